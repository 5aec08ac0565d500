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
import contextlib
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any

from spark_mq.errors import SparkMQError
from spark_mq.journal.inline_commit import InlineCommit
from spark_mq.security.authenticate import Credentials
from spark_mq.security.tls import common_name
from spark_mq.session import Principal
from spark_mq.transports.stomp_codec import (
    PRELOGIN_LIMITS,
    VERSIONS,
    Frame,
    HeartBeat,
    Parser,
    StompError,
    encode,
)
from spark_mq.transports.stomp_session import StompSession
from spark_mq.version import __version__

if TYPE_CHECKING:
    from spark_mq.transports.stomp import StompServer

log = logging.getLogger(__name__)

_LINGER_S = 2.0  # after an ERROR, what the client still sends is read and dropped this long
_BACKLOG_FRAMES = 256  # frames read ahead while one waits for a helper thread
_WRITE_HIGH = 1024 * 1024  # unsent bytes past which the client is not read nor delivered to


class StompConnection(asyncio.Protocol):
    def __init__(self, server: StompServer) -> None:
        self.server = server
        self.loop = server.loop
        self.transport: Any = None
        self.peer = "?"
        # until it has logged in, a connection's frames may be only a CONNECT's size, and only
        # its first frame is read: an unauthenticated client makes the broker buffer no more
        self.parser = Parser(PRELOGIN_LIMITS)
        self.version = "1.2"
        self.verbs: StompSession | None = None  # once connected
        self.certificate_name: str | None = None
        self.closed = False
        self.refused = False  # an ERROR went out: what comes is dropped until the close
        self.draining = False
        self.disconnecting: str | None = None  # DISCONNECT's receipt ("" for none)
        self.frames: deque[Frame] = deque()
        self.busy = False  # a helper thread works for the frame at the head
        self._pump_due = False
        self.paused_writing = False
        self.reading = True
        self.opened = self.last_read = self.last_write = time.monotonic()
        self.hb_in = self.hb_out = 0.0  # seconds; 0: none
        self.next_extend = 0.0  # when the leases of unacknowledged messages are extended next
        self.inline: InlineCommit | None = None  # while frames are handled: commits them
        self.handshaking = False  # TLS: the handshake is under way (it has its own deadline)
        self._early: list[bytes] = []  # data that came before the handshake was done with

    # -- asyncio's callbacks -----------------------------------------------------------------
    def connection_made(self, transport: Any) -> None:
        self.transport = transport
        peer = transport.get_extra_info("peername")
        self.peer = f"{peer[0]}:{peer[1]}" if peer else "?"
        server = self.server
        if server.draining:
            transport.close()
            return
        server.conns.add(self)
        if len(server.conns) > server.settings.max_connections:
            self.error(
                f"the broker has {server.settings.max_connections} STOMP connections open, its "
                "limit (broker.max_connections): try again later"
            )
            return
        transport.set_write_buffer_limits(high=_WRITE_HIGH)
        if server.security.tls is not None:
            transport.pause_reading()  # the TLS handshake reads first
            self.handshaking = True
            self.loop.create_task(self._start_tls(transport))

    async def _start_tls(self, raw: Any) -> None:
        tls = self.server.security.tls
        assert tls is not None
        try:
            self.transport = await self.loop.start_tls(
                raw, self, tls.context(), server_side=True,
                ssl_handshake_timeout=self.server.settings.handshake_timeout_s,
            )  # fmt: skip
        except Exception as exc:  # (ssl.SSLError, a reset, the handshake's timeout)
            log.info("stomp: TLS handshake with %s failed: %s", self.peer, exc)
            self.server.security.audit.event(
                "authentication_failed", peer=self.peer, transport="stomp", detail=str(exc)
            )
            raw.abort()
            self.connection_lost(None)
            return
        if self.transport is None:  # (the client left during the handshake)
            self.connection_lost(None)
            return
        self.handshaking = False
        self.certificate_name = common_name(self.transport.get_extra_info("peercert"))
        early, self._early = self._early, []
        for data in early:  # (what came with the handshake's last flight)
            self.data_received(data)

    def connection_lost(self, exc: Exception | None) -> None:
        if self.closed:
            return
        self.closed = True
        self.server.conns.discard(self)
        if self.verbs is not None:
            self.verbs.close()  # consumers detached: what they held goes back

    def pause_writing(self) -> None:
        self.paused_writing = True
        self._update_reading()

    def resume_writing(self) -> None:
        self.paused_writing = False
        self._update_reading()
        self.set()

    def data_received(self, data: bytes) -> None:
        if self.refused or self.closed:
            return
        if self.handshaking:  # TLS: decrypted before start_tls returned the transport to use
            self._early.append(data)
            return
        self.last_read = time.monotonic()
        try:
            # (before CONNECTED: the CONNECT alone; what follows it waits in the parser)
            at_most = None if self.verbs is not None else 0 if self.busy or self.frames else 1
            events = self.parser.feed(data, at_most=at_most)
        except StompError as exc:
            self.error(exc.message, receipt=exc.receipt)
            return
        for event in events:
            if not isinstance(event, HeartBeat):
                self.frames.append(event)
        self._process()

    def eof_received(self) -> bool:
        return False  # the client finished sending: close

    # -- the frames, in order ----------------------------------------------------------------
    def _process(self) -> None:
        with self.committing():
            while self.frames and not self.busy and not self.refused and not self.closed:
                if self.disconnecting is not None or self.draining:
                    self.frames.clear()  # nothing after a DISCONNECT; nothing new while stopping
                    break
                frame = self.frames.popleft()
                try:
                    self._frame(frame)
                except (StompError, SparkMQError) as exc:
                    self.error(exc.message, receipt=frame.header("receipt"))
                    return
        self._update_reading()
        self.maybe_finish()

    @contextlib.contextmanager
    def committing(self) -> Iterator[None]:
        """What the frames handled inside (the sends and acks that came together) is made
        durable here, on the loop, at the end: one sync for all of them and no hand-off to the
        journal's threads, as the direct wire's turn does (with quick commits: the hot tier or
        memory; Delta-only journals commit on the writer threads)."""
        if self.inline is not None or not self.server.broker.journal.commits_are_quick:
            yield
            return
        self.inline = self.server.inline_commit()
        try:
            yield
        finally:
            inline, self.inline = self.inline, None
            inline.commit()
            self.server.committed()

    def _frame(self, frame: Frame) -> None:
        if self.verbs is None:
            if frame.command in ("CONNECT", "STOMP"):
                return self._connect(frame)
            raise StompError(f"the first frame must be CONNECT (or STOMP), not {frame.command}")
        if frame.command == "DISCONNECT":
            self.disconnecting = frame.header("receipt") or ""
        else:
            self.verbs.frame(frame)

    def blocking(
        self, fn: Callable[[], Any], then: Callable[[Any], None], receipt: str | None
    ) -> None:
        """Run ``fn`` on a helper thread; the frames behind it wait; ``then`` gets its result
        on the loop (an exception is an ERROR)."""
        self.awaiting(self.server.run_blocking(fn), then, receipt)

    def awaiting(
        self,
        work: asyncio.Future[Any] | Future[Any],
        then: Callable[[Any], None],
        receipt: str | None,
    ) -> None:
        """Wait for ``work`` (done elsewhere: a helper thread, the security layer's login);
        the frames behind it wait; ``then`` gets its result on the loop (an exception is an
        ERROR)."""
        self.busy = True
        self._update_reading()

        def done(fut: asyncio.Future[Any]) -> None:
            self.busy = False
            if self.closed:
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
        self.hb_out = max(ours, cy) / 1000 if ours and cy else 0.0
        self.hb_in = max(ours, cx) / 1000 if ours and cx else 0.0
        client_id = frame.header("client-id") or None
        login, passcode = frame.header("login"), frame.header("passcode")
        security, peer = self.server.security, self.peer
        certificate = self.certificate_name

        if login:
            creds = Credentials(login, passcode or "")
        elif passcode:  # a bearer token in the passcode, as RabbitMQ's OAuth plugin
            creds = Credentials(token=passcode)
        else:  # a client certificate's name, or nothing (refused with security on)
            creds = Credentials(certificate_name=certificate)

        def connected(principal: Principal) -> None:
            session = security.session(self.server.broker, principal, peer=peer, transport="stomp")
            session.on_revoke = lambda reason: self.threadsafe(self.error, reason)
            self.verbs = StompSession(self, session, client_id)
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

        # (the login runs off the loop: a host's penalty is a timer, argon2 a pool of its own)
        login_done = security.submit_login(creds, peer=peer, transport="stomp")
        self.awaiting(login_done, connected, frame.header("receipt"))

    # -- waking, writing, closing -------------------------------------------------------------
    def set(self) -> None:
        """Its consumers' wake-up (any thread): something to deliver, or a settle answered."""
        if not self._pump_due:
            self._pump_due = True
            self.threadsafe(self._pump)

    def _pump(self) -> None:
        self._pump_due = False
        if self.verbs is not None and not self.closed and not self.refused:
            with self.committing():  # (auto acks)
                self.verbs.pump()

    def write_bytes(self, parts: list[bytes]) -> None:
        self.transport.writelines(parts)
        self.last_write = time.monotonic()

    def write(self, frame: Frame) -> None:
        if self.closed or self.transport is None:
            return
        self.transport.write(encode(frame, self.version if self.verbs is not None else "1.0"))
        self.last_write = time.monotonic()

    def receipt(self, frame: Frame) -> None:
        self.reply(frame.header("receipt"))

    def reply(self, receipt: str | None) -> None:
        if receipt is not None and not self.refused:
            self.write(Frame("RECEIPT", (("receipt-id", receipt),)))

    @property
    def outstanding(self) -> int:
        """Frames taken whose answer is still to come."""
        pending = self.verbs.pending_ops if self.verbs is not None else 0
        return pending + (1 if self.busy else 0)

    def maybe_finish(self) -> None:
        """After DISCONNECT: once everything before it is answered, its receipt, and close."""
        if self.disconnecting is None or self.outstanding or self.closed or self.refused:
            return
        self.reply(self.disconnecting or None)
        self.refused = True  # (nothing more is read)
        self.transport.close()

    def error(self, message: str, *, receipt: str | None = None) -> None:
        """An ERROR frame saying what was wrong; then the connection closes."""
        if self.refused or self.closed:
            return
        log.info("stomp: ERROR to %s: %s", self.peer, message)
        one_line = " ".join(message.split())
        headers = [("message", one_line[:1000]), ("content-type", "text/plain")]
        if receipt is not None:
            headers.append(("receipt-id", receipt))
        self.write(Frame("ERROR", tuple(headers), message.encode()))
        self._refuse()

    def _refuse(self) -> None:
        self.refused = True
        self.frames.clear()
        transport = self.transport
        if transport is None:
            return
        # half-close and read what still comes, then close: closing at once with unread input
        # resets the connection, and the client could lose the ERROR (TLS cannot half-close:
        # the ERROR goes out, what comes is read and dropped, and the close follows)
        if transport.can_write_eof():
            transport.write_eof()
        if not self.reading:
            self.reading = True
            transport.resume_reading()
        self.loop.call_later(_LINGER_S, transport.close)

    def abort(self) -> None:
        if self.transport is not None:
            self.transport.abort()

    def sweep(self, now: float) -> None:
        """(Every quarter second.) The CONNECT deadline and heart-beats both ways."""
        if self.closed or self.refused or self.transport is None or self.handshaking:
            return
        settings = self.server.settings
        if self.verbs is None and not self.busy:
            if now - self.opened >= settings.handshake_timeout_s:
                self.error(
                    f"no CONNECT frame within {settings.handshake_timeout_s:g} s of connecting "
                    "(broker.handshake_timeout_s)"
                )
            return
        if self.hb_in and now - self.last_read > 2 * self.hb_in:
            self.error(
                f"nothing received for {now - self.last_read:.1f} s; the heart-beat agreed was "
                f"every {self.hb_in * 1000:.0f} ms: the connection is taken to be dead"
            )
            return
        if self.verbs is not None and now >= self.next_extend:
            self.next_extend = now + self.verbs.extend_leases()
        if self.hb_out and now - self.last_write >= self.hb_out:
            self.transport.write(b"\n")
            self.last_write = now

    def drain(self) -> None:
        """The broker stops: nothing new is read or delivered; what was taken is answered."""
        self.draining = True
        self._update_reading()

    def stopping(self) -> None:
        self.error("the broker is shutting down: reconnect (to its backup, or once it is back)")

    def _update_reading(self) -> None:
        if self.transport is None or self.closed or self.refused or self.handshaking:
            return
        want = not (
            self.paused_writing
            or self.draining
            or self.disconnecting is not None
            or (self.busy and len(self.frames) >= _BACKLOG_FRAMES)
            or (self.verbs is None and self.busy)  # nothing more read while it logs in
        )
        if want != self.reading:
            self.reading = want
            if want:
                self.transport.resume_reading()
            else:
                self.transport.pause_reading()

    def threadsafe(self, fn: Callable[..., Any], *args: Any) -> None:
        """``fn(*args)`` on the loop, soon (from any thread; on the loop itself without waking
        it through its self-pipe: an inline commit resolves its futures there)."""
        try:
            if threading.get_ident() == self.server.loop_thread:
                self.loop.call_soon(fn, *args)
            else:
                self.loop.call_soon_threadsafe(fn, *args)
        except RuntimeError:  # the loop closed: the broker stopped
            pass


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
