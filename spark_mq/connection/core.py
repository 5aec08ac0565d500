"""One connection, whatever its protocol: where it is in its life (one :class:`ConnState`), its
login and session, its deadlines (:meth:`Connection.check`, pure: a transport's sweep calls it
with the time and carries out the verdict), the heartbeats its client asked for, and the end of
a session whose user's login no longer holds. The transport owns the socket and the codec."""

from __future__ import annotations

import enum
import logging
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass

from spark_mq.config import BrokerSection
from spark_mq.errors import NotAuthenticated, ProtocolError, SparkMQError
from spark_mq.security.authenticate import Credentials
from spark_mq.session import ClientSession, Principal

log = logging.getLogger(__name__)

LINGER_S = 2.0  # a refused connection is closed this long after it was told why


class ConnState(enum.Enum):
    """A connection's life. Reading: ``OPENING`` and ``SERVING`` read; ``LOGGING_IN`` and
    ``WAITING`` hold what comes behind (the transport reads ahead at most a little);
    ``REFUSED`` reads and drops; ``CLOSING`` reads nothing more."""

    HANDSHAKING = "handshaking"  # the TLS handshake is under way (it has its own deadline)
    OPENING = "opening"  # connected; it has not said what it does yet (first frame, CONNECT)
    LOGGING_IN = "logging in"  # its login is being checked; its next frames wait
    SERVING = "serving"
    WAITING = "waiting"  # a frame of it waits on a helper thread (a produce that may wait
    # for room, a transaction's commit); the frames behind it wait, so they keep their order
    CLOSING = "closing"  # it said goodbye, or the broker drains: what it sent before is
    # answered, then it closes
    REFUSED = "refused"  # told why (a failure, an ERROR); what it still sends is dropped,
    # and it closes after LINGER_S (closing at once would reset it, losing the reason)
    CLOSED = "closed"

    @property
    def ended(self) -> bool:
        """Told why and going, or gone: nothing more is taken from it."""
        return self in (ConnState.REFUSED, ConnState.CLOSED)


@dataclass(frozen=True)
class Deadlines:
    """A listener's limits in time (``[broker]`` in ``conf/broker.toml``)."""

    handshake_s: float  # to say what it does (and log in), from connecting
    frame_s: float  # a frame once begun, plus a second per MiB of it
    idle_s: float  # nothing in flight this long: closed quietly (0: never)
    linger_s: float = LINGER_S

    @classmethod
    def of(cls, settings: BrokerSection) -> Deadlines:
        return cls(settings.handshake_timeout_s, settings.frame_timeout_s, settings.idle_timeout_s)


@dataclass(frozen=True)
class Refuse:
    """Say why (the protocol's failure frame), then close after the linger."""

    error: SparkMQError


@dataclass(frozen=True)
class Close:
    """Close now (told already, or nothing to tell); ``reason`` for the log, if any."""

    reason: str = ""


@dataclass(frozen=True)
class Beat:
    """Write a heartbeat: the client asked, waits, and heard nothing for its interval."""


Verdict = Refuse | Close | Beat


class Connection:
    """A connection's state beyond its socket and codec. Owned by its transport's loop (one
    thread), but for :meth:`revoked` and the login's completion, which any thread may cause
    and which only set fields and wake the loop (``wake``)."""

    def __init__(
        self,
        peer: str,
        transport: str,
        now: float,
        *,
        first: str,
        wake: Callable[[], None],
        tls: bool = False,
    ) -> None:
        self.peer = peer
        self.transport = transport
        self.first = first  # what it must send first, for the error that says it did not
        self._wake = wake
        self.state = ConnState.HANDSHAKING if tls else ConnState.OPENING
        self.opened = self.last_read = now  # time.monotonic()
        self.refused_at = 0.0
        # a frame being received (the transport says): since when, and its size so far
        self.frame_started: float | None = None
        self.frame_size = 0
        # silence: a client that must be heard from this often (STOMP's heart-beats; 0: none)
        self.silence_s = 0.0
        # heartbeats out (the client asked for them): something goes out at least this often
        # while it waits for something; ``writes`` counts writes (no clock read on the hot
        # path), the check notes when it last saw it change
        self.heartbeat_s = 0.0
        self.writes = 0
        self._writes_seen = 0
        self._quiet_since = now
        # who it is
        self.certificate_name: str | None = None  # a verified client certificate's name
        self.login: Future[Principal] | None = None
        self.session: ClientSession | None = None
        self.revoked: str | None = None  # why its user's login no longer holds (any thread)
        # what the transport says of its in-flight work (set by it; the defaults: nothing)
        self.idle: Callable[[], bool] = lambda: False  # nothing in flight: may be closed
        self.waits: Callable[[], bool] = lambda: False  # waits for something from the broker

    def __repr__(self) -> str:
        return f"Connection({self.transport} {self.peer}, {self.state.value})"

    def wake(self) -> None:
        """(Any thread.) Something for the loop to do for it (a delivery, an answer)."""
        self._wake()

    # -- life --------------------------------------------------------------------------------
    def handshaken(self, certificate_name: str | None) -> None:
        """TLS is established (``certificate_name``: the client certificate TLS verified)."""
        self.certificate_name = certificate_name
        if self.state is ConnState.HANDSHAKING:
            self.state = ConnState.OPENING

    def serving(self) -> None:
        if not self.state.ended and self.state is not ConnState.CLOSING:
            self.state = ConnState.SERVING

    def waiting(self) -> None:
        """A frame of it went to a helper thread: the frames behind it wait."""
        if self.state is ConnState.SERVING:
            self.state = ConnState.WAITING

    def done_waiting(self) -> None:
        if self.state is ConnState.WAITING:
            self.state = ConnState.SERVING

    def closing(self) -> None:
        if not self.state.ended:
            self.state = ConnState.CLOSING

    def refuse(self, now: float) -> bool:
        """It is told why and goes; False when it was told (or closed) already."""
        if self.state.ended:
            return False
        self.state = ConnState.REFUSED
        self.refused_at = now
        return True

    def closed(self) -> bool:
        """It is closed now; False when it was already. Its session closes: the consumers it
        attached are detached and what they held goes back."""
        if self.state is ConnState.CLOSED:
            return False
        self.state = ConnState.CLOSED
        if self.session is not None:
            self.session.close()
        return True

    # -- login and session -------------------------------------------------------------------
    def credentials(
        self, username: str | None, password: str | None, token: str | None
    ) -> Credentials:
        """What it presents: a user and password or a token it sent, else the client
        certificate TLS verified, else nothing (refused with security on)."""
        if username or password or token:
            return Credentials(username, password, token)
        return Credentials(certificate_name=self.certificate_name)

    def logging_in(self, login: Future[Principal]) -> None:
        """Its login is being checked; its frames wait. The loop is woken once it is done (a
        remembered login is done before this returns)."""
        self.login = login
        self.state = ConnState.LOGGING_IN
        login.add_done_callback(lambda _: self._wake())

    def login_outcome(self) -> Principal | SparkMQError | None:
        """Its login's outcome once done (None: not done, or none begun). Taken up: a
        connection that logged in but has not said what it does is opening again (its
        handshake deadline applies)."""
        login = self.login
        if login is None or not login.done():
            return None
        if self.state is ConnState.LOGGING_IN:
            self.state = ConnState.OPENING
        failed = login.exception()
        if failed is None:
            return login.result()
        return failed if isinstance(failed, SparkMQError) else SparkMQError(str(failed))

    def open(self, session: ClientSession) -> ClientSession:
        """Its session, for the principal it proved: it serves from now on. Revoking the
        session (its user removed, say) ends the connection."""
        self.session = session
        session.on_revoke = self._revoke
        if self.state in (ConnState.OPENING, ConnState.LOGGING_IN):
            self.state = ConnState.SERVING
        return session

    def _revoke(self, reason: str) -> None:
        """(Any thread.) The loop refuses the connection when woken."""
        self.revoked = reason
        self._wake()

    def revocation(self) -> NotAuthenticated | None:
        """The error to end it with, once its session was revoked (and it was not told)."""
        if self.revoked is None or self.state.ended:
            return None
        return NotAuthenticated(self.revoked)

    # -- time --------------------------------------------------------------------------------
    def heard(self, now: float) -> None:
        self.last_read = now

    def check(self, now: float, deadlines: Deadlines) -> Verdict | None:
        """What its deadlines say now (the transport's sweep carries it out): refuse one that
        did not say what it does in time, or did not finish a frame it began, or fell silent
        past the heart-beat agreed; close one refused a linger ago, or idle with nothing in
        flight; beat for one that asked for heartbeats."""
        state = self.state
        if state is ConnState.CLOSED or state is ConnState.HANDSHAKING:
            return None
        if state is ConnState.REFUSED:
            return Close() if now - self.refused_at >= deadlines.linger_s else None
        if state is ConnState.OPENING and now - self.opened >= deadlines.handshake_s:
            return Refuse(
                ProtocolError(
                    f"no {self.first} within {deadlines.handshake_s:g} s of connecting "
                    "(broker.handshake_timeout_s)",
                    fault="remote",
                )
            )
        started = self.frame_started
        if started is not None:
            allowed = deadlines.frame_s + self.frame_size / (1024 * 1024)
            if now >= started + allowed:
                return Refuse(
                    ProtocolError(
                        f"a frame of {self.frame_size} bytes did not arrive within {allowed:g} s "
                        "(broker.frame_timeout_s plus a second per MiB)",
                        fault="remote",
                    )
                )
        if self.silence_s and now - self.last_read > self.silence_s:
            return Refuse(
                ProtocolError(
                    f"nothing received for {now - self.last_read:.1f} s; the heart-beat agreed "
                    f"was every {self.silence_s * 500:.0f} ms: the connection is taken to be dead",
                    fault="remote",
                )
            )
        if deadlines.idle_s and now - self.last_read >= deadlines.idle_s and self.idle():
            return Close(f"idle for {now - self.last_read:.0f} s (broker.idle_timeout_s)")
        if self._heartbeat_due(now):
            return Beat()
        return None

    def _heartbeat_due(self, now: float) -> bool:
        if not self.heartbeat_s:
            return False
        if self.writes != self._writes_seen:
            self._writes_seen, self._quiet_since = self.writes, now
            return False
        if now - self._quiet_since < self.heartbeat_s or not self.waits():
            return False
        self._quiet_since = now
        return True
