"""The source's Kafka- and Delta-style options, against real broker-written Delta logs."""

from __future__ import annotations

import json
import tempfile
from collections.abc import Callable

import pyarrow as pa
import pytest
from chispa import assert_df_equality
from pyspark.sql import functions as F

from spark_mq import Admin, Consumer, Producer
from spark_mq.clock import ManualClock
from spark_mq.connectors.options import SourceOptions
from spark_mq.errors import ConfigError
from spark_mq.jobs.compaction import CompactionPolicy, compact_all
from spark_mq.schema import HEADERS
from spark_mq.service import RunningBroker
from tests.conftest import receive_n

pytestmark = pytest.mark.spark


def produce(broker: RunningBroker, dest: str, bodies: list[bytes], **columns: list) -> list[int]:
    if "headers" in columns:
        columns["headers"] = pa.array(columns["headers"], HEADERS)
    with Producer(broker.url, destination=dest) as p:
        offsets = p.send_batch(pa.table({"body": bodies, **columns}))
    assert broker.broker.journal.move(timeout=60)  # Spark reads Delta
    return offsets


def topics(broker: RunningBroker, *names: str) -> None:
    with Admin(broker.url) as admin:
        for n in names:
            admin.create_topic(n)


def keys(df) -> list[tuple[str, int]]:
    return sorted((r.destination, r.offset) for r in df.select("destination", "offset").collect())


class Stream:
    """A restartable availableNow query (one checkpoint) collecting rows through foreachBatch."""

    def __init__(self, spark, root: str, **options: str) -> None:
        self.spark, self.root, self.options = spark, root, options
        self.checkpoint = tempfile.mkdtemp()
        self.batches: list[tuple[int, list]] = []

    def run(self, transform: Callable | None = None) -> list:
        reader = self.spark.readStream.format("sparkmq").option("root", self.root)
        for k, v in self.options.items():
            reader = reader.option(k, v)
        df = reader.load()
        shape = transform or (lambda b: b)  # applied to each micro-batch's DataFrame
        before = len(self.batches)
        q = (
            df.writeStream.foreachBatch(lambda b, i: self.batches.append((i, shape(b).collect())))
            .option("checkpointLocation", self.checkpoint)
            .trigger(availableNow=True)
            .start()
        )
        assert q.awaitTermination(120), "the availableNow query did not finish in 120 s"
        if q.exception() is not None:
            raise q.exception()
        return [r for _, rows in self.batches[before:] for r in rows]


def test_several_destinations_by_list_and_pattern_with_json_offsets(
    spark, broker: RunningBroker
) -> None:
    root = broker.broker.config.broker.data_dir
    topics(broker, "eu.orders", "us.orders", "audit")
    produce(broker, "eu.orders", [b"eu%d" % i for i in range(30)])
    produce(broker, "us.orders", [b"us%d" % i for i in range(20)])
    produce(broker, "audit", [b"a"] * 5)
    both = [("eu.orders", o) for o in range(30)] + [("us.orders", o) for o in range(20)]

    listed = spark.read.format("sparkmq").load(root, destination="eu.orders, us.orders")
    assert keys(listed) == both
    by_pattern = spark.read.format("sparkmq").load(root, destinationPattern=r".*\.orders")
    assert_df_equality(listed.drop("headers"), by_pattern.drop("headers"), ignore_row_order=True)
    ending = spark.read.format("sparkmq").load(
        root, destination="eu.orders,us.orders", endingOffsets=json.dumps({"eu.orders": 10})
    )
    assert keys(ending) == [k for k in both if k[0] == "us.orders" or k[1] < 10]

    stream = Stream(
        spark,
        root,
        destinationPattern=r".*\.orders",
        startingOffsets=json.dumps({"eu.orders": 25, "us.orders": -1}),
    )
    assert sorted((r.destination, r.offset) for r in stream.run()) == [
        ("eu.orders", o) for o in range(25, 30)
    ]
    # a restart resumes; a destination matching the pattern later is read from its start
    topics(broker, "jp.orders")
    produce(broker, "us.orders", [b"late"] * 3)
    produce(broker, "jp.orders", [b"jp"] * 2)
    assert sorted((r.destination, r.offset) for r in stream.run()) == [
        ("jp.orders", 0),
        ("jp.orders", 1),
        ("us.orders", 20),
        ("us.orders", 21),
        ("us.orders", 22),
    ]


def test_starting_timestamp_and_headers_left_out(
    spark, broker: RunningBroker, clock: ManualClock
) -> None:
    root = broker.broker.config.broker.data_dir
    topics(broker, "t")
    produce(broker, "t", [b"old"] * 4, headers=[[("k", "v")]] * 4)
    cut_ms = int((clock.wall() + 30) * 1000)
    clock.advance(60)
    produce(broker, "t", [b"new"] * 3)
    df = spark.read.format("sparkmq").load(
        root, destination="t", startingTimestamp=str(cut_ms), includeHeaders="false"
    )
    assert "headers" not in df.columns
    assert [(r.offset, bytes(r.body)) for r in df.orderBy("offset").collect()] == [
        (4, b"new"),
        (5, b"new"),
        (6, b"new"),
    ]
    with_headers = spark.read.format("sparkmq").load(root, destination="t")
    assert with_headers.filter(F.col("headers")["k"] == "v").count() == 4


def test_max_bytes_per_trigger_splits_micro_batches(spark, broker: RunningBroker) -> None:
    root = broker.broker.config.broker.data_dir
    topics(broker, "big")
    import os

    for _ in range(4):
        produce(broker, "big", [os.urandom(1024) for _ in range(100)])
    stream = Stream(spark, root, destination="big", maxBytesPerTrigger=str(150 * 1024))
    rows = stream.run()
    sizes = [len(b) for _, b in stream.batches]
    assert sorted(r.offset for r in rows) == list(range(400))
    assert len(sizes) >= 3 and max(sizes) <= 160, sizes  # about 150 KiB of files per batch


def test_fail_on_data_loss_after_compaction(spark, broker: RunningBroker) -> None:
    root = broker.broker.config.broker.data_dir
    topics(broker, "t")
    with Admin(broker.url) as admin:
        admin.create_subscription("t", "s")
    produce(broker, "t", [b"%d" % i for i in range(10)])
    stream = Stream(spark, root, destination="t")
    assert len(stream.run()) == 10  # the checkpoint now says: next is offset 10
    produce(broker, "t", [b"%d" % i for i in range(10, 20)])
    with Consumer(broker.url, "t", subscription="s", prefetch=50) as c:
        got = receive_n(c, 20)
        c.ack([m for m in got if m.offset < 15]).result(timeout=10)
    assert broker.broker.journal.move(timeout=60)
    (done,) = compact_all(root, CompactionPolicy(force=True, keep_recent_s=0))
    assert done.rows_removed == 15

    with pytest.raises(Exception, match=r"5 offset\(s\) of 't'.*10, 11, 12, 13, 14"):
        stream.run()
    stream.options["failOnDataLoss"] = "false"
    assert sorted(r.offset for r in stream.run()) == [15, 16, 17, 18, 19]
    # a new query from earliest starts where the log now starts: nothing is missing for it
    assert sorted(r.offset for r in Stream(spark, root, destination="t").run()) == list(
        range(15, 20)
    )


def test_grouping_partitions_keep_each_group_in_one_partition_in_order(
    spark, broker: RunningBroker
) -> None:
    root = broker.broker.config.broker.data_dir
    topics(broker, "g")
    groups = [f"customer-{i % 7}" if i % 11 else None for i in range(300)]
    produce(broker, "g", [b"%d" % i for i in range(300)], group_id=groups)
    stream = Stream(
        spark,
        root,
        destination="g",
        groupingPartitions="3",
        maxMessagesPerTrigger="100",
    )

    def tag(df):
        return df.select(
            "group_id",
            "offset",
            F.spark_partition_id().alias("part"),
            F.monotonically_increasing_id().alias("seq"),
        )

    rows = stream.run(tag)
    assert len(stream.batches) == 3 and sorted(r.offset for r in rows) == list(range(300))
    produce(broker, "g", [b"x"] * 60, group_id=[f"customer-{i % 7}" for i in range(60)])
    rows += stream.run(tag)  # after a restart from the checkpoint
    part_of: dict[str, set[int]] = {}
    for r in rows:
        if r.group_id is not None:
            part_of.setdefault(r.group_id, set()).add(r.part)
    assert len(part_of) == 7 and all(len(p) == 1 for p in part_of.values()), part_of
    assert len({next(iter(p)) for p in part_of.values()}) > 1  # groups do spread out
    for _, batch in stream.batches:  # within a partition, a group's messages come in order
        for group in part_of:
            seen = [r.offset for r in sorted(batch, key=lambda r: r.seq) if r.group_id == group]
            assert seen == sorted(seen)


def test_option_errors_name_the_option() -> None:
    base = {"root": "/data", "destination": "t"}
    cases = {
        "startingOffsets": ('{"t": "x"}', "startingOffsets"),
        "endingOffsets": ("earliest", "endingOffsets"),
        "failOnDataLoss": ("maybe", "failOnDataLoss"),
        "groupingKey": ("body", "groupingKey"),
        "groupingPartitions": ("0", "groupingPartitions"),
        "maxBytesPerTrigger": ("lots", "maxBytesPerTrigger"),
        "startingTimestamp": ("-5", "startingTimestamp"),
        "destinationPattern": ("(", "destinationPattern"),
    }
    for option, (value, named) in cases.items():
        with pytest.raises(ConfigError, match=named):
            SourceOptions.parse({**base, option: value})
    with pytest.raises(ConfigError, match="not both"):
        SourceOptions.parse({**base, "destinationPattern": ".*"})
    with pytest.raises(ConfigError, match="twice"):
        SourceOptions.parse({"root": "/d", "destination": "a,a"})
    parsed = SourceOptions.parse({**base, "destination": "a, b", "startingOffsets": '{"a": -1}'})
    assert parsed.destinations == ("a", "b") and parsed.starting == {"a": -1}
