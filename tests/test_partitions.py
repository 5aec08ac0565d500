"""Partitioned destinations on one broker: created with ``partitions = N``, placed by group id,
consumed as one, administered as one, kept across a restart. (Across cluster members:
test_cluster.py; through Kafka clients: test_kafka.py; Spark: test_spark_source.py.)"""

from __future__ import annotations

import asyncio
import threading
import time
from collections import defaultdict

import pyarrow as pa
import pytest

from spark_mq import Admin, Consumer, Producer, Transaction
from spark_mq.client.producer import _placed
from spark_mq.errors import ConfigError, DestinationExists, DestinationNotFound, Partitioned
from spark_mq.names import choose_partition, partition_of
from spark_mq.service import RunningBroker
from tests.conftest import Restartable, receive_n, wait_for


def by_group(messages: list) -> dict[str, list[int]]:
    seen: dict[str, list[int]] = defaultdict(list)
    for m in messages:
        seen[m.group_id].append(int(m.body))
    return seen


def test_a_partitioned_queue_spreads_groups_and_keeps_each_groups_order(
    broker: RunningBroker,
) -> None:
    with Admin(broker.url) as admin:
        assert admin.create_queue("orders", partitions=4, max_delivery_attempts=3)
        assert not admin.create_queue("orders", partitions=4)  # idempotent
        assert not admin.create_queue("orders")  # (it exists: the count need not be said)
        with pytest.raises(DestinationExists, match="4 partitions, not 2"):
            admin.create_queue("orders", partitions=2)
        with pytest.raises(DestinationExists, match="as a queue"):
            admin.create_topic("orders", partitions=4)
        listed = sorted(d["name"] for d in admin.list_destinations())
        assert listed == ["orders~0", "orders~1", "orders~2", "orders~3"]
    groups = [f"g{i}" for i in range(12)]
    with Producer(broker.url, linger_ms=1) as producer:
        futures = [
            producer.send(str(i).encode(), destination="orders", group_id=groups[i % 12])
            for i in range(240)
        ]
        producer.flush()
        assert all(f.result(timeout=10) >= 0 for f in futures)
        # a batch is split by group too, and its offsets come back in the rows' order
        table = pa.table(
            {"body": [str(i).encode() for i in range(240, 300)],
             "group_id": [groups[i % 12] for i in range(240, 300)]}
        )  # fmt: skip
        offsets = producer.send_batch(table, destination="orders")
        assert len(offsets) == 60
    with Consumer(broker.url, "orders") as consumer:
        assert consumer.partitions is not None and len(consumer.partitions) == 4
        got = receive_n(consumer, 300)
        consumer.ack(got).result(timeout=10)
        assert consumer.receive(timeout=0.3) is None
    for m in got:  # each group in the one partition its id places it in
        assert m.partition == choose_partition(m.group_id, 4, 0)
        assert partition_of(m.destination) == ("orders", m.partition)
    seen = by_group(got)
    assert sorted(seen) == sorted(groups)
    for group, bodies in seen.items():
        assert bodies == sorted(bodies), group  # per-group order kept
    spread = {m.partition for m in got}
    assert spread == {0, 1, 2, 3}
    with Admin(broker.url) as admin:
        stats = admin.stats("orders")
        assert stats["produced"] == 300 and len(stats["partitions"]) == 4
        assert stats["acked"] == 300 and stats["depth"] == 0
        assert stats["settings"]["max_delivery_attempts"] == 3
        assert stats["settings"]["partitions"] == 4
        assert [p["name"] for p in stats["partitions"]] == [f"orders~{i}" for i in range(4)]


def test_a_batch_places_each_row_where_it_would_go_sent_alone() -> None:
    keys = pa.array(["g1", None, "\u00fc-7", "g1", "", None, "order-17", "g2"] * 50)
    expected = [choose_partition(k, 5, 11 + i) for i, k in enumerate(keys.to_pylist())]
    assert _placed(keys, 5, 11).tolist() == expected
    assert _placed(pa.array([None, None, None], pa.string()), 3, 4).tolist() == [1, 2, 0]


def test_a_mixed_batch_s_offsets_follow_its_rows_each_in_its_partition(
    broker: RunningBroker,
) -> None:
    with Admin(broker.url) as admin:
        admin.create_queue("mixed", partitions=3)
    n = 90  # a group id, else a dedup id, else neither, in turn
    table = pa.table(
        {"body": [b"%d" % i for i in range(n)],
         "group_id": [f"g{i % 7}" if i % 3 == 0 else None for i in range(n)],
         "dedup_id": [f"d{i}" if i % 3 == 1 else None for i in range(n)]}
    )  # fmt: skip
    with Producer(broker.url) as producer:
        offsets = producer.send_batch(table, destination="mixed")
    with Consumer(broker.url, "mixed") as consumer:
        got = receive_n(consumer, n)
        consumer.ack(got).result(timeout=10)
    assert len({(m.partition, m.offset) for m in got}) == n
    for m in got:
        i = int(m.body)
        assert m.offset == offsets[i], i  # (the offset in its partition)
        key = table["group_id"][i].as_py() or table["dedup_id"][i].as_py()
        if key is not None:
            assert m.partition == choose_partition(key, 3, 0), i
    for group, bodies in by_group(got).items():
        assert group is None or bodies == sorted(bodies), group


def test_messages_without_a_group_go_round_robin_and_a_dedup_id_keeps_its_partition(
    broker: RunningBroker,
) -> None:
    with Admin(broker.url) as admin:
        admin.create_queue("spread", partitions=3)
    with Producer(broker.url) as producer:
        for i in range(30):
            producer.send_sync(str(i).encode(), destination="spread")
        # a resend of the same dedup id lands in the same partition, so it is caught
        first = producer.send_sync(b"once", destination="spread", dedup_id="order-17")
        again = producer.send_sync(b"once", destination="spread", dedup_id="order-17")
        assert first == again
    with Admin(broker.url) as admin:
        counts = [p["produced"] for p in admin.stats("spread")["partitions"]]
    assert sum(counts) == 31
    assert sorted(counts) == [10, 10, 11]


def test_a_batch_without_groups_goes_whole_to_one_partition_and_the_next_to_the_next(
    broker: RunningBroker,
) -> None:
    """Kafka's sticky partitioner: a batch smaller than ``batch_size`` is not cut (a batch of 50
    to four partitions was four sends of 12 or 13); a bigger one is cut in runs of at least
    ``batch_size``, one a partition. The asyncio SDK sends a batch to one partition too."""
    from spark_mq.aio import AsyncProducer

    with Admin(broker.url) as admin:
        admin.create_queue("sticky", partitions=4)

        def counts() -> list[int]:
            return [p["produced"] for p in admin.stats("sticky")["partitions"]]

        with Producer(broker.url, batch_size=100) as producer:
            first = producer.send_batch([b"a%d" % i for i in range(50)], destination="sticky")
            assert sorted(counts()) == [0, 0, 0, 50]
            assert first == list(range(50))  # (one partition's offsets, in order)
            producer.send_batch([b"b%d" % i for i in range(50)], destination="sticky")
            assert sorted(counts()) == [0, 0, 50, 50]
            producer.send_batch([b"c%d" % i for i in range(400)], destination="sticky")
            assert sorted(counts()) == [100, 100, 150, 150]

        async def send() -> list[int]:
            async with AsyncProducer(broker.url, destination="sticky") as p:
                return await p.send_batch([b"d%d" % i for i in range(60)])

        before = counts()
        offsets = asyncio.run(send())
        grew = [after - was for after, was in zip(counts(), before, strict=True)]
        assert sorted(grew) == [0, 0, 0, 60]
        assert offsets == list(range(before[grew.index(60)], before[grew.index(60)] + 60))

        async def send_big() -> list[int]:  # (two frames' worth: two runs, two partitions)
            async with AsyncProducer(broker.url, destination="sticky") as p:
                return await p.send_batch([b"f%d" % i for i in range(2000)])

        before = counts()
        assert len(asyncio.run(send_big())) == 2000
        grew = [after - was for after, was in zip(counts(), before, strict=True)]
        assert sorted(grew) == [0, 0, 1000, 1000]
    with Consumer(broker.url, "sticky", prefetch=2600) as consumer:
        got = receive_n(consumer, 2560)
        consumer.ack(got).result(timeout=10)
    for prefix in "abd":  # each small batch in one partition, in its order
        batch = [m for m in got if m.body.startswith(prefix.encode())]
        assert len({m.partition for m in batch}) == 1
        assert [m.body for m in batch] == sorted((m.body for m in batch), key=lambda b: int(b[1:]))


def test_sent_messages_without_a_group_fill_one_partitions_batch_then_the_next(
    broker: RunningBroker,
) -> None:
    """``send`` without a group or dedup id: the partition whose batch is being filled, then
    the next once that batch went (Kafka's sticky partitioner); a group still places its own."""
    with Admin(broker.url) as admin:
        admin.create_queue("filled", partitions=3)
    with Producer(broker.url, batch_size=10, linger_ms=60_000) as producer:
        futures = [producer.send(b"%d" % i, destination="filled") for i in range(30)]
        grouped = producer.send(b"g", destination="filled", group_id="g7")
        producer.flush()
        assert [f.result(timeout=10) for f in futures] == [i % 10 for i in range(30)]
        assert grouped.result(timeout=10) >= 0
    with Consumer(broker.url, "filled") as consumer:
        got = receive_n(consumer, 31)
        consumer.ack(got).result(timeout=10)
    where = {int(m.body): m.partition for m in got if m.body != b"g"}
    runs = [{where[i] for i in range(k, k + 10)} for k in (0, 10, 20)]
    assert all(len(run) == 1 for run in runs), runs  # each batch of ten in one partition
    assert set.union(*runs) == {0, 1, 2}
    assert next(m.partition for m in got if m.body == b"g") == choose_partition("g7", 3, 0)


def test_the_partitioned_name_itself_is_refused_where_a_partition_is_meant(
    broker: RunningBroker,
) -> None:
    with Admin(broker.url) as admin:
        admin.create_queue("parted", partitions=2)
        with pytest.raises(Partitioned, match="2 partitions, parted~0 to parted~1"):
            admin.browse("parted")
        with pytest.raises(ConfigError, match="added, not taken away"):
            admin.configure("parted", partitions=1)
        # configured as one: each partition gets the setting
        assert admin.configure("parted", max_delivery_attempts=7)["max_delivery_attempts"] == 7
        parts = admin.stats("parted")["partitions"]
        assert {p["settings"]["max_delivery_attempts"] for p in parts} == {7}
        admin.create_queue("plain")
        with pytest.raises(DestinationExists, match="exists without partitions"):
            admin.create_queue("plain", partitions=2)
    # a partition may be named: a producer or consumer of one partition only
    with Producer(broker.url) as producer:
        producer.send_sync(b"direct", destination="parted~1")
    with Consumer(broker.url, "parted~1") as only:
        assert only.partitions is None
        (m,) = receive_n(only, 1)
        assert (m.body, m.partition) == (b"direct", 1)
        m.ack().result(timeout=5)
    with Producer(broker.url) as producer, pytest.raises(DestinationNotFound, match="parted~7"):
        producer.send_sync(b"nowhere", destination="parted~7")  # (not made by a send)
    with Admin(broker.url) as admin:
        admin.delete_destination("parted")
        assert [d["name"] for d in admin.list_destinations()] == ["plain"]


def test_a_partitioned_topic_has_its_subscriptions_on_every_partition(
    broker: RunningBroker,
) -> None:
    with Admin(broker.url) as admin:
        admin.create_topic("events", partitions=2)
        assert admin.create_subscription("events", "audit")
        assert not admin.create_subscription("events", "audit")
    received: list = []
    done = threading.Event()

    def handle(m) -> None:
        received.append(m)
        m.ack()
        if len(received) == 20:
            done.set()

    with Consumer(broker.url, "events", subscription="audit", on_message=handle) as consumer:
        with Producer(broker.url) as producer:
            producer.send_batch(
                pa.table({"body": [b"%d" % i for i in range(20)],
                          "group_id": [f"k{i % 5}" for i in range(20)]}),
                destination="events",
            )  # fmt: skip
        assert done.wait(10)
        with pytest.raises(RuntimeError, match="on_message"):
            consumer.receive(timeout=0.1)
    assert {m.partition for m in received} == {0, 1}
    for bodies in by_group(received).values():
        assert bodies == sorted(bodies)
    with Admin(broker.url) as admin:
        assert admin.stats("events")["subscriptions"]["audit"]["acked"] == 20
        admin.delete_subscription("events", "audit")
        assert admin.stats("events")["subscriptions"] == {}


def test_partitions_are_kept_across_a_restart(restartable: Restartable) -> None:
    with Admin(restartable.url) as admin:
        admin.create_queue("kept", partitions=3)
        admin.create_topic("grown", partitions=2)
        admin.create_subscription("grown", "audit", selector="kind = 'keep'")
        assert admin.add_partitions("grown", 3)
    with Producer(restartable.url) as producer:
        producer.send_batch(
            pa.table({"body": [b"%d" % i for i in range(30)],
                      "group_id": [f"k{i % 6}" for i in range(30)]}),
            destination="kept",
        )  # fmt: skip
        sent = [
            producer.send(kind.encode(), destination="grown~2", headers={"kind": kind})
            for kind in ("skip", "keep")
        ]
        producer.flush()
        assert [f.result(timeout=10) for f in sent] == [0, 1]
    restartable.restart()
    with Consumer(restartable.url, "kept") as consumer:
        got = receive_n(consumer, 30)
        consumer.ack(got).result(timeout=10)
    assert sorted(int(m.body) for m in got) == list(range(30))
    with Admin(restartable.url) as admin:
        assert len(admin.stats("kept")["partitions"]) == 3
        # a partition added is kept, with its subscription and the subscription's selector
        assert admin.partitions("grown") == 3
        assert list(admin.stats("grown~2")["subscriptions"]) == ["audit"]
    with Consumer(restartable.url, "grown", subscription="audit") as consumer:
        (m,) = receive_n(consumer, 1)
        assert (m.body, m.partition) == (b"keep", 2)
        m.ack().result(timeout=10)
        assert consumer.receive(timeout=0.3) is None  # ("skip": not selected)


def test_partitions_added_to_a_topic_reach_its_subscriptions_producers_and_consumers(
    broker: RunningBroker,
) -> None:
    """Growing a partitioned topic: the new partitions carry its durable subscriptions, and a
    producer and a consumer already using it take them on (each asks now and then)."""
    with Admin(broker.url) as admin:
        admin.create_topic("growing", partitions=2, max_delivery_attempts=4)
        admin.create_subscription("growing", "all")
    late = next(f"g{i}" for i in range(100) if choose_partition(f"g{i}", 4, 0) == 3)
    with (
        Producer(broker.url, linger_ms=1, partitions_recheck_s=0.1) as producer,
        Consumer(broker.url, "growing", subscription="all", partitions_recheck_s=0.1) as consumer,
    ):
        producer.send_sync(b"before", destination="growing", group_id=late)
        (first,) = receive_n(consumer, 1)
        assert first.partition == choose_partition(late, 2, 0)
        first.ack().result(timeout=10)
        with Admin(broker.url) as admin:
            assert admin.add_partitions("growing", 4)
            assert not admin.add_partitions("growing", 4)  # (it has them: nothing to do)
            with pytest.raises(ConfigError, match="has 4 partitions: partitions can be added"):
                admin.add_partitions("growing", 3)
            stats = admin.stats("growing")
        assert [p["name"] for p in stats["partitions"]] == [f"growing~{i}" for i in range(4)]
        for part in stats["partitions"]:  # each with the topic's settings and subscription
            assert part["settings"]["max_delivery_attempts"] == 4
            assert list(part["subscriptions"]) == ["all"]
        wait_for(lambda: len(consumer.partitions or ()) == 4, 10, "the consumer's new partitions")
        # the producer places the group by the new count once it has asked again
        got: list = []
        deadline = time.monotonic() + 10
        while not any(m.partition == 3 for m in got):
            assert time.monotonic() < deadline, "the producer never placed over 4 partitions"
            producer.send_sync(b"after", destination="growing", group_id=late)
            got += receive_n(consumer, 1)
        consumer.ack(got).result(timeout=10)
        assert {m.partition for m in got} <= {choose_partition(late, 2, 0), 3}
    with Admin(broker.url) as admin:
        assert admin.stats("growing~3")["subscriptions"]["all"]["acked"] == 1


def _subscriptions_of(broker: RunningBroker, part: str) -> dict[str, str | None]:
    """A partition's durable subscriptions as recorded, with their selectors."""
    recorded = broker.broker.journal.recorded(part)
    assert recorded is not None, part
    return {s.name: s.selector for s in recorded.subscriptions.values()}


def test_a_change_made_while_partitions_are_added_reaches_the_new_ones_too(
    broker: RunningBroker, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A subscription made or removed, or a setting changed, while partitions are added (the
    growth having read partition 0 already): the growth reads partition 0 again once its count
    is raised and does the change to the new partitions too."""
    with Admin(broker.url) as admin:
        admin.create_topic("racing", partitions=2)
        admin.create_subscription("racing", "old")
    registry = broker.broker.admin.destinations
    create, read, go = registry.create, threading.Event(), threading.Event()

    def held_create(name: str, *args, **kwargs) -> bool:
        if name == "racing~2":  # (the growth has read partition 0's subscriptions)
            read.set()
            assert go.wait(30)
        return create(name, *args, **kwargs)

    monkeypatch.setattr(registry, "create", held_create)
    grown: list[bool] = []
    growth = threading.Thread(
        target=lambda: grown.append(Admin(broker.url).add_partitions("racing", 4))
    )
    growth.start()
    assert read.wait(30)
    with Admin(broker.url) as admin:
        assert admin.create_subscription("racing", "new", selector="kind = 'x'")
        admin.delete_subscription("racing", "old")
        admin.configure("racing", max_delivery_attempts=7)
        assert admin.partitions("racing") == 2  # (what the client saw: the growth is held)
    go.set()
    growth.join(30)
    assert grown == [True]
    with Admin(broker.url) as admin:
        for index in range(4):
            part = f"racing~{index}"
            assert _subscriptions_of(broker, part) == {"new": "kind = 'x'"}, part
            assert admin.stats(part)["settings"]["max_delivery_attempts"] == 7, part


def test_an_admin_client_does_its_change_to_partitions_added_before_it_reached_partition_0(
    broker: RunningBroker, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A growth that ran whole between an admin client's change of partitions 1.. and of
    partition 0 (so it never saw the change): the client reads the count again after partition
    0 and does the change to the new partitions too; a subscription removed that the new ones
    never had is no error."""
    with Admin(broker.url) as admin:
        admin.create_topic("behind", partitions=2)
    core = broker.broker.admin
    create, delete = core.create_subscription, core.delete_subscription

    def grow(count: int) -> None:
        growth = threading.Thread(target=lambda: Admin(broker.url).add_partitions("behind", count))
        growth.start()
        growth.join(30)

    def create_after_growth(destination: str, name: str, selector: str | None = None) -> bool:
        if destination == "behind~0" and name == "late":
            grow(3)  # (reads partition 0 before and after: no "late" there yet)
        return create(destination, name, selector)

    def growth_after_delete(destination: str, name: str) -> None:
        delete(destination, name)
        if destination == "behind~0":
            grow(4)  # (partition 3 is made without "late")

    monkeypatch.setattr(core, "create_subscription", create_after_growth)
    monkeypatch.setattr(core, "delete_subscription", growth_after_delete)
    with Admin(broker.url) as admin:
        assert admin.create_subscription("behind", "late")
        assert admin.partitions("behind") == 3
        assert all(_subscriptions_of(broker, f"behind~{i}") == {"late": None} for i in range(3))
        admin.delete_subscription("behind", "late")
        assert admin.partitions("behind") == 4
        assert all(_subscriptions_of(broker, f"behind~{i}") == {} for i in range(4))


def test_adding_partitions_says_what_cannot_be_done(broker: RunningBroker) -> None:
    with Admin(broker.url) as admin:
        admin.create_queue("single")
        with pytest.raises(ConfigError, match="'single' has no partitions"):
            admin.add_partitions("single", 2)
        with pytest.raises(DestinationNotFound, match="'nowhere' does not exist"):
            admin.add_partitions("nowhere", 2)
        admin.create_queue("two", partitions=2)
        for bad in (0, 5000):
            with pytest.raises(ConfigError, match="a whole number from 1 to 1024"):
                admin.add_partitions("two", bad)
        # configure's ``partitions`` grows it, then the other settings apply to every partition
        settings = admin.configure("two", partitions=3, max_delivery_attempts=9)
        assert settings["max_delivery_attempts"] == 9
        assert admin.stats("two")["settings"]["partitions"] == 3
        parts = admin.stats("two")["partitions"]
        assert [p["settings"]["max_delivery_attempts"] for p in parts] == [9, 9, 9]
        admin.create_topic("cut", partitions=2)
        admin.create_subscription("cut", "keep")
    # a growth cut short left a partition without the topic's subscription: said, not used
    broker.broker.destinations.create("cut~2", "topic", {"partitions": 3})
    with Admin(broker.url) as admin:
        with pytest.raises(ConfigError, match="'cut~2' was made by an earlier growth cut short"):
            admin.add_partitions("cut", 3)
        assert admin.partitions("cut") == 2
        admin.create_subscription("cut~2", "keep")
        assert admin.add_partitions("cut", 3)
        assert admin.partitions("cut") == 3


def test_a_transaction_places_its_sends_in_partitions(broker: RunningBroker) -> None:
    with Admin(broker.url) as admin:
        admin.create_queue("txparts", partitions=2)
        admin.create_queue("txsource")
    with Producer(broker.url) as producer:
        producer.send_sync(b"in", destination="txsource")
    with Consumer(broker.url, "txsource") as consumer, Transaction(broker.url) as tx:
        (m,) = receive_n(consumer, 1)
        for i in range(6):
            tx.send("txparts", f"{i}", group_id=f"g{i % 3}")
        tx.ack(m)
        offsets = tx.commit()
    assert set(offsets) <= {"txparts~0", "txparts~1"}
    assert sum(len(v) for v in offsets.values()) == 6
    with Consumer(broker.url, "txparts") as consumer:
        got = receive_n(consumer, 6)
        consumer.ack(got).result(timeout=10)
    for msg in got:
        assert msg.partition == choose_partition(msg.group_id, 2, 0)


def test_a_partitions_dead_letters_go_to_its_destinations_queue(broker: RunningBroker) -> None:
    """Every partition dead-letters into the destination's one DLQ, saying which partition a
    message came from; a topic's statistics carry what the command line's tables show."""
    from spark_mq.views import summary

    with Admin(broker.url) as admin:
        admin.create_queue("doomed", partitions=2, max_delivery_attempts=1)
    with Producer(broker.url) as producer:
        for i in range(4):
            producer.send_sync(f"{i}".encode(), destination="doomed")  # (in turn: both)
    with Consumer(broker.url, "doomed") as consumer:
        got = receive_n(consumer, 4)
        consumer.nack(got).result(timeout=10)
    with Consumer(broker.url, "DLQ.doomed") as dlq:
        dead = receive_n(dlq, 4)
        dlq.ack(dead).result(timeout=10)
    assert sorted(m.body for m in dead) == [b"0", b"1", b"2", b"3"]
    assert {m.headers["sparkmq.original_destination"] for m in dead} == {"doomed~0", "doomed~1"}
    with Admin(broker.url) as admin:
        names = {d["name"] for d in admin.list_destinations()}
        assert "DLQ.doomed" in names and not any(n.startswith("DLQ.doomed~") for n in names)
        assert admin.stats("doomed")["dead_lettered"] == 4
        admin.create_topic("watched", partitions=2)
        admin.create_subscription("watched", "audit")
        stats = admin.stats("watched")
    assert {"groups_owned", "depth", "acked"} <= set(stats["subscriptions"]["audit"])
    assert "delta_lag_messages" in stats and summary(stats)["subscriptions"] == 1
