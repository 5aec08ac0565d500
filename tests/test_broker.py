"""Produce, consume, ack, nack, topics and errors through the SDK against a real Flight broker."""

from __future__ import annotations

import socket
import threading
import time
from datetime import datetime, timedelta, timezone

import pyarrow as pa
import pyarrow.flight as fl
import pytest

from spark_mq import (
    Admin,
    Consumer,
    DestinationNotFound,
    InvalidNameError,
    LeaseError,
    MessageTooLarge,
    Producer,
    SchemaMismatch,
    SubscriptionNotFound,
    protocol,
    wire,
)
from spark_mq.clock import ManualClock
from spark_mq.service import RunningBroker
from tests.conftest import receive_n, start_inprocess


def test_produce_consume_ack(broker: RunningBroker) -> None:
    with Admin(broker.url) as admin:
        assert admin.create_queue("orders") is True
        assert admin.create_queue("orders") is False
    with Producer(broker.url, destination="orders") as producer:
        futures = [producer.send(f"m{i}", headers={"i": str(i)}, group_id="g") for i in range(25)]
        producer.flush()
        assert [f.result() for f in futures] == list(range(25))
        assert producer.send_sync("sync") == 25
        assert producer.send_batch([b"b1", b"b2"]) == [26, 27]
    with Consumer(broker.url, "orders", prefetch=100) as consumer:
        got = receive_n(consumer, 28)
        assert [m.offset for m in got] == list(range(28))
        assert got[3].text == "m3" and got[3].headers == {"i": "3"} and got[3].group_id == "g"
        assert got[0].delivery_count == 1 and not got[0].redelivered
        assert got[0].dedup_id and got[0].dedup_id != got[1].dedup_id
        consumer.ack(got[:20]).result(timeout=10)
    with Admin(broker.url) as admin:
        stats = admin.stats("orders")
    assert stats["acked"] == 20
    assert stats["depth"] == 8  # the 8 unacked went back when the consumer left
    # a new consumer gets exactly the unacked ones, flagged as redelivered
    with Consumer(broker.url, "orders") as consumer:
        again = receive_n(consumer, 8)
        assert consumer.receive(timeout=0.2) is None
        assert [m.offset for m in again] == list(range(20, 28))
        assert all(m.redelivered and m.delivery_count == 2 for m in again)


def test_every_field_of_a_delivery_batch_mixing_set_and_unset_fields(
    broker: RunningBroker, clock: ManualClock
) -> None:
    """Messages are built a column at a time from a delivery batch: fields set on some rows
    only, and all-null columns, come out right on every message of one batch."""
    with Admin(broker.url) as admin:
        admin.create_queue("q")
    now = datetime.fromtimestamp(clock.wall(), timezone.utc)
    past = now - timedelta(seconds=5)
    with Producer(broker.url, destination="q") as producer:
        producer.send("plain")
        producer.send(
            "full",
            headers={"a": "1", "b": "2"},
            group_id="g",
            priority=9,
            ttl_s=60,
            message_id="m-1",
            dedup_id="d-1",
            deliver_at=past,
        )
        producer.send("third", priority=0)
    with Consumer(broker.url, "q") as consumer:
        got = receive_n(consumer, 3)
    assert [m.text for m in got] == ["full", "plain", "third"]  # by priority
    plain, full, third = sorted(got, key=lambda m: m.offset)
    enqueued = plain.enqueue_time
    assert enqueued.tzinfo is not None and enqueued.utcoffset() == timedelta(0)
    assert abs((enqueued - now).total_seconds()) < 0.001
    assert (plain.offset, plain.body, plain.headers, plain.group_id) == (0, b"plain", {}, None)
    assert (plain.priority, plain.message_id, plain.expiry_time, plain.deliver_time) == (
        4,
        None,
        None,
        None,
    )
    assert (full.offset, full.text, full.headers) == (1, "full", {"a": "1", "b": "2"})
    assert (full.group_id, full.priority, full.message_id, full.dedup_id) == ("g", 9, "m-1", "d-1")
    assert full.expiry_time - full.enqueue_time == timedelta(seconds=60)
    assert full.deliver_time == past
    assert (full.delivery_count, full.redelivered, full.group_first) == (1, False, True)
    assert (third.offset, third.priority, third.headers, third.expiry_time) == (2, 0, {}, None)
    assert third.enqueue_time == enqueued and third.dedup_id not in (None, plain.dedup_id)


def test_send_batch_without_waiting_gives_one_future_of_all_offsets(
    strict_broker: RunningBroker,
) -> None:
    broker = strict_broker
    with Admin(broker.url) as admin:
        admin.create_queue("bulk")
    with Producer(broker.url, destination="bulk", batch_size=3) as producer:
        first = producer.send_batch([b"%d" % i for i in range(7)], wait=False)  # 3 + 3 + 1
        second = producer.send_batch([b"last"], wait=False)
        assert first.result(timeout=10) == list(range(7))
        assert second.result(timeout=10) == [7]
        assert producer.send_batch([], wait=False).result(timeout=10) == []
        with pytest.raises(DestinationNotFound):
            producer.send_batch([b"x"] * 5, destination="missing", wait=False).result(timeout=10)


PLAIN_CLIENT = """
import sys
from datetime import datetime, timedelta, timezone
from spark_mq import Admin, Consumer, Producer
url = sys.argv[1]
with Admin(url) as admin:
    admin.create_queue("q")
with Producer(url, destination="q") as p:
    expiry = datetime.now(timezone.utc) + timedelta(hours=1)
    past = datetime(2020, 1, 1, tzinfo=timezone.utc)
    one = dict(headers={"k": "v"}, group_id="g", priority=7, expiry_time=expiry, deliver_at=past)
    assert p.send_sync(b"one", **one) == 0
    assert p.send_batch([b"x"] * 1000) == list(range(1, 1001))
with Consumer(url, "q", prefetch=2000) as c:
    got = []
    while len(got) < 1001:
        got += c.receive_many(1001, timeout=10)
    c.ack(got).result(timeout=10)
first = got[0]
assert (first.headers, first.group_id, first.priority) == ({"k": "v"}, "g", 7)
assert (first.expiry_time, first.deliver_time) == (expiry, past)
with Admin(url) as admin:
    admin.create_queue("p", partitions=2)
with Producer(url, destination="p", group_id="g") as p:  # (placed by its group id)
    assert len(p.send_batch([b"y"] * 500)) == 500
with Consumer(url, "p", prefetch=1000) as c:  # (a batch acked whole: from its columns)
    batch = c.receive_batch(500, timeout=10)
    assert batch is not None and len(batch) == 500
    batch.ack().result(timeout=10)
print("pandas imported:", "pandas" in sys.modules)
"""


@pytest.mark.process
def test_a_client_never_imports_pandas(broker: RunningBroker) -> None:
    """pyarrow imports pandas on its first conversion of Python values (~0.15 s), and on its
    first ``to_numpy``: a producer's first send_batch, or first message with headers or times,
    paid for it, so did a consumer's first ``batch.ack()`` (0.25 s), and so did the first
    figure of a throughput run."""
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "-c", PLAIN_CLIENT, broker.url],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "pandas imported: False"


def test_one_message_deliveries_flag_the_first_of_a_group(broker: RunningBroker) -> None:
    """With prefetch 1 every delivery holds one message (the broker's one-message path)."""
    with Admin(broker.url) as admin:
        admin.create_queue("q")
    with Producer(broker.url, destination="q") as producer:
        for body in (b"g1", b"g2", b"plain"):
            producer.send_sync(body, group_id="g" if body != b"plain" else None)
    with Consumer(broker.url, "q", prefetch=1) as consumer:
        seen = []
        for _ in range(3):
            msg = consumer.receive(timeout=5)
            assert msg is not None
            seen.append((msg.body, msg.group_first, msg.redelivered, msg.delivery_count))
            msg.ack().result(timeout=5)
    assert seen == [(b"g1", True, False, 1), (b"g2", False, False, 1), (b"plain", False, False, 1)]


def test_nack_redelivers_with_higher_count(broker: RunningBroker) -> None:
    with Admin(broker.url) as admin:
        admin.create_queue("q")
    with Producer(broker.url, destination="q") as producer:
        producer.send_batch([b"only"])
    with Consumer(broker.url, "q", prefetch=1) as consumer:
        first = consumer.receive(timeout=5)
        assert first is not None and (first.delivery_count, first.redelivered) == (1, False)
        first.nack().result(timeout=5)
        second = consumer.receive(timeout=5)
        assert second is not None
        assert (second.offset, second.redelivered, second.delivery_count) == (0, True, 2)
        # the first delivery's fence is stale now
        with pytest.raises(LeaseError, match=r"already|stale|not delivered"):
            first.ack().result(timeout=5)
        second.ack().result(timeout=5)
        with pytest.raises(LeaseError, match="already settled"):
            second.ack().result(timeout=5)


def test_prefetch_bounds_unacked_deliveries(broker: RunningBroker) -> None:
    with Admin(broker.url) as admin:
        admin.create_queue("q")
    with Producer(broker.url, destination="q") as producer:
        producer.send_batch([b"%d" % i for i in range(50)])
    with Consumer(broker.url, "q", prefetch=10) as a, Consumer(broker.url, "q", prefetch=10) as b:
        got_a = a.receive_many(50, timeout=5)
        got_b = b.receive_many(50, timeout=5)
        # each holds at most 10 unacked, and they never share a message
        assert len(got_a) <= 10 and len(got_b) <= 10
        assert not {m.offset for m in got_a} & {m.offset for m in got_b}
        a.ack(got_a).result(timeout=5)
        more = a.receive_many(50, timeout=5)
        assert more and not {m.offset for m in more} & {m.offset for m in got_a + got_b}


def test_topic_with_two_durable_subscriptions(broker: RunningBroker) -> None:
    with Admin(broker.url) as admin:
        admin.create_topic("events")
        admin.create_subscription("events", "billing")
        admin.create_subscription("events", "audit")
    with Producer(broker.url, destination="events") as producer:
        producer.send_batch([b"e0", b"e1", b"e2"])
    with Admin(broker.url) as admin:
        admin.create_subscription("events", "late")  # sees only what comes after it
    with Producer(broker.url, destination="events") as producer:
        producer.send_batch([b"e3"])

    def drain(sub: str, n: int) -> list[bytes]:
        with Consumer(broker.url, "events", subscription=sub) as c:
            got = receive_n(c, n)
            c.ack(got).result(timeout=5)
            assert c.receive(timeout=0.2) is None
            return [m.body for m in got]

    assert drain("billing", 4) == [b"e0", b"e1", b"e2", b"e3"]
    assert drain("audit", 4) == [b"e0", b"e1", b"e2", b"e3"]
    assert drain("late", 1) == [b"e3"]
    with Admin(broker.url) as admin:
        stats = admin.stats("events")
        assert stats["subscriptions"]["billing"]["acked"] == 4
        with pytest.raises(SubscriptionNotFound):
            Consumer(broker.url, "events", subscription="nobody")
        with pytest.raises(SubscriptionNotFound):
            Consumer(broker.url, "events")


def test_clear_errors_for_bad_input(strict_broker: RunningBroker, tmp_path, clock) -> None:
    broker = strict_broker
    with Admin(broker.url) as admin:
        admin.create_queue("q")
        with pytest.raises(DestinationNotFound, match="'missing' does not exist"):
            admin.stats("missing")
        for bad in ("../etc", "a/b", "", ".hidden", "x" * 300):
            with pytest.raises(InvalidNameError):
                admin.create_queue(bad)
    with Producer(broker.url) as producer:
        with pytest.raises(DestinationNotFound):
            producer.send_batch([b"x"], destination="missing")
        with pytest.raises(SchemaMismatch, match="unknown column"):
            producer.send_batch(pa.table({"body": [b"x"], "colour": ["red"]}), destination="q")
        with pytest.raises(SchemaMismatch, match="'priority'"):
            producer.send_batch(pa.table({"body": [b"x"], "priority": ["high"]}), destination="q")
        with pytest.raises(TypeError, match=r"send_sync\(\) got .* \['ttl'\]; .*'ttl_s'"):
            producer.send_sync(b"x", destination="q", ttl=5)
        assert producer.send_sync(b"x", destination="q", ttl_s=5) == 0  # nothing went before
    with pytest.raises(DestinationNotFound):
        Consumer(broker.url, "missing")

    small = start_inprocess(tmp_path / "small", clock, **{"limits.max_message_bytes": 100})
    try:
        with Admin(small.url) as admin:
            admin.create_queue("q")
        with Producer(small.url, destination="q") as producer:
            with pytest.raises(MessageTooLarge, match="101 bytes is over the limit of 100") as info:
                producer.send_batch([b"x" * 101])
            assert (info.value.size, info.value.limit) == (101, 100)
            assert producer.send_batch([b"x" * 100]) == [
                0
            ]  # nothing was stored for the refused one
            # one over-sized body among small ones: the whole batch is refused, nothing stored
            with pytest.raises(MessageTooLarge, match="101 bytes"):
                producer.send_batch([b"a", b"x" * 101, b"b"])
            assert producer.send_sync(b"next") == 1
    finally:
        small.stop()


def test_raw_flight_client_gets_protocol_errors(broker: RunningBroker) -> None:
    """A client that is not the SDK sends malformed commands and frames."""
    client = fl.FlightClient(broker.url)
    with pytest.raises(fl.FlightServerError, match="not JSON"):
        list(client.do_action(fl.Action("stats", b"{nope")))
    with pytest.raises(fl.FlightServerError, match="unknown action"):
        list(client.do_action(fl.Action("format_disk", b"{}")))
    with Admin(broker.url) as admin:
        admin.create_queue("q")
    # a produce batch is answered in order with a put_failed frame naming the problem
    desc = fl.FlightDescriptor.for_command(protocol.encode(protocol.Produce("q")))
    schema = pa.schema([("nobody", pa.int64())])
    writer, acks = client.do_put(desc, schema)
    writer.write_batch(pa.record_batch([pa.array([1])], schema=schema))
    frame = protocol.parse(acks.read().to_pybytes())
    assert isinstance(frame, protocol.PutFailed) and frame.error["code"] == "schema_mismatch"
    writer.close()
    # a consumer sending garbage instead of settle frames is cut off with a protocol error
    desc = fl.FlightDescriptor.for_command(protocol.encode(protocol.Consume("q")))
    writer, reader = client.do_exchange(desc)
    welcome = protocol.parse(reader.read_chunk().app_metadata.to_pybytes())
    assert isinstance(welcome, protocol.Welcome)
    writer.write_metadata(pa.py_buffer(b"\x00garbage"))
    with pytest.raises(fl.FlightServerError, match="not JSON"):
        while True:
            reader.read_chunk()
    client.close()


def test_delete_destination(broker: RunningBroker) -> None:
    with Admin(broker.url) as admin:
        admin.create_queue("gone")
        admin.delete_destination("gone")
        assert "gone" not in [d["name"] for d in admin.list_destinations()]
        with pytest.raises(DestinationNotFound):
            admin.delete_destination("gone")
        # re-created empty
        admin.create_queue("gone")
        assert admin.stats("gone")["end_offset"] == 0


def test_a_fresh_client_process_needs_no_pandas_to_send_or_receive(broker: RunningBroker) -> None:
    """``pa.array`` and pyarrow's zoned timestamps import pandas on first use (0.2-1 s), which
    held up a fresh process's first send and first delivery; the SDK builds and reads its
    columns without it, times zoned UTC all the same."""
    import subprocess
    import sys

    with Admin(broker.url) as admin:
        admin.create_queue("q")
    code = (
        "import sys\n"
        "from spark_mq import Consumer, Producer\n"
        f"with Producer({broker.url!r}, destination='q') as p:\n"
        "    p.send_sync('hello', ttl_s=60, group_id='g', priority=7)\n"
        f"with Consumer({broker.url!r}, 'q') as c:\n"
        "    m = c.receive(timeout=10)\n"
        "    assert (m.text, m.group_id, m.priority) == ('hello', 'g', 7)\n"
        "    assert m.ack().result() is None\n"
        "    assert m.enqueue_time.utcoffset().total_seconds() == 0\n"
        "    assert (m.expiry_time - m.enqueue_time).total_seconds() == 60\n"
        "print('pandas' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"


def test_a_bye_ends_the_stream_after_answering_the_settles_before_it(broker: RunningBroker) -> None:
    """A consumer leaves with a bye frame, never by half-closing: the broker answers, then ends
    the stream, so only the client's reader thread finishes the call."""
    with Admin(broker.url) as admin:
        admin.create_queue("q")
    with Producer(broker.url, destination="q") as producer:
        producer.send_batch(["a", "b"])
    client = fl.FlightClient(broker.url)
    desc = fl.FlightDescriptor.for_command(protocol.encode(protocol.Consume("q")))
    writer, reader = client.do_exchange(desc)
    welcome = protocol.parse(reader.read_chunk().app_metadata.to_pybytes())
    assert isinstance(welcome, protocol.Welcome)
    delivered = reader.read_chunk().data
    while delivered.num_rows < 2:
        delivered = pa.concat_batches([delivered, reader.read_chunk().data])
    first = delivered.column("offset")[0].as_py()
    settle = protocol.Settle("ack", 7, ((first, 1),))
    writer.write_metadata(pa.py_buffer(protocol.encode(settle)))
    writer.write_metadata(pa.py_buffer(protocol.encode(protocol.Bye())))
    frames = []
    with pytest.raises(StopIteration):
        while True:
            frames.append(protocol.parse(reader.read_chunk().app_metadata.to_pybytes()))
    assert frames == [protocol.Reply(7)]  # nothing refused
    writer.close()
    client.close()
    with Admin(broker.url) as admin:  # the acked one is gone; the other went back
        stats = admin.stats("q")
        assert (stats["depth"], stats["in_flight"]) == (1, 0)


class _SilentBroker(fl.FlightServerBase):
    """Welcomes a consumer, then takes its frames (the bye too) without answering, and keeps
    the stream open, half-closed or not, until the client cancels the call."""

    def __init__(self) -> None:
        super().__init__("grpc://127.0.0.1:0")
        self.cancelled = threading.Event()

    def do_action(self, context, action):
        yield b'{"ok": true}'  # no direct wire: consumers come over Flight

    def do_exchange(self, context, descriptor, reader, writer) -> None:
        writer.begin(pa.schema([]))
        writer.write_metadata(pa.py_buffer(protocol.encode(protocol.Welcome(1, 5.0, "q"))))
        try:
            for _ in reader:
                pass
        except fl.FlightError:
            pass
        while not context.is_cancelled():  # a half-closed stream is not ended either
            time.sleep(0.05)
        self.cancelled.set()


class _SilentWire(fl.FlightServerBase):
    """Points consumers at a direct-wire listener that welcomes them, then reads and never
    answers (not even the bye), nor hangs up, until the client does."""

    def __init__(self) -> None:
        super().__init__("grpc://127.0.0.1:0")
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.cancelled = threading.Event()
        threading.Thread(target=self._serve, daemon=True).start()

    def do_action(self, context, action):
        yield b'{"ok": true, "wire_port": %d}' % self.listener.getsockname()[1]

    def _serve(self) -> None:
        sock, _ = self.listener.accept()
        sock.sendall(wire.control(protocol.Welcome(1, 5.0, "q")))
        while sock.recv(65536):  # the client's frames, until it hangs up
            pass
        self.cancelled.set()
        sock.close()

    def shutdown(self) -> None:
        self.listener.close()
        super().shutdown()


@pytest.mark.parametrize("silent", [_SilentBroker, _SilentWire], ids=["flight", "wire"])
def test_closing_a_consumer_on_a_broker_that_never_answers_returns_within_its_timeout(
    silent: type[_SilentBroker | _SilentWire],
) -> None:
    server = silent()
    try:
        consumer = Consumer(f"grpc://127.0.0.1:{server.port}", "q", timeout_s=1.0)
        started = time.monotonic()
        consumer.close()
        assert time.monotonic() - started < 10
        assert server.cancelled.wait(10)  # the call was cancelled, not left open
    finally:
        server.shutdown()
