"""The direct wire's producers and logins: a produce frame's batch to the broker (inline with the
loop's turn, or on a helper thread when it may wait for room), its answer once durable, a
connection's login and its session (a part of
:class:`spark_mq.transports.direct_wire.WireServer`)."""

from __future__ import annotations

import json
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from spark_mq import protocol, wire
from spark_mq.errors import MessageTooLarge, NotAuthenticated, SparkMQError, to_wire
from spark_mq.journal.inline_commit import InlineCommit
from spark_mq.plain import PlainMessage
from spark_mq.schema import PRODUCE_SCHEMA
from spark_mq.security.authenticate import Credentials
from spark_mq.security.context import Security
from spark_mq.session import ANONYMOUS, ClientSession
from spark_mq.transports.flight import put_answer
from spark_mq.transports.wire_conn import WireConn

if TYPE_CHECKING:
    from spark_mq.broker.core import Broker

# a batch this big is synced by the journal writer thread, so the loop reads the next meanwhile
INLINE_MAX_BYTES = 256 * 1024


class WireProducing:
    """Mixed into ``WireServer``: relies on its ``broker``, ``security``, ``_helpers``,
    ``_inline`` (the turn's commit) and ``mark``."""

    broker: Broker
    security: Security
    _helpers: ThreadPoolExecutor
    _inline: InlineCommit | None

    if TYPE_CHECKING:

        def mark(self, conn: WireConn) -> None: ...

    def _produce(self, conn: WireConn, kind: int, body: wire.Body) -> None:
        one = wire.read_plain_message(body) if kind == wire.PLAIN else None
        if one is not None:  # the commonest frame: one plain message (spark_mq.plain)
            seq, batch = one
        elif kind == wire.PLAIN:
            seq, batch = wire.read_plain(body)
        elif kind == wire.COLUMNS:
            seq, batch = wire.PRODUCE_SUBSETS.read(body)
        else:
            seq, batch = wire.read_batch(body, PRODUCE_SCHEMA)
        dest, client = conn.destination, conn.client
        assert client is not None
        conn.submitted += 1
        try:
            parked = client.produce_may_wait(dest)
            if parked:
                fut = self._helpers.submit(self._produce_waiting, client, dest, batch)
            elif isinstance(batch, PlainMessage):
                fut = client.produce_plain(dest, batch, self._inline)
            elif len(body) >= INLINE_MAX_BYTES:  # the writer thread syncs; the loop reads on
                fut = client.produce(dest, batch)
            else:
                fut = client.produce(dest, batch, self._inline)
        except SparkMQError as exc:
            self._answer(conn, protocol.PutFailed(seq, json.loads(to_wire(exc))))
            return
        conn.parked = parked
        fut.add_done_callback(lambda f: self._produced(conn, seq, f, unpark=parked))

    @staticmethod
    def _produce_waiting(
        client: ClientSession, dest: str, batch: pa.RecordBatch | PlainMessage
    ) -> Any:
        if isinstance(batch, PlainMessage):
            return client.produce_plain(dest, batch).result()
        return client.produce(dest, batch).result()

    def _log_in(self, conn: WireConn, creds: Credentials) -> None:
        """Start checking a login (off the loop: a host's penalty is a timer, argon2 runs on
        the security layer's own pool); the connection's next frames wait for the outcome,
        which the loop takes up when woken. Nobody else waits."""
        conn.parked = True  # (set first: a remembered login is done before submit returns)
        conn.login = self.security.submit_login(creds, peer=str(conn.peer), transport="wire")
        conn.login.add_done_callback(lambda _: self._logged_in(conn))

    def _must_log_in(self, conn: WireConn) -> bool:
        """Whether a connection's produce or consume frame must wait for a login first: security
        is on and it neither sent a login frame nor presented a client certificate."""
        return (
            self.security.enabled
            and conn.login is None
            and conn.client is None
            and conn.certificate_name is None
        )

    def _logged_in(self, conn: WireConn) -> None:
        """(Any thread, once the login's future is done.) The loop takes up its outcome and the
        frames that waited for it."""
        conn.parked = False
        self.mark(conn)

    def _client(self, conn: WireConn) -> ClientSession:
        """The connection's session, opened at its produce or consume frame: for the user it
        logged in as, else its client certificate's, else (security off) anonymous."""
        if conn.client is not None:
            return conn.client
        if conn.login is not None:
            principal = conn.login.result()  # (done: the frame waited for it) or raises
        elif conn.certificate_name is not None:
            principal = self.security.authenticator.certificate(conn.certificate_name)
        elif self.security.enabled:  # (_must_log_in sent such a frame to a login first)
            raise NotAuthenticated("this broker requires credentials")
        else:
            principal = ANONYMOUS
        conn.client = self.security.session(
            self.broker, principal, peer=str(conn.peer), transport="wire"
        )
        session = conn.client
        session.on_revoke = lambda reason: self._revoked(conn, session, reason)
        return conn.client

    def _revoked(self, conn: WireConn, session: ClientSession, reason: str) -> None:
        """(Any thread.) The connection's user was removed or its password changed: the loop
        refuses the connection (its consumers' messages go back)."""
        conn.revoked = reason
        self.mark(conn)

    def _produced(self, conn: WireConn, seq: int, fut: Future, *, unpark: bool = False) -> None:
        """A batch is durable or failed (any thread): queue its answer."""
        conn.answers.append(wire.control(put_answer(seq, fut)))
        if unpark:
            conn.parked = False  # the loop reads its backlog and its socket again
        self.mark(conn)

    def _answer(self, conn: WireConn, frame: protocol.Frame) -> None:
        conn.answers.append(wire.control(frame))
        self.mark(conn)

    def _too_large(self, conn: WireConn, item: wire.TooLarge) -> None:
        limit = self.broker.config.limits.max_batch_bytes
        err = MessageTooLarge(
            f"a frame of {item.size} bytes is over the limit of {limit} bytes (setting "
            "limits.max_batch_bytes): send smaller batches",
            destination=conn.destination or None,
            size=item.size,
            limit=limit,
        )
        if conn.role != "produce" or item.kind not in wire.PRODUCE_KINDS:
            raise err
        conn.submitted += 1
        self._answer(conn, protocol.PutFailed(item.seq, json.loads(to_wire(err))))
