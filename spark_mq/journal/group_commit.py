"""Group commit for one destination: buffer appends and settlements, flush them as one commit.

A flush happens when the buffer holds ``buffer_size_bytes`` or when its oldest record has waited
``buffer_timeout_s`` (Artemis' journal-buffer-size / journal-buffer-timeout pair); while a commit
is under way new records collect for the next one, so throughput grows with load. The writer
thread does every flush: a submitter that flushed its own record (leader style) would stop
reading its stream meanwhile, and measured pipelined single-message produce at 740/s against
1,320/s with the hand-off, at no gain for synchronous sends.

While messages are flowing (one came within ``settle_timeout_s``), a flush holding only
settlements (acks) waits up to ``settle_timeout_s`` for messages to share its sync: an ack then
costs no sync of its own, and no producer waits behind one. Acks with no messages about (a
queue being drained) are not held. Nobody is answered early: an ack's reply, and the prefetch
room it gives back, still wait until it is durable.

Offsets are assigned at flush time, not at append time, so a failed commit leaves no gap: the
next flush reuses the offsets the failed one would have taken.

A transport that serves many clients from one thread (``spark_mq.transports.direct_wire``) commits
inline instead: a submit given an :class:`InlineCommit` does not wake the writer thread, and
when the caller commits that object it commits every writer it touched itself, one sync each,
and the futures resolve there. Thread hand-offs, not the work, were most of a synchronous
send's cost. A turn that left a writer much to commit (``inline_commit.WRITE_BEHIND_FROM``)
writes it behind instead (:meth:`DestinationWriter.write_behind`): the loop numbers, encodes and
writes it, and the syncer thread of the pipeline below makes it durable and answers, while the
loop goes on with its next turn (the sync was a quarter of a saturated loop's time).
Either way one commit runs at a time per destination (the commit lock), so offsets stay in order.

Over the hot tier the writer thread pipelines: it writes a flush to the segment log and hands it
to a second thread (``journal-sync-<destination>``), which syncs it, runs ``on_commit`` and
answers, while the writer numbers, encodes and writes the next (at most ``MAX_IN_FLIGHT`` flushes
written and not yet durable). Batched 1 KiB produce went from 174-227k msg/s to 257-280k (three
interleaved pairs): the writer had spent a third of its time encoding and checksumming with the
disk idle, and each sync waited for the copy into the page cache. Nothing is answered before
it is durable, and while flushes are in the pipeline an inline commit leaves its records to it
(they must not be durable, or seen by ``on_commit``, before the flushes ahead of them). A failed
sync fails every flush it may have lost, which the segment log cuts off, and numbering resumes
after the last durable offset: still no gap.

Not guaranteed: a record whose future failed with ``JournalError`` was not stored (when the store
cannot say whether a commit landed, the writer asks ``committed_end`` and reports what it finds).
"""

from __future__ import annotations

import logging
import threading
import time
from bisect import bisect_left
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import cast

import pyarrow as pa

from spark_mq.errors import DestinationNotFound, SparkMQError
from spark_mq.journal.base import AppendResult
from spark_mq.journal.inline_commit import InlineCommit, Resolutions
from spark_mq.journal.settlements import Settlement, SettlementRows
from spark_mq.journal.sinks import CommitSink, PipelinedSink, Written, as_journal_error
from spark_mq.journal.timing import CommitTiming
from spark_mq.messages import Messages, PlainMessage
from spark_mq.schema import with_offsets

log = logging.getLogger(__name__)

# One flush carries at most this much (a backlog goes out in several): a flush's encoding buffer
# is then reused instead of mapped afresh (see ipc_payloads.Scratch), and no single sync is huge.
MAX_FLUSH_BYTES = 8 * 1024 * 1024
# flushes written and not yet durable, at most (the pipeline of a sink that syncs apart)
MAX_IN_FLIGHT = 2

# a commit's messages, once durable: rows of MESSAGE_SCHEMA, or plain messages with their
# offsets when every message of the commit came as one
OnCommit = Callable[[str, Messages], None]


@dataclass(slots=True)
class _Record:
    payload: Messages | Settlement
    future: Future
    is_settlement: bool
    nbytes: int
    at: float  # time.monotonic() when it was submitted


@dataclass(slots=True)
class _Flight:
    """One flush: its records and rows, and (pipelined) where they were written."""

    messages: list[_Record]
    settles: list[_Record]
    rows: Messages | None
    end: int  # one past its last offset
    results: list[AppendResult]
    settle_rows: SettlementRows | None
    written: Written | None = None  # pipelined: where the sink wrote it
    taken: list[_Record] = field(default_factory=list)
    started: float = 0.0  # time.perf_counter() when its commit began


def _written(f: _Flight) -> Written:
    """Where a flush of the pipeline was written (set before it is listed in flight)."""
    assert f.written is not None
    return f.written


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
        sink: CommitSink,
        destination: str,
        next_offset: int,
        *,
        buffer_timeout_s: float,
        buffer_size_bytes: int,
        max_pending_bytes: int,
        settle_timeout_s: float = 0.0,
        on_commit: OnCommit | None = None,
        timing: CommitTiming | None = None,
    ) -> None:
        self.destination = destination
        self._timing = timing
        self._sink = sink
        self._next_offset = next_offset  # one past the last durable offset
        # one past the last offset given (written, maybe not yet synced); only the holder of the
        # commit lock reads or changes it
        self._assigned = next_offset
        self._timeout = buffer_timeout_s
        self._settle_timeout = max(settle_timeout_s, buffer_timeout_s)
        self._size = buffer_size_bytes
        self._max_pending = max_pending_bytes
        self._on_commit = on_commit
        # one lock (a condition's, entered directly on the hot paths: Condition.__enter__ is a
        # Python call around it)
        self._mutex = threading.RLock()
        self._cond = threading.Condition(self._mutex)
        # the syncer's own (a flush listed for it, or the stop): a flush the wire loop wrote
        # behind woke the writer thread too, for nothing, a tenth of the GIL's time (py-spy)
        self._to_sync = threading.Condition(self._mutex)
        self._commit_lock = threading.Lock()  # one commit at a time: the thread's, or inline
        self._records: list[_Record] = []
        self._messages = 0  # how many of the records are messages (not settlements)
        self._pending_bytes = 0
        # when the writer thread wakes on its own: inf (only when told), None (it is busy)
        self._thread_wakes_at: float | None = None
        self._blocked = 0  # submitters waiting for the pending bytes to go down
        self._first_at = 0.0
        self._last_message_at = float("-inf")
        self._closing = False
        self._gone: SparkMQError | None = None  # (close's: what a late submit is told)
        self._flush_requested = False
        self.stats = WriterStats()
        # a sink that can (the hot tier) gets its flushes written by the writer thread and
        # synced by this one meanwhile: flushes written, not yet durable, oldest first
        self._pipe: PipelinedSink | None = sink if getattr(sink, "pipelined", False) else None  # type: ignore[assignment]
        self._in_flight: deque[_Flight] = deque()
        self._syncer: threading.Thread | None = None
        self._sync_stop = False
        if self._pipe is not None:
            self._syncer = threading.Thread(
                target=self._sync_loop, name=f"journal-sync-{destination}", daemon=True
            )
            self._syncer.start()
        self._worker = threading.Thread(
            target=self._run, name=f"journal-writer-{destination}", daemon=True
        )
        self._worker.start()

    @property
    def next_offset(self) -> int:
        """One past the last durable offset."""
        with self._mutex:
            return self._next_offset

    def submit(self, record: Messages | Settlement, inline: InlineCommit | None = None) -> Future:
        """Buffer messages (rows of ``UNOFFSET_SCHEMA``, or plain messages) or a settlement;
        with ``inline``, for its holder to commit (else the writer thread commits it)."""
        fut: Future = Future()
        is_settlement = type(record) is Settlement
        nbytes = record.nbytes
        with self._mutex:
            # bounded buffer: block the caller while the writer is behind (back-pressure)
            while self._pending_bytes > self._max_pending and not self._closing:
                self._cond.notify_all()  # records held for an inline commit go now
                self._blocked += 1
                try:
                    self._cond.wait()
                finally:
                    self._blocked -= 1
            if self._closing:
                raise self._gone or DestinationNotFound(
                    f"destination {self.destination!r} is closing", destination=self.destination
                )
            now = time.monotonic()
            if not self._records:
                self._first_at = now
            if not is_settlement:
                self._last_message_at = now
            self._records.append(_Record(record, fut, is_settlement, nbytes, now))
            self._messages += not is_settlement
            self._pending_bytes += nbytes
            if inline is None:
                self._cond.notify_all()
        if inline is not None:
            inline.writers[self] = None
        return fut

    def commit_here(
        self, *, coming_back: bool = False, resolving: Resolutions | None = None
    ) -> float | None:
        """Commit what is buffered in the calling thread (see :class:`InlineCommit`; its
        ``resolving``, where the results go).

        Settlements alone are left for a later commit to share while they may wait; returns
        when they are due (``time.monotonic()``), or None when nothing is left. The writer
        thread commits them then, should nothing else come first, unless the caller is
        ``coming_back`` to do it.
        """
        while True:
            with self._commit_lock:
                with self._mutex:
                    if not self._records:
                        return None
                    if self._in_flight:  # they go after the flushes being synced: its way
                        self._cond.notify_all()
                        return None
                    due = self._due_at()
                    if time.monotonic() < due:
                        wakes = self._thread_wakes_at
                        if not coming_back and wakes is not None and wakes > due:
                            self._cond.notify_all()
                        return due
                    taken = self._take_now()
                self._flush(taken, resolving)

    @property
    def pending_bytes(self) -> int:
        """What is buffered, not yet durable (as last counted: no lock)."""
        return self._pending_bytes

    def write_behind(self) -> bool:
        """(An inline commit's, for a big flush.) Take what is due and write it into the
        pipeline, where the syncer thread makes it durable and answers it while the caller (the
        wire loop) goes on with its next turn. False: nothing was written so (a sink that
        cannot sync apart, another commit under way, the pipeline full, nothing due, closing):
        :meth:`commit_here` does what is left."""
        if self._pipe is None or not self._commit_lock.acquire(blocking=False):
            return False
        try:
            with self._mutex:
                if (
                    not self._records
                    or self._closing
                    or len(self._in_flight) >= MAX_IN_FLIGHT
                    or time.monotonic() < self._due_at()
                ):
                    return False
                taken = self._take_now()
            self._write(taken)
            return True
        finally:
            self._commit_lock.release()

    # -- one inline commit of several writers: written, then synced together --------------------
    def write_here(self) -> _Flight | None:
        """The first part of an inline commit of several writers (:class:`InlineCommit`): take
        what is due and write it, not yet durable, keeping the commit lock until
        :meth:`finish_here`. None when there is nothing to write so (nothing due, a sink that
        cannot sync apart, flushes in the pipeline, another commit under way, or the write
        failed: its submitters are told): :meth:`commit_here` then does what is left."""
        if self._pipe is None or not self._commit_lock.acquire(blocking=False):
            return None
        taken: list[_Record] | None = None
        try:
            with self._mutex:
                if self._records and not self._in_flight and time.monotonic() >= self._due_at():
                    taken = self._take_now()
            if taken is None:
                self._commit_lock.release()
                return None
            started = time.perf_counter()
            f = self._flight(taken)
            written = self._pipe.write(f.rows, f.end, f.settle_rows)
        except Exception as exc:  # (as the writer thread's: every future hears of it)
            log.exception("journal writer for %r failed", self.destination)
            written = as_journal_error(exc, self.destination)
        if isinstance(written, SparkMQError):  # nothing of it was kept
            if taken is not None:
                _fail(taken, written)
                self._release(taken)
            self._commit_lock.release()
            return None
        f.written, f.started = written, started
        if f.rows is not None:
            self._assigned = f.end
        return f

    def sync_here(self) -> tuple[int, SparkMQError | None]:
        """The second part: make what :meth:`write_here` wrote durable (any thread: the syncs
        of an inline commit's writers run at once)."""
        assert self._pipe is not None
        try:
            return self._pipe.sync()
        except Exception as exc:  # (it says why itself; never left to the pool's thread)
            return -1, as_journal_error(exc, self.destination)

    def finish_here(
        self,
        f: _Flight,
        synced: tuple[int, SparkMQError | None],
        resolving: Resolutions | None = None,
    ) -> None:
        """The last part: tell the flush's submitters how its sync went (``synced``:
        :meth:`sync_here`'s), and let the commit lock go."""
        durable, error = synced
        try:
            if error is None and _written(f).last_lsn <= durable:
                self._publish(f, resolving)
                return
            self._cut_unsynced()  # lost, perhaps: failed, numbering resumes after the durable
            self.stats.failed_commits += 1
            _fail(f.taken, error or as_journal_error(OSError("not synced"), self.destination))
            self._timed(f.taken, f.started)
            self._release(f.taken)
            self._assigned = self._next_offset
        finally:
            self._commit_lock.release()

    def close_if_untouched(self, end: int) -> bool:
        """Stop taking records, but only if none came since the log ended at ``end``: nothing
        buffered, being committed or synced, no offset given past it. True: from now on every
        submit is refused (the caller deletes the logs, then :meth:`close`); False: nothing
        changed. An auto-deleted queue's emptiness is decided here, where no append can slip in
        between the check and the deletion (one did, and was acknowledged, then deleted)."""
        with self._commit_lock, self._mutex:  # (no commit under way, inline or the thread's)
            if self._records or self._in_flight or not self._assigned == self._next_offset == end:
                return False
            self._closing = True
            self._cond.notify_all()
            return True

    def flush(self) -> None:
        """Ask for an immediate commit of what is buffered and wait for it."""
        with self._mutex:
            futures = [r.future for r in self._records]
            self._flush_requested = True
            self._cond.notify_all()
        for f in futures:
            f.exception()

    def close(self, *, drain: bool = True, gone: SparkMQError | None = None) -> None:
        """Stop the writer; with ``drain`` everything buffered is committed first. ``gone``:
        what a submit made from now on is refused with (else ``DestinationNotFound``)."""
        with self._mutex:
            self._gone = gone
            self._closing = True
            if not drain:
                err = DestinationNotFound(
                    f"destination {self.destination!r} was deleted", destination=self.destination
                )
                for r in self._records:
                    r.future.set_exception(err)
                self._records = []
                self._messages = 0
                self._pending_bytes = 0
            self._cond.notify_all()
        self._worker.join()
        if self._syncer is not None:
            with self._mutex:
                self._sync_stop = True
                self._to_sync.notify()
            self._syncer.join()
        # an inline commit under way (a loop's, which took its records before the worker saw
        # them) ends before the sink closes: a hot tier closing under a write it then
        # acknowledged deleted its directory, and the record with it (a cluster member letting
        # a destination go while serving it). No new one starts: nothing is taken any more.
        with self._commit_lock:
            pass
        if self._in_flight:  # (written behind as the syncer stopped: synced here)
            self._sync_loop()
        self._sink.close(drain=drain)

    # -- the writer thread -------------------------------------------------------------------
    def _due_at(self) -> float:
        """When the buffered records must be committed (caller holds the lock; records exist)."""
        if self._closing or self._flush_requested or self._pending_bytes >= self._size:
            return 0.0
        wait = self._timeout
        if not self._messages and self._first_at - self._last_message_at < self._settle_timeout:
            wait = self._settle_timeout  # acks alone while messages flow: wait for one to share
        return self._first_at + wait

    def _wait_due(self) -> bool:
        """Wait until a flush is due; False once closing with nothing left."""
        with self._mutex:
            try:
                while True:
                    if self._records:
                        due = self._due_at()
                        now = time.monotonic()
                        if now >= due:
                            return True
                        self._thread_wakes_at = due
                        self._cond.wait(due - now)
                    elif self._closing:
                        return False
                    else:
                        self._thread_wakes_at = float("inf")
                        self._cond.wait()
            finally:
                self._thread_wakes_at = None

    def _take_now(self) -> list[_Record]:
        """The oldest records, at most MAX_FLUSH_BYTES (at least one); caller holds the lock."""
        taken: list[_Record] = []
        size = 0
        for r in self._records:
            if taken and size + r.nbytes > MAX_FLUSH_BYTES:
                break
            taken.append(r)
            size += r.nbytes
        del self._records[: len(taken)]
        self._messages -= sum(not r.is_settlement for r in taken)
        if self._records:
            self._first_at = float("-inf")  # the rest is due at once
        else:
            self._flush_requested = False
        return taken

    def _release(self, taken: list[_Record]) -> None:
        with self._mutex:
            self._pending_bytes -= sum(r.nbytes for r in taken)
            self.stats.pending_bytes = self._pending_bytes
            if self._blocked:  # not otherwise: it would wake the writer thread for nothing
                self._cond.notify_all()

    def _run(self) -> None:
        while self._wait_due():
            if self._pipe is not None:
                with self._mutex:  # a bounded pipeline: a flush waits for room
                    while len(self._in_flight) >= MAX_IN_FLIGHT:
                        self._cond.wait()
            with self._commit_lock:
                with self._mutex:
                    taken = self._take_now() if self._records else None
                if taken and self._pipe is not None:
                    self._write(taken)
                elif taken:  # (an inline commit may have taken them meanwhile)
                    self._flush(taken)

    def _flush(self, taken: list[_Record], resolving: Resolutions | None = None) -> None:
        started = time.perf_counter()
        try:
            self._commit(taken, resolving)
        except BaseException as exc:  # keep the writer alive; every future hears of it
            log.exception("journal writer for %r failed", self.destination)
            _fail(taken, exc)
        finally:
            self._timed(taken, started)
            self._release(taken)

    def _commit(self, taken: list[_Record], resolving: Resolutions | None) -> None:
        f = self._flight(taken)
        msg_error, settle_error = self._sink.commit(f.rows, f.end, f.settle_rows)
        if f.rows is not None and msg_error is None:
            self._assigned = f.end  # (the commit lock is held: numbering is this thread's)
        self._finish(f, msg_error, settle_error, resolving)

    def _flight(self, taken: list[_Record]) -> _Flight:
        """``taken`` numbered (from ``_assigned``), as one flush's rows; caller holds the commit
        lock."""
        messages = [r for r in taken if not r.is_settlement]
        settles = [r for r in taken if r.is_settlement]
        rows, end, results = self._numbered(messages)
        settle_rows = (
            SettlementRows([cast(Settlement, r.payload) for r in settles]) if settles else None
        )
        return _Flight(messages, settles, rows, end, results, settle_rows, taken=taken)

    def _finish(
        self,
        f: _Flight,
        msg_error: SparkMQError | None,
        settle_error: SparkMQError | None,
        resolving: Resolutions | None = None,
    ) -> None:
        """Tell a flush's submitters how it went (a durable one: ``on_commit`` first); with
        ``resolving`` (an inline commit's), leave the futures for its holder to resolve."""
        if f.rows is not None and self._resolve(f.messages, msg_error):
            with self._mutex:
                self._next_offset = f.end
            self.stats.messages += f.rows.num_rows
            if self._on_commit is not None:
                self._on_commit(self.destination, f.rows)
            for r, res in zip(f.messages, f.results, strict=True):
                if resolving is None:
                    r.future.set_result(res)
                else:
                    resolving.append((r.future, res))
        if f.settle_rows is not None and self._resolve(f.settles, settle_error):
            self.stats.settlements += f.settle_rows.num_rows
            for r in f.settles:
                if resolving is None:
                    r.future.set_result(None)
                else:
                    resolving.append((r.future, None))

    # -- the pipeline: the writer thread writes, the syncer makes durable and answers ------------
    def _write(self, taken: list[_Record]) -> None:
        """Write ``taken`` (the writer thread, holding the commit lock) for the syncer to sync."""
        assert self._pipe is not None
        started = time.perf_counter()
        try:
            f = self._flight(taken)
            written = self._pipe.write(f.rows, f.end, f.settle_rows)
        except Exception as exc:  # keep the writer alive; every future hears of it
            log.exception("journal writer for %r failed", self.destination)
            written = as_journal_error(exc, self.destination)
        if isinstance(written, SparkMQError):  # nothing of it was kept
            _fail(taken, written)
            self._release(taken)
            return
        f.written, f.started = written, started
        if f.rows is not None:
            self._assigned = f.end  # only ever changed under the commit lock
        with self._mutex:
            self._in_flight.append(f)
            self._to_sync.notify()

    def _sync_loop(self) -> None:
        assert self._pipe is not None
        while True:
            with self._mutex:
                while not self._in_flight and not self._sync_stop:
                    self._to_sync.wait()
                if not self._in_flight:
                    return
            durable, error = self._pipe.sync()
            if error is None:
                with self._mutex:
                    done = [f for f in self._in_flight if _written(f).last_lsn <= durable]
                for f in done:  # still listed meanwhile: an inline commit waits for them
                    self._publish(f)
                with self._mutex:
                    for _ in done:
                        self._in_flight.popleft()
                    # (room in the pipeline: for the writer thread when it waits for it, not
                    # while it waits for records; and for submitters held back)
                    if self._thread_wakes_at is None or self._blocked:
                        self._cond.notify_all()
                continue
            # lost, perhaps, since the last good sync: cut off, and failed (no commit meanwhile)
            with self._commit_lock:
                self._cut_unsynced()
                with self._mutex:
                    flights = list(self._in_flight)
                    self._in_flight.clear()
                for f in flights:
                    if _written(f).last_lsn <= durable:
                        self._publish(f)
                    else:
                        self.stats.failed_commits += 1
                        _fail(f.taken, error)
                        self._release(f.taken)
                self._assigned = self._next_offset  # numbering resumes after the durable
                with self._mutex:
                    self._cond.notify_all()

    def _cut_unsynced(self) -> None:
        """After a failed sync (the commit lock held): what it may have lost is cut off."""
        assert self._pipe is not None
        try:
            self._pipe.drop_unsynced()
        except SparkMQError:
            log.exception(
                "journal writer for %r: could not cut a failed sync off", self.destination
            )

    def _publish(self, f: _Flight, resolving: Resolutions | None = None) -> None:
        """A durable flush: its commit done and its submitters told (``resolving``: an inline
        commit's, for its holder to resolve)."""
        assert self._pipe is not None and f.written is not None
        try:
            self._pipe.published(f.written)
            self._finish(f, None, None, resolving)
        except BaseException as exc:
            log.exception("journal writer for %r failed", self.destination)
            _fail(f.taken, exc)
        finally:
            self._timed(f.taken, f.started)
            self._release(f.taken)

    def _timed(self, taken: list[_Record], started: float) -> None:
        """A commit ended: how long it took, how many records it had, how long each produce
        waited from its arrival (the metrics' histograms, when kept; inlined: this runs twice
        per message in a synchronous send and ack)."""
        took = time.perf_counter() - started
        self.stats.last_commit_ms = took * 1000
        timing = self._timing
        if timing is None:
            return
        h = timing.commit_seconds
        h.counts[bisect_left(h.bounds, took)] += 1
        h.total += took
        h = timing.commit_records
        n = len(taken)
        h.counts[bisect_left(h.bounds, n)] += 1
        h.total += n
        h = timing.produce_ack_seconds
        now = time.monotonic()
        for r in taken:
            if not r.is_settlement:
                waited = now - r.at
                h.counts[bisect_left(h.bounds, waited)] += 1
                h.total += waited

    def _numbered(self, messages: list[_Record]) -> tuple[Messages | None, int, list[AppendResult]]:
        """The messages with their offsets, the end offset, and each record's result."""
        if not messages:
            return None, self._assigned, []
        offset = self._assigned
        plain: list[PlainMessage] = []
        tables: list[pa.Table | None] = []  # None: plain (their table, if one is needed, later)
        results: list[AppendResult] = []
        for r in messages:
            given: Messages = r.payload  # type: ignore[assignment]  # (a message record; no cast() call)
            if (ones := given.plain) is not None:
                for i, m in enumerate(ones):  # offsets are given at commit time, as for tables
                    m.offset = offset + i
                plain += ones
                tables.append(None)
                n = len(ones)
            else:
                table = with_offsets(given.table(), offset)
                tables.append(table)
                n = table.num_rows
            results.append(AppendResult(self.destination, offset, n))
            offset += n
        if len(plain) == offset - self._assigned:  # every one plain
            return Messages(None, plain), offset, results
        whole = [  # plain messages among batches: all as tables, in offset order
            cast(Messages, r.payload).table() if t is None else t
            for r, t in zip(messages, tables, strict=True)
        ]
        return Messages.of(_one_table(whole)), offset, results

    def _resolve(self, records: list[_Record], error: SparkMQError | None) -> bool:
        """Count the commit; on ``error`` fail every record's future. True when it is durable."""
        if error is None:
            self.stats.commits += 1
            return True
        self.stats.failed_commits += 1
        for r in records:
            r.future.set_exception(error)
        return False


def _fail(records: list[_Record], error: BaseException) -> None:
    """Every record not answered yet hears of ``error``."""
    for r in records:
        if not r.future.done():
            r.future.set_exception(error)


def _one_table(tables: list[pa.Table]) -> pa.Table:
    """The records of one commit as one table; a single record is used as it is (a commit of
    one message is the common case, and concatenating it made a new table: ~2 us)."""
    return tables[0] if len(tables) == 1 else pa.concat_tables(tables)
