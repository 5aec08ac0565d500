"""Direct-wire connections are bounded: a deadline for the first frame and for each frame, an
idle timeout for producers with nothing in flight, a cap on connections, and a bound on what
waits to be written to one; each limit is said before the connection closes."""

from __future__ import annotations

import select
import selectors
import socket
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from spark_mq import Producer, protocol, wire
from spark_mq.clock import ManualClock
from spark_mq.connection.core import ConnState
from spark_mq.connection.listener import INLINE_MAX_BYTES
from spark_mq.errors import SparkMQError
from spark_mq.journal.hot_tier import HotTier
from spark_mq.service import RunningBroker
from spark_mq.transports.wire_conn import _ANSWER_BYTES as _LEAST_ANSWER
from spark_mq.transports.wire_conn import WireConn
from tests.conftest import frames_until_closed, start_inprocess, wait_for


@pytest.fixture
def strict(tmp_path: Path, clock: ManualClock) -> Iterator[RunningBroker]:
    running = start_inprocess(
        tmp_path / "data",
        clock,
        **{
            "broker.handshake_timeout_s": 0.5,
            "broker.frame_timeout_s": 0.5,
            "broker.idle_timeout_s": 1.0,
            "broker.max_connections": 20,
        },
    )
    try:
        yield running
    finally:
        running.stop()


def _sweeps(broker: RunningBroker, n: int) -> None:
    """Until the wire loop has made ``n`` more sweeps of its connections (its own clock)."""
    wire_server = broker.wire
    assert wire_server is not None
    seen = [wire_server._next_sweep]

    def swept() -> bool:
        if wire_server._next_sweep != seen[-1]:
            seen.append(wire_server._next_sweep)
        return len(seen) > n

    wait_for(swept, timeout=10, what=f"{n} sweeps of the wire loop")


def connect(broker: RunningBroker) -> socket.socket:
    assert broker.wire_port
    return socket.create_connection(("127.0.0.1", broker.wire_port), timeout=10)


def failure_then_close(sock: socket.socket) -> dict:
    (frame,) = [wire.parse_control(body) for _, body in frames_until_closed(sock)]
    assert isinstance(frame, wire.Failure)
    return frame.error


def test_a_connection_that_says_nothing_is_closed_after_the_handshake_timeout(
    strict: RunningBroker,
) -> None:
    started = time.monotonic()
    with connect(strict) as sock:
        error = failure_then_close(sock)
    assert 0.4 <= time.monotonic() - started < 5
    assert "no produce or consume frame within 0.5 s" in error["message"]
    assert "broker.handshake_timeout_s" in error["message"]


def test_a_client_on_time_is_not_refused_for_a_loop_late_to_read_it(
    strict: RunningBroker,
) -> None:
    """The deadlines are checked once what has arrived is read: a loop busy past a client's
    handshake time (as on a loaded machine) does not refuse the handshake waiting for it."""
    wire_server = strict.wire
    assert wire_server is not None
    real, stalled, sent = wire_server._sel.select, threading.Event(), threading.Event()

    def select(timeout: float | None = None) -> list:
        if not stalled.is_set() and wire_server._conns:  # the loop's first turn after accepting
            stalled.set()
            time.sleep(0.8)  # busy elsewhere past the handshake's 0.5 s, the Produce sent
            # (however late the test's thread ran, and once the kernel has it there: twice in
            # suite runs a look without waiting found nothing yet, and the loop rightly
            # refused a client that had, as far as it could see, said nothing)
            sent.wait(10)
            return real(5)
        return real(timeout)

    wire_server._sel.select = select  # type: ignore[method-assign]
    try:
        with connect(strict) as sock:
            wait_for(stalled.is_set, timeout=10, what="the loop to stall")
            sock.sendall(wire.control(protocol.Produce("q")))
            sent.set()
            (conn,) = list(wire_server._conns)
            _sweeps(strict, 2)
            # serving; or, past broker.idle_timeout_s (1 s) on a loaded machine, closed as an
            # idle producer (as a CI run saw: the two sweeps took that long), but never refused
            assert conn.core.refused_at == 0.0, "refused the handshake waiting to be read"
            assert conn.core.state in (ConnState.SERVING, ConnState.CLOSED), conn.core.state
            assert conn.core.state is ConnState.SERVING or conn.core.idle()
    finally:
        wire_server._sel.select = real  # type: ignore[method-assign]


def test_a_frame_trickled_a_byte_at_a_time_is_cut_off(strict: RunningBroker) -> None:
    """Slow-loris: the broker does not wait for the rest of a frame for ever, and everyone
    else is served meanwhile."""
    stop = threading.Event()
    errors: list[dict] = []

    def trickle(sock: socket.socket) -> None:
        with sock:
            frame = wire.HEADER.pack(100_000, wire.BATCH) + bytes(100)
            try:
                for i in range(len(frame)):
                    if stop.is_set():
                        return
                    sock.send(frame[i : i + 1])
                    time.sleep(0.05)
            except OSError:
                pass
            errors.append(failure_then_close(sock))

    # (each says what it does at once, from here: the frame's deadline is what is tested)
    socks = [connect(strict) for _ in range(10)]
    for sock in socks:
        sock.sendall(wire.control(protocol.Produce("q")))
    tricklers = [threading.Thread(target=trickle, args=(sock,)) for sock in socks]
    for t in tricklers:
        t.start()
    try:
        with Producer(strict.url, destination="q") as producer:
            started = time.monotonic()
            for _ in range(50):
                producer.send_sync("meanwhile")
            assert time.monotonic() - started < 5
    finally:
        for t in tricklers:
            t.join(timeout=10)
        stop.set()
    assert len(errors) == 10
    assert all("a frame of 100000 bytes did not arrive within" in e["message"] for e in errors), (
        errors
    )


def test_an_idle_producer_connection_is_closed_and_the_sdk_reconnects_unnoticed(
    strict: RunningBroker,
) -> None:
    with Producer(strict.url, destination="q") as producer:
        assert producer.send_sync("before") == 0
        conns = strict.wire._conns  # type: ignore[union-attr]
        deadline = time.monotonic() + 10
        while any(c.role == "produce" for c in conns):  # closed once idle for a second
            assert time.monotonic() < deadline, "the idle producer connection stayed"
            time.sleep(0.05)
        assert producer.send_sync("after") == 1  # on a new connection
        assert producer.send("async").result(timeout=10) == 2


def test_a_producer_waiting_for_answers_is_not_idle(strict: RunningBroker) -> None:
    conn_is_idle = []
    wire_conns = strict.wire._conns  # type: ignore[union-attr]
    with (
        Producer(strict.url, destination="q") as producer,
        Producer(strict.url, destination="idle") as idle,
    ):
        producer.send_sync("x")
        (conn,) = [c for c in wire_conns if c.role == "produce"]
        conn.submitted += 1  # as if a batch were still unanswered
        idle.send_sync("y")
        (quiet,) = [c for c in wire_conns if c.role == "produce" and c is not conn]
        # the idle timeout has passed once the other producer's connection is closed for it
        wait_for(lambda: quiet.state is ConnState.CLOSED, timeout=10, what="the idle one closed")
        conn_is_idle.append(conn.state is ConnState.CLOSED)
        conn.submitted -= 1
    assert conn_is_idle == [False]


def test_connections_over_the_cap_are_refused_saying_why(strict: RunningBroker) -> None:
    held = []
    try:
        for _ in range(20):
            sock = connect(strict)
            sock.sendall(wire.control(protocol.Consume("q", prefetch=1)))
            held.append(sock)
        deadline = time.monotonic() + 5
        while len(strict.wire._conns) < 20:  # type: ignore[union-attr]
            assert time.monotonic() < deadline
            time.sleep(0.01)
        with connect(strict) as extra:
            error = failure_then_close(extra)
        assert error["code"] == "unavailable"
        assert (
            "20 direct-wire connections open, its limit (broker.max_connections)"
            in (error["message"])
        )
    finally:
        for sock in held:
            sock.close()
    deadline = time.monotonic() + 5
    while True:  # room again once they are gone
        try:
            with Producer(strict.url, destination="q") as producer:
                producer.send_sync("room again")
            break
        except Exception:
            assert time.monotonic() < deadline
            time.sleep(0.1)


def _send_until_not_read(
    running: RunningBroker,
    sock: socket.socket,
    frame: bytes,
    held: Callable[[], int],
    most: int,
) -> int:
    """Send ``frame`` (in runs of 64) until the broker has stopped reading its connection with
    ``held()`` over its limit (65,536 bytes), and still has after a sweep of its loop (seen
    between an answer queued and written, it has not); fails once it has taken ``most``
    frames. Returns how many frames went. (Sent on until then: sends also block while the
    broker's commits wait for a busy disk, which is not what is tested.)"""
    conn = _the_connection(running)

    def stopped() -> bool:
        return held() > 65536 and not conn.events & selectors.EVENT_READ

    run = frame * 64
    sent, at, deadline = 0, 0, time.monotonic() + 30
    while True:
        if stopped():
            _sweeps(running, 1)
            if stopped():
                return sent
        assert time.monotonic() < deadline, (sent, held(), conn.events)
        taken = conn.submitted
        assert taken < most, f"{taken} frames taken, {held()} bytes held: not bounded"
        try:
            n = sock.send(memoryview(run)[at:])
        except BlockingIOError:
            select.select([], [sock], [], 0.05)
            continue
        at += n
        sent += at // len(frame) - (at - n) // len(frame)
        at %= len(run)


def test_a_producer_that_never_reads_its_answers_is_not_read_either(
    tmp_path: Path, clock: ManualClock
) -> None:
    running = start_inprocess(tmp_path / "data", clock, **{"broker.max_unsent_bytes": 65536})
    try:
        with connect(running) as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            sock.sendall(wire.control(protocol.Produce("q")))
            # (a frame of 1 KiB: one turn of the loop reads 8 MiB, and 8,000 messages in one
            # turn take a moment; 200,000 of 40 bytes, as many seconds)
            frame = _one_message_frame(b"m" * 1000)
            sock.setblocking(False)
            conn = _the_connection(running)
            # past the limit the connection is not read (its client's sends block, as here);
            # what waits for it is the limit plus the answers to one turn's reading at most
            bound = 65536 + (8 * 1024 * 1024 // len(frame)) * _ANSWER
            # (the answers fill the kernel's buffers: then they wait in the broker)
            sent = _send_until_not_read(running, sock, frame, lambda: conn.unsent, most=10**7)
            assert sent > 1000
            wait_for(lambda: conn.submitted == conn.answered, timeout=30, what="every answer")
            assert conn.unsent < bound
            held = conn.unsent
            _sweeps(running, 3)  # three of the loop's sweeps (0.25 s each) went by
            assert conn.unsent == held  # nothing more read, nothing more queued
    finally:
        running.stop()


def test_frames_waiting_for_a_slow_commit_count_against_the_unsent_limit(
    tmp_path: Path, clock: ManualClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The answers still to come count too: frames read while their commit waits (here the
    journal writer's sync, held) stop the reading as their answers would, not only once
    answered (before, a connection held up to ``journal.max_pending_bytes`` of them)."""
    holding, release = threading.Event(), threading.Event()
    real_sync = HotTier.sync

    def held_sync(self: HotTier) -> tuple[int, SparkMQError | None]:
        if holding.is_set():
            release.wait(60)
        return real_sync(self)

    monkeypatch.setattr(HotTier, "sync", held_sync)
    running = start_inprocess(tmp_path / "data", clock, **{"broker.max_unsent_bytes": 65536})
    try:
        with connect(running) as sock:
            sock.sendall(wire.control(protocol.Produce("q")))
            conn = _the_connection(running)
            # a big batch is synced by the journal writer's threads, not the wire loop: held
            holding.set()
            sock.sendall(_one_message_frame(b"b" * INLINE_MAX_BYTES))
            wait_for(lambda: conn.submitted == 1, timeout=10, what="the big batch taken")
            frame = _one_message_frame(b"m" * 1000)
            sock.setblocking(False)
            turn = 8 * 1024 * 1024 // len(frame) + 1  # the most one turn of the loop reads
            most = 65536 // _LEAST_ANSWER + turn + 64
            sent = _send_until_not_read(running, sock, frame, conn.held, most=most)
            assert conn.answered == 0 and conn.unsent == 0  # every commit still waits
            assert conn.held() <= 65536 + turn * _LEAST_ANSWER
            release.set()
            sock.setblocking(True)
            seqs = []
            reader = wire.FrameReader()
            while len(seqs) < 1 + sent:  # all answered once the commits go on
                data = sock.recv(1 << 20)
                assert data, f"closed after {len(seqs)} answers"
                for _, body in reader.feed(data):
                    answer = protocol.parse(wire.control_bytes(body))
                    assert isinstance(answer, protocol.PutAck), answer
                    seqs.append(answer.seq)
            assert seqs == [0] * len(seqs)  # (each frame its own batch 0, as sent)
    finally:
        release.set()
        running.stop()


# a message's answer, at most (the broker counts one still to come at the least, _ANSWER_BYTES)
_ANSWER = len(wire.control(protocol.PutAck(2**20, 2**40, 1, (2**40,), 0)))


def _one_message_frame(body: bytes) -> bytes:
    return b"".join(bytes(p) for p in wire.Plain([b"id"], [body]).parts(0))


def _the_connection(running: RunningBroker) -> WireConn:
    wire_server = running.wire
    assert wire_server is not None
    wait_for(lambda: wire_server._conns, timeout=10, what="the connection")
    (conn,) = list(wire_server._conns)
    return conn
