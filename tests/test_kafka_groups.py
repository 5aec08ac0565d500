"""The Kafka group coordinator on its own (where Kafka-compatible brokers found their bugs):
concurrent joins, a storm of members, generations fencing old members, rebalances when members
come, leave, fall silent or do not join again, and a leader lost mid-rebalance. A real asyncio
loop runs its timers; the clock of session timeouts is the test's."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest
from kio.schema.errors import ErrorCode

from spark_mq.transports.kafka.groups import Coordinator, Joined, State, Synced


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def loop() -> Iterator[asyncio.AbstractEventLoop]:
    loop = asyncio.new_event_loop()
    yield loop
    loop.close()


def _run(loop: asyncio.AbstractEventLoop, seconds: float = 0.05) -> None:
    loop.run_until_complete(asyncio.sleep(seconds))


class Member:
    """A client's side: joins (with KIP-394's member id round trip), syncs, heartbeats."""

    def __init__(self, c: Coordinator, group: str, name: str, rebalance_s: float = 5.0) -> None:
        self.c, self.group, self.name = c, group, name
        self.id = ""
        self.rebalance_s = rebalance_s
        self.joined: list[Joined] = []
        self.synced: list[Synced] = []

    def join(self) -> None:
        def answered(j: Joined) -> None:
            self.joined.append(j)
            if j.error is ErrorCode.member_id_required:
                self.id = j.member_id
                self.join()
            elif j.error is ErrorCode.none:
                self.id = j.member_id

        self.c.join(
            self.group, self.id, client_id=self.name, host="127.0.0.1", session_timeout_s=10,
            rebalance_timeout_s=self.rebalance_s, protocol_type="consumer",
            protocols=[("range", self.name.encode())], member_id_required=True,
            respond=answered,
        )  # fmt: skip

    @property
    def last(self) -> Joined:
        return self.joined[-1]

    def sync(self, assignments: dict[str, bytes] | None = None) -> None:
        generation = self.last.generation
        self.c.sync(self.group, generation, self.id, assignments or {}, self.synced.append)

    def heartbeat(self) -> ErrorCode:
        return self.c.heartbeat(self.group, self.last.generation, self.id)


def _coordinator(loop: asyncio.AbstractEventLoop, clock: Clock | None = None) -> Coordinator:
    return Coordinator(loop, initial_delay_s=0.02, clock=clock or Clock())


def _settle(loop: asyncio.AbstractEventLoop, members: list[Member]) -> Member:
    """Let the rebalance finish; the leader hands every member its name; returns the leader."""
    _run(loop)
    done = [m for m in members if m.joined and m.last.error is ErrorCode.none]
    assert len(done) == len(members), [m.joined for m in members]
    generations = {m.last.generation for m in members}
    assert len(generations) == 1, generations
    (leader,) = [m for m in members if m.id == m.last.leader]
    assert {mid for mid, _ in leader.last.members} == {m.id for m in members}
    for m in members:
        if m is not leader:
            m.sync()
    leader.sync({m.id: m.name.encode() for m in members})
    for m in members:
        assert m.synced[-1].error is ErrorCode.none
        assert m.synced[-1].assignment == m.name.encode()
    return leader


def test_members_joining_together_get_one_generation_and_one_leader(
    loop: asyncio.AbstractEventLoop,
) -> None:
    c = _coordinator(loop)
    members = [Member(c, "g", f"m{i}") for i in range(3)]
    for m in members:
        m.join()
    _settle(loop, members)
    assert c.groups["g"].state is State.STABLE
    assert members[0].last.generation == 1


def test_a_storm_of_members_ends_in_one_generation_without_unknown_member_errors(
    loop: asyncio.AbstractEventLoop,
) -> None:
    c = _coordinator(loop)
    members = [Member(c, "storm", f"m{i}") for i in range(50)]
    for m in members:
        m.join()
    _settle(loop, members)
    errors = {j.error for m in members for j in m.joined}
    assert errors == {ErrorCode.member_id_required, ErrorCode.none}
    assert len(c.groups["storm"].members) == 50


def test_a_new_member_rebalances_the_group_and_old_generations_are_fenced(
    loop: asyncio.AbstractEventLoop,
) -> None:
    c = _coordinator(loop)
    a, b = Member(c, "g", "a"), Member(c, "g", "b")
    a.join()
    b.join()
    _settle(loop, [a, b])
    old = a.last.generation
    newcomer = Member(c, "g", "c")
    newcomer.join()
    assert a.heartbeat() is ErrorCode.rebalance_in_progress  # (told to join again)
    # what it read before it joins again it may still commit (as on Kafka: the revocation
    # callback's commit; refusing it made kafka-python's consumer give up)
    assert c.check_commit("g", old, a.id) is ErrorCode.none
    a.join()
    b.join()
    _run(loop)
    assert c.groups["g"].state is State.COMPLETING  # (joined; the leader has not synced yet)
    assert c.check_commit("g", a.last.generation, a.id) is ErrorCode.rebalance_in_progress
    assert c.check_commit("g", old, a.id) is ErrorCode.illegal_generation
    _settle(loop, [a, b, newcomer])
    assert a.last.generation == old + 1
    # an old generation's calls are refused; an unknown member's too
    assert c.heartbeat("g", old, a.id) is ErrorCode.illegal_generation
    assert c.check_commit("g", old, a.id) is ErrorCode.illegal_generation
    assert c.check_commit("g", a.last.generation, "nobody") is ErrorCode.unknown_member_id
    assert c.check_commit("g", a.last.generation, a.id) is ErrorCode.none
    stale: list[Synced] = []
    c.sync("g", old, a.id, {}, stale.append)
    assert stale[0].error is ErrorCode.illegal_generation


def test_a_member_that_does_not_join_again_in_time_is_out(
    loop: asyncio.AbstractEventLoop,
) -> None:
    c = _coordinator(loop)
    a, b = Member(c, "g", "a", rebalance_s=0.1), Member(c, "g", "b", rebalance_s=0.1)
    a.join()
    b.join()
    _settle(loop, [a, b])
    c2 = Member(c, "g", "c", rebalance_s=0.1)
    c2.join()
    a.join()  # b never joins again
    _run(loop, 0.3)
    assert b.id not in c.groups["g"].members
    assert c.heartbeat("g", b.last.generation, b.id) is ErrorCode.unknown_member_id
    _settle(loop, [a, c2])


def test_silent_members_are_out_after_their_session_timeout(
    loop: asyncio.AbstractEventLoop,
) -> None:
    clock = Clock()
    c = _coordinator(loop, clock)
    a, b = Member(c, "g", "a"), Member(c, "g", "b")
    a.join()
    b.join()
    _settle(loop, [a, b])
    clock.now += 6
    assert a.heartbeat() is ErrorCode.none  # a is heard; b is not
    clock.now += 6
    assert c.sweep() == []  # (a is left: the group is not empty)
    assert set(c.groups["g"].members) == {a.id}
    assert a.heartbeat() is ErrorCode.rebalance_in_progress
    a.join()
    _settle(loop, [a])
    clock.now += 11
    assert c.sweep() == ["g"] and c.empty("g")  # (emptied: a cluster's keeps it so)


def test_a_leader_lost_before_it_syncs_sends_the_others_round_again(
    loop: asyncio.AbstractEventLoop,
) -> None:
    c = _coordinator(loop)
    members = [Member(c, "g", f"m{i}") for i in range(3)]
    for m in members:
        m.join()
    _run(loop)
    (leader,) = [m for m in members if m.id == m.last.leader]
    others = [m for m in members if m is not leader]
    for m in others:
        m.sync()  # waiting for the leader's assignments
    assert all(not m.synced for m in others)
    assert c.leave("g", [leader.id]) == [ErrorCode.none]
    assert [m.synced[-1].error for m in others] == [ErrorCode.rebalance_in_progress] * 2
    for m in others:
        m.join()
    new_leader = _settle(loop, others)
    assert new_leader in others


def test_every_member_leaving_empties_the_group_and_a_standalone_commit_is_allowed(
    loop: asyncio.AbstractEventLoop,
) -> None:
    c = _coordinator(loop)
    a = Member(c, "g", "a")
    a.join()
    _settle(loop, [a])
    assert c.check_commit("g", -1, "") is ErrorCode.unknown_member_id  # (it has members)
    assert c.leave("g", [a.id, "nobody"]) == [ErrorCode.none, ErrorCode.unknown_member_id]
    assert c.groups["g"].state is State.EMPTY
    assert c.check_commit("g", -1, "") is ErrorCode.none
    assert c.forget("g") is ErrorCode.none and "g" not in c.groups


def test_a_stable_groups_membership_restored_elsewhere_carries_on_in_its_generation(
    loop: asyncio.AbstractEventLoop,
) -> None:
    # (a cluster's coordinator moving: the membership kept as JSON beside the offsets, read
    # back by the next coordinator) its members heartbeat, sync and commit as they were
    import json

    c = _coordinator(loop)
    members = [Member(c, "g", f"m{i}") for i in range(2)]
    for m in members:
        m.join()
    assert c.snapshot("g") is None and not c.empty("g")  # (not stable yet: nothing to keep)
    leader = _settle(loop, members)
    kept = json.loads(json.dumps({"g": c.snapshot("g")}))
    other = _coordinator(loop)
    other.restore(kept, term=3)
    assert other.term == 3 and other.groups["g"].state is State.STABLE
    for m in members:
        m.c = other
        assert m.heartbeat() is ErrorCode.none
        assert other.check_commit("g", m.last.generation, m.id) is ErrorCode.none
        m.sync()
        assert m.synced[-1].assignment == m.name.encode()  # (its assignment, as it was)
    assert other.groups["g"].leader == leader.id
    assert other.heartbeat("g", members[0].last.generation - 1, members[0].id) is (
        ErrorCode.illegal_generation
    )
    # restored again (the offsets came back after another coordinated): what this one held
    # goes, a join waiting on it is told to find the coordinator again
    newcomer = Member(other, "g", "late")
    newcomer.join()
    newcomer.join()  # (again with the id it was given: waits for the rebalance)
    other.restore({}, term=4)
    assert newcomer.last.error is ErrorCode.not_coordinator
    assert other.groups == {} and members[0].heartbeat() is ErrorCode.unknown_member_id


def test_a_kept_membership_that_cannot_be_read_is_skipped_and_its_members_join_again(
    loop: asyncio.AbstractEventLoop,
) -> None:
    import json

    c = _coordinator(loop)
    members = [Member(c, g, "m") for g in ("good", "bad", "worse")]
    for m in members:
        m.join()
        _settle(loop, [m])
    kept = json.loads(json.dumps({g: c.snapshot(g) for g in ("good", "bad", "worse")}))
    kept["bad"]["protocol"] = 7  # (not text)
    del kept["worse"]["members"][0]["assignment"]
    other = _coordinator(loop)
    other.restore(kept, term=2)
    assert set(other.groups) == {"good"}
    members[0].c = members[1].c = other
    assert members[0].heartbeat() is ErrorCode.none
    assert members[1].heartbeat() is ErrorCode.unknown_member_id  # (it joins again)
