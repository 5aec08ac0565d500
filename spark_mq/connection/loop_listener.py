"""A listener served by one asyncio event loop on a thread of its own (STOMP's, Kafka's): the
loop and its thread, the listening socket, a sweep of its connections every so often, acks
that wait to share a sync committed when due, and the drain at shutdown. A protocol's listener
subclasses it with what is its own (its connections' factory, its limits, its coordinators);
its connections are :class:`~spark_mq.connection.loop_connection.LoopConnection` s.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from spark_mq import serving_threads
from spark_mq.connection.gateway import Gateway
from spark_mq.connection.listener import ListenerCore
from spark_mq.errors import ConfigError

log = logging.getLogger(__name__)

SWEEP_S = 0.25  # a listener's connections are checked this often (unless it says otherwise)


class LoopListener:
    """See the module. ``name`` is the listener's (``stomp``, ``kafka``): its settings are
    ``broker.<name>`` and ``broker.<name>_port``, its threads ``<name>-loop`` and
    ``<name>-blocking``."""

    name: str
    conns: set[Any]  # (its LoopConnections, typed by each protocol's listener)

    def __init__(self, gateway: Gateway, name: str, *, label: str, forwards: bool = False) -> None:
        self.name = name
        self.label = label
        self.gateway = gateway
        self.core = ListenerCore(gateway, name, label=label, forwards=forwards)
        self.turn = self.core.turn
        self.settings = gateway.config.broker
        self.conns = set()
        self.draining = False
        self._later_at: asyncio.TimerHandle | None = None
        self.loop = asyncio.new_event_loop()
        self.loop_thread = 0  # its thread's ident, once running
        self._worker = threading.Thread(target=self._run, name=f"{name}-loop", daemon=True)
        self._worker.start()
        self.port = 0

    def listen(self, host: str, port: int, factory: Callable[[], asyncio.Protocol]) -> None:
        """Bind the port (refused: a ``ConfigError`` naming the setting) and begin sweeping."""
        try:
            self._server = asyncio.run_coroutine_threadsafe(
                self.loop.create_server(factory, host, port, backlog=128, reuse_address=True),
                self.loop,
            ).result()
        except OSError as exc:
            self._stop_loop()
            raise ConfigError(
                f"{self.label} cannot listen on {host}:{port}: {exc.strerror or exc}; set "
                f"broker.{self.name}_port (0 picks a free port), or broker.{self.name} = false",
                setting=f"broker.{self.name}_port",
            ) from exc
        self.port = self._server.sockets[0].getsockname()[1]
        self.loop.call_soon_threadsafe(self._sweep)

    def _run(self) -> None:
        self.loop_thread = threading.get_ident()
        serving_threads.answers_at_once()  # (its clients are many: see serving_threads)
        asyncio.set_event_loop(self.loop)
        self.loop.run_forever()

    def _stop_loop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._worker.join()
        self.loop.close()
        self.core.close()

    # -- the sweep -----------------------------------------------------------------------------
    def _sweep(self) -> None:
        now = time.monotonic()
        for conn in list(self.conns):
            try:
                conn.sweep(now)
            except Exception:  # one client's trouble never stops the others
                log.exception("%s: error checking %s", self.name, conn.peer)
                conn.abort()
        try:
            self.swept(now)
        except Exception:
            log.exception("%s: error in the listener's sweep", self.name)
        if not self.loop.is_closed():
            self.loop.call_later(self.sweep_every(), self._sweep)

    def swept(self, now: float) -> None:
        """(The loop, after each sweep of the connections.) The listener's own checks."""

    def sweep_every(self) -> float:
        return SWEEP_S

    # -- what the broker's service asks --------------------------------------------------------
    def connection_count(self) -> int:
        return len(self.conns)

    def waiting_for(self) -> str:
        pending = sum(c.outstanding for c in list(self.conns))
        return f"{pending} {self.label} request(s) to answer" if pending else ""

    def begin_stop(self, deadline: float) -> None:
        """(Drained in :meth:`stop`.)"""

    def stop(self, deadline: float | None = None) -> list[str]:
        """Stop accepting; with a ``deadline`` (``time.monotonic()``) first answer what was
        read until everything is or the deadline passes; then tell every client (``goodbye``)
        and close."""
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
            self.goodbye(conn)
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self._server.wait_closed(), 0.5)

    def goodbye(self, conn: Any) -> None:
        """The broker stops: end ``conn`` (the protocol's way of saying so, if it has one)."""
        conn.abort()

    # -- acks waiting to share a sync ----------------------------------------------------------
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
