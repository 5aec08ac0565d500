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


def test_a_partitioned_queue_is_consumed_in_claims_of_each_partition(
    spark, broker: RunningBroker
) -> None:
    """Option ``consumer`` on a partitioned queue: each micro-batch claims from every
    partition (``maxMessagesPerTrigger`` shared), a restarted query replays its uncommitted
    batch with the same messages, each group stays in order, a partition added while the
    query runs is consumed too, and releasing a consumer name gives back what it held on
    every partition."""
    with Admin(broker.url) as admin:
        admin.create_queue("parted", partitions=3)
    with Producer(broker.url) as producer:
        for i in range(24):  # (group g<k> in partition k % 3)
            producer.send_sync(b"%d" % i, destination=f"parted~{i % 3}", group_id=f"g{i % 6}")
    with Admin(broker.url) as admin:
        for part in ("parted~0", "parted~1"):
            assert admin.claim(part, "gone", 1, 2) == 2
        assert admin.release_claims("parted", "gone") == 4
        with pytest.raises(Exception, match="may not claim again"):
            admin.claim("parted~1", "gone", 2, 2)
    checkpoint = tempfile.mkdtemp()
    seen: dict[int, list[tuple[str, bytes]]] = {}

    def fail_second(df, batch_id: int) -> None:
        seen[batch_id] = [(r.destination, bytes(r.body)) for r in df.collect()]
        if batch_id == 1:
            raise RuntimeError("the sink is down")

    query = consume(spark, broker, checkpoint, fail_second, destination="parted")
    with pytest.raises(Exception, match="the sink is down"):
        query.awaitTermination(120)
    first_try = dict(seen)
    assert [len(first_try[b]) for b in (0, 1)] == [10, 10]
    assert {d for d, _ in first_try[0]} == {"parted~0", "parted~1", "parted~2"}

    seen.clear()
    query = consume(
        spark, broker, checkpoint, lambda df, b: fail_second(df, b + 100), destination="parted"
    )
    try:
        query.processAllAvailable()
        assert sorted(seen[101]) == sorted(first_try[1])  # the same messages again
        with Admin(broker.url) as admin:
            assert admin.add_partitions("parted", 4)
        with Producer(broker.url) as producer:
            producer.send_sync(b"late", destination="parted~3", group_id="g9")
        wait_for(lambda: any(body == b"late" for got in seen.values() for _, body in got), 60,
                 "the message in the partition added")  # fmt: skip
        query.processAllAvailable()
    finally:
        query.stop()
    batches = [first_try[0]] + [seen[b] for b in sorted(seen)]
    bodies = [body for got in batches for _, body in got]
    assert sorted(bodies) == sorted([b"%d" % i for i in range(24)] + [b"late"])  # each once
    for group in range(6):  # each group in its order, across batches
        mine = [int(body) for body in bodies if body != b"late" and int(body) % 6 == group]
        assert mine == sorted(mine), group
    with Admin(broker.url) as admin:
        wait_for(lambda: admin.stats("parted")["acked"] == 25, 30, "every message acked")
        assert admin.stats("parted")["depth"] == 0
