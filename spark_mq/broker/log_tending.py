"""A destination's owner keeps its settlement log short, whoever schedules compaction.

Every ack, nack or disposal adds settlement rows, and every take-on of a destination (a
restart, a failover, a cluster member taking it over or having it moved to it) reads its whole
settlement log back (:mod:`spark_mq.broker.recovery`): before this, the log grew until the
compaction job collapsed it, and with it the time a move took (20 moves of one queue under
synchronous sends took a take-on from 0.04 to 0.6 s). Now a worker thread collapses a
destination's settlement log as compaction does when its owner takes it on, and after every
``COLLAPSE_EVERY`` commits or ``COLLAPSE_ROWS`` rows to it (at most once every
``COLLAPSE_APART_S``): each subscription's rows below its low-water mark are replaced
by one ``compacted`` row carrying the mark (``LogStore.collapse_settlements``: the marks first,
so a reader between the two finds both), and the log's small files are merged.

The marks are what the store's settlements tell: a settlement still in the hot tier, not yet
moved to Delta, is not counted, so a mark is never past what the log holds. The message log is
left to compaction (its rows are what readers and Spark queries read).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from spark_mq.broker.recovery import collapse_marks
from spark_mq.errors import SparkMQError
from spark_mq.journal import Journal

log = logging.getLogger(__name__)

COLLAPSE_EVERY = 50  # settlement commits to one destination's log between two collapses
COLLAPSE_ROWS = 5_000  # ... or rows committed to it, whichever comes first
COLLAPSE_APART_S = 5.0  # ... and at least this long between two of one destination


class SettlementLogTending:
    """Collapses the settlement logs of the destinations served here (see the module); told
    of each settlement commit by the journal's store (``on_settlements``)."""

    def __init__(
        self,
        journal: Journal,
        *,
        every: int = COLLAPSE_EVERY,
        rows: int = COLLAPSE_ROWS,
        apart_s: float = COLLAPSE_APART_S,
        monotonic: Callable[[], float] = time.monotonic,
        now_us: Callable[[], int] = lambda: time.time_ns() // 1000,
    ) -> None:
        self._journal = journal
        self._every, self._rows, self._apart_s = every, rows, apart_s
        self._monotonic, self._now_us = monotonic, now_us
        self._lock = threading.Lock()
        self._commits: dict[str, tuple[int, int]] = {}  # commits and rows since the last
        self._last: dict[str, float] = {}  # when a collapse of each was last queued
        self._queued: set[str] = set()
        self._closed = False
        self._pool = ThreadPoolExecutor(1, "settlement-log")
        self.collapsed = 0  # collapses done (for tests and the log)

    def committed(self, destination: str, rows: int) -> None:
        """A commit of ``rows`` to ``destination``'s settlement log landed (any thread: the
        committing one): a collapse is queued when it is time."""
        with self._lock:
            if self._closed:
                return
            n, r = self._commits.get(destination, (0, 0))
            n, r = n + 1, r + rows
            if n < self._every and r < self._rows:
                self._commits[destination] = (n, r)
                return
            if not self._queue(destination):
                self._commits[destination] = (n, r)

    def taken_on(self, destination: str) -> None:
        """``destination`` is served here from now on (a take-on or a restart read its whole
        settlement log): its log is collapsed at once, so the next take-on reads a short one."""
        with self._lock:
            if not self._closed:
                self._queue(destination)

    def _queue(self, destination: str) -> bool:
        """Queue a collapse of ``destination`` unless one is, or one was queued less than
        ``apart_s`` ago (under the lock)."""
        last = self._last.get(destination)
        now = self._monotonic()
        if destination in self._queued or (last is not None and now - last < self._apart_s):
            return False
        self._commits[destination] = (0, 0)
        self._queued.add(destination)
        self._last[destination] = now
        self._pool.submit(self._collapse_queued, destination)
        return True

    def _collapse_queued(self, destination: str) -> None:
        try:
            self.collapse(destination)
        except SparkMQError as exc:  # (a deposed owner, a store error: the next time)
            log.info("%s: settlement log not collapsed: %s", destination, exc)
        except Exception:
            log.exception("%s: settlement log not collapsed", destination)
        finally:
            with self._lock:
                self._queued.discard(destination)

    def collapse(self, destination: str) -> int:
        """Collapse ``destination``'s settlement log now, if it is served here: the rows
        removed (0: nothing to collapse, or not served here)."""
        info = self._journal.destinations.get(destination)
        if info is None:  # (let go, or deleted, meanwhile)
            return 0
        store = self._journal.store
        started = time.perf_counter()
        settlements = store.read_settlements(destination)
        marks = collapse_marks(settlements, info)
        if not marks:
            return 0
        removed = store.collapse_settlements(destination, marks, self._now_us())
        self.collapsed += 1
        log.debug(
            "%s: settlement log collapsed (%d of %d row(s) removed) in %.3fs",
            destination,
            removed,
            settlements.num_rows,
            time.perf_counter() - started,
            extra={"destination": destination},
        )
        return removed

    def close(self) -> None:
        """No more collapses; waits for one under way."""
        with self._lock:
            self._closed = True
        self._pool.shutdown(wait=True, cancel_futures=True)
