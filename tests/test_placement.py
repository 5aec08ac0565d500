"""Placement (spark_mq.cluster.placement): every destination on a live member, pins honoured,
counts within one of each other, nothing moved without a reason, a joining member taking its
share and no more, a leaving member's destinations only moving."""

from __future__ import annotations

import math

from hypothesis import given
from hypothesis import strategies as st

from spark_mq.cluster.placement import moves, place

MEMBERS = st.lists(st.sampled_from([f"m{i}" for i in range(6)]), min_size=1, unique=True)
NAMES = st.lists(st.text("abcdefgh", min_size=1, max_size=4), unique=True, max_size=40)


def _counts(owner: dict[str, str], members: list[str]) -> list[int]:
    return [sum(1 for m in owner.values() if m == member) for member in members]


@given(MEMBERS, NAMES, st.data())
def test_every_destination_lands_on_a_live_member_and_counts_stay_within_one(
    members: list[str], names: list[str], data: st.DataObject
) -> None:
    # owners now: anyone, alive or gone, or nobody
    current = {
        n: o
        for n in names
        if (o := data.draw(st.sampled_from([None, "gone", *members]))) is not None
    }
    owner = place(members, dict.fromkeys(names, 1.0), current)
    assert set(owner) == set(names)
    assert set(owner.values()) <= set(members)
    counts = _counts(owner, members)
    assert max(counts) - min(counts) <= 1
    # the same inputs again: the same answer, and placing the answer moves nothing
    assert place(list(reversed(members)), dict.fromkeys(names, 1.0), current) == owner
    assert moves(owner, place(members, dict.fromkeys(names, 1.0), owner)) == {}


@given(MEMBERS, NAMES, st.sampled_from([f"m{i}" for i in range(6, 9)]))
def test_a_joining_member_takes_its_share_and_no_more_moves(
    members: list[str], names: list[str], newcomer: str
) -> None:
    loads = dict.fromkeys(names, 1.0)
    before = place(members, loads, {})
    after = place([*members, newcomer], loads, before)
    moved = moves(before, after)
    assert all(new == newcomer for _, new in moved.values())  # only to the newcomer
    assert len(moved) <= math.ceil(len(names) / (len(members) + 1))
    counts = _counts(after, [*members, newcomer])
    assert max(counts) - min(counts) <= 1


@given(MEMBERS.filter(lambda m: len(m) > 1), NAMES)
def test_only_a_leaving_members_destinations_move(members: list[str], names: list[str]) -> None:
    loads = dict.fromkeys(names, 1.0)
    before = place(members, loads, {})
    gone = members[0]
    after = place(members[1:], loads, before)
    assert {n for n in moves(before, after)} == {n for n, m in before.items() if m == gone}
    counts = _counts(after, members[1:])
    assert max(counts) - min(counts) <= 1


@given(MEMBERS, NAMES, st.data())
def test_a_pin_to_a_live_member_wins_and_a_pin_to_a_gone_one_waits(
    members: list[str], names: list[str], data: st.DataObject
) -> None:
    pins = {n: data.draw(st.sampled_from([*members, "gone"])) for n in names[: len(names) // 2]}
    owner = place(members, dict.fromkeys(names, 1.0), {}, pins)
    for name, member in pins.items():
        if member == "gone":
            assert owner[name] in members  # placed as any other meanwhile
        else:
            assert owner[name] == member


@given(MEMBERS, st.dictionaries(st.text("abcdef", min_size=1, max_size=3), st.floats(0.1, 50)))
def test_weighted_loads_end_within_one_destination_of_each_other(
    members: list[str], loads: dict[str, float]
) -> None:
    owner = place(members, loads, {})
    per = {m: sum(loads[n] for n, o in owner.items() if o == m) for m in members}
    if loads:
        assert max(per.values()) - min(per.values()) <= max(loads.values()) + 1e-6


def test_no_member_no_placement_and_ties_break_by_name() -> None:
    assert place([], {"a": 1.0}, {}) == {}
    assert place(["b", "a"], {"x": 1.0, "y": 1.0}, {}) == {"x": "a", "y": "b"}


@given(
    st.lists(st.sampled_from([f"m{i}" for i in range(4)]), min_size=2, unique=True),
    st.integers(2, 12),
    st.lists(st.text("xyz", min_size=1, max_size=3), unique=True, max_size=8),
)
def test_a_new_destinations_partitions_spread_over_the_members(
    members: list[str], partitions: int, others: list[str]
) -> None:
    """Placed on members that are equally loaded, a destination's partitions are within one of
    each other on each member (partitions are what spreads one destination's load)."""
    first = place(members, dict.fromkeys(others, 1.0), {})
    balanced = max(_counts(first, members)) == min(_counts(first, members))
    parts = {f"orders~{i}": 1.0 for i in range(partitions)}
    owner = place(members, {**dict.fromkeys(others, 1.0), **parts}, first)
    per_member = [sum(1 for n in parts if owner[n] == m) for m in members]
    assert max(_counts(owner, members)) - min(_counts(owner, members)) <= 1
    if balanced:
        assert max(per_member) - min(per_member) <= 1, (per_member, first)
    else:  # (the least loaded takes more, but never all of them while another could)
        assert sum(1 for c in per_member if c) >= min(len(members), 2) or partitions < 2


def test_a_destination_s_dead_letter_and_expiry_queues_go_with_it() -> None:
    """A DLQ or expiry queue is placed with its destination (a partitioned one's with its
    partition 0) and moves with it, its load counted as the destination's; one pinned goes
    where it is pinned; one whose destination is not there is placed as any queue."""
    names = {n: 1.0 for n in ("a", "DLQ.a", "EXP.a", "b", "DLQ.b", "c~0", "c~1", "DLQ.c", "DLQ.z")}
    owner = place(["m1", "m2"], names, {}, {"DLQ.b": "m2"})
    assert owner["DLQ.a"] == owner["EXP.a"] == owner["a"]
    assert owner["DLQ.c"] == owner["c~0"]
    assert owner["DLQ.b"] == "m2"
    assert owner["c~0"] != owner["c~1"]  # (partitions still spread)
    # "a" weighs 3 with its side queues, "c~0" 2 with its DLQ: the loads still balance
    counts = _counts(owner, ["m1", "m2"])
    assert abs(counts[0] - counts[1]) <= 1, owner
    moved = place(["m1", "m2"], names, owner, {"a": "m2" if owner["a"] == "m1" else "m1"})
    assert moved["DLQ.a"] == moved["EXP.a"] == moved["a"] != owner["a"]
    assert moves(owner, moved).keys() >= {"a", "DLQ.a", "EXP.a"}
