"""The direct wire's connection limits (``[broker]`` in ``conf/broker.toml``): the handshake,
frame and idle deadlines checked every sweep, and the refusal of connections past
``max_connections`` (a part of :class:`spark_mq.transports.direct_wire.WireServer`)."""

from __future__ import annotations

import contextlib
import logging
import socket
import time
from typing import TYPE_CHECKING, Any

from spark_mq import protocol, wire
from spark_mq.errors import BrokerUnavailable, ProtocolError, SparkMQError
from spark_mq.transports.wire_conn import WireConn

if TYPE_CHECKING:
    from spark_mq.config import BrokerSection

log = logging.getLogger("spark_mq.transports.direct_wire")

_HEARTBEAT = wire.control(protocol.Heartbeat())
REFUSED_LINGER_S = 2.0  # a refused connection is closed this long after its failure frame


class ConnectionLimits:
    """Mixed into ``WireServer``: relies on its ``settings``, ``max_frame``, ``_conns`` and its
    ``_refuse`` and ``_close``."""

    settings: BrokerSection
    max_frame: int
    _conns: set[WireConn]
    _refused_total: int
    _refused_logged: float

    if TYPE_CHECKING:

        def _refuse(self, conn: WireConn, err: SparkMQError) -> None: ...
        def _close(self, conn: WireConn) -> None: ...
        def _write(self, conn: WireConn) -> None: ...

    def _turn_away(self, sock: socket.socket, peer: Any) -> None:
        """Refuse a connection over ``max_connections``: say so (if the socket takes it at
        once) and hang up."""
        limit = self.settings.max_connections
        err = BrokerUnavailable(
            f"the broker has {limit} direct-wire connections open, its limit "
            "(broker.max_connections): try again later, or raise the limit"
        )
        with contextlib.suppress(OSError):
            sock.setblocking(False)
            sock.send(wire.failure(err))
        sock.close()
        self._refused_total += 1
        now = time.monotonic()
        if now - self._refused_logged >= 10:
            self._refused_logged = now
            log.warning(
                "wire: connection from %s refused: %d open, the limit (broker.max_connections); "
                "%d refused so far",
                peer or "a local client",
                limit,
                self._refused_total,
            )

    def _sweep(self, now: float) -> None:
        """Close connections past their deadlines (see the module's doc)."""
        s = self.settings
        for conn in list(self._conns):
            if conn.closed:
                continue
            if conn.refused:
                if now - conn.refused_at >= REFUSED_LINGER_S:
                    self._close(conn)  # it was told why; it need not hang up itself
                continue
            if conn.heartbeat_due(now):
                conn.queue(_HEARTBEAT)
                self._write(conn)
            started = conn.frame_started
            if conn.role is None and now - conn.opened >= s.handshake_timeout_s:
                self._refuse(
                    conn,
                    ProtocolError(
                        f"no produce or consume frame within {s.handshake_timeout_s:g} s of "
                        "connecting (broker.handshake_timeout_s)",
                        fault="remote",
                    ),
                )
            elif started is not None and now >= started + self._frame_time(conn):
                size = conn.reader.partial or 0
                self._refuse(
                    conn,
                    ProtocolError(
                        f"a frame of {size} bytes did not arrive within "
                        f"{self._frame_time(conn):g} s (broker.frame_timeout_s plus a second "
                        "per MiB)",
                        fault="remote",
                    ),
                )
            elif (
                s.idle_timeout_s
                and now - conn.last_read >= s.idle_timeout_s
                and conn.idle_producer()
            ):
                log.info(
                    "wire: closing %s's producer connection to %s: idle for %.0f s "
                    "(broker.idle_timeout_s)",
                    conn.peer,
                    conn.destination,
                    now - conn.last_read,
                )
                self._close(conn)

    def _frame_time(self, conn: WireConn) -> float:
        """How long the frame ``conn`` is receiving may take in all."""
        size = min(conn.reader.partial or 0, self.max_frame)  # (what a header claims is no
        # reason to wait longer: a frame over the limit is skipped, and waits as one at it)
        return self.settings.frame_timeout_s + size / (1024 * 1024)
