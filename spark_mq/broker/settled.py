"""The settled offsets of a subscription above its low-water mark.

Below a subscription's low-water mark every offset is settled; above it, most usually are too:
its mark stops at its first unsettled message, and a message held unacknowledged (one scheduled
far ahead, one in a long lease, one a consumer keeps) holds it there while everything after it
is acknowledged. Those offsets were a Python set: some 60 bytes an offset, and copied whole at
every tick to forget what fell below the mark (30-60 ms a million, every 100 ms, under the
subscription's lock). Here they are a byte an offset from the lowest one that may still be asked
about: adding one, asking about one and forgetting those below a new mark cost the same however
many there are, and a batch of consecutive offsets is one slice.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import numpy as np

_MIN_ROOM = 1024


def sorted_unique(offsets: np.ndarray) -> np.ndarray:
    """``offsets`` sorted, each once. (numpy 2.4's ``np.unique`` hashes: 1.5-1.7 s for two
    million offsets where sorting takes 0.1, measured.)"""
    out = np.sort(offsets)
    if len(out) > 1:
        out = out[np.r_[True, out[1:] != out[:-1]]]
    return out


class SettledOffsets:
    """A set of offsets (non-negative ints) for a window that moves up: ``forget_below`` drops
    what lies under a mark. Not locked: its subscription's lock guards it."""

    __slots__ = ("_base", "_count", "_flags", "_top")

    def __init__(self, offsets: Iterable[int] | np.ndarray = ()) -> None:
        arr = offsets if isinstance(offsets, np.ndarray) else np.fromiter(offsets, np.int64)
        self._base = int(arr.min()) if len(arr) else 0
        top = int(arr.max()) if len(arr) else 0
        self._flags = np.zeros(max(_MIN_ROOM, top - self._base + 1), dtype=np.bool_)
        self._flags[arr - self._base] = True  # (no sort: repeats set a flag twice)
        self._count = int(np.count_nonzero(self._flags))
        self._top = top if len(arr) else -1  # the highest offset (-1: none)

    # -- asking ------------------------------------------------------------------------------
    def __contains__(self, offset: object) -> bool:
        i = offset - self._base  # type: ignore[operator]
        return 0 <= i < len(self._flags) and bool(self._flags[i])

    def __len__(self) -> int:
        return self._count

    def __bool__(self) -> bool:
        return self._count > 0

    def __iter__(self) -> Iterator[int]:
        return iter(self.offsets().tolist())

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, SettledOffsets):
            return NotImplemented
        return bool(np.array_equal(self.offsets(), other.offsets()))

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"SettledOffsets({self._count} from {self._base})"

    def offsets(self) -> np.ndarray:
        """Every offset, sorted (int64)."""
        return np.flatnonzero(self._flags) + self._base

    def highest(self) -> int:
        """The highest offset, or -1."""
        return self._top if self._count else -1

    def count_from(self, start: int) -> int:
        """How many offsets are ``start`` or above."""
        i = max(start - self._base, 0)
        return int(np.count_nonzero(self._flags[i:])) if i < len(self._flags) else 0

    def mask(self, offsets: np.ndarray) -> np.ndarray:
        """Of ``offsets`` (int64), which are here."""
        i = offsets - self._base
        inside = (i >= 0) & (i < len(self._flags))
        out = np.zeros(len(offsets), dtype=np.bool_)
        out[inside] = self._flags[i[inside]]
        return out

    def settled(self, offsets: np.ndarray, mark: int) -> np.ndarray:
        """Of ``offsets``, which are settled for a subscription whose low-water mark is
        ``mark`` and whose settled offsets past it these are: those below it, and those here."""
        return (offsets < mark) | self.mask(offsets)

    # -- changing ----------------------------------------------------------------------------
    def add(self, offset: int) -> None:
        i = offset - self._base
        if not 0 <= i < len(self._flags):
            self._room(offset, offset)
            i = offset - self._base
        if not self._flags[i]:
            self._flags[i] = True
            self._count += 1
            if offset > self._top:
                self._top = offset

    def update(self, offsets: list[int]) -> None:
        """Add each of ``offsets`` (distinct ints)."""
        n = len(offsets)
        if n < 8:
            for o in offsets:
                self.add(o)
            return
        low, high = min(offsets), max(offsets)
        self._room(low, high)
        self._top = max(self._top, high)
        a, b = low - self._base, high - self._base + 1
        if b - a == n:  # consecutive (acks mostly are): one slice
            self._count += n - int(np.count_nonzero(self._flags[a:b]))
            self._flags[a:b] = True
            return
        i = np.fromiter(offsets, np.int64, n) - self._base
        self._count += n - int(np.count_nonzero(self._flags[i]))
        self._flags[i] = True

    def forget_below(self, mark: int) -> None:
        """Drop every offset under ``mark``."""
        cut = mark - self._base
        if cut <= 0:
            return
        if cut >= len(self._flags) or self._top < mark:
            if self._count:  # (none held, the usual case at a tick: the flags are all down)
                self._flags = np.zeros(_MIN_ROOM, dtype=np.bool_)
            self._count, self._top = 0, -1
        else:
            if self._count:
                self._count -= int(np.count_nonzero(self._flags[:cut]))
            kept = self._flags[cut:]
            # (a view keeps the whole array alive: copied once it is a small part of it)
            whole = kept.base if kept.base is not None else kept
            self._flags = kept.copy() if len(kept) * 4 < len(whole) else kept
        self._base = mark

    def _room(self, low: int, high: int) -> None:
        """Make room for offsets ``low`` to ``high``, growing by half again at least."""
        size = len(self._flags)
        if low >= self._base and high < self._base + size:
            return
        if not self._count:  # (all flags down: they may stand for any offsets)
            self._base = low
            if high - low >= size:
                self._flags = np.zeros(max(high - low + 1, size + size // 2), dtype=np.bool_)
            return
        base = min(low, self._base)
        need = max(high, self._base + size - 1) - base + 1
        flags = np.zeros(max(need, size + size // 2), dtype=np.bool_)
        flags[self._base - base : self._base - base + size] = self._flags
        self._flags, self._base = flags, base
