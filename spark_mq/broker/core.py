"""The broker: destinations, subscriptions and consumers above the journal, made of parts
that each own one concern and share the destinations registry (:mod:`~spark_mq.broker.
registry`) and the journal:

===============  ===============================================================================
``destinations`` the map of destinations and its lock; finding, making, letting go (registry)
``admin``        creating, configuring, deleting destinations and subscriptions; statistics
``consumers``    attaching consumers, temporary queues, browse, purge (attaching)
``producing``    the produce path: checks, limits, duplicate detection, append
``limits``       flow control: message and byte limits, memory states
``disposer``     returns, dead-letter and expiry moves (disposal)
``claims``       a Spark query's claims
``transactions`` local transactions
``moves``        moves and redrives
``log``          reading a destination as a log by offset (Kafka's fetch; log_reads)
``group_offsets`` Kafka consumer groups' committed offsets, durable in the journal
===============  ===============================================================================

This module has the broker's life (start, recovery, timers, close) and its face to the session
layer: each method hands the work to the part whose it is.

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
from typing import Any, Protocol

import numpy as np
import pyarrow as pa

from spark_mq import serving_threads
from spark_mq.broker import transactions
from spark_mq.broker.admin import DestinationAdmin
from spark_mq.broker.attaching import Attachments
from spark_mq.broker.claims import Claims
from spark_mq.broker.consumers import ConsumerSession, Wakeup
from spark_mq.broker.dedup import DuplicateCache
from spark_mq.broker.destination import Destination, hot_tier_settings, make_store
from spark_mq.broker.disk import DiskMonitor, journal_disk
from spark_mq.broker.disposal import Disposer
from spark_mq.broker.group_offsets import GroupOffsets
from spark_mq.broker.limits import Limits
from spark_mq.broker.log_reads import LogReads
from spark_mq.broker.log_tending import LogTending
from spark_mq.broker.memory import MemoryMonitor
from spark_mq.broker.moving import Moves
from spark_mq.broker.producing import Producing
from spark_mq.broker.recovery import recover_destination
from spark_mq.broker.registry import Destinations
from spark_mq.broker.selector import compile_selector
from spark_mq.broker.subscription import Subscription
from spark_mq.broker.tenure import Tenure
from spark_mq.broker.transactions import Transactions
from spark_mq.clock import Clock, SystemClock
from spark_mq.commands import TransactionAck
from spark_mq.config import BrokerConfig
from spark_mq.errors import ConfigError, Deposed, NotAllowed, NotOwner, SparkMQError
from spark_mq.journal import DestinationInfo, Journal, LogStore
from spark_mq.journal.base import Kind
from spark_mq.journal.dir_lock import DataDirLock, lock_dir
from spark_mq.journal.inline_commit import InlineCommit
from spark_mq.journal.sealing import has_segments
from spark_mq.journal.timing import CommitTiming
from spark_mq.messages import Messages
from spark_mq.names import KAFKA_OFFSETS
from spark_mq.version import __version__

log = logging.getLogger(__name__)
_CLOSE_MOVES_S = 30.0  # how long a clean shutdown waits for dead-letter and expiry moves
_RELEASE_MOVES_S = 10.0  # how long letting a destination go waits for them (a hand-over)
# rows and chunks (a chunk a commit) the timers look at a second per destination for settled
# ones above its mark: dropping 250 chunks of 2,000 rows took 1.4 ms, 10,000 of one row 51 ms
# (2026-12-06, a suite running beside it); with 500,000 rows a look, a consumer acking 600,000
# a second past a held message outran it (bench/held_bench.py)
SETTLED_SCAN_ROWS = 2_000_000
SETTLED_SCAN_CHUNKS = 10_000


class ClusterControl(Protocol):
    """A cluster member's face to the broker's operators (:mod:`spark_mq.cluster.member`)."""

    def state(self) -> dict[str, Any]: ...
    def pin(self, name: str, member: str | None) -> dict[str, Any]: ...


class Broker:
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
        # the logs of what it serves kept lean (spark_mq.broker.log_tending)
        self.log_tending = LogTending(
            self.journal,
            monotonic=self.clock.monotonic,
            now_us=lambda: int(self.clock.wall() * 1_000_000),
            nice=self.config.journal.mover_nice,
        )
        store.on_log_commit = self.log_tending.committed
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
        # the parts (see the module), each given what it works on
        journal, config = self.journal, self.config
        self.destinations = d = Destinations(config, self.clock, journal)
        journal.producer_state = d.producer_state_at
        self.disposer = Disposer(d, journal, self._store_copy)
        self.limits = Limits(d, journal, config, self.clock, self.memory, self.disposer, self._stop)
        self.producing = Producing(d, journal, config, self.clock, self.disk, self.limits)
        self.admin = DestinationAdmin(d, journal, config, self.memory, self.disk, self.ha_state)
        self.consumers = Attachments(d, journal, config, self.disposer, self._consumer_ids)
        self.claims = Claims(d, journal, self._consumer_ids)
        self.log = LogReads(d, journal)
        self.group_offsets = GroupOffsets(
            d,
            journal,
            lambda name, rows: self.producing.store_checked(name, rows),
            self._kept_as_offsets,
            self.clock.monotonic,
        )
        self.transactions = Transactions(
            d, journal, self.producing, self.limits, self.disk, self.clock
        )
        self.moves = Moves(d, self.consumers, self.transactions)
        # a cluster member takes destinations on and lets them go one at a time; its state
        # (members, owners, the session's health), for status (the service's member)
        self._handing = threading.Lock()
        self.cluster: ClusterControl | None = None
        # a cluster member's: stores messages at the member serving a destination (the
        # service's forwarding), for copies to a dead-letter or expiry queue served elsewhere
        self.store_elsewhere: Callable[[NotOwner, str, Messages], Future] | None = None

    def _store_copy(self, target: str, rows: pa.Table) -> Future:
        """A message's copy for its dead-letter or expiry queue (:mod:`.disposal`), stored
        here, or at the cluster member serving that queue. Before, a member refused it while
        the queue was another's, and the messages stayed until it happened to come here."""
        try:
            return self.producing.store_checked(target, rows)
        except NotOwner as owner:
            if self.store_elsewhere is None or not owner.fields.get("member"):
                raise  # (being placed just now: the next disposal round tries again)
            return self.store_elsewhere(owner, target, Messages.of(rows))

    def _kept_as_offsets(self, name: str) -> None:
        """The consumer groups' offsets topic, with its retention (created, or set on it)."""
        keep = self.config.broker.kafka_retention_s or 7 * 24 * 3600.0
        if self.admin.create_destination(name, "topic", {"retention_s": keep}):
            return
        if self.destinations.get(name).overrides.get("retention_s") != keep:
            self.admin.configure_destination(name, {"retention_s": keep})

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
        """Role and epoch (and the replication's state), for ping and stats; a cluster
        member's cluster (clients that see it follow the member that owns a destination)."""
        if self.tenure is not None:
            state = self.tenure.state()
        else:
            state = {
                "ha_mode": self.config.ha.mode,
                "role": "primary",
                "broker_id": self.broker_id,
                "epoch": None,
            }
        if self.config.clustered:
            state["cluster"] = self.config.cluster.name
        return state

    def status(self) -> dict[str, Any]:
        """What an operator asks first: version, phase, role, uptime, memory and disk."""
        n = sum(1 for d in self.destinations.all() if not d.temporary)
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
            **({"cluster": self.cluster.state()} if self.cluster is not None else {}),
        }

    def _release_dir(self) -> None:
        if self._dir_lock is not None:
            self._dir_lock.release()
            self._dir_lock = None

    def _open(self) -> None:
        started = time.perf_counter()
        self._refuse_unmoved_segments()
        if self.config.clustered:  # its destinations come as it is given them (acquire)
            self.journal.open(shared=True)
            self.disk.measure()
            return
        infos = self.journal.open()
        self.disk.measure()
        now_us = int(self.clock.wall() * 1_000_000)
        for record in transactions.unfinished(self.journal.read_transactions()):
            transactions.replay(self.journal, record, now_us)
        for info in infos.values():
            self._recover(info)
            self.log_tending.taken_on(info.name)
        log.info("recovered %d destination(s) in %.2fs", len(infos), time.perf_counter() - started)

    def _refuse_unmoved_segments(self, name: str | None = None) -> None:
        """Delta-only over a hot tier a crash left behind would ignore acknowledged messages
        (``name``: a cluster member taking that destination on, whose earlier owner may have
        had a hot tier)."""
        if self.config.journal.hot_tier or not self.journal.store.durable:
            return
        try:
            location = self.config.hot_dir_location()
        except ConfigError:
            return  # a remote data_dir without hot_dir: there never was a local hot tier
        left = has_segments(location, name) if location else []
        if left:
            raise ConfigError(
                f"journal.hot_tier is false, but {location} still holds hot-tier segments of "
                f"{', '.join(left)} that may not be in Delta yet: start once with "
                "journal.hot_tier = true and stop cleanly (SIGTERM moves them), then switch "
                "(every member of a cluster must have the same journal.hot_tier)",
                setting="journal.hot_tier",
            )

    def close(self) -> None:
        """Stop timers and flush every pending commit (graceful shutdown)."""
        self.phase = "stopping"
        self._stop.set()
        if self._timer is not None:
            self._timer.join()
        sessions = [s for d in self.destinations.all() for s in d.sessions.values()]
        for s in sessions:
            s.close()
        dests = self.destinations.all()
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
        self.transactions.close()  # (the done rows waiting: before the journal closes)
        self.log_tending.close()
        self.unmoved = self.journal.close()
        self._release_dir()
        self.phase = "stopped"

    # -- a cluster member's destinations (spark_mq.cluster.member) ------------------------------
    def acquire(self, name: str, epoch: int) -> bool:
        """Serve ``name`` from now on, owning it with ``epoch``: its tables fenced with it
        first (a member that owned it before commits nothing more to it), then its state
        recovered from the log as a restart would, with what a transaction left unapplied.
        False when it is no longer recorded (deleted meanwhile). ``Deposed`` when a greater
        epoch fenced it already (a newer owner)."""
        with self._handing:
            if self.destinations.find(name) is not None:
                return True
            started = time.perf_counter()
            store = self.journal.store
            self._refuse_unmoved_segments(name)
            self.journal.claim(name, epoch)  # (its hot tier's directory: before the fence)
            try:
                store.fence_destination(name, epoch)
            except Deposed:
                self.journal.unclaim(name, epoch)
                raise
            info = self.journal.adopt(name, epoch)
            if info is None:
                store.release_destination(name)
                return False
            fenced = time.perf_counter()
            now_us = int(self.clock.wall() * 1_000_000)
            for record in transactions.unfinished(self.journal.read_transactions()):
                if record.touches(name):
                    transactions.replay(self.journal, record, now_us, only=name)
            replayed = time.perf_counter()
            parts = self._recover(info, handed=store.handed_producers(name))
            self.log_tending.taken_on(name)
            done = time.perf_counter()
            # (what a take-on spent where: an operator's first question when moves are slow)
            log.info(
                "serving %s from now on (epoch %d), taken on in %.2fs (fence %.2f, "
                "transactions %.2f, delivery state %.2f, duplicate cache %.2f)",
                name,
                epoch,
                done - started,
                fenced - started,
                replayed - fenced,
                parts[0],
                parts[1],
                extra={"destination": name},
            )
            return True

    def pin(self, name: str, member: str | None) -> dict[str, Any]:
        """An operator's move: keep ``name`` on ``member`` (None: placement decides again)."""
        if self.cluster is None:
            raise NotAllowed(
                "this broker is not a cluster member (cluster.zookeeper): there is nowhere to "
                "pin a destination to"
            )
        return self.cluster.pin(name, member)

    def serving(self) -> list[str]:
        """The destinations served here (a temporary queue is its consumer's: not counted)."""
        return [d.name for d in self.destinations.all() if not d.temporary]

    def recorded_kinds(self) -> dict[str, Kind]:
        """Every destination of the data root and its kind (a cluster member's: whoever
        serves it)."""
        return self.journal.recorded_kinds()

    def forget_epoch(self, name: str) -> None:
        """A cluster member deleted ``name``: its fence goes with it."""
        self.journal.store.release_destination(name)

    def release(self, name: str, owner: NotOwner) -> bool:
        """Stop serving ``name`` (another member owns it now, as ``owner`` says): its consumers
        are told so and detached (what they held is redelivered by the new owner), what was
        taken is committed (refused, never acknowledged, once the new owner fenced it), and its
        state goes. False when it was not served here.

        First, outside the hand-over lock, the transactions writing to it and the dead-letter
        moves of its messages finish (none starts meanwhile): a move's copy may be on its way
        to a dead-letter queue being taken on here, which takes that lock (waited for under
        it, the copy waited 10 s and its original, never settled, was delivered again)."""
        self.destinations.begin_letting_go(name)
        try:
            if not self.disposer.wait_under_way(_RELEASE_MOVES_S, name):
                log.warning(
                    "letting %s go with dead-letter or expiry moves unfinished after %.0f s: "
                    "its new owner may deliver their messages again",
                    name,
                    _RELEASE_MOVES_S,
                    extra={"destination": name},
                )
            return self._let_go(name, owner)
        finally:
            self.destinations.end_letting_go(name)

    def _let_go(self, name: str, owner: NotOwner) -> bool:
        with self._handing:
            dest = self.destinations.forget(name)
            if dest is None:
                return False
            with dest.lock:
                sessions = list(dest.sessions.values())
                subs = list(dest.subscriptions.values())
            for s in sessions:
                s.ended_by = owner
                s.close()
            for sub in subs:
                self.disposer.record_returns(dest, sub)
            end = self.journal.release(name)
            if dest.dedup is not None and end is not None:
                self._hand_on_producers(name, dest.dedup, end)
            self.journal.store.release_destination(name)
            self.log_tending.forget(name)
            if name == KAFKA_OFFSETS:
                self.group_offsets.forget()
            log.info(
                "not serving %s any more: %s", name, owner.message, extra={"destination": name}
            )
            return True

    def _hand_on_producers(self, name: str, cache: DuplicateCache, end: int) -> None:
        """Write where each numbering producer got to in ``name``'s log, which ends at ``end``
        now that all it took is committed, for its next owner
        (:mod:`spark_mq.broker.producer_state`): one commit of no rows, 5-25 ms of a move
        under load."""
        try:
            self.journal.store.hand_on_producers(name, cache.handed(end))
        except SparkMQError as exc:
            log.warning(
                "could not hand %s's producer state on (%s): its next owner checks a Kafka "
                "producer's first batch only against its log's newest rows",
                name,
                exc,
                extra={"destination": name},
            )

    def _recover(self, info: DestinationInfo, handed: str | None = None) -> tuple[float, float]:
        """Serve ``info``'s destination from what its logs say; how long its delivery state
        (settlements and unsettled rows, subscriptions) and its duplicate cache took."""
        d = self.destinations
        started = time.perf_counter()
        subs, rows = recover_destination(self.journal, info)
        dest = d.build(info.name, info.kind, info.settings)
        read = time.perf_counter()
        d.refill_dedup(dest, handed)
        refilled = time.perf_counter()
        dest.store.add(Messages.of(rows))
        for rs in subs:
            dest.subscriptions[rs.name] = d.new_subscription(
                dest,
                rs.name,
                rs.start_offset,
                next_offset=rs.low_water,
                settled=rs.settled_above,
                returned=rs.returned,
                selector=compile_selector(info.subscriptions[rs.name].selector),
            )
            self.claims.restore(info.name, dest.subscriptions[rs.name], rs.claims, rs.released)
        d.add(dest)
        log.info(
            "destination %s (%s): end offset %d, %d unsettled row(s) in memory",
            info.name,
            info.kind,
            self.journal.end_offset(info.name),
            dest.store.rows,
        )
        return read - started + time.perf_counter() - refilled, refilled - read

    def _timer_loop(self) -> None:
        # it serves every destination: one being placed (a dead-letter queue a copy goes to)
        # is not waited for here, but tried again the next round (waited for, a cluster
        # member's copy to a queue it was about to take on waited for the hand-over of the
        # queue the copy came from, which waited for the copy)
        serving_threads.answers_at_once()
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
        dests = self.destinations.all()
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
            if subs and now >= dest.settled_scan_at and dest.store.rows:
                self._drop_settled(dest, low, now)
            self._maybe_auto_delete(dest, subs, now)
        self.memory.measure(d.store for d in dests)
        self.group_offsets.refresh_due()
        return expired

    def _drop_settled(self, dest: Destination, low: int, now: float) -> None:
        """Drop from memory the chunks above the low-water mark that every subscription has
        settled: a message held unacknowledged (scheduled far ahead, in a long lease, kept by
        a consumer) holds the mark, and without this every row after it, acknowledged or not,
        stayed in memory until the memory states evicted their bodies. Once a second, at most
        ``SETTLED_SCAN_ROWS`` rows and ``SETTLED_SCAN_CHUNKS`` chunks a time, where the last
        look stopped, and only as far as every subscription settled anything."""
        dest.settled_scan_at = now + 1.0
        start = max(dest.settled_scan_from, low)
        # (past it, some subscription settled nothing: no chunk there can go)
        upto = min((sub.settled_upto() for sub in list(dest.subscriptions.values())), default=-1)
        if upto < start:
            dest.settled_scan_from = 0
            return

        def settled(offsets: np.ndarray) -> np.ndarray:
            # (the subscriptions as they are now, not as the tick began: one made meanwhile
            # starts at the log's end, and a chunk past it is its too)
            flags = np.ones(len(offsets), dtype=np.bool_)
            for sub in list(dest.subscriptions.values()):
                flags &= sub.settled_mask(offsets)
            return flags

        dropped, dest.settled_scan_from = dest.store.drop_settled(
            settled, start, upto, SETTLED_SCAN_ROWS, SETTLED_SCAN_CHUNKS
        )
        if dropped:
            log.debug("%s: %d settled row(s) above its mark %d dropped from memory", dest.name,
                      dropped, low)  # fmt: skip

    def _maybe_auto_delete(self, dest: Destination, subs: list[Subscription], now: float) -> None:
        if not dest.settings.auto_delete or dest.temporary:
            return
        if now - dest.last_used < self.config.broker.auto_delete_delay_s or dest.sessions:
            return
        end = self.journal.end_offset(dest.name)
        if any(sub.depth_estimate(end) for sub in subs):
            return
        with self.destinations.lock:  # a producer or consumer arriving now waits for it
            if (
                dest.sessions
                or self.destinations.find(dest.name) is not dest
                or self.clock.monotonic() - dest.last_used < self.config.broker.auto_delete_delay_s
            ):
                return
            # deleted only if nothing was appended since ``end`` was read: an append that got
            # in between was acknowledged, then deleted with the queue
            if not self.admin.delete_destination(dest.name, internal=True, only_if_end=end):
                return
        self.log_tending.forget(dest.name)
        log.info(
            "auto-deleted %s %s: unused and empty",
            dest.kind,
            dest.name,
            extra={"destination": dest.name},
        )

    # -- the journal tells us what became durable ---------------------------------------------
    def _on_commit(self, destination: str, messages: Messages) -> None:
        self.destinations.committed(destination, messages)

    # -- the face the session layer sees: each call goes to the part whose work it is ----------
    def produce(
        self, destination: str, messages: Messages, inline: InlineCommit | None = None
    ) -> Future:
        """Check and append messages (see :meth:`Producing.produce
        <spark_mq.broker.producing.Producing.produce>`)."""
        return self.producing.produce(destination, messages, inline)

    def store_checked(self, destination: str, batch: pa.Table) -> Future:
        return self.producing.store_checked(destination, batch)

    def commit_transaction(
        self, acks: list[TransactionAck], messages: pa.Table | None, *, here: bool = False
    ) -> dict[str, list[int]]:
        """Send and ack atomically (:mod:`spark_mq.broker.transactions`)."""
        return self.transactions.commit(acks, messages, here=here)

    def finish_transactions(self, alive: set[str]) -> int:
        """(A cluster member's, now and then.) Transactions' parts for destinations served
        here that their coordinating member did not store (it was lost, or gave up waiting):
        :meth:`spark_mq.broker.transactions.Transactions.finish`."""
        return self.transactions.finish(alive)

    def create_destination(
        self, name: str, kind: Kind, settings: dict[str, Any] | None = None
    ) -> bool:
        return self.admin.create_destination(name, kind, settings)

    def configure_destination(self, name: str, settings: dict[str, Any]) -> dict[str, Any]:
        return self.admin.configure_destination(name, settings)

    def add_partitions(self, name: str, count: int) -> dict[str, Any]:
        return self.admin.add_partitions(name, count)

    def delete_destination(self, name: str) -> bool:
        deleted = self.admin.delete_destination(name)
        self.log_tending.forget(name)
        return deleted

    def create_subscription(self, destination: str, name: str, selector: str | None = None) -> bool:
        return self.admin.create_subscription(destination, name, selector)

    def delete_subscription(self, destination: str, name: str) -> None:
        self.admin.delete_subscription(destination, name)

    def has_subscription(self, destination: str, name: str) -> bool:
        return self.admin.has_subscription(destination, name)

    def list_destinations(self) -> list[dict[str, Any]]:
        return self.admin.list_destinations()

    def stats(self, name: str) -> dict[str, Any]:
        return self.admin.stats(name)

    def partitions(self, name: str, *, fresh: bool = False) -> dict[str, Any]:
        """``{"partitions", "kind"}`` of a partitioned destination; ``{"partitions": 1}`` for
        any other name (a destination, or none: whichever member is asked answers). ``fresh``:
        as recorded now, where partition 0 is served elsewhere (partitions may have been
        added: a read of the bindings log, not for a loop); else as read up to 10 s ago."""
        parts = self.destinations.partitioned(name, fresh=fresh)
        if parts is not None:
            return {"kind": parts[0], "partitions": parts[1]}
        return {"partitions": 1}

    def has_destination(self, name: str) -> bool:
        return self.destinations.has(name)

    def newest_dedup_number(self, name: str, prefix: str) -> int | None:
        """The number of the newest dedup id ``<prefix>-<n>`` that ``name``, served here,
        holds in its duplicate cache; -1 when its log certainly holds none; None when that is
        not known (not served here, no cache, or the cache does not hold all the log has)."""
        dest = self.destinations.find(name)
        if dest is None or dest.dedup is None:
            return None
        return dest.dedup.newest_number(prefix)

    def destination_kind(self, name: str) -> Kind | None:
        return self.destinations.kind(name)

    def kind_elsewhere(self, name: str) -> Kind | None:
        return self.destinations.kind_elsewhere(name)

    def destination_for_use(self, name: str) -> Destination:
        return self.destinations.for_use(name)

    def attach(
        self,
        destination: str,
        subscription: str | None = None,
        prefetch: int | None = None,
        *,
        selector: str | None = None,
        durable: bool = True,
        wakeup: Wakeup | None = None,
    ) -> ConsumerSession:
        """Attach a consumer (see :meth:`Attachments.attach
        <spark_mq.broker.attaching.Attachments.attach>`)."""
        return self.consumers.attach(
            destination, subscription, prefetch, selector=selector, durable=durable, wakeup=wakeup
        )

    def attach_temporary(
        self, prefetch: int | None = None, *, wakeup: Wakeup | None = None
    ) -> ConsumerSession:
        return self.consumers.attach_temporary(prefetch, wakeup=wakeup)

    def detach(self, session: ConsumerSession) -> None:
        self.consumers.detach(session)

    def browse(
        self,
        destination: str,
        subscription: str | None = None,
        *,
        limit: int = 100,
        selector: str | None = None,
    ) -> pa.Table:
        return self.consumers.browse(destination, subscription, limit=limit, selector=selector)

    def purge(self, destination: str, subscription: str | None = None) -> int:
        return self.consumers.purge(destination, subscription)
