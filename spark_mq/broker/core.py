"""The broker: destinations, subscriptions and consumers above the journal.

Thread-safety: every public method may be called from any thread (the Flight server calls them
from its gRPC threads).
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from spark_mq.broker.dedup import DuplicateCache, combine
from spark_mq.broker.message_store import MessageStore
from spark_mq.broker.recovery import recover_destination
from spark_mq.broker.session import ConsumerSession
from spark_mq.broker.subscription import Subscription
from spark_mq.clock import Clock, SystemClock
from spark_mq.config import BrokerConfig
from spark_mq.errors import (
    ConfigError,
    DestinationExists,
    DestinationNotFound,
    MessageTooLarge,
    SubscriptionNotFound,
)
from spark_mq.journal import DeltaStore, DestinationInfo, Journal, LogStore, MemoryStore
from spark_mq.journal.base import Kind
from spark_mq.journal.hot_tier import HotTierSettings, has_segments
from spark_mq.schema import QUEUE_SUBSCRIPTION, normalize_produce_batch

log = logging.getLogger(__name__)


@dataclass
class Destination:
    name: str
    kind: Kind
    store: MessageStore = field(default_factory=MessageStore)
    subscriptions: dict[str, Subscription] = field(default_factory=dict)
    sessions: dict[int, ConsumerSession] = field(default_factory=dict)
    lock: threading.RLock = field(default_factory=threading.RLock)
    produced_total: int = 0
    dedup: DuplicateCache | None = None
    # claim dedup ids, append, bind: one batch at a time, so a racing resend finds its original
    produce_lock: threading.Lock = field(default_factory=threading.Lock)


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

    # -- lifecycle ---------------------------------------------------------------------------
    def start(self, *, run_timers: bool = True) -> None:
        """Open the journal, rebuild every destination, start the lease timer."""
        started = time.perf_counter()
        self._refuse_unmoved_segments()
        infos = self.journal.open()
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
        self.journal.close()

    def _recover(self, info: DestinationInfo) -> None:
        subs, rows = recover_destination(self.journal, info)
        dest = self._new_destination(info.name, info.kind)
        self._refill_dedup(dest)
        dest.store.add(rows)
        for rs in subs:
            dest.subscriptions[rs.name] = self._subscription(
                dest, rs.name, rs.start_offset, next_offset=rs.low_water, settled=rs.settled_above
            )
        with self._lock:
            self._dests[info.name] = dest
        log.info(
            "destination %s (%s): end offset %d, %d unsettled row(s) in memory",
            info.name,
            info.kind,
            self.journal.end_offset(info.name),
            dest.store.rows,
        )

    def _new_destination(self, name: str, kind: Kind) -> Destination:
        d = self.config.duplicates
        cache = DuplicateCache(d.cache_size, d.window_s) if d.cache_size else None
        return Destination(name, kind, dedup=cache)

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
        self, dest: Destination, name: str, start: int, *, next_offset: int, settled: set[int]
    ) -> Subscription:
        sub = Subscription(
            dest.name,
            name,
            dest.store,
            start_offset=start,
            settled=settled,
            lease_s=self.config.delivery.mark_interval_s,
            monotonic=self.clock.monotonic,
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

    def run_timers(self) -> int:
        """Expire lapsed leases and drop settled rows from memory; returns leases expired."""
        expired = 0
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
            low = min((sub.low_water() for sub in subs), default=None)
            if low is None:
                low = self.journal.end_offset(dest.name)
            dest.store.drop_below(low)
        return expired

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

    def create_destination(self, name: str, kind: Kind) -> bool:
        with self._lock:
            _, created = self.journal.create_destination(name, kind)
            if created:
                dest = self._new_destination(name, kind)
                if kind == "queue":
                    dest.subscriptions[QUEUE_SUBSCRIPTION] = self._subscription(
                        dest, QUEUE_SUBSCRIPTION, 0, next_offset=0, settled=set()
                    )
                self._dests[name] = dest
                log.info("created %s %s", kind, name)
            return created

    def delete_destination(self, name: str) -> None:
        with self._lock:
            dest = self._dest(name)
            self.journal.delete_destination(name)
            del self._dests[name]
        for s in list(dest.sessions.values()):
            s.close()
        log.info("deleted %s %s", dest.kind, name)

    def create_subscription(self, destination: str, name: str) -> bool:
        dest = self._dest(destination)
        with dest.lock:
            info, created = self.journal.create_subscription(destination, name)
            if created:
                dest.subscriptions[name] = self._subscription(
                    dest, name, info.start_offset, next_offset=info.start_offset, settled=set()
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
        dest = self._dest(destination)
        limit = self.config.limits.max_batch_bytes
        if batch.nbytes > limit:
            raise MessageTooLarge(
                f"a batch of {batch.nbytes} bytes is over the limit of {limit} bytes "
                "(setting limits.max_batch_bytes): send smaller batches",
                destination=destination,
                size=batch.nbytes,
                limit=limit,
            )
        now = self.clock.wall()
        rows = normalize_produce_batch(
            batch,
            enqueue_time_us=int(now * 1_000_000),
            max_message_bytes=self.config.limits.max_message_bytes,
            destination=destination,
        )
        cache = dest.dedup
        if cache is None or rows["dedup_id"].null_count == rows.num_rows:
            return self.journal.append(destination, rows)
        ids = rows["dedup_id"].to_pylist()
        with dest.produce_lock:
            keep, dups, claim = cache.claim(ids, now)
            stored = None
            if keep:
                try:
                    stored = self.journal.append(destination, rows if not dups else rows.take(keep))
                except BaseException:
                    cache.release(claim)
                    raise
                cache.bind(claim, stored)
            if not dups:
                return stored
        return combine(rows.num_rows, keep, stored, dups)

    def attach(
        self, destination: str, subscription: str | None = None, prefetch: int | None = None
    ) -> ConsumerSession:
        """Attach a consumer to a queue, or to a durable subscription of a topic."""
        dest = self._dest(destination)
        if dest.kind == "queue":
            if subscription not in (None, QUEUE_SUBSCRIPTION):
                raise DestinationExists(
                    f"{destination!r} is a queue; subscriptions are for topics",
                    destination=destination,
                )
            sub_name = QUEUE_SUBSCRIPTION
        else:
            if not subscription:
                raise SubscriptionNotFound(
                    f"{destination!r} is a topic: consume it through a subscription "
                    f"(Admin.create_subscription({destination!r}, 'name'))",
                    destination=destination,
                )
            sub_name = subscription
        with dest.lock:
            sub = dest.subscriptions.get(sub_name)
            if sub is None:
                raise SubscriptionNotFound(
                    f"topic {destination!r} has no subscription {sub_name!r}",
                    destination=destination,
                    subscription=sub_name,
                )
            consumer_id = next(self._consumer_ids)
            session = ConsumerSession(
                consumer_id,
                sub,
                dest.store,
                prefetch=prefetch or self.config.delivery.default_prefetch,
                max_batch=self.config.delivery.max_delivery_batch,
                settle_durably=lambda offsets: self.journal.settle(
                    destination, offsets, subscription=sub_name
                ),
            )
            dest.sessions[consumer_id] = session
        return session

    def detach(self, session: ConsumerSession) -> None:
        with self._lock:
            dest = self._dests.get(session.subscription.destination)
        if dest is not None:
            with dest.lock:
                dest.sessions.pop(session.consumer_id, None)
        session.close()
