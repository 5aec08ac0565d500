"""The append journal: everything durable goes through here, whatever the store.

* bindings: destinations and durable subscriptions (append-only events, replayed on open);
* per destination, an append-only message log with gap-free int64 offsets assigned here;
* per destination, an append-only settlement log (acks and other outcomes);
* group commit through one :class:`DestinationWriter` per destination.

A producer may be acknowledged once the future returned by :meth:`Journal.append` resolves:
its rows are then committed to the store.
"""

from __future__ import annotations

import shutil
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future
from typing import Any, TypedDict

import pyarrow as pa

from spark_mq.errors import (
    DestinationExists,
    DestinationNotFound,
    NotOwner,
    SchemaMismatch,
    SubscriptionNotFound,
)
from spark_mq.journal import bindings, layout, sealing
from spark_mq.journal.base import DestinationInfo, Kind, LogStore, SubscriptionInfo
from spark_mq.journal.group_commit import DestinationWriter, OnCommit, WriterStats
from spark_mq.journal.hot_tier import (
    HotTier,
    HotTierSettings,
    HotTierStats,
    Replica,
)
from spark_mq.journal.inline_commit import InlineCommit
from spark_mq.journal.memory_store import MemoryStore
from spark_mq.journal.settlements import Settlement
from spark_mq.journal.sinks import CommitSink, DirectSink, ProducerStateAt
from spark_mq.journal.timing import CommitTiming
from spark_mq.messages import Messages
from spark_mq.names import validate_name, validate_stored_name
from spark_mq.schema import UNOFFSET_SCHEMA

DEFAULT_BUFFER_TIMEOUT_S = 0.001
DEFAULT_BUFFER_SIZE_BYTES = 490 * 1024
DEFAULT_MAX_PENDING_BYTES = 256 * 1024 * 1024


def _now_us() -> int:
    return time.time_ns() // 1000


class _WriterOptions(TypedDict):
    """What every destination's writer is made with (``DestinationWriter``'s settings)."""

    buffer_timeout_s: float
    buffer_size_bytes: int
    max_pending_bytes: int
    settle_timeout_s: float
    timing: CommitTiming | None


class Journal:
    """Durable (or, with ``MemoryStore``, in-memory) logs for every destination."""

    def __init__(
        self,
        store: LogStore,
        *,
        buffer_timeout_s: float = DEFAULT_BUFFER_TIMEOUT_S,
        buffer_size_bytes: int = DEFAULT_BUFFER_SIZE_BYTES,
        max_pending_bytes: int = DEFAULT_MAX_PENDING_BYTES,
        settle_timeout_s: float = 0.0,
        on_commit: OnCommit | None = None,
        now_us: Callable[[], int] = _now_us,
        hot_tier: HotTierSettings | None = None,
        timing: CommitTiming | None = None,
    ) -> None:
        self.store = store
        self._hot = hot_tier
        self._tiers: dict[str, HotTier] = {}
        self.replica: Replica | None = None  # a replicating primary's (spark_mq.ha.replication)
        # a cluster member's: what its sinks' commits carry (sinks.ProducerStateCarrier)
        self.producer_state: ProducerStateAt | None = None
        self._writer_opts = _WriterOptions(
            buffer_timeout_s=buffer_timeout_s,
            buffer_size_bytes=buffer_size_bytes,
            max_pending_bytes=max_pending_bytes,
            settle_timeout_s=settle_timeout_s,
            timing=timing,
        )
        self._on_commit = on_commit
        self._now_us = now_us
        self._lock = threading.RLock()
        self._dests: dict[str, DestinationInfo] = {}
        self._writers: dict[str, DestinationWriter] = {}
        self._temporary: dict[str, MemoryStore] = {}  # never persisted, not in the bindings
        self._seq = 0
        self._opened = False
        # a cluster member's (see open): the data root's destinations are many members', and
        # this journal keeps, and writes, only those it was given (adopt / release)
        self.shared = False
        self._let_go: set[str] = set()  # (shared) released here: another member serves them

    # -- lifecycle ---------------------------------------------------------------------------
    def open(self, *, shared: bool = False) -> dict[str, DestinationInfo]:
        """Replay the bindings and start a writer for every destination; returns them.

        ``shared`` (a cluster member): other members own destinations of the same root, so
        none is opened now; each is opened when this member is given it (:meth:`adopt`) and
        let go when it is not any more (:meth:`release`)."""
        with self._lock:
            self.shared = shared
            dests, self._seq = bindings.replay(self.store.read_bindings())
            self._dests = {} if shared else dests
            for name in self._dests:
                self._start_writer(name)
            self._opened = True
            return dict(self._dests)

    def _replay(self) -> dict[str, DestinationInfo]:
        """(Under the lock.) The root's destinations as recorded now, by every member; the next
        event this journal records follows the last recorded."""
        dests, seq = bindings.replay(self.store.read_bindings())
        self._seq = max(self._seq, seq)
        return dests

    def recorded_kinds(self) -> dict[str, Kind]:
        """Every destination of the data root as recorded now (whichever member serves it), and
        its kind."""
        with self._lock:
            return {name: info.kind for name, info in self._replay().items()}

    def recorded(self, name: str) -> DestinationInfo | None:
        """``name`` as recorded now (a shared journal: whichever member serves it)."""
        with self._lock:
            return (self._replay() if self.shared else self._dests).get(name)

    def claim(self, name: str, epoch: int) -> None:
        """A shared journal is about to fence ``name`` with ``epoch``: its hot tier's directory
        for this owner is made first (see :mod:`spark_mq.journal.sealing`)."""
        if self._hot is not None and self.shared:
            sealing.claim(self._hot_dir(name), epoch)

    def unclaim(self, name: str, epoch: int) -> None:
        """The fence of :meth:`claim` failed: its directory goes again."""
        if self._hot is not None and self.shared:
            sealing.unclaim(self._hot_dir(name), epoch)

    def adopt(self, name: str, epoch: int) -> DestinationInfo | None:
        """A shared journal takes ``name`` on (its store already fenced with this member's
        ``epoch`` for it, after :meth:`claim`): its recorded state, what earlier owners' hot
        tiers hold moved to Delta, and a writer from its log's end. None when it is not
        recorded (deleted meanwhile)."""
        if self._hot is not None and name not in self._writers:
            if self.recorded(name) is None:
                return None
            # (outside the lock: the moves are Delta commits)
            sealing.absorb(self.store, name, self._hot_dir(name), self._hot, epoch)
        with self._lock:
            info = self._replay().get(name)
            if info is None:
                return None
            if name not in self._writers:
                self._start_writer(name, epoch)
            self._dests[name] = info
            self._let_go.discard(name)
            return info

    def release(self, name: str) -> int | None:
        """A shared journal lets ``name`` go (another member owns it now): what was taken is
        committed first (refused, and so never acknowledged, once the new owner fenced it).
        Returns where its log ends then (None: it was not written here)."""
        with self._lock:
            self._dests.pop(name, None)
            writer = self._writers.pop(name, None)
            self._tiers.pop(name, None)
            self._let_go.add(name)
        if writer is None:
            return None
        writer.close(drain=True, gone=_let_go(name))  # (its sink too: a hot tier moves it)
        return writer.next_offset

    def close(self) -> int:
        """Commit everything buffered, then stop the writers and the store. Returns how many
        records stay in the hot tier's segments, durable but not in Delta (moved at the next
        start, or by the broker that took over)."""
        with self._lock:
            writers, self._writers = list(self._writers.values()), {}
        for w in writers:
            w.close(drain=True)
        self.store.close()
        with self._lock:
            return sum(t.unmoved for t in self._tiers.values())

    @property
    def commits_are_quick(self) -> bool:
        """Whether a commit takes about a sync (the hot tier, memory), so a loop serving many
        clients may commit itself. Not a Delta commit (15-50 ms), and not a commit that waits
        for a backup's acknowledgement (a round trip at best, ``ha.failover_timeout_s`` when
        the backup is silent): those stay on the writer threads."""
        if self.replica is not None and self.replica.replicated_acks:
            return False
        return self._hot is not None or not self.store.durable

    def _start_writer(self, name: str, epoch: int | None = None) -> None:
        """``epoch``: a shared journal's, the epoch it owns ``name`` with (its earlier owners'
        hot tiers already absorbed: :meth:`adopt`)."""
        sink: CommitSink
        if self._hot is not None:
            root = self._hot_dir(name)
            if self.shared:
                assert epoch is not None, "a shared journal's writer is its epoch's"
                directory = sealing.owner_dir(root, epoch)
            else:  # (a root a cluster served before: what its members' tiers hold moves first)
                sealing.absorb(self.store, name, root, self._hot, None)
                directory = root
            tier = HotTier(self.store, name, directory, self._hot)
            if self.shared:
                tier.producers.state_at = self.producer_state
            if self.replica is not None:
                tier.attach_replica(self.replica)
            next_offset = tier.open()
            self._tiers[name] = sink = tier
        else:
            sink = direct = DirectSink(self.store, name)
            if self.shared:
                direct.producers.state_at = self.producer_state
            next_offset = self.store.committed_end(name)
        self._writers[name] = DestinationWriter(
            sink, name, next_offset, on_commit=self._on_commit, **self._writer_opts
        )

    def _hot_dir(self, name: str) -> str:
        assert self._hot is not None
        return layout.hot_uri(self._hot.directory, name)

    def _writer(self, name: str) -> DestinationWriter:
        try:
            return self._writers[name]
        except KeyError:
            if name in self._let_go:  # (a request that found it just before it was let go)
                raise _let_go(name) from None
            raise DestinationNotFound(
                f"destination {name!r} does not exist", destination=name
            ) from None

    def _record(self, ev: str, destination: str, **kw: object) -> None:
        self.store.append_bindings(
            bindings.event(self._seq, ev, destination, time_us=self._now_us(), **kw)  # type: ignore[arg-type]
        )
        self._seq += 1

    # -- bindings ----------------------------------------------------------------------------
    @property
    def destinations(self) -> dict[str, DestinationInfo]:
        with self._lock:
            return dict(self._dests)

    def destination(self, name: str) -> DestinationInfo:
        with self._lock:
            try:
                return self._dests[name]
            except KeyError:
                raise DestinationNotFound(
                    f"destination {name!r} does not exist", destination=name
                ) from None

    def create_destination(
        self,
        name: str,
        kind: Kind,
        settings: dict[str, Any] | None = None,
        subscriptions: Mapping[str, str | None] | None = None,
    ) -> tuple[DestinationInfo, bool]:
        """Create a queue or topic; returns it and whether it was new. Idempotent per kind.

        ``settings`` (already validated by the caller) are recorded with it; a topic's
        ``subscriptions`` (durable, each with its selector, already checked) too, in the same
        commit, each from the log's start (a partition added to a topic gets its topic's).
        """
        validate_stored_name(name)
        if kind not in ("queue", "topic"):
            raise ValueError(f"kind must be 'queue' or 'topic', got {kind!r}")
        with self._lock:
            existing = self._replay().get(name) if self.shared else self._dests.get(name)
            if existing is not None:
                if existing.kind != kind:
                    raise DestinationExists(
                        f"{name!r} already exists as a {existing.kind}", destination=name
                    )
                return existing, False
            subs = dict(subscriptions or {}) if kind == "topic" else {}
            for sub in subs:
                validate_name(sub, "subscription")
            self.store.drop_logs(name)  # leftovers of a delete interrupted by a crash
            if self._hot is not None:
                shutil.rmtree(self._hot_dir(name), ignore_errors=True)
            self.store.create_logs(name)
            now = self._now_us()
            events = [
                bindings.event(
                    self._seq,
                    bindings.CREATE_DESTINATION,
                    name,
                    time_us=now,
                    kind=kind,
                    settings=settings,
                )
            ]
            events += [
                bindings.event(
                    self._seq + 1 + i,
                    bindings.CREATE_SUBSCRIPTION,
                    name,
                    time_us=now,
                    subscription=sub,
                    start_offset=0,
                    settings={"selector": selector} if selector else None,
                )
                for i, (sub, selector) in enumerate(subs.items())
            ]
            self.store.append_bindings(pa.concat_tables(events))
            self._seq += len(events)
            info = bindings.new_destination(name, kind, settings)
            for sub, selector in subs.items():
                info.subscriptions[sub] = SubscriptionInfo(name, sub, 0, selector=selector)
            if not self.shared:  # (a shared journal's member serves it once given it: adopt)
                self._dests[name] = info
                self._start_writer(name)
            return info, True

    def configure_destination(self, name: str, settings: dict[str, Any]) -> None:
        """Replace a destination's recorded settings."""
        with self._lock:
            info = self.destination(name)
            self._record(bindings.CONFIGURE_DESTINATION, name, settings=settings or None)
            info.settings.clear()
            info.settings.update(settings)

    def create_temporary(self, name: str) -> DestinationInfo:
        """A queue kept in memory only: no bindings event, no logs on disk (the seeds'
        temporary destinations, which live as long as the connection that made them)."""
        validate_name(name)
        with self._lock:
            if name in self._dests:
                raise DestinationExists(f"{name!r} already exists", destination=name)
            store = MemoryStore()
            store.create_logs(name)
            info = bindings.new_destination(name, "queue")
            self._dests[name] = info
            self._temporary[name] = store
            self._writers[name] = DestinationWriter(
                DirectSink(store, name), name, 0, on_commit=self._on_commit, **self._writer_opts
            )
            return info

    def is_temporary(self, name: str) -> bool:
        with self._lock:
            return name in self._temporary

    def _store_of(self, name: str) -> LogStore:
        return self._temporary.get(name, self.store)

    def delete_destination(self, name: str, *, only_if_end: int | None = None) -> bool:
        """Delete a destination and its logs; pending appends fail with DestinationNotFound.

        ``only_if_end``: only if its log still ends there and no append is under way (see
        :meth:`DestinationWriter.close_if_untouched`); returns whether it was deleted."""
        with self._lock:
            if name in self._temporary:
                del self._dests[name], self._temporary[name]
                writer = self._writers.pop(name)
                writer.close(drain=False)
                return True
            self.destination(name)
            if only_if_end is not None and not self._writers[name].close_if_untouched(only_if_end):
                return False
            self._record(bindings.DELETE_DESTINATION, name)
            del self._dests[name]
            writer = self._writers.pop(name)
            tier = self._tiers.pop(name, None)
        writer.close(drain=False)
        if tier is not None:
            shutil.rmtree(self._hot_dir(name), ignore_errors=True)
            if self.replica is not None:
                self.replica.dropped(name)
        self.store.drop_logs(name)
        return True

    def hot_tiers(self) -> list[HotTier]:
        with self._lock:
            return list(self._tiers.values())

    def create_subscription(
        self, destination: str, name: str, selector: str | None = None
    ) -> tuple[SubscriptionInfo, bool]:
        """A durable subscription on a topic: it receives what is published from now on
        (only what ``selector``, already checked by the caller, selects)."""
        validate_name(name, "subscription")
        with self._lock:
            info = self.destination(destination)
            if info.kind != "topic":
                raise DestinationExists(
                    f"{destination!r} is a {info.kind}; subscriptions are for topics",
                    destination=destination,
                )
            if name in info.subscriptions:
                return info.subscriptions[name], False
            start = self._writer(destination).next_offset
            self._record(
                bindings.CREATE_SUBSCRIPTION,
                destination,
                subscription=name,
                start_offset=start,
                settings={"selector": selector} if selector else None,
            )
            sub = SubscriptionInfo(destination, name, start, selector=selector)
            info.subscriptions[name] = sub
            return sub, True

    def delete_subscription(self, destination: str, name: str) -> None:
        with self._lock:
            info = self.destination(destination)
            if name not in info.subscriptions or info.kind != "topic":
                raise SubscriptionNotFound(
                    f"topic {destination!r} has no subscription {name!r}",
                    destination=destination,
                    subscription=name,
                )
            self._record(bindings.DELETE_SUBSCRIPTION, destination, subscription=name)
            del info.subscriptions[name]

    # -- logs --------------------------------------------------------------------------------
    def append(
        self, destination: str, messages: Messages, inline: InlineCommit | None = None
    ) -> Future:
        """Buffer ``messages`` (rows of ``UNOFFSET_SCHEMA``, or plain messages with their
        enqueue time set) for the next group commit (``inline``'s holder commits it, else the
        destination's writer thread).

        The future resolves to an :class:`AppendResult` once they are durable.
        """
        rows = messages.rows
        if rows is not None and not rows.schema.equals(UNOFFSET_SCHEMA):
            raise SchemaMismatch(
                f"journal rows for {destination!r} must have the schema {UNOFFSET_SCHEMA}, "
                f"got {rows.schema}",
                destination=destination,
            )
        return self._writer(destination).submit(messages, inline)

    def settle(
        self,
        destination: str,
        offsets: list[int],
        *,
        subscription: str,
        outcome: str = "ack",
        reason: str | None = None,
        inline: InlineCommit | None = None,
    ) -> Future:
        """Record that ``subscription`` is done with ``offsets``; resolves once durable."""
        # a copy: the record is the journal's until it is in Delta, whatever the caller does
        record = Settlement(tuple(offsets), subscription, outcome, self._now_us(), reason)
        return self._writer(destination).submit(record, inline)

    # -- transactions ------------------------------------------------------------------------
    def record_transactions(self, rows: pa.Table) -> None:
        """Append to the transaction log; durable when this returns."""
        self.store.append_transactions(rows)

    def read_transactions(self) -> pa.Table:
        return self.store.read_transactions()

    def end_offset(self, destination: str) -> int:
        """One past the last durable offset of ``destination``."""
        return self._writer(destination).next_offset

    def flush(self, destination: str | None = None) -> None:
        with self._lock:
            writers = [self._writer(destination)] if destination else list(self._writers.values())
        for w in writers:
            w.flush()

    def move(self, destination: str | None = None, *, timeout: float | None = None) -> bool:
        """Hot tier: commit what is durable now to Delta and wait; False if ``timeout`` passed.

        Without a hot tier every durable record already is in the store: returns True.
        """
        with self._lock:
            if destination is not None:
                self._writer(destination)
                tiers = [t for n, t in self._tiers.items() if n == destination]
            else:
                tiers = list(self._tiers.values())
        return all(t.request_move(wait=True, timeout=timeout) for t in tiers)

    def read_messages(
        self,
        destination: str,
        start: int = 0,
        end: int | None = None,
        columns: Sequence[str] | None = None,
    ) -> pa.Table:
        """Durable rows ``start <= offset < end``, whichever tier holds them (of ``columns``
        only: :func:`spark_mq.schema.message_columns`)."""
        self.destination(destination)
        tier = self._tiers.get(destination)
        if tier is not None:
            return tier.read_messages(start, end, columns)
        return self._store_of(destination).read_messages(destination, start, end, columns)

    def read_recent(self, destination: str, start: int, end: int) -> pa.Table | None:
        """Durable rows ``start <= offset < end`` when the hot tier still holds them all in
        memory (a read quick enough for an event loop), else None."""
        tier = self._tiers.get(destination)
        return tier.read_recent(start, end) if tier is not None else None

    def read_settlements(self, destination: str) -> pa.Table:
        """Durable settlement rows (with a hot tier, a row may appear twice while it moves)."""
        self.destination(destination)
        tier = self._tiers.get(destination)
        if tier is not None:
            return tier.read_settlements()
        return self._store_of(destination).read_settlements(destination)

    def stats(self, destination: str) -> WriterStats:
        return self._writer(destination).stats

    def tier_stats(self, destination: str) -> HotTierStats | None:
        """How far Delta trails the hot tier (None without a hot tier)."""
        self._writer(destination)
        tier = self._tiers.get(destination)
        return tier.stats() if tier is not None else None


def _let_go(name: str) -> NotOwner:
    """What a request for a destination a shared journal let go just now is told (it found it
    before it was let go): ask the member again, which says where it is served now."""
    return NotOwner(
        f"{name!r} was let go by this member just now (another serves it): ask again where it is",
        destination=name,
        member="",
        endpoint="",
        epoch=0,
    )
