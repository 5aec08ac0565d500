"""The direct wire: framing, and a real broker's wire server under good and bad input (the SDK's
own tests run over the wire too: it is the default transport; the loop's inline group commit is
tested in ``test_inline_commit.py``)."""

from __future__ import annotations

import socket
import threading
from datetime import datetime
from pathlib import Path

import pyarrow as pa
import pytest

from spark_mq import Admin, Consumer, Producer, protocol, wire
from spark_mq.broker import Broker
from spark_mq.clock import ManualClock
from spark_mq.errors import BrokerUnavailable, ConfigError, MessageTooLarge, ProtocolError
from spark_mq.schema import (
    DELIVERY_SCHEMA,
    PRODUCE_SCHEMA,
    null_column,
)
from spark_mq.service import RunningBroker
from tests.conftest import (
    frames_until_closed,
    raw_wire,
    receive_n,
    start_inprocess,
    test_config,
)


def _one(body: bytes) -> pa.RecordBatch:
    cols = [
        pa.array([body]) if f.name == "body" else null_column(1, f.type) for f in PRODUCE_SCHEMA
    ]
    return pa.record_batch(cols, schema=PRODUCE_SCHEMA)


def _frame_bytes(seq: int, batch: pa.RecordBatch) -> bytes:
    return b"".join(bytes(memoryview(p)) for p in wire.batch_parts(seq, batch))


def _fed(reader: wire.FrameReader, pieces: list[bytes]) -> list:
    """Feed ``pieces`` as the readers do: each received into one buffer, reused (scribbled over
    here after each feed, so a frame that kept a view of it would show)."""
    inbox = bytearray(max(map(len, pieces)))
    view, out = memoryview(inbox), []
    for piece in pieces:
        inbox[: len(piece)] = piece
        out += reader.feed(view[: len(piece)])
        inbox[:] = b"\xee" * len(inbox)
    return out


# -- framing ---------------------------------------------------------------------------------
def test_frames_reassemble_however_the_stream_is_cut() -> None:
    stream = (
        wire.control(protocol.Produce("q"))
        + _frame_bytes(7, _one(b"hello"))
        + wire.control(protocol.Bye())
    )
    for cut in range(1, len(stream)):
        reader = wire.FrameReader()
        frames = _fed(reader, [stream[:cut], stream[cut:]])
        assert [k for k, _ in frames] == [wire.CONTROL, wire.BATCH, wire.CONTROL], cut
        assert protocol.parse(frames[0][1]) == protocol.Produce("q")
        seq, batch = wire.read_batch(frames[1][1], PRODUCE_SCHEMA)
        assert (seq, batch["body"].to_pylist()) == (7, [b"hello"])
        assert protocol.parse(frames[2][1]) == protocol.Bye()


def _received(reader: wire.FrameReader, stream: bytes, chunk: int) -> list:
    """Read ``stream`` as the broker's loop and the client do, ``chunk`` bytes a receive at most:
    into the reader's :meth:`~spark_mq.wire.FrameReader.sink` when it offers one, else fed."""
    out, pos = [], 0
    while pos < len(stream):
        sink = reader.sink()
        if sink is None:
            out += _fed(reader, [stream[pos : pos + chunk]])
            pos += chunk
            continue
        n = min(len(sink), chunk, len(stream) - pos)
        sink[:n] = stream[pos : pos + n]
        out += reader.filled(n)
        pos += n
    return out


def test_big_frames_are_received_in_place_however_the_stream_is_cut() -> None:
    big = b"b" * (wire.RECEIVE_IN_PLACE_BYTES + 5)
    stream = (
        wire.control(protocol.Produce("q"))
        + _frame_bytes(7, _one(big))
        + b"".join(bytes(p) for p in wire.Plain([b"id-1"], [big]).parts(8))
        + b"".join(bytes(p) for p in wire.Plain([b"id-2"], [b"small"]).parts(9))
        + b"".join(bytes(p) for p in wire.Plain([b"id-3", b"id-4"], [big, b"x"]).parts(10))
        + wire.control(protocol.Bye())
    )
    for chunk in (1000, 4096, 65536, 256 * 1024, 1 << 20):
        for fed_only in (False, True):
            reader = wire.FrameReader()
            if fed_only:  # a caller that never asks for the sink gets the same frames
                frames = _fed(reader, [stream[i : i + chunk] for i in range(0, len(stream), chunk)])
            else:
                frames = _received(reader, stream, chunk)
            kinds = [k for k, _ in frames]
            assert kinds == [wire.CONTROL, wire.BATCH, *[wire.PLAIN] * 3, wire.CONTROL], chunk
            assert protocol.parse(frames[0][1]) == protocol.Produce("q")
            seq, batch = wire.read_batch(frames[1][1], PRODUCE_SCHEMA)
            assert (seq, batch["body"].to_pylist()) == (7, [big])
            seq, message = wire.read_plain_message(frames[2][1])
            assert (seq, message.dedup_id, message.body) == (8, "id-1", big)
            seq, message = wire.read_plain_message(frames[3][1])
            assert (seq, message.dedup_id, message.body) == (9, "id-2", b"small")
            assert wire.read_plain_message(frames[4][1]) is None  # two messages: read_plain
            seq, batch = wire.read_plain(frames[4][1])
            assert (seq, batch["dedup_id"].to_pylist()) == (10, ["id-3", "id-4"])
            assert batch["body"].to_pylist() == [big, b"x"]
            assert protocol.parse(frames[5][1]) == protocol.Bye()
            assert reader.sink() is None


def test_a_frame_over_the_limit_is_skipped_and_reported_and_the_stream_goes_on() -> None:
    big, small = _frame_bytes(3, _one(b"x" * 5000)), _frame_bytes(4, _one(b"ok"))
    reader = wire.FrameReader(max_body=1000)
    stream = big + small
    out = _fed(reader, [stream[i : i + 97] for i in range(0, len(stream), 97)])  # in pieces
    assert isinstance(out[0], wire.TooLarge)
    assert (out[0].seq, out[0].kind, out[0].size) == (3, wire.BATCH, len(big) - 5)
    assert wire.read_batch(out[1][1], PRODUCE_SCHEMA)[1]["body"].to_pylist() == [b"ok"]
    assert len(out) == 2


def test_a_malformed_batch_is_a_protocol_error() -> None:
    with pytest.raises(ProtocolError, match="batch 9"):
        wire.read_batch(wire.SEQ.pack(9) + b"not arrow at all", PRODUCE_SCHEMA)
    with pytest.raises(ProtocolError, match="shorter"):
        wire.read_batch(b"\x01", PRODUCE_SCHEMA)


def test_a_columns_frame_carries_only_the_columns_named_and_refuses_bad_masks() -> None:
    subsets = wire.PRODUCE_SUBSETS
    schema = subsets.schema(0b101)
    assert schema.names == ["body", "dedup_id"]
    batch = pa.record_batch([pa.array([b"b1", b"b2"]), pa.array(["d1", None])], schema=schema)
    frame = b"".join(bytes(memoryview(p)) for p in subsets.parts(4, batch))
    ((kind, body),) = wire.FrameReader().feed(frame)
    assert kind == wire.COLUMNS
    seq, back = subsets.read(body)
    assert seq == 4 and back.equals(batch)
    # every column is a subset too (the same columns, in the schema's order)
    full = _one(b"x")
    whole = b"".join(bytes(memoryview(p)) for p in subsets.parts(5, full))
    assert subsets.read(whole[wire.HEADER.size :])[1].equals(full)
    head = wire.SEQ.pack(6)
    with pytest.raises(ProtocolError, match="batch 6: column mask 0x0 names no column"):
        subsets.read(head + wire.MASK.pack(0) + body[6:])
    with pytest.raises(ProtocolError, match="batch 6: column mask 0x400 names no column or an"):
        subsets.read(head + wire.MASK.pack(1 << len(PRODUCE_SCHEMA)) + body[6:])
    with pytest.raises(ProtocolError, match="batch 6 is not an Arrow record batch"):
        subsets.read(head + wire.MASK.pack(0b111) + body[6:])  # three columns named, two sent
    with pytest.raises(ProtocolError, match="shorter"):
        subsets.read(head + b"\x01")
    out_of_order = pa.record_batch([pa.array(["d"]), pa.array([b"b"])], names=["dedup_id", "body"])
    with pytest.raises(ValueError, match="not some of"):
        subsets.parts(7, out_of_order)
    for wrong in (
        pa.record_batch([pa.array(["a string body"])], names=["body"]),  # after a good one
        pa.record_batch([pa.array([b"b"]), pa.array([1])], names=["body", "no_such_column"]),
    ):
        subsets.parts(8, pa.record_batch([pa.array([b"b"])], names=["body"]))
        with pytest.raises(ValueError, match="not some of"):
            subsets.parts(8, wrong)


# -- a real broker's wire server -------------------------------------------------------------
def test_the_loop_itself_commits_an_ack_left_waiting_to_share_a_sync(
    tmp_path: Path, clock: ManualClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An ack that comes while messages flow waits up to ``journal.settle_timeout_ms`` for a
    sync to share; the loop wakes for it when due, however long it would sleep otherwise."""
    from spark_mq.transports import direct_wire

    monkeypatch.setattr(direct_wire, "_IDLE_S", 60.0)  # nothing else would wake the loop
    running = start_inprocess(tmp_path / "data", clock, **{"journal.settle_timeout_ms": 300})
    try:
        with Admin(running.url) as admin:
            admin.create_queue("q")
        with Consumer(running.url, "q") as c, Producer(running.url, destination="q") as p:
            p.send_sync(b"m")
            (m,) = receive_n(c, 1)
            c.ack([m]).result(timeout=10)
    finally:
        running.stop()


def test_a_malformed_first_frame_gets_a_clear_failure_and_the_broker_serves_on(
    broker: RunningBroker,
) -> None:
    with raw_wire(broker) as sock:
        sock.sendall(wire.HEADER.pack(8, wire.CONTROL) + b"not json")
        frames = frames_until_closed(sock)  # answered, then half-closed by the broker
    failure = wire.parse_control(frames[0][1])
    assert isinstance(failure, wire.Failure)
    assert failure.error["code"] == ProtocolError.code
    assert "not JSON" in failure.error["message"]
    with Producer(broker.url, destination="q", transport="wire") as producer:
        assert producer.send_sync(b"still serving") == 0


def test_a_batch_over_the_limit_fails_alone_and_the_connection_goes_on(tmp_path: Path) -> None:
    running = start_inprocess(
        tmp_path / "data", ManualClock(), **{"limits.max_batch_bytes": 64 * 1024}
    )
    try:
        with Producer(running.url, destination="q", transport="wire") as producer:
            with pytest.raises(MessageTooLarge, match=r"limits\.max_batch_bytes"):
                producer.send_batch([b"x" * 1024] * 200)  # ~200 KiB in one frame
            assert producer.send_batch([b"small", b"ones"]) == [0, 1]
        with Consumer(running.url, "q", transport="wire") as consumer:
            got = [consumer.receive(timeout=10) for _ in range(2)]
            assert [m.body for m in got if m] == [b"small", b"ones"]
    finally:
        running.stop()


def test_a_batch_of_more_parts_than_the_window_is_sent_and_answered(
    broker: RunningBroker,
) -> None:
    """``send_batch`` of more ``batch_size`` parts than ``max_in_flight_batches``, waited for
    on the caller's thread: the window fills before the caller would read the answers, so a
    reader thread does. Before, the caller waited for room in the window for good (with the
    defaults, any batch of more than 32,000 rows hung, and the liveness watchdog then took the
    broker for silent)."""
    done: list[object] = []

    def send() -> None:
        with Producer(
            broker.url, destination="q", transport="wire", batch_size=100, max_in_flight_batches=4
        ) as producer:
            done.append(producer.send_batch([b"m%d" % i for i in range(1000)]))

    sender = threading.Thread(target=send, daemon=True)
    sender.start()
    sender.join(30)
    assert done == [list(range(1000))]


def test_a_consumer_that_drops_its_connection_gives_its_messages_back(
    broker: RunningBroker,
) -> None:
    with Producer(broker.url, destination="q") as producer:
        producer.send_batch([b"a", b"b"])
    with raw_wire(broker) as sock:
        sock.sendall(wire.control(protocol.Consume("q", prefetch=10)))
        reader, frames = wire.FrameReader(), []
        while len(frames) < 2:  # the welcome, then the delivery
            frames += reader.feed(sock.recv(65536))
        assert isinstance(protocol.parse(frames[0][1]), protocol.Welcome)
        leased = wire.read_batch(frames[1][1], DELIVERY_SCHEMA)[1]
        assert leased["body"].to_pylist() == [b"a", b"b"]
    # gone without acking: both are delivered again, at once (no lease has to lapse)
    with Consumer(broker.url, "q") as consumer:
        again = consumer.receive_many(2, timeout=10)
        assert [(m.body, m.redelivered) for m in again] == [(b"a", True), (b"b", True)]


def test_columns_frames_are_checked_as_any_batch_and_stored_with_the_defaults(
    broker: RunningBroker,
) -> None:
    subsets = wire.PRODUCE_SUBSETS

    def frame(seq: int, columns: dict[str, pa.Array]) -> bytes:
        at = PRODUCE_SCHEMA.names
        mask = sum(1 << at.index(name) for name in columns)
        batch = pa.record_batch(list(columns.values()), schema=subsets.schema(mask))
        return b"".join(bytes(memoryview(p)) for p in subsets.parts(seq, batch))

    with raw_wire(broker) as sock:
        sock.sendall(wire.control(protocol.Produce("q")))
        sock.sendall(frame(0, {"body": pa.array([b"plain"]), "dedup_id": pa.array(["p-0"])}))
        sock.sendall(frame(1, {"body": pa.array([b"bad"]), "priority": pa.array([12], pa.int32())}))
        sock.sendall(frame(2, {"body": pa.array([None], pa.binary())}))
        sock.sendall(
            frame(3, {"body": pa.array([b"urgent"]), "priority": pa.array([9], pa.int32())})
        )
        sock.sendall(frame(4, {"body": pa.array([b"again"]), "dedup_id": pa.array(["p-0"])}))
        reader, answers = wire.FrameReader(), []
        while len(answers) < 5:
            answers += [protocol.parse(body) for _, body in reader.feed(sock.recv(65536))]
    by_seq = {a.seq: a for a in answers}
    assert isinstance(by_seq[0], protocol.PutAck) and by_seq[0].first_offset == 0
    assert isinstance(by_seq[1], protocol.PutFailed)
    assert "priority must be between 0 and 9" in by_seq[1].error["message"]
    assert isinstance(by_seq[2], protocol.PutFailed)
    assert "'body' must not contain nulls" in by_seq[2].error["message"]
    assert isinstance(by_seq[3], protocol.PutAck) and by_seq[3].first_offset == 1
    assert isinstance(by_seq[4], protocol.PutAck) and by_seq[4].duplicates == 1
    with Consumer(broker.url, "q") as consumer:
        got = receive_n(consumer, 2)
        assert [(m.body, m.priority, m.dedup_id) for m in got] == [
            (b"urgent", 9, None),  # the higher priority first
            (b"plain", 4, "p-0"),  # no priority column: the JMS default
        ]
        consumer.ack(got).result(10)


def test_the_sdk_sends_only_the_columns_its_messages_use() -> None:
    from concurrent.futures import Future

    from spark_mq.client._pending import Pending, batch_of

    def pending(body: bytes, priority: int | None = None) -> Pending:
        none = (None,) * 5  # headers, ttl, expiry, delay, delivery time
        return Pending(body, None, "d", None, priority, *none, Future())  # type: ignore[arg-type]

    plain = batch_of([pending(b"a"), pending(b"b")], every_column=False)
    assert plain.schema.names == ["body", "dedup_id"]
    mixed = batch_of([pending(b"a"), pending(b"b", 7)], every_column=False)
    assert mixed.schema.names == ["body", "dedup_id", "priority"]
    assert mixed["priority"].to_pylist() == [None, 7]
    every = batch_of([pending(b"a")], every_column=True)  # Flight: one schema per stream
    assert every.schema.equals(PRODUCE_SCHEMA)


class _Text(str):
    pass


@pytest.mark.parametrize(
    ("values", "typ"),
    [
        ([b"a", b"", b"\x00c"], pa.binary()),
        ([b"a", "\u00e9t\u00e9"], pa.binary()),  # text bodies go as UTF-8
        (["x", _Text("y")], pa.string()),  # a str subclass: pyarrow's conversion
        ([b"a", None], pa.binary()),
        ([None, None], pa.int32()),
        ([1, 2**40], pa.int64()),
        ([3, -4], pa.int32()),
        ([datetime(2026, 1, 2, 3, 4, 5, 6)], pa.timestamp("us")),
        ([[("k", "v")], []], pa.map_(pa.string(), pa.string())),
    ],
)
def test_the_sdk_builds_each_column_as_pyarrow_would(values: list, typ: pa.DataType) -> None:
    from spark_mq.client._pending import column

    # built without pyarrow's conversion where it can be (see column): the same array either way
    expected = pa.array(
        [v.encode() if isinstance(v, str) and typ == pa.binary() else v for v in values], typ
    )
    assert column(values, typ).equals(expected)


def test_delivered_fields_are_read_when_asked_and_a_kept_message_does_not_keep_the_batch() -> None:
    from datetime import datetime, timezone

    from spark_mq.client.message import messages_of

    at = datetime(2026, 11, 22, 12, 0, 0, 123456, tzinfo=timezone.utc)
    later = datetime(2026, 11, 23, tzinfo=timezone.utc)
    plain = {"offset": 7, "body": b"x" * (1 << 20), "dedup_id": "d-7", "priority": 4}
    full = {
        **plain,
        **{"offset": 8, "body": b"full", "message_id": "m-8", "group_id": "g", "priority": 9},
        **{"expiry_time": later, "deliver_time": later, "headers": [("k", "v")]},
        **{"delivery_count": 2, "redelivered": True, "group_first": True},
    }
    rows_plain = {"enqueue_time": at, "delivery_count": 1, "redelivered": False, **plain}
    rows = [rows_plain, full]
    batch = pa.RecordBatch.from_pylist(rows, schema=DELIVERY_SCHEMA)
    first, second = messages_of("q", batch, None)
    assert (first.offset, first.body, first.delivery_count) == (7, plain["body"], 1)
    assert (first.message_id, first.group_id, first.expiry_time, first.deliver_time) == (None,) * 4
    assert (first.dedup_id, first.priority, first.headers, first.redelivered) == (
        "d-7",
        4,
        {},
        False,
    )
    assert first.enqueue_time == at and first.enqueue_time.tzinfo is not None
    assert second.headers == {"k": "v"} and second.expiry_time == later == second.deliver_time
    assert (second.message_id, second.group_id, second.priority) == ("m-8", "g", 9)
    assert (second.delivery_count, second.redelivered, second.group_first) == (2, True, True)
    assert second.text == "full" and not first.group_first
    with pytest.raises(AttributeError):
        first.body = b"changed"  # type: ignore[misc]
    # the bodies were copied out; the messages keep only the small columns of their batch
    held = pa.total_allocated_bytes()
    del batch, rows
    assert pa.total_allocated_bytes() <= held - (1 << 20)
    assert first.body == plain["body"] and first.dedup_id == "d-7"
    # a batch of plain messages only: each still has its own (empty) headers
    alone = pa.RecordBatch.from_pylist([{**rows_plain, "offset": 9}] * 2, schema=DELIVERY_SCHEMA)
    a, b = messages_of("q", alone, None)
    assert a.headers == {} == b.headers and a.headers is not b.headers


@pytest.mark.parametrize("transport", ["wire", "flight"])
def test_both_transports_carry_the_same_round_trip(broker: RunningBroker, transport: str) -> None:
    with Producer(broker.url, destination="q", transport=transport) as producer:  # type: ignore[arg-type]
        offsets = [producer.send(b"m%d" % i, headers={"i": str(i)}) for i in range(5)]
        producer.flush()
        assert [f.result(10) for f in offsets] == [0, 1, 2, 3, 4]
    with Consumer(broker.url, "q", transport=transport) as consumer:  # type: ignore[arg-type]
        got = consumer.receive_many(5, timeout=10)
        while len(got) < 5:
            got += consumer.receive_many(5 - len(got), timeout=10)
        assert [(m.body, m.headers["i"]) for m in got] == [(b"m%d" % i, str(i)) for i in range(5)]
        consumer.ack(got).result(10)
    with Admin(broker.url) as admin:
        assert admin.stats("q")["depth"] == 0


@pytest.mark.parametrize("local", [True, False])
def test_clients_on_this_machine_use_the_local_socket_unless_it_is_off(
    tmp_path: Path, local: bool
) -> None:
    from spark_mq.client._transport import call_action, connect

    running = start_inprocess(tmp_path / "data", ManualClock(), **{"broker.wire_local": local})
    try:
        conn = connect(running.url, 10)
        name = call_action(conn.client, conn.options, "ping")["wire_local"]
        conn.client.close()
        assert (name is not None) is local
        family = socket.AF_UNIX if local else socket.AF_INET
        with Producer(running.url, destination="q", transport="wire") as producer:
            assert producer.send_sync(b"near") == 0
            sock = producer._streams["q"]._sock  # type: ignore[union-attr]
            assert sock.family == family
            # a local socket holds a few big frames unread (the kernel doubles what is asked,
            # up to twice net.core.wmem_max); TCP keeps the kernel's own tuning
            sndbuf = sock.getsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF)
            widest = 2 * min(wire.LOCAL_SEND_BUFFER_BYTES, _wmem_max())
            assert (sndbuf == widest) is local
        with Consumer(running.url, "q", transport="wire") as consumer:
            assert consumer._link._sock.family == family  # type: ignore[union-attr]
            [message] = receive_n(consumer, 1)
            assert message.body == b"near"
            consumer.ack(message).result(10)
    finally:
        running.stop()
    if name is not None:  # gone with the broker: nothing left to connect to
        with socket.socket(socket.AF_UNIX) as probe, pytest.raises(ConnectionRefusedError):
            probe.connect("\0" + name)


def _wmem_max() -> int:
    return int(Path("/proc/sys/net/core/wmem_max").read_text())


def test_a_local_socket_this_process_cannot_reach_falls_back_to_tcp(broker: RunningBroker) -> None:
    # another machine's broker names a local socket that does not exist here
    from spark_mq.client._transport import connect
    from spark_mq.client._wire import Address, WireConsumeLink

    address = Address("127.0.0.1", broker.wire_port, "sparkmq-wire-of-another-machine")  # type: ignore[arg-type]
    conn = connect(broker.url, 10)
    consume = protocol.Consume("q", None, 10, None, True, False)
    link = WireConsumeLink(address, 10, consume, conn)
    try:
        assert link._sock.family == socket.AF_INET
        welcome = protocol.parse(link.read())  # type: ignore[arg-type]
        assert isinstance(welcome, protocol.Welcome)
    finally:
        link.close()


def test_insisting_on_the_wire_of_a_broker_without_one_says_what_to_do(tmp_path: Path) -> None:
    running = start_inprocess(tmp_path / "data", ManualClock(), **{"broker.wire": False})
    try:
        assert running.wire_port is None
        with pytest.raises(BrokerUnavailable, match="transport='flight'"):
            Consumer(running.url, "q", transport="wire")
        with Producer(running.url, destination="q") as producer:  # auto: Flight, and it works
            assert producer.send_sync(b"over flight") == 0
    finally:
        running.stop()


def test_a_taken_wire_port_is_a_config_error_naming_the_setting(tmp_path: Path) -> None:
    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        with pytest.raises(ConfigError, match=r"broker\.wire_port") as caught:
            start_inprocess(tmp_path / "data", ManualClock(), **{"broker.wire_port": port})
        assert f"127.0.0.1:{port}" in str(caught.value)
    running = start_inprocess(tmp_path / "data", ManualClock())  # nothing was left half-open
    running.stop()


# -- the SDK's produce stream: who reads the answers ------------------------------------------
def _acks_threads() -> int:
    return sum(t.name == "producer-acks" for t in threading.enumerate())


def test_synchronous_sends_from_several_threads_each_read_their_own_answers(
    broker: RunningBroker,
) -> None:
    before = _acks_threads()
    got: dict[int, list[int]] = {}
    with Producer(broker.url, destination="q", transport="wire", linger_ms=0) as producer:

        def sender(n: int) -> None:
            got[n] = [producer.send_sync(b"%d-%d" % (n, i)) for i in range(40)]

        threads = [threading.Thread(target=sender, args=(n,)) for n in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        # every answer was read by a waiting sender: no reader thread was needed
        assert _acks_threads() == before
    assert sorted(o for offsets in got.values() for o in offsets) == list(range(160))
    assert all(offsets == sorted(offsets) for offsets in got.values())  # each thread in order
    with Consumer(broker.url, "q", prefetch=200) as consumer:
        bodies = {m.offset: m.body for m in receive_n(consumer, 160)}
    for n, offsets in got.items():
        assert [bodies[o] for o in offsets] == [b"%d-%d" % (n, i) for i in range(40)]


def test_a_send_nobody_waits_for_is_answered_between_synchronous_sends(
    broker: RunningBroker,
) -> None:
    with Producer(broker.url, destination="q", transport="wire", linger_ms=0) as producer:
        assert producer.send_sync(b"first") == 0
        answered = threading.Event()
        fut = producer.send(b"second")  # no flush: a reader thread must answer it
        fut.add_done_callback(lambda _: answered.set())
        assert answered.wait(10) and fut.result() == 1
        assert producer.send_sync(b"third") == 2
        assert producer.send_batch([b"fourth", b"fifth"]) == [3, 4]


def test_a_synchronous_producer_reaches_a_broker_restarted_on_its_ports_without_a_failure(
    tmp_path: Path, clock: ManualClock
) -> None:
    ports: list[int] = []

    def start() -> RunningBroker:
        flight_port, wire_port = ports
        config = test_config(
            tmp_path / "data", **{"broker.port": flight_port, "broker.wire_port": wire_port}
        )
        return RunningBroker(Broker(config, clock=clock), "127.0.0.1", flight_port)

    for attempt in range(5):  # free ports, found and let go: another may take one meanwhile
        ports.clear()
        for _ in range(2):
            with socket.create_server(("127.0.0.1", 0)) as probe:
                ports.append(probe.getsockname()[1])
        try:
            running = start()
            break
        except Exception:
            if attempt == 4:
                raise
    try:
        with Producer(running.url, destination="q", transport="wire", linger_ms=0) as producer:
            assert producer.send_sync(b"before") == 0
            running.stop()  # the broker hangs up while nothing is in flight
            running = start()
            # the hang-up is noticed before writing: a new connection, no failed send
            assert producer.send_sync(b"after") == 1
    finally:
        running.stop()


def test_a_synchronous_send_goes_after_what_the_producer_buffered(broker: RunningBroker) -> None:
    """A plain ``send_sync`` skips the buffer only when nothing waits in it: messages ``send``
    left lingering go first, in order, and whatever the synchronous message carries arrives."""
    with Admin(broker.url) as admin:
        admin.create_queue("after-buffered")
    with Producer(broker.url, destination="after-buffered", linger_ms=60_000) as p:
        first, second = p.send(b"first"), p.send(b"second")
        assert not first.done()  # lingering
        assert p.send_sync("third") == 2  # a str body, as send() takes
        assert (first.result(5), second.result(5)) == (0, 1)
        assert p.send_sync(b"fourth", dedup_id="mine") == 3
        assert p.send_sync(b"fifth", headers={"h": "v"}) == 4  # not plain: the general way
    with Consumer(broker.url, "after-buffered", prefetch=10) as c:
        got = receive_n(c, 5)
    assert [m.body for m in got] == [b"first", b"second", b"third", b"fourth", b"fifth"]
    assert got[3].dedup_id == "mine" and got[4].headers == {"h": "v"}


@pytest.mark.process
@pytest.mark.parametrize("asked", [None, "system"])
def test_the_broker_process_gives_arrow_jemalloc_unless_told_otherwise(
    tmp_path: Path, asked: str | None
) -> None:
    from spark_mq.launch import BrokerProcess

    expected = asked or ("jemalloc" if "jemalloc" in pa.supported_memory_backends() else None)
    env = {"ARROW_DEFAULT_MEMORY_POOL": asked} if asked else {}
    log_file = tmp_path / "broker.log"
    proc = BrokerProcess(str(tmp_path / "data"), env=env, log_file=str(log_file)).start()
    assert proc.stop() == 0
    said = [line for line in log_file.read_text().splitlines() if "listening on" in line]
    assert len(said) == 1
    assert f"Arrow memory: {expected or pa.default_memory_pool().backend_name}," in said[0]
