"""Claims: how a Spark query consumes a queue (or a topic's durable subscription) through the
broker, exactly once.

A claimant (the query's ``consumer`` option) takes messages in numbered claims, one per
micro-batch. A claim is a lease that does not lapse, recorded durably (settlement rows with
outcome ``claimed``, reason ``<claimant>#<number>``) before the query sees it:

* claiming number *n* again returns the same offsets (a query restarted from its checkpoint
  replays batch *n* with exactly the same messages, even across a broker restart);
* claiming *n* means the query committed every batch before it, so those claims are acked;
  the query's ``commit`` acks them too (whichever comes first);
* claimed messages are invisible to every other consumer until acked;
* a claimant gone for good (a query deleted with its checkpoint) is *released*: what it holds
  goes back to the other consumers, recorded as ``returned`` rows with reason
  ``released:<claimant>``, and the name may not claim again on that subscription (a query still
  using it would otherwise replay claims that no longer hold the same messages).
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Iterable
from dataclasses import dataclass, field

import pyarrow as pa

from spark_mq.broker import disposal
from spark_mq.broker.destination import Destination
from spark_mq.broker.recovery import CLAIMED, RETURNED
from spark_mq.broker.registry import Destinations
from spark_mq.broker.subscription import Subscription
from spark_mq.errors import LeaseError, NotAllowed
from spark_mq.journal import Journal
from spark_mq.names import validate_name
from spark_mq.schema import MESSAGE_SCHEMA, RELEASED_PREFIX

FOREVER = float("inf")


@dataclass
class Claimant:
    consumer_id: int
    batches: dict[int, list[int]] = field(default_factory=dict)  # claim number -> offsets
    lock: threading.Lock = field(default_factory=threading.Lock)
    released: bool = False


class Claims:
    def __init__(
        self, destinations: Destinations, journal: Journal, consumer_ids: itertools.count
    ) -> None:
        self.destinations = destinations
        self.journal = journal
        self._ids = consumer_ids
        self._lock = threading.Lock()
        self._claimants: dict[tuple[str, str, str], Claimant] = {}
        self._released: set[tuple[str, str, str]] = set()  # (destination, subscription, name)

    def _subscription(
        self, destination: str, subscription: str | None
    ) -> tuple[Destination, Subscription]:
        dest = self.destinations.get(destination)
        return dest, self.destinations.subscription(dest, subscription)

    def _claimant(self, dest: str, sub: Subscription, name: str) -> Claimant:
        validate_name(name, "consumer")
        with self._lock:
            key = (dest, sub.name, name)
            if key in self._released:
                raise NotAllowed(
                    f"consumer {name!r} of {dest!r} was released and may not claim again: give "
                    "the query a new consumer name (and a new checkpoint)",
                    destination=dest,
                )
            found = self._claimants.get(key)
            if found is None:
                found = self._claimants[key] = Claimant(next(self._ids))
                sub.register(found.consumer_id)
            return found

    def restore(
        self,
        dest: str,
        sub: Subscription,
        claims: dict[str, dict[int, list[int]]],
        released: Iterable[str] = (),
    ) -> None:
        """After a restart: lease every unsettled claimed offset to its claimant again."""
        with self._lock:
            self._released.update((dest, sub.name, name) for name in released)
        for name, numbers in claims.items():
            if not numbers:
                continue
            claimant = self._claimant(dest, sub, name)
            for number, offsets in numbers.items():
                claimant.batches[number] = sub.lease_to(claimant.consumer_id, offsets, FOREVER)

    def claim(
        self,
        destination: str,
        subscription: str | None,
        name: str,
        number: int,
        limit: int,
        below: int | None = None,
    ) -> list[int]:
        """The offsets of claim ``number`` (made now, unless it exists); acks earlier claims."""
        dest, sub = self._subscription(destination, subscription)
        claimant = self._claimant(destination, sub, name)
        with claimant.lock:
            _check_live(claimant, name, destination)
            self._ack(dest, sub, claimant, number - 1)
            if number in claimant.batches:
                return list(claimant.batches[number])
            taken = sub.take(claimant.consumer_id, limit, lease_s=FOREVER, below=below)
            offsets = [o for o, _, _ in taken]
            if offsets:
                try:
                    self._record(sub, destination, offsets, CLAIMED, f"{name}#{number}")
                except BaseException:
                    # not recorded (a full disk, say): a lease that never lapses must not be
                    # left behind, or these messages would stay invisible to everyone
                    sub.nack(claimant.consumer_id, [(o, c) for o, c, _ in taken])
                    raise
                claimant.batches[number] = offsets
            return offsets

    def _record(
        self, sub: Subscription, destination: str, offsets: list[int], outcome: str, reason: str
    ) -> None:
        """Make settlement rows for ``offsets`` durable before anyone is told (claims, releases)."""
        self.journal.settle(
            destination, offsets, subscription=sub.name, outcome=outcome, reason=reason
        ).result()

    def rows(self, destination: str, subscription: str | None, name: str, number: int) -> pa.Table:
        """The messages of claim ``number``, in offset order."""
        dest, sub = self._subscription(destination, subscription)
        claimant = self._claimant(destination, sub, name)
        with claimant.lock:
            offsets = claimant.batches.get(number)
        if offsets is None:
            raise LeaseError(
                f"{name!r} holds no claim {number} on {destination!r} (acked already, or never "
                "made)",
                destination=destination,
            )
        if not offsets:
            return MESSAGE_SCHEMA.empty_table()
        return disposal.order_like(dest.store.take(offsets), sorted(offsets))

    def ack(self, destination: str, subscription: str | None, name: str, upto: int) -> int:
        """Ack every claim numbered ``upto`` or lower (the query committed them)."""
        dest, sub = self._subscription(destination, subscription)
        claimant = self._claimant(destination, sub, name)
        with claimant.lock:
            return self._ack(dest, sub, claimant, upto)

    def release(self, destination: str, subscription: str | None, name: str) -> int:
        """Give back everything ``name`` holds and retire the name; returns how many messages.

        The returns count as ended deliveries (each message's delivery count goes up by one).
        """
        _, sub = self._subscription(destination, subscription)
        validate_name(name, "consumer")
        key = (destination, sub.name, name)
        with self._lock:
            claimant = self._claimants.get(key)
        if claimant is None:
            return 0
        with claimant.lock:
            if claimant.released:
                return 0
            offsets = [o for n in sorted(claimant.batches) for o in claimant.batches[n]]
            if offsets:  # durable first: a crash before this leaves the claims as they were
                self._record(sub, destination, offsets, RETURNED, f"{RELEASED_PREFIX}{name}")
                with self._lock:
                    self._released.add(key)
            with self._lock:
                del self._claimants[key]
            claimant.released = True
            claimant.batches.clear()
            return sub.release_consumer(claimant.consumer_id, log=False)

    def _ack(self, dest: Destination, sub: Subscription, claimant: Claimant, upto: int) -> int:
        done = sorted(n for n in claimant.batches if n <= upto)
        offsets = [o for n in done for o in claimant.batches[n]]
        if offsets:
            entries = [(o, sub.delivery_count(o)) for o in offsets]
            ok, refused = sub.begin_ack(claimant.consumer_id, entries)
            if refused:
                sub.end_ack(ok, durable=False)
                raise LeaseError(
                    f"claim of {dest.name!r} could not be acked: offset {refused[0].offset}: "
                    f"{refused[0].reason}",
                    destination=dest.name,
                )
            fut = self.journal.settle(dest.name, ok, subscription=sub.name)
            try:
                fut.result()
            except BaseException:
                sub.end_ack(ok, durable=False)
                raise
            sub.end_ack(ok, durable=True)
        for n in done:
            del claimant.batches[n]
        return len(offsets)


def _check_live(claimant: Claimant, name: str, destination: str) -> None:
    if claimant.released:  # released while this call waited for the claimant
        raise NotAllowed(
            f"consumer {name!r} of {destination!r} was released meanwhile", destination=destination
        )
