"""A single plain message through the broker as Python values (spark_mq.messages): it must be
stored, recovered, moved and delivered exactly as the general (Arrow) path does it."""

from __future__ import annotations

import struct
from pathlib import Path

import pyarrow as pa
import pytest

from spark_mq import Admin, Consumer, Producer, wire
from spark_mq.broker.message_store import MessageStore
from spark_mq.deliveries import delivery_table
from spark_mq.errors import MessageTooLarge
from spark_mq.journal import DeltaStore, Journal
from spark_mq.journal.hot_tier import HotTierSettings
from spark_mq.journal.inline_commit import InlineCommit
from spark_mq.journal.records import (
    KIND_PLAIN,
    MESSAGE_KINDS,
    decode_plain,
    encode_plain,
    scan_segment,
)
from spark_mq.launch import BrokerProcess
from spark_mq.messages import Messages, PlainMessage, plain_batch, plain_table
from spark_mq.schema import MESSAGE_SCHEMA, normalize_produce_batch, with_offsets
from tests.conftest import receive_n, start_inprocess

T0 = 1_700_000_000_000_000


def general_row(message: PlainMessage) -> pa.Table:
    """The row the general path stores for the same message."""
    rows = normalize_produce_batch(
        plain_batch([message]),
        enqueue_time_us=message.enqueue_time_us,
        max_message_bytes=1 << 20,
        destination="q",
    )
    return with_offsets(rows, message.offset)


@pytest.mark.parametrize("dedup_id", ["p-1", "", None])
@pytest.mark.parametrize("body", [b"hello", b"", bytes(range(256)) * 8])
def test_a_plain_message_is_the_row_the_general_path_stores(
    dedup_id: str | None, body: bytes
) -> None:
    message = PlainMessage(dedup_id, body, T0 + 5, 7)
    assert plain_table([message]).equals(general_row(message), check_metadata=True)


def test_plain_rows_build_one_table_and_survive_their_segment_encoding() -> None:
    messages = [
        PlainMessage(f"id-{i}" if i % 3 else None, b"b%d" % i, T0 + i, 40 + i) for i in range(7)
    ]
    expected = pa.concat_tables([general_row(m) for m in messages])
    rows = Messages.of_plain(messages)
    assert rows.table().equals(expected)
    payload = encode_plain(messages)
    assert Messages.of_plain(decode_plain(payload, 40, 7)).table().equals(expected)
    with pytest.raises(ValueError, match="runs past"):
        decode_plain(payload[:-1], 40, 7)
    with pytest.raises(ValueError, match="over"):
        decode_plain(payload, 40, 6)


def test_plain_messages_and_batches_in_one_commit_keep_their_order(tmp_path: Path) -> None:
    hot = HotTierSettings(str(tmp_path / "hot"), move_interval_s=3600)
    j = Journal(DeltaStore(str(tmp_path / "root")), hot_tier=hot)
    j.open()
    try:
        j.create_destination("q", "queue")
        batch = normalize_produce_batch(
            pa.table({"body": pa.array([b"b1", b"b2"], pa.binary())}),
            enqueue_time_us=T0,
            max_message_bytes=1 << 20,
            destination="q",
        )
        inline = InlineCommit()  # one flush holds all three
        first = j.append("q", Messages.one(PlainMessage("a", b"p0", T0)), inline)
        middle = j.append("q", Messages.of(batch), inline)
        last = j.append("q", Messages.one(PlainMessage("c", b"p3", T0)), inline)
        inline.commit()
        assert [f.result().first_offset for f in (first, middle, last)] == [0, 1, 3]
        assert j.read_messages("q")["body"].to_pylist() == [b"p0", b"b1", b"b2", b"p3"]
        j.append("q", Messages.one(PlainMessage("d", b"p4", T0))).result()  # alone: plain
        assert j.move(timeout=60)
    finally:
        j.close()
    moved = DeltaStore(str(tmp_path / "root")).read_messages("q", 0, None).sort_by("offset")
    assert moved["offset"].to_pylist() == [0, 1, 2, 3, 4]
    assert moved["dedup_id"].to_pylist() == ["a", None, None, "c", "d"]
    assert moved["priority"].to_pylist() == [4] * 5


def test_a_store_evicting_plain_bodies_reads_them_back() -> None:
    messages = [PlainMessage(f"m{i}", b"x" * 1000, T0, i) for i in range(3)]
    table = plain_table(messages)
    store = MessageStore(lambda start, end: table.slice(start, end - start))
    for m in messages:
        store.add(Messages.one(m))
    assert store.plain([2, 1]) == [messages[2], messages[1]]  # in the order asked for
    assert store.evict_bodies(0) > 0  # every chunk but the newest
    assert store.plain([0]) is None and store.plain([2, 0]) is None
    assert store.plain([2]) == [messages[2]] and store.plain([3]) is None
    assert store.take([0])["body"].to_pylist() == [b"x" * 1000]
    assert store.take([0, 1, 2]).equals(table)
    assert store.drop_below(3) == 3 and store.nbytes == 0


def _fields(m) -> tuple:
    return (m.offset, m.dedup_id, m.body, m.priority, m.enqueue_time, m.expiry_time, m.group_id)


def test_sync_sends_go_the_plain_way_to_every_kind_of_consumer(tmp_path: Path, clock) -> None:
    running = start_inprocess(tmp_path / "data", clock)
    try:
        with (
            Consumer(running.url, "q", transport="wire") as live,
            Producer(running.url, destination="q", linger_ms=0) as p,
        ):
            delivered = []
            for i in range(3):
                assert p.send_sync(b"m%d" % i, dedup_id=f"d-{i}") == i
                delivered += receive_n(live, 1)  # alone in the queue: a ONE frame
            assert p.send_sync(b"resent", dedup_id="d-1") == 1  # a duplicate: the original's
            with pytest.raises(MessageTooLarge, match="max_message_bytes"):
                p.send_sync(b"x" * (running.broker.config.limits.max_message_bytes + 1))
            for m in delivered:
                m.nack()
        hot = Path(running.broker.config.hot_dir_location()) / "q"
        (segment,) = hot.glob("segment-*.log")
        refs, _ = scan_segment(segment.read_bytes(), 0, 1)
        assert [r.kind for r in refs if r.kind in MESSAGE_KINDS] == [KIND_PLAIN] * 3

        now_us = int(clock.wall() * 1_000_000)
        expected = [general_row(PlainMessage(f"d-{i}", b"m%d" % i, now_us, i)) for i in range(3)]
        with Admin(running.url) as admin:
            browsed = admin.browse("q")
        assert browsed.select(MESSAGE_SCHEMA.names).equals(pa.concat_tables(expected))
        with Consumer(running.url, "q", transport="flight") as c:
            redelivered = receive_n(c, 3)  # from the rows built for them
        want = [
            (i, f"d-{i}", b"m%d" % i, 4, t["enqueue_time"][0].as_py(), None, None)
            for i, t in enumerate(expected)
        ]
        assert [_fields(m) for m in delivered] == want
        assert [_fields(m) for m in redelivered] == want
        assert all(m.redelivered for m in redelivered)
    finally:
        running.stop()


def test_a_queue_with_a_default_ttl_gives_plain_messages_their_expiry(
    tmp_path: Path, clock
) -> None:
    running = start_inprocess(tmp_path / "data", clock)
    try:
        with Admin(running.url) as admin:
            admin.create_queue("ttl", default_ttl_ms=60_000)
        with Producer(running.url, destination="ttl", linger_ms=0) as p:
            p.send_sync(b"short-lived")
        with Consumer(running.url, "ttl") as c:
            (m,) = receive_n(c, 1)
        assert m.expiry_time is not None
        assert (m.expiry_time - m.enqueue_time).total_seconds() == 60
    finally:
        running.stop()


@pytest.mark.process
def test_plain_records_come_back_after_a_kill(tmp_path: Path) -> None:
    data = str(tmp_path / "data")
    args = ["--set", "journal.move_interval_ms=3600000"]  # nothing reaches Delta before the kill
    broker = BrokerProcess(data, extra_args=args).start()
    try:
        with Producer(broker.url, destination="q", linger_ms=0) as p:
            for i in range(20):
                p.send_sync(b"k%d" % i, dedup_id=f"k-{i}")
        with Consumer(broker.url, "q") as c:
            acks = [m.ack() for m in receive_n(c, 5)]
            for ack in acks:  # durable: the kill must not undo them
                ack.result(timeout=10)
    finally:
        broker.kill()
    broker = BrokerProcess(data, extra_args=args).start()
    try:
        with Consumer(broker.url, "q") as c:
            got = receive_n(c, 15)
        assert [(m.offset, m.dedup_id, m.body) for m in got] == [
            (i, f"k-{i}", b"k%d" % i) for i in range(5, 20)
        ]
        with Producer(broker.url, destination="q", linger_ms=0) as p:
            assert p.send_sync(b"again", dedup_id="k-3") == 3  # the dedup cache came back too
    finally:
        broker.stop()


@pytest.mark.parametrize(
    ("n", "offsets", "data"),
    [
        (1, [0, 2, 0, 4], b"idbody"),  # well formed
        (2, [0, 2, 0, 4], b"idbody"),  # not one message
        (1, [0, 2, 0, 5], b"idbody"),  # the offsets overrun the data
        (1, [1, 2, 0, 4], b"idbody"),  # the ids do not start at 0
        (1, [0, -1, 0, 7], b"idbody"),  # a negative end
        (1, [0, 2, 0, 4], b"\xff\xfebody"),  # the id is not UTF-8
    ],
)
def test_only_a_well_formed_one_message_plain_frame_is_read_as_a_plain_message(
    n: int, offsets: list[int], data: bytes
) -> None:
    body = wire.PLAIN_HEAD.pack(9, n) + struct.pack("<4i", *offsets) + data
    one = wire.read_plain_message(body)
    if (n, offsets, data) != (1, [0, 2, 0, 4], b"idbody"):
        assert one is None  # read_plain reads it, or says what is wrong with it
        return
    assert one is not None
    seq, message = one
    assert (seq, message.dedup_id, message.body) == (9, "id", b"body")
    _, batch = wire.read_plain(body)  # the general reading of the same frame agrees
    assert batch.to_pylist() == [{"body": b"body", "dedup_id": "id"}]


def test_plain_messages_that_waited_are_delivered_together_as_they_came(
    tmp_path: Path, clock
) -> None:
    """A consumer that comes (or falls) behind gets several plain messages in one delivery: as
    the messages themselves (a ONE frame each on the wire), the same rows on every path."""
    running = start_inprocess(tmp_path / "data", clock)
    try:
        with Producer(running.url, destination="q", linger_ms=0) as p:
            for i in range(4):
                p.send_sync(b"m%d" % i, dedup_id=f"d-{i}")
        session = running.broker.attach("q", prefetch=10)
        messages, state = session.next_leased()
        assert messages.plain is not None  # as they came
        assert [m.offset for m in messages.plain] == [0, 1, 2, 3] and state == [(1, False)] * 4
        now_us = int(clock.wall() * 1_000_000)
        general = pa.concat_tables(
            general_row(PlainMessage(m.dedup_id, m.body, now_us, m.offset)) for m in messages.plain
        )
        assert delivery_table(messages, state).select(MESSAGE_SCHEMA.names).equals(general)
        running.broker.detach(session)  # unsettled: they go back, delivered once

        with Consumer(running.url, "q", transport="wire") as c:
            got = receive_n(c, 4)
            keys = ("offset", "dedup_id", "body", "priority", "enqueue_time")
            want = [tuple(row[k] for k in keys) for row in general.to_pylist()]
            assert [_fields(m)[:5] for m in got] == want
            assert want[2][:3] == (2, "d-2", b"m2")
            assert [m.delivery_count for m in got] == [2] * 4
            c.nack(got[1:3]).result(10)
            again = receive_n(c, 2)
            assert [(m.offset, m.body, m.delivery_count) for m in again] == [
                (1, b"m1", 3),
                (2, b"m2", 3),
            ]
    finally:
        running.stop()
