"""SQL's ``LIKE`` patterns, matched in time linear in the value (a selector's ``LIKE``): never by
a backtracking regular expression, with which ``'%a%a%a...%b'`` against a long run of ``a``
took seconds, and froze every client of the broker."""

from __future__ import annotations

from typing import cast

_ANY_ONE = object()  # "_": any one character


class LikePattern:
    """A LIKE pattern (``%``: any run of characters, ``_``: any one), matched in linear time.

    A pattern is a sequence of *pieces* split at ``%``: the first must match at the value's
    start, the last at its end, and the others in order, each as early as it can (taking a piece
    at its leftmost place never loses a match that a later place would give). A piece of literal
    characters is found with ``str.find``; a piece with ``_`` in it by a bit-parallel scan
    (one state bit per position in the piece, one pass over the value). Either way the value is
    read a bounded number of times, whatever the pattern: there is no backtracking.
    """

    def __init__(self, pattern: str, escape: str | None = None) -> None:
        pieces: list[list[object]] = [[]]
        i = 0
        while i < len(pattern):
            ch = pattern[i]
            if escape is not None and ch == escape and i + 1 < len(pattern):
                pieces[-1].append(pattern[i + 1])
                i += 2
                continue
            if ch == "%":
                pieces.append([])
            else:
                pieces[-1].append(_ANY_ONE if ch == "_" else ch)
            i += 1
        self._anchored_end = len(pieces) == 1  # no "%": the whole value is one piece
        self._first = pieces[0]
        self._middle = [p for p in pieces[1:-1] if p]
        self._last = pieces[-1] if len(pieces) > 1 else []

    def matches(self, value: str) -> bool:
        first, last = self._first, self._last
        if self._anchored_end:
            return len(value) == len(first) and _piece_at(first, value, 0)
        if len(value) < len(first) + len(last) or not _piece_at(first, value, 0):
            return False
        end = len(value) - len(last)
        if not _piece_at(last, value, end):
            return False
        pos = len(first)
        for piece in self._middle:
            found = _find_piece(piece, value, pos, end)
            if found < 0:
                return False
            pos = found + len(piece)
        return True


def _piece_at(piece: list[object], value: str, at: int) -> bool:
    """Whether ``piece`` matches ``value`` at ``at`` (the caller made sure it fits)."""
    if all(type(c) is str for c in piece):
        return value.startswith("".join(piece), at)  # type: ignore[arg-type]
    return all(c is _ANY_ONE or value[at + k] == c for k, c in enumerate(piece))


def _find_piece(piece: list[object], value: str, start: int, end: int) -> int:
    """The first position ``>= start`` where ``piece`` matches within ``value[:end]``, or -1."""
    if all(type(c) is str for c in piece):
        return value.find("".join(piece), start, end)  # type: ignore[arg-type]
    # shift-and: bit k of the state is set when the piece's first k+1 items match ending here
    masks: dict[str, int] = {}
    anyone = 0
    for k, c in enumerate(piece):
        if c is _ANY_ONE:
            anyone |= 1 << k
        else:
            masks[cast(str, c)] = masks.get(cast(str, c), 0) | 1 << k
    done = 1 << (len(piece) - 1)
    state = 0
    for i in range(start, end):
        state = ((state << 1) | 1) & (masks.get(value[i], 0) | anyone)
        if state & done:
            return i - len(piece) + 1
    return -1
