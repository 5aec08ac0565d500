"""What a listener shares between its connections, whatever its protocol, and what the service
knows of a listener.

* :class:`Turn`: a loop commits the sends and acks of the frames it handled together inline,
  at the end of its turn: one sync, no hand-off to the journal's threads (with quick commits: the
  hot tier, memory; a Delta-only journal's commits stay on the writer threads). Acks that wait to
  share a sync with later messages are the loop's to commit when due (``due``).
* :class:`ListenerCore`: the connection cap, the helper threads for work that may wait (a
  produce that waits for room, a transaction's commit), the deadlines, the produce dispatch,
  logins and sessions (through the :class:`~spark_mq.connection.gateway.Gateway`).
* :func:`pump`: a consumer's deliveries, leased while its connection may take more.
* :class:`Listener`: what :mod:`spark_mq.service` starts, counts and stops, without knowing
  which protocol it serves.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from typing import Any, Protocol

from spark_mq.connection.core import Connection, Deadlines
from spark_mq.connection.gateway import Gateway
from spark_mq.deliveries import DeliveryState
from spark_mq.errors import BrokerUnavailable, SparkMQError
from spark_mq.journal.inline_commit import DestinationWriter, InlineCommit, Resolutions, resolve
from spark_mq.messages import Messages
from spark_mq.security.authenticate import Credentials
from spark_mq.security.scram import ScramLogin
from spark_mq.session import ClientSession, ConsumerHandle, Principal

log = logging.getLogger(__name__)

# a produce this big is synced by the journal writer thread, so the loop reads the next meanwhile
# (batched 1 KiB produce: 330-339k msg/s against 255-314k inline, interleaved runs)
INLINE_MAX_BYTES = 256 * 1024


class Listener(Protocol):
    """A protocol's listener, as the service sees it."""

    name: str  # "flight", "wire", "stomp": the transport label of the metrics

    @property
    def port(self) -> int:
        """The port it listens on (given as 0: the one the system chose)."""
        ...

    def connection_count(self) -> int: ...

    def waiting_for(self) -> str:
        """What a shutdown waits for (for the log); empty when nothing."""
        ...

    def begin_stop(self, deadline: float) -> None:
        """Nothing new is taken from now on; what was taken is answered until ``deadline``
        (``time.monotonic()``)."""
        ...

    def stop(self, deadline: float | None = None) -> list[str]:
        """Stop (draining until ``deadline`` first, when given), every connection closed;
        returns what was still open and is left to the process's end (Flight calls whose
        clients never ended them), described."""
        ...


class Turn:
    """One loop's inline commits (see the module). ``defer_answers``: the commits leave their
    futures for :meth:`resolve`, called once the deliveries they made possible are out (the
    direct wire writes those first)."""

    def __init__(self, quick: bool, *, defer_answers: bool = False) -> None:
        self.quick = quick
        self.later: dict[DestinationWriter, float] = {}  # acks waiting to share a sync
        self._resolving: Resolutions | None = [] if defer_answers else None
        self.inline: InlineCommit | None = None  # the turn's, while it runs

    def begin(self) -> InlineCommit | None:
        """The turn's inline commit (None with slow commits: the writer threads commit)."""
        self.inline = InlineCommit(self.later, self._resolving) if self.quick else None
        return self.inline

    def end(self) -> None:
        """Commit what the turn's frames submitted (and what ``later`` says is due)."""
        inline, self.inline = self.inline, None
        if inline is not None:
            inline.commit()

    @contextmanager
    def running(self) -> Iterator[InlineCommit | None]:
        """A turn: what is submitted inside with the yielded commit is durable at its end."""
        outer = self.inline  # (a local: mypyc trusts mypy's narrowing of self.inline below)
        if outer is not None:  # (nested: the outer turn commits)
            yield outer
            return
        inline = self.begin()
        try:
            yield inline
        finally:
            if inline is self.inline:
                self.end()

    def due(self) -> float | None:
        """When the earliest waiting ack is due (``time.monotonic()``); None: none waits."""
        return min(self.later.values()) if self.later else None

    def commit_due(self) -> None:
        """Commit the acks that are due (the loop came back for them)."""
        if self.later and self.inline is None:
            InlineCommit(self.later, self._resolving).commit()

    @property
    def unresolved(self) -> bool:
        return bool(self._resolving)

    def resolve(self) -> None:
        """Resolve the futures the turn's commits left pending, in commit order."""
        if self._resolving:
            resolve(self._resolving)


class ListenerCore:
    def __init__(
        self,
        gateway: Gateway,
        name: str,
        *,
        label: str,
        helper_threads: int = 4,
        defer_answers: bool = False,
        forwards: bool = False,
    ) -> None:
        self.gateway = gateway
        # its clients cannot follow a destination to the cluster member serving it (STOMP's):
        # this member forwards what they do there (the gateway's forwarding, on a member), and
        # places what they send to a partitioned destination in its partitions
        self.forwards = forwards
        self.name = name
        self.label = label  # what people call its connections ("direct-wire", "STOMP")
        self.settings = gateway.config.broker
        self.deadlines = Deadlines.of(self.settings)
        self.turn = Turn(gateway.commits_are_quick, defer_answers=defer_answers)
        self.helpers = ThreadPoolExecutor(helper_threads, thread_name_prefix=f"{name}-blocking")
        self._refused_total = 0
        self._refused_logged = 0.0

    # -- connections -------------------------------------------------------------------------
    def over_cap(self, open_now: int, peer: Any) -> BrokerUnavailable | None:
        """Why a connection past ``broker.max_connections`` is refused (logged now and then);
        None while there is room."""
        limit = self.settings.max_connections
        if open_now < limit:
            return None
        self._refused_total += 1
        now = time.monotonic()
        if now - self._refused_logged >= 10:
            self._refused_logged = now
            log.warning(
                "%s: connection from %s refused: %d open, the limit (broker.max_connections); "
                "%d refused so far",
                self.label,
                peer or "a local client",
                limit,
                self._refused_total,
            )
        return BrokerUnavailable(
            f"the broker has {limit} {self.label} connections open, its limit "
            "(broker.max_connections): try again later, or raise the limit"
        )

    def log_in(self, conn: Connection, username: str | None, password: str | None,
               token: str | None) -> None:  # fmt: skip
        """Begin ``conn``'s login (never blocking: its frames wait, nobody else does)."""
        creds = conn.credentials(username, password, token)
        conn.logging_in(self.gateway.login(creds, peer=conn.peer, transport=conn.transport))

    def scram_login(self) -> ScramLogin:
        """A SASL/SCRAM-SHA-512 exchange for a connection to begin (:meth:`log_in_scram`
        checks its proof)."""
        return self.gateway.scram_login()

    def log_in_scram(self, conn: Connection, exchange: ScramLogin) -> None:
        """Begin ``conn``'s login by the proof of a SCRAM exchange (as :meth:`log_in`)."""
        creds = Credentials(username=exchange.username, scram=exchange)
        conn.logging_in(self.gateway.login(creds, peer=conn.peer, transport=conn.transport))

    def open_session(self, conn: Connection, principal: Principal) -> ClientSession:
        session = self.gateway.session(principal, peer=conn.peer, transport=conn.transport)
        if self.forwards:
            session.forwarding = self.gateway.forwarding
            session.places = True
        return conn.open(session)

    # -- producing ---------------------------------------------------------------------------
    def produce(
        self,
        session: ClientSession,
        destination: str,
        messages: Messages,
        size: int,
    ) -> tuple[Future, bool]:
        """Hand produced messages (``size`` bytes as they came) to ``session``: committed with
        the turn, or by the writer thread when big, or on a helper thread when it may wait for
        room (True: the connection waits for it; its frames behind it wait too)."""
        if session.produce_may_wait(destination):
            return self.helpers.submit(_produce_waiting, session, destination, messages), True
        inline = self.turn.inline if size < INLINE_MAX_BYTES else None
        return session.produce(destination, messages, inline), False

    def run_blocking(self, fn: Any, *args: Any) -> Future:
        """``fn(*args)`` on a helper thread (a transaction's commit, say)."""
        return self.helpers.submit(fn, *args)

    def close(self) -> None:
        # a produce waiting for room gives up when the broker closes (DestinationFull)
        self.helpers.shutdown(wait=False, cancel_futures=True)


def pump(
    consumer: ConsumerHandle,
    deliver: Callable[[Messages, list[DeliveryState]], None],
    room: Callable[[], bool] | None = None,
) -> bool:
    """Lease what ``consumer``'s prefetch window allows and hand each lease to ``deliver``
    (the transport frames and writes it), for as long as ``room()`` says the connection takes
    more (None: always; a STOMP client that stopped reading does not). True if anything was
    delivered."""
    delivered = False
    while room is None or room():
        leased = consumer.next_leased()
        if leased is None:
            break
        deliver(*leased)
        delivered = True
    return delivered


def _produce_waiting(session: ClientSession, destination: str, messages: Messages) -> Any:
    return session.produce(destination, messages).result()


def error_of(exc: BaseException) -> SparkMQError:
    return exc if isinstance(exc, SparkMQError) else SparkMQError(str(exc))
