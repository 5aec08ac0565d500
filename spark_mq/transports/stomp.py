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

from spark_mq.connection.gateway import Gateway
from spark_mq.connection.loop_listener import SWEEP_S, LoopListener
from spark_mq.transports.stomp_codec import Limits
from spark_mq.transports.stomp_connection import StompConnection


class StompServer(LoopListener):
    conns: set[StompConnection]

    def __init__(self, gateway: Gateway, host: str, port: int) -> None:
        # (a cluster member forwards what clients do to destinations another member serves)
        super().__init__(gateway, "stomp", label="STOMP", forwards=True)
        settings = self.settings
        body = gateway.config.limits.max_message_bytes
        self.limits = Limits(
            max_frame_bytes=body + settings.stomp_max_headers * settings.stomp_max_header_bytes,
            max_headers=settings.stomp_max_headers,
            max_header_bytes=settings.stomp_max_header_bytes,
            max_body_bytes=body,
        )
        self.listen(host, port, lambda: StompConnection(self))

    def sweep_every(self) -> float:
        # (often enough for the shortest heart-beat)
        return min(SWEEP_S, self.settings.stomp_heartbeat_ms / 4000 or SWEEP_S)

    def goodbye(self, conn: StompConnection) -> None:
        conn.stopping()  # an ERROR saying the broker stops
