"""Kafka consumer groups' committed offsets in the journal (broker/group_offsets.py), on a real
broker in this process: commits read back after a restart (the last one wins), the internal
topic's retention, and the refresh that keeps what is still committed younger than that
retention, never writing an older offset after a newer one."""

from __future__ import annotations

import json
from concurrent.futures import Future
from pathlib import Path

import pyarrow as pa

from spark_mq.broker.core import Broker
from spark_mq.broker.group_offsets import OFFSETS_TOPIC, REFRESH_S, GroupOffsets
from spark_mq.clock import ManualClock
from tests.conftest import test_config, wait_for


def _broker(data: Path, clock: ManualClock) -> Broker:
    b = Broker(test_config(data), clock=clock)
    b.start(run_timers=False)
    return b


def _commits(b: Broker) -> list[tuple[str, int]]:
    rows = b.journal.read_messages(OFFSETS_TOPIC, 0, None)
    return [
        (dict(h)["group"], json.loads(body)["offset"])
        for body, h in zip(rows["body"].to_pylist(), rows["headers"].to_pylist(), strict=True)
    ]


def test_offsets_are_read_back_refreshed_and_kept_for_the_retention(
    tmp_path: Path, clock: ManualClock
) -> None:
    b = _broker(tmp_path / "data", clock)
    try:
        offsets = b.group_offsets
        offsets.commit("g", [("t", 0, 5, "m")]).result(10)
        offsets.commit("g", [("t", 0, 7, None)]).result(10)
        offsets.commit("h", [("t", 0, 3, None)]).result(10)
        assert b.destinations.get(OFFSETS_TOPIC).settings.retention_s == 7 * 24 * 3600
        assert _commits(b) == [("g", 5), ("g", 7), ("h", 3)]
        before = len(_commits(b))
        clock.advance(REFRESH_S - 1)
        offsets.refresh_due()
        assert len(_commits(b)) == before  # not due yet
        clock.advance(2)
        offsets.refresh_due()
        wait_for(lambda: len(_commits(b)) >= before + 2, 10, "the refresh's rows")
        assert sorted(_commits(b)[before:]) == [("g", 7), ("h", 3)]  # what is committed, again
    finally:
        b.close()
    again = _broker(tmp_path / "data", clock)
    try:
        assert again.group_offsets.fetch("g")[("t", 0)].offset == 7  # the last one wins
        assert again.group_offsets.fetch("h")[("t", 0)].offset == 3
        # and each start appends what is committed again (the retention never reaches it)
        wait_for(lambda: len(_commits(again)) == 7, 10, "a refresh at the start")
        assert sorted(_commits(again)[-2:]) == [("g", 7), ("h", 3)]
    finally:
        again.close()


class _Held:
    """A store whose appends are durable only when the test says (a seam of our own)."""

    def __init__(self) -> None:
        self.log: list[pa.Table] = []
        self.pending: list[Future] = []

    def __call__(self, name: str, rows: pa.Table) -> Future:
        self.log.append(rows)
        fut: Future = Future()
        self.pending.append(fut)
        return fut


def test_a_refresh_waits_while_a_commit_is_on_its_way(tmp_path: Path, clock: ManualClock) -> None:
    b = _broker(tmp_path / "data", clock)
    try:
        store = _Held()
        offsets = GroupOffsets(b.destinations, b.journal, store, lambda _: None, clock.monotonic)
        first = offsets.commit("g", [("t", 0, 1, None)])
        store.pending[0].set_result(None)
        first.result(1)
        second = offsets.commit("g", [("t", 0, 2, None)])  # appended, not yet durable
        assert offsets.refresh() is None  # (it would write offset 1 after the row of 2)
        store.pending[-1].set_result(None)
        second.result(1)
        assert offsets.refresh() is not None
        last = store.log[-1]
        assert [json.loads(v)["offset"] for v in last["body"].to_pylist()] == [2]
    finally:
        b.close()


def test_group_memberships_are_kept_read_back_and_emptied(
    tmp_path: Path, clock: ManualClock
) -> None:
    b = _broker(tmp_path / "data", clock)
    try:
        offsets = b.group_offsets
        offsets.commit("g", [("t", 0, 5, None)]).result(10)
        offsets.keep_membership("g", {"generation": 4, "members": [{"id": "m1"}]}).result(10)
        offsets.keep_membership("h", {"generation": 1, "members": [{"id": "x"}]}).result(10)
        offsets.keep_membership("h", None).result(10)  # (empty now)
        term, kept = offsets.memberships()
        assert kept == {"g": {"generation": 4, "members": [{"id": "m1"}]}}
        offsets.forget()  # (let go: another member coordinates; read again when back)
        assert offsets.term == term + 1
        assert offsets.memberships()[1] == kept
        # a membership row is not a commit: the offsets are as they were
        assert offsets.fetch("g")[("t", 0)].offset == 5 and offsets.groups() == ["g"]
    finally:
        b.close()
    again = _broker(tmp_path / "data", clock)
    try:
        assert again.group_offsets.memberships()[1] == kept

        # the refresh at the start appends it again too (the retention never takes it): the
        # three rows kept above, and g's again (h, empty, is not)
        def kept_rows() -> list[str]:
            headers = again.journal.read_messages(OFFSETS_TOPIC, 0, None)["headers"]
            return [dict(h)["group"] for h in headers.to_pylist() if dict(h).get("membership")]

        wait_for(lambda: kept_rows() == ["g", "h", "h", "g"], 10, "the membership refreshed")
    finally:
        again.close()
