"""A destination's owner keeps its logs lean, whoever schedules compaction.

Every take-on of a destination (a restart, a failover, a cluster member taking it over or
having it moved to it) reads its whole settlement log back and opens its message log
(:mod:`spark_mq.broker.recovery`, and the duplicate cache's refill). Before this, both only
grew until the compaction job ran: every ack added settlement rows, and every commit a small
file to each log, so 20 moves of one queue under synchronous sends took a take-on from 0.04 to
0.6 s. Now a worker thread tends a destination's logs when its owner takes it on, and after
every ``TEND_EVERY`` commits or ``TEND_ROWS`` rows to them (at most once every ``TEND_APART_S``,
or ``TEND_REST`` times as long as the last one took):

* its settlement log is collapsed as compaction does: each subscription's rows below its
  low-water mark replaced by one ``compacted`` row carrying the mark, and above it (past a
  message held unacknowledged) each long run of settled offsets by one ``settled-run`` row
  (``recovery.collapse_plan``; ``LogStore.collapse_settlements``: the new rows first, so a
  reader between the two finds both), and the log's small files merged. The marks and runs are
  what the store's settlements tell: a settlement still in the hot tier, not yet moved to
  Delta, is not counted, so neither is ever past what the log holds;
* its message log's small files are merged once there are ``MERGE_AT_FILES`` of them (as
  Databricks' auto compaction does: 50): no rows change, and a Delta stream skips the commit.
  Removing settled messages stays compaction's.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from spark_mq.broker.recovery import collapse_plan
from spark_mq.errors import SparkMQError
from spark_mq.journal import Journal, priority

log = logging.getLogger(__name__)

TEND_EVERY = 50  # commits to a destination's logs between two tendings
TEND_ROWS = 5_000  # ... or rows committed to them, whichever comes first
TEND_APART_S = 5.0  # ... and at least this long between two of one destination
TEND_REST = 10  # ... or this many times as long as the last one took
MERGE_AT_FILES = 50  # a message log's small files are merged once it has this many


class LogTending:
    """Tends the logs of the destinations served here (see the module); told of each commit
    to them by the journal's store (``on_log_commit``)."""

    def __init__(
        self,
        journal: Journal,
        *,
        every: int = TEND_EVERY,
        rows: int = TEND_ROWS,
        apart_s: float = TEND_APART_S,
        merge_at: int = MERGE_AT_FILES,
        monotonic: Callable[[], float] = time.monotonic,
        now_us: Callable[[], int] = lambda: time.time_ns() // 1000,
        nice: int = 0,
    ) -> None:
        self._journal = journal
        self._every, self._rows, self._apart_s = every, rows, apart_s
        self._merge_at = merge_at
        self._monotonic, self._now_us = monotonic, now_us
        self._lock = threading.Lock()
        self._commits: dict[str, tuple[int, int]] = {}  # commits and rows since the last
        self._next: dict[str, float] = {}  # when each may be tended again
        self._queued: set[str] = set()
        self._closed = False
        # (at the movers' priority: background work yields the CPU to the loops)
        self._pool = ThreadPoolExecutor(
            1, "log-tending", initializer=priority.background, initargs=(nice,)
        )
        self.collapsed = 0  # settlement logs collapsed (for tests)
        self.merged = 0  # message logs whose files were merged (for tests)

    def committed(self, destination: str, rows: int) -> None:
        """A commit of ``rows`` to one of ``destination``'s logs landed (any thread: the
        committing one): a tending is queued when it is time."""
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
        settlement log): its logs are tended at once, so the next take-on finds them lean."""
        with self._lock:
            if not self._closed:
                self._queue(destination)

    def forget(self, destination: str) -> None:
        """``destination`` is not served here any more (let go, or deleted): its counts go (a
        tending under way finishes, and keeps none)."""
        with self._lock:
            self._commits.pop(destination, None)
            self._next.pop(destination, None)

    @property
    def tracked(self) -> set[str]:
        """The destinations whose commits are counted here."""
        with self._lock:
            return set(self._commits) | set(self._next)

    def _queue(self, destination: str) -> bool:
        """Queue a tending of ``destination`` unless one is, or it is too soon after the last
        (under the lock)."""
        now = self._monotonic()
        if destination in self._queued or now < self._next.get(destination, now):
            return False
        self._commits[destination] = (0, 0)
        self._queued.add(destination)
        self._next[destination] = now + self._apart_s
        self._pool.submit(self._tend_queued, destination)
        return True

    def _tend_queued(self, destination: str) -> None:
        started = time.perf_counter()
        try:
            self.tend(destination)
        except SparkMQError as exc:  # (a deposed owner, a store error: the next time)
            log.info("%s: logs not tended: %s", destination, exc)
        except Exception:
            log.exception("%s: logs not tended", destination)
        finally:
            took = time.perf_counter() - started
            with self._lock:
                self._queued.discard(destination)
                if destination in self._commits:  # (else forgotten meanwhile)
                    # (resting TEND_REST times as long as it took: at most a share of a core)
                    rest = max(self._apart_s, TEND_REST * took)
                    self._next[destination] = self._monotonic() - took + rest

    def tend(self, destination: str) -> tuple[int, int]:
        """Tend ``destination``'s logs now, if it is served here: the settlement rows removed
        and the message files merged."""
        info = self._journal.destinations.get(destination)
        if info is None:  # (let go, or deleted, meanwhile)
            return 0, 0
        store = self._journal.store
        started = time.perf_counter()
        settlements = store.read_settlements(destination)
        collapse = collapse_plan(settlements, info)
        removed = 0
        if collapse:
            removed = store.collapse_settlements(destination, collapse, self._now_us())
            self.collapsed += 1
        merged = store.merge_message_files(destination, self._merge_at)
        if merged:
            self.merged += 1
        log.debug(
            "%s: %d of %d settlement row(s) collapsed, %d message file(s) merged, in %.3fs",
            destination,
            removed,
            settlements.num_rows,
            merged,
            time.perf_counter() - started,
            extra={"destination": destination},
        )
        return removed, merged

    def close(self) -> None:
        """No more tending; waits for one under way."""
        with self._lock:
            self._closed = True
        self._pool.shutdown(wait=True, cancel_futures=True)
