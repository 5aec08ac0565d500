"""The broker: destinations, subscriptions and consumers above the journal.

Thread-safety: every public method may be called from any thread (the Flight server calls them
from its gRPC threads).
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
import uuid
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from spark_mq import protocol
from spark_mq.broker import disposal, transactions
from spark_mq.broker.claims import Claims
from spark_mq.broker.dedup import DuplicateCache, combine
from spark_mq.broker.memory import THROTTLE_S, MemoryMonitor
from spark_mq.broker.message_store import MessageStore
from spark_mq.broker.recovery import RETURNED, recover_destination
from spark_mq.broker.selector import Selector, compile_selector
from spark_mq.broker.session import ConsumerSession
from spark_mq.broker.subscription import Subscription
from spark_mq.clock import Clock, SystemClock
from spark_mq.config import BrokerConfig, DestinationSettings
from spark_mq.errors import (
    ConfigError,
    ConsumerRefused,
    DestinationExists,
    DestinationFull,
    DestinationNotFound,
    LeaseError,
    MessageTooLarge,
    NotAllowed,
    SparkMQError,
    SubscriptionNotFound,
)
from spark_mq.journal import DeltaStore, DestinationInfo, Journal, LogStore, MemoryStore, failpoints
from spark_mq.journal.base import Kind
from spark_mq.journal.hot_tier import HotTierSettings, has_segments
from spark_mq.names import validate_name
from spark_mq.schema import (
    MESSAGE_SCHEMA,
    QUEUE_SUBSCRIPTION,
    TS,
    normalize_produce_batch,
    numbered_ids,
)

log = logging.getLogger(__name__)


@dataclass
class Destination:
    name: str
    kind: Kind
    settings: DestinationSettings
    overrides: dict[str, Any] = field(default_factory=dict)  # what was set for this one
    store: MessageStore = field(default_factory=MessageStore)
    subscriptions: dict[str, Subscription] = field(default_factory=dict)
    sessions: dict[int, ConsumerSession] = field(default_factory=dict)
    lock: threading.RLock = field(default_factory=threading.RLock)
    produced_total: int = 0
    dedup: DuplicateCache | None = None
    temporary: bool = False  # memory only, gone with the consumer that made it
    last_used: float = 0.0  # monotonic time of the last produce or attach (auto-delete)
    # claim dedup ids, append, bind: one batch at a time, so a racing resend finds its original
    produce_lock: threading.Lock = field(default_factory=threading.Lock)


def _settled_in_memory(offsets: list[int], outcome: str) -> Future:
    """A non-durable subscription's acks need no journal record."""
    done: Future = Future()
    done.set_result(None)
    return done


def _default_expiry(rows: pa.Table, now_us: int, ttl_ms: int) -> pa.Table:
    """Messages without an expiry get the destination's default TTL."""
    expiry = rows["expiry_time"]
    if expiry.null_count == 0:
        return rows
    default = pa.scalar(now_us + ttl_ms * 1000, pa.int64()).cast(TS)
    i = rows.schema.get_field_index("expiry_time")
    return rows.set_column(i, rows.schema.field(i), pc.fill_null(expiry, default))


def hot_tier_settings(config: BrokerConfig) -> HotTierSettings | None:
    directory = config.hot_dir()
    if directory is None:
        return None
    j = config.journal
    return HotTierSettings(
        directory,
        segment_bytes=j.segment_bytes,
        sync=j.sync,
        move_interval_s=j.move_interval_ms / 1000,
        move_max_bytes=j.move_max_bytes,
        max_bytes=j.hot_max_bytes,
    )


def make_store(config: BrokerConfig) -> LogStore:
    if config.broker.persistence == "memory":
        return MemoryStore()
    return DeltaStore(
        config.broker.data_dir, checkpoint_interval=config.journal.checkpoint_interval
    )


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
        self.journal = Journal(
            store,
            buffer_timeout_s=self.config.journal.buffer_timeout_ms / 1000,
            buffer_size_bytes=self.config.journal.buffer_size_bytes,
            max_pending_bytes=self.config.journal.max_pending_bytes,
            on_commit=self._on_commit,
            now_us=lambda: int(self.clock.wall() * 1_000_000),
            hot_tier=hot_tier_settings(self.config) if store.durable else None,
        )
        self._lock = threading.RLock()
        self._dests: dict[str, Destination] = {}
        self._consumer_ids = itertools.count(1)
        self._stop = threading.Event()
        self._timer: threading.Thread | None = None
        self._next_reap = 0.0
        self.memory = MemoryMonitor(self.config.limits.memory_budget_bytes)
        self.claims = Claims(self, self._consumer_ids)

    # -- lifecycle ---------------------------------------------------------------------------
    def start(self, *, run_timers: bool = True) -> None:
        """Open the journal, rebuild every destination, start the lease timer."""
        started = time.perf_counter()
        self._refuse_unmoved_segments()
        infos = self.journal.open()
        now_us = int(self.clock.wall() * 1_000_000)
        for record in transactions.unfinished(self.journal.read_transactions()):
            transactions.replay(self.journal, record, now_us)
        for info in infos.values():
            self._recover(info)
        log.info("recovered %d destination(s) in %.2fs", len(infos), time.perf_counter() - started)
        if run_timers:
            self._timer = threading.Thread(
                target=self._timer_loop, name="broker-timers", daemon=True
            )
            self._timer.start()

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
                self._record_returns(dest, sub)
        self.journal.close()

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
            self.claims.restore(info.name, dest.subscriptions[rs.name], rs.claims)
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
                self._follow_up(dest, sub)
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
        with self._lock:
            if dest.sessions or self._dests.get(dest.name) is not dest:
                return
            self.delete_destination(dest.name, internal=True)
        log.info("auto-deleted %s %s: unused and empty", dest.kind, dest.name)

    # -- what subscriptions leave for the broker: returns to record, messages to move ---------
    def _follow_up(self, dest: Destination, sub: Subscription) -> list[Future]:
        """Record returned / filtered deliveries, dispose of doomed messages; their futures."""
        futures = self._record_returns(dest, sub)
        doomed = sub.claim_doomed()
        by_reason: dict[str, list[int]] = {}
        for offset, (why, _) in doomed.items():
            by_reason.setdefault(why, []).append(offset)
        counts = {o: n for o, (_, n) in doomed.items()}
        for why, offsets in by_reason.items():
            try:
                futures.append(self._dispose(dest, sub, why, sorted(offsets), counts))
            except Exception:
                sub.unclaim(offsets)
                log.exception(
                    "could not dispose of %d %s message(s) of %s", len(offsets), why, dest.name
                )
        return futures

    def _settle_doomed(
        self,
        dest: Destination,
        sub: Subscription,
        offsets: list[int],
        outcome: str,
        why: str,
        counts: dict[int, int],
    ) -> Future:
        reason = disposal.REASONS[why].format(n=max(counts.values(), default=0))
        return self.journal.settle(
            dest.name, offsets, subscription=sub.name, outcome=outcome, reason=reason
        )

    def _record_returns(self, dest: Destination, sub: Subscription) -> list[Future]:
        futures: list[Future] = []
        returned, filtered = sub.drain_log()
        if sub.durable:
            for offsets, outcome in ((returned, RETURNED), (filtered, "filtered")):
                if offsets:
                    futures.append(
                        self.journal.settle(
                            dest.name, offsets, subscription=sub.name, outcome=outcome
                        )
                    )
        return futures

    def _dispose(
        self,
        dest: Destination,
        sub: Subscription,
        why: str,
        offsets: list[int],
        counts: dict[int, int],
    ) -> Future:
        settings = dest.settings
        target = disposal.side_queue(
            dest.name, why, dead_letter=settings.dead_letter, expiry=settings.expiry
        )
        outcome = disposal.OUTCOMES[why]
        done: Future = Future()

        def settle(_: Future | None = None) -> None:
            if _ is not None and _.exception() is not None:
                sub.unclaim(offsets)
                done.set_exception(_.exception())
                return
            if not sub.durable:
                sub.finish(offsets, outcome)
                done.set_result(len(offsets))
                return
            try:
                fut = self._settle_doomed(dest, sub, offsets, outcome, why, counts)
            except SparkMQError as exc:  # the destination went, or the broker is closing
                sub.unclaim(offsets)
                done.set_exception(exc)
                return

            def finished(f: Future) -> None:
                if f.exception() is not None:
                    sub.unclaim(offsets)
                    done.set_exception(f.exception())
                else:
                    sub.finish(offsets, outcome)
                    done.set_result(len(offsets))

            fut.add_done_callback(finished)

        if target is None:
            settle()
            return done
        if target not in self._dests:
            self.create_destination(target, "queue", disposal.SIDE_QUEUE_SETTINGS)
        copy = disposal.side_copy(
            dest.store.take(offsets),
            destination=dest.name,
            subscription=sub.name,
            why=why,
            counts=counts,
            target=target,
        )
        # not through produce(): a move frees as much as it takes, so limits and memory states
        # must not block it (it runs on the timer thread)
        side = self._dest(copy.target)
        now = self.clock.wall()
        self._store(side, self._checked_rows(side, copy.rows, now), now).add_done_callback(settle)
        if why == "dead":
            log.info("dead-lettering %d message(s) of %s into %s", len(offsets), dest.name, target)
        return done

    # -- the journal tells us what became durable ---------------------------------------------
    def _on_commit(self, destination: str, rows: pa.Table) -> None:
        with self._lock:
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

    # -- admin -------------------------------------------------------------------------------
    def _dest(self, name: str) -> Destination:
        with self._lock:
            try:
                return self._dests[name]
            except KeyError:
                raise DestinationNotFound(
                    f"destination {name!r} does not exist (create it first, e.g. "
                    f"Admin.create_queue({name!r}))",
                    destination=name,
                ) from None

    def destination_for_use(self, name: str) -> Destination:
        """The destination a producer or consumer names: created as an auto-deleting queue
        when it does not exist and ``broker.auto_create_queues`` allows it."""
        with self._lock:
            dest = self._dests.get(name)
        if dest is None and self.config.broker.auto_create_queues:
            validate_name(name)
            if self.create_destination(name, "queue", {"auto_delete": True}):
                log.info("auto-created queue %s", name)
            dest = self._dest(name)
        elif dest is None:
            dest = self._dest(name)
        dest.last_used = self.clock.monotonic()
        return dest

    def _administrable(self, name: str) -> Destination:
        dest = self._dest(name)
        if dest.temporary:
            raise NotAllowed(
                f"{name!r} is a temporary queue: it belongs to the consumer that made it and "
                "goes with it; it cannot be administered",
                destination=name,
            )
        return dest

    def create_destination(
        self, name: str, kind: Kind, settings: dict[str, Any] | None = None
    ) -> bool:
        """Create a queue or topic (``settings``: overrides of ``[destinations]``)."""
        overrides = self._checked_settings(settings)
        with self._lock:
            _, created = self.journal.create_destination(name, kind, overrides)
            if created:
                dest = self._new_destination(name, kind, overrides)
                if kind == "queue":
                    dest.subscriptions[QUEUE_SUBSCRIPTION] = self._subscription(
                        dest, QUEUE_SUBSCRIPTION, 0, next_offset=0, settled=set()
                    )
                self._dests[name] = dest
                log.info("created %s %s", kind, name)
            return created

    def _checked_settings(self, settings: dict[str, Any] | None) -> dict[str, Any]:
        """Validated overrides, as given (so later changes of the defaults still apply)."""
        if not settings:
            return {}
        if not isinstance(settings, dict):
            raise ConfigError("destination settings must be an object", setting="settings")
        checked = self.config.destinations.with_overrides(settings)
        return {k: getattr(checked, k) for k in settings}

    def configure_destination(self, name: str, settings: dict[str, Any]) -> dict[str, Any]:
        """Change some settings of a destination; returns all of them (effective)."""
        dest = self._administrable(name)
        with dest.lock:
            overrides = {**dest.overrides, **self._checked_settings(settings)}
            effective = self.config.destinations.with_overrides(overrides)
            self.journal.configure_destination(name, overrides)
            dest.overrides, dest.settings = overrides, effective
            for sub in dest.subscriptions.values():
                sub.settings = effective
        for sub in list(dest.subscriptions.values()):
            sub.wake()
        return effective.model_dump()

    def delete_destination(self, name: str, *, internal: bool = False) -> None:
        with self._lock:
            dest = self._dest(name) if internal else self._administrable(name)
            self.journal.delete_destination(name)
            del self._dests[name]
        for s in list(dest.sessions.values()):
            s.close()
        log.info("deleted %s %s", dest.kind, name)

    def create_subscription(self, destination: str, name: str, selector: str | None = None) -> bool:
        """A durable subscription; with a selector it keeps only the messages that match."""
        compiled = compile_selector(selector)
        dest = self._dest(destination)
        with dest.lock:
            info, created = self.journal.create_subscription(
                destination, name, compiled.text if compiled else None
            )
            if created:
                dest.subscriptions[name] = self._subscription(
                    dest,
                    name,
                    info.start_offset,
                    next_offset=info.start_offset,
                    settled=set(),
                    selector=compiled,
                )
        return created

    def delete_subscription(self, destination: str, name: str) -> None:
        dest = self._dest(destination)
        with dest.lock:
            self.journal.delete_subscription(destination, name)
            dest.subscriptions.pop(name, None)
            doomed = [s for s in dest.sessions.values() if s.subscription.name == name]
        for s in doomed:
            s.close()

    def list_destinations(self) -> list[dict[str, Any]]:
        with self._lock:
            names = sorted(self._dests)
        return [self.stats(n) for n in names]

    def stats(self, name: str) -> dict[str, Any]:
        dest = self._dest(name)
        end = self.journal.end_offset(name)
        writer = self.journal.stats(name)
        with dest.lock:
            subs = {s.name: s.stats(end) for s in dest.subscriptions.values()}
            consumers = len(dest.sessions)
        out: dict[str, Any] = {
            "name": name,
            "kind": dest.kind,
            "end_offset": end,
            "consumers": consumers,
            "rows_in_memory": dest.store.rows,
            "journal_commits": writer.commits,
            "journal_failed_commits": writer.failed_commits,
            "last_commit_ms": round(writer.last_commit_ms, 3),
            "bytes_in_memory": dest.store.nbytes,
            "bodies_evicted": dest.store.evicted_rows,
            **self.memory.stats(),
            "settings": dest.settings.model_dump(),
            "temporary": dest.temporary,
            "duplicates": dest.dedup.duplicates_total if dest.dedup else 0,
            "dedup_cache_ids": len(dest.dedup) if dest.dedup else 0,
        }
        tier = self.journal.tier_stats(name)
        if tier is not None:
            # freshness: how far the Delta tables (what Spark reads) trail the broker
            out["delta_end_offset"] = tier.delta_end_offset
            out["delta_lag_messages"] = end - tier.delta_end_offset
            out["delta_lag_ms"] = round(tier.delta_lag_ms, 1)
            out["hot_tier_bytes"] = tier.pending_bytes
            out["hot_tier_segments"] = tier.segments
            out["hot_tier_moves"] = tier.moves
            out["hot_tier_move_failures"] = tier.move_failures
        else:
            out["delta_end_offset"] = end if self.journal.store.durable else None
            out["delta_lag_messages"] = 0
        if dest.kind == "queue":
            out.update({k: v for k, v in subs[QUEUE_SUBSCRIPTION].items() if k != "start_offset"})
        else:
            out["subscriptions"] = subs
        return out

    # -- produce / consume -------------------------------------------------------------------
    def produce(self, destination: str, batch: pa.RecordBatch | pa.Table) -> Future:
        """Check and append a batch; the future resolves once it is durable.

        To an ``AppendResult``; or, when some rows were duplicates (their dedup id was stored
        within the window), to a ``ProduceResult`` giving each row the offset its original has.
        """
        dest = self.destination_for_use(destination)
        now = self.clock.wall()
        rows = self._checked_rows(dest, batch, now)
        self._make_room(dest, rows)
        self._admit_memory(dest, rows)
        return self._store(dest, rows, now)

    def _admit_memory(self, dest: Destination, rows: pa.Table) -> None:
        """Throttle producers at orange, block them at red (the seeds' memory states)."""
        state = self.memory.note_added(rows.get_total_buffer_size())
        if state == "orange":
            time.sleep(THROTTLE_S)
        elif state == "red":
            timeout = self.config.limits.block_timeout_s
            if not self.memory.wait_below_red(timeout):
                raise DestinationFull(
                    f"the broker's memory is in state red ({self.memory.used} of "
                    f"{self.memory.budget} bytes): producers blocked {timeout}s and it did not "
                    "improve; consume, or raise limits.memory_budget_bytes",
                    destination=dest.name,
                )

    def _checked_rows(self, dest: Destination, batch: pa.RecordBatch | pa.Table, now: float):
        limit = self.config.limits.max_batch_bytes
        if batch.nbytes > limit:
            raise MessageTooLarge(
                f"a batch of {batch.nbytes} bytes is over the limit of {limit} bytes "
                "(setting limits.max_batch_bytes): send smaller batches",
                destination=dest.name,
                size=batch.nbytes,
                limit=limit,
            )
        rows = normalize_produce_batch(
            batch,
            enqueue_time_us=int(now * 1_000_000),
            max_message_bytes=self.config.limits.max_message_bytes,
            destination=dest.name,
        )
        if dest.settings.default_ttl_ms:
            rows = _default_expiry(rows, int(now * 1_000_000), dest.settings.default_ttl_ms)
        return rows

    def _store(self, dest: Destination, rows: pa.Table, now: float) -> Future:
        """Append checked rows through duplicate detection."""
        cache = dest.dedup
        if cache is None or rows["dedup_id"].null_count == rows.num_rows:
            return self.journal.append(dest.name, rows)
        with dest.produce_lock:
            keep, dups, claim = cache.claim(rows["dedup_id"], now)
            stored = None
            if keep:
                try:
                    stored = self.journal.append(dest.name, rows if not dups else rows.take(keep))
                except BaseException:
                    cache.release(claim)
                    raise
                cache.bind(claim, stored)
            if not dups:
                return stored
        return combine(rows.num_rows, keep, stored, dups)

    # -- local transactions --------------------------------------------------------------------
    def commit_transaction(
        self, acks: list[protocol.Ack], messages: pa.Table | None
    ) -> dict[str, list[int]]:
        """Send ``messages`` (a ``destination`` column plus produce columns) and settle
        ``acks`` atomically; returns each destination's offsets, once everything is durable."""
        txid = uuid.uuid4().hex
        now = self.clock.wall()
        record = transactions.Record(txid)
        dests: dict[str, Destination] = {}
        for name, batch in (
            transactions.split_by_destination(messages) if messages else {}
        ).items():
            dest = dests[name] = self.destination_for_use(name)
            rows = self._checked_rows(dest, batch, now)
            n = rows.num_rows
            ids = pc.coalesce(rows["dedup_id"], numbered_ids(f"tx:{txid}", 0, n, ":"))
            rows = rows.set_column(rows.schema.get_field_index("dedup_id"), "dedup_id", ids)
            self._make_room(dest, rows)
            record.messages[name] = rows
            record.ends[name] = self.journal.end_offset(name)
        begun = self._begin_acks(acks)
        try:
            record.acks = [(d, s, o) for (d, s, _), offsets in begun.items() for o in offsets]
            self.journal.record_transactions(record.row(transactions.COMMIT, int(now * 1e6)))
        except BaseException:
            for (d, s, _), offsets in begun.items():
                self._dests[d].subscriptions[s].end_ack(offsets, durable=False)
            raise
        # committed: from here on recovery finishes the job if we crash
        failpoints.hit("transaction-recorded")
        stored = {
            name: self._store(dests[name], rows, now) for name, rows in record.messages.items()
        }
        if stored:
            for fut in stored.values():
                fut.exception()
            failpoints.hit("transaction-applying")
        settled = {
            key: self.journal.settle(key[0], offsets, subscription=key[1])
            for key, offsets in begun.items()
        }
        out = {}
        for name, fut in stored.items():
            res = fut.result()
            out[name] = list(res.offsets)
        for (d, s, consumer_id), fut in settled.items():
            ok = fut.exception() is None
            dest = self._dests.get(d)
            if dest is None:
                continue
            offsets = begun[(d, s, consumer_id)]
            dest.subscriptions[s].end_ack(offsets, durable=ok)
            session = dest.sessions.get(consumer_id)
            if session is not None and ok:
                session.forget(offsets)
        self.journal.record_transactions(record.row(transactions.DONE, int(now * 1e6)))
        return out

    def _begin_acks(self, acks: list[protocol.Ack]) -> dict[tuple[str, str, int], list[int]]:
        """Fence every ack of a transaction; all or none (a refusal rolls the others back)."""
        grouped: dict[tuple[str, str, int], list[tuple[int, int]]] = {}
        for d, s, consumer_id, offset, count in acks:
            grouped.setdefault((d, s, consumer_id), []).append((offset, count))
        begun: dict[tuple[str, str, int], list[int]] = {}
        problems: list[str] = []
        for (d, s, consumer_id), entries in grouped.items():
            dest = self._dest(d)
            sub = self._named_subscription(dest, s or None)
            ok, refused = sub.begin_ack(consumer_id, entries)
            begun[(d, sub.name, consumer_id)] = ok
            problems += [f"{d} offset {r.offset}: {r.reason}" for r in refused]
        if problems:
            for (d, s, _), offsets in begun.items():
                self._dests[d].subscriptions[s].end_ack(offsets, durable=False)
            raise LeaseError(
                f"transaction rolled back: {len(problems)} ack(s) refused, e.g. {problems[0]}"
            )
        return begun

    def attach(
        self,
        destination: str,
        subscription: str | None = None,
        prefetch: int | None = None,
        *,
        selector: str | None = None,
        durable: bool = True,
    ) -> ConsumerSession:
        """Attach a consumer to a queue, or to a subscription of a topic.

        On a topic, ``durable=False`` attaches to a non-durable subscription that lives while
        consumers use it: private without a name, shared by every consumer giving the same
        name. ``selector`` filters what this consumer receives.
        """
        compiled = compile_selector(selector)
        dest = self.destination_for_use(destination)
        with dest.lock:
            consumer_id = next(self._consumer_ids)
            sub = self._consumed_subscription(dest, subscription, durable, consumer_id)
            policy = dest.settings.delivery_policy
            if policy == "single" and sub.consumers:
                raise ConsumerRefused(
                    f"queue {destination!r} has the delivery policy 'single' and already has a "
                    "consumer; it takes another once that one leaves",
                    destination=destination,
                )
            sub.register(consumer_id)
            sub_name = sub.name
            if sub.durable:
                settle = lambda offsets, outcome: self.journal.settle(  # noqa: E731
                    destination, offsets, subscription=sub_name, outcome=outcome
                )
            else:
                settle = _settled_in_memory
            session = ConsumerSession(
                consumer_id,
                sub,
                dest.store,
                prefetch=prefetch or self.config.delivery.default_prefetch,
                max_batch=self.config.delivery.max_delivery_batch,
                settle_durably=settle,
                selector=compiled,
                on_close=self._closed_session,
                persist_delivery_count=sub.durable and self.config.delivery.persist_delivery_count,
            )
            dest.sessions[consumer_id] = session
        return session

    def attach_temporary(self, prefetch: int | None = None) -> ConsumerSession:
        """A new temporary queue (memory only) and a consumer on it; the queue goes when that
        consumer does. Its name is ``session.subscription.destination``."""
        name = f"tmp.{uuid.uuid4().hex[:16]}"
        with self._lock:
            self.journal.create_temporary(name)
            dest = self._new_destination(name, "queue")
            dest.temporary = True
            dest.subscriptions[QUEUE_SUBSCRIPTION] = self._subscription(
                dest, QUEUE_SUBSCRIPTION, 0, next_offset=0, settled=set(), durable=False
            )
            self._dests[name] = dest
        session = self.attach(name, prefetch=prefetch)
        log.info("temporary queue %s for consumer %d", name, session.consumer_id)
        return session

    def _consumed_subscription(
        self, dest: Destination, name: str | None, durable: bool, consumer_id: int
    ) -> Subscription:
        """The subscription a new consumer reads (caller holds ``dest.lock``)."""
        if dest.kind == "queue":
            if name not in (None, QUEUE_SUBSCRIPTION):
                raise DestinationExists(
                    f"{dest.name!r} is a queue; subscriptions are for topics",
                    destination=dest.name,
                )
            return dest.subscriptions[QUEUE_SUBSCRIPTION]
        if durable:
            if not name:
                raise SubscriptionNotFound(
                    f"{dest.name!r} is a topic: consume it through a subscription "
                    f"(Admin.create_subscription({dest.name!r}, 'name')), or non-durably "
                    "(durable=False)",
                    destination=dest.name,
                )
            sub = dest.subscriptions.get(name)
            if sub is None or not sub.durable:
                raise SubscriptionNotFound(
                    f"topic {dest.name!r} has no subscription {name!r}",
                    destination=dest.name,
                    subscription=name,
                )
            return sub
        key = f"~{name}" if name else f"~{consumer_id}"  # "~" never starts a durable name
        sub = dest.subscriptions.get(key)
        if sub is None:
            end = self.journal.end_offset(dest.name)
            sub = self._subscription(dest, key, end, next_offset=end, settled=set(), durable=False)
            dest.subscriptions[key] = sub
        return sub

    def _closed_session(self, session: ConsumerSession) -> None:
        """A non-durable subscription goes with its last consumer, a temporary queue with
        the consumer that made it."""
        sub = session.subscription
        with self._lock:
            dest = self._dests.get(sub.destination)
        if dest is None:
            return
        dest.last_used = self.clock.monotonic()
        if dest.temporary:
            try:
                self.delete_destination(dest.name, internal=True)
            except DestinationNotFound:
                pass  # deleted meanwhile
            return
        if sub.durable:
            return
        with dest.lock:
            if not sub.consumers and dest.subscriptions.get(sub.name) is sub:
                del dest.subscriptions[sub.name]

    # -- browse, purge, limits -----------------------------------------------------------------
    def _named_subscription(self, dest: Destination, name: str | None) -> Subscription:
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

    def browse(
        self,
        destination: str,
        subscription: str | None = None,
        *,
        limit: int = 100,
        selector: str | None = None,
    ) -> pa.Table:
        """Waiting messages in delivery order, without leasing them (a queue browser)."""
        dest = self._dest(destination)
        sub = self._named_subscription(dest, subscription)
        offsets = sub.browse(max(limit, 0), compile_selector(selector))
        if not offsets:
            return MESSAGE_SCHEMA.empty_table()
        return disposal.order_like(dest.store.take(offsets), offsets)

    def purge(self, destination: str, subscription: str | None = None) -> int:
        """Remove every waiting message (leased ones stay); returns how many, once durable."""
        dest = self._administrable(destination)
        sub = self._named_subscription(dest, subscription)
        n = len(sub.purge())
        for fut in self._follow_up(dest, sub):
            fut.result()
        log.info("purged %d message(s) of %s", n, destination)
        return n

    def _usage(self, dest: Destination) -> tuple[int, int]:
        """Unsettled messages (of the slowest subscription) and bytes held for ``dest``."""
        end = self.journal.end_offset(dest.name)
        with dest.lock:
            subs = list(dest.subscriptions.values())
        depth = max((s.depth_estimate(end) for s in subs), default=0)
        return depth, dest.store.nbytes if subs else 0

    def _make_room(self, dest: Destination, rows: pa.Table) -> None:
        """Apply the destination's and the broker's limits to a batch about to be stored."""
        st, lim = dest.settings, self.config.limits
        if not (st.max_messages or st.max_bytes or lim.max_messages or lim.max_bytes):
            return
        n, size = rows.num_rows, rows["body"].nbytes
        deadline = self.clock.monotonic() + lim.block_timeout_s

        def over() -> tuple[str, bool, int] | None:
            """What is over a limit: why, whether broker-wide, and how many messages too many."""
            depth, held = self._usage(dest)
            if st.max_messages and depth + n > st.max_messages:
                why = f"{dest.name!r} holds {depth} of at most {st.max_messages} messages"
                return why, False, depth + n - st.max_messages
            if st.max_bytes and held + size > st.max_bytes:
                return f"{dest.name!r} holds {held} of at most {st.max_bytes} bytes", False, n
            if lim.max_messages or lim.max_bytes:
                usage = [self._usage(d) for d in list(self._dests.values())]
                total_n, total_b = sum(u[0] for u in usage), sum(u[1] for u in usage)
                if lim.max_messages and total_n + n > lim.max_messages:
                    why = f"the broker holds {total_n} of at most {lim.max_messages} messages"
                    return why, True, total_n + n - lim.max_messages
                if lim.max_bytes and total_b + size > lim.max_bytes:
                    why = f"the broker holds {total_b} of at most {lim.max_bytes} bytes"
                    return why, True, n
            return None

        while (problem := over()) is not None:
            why, system, excess = problem
            policy = lim.overflow if system else st.overflow
            if policy == "drop_oldest":  # from the destination being produced to
                with dest.lock:
                    subs = list(dest.subscriptions.values())
                if not sum(sub.drop_oldest(max(excess, 1)) for sub in subs):
                    policy = "reject"  # nothing waiting to drop (all leased)
                else:
                    for sub in subs:
                        self._follow_up(dest, sub)
                    return
            if policy == "block" and self.clock.monotonic() < deadline and not self._stop.is_set():
                time.sleep(0.01)
                continue
            setting = "limits" if system else f"destination {dest.name!r}"
            raise DestinationFull(
                f"{why}: batch of {n} refused ({setting} overflow = {policy}); consume, or "
                "raise the limit",
                destination=dest.name,
            )

    def detach(self, session: ConsumerSession) -> None:
        with self._lock:
            dest = self._dests.get(session.subscription.destination)
        if dest is not None:
            with dest.lock:
                dest.sessions.pop(session.consumer_id, None)
        session.close()
