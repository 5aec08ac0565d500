"""Settlement records as Python values: what an ack, a nack or a disposal writes to the journal.

Every settle frame a consumer sends becomes one journal record, most of them an ack of one or two
offsets. Built as a one-row Arrow table and written as an Arrow IPC stream, such a record cost
about 18 us of the broker's hot path (11.6 to build the table, 6.3 to encode it), and the mover
then concatenated hundreds of those tables for each Delta commit. A :class:`Settlement` keeps
the settle call's arguments instead; the group commit hands a commit's settlements on as
:class:`SettlementRows`, the hot tier writes them as a record of kind ``KIND_PLAIN_SETTLEMENTS``
(:meth:`SettlementRows.encode`), and a table of ``SETTLEMENT_SCHEMA`` is built only where one is
needed: for a Delta commit, many settlements at once (:func:`settlement_table`).
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa

from spark_mq.schema import (
    COMPACTED,
    RELEASED_PREFIX,
    SETTLED_RUN,
    SETTLEMENT_SCHEMA,
    ints,
    numpy_column,
    strings,
    variable_column,
)

# one settlement in a segment record: settle time, offset count, subscription, outcome and
# reason lengths (reason -1: none); then those three strings and the offsets (int64, little end)
_HEAD = struct.Struct("<qIIIi")
_STRING = pa.string()
_TIMES = SETTLEMENT_SCHEMA.field("settle_time").type


@dataclass(slots=True)
class Settlement:
    """``subscription`` is done with ``offsets`` (``outcome``: ack, returned, dead, ...)."""

    offsets: Sequence[int]
    subscription: str
    outcome: str
    settle_time_us: int
    reason: str | None = None

    @property
    def nbytes(self) -> int:
        """About what its rows take in memory (what the writer's pending bytes count)."""
        return 8 * len(self.offsets) + len(self.subscription) + len(self.reason or "") + 40

    def __repr__(self) -> str:  # not the offsets themselves: there may be thousands
        return (
            f"Settlement({self.subscription!r} {self.outcome} {len(self.offsets)} offset(s), "
            f"reason={self.reason!r})"
        )


class SettlementRows:
    """The settlements of one commit (or of consecutive ones), in the order they came: a row
    per offset; their table built only when asked for."""

    __slots__ = ("_table", "items")

    def __init__(self, items: list[Settlement]) -> None:
        self.items = items
        self._table: pa.Table | None = None

    @classmethod
    def joined(cls, parts: list[SettlementRows]) -> SettlementRows:
        """One value for the settlements of ``parts``, in order."""
        return cls([item for part in parts for item in part.items])

    @property
    def num_rows(self) -> int:
        items = self.items
        if len(items) == 1:
            return len(items[0].offsets)
        return sum(len(s.offsets) for s in items)

    @property
    def nbytes(self) -> int:
        """About what the settlements take in memory."""
        items = self.items
        if len(items) == 1:  # the usual commit of an ack
            return items[0].nbytes
        return sum(item.nbytes for item in items)

    def table(self) -> pa.Table:
        """One row of ``SETTLEMENT_SCHEMA`` per offset (built once)."""
        if self._table is None:
            self._table = settlement_table(self.items)
        return self._table

    # -- the segment record (``KIND_PLAIN_SETTLEMENTS``) ------------------------------------
    def encode(self) -> bytes:
        parts: list[bytes] = []
        for s in self.items:
            sub, outcome = s.subscription.encode(), s.outcome.encode()
            reason = s.reason.encode() if s.reason is not None else b""
            reason_size = -1 if s.reason is None else len(reason)
            offsets = np.asarray(s.offsets, dtype="<i8").tobytes()
            head = _HEAD.pack(s.settle_time_us, len(s.offsets), len(sub), len(outcome), reason_size)
            parts += (head, sub, outcome, reason, offsets)
        return b"".join(parts)

    @classmethod
    def decode(cls, payload: bytes | memoryview, rows: int) -> SettlementRows:
        """What :meth:`encode` wrote; ``ValueError`` unless it holds exactly ``rows`` offsets."""
        view = memoryview(payload)
        settlements, pos, found = [], 0, 0
        while pos < len(view):
            if pos + _HEAD.size > len(view):
                raise ValueError("a settlement record ends inside a settlement's header")
            when, n, sub_size, outcome_size, reason_size = _HEAD.unpack_from(view, pos)
            pos += _HEAD.size
            strings = pos + sub_size + outcome_size + max(reason_size, 0)
            end = strings + 8 * n
            if end > len(view):
                raise ValueError("a settlement runs past its record's payload")
            sub = bytes(view[pos : pos + sub_size]).decode()
            pos += sub_size
            outcome = bytes(view[pos : pos + outcome_size]).decode()
            pos += outcome_size
            reason = None if reason_size < 0 else bytes(view[pos:strings]).decode()
            offsets = np.frombuffer(view[strings:end], dtype="<i8").tolist()
            settlements.append(Settlement(offsets, sub, outcome, when, reason))
            found += n
            pos = end
        if found != rows:
            raise ValueError(f"a settlement record of {rows} row(s) holds {found}")
        return cls(settlements)


def settlement_table(settlements: list[Settlement]) -> pa.Table:
    """Rows of ``SETTLEMENT_SCHEMA`` for ``settlements``, built from buffers in one go."""
    counts = np.array([len(s.offsets) for s in settlements], np.int64)
    n = int(counts.sum())
    offsets = np.fromiter((o for s in settlements for o in s.offsets), np.int64, n)
    times = np.repeat(np.array([s.settle_time_us for s in settlements], np.int64), counts)
    return pa.table(
        [
            numpy_column(offsets, pa.int64()),
            _repeated([s.subscription for s in settlements], counts),
            _repeated([s.outcome for s in settlements], counts),
            numpy_column(times, _TIMES),
            _repeated([s.reason for s in settlements], counts),
        ],
        schema=SETTLEMENT_SCHEMA,
    )


# -- collapsing a settlement log ---------------------------------------------------------------
# Compaction and a destination's owner (spark_mq.broker.log_tending) replace the settlement rows
# below each subscription's low-water mark by one ``compacted`` row carrying the mark; the owner
# also replaces the rows of each long run of settled offsets above a mark (past a message held
# unacknowledged) by one ``settled-run`` row. The new rows are written first, then the rows they
# stand for removed, so a reader between the two (or after a crash) finds both and reads them
# the same way.


@dataclass(frozen=True, slots=True)
class Collapse:
    """What one collapse of a settlement log writes and removes. ``marks``: subscription ->
    low-water mark (every offset below it settled); ``runs``: subscription -> runs of settled
    offsets above its mark, ``(start, end)`` each (``start <= offset < end`` all settled). The
    rows that release a Spark query's claims are never removed: they count whatever their
    offset."""

    marks: dict[str, int]
    runs: dict[str, list[tuple[int, int]]] = field(default_factory=dict)

    def __bool__(self) -> bool:
        return bool(self.marks) or any(self.runs.values())

    def rows(self, now_us: int, reason: str) -> pa.Table:
        """One ``compacted`` row per mark (``reason`` its reason), one ``settled-run`` row per
        run (at the run's first offset, the run's end its reason)."""
        marks = [
            Settlement([mark], sub, COMPACTED, now_us, reason) for sub, mark in self.marks.items()
        ]
        runs = [
            Settlement([start], sub, SETTLED_RUN, now_us, str(end))
            for sub, spans in self.runs.items()
            for start, end in spans
        ]
        return settlement_table(marks + runs)

    def predicate(self) -> str:
        """The rows this collapse removes, as a Delta predicate: each subscription's rows below
        its mark (its older marks and runs too), and those in each of its runs but the run's
        own row."""
        kept = f"coalesce(reason, '') NOT LIKE '{RELEASED_PREFIX}%'"
        parts = [
            f"(subscription = {_quoted(sub)} AND offset < {int(mark)} AND {kept})"
            for sub, mark in self.marks.items()
        ]
        parts += [
            f"(subscription = {_quoted(sub)} AND offset >= {int(start)} AND offset < {int(end)}"
            f" AND {kept} AND NOT (outcome = '{SETTLED_RUN}' AND offset = {int(start)}"
            f" AND coalesce(reason, '') = '{int(end)}'))"
            for sub, spans in self.runs.items()
            for start, end in spans
        ]
        return " OR ".join(parts)

    def removes(self, subscription: str, offset: int, outcome: str, reason: str | None) -> bool:
        """Whether :meth:`predicate` names this row (for a log held in memory)."""
        if subscription not in self.marks and subscription not in self.runs:
            return False
        if (reason or "").startswith(RELEASED_PREFIX):
            return False
        if offset < self.marks.get(subscription, -1):
            return True
        return any(
            start <= offset < end
            and not (outcome == SETTLED_RUN and offset == start and reason == str(end))
            for start, end in self.runs.get(subscription, ())
        )

    def apply(self, rows: pa.Table) -> pa.Table:
        """``rows`` without those :meth:`predicate` names."""
        reasons: list[str | None] = rows["reason"].to_pylist()
        keep = [
            not self.removes(sub, offset, outcome, reason)
            for sub, offset, outcome, reason in zip(
                strings(rows["subscription"]),
                ints(rows["offset"]),
                strings(rows["outcome"]),
                reasons,
                strict=True,
            )
        ]
        return rows.filter(pa.array(keep, pa.bool_()))


def run_end(start: int, reason: str | None) -> int:
    """The end of the run a ``settled-run`` row at ``start`` stands for (``start + 1``, only
    its own offset, when its reason does not name an end past it)."""
    if reason is not None and reason.isdigit() and int(reason) > start:
        return int(reason)
    return start + 1


def _quoted(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def _repeated(values: list[str | None], counts: np.ndarray) -> pa.Array:
    """A string column of each of ``values`` (None: null) ``counts`` times. The values of a
    move are a few subscriptions, outcomes and reasons again and again: each distinct one is
    encoded once, then taken for every row."""
    index: dict[str | None, int] = {}
    codes = np.fromiter((index.setdefault(v, len(index)) for v in values), np.int32, len(values))
    distinct = variable_column(_STRING, [None if v is None else v.encode() for v in index])
    return distinct.take(numpy_column(np.repeat(codes, counts), pa.int32()))
