"""A streaming query consuming through the broker (option ``consumer``): claims are invisible
to other consumers, committed batches are acked, and a restarted query replays a batch with
exactly the same messages."""

from __future__ import annotations

import tempfile

import pytest

from spark_mq import Admin, ConfigError, Producer
from spark_mq.connectors.options import SourceOptions
from spark_mq.service import RunningBroker
from tests.conftest import wait_for

pytestmark = pytest.mark.spark


def consume(spark, broker: RunningBroker, checkpoint: str, on_batch, **opts):
    reader = (
        spark.readStream.format("sparkmq")
        .option("url", broker.url)
        .option("consumer", "etl")
        .option("maxMessagesPerTrigger", 10)
    )
    for key, value in opts.items():
        reader = reader.option(key, value)
    return (
        reader.load()
        .writeStream.foreachBatch(on_batch)
        .option("checkpointLocation", checkpoint)
        .trigger(processingTime="0 seconds")
        .start()
    )


def test_queue_consumer_claims_acks_and_replays_exactly(spark, broker: RunningBroker) -> None:
    with Admin(broker.url) as admin:
        admin.create_queue("jobs")
    with Producer(broker.url, destination="jobs") as producer:
        producer.send_batch([b"job %d" % i for i in range(25)])
    checkpoint = tempfile.mkdtemp()
    seen: dict[int, list[int]] = {}
    waiting: list[list[int]] = []

    def fail_second(df, batch_id: int) -> None:
        seen[batch_id] = sorted(r.offset for r in df.select("offset").collect())
        with Admin(broker.url) as admin:  # what the batch holds, nobody else can take
            waiting.append(admin.browse("jobs", limit=100)["offset"].to_pylist())
        if batch_id == 1:
            raise RuntimeError("the sink is down")

    query = consume(spark, broker, checkpoint, fail_second, destination="jobs")
    with pytest.raises(Exception, match="the sink is down"):
        query.awaitTermination(120)
    first_try = dict(seen)
    assert first_try[0] == list(range(10)) and first_try[1] == list(range(10, 20))
    assert not set(first_try[1]) & set(waiting[1])  # claimed: invisible to others
    with Admin(broker.url) as admin:
        assert admin.stats("jobs")["acked"] == 10  # batch 0 was committed, batch 1 was not

    seen.clear()
    query = consume(
        spark, broker, checkpoint, lambda df, b: fail_second(df, b + 100), destination="jobs"
    )
    try:
        query.processAllAvailable()
    finally:
        query.stop()
    assert seen[101] == first_try[1]  # the replay holds exactly the same messages
    assert seen[102] == list(range(20, 25))
    with Admin(broker.url) as admin:
        wait_for(lambda: admin.stats("jobs")["acked"] == 25)
        assert admin.stats("jobs")["depth"] == 0


def test_topic_subscription_consumer_with_available_now(spark, broker: RunningBroker) -> None:
    with Admin(broker.url) as admin:
        admin.create_topic("events")
        admin.create_subscription("events", "spark")
        admin.create_subscription("events", "others")
    with Producer(broker.url, destination="events") as producer:
        producer.send_batch([b"e%d" % i for i in range(15)])
    got: list[bytes] = []
    query = (
        spark.readStream.format("sparkmq")
        .option("url", broker.url)
        .option("consumer", "etl")
        .option("destination", "events")
        .option("subscription", "spark")
        .option("maxMessagesPerTrigger", 4)
        .load()
        .writeStream.foreachBatch(lambda df, _: got.extend(r.body for r in df.collect()))
        .option("checkpointLocation", tempfile.mkdtemp())
        .trigger(availableNow=True)
        .start()
    )
    assert query.awaitTermination(120), "the availableNow query did not finish in 120 s"
    assert sorted(got) == sorted(b"e%d" % i for i in range(15))
    with Admin(broker.url) as admin:
        subs = admin.stats("events")["subscriptions"]
        assert subs["spark"]["acked"] == 15 and subs["spark"]["depth"] == 0
        assert subs["others"]["depth"] == 15  # another subscription is untouched


def test_consumer_options_are_checked(spark, broker: RunningBroker) -> None:
    base = {"consumer": "etl", "destination": "q"}
    with pytest.raises(ConfigError, match="do not apply"):
        SourceOptions.parse({**base, "startingOffsets": "earliest"})
    with pytest.raises(ConfigError, match="one destination"):
        SourceOptions.parse({**base, "destination": "a,b"})
    with pytest.raises(ConfigError, match="needs 'consumer'"):
        SourceOptions.parse({"root": "/x", "destination": "q", "subscription": "s"})
    with pytest.raises(Exception, match="for streaming queries"):
        spark.read.format("sparkmq").option("url", broker.url).options(**base).load().collect()
