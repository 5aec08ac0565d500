"""Which member owns which destination: a pure function of who is alive, what exists, who owns
what now and what an operator pinned.

The rules, in order:

1. A destination pinned to a live member goes there (an operator's word wins); pinned to a
   member that is gone, it is placed as any other until that member is back.
2. A destination stays with its owner while the owner lives: every move costs a hand-over
   (drain, fence, assign, redirect), so nothing moves without a reason.
3. A destination without a live owner (new, or its owner gone) goes to the least loaded member;
   a partition counts the partitions of its destination a member has as load too, so that a
   destination's partitions spread over the members (what partitioning a destination is for).
4. Then, while moving one destination from a more loaded member to the least loaded one makes
   the two closer (its load is less than their difference), the smallest such one of the most
   loaded member that has one moves (pinned destinations never do).
   With equal loads this ends with member counts at most one apart; a member that joins takes
   its share, and no more than its share moves.

A destination's load is a weight (1.0 unless the caller knows better: a message rate, say); a
topic is placed with all its subscriptions, as one destination, and a destination's dead-letter
and expiry queues (``DLQ.<name>``, ``EXP.<name>``; a partitioned one's with its partition 0) go
with it, their loads counted as its, unless pinned: a message is copied there by the member
that dead-letters it, which then need not forward the copy, and they move with it rather than
on their own (before, a DLQ was balanced as any queue and moved back and forth as its queue
did). The function is deterministic (ties broken by name), so every member computing it from the
same inputs gets the same answer.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from spark_mq.names import logical_name, partition_name, side_queue_of


def place(
    members: Iterable[str],
    destinations: Mapping[str, float],
    current: Mapping[str, str],
    pins: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """The owner of each destination in ``destinations`` (name → load), given the live
    ``members``, the ``current`` owners (destination → member, any of them gone) and ``pins``
    (destination → member). Empty when no member lives."""
    live = sorted(set(members))
    if not live:
        return {}
    pins = pins or {}
    follows = _companions(destinations, {n for n, m in pins.items() if m in live})
    weights = {n: w for n, w in destinations.items() if n not in follows}
    for name, leader in follows.items():
        weights[leader] += destinations[name]
    owner = _place(live, weights, current, pins)
    for name, leader in follows.items():
        owner[name] = owner[leader]
    return owner


def _companions(destinations: Mapping[str, float], pinned: set[str]) -> dict[str, str]:
    """Each side queue placed with its destination (not pinned itself) → that destination."""
    out: dict[str, str] = {}
    for name in destinations:
        base = side_queue_of(name)
        if base is None or name in pinned:
            continue
        for leader in (base, partition_name(base, 0)):
            if leader in destinations and side_queue_of(leader) is None:
                out[name] = leader
                break
    return out


def _place(
    live: list[str],
    destinations: Mapping[str, float],
    current: Mapping[str, str],
    pins: Mapping[str, str],
) -> dict[str, str]:
    load = dict.fromkeys(live, 0.0)
    owner: dict[str, str] = {}
    fixed: set[str] = set()
    for name in sorted(destinations):
        pinned = pins.get(name)
        if pinned in load:
            owner[name] = pinned
            fixed.add(name)
        elif current.get(name) in load:
            owner[name] = current[name]
        else:
            continue
        load[owner[name]] += destinations[name]
    # new and orphaned destinations, heaviest first, each to the least loaded member
    orphans = [n for n in destinations if n not in owner]
    siblings: dict[tuple[str, str], int] = {}  # (destination, member) → its partitions there
    for name, member in owner.items():
        key = (logical_name(name), member)
        siblings[key] = siblings.get(key, 0) + 1
    for name in sorted(orphans, key=lambda n: (-destinations[n], n)):
        base = logical_name(name)
        to = min(live, key=lambda m: (load[m] + siblings.get((base, m), 0), m))
        owner[name] = to
        load[to] += destinations[name]
        siblings[(base, to)] = siblings.get((base, to), 0) + 1
    _balance(owner, load, destinations, fixed)
    return owner


def _balance(
    owner: dict[str, str], load: dict[str, float], weights: Mapping[str, float], fixed: set[str]
) -> None:
    # each move lowers the sum of squared loads by 2w(gap - w) > 0, so this ends; the most
    # loaded member with something movable gives (one whose load is all pinned gives nothing)
    while True:
        least = min(load, key=lambda m: (load[m], m))
        for most in sorted(load, key=lambda m: (-load[m], m)):
            gap = load[most] - load[least]
            if gap <= 1e-9:
                return
            movable = [
                n
                for n, m in owner.items()
                if m == most and n not in fixed and weights[n] < gap - 1e-9
            ]
            if movable:
                name = min(movable, key=lambda n: (weights[n], n))
                owner[name] = least
                load[most] -= weights[name]
                load[least] += weights[name]
                break
        else:
            return


def moves(before: Mapping[str, str], after: Mapping[str, str]) -> dict[str, tuple[str | None, str]]:
    """What changed hands: destination → (old owner or None, new owner)."""
    return {n: (before.get(n), m) for n, m in after.items() if before.get(n) != m}
