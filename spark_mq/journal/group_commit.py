"""Group commit for one destination: buffer appends and settlements, flush them as one commit.

A flush happens when the buffer holds ``buffer_size_bytes`` or when its oldest record has waited
``buffer_timeout_s`` (Artemis' journal-buffer-size / journal-buffer-timeout pair); while a commit
is under way new records collect for the next one, so throughput grows with load.

Offsets are assigned at flush time, not at append time, so a failed commit leaves no gap: the
next flush reuses the offsets the failed one would have taken.

Not guaranteed: a record whose future failed with ``JournalError`` was not stored (when the store
cannot say whether a commit landed, the writer asks ``committed_end`` and reports what it finds).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass

import pyarrow as pa

from spark_mq.errors import DestinationNotFound, JournalError, SparkMQError
from spark_mq.journal.base import AppendResult, LogStore
from spark_mq.schema import with_offsets

log = logging.getLogger(__name__)

OnCommit = Callable[[str, pa.Table], None]


@dataclass
class _Record:
    table: pa.Table
    future: Future
    is_settlement: bool
    nbytes: int


@dataclass
class WriterStats:
    commits: int = 0
    failed_commits: int = 0
    messages: int = 0
    settlements: int = 0
    last_commit_ms: float = 0.0
    pending_bytes: int = 0


class DestinationWriter:
    """The single committer of one destination's logs (one thread)."""

    def __init__(
        self,
        store: LogStore,
        destination: str,
        next_offset: int,
        *,
        buffer_timeout_s: float,
        buffer_size_bytes: int,
        max_pending_bytes: int,
        on_commit: OnCommit | None = None,
    ) -> None:
        self.destination = destination
        self._store = store
        self._next_offset = next_offset
        self._timeout = buffer_timeout_s
        self._size = buffer_size_bytes
        self._max_pending = max_pending_bytes
        self._on_commit = on_commit
        self._cond = threading.Condition()
        self._records: list[_Record] = []
        self._pending_bytes = 0
        self._first_at = 0.0
        self._closing = False
        self._flush_requested = False
        self.stats = WriterStats()
        self._thread = threading.Thread(
            target=self._run, name=f"journal-writer-{destination}", daemon=True
        )
        self._thread.start()

    @property
    def next_offset(self) -> int:
        """One past the last durable offset."""
        with self._cond:
            return self._next_offset

    def submit(self, table: pa.Table, *, is_settlement: bool) -> Future:
        fut: Future = Future()
        nbytes = table.nbytes
        with self._cond:
            # bounded buffer: block the caller while the writer is behind (back-pressure)
            while self._pending_bytes > self._max_pending and not self._closing:
                self._cond.wait()
            if self._closing:
                raise DestinationNotFound(
                    f"destination {self.destination!r} is closing", destination=self.destination
                )
            if not self._records:
                self._first_at = time.monotonic()
            self._records.append(_Record(table, fut, is_settlement, nbytes))
            self._pending_bytes += nbytes
            self._cond.notify_all()
        return fut

    def flush(self) -> None:
        """Ask for an immediate commit of what is buffered and wait for it."""
        with self._cond:
            futures = [r.future for r in self._records]
            self._flush_requested = True
            self._cond.notify_all()
        for f in futures:
            f.exception()

    def close(self, *, drain: bool = True) -> None:
        """Stop the writer; with ``drain`` everything buffered is committed first."""
        with self._cond:
            self._closing = True
            if not drain:
                err = DestinationNotFound(
                    f"destination {self.destination!r} was deleted", destination=self.destination
                )
                for r in self._records:
                    r.future.set_exception(err)
                self._records = []
                self._pending_bytes = 0
            self._cond.notify_all()
        self._thread.join()

    # -- the writer thread -------------------------------------------------------------------
    def _take(self) -> list[_Record] | None:
        with self._cond:
            while True:
                if self._records:
                    due = self._first_at + self._timeout
                    now = time.monotonic()
                    if (
                        self._closing
                        or self._flush_requested
                        or self._pending_bytes >= self._size
                        or now >= due
                    ):
                        break
                    self._cond.wait(due - now)
                elif self._closing:
                    return None
                else:
                    self._cond.wait()
            taken, self._records = self._records, []
            self._flush_requested = False
            return taken

    def _release(self, taken: list[_Record]) -> None:
        with self._cond:
            self._pending_bytes -= sum(r.nbytes for r in taken)
            self.stats.pending_bytes = self._pending_bytes
            self._cond.notify_all()

    def _run(self) -> None:
        while (taken := self._take()) is not None:
            started = time.perf_counter()
            try:
                self._commit_messages([r for r in taken if not r.is_settlement])
                self._commit_settlements([r for r in taken if r.is_settlement])
            except BaseException as exc:  # keep the writer alive; every future hears of it
                log.exception("journal writer for %r failed", self.destination)
                for r in taken:
                    if not r.future.done():
                        r.future.set_exception(exc)
            finally:
                self.stats.last_commit_ms = (time.perf_counter() - started) * 1000
                self._release(taken)

    def _commit_messages(self, records: list[_Record]) -> None:
        if not records:
            return
        first = self._next_offset
        tables, results = [], []
        offset = first
        for r in records:
            tables.append(with_offsets(r.table, offset))
            results.append(AppendResult(self.destination, offset, r.table.num_rows))
            offset += r.table.num_rows
        rows = pa.concat_tables(tables)
        error = self._try(lambda: self._store.commit_messages(self.destination, rows, offset))
        if error is not None:
            # the commit may have landed even though the call failed: ask the store
            try:
                landed = self._store.committed_end(self.destination) >= offset
            except Exception:
                landed = False
            if not landed:
                self.stats.failed_commits += 1
                for r in records:
                    r.future.set_exception(error)
                return
        with self._cond:
            self._next_offset = offset
        self.stats.commits += 1
        self.stats.messages += rows.num_rows
        if self._on_commit is not None:
            self._on_commit(self.destination, rows)
        for r, res in zip(records, results, strict=True):
            r.future.set_result(res)

    def _commit_settlements(self, records: list[_Record]) -> None:
        if not records:
            return
        rows = pa.concat_tables([r.table for r in records])
        error = self._try(lambda: self._store.commit_settlements(self.destination, rows))
        if error is not None:
            self.stats.failed_commits += 1
            for r in records:
                r.future.set_exception(error)
            return
        self.stats.commits += 1
        self.stats.settlements += rows.num_rows
        for r in records:
            r.future.set_result(None)

    def _try(self, fn: Callable[[], None]) -> SparkMQError | None:
        try:
            fn()
            return None
        except SparkMQError as exc:
            return exc
        except Exception as exc:
            return JournalError(
                f"could not commit to {self.destination!r}: {type(exc).__name__}: {exc}",
                destination=self.destination,
            )
