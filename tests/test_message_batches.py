"""Receiving in Arrow batches: ``Consumer.receive_batch`` hands a delivery over as one
``MessageBatch`` (its columns in ``arrow``), settled whole by ``ack()``/``nack()``; it keeps
delivery order with ``receive_many``, takes no more than asked, and over a partitioned
destination gives each partition's messages in batches of their own."""

from __future__ import annotations

import pyarrow as pa
import pytest

from spark_mq import Admin, Consumer, MessageBatch, Producer
from spark_mq.names import choose_partition
from spark_mq.schema import DELIVERY_SCHEMA
from spark_mq.service import RunningBroker


def _batches(consumer: Consumer, n: int, most: int = 1000) -> list[MessageBatch]:
    """Batches holding ``n`` messages in all, else fail."""
    got: list[MessageBatch] = []
    while sum(len(b) for b in got) < n:
        batch = consumer.receive_batch(most, timeout=10)
        assert batch is not None, f"only {sum(len(b) for b in got)} of {n} arrived"
        assert 0 < len(batch) <= most
        got.append(batch)
    assert sum(len(b) for b in got) == n
    return got


@pytest.mark.parametrize("transport", ["wire", "flight"])
def test_a_batch_holds_a_deliverys_columns_and_its_ack_settles_them_all(
    broker: RunningBroker, transport: str
) -> None:
    with (
        Producer(broker.url, destination="q") as producer,
        Consumer(broker.url, "q", prefetch=100, transport=transport) as consumer,  # type: ignore[arg-type]
    ):
        producer.send_batch([b"m%d" % i for i in range(50)])
        batches = _batches(consumer, 50)
        # one plain message delivered alone: over the wire it comes as a ONE frame, not a
        # record batch (its batch's columns are made from it)
        producer.send(b"m50").result(timeout=10)
        batches += _batches(consumer, 1)
        producer.send(b"m51", headers={"k": "v"}).result(timeout=10)
        batches += _batches(consumer, 1)
        arrow = pa.concat_batches([b.arrow.select(DELIVERY_SCHEMA.names) for b in batches])
        assert arrow.schema.equals(DELIVERY_SCHEMA)
        assert arrow.column("body").to_pylist() == [b"m%d" % i for i in range(52)]
        offsets = [o for b in batches for o in b.offsets]
        assert offsets == sorted(offsets) and len(set(offsets)) == 52
        assert [body for b in batches for body in b.bodies] == [b"m%d" % i for i in range(52)]
        assert arrow.column("delivery_count").to_pylist() == [1] * 52
        assert arrow.column("headers").to_pylist()[-1] == [("k", "v")]
        # it is a sequence of messages too, made when asked for
        last = batches[-1][-1]
        assert last.body == b"m51" and last.headers == {"k": "v"}
        assert all(b.destination == "q" and b.partition is None for b in batches)
        for b in batches:
            b.ack().result(timeout=10)
        assert consumer.receive_batch(100, timeout=0.3) is None
    with Admin(broker.url) as admin:
        stats = admin.stats("q")
        assert stats["acked"] == 52 and stats["depth"] == 0


def test_a_nacked_batch_comes_again_with_its_delivery_counted(broker: RunningBroker) -> None:
    with Producer(broker.url, destination="q") as producer:
        producer.send_batch([b"a", b"b", b"c"])
    with Consumer(broker.url, "q") as consumer:
        first = consumer.receive_batch(10, timeout=10)
        assert first is not None and first.bodies == [b"a", b"b", b"c"]
        first.nack().result(timeout=10)
        again = _batches(consumer, 3)
        assert [body for b in again for body in b.bodies] == [b"a", b"b", b"c"]
        counts = [c for b in again for c in b.arrow.column("delivery_count").to_pylist()]
        assert counts == [2, 2, 2]
        assert all(m.redelivered for b in again for m in b)
        for b in again:
            consumer.ack(b).result(timeout=10)  # (the consumer's ack takes a batch too)
        assert consumer.receive(timeout=0.3) is None


def test_batches_and_messages_taken_in_turn_keep_delivery_order_and_the_size_asked(
    broker: RunningBroker,
) -> None:
    with Producer(broker.url, destination="q") as producer:
        producer.send_batch([b"%d" % i for i in range(40)])
    with Consumer(broker.url, "q", prefetch=100) as consumer:
        taken: list[bytes] = []
        three = consumer.receive_many(3, timeout=10)
        taken += [m.body for m in three]
        seven = consumer.receive_batch(7, timeout=10)  # (the rest of the delivery's messages)
        assert seven is not None and len(seven) == 7
        taken += seven.bodies
        two = consumer.receive_many(2, timeout=10)
        taken += [m.body for m in two]
        rest = _batches(consumer, 28, most=5)
        taken += [body for b in rest for body in b.bodies]
        assert taken == [b"%d" % i for i in range(40)]
        consumer.ack(three)
        consumer.ack(two)
        for b in [seven, *rest]:
            b.ack()
        assert consumer.receive(timeout=0.3) is None
    with Consumer(broker.url, "q") as consumer:
        assert consumer.receive(timeout=0.3) is None  # every ack was sent before the close


def test_a_partitioned_queue_gives_batches_of_one_partition_each(broker: RunningBroker) -> None:
    with Admin(broker.url) as admin:
        admin.create_queue("orders", partitions=3)
    groups = [f"g{i}" for i in range(9)]
    table = pa.table(
        {"body": [b"%d" % i for i in range(90)], "group_id": [groups[i % 9] for i in range(90)]}
    )
    with Producer(broker.url) as producer:
        producer.send_batch(table, destination="orders")
    with Consumer(broker.url, "orders") as consumer:
        batches = _batches(consumer, 90, most=20)
        seen: dict[str, list[int]] = {}
        for b in batches:
            assert b.partition is not None and b.destination == f"orders~{b.partition}"
            for group, body in zip(b.arrow.column("group_id").to_pylist(), b.bodies, strict=True):
                assert choose_partition(group, 3, 0) == b.partition
                seen.setdefault(group, []).append(int(body))
            b.ack().result(timeout=10)
        assert sorted(seen) == sorted(groups)
        assert all(bodies == sorted(bodies) for bodies in seen.values())
        assert consumer.receive_batch(10, timeout=0.3) is None
    with Admin(broker.url) as admin:
        assert admin.stats("orders")["acked"] == 90
