"""One Kafka connection's I/O: size-prefixed frames in, decoded by the codec
(:mod:`~spark_mq.transports.kafka.codec`), handed in order to its
:class:`~spark_mq.transports.kafka.requests.KafkaRequests` (what they mean); responses written
back **in the order the requests came**, as Kafka requires, whenever each is ready (a produce
once durable, a fetch once it has data or its wait is over); ApiVersions, the SASL exchange and
closing are handled here.

Before it has logged in a connection may send only ApiVersions, SaslHandshake and
SaslAuthenticate, in frames of at most 64 KiB (with security on); any other request logs it in
with what it has: its TLS client certificate, or nothing (refused with security on). A request
this listener cannot read, an API it does not serve past ApiVersions' answer, or a login that
fails closes the connection, as Kafka's brokers do (a client cannot parse an answer to a request
it framed wrongly); the broker's log says why. A client that does not read is not read either
until what waits for it has gone out.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future
from datetime import timedelta
from typing import Any, Protocol

from spark_mq.config import BrokerSection
from spark_mq.connection.core import Beat, Close, ConnState, Refuse
from spark_mq.connection.gateway import Gateway
from spark_mq.connection.listener import ListenerCore, Turn
from spark_mq.connection.loop_connection import LoopConnection
from spark_mq.errors import NotAuthenticated, SparkMQError
from spark_mq.security.scram import MECHANISM as SCRAM_MECHANISM
from spark_mq.security.scram import ScramLogin
from spark_mq.session import Principal
from spark_mq.transports.kafka import codec
from spark_mq.transports.kafka.codec import ErrorCode, KafkaProtocolError, Request, build
from spark_mq.transports.kafka.groups import Coordinator
from spark_mq.transports.kafka.nodes import Nodes
from spark_mq.transports.kafka.requests import KafkaRequests
from spark_mq.transports.kafka.sequences import Sequences
from spark_mq.transports.kafka.share import ShareGroups
from spark_mq.transports.kafka.transactions import ProducerTransactions

log = logging.getLogger(__name__)

PRELOGIN_FRAME_BYTES = 64 * 1024  # before a login: ApiVersions and SASL frames only
_BACKLOG = 64  # requests read ahead of their answers (librdkafka sends at most 5 at once)
_MECHANISMS = ("PLAIN", "OAUTHBEARER", SCRAM_MECHANISM)
_BEFORE_LOGIN = (codec.API_VERSIONS, codec.SASL_HANDSHAKE, codec.SASL_AUTHENTICATE)
_ZERO = timedelta(0)


class KafkaHost(Protocol):
    """What a connection asks of the listener that accepted it
    (:class:`~spark_mq.transports.kafka.server.KafkaServer`)."""

    gateway: Gateway
    core: ListenerCore
    turn: Turn
    settings: BrokerSection
    conns: set[KafkaConnection]
    draining: bool
    loop: asyncio.AbstractEventLoop
    loop_thread: int

    @property
    def advertised(self) -> tuple[str, int]: ...

    nodes: Nodes
    groups: Coordinator
    share_groups: ShareGroups
    sequences: Sequences
    transactions: ProducerTransactions

    def committed(self) -> None: ...


class Slot:
    """A request's place in the line of answers: its response's bytes once ready (``b""``:
    none is sent, a Produce with ``acks=0``)."""

    __slots__ = ("data", "request")

    def __init__(self, request: Request) -> None:
        self.request = request
        self.data: bytes | None = None


class KafkaConnection(LoopConnection):
    server: KafkaHost

    def __init__(self, server: KafkaHost) -> None:
        super().__init__(server, "kafka", first="ApiVersions or SASL request")
        self.buffer = bytearray()
        self.frames: deque[bytes] = deque()
        self.slots: deque[Slot] = deque()
        self.requests: KafkaRequests | None = None  # once it has a session
        self.mechanism: str | None = None  # the SASL mechanism its handshake chose
        self.scram: ScramLogin | None = None  # a SCRAM exchange past its first message
        self._wake_due = False
        self.max_frame = server.settings.kafka_max_request_bytes

    # -- what the connection core leaves to Kafka ---------------------------------------------
    def ended(self) -> None:
        if self.requests is not None:
            self.requests.close()

    def backlogged(self) -> bool:
        return len(self.frames) >= _BACKLOG

    def received(self, data: bytes) -> None:
        self.buffer += data
        if not self._cut():
            return
        self._process()

    # -- frames ------------------------------------------------------------------------------
    def _cut(self) -> bool:
        """Whole frames out of the buffer (False: the connection was closed)."""
        buf = self.buffer
        # (with security off nothing is proved: every frame may be a request's full size)
        known = self.requests is not None or not self.server.gateway.security_on
        limit = self.max_frame if known else PRELOGIN_FRAME_BYTES
        at = 0
        while len(buf) - at >= 4:
            size = codec.SIZE.unpack_from(buf, at)[0]
            if size < 0 or size > limit:
                self.close(
                    f"a request of {size} bytes; this listener takes at most {limit}"
                    + (" (broker.kafka_max_request_bytes)" if known else " before a login")
                )
                return False
            if len(buf) - at - 4 < size:
                self.core.frame_started = self.core.frame_started or time.monotonic()
                self.core.frame_size = size
                break
            self.frames.append(bytes(buf[at + 4 : at + 4 + size]))
            at += 4 + size
            self.core.frame_started = None
        if at:
            del buf[:at]
        return True

    def _process(self) -> None:
        core = self.core
        with self.server.turn.running():  # what the requests submit: one sync, on the loop
            while self.frames:
                state = core.state
                if state.ended or state is ConnState.CLOSING:
                    self.frames.clear()
                    break
                if state is ConnState.LOGGING_IN or state is ConnState.WAITING:
                    break
                if len(self.slots) >= _BACKLOG:
                    break
                if not self._handled(self._request, self.frames.popleft()):
                    return
        self.server.committed()
        self.update_reading()

    def _handled(self, fn: Callable[..., None], *args: Any) -> bool:
        """Run ``fn`` (a request's handling, at once or once what it waited for is done);
        False when it failed and the connection is closed for it (a request that cannot be
        served: the client is told nothing, as Kafka's brokers do; a defect of ours: this
        client goes, the others stay)."""
        try:
            fn(*args)
        except KafkaProtocolError as exc:
            self.close(str(exc))
            return False
        except Exception:
            log.exception("kafka: a request of %s failed", self.peer)
            self.close("the broker failed to handle a request (see the log)")
            return False
        return True

    def _request(self, frame: bytes) -> None:
        key, version, correlation = codec.peek_header(frame)
        if key == codec.API_VERSIONS:
            return self._api_versions(frame, key, version, correlation)
        if not codec.served(key, version):
            raise KafkaProtocolError(
                f"{codec.api_name(key)} v{version} is not served here (ApiVersions lists what "
                "is): the client should not have sent it"
            )
        request = codec.decode_request(frame)
        if self.requests is None:
            if key == codec.SASL_HANDSHAKE:
                return self._sasl_handshake(request)
            if key == codec.SASL_AUTHENTICATE:
                return self._sasl_authenticate(request)
            if self.mechanism is not None:
                raise KafkaProtocolError(
                    f"a {codec.api_name(key)} request in the middle of a SASL exchange"
                )
            # no SASL: its certificate, or nothing (with security on: refused)
            self.server.core.log_in(self.core, None, None, None)
            self.frames.appendleft(frame)
            assert self.core.login is not None
            self.awaiting(self.core.login, self._logged_in, on_error=self._login_failed)
            return
        if key in _BEFORE_LOGIN and key != codec.API_VERSIONS:
            raise KafkaProtocolError(f"{codec.api_name(key)} after the connection logged in")
        self.requests.handle(request, self.slot(request))

    def slot(self, request: Request) -> Slot:
        slot = Slot(request)
        self.slots.append(slot)
        return slot

    # -- before a session: ApiVersions and SASL ----------------------------------------------
    def _api_versions(self, frame: bytes, key: int, version: int, correlation: int) -> None:
        # a version too new for us: answered in v0 with UNSUPPORTED_VERSION and our versions
        # (KIP-511), which the client reads whatever it sent
        known = codec.served(key, version)
        if known:
            request = codec.decode_request(frame)
        else:
            request = Request(key, 0, correlation, None, None, 0)
        mod = codec.response_module(key, request.version)
        keys = tuple(
            build(mod, "ApiVersion", api_key=k, min_version=lo, max_version=hi)
            for k, (lo, hi) in sorted(codec.SERVED.items())
        )
        response = build(
            mod,
            "ApiVersionsResponse",
            error_code=ErrorCode.none if known else ErrorCode.unsupported_version,
            api_keys=keys,
            throttle_time=_ZERO,
        )
        self.answer(self.slot(request), response)

    def _sasl_handshake(self, request: Request) -> None:
        mechanism = request.body.mechanism
        ok = mechanism in _MECHANISMS
        mod = codec.response_module(request.api_key, request.version)
        response = build(
            mod,
            "SaslHandshakeResponse",
            error_code=ErrorCode.none if ok else ErrorCode.unsupported_sasl_mechanism,
            mechanisms=_MECHANISMS,
        )
        self.answer(self.slot(request), response)
        if ok:
            self.mechanism = mechanism
        else:
            log.info("kafka: %s asked for SASL mechanism %r", self.peer, mechanism)

    def _sasl_authenticate(self, request: Request) -> None:
        slot = self.slot(request)
        data = bytes(request.body.auth_bytes)
        if self.mechanism == SCRAM_MECHANISM:
            if self.scram is None:  # its first message: the salt and iterations to answer
                self.scram = self.server.core.scram_login()
                try:
                    self._sasl_answer(slot, None, self.scram.first(data))
                except NotAuthenticated as exc:
                    self._sasl_answer(slot, exc.message)
                    self._refuse()
                return
            # its proof: checked as every login is (the host's penalty, the audit)
            self.scram.prove(data)
            self.server.core.log_in_scram(self.core, self.scram)
        else:
            try:
                user, password, token = _sasl_credentials(self.mechanism, data)
            except ValueError as exc:
                self._sasl_answer(slot, str(exc))
                self._refuse()
                return
            self.server.core.log_in(self.core, user, password, token)
        assert self.core.login is not None

        def failed(exc: BaseException) -> None:
            message = exc.message if isinstance(exc, SparkMQError) else str(exc)
            self._sasl_answer(slot, message or "authentication failed")
            self._refuse()

        def done(principal: Principal) -> None:
            final = b""
            if self.scram is not None:  # the broker proves it knows the password too
                if self.scram.server_final is None:  # (security off: not checked yet)
                    try:
                        self.scram.verify()
                    except NotAuthenticated as exc:
                        return failed(exc)
                final = self.scram.server_final or b""
            self._logged_in(principal)
            self._sasl_answer(slot, None, final)

        self.awaiting(self.core.login, done, on_error=failed)

    def _sasl_answer(self, slot: Slot, error: str | None, data: bytes = b"") -> None:
        request = slot.request
        mod = codec.response_module(request.api_key, request.version)
        response = build(
            mod,
            "SaslAuthenticateResponse",
            error_code=ErrorCode.none if error is None else ErrorCode.sasl_authentication_failed,
            error_message=error,
            auth_bytes=data,
            session_lifetime=_ZERO,
        )
        self.answer(slot, response)

    def _logged_in(self, principal: Principal) -> None:
        session = self.server.core.open_session(self.core, principal)
        self.requests = KafkaRequests(
            self,
            self.server.core,
            session,
            self.server.groups,
            self.server.share_groups,
            self.server.sequences,
            self.server.transactions,
        )

    def _login_failed(self, exc: BaseException) -> None:
        message = exc.message if isinstance(exc, SparkMQError) else str(exc)
        self.close(
            f"not logged in: {message} (a Kafka client logs in with SASL PLAIN, "
            "SCRAM-SHA-512 or OAUTHBEARER, or a TLS client certificate)"
        )

    # -- waiting, answering, waking ----------------------------------------------------------
    def awaiting(
        self,
        work: Future[Any],
        then: Callable[[Any], None],
        *,
        on_error: Callable[[BaseException], None],
    ) -> None:
        """Wait for ``work`` (a login, a helper thread's): the requests behind it wait."""
        if self.core.state is ConnState.SERVING:
            self.core.waiting()
        self.update_reading()

        def done(fut: asyncio.Future[Any]) -> None:
            self.core.done_waiting()
            if self.core.state.ended:
                return
            exc = fut.exception()
            if exc is not None:
                handled = self._handled(on_error, exc)
            else:
                handled = self._handled(then, fut.result())
            if handled:
                self._process()

        asyncio.wrap_future(work, loop=self.loop).add_done_callback(done)

    def answer(self, slot: Slot, response: Any) -> None:
        """``slot``'s response (None: none is sent); written once those before it are."""
        request = slot.request
        slot.data = (
            b""
            if response is None
            else codec.encode_response(
                request.api_key, request.version, request.correlation_id, response
            )
        )
        self._flush()

    def answer_encoded(self, slot: Slot, frame: bytes) -> None:
        """``slot``'s response, already a frame (:func:`codec.produce_answer`'s)."""
        slot.data = frame
        self._flush()

    def _flush(self) -> None:
        slots = self.slots
        wrote = False
        while slots and slots[0].data is not None:
            data = slots.popleft().data
            if data and self.transport is not None and not self.core.state.ended:
                self.transport.write(data)
                self.core.writes += 1
                wrote = True
        if wrote and self.frames:
            self.threadsafe(self._process)  # (requests held back by the backlog)

    def set(self) -> None:
        """(Any thread.) Its session was revoked, or a login finished."""
        if not self._wake_due:
            self._wake_due = True
            self.threadsafe(self._woken)

    def _woken(self) -> None:
        self._wake_due = False
        revoked = self.core.revocation()
        if revoked is not None:
            self.close(revoked.message)

    @property
    def advertised(self) -> tuple[str, int]:
        """Where Metadata tells clients this broker is."""
        return self.server.advertised

    @property
    def nodes(self) -> Nodes:
        return self.server.nodes

    @property
    def outstanding(self) -> int:
        return len(self.slots)

    def close(self, reason: str) -> None:
        """Close (Kafka has no frame to say why): logged."""
        if self.core.state is ConnState.CLOSED:
            return
        log.info("kafka: closing the connection of %s: %s", self.peer, reason)
        self.core.refuse(time.monotonic())
        self.frames.clear()
        if self.transport is not None:
            self.transport.close()

    def _refuse(self) -> None:
        """Told why (a SASL answer): what still comes is dropped, and it closes a linger on."""
        self.core.refuse(time.monotonic())
        self.frames.clear()

    def sweep(self, now: float) -> None:
        if self.transport is None:
            return
        match self.core.check(now, self.server.core.deadlines):
            case Refuse(error=err):
                self.close(err.message)
            case Close():
                self.transport.close()
            case Beat():
                pass  # (Kafka has no heartbeat on a connection)


def _sasl_credentials(
    mechanism: str | None, data: bytes
) -> tuple[str | None, str | None, str | None]:
    """(user, password, token) of a SASL exchange's client message."""
    if mechanism == "PLAIN":
        parts = data.split(b"\0")
        if len(parts) != 3:
            raise ValueError("a SASL PLAIN message is authzid NUL user NUL password")
        try:
            return parts[1].decode(), parts[2].decode(), None
        except UnicodeDecodeError:
            raise ValueError("SASL PLAIN user and password must be UTF-8") from None
    if mechanism == "OAUTHBEARER":
        # RFC 7628: "n,a=<authzid>,\x01auth=Bearer <token>\x01...\x01\x01"
        for field in data.split(b"\x01"):
            if field.startswith(b"auth="):
                scheme, _, token = field[5:].decode(errors="replace").partition(" ")
                if scheme.lower() == "bearer" and token:
                    return None, None, token.strip()
        raise ValueError("the OAUTHBEARER message carries no 'auth=Bearer <token>'")
    raise ValueError("SaslAuthenticate before a SaslHandshake chose a mechanism")
