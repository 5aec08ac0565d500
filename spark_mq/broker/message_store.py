"""The Arrow rows of one destination that some subscription may still need.

Rows arrive in offset order (one chunk per group commit, or the unsettled rows read back at
recovery); chunks whose every offset is below all subscriptions' low-water marks are dropped.
Bounded only by what is unsettled: paging bodies out of memory is the memory-states work.
"""

from __future__ import annotations

import bisect
import threading
from collections.abc import Iterable

import numpy as np
import pyarrow as pa


class MessageStore:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._firsts: list[int] = []
        self._offsets: list[np.ndarray] = []
        self._chunks: list[pa.Table] = []

    def add(self, rows: pa.Table) -> None:
        """Add rows whose offsets are sorted and above every offset already held."""
        if rows.num_rows == 0:
            return
        offsets = rows["offset"].to_numpy()
        with self._lock:
            if self._offsets and offsets[0] <= self._offsets[-1][-1]:
                raise ValueError("rows must be added in increasing offset order")
            self._firsts.append(int(offsets[0]))
            self._offsets.append(offsets)
            self._chunks.append(rows.combine_chunks())

    def scan(self, start: int, limit: int, skip: set[int]) -> tuple[list[int], int]:
        """Up to ``limit`` held offsets >= ``start`` not in ``skip``; and the next start."""
        out: list[int] = []
        cursor = start
        with self._lock:
            i = max(bisect.bisect_right(self._firsts, start) - 1, 0)
            for offsets in self._offsets[i:]:
                j = int(np.searchsorted(offsets, cursor))
                for o in offsets[j:]:
                    o = int(o)
                    cursor = o + 1
                    if o in skip:
                        continue
                    out.append(o)
                    if len(out) >= limit:
                        return out, cursor
        return out, cursor

    def take(self, offsets: Iterable[int]) -> pa.Table:
        """The rows of ``offsets`` (held ones), in increasing offset order."""
        wanted = np.unique(np.fromiter(offsets, dtype=np.int64))
        parts = []
        if len(wanted) == 0:
            raise KeyError("no offsets requested")
        with self._lock:
            # only the chunks that can hold wanted offsets: O(log chunks + chunks touched)
            first = max(bisect.bisect_right(self._firsts, int(wanted[0])) - 1, 0)
            last = bisect.bisect_right(self._firsts, int(wanted[-1]))
            for first_offsets, chunk in zip(
                self._offsets[first:last], self._chunks[first:last], strict=True
            ):
                lo = np.searchsorted(wanted, first_offsets[0])
                hi = np.searchsorted(wanted, first_offsets[-1], side="right")
                if lo == hi:
                    continue
                idx = np.searchsorted(first_offsets, wanted[lo:hi])
                parts.append(chunk.take(pa.array(idx)))
        if not parts:
            raise KeyError("none of the requested offsets is held")
        return pa.concat_tables(parts)

    def drop_below(self, offset: int) -> int:
        """Forget whole chunks entirely below ``offset``; returns how many rows went."""
        dropped = 0
        with self._lock:
            while self._offsets and self._offsets[0][-1] < offset:
                dropped += len(self._offsets[0])
                del self._firsts[0], self._offsets[0], self._chunks[0]
        return dropped

    @property
    def rows(self) -> int:
        with self._lock:
            return sum(len(o) for o in self._offsets)

    @property
    def nbytes(self) -> int:
        with self._lock:
            return sum(c.nbytes for c in self._chunks)
