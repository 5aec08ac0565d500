"""A receiver reads its consumer's wire link itself while it waits (``client/_turn.py``); the
reader thread reads only when a reply is awaited and nobody receives, or the stream must be
seen to its end. Order, timeouts, replies and failures must be what the queue hand-off gave."""

from __future__ import annotations

import random
import socket
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from spark_mq import Consumer, Producer, protocol, wire
from spark_mq.client import consumer as consumer_module
from spark_mq.client._wire import Address, WireConsumeLink
from spark_mq.errors import BrokerUnavailable, LeaseError, ProtocolError
from spark_mq.launch import BrokerProcess
from spark_mq.service import RunningBroker
from tests.conftest import wait_for


def one_frame(offset: int, body: bytes) -> bytes:
    """A ``ONE`` delivery frame of a plain message with no dedup id."""
    payload = wire.ONE_HEAD.pack(0, offset, 1_700_000_000_000_000, 4, 1, -1) + body
    return wire.HEADER.pack(len(payload), wire.ONE) + payload


class FakeWire:
    """A listening socket that plays the broker's direct wire for one consumer (to send what a
    real broker never would); consumers reach it through the ``discover`` seam."""

    def __init__(self) -> None:
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.conn: socket.socket | None = None

    def accept(self) -> None:
        """Take the consumer's connection and its Consume frame, and welcome it."""
        self.listener.settimeout(10)
        self.conn, _ = self.listener.accept()
        reader, frames = wire.FrameReader(), []
        while not frames:
            frames = reader.feed(self.conn.recv(65536))
        assert isinstance(wire.parse_control(frames[0][1]), protocol.Consume)
        self.conn.sendall(wire.control(protocol.Welcome(7, 30.0, "q")))

    def send(self, data: bytes) -> None:
        assert self.conn is not None
        self.conn.sendall(data)

    def close(self) -> None:
        for sock in (self.conn, self.listener):
            if sock is not None:
                sock.close()


@pytest.fixture
def fake_wire(broker: RunningBroker, monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeWire]:
    fake = FakeWire()
    port = fake.listener.getsockname()[1]
    monkeypatch.setattr(
        consumer_module, "discover", lambda *_: (Address("127.0.0.1", port, None, 2), {})
    )
    try:
        yield fake
    finally:
        fake.close()


def consumer_of(fake: FakeWire, url: str) -> Consumer:
    accepting = threading.Thread(target=fake.accept)
    accepting.start()
    consumer = Consumer(url, "q", transport="wire", timeout_s=5)
    accepting.join()
    return consumer


def test_order_holds_whichever_thread_reads_the_link(
    broker: RunningBroker, monkeypatch: pytest.MonkeyPatch
) -> None:
    readers: list[str] = []  # which thread read each delivery off the link
    read = WireConsumeLink.read

    def spying_read(self: WireConsumeLink, timeout: float | None = None) -> object:
        item = read(self, timeout)
        if isinstance(item, wire.One) or (item is not None and not isinstance(item, bytes)):
            readers.append(threading.current_thread().name)
        return item

    monkeypatch.setattr(WireConsumeLink, "read", spying_read)
    total, got, rng = 300, [], random.Random(3)
    with (
        Consumer(broker.url, "q", transport="wire", prefetch=50) as consumer,
        Producer(broker.url, destination="q", linger_ms=0, transport="wire") as producer,
    ):
        hand_over = consumer._messages.put

        def slow_hand_over(item: object) -> None:  # widens any gap a receiver could slip into
            time.sleep(0.002)
            hand_over(item)

        consumer._messages.put = slow_hand_over  # type: ignore[method-assign]
        producer.send_sync(b"0")
        (kept,) = consumer.receive_many(1, timeout=10)
        got.append(kept)
        done = threading.Event()

        def extend_all_along() -> None:  # a reply is always awaited: the reader thread reads
            while not done.is_set():  # whenever the receiver does not
                consumer.extend_lease(kept).result(timeout=10)

        def produce() -> None:
            for i in range(1, total):
                producer.send(str(i).encode())
                if i % 10 == 0:
                    time.sleep(0.002)
            producer.flush()

        side = [threading.Thread(target=extend_all_along), threading.Thread(target=produce)]
        for t in side:
            t.start()
        while len(got) < total:
            batch = consumer.receive_many(rng.choice((1, 1, 5)), timeout=10)
            assert batch, f"only {len(got)} of {total} arrived"
            got += batch
            consumer.ack(batch)
            if rng.random() < 0.3:  # busy with them: meanwhile the reader thread reads
                time.sleep(0.002)
        done.set()
        for t in side:
            t.join()
    assert [int(m.body) for m in got] == list(range(total))
    assert "consumer-read" in readers and threading.current_thread().name in readers


def test_a_reply_is_read_while_nobody_receives(broker: RunningBroker) -> None:
    with (
        Consumer(broker.url, "q", transport="wire") as consumer,
        Producer(broker.url, destination="q", transport="wire") as producer,
    ):
        producer.send_sync(b"one")
        (m,) = consumer.receive_many(1, timeout=10)
        consumer.ack(m).result(timeout=10)  # no receiver reads: the reader thread does
        refused = consumer.extend_lease(m).exception(timeout=10)  # answered, and refused
        assert isinstance(refused, LeaseError)
        producer.send_sync(b"two")
        assert consumer.receive(timeout=10).body == b"two"


def test_receive_timeouts_hold_while_the_receiver_reads_the_link(broker: RunningBroker) -> None:
    with Consumer(broker.url, "q", transport="wire") as consumer:
        started = time.monotonic()
        assert consumer.receive(timeout=0.3) is None
        assert 0.3 <= time.monotonic() - started < 3
        started = time.monotonic()
        assert consumer.receive(timeout=0) is None
        assert time.monotonic() - started < 1
        with Producer(broker.url, destination="q", transport="wire") as producer:
            producer.send_sync(b"late")
        assert consumer.receive(timeout=10).body == b"late"


def test_the_socket_timeout_is_set_again_only_when_it_no_longer_serves(
    broker: RunningBroker, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Receives asking for about the same timeout share one SO_RCVTIMEO; a shorter one still
    ends on time (a socket left at 10 s must not hold a 0.3 s receive)."""
    set_to: list[float | None] = []
    original = WireConsumeLink._set_recv_timeout

    def spying(self: WireConsumeLink, timeout: float | None) -> None:
        set_to.append(timeout)
        original(self, timeout)

    monkeypatch.setattr(WireConsumeLink, "_set_recv_timeout", spying)
    with Consumer(broker.url, "q", transport="wire") as consumer:
        with Producer(broker.url, destination="q", transport="wire") as producer:
            got = []
            for i in range(20):  # one at a time: each receive reads the socket
                producer.send_sync(b"m%d" % i)
                got.append(consumer.receive(timeout=10))
        assert [m.body for m in got] == [b"m%d" % i for i in range(20)]
        # twenty receives, each asking for what is left of 10 s: one setting (not twenty)
        assert len([t for t in set_to if t is not None]) == 1
        started = time.monotonic()
        assert consumer.receive(timeout=0.3) is None
        assert 0.3 <= time.monotonic() - started < 3
        assert 0 < set_to[-1] <= 0.3


def test_a_frame_cut_by_a_timeout_is_finished_by_the_next_receive(
    broker: RunningBroker, fake_wire: FakeWire
) -> None:
    consumer = consumer_of(fake_wire, broker.url)
    try:
        frame = one_frame(41, b"x" * 5000)
        fake_wire.send(frame[:2000])
        assert consumer.receive(timeout=0.2) is None
        fake_wire.send(frame[2000:] + one_frame(42, b"next"))
        first, second = consumer.receive(timeout=5), consumer.receive(timeout=5)
        assert (first.offset, first.body) == (41, b"x" * 5000)
        assert (second.offset, second.body) == (42, b"next")
    finally:
        fake_wire.close()  # the consumer sees its stream end
        consumer.close()


@pytest.mark.parametrize("reader", ["receiver", "reader thread"])
def test_a_malformed_frame_ends_the_consumer_with_a_protocol_error(
    broker: RunningBroker, fake_wire: FakeWire, reader: str
) -> None:
    consumer = consumer_of(fake_wire, broker.url)
    try:
        fake_wire.send(one_frame(1, b"fine"))
        first = consumer.receive(timeout=5)
        assert first.body == b"fine"
        # an ack's reply is awaited and nobody receives: the reader thread reads the link
        ack = consumer.ack(first) if reader == "reader thread" else None
        fake_wire.send(wire.HEADER.pack(3, wire.ONE) + b"bad")  # shorter than its header
        if ack is not None:
            with pytest.raises(ProtocolError, match="shorter than its header"):
                ack.result(timeout=10)
        with pytest.raises(ProtocolError, match="shorter than its header"):
            consumer.receive(timeout=5)
        assert isinstance(consumer.error, ProtocolError)
        with pytest.raises(ProtocolError):  # and stays ended
            consumer.receive(timeout=5)
    finally:
        consumer.close()


def _reading(consumer: Consumer) -> bool:
    """Whether a receiver holds the consumer's link (blocked reading it)."""
    turn = consumer._turn
    return turn is not None and turn._receiver_reading


@pytest.fixture
def broker_process(tmp_path: Path) -> Iterator[BrokerProcess]:
    """A real broker process, for a test to SIGKILL."""
    broker = BrokerProcess(str(tmp_path / "data"), log_file=str(tmp_path / "broker.log")).start()
    try:
        yield broker
    finally:
        broker.kill()


@pytest.mark.process
def test_a_broker_killed_while_a_receiver_waits_is_reported(broker_process: BrokerProcess) -> None:
    consumer = Consumer(broker_process.url, "q", transport="wire", timeout_s=5)
    with ThreadPoolExecutor(1) as pool:
        receiving = pool.submit(consumer.receive, 60)
        wait_for(lambda: _reading(consumer), what="the receiver to read the link")
        broker_process.kill()
        with pytest.raises(BrokerUnavailable):  # as soon as the receive notices
            receiving.result(timeout=20)
    with pytest.raises(BrokerUnavailable):
        consumer.wait(10)
    consumer.close()


@pytest.mark.process
def test_wait_sees_a_live_stream_then_its_end(broker_process: BrokerProcess) -> None:
    consumer = Consumer(broker_process.url, "q", transport="wire", timeout_s=5)
    assert consumer.wait(0.3) is False  # alive: nobody receives, and wait() reads on
    broker_process.kill()
    with pytest.raises(BrokerUnavailable):
        consumer.wait(20)
    consumer.close()


def test_closing_from_another_thread_ends_a_blocked_receive(broker: RunningBroker) -> None:
    consumer = Consumer(broker.url, "q", transport="wire")
    with ThreadPoolExecutor(1) as pool:
        receiving = pool.submit(consumer.receive, 60)
        wait_for(lambda: _reading(consumer), what="the receiver to read the link")
        started = time.monotonic()
        consumer.close()
        assert receiving.result(timeout=20) is None
        assert time.monotonic() - started < 10
