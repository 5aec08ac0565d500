"""A Kafka user's habits with format("sparkmq"): Kafka's option names and value forms on the
source, Kafka-shaped frames on the sink (a topic column, a binary key, headers as
array<struct<key,value>>, a Kafka source's other columns), and unknown options named as
written with the closest one suggested."""

from __future__ import annotations

import json
import tempfile
from datetime import datetime, timezone

import pytest
from pyspark.sql.utils import AnalysisException

from spark_mq import Admin
from spark_mq.clock import ManualClock
from spark_mq.connectors.options import SourceOptions
from spark_mq.errors import ConfigError
from spark_mq.service import RunningBroker
from tests.test_spark_options import produce, topics
from tests.test_spark_sink import drain

pytestmark = pytest.mark.spark


def test_kafkas_option_names_and_forms_parse_as_their_sparkmq_meaning() -> None:
    opts = SourceOptions.parse(
        {
            "root": "/data",
            "subscribe": "orders",
            "maxOffsetsPerTrigger": "500",
            "minOffsetsPerTrigger": "100",
            "maxTriggerDelay": "30s",
            "startingOffsets": '{"orders": {"0": 42}}',
            "startingOffsetsByTimestamp": '{"orders": {"0": "2026-11-26T10:00:00Z"}}',
        }
    )
    assert opts.destinations == ("orders",)
    assert opts.max_messages_per_trigger == 500 and opts.min_messages_per_trigger == 100
    assert opts.max_trigger_delay_s == 30.0
    assert opts.starting == {"orders": 42}
    ten = int(datetime(2026, 11, 26, 10, tzinfo=timezone.utc).timestamp() * 1000)
    assert opts.starting_timestamps == {"orders": ten}
    pattern = SourceOptions.parse({"root": "/d", "subscribePattern": "eu\\..*"})
    assert pattern.pattern == "eu\\..*" and pattern.max_trigger_delay_s == 15 * 60
    iso = SourceOptions.parse(
        {"root": "/d", "destination": "t", "startingTimestamp": "2026-11-26T11:30:00+01:00"}
    )
    assert iso.starting_timestamp_ms == ten + 30 * 60 * 1000
    assert SourceOptions.parse(
        {"root": "/d", "destination": "t", "startingTimestamp": str(ten)}
    ).starting_timestamp_ms == ten  # fmt: skip
    for delay, seconds in (("500ms", 0.5), ("15m", 900.0), ("2h", 7200.0), ("250", 0.25)):
        parsed = SourceOptions.parse({"root": "/d", "destination": "t", "maxTriggerDelay": delay})
        assert parsed.max_trigger_delay_s == seconds


def test_kafka_option_mistakes_are_named_with_a_suggestion() -> None:
    base = {"root": "/data", "destination": "t"}
    with pytest.raises(ConfigError, match=r"'maxOffsetPerTrigger' \(did you mean "
                       r"'maxOffsetsPerTrigger'\?\)"):  # fmt: skip
        SourceOptions.parse({**base, "maxOffsetPerTrigger": "5"})
    with pytest.raises(ConfigError, match=r"'startingOffset' \(did you mean 'startingOffsets'"):
        SourceOptions.parse({**base, "startingOffset": "earliest"})
    with pytest.raises(ConfigError, match="say the same thing"):
        SourceOptions.parse({"root": "/d", "destination": "a", "subscribe": "a"})
    with pytest.raises(ConfigError, match="'x' is not a partition"):
        SourceOptions.parse({**base, "startingOffsets": '{"t": {"0": 1, "x": 5}}'})
    # a partitioned destination's partitions: partition 0 by the name, the others <name>~<i>
    parsed = SourceOptions.parse({**base, "startingOffsets": '{"t": {"0": 1, "1": 5}}'})
    assert parsed.starting == {"t": 1, "t~1": 5}
    with pytest.raises(ConfigError, match="ISO-8601"):
        SourceOptions.parse({**base, "startingTimestamp": "yesterday"})
    with pytest.raises(ConfigError, match="maxTriggerDelay"):
        SourceOptions.parse({**base, "maxTriggerDelay": "soon"})
    with pytest.raises(ConfigError, match="do not apply when consuming through the broker"):
        SourceOptions.parse({**base, "consumer": "q1", "minOffsetsPerTrigger": "5"})


def test_a_query_written_for_kafka_runs_with_its_format_and_servers_changed(
    spark, broker: RunningBroker, clock: ManualClock
) -> None:
    root = broker.broker.config.broker.data_dir
    topics(broker, "orders")
    produce(broker, "orders", [b"old-%d" % i for i in range(3)])
    cut = datetime.fromtimestamp(clock.wall() + 30, tz=timezone.utc)
    clock.advance(60)
    produce(broker, "orders", [b"new-%d" % i for i in range(7)])

    # as written for Kafka, but format("sparkmq") and root instead of kafka.bootstrap.servers
    batches: list[list[str]] = []
    query = (
        spark.readStream.format("sparkmq")
        .option("root", root)
        .option("subscribe", "orders")
        .option("startingOffsets", '{"orders": {"0": 1}}')
        .option("maxOffsetsPerTrigger", 3)
        .option("failOnDataLoss", "true")
        .option("kafkaColumns", "true")  # (Kafka's key, value, topic, timestamp, headers)
        .load()
        .selectExpr("CAST(value AS STRING) AS value")
        .writeStream.foreachBatch(
            lambda df, _: batches.append(sorted(r.value for r in df.collect()))
        )
        .option("checkpointLocation", tempfile.mkdtemp())
        .trigger(availableNow=True)
        .start()
    )
    assert query.awaitTermination(120) and query.exception() is None
    assert [len(b) for b in batches] == [3, 3, 3]  # nine from offset 1, three a trigger
    assert sorted(v for b in batches for v in b) == sorted(
        ["old-1", "old-2", *(f"new-{i}" for i in range(7))]
    )

    # startingTimestamp as an ISO-8601 time, and startingOffsetsByTimestamp
    since = (
        spark.read.format("sparkmq")
        .option("root", root)
        .option("subscribe", "orders")
        .option("startingTimestamp", cut.isoformat())
        .load()
    )
    assert sorted(bytes(r.body) for r in since.collect()) == [b"new-%d" % i for i in range(7)]
    by_time = (
        spark.read.format("sparkmq")
        .option("root", root)
        .option("subscribe", "orders")
        .option("startingOffsetsByTimestamp", json.dumps({"orders": {"0": cut.isoformat()}}))
        .load()
    )
    assert by_time.count() == 7

    with pytest.raises(AnalysisException, match=r"did you mean 'maxOffsetsPerTrigger'"):
        spark.read.format("sparkmq").option("root", root).option("subscribe", "orders").option(
            "maxOffsetPerTrigger", 3
        ).load()


def test_min_offsets_per_trigger_waits_for_enough_messages(spark, broker: RunningBroker) -> None:
    from spark_mq.connectors.source import StreamReader

    root = broker.broker.config.broker.data_dir
    topics(broker, "slow")
    produce(broker, "slow", [b"x"] * 4)
    reader = StreamReader(
        SourceOptions.parse(
            {
                "root": root,
                "subscribe": "slow",
                "minOffsetsPerTrigger": "10",
                "maxTriggerDelay": "1h",
            }
        )
    )
    from pyspark.sql.streaming.datasource import ReadAllAvailable

    start = reader.initialOffset()
    assert reader.latestOffset(start, ReadAllAvailable()) == start  # 4 < 10: no batch yet
    produce(broker, "slow", [b"x"] * 6)
    assert reader.latestOffset(start, ReadAllAvailable()) == {"slow": 10}
    hurried = StreamReader(
        SourceOptions.parse(
            {
                "root": root,
                "subscribe": "slow",
                "minOffsetsPerTrigger": "100",
                "maxTriggerDelay": "0ms",
            }
        )
    )
    assert hurried.latestOffset(start, ReadAllAvailable()) == {"slow": 10}  # waited enough


def test_the_sink_takes_kafka_shaped_frames(spark, broker: RunningBroker) -> None:
    with Admin(broker.url) as admin:
        admin.create_queue("k.orders")
        admin.create_queue("k.audit")
        admin.create_queue("k.plain")
    # a Kafka source's frame, passed through unchanged (only format and servers differ)
    frame = spark.createDataFrame(
        [
            (b"c-1", b"first", "k.orders", 0, 10, None, 0, [("trace", b"t1"), ("v", None)]),
            (b"c-2", b"second", "k.orders", 0, 11, None, 0, []),
            (None, b"third", "k.audit", 3, 12, None, 0, None),
        ],
        "key binary, value binary, topic string, partition int, offset long, "
        "timestamp timestamp, timestampType int, "
        "headers array<struct<key:string,value:binary>>",
    )
    frame.write.format("sparkmq").option("url", broker.url).mode("append").save()
    orders = sorted(drain(broker, "k.orders", 2), key=lambda m: m.text)  # (tasks race)
    assert [(m.text, m.group_id, m.headers) for m in orders] == [
        ("first", "c-1", {"trace": "t1", "v": ""}),
        ("second", "c-2", {}),
    ]
    (audit,) = drain(broker, "k.audit", 1)
    assert (audit.text, audit.group_id, audit.headers) == ("third", None, {})

    # Kafka's "topic" option names the destination of rows without a topic column
    spark.createDataFrame([("plain",)], "value string").write.format("sparkmq").option(
        "url", broker.url
    ).option("topic", "k.plain").mode("append").save()
    assert [m.text for m in drain(broker, "k.plain", 1)] == ["plain"]

    not_text = spark.createDataFrame([(b"\xff\xfe", b"x")], "key binary, value binary")
    with pytest.raises(Exception, match="not UTF-8"):
        not_text.write.format("sparkmq").option("url", broker.url).option(
            "destination", "k.audit"
        ).mode("append").save()
    wrong = spark.createDataFrame([(b"x", [1, 2])], "value binary, headers array<int>")
    with pytest.raises(Exception, match="array<struct<key:string,value:binary>>"):
        wrong.write.format("sparkmq").option("url", broker.url).option(
            "destination", "k.audit"
        ).mode("append").save()


def test_kafka_columns_on_both_read_paths(spark, broker: RunningBroker) -> None:
    root = broker.broker.config.broker.data_dir
    topics(broker, "kc")
    produce(
        broker, "kc", [b"first", b"second"], group_id=["cust-1", None],
        headers=[[("trace", "t1")], []],
    )  # fmt: skip
    expected = [
        ("cust-1", "first", "kc", [("trace", b"t1")]),
        (None, "second", "kc", []),
    ]
    for fmt in ("sparkmq", "sparkmq_python"):  # (Spark's Parquet reader; the Python source)
        df = (
            spark.read.format(fmt).option("root", root).option("subscribe", "kc")
            .option("kafkaColumns", "true").load()
        )  # fmt: skip
        assert df.schema["headers"].dataType.simpleString() == (
            "array<struct<key:string,value:binary>>"
        )
        # as a query written for Kafka selects them
        rows = df.selectExpr(
            "CAST(key AS STRING) AS k", "CAST(value AS STRING) AS v", "topic", "headers",
            "timestamp", "offset",
        ).orderBy("offset").collect()  # fmt: skip
        got = [(r.k, r.v, r.topic, [(h.key, bytes(h.value)) for h in r.headers]) for r in rows]
        assert got == expected, fmt
        assert all(r.timestamp is not None for r in rows)
    plain = spark.read.format("sparkmq").option("root", root).option("destination", "kc").load()
    assert "value" not in plain.columns and "headers" in plain.columns  # (off by default)
