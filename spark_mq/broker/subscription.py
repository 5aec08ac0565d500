"""Delivery state of one subscription (a queue's implicit one, or a topic's durable one).

An offset is, for a subscription, exactly one of: *not yet delivered* (>= ``next_offset``),
*available again* (nacked or its lease lapsed), *leased* to one consumer until its deadline,
or *settled* (acked durably). A lease is fenced by the delivery count: an ack or nack must name
the delivery it answers, so a consumer whose lease lapsed and whose message went elsewhere
cannot settle it.

Delivery counts live in memory: after a broker restart unsettled messages start again from
count 0 (persisting them is the delivery-semantics work).
"""

from __future__ import annotations

import heapq
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from spark_mq.broker.message_store import MessageStore


@dataclass
class Lease:
    consumer_id: int
    delivery_count: int
    deadline: float
    settling: bool = False


@dataclass(frozen=True)
class Refusal:
    offset: int
    reason: str


class Subscription:
    def __init__(
        self,
        destination: str,
        name: str,
        store: MessageStore,
        *,
        start_offset: int,
        settled: Iterable[int] = (),
        lease_s: float,
        monotonic: Callable[[], float],
    ) -> None:
        self.destination = destination
        self.name = name
        self.start_offset = start_offset
        self.lease_s = lease_s
        self._store = store
        self._now = monotonic
        self._lock = threading.Lock()
        self.next_offset = start_offset
        self._settled: set[int] = set(settled)
        self._available: set[int] = set()
        self._available_heap: list[int] = []
        self._counts: dict[int, int] = {}  # delivery counts of offsets delivered before
        self._leases: dict[int, Lease] = {}
        self._waiters: set[threading.Event] = set()
        self.acked_total = 0
        self.redelivered_total = 0

    # -- consumers waiting for messages -------------------------------------------------------
    def add_waiter(self, event: threading.Event) -> None:
        with self._lock:
            self._waiters.add(event)

    def remove_waiter(self, event: threading.Event) -> None:
        with self._lock:
            self._waiters.discard(event)

    def wake(self) -> None:
        with self._lock:
            waiters = list(self._waiters)
        for w in waiters:
            w.set()

    # -- delivery ----------------------------------------------------------------------------
    def take(self, consumer_id: int, limit: int) -> list[tuple[int, int]]:
        """Lease up to ``limit`` messages to ``consumer_id``: ``(offset, delivery_count)``."""
        if limit <= 0:
            return []
        out: list[tuple[int, int]] = []
        deadline = self._now() + self.lease_s
        with self._lock:
            while self._available_heap and len(out) < limit:
                offset = heapq.heappop(self._available_heap)
                if offset in self._available:
                    self._available.discard(offset)
                    out.append((offset, self._counts.pop(offset, 0) + 1))
            if len(out) < limit:
                fresh, self.next_offset = self._store.scan(
                    self.next_offset, limit - len(out), self._settled
                )
                out.extend((o, 1) for o in fresh)
            for offset, count in out:
                self._leases[offset] = Lease(consumer_id, count, deadline)
        return out

    def _make_available(self, offset: int, count: int) -> None:
        self._counts[offset] = count
        self._available.add(offset)
        heapq.heappush(self._available_heap, offset)
        self.redelivered_total += 1

    def _check(self, consumer_id: int, offset: int, count: int) -> Lease | Refusal:
        lease = self._leases.get(offset)
        if lease is not None and lease.consumer_id == consumer_id and lease.delivery_count == count:
            return lease
        if offset in self._settled:
            return Refusal(offset, "already settled")
        if lease is not None:
            return Refusal(
                offset, "the lease lapsed and the message was delivered again (stale delivery)"
            )
        if offset in self._available and self._counts.get(offset) == count:
            # the lease lapsed but nobody else has it yet: let the late answer through
            lease = Lease(consumer_id, count, self._now() + self.lease_s)
            self._available.discard(offset)
            del self._counts[offset]
            self._leases[offset] = lease
            return lease
        return Refusal(offset, "not delivered to this consumer, or the lease lapsed")

    def begin_ack(
        self, consumer_id: int, entries: Iterable[tuple[int, int]]
    ) -> tuple[list[int], list[Refusal]]:
        """Mark leases as being settled; the caller makes that durable, then ``end_ack``."""
        ok, refused = [], []
        with self._lock:
            for offset, count in entries:
                got = self._check(consumer_id, offset, count)
                if isinstance(got, Refusal):
                    refused.append(got)
                elif got.settling:
                    refused.append(Refusal(offset, "an ack for this delivery is already under way"))
                else:
                    got.settling = True
                    ok.append(offset)
        return ok, refused

    def end_ack(self, offsets: Iterable[int], *, durable: bool) -> None:
        """After the settlement commit: forget the leases, or (on failure) keep them."""
        with self._lock:
            for offset in offsets:
                lease = self._leases.get(offset)
                if lease is None:
                    continue
                if durable:
                    del self._leases[offset]
                    self._settled.add(offset)
                    self.acked_total += 1
                else:
                    lease.settling = False

    def nack(
        self, consumer_id: int, entries: Iterable[tuple[int, int]]
    ) -> tuple[list[int], list[Refusal]]:
        """Give messages back for immediate redelivery (with a higher delivery count)."""
        ok, refused = [], []
        with self._lock:
            for offset, count in entries:
                got = self._check(consumer_id, offset, count)
                if isinstance(got, Refusal) or got.settling:
                    refused.append(got if isinstance(got, Refusal) else Refusal(offset, "settling"))
                    continue
                del self._leases[offset]
                self._make_available(offset, got.delivery_count)
                ok.append(offset)
        if ok:
            self.wake()
        return ok, refused

    def extend(
        self, consumer_id: int, entries: Iterable[tuple[int, int]]
    ) -> tuple[list[int], list[Refusal]]:
        """Push lease deadlines one mark interval from now."""
        ok, refused = [], []
        deadline = self._now() + self.lease_s
        with self._lock:
            for offset, count in entries:
                got = self._check(consumer_id, offset, count)
                if isinstance(got, Refusal):
                    refused.append(got)
                    continue
                got.deadline = deadline
                ok.append(offset)
        return ok, refused

    def expire_leases(self) -> int:
        """Make messages whose lease lapsed available again; returns how many."""
        now = self._now()
        with self._lock:
            lapsed = [
                o
                for o, lease in self._leases.items()
                if lease.deadline <= now and not lease.settling
            ]
            for offset in lapsed:
                lease = self._leases.pop(offset)
                self._make_available(offset, lease.delivery_count)
        if lapsed:
            self.wake()
        return len(lapsed)

    def release_consumer(self, consumer_id: int) -> int:
        """A consumer left: its unsettled messages go back for redelivery."""
        with self._lock:
            mine = [
                o
                for o, lease in self._leases.items()
                if lease.consumer_id == consumer_id and not lease.settling
            ]
            for offset in mine:
                lease = self._leases.pop(offset)
                self._make_available(offset, lease.delivery_count)
        if mine:
            self.wake()
        return len(mine)

    def is_leased_to(self, offset: int, consumer_id: int) -> bool:
        with self._lock:
            lease = self._leases.get(offset)
            return lease is not None and lease.consumer_id == consumer_id

    # -- bookkeeping -------------------------------------------------------------------------
    def low_water(self) -> int:
        """Every offset below this is settled for this subscription."""
        with self._lock:
            low = self.next_offset
            if self._leases:
                low = min(low, min(self._leases))
            if self._available:
                low = min(low, min(self._available))
            self._settled = {o for o in self._settled if o >= low}
            return low

    def has_work(self, end_offset: int) -> bool:
        with self._lock:
            return bool(self._available) or self.next_offset < end_offset

    def stats(self, end_offset: int) -> dict[str, int]:
        with self._lock:
            unsettled_new = max(end_offset - self.next_offset, 0)
            unsettled_new -= sum(1 for o in self._settled if o >= self.next_offset)
            return {
                "start_offset": self.start_offset,
                "next_offset": self.next_offset,
                "in_flight": len(self._leases),
                "available_again": len(self._available),
                "depth": unsettled_new + len(self._available) + len(self._leases),
                "acked": self.acked_total,
                "redelivered": self.redelivered_total,
            }
