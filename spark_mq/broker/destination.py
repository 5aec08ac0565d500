"""A destination as the broker holds it, and what a broker is built from (store, hot tier)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from spark_mq.broker.dedup import DuplicateCache
from spark_mq.broker.message_store import MessageStore
from spark_mq.config import BrokerConfig, DestinationSettings
from spark_mq.journal import DeltaStore, LogStore, MemoryStore
from spark_mq.journal.base import Kind
from spark_mq.journal.hot_tier import HotTierSettings
from spark_mq.schema import TS, fill_null

if TYPE_CHECKING:
    from spark_mq.broker.consumers import ConsumerSession
    from spark_mq.broker.subscription import Subscription


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
    # called (on the committing thread) after each commit of messages: readers of the log (a
    # Kafka fetch waiting for data) that are not subscriptions
    log_watchers: set[Callable[[], None]] = field(default_factory=set)
    # the timers' look for settled chunks above the low-water mark: when next, and from where
    settled_scan_at: float = 0.0
    settled_scan_from: int = 0


def settled_in_memory(offsets: list[int], outcome: str, inline: object = None) -> Future:
    """A non-durable subscription's acks need no journal record."""
    done: Future = Future()
    done.set_result(None)
    return done


def default_expiry(rows: pa.Table, now_us: int, ttl_ms: int) -> pa.Table:
    """Messages without an expiry get the destination's default TTL."""
    expiry = rows["expiry_time"]
    if expiry.null_count == 0:
        return rows
    default = pa.scalar(now_us + ttl_ms * 1000, pa.int64()).cast(TS)
    i = rows.schema.get_field_index("expiry_time")
    return rows.set_column(i, rows.schema.field(i), fill_null(expiry, default))


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
        mover_nice=j.mover_nice,
        shared=config.clustered,
    )


def make_store(config: BrokerConfig) -> LogStore:
    if config.broker.persistence == "memory":
        return MemoryStore()
    return DeltaStore(
        config.broker.data_dir,
        checkpoint_interval=config.journal.checkpoint_interval,
        storage_options=config.storage or None,
    )
