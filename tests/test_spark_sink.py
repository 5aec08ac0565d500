"""writeStream / write .format("sparkmq"): through the broker, exactly once across kills."""

from __future__ import annotations

import os
import tempfile

import pytest
from pyspark.sql import functions as F

from spark_mq import Admin, Consumer, Producer
from spark_mq.service import RunningBroker
from tests.conftest import receive_n

pytestmark = pytest.mark.spark


def drain(broker: RunningBroker, queue: str, n: int) -> list:
    with Consumer(broker.url, queue, prefetch=1000) as c:
        got = receive_n(c, n, timeout=30)
        assert c.receive(timeout=0.3) is None  # nothing more than expected
    return sorted(got, key=lambda m: m.offset)


def test_batch_write_maps_columns_like_the_kafka_sink(spark, broker: RunningBroker) -> None:
    with Admin(broker.url) as admin:
        admin.create_queue("a")
        admin.create_queue("b")
    df = spark.createDataFrame(
        [
            ("one", "k1", {"h": "1"}, 7, "a"),
            ("two", None, None, None, "b"),
            ("three", "k3", {}, 0, None),
        ],
        "value string, key string, headers map<string,string>, priority int, destination string",
    )
    df.write.format("sparkmq").option("url", broker.url).option("destination", "a").mode(
        "append"
    ).save()
    got_a = sorted(drain(broker, "a", 2), key=lambda m: m.text)  # tasks race: any order
    assert [(m.text, m.group_id, m.priority) for m in got_a] == [
        ("one", "k1", 7),
        ("three", "k3", 0),
    ]
    assert got_a[0].headers == {"h": "1"} and got_a[0].dedup_id.startswith("spark:")
    (two,) = drain(broker, "b", 1)
    assert (two.text, two.group_id, two.priority) == ("two", None, 4)


def test_bad_sink_input_is_refused_before_sending(spark, broker: RunningBroker) -> None:
    with Admin(broker.url) as admin:
        admin.create_queue("q")

    def write(df, **opts):
        w = df.write.format("sparkmq").mode("append")
        for k, v in {"url": broker.url, "destination": "q", **opts}.items():
            if v is not None:
                w = w.option(k, v)
        w.save()

    body = spark.createDataFrame([("x",)], "body string")
    with pytest.raises(Exception, match="'priority' is string"):
        write(body.withColumn("priority", F.lit("high")))
    with pytest.raises(Exception, match="no column 'colour'"):
        write(body.withColumn("colour", F.lit("red")))
    with pytest.raises(Exception, match="needs a 'body'"):
        write(spark.createDataFrame([(1,)], "n int"))
    with pytest.raises(Exception, match="option 'url' is required"):
        write(body, url=None)
    with pytest.raises(Exception, match="append-only"):
        body.write.format("sparkmq").option("url", broker.url).option("destination", "q").mode(
            "overwrite"
        ).save()
    with Admin(broker.url) as admin:
        assert admin.stats("q")["end_offset"] == 0  # nothing was sent


def test_pipeline_killed_mid_batch_is_exactly_once(spark, broker: RunningBroker) -> None:
    root = broker.broker.config.broker.data_dir
    with Admin(broker.url) as admin:
        admin.create_topic("in")
        admin.create_queue("out")
    bodies = [b"m%03d" % i for i in range(300)]
    with Producer(broker.url, destination="in") as p:
        p.send_batch(bodies)
    assert broker.broker.journal.move(timeout=60)

    checkpoint, markers = tempfile.mkdtemp(), tempfile.mkdtemp()
    restarts = 0
    for _ in range(20):
        query = (
            spark.readStream.format("sparkmq")
            .option("root", root)
            .option("destination", "in")
            .option("maxMessagesPerTrigger", 100)
            .option("maxMessagesPerPartition", 50)
            .load()
            .select("body", "group_id")
            .writeStream.format("sparkmq")
            .option("url", broker.url)
            .option("destination", "out")
            # each task's first attempt dies after sending 30 of its 50 rows
            .option("testing.killAfterRows", 30)
            .option("testing.markerDir", markers)
            .option("checkpointLocation", checkpoint)
            .trigger(availableNow=True)
            .start()
        )
        try:
            finished = query.awaitTermination(120)
        except Exception as exc:
            assert "Python worker exited unexpectedly" in str(exc), exc
            restarts += 1  # a task's worker died mid-partition: restart from the checkpoint
            continue
        assert finished, "the availableNow query did not finish in 120 s"
        assert query.exception() is None
        break
    killed = len(os.listdir(markers))  # one marker per task whose Python worker was killed
    assert killed >= 5 and restarts >= 3, (killed, restarts)
    got = drain(broker, "out", 300)
    assert sorted(m.body for m in got) == bodies  # no gap, no duplicate
    with Admin(broker.url) as admin:
        stats = admin.stats("out")
    assert stats["end_offset"] == 300 and stats["duplicates"] >= 30 * restarts
