"""State-store helpers on sparkmq streams: dedup ids and per-group in-order processing,
both surviving a query restart from the checkpoint."""

from __future__ import annotations

import tempfile
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pytest

from spark_mq import Admin, Producer
from spark_mq.clock import ManualClock
from spark_mq.connectors.state import drop_duplicate_ids, process_groups_in_order
from tests.conftest import start_inprocess

pytestmark = pytest.mark.spark


@pytest.fixture
def no_broker_dedup(tmp_path: Path, clock: ManualClock):
    """A broker that stores duplicates (detection off), so the log has some for Spark to drop."""
    running = start_inprocess(tmp_path / "data", clock, **{"duplicates.cache_size": 0})
    with Admin(running.url) as admin:
        admin.create_topic("t")
    yield running
    running.stop()


def produce(running, bodies: list[bytes], **columns: list) -> None:
    with Producer(running.url, destination="t") as p:
        p.send_batch(pa.table({"body": bodies, **columns}))
    assert running.broker.journal.move(timeout=60)


def run(spark, running, checkpoint: str, shape, out: list) -> None:
    stream = (
        spark.readStream.format("sparkmq")
        .option("root", running.broker.config.broker.data_dir)
        .option("destination", "t")
        .option("maxMessagesPerTrigger", 10)
        .load()
    )
    q = (
        shape(stream)
        .writeStream.foreachBatch(lambda b, _i: out.extend(b.collect()))
        .option("checkpointLocation", checkpoint)
        .trigger(availableNow=True)
        .start()
    )
    assert q.awaitTermination(180), "the availableNow query did not finish in 180 s"
    assert q.exception() is None, q.exception()


def test_duplicate_ids_are_dropped_across_batches_and_restarts(spark, no_broker_dedup) -> None:
    checkpoint, out = tempfile.mkdtemp(), []
    ids = [f"id-{i}" for i in range(20)]
    produce(no_broker_dedup, [b"%d" % i for i in range(20)], dedup_id=ids)
    produce(no_broker_dedup, [b"again"] * 5 + [b"no id"] * 2, dedup_id=[*ids[:5], None, None])
    run(spark, no_broker_dedup, checkpoint, drop_duplicate_ids, out)
    assert sorted(r.offset for r in out) == [*list(range(20)), 25, 26]
    # after a restart the state still knows every id: the resends are dropped, new ids pass
    produce(no_broker_dedup, [b"late"] * 3, dedup_id=[ids[7], ids[19], "id-new"])
    run(spark, no_broker_dedup, checkpoint, drop_duplicate_ids, out)
    assert sorted(r.offset for r in out)[-3:] == [25, 26, 29]


def test_groups_are_processed_in_order_with_state_across_restarts(spark, no_broker_dedup) -> None:
    checkpoint, out = tempfile.mkdtemp(), []
    groups = [f"g{i % 3}" for i in range(30)]
    produce(no_broker_dedup, [b"%d" % i for i in range(30)], group_id=groups)

    def running_count(group, messages: pd.DataFrame, state):
        seen = state or {"count": 0, "last": -1}
        offsets = messages["offset"].tolist()
        assert offsets == sorted(offsets) and offsets[0] > seen["last"]  # in order, no repeats
        seen = {"count": seen["count"] + len(offsets), "last": offsets[-1]}
        row = {"group": group, "first": offsets[0], "last": offsets[-1], "total": seen["count"]}
        return pd.DataFrame([row]), seen

    def shape(stream):
        return process_groups_in_order(
            stream, running_count, "group string, first long, last long, total long"
        )

    run(spark, no_broker_dedup, checkpoint, shape, out)
    produce(no_broker_dedup, [b"x"] * 6, group_id=[f"g{i % 3}" for i in range(6)])
    run(spark, no_broker_dedup, checkpoint, shape, out)  # state comes back from the checkpoint
    final = {}
    for r in out:
        assert r.last >= r.first
        final[r.group] = max(final.get(r.group, 0), r.total)
    assert final == {"g0": 12, "g1": 12, "g2": 12}
    assert len(out) > 6  # several micro-batches per group (10 messages per trigger)
