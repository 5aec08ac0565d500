"""``PLAIN`` frames: the direct wire's compact form of messages that are only a body and a dedup
id (what ``Producer.send`` makes of a message given no options), from framing to a real broker."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest

from spark_mq import Admin, Consumer, Producer, protocol, wire
from spark_mq.client._transport import connect
from spark_mq.client._wire import WireProduceStream, wire_address
from spark_mq.clock import ManualClock
from spark_mq.errors import BrokerUnavailable, ProtocolError
from spark_mq.service import RunningBroker
from tests.conftest import frames_until_closed, raw_wire, receive_n, start_inprocess


def _frame(plain: wire.Plain, seq: int) -> bytes:
    return b"".join(bytes(memoryview(p)) for p in plain.parts(seq))


def _raw_plain(seq: int, n: int, id_offsets: list[int], body_offsets: list[int], data: bytes):
    """A PLAIN frame's body as a broken client might write it."""
    offsets = struct.pack(f"<{len(id_offsets) + len(body_offsets)}i", *id_offsets, *body_offsets)
    return wire.PLAIN_HEAD.pack(seq, n) + offsets + data


# -- framing ---------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("ids", "bodies"),
    [
        ([b"p-0"], [b"one body"]),
        ([b"a", "d\u00e9j\u00e0-vu".encode(), b""], [b"x", b"", b"\x00" * 3000]),
    ],
)
def test_plain_frames_round_trip_however_the_stream_is_cut(
    ids: list[bytes], bodies: list[bytes]
) -> None:
    stream = _frame(wire.Plain(ids, bodies), 41)
    for cut in range(1, len(stream), 7):
        reader = wire.FrameReader()
        frames = reader.feed(stream[:cut]) + reader.feed(stream[cut:])
        ((kind, body),) = frames
        assert kind == wire.PLAIN
        seq, batch = wire.read_plain(body)
        assert seq == 41
        assert batch.schema.equals(wire.PLAIN_SCHEMA)
        assert batch["body"].to_pylist() == bodies
        assert batch["dedup_id"].to_pylist() == [i.decode() for i in ids]


@pytest.mark.parametrize(
    ("body", "error"),
    [
        (b"\x01\x00", "plain frame shorter than its header"),
        (wire.PLAIN_HEAD.pack(5, 1000), "batch 5: a plain frame of 8 bytes cannot hold"),
        (_raw_plain(6, 1, [0, 2], [0, 3], b"abx"), "batch 6: a plain frame of 27 bytes, but its"),
        (_raw_plain(7, 1, [0, -1], [0, 1], b"a"), r"batch 7: .* offsets end at -1 \(ids\)"),
        (_raw_plain(8, 2, [0, 2, 1], [0, 1, 1], b"ab"), "batch 8: .* offsets or dedup ids are"),
        (_raw_plain(9, 1, [3, 2], [0, 1], b"abx"), "batch 9: .* offsets or dedup ids are"),
        (_raw_plain(10, 1, [0, 2], [0, 1], b"\xff\xfex"), "batch 10: .*Invalid UTF8"),
    ],
    ids=["short", "no-offsets", "truncated", "negative", "decreasing", "out-of-bounds", "utf8"],
)
def test_a_malformed_plain_frame_is_a_protocol_error_naming_its_batch(
    body: bytes, error: str
) -> None:
    with pytest.raises(ProtocolError, match=error):
        wire.read_plain(body)


# -- a real broker ---------------------------------------------------------------------------
def test_plain_frames_are_checked_as_any_batch_and_a_malformed_one_loses_nothing(
    tmp_path: Path,
) -> None:
    running = start_inprocess(
        tmp_path / "data", ManualClock(), **{"limits.max_message_bytes": 1024}
    )
    try:
        with raw_wire(running) as sock:
            sock.sendall(wire.control(protocol.Produce("q")))
            sock.sendall(_frame(wire.Plain([b"p-0"], [b"first"]), 0))
            sock.sendall(_frame(wire.Plain([b"p-1", b"p-2"], [b"second", b"third"]), 1))
            sock.sendall(_frame(wire.Plain([b"p-0"], [b"first, resent"]), 2))
            sock.sendall(_frame(wire.Plain([b"p-3"], [b"x" * 2000]), 3))
            reader, answers = wire.FrameReader(), []
            while len(answers) < 4:
                answers += [wire.parse_control(body) for _, body in reader.feed(sock.recv(65536))]
            # then a malformed one: refused, and what was acknowledged stays
            sock.sendall(wire.HEADER.pack(10, wire.PLAIN) + wire.PLAIN_HEAD.pack(4, 1) + b"\0\0")
            answers += [wire.parse_control(body) for _, body in frames_until_closed(sock)]
        acks = {a.seq: a for a in answers if isinstance(a, protocol.PutAck | protocol.PutFailed)}
        assert (acks[0].first_offset, acks[1].first_offset, acks[1].count) == (0, 1, 2)
        assert isinstance(acks[2], protocol.PutAck) and acks[2].duplicates == 1
        assert isinstance(acks[3], protocol.PutFailed)
        assert "limits.max_message_bytes" in acks[3].error["message"]
        assert isinstance(answers[-1], wire.Failure)
        assert answers[-1].error["code"] == ProtocolError.code
        assert "plain frame of 10 bytes cannot hold the offsets" in answers[-1].error["message"]
        with Consumer(running.url, "q") as consumer:
            got = receive_n(consumer, 3)
            assert [(m.body, m.dedup_id, m.priority) for m in got] == [
                (b"first", "p-0", 4),  # stored with the defaults, as a COLUMNS frame's
                (b"second", "p-1", 4),
                (b"third", "p-2", 4),
            ]
            assert consumer.receive(timeout=0.2) is None  # neither the resend nor the big one
    finally:
        running.stop()


def _kinds_read(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Which reader the broker's wire server uses for each produced frame."""
    seen: list[str] = []
    read_plain, read_columns = wire.read_plain, wire.ColumnSubsets.read
    read_one = wire.read_plain_message

    def plain(body: bytes):
        seen.append("plain")
        return read_plain(body)

    def plain_one(body: bytes):
        one = read_one(body)
        if one is not None:  # else read_plain reads it
            seen.append("plain")
        return one

    def columns(self: wire.ColumnSubsets, body: bytes):
        seen.append("columns")
        return read_columns(self, body)

    monkeypatch.setattr(wire, "read_plain", plain)
    monkeypatch.setattr(wire, "read_plain_message", plain_one)
    monkeypatch.setattr(wire.ColumnSubsets, "read", columns)
    return seen


@pytest.mark.pure_python
@pytest.mark.parametrize("urls", [1, 2], ids=["one broker", "a pair: batches kept to resend"])
def test_the_sdk_sends_plain_messages_as_plain_frames_and_others_as_columns(
    broker: RunningBroker, monkeypatch: pytest.MonkeyPatch, urls: int
) -> None:
    seen = _kinds_read(monkeypatch)
    # (given two URLs, a producer keeps every batch until answered, to send it again after a
    # failover: its plain messages go as PLAIN frames all the same)
    url = [broker.url] * urls if urls > 1 else broker.url
    with Producer(url, destination="q", transport="wire", linger_ms=0) as producer:
        producer.send_sync(b"plain")
        producer.send_sync(b"with a header", headers={"k": "v"})
        producer.send_sync(b"with a priority", priority=7)
        producer.send_sync(bytearray(b"not bytes"))
        producer.send_sync("a str body")  # encoded first: plain
    assert seen == ["plain", "columns", "columns", "columns", "plain"]
    with Consumer(broker.url, "q") as consumer:
        got = receive_n(consumer, 5)
        assert sorted(m.body for m in got) == sorted(
            [b"plain", b"with a header", b"with a priority", b"not bytes", b"a str body"]
        )
        assert all(m.dedup_id for m in got)  # every SDK message has one, plain or not


@pytest.mark.pure_python
def test_send_without_linger_writes_a_plain_message_at_once_and_fails_through_its_future(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``send`` of a body alone, with no linger, skips the buffer (a PLAIN frame written by the
    caller); one with options takes the buffer's way; order holds across both; and a broker
    that is gone fails the future, as the buffered way does, instead of raising."""
    running = start_inprocess(tmp_path / "data", ManualClock())
    seen = _kinds_read(monkeypatch)
    buffered: list[object] = []
    original = Producer._buffer

    def spying(self: Producer, body: object, *args: object, **kwargs: object) -> object:
        buffered.append(body)
        return original(self, body, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(Producer, "_buffer", spying)
    try:
        with Producer(running.url, destination="q", transport="wire", linger_ms=0) as producer:
            futures = [
                producer.send(b"a"),
                producer.send(b"b", headers={"k": "v"}),
                producer.send("c"),
            ]
            assert [f.result(timeout=10) for f in futures] == [0, 1, 2]
            assert buffered == [b"b"] and seen == ["plain", "columns", "plain"]
            running.stop()
            late = producer.send(b"after the broker went")
            assert isinstance(late.exception(timeout=30), BrokerUnavailable)
    finally:
        running.stop()


@pytest.mark.pure_python
def test_a_broker_of_wire_version_1_gets_columns_frames_only(
    broker: RunningBroker, monkeypatch: pytest.MonkeyPatch
) -> None:
    with Admin(broker.url) as admin:
        admin.create_queue("q")
    conn = connect(broker.url, 10)
    try:
        address = wire_address(conn.client, conn.options, broker.url, "wire")
    finally:
        conn.client.close()
    assert address is not None and address.version == wire.VERSION >= 2
    seen = _kinds_read(monkeypatch)
    with Producer(broker.url, destination="q", transport="wire") as producer:
        # as a producer would find a broker from before wire versions (no "wire_version")
        producer._link.address = address._replace(version=1)
        producer._link.discovered = True
        assert producer.send_sync(b"old broker") == 0
        stream = producer._streams["q"]
        assert isinstance(stream, WireProduceStream) and not stream.takes_plain
    assert seen == ["columns"]


def test_a_plain_frame_over_the_frame_limit_fails_alone(tmp_path: Path) -> None:
    running = start_inprocess(
        tmp_path / "data", ManualClock(), **{"limits.max_batch_bytes": 64 * 1024}
    )
    try:
        with raw_wire(running) as sock:
            sock.sendall(wire.control(protocol.Produce("q")))
            sock.sendall(_frame(wire.Plain([b"big"], [b"x" * (4 * 1024 * 1024)]), 0))
            sock.sendall(_frame(wire.Plain([b"small"], [b"ok"]), 1))
            reader, answers = wire.FrameReader(), []
            while len(answers) < 2:
                answers += [wire.parse_control(body) for _, body in reader.feed(sock.recv(65536))]
        assert isinstance(answers[0], protocol.PutFailed) and answers[0].seq == 0
        assert isinstance(answers[1], protocol.PutAck) and answers[1].first_offset == 0
    finally:
        running.stop()
