"""readStream / read .format("sparkmq") over real Delta logs written by a real broker."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import pyarrow as pa
import pytest
from chispa import assert_df_equality
from pyspark.sql import functions as F
from pyspark.sql.utils import AnalysisException

from spark_mq import Admin, Producer
from spark_mq.service import RunningBroker

pytestmark = pytest.mark.spark


@pytest.fixture
def topic_with_messages(broker: RunningBroker) -> tuple[str, list[bytes]]:
    bodies = [b"msg-%03d" % i for i in range(350)]
    with Admin(broker.url) as admin:
        admin.create_topic("events")
    with Producer(broker.url, destination="events") as producer:
        for start in range(0, 350, 70):  # several commits, so several Delta files
            producer.send_batch(bodies[start : start + 70])
    # Spark reads Delta: wait until the hot tier has moved everything there
    assert broker.broker.journal.move(timeout=60)
    return broker.broker.config.broker.data_dir, bodies


def expected_df(spark, bodies: list[bytes]):
    return spark.createDataFrame(
        [(i, bytearray(b)) for i, b in enumerate(bodies)], "offset bigint, body binary"
    )


def run_available_now(spark, reader, name: str):
    query = (
        reader.writeStream.format("memory")
        .queryName(name)
        .option("checkpointLocation", tempfile.mkdtemp())
        .trigger(availableNow=True)
        .start()
    )
    assert query.awaitTermination(120), "the availableNow query did not finish in 120 s"
    return query


def test_stream_available_now_reads_everything(spark, topic_with_messages) -> None:
    root, bodies = topic_with_messages
    reader = (
        spark.readStream.format("sparkmq")
        .option("root", root)
        .option("destination", "events")
        .load()
    )
    query = run_available_now(spark, reader, "all_events")
    out = spark.table("all_events")
    assert_df_equality(
        out.select("offset", "body"), expected_df(spark, bodies), ignore_row_order=True
    )
    assert out.filter(F.col("destination") != "events").count() == 0
    assert out.filter(F.col("priority") != 4).count() == 0
    assert sum(p["numInputRows"] for p in query.recentProgress) == 350


def test_admission_control_splits_into_micro_batches(spark, topic_with_messages) -> None:
    root, bodies = topic_with_messages
    reader = (
        spark.readStream.format("sparkmq")
        .option("root", root)
        .option("destination", "events")
        .option("maxMessagesPerTrigger", "100")
        .option("maxMessagesPerPartition", "40")
        .load()
    )
    query = run_available_now(spark, reader, "limited_events")
    sizes = [p["numInputRows"] for p in query.recentProgress if p["numInputRows"]]
    assert sizes == [100, 100, 100, 50]
    assert_df_equality(
        spark.table("limited_events").select("offset", "body"),
        expected_df(spark, bodies),
        ignore_row_order=True,
    )


def test_latest_starts_after_existing_messages(
    spark, broker: RunningBroker, topic_with_messages
) -> None:
    root, _ = topic_with_messages
    checkpoint = tempfile.mkdtemp()

    collected: list = []

    def run() -> int:
        reader = (
            spark.readStream.format("sparkmq")
            .option("root", root)
            .option("destination", "events")
            .option("startingOffsets", "latest")
            .load()
        )
        before = len(collected)
        q = (
            reader.writeStream.foreachBatch(lambda df, _id: collected.extend(df.collect()))
            .option("checkpointLocation", checkpoint)
            .trigger(availableNow=True)
            .start()
        )
        assert q.awaitTermination(120), "the availableNow query did not finish in 120 s"
        return len(collected) - before

    assert run() == 0
    with Producer(broker.url, destination="events") as producer:
        producer.send_batch([b"new-1", b"new-2"])
    assert broker.broker.journal.move(timeout=60)
    # the restarted query resumes from its checkpoint and sees only the new messages
    assert run() == 2
    assert sorted(bytes(r.body) for r in collected) == [b"new-1", b"new-2"]


def test_batch_read(spark, topic_with_messages) -> None:
    root, bodies = topic_with_messages
    df = spark.read.format("sparkmq").load(root, destination="events")
    assert_df_equality(
        df.select("offset", "body"), expected_df(spark, bodies), ignore_row_order=True
    )


def test_bad_options_are_named(spark, topic_with_messages, tmp_path: Path) -> None:
    root, _ = topic_with_messages

    def base():  # a DataFrameReader's options are mutable: a fresh one each time
        return spark.read.format("sparkmq").option("root", root)

    with pytest.raises(AnalysisException, match=r"unknown sparkmq option.*maxmessages"):
        base().option("destination", "events").option("maxMessages", "5").load()
    with pytest.raises(AnalysisException, match="'destination' is required"):
        base().load()
    with pytest.raises(AnalysisException, match="startingOffsets"):
        (
            spark.readStream.format("sparkmq")
            .option("root", root)
            .option("destination", "events")
            .option("startingOffsets", "yesterday")
            .load()
        )
    with pytest.raises(AnalysisException, match="maxMessagesPerTrigger"):
        (
            spark.readStream.format("sparkmq")
            .option("root", root)
            .option("destination", "events")
            .option("maxMessagesPerTrigger", "-3")
            .load()
        )
    with pytest.raises(Exception, match="no message log for destination 'nothing'"):
        spark.read.format("sparkmq").option("root", str(tmp_path)).option(
            "destination", "nothing"
        ).load().count()


def test_a_query_reads_partitions_added_while_it_runs_from_their_first_offset(
    spark, broker: RunningBroker, tmp_path: Path
) -> None:
    """Partitions added to a destination a query reads: the next micro-batch reads them from
    their first offset (as Spark's Kafka source reads partitions it finds), even where the
    query began at ``latest``; the partitions it read before go on from its checkpoint."""
    name = "widening"
    with Admin(broker.url) as admin:
        admin.create_queue(name, partitions=2)
    root = broker.broker.config.broker.data_dir
    checkpoint, out = str(tmp_path / "checkpoint"), str(tmp_path / "out")

    def run() -> list:
        reader = (
            spark.readStream.format("sparkmq")
            .option("root", root)
            .option("subscribe", name)
            .option("startingOffsets", "latest")
            .load()
        )
        query = (
            reader.select("destination", "body")
            .writeStream.format("parquet")
            .option("path", out)
            .option("checkpointLocation", checkpoint)
            .trigger(availableNow=True)
            .start()
        )
        assert query.awaitTermination(120), "the availableNow query did not finish in 120 s"
        rows = spark.read.parquet(out).collect()
        return sorted((r.destination, bytes(r.body)) for r in rows)

    with Producer(broker.url) as producer:
        producer.send_sync(b"old", destination=f"{name}~0")  # (before the query: not read)
    # In the table before the query starts: "latest" is the table's end, which trails the
    # broker by the hot tier's move (README, Freshness).
    assert broker.broker.journal.move(timeout=60)
    assert run() == []
    with Admin(broker.url) as admin:
        assert admin.add_partitions(name, 3)
    with Producer(broker.url) as producer:
        for part in (0, 2, 2):
            producer.send_sync(b"new-%d" % part, destination=f"{name}~{part}")
    assert broker.broker.journal.move(timeout=60)
    assert run() == [(f"{name}~0", b"new-0"), (f"{name}~2", b"new-2"), (f"{name}~2", b"new-2")]


@pytest.mark.parametrize("fmt", ["sparkmq", "sparkmq_python"])
def test_a_partitioned_destination_is_read_whole_with_offsets_per_partition(
    spark, broker: RunningBroker, fmt: str
) -> None:
    """A destination of three partitions is read as one: every partition's messages, each with
    offsets of its own (the query's offsets name each partition), Kafka's ``topic`` and
    ``partition`` columns, and Kafka's per-partition starting offsets."""
    name = f"clicks_{fmt}"
    with Admin(broker.url) as admin:
        admin.create_topic(name, partitions=3, retention_s=3600)
    with Producer(broker.url, destination=name) as producer:
        producer.send_batch(
            pa.table({"body": [b"c%02d" % i for i in range(90)],
                      "group_id": [f"user{i % 9}" for i in range(90)]})
        )  # fmt: skip
    assert broker.broker.journal.move(timeout=60)
    root = broker.broker.config.broker.data_dir
    reader = (
        spark.readStream.format(fmt)
        .option("root", root)
        .option("subscribe", name)
        .option("kafkaColumns", "true")
        .load()
    )
    query = run_available_now(spark, reader, f"parts_{fmt}")
    out = spark.table(f"parts_{fmt}")
    rows = out.select("destination", "topic", "partition", "offset", "key", "value").collect()
    assert sorted(r.value for r in rows) == [b"c%02d" % i for i in range(90)]
    assert {r.topic for r in rows} == {name}
    assert {r.destination for r in rows} == {f"{name}~{i}" for i in range(3)}
    for i in range(3):
        offsets = sorted(r.offset for r in rows if r.partition == i)
        assert offsets == list(range(len(offsets))) and offsets  # dense from 0, each its own
        assert all(r.destination == f"{name}~{i}" for r in rows if r.partition == i)
    groups: dict[bytes, set[int]] = {}
    for r in rows:
        groups.setdefault(bytes(r.key), set()).add(r.partition)
    assert all(len(p) == 1 for p in groups.values())  # a group in one partition
    end = query.lastProgress["sources"][0]["endOffset"]
    assert sorted(json.loads(end) if isinstance(end, str) else end) == sorted(
        f"{name}~{i}" for i in range(3)
    )
    counts = {i: sum(1 for r in rows if r.partition == i) for i in range(3)}
    # Kafka's per-partition JSON: partition 0 from 2 on, the others from their starts
    batch = (
        spark.read.format(fmt)
        .option("root", root)
        .option("destination", name)
        .option("startingOffsets", json.dumps({name: {"0": 2, "1": -2, "2": -2}}))
        .load()
    )
    assert batch.count() == 90 - min(2, counts[0])
