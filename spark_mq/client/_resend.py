"""A producer's batches that met a failover, sent again in their order to the broker that
serves now (a producer given several URLs: a primary and its backup; a cluster's members,
when a destination moved). Buffered sends' batches and ``send_batch(wait=False)`` tables alike.

Every batch gets a sequence number when it is first written and stays *unresolved* until the
broker answers it. One whose broker went away (``BrokerUnavailable``: the connection broke,
the broker was deposed or shut down for a switchover) is kept, not failed; a resender thread
then reconnects and writes the kept batches again in sequence order, each message with its
dedup id, so the new primary's duplicate detection stores once what the old one had already
made durable. While any batch waits to go again, new batches queue behind it: messages keep the
order they were sent in (per-group order survives a failover). A batch still unanswered
``timeout_s`` after it first failed fails with the broker's error.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

from spark_mq.client._outcome import Outcome
from spark_mq.client._pending import Pending, batch_of, plain_of
from spark_mq.errors import BrokerUnavailable, NotOwner, SparkMQError

log = logging.getLogger(__name__)


@dataclass(order=True)
class _Batch:
    """Messages ``send`` buffered (``items``, a future each), or a table ``send_batch`` gave
    (``table``, in chunks of ``chunk`` rows, one future for its offsets: ``whole``)."""

    seq: int
    dest: str = field(compare=False)
    items: list[Pending] = field(compare=False)
    failed_at: float | None = field(default=None, compare=False)
    error: SparkMQError | None = field(default=None, compare=False)
    table: pa.Table | None = field(default=None, compare=False)
    chunk: int = field(default=0, compare=False)
    whole: Future | None = field(default=None, compare=False)
    stream: object = field(default=None, compare=False)  # what it was last written to
    # written to a stream another batch failed on: it may fail too, and go again first
    doomed: bool = field(default=False, compare=False)


class Resender:
    def __init__(
        self,
        stream_for: Callable[[str], object],
        reconnect: Callable[[float, int], None],
        generation: Callable[[], int],
        timeout_s: float,
        follow: Callable[[str, NotOwner], None] | None = None,
    ) -> None:
        # a cluster: a batch refused because another member owns its destination goes there
        # (the producer's _follow, on this thread before the batch is written again)
        self._follow = follow
        self._stream_for = stream_for  # the producer's _stream(dest)
        self._reconnect = reconnect  # the producer's _reconnect(timeout_s, since generation)
        self._generation = generation  # how many times the producer has reconnected
        self._timeout_s = timeout_s
        self._seqs = itertools.count(1)
        self._cond = threading.Condition()
        self._unresolved: dict[int, _Batch] = {}
        self._waiting: list[_Batch] = []  # a heap, by sequence
        self._closed = False
        # the destination of the batch the resender took from the heap and has not written yet
        self._busy: str | None = None
        # each destination's stream its last batch was written to: batches of it still on
        # their way on another (refused for a move, or broken) go before any after them
        self._current: dict[str, object] = {}
        self._dest_locks: dict[str, threading.Lock] = {}  # (see _writing)
        self._thread: threading.Thread | None = None

    def send(self, dest: str, items: list[Pending]) -> None:
        """Write a new batch, or queue it behind batches waiting to go again."""
        self._send(_Batch(next(self._seqs), dest, items))

    def send_table(self, dest: str, table: pa.Table, chunk: int) -> Future:
        """``send`` of a table (its messages carry their dedup ids): the future of its
        offsets."""
        whole: Future = Future()
        self._send(_Batch(next(self._seqs), dest, [], table=table, chunk=chunk, whole=whole))
        return whole

    def _send(self, batch: _Batch) -> None:
        """Write a new batch, or queue it behind batches of its destination waiting to go
        again, those on their way that may yet fail, and one being written again."""
        with self._writing(batch.dest):
            with self._cond:
                self._unresolved[batch.seq] = batch
            self._write(batch)

    def _writing(self, dest: str) -> threading.Lock:
        """``dest``'s write lock: held from the choice of a batch's stream until it is written
        on it, so no batch of the destination is written between (two threads each choosing
        the same new stream wrote in either order)."""
        with self._cond:
            lock = self._dest_locks.get(dest)
            if lock is None:
                lock = self._dest_locks[dest] = threading.Lock()
            return lock

    def _must_wait(self, batch: _Batch, stream: object, resending: bool) -> bool:
        """(Under the condition's lock.) Whether ``batch`` goes after others of its
        destination: a new one after those waiting to go again, one being written again, and
        those on their way that may yet fail; any, after older ones still on a stream given
        up just now (before their refusal was heard: they may go again)."""
        dest = batch.dest
        if not resending and (
            self._busy == dest
            or any(b.dest == dest for b in self._waiting)
            or any(b.doomed and b.dest == dest for b in self._unresolved.values())
        ):
            return True
        if resending and any(b.dest == dest and b.seq < batch.seq for b in self._waiting):
            # an older one was refused again meanwhile (written just before this one, on the
            # stream given up since): it goes first. Written on the new stream ahead of it,
            # this one was stored first
            return True
        return any(
            o.dest == dest and o.seq < batch.seq and o.stream is not None
            and o.stream is not stream
            for o in self._unresolved.values()
        )  # fmt: skip

    def _write(self, batch: _Batch, *, resending: bool = False) -> BrokerUnavailable | None:
        """Write ``batch``; its answer comes through its futures. Resending, a broker that is
        not there to write to is returned (the resender reconnects), not queued again."""
        inner: list[Future]
        try:
            stream: Any = self._stream_for(batch.dest)
            with self._cond:
                self._current[batch.dest] = stream
                if self._must_wait(batch, stream, resending):
                    heapq.heappush(self._waiting, batch)
                    self._start()
                    self._cond.notify_all()
                    return None
                batch.stream, batch.doomed = stream, False
            if batch.table is not None:
                chunks = batch.table.to_batches(max_chunksize=batch.chunk)
                inner = [Future() for _ in chunks]
                for rows, f in zip(chunks, inner, strict=True):
                    stream.write(rows, Outcome(rows.num_rows, whole=f), waited=False)
            else:
                inner = [Future() for _ in batch.items]
                # plain messages as a PLAIN frame where the broker takes one, as the producer
                # writes them without a resender: built as an Arrow batch, a member's
                # synchronous send cost the client twice a single broker's CPU
                plain = plain_of(batch.items) if getattr(stream, "takes_plain", False) else None
                frame = plain or batch_of(batch.items, every_column=stream.every_column)
                stream.write(frame, Outcome(len(inner), per_message=inner), waited=False)
        except SparkMQError as exc:
            if resending and isinstance(exc, BrokerUnavailable):
                return exc
            self._answered(batch, None, exc)
            return None
        left = [len(inner)]
        lock = threading.Lock()

        def one_done(_: Future) -> None:
            with lock:
                left[0] -= 1
                if left[0]:
                    return
            errors = [f.exception() for f in inner if f.exception() is not None]
            if errors:
                self._answered(batch, None, errors[0])
            elif batch.table is not None:  # (a future a chunk, each of its offsets)
                self._answered(batch, [o for f in inner for o in f.result()], None)
            else:
                self._answered(batch, [f.result() for f in inner], None)

        for f in inner:
            f.add_done_callback(one_done)
        return None

    def _answered(
        self, batch: _Batch, offsets: list[int] | None, error: BaseException | None
    ) -> None:
        if error is None and offsets is not None:
            with self._cond:
                self._unresolved.pop(batch.seq, None)
                self._cond.notify_all()
            if batch.whole is not None:
                if not batch.whole.done():
                    batch.whole.set_result(offsets)
                return
            for item, offset in zip(batch.items, offsets, strict=True):
                if not item.future.done():
                    item.future.set_result(offset)
            return
        now = time.monotonic()
        if isinstance(error, BrokerUnavailable) and not self._closed:
            batch.failed_at = batch.failed_at or now
            batch.error = error
            if now - batch.failed_at < self._timeout_s:
                with self._cond:
                    # what may fail too, and so go again before the batches behind it: what
                    # is on the same stream, and its destination's older batches on their way
                    # (a batch that failed before it was written names no stream)
                    dead, batch.stream = batch.stream, None
                    for other in self._unresolved.values():
                        if (
                            other is not batch
                            and other.stream is not None
                            and (
                                other.stream is dead
                                or (other.dest == batch.dest and other.seq < batch.seq)
                            )
                        ):
                            other.doomed = True
                    heapq.heappush(self._waiting, batch)
                    self._start()
                    self._cond.notify_all()
                return
        with self._cond:
            self._unresolved.pop(batch.seq, None)
            self._cond.notify_all()
        failure = error or BrokerUnavailable("the broker went away")
        if batch.whole is not None and not batch.whole.done():
            batch.whole.set_exception(failure)
        for item in batch.items:
            if not item.future.done():
                item.future.set_exception(failure)

    def _start(self) -> None:
        if self._thread is None or not self._thread.is_alive():
            self._thread = threading.Thread(target=self._run, name="producer-resend", daemon=True)
            self._thread.start()

    def _next(self) -> _Batch | None:
        """The next batch to write again: the oldest waiting of a destination none of whose
        older batches is still on its way on a stream a batch failed on (each broken stream
        fails all it held, but one callback at a time: those go again first). Batches written
        since, to the stream that serves now, hold nothing up: that stream keeps their order."""
        with self._cond:
            while True:
                if not self._waiting:
                    if self._closed:
                        return None
                    self._cond.wait(1.0)
                    continue
                chosen = self._eligible()
                if chosen is None:
                    self._cond.wait(0.02)
                    continue
                self._waiting.remove(chosen)
                heapq.heapify(self._waiting)
                self._busy = chosen.dest
                return chosen

    def _eligible(self) -> _Batch | None:
        """(Under the condition's lock.) Not one with an older batch of its destination on
        its way that may yet fail: on a stream another batch failed on, or on one given up
        (its destination's batches are written to another now)."""
        seen: set[str] = set()
        waiting = {b.seq for b in self._waiting}
        for head in sorted(self._waiting):
            if head.dest in seen:
                continue  # (an older one of its destination goes first)
            seen.add(head.dest)
            current = self._current.get(head.dest)
            if not any(
                b.dest == head.dest and b.seq < head.seq and b.seq not in waiting
                and (b.doomed or (b.stream is not None and b.stream is not current))
                for b in self._unresolved.values()
            ):  # fmt: skip
                return head
        return None

    def _run(self) -> None:
        while (batch := self._next()) is not None:
            tries = 0
            while True:
                if isinstance(batch.error, NotOwner) and self._follow is not None:
                    self._follow(batch.dest, batch.error)
                    batch.error = None  # (followed once: a new refusal says where next)
                generation = self._generation()
                with self._writing(batch.dest):
                    gone = self._write(batch, resending=True)
                if gone is None:
                    break
                tries += 1
                if tries > 1:  # (the broker named may be the one gone: its cluster has not
                    time.sleep(min(0.05 * tries, 0.5))  # noticed yet; not a busy loop)
                started = batch.failed_at or time.monotonic()
                left = self._timeout_s - (time.monotonic() - started)
                if left <= 0:
                    self._answered(batch, None, gone)
                    break
                log.info(
                    "producer: %s; sending %d waiting batch(es) again where the data is served now",
                    gone.message,
                    len(self._waiting) + 1,
                )
                try:
                    self._reconnect(left, generation)
                except SparkMQError as exc:
                    self._answered(batch, None, exc)
                    break
            with self._cond:
                self._busy = None
                self._cond.notify_all()

    def wait_all(self, timeout: float | None = None) -> bool:
        """Until every batch is answered (or failed for good)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            while self._unresolved:
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    return False
                self._cond.wait(left if left is not None else 0.5)
        return True

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()
