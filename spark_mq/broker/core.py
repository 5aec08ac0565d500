"""The broker: destinations, subscriptions and consumers above the journal. This module has its
life (start, recovery, timers, close) and the produce path; two parts are mixed in: administering
destinations (:mod:`spark_mq.broker.admin_ops`) and attaching consumers, browsing and purging
(:mod:`spark_mq.broker.attaching`).

Thread-safety: every public method may be called from any thread (the Flight server calls them
from its gRPC threads).
"""

from __future__ import annotations

import itertools
import logging
import os
import socket
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from spark_mq.broker import transactions
from spark_mq.broker.admin_ops import DestinationAdmin
from spark_mq.broker.attaching import Attaching
from spark_mq.broker.claims import Claims
from spark_mq.broker.commands import TransactionAck
from spark_mq.broker.dedup import DuplicateCache, combine
from spark_mq.broker.destination import (
    Destination,
    default_expiry,
    hot_tier_settings,
    make_store,
)
from spark_mq.broker.disk import DiskMonitor, journal_disk
from spark_mq.broker.disposal import Disposer
from spark_mq.broker.limits import Limits
from spark_mq.broker.memory import MemoryMonitor
from spark_mq.broker.message_store import MessageStore
from spark_mq.broker.recovery import recover_destination
from spark_mq.broker.selector import Selector, compile_selector
from spark_mq.broker.subscription import Subscription
from spark_mq.broker.tenure import Tenure
from spark_mq.clock import Clock, SystemClock
from spark_mq.config import BrokerConfig, DestinationSettings
from spark_mq.errors import (
    ConfigError,
    Deposed,
    MessageTooLarge,
    NotAllowed,
)
from spark_mq.journal import DestinationInfo, Journal, LogStore
from spark_mq.journal.base import Kind
from spark_mq.journal.dir_lock import DataDirLock, lock_dir
from spark_mq.journal.hot_tier import has_segments
from spark_mq.journal.inline_commit import InlineCommit
from spark_mq.journal.timing import CommitTiming
from spark_mq.plain import PlainMessage, plain_batch
from spark_mq.schema import (
    body_too_large,
    normalize_produce_batch,
)

log = logging.getLogger(__name__)
_CLOSE_MOVES_S = 30.0  # how long a clean shutdown waits for dead-letter and expiry moves


class Broker(DestinationAdmin, Attaching):
    def __init__(
        self,
        config: BrokerConfig | None = None,
        *,
        clock: Clock | None = None,
        store: LogStore | None = None,
    ) -> None:
        self.config = config or BrokerConfig()
        self.clock = clock or SystemClock()
        store = store or make_store(self.config)
        # the journal's histograms for the metrics endpoint (broker.metrics = false: none kept)
        self.timing = CommitTiming() if self.config.broker.metrics else None
        self.journal = Journal(
            store,
            buffer_timeout_s=self.config.journal.buffer_timeout_ms / 1000,
            buffer_size_bytes=self.config.journal.buffer_size_bytes,
            max_pending_bytes=self.config.journal.max_pending_bytes,
            settle_timeout_s=self.config.journal.settle_timeout_ms / 1000,
            on_commit=self._on_commit,
            now_us=lambda: int(self.clock.wall() * 1_000_000),
            hot_tier=hot_tier_settings(self.config) if store.durable else None,
            timing=self.timing,
        )
        self._lock = threading.RLock()
        self._dests: dict[str, Destination] = {}
        self._consumer_ids = itertools.count(1)
        self._stop = threading.Event()
        self._timer: threading.Thread | None = None
        self._dir_lock: DataDirLock | None = None
        # high availability: this broker's name, its ownership epoch (None: not fenced), and
        # the error that deposed it (and whom to tell: the service steps down)
        self.broker_id = self.config.ha.broker_id or f"{socket.gethostname()}-{os.getpid()}"
        self.tenure: Tenure | None = None  # what it serves under (see start)
        self.deposed: Deposed | None = None
        self.on_deposed: Callable[[Deposed], None] | None = None
        self.on_handover: Callable[[], None] | None = None  # the service, for hand_over()
        self.unmoved = 0  # records left in the hot tier's segments at close (not in Delta)
        self._next_reap = 0.0
        # where it is in its life, for readiness probes (spark_mq.ops.health): starting,
        # backup (waiting to take over), recovering, serving (the service sets it once it
        # listens), stopping, stopped
        self.phase = "starting"
        self.started_at = time.time()
        self.memory = MemoryMonitor(self.config.limits.memory_budget_bytes)
        self.disk = DiskMonitor(journal_disk(self.config), self.config.limits.min_free_disk_bytes)
        self.claims = Claims(self, self._consumer_ids)
        self.disposer = Disposer(self)
        self.limits = Limits(self)

    # -- lifecycle ---------------------------------------------------------------------------
    def start(self, *, run_timers: bool = True, tenure: Tenure | None = None) -> None:
        """Open the journal, rebuild every destination, start the lease timer.

        ``tenure``: what this broker serves under, begun by the service before
        (:func:`spark_mq.ha.term.begin`: the data directory's lock, the ownership epoch that
        fences the store, a replicating primary's replication); ended by the service after
        :meth:`close`. Without one (a broker of its own, in a test), the data directory's lock
        is taken here, and high availability is not available."""
        self.tenure = tenure
        if tenure is None:
            where = lock_dir(self.config)  # (says what a replicating broker lacks, first)
            if self.config.ha.mode != "none":
                raise ConfigError(
                    f"ha.mode = {self.config.ha.mode!r} needs its term begun first "
                    "(spark_mq.ha.term.begin; the service does it)",
                    setting="ha.mode",
                )
            self._dir_lock = DataDirLock(where).acquire() if where is not None else None
        started = time.perf_counter()
        self.phase = "recovering"
        try:
            self._open()
        except BaseException:
            self._release_dir()
            raise
        if run_timers:
            self._timer = threading.Thread(
                target=self._timer_loop, name="broker-timers", daemon=True
            )
            self._timer.start()
        log.info("started in %.2fs", time.perf_counter() - started)

    @property
    def epoch(self) -> int | None:
        """The ownership epoch it serves under (None: not fenced, no high availability)."""
        return self.tenure.epoch if self.tenure is not None else None

    def deposed_by(self, err: Deposed) -> None:
        """(Any committing thread; the term's ``on_deposed``.) Another broker took over:
        acknowledge nothing more (the store refuses every commit), and tell the service."""
        self._deposed(err)

    def _deposed(self, err: Deposed) -> None:
        """(Any committing thread.) Another broker took over: acknowledge nothing more."""
        if self.deposed is None:
            self.deposed = err
            log.error("deposed: %s", err.message)
            if self.on_deposed is not None:
                self.on_deposed(err)

    def hand_over(self) -> dict[str, Any]:
        """A planned switchover (the ``promote`` admin action): this primary stops serving as a
        shutdown does (clients are told, everything taken is answered), lets go of the data,
        and waits as the backup; the backup takes over."""
        if self.config.ha.mode == "none" or self.on_handover is None:
            raise NotAllowed(
                'this broker has no backup to hand over to (ha.mode = "none")',
            )
        log.info("handing over to the backup (promote), epoch %s", self.epoch)
        self.on_handover()
        return {"handing_over": True, "broker_id": self.broker_id, "epoch": self.epoch}

    def ha_state(self) -> dict[str, Any]:
        """Role and epoch (and the replication's state), for ping and stats."""
        if self.tenure is not None:
            return self.tenure.state()
        return {
            "ha_mode": self.config.ha.mode,
            "role": "primary",
            "broker_id": self.broker_id,
            "epoch": None,
        }

    def status(self) -> dict[str, Any]:
        """What an operator asks first: version, phase, role, uptime, memory and disk."""
        from spark_mq.version import __version__

        with self._lock:
            n = sum(1 for d in self._dests.values() if not d.temporary)
        return {
            "version": __version__,
            "phase": self.phase,
            "uptime_s": round(time.time() - self.started_at, 1),
            "destinations": n,
            "data_dir": self.config.broker.data_dir,
            "persistence": self.config.broker.persistence,
            **self.ha_state(),
            **self.memory.stats(),
            **self.disk.stats(),
        }

    def _release_dir(self) -> None:
        if self._dir_lock is not None:
            self._dir_lock.release()
            self._dir_lock = None

    def _open(self) -> None:
        started = time.perf_counter()
        self._refuse_unmoved_segments()
        infos = self.journal.open()
        self.disk.measure()
        now_us = int(self.clock.wall() * 1_000_000)
        for record in transactions.unfinished(self.journal.read_transactions()):
            transactions.replay(self.journal, record, now_us)
        for info in infos.values():
            self._recover(info)
        log.info("recovered %d destination(s) in %.2fs", len(infos), time.perf_counter() - started)

    def _refuse_unmoved_segments(self) -> None:
        """Delta-only over a hot tier a crash left behind would ignore acknowledged messages."""
        if self.config.journal.hot_tier or not self.journal.store.durable:
            return
        try:
            location = self.config.hot_dir_location()
        except ConfigError:
            return  # a remote data_dir without hot_dir: there never was a local hot tier
        left = has_segments(location) if location else []
        if left:
            raise ConfigError(
                f"journal.hot_tier is false, but {location} still holds hot-tier segments of "
                f"{', '.join(left)} that may not be in Delta yet: start once with "
                "journal.hot_tier = true and stop cleanly (SIGTERM moves them), then switch",
                setting="journal.hot_tier",
            )

    def close(self) -> None:
        """Stop timers and flush every pending commit (graceful shutdown)."""
        self.phase = "stopping"
        self._stop.set()
        if self._timer is not None:
            self._timer.join()
        with self._lock:
            sessions = [s for d in self._dests.values() for s in d.sessions.values()]
        for s in sessions:
            s.close()
        with self._lock:
            dests = list(self._dests.values())
        for dest in dests:  # record the returns the last timer run did not see
            with dest.lock:
                subs = list(dest.subscriptions.values())
            for sub in subs:
                self.disposer.record_returns(dest, sub)
        # a message moved to a dead-letter or expiry queue is settled once its copy is durable:
        # closing the journal in between would leave both (and move it again after a restart)
        if not self.disposer.wait_under_way(timeout=_CLOSE_MOVES_S):
            log.warning(
                "closing with dead-letter or expiry moves unfinished after %.0f s: their "
                "messages are moved again after the restart",
                _CLOSE_MOVES_S,
            )
        self.unmoved = self.journal.close()
        self._release_dir()
        self.phase = "stopped"

    def _recover(self, info: DestinationInfo) -> None:
        subs, rows = recover_destination(self.journal, info)
        dest = self._new_destination(info.name, info.kind, info.settings)
        self._refill_dedup(dest)
        dest.store.add(rows)
        for rs in subs:
            dest.subscriptions[rs.name] = self._subscription(
                dest,
                rs.name,
                rs.start_offset,
                next_offset=rs.low_water,
                settled=rs.settled_above,
                returned=rs.returned,
                selector=compile_selector(info.subscriptions[rs.name].selector),
            )
            self.claims.restore(info.name, dest.subscriptions[rs.name], rs.claims, rs.released)
        with self._lock:
            self._dests[info.name] = dest
        log.info(
            "destination %s (%s): end offset %d, %d unsettled row(s) in memory",
            info.name,
            info.kind,
            self.journal.end_offset(info.name),
            dest.store.rows,
        )

    def _new_destination(
        self, name: str, kind: Kind, overrides: dict[str, Any] | None = None
    ) -> Destination:
        d = self.config.duplicates
        cache = DuplicateCache(d.cache_size, d.window_s) if d.cache_size else None
        overrides = dict(overrides or {})
        unknown = [k for k in overrides if k not in DestinationSettings.model_fields]
        if unknown:  # recorded by another version: say so, do not refuse to start
            log.warning("%s: ignoring unknown recorded setting(s) %s", name, unknown)
            overrides = {k: v for k, v in overrides.items() if k not in unknown}
        settings = self.config.destinations.with_overrides(overrides)
        store = MessageStore(lambda start, end: self.journal.read_messages(name, start, end))
        dest = Destination(name, kind, settings, overrides, store=store, dedup=cache)
        dest.last_used = self.clock.monotonic()
        return dest

    def _refill_dedup(self, dest: Destination) -> None:
        """Recent dedup ids from the log's newest rows, so a resend after a crash is caught."""
        if dest.dedup is None:
            return
        end = self.journal.end_offset(dest.name)
        start = max(0, end - dest.dedup.size)
        if start == end:
            return
        rows = self.journal.read_messages(dest.name, start, end)
        since = self.clock.wall() - dest.dedup.window_s
        at = pc.divide(rows["enqueue_time"].cast(pa.int64()), 1_000_000.0)
        for dedup_id, offset, t in zip(
            rows["dedup_id"].to_pylist(),
            rows["offset"].to_pylist(),
            at.to_pylist(),
            strict=True,
        ):
            if dedup_id is not None and t >= since:
                dest.dedup.remember(dedup_id, offset, t)

    def _subscription(
        self,
        dest: Destination,
        name: str,
        start: int,
        *,
        next_offset: int,
        settled: set[int],
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
        sub.next_offset = next_offset
        return sub

    def _timer_loop(self) -> None:
        interval = self.config.delivery.lease_check_interval_ms / 1000
        while not self._stop.wait(interval):
            try:
                self.disk.measure()
                self.run_timers()
            except Exception:
                log.exception("broker timer failed")

    def run_timers(self, *, reap: bool | None = None) -> int:
        """Expire lapsed leases, release scheduled messages whose time came, dispose of
        dead-lettered / expired ones and drop settled rows from memory; returns leases expired.

        The expiry reaper runs every ``delivery.expiry_scan_interval_s`` (``reap`` forces it).
        """
        expired = 0
        now = self.clock.monotonic()
        if reap is None:
            reap = now >= self._next_reap
        if reap:
            self._next_reap = now + self.config.delivery.expiry_scan_interval_s
        with self._lock:
            dests = list(self._dests.values())
        for dest in dests:
            with dest.lock:
                subs = list(dest.subscriptions.values())
                sessions = list(dest.sessions.values())
            n = sum(sub.expire_leases() for sub in subs)
            if n:
                expired += n
                for s in sessions:
                    s.lapsed()
            for sub in subs:
                sub.tick()
                if reap:
                    sub.reap_expired()
                self.disposer.run(dest, sub)
            low = min((sub.low_water() for sub in subs), default=None)
            if low is None:
                low = self.journal.end_offset(dest.name)
            dest.store.drop_below(low)
            self._maybe_auto_delete(dest, subs, now)
        self.memory.measure(d.store for d in dests)
        return expired

    def _maybe_auto_delete(self, dest: Destination, subs: list[Subscription], now: float) -> None:
        if not dest.settings.auto_delete or dest.temporary:
            return
        if now - dest.last_used < self.config.broker.auto_delete_delay_s or dest.sessions:
            return
        end = self.journal.end_offset(dest.name)
        if any(sub.depth_estimate(end) for sub in subs):
            return
        with self._lock:  # a producer or consumer arriving now waits for the decision
            if (
                dest.sessions
                or self._dests.get(dest.name) is not dest
                or self.clock.monotonic() - dest.last_used < self.config.broker.auto_delete_delay_s
            ):
                return
            # deleted only if nothing was appended since ``end`` was read: an append that got
            # in between was acknowledged, then deleted with the queue
            if not self.delete_destination(dest.name, internal=True, only_if_end=end):
                return
        log.info(
            "auto-deleted %s %s: unused and empty",
            dest.kind,
            dest.name,
            extra={"destination": dest.name},
        )

    # -- the journal tells us what became durable ---------------------------------------------
    def _on_commit(self, destination: str, rows: pa.Table) -> None:
        # (no broker lock: a deletion holds it while it waits for the writer of this commit)
        dest = self._dests.get(destination)
        if dest is None:
            return
        with dest.lock:
            dest.produced_total += rows.num_rows
            if not dest.subscriptions:
                return  # a topic nobody subscribes to: the log keeps it, memory need not
            dest.store.add(rows)
            subs = list(dest.subscriptions.values())
        for sub in subs:
            sub.wake()

    # -- produce / consume -------------------------------------------------------------------
    def produce(
        self,
        destination: str,
        batch: pa.RecordBatch | pa.Table,
        inline: InlineCommit | None = None,
    ) -> Future:
        """Check and append a batch; the future resolves once it is durable (``inline``: its
        holder commits it, see :class:`~spark_mq.journal.inline_commit.InlineCommit`).

        To an ``AppendResult``; or, when some rows were duplicates (their dedup id was stored
        within the window), to a ``ProduceResult`` giving each row the offset its original has.
        """
        dest = self.destination_for_use(destination)
        self.disk.admit(destination)
        now = self.clock.wall()
        rows = self._checked_rows(dest, batch, now)
        self.limits.make_room(dest, rows.num_rows, rows["body"].nbytes)
        self.limits.admit_memory(dest, rows.get_total_buffer_size())
        return self._store(dest, rows, now, inline)

    def produce_plain(
        self, destination: str, message: PlainMessage, inline: InlineCommit | None = None
    ) -> Future:
        """:meth:`produce` for one plain message (:mod:`spark_mq.plain`), with the same checks
        and the same stored row, built without Arrow."""
        dest = self.destination_for_use(destination)
        self.disk.admit(destination)
        if dest.settings.default_ttl_ms:  # the row gets an expiry time: not plain
            return self.produce(destination, plain_batch(message), inline)
        now = self.clock.wall()
        limit = self.config.limits.max_message_bytes
        if len(message.body) > limit:
            raise body_too_large(len(message.body), limit, dest.name)
        message.enqueue_time_us = int(now * 1_000_000)
        self.limits.make_room(dest, 1, len(message.body))
        self.limits.admit_memory(dest, message.nbytes)
        cache = dest.dedup
        if cache is None or message.dedup_id is None:
            return self.journal.append_plain(dest.name, message, inline)
        with dest.produce_lock:
            claim = cache.claim_one(message.dedup_id, now)
            if claim is None:  # seen before, or ids held as runs: claim() tells
                keep, dups, claim = cache.claim([message.dedup_id], now)
                if dups:
                    return combine(1, keep, None, dups)
            try:
                stored = self.journal.append_plain(dest.name, message, inline)
            except BaseException:
                cache.release(claim)
                raise
            cache.bind(claim, stored)
            return stored

    def store_checked(self, destination: str, batch: pa.Table) -> Future:
        """Store produce columns in ``destination`` as the broker itself, past every limit (a
        message moved to a dead-letter or expiry queue frees as much as it takes)."""
        dest = self._dest(destination)
        now = self.clock.wall()
        return self._store(dest, self._checked_rows(dest, batch, now), now)

    def commit_transaction(
        self, acks: list[TransactionAck], messages: pa.Table | None
    ) -> dict[str, list[int]]:
        """Send and ack atomically (``spark_mq.broker.transactions.commit``)."""
        return transactions.commit(self, acks, messages)

    def _checked_rows(self, dest: Destination, batch: pa.RecordBatch | pa.Table, now: float):
        limit = self.config.limits.max_batch_bytes
        # the size of its buffers: .nbytes walks every array to find shared ones (~17 us a
        # batch); a batch read off the wire shares none
        size = batch.get_total_buffer_size()
        if size > limit:
            raise MessageTooLarge(
                f"a batch of {size} bytes is over the limit of {limit} bytes "
                "(setting limits.max_batch_bytes): send smaller batches",
                destination=dest.name,
                size=size,
                limit=limit,
            )
        rows = normalize_produce_batch(
            batch,
            enqueue_time_us=int(now * 1_000_000),
            max_message_bytes=self.config.limits.max_message_bytes,
            destination=dest.name,
        )
        if dest.settings.default_ttl_ms:
            rows = default_expiry(rows, int(now * 1_000_000), dest.settings.default_ttl_ms)
        return rows

    def _store(
        self, dest: Destination, rows: pa.Table, now: float, inline: InlineCommit | None = None
    ) -> Future:
        """Append checked rows through duplicate detection."""
        cache = dest.dedup
        if cache is None or rows["dedup_id"].null_count == rows.num_rows:
            return self.journal.append(dest.name, rows, inline)
        with dest.produce_lock:
            keep, dups, claim = cache.claim(rows["dedup_id"], now)
            stored = None
            if keep:
                try:
                    kept = rows if not dups else rows.take(keep)
                    stored = self.journal.append(dest.name, kept, inline)
                except BaseException:
                    cache.release(claim)
                    raise
                cache.bind(claim, stored)
            if not dups:
                assert stored is not None  # (no duplicate: every row was kept)
                return stored
        return combine(rows.num_rows, keep, stored, dups)
