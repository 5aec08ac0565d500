"""State-store helpers for any sparkmq stream: duplicate-id dedup and per-group in-order processing.

Both keep their state in Spark's state store, so it survives a query restart from its checkpoint.
:func:`use_rocksdb` switches a session to the RocksDB provider (it ships with pyspark), which
``transformWithStateInPandas`` requires and which keeps large state off the JVM heap.

* :func:`drop_duplicate_ids` — ``dropDuplicatesWithinWatermark`` on the dedup id, with the
  enqueue time as event time: a message whose id was seen within ``retention`` is dropped, and
  state older than that is evicted (the bound).
* :func:`process_groups_in_order` — a user function sees each group's messages in offset order,
  batch after batch, with its own per-group state (any JSON value), through
  ``transformWithStateInPandas``. Combine it with the source's ``groupingPartitions`` to keep a
  group on one partition upstream as well.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import Any

import pandas as pd
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.streaming.stateful_processor import (
    StatefulProcessor,
    StatefulProcessorHandle,
    TimerValues,
)
from pyspark.sql.types import StringType, StructField, StructType

ROCKSDB = "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"
_STATE_SCHEMA = StructType([StructField("json", StringType(), True)])

# (group key, the group's new messages in offset order, its state or None) -> (rows, new state)
GroupFunction = Callable[[Any, pd.DataFrame, Any], tuple[pd.DataFrame, Any]]


def use_rocksdb(spark: SparkSession) -> None:
    """Keep streaming state in RocksDB (set before a query first starts from its checkpoint)."""
    spark.conf.set("spark.sql.streaming.stateStore.providerClass", ROCKSDB)


def drop_duplicate_ids(
    stream: DataFrame,
    retention: str = "10 minutes",
    *,
    id_column: str = "dedup_id",
    event_time: str = "enqueue_time",
) -> DataFrame:
    """Drop messages whose ``id_column`` was already seen within ``retention`` of event time.

    Messages without an id pass through. ``retention`` is a Spark interval ("10 minutes").
    """
    with_id = stream.filter(stream[id_column].isNotNull())
    without = stream.filter(stream[id_column].isNull())
    deduped = with_id.withWatermark(event_time, retention).dropDuplicatesWithinWatermark(
        [id_column]
    )
    return deduped.unionByName(without)


class _InOrder(StatefulProcessor):
    def __init__(self, fn: GroupFunction, order_by: str, ttl_ms: int | None) -> None:
        self.fn, self.order_by, self.ttl_ms = fn, order_by, ttl_ms

    def init(self, handle: StatefulProcessorHandle) -> None:
        self.state = handle.getValueState("group_state", _STATE_SCHEMA, self.ttl_ms)

    def handleInputRows(
        self, key: Any, rows: Iterator[pd.DataFrame], timerValues: TimerValues
    ) -> Iterator[pd.DataFrame]:
        batch = pd.concat(list(rows), ignore_index=True).sort_values(self.order_by, kind="stable")
        stored = self.state.get() if self.state.exists() else None
        current = json.loads(stored[0]) if stored is not None else None
        out, new_state = self.fn(key[0] if isinstance(key, tuple) else key, batch, current)
        if new_state is None:
            self.state.clear()
        else:
            self.state.update((json.dumps(new_state),))
        yield out

    def close(self) -> None:
        pass


def process_groups_in_order(
    stream: DataFrame,
    fn: GroupFunction,
    output_schema: StructType | str,
    *,
    key: str = "group_id",
    order_by: str = "offset",
    state_ttl_ms: int | None = None,
) -> DataFrame:
    """Run ``fn`` per group on its messages in ``order_by`` order, with per-group state.

    ``fn(key, messages, state) -> (rows, new_state)``: ``messages`` is a pandas DataFrame of the
    group's messages in this micro-batch, sorted; ``state`` is what it returned last time (None
    the first time, any JSON value after); ``rows`` must match ``output_schema``. Returning
    ``None`` as the new state clears it; ``state_ttl_ms`` expires idle groups' state.
    """
    return stream.groupBy(key).transformWithStateInPandas(
        statefulProcessor=_InOrder(fn, order_by, state_ttl_ms),
        outputStructType=output_schema,
        outputMode="Append",
        timeMode="None",
    )
