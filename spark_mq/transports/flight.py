"""The broker's Arrow Flight service: the only place that speaks to sockets.

* ``do_put``: one reader loop submits batches to the broker; an acker thread answers each one
  in order once it is durable, so a producer can pipeline many batches on one stream.
* ``do_exchange``: one loop writes deliveries and replies for a consumer session while a reader
  thread hands its settle frames to the session.
* ``do_action``: admin operations, JSON in and out.

Errors leave as ``FlightServerError`` whose ``extra_info`` is :func:`spark_mq.errors.to_wire`.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import logging
import threading
import time
from collections.abc import Iterator
from concurrent.futures import Future
from typing import Any

import pyarrow as pa
import pyarrow.flight as fl

from spark_mq import commands, protocol, wire
from spark_mq.arrow_checks import checked
from spark_mq.connection.gateway import Gateway
from spark_mq.connection.listener import pump
from spark_mq.connection.produce_order import ProduceOrder
from spark_mq.deliveries import delivery_table
from spark_mq.errors import NotAuthenticated, ProtocolError, SparkMQError, to_wire
from spark_mq.messages import Messages
from spark_mq.protocol import Bye, Consume, Produce, PutFailed, Settle
from spark_mq.schema import DELIVERY_SCHEMA
from spark_mq.session import ClientSession
from spark_mq.transports import flight_auth, translate
from spark_mq.transports.answers import put_answer

log = logging.getLogger(__name__)

_IDLE_WAKE_S = 0.5  # a consumer loop re-checks that its stream is alive this often
_BYE_WAIT_S = 30.0  # how long a leaving consumer's unanswered settles may keep its stream open


def _flight_error(err: SparkMQError) -> fl.FlightServerError:
    return fl.FlightServerError(  # type: ignore[call-arg]  # (extra_info: the stubs lack it)
        err.message, extra_info=to_wire(err)
    )


def _command(descriptor: fl.FlightDescriptor) -> protocol.Frame:
    if descriptor.descriptor_type != fl.DescriptorType.CMD:
        raise ProtocolError("expected a command descriptor", fault="remote")
    return protocol.parse(descriptor.command)


class FlightService(fl.FlightServerBase):
    name = "flight"

    def __init__(
        self,
        gateway: Gateway,
        location: str,
        *,
        wire_port: int | None = None,
        wire_local: str | None = None,
        **kwargs: Any,
    ) -> None:
        self.gateway = gateway
        tls = gateway.tls
        if tls is not None:
            kwargs.update(tls.flight_options())
        middleware: dict[str, fl.ServerMiddlewareFactory] = {
            flight_auth.KEY: flight_auth.CredentialsFactory()
        }
        super().__init__(location, middleware=middleware, **kwargs)
        self.wire_port = wire_port
        self.wire_local = wire_local
        # the calls under way (what a shutdown says it waits for) and the streams to tell
        self._calls_lock = threading.Lock()
        self._calls: dict[int, str] = {}
        self._call_ids = itertools.count()
        self._produce_streams: set[_InOrderAcks] = set()
        self._stopping = threading.Event()
        self._stop_deadline = float("inf")  # time.monotonic() when streams stop waiting

    @contextlib.contextmanager
    def _call(self, what: str) -> Iterator[None]:
        call = next(self._call_ids)
        with self._calls_lock:
            self._calls[call] = what
        try:
            yield
        finally:
            with self._calls_lock:
                del self._calls[call]

    def calls(self) -> list[str]:
        """The calls under way, described (a shutdown logs what it waits for)."""
        with self._calls_lock:
            return list(self._calls.values())

    # -- the Listener protocol (spark_mq.connection.listener) ---------------------------------
    def connection_count(self) -> int:
        """Calls under way (gRPC has no connections of its own to count)."""
        return len(self.calls())

    def waiting_for(self) -> str:
        calls = self.calls()
        return f"{len(calls)} Flight call(s): " + "; ".join(calls) if calls else ""

    def stop(self, deadline: float | None = None) -> list[str]:
        """Stop taking calls and wait for those under way to end, until ``deadline`` (half a
        second past it: a call that just ended); the calls still open then, described, are
        left to the process's end (their clients never ended them)."""
        stopping = threading.Thread(target=self.shutdown, name="flight-stop", daemon=True)
        stopping.start()
        left = None if deadline is None else max(deadline - time.monotonic(), 0.0) + 0.5
        stopping.join(left)
        return self.calls() if stopping.is_alive() else []

    def begin_stop(self, deadline: float) -> None:
        """Shutting down: consumer streams stop delivering and tell their clients (Closing),
        produce streams tell theirs once every batch is answered; each ends once its client has
        ended its side, or at ``deadline`` (``time.monotonic()``)."""
        self._stop_deadline = deadline
        self._stopping.set()
        with self._calls_lock:
            streams = list(self._produce_streams)
        for acks in streams:
            acks.closing()

    # -- admin -------------------------------------------------------------------------------
    def list_actions(  # type: ignore[override]  # (pyarrow takes (name, description) pairs)
        self, context: fl.ServerCallContext
    ) -> list[tuple[str, str]]:
        with _answering("list actions"):
            if not self._certified_port_map(context):
                self._session(context)  # (authenticated, as every call)
        return [(name, f"sparkmq admin: {name}") for name in protocol.ADMIN_ACTIONS]

    # -- what Flight has and sparkmq does not serve: a plain refusal, never a traceback (the
    # middleware refuses GetSchema: pyarrow answers any error raised in its handler with a
    # Python traceback, see flight_auth) -----------------------------------------------------
    def list_flights(  # type: ignore[override]  # (criteria come as bytes, not str)
        self, context: fl.ServerCallContext, criteria: bytes
    ) -> Iterator[Any]:
        self._not_served(context, "ListFlights")
        return iter(())

    def get_flight_info(
        self, context: fl.ServerCallContext, descriptor: fl.FlightDescriptor
    ) -> fl.FlightInfo:
        self._not_served(context, "GetFlightInfo")
        raise AssertionError  # (unreachable: _not_served raises)

    def _not_served(self, context: fl.ServerCallContext, call: str) -> None:
        with _answering(call):
            self._session(context)  # who asks is checked first, as for every call
            raise ProtocolError(
                f"sparkmq does not serve Flight's {call}: destinations are listed by the "
                "list_destinations action, read by DoGet (browse), produced to by DoPut and "
                "consumed by DoExchange",
                fault="remote",
            )

    def _session(self, context: fl.ServerCallContext) -> ClientSession:
        """The session a call runs in, for the principal the call authenticated as."""
        peer = context.peer()
        creds = flight_auth.presented(context)
        if self._certified_port_map(context):
            raise NotAuthenticated(
                "over Flight a client certificate does not say who you are (gRPC verified it, "
                "but cannot tell the broker whose it is): log in with a user name and password "
                "or a token, or use the direct wire (transport='wire'), where it identifies you"
            )
        principal = self.gateway.login_now(creds, peer=peer, transport="flight")
        return self.gateway.session(principal, peer=peer, transport="flight")

    def _certified_port_map(self, context: fl.ServerCallContext) -> bool:
        """A ping without credentials under mutual TLS: answered with where the direct wire is
        (the seeds' port mapper) and nothing else. Every caller has a certificate gRPC verified,
        but Flight cannot say whose, so a client that has only its certificate finds the wire
        this way and is identified there."""
        tls = self.gateway.tls
        return (
            self.gateway.security_on
            and tls is not None
            and tls.mutual
            and flight_auth.presented(context).empty
        )

    def do_action(self, context: fl.ServerCallContext, action: fl.Action) -> Iterator[bytes]:
        # (an action's type is a protobuf string: gRPC refuses one that is not UTF-8 itself)
        with self._call(f"action {action.type}"), _answering("action"):
            cmd = translate.action_command(action.type, action.body.to_pybytes())
            if isinstance(cmd, commands.Ping) and self._certified_port_map(context):
                result: Any = {}  # (who asks is not known: where the wire is, and no more)
            else:
                result = self._session(context).execute(cmd)
            if isinstance(cmd, commands.Ping):  # also how clients find the direct wire
                answer: Any = {
                    "ok": True,
                    "wire_port": self.wire_port,
                    "wire_local": self.wire_local,
                    "wire_version": wire.VERSION,
                    **result,  # (the broker's role and epoch)
                }
            else:
                answer = translate.action_answer(cmd, result)
        yield json.dumps(answer).encode()

    # -- browse ------------------------------------------------------------------------------
    def do_get(self, context: fl.ServerCallContext, ticket: fl.Ticket) -> fl.RecordBatchStream:
        with self._call("a browse"), _answering("browse"):
            cmd = translate.ticket_command(protocol.parse(ticket.ticket))
            table = self._session(context).execute(cmd)
        return fl.RecordBatchStream(table)

    # -- produce -----------------------------------------------------------------------------
    def do_put(
        self,
        context: fl.ServerCallContext,
        descriptor: fl.FlightDescriptor,
        reader: fl.MetadataRecordBatchReader,
        writer: fl.FlightMetadataWriter,
    ) -> None:
        with _answering("produce"):
            cmd = _command(descriptor)
            if not isinstance(cmd, Produce):
                raise ProtocolError("do_put expects a produce command", fault="remote")
            session = self._session(context)
            session.open_producer(cmd.destination)
        acks = _InOrderAcks(writer, heartbeat_s=cmd.heartbeat_ms / 1000)
        # (answered below in order, then the session closes: the producer's lifecycle)
        with (
            self._call(f"a producer to {cmd.destination} ({context.peer()})"),
            _answering("produce"),
            contextlib.ExitStack() as answered,
        ):
            with self._calls_lock:
                self._produce_streams.add(acks)
            if self._stopping.is_set():
                acks.closing()
            answered.callback(session.close)
            answered.callback(self._produce_streams.discard, acks)
            answered.callback(acks.drain)  # what came before an error is answered first
            order = ProduceOrder()  # once a batch is refused for a move, the rest are too
            for chunk in _chunks(reader, "produce stream"):
                if session.revoked is not None:  # (its user's login no longer holds)
                    raise NotAuthenticated(session.revoked)
                if chunk.data is None:
                    continue
                try:
                    batch = checked(chunk.data, f"batch {acks.next_seq}")
                    order.check()
                    produced = session.produce(cmd.destination, Messages.of(batch))
                    # (refused for a move through its future: the later ones are too)
                    produced.add_done_callback(order.refused_through)
                    result: Future | SparkMQError = produced
                except SparkMQError as exc:
                    order.refused(exc)
                    result = exc
                acks.add(result)

    # -- consume -----------------------------------------------------------------------------
    def do_exchange(
        self,
        context: fl.ServerCallContext,
        descriptor: fl.FlightDescriptor,
        reader: fl.MetadataRecordBatchReader,
        writer: fl.MetadataRecordBatchWriter,
    ) -> None:
        with self._call(f"a consumer ({context.peer()})"):
            self._exchange(context, descriptor, reader, writer)

    def _exchange(
        self,
        context: fl.ServerCallContext,
        descriptor: fl.FlightDescriptor,
        reader: fl.MetadataRecordBatchReader,
        writer: fl.MetadataRecordBatchWriter,
    ) -> None:
        with _answering("consume"):
            cmd = _command(descriptor)
            if not isinstance(cmd, Consume):
                raise ProtocolError("do_exchange expects a consume command", fault="remote")
            wakeup = threading.Event()  # set when the consumer has something to send
            session = self._session(context)
            consumer = session.attach(translate.attach_of(cmd), wakeup)
        log.info(
            "consumer %d attached to %s%s",
            consumer.consumer_id,
            consumer.destination,
            f" subscription {cmd.subscription}" if cmd.subscription else "",
        )
        done = threading.Event()
        said_bye = threading.Event()
        problem: list[SparkMQError] = []

        def read_settles() -> None:
            try:
                for chunk in _chunks(reader, "consumer stream"):
                    frame = protocol.parse(
                        chunk.app_metadata.to_pybytes() if chunk.app_metadata else b""
                    )
                    if isinstance(frame, Bye):
                        said_bye.set()  # answered below, then the stream ends
                        break
                    if not isinstance(frame, Settle):
                        raise ProtocolError(
                            "consumers may only send settle and bye frames", fault="remote"
                        )
                    session.settle(consumer, translate.settle_of(frame))
            except SparkMQError as exc:
                problem.append(exc)
            except fl.FlightError:
                pass  # the client went away; the loop below notices
            except Exception as exc:  # a bug of ours: said, and the stream ends
                log.exception("serving consumer %d failed", consumer.consumer_id)
                problem.append(SparkMQError(f"internal error: {type(exc).__name__}: {exc}"))
            finally:
                done.set()
                wakeup.set()

        threading.Thread(target=read_settles, name="consumer-reader", daemon=True).start()
        try:
            writer.begin(DELIVERY_SCHEMA)
            writer.write_metadata(
                pa.py_buffer(
                    protocol.encode(
                        protocol.Welcome(
                            consumer.consumer_id,
                            consumer.lease_s,
                            consumer.destination,
                        )
                    )
                )
            )
            stopping = self._stopping
            heartbeat_s = cmd.heartbeat_ms / 1000  # (0: the client asked for none)
            wrote_at = time.monotonic()
            while (
                not done.is_set()
                and not consumer.closed
                and not context.is_cancelled()
                and not stopping.is_set()
                and session.revoked is None
            ):
                wakeup.wait(min(_IDLE_WAKE_S, heartbeat_s / 2) if heartbeat_s else _IDLE_WAKE_S)
                wakeup.clear()
                wrote = False
                for reply in consumer.replies():
                    writer.write_metadata(_reply(reply))
                    wrote = True
                if pump(
                    consumer,
                    lambda messages, state: writer.write_table(delivery_table(messages, state)),
                ):
                    wrote = True
                now = time.monotonic()
                if wrote:
                    wrote_at = now
                elif heartbeat_s and now - wrote_at >= heartbeat_s:
                    writer.write_metadata(_HEARTBEAT)
                    wrote_at = now
            deadline = time.monotonic() + _BYE_WAIT_S
            if stopping.is_set() and not done.is_set():
                # the client says bye once told (answered below, as any bye); a client that
                # does not is not waited for past the shutdown's deadline
                writer.write_metadata(pa.py_buffer(protocol.encode(protocol.Closing())))
                deadline = self._stop_deadline
                while not done.wait(_IDLE_WAKE_S) and time.monotonic() < deadline:
                    for reply in consumer.replies():
                        writer.write_metadata(_reply(reply))
            # a leaving consumer still listens: its last acks are answered once durable
            while said_bye.is_set() and consumer.unanswered and time.monotonic() < deadline:
                for reply in consumer.replies():
                    writer.write_metadata(_reply(reply))
                wakeup.wait(_IDLE_WAKE_S)
                wakeup.clear()
            for reply in consumer.replies():
                writer.write_metadata(_reply(reply))
        except fl.FlightError:
            pass  # the client went away
        finally:
            session.close()  # the consumer is detached: what it held goes back
            log.info("consumer %d detached", consumer.consumer_id)
        if session.revoked is not None:
            raise _flight_error(NotAuthenticated(session.revoked))
        if consumer.ended_by is not None:  # (its destination moved to another cluster member)
            raise _flight_error(consumer.ended_by)
        if problem:
            raise _flight_error(problem[0])


_HEARTBEAT = pa.py_buffer(protocol.HEARTBEAT)


def _reply(reply: commands.SettleReply) -> pa.Buffer:
    return pa.py_buffer(protocol.encode(translate.reply_frame(reply)))


@contextlib.contextmanager
def _answering(what: str) -> Iterator[None]:
    """Errors leave a Flight call as ``FlightServerError`` carrying sparkmq's code and message
    (:func:`spark_mq.errors.to_wire`), never as gRPC's UNKNOWN with no detail: the client's
    own errors as they are, anything else as an internal error, logged with its traceback."""
    try:
        yield
    except SparkMQError as exc:
        raise _flight_error(exc) from None
    except fl.FlightError:
        raise
    except Exception as exc:
        log.exception("%s failed", what)
        err = SparkMQError(f"internal error in {what}: {type(exc).__name__}: {exc}")
        raise _flight_error(err) from None


def _chunks(reader: fl.MetadataRecordBatchReader, what: str) -> Iterator[fl.FlightStreamChunk]:
    """The chunks a client sends; one Arrow cannot read (a malformed IPC message) is a
    ``ProtocolError``, and the stream ends with it."""
    while True:
        try:
            chunk = reader.read_chunk()
        except StopIteration:
            return
        except fl.FlightError:
            raise
        except (pa.ArrowException, ValueError, OSError) as exc:
            raise ProtocolError(
                f"the {what} sent what is not Arrow data: {exc}", fault="remote"
            ) from None
        yield chunk


class _InOrderAcks:
    """Answers a produce stream's batches in the order they came, as soon as each is durable.

    The thread completing a batch's future (the journal writer) only files the answer; a
    sender thread per stream writes it to the socket. A write to a slow or far client can block,
    and the writer must not wait on it: every destination's commits go through that one thread.
    At most ``window`` batches wait, which bounds a stream's memory. With ``heartbeat_s``
    (the producer asked for them), a heartbeat goes out whenever batches wait for their answers
    and nothing was written for that long.
    """

    def __init__(
        self, writer: fl.FlightMetadataWriter, window: int = 64, *, heartbeat_s: float = 0.0
    ) -> None:
        self._writer = writer
        self._heartbeat_s = heartbeat_s
        self._wrote_at = time.monotonic()
        self._cond = threading.Condition()
        self._window = window
        self._next_seq = 0  # the next batch's number
        self._next_ack = 0  # the first batch not answered yet
        self._sent = 0  # answers written (or dropped because the producer went away)
        self._done: dict[int, protocol.Frame] = {}
        self._outgoing: list[protocol.Frame] = []
        self._broken = False
        self._stopping = False
        self._closing = False  # say Closing once every batch so far is answered
        self._said_closing = False
        self._sender = threading.Thread(target=self._send_loop, name="produce-acks", daemon=True)
        self._sender.start()

    @property
    def next_seq(self) -> int:
        """The number the next batch of the stream gets (its place in the stream, from 0)."""
        return self._next_seq

    def add(self, result: Future | SparkMQError) -> None:
        with self._cond:
            while self._next_seq - self._next_ack >= self._window and not self._broken:
                self._cond.wait()
            seq = self._next_seq
            self._next_seq += 1
        if isinstance(result, SparkMQError):
            self._complete(seq, PutFailed(seq, json.loads(to_wire(result))))
        else:
            result.add_done_callback(lambda f: self._complete(seq, put_answer(seq, f)))

    def _complete(self, seq: int, frame: protocol.Frame) -> None:
        with self._cond:
            self._done[seq] = frame
            while (due := self._done.pop(self._next_ack, None)) is not None:
                self._outgoing.append(due)  # in order: one sender writes them in turn
                self._next_ack += 1
            self._cond.notify_all()

    def closing(self) -> None:
        """The broker is shutting down: once every batch taken so far is answered, tell the
        client (:class:`~spark_mq.protocol.Closing`), which then ends its side of the stream."""
        with self._cond:
            self._closing = True
            self._cond.notify_all()

    def _due_closing(self) -> bool:
        """Whether to say Closing now (caller holds the lock)."""
        return (
            self._closing
            and not self._said_closing
            and self._next_ack == self._next_seq
            and not self._outgoing
        )

    def _heartbeat_due(self) -> bool:
        """Whether to write a heartbeat now (caller holds the lock). Also while no batch is
        known to wait: one may be held up in a produce that waits for room, before it counts
        here (a Flight producer reads its answer stream all the time: nothing piles up)."""
        return self._heartbeat_s > 0 and time.monotonic() - self._wrote_at >= self._heartbeat_s

    def _send_loop(self) -> None:
        hb = self._heartbeat_s
        while True:
            with self._cond:
                while not self._outgoing and not self._stopping and not self._due_closing():
                    if self._heartbeat_due():
                        self._outgoing.append(protocol.Heartbeat())
                        break
                    self._cond.wait(hb / 2 if hb else None)
                if self._due_closing():
                    self._said_closing = True
                    self._outgoing.append(protocol.Closing())
                if not self._outgoing:
                    return
                frames, self._outgoing = self._outgoing, []
                broken = self._broken
            for frame in frames:
                if broken:
                    break
                try:
                    self._writer.write(pa.py_buffer(protocol.encode(frame)))
                except fl.FlightError:
                    broken = True  # the producer went away; it resends what it lacks
            with self._cond:
                self._wrote_at = time.monotonic()
                self._broken = self._broken or broken
                self._sent += sum(
                    not isinstance(f, protocol.Closing | protocol.Heartbeat) for f in frames
                )
                self._cond.notify_all()

    def drain(self) -> None:
        """Wait until every batch is answered (the stream closes when do_put returns)."""
        with self._cond:
            while self._sent < self._next_seq:
                self._cond.wait()
            self._stopping = True
            self._cond.notify_all()
        self._sender.join()
