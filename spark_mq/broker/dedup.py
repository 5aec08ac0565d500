"""Duplicate detection: a message whose dedup id was seen recently is acknowledged, not stored.

One cache per destination, bounded two ways: the newest ``size`` ids (Artemis' id-cache-size,
20,000) seen within ``window_s`` seconds (SQS FIFO's five-minute deduplication interval). An id
is claimed when its batch arrives, so a resend racing the original is caught too; it gets its
offset once the original is durable and is forgotten again if the original fails (a retry must
then be stored). After a restart the cache is refilled from the message log's newest rows.

A duplicate is answered with the offset the original got, like Artemis answering a duplicate send
as a success without storing it.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from concurrent.futures import Future
from dataclasses import dataclass

from spark_mq.journal.base import AppendResult


class _Batch:
    """One stored batch the cache's ids point into: an id's offset is ``first + position``."""

    __slots__ = ("failed", "first", "future")

    def __init__(self) -> None:
        self.future: Future | None = None  # set by bind(); None for ids read back at recovery
        self.first: int | None = None
        self.failed = False


_RECOVERED = _Batch()
_RECOVERED.first = 0  # a recovered id's "position" is its offset

# dedup id -> (when it arrived, the batch storing it, its position among that batch's rows)
_Entry = tuple[float, _Batch, int]


@dataclass(frozen=True)
class ProduceResult:
    """What a produced batch became: an offset per row (a duplicate's is its original's)."""

    offsets: list[int]
    duplicates: int


class DuplicateCache:
    def __init__(self, size: int, window_s: float) -> None:
        self.size = size
        self.window_s = window_s
        self._lock = threading.Lock()
        self._seen: OrderedDict[str, _Entry] = OrderedDict()
        self.duplicates_total = 0

    def __len__(self) -> int:
        return len(self._seen)

    def _evict(self, now: float) -> None:
        seen = self._seen
        for _ in range(len(seen) - self.size):
            seen.popitem(last=False)
        oldest = now - self.window_s
        while seen and next(iter(seen.values()))[0] < oldest:
            seen.popitem(last=False)

    def remember(self, dedup_id: str, offset: int, at: float) -> None:
        """Record a stored message (recovery reads them back from the log, oldest first)."""
        with self._lock:
            self._seen[dedup_id] = (at, _RECOVERED, offset)
            self._seen.move_to_end(dedup_id)
            self._evict(at)

    def claim(
        self, ids: list[str | None], now: float
    ) -> tuple[list[int], dict[int, tuple[_Batch, int]], _Batch]:
        """Split a batch: the rows to store, and for each duplicate row where its original is.

        New ids are claimed for the returned batch at once (:meth:`bind` ties it to the
        append); an id seen twice in one batch is a duplicate of its first row.
        """
        batch = _Batch()
        with self._lock:
            self._evict(now)
            seen = self._seen
            named = [i for i in ids if i is not None]
            if len(set(named)) == len(named) and seen.keys().isdisjoint(named):
                # the usual case, no duplicate: claim them all in one go
                seen.update((i, (now, batch, row)) for row, i in enumerate(ids) if i is not None)
                self._evict(now)
                return list(range(len(ids))), {}, batch
            keep: list[int] = []
            dups: dict[int, tuple[_Batch, int]] = {}
            for row, dedup_id in enumerate(ids):
                if dedup_id is None:
                    keep.append(row)
                    continue
                entry = seen.get(dedup_id)
                if entry is not None and not entry[1].failed and entry[0] >= now - self.window_s:
                    dups[row] = (entry[1], entry[2])
                    continue
                seen[dedup_id] = (now, batch, len(keep))
                seen.move_to_end(dedup_id)
                keep.append(row)
            self._evict(now)
            self.duplicates_total += len(dups)
        return keep, dups, batch

    def release(self, batch: _Batch) -> None:
        """The batch was refused before it reached the journal: its ids were never stored."""
        batch.failed = True

    def bind(self, batch: _Batch, future: Future) -> None:
        """Tie a claimed batch to the append storing its rows."""
        batch.future = future

        def done(f: Future) -> None:
            if f.exception() is None:
                batch.first = f.result().first_offset
            else:  # not stored: a retry must not be taken for a duplicate
                batch.failed = True

        future.add_done_callback(done)


def combine(
    rows: int, keep: list[int], stored: Future | None, dups: dict[int, tuple[_Batch, int]]
) -> Future:
    """One future of a batch's :class:`ProduceResult`, once its rows and originals are durable."""
    waits = {id(b.future): b.future for b, _ in dups.values() if b.future is not None}
    if stored is not None:
        waits[id(stored)] = stored
    result: Future = Future()
    left = [len(waits)]
    lock = threading.Lock()

    def finish() -> None:
        offsets = [0] * rows
        try:
            if stored is not None:
                first = stored.result().first_offset
                for pos, row in enumerate(keep):
                    offsets[row] = first + pos
            for row, (batch, position) in dups.items():
                if batch.future is not None:
                    res: AppendResult = batch.future.result()  # raises if the original failed
                    offsets[row] = res.first_offset + position
                else:
                    offsets[row] = (batch.first or 0) + position  # recovered from the log
        except Exception as exc:
            result.set_exception(exc)
            return
        result.set_result(ProduceResult(offsets, len(dups)))

    def one_done(_: Future) -> None:
        with lock:
            left[0] -= 1
            if left[0]:
                return
        finish()

    if not waits:
        finish()
    for f in waits.values():
        f.add_done_callback(one_done)
    return result
