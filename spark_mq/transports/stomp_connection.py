"""One STOMP connection's I/O: bytes in through the codec (:mod:`stomp_codec`), frames
handed in order to its :class:`~spark_mq.transports.stomp_session.StompSession` (what they
mean), frames written back; CONNECT and the login, heart-beats, flow control and closing.

Frames are handled one at a time, in the order they came. What must not run on the loop (the
login, a produce that may wait for room, a transaction's commit) runs on a helper thread while
the frames behind it wait: a client's frames keep their order. A DISCONNECT's receipt comes once
every frame before it is answered. Anything wrong (a malformed frame, an unknown id, a refused
permission) is an ERROR frame saying what, after which the connection closes and the session
with it: messages it held unacknowledged go back to be redelivered. A client that does not read
is neither read nor delivered to until what waits for it has gone out.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any, Protocol

from spark_mq.config import BrokerSection
from spark_mq.connection.core import Beat, Close, ConnState, Refuse
from spark_mq.connection.gateway import Gateway
from spark_mq.connection.listener import ListenerCore, Turn
from spark_mq.connection.loop_connection import LoopConnection
from spark_mq.errors import SparkMQError
from spark_mq.session import Principal
from spark_mq.transports.stomp_codec import (
    PRELOGIN_LIMITS,
    VERSIONS,
    Frame,
    HeartBeat,
    Limits,
    Parser,
    StompError,
    encode,
)
from spark_mq.transports.stomp_session import StompSession
from spark_mq.version import __version__

log = logging.getLogger(__name__)

_BACKLOG_FRAMES = 256  # frames read ahead while one waits for a helper thread


class StompHost(Protocol):
    """What a connection asks of the listener that accepted it
    (:class:`~spark_mq.transports.stomp.StompServer`)."""

    gateway: Gateway
    core: ListenerCore
    turn: Turn
    settings: BrokerSection
    limits: Limits  # a logged-in connection's frames
    conns: set[StompConnection]
    draining: bool
    loop: asyncio.AbstractEventLoop
    loop_thread: int

    def committed(self) -> None:
        """After a turn of frames: what they submitted commits (now, or with the next)."""


class StompConnection(LoopConnection):
    server: StompHost

    def __init__(self, server: StompHost) -> None:
        super().__init__(server, "stomp", first="CONNECT frame")
        self.core.waits = lambda: True  # (a STOMP heart-beat goes out whenever it is due)
        # until it has logged in, a connection's frames may be only a CONNECT's size, and only
        # its first frame is read: an unauthenticated client makes the broker buffer no more
        self.parser = Parser(PRELOGIN_LIMITS)
        self.version = "1.2"
        self.verbs: StompSession | None = None  # once connected
        self.disconnecting: str | None = None  # DISCONNECT's receipt ("" for none)
        self.frames: deque[Frame] = deque()
        self._pump_due = False
        self.next_extend = 0.0  # when the leases of unacknowledged messages are extended next
        self.next_widen = 0.0  # when subscriptions look for partitions added next

    # -- what the connection core leaves to STOMP ---------------------------------------------
    def refused(self, message: str) -> None:
        self.core.state = ConnState.OPENING  # (told in plain STOMP, before any TLS)
        self.error(message)

    def ended(self) -> None:
        if self.verbs is not None:
            self.verbs.close()  # consumers detached: what they held goes back

    def writable(self) -> None:
        self.set()  # (deliveries held back while it did not read)

    def backlogged(self) -> bool:
        return self.core.state is ConnState.WAITING and len(self.frames) >= _BACKLOG_FRAMES

    def received(self, data: bytes) -> None:
        state = self.core.state
        try:
            # (before CONNECTED: the CONNECT alone; what follows it waits in the parser)
            if self.verbs is not None:
                at_most = None
            else:
                at_most = 0 if state is ConnState.LOGGING_IN or self.frames else 1
            events = self.parser.feed(data, at_most=at_most)
        except StompError as exc:
            self.error(exc.message, receipt=exc.receipt)
            return
        for event in events:
            if not isinstance(event, HeartBeat):
                self.frames.append(event)
        self._process()

    def close(self, reason: str) -> None:
        self.error(reason)

    # -- the frames, in order ----------------------------------------------------------------
    def _process(self) -> None:
        core = self.core
        with self.server.turn.running():  # what the frames submit: one sync, on the loop
            while self.frames:
                state = core.state
                if state is ConnState.CLOSING:
                    self.frames.clear()  # nothing after a DISCONNECT; nothing new while stopping
                    break
                if state is not ConnState.SERVING and state is not ConnState.OPENING:
                    break  # (waiting on a helper or a login, or going)
                frame = self.frames.popleft()
                try:
                    self._frame(frame)
                except (StompError, SparkMQError) as exc:
                    self.error(exc.message, receipt=frame.header("receipt"))
                    return
        self.server.committed()
        self.update_reading()
        self.maybe_finish()

    def _frame(self, frame: Frame) -> None:
        if self.verbs is None:
            if frame.command in ("CONNECT", "STOMP"):
                return self._connect(frame)
            raise StompError(f"the first frame must be CONNECT (or STOMP), not {frame.command}")
        if frame.command == "DISCONNECT":
            self.disconnecting = frame.header("receipt") or ""
            self.core.closing()
        else:
            self.verbs.frame(frame)

    def blocking(
        self, fn: Callable[[], Any], then: Callable[[Any], None], receipt: str | None
    ) -> None:
        """Run ``fn`` on a helper thread; the frames behind it wait; ``then`` gets its result
        on the loop (an exception is an ERROR)."""
        self.awaiting(self.server.core.run_blocking(fn), then, receipt)

    def awaiting(
        self,
        work: asyncio.Future[Any] | Future[Any],
        then: Callable[[Any], None],
        receipt: str | None,
    ) -> None:
        """Wait for ``work`` (done elsewhere: a helper thread, the security layer's login);
        the frames behind it wait; ``then`` gets its result on the loop (an exception is an
        ERROR)."""
        self.core.waiting()  # (a login is LOGGING_IN already)
        self.update_reading()

        def done(fut: asyncio.Future[Any]) -> None:
            self.core.done_waiting()
            if self.core.state.ended:
                return
            exc = fut.exception()
            if exc is not None:
                message = exc.message if isinstance(exc, SparkMQError) else str(exc)
                self.error(message or type(exc).__name__, receipt=receipt)
                return
            try:
                then(fut.result())
            except (StompError, SparkMQError) as err:
                self.error(err.message, receipt=receipt)
                return
            self._process()

        asyncio.wrap_future(work, loop=self.loop).add_done_callback(done)

    # -- CONNECT -----------------------------------------------------------------------------
    def _connect(self, frame: Frame) -> None:
        accepted = (frame.header("accept-version") or "1.0").split(",")
        common = [v for v in VERSIONS if v in {a.strip() for a in accepted}]
        if not common:
            self.write(
                Frame(
                    "ERROR",
                    (("version", ",".join(VERSIONS)), ("message", "no STOMP version in common")),
                    f"this broker speaks STOMP {', '.join(VERSIONS)}; the client "
                    f"accepts {', '.join(accepted)}".encode(),
                )
            )
            self._refuse()
            return
        version = common[-1]
        cx, cy = _heart_beat(frame.header("heart-beat"))
        ours = self.server.settings.stomp_heartbeat_ms
        core = self.core
        core.heartbeat_s = max(ours, cy) / 1000 if ours and cy else 0.0
        # a client silent for twice the heart-beat agreed is taken for dead
        core.silence_s = 2 * max(ours, cx) / 1000 if ours and cx else 0.0
        client_id = frame.header("client-id") or None
        login, passcode = frame.header("login"), frame.header("passcode")
        # a bearer token may come as the passcode alone, as for RabbitMQ's OAuth plugin; with
        # neither, the certificate TLS verified (or nothing: refused with security on)
        if login:
            self.server.core.log_in(core, login, passcode or "", None)
        else:
            self.server.core.log_in(core, None, None, passcode or None)

        def connected(principal: Principal) -> None:
            session = self.server.core.open_session(core, principal)
            self.verbs = StompSession(self, self.server.core, session, client_id)
            self.version = self.parser.version = version
            self.parser.limits = self.server.limits  # (a login's, until now)
            for event in self.parser.feed(b""):  # what came behind the CONNECT
                if not isinstance(event, HeartBeat):
                    self.frames.append(event)
            self.write(
                Frame(
                    "CONNECTED",
                    (
                        ("version", version),
                        ("server", f"sparkmq/{__version__}"),
                        ("session", f"{id(self):x}"),
                        ("heart-beat", f"{ours},{ours}"),
                    ),
                )
            )
            self.receipt(frame)

        assert core.login is not None
        self.awaiting(core.login, connected, frame.header("receipt"))

    # -- waking, writing, closing -------------------------------------------------------------
    def set(self) -> None:
        """Its consumers' wake-up (any thread): something to deliver, a settle answered, its
        session revoked."""
        if not self._pump_due:
            self._pump_due = True
            self.threadsafe(self._pump)

    def _pump(self) -> None:
        self._pump_due = False
        revoked = self.core.revocation()
        if revoked is not None:
            self.error(revoked.message)
            return
        if self.verbs is not None and not self.core.state.ended:
            with self.server.turn.running():  # (auto acks)
                self.verbs.pump()
            self.server.committed()

    def write_bytes(self, parts: list[bytes]) -> None:
        self.transport.writelines(parts)
        self.core.writes += 1

    def write(self, frame: Frame) -> None:
        if self.core.state is ConnState.CLOSED or self.transport is None:
            return
        self.transport.write(encode(frame, self.version if self.verbs is not None else "1.0"))
        self.core.writes += 1

    def receipt(self, frame: Frame) -> None:
        self.reply(frame.header("receipt"))

    def reply(self, receipt: str | None) -> None:
        if receipt is not None and not self.core.state.ended:
            self.write(Frame("RECEIPT", (("receipt-id", receipt),)))

    @property
    def outstanding(self) -> int:
        """Frames taken whose answer is still to come."""
        pending = self.verbs.pending_ops if self.verbs is not None else 0
        busy = self.core.state in (ConnState.WAITING, ConnState.LOGGING_IN)
        return pending + (1 if busy else 0)

    def maybe_finish(self) -> None:
        """After DISCONNECT: once everything before it is answered, its receipt, and close."""
        if self.disconnecting is None or self.outstanding or self.core.state.ended:
            return
        self.reply(self.disconnecting or None)
        self.core.refuse(time.monotonic())  # (nothing more is read)
        self.transport.close()

    def error(self, message: str, *, receipt: str | None = None) -> None:
        """An ERROR frame saying what was wrong; then the connection closes."""
        if self.core.state.ended:
            return
        log.info("stomp: ERROR to %s: %s", self.peer, message)
        one_line = " ".join(message.split())
        headers = [("message", one_line[:1000]), ("content-type", "text/plain")]
        if receipt is not None:
            headers.append(("receipt-id", receipt))
        self.write(Frame("ERROR", tuple(headers), message.encode()))
        self._refuse()

    def _refuse(self) -> None:
        """Told why: what still comes is read and dropped, and it closes after a linger."""
        self.core.refuse(time.monotonic())
        self.frames.clear()
        transport = self.transport
        if transport is None:
            return
        # half-close and read what still comes, then close: closing at once with unread input
        # resets the connection, and the client could lose the ERROR (TLS cannot half-close:
        # the ERROR goes out, what comes is read and dropped; the sweep closes it a linger on)
        if transport.can_write_eof():
            transport.write_eof()
        if not self.reading:
            self.reading = True
            transport.resume_reading()

    def sweep(self, now: float) -> None:
        """(Every quarter second, or a quarter of the heart-beat.) The connection's deadlines
        (see ``Connection.check``), its unacknowledged messages' leases, and its subscriptions
        still to follow their destination."""
        if self.transport is None:
            return
        match self.core.check(now, self.server.core.deadlines):
            case Refuse(error=err):
                self.error(err.message)
                return
            case Close():
                self.transport.close()
                return
            case Beat():
                self.transport.write(b"\n")
        if self.verbs is not None and not self.core.state.ended and now >= self.next_extend:
            self.next_extend = now + self.verbs.extend_leases()
        if self.verbs is not None and self.verbs.follow_again:
            self.set()  # (a subscription to attach again where its destination went)
        if self.verbs is not None and self.verbs.widening and now >= self.next_widen:
            self.next_widen = now + self.server.settings.stomp_partitions_recheck_s
            if not self.core.state.ended:
                self.verbs.take_on_partitions()

    def stopping(self) -> None:
        self.error("the broker is shutting down: reconnect (to its backup, or once it is back)")


def _required(frame: Frame, name: str) -> str:
    value = frame.header(name)
    if not value:
        raise StompError(f"{frame.command} needs a {name} header")
    return value


def _heart_beat(text: str | None) -> tuple[int, int]:
    if not text:
        return 0, 0
    try:
        cx, cy = (int(p.strip()) for p in text.split(","))
    except ValueError:
        raise StompError(
            f"heart-beat must be two numbers of ms, 'cx,cy'; got {text[:40]!r}"
        ) from None
    if cx < 0 or cy < 0:
        raise StompError(f"heart-beat intervals cannot be negative: {text[:40]!r}")
    return cx, cy
