"""A cluster member's hot tier on the shared root: a new owner seals the old owner's segments,
moves what it acknowledged to Delta, and the old owner acknowledges nothing more
(spark_mq.journal.sealing). Real Delta tables, two journals on one root, as two members."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from spark_mq.errors import Deposed
from spark_mq.journal import DeltaStore, Journal
from spark_mq.journal.hot_tier import HotTierSettings
from spark_mq.journal.sealing import has_segments
from spark_mq.messages import Messages
from tests.test_journal_conformance import rows as unoffset


def member(root: Path, deposed: list[Deposed]) -> Journal:
    """A member's journal: the shared root, the hot tier under it, nothing moved by itself."""
    hot = HotTierSettings(str(root / "_hot"), move_interval_s=3600, shared=True)
    store = DeltaStore(str(root))
    store.on_deposed = deposed.append
    j = Journal(store, hot_tier=hot)
    j.open(shared=True)
    return j


def take(j: Journal, name: str, epoch: int) -> None:
    """What Broker.acquire does: the owner's directory, the fence, then the adoption."""
    j.claim(name, epoch)
    j.store.fence_destination(name, epoch)  # type: ignore[attr-defined]
    assert j.adopt(name, epoch) is not None


def send(j: Journal, name: str, *bodies: bytes) -> list[int]:
    result = j.append(name, Messages.of(unoffset(list(bodies)))).result(30)
    return list(range(result.first_offset, result.first_offset + len(bodies)))


def test_a_new_owner_moves_what_the_old_one_acknowledged_and_seals_it_off(tmp_path: Path) -> None:
    told_a: list[Deposed] = []
    a = member(tmp_path, told_a)
    b = member(tmp_path, [])
    try:
        a.create_destination("q", "queue")
        take(a, "q", 1)
        acked = [send(a, "q", b"m%d" % i, b"n%d" % i) for i in range(5)]
        a.settle("q", [0, 1], subscription="").result(30)  # an ack, acknowledged too
        q_dir = tmp_path / "_hot" / "q"
        assert DeltaStore(str(tmp_path)).committed_end("q") == 0  # all in a's hot tier only
        assert has_segments(str(tmp_path / "_hot")) == ["q"]

        take(b, "q", 2)  # b seals a's directory and moves its records
        assert sorted(os.listdir(q_dir)) == ["e2"]
        assert b.end_offset("q") == 10
        got = b.read_messages("q")
        assert got["offset"].to_pylist() == [o for pair in acked for o in pair]
        assert got["body"].to_pylist()[:2] == [b"m0", b"n0"]
        assert b.read_settlements("q")["offset"].to_pylist() == [0, 1]
        assert DeltaStore(str(tmp_path)).committed_end("q") == 10  # in Delta, with b's epoch

        # a has not noticed: its next write is synced, then refused, and the member told
        with pytest.raises(Deposed, match="sealed this member's hot tier"):
            send(a, "q", b"too late")
        assert [e.fields["destination"] for e in told_a] == ["q"]
        assert not (q_dir / "e1").exists()  # nothing made a's directory again

        assert send(b, "q", b"next") == [10]  # b goes on from the end a reached
        b.close()  # (drains into Delta)
        delta = DeltaStore(str(tmp_path))
        assert delta.read_messages("q", 0, None)["offset"].to_pylist() == list(range(11))
        assert sorted(delta.read_settlements("q")["offset"].to_pylist()) == [0, 1]
    finally:
        a.close()
        b.close()


def test_an_owner_replaced_before_it_opened_its_log_cannot_write_where_no_one_looks(
    tmp_path: Path,
) -> None:
    a = member(tmp_path, [])
    b = member(tmp_path, [])
    try:
        a.create_destination("q", "queue")
        a.claim("q", 1)
        a.store.fence_destination("q", 1)  # type: ignore[attr-defined]
        take(b, "q", 2)  # before a adopted it: b seals a's (empty) directory all the same
        # a's own directory is gone, and a does not make it again: it was taken over
        with pytest.raises(Deposed, match="another member took it over before this one opened"):
            a.adopt("q", 1)
        assert sorted(os.listdir(tmp_path / "_hot" / "q")) == ["e2"]
        assert send(b, "q", b"only b") == [0]
    finally:
        a.close()
        b.close()


def test_a_single_broker_on_a_root_a_crashed_cluster_left_moves_its_members_records(
    tmp_path: Path,
) -> None:
    live = tmp_path / "live"
    a = member(live, [])
    try:
        a.create_destination("q", "queue")
        take(a, "q", 7)
        send(a, "q", b"x", b"y", b"z")
        # what a crash of the whole cluster leaves: the Delta tables and the member's segments
        shutil.copytree(live, tmp_path / "after")
    finally:
        a.close()
    after = tmp_path / "after"
    assert DeltaStore(str(after)).committed_end("q") == 0
    single = Journal(DeltaStore(str(after)), hot_tier=HotTierSettings(str(after / "_hot")))
    single.open()
    try:
        assert single.end_offset("q") == 3
        assert single.read_messages("q")["body"].to_pylist() == [b"x", b"y", b"z"]
        assert not (after / "_hot" / "q" / "e7").exists()
        assert send(single, "q", b"w") == [3]
    finally:
        single.close()
    assert DeltaStore(str(after)).committed_end("q") == 4
