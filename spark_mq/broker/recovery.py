"""Rebuilding a destination's delivery state from its logs after a (re)start.

For every subscription: every offset below its *low-water mark* is settled; above it, the
settled offsets are kept as :class:`~spark_mq.broker.settled.SettledOffsets` (a byte an
offset). Of the message rows from the lowest low-water mark to the end of the log, those some
subscription has not settled are read back into memory (the offsets first, then those rows).

Compaction replaces a subscription's settlement rows below its low-water mark by one row with
outcome ``compacted`` whose offset is that mark (:data:`COMPACTED`): every offset below it is
settled. A destination's owner does too, and replaces the rows of a long run of settled offsets
above a mark by one ``settled-run`` row (:data:`SETTLED_RUN`): every offset from its own to the
end its reason names is settled (:class:`spark_mq.journal.settlements.Collapse`).

An offset below the log's end that the message log holds no row for (the offsets of a record
the hot tier quarantined: see :mod:`spark_mq.journal.hot_tier`) is settled for everyone
(:func:`log_gaps`): nobody can ever receive it, and a low-water mark must pass it.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from spark_mq.broker.settled import SettledOffsets, sorted_unique
from spark_mq.journal import DestinationInfo, Journal
from spark_mq.journal.settlements import Collapse, run_end
from spark_mq.schema import (
    COMPACTED,
    RELEASED_PREFIX,
    SETTLED_RUN,
    equal_to,
    fill_null,
    ints,
    strings,
)

log = logging.getLogger(__name__)

# a delivery came back unsettled (nack, lapsed lease, consumer gone): not a settlement, but
# counted, so delivery counts and dead-lettering survive a restart
RETURNED = "returned"
# a delivery is about to be made (only with delivery.persist_delivery_count): counted, so the
# delivery count stays exact even for deliveries a crash interrupted
DELIVERED = "delivered"
# a Spark query claimed the offset for one of its micro-batches (reason: "<claimant>#<n>");
# settled when the query commits the batch (an ack)
CLAIMED = "claimed"
NOT_SETTLED = (RETURNED, DELIVERED, CLAIMED)


@dataclass
class RecoveredSubscription:
    name: str
    start_offset: int
    low_water: int
    settled_above: SettledOffsets
    returned: dict[int, int]  # offset -> deliveries that came back, for unsettled offsets
    claims: dict[str, dict[int, list[int]]]  # claimant -> claim number -> unsettled offsets
    released: set[str] = field(default_factory=set)  # claimants that may not claim again


@dataclass
class Settled:
    """One subscription's settled offsets: all below ``below``, and those in ``offsets``."""

    below: int
    offsets: np.ndarray


def settled_by_subscription(settlements: pa.Table, end: int | None = None) -> dict[str, Settled]:
    """Per subscription name: its compaction mark and its sorted, unique settled offsets.
    ``end``: the message log's, which no ``settled-run`` row's run passes (a row naming an end
    past it, which the broker never writes, is read as ending there, and the log says so)."""
    out: dict[str, Settled] = {}
    if settlements.num_rows == 0:
        return out
    settlements = settlements.filter(
        pc.invert(pc.is_in(settlements["outcome"], pa.array(NOT_SETTLED, pa.string())))
    )
    for name in strings(pc.unique(settlements["subscription"])):
        rows = settlements.filter(equal_to(settlements["subscription"], name))
        marks = equal_to(rows["outcome"], COMPACTED)
        below = pc.max(rows.filter(marks)["offset"]).as_py() or 0
        runs = rows.filter(equal_to(rows["outcome"], SETTLED_RUN))
        spans = []
        for start, reason in zip(ints(runs["offset"]), runs["reason"].to_pylist(), strict=True):
            stop = run_end(start, reason)
            if end is not None and stop > max(end, start + 1):
                log.warning(
                    "subscription %r: a settled-run row at offset %d names its end %d, past the "
                    "message log's end %d: read as ending there",
                    name, start, stop, end,
                )  # fmt: skip
                stop = max(end, start + 1)
            spans.append(np.arange(start, stop, dtype=np.int64))
        single = rows.filter(pc.invert(marks))["offset"].to_numpy()
        out[name] = Settled(below, sorted_unique(np.concatenate([single, *spans])))
    return out


def low_water(start: int, settled: Settled | None) -> tuple[int, SettledOffsets]:
    """The first unsettled offset >= ``start``, and the settled offsets above it."""
    if settled is None:
        return start, SettledOffsets()
    start = max(start, settled.below)
    above = settled.offsets[settled.offsets >= start]
    expected = np.arange(start, start + len(above))
    gaps = np.nonzero(above != expected)[0]
    n = int(gaps[0]) if len(gaps) else len(above)
    return start + n, SettledOffsets(above[n:])


# a run of settled offsets above a low-water mark is collapsed into one row once this many
# rows of its subscription lie in it; at most this many runs a collapse (a predicate each)
RUN_ROWS = 100
MAX_RUNS = 32


def collapse_plan(settlements: pa.Table, info: DestinationInfo) -> Collapse:
    """What a collapse of ``settlements`` (a destination's settlement log) may do, as they tell
    it: per subscription of ``info``, its low-water mark where it moved past its last one, and
    the runs of settled offsets above it that hold at least ``RUN_ROWS`` of its rows (the
    ``MAX_RUNS`` holding most). Offsets a quarantined record left out count as unsettled here:
    a lower mark and shorter runs, never wrong ones."""
    settled = settled_by_subscription(settlements)
    marks: dict[str, int] = {}
    runs: dict[str, list[tuple[int, int]]] = {}
    for sub in info.subscriptions.values():
        mine = settled.get(sub.name)
        if mine is None:
            continue
        mark, _ = low_water(sub.start_offset, mine)
        if mark > mine.below:
            marks[sub.name] = mark
        spans = _long_runs(settlements, sub.name, mine.offsets[mine.offsets > mark])
        if spans:
            runs[sub.name] = spans
    return Collapse(marks, runs)


def _long_runs(settlements: pa.Table, name: str, above: np.ndarray) -> list[tuple[int, int]]:
    """The runs of consecutive offsets in ``above`` (sorted, unique) that hold at least
    ``RUN_ROWS`` of subscription ``name``'s rows (a release of claims not counted: it stays),
    the ``MAX_RUNS`` holding most, in offset order."""
    if not len(above):
        return []
    breaks = np.nonzero(np.diff(above) != 1)[0] + 1
    starts = above[np.r_[0, breaks]]
    ends = above[np.r_[breaks - 1, len(above) - 1]] + 1
    rows = settlements.filter(equal_to(settlements["subscription"], name))
    released = fill_null(pc.starts_with(rows["reason"], RELEASED_PREFIX), False)
    offsets = np.sort(rows.filter(pc.invert(released))["offset"].to_numpy())
    counts = np.searchsorted(offsets, ends) - np.searchsorted(offsets, starts)
    pick = np.nonzero(counts >= RUN_ROWS)[0]
    pick = np.sort(pick[np.argsort(-counts[pick], kind="stable")][:MAX_RUNS])
    return [(int(starts[i]), int(ends[i])) for i in pick]


def log_gaps(present: np.ndarray, start: int, end: int) -> np.ndarray:
    """The offsets in ``[start, end)`` that the message log holds no row for, sorted (rows
    compaction removed are settled already; others are the offsets of a quarantined record)."""
    if start >= end:
        return np.empty(0, np.int64)
    present = present[(present >= start) & (present < end)]
    if len(present) == end - start:
        return np.empty(0, np.int64)
    return np.setdiff1d(np.arange(start, end, dtype=np.int64), present, assume_unique=True)


def with_gaps(settled: dict[str, Settled], names: list[str], gaps: np.ndarray) -> None:
    """Count ``gaps`` (:func:`log_gaps`) as settled by every subscription in ``names``."""
    if not len(gaps):
        return
    for name in names:
        mine = settled.get(name)
        if mine is None:
            settled[name] = Settled(0, gaps)
        else:
            settled[name] = Settled(mine.below, sorted_unique(np.concatenate([mine.offsets, gaps])))


def returned_counts(settlements: pa.Table) -> dict[str, dict[int, int]]:
    """Per subscription name: how many deliveries of each offset ended without an ack.

    Each return is recorded; with ``persist_delivery_count`` each delivery is too, and then a
    delivery a crash interrupted counts as well: the larger of the two counts wins.
    """
    returned = _counts(settlements, RETURNED)
    delivered = _counts(settlements, DELIVERED)
    for name, counts in delivered.items():
        mine = returned.setdefault(name, {})
        for offset, n in counts.items():
            mine[offset] = max(mine.get(offset, 0), n)
    return returned


def _counts(settlements: pa.Table, outcome: str) -> dict[str, dict[int, int]]:
    rows = settlements.filter(equal_to(settlements["outcome"], outcome))
    out: dict[str, dict[int, int]] = {}
    if rows.num_rows == 0:
        return out
    # with a hot tier a row may be read twice while it moves: count distinct returns
    rows = rows.group_by(["subscription", "offset", "settle_time"]).aggregate([])
    grouped = rows.group_by(["subscription", "offset"]).aggregate([("settle_time", "count")])
    for name, offset, n in zip(
        strings(grouped["subscription"]),
        ints(grouped["offset"]),
        ints(grouped["settle_time_count"]),
        strict=True,
    ):
        out.setdefault(name, {})[offset] = n
    return out


def released_claimants(settlements: pa.Table) -> dict[str, set[str]]:
    """Per subscription: the claimants whose claims were released (they may not claim again)."""
    returned = settlements.filter(equal_to(settlements["outcome"], RETURNED))
    rows = returned.filter(pc.starts_with(returned["reason"], RELEASED_PREFIX))  # (null: no)
    out: dict[str, set[str]] = {}
    subs, reasons = strings(rows["subscription"]), strings(rows["reason"])
    for sub, reason in zip(subs, reasons, strict=True):
        out.setdefault(sub, set()).add(reason[len(RELEASED_PREFIX) :])
    return out


def claims_of(
    settlements: pa.Table, released: dict[str, set[str]]
) -> dict[str, dict[str, dict[int, list[int]]]]:
    """Per subscription: each claimant's claims (number -> offsets), settled or not; a claimant
    in ``released`` (per subscription, :func:`released_claimants`) holds none."""
    rows = settlements.filter(equal_to(settlements["outcome"], CLAIMED))
    out: dict[str, dict[str, dict[int, list[int]]]] = {}
    seen: set[tuple[str, str | None, int]] = set()  # a row read twice while the hot tier moves
    reasons: list[str | None] = rows["reason"].to_pylist()
    for sub, offset, reason in zip(
        strings(rows["subscription"]), ints(rows["offset"]), reasons, strict=True
    ):
        if (sub, reason, offset) in seen:
            continue
        seen.add((sub, reason, offset))
        claimant, _, number = (reason or "").rpartition("#")
        if claimant and number.isdigit() and claimant not in released.get(sub, ()):
            out.setdefault(sub, {}).setdefault(claimant, {}).setdefault(int(number), []).append(
                offset
            )
    return out


def recover_destination(
    journal: Journal, info: DestinationInfo
) -> tuple[list[RecoveredSubscription], pa.Table]:
    end = journal.end_offset(info.name)
    settlements = journal.read_settlements(info.name) if end else None
    settled = settled_by_subscription(settlements, end) if settlements is not None else {}
    returned = returned_counts(settlements) if settlements is not None else {}
    released = released_claimants(settlements) if settlements is not None else {}
    claimed = claims_of(settlements, released) if settlements is not None else {}
    marks = {
        s.name: low_water(s.start_offset, settled.get(s.name)) for s in info.subscriptions.values()
    }
    first = min((low for low, _ in marks.values()), default=end)
    # (the offsets first: past a message held unacknowledged, most rows above it are settled,
    # and only those some subscription has not settled are read whole below)
    rows = journal.read_messages(info.name, first, end, ["offset"]) if first < end else None
    if rows is not None:
        gaps = log_gaps(rows["offset"].to_numpy(), first, end)
        if len(gaps):
            with_gaps(settled, list(info.subscriptions), gaps)
            marks = {
                s.name: low_water(s.start_offset, settled.get(s.name))
                for s in info.subscriptions.values()
            }
    subs = []
    for sub in info.subscriptions.values():
        low, above = marks[sub.name]
        counts = {
            o: n for o, n in returned.get(sub.name, {}).items() if o >= low and o not in above
        }
        claims = {
            claimant: {
                number: live
                for number, offsets in numbers.items()
                if (live := [o for o in offsets if o >= low and o not in above])
            }
            for claimant, numbers in claimed.get(sub.name, {}).items()
        }
        subs.append(
            RecoveredSubscription(
                sub.name,
                sub.start_offset,
                low,
                above,
                counts,
                claims,
                released.get(sub.name, set()),
            )
        )
    if rows is None:
        return subs, journal.read_messages(info.name, end, end)
    return subs, _unsettled_rows(journal, info.name, rows["offset"], subs)


# a destination's unsettled rows are read range by range when they lie in at most this many runs of
# consecutive offsets (each a read Delta's file statistics narrow down), else in one read
RANGE_READS = 16


def _unsettled_rows(
    journal: Journal, name: str, offsets: pa.ChunkedArray, subs: list[RecoveredSubscription]
) -> pa.Table:
    """The whole rows of ``offsets`` (a destination's message log's, from its lowest low-water
    mark to its end) but those every one of ``subs`` has settled."""
    present = np.sort(offsets.to_numpy())
    by_all = np.ones(len(present), dtype=np.bool_)
    for sub in subs:
        by_all &= sub.settled_above.settled(present, sub.low_water)
    present = present[~by_all]
    if not len(present):
        return journal.read_messages(name, 0, 0)
    breaks = np.nonzero(np.diff(present) != 1)[0] + 1
    starts = present[np.r_[0, breaks]]
    ends = present[np.r_[breaks - 1, len(present) - 1]] + 1
    if len(starts) <= RANGE_READS:
        return pa.concat_tables(
            [journal.read_messages(name, int(a), int(b)) for a, b in zip(starts, ends, strict=True)]
        )
    rows = journal.read_messages(name, int(starts[0]), int(ends[-1]))
    return rows.filter(pc.is_in(rows["offset"], pa.array(present, pa.int64())))
