"""A connection of a :class:`~spark_mq.connection.loop_listener.LoopListener` (STOMP's,
Kafka's), on asyncio's side: what every such protocol does the same way, so that each one's
connection holds only its own frames and verbs.

* **Accepting**: the listener's cap on connections (a protocol says no its own way:
  :meth:`LoopConnection.refused`), and a listener that drains takes no one new.
* **TLS**: with the broker's TLS on, the handshake first (reading paused until it is done;
  bytes that came with the handshake's last flight are kept and read after it), a failed
  handshake audited; the verified client certificate's name given to the connection core.
* **Flow**: past ``WRITE_HIGH`` unsent bytes the client is not read (nor, where the protocol
  delivers, delivered to) until its socket drains; nor while it logs in, while the broker
  drains, or while the protocol holds frames back (:meth:`LoopConnection.backlogged`).
* **From other threads**: :meth:`LoopConnection.threadsafe` runs work on the loop (on the loop
  itself without waking it through its self-pipe: an inline commit resolves its futures
  there); work that fails closes only its own connection, logged.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable
from typing import Any, Protocol

from spark_mq.config import BrokerSection
from spark_mq.connection.core import Connection, ConnState
from spark_mq.connection.gateway import Gateway
from spark_mq.connection.listener import ListenerCore
from spark_mq.security.tls import common_name

log = logging.getLogger(__name__)

WRITE_HIGH = 1024 * 1024  # unsent bytes past which the client is not read


class LoopHost(Protocol):
    """What a connection asks of the listener that accepted it."""

    gateway: Gateway
    core: ListenerCore
    settings: BrokerSection
    conns: set[Any]
    draining: bool
    loop: asyncio.AbstractEventLoop
    loop_thread: int


class LoopConnection(asyncio.Protocol):
    """See the module. A protocol's connection says what it is called (``transport``), what a
    client sends first (``first``, for the handshake timeout's error), and fills in the
    hooks: :meth:`received`, :meth:`ended`, :meth:`refused`, :meth:`backlogged`,
    :meth:`writable`, :meth:`close`; the listener asks :attr:`outstanding`, :meth:`sweep`,
    :meth:`drain` and :meth:`abort`."""

    def __init__(self, server: LoopHost, transport: str, *, first: str) -> None:
        self.server = server
        self.loop = server.loop
        self.transport_name = transport
        self.transport: Any = None
        self.peer = "?"
        self.core = Connection(
            "?", transport, time.monotonic(), first=first, wake=self.set,
            tls=server.gateway.tls is not None,
        )  # fmt: skip
        self.paused_writing = False
        self.reading = True
        self._early: list[bytes] = []  # data that came before the handshake was done with

    @property
    def state(self) -> ConnState:
        return self.core.state

    # -- asyncio's callbacks -----------------------------------------------------------------
    def connection_made(self, transport: Any) -> None:
        self.transport = transport
        peer = transport.get_extra_info("peername")
        self.peer = self.core.peer = f"{peer[0]}:{peer[1]}" if peer else "?"
        server = self.server
        if server.draining:
            transport.close()
            return
        refused = server.core.over_cap(len(server.conns), self.peer)
        server.conns.add(self)
        if refused is not None:
            self.refused(refused.message)
            return
        transport.set_write_buffer_limits(high=WRITE_HIGH)
        if self.core.state is ConnState.HANDSHAKING:
            transport.pause_reading()  # the TLS handshake reads first
            self.loop.create_task(self._start_tls(transport))

    async def _start_tls(self, raw: Any) -> None:
        tls = self.server.gateway.tls
        assert tls is not None
        try:
            self.transport = await self.loop.start_tls(
                raw, self, tls.context(), server_side=True,
                ssl_handshake_timeout=self.server.settings.handshake_timeout_s,
            )  # fmt: skip
        except Exception as exc:  # (ssl.SSLError, a reset, the handshake's timeout)
            log.info("%s: TLS handshake with %s failed: %s", self.transport_name, self.peer, exc)
            self.server.gateway.audit(
                "authentication_failed",
                peer=self.peer,
                transport=self.transport_name,
                detail=str(exc),
            )
            raw.abort()
            self.connection_lost(None)
            return
        if self.transport is None:  # (the client left during the handshake)
            self.connection_lost(None)
            return
        self.core.handshaken(common_name(self.transport.get_extra_info("peercert")))
        early, self._early = self._early, []
        for data in early:  # (what came with the handshake's last flight)
            self.data_received(data)

    def connection_lost(self, exc: Exception | None) -> None:
        if self.core.state is ConnState.CLOSED:
            return
        self.server.conns.discard(self)
        self.ended()
        self.core.closed()

    def pause_writing(self) -> None:
        self.paused_writing = True
        self.update_reading()

    def resume_writing(self) -> None:
        self.paused_writing = False
        self.update_reading()
        self.writable()

    def data_received(self, data: bytes) -> None:
        state = self.core.state
        if state.ended:
            return
        if state is ConnState.HANDSHAKING:  # TLS: decrypted before start_tls returned the
            self._early.append(data)  # transport to use
            return
        self.core.heard(time.monotonic())
        self.received(data)

    def eof_received(self) -> bool:
        return False  # the client finished sending: close

    # -- reading or not ----------------------------------------------------------------------
    def update_reading(self) -> None:
        """Read the client, or stop reading it, as things stand (see the module)."""
        state = self.core.state
        if self.transport is None or state.ended or state is ConnState.HANDSHAKING:
            return
        want = not (
            self.paused_writing
            or state is ConnState.CLOSING
            or state is ConnState.LOGGING_IN  # nothing more read while it logs in
            or self.backlogged()
        )
        if want != self.reading:
            self.reading = want
            if want:
                self.transport.resume_reading()
            else:
                self.transport.pause_reading()

    def drain(self) -> None:
        """The broker stops: nothing new is read; what was taken is answered."""
        self.core.closing()
        self.update_reading()

    def abort(self) -> None:
        if self.transport is not None:
            self.transport.abort()

    # -- from other threads ------------------------------------------------------------------
    def threadsafe(self, fn: Callable[..., Any], *args: Any) -> None:
        """``fn(*args)`` on the loop, soon (from any thread); if it fails, this connection
        closes and the others go on."""
        try:
            if threading.get_ident() == self.server.loop_thread:
                self.loop.call_soon(self._safely, fn, args)
            else:
                self.loop.call_soon_threadsafe(self._safely, fn, args)
        except RuntimeError:  # the loop closed: the broker stopped
            pass

    def now_or_soon(self, fn: Callable[..., Any], *args: Any) -> None:
        """``fn(*args)`` at once when called on the loop (a commit of the loop's turn resolved
        a future: its answer goes out in this turn, not the next), else :meth:`threadsafe`."""
        if threading.get_ident() == self.server.loop_thread:
            self._safely(fn, args)
        else:
            self.threadsafe(fn, *args)

    def _safely(self, fn: Callable[..., Any], args: tuple[Any, ...]) -> None:
        try:
            fn(*args)
        except Exception:
            log.exception("%s: handling a request of %s failed", self.transport_name, self.peer)
            self.close("the broker failed to handle a request (see the log)")

    # -- the protocol's own ------------------------------------------------------------------
    @property
    def outstanding(self) -> int:
        """Requests taken whose answer is still to come."""
        raise NotImplementedError

    def received(self, data: bytes) -> None:
        """Bytes from the client (logged in or not; past any TLS handshake)."""
        raise NotImplementedError

    def ended(self) -> None:
        """The connection is gone: let go of what it held (its consumers' messages go back)."""

    def refused(self, message: str) -> None:
        """Over the listener's cap on connections: say so (if the protocol can) and close."""
        self.close(message)

    def backlogged(self) -> bool:
        """Whether frames read ahead are enough for now (the client is not read meanwhile)."""
        return False

    def writable(self) -> None:
        """Its socket drained below ``WRITE_HIGH`` again."""

    def set(self) -> None:
        """(Any thread.) Something for it happened: a login finished, its session was
        revoked, a message came for it."""

    def close(self, reason: str) -> None:
        raise NotImplementedError

    def sweep(self, now: float) -> None:
        """(The loop, every so often.) Deadlines and heart-beats."""
