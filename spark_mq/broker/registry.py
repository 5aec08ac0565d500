"""The broker's destinations: the map of them and its lock, how each is found, made and let go,
and the one place new destinations and subscriptions are built. The broker's other parts (admin,
attaching, producing, claims, disposal, limits, transactions, moving) find destinations here;
none holds the map itself."""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable, Iterable, Mapping
from contextlib import AbstractContextManager
from typing import Any, Protocol

import numpy as np
import pyarrow as pa

from spark_mq.broker.dedup import DuplicateCache
from spark_mq.broker.destination import Destination
from spark_mq.broker.message_store import MessageStore
from spark_mq.broker.selector import Selector, compile_selector
from spark_mq.broker.subscription import Subscription
from spark_mq.clock import Clock
from spark_mq.config import BrokerConfig, DestinationSettings
from spark_mq.errors import (
    DestinationNotFound,
    NotAllowed,
    NotOwner,
    Partitioned,
    SubscriptionNotFound,
)
from spark_mq.journal import Journal
from spark_mq.journal.base import Kind
from spark_mq.messages import Messages
from spark_mq.names import partition_name, partition_of, validate_name
from spark_mq.schema import QUEUE_SUBSCRIPTION

log = logging.getLogger("spark_mq.broker.core")
# rows read back after a producer state handed on, at most, beyond the duplicate cache's (a
# member lost under load: its hot tier's last moves carried the state up to a second before)
REPLAY_ROWS = 200_000
_REFILL_COLUMNS = ("offset", "dedup_id", "enqueue_time")

# how long letting a destination go waits for transactions holding it (they write moments)
_HELD_WAIT_S = 30.0


class Elsewhere(Protocol):
    """A cluster member's answer for destinations it does not serve
    (:class:`spark_mq.cluster.member.ClusterMember`)."""

    def route(self, name: str) -> None:
        """Raise ``NotOwner`` when another member owns ``name`` or it is being placed; return
        when the cluster does not have it, or once this member serves it."""
        ...

    def creating(self, name: str) -> AbstractContextManager[None]:
        """Held while ``name`` is created here: no other member creates it meanwhile."""
        ...

    def created(self, name: str, kind: Kind) -> None:
        """``name`` was just recorded: it is to be placed."""
        ...

    def kind_of(self, name: str) -> Kind | None:
        """``name``'s kind, as the cluster registered it (None: not known)."""
        ...

    def deleted(self, name: str) -> None:
        """``name`` was deleted by this member, its owner."""
        ...

    def created_temporary(self, name: str) -> None:
        """A temporary queue of this member's (the others send to it here)."""
        ...

    def deleted_temporary(self, name: str) -> None: ...

    def has(self, name: str) -> bool:
        """Whether the cluster has ``name`` (as last seen: quick)."""
        ...


# how old a partition count read from the bindings log (a partitioned destination whose
# partition 0 another cluster member serves) may be before it is read again: partitions added
# reach this member's answers (Kafka metadata, STOMP sends' placing) this much later at most
PARTITIONS_REREAD_S = 10.0
# ... and once the cluster has a partition past that count (one being added: its partitions are
# made, then partition 0's count raised): read again this often while asked, so that the count
# follows within about this long of the growth (a Kafka client told a topic it just grew has its
# old count fails the records it sent to the new partitions)
PARTITIONS_GROWING_REREAD_S = 0.5


class Destinations:
    """Thread-safe: the map under its lock; a destination's own state under its ``lock``."""

    def __init__(self, config: BrokerConfig, clock: Clock, journal: Journal) -> None:
        self.config = config
        self.clock = clock
        self.journal = journal
        self._lock = threading.RLock()
        self._dests: dict[str, Destination] = {}
        # transactions writing to (or settling in) a destination, which is not let go meanwhile
        self._held: dict[str, int] = {}
        self._letting_go: set[str] = set()
        self._unheld = threading.Condition(self._lock)
        # a cluster member's: where the destinations it does not serve are (None: one broker
        # serves them all)
        self.elsewhere: Elsewhere | None = None
        # a cluster member's partitioned destinations none of whose partition 0 it serves:
        # their kind and partition count as recorded, and when that was read (a count grows
        # when partitions are added: read again in the background once it is old)
        self._partitioned: dict[str, tuple[Kind, int, float]] = {}
        self._rereading: set[str] = set()

    # -- finding -------------------------------------------------------------------------------
    def get(self, name: str, *, kind: Kind | None = None) -> Destination:
        """The destination ``name``; ``kind``: what the caller needs it to be, which the error
        for a missing one suggests creating."""
        dest = self._served(name)
        if dest is None:
            self._refuse_partitioned(name)
            maker = "create_topic" if kind == "topic" else "create_queue"
            raise DestinationNotFound(
                f"{kind or 'destination'} {name!r} does not exist (create it first, e.g. "
                f"Admin.{maker}({name!r}))",
                destination=name,
            )
        return dest

    def _served(self, name: str) -> Destination | None:
        """``name`` as served here; None when there is no such destination. A cluster member
        asks where one it does not serve is: ``NotOwner``, unless it is served here now."""
        with self._lock:
            dest = self._dests.get(name)
        if dest is None and self.elsewhere is not None:
            self.elsewhere.route(name)
            with self._lock:
                dest = self._dests.get(name)
        return dest

    def partitioned(self, name: str, *, fresh: bool = False) -> tuple[Kind, int] | None:
        """``name``'s kind and partition count when it is a partitioned destination (its
        partitions are the destinations ``<name>~<index>``); else None. Where partition 0 is
        served elsewhere, the count as read up to ``PARTITIONS_REREAD_S`` ago (read again in
        the background; every ``PARTITIONS_GROWING_REREAD_S`` once the cluster has a partition
        past it), unless ``fresh`` (a read of the bindings log now: not for a loop)."""
        first = partition_name(name, 0)
        with self._lock:
            dest = self._dests.get(first)
            if dest is not None:
                return dest.kind, dest.settings.partitions
            if self.elsewhere is None or not self.elsewhere.has(first):
                self._partitioned.pop(name, None)
                return None
            known = self._partitioned.get(name)
            now = self.clock.monotonic()
            stale = known is not None and (
                now - known[2] >= PARTITIONS_REREAD_S
                or (
                    now - known[2] >= PARTITIONS_GROWING_REREAD_S
                    and self.elsewhere.has(partition_name(name, known[1]))
                )
            )
            if stale and name not in self._rereading:
                self._rereading.add(name)
                threading.Thread(
                    target=self._reread_partitioned,
                    args=(name,),
                    daemon=True,
                    name=f"partitions of {name}",
                ).start()
        if known is None or fresh:
            return self._read_partitioned(name)
        return known[0], known[1]

    def _read_partitioned(self, name: str) -> tuple[Kind, int] | None:
        """``name``'s kind and partition count as its partition 0 records them (a read of the
        bindings log, whichever member serves it), kept for :meth:`partitioned`."""
        read_at = self.clock.monotonic()
        info = self.journal.recorded(partition_name(name, 0))
        with self._lock:
            if info is None:
                self._partitioned.pop(name, None)
                return None
            count = int(info.settings.get("partitions", 1))
            known = self._partitioned.get(name)
            if known is None or known[2] <= read_at:  # (a slower, older read loses)
                self._partitioned[name] = info.kind, count, read_at
            return info.kind, count

    def _reread_partitioned(self, name: str) -> None:
        try:
            self._read_partitioned(name)
        except Exception:  # (the old count stays; read again next time it is asked)
            log.warning("could not read %s's partition count again", name, exc_info=True)
        finally:
            with self._lock:
                self._rereading.discard(name)

    def kind_elsewhere(self, name: str) -> Kind | None:
        """The kind of ``name``, which another cluster member serves, as the cluster registered
        it; None when it has no such destination or cannot say now (a protocol that names a
        kind checks it here before what it does is forwarded to the owner: quick, a loop may
        ask; the bindings log's read took 110 ms)."""
        return None if self.elsewhere is None else self.elsewhere.kind_of(name)

    def _refuse_partitioned(self, name: str) -> None:
        """A partitioned destination's own name is no destination: say which its are."""
        parts = self.partitioned(name)
        if parts is None:
            return
        kind, n = parts
        raise Partitioned(
            f"{name!r} is a {kind} of {n} partitions, {partition_name(name, 0)} to "
            f"{partition_name(name, n - 1)}: send to it and consume from it with a client that "
            "knows partitions (the Python SDK, Kafka clients, STOMP sends), or name a partition",
            destination=name,
            kind=kind,
            partitions=n,
        )

    def find(self, name: str) -> Destination | None:
        with self._lock:
            return self._dests.get(name)

    def for_use(self, name: str) -> Destination:
        """The destination a producer or consumer names: created as an auto-deleting queue
        when it does not exist and ``broker.auto_create_queues`` allows it."""
        dest = self._served(name)
        if dest is None:
            self._refuse_partitioned(name)
        # (a partition that is not there is not made: only its destination makes partitions)
        auto = self.config.broker.auto_create_queues and partition_of(name) is None
        if dest is None and auto:
            validate_name(name)
            if self.create(name, "queue", {"auto_delete": True}):
                log.info("auto-created queue %s", name, extra={"destination": name})
            dest = self.get(name)
        elif dest is None:
            dest = self.get(name)
        dest.last_used = self.clock.monotonic()
        return dest

    def administrable(self, name: str) -> Destination:
        """A destination an administrator may change (not a consumer's temporary queue)."""
        dest = self.get(name)
        if dest.temporary:
            raise NotAllowed(
                f"{name!r} is a temporary queue: it belongs to the consumer that made it and "
                "goes with it; it cannot be administered",
                destination=name,
            )
        return dest

    def subscription(self, dest: Destination, name: str | None) -> Subscription:
        """A queue's subscription, or a topic's by ``name``."""
        key = QUEUE_SUBSCRIPTION if dest.kind == "queue" else name
        with dest.lock:
            sub = dest.subscriptions.get(key or "")
        if sub is None:
            raise SubscriptionNotFound(
                f"topic {dest.name!r} has no subscription {name!r}"
                if name
                else f"{dest.name!r} is a topic: name the subscription",
                destination=dest.name,
                subscription=name or "",
            )
        return sub

    def has(self, name: str) -> bool:
        with self._lock:
            return name in self._dests

    def kind(self, name: str) -> Kind | None:
        """``queue`` or ``topic``; None when there is no such destination (a cluster member:
        ``NotOwner`` for one another member serves)."""
        dest = self._served(name)
        if dest is None:
            parts = self.partitioned(name)
            return None if parts is None else parts[0]
        return dest.kind

    def names(self) -> list[str]:
        with self._lock:
            return sorted(self._dests)

    def all(self) -> list[Destination]:
        with self._lock:
            return list(self._dests.values())

    @property
    def lock(self) -> threading.RLock:
        """The map's lock: held, no destination is added or removed (auto-deletion decides
        under it)."""
        return self._lock

    # -- making and letting go -----------------------------------------------------------------
    def create(
        self,
        name: str,
        kind: Kind,
        overrides: dict[str, Any] | None = None,
        subscriptions: Mapping[str, str | None] | None = None,
    ) -> bool:
        """Record and build a queue or topic (``overrides``: checked settings; a topic's
        ``subscriptions``: durable ones it starts with, by name, each with its selector);
        False when it existed."""
        overrides = overrides or {}
        if self.journal.shared:  # a cluster member: it is placed, and served by its owner
            elsewhere = self.elsewhere
            with elsewhere.creating(name) if elsewhere is not None else contextlib.nullcontext():
                _, created = self.journal.create_destination(name, kind, overrides, subscriptions)
                if elsewhere is not None:
                    elsewhere.created(name, kind)  # (idempotent: a create that was cut short)
            if created:
                log.info("created %s %s", kind, name, extra={"destination": name})
            return created
        with self._lock:
            info, created = self.journal.create_destination(name, kind, overrides, subscriptions)
            if created:
                dest = self.build(name, kind, overrides)
                for sub in info.subscriptions.values():  # (a queue's own, a topic's given)
                    dest.subscriptions[sub.name] = self.new_subscription(
                        dest,
                        sub.name,
                        0,
                        next_offset=0,
                        settled=set(),
                        selector=compile_selector(sub.selector),
                    )
                self._dests[name] = dest
                log.info("created %s %s", kind, name, extra={"destination": name})
            return created

    def create_temporary(self, name: str) -> Destination:
        """A temporary queue (memory only): its consumer's, gone with it."""
        with self._lock:
            self.journal.create_temporary(name)
            dest = self.build(name, "queue")
            dest.temporary = True
            dest.subscriptions[QUEUE_SUBSCRIPTION] = self.new_subscription(
                dest, QUEUE_SUBSCRIPTION, 0, next_offset=0, settled=set(), durable=False
            )
            self._dests[name] = dest
        if self.elsewhere is not None:
            self.elsewhere.created_temporary(name)
        return dest

    def add(self, dest: Destination) -> None:
        """One rebuilt at recovery."""
        with self._lock:
            self._dests[dest.name] = dest

    def begin_letting_go(self, name: str) -> None:
        """A cluster member is about to let ``name`` go: no transaction (:meth:`hold`) nor
        dead-letter move (:meth:`letting_go`) starts on it from now on, and the transactions
        holding it are waited for (a bounded time)."""
        with self._unheld:
            self._letting_go.add(name)
            if not self._unheld.wait_for(lambda: not self._held.get(name), _HELD_WAIT_S):
                log.warning(
                    "letting %s go with a transaction still writing to it after %.0f s: its "
                    "new owner finishes what the transaction log holds of it",
                    name,
                    _HELD_WAIT_S,
                    extra={"destination": name},
                )

    def end_letting_go(self, name: str) -> None:
        with self._lock:
            self._letting_go.discard(name)

    def letting_go(self, name: str) -> bool:
        with self._lock:
            return name in self._letting_go

    def forget(self, name: str) -> Destination | None:
        """A cluster member lets ``name`` go (another owns it now): out of the map, its logs
        kept. (Its consumers are the caller's to close.)"""
        with self._lock:
            return self._dests.pop(name, None)

    def hold(self, dests: list[Destination]) -> Callable[[], None]:
        """Keep ``dests`` served here until the returned function is called: a transaction's
        hold, from before its commit record until it applied it. Letting one go waits for it,
        so the new owner, which reads the transaction log once it fenced the destination, sees
        any commit the old owner may not have applied in full, and finishes it. (Before, a
        commit recorded after the new owner had read the log, its sends refused by the fence,
        would have lost them while its acks held.) ``NotOwner`` when one was let go, or is
        being let go, since it was found."""
        names: list[str] = []
        with self._lock:
            for dest in dests:
                if dest.name in self._letting_go or self._dests.get(dest.name) is not dest:
                    self._unhold(names)
                    raise NotOwner(
                        f"{dest.name!r} is being moved to another cluster member just now: "
                        "try again shortly",
                        destination=dest.name,
                        member="",
                        endpoint="",
                        epoch=0,
                    )
                self._held[dest.name] = self._held.get(dest.name, 0) + 1
                names.append(dest.name)
        return lambda: self._unhold(names)

    def _unhold(self, names: list[str]) -> None:
        with self._unheld:
            for name in names:
                self._held[name] -= 1
                if not self._held[name]:
                    del self._held[name]
            self._unheld.notify_all()

    def remove(
        self, name: str, *, internal: bool = False, only_if_end: int | None = None
    ) -> Destination | None:
        """Delete a destination's logs and forget it; ``only_if_end``: only if its log still
        ends there with no append under way (auto-deletion). The destination, or None when it
        was not deleted. (Its consumers are the caller's to close.)"""
        with self._lock:
            dest = self.get(name) if internal else self.administrable(name)
            if not self.journal.delete_destination(name, only_if_end=only_if_end):
                return None
            del self._dests[name]
        if self.elsewhere is not None and dest.temporary:
            self.elsewhere.deleted_temporary(name)
        elif self.elsewhere is not None:
            self.elsewhere.deleted(name)
        return dest

    # -- building ------------------------------------------------------------------------------
    def build(self, name: str, kind: Kind, overrides: dict[str, Any] | None = None) -> Destination:
        """A destination's in-memory state (not yet in the map)."""
        d = self.config.duplicates
        if d.cache_size:
            cache = DuplicateCache(d.cache_size, d.window_s)
        else:  # (off: a Kafka producer's batches are still stored once)
            cache = DuplicateCache.kafka_only(d.window_s)
        overrides = dict(overrides or {})
        unknown = [k for k in overrides if k not in DestinationSettings.model_fields]
        if unknown:  # recorded by another version: say so, do not refuse to start
            log.warning("%s: ignoring unknown recorded setting(s) %s", name, unknown)
            overrides = {k: v for k, v in overrides.items() if k not in unknown}
        settings = self.config.destinations.with_overrides(overrides)
        journal = self.journal
        store = MessageStore(lambda start, end: journal.read_messages(name, start, end))
        dest = Destination(name, kind, settings, overrides, store=store, dedup=cache)
        dest.last_used = self.clock.monotonic()
        return dest

    def new_subscription(
        self,
        dest: Destination,
        name: str,
        start: int,
        *,
        next_offset: int,
        settled: Iterable[int],
        returned: dict[int, int] | None = None,
        selector: Selector | None = None,
        durable: bool = True,
    ) -> Subscription:
        sub = Subscription(
            dest.name,
            name,
            dest.store,
            start_offset=start,
            settled=settled,
            returned=returned,
            lease_s=self.config.delivery.mark_interval_s,
            monotonic=self.clock.monotonic,
            wall=self.clock.wall,
            settings=dest.settings,
            selector=selector,
            durable=durable,
            max_scan=self.config.delivery.max_scan,
        )
        sub.begin_at(next_offset)
        return sub

    def refill_dedup(self, dest: Destination, handed: str | None = None) -> None:
        """Recent dedup ids from the log's newest rows, so a resend after a crash is caught;
        and where each producer numbering its ids got to (its producer state): from the state
        the last owner ``handed`` on and the rows after it when those are among the rows read,
        else from the rows read (all a producer's, when they are the whole log)."""
        cache = dest.dedup
        if cache is None:
            return
        end = self.journal.end_offset(dest.name)
        start = max(0, end - cache.size)  # (the ids the cache holds)
        replay = None
        if handed is not None:
            replay = cache.begin_from(handed, max(0, min(start, end - REPLAY_ROWS)), end)
        if replay is None:
            replay = start
            if start > 0:
                cache.began_partway()
        first = min(start, replay)
        if first == end:
            return
        # (not the bodies: most of what a read decodes)
        rows = self.journal.read_messages(dest.name, first, end, _REFILL_COLUMNS)
        offsets = rows["offset"].to_numpy()  # (in order)
        after = int(np.searchsorted(offsets, replay))  # the first row to replay
        if len(offsets) - after != end - replay:
            cache.began_partway()  # (compaction removed some: what they held is gone)
        ids = cache.looked_at(rows["dedup_id"].combine_chunks())
        cache.replayed(ids.slice(after).to_pylist())
        held = int(np.searchsorted(offsets, start))
        since = self.clock.wall() - cache.window_s
        times = rows["enqueue_time"].slice(held).cast(pa.int64()).to_numpy() / 1_000_000.0
        recent = times >= since  # (every row has an enqueue time)
        cache.remember_all(ids.slice(held).filter(recent), offsets[held:][recent], times[recent])

    # -- what the journal made durable ---------------------------------------------------------
    def producer_state_at(self, name: str, end: int) -> str | None:
        """(A sink's commit: a hot tier's mover, or a writer without one.) ``name``'s producer
        state with its log ending at ``end``, for a commit to carry; None when it did not
        change since last handed on."""
        # (no map lock: a deletion holds it while it waits for the mover or writer asking;
        # taking it here, a partition deleted on a cluster member hung while its mover moved)
        dest = self._dests.get(name)
        if dest is None or dest.dedup is None:
            return None
        return dest.dedup.handed_if_changed(end)

    def committed(self, destination: str, messages: Messages) -> None:
        """(The committing thread.) Messages are durable: consumers may have them."""
        # (no map lock: a deletion holds it while it waits for the writer of this commit)
        dest = self._dests.get(destination)
        if dest is None:
            return
        with dest.lock:
            dest.produced_total += messages.num_rows
            watchers = list(dest.log_watchers) if dest.log_watchers else None
            if not dest.subscriptions:
                subs = None  # a topic nobody subscribes to: the log keeps it, memory need not
            else:
                dest.store.add(messages)
                subs = list(dest.subscriptions.values())
        if watchers is not None:
            for watcher in watchers:
                watcher()
        if subs is None:
            return
        for sub in subs:
            sub.wake()
