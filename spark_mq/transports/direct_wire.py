"""The direct wire's server (:mod:`spark_mq.wire`): one thread serves every connection. This
module is its loop (accepting, reading, consuming, writing) and what the wire's frames mean; a
connection's socket and codec state is :mod:`~spark_mq.transports.wire_conn`, and what every
listener does alike (its life and deadlines, logins, sessions, the cap, produce dispatch, the
turn's inline commit) is the connection core's (:mod:`spark_mq.connection`).

Each turn of the loop reads every ready socket and hands produce batches and settle frames to
their sessions with the turn's inline commit, so all of them are made durable by this thread at
the end of the turn, one sync per destination, with no hand-off to the journal writer (with the
hot tier or in memory; a Delta-only journal's commits stay on the writer threads). The same turn
then writes the deliveries the commit made possible, and only then answers the producers and
acks (their futures resolve after the deliveries are out). A big batch (256 KiB or more) is the
exception: the journal writer thread syncs it while the loop reads the next. Work finished by
other threads (a Flight producer's commit, a lapsed lease, a login) reaches the loop through a
wake-up socket.

A produce that may have to wait (a ``block`` overflow policy with limits set, or the memory in
state orange or red) runs on a helper thread instead, and its connection is not read until it is
answered: the loop never sleeps on behalf of one client, and a producer's batches keep order.

Connections are bounded (``[broker]`` in ``conf/broker.toml``): a connection must name what it
does within ``handshake_timeout_s``; a frame, once begun, must arrive within
``frame_timeout_s`` plus a second per MiB (a client trickling a byte a second is cut off); a
producer connection with nothing in flight is closed after ``idle_timeout_s``; at most
``max_connections`` are open; until it has said what it does, only a login-sized frame is read;
and a connection is not read while more than ``max_unsent_bytes`` wait to go out to it (or are
still to come: the answers to the frames it sent, counted at their least size). Each
limit is said in a failure frame first.

Besides its TCP port, the loop listens on a local socket (Linux: in the abstract namespace, so
no file is left behind and only processes sharing this network namespace, as the loopback
interface, can connect). Clients on this machine use it: a round trip through it took 42 us
against 58-62 us over TCP loopback (two Python processes, measured on this machine).
"""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import selectors
import socket
import ssl
import threading
import time
from collections import deque
from concurrent.futures import Future
from typing import Any, cast

import pyarrow as pa

from spark_mq import protocol, serving_threads, wire
from spark_mq.connection.core import Beat, Close, ConnState, Refuse
from spark_mq.connection.gateway import Gateway
from spark_mq.connection.listener import ListenerCore, pump
from spark_mq.deliveries import DeliveryState, delivery_table
from spark_mq.errors import (
    ConfigError,
    MessageTooLarge,
    NotOwner,
    Partitioned,
    ProtocolError,
    SparkMQError,
    to_wire,
)
from spark_mq.messages import Messages
from spark_mq.schema import PRODUCE_SCHEMA
from spark_mq.security.tls import common_name
from spark_mq.session import ANONYMOUS, ClientSession
from spark_mq.transports import translate
from spark_mq.transports.answers import put_answer
from spark_mq.transports.wire_conn import WireConn, coalesce, local_listener

log = logging.getLogger(__name__)

_READ_BYTES = 256 * 1024
_READ_TURN_BYTES = 8 * 1024 * 1024  # the most one connection gives one turn (one sync)
_IDLE_S = 0.5  # the loop looks at its stop flag this often when nothing happens
_SWEEP_S = 0.25  # connections' deadlines are checked this often
_HEARTBEAT = wire.control(protocol.Heartbeat())
_SERVING = ConnState.SERVING


class WireServer:
    name = "wire"

    def __init__(self, gateway: Gateway, host: str, port: int, *, local: bool = True) -> None:
        self.gateway = gateway
        self.core = ListenerCore(gateway, "wire", label="direct-wire", defer_answers=True)
        self.turn = self.core.turn
        self.max_frame = gateway.config.limits.max_batch_bytes + wire.FRAME_SLACK
        self.settings = gateway.config.broker
        self._next_sweep = 0.0
        try:
            self._listener = socket.create_server((host, port), backlog=128)
        except OSError as exc:  # the port taken (a second broker on this machine), say
            raise ConfigError(
                f"the direct wire cannot listen on {host}:{port}: {exc.strerror or exc}; set "
                "broker.wire_port (0 picks a free port), or broker.wire = false",
                setting="broker.wire_port",
            ) from exc
        self._listener.setblocking(False)
        self.port = self._listener.getsockname()[1]
        self._sel = selectors.DefaultSelector()
        self._sel.register(self._listener, selectors.EVENT_READ, "accept")
        self._listeners = [self._listener]
        self.local_name: str | None = None  # the local socket's name, for clients to find it
        found = local_listener() if local else None
        if found is not None:
            local_sock, self.local_name = found
            self._listeners.append(local_sock)
            self._sel.register(local_sock, selectors.EVENT_READ, "accept")
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        self._sel.register(self._wake_r, selectors.EVENT_READ, "wake")
        self._dirty: deque[WireConn] = deque()
        self._poked = False
        self._stopping = False
        self._draining = False  # shutting down: nothing new taken, what was taken answered
        self._drain_deadline = 0.0
        # every read lands here first: recv(256 KiB) made and freed a buffer that size per call
        # (a small read took 16-23 us that way, 3-5 us with recv_into, in a microbenchmark)
        self._inbox = bytearray(_READ_BYTES)
        self._inbox_view = memoryview(self._inbox)
        self._conns: set[WireConn] = set()
        self._worker = threading.Thread(target=self._run, name="wire-loop", daemon=True)
        self._ident: int | None = None
        self._worker.start()

    # -- waking the loop ---------------------------------------------------------------------
    def mark(self, conn: WireConn) -> None:
        """``conn`` has something to send; callable from any thread."""
        self._dirty.append(conn)
        if threading.get_ident() != self._ident and not self._poked:
            self._poked = True
            with contextlib.suppress(BlockingIOError, OSError):
                self._wake_w.send(b"w")

    # -- what the service asks (the Listener protocol) ----------------------------------------
    def connection_count(self) -> int:
        return len(self._conns)

    def waiting_for(self) -> str:
        """What a shutdown waits for (for the log); empty when nothing."""
        conns = list(self._conns)
        batches = sum(c.submitted - c.answered for c in conns if c.role == "produce")
        settles = sum(c.consumer.unanswered for c in conns if c.consumer is not None)
        parts = []
        if batches:
            parts.append(f"{batches} produced batch(es) to answer")
        if settles:
            parts.append(f"{settles} settle(s) to answer")
        if parts:
            parts.append(f"on {len(conns)} direct-wire connection(s)")
        return ", ".join(parts)

    def begin_stop(self, deadline: float) -> None:
        """(The wire drains in :meth:`shutdown`.)"""

    def stop(self, deadline: float | None = None) -> list[str]:
        """Stop accepting, close every connection (consumers' messages go back), stop.

        With a ``deadline`` (``time.monotonic()``), first answer what was taken: no frame is
        read any more and no message delivered, but produced batches and settles already read
        are answered once durable, until every one is or the deadline passes."""
        if deadline is not None:
            self._drain_deadline = deadline
            self._draining = True
        else:
            self._stopping = True
        self._poked = False
        with contextlib.suppress(OSError):
            self._wake_w.send(b"s")
        self._worker.join()
        self.core.close()
        for s in (*self._listeners, self._wake_r, self._wake_w):
            s.close()
        self._sel.close()
        return []

    def _drained(self) -> bool:
        """Whether everything taken has been answered and written (shutting down)."""
        return all(
            conn.state is ConnState.CLOSED
            or (
                not conn.out
                and not conn.answers
                and (conn.role != "produce" or conn.submitted == conn.answered)
                and (conn.consumer is None or not conn.consumer.unanswered)
            )
            for conn in list(self._conns)
        )

    # -- the loop ----------------------------------------------------------------------------
    def _run(self) -> None:
        self._ident = threading.get_ident()
        serving_threads.answers_at_once()  # (SDK clients: they follow a cluster's answers)
        drain_begun = False
        turn = self.turn
        while not self._stopping:
            if self._draining and not drain_begun:
                drain_begun = True
                for listener in self._listeners:  # new clients are refused by the kernel now
                    self._sel.unregister(listener)
                for conn in list(self._conns):
                    self._interest(conn)  # no more reading
            if self._draining and (self._drained() or time.monotonic() >= self._drain_deadline):
                break
            timeout = _IDLE_S if not self._draining else 0.05
            due = turn.due()
            if due is not None:  # acks waiting to share a sync: this loop commits them when due
                timeout = min(timeout, max(due - time.monotonic(), 0.0))
            events = self._sel.select(timeout)
            turn.begin()
            try:
                for key, mask in events:
                    try:
                        self._event(key, mask)
                    except Exception:  # one client's trouble never stops the loop
                        log.exception("wire: error serving %s", key.data)
                        if isinstance(key.data, WireConn):
                            self._close(key.data)
            finally:
                turn.end()
            self._serve_dirty()
            # the deadlines once what arrived is read (as asyncio's loops run a timer after the
            # reads that came due with it): checked first, a loop busy past a client's
            # handshake time refused the handshake waiting to be read
            now = time.monotonic()
            if now >= self._next_sweep:
                self._next_sweep = now + _SWEEP_S
                self._sweep(now)
        for conn in list(self._conns):
            self._close(conn)

    def _sweep(self, now: float) -> None:
        """Carry out what each connection's deadlines say (see ``Connection.check``)."""
        deadlines = self.core.deadlines
        for conn in list(self._conns):
            match conn.core.check(now, deadlines):
                case Refuse(error=err):
                    self._refuse(conn, err)
                case Close(reason=reason):
                    if reason:
                        log.info(
                            "wire: closing %s's %s connection to %s: %s",
                            conn.peer, conn.role, conn.destination, reason,
                        )  # fmt: skip
                    self._close(conn)
                case Beat():
                    conn.queue(_HEARTBEAT)
                    self._write(conn)

    def _event(self, key: selectors.SelectorKey, mask: int) -> None:
        if key.data == "accept":
            if not self._draining:
                self._accept(key.fileobj)  # type: ignore[arg-type]
        elif key.data == "wake":
            # drain first, then clear: cleared first, a poke sent in between would be drained
            # with the flag left set, and no thread would poke again (each mark then waited for
            # the next socket event, or for _IDLE_S)
            with contextlib.suppress(BlockingIOError):
                while self._wake_r.recv(4096):
                    pass
            self._poked = False
        else:
            conn: WireConn = key.data
            if conn.state is ConnState.HANDSHAKING:
                self._handshake(conn)
                return
            if mask & selectors.EVENT_WRITE:
                self._write(conn)
            readable = mask & selectors.EVENT_READ and conn.state is not ConnState.CLOSED
            if readable and not self._draining:
                self._read(conn)

    def _accept(self, listener: socket.socket) -> None:
        for _ in range(64):
            try:
                sock, peer = listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:  # out of file descriptors, say: keep serving the rest
                log.warning("wire: cannot accept a connection: %s", exc)
                return
            refused = self.core.over_cap(len(self._conns), peer)
            if refused is not None:
                with contextlib.suppress(OSError):  # said, if the socket takes it at once
                    sock.setblocking(False)
                    sock.send(wire.failure(refused))
                sock.close()
                continue
            sock.setblocking(False)
            tls = self.gateway.tls
            if sock.family != socket.AF_UNIX:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                if tls is not None:  # (the local socket is this machine's own)
                    sock = tls.context().wrap_socket(
                        sock, server_side=True, do_handshake_on_connect=False
                    )
            wire.widen_local_send_buffer(sock)  # deliveries to a local consumer
            conn = WireConn(sock, peer or "a local client", time.monotonic(), self.mark)
            self._conns.add(conn)
            self._interest(conn)

    def _handshake(self, conn: WireConn) -> None:
        """Go on with a TLS handshake (non-blocking); a client that fails it is dropped."""
        sock = cast(ssl.SSLSocket, conn.sock)
        try:
            sock.do_handshake()
        except ssl.SSLWantReadError:
            self._watch(conn, selectors.EVENT_READ)
            return
        except ssl.SSLWantWriteError:
            self._watch(conn, selectors.EVENT_WRITE)
            return
        except (ssl.SSLError, OSError) as exc:
            log.info("wire: TLS handshake with %s failed: %s", conn.peer, exc)
            self.gateway.audit(
                "authentication_failed", peer=str(conn.peer), transport="wire", detail=str(exc)
            )
            self._close(conn)
            return
        conn.core.handshaken(common_name(sock.getpeercert()))
        self._interest(conn)
        self._read(conn)  # what came with the last handshake record is already buffered

    def _watch(self, conn: WireConn, events: int) -> None:
        if conn.events == events:
            return
        if not conn.events:
            self._sel.register(conn.sock, events, conn)
        else:
            self._sel.modify(conn.sock, events, conn)
        conn.events = events

    def _interest(self, conn: WireConn) -> None:
        """Watch for what ``conn`` needs now: input while it serves (or is refused: what comes
        is read and dropped), output if queued."""
        state = conn.state
        if state is ConnState.CLOSED:
            return
        if state is ConnState.HANDSHAKING:
            if not conn.events:
                self._watch(conn, selectors.EVENT_READ)
            return
        if state is ConnState.REFUSED:
            want = selectors.EVENT_READ
        elif state in (ConnState.SERVING, ConnState.OPENING) and not self._draining:
            want = selectors.EVENT_READ
            if conn.held() > self.settings.max_unsent_bytes:
                want = 0  # read on once what waits for it has gone out
        else:
            want = 0  # logging in, waiting on a helper thread, closing, draining
        if conn.out:
            want |= selectors.EVENT_WRITE
        if want == conn.events:
            return
        if not conn.events:
            self._sel.register(conn.sock, want, conn)
        elif not want:
            self._sel.unregister(conn.sock)
        else:
            self._sel.modify(conn.sock, want, conn)
        conn.events = want

    # -- reading -----------------------------------------------------------------------------
    def _read(self, conn: WireConn) -> None:
        # what is there, up to _READ_TURN_BYTES: batches that arrived together share one sync
        got = 0
        refused = conn.state is ConnState.REFUSED
        while got < _READ_TURN_BYTES:
            # the rest of a big frame goes straight to its own buffer (FrameReader.sink)
            sink = None if refused else conn.reader.sink()
            try:
                n = conn.sock.recv_into(self._inbox if sink is None else sink)
            except (BlockingIOError, InterruptedError, ssl.SSLWantReadError, ssl.SSLWantWriteError):
                break
            except OSError:
                n = 0
            if not n:  # the client went away (or closed after its last frame)
                if got:  # answer what came first; the next turn sees the end again
                    break
                self._close(conn)
                return
            got += n
            if refused:
                continue  # discarded: the client has its answer
            conn.core.last_read = time.monotonic()
            if sink is not None:
                conn.backlog.extend(conn.reader.filled(n))
                if n < len(sink) and not conn.tls:  # (TLS: a record at a time, read on)
                    break  # drained
                continue
            try:
                conn.backlog.extend(conn.reader.feed(self._inbox_view[:n]))  # feed copies
            except SparkMQError as exc:
                self._refuse(conn, exc)
                return
            if n < _READ_BYTES and not conn.tls:
                break  # drained
            if conn.reader.one_at_a_time and conn.reader.buffered > wire.PRELOGIN_MAX_FRAME:
                break  # not known yet: no more is read than its first frames need
        self._note_partial(conn)
        try:
            self._handle_backlog(conn)
        except SparkMQError as exc:
            self._refuse(conn, exc)
            return
        if conn.held() > self.settings.max_unsent_bytes:
            self._interest(conn)  # the answers to come are enough: read no more for now

    @staticmethod
    def _note_partial(conn: WireConn) -> None:
        """The frame being received (its deadline runs from when it began); none between
        frames."""
        core, size = conn.core, conn.reader.partial
        if size is None:
            core.frame_started = None
        else:
            core.frame_size = min(size, 2**40)
            if core.frame_started is None:
                core.frame_started = core.last_read

    def _handle_backlog(self, conn: WireConn) -> None:
        core = conn.core
        while core.state is _SERVING or core.state is ConnState.OPENING:
            if not conn.backlog:
                if not conn.reader.one_at_a_time:
                    return
                # (what is known of a connection decides how its next frame is read: its
                # frames are cut one at a time until it has said what it does)
                conn.backlog.extend(conn.reader.feed(b""))
                self._note_partial(conn)
                if not conn.backlog:
                    return
            item = conn.backlog.popleft()
            if isinstance(item, wire.TooLarge):
                self._too_large(conn, item)
                continue
            kind, body = item
            if conn.role is None:
                self._first(conn, kind, body)
            elif conn.role == "produce":
                if kind not in wire.PRODUCE_KINDS:
                    raise ProtocolError(
                        "a producer connection carries batch frames only", fault="remote"
                    )
                self._produce(conn, kind, body)
            else:
                if kind != wire.CONTROL:
                    raise ProtocolError("consumers send settle and bye frames only", fault="remote")
                self._consumer_frame(conn, protocol.parse(wire.control_bytes(body)))

    def _first(self, conn: WireConn, kind: int, body: wire.Body) -> None:
        frame = protocol.parse(wire.control_bytes(body)) if kind == wire.CONTROL else None
        core = conn.core
        match frame:
            case protocol.Login():
                if core.login is not None or core.session is not None:
                    raise ProtocolError("a connection logs in once, first", fault="remote")
                self.core.log_in(core, frame.username, frame.password, frame.token)
            case protocol.Produce() | protocol.Consume() if core.session is None:
                if core.login is None and self.gateway.security_on:
                    # no login frame: the certificate TLS verified, or no credentials (refused,
                    # and slowed per host as any failure), off the loop too; the frame waits
                    conn.backlog.appendleft((kind, body))
                    self.core.log_in(core, None, None, None)
                    return
                outcome = core.login_outcome() if core.login is not None else ANONYMOUS
                if isinstance(outcome, SparkMQError):
                    raise outcome
                assert outcome is not None  # (the frame waited for the login to be done)
                self.core.open_session(core, outcome)
                conn.backlog.appendleft((kind, body))  # handled now that it has a session
            case protocol.Produce(destination=name):
                self._session(conn).open_producer(name)
                conn.role, conn.destination = "produce", name
                core.heartbeat_s = frame.heartbeat_ms / 1000
                self._known(conn)
            case protocol.Consume() as cmd:
                self._attach(conn, cmd)
                self._known(conn)
            case _:
                raise ProtocolError(
                    "a connection starts with a produce or consume frame", fault="remote"
                )

    def _known(self, conn: WireConn) -> None:
        """The connection said what it does (and logged in): its frames may be as big as the
        limits allow, and are cut as they come."""
        conn.reader.max_body = self.max_frame
        conn.reader.one_at_a_time = False
        conn.backlog.extend(conn.reader.feed(b""))  # what came behind its first frames
        self._note_partial(conn)

    @staticmethod
    def _session(conn: WireConn) -> ClientSession:
        session = conn.core.session
        assert session is not None  # (opened before a produce or consume frame is handled)
        return session

    def _refuse(self, conn: WireConn, err: SparkMQError) -> None:
        """Say why, then hang up once it is written (and the client had time to read it)."""
        if not conn.core.refuse(time.monotonic()):
            return
        # (a cluster member sending a client to another, or an SDK client told a destination
        # has partitions, which it then uses: routine, not news)
        level = logging.DEBUG if isinstance(err, NotOwner | Partitioned) else logging.INFO
        log.log(level, "wire: refusing %s: %s", conn.peer, err.message)
        conn.backlog.clear()
        conn.queue(wire.failure(err))
        self._write(conn)

    # -- producing ---------------------------------------------------------------------------
    def _produce(self, conn: WireConn, kind: int, body: wire.Body) -> None:
        one = wire.read_plain_message(body) if kind == wire.PLAIN else None
        batch: pa.RecordBatch
        if one is not None:  # the commonest frame: one plain message (spark_mq.messages)
            seq, message = one
            messages = Messages(None, [message])
        else:
            if kind == wire.PLAIN:
                seq, batch = wire.read_plain(body)
            elif kind == wire.COLUMNS:
                seq, batch = wire.PRODUCE_SUBSETS.read(body)
            else:
                seq, batch = wire.read_batch(body, PRODUCE_SCHEMA)
            messages = Messages.of(batch)
        conn.submitted += 1
        try:
            conn.order.check()
            fut, waits = self.core.produce(
                self._session(conn), conn.destination, messages, len(body)
            )
        except SparkMQError as exc:
            conn.order.refused(exc)
            self._answer(conn, protocol.PutFailed(seq, json.loads(to_wire(exc))))
            return
        if waits:
            conn.core.waiting()  # not read until it is answered: its batches keep order
            conn.waiting_on = fut
        fut.add_done_callback(lambda f: self._produced(conn, seq, f))

    def _produced(self, conn: WireConn, seq: int, fut: Future) -> None:
        """A batch is durable or failed (any thread): queue its answer. One refused for a
        move through its future (let go after it was taken) refuses the stream's later ones
        too, as one refused at once does."""
        answer = put_answer(seq, fut)
        if isinstance(answer, protocol.PutFailed):  # (only a failure asks its future again)
            conn.order.refused_through(fut)
        conn.answers.append(wire.control(answer))
        self.mark(conn)

    def _answer(self, conn: WireConn, frame: protocol.Frame) -> None:
        conn.answers.append(wire.control(frame))
        self.mark(conn)

    def _too_large(self, conn: WireConn, item: wire.TooLarge) -> None:
        if conn.role is None:  # (not known yet: a login's size)
            raise ProtocolError(
                f"a frame of {item.size} bytes is over the limit of {wire.PRELOGIN_MAX_FRAME} "
                "bytes a connection may send before it has logged in and said what it does",
                fault="remote",
            )
        limit = self.gateway.config.limits.max_batch_bytes
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

    # -- consuming ---------------------------------------------------------------------------
    def _attach(self, conn: WireConn, cmd: protocol.Consume) -> None:
        consumer = self._session(conn).attach(translate.attach_of(cmd), wakeup=conn)
        conn.role, conn.consumer, conn.compact = "consume", consumer, cmd.compact
        conn.core.heartbeat_s = cmd.heartbeat_ms / 1000
        conn.queue(
            wire.control(
                protocol.Welcome(consumer.consumer_id, consumer.lease_s, consumer.destination)
            )
        )
        log.info(
            "consumer %d attached to %s over the wire", consumer.consumer_id, consumer.destination
        )
        self.mark(conn)

    def _consumer_frame(self, conn: WireConn, frame: protocol.Frame) -> None:
        assert conn.consumer is not None
        match frame:
            case protocol.Settle():
                self._session(conn).settle(
                    conn.consumer, translate.settle_of(frame), self.turn.inline
                )
            case protocol.Bye():
                conn.bye = True  # answer what came before, then hang up
                self.mark(conn)
            case _:
                raise ProtocolError("consumers send settle and bye frames only", fault="remote")

    # -- writing -----------------------------------------------------------------------------
    def _serve_dirty(self) -> None:
        """Write what is waiting: first the deliveries the turn's commits made possible, then,
        once their futures resolve, the answers to producers and acks. Resolved first, their
        callbacks (a producer's answer encoded, its dedup entries rewritten, an ack's reply)
        ran between the sync and the consumer's message, for answers written after it anyway."""
        while True:
            while self._dirty:
                # each connection once a round; one marked again while served (its backlog's
                # commit answered it) comes round again
                due = dict.fromkeys(self._dirty.popleft() for _ in range(len(self._dirty)))
                for conn in due:
                    if conn.state is ConnState.CLOSED:
                        continue
                    try:
                        self._serve(conn)
                    except Exception:
                        log.exception("wire: error serving %s", conn.peer)
                        self._close(conn)
            if not self.turn.unresolved:
                return
            self.turn.resolve()  # answers queue up, their connections are marked

    def _serve(self, conn: WireConn) -> None:
        core = conn.core
        revoked = core.revocation()
        if revoked is not None:
            self._refuse(conn, revoked)
            return
        if core.state is ConnState.LOGGING_IN and core.login is not None and core.login.done():
            outcome = core.login_outcome()
            if isinstance(outcome, SparkMQError):  # said at once, not at the next frame
                self._refuse(conn, outcome)
                return
        if conn.waiting_on is not None and conn.waiting_on.done():
            conn.waiting_on = None
            core.done_waiting()  # the loop reads its backlog and its socket again
        while conn.answers:
            conn.queue(conn.answers.popleft())
            conn.answered += 1
        consumer = conn.consumer
        if consumer is not None:
            if not conn.bye and not self._draining and not core.state.ended:
                # deliveries before the replies to settles: the client reads them first, and an
                # ack's answer can wait better than a message (at 1,000 msg/s a reply was ahead
                # of half the deliveries, ~0.04 ms each in the broker and the client, measured)
                def deliver(messages: Messages, state: list[DeliveryState]) -> None:
                    for part in self._delivery_parts(conn, messages, state):
                        conn.queue(part)

                if pump(consumer, deliver):
                    self._write(conn)  # on their way before the replies are even encoded
                    if conn.state is ConnState.CLOSED:  # the client went away
                        return
            for reply in consumer.replies():
                conn.queue(wire.control(translate.reply_frame(reply)))
            if consumer.closed and consumer.ended_by is not None:  # (moved to another member)
                self._refuse(conn, consumer.ended_by)
                return
            if conn.bye and not consumer.unanswered:
                core.closing()
        waiting = conn.backlog or (conn.reader.one_at_a_time and conn.reader.buffered)
        if waiting and (core.state is _SERVING or core.state is ConnState.OPENING):
            # frames that waited behind a parked produce, or a login (those a connection not yet
            # known sent after its first are still in the reader: _handle_backlog cuts them)
            with self.turn.running():
                try:
                    self._handle_backlog(conn)
                except SparkMQError as exc:
                    self._refuse(conn, exc)
        self._write(conn)

    @staticmethod
    def _delivery_parts(
        conn: WireConn, messages: Messages, state: list[DeliveryState]
    ) -> list[Any]:
        """Leased messages as frames: a ONE frame each when the consumer takes them and the
        delivery is of plain messages (or of one message), else batches. Measured warm, for a
        1 KiB message: 6.8 us to write the frame against 10.8 for the batch, and the consumer
        reads it in 1.1 us against 11.5."""
        if conn.compact:
            if (plain := messages.plain) is not None:
                parts = []
                for message, (count, _) in zip(plain, state, strict=True):
                    parts += wire.plain_one_parts(message, count)
                return parts
            if (one := wire.one_parts(messages.table(), state)) is not None:
                return one
        table = delivery_table(messages, state)
        return [part for batch in table.to_batches() for part in wire.batch_parts(0, batch)]

    def _write(self, conn: WireConn) -> None:
        state = conn.state
        if state is ConnState.CLOSED:
            return
        while conn.out:
            try:
                if conn.tls:  # (an SSL socket has no sendmsg: a buffer at a time)
                    if not conn.retrying_write:
                        coalesce(conn.out)
                    conn.retrying_write = True
                    sent = conn.sock.send(conn.out[0])
                    conn.retrying_write = False
                else:
                    sent = conn.sock.sendmsg(list(conn.out)[:512])
            except (BlockingIOError, InterruptedError, ssl.SSLWantReadError, ssl.SSLWantWriteError):
                break
            except OSError as exc:
                if exc.errno not in (errno.EPIPE, errno.ECONNRESET):
                    log.info("wire: writing to %s failed: %s", conn.peer, exc)
                self._close(conn)
                return
            conn.unsent -= sent
            conn.core.writes += 1
            while conn.out and sent >= len(conn.out[0]):
                sent -= len(conn.out.popleft())
            if sent:
                conn.out[0] = conn.out[0][sent:]
        if state is ConnState.CLOSING and not conn.out:
            self._close(conn)
            return
        if state is ConnState.REFUSED and not conn.out:
            with contextlib.suppress(OSError):
                conn.sock.shutdown(socket.SHUT_WR)
        self._interest(conn)

    def _close(self, conn: WireConn) -> None:
        if conn.state is ConnState.CLOSED:
            return
        if conn.events:
            with contextlib.suppress(KeyError, ValueError, OSError):
                self._sel.unregister(conn.sock)
            conn.events = 0
        try:
            # (its session closes before the hang-up: a client seeing the end may rely on it)
            conn.core.closed()  # its consumer is detached: what it held goes back
            if conn.consumer is not None:
                log.info("consumer %d detached", conn.consumer.consumer_id)
        finally:
            with contextlib.suppress(OSError):
                conn.sock.close()
            self._conns.discard(conn)  # (last: counted as open until it is closed)
