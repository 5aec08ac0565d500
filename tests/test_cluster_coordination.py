"""Members and placement on a real ZooKeeper (spark_mq.cluster.coordination): members see each
other and share the destinations; a member that leaves, dies (SIGKILL) or is paused past its
session has its destinations moved, and only those; a paused one steps aside and joins again;
pins; a member added takes its share. (ZooKeeper stopped for a while, with brokers serving
meanwhile, moves nothing: tests/test_cluster.py.)"""

from __future__ import annotations

import itertools
import subprocess
import sys
import textwrap
import time
from collections import Counter
from collections.abc import Callable, Iterator

import pytest

from spark_mq.cluster.coordination import Assignment, Coordinator
from spark_mq.errors import ConfigError
from tests.conftest import wait_for
from tests.zk_kit import ZooKeeper

pytestmark = pytest.mark.process

SESSION_S = 2.0  # short sessions: a dead member is noticed within seconds
_clusters = itertools.count()


@pytest.fixture
def cluster(zookeeper: ZooKeeper) -> Iterator[Callable[..., Coordinator]]:
    """Start members of a cluster of this test's own (a name of its own in the same ZooKeeper)."""
    name = f"t{next(_clusters)}"
    started: list[Coordinator] = []

    def member(
        member_id: str, hosts: str | None = None, cluster_name: str | None = None
    ) -> Coordinator:
        c = Coordinator(
            hosts or zookeeper.hosts,
            member_id,
            f"grpc://{member_id}:1",
            cluster=cluster_name or name,
            session_timeout_s=SESSION_S,
        )
        c.start()
        started.append(c)
        return c

    yield member
    for c in started:
        if c.health != "stopped":
            c.stop()


def _member_process(hosts: str, cluster: str, member_id: str) -> subprocess.Popen[str]:
    """A member in a process of its own (to be killed or paused); prints its health changes."""
    code = textwrap.dedent(f"""
        import threading
        from spark_mq.cluster.coordination import Coordinator
        c = Coordinator({hosts!r}, {member_id!r}, "grpc://{member_id}:1", cluster={cluster!r},
                        session_timeout_s={SESSION_S},
                        on_health=lambda h: print(h, flush=True))
        c.start()
        print("up", flush=True)
        threading.Event().wait()  # a member until the test kills it
    """)
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    while (line := proc.stdout.readline().strip()) != "up":  # (its health on the way)
        assert line, "the member process ended before it was up"
    return proc


def _balanced(c: Coordinator, names: set[str], members: set[str]) -> bool:
    a = c.assignments()
    if set(a) != names or {x.member for x in a.values()} != members:
        return False
    counts = Counter(x.member for x in a.values()).values()
    return max(counts) - min(counts) <= 1


def test_members_see_each_other_elect_one_leader_and_share_the_destinations(cluster) -> None:
    a, b, c = cluster("a"), cluster("b"), cluster("c")
    names = {f"d{i}" for i in range(9)}
    for n in names:
        a.add_destination(n)
    for m in (a, b, c):
        wait_for(lambda m=m: _balanced(m, names, {"a", "b", "c"}), 10, "a balanced placement")
    assert a.assignments() == b.assignments() == c.assignments()
    assert sorted(a.members()) == ["a", "b", "c"]
    assert a.members()["b"].endpoint == "grpc://b:1"
    assert a.leader == b.leader == c.leader == "a"  # the first to join
    assert len({x.epoch for x in a.assignments().values()}) == 9  # each hand-over its own epoch


def test_every_member_reads_a_destinations_kind_as_registered(cluster) -> None:
    """What a member checks a STOMP destination's kind against when another serves it: read
    once from ZooKeeper, forgotten once the destination goes."""
    a, b = cluster("a"), cluster("b")
    a.add_destination("orders", kind="queue")
    a.register({"news": "topic", "orders": "topic"})  # (registered already: kept as it was)
    b.add_destination("old")  # (an older member's registration: no kind)
    wait_for(lambda: {"orders", "news", "old"} <= set(b.destinations()), 10, "registrations")
    assert (b.kind_of("orders"), b.kind_of("news"), b.kind_of("old")) == ("queue", "topic", None)
    # a member starting registers what it finds recorded: the kind an older member left out is
    # added (and what was registered with one is kept)
    b.register({"old": "topic", "orders": "topic"})
    wait_for(lambda: a.kind_of("old") == "topic", 10, "the older registration's kind")
    assert a.kind_of("orders") == "queue"
    assert a.kind_of("orders") == "queue" and a.kind_of("missing") is None
    a.remove_destination("orders")
    wait_for(lambda: "orders" not in b.destinations(), 10, "the deletion seen")
    assert b.kind_of("orders") is None  # (not kept past its registration)


def test_a_member_that_leaves_has_its_destinations_moved_and_no_other(cluster) -> None:
    a, b, c = cluster("a"), cluster("b"), cluster("c")
    names = {f"d{i}" for i in range(9)}
    for n in names:
        b.add_destination(n)
    wait_for(lambda: _balanced(a, names, {"a", "b", "c"}), 10, "a balanced placement")
    before = a.assignments()
    started = time.monotonic()
    c.stop()  # a planned leave: its node goes at once
    wait_for(lambda: _balanced(a, names, {"a", "b"}), 10, "c's destinations placed again")
    took = time.monotonic() - started
    after = a.assignments()
    for name, was in before.items():
        if was.member == "c":
            assert after[name].member in ("a", "b")
            assert after[name].epoch > max(x.epoch for x in before.values())
        else:
            assert after[name] == was  # untouched: same owner, same epoch
    assert took < 3


def test_a_killed_member_is_replaced_after_its_session_and_a_paused_one_steps_aside(
    cluster, zookeeper: ZooKeeper
) -> None:
    a = cluster("a")
    name = a.root.rsplit("/", 1)[1]
    killed = _member_process(zookeeper.hosts, name, "k")
    paused = _member_process(zookeeper.hosts, name, "p")
    try:
        names = {f"d{i}" for i in range(6)}
        for n in names:
            a.add_destination(n)
        wait_for(lambda: _balanced(a, names, {"a", "k", "p"}), 10, "a balanced placement")
        started = time.monotonic()
        killed.kill()  # SIGKILL: no goodbye; its session lapses after SESSION_S
        placed = a.assignments()
        wait_for(lambda: _balanced(a, names, {"a", "p"}), 15, "k's destinations placed again")
        assert time.monotonic() - started < SESSION_S + 4
        # (k is gone: nobody is waited for to let its destinations go)
        moved = [x for n, x in a.assignments().items() if placed[n].member == "k"]
        assert moved and all(x.previous == "" for x in moved), moved

        # paused past its session: the others give it up; resumed, it learns it was (lost) and
        # joins again as a newcomer, with destinations under new epochs
        before = a.assignments()
        paused.send_signal(subprocess.signal.SIGSTOP)
        wait_for(lambda: _balanced(a, names, {"a"}), 15, "p's destinations placed again")
        paused.send_signal(subprocess.signal.SIGCONT)
        assert paused.stdout is not None
        seen: list[str] = []
        while not ("lost" in seen and "connected" in seen[seen.index("lost") :]):
            line = paused.stdout.readline().strip()
            assert line, f"the paused member ended: {seen}"
            seen.append(line)
        assert "lost" in seen, seen  # it learnt it was given up, then joined again
        wait_for(lambda: _balanced(a, names, {"a", "p"}), 15, "p back with a share")
        top = max(x.epoch for x in before.values())
        assert all(x.epoch > top for x in a.assignments().values() if x.member == "p")
    finally:
        for proc in (killed, paused):
            proc.kill()
            proc.wait(10)


def test_a_killed_leaders_destinations_are_placed_by_the_next_leader_at_once(
    cluster, zookeeper: ZooKeeper
) -> None:
    # the next leader has been a member for longer than a session: the dead leader's
    # destinations are placed as soon as its session expires, not a session later (a leader
    # that has just joined waits that long: a cluster starting again, its members one by one)
    name = f"t{next(_clusters)}"
    leader = _member_process(zookeeper.hosts, name, "l")
    try:
        a = cluster("a", cluster_name=name)
        b = cluster("b", cluster_name=name)
        names = {f"d{i}" for i in range(6)}
        for n in names:
            a.add_destination(n)
        wait_for(lambda: _balanced(a, names, {"l", "a", "b"}), 10, "a balanced placement")
        assert a.leader == "l"
        wait_for(lambda: time.monotonic() - b._joined_at > SESSION_S, 10, "b long a member")
        started = time.monotonic()
        leader.kill()
        wait_for(lambda: _balanced(a, names, {"a", "b"}), 15, "l's destinations placed again")
        took = time.monotonic() - started
        assert a.leader == "a"
        # its session (2 s) and ZooKeeper's expiry tick (0.5 s), and no more than moments
        assert took < SESSION_S + 1.5, took
    finally:
        leader.kill()
        leader.wait(10)


def test_a_pin_moves_a_destination_and_a_new_member_takes_its_share(cluster) -> None:
    a, b = cluster("a"), cluster("b")
    names = {f"d{i}" for i in range(8)}
    for n in names:
        a.add_destination(n)
    wait_for(lambda: _balanced(a, names, {"a", "b"}), 10, "a balanced placement")
    target = next(n for n, x in a.assignments().items() if x.member == "a")
    old = a.assignments()[target]
    b.pin(target, "b")
    wait_for(lambda: a.owner_of(target) is not None and a.owner_of(target).member == "b", 10, "pin")
    moved = a.owner_of(target)
    assert isinstance(moved, Assignment) and moved.epoch > old.epoch
    # a hand-over's first phase: a (alive) is named as the member it moves from, and b may
    # fence it once a said it let it go for b's epoch (an earlier epoch's word is not enough)
    assert moved.previous == "a"
    assert not b.handed_over(target, moved.epoch)
    a.handed(target, moved.epoch - 1)
    assert not b.handed_over(target, moved.epoch)
    a.handed(target, moved.epoch)
    assert b.handed_over(target, moved.epoch) and not b.handed_over(target, moved.epoch + 1)
    # pinned elsewhere again: moved at once, not at the leader's next rescan (5 s on; a leader
    # settling after its election looks again sooner, so the test waits that out first)
    wait_for(lambda: time.monotonic() > a._settle_until + 0.3, 10, "the leader settled")
    b.pin(target, "a")
    wait_for(lambda: a.owner_of(target).member == "a", 1, "pinned to a again")  # type: ignore[union-attr]

    before = a.assignments()
    cluster("c")
    wait_for(lambda: _balanced(a, names, {"a", "b", "c"}), 10, "c given its share")
    after = a.assignments()
    changed = {n for n in names if after[n] != before[n]}
    assert all(after[n].member == "c" for n in changed)  # moves only to the newcomer
    assert len(changed) == 2  # 8 over three members: 3, 3, 2 (the pinned one stays with a)
    assert after[target].member == "a"


def test_a_second_member_of_the_same_name_and_an_unreachable_zookeeper_are_refused(
    cluster,
) -> None:
    cluster("a")
    with pytest.raises(ConfigError, match="already in cluster"):
        cluster("a")
    with pytest.raises(ConfigError, match="cannot reach ZooKeeper"):
        Coordinator("127.0.0.1:9", "x", "grpc://x:1").start(timeout_s=1)
