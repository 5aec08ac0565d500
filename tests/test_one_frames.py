"""``ONE`` frames: a delivery of one plain message, written and read without Arrow, must give a
consumer exactly what a batch delivery of it gives."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pyarrow as pa
import pytest

from spark_mq import Consumer, Producer, wire
from spark_mq.client.message import Message, message_of_one, messages_of
from spark_mq.deliveries import delivery_table
from spark_mq.errors import ProtocolError
from spark_mq.messages import Messages
from spark_mq.schema import normalize_produce_batch, with_offsets
from spark_mq.service import RunningBroker
from tests.conftest import receive_n

_FIELDS = [
    *("offset", "body", "delivery_count", "redelivered", "group_first", "message_id"),
    *("dedup_id", "group_id", "priority", "enqueue_time", "expiry_time", "deliver_time"),
    "headers",
]
_AT = datetime(2026, 11, 23, 9, 30, 0, 654321, tzinfo=timezone.utc)


def _rows(offset: int = 12, **columns: pa.Array) -> pa.Table:
    """One stored row (``MESSAGE_SCHEMA``), as the broker makes it of a produced batch."""
    batch = pa.table({"body": pa.array([b"the body"]), **columns})
    micros = (_AT - datetime(1970, 1, 1, tzinfo=timezone.utc)) // timedelta(microseconds=1)
    rows = normalize_produce_batch(
        batch, enqueue_time_us=micros, max_message_bytes=1 << 20, destination="q"
    )
    return with_offsets(rows, offset)


def _fields(m: Message) -> dict:
    return {name: getattr(m, name) for name in _FIELDS}


def _through_the_wire(parts: list) -> Message:
    frame = b"".join(bytes(memoryview(p).cast("B")) for p in parts)
    ((kind, body),) = wire.FrameReader().feed(frame)
    assert kind == wire.ONE
    return message_of_one("q", wire.read_one(body), None)


@pytest.mark.parametrize(
    ("columns", "count"),
    [
        ({"dedup_id": pa.array(["d-12"])}, 1),
        ({"dedup_id": pa.array(["d-\u00e9"]), "priority": pa.array([9], pa.int32())}, 3),
        ({}, 1),  # no dedup id at all (a Flight producer's own batch may have none)
    ],
)
def test_a_one_frame_gives_what_a_batch_delivery_gives(columns: dict, count: int) -> None:
    rows, state = _rows(**columns), [(count, False)]
    one = _through_the_wire(wire.one_parts(rows, state))  # type: ignore[arg-type]
    (batched,) = messages_of("q", delivery_table(Messages.of(rows), state), None)
    assert _fields(one) == _fields(batched)
    assert one.enqueue_time == _AT and one.redelivered == (count > 1)


@pytest.mark.parametrize(
    "columns",
    [
        {"message_id": pa.array(["m-1"])},
        {"group_id": pa.array(["g"])},
        {"headers": pa.array([[("k", "v")]], pa.map_(pa.string(), pa.string()))},
        {"ttl_ms": pa.array([60_000], pa.int64())},
        {"delay_ms": pa.array([1], pa.int64())},
    ],
    ids=["message-id", "group", "headers", "expiry", "scheduled"],
)
def test_a_message_with_a_field_a_one_frame_lacks_goes_as_a_batch(columns: dict) -> None:
    assert wire.one_parts(_rows(**columns), [(1, False)]) is None


def test_only_a_single_message_that_is_not_a_group_first_goes_as_a_one_frame() -> None:
    rows = _rows(dedup_id=pa.array(["d"]))
    assert wire.one_parts(rows, [(1, True)]) is None
    two = pa.concat_tables([rows, _rows(13, dedup_id=pa.array(["e"]))])
    assert wire.one_parts(two, [(1, False), (1, False)]) is None
    assert wire.one_parts(rows, [(1, False)]) is not None


def test_a_malformed_one_frame_is_a_protocol_error() -> None:
    good = b"".join(
        bytes(memoryview(p).cast("B"))
        for p in wire.one_parts(_rows(dedup_id=pa.array(["d-1"])), [(1, False)])  # type: ignore[union-attr]
    )[wire.HEADER.size :]
    assert wire.read_one(good).dedup_id == "d-1"
    with pytest.raises(ProtocolError, match="shorter than its header"):
        wire.read_one(good[:20])
    long_id = (
        good[: wire.ONE_HEAD.size - 4] + (1000).to_bytes(4, "little") + good[wire.ONE_HEAD.size :]
    )
    with pytest.raises(ProtocolError, match="with a dedup id of 1000"):
        wire.read_one(long_id)
    bad_id = good[: wire.ONE_HEAD.size] + b"\xff\xfe" + good[wire.ONE_HEAD.size + 2 :]
    with pytest.raises(ProtocolError, match="not UTF-8"):
        wire.read_one(bad_id)


def test_a_wire_consumer_gets_a_plain_message_alone_as_a_one_frame(
    broker: RunningBroker, monkeypatch: pytest.MonkeyPatch
) -> None:
    kinds: list[str] = []
    read_one, read_batch = wire.read_one, wire.read_batch
    monkeypatch.setattr(wire, "read_one", lambda body: kinds.append("one") or read_one(body))
    monkeypatch.setattr(
        wire, "read_batch", lambda body, schema: kinds.append("batch") or read_batch(body, schema)
    )
    with (
        Consumer(broker.url, "q", transport="wire") as consumer,
        Producer(broker.url, destination="q", transport="wire") as producer,
    ):
        producer.send_sync(b"plain", dedup_id="p-1")
        (plain,) = receive_n(consumer, 1)
        producer.send_sync(b"with a header", headers={"k": "v"})
        (headed,) = receive_n(consumer, 1)
        consumer.nack(plain).result(10)
        (again,) = receive_n(consumer, 1)
        consumer.ack([headed, again]).result(10)
    assert kinds == ["one", "batch", "one"]
    assert (plain.body, plain.dedup_id, plain.priority, plain.headers) == (b"plain", "p-1", 4, {})
    assert (again.offset, again.delivery_count, again.redelivered) == (plain.offset, 2, True)
    assert headed.headers == {"k": "v"}
    # Flight, which has no ONE frames, gives the same message the same fields
    with Producer(broker.url, destination="r", transport="flight") as producer:
        producer.send_sync(b"same", dedup_id="s-1")
    with Consumer(broker.url, "r", transport="flight") as flight:
        (by_flight,) = receive_n(flight, 1)  # not acked: it goes back when the consumer leaves
    with Consumer(broker.url, "r", transport="wire") as wire_consumer:
        (by_wire,) = receive_n(wire_consumer, 1)
        wire_consumer.ack(by_wire).result(10)
    assert kinds[-1] == "one"
    counted = ("delivery_count", "redelivered")
    assert {k: v for k, v in _fields(by_flight).items() if k not in counted} == {
        k: v for k, v in _fields(by_wire).items() if k not in counted
    }
    assert by_wire.delivery_count > 1 and by_wire.redelivered
