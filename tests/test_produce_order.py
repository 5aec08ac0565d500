"""A producer's batches keep their order when their destination moves (a cluster): once a
produce stream has a batch refused ``NotOwner`` (another member owns the destination, or it is
being placed just now), every later batch on that stream is refused too and none is stored
(spark_mq.connection.produce_order), and the SDK sends them again, in order, on a new stream
(spark_mq.client._resend). Without it a batch written behind the refused one, arriving once the
member had taken the destination on, was stored first: a group's order broken (the cluster's
partitioned-destination test found it).

Kafka's idempotent producers keep their order by their sequence numbers instead: see
tests/test_kafka_sequences.py.

The broker is real; its refusal is made by wrapping its ``produce`` (a seam of our own). The
resender's streams are stand-ins (its ``stream_for`` seam), so the race is played in order.
librdkafka across real moves is in tests/test_cluster.py."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from typing import Any

import pyarrow as pa
import pytest

from spark_mq import Admin, Consumer, protocol, wire
from spark_mq.client._flight_put import PutStream
from spark_mq.client._outcome import Outcome
from spark_mq.client._resend import Resender
from spark_mq.client._transport import connect
from spark_mq.errors import NotOwner
from spark_mq.schema import PRODUCE_SCHEMA
from spark_mq.service import RunningBroker
from tests.conftest import raw_wire, receive_n


def _first_refused(broker: RunningBroker, later: bool) -> Iterator[list[str]]:
    """Queue ``q``; the broker's ``produce`` refuses its first call ``NotOwner``, at once
    (being placed) or, ``later``, through its future (let go after it was taken), then serves;
    the list records each call's outcome."""
    with Admin(broker.url) as admin:
        admin.create_queue("q")
    real = broker.broker.produce
    calls: list[str] = []

    def produce(destination: str, messages: Any, inline: Any = None) -> Future:
        if calls:
            calls.append("stored")
            return real(destination, messages, inline)
        refusal = NotOwner("q is being placed: ask again shortly", member="", endpoint="", epoch=0)
        calls.append("failed later" if later else "refused")
        if not later:
            raise refusal
        failed: Future = Future()
        failed.set_exception(refusal)
        return failed

    broker.broker.produce = produce  # type: ignore[method-assign]
    try:
        yield calls
    finally:
        broker.broker.produce = real  # type: ignore[method-assign]


@pytest.fixture
def refusing_once(broker: RunningBroker) -> Iterator[list[str]]:
    yield from _first_refused(broker, later=False)


@pytest.fixture
def refusing_later(broker: RunningBroker) -> Iterator[list[str]]:
    yield from _first_refused(broker, later=True)


def _bodies(broker: RunningBroker, n: int) -> list[bytes]:
    with Consumer(broker.url, "q", prefetch=10) as consumer:
        got = receive_n(consumer, n, timeout=10)
        consumer.ack(got)
        return [m.body for m in got]


def _produced(broker: RunningBroker, bodies: list[bytes]) -> list[protocol.Frame]:
    """Send ``bodies`` on one new produce connection, one batch each, none waiting for the
    one before; their answers."""
    with raw_wire(broker) as sock:
        sock.sendall(wire.control(protocol.Produce("q")))
        for seq, body in enumerate(bodies):
            plain = wire.Plain([b"id-%d" % seq], [body])
            sock.sendall(b"".join(bytes(p) for p in plain.parts(seq)))
        reader, answers = wire.FrameReader(), []
        while len(answers) < len(bodies):
            answers += [wire.parse_control(body) for _, body in reader.feed(sock.recv(65536))]
    return answers


def test_the_direct_wire_refuses_every_batch_after_one_refused_for_a_move(
    broker: RunningBroker, refusing_once: list[str]
) -> None:
    answers = _produced(broker, [b"first", b"second", b"third"])  # (pipelined)
    assert [type(a) for a in answers] == [protocol.PutFailed] * 3
    assert all(a.error["code"] == NotOwner.code for a in answers)  # type: ignore[attr-defined]
    assert "a batch before this one" in answers[1].error["message"]  # type: ignore[attr-defined]
    assert refusing_once == ["refused"]  # (the later ones never reached the broker)
    # a new stream is served, in order: what a producer sends again
    answers = _produced(broker, [b"first", b"second"])
    assert [type(a) for a in answers] == [protocol.PutAck] * 2
    assert _bodies(broker, 2) == [b"first", b"second"]


def test_a_batch_refused_through_its_future_refuses_the_later_ones_too(
    broker: RunningBroker, refusing_later: list[str]
) -> None:
    answers = _produced(broker, [b"first", b"second", b"third"])
    assert [type(a) for a in answers] == [protocol.PutFailed] * 3
    assert all(a.error["code"] == NotOwner.code for a in answers)  # type: ignore[attr-defined]
    assert refusing_later == ["failed later"]


def test_a_flight_stream_refuses_every_batch_after_one_refused_for_a_move(
    broker: RunningBroker, refusing_once: list[str]
) -> None:
    conn = connect(broker.url, 10)
    try:
        stream = PutStream(conn, "q", window=8)
        futures: list[Future] = []
        for i in range(3):
            futures.append(Future())
            rows = pa.table({"body": [b"m%d" % i], "dedup_id": [f"id-{i}"]})
            batch = pa.table(
                {f.name: rows[f.name] if f.name in rows.column_names else pa.nulls(1, f.type)
                 for f in PRODUCE_SCHEMA}, schema=PRODUCE_SCHEMA,
            ).to_batches()[0]  # fmt: skip
            stream.write(batch, Outcome(1, whole=futures[-1]))
        errors = [f.exception(10) for f in futures]
        assert all(isinstance(e, NotOwner) for e in errors), errors
        assert not stream.usable()  # (the producer opens a new stream for what it sends again)
        stream.close(5)
    finally:
        conn.client.close()
    assert refusing_once == ["refused"]


# -- the SDK's side: the resender ------------------------------------------------------------
class _Stream:
    """A stand-in produce stream: records what is written; answers when the test says."""

    every_column = True
    takes_plain = False

    def __init__(self, name: str) -> None:
        self.name = name
        self.written: list[tuple[Any, Outcome]] = []
        self.moved = False
        self.broken = None

    def write(self, batch: Any, outcome: Outcome, *, waited: bool = False) -> None:
        self.written.append((batch, outcome))

    def usable(self) -> bool:
        return not self.moved

    def bodies(self) -> list[bytes]:
        return [b for batch, _ in self.written for b in batch.column("body").to_pylist()]


def _table(i: int) -> pa.Table:
    return pa.table({"body": [b"%d" % i], "dedup_id": [f"id-{i}"]})


def _no_reconnect(timeout_s: float, since: int) -> None:
    raise AssertionError("a refusal for a move is followed, not reconnected")


def _resender(streams: list[_Stream]) -> Resender:
    """A resender whose destination is served by the first usable stream of ``streams``."""

    def stream_for(dest: str) -> _Stream:
        return next(s for s in streams if s.usable())

    def follow(dest: str, err: NotOwner) -> None:
        pass

    return Resender(stream_for, _no_reconnect, lambda: 0, 10.0, follow)


def _answer_in_order(stream: _Stream, done: int, answer: Callable[[int, Outcome], None]) -> int:
    """Answer what ``stream`` was written from ``done`` on; how many it has answered."""
    for i, (_, outcome) in enumerate(stream.written[done:], start=done):
        answer(i, outcome)
    return len(stream.written)


def test_a_batch_written_once_its_stream_was_given_up_waits_for_the_older_ones() -> None:
    """The race: the old stream has batches 0..2 on their way; it refuses 0, and is given up
    (not usable) before the resender hears of it; batch 3 is written just then. It must not go
    to the new stream before 0..2 are sent there again."""
    old, new = _Stream("old"), _Stream("new")
    resender = _resender([old, new])
    try:
        futures = [resender.send_table("q", _table(i), 100) for i in range(3)]
        assert old.bodies() == [b"0", b"1", b"2"]
        old.moved = True  # (the reader saw the refusal; its callbacks have not run yet)
        futures.append(resender.send_table("q", _table(3), 100))
        refusal = NotOwner("q moved", member="b", endpoint="grpc://b", epoch=2)
        for _, outcome in old.written:  # the old stream refuses them all, in order
            outcome.fail(refusal)
        done = 0
        deadline = threading.Event()
        for _ in range(200):  # the new stream acknowledges what it is sent, as it comes
            done = _answer_in_order(new, done, lambda i, o: o.resolve(i))
            if all(f.done() for f in futures):
                break
            deadline.wait(0.02)
        assert [f.result(0) for f in futures] == [[0], [1], [2], [3]]
        assert new.bodies() == [b"0", b"1", b"2", b"3"]  # in the order they were sent
    finally:
        resender.close()


def test_batches_refused_for_a_move_go_again_in_order_before_newer_ones() -> None:
    """The stream refuses batch 1 and (as a member now does) every one after it; batch 0 was
    stored. The refused ones go again on a new stream in their order, and one sent meanwhile
    goes after them."""
    old, new = _Stream("old"), _Stream("new")
    resender = _resender([old, new])
    try:
        futures = [resender.send_table("q", _table(i), 100) for i in range(4)]
        old.written[0][1].resolve(0)
        refusal = NotOwner("q is being placed", member="", endpoint="", epoch=0)
        old.moved = True
        for _, outcome in old.written[1:]:
            outcome.fail(refusal)
        futures.append(resender.send_table("q", _table(4), 100))
        done = 0
        for _ in range(200):
            done = _answer_in_order(new, done, lambda i, o: o.resolve(i + 1))
            if all(f.done() for f in futures):
                break
            threading.Event().wait(0.02)
        assert [f.result(0) for f in futures] == [[0], [1], [2], [3], [4]]
        assert new.bodies() == [b"1", b"2", b"3", b"4"]
    finally:
        resender.close()


def test_a_new_batch_never_overtakes_one_being_written_again_on_the_new_stream() -> None:
    """The race the partitioned test's CI run found: a new batch (1) passes its checks while
    batch 0 is still on its way on the old stream; 0 is refused and written again on the new
    stream; 1, written on that same new stream just then, must not go first."""
    old = _Stream("old")
    slow_choice, slow_write = threading.Event(), threading.Event()
    order: list[bytes] = []
    caller_choosing = threading.Event()

    class _Slow(_Stream):
        def write(self, batch: Any, outcome: Outcome, *, waited: bool = False) -> None:
            if batch.column("body")[0].as_py() == b"0":
                slow_write.wait(5)  # (the resender's write of 0, slow to reach the socket)
            order.extend(batch.column("body").to_pylist())
            super().write(batch, outcome, waited=waited)

    new = _Slow("new")
    main = threading.current_thread()

    def stream_for(dest: str) -> _Stream:
        if threading.current_thread() is not main and old.moved and not caller_choosing.is_set():
            caller_choosing.set()
            slow_choice.wait(5)  # (the caller of batch 1, between its checks and its write)
        return next(s for s in (old, new) if s.usable())

    resender = Resender(stream_for, _no_reconnect, lambda: 0, 10.0, lambda d, e: None)
    try:
        first = resender.send_table("q", _table(0), 100)
        old.moved = True
        second: list[Future] = []
        sender = threading.Thread(
            target=lambda: second.append(resender.send_table("q", _table(1), 100))
        )
        sender.start()
        assert caller_choosing.wait(5)
        old.written[0][1].fail(NotOwner("q moved", member="b", endpoint="grpc://b", epoch=2))
        threading.Event().wait(0.2)  # (the resender takes 0 and writes it again meanwhile)
        slow_choice.set()
        threading.Event().wait(0.2)
        slow_write.set()
        sender.join(5)
        done = 0
        for _ in range(200):
            done = _answer_in_order(new, done, lambda i, o: o.resolve(i))
            if first.done() and second and second[0].done():
                break
            threading.Event().wait(0.02)
        assert order == [b"0", b"1"]
        assert first.result(0) == [0] and second[0].result(0) == [1]
    finally:
        slow_choice.set()
        slow_write.set()
        resender.close()


def test_following_a_destination_being_placed_drops_the_refused_stream_not_a_fresh_one() -> None:
    """The resender follows each batch refused "being placed" before writing it again. The
    stream that was refused goes, with a pause before the next try; one opened since (after
    the first such batch) stays, and the next batch goes on it at once. Before, every batch
    dropped the stream and paused: eight batches took 0.8 s to go again after a move (a
    pipelined producer across ten moves: 16-25k msg/s, now 47-50k; bench in issue 49's
    notes)."""
    from spark_mq import Producer
    from spark_mq.client._routes import PLACING_RETRY_S
    from spark_mq.errors import NotOwner

    class Stream:
        def __init__(self, usable: bool) -> None:
            self._usable, self.closed = usable, False

        def usable(self) -> bool:
            return self._usable

        def close(self) -> None:
            self.closed = True

    placing = NotOwner("being placed", destination="q", member="", endpoint="", epoch=0)
    producer = Producer("grpc://127.0.0.1:1", timeout_s=1)  # (nothing is sent: no broker)
    try:
        fresh = producer._streams["q"] = Stream(usable=True)
        started = time.monotonic()
        producer._follow("q", placing)
        assert producer._streams.get("q") is fresh and not fresh.closed
        assert time.monotonic() - started < PLACING_RETRY_S
        refused = producer._streams["q"] = Stream(usable=False)
        started = time.monotonic()
        producer._follow("q", placing)
        assert "q" not in producer._streams and refused.closed
        assert time.monotonic() - started >= PLACING_RETRY_S
    finally:
        producer._streams.clear()
        producer.close()
