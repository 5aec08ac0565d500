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


@dataclass
class _Seen:
    at: float  # wall-clock seconds the original arrived
    offset: int | None = None  # None until the original is durable
    original: Future | None = None  # the original's append, while it is under way
    position: int = 0  # the original's row among the rows that append stores


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
        self._seen: OrderedDict[str, _Seen] = OrderedDict()
        self.duplicates_total = 0

    def __len__(self) -> int:
        return len(self._seen)

    def _evict(self, now: float) -> None:
        oldest = now - self.window_s
        while self._seen:
            first = next(iter(self._seen.values()))
            if len(self._seen) <= self.size and first.at >= oldest:
                break
            self._seen.popitem(last=False)

    def remember(self, dedup_id: str, offset: int, at: float) -> None:
        """Record a stored message (recovery reads them back from the log, oldest first)."""
        with self._lock:
            self._seen[dedup_id] = _Seen(at, offset)
            self._seen.move_to_end(dedup_id)
            self._evict(at)

    def claim(self, ids: list[str | None], now: float) -> tuple[list[int], dict[int, _Seen]]:
        """Split a batch: the rows to store, and for each duplicate row what it duplicates.

        New ids are claimed at once (their offsets come with :meth:`bind`); an id seen twice in
        one batch is a duplicate of its first row.
        """
        keep: list[int] = []
        dups: dict[int, _Seen] = {}
        with self._lock:
            self._evict(now)
            for row, dedup_id in enumerate(ids):
                if dedup_id is None:
                    keep.append(row)
                    continue
                seen = self._seen.get(dedup_id)
                if seen is not None and seen.at >= now - self.window_s:
                    dups[row] = seen
                    continue
                self._seen[dedup_id] = _Seen(now, position=len(keep))
                self._seen.move_to_end(dedup_id)
                keep.append(row)
            self._evict(now)
            self.duplicates_total += len(dups)
        return keep, dups

    def release(self, ids: list[str | None]) -> None:
        """Forget claims whose batch was refused before it reached the journal."""
        with self._lock:
            for dedup_id in ids:
                seen = self._seen.get(dedup_id) if dedup_id is not None else None
                if seen is not None and seen.offset is None and seen.original is None:
                    del self._seen[dedup_id]

    def bind(self, ids: list[str | None], future: Future) -> None:
        """Tie the claimed ``ids`` (the stored rows, in order) to the append storing them."""
        with self._lock:
            claimed = [self._seen.get(i) for i in ids if i is not None]
            for seen in claimed:
                if seen is not None and seen.offset is None:
                    seen.original = future

        def done(f: Future) -> None:
            with self._lock:
                for dedup_id in ids:
                    seen = self._seen.get(dedup_id) if dedup_id is not None else None
                    if seen is None or seen.original is not f:
                        continue
                    if f.exception() is None:
                        seen.offset = f.result().first_offset + seen.position
                        seen.original = None
                    else:  # not stored: a retry must not be taken for a duplicate
                        del self._seen[dedup_id]

        future.add_done_callback(done)


def combine(rows: int, keep: list[int], stored: Future | None, dups: dict[int, _Seen]) -> Future:
    """One future of a batch's :class:`ProduceResult`, once its rows and originals are durable."""
    waits = {id(s.original): s.original for s in dups.values() if s.original is not None}
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
            for row, seen in dups.items():
                if seen.offset is not None:
                    offsets[row] = seen.offset
                elif seen.original is not None:  # bound, not yet recorded: ask the original
                    res: AppendResult = seen.original.result()
                    offsets[row] = res.first_offset + seen.position
                else:  # claims are bound under the destination's produce lock
                    raise AssertionError("a duplicate of an unbound claim")
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
