"""The STOMP service: STOMP 1.0, 1.1 and 1.2 clients of any language on their own port
(``broker.stomp_port``, 61613 by default), served by one asyncio event loop on a thread of its
own (``stomp-loop``), as the direct wire is served by its loop.

Each connection (:class:`~spark_mq.transports.stomp_connection.StompConnection`) is one more
protocol adapter over the session layer: its CONNECT logs in (off the loop: argon2 takes tens of
milliseconds), it gets a ``ClientSession``, and its frames become the session's calls. Nothing
here decides delivery: leases, redelivery, dead-lettering, groups, dedup, transactions are the
broker's, exactly as for the SDK.

Limits: a connection must send CONNECT within ``broker.handshake_timeout_s``; at most
``broker.max_connections`` STOMP connections; frames are bounded by
``limits.max_message_bytes`` (body) and ``broker.stomp_max_headers`` /
``stomp_max_header_bytes``; a client that does not read is not read (and gets no deliveries)
until what waits for it has gone out. TLS comes from ``Security.tls`` (a changed certificate is
used for new connections), and on SIGTERM the service drains: nothing new is read, what was read
is answered once durable, then every client gets an ERROR saying the broker is stopping.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time

from spark_mq.connection.gateway import Gateway
from spark_mq.connection.listener import ListenerCore
from spark_mq.errors import ConfigError
from spark_mq.transports.stomp_codec import Limits
from spark_mq.transports.stomp_connection import StompConnection

log = logging.getLogger(__name__)

_SWEEP_S = 0.25  # heart-beats and handshake deadlines are checked this often


class StompServer:
    name = "stomp"

    def __init__(self, gateway: Gateway, host: str, port: int) -> None:
        self.gateway = gateway
        self.core = ListenerCore(gateway, "stomp", label="STOMP")
        self.turn = self.core.turn
        settings = gateway.config.broker
        self.settings = settings
        body = gateway.config.limits.max_message_bytes
        self.limits = Limits(
            max_frame_bytes=body + settings.stomp_max_headers * settings.stomp_max_header_bytes,
            max_headers=settings.stomp_max_headers,
            max_header_bytes=settings.stomp_max_header_bytes,
            max_body_bytes=body,
        )
        self.conns: set[StompConnection] = set()
        # acks waiting to share a sync with the next messages (the turn's ``later``): the loop
        # commits them when due, rather than waking each writer thread to
        self._later_at: asyncio.TimerHandle | None = None
        self.draining = False
        self.loop = asyncio.new_event_loop()
        self.loop_thread = 0  # its thread's ident, once running
        self._thread = threading.Thread(target=self._run, name="stomp-loop", daemon=True)
        self._thread.start()
        try:
            self._server = asyncio.run_coroutine_threadsafe(
                self.loop.create_server(
                    lambda: StompConnection(self), host, port, backlog=128, reuse_address=True
                ),
                self.loop,
            ).result()
        except OSError as exc:
            self._stop_loop()
            raise ConfigError(
                f"STOMP cannot listen on {host}:{port}: {exc.strerror or exc}; set "
                "broker.stomp_port (0 picks a free port), or broker.stomp = false",
                setting="broker.stomp_port",
            ) from exc
        self.port: int = self._server.sockets[0].getsockname()[1]
        self.loop.call_soon_threadsafe(self._sweep)

    def _run(self) -> None:
        self.loop_thread = threading.get_ident()
        asyncio.set_event_loop(self.loop)
        self.loop.run_forever()

    def _stop_loop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join()
        self.loop.close()
        self.core.close()

    def _sweep(self) -> None:
        now = time.monotonic()
        for conn in list(self.conns):
            try:
                conn.sweep(now)
            except Exception:  # one client's trouble never stops the others
                log.exception("stomp: error checking %s", conn.peer)
                conn.abort()
        if not self.loop.is_closed():  # (often enough for the shortest heart-beat)
            beat = self.settings.stomp_heartbeat_ms / 4000 or _SWEEP_S
            self.loop.call_later(min(_SWEEP_S, beat), self._sweep)

    # -- what the broker's service asks ------------------------------------------------------
    def connection_count(self) -> int:
        return len(self.conns)

    def waiting_for(self) -> str:
        pending = sum(c.outstanding for c in list(self.conns))
        return f"{pending} STOMP frame(s) to answer" if pending else ""

    def stop(self, deadline: float | None = None) -> list[str]:
        """Stop accepting; with a ``deadline`` (``time.monotonic()``) first answer what was
        read (receipts once durable) until everything is or the deadline passes; then tell
        every client the broker stops, and close (consumers' messages go back)."""
        if self.loop.is_closed():
            return []
        asyncio.run_coroutine_threadsafe(self._shutdown(deadline), self.loop).result()
        self._stop_loop()
        return []

    async def _shutdown(self, deadline: float | None) -> None:
        self._server.close()
        self.draining = True
        for conn in list(self.conns):
            conn.drain()
        while deadline is not None and time.monotonic() < deadline:
            if not any(c.outstanding for c in self.conns):
                break
            await asyncio.sleep(0.02)
        for conn in list(self.conns):
            conn.stopping()
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self._server.wait_closed(), 0.5)

    def begin_stop(self, deadline: float) -> None:
        """(STOMP drains in :meth:`shutdown`.)"""

    def committed(self) -> None:
        """(After a turn.) Come back when the earliest waiting ack is due."""
        due = self.turn.due()
        if due is None:
            return
        if self._later_at is not None:
            if self._later_at.when() <= due:
                return
            self._later_at.cancel()
        self._later_at = self.loop.call_at(due, self._commit_later)

    def _commit_later(self) -> None:
        self._later_at = None
        self.turn.commit_due()  # (what is due; the rest stays for later)
        self.committed()
