"""Noticing a silent broker: a connection whose broker sends nothing while the client waits for
something (an answer, a delivery) is taken for dead after a few heartbeat intervals, and cut.

A paused broker (SIGSTOP, a machine that hangs, a stall), or one cut off by the network, keeps
its TCP connections open: the kernel acknowledges what is sent to it, so a client blocked
reading waits for ever. A client that asks for heartbeats (``heartbeat_ms`` in its produce or
consume command) is written to at least that often while it waits, so silence means trouble.
One watchdog thread per process looks at every watched connection four times a second: one
that expects something and has received nothing for ``dead_after_s`` is cut (its socket shut
down, its Flight call cancelled); whoever reads it then sees the broker gone and fails over to
the pair's other broker, as after a crash.

The watched connections count what they receive (an integer added to on each read, no clock
read on the hot path); the watchdog compares the count between its looks.
"""

from __future__ import annotations

import logging
import threading
import time
import weakref
from typing import Protocol

log = logging.getLogger(__name__)

DEFAULT_HEARTBEAT_S = 1.0  # what clients ask for
DEAD_AFTER = 4  # heartbeat intervals of silence, while waiting, before the broker is dead
_TICK_S = 0.25


class Watched(Protocol):
    @property
    def received(self) -> int:
        """How many reads brought something so far (any count that grows with input)."""
        ...

    def expecting(self) -> bool:
        """Whether the client waits for something from the broker now."""
        ...

    def cut(self, reason: str) -> None:
        """The broker is taken for dead: end the connection so its reader sees it gone
        (thread-safe)."""
        ...


class _Entry:
    __slots__ = ("dead_after_s", "quiet_s", "seen")

    def __init__(self, dead_after_s: float) -> None:
        self.dead_after_s = dead_after_s
        self.seen = -1
        self.quiet_s = 0.0


class Watchdog:
    """One per process (:func:`watch`): a daemon thread started at the first connection."""

    def __init__(self, tick_s: float = _TICK_S) -> None:
        self._tick_s = tick_s
        self._lock = threading.Lock()
        self._watched: weakref.WeakKeyDictionary[Watched, _Entry] = weakref.WeakKeyDictionary()
        self._thread: threading.Thread | None = None
        self.ticks = 0  # looks taken so far (its own clock, for whoever waits on it)
        self._ticked = threading.Condition(self._lock)

    def watch(self, conn: Watched, heartbeat_s: float) -> None:
        """Watch ``conn``, whose broker was asked for a heartbeat every ``heartbeat_s``."""
        if heartbeat_s <= 0:
            return
        with self._lock:
            self._watched[conn] = _Entry(DEAD_AFTER * heartbeat_s)
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name="sparkmq-liveness", daemon=True
                )
                self._thread.start()

    def forget(self, conn: Watched) -> None:
        with self._lock:
            self._watched.pop(conn, None)

    def _run(self) -> None:
        last = time.monotonic()
        while True:
            time.sleep(self._tick_s)
            now = time.monotonic()
            elapsed, last = now - last, now
            with self._lock:
                entries = list(self._watched.items())
            for conn, entry in entries:
                try:
                    self._look(conn, entry, elapsed)
                except Exception:  # one connection's trouble never stops the watchdog
                    log.debug("liveness check failed", exc_info=True)
            with self._lock:
                self.ticks += 1
                self._ticked.notify_all()

    def wait_ticks(self, n: int, timeout: float = 60.0) -> bool:
        """Wait until the watchdog has looked at its connections ``n`` more times (False: it
        did not within ``timeout``, or it is not running)."""
        with self._lock:
            if self._thread is None:
                return False
            target = self.ticks + n
            return self._ticked.wait_for(lambda: self.ticks >= target, timeout)

    def _look(self, conn: Watched, entry: _Entry, elapsed: float) -> None:
        received = conn.received
        if received != entry.seen or not conn.expecting():
            entry.seen, entry.quiet_s = received, 0.0
            return
        # (a tick the process itself was stalled past is not the broker's silence: at most one
        # tick's worth counts, so a client paused for a minute does not cut a live broker)
        entry.quiet_s += min(elapsed, 2 * self._tick_s)
        if entry.quiet_s >= entry.dead_after_s:
            entry.quiet_s = 0.0
            self.forget(conn)
            reason = (
                f"the broker sent nothing for {entry.dead_after_s:g} s while this client waited "
                "(no answer, delivery or heartbeat): it is taken for dead (paused, hung or cut "
                "off)"
            )
            log.warning("%s; reconnecting", reason)
            conn.cut(reason)


_WATCHDOG = Watchdog()


def watch(conn: Watched, heartbeat_s: float) -> None:
    _WATCHDOG.watch(conn, heartbeat_s)


def forget(conn: Watched) -> None:
    _WATCHDOG.forget(conn)


def wait_ticks(n: int, timeout: float = 60.0) -> bool:
    """Wait for ``n`` more looks of the process's watchdog (see :meth:`Watchdog.wait_ticks`)."""
    return _WATCHDOG.wait_ticks(n, timeout)
