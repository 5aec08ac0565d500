"""Compaction of the Delta logs: exactly the settled and expired rows go, nothing owed is lost."""

from __future__ import annotations

import json
import threading
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pyarrow as pa
import pytest
from click.testing import CliRunner
from deltalake import DeltaTable

from spark_mq import Admin, Consumer, Producer
from spark_mq.broker.producer_state import ProducerState
from spark_mq.broker.recovery import (
    RETURNED,
    collapse_plan,
    low_water,
    released_claimants,
    settled_by_subscription,
)
from spark_mq.cli import main as cli
from spark_mq.clock import ManualClock
from spark_mq.jobs.compaction import EXPIRED, CompactionPolicy, compact_all, compact_destination
from spark_mq.journal import DeltaStore, layout
from spark_mq.journal.base import DestinationInfo, SubscriptionInfo
from spark_mq.journal.settlements import Collapse, Settlement, settlement_table
from spark_mq.launch import BrokerProcess
from spark_mq.schema import (
    COMPACTED,
    RELEASED_PREFIX,
    SETTLED_RUN,
    equal_to,
    ints,
    normalize_produce_batch,
    strings,
    with_offsets,
)
from spark_mq.service import RunningBroker
from tests.conftest import receive_n, start_inprocess, wait_for


def messages_in_delta(root: Path, name: str) -> pa.Table:
    dt = DeltaTable(layout.messages_uri(str(root), name))
    return pa.table(dt.to_pyarrow_table()).sort_by("offset")


def settlements_in_delta(root: Path, name: str) -> pa.Table:
    return pa.table(DeltaTable(layout.settlements_uri(str(root), name)).to_pyarrow_table())


def data_changes(root: Path, name: str) -> dict[str, set[bool]]:
    """Each operation in a message log's history and the dataChange flags of its actions."""
    out: dict[str, set[bool]] = {}
    log_dir = Path(layout.messages_uri(str(root), name)) / "_delta_log"
    for commit in sorted(log_dir.glob("*.json")):
        actions = [json.loads(line) for line in commit.read_text().splitlines() if line]
        op = next(a["commitInfo"]["operation"] for a in actions if "commitInfo" in a)
        flags = {a[k]["dataChange"] for a in actions for k in ("add", "remove") if k in a}
        out.setdefault(op, set()).update(flags)
    return out


def fill(running: RunningBroker, name: str, batches: int, size: int, **send: object) -> None:
    """``batches`` batches of ``size`` messages, each moved to Delta on its own (one file each)."""
    with Producer(running.url, destination=name, linger_ms=0) as p:
        for b in range(batches):
            futures = [p.send(f"{name}-{b * size + i}", **send) for i in range(size)]
            p.flush()
            for f in futures:
                f.result()
            assert running.broker.journal.move(name, timeout=30)


def ack_offsets(
    running: RunningBroker, name: str, wanted: set[int], total: int, subscription: str | None = None
) -> None:
    with Consumer(running.url, name, subscription=subscription, prefetch=total) as c:
        got = receive_n(c, total)
        c.ack([m for m in got if m.offset in wanted]).result(timeout=10)
    assert running.broker.journal.move(name, timeout=30)


@pytest.fixture
def data(tmp_path: Path) -> Path:
    return tmp_path / "data"


def test_a_topic_with_a_retention_keeps_its_rows_that_long_owed_or_not(
    data: Path, clock: ManualClock
) -> None:
    running = start_inprocess(data, clock)
    try:
        with Admin(running.url) as admin:
            admin.create_topic("log", retention_s=3600)  # (read as a log: Kafka's retention)
            admin.create_topic("jms")  # nobody subscribes: nothing is owed to anyone
        fill(running, "log", batches=10, size=2)
        fill(running, "jms", batches=10, size=2)
        for name in ("log", "jms"):
            assert running.broker.journal.move(name, timeout=30)
    finally:
        running.stop()
    enqueued = datetime.fromtimestamp(clock.wall(), timezone.utc)
    policy = CompactionPolicy(force=True, keep_recent_s=0)
    soon = {
        r.destination: r for r in compact_all(data, policy, now=enqueued + timedelta(minutes=30))
    }
    assert soon["jms"].rows_removed == 20 and messages_in_delta(data, "jms").num_rows == 0
    assert soon["log"].rows_removed == 0 and messages_in_delta(data, "log").num_rows == 20
    later = {r.destination: r for r in compact_all(data, policy, now=enqueued + timedelta(hours=2))}
    assert later["log"].rows_removed == 20 and messages_in_delta(data, "log").num_rows == 0


def _numbered_rows(ids: list[str], first: int) -> pa.Table:
    batch = pa.table({"body": pa.array([b"m"] * len(ids), pa.binary()), "dedup_id": ids})
    return with_offsets(
        normalize_produce_batch(
            batch, enqueue_time_us=1_700_000_000_000_000, max_message_bytes=1 << 20, destination="t"
        ),
        first,
    )


def test_the_producer_state_is_carried_past_the_rows_compaction_removes(tmp_path: Path) -> None:
    """A member taking a log on begins from the newest producer state handed on and replays the
    rows after it (spark_mq.broker.producer_state); compaction's commit removing rows carries
    the state rebuilt at the log's end, so those rows are not needed. Before, once they were
    gone, the next owner could not tell where a Kafka producer got to (it took any first
    batch). A state whose following rows are gone already is not carried on."""
    root = str(tmp_path / "data")
    store = DeltaStore(root)
    store.create_logs("t")
    handed = ProducerState()
    handed.stored("kafka-7-0", 3)
    ids = [f"kafka-7-0-{n}" for n in range(4)]
    store.commit_messages("t", _numbered_rows(ids, 0), 4, handed.handed(4))
    ids = ["kafka-7-0-4", "kafka-8-0-0", "kafka-7-0-5", "plain", None, "kafka-8-0-1"]
    store.commit_messages("t", _numbered_rows(ids, 4), 10)  # (no state: rows to replay)
    info = DestinationInfo("t", "topic")  # (nobody subscribes: nothing is owed)
    policy = CompactionPolicy(force=True, keep_recent_s=0)
    later = datetime(2030, 1, 1, tzinfo=timezone.utc)
    assert compact_destination(root, info, policy, now=later).rows_removed == 10
    state = ProducerState()
    assert state.begin_from(store.handed_producers("t") or "", 0, 10) == 10  # (none to replay)
    assert (state.newest("kafka-7-0"), state.newest("kafka-8-0")) == (5, 1)
    assert state.newest("kafka-9-0") == -1  # (the log holds none of it)

    # a row after the newest state is gone already (removed by an older compaction, say): the
    # state cannot be rebuilt, and an older one is not carried on as if it were the newest
    ids = ["kafka-7-0-6", "kafka-7-0-7"]
    store.commit_messages("t", _numbered_rows(ids, 10), 12)
    DeltaTable(layout.messages_uri(root, "t")).delete("offset = 10")
    assert compact_destination(root, info, policy, now=later).rows_removed == 1
    assert json.loads(store.handed_producers("t") or "")["end"] == 10


def test_messages_in_a_collapsed_run_are_removed_and_the_held_ones_kept(tmp_path: Path) -> None:
    """An owner's collapse leaves one ``settled-run`` row for the acks between two messages
    held unacknowledged (spark_mq.broker.log_tending): compaction counts the whole run
    settled, removes its messages, and keeps the held ones and every settlement above its
    mark (the run's row too)."""
    root = str(tmp_path / "data")
    store = DeltaStore(root)
    store.create_logs("t")
    store.commit_messages("t", _numbered_rows([f"m{n}" for n in range(300)], 0), 300)
    info = DestinationInfo("t", "queue", {"": SubscriptionInfo("t", "", 0)})
    held = {10, 250}
    for start in range(0, 300, 30):
        acks = [o for o in range(start, start + 30) if o not in held]
        store.commit_settlements("t", settlement_table([Settlement(acks, "", "ack", 1)]))
    plan = collapse_plan(store.read_settlements("t"), info)
    assert plan == Collapse({"": 10}, {"": [(11, 250)]})
    store.collapse_settlements("t", plan, 2)

    policy = CompactionPolicy(force=True, keep_recent_s=0)
    later = datetime(2030, 1, 1, tzinfo=timezone.utc)
    result = compact_destination(root, info, policy, now=later)
    assert result.rows_removed == 300 - 2  # (all but the held ones)
    left = store.read_messages("t", 0, None)
    assert ints(left["offset"]) == [10, 250]
    rows = store.read_settlements("t")
    runs = rows.filter(equal_to(rows["outcome"], SETTLED_RUN))
    assert (ints(runs["offset"]), strings(runs["reason"])) == ([11], ["250"])
    # (read back as it was: 10 and 250 unsettled, all else settled)
    low, above = low_water(0, settled_by_subscription(rows)[""])
    assert (low, set(above)) == (10, set(range(11, 300)) - held)


def test_removes_exactly_settled_and_expired_rows_and_restart_agrees(
    data: Path, clock: ManualClock
) -> None:
    running = start_inprocess(data, clock)
    try:
        with Admin(running.url) as admin:
            admin.create_queue("q")
            admin.create_topic("t")
            admin.create_subscription("t", "a")
            admin.create_subscription("t", "b")
        fill(running, "q", batches=11, size=10)  # offsets 0..109, 11 files
        fill(running, "q", batches=1, size=5, ttl_s=60)  # 110..114 expire a minute after enqueue
        fill(running, "t", batches=10, size=2)  # 0..19
        settled_q = set(range(80)) | {85, 90}
        ack_offsets(running, "q", settled_q, 115)
        ack_offsets(running, "t", set(range(20)), 20, subscription="a")
        ack_offsets(running, "t", set(range(14)) | {15}, 20, subscription="b")
    finally:
        running.stop()
    # a Spark query's claims were released (it may not claim again): whatever its offset, that
    # row stays
    release = Settlement([10], "", RETURNED, 1_000_000, f"{RELEASED_PREFIX}query-1")
    DeltaStore(str(data)).commit_settlements("q", settlement_table([release]))
    later = datetime.fromtimestamp(clock.wall(), timezone.utc) + timedelta(minutes=10)

    results = {r.destination: r for r in compact_all(data, now=later)}

    q, t = results["q"], results["t"]
    assert q.action == "compacted", q.reason
    assert (q.rows_removed, q.expired) == (82 + 5, 5)
    assert q.low_water == {"": 80}
    left = messages_in_delta(data, "q")
    expect = [o for o in range(110) if o not in settled_q]
    assert left["offset"].to_pylist() == expect  # row by row
    assert left["body"].to_pylist() == [f"q-{o}".encode() for o in expect]
    assert q.files_after < q.files_before
    # settlements below the mark collapsed into one marker; the expired ones were recorded
    s = settlements_in_delta(data, "q").to_pylist()
    assert [r["offset"] for r in s if r["outcome"] == COMPACTED] == [80]
    assert not [r for r in s if r["outcome"] == "ack" and r["offset"] < 80]
    assert released_claimants(settlements_in_delta(data, "q")) == {"": {"query-1"}}
    assert sorted(r["offset"] for r in s if r["outcome"] == EXPIRED) == list(range(110, 115))
    # for other Delta readers: merging files is no data change (a stream skips it), the
    # removal of settled rows is one (skipChangeCommits skips it)
    changes = data_changes(data, "q")
    assert changes["OPTIMIZE"] == {False} and changes["DELETE"] == {True}
    assert changes["WRITE"] == {True}
    # the topic: 'b' still owes 14 and 16..19, so only those stay
    assert t.action == "compacted", t.reason
    assert messages_in_delta(data, "t")["offset"].to_pylist() == [14, 16, 17, 18, 19]
    assert t.low_water == {"a": 20, "b": 14}

    # a restarted broker agrees: it owes exactly what was left, and remembers the acks
    running = start_inprocess(data, clock)
    try:
        with Admin(running.url) as admin:
            assert admin.stats("q")["depth"] == len(expect)
        with Consumer(running.url, "q", prefetch=200) as c:
            got = receive_n(c, len(expect))
            assert sorted(m.offset for m in got) == expect
            assert c.receive(timeout=0.2) is None
        with Consumer(running.url, "t", subscription="b", prefetch=50) as c:
            got = receive_n(c, 5)
            assert sorted(m.offset for m in got) == [14, 16, 17, 18, 19]
        with Consumer(running.url, "t", subscription="a") as c:
            assert c.receive(timeout=0.2) is None
    finally:
        running.stop()
    # a second run finds nothing more to do and still loses nothing
    again = {
        r.destination: r for r in compact_all(data, now=later, policy=CompactionPolicy(force=True))
    }
    assert again["q"].rows_removed == 0
    assert messages_in_delta(data, "q")["offset"].to_pylist() == expect


def test_thresholds_and_dry_run_change_nothing(data: Path, clock: ManualClock) -> None:
    running = start_inprocess(data, clock)
    try:
        with Admin(running.url) as admin:
            admin.create_queue("few")
            admin.create_queue("busy")
        fill(running, "few", batches=3, size=10)
        ack_offsets(running, "few", set(range(30)), 30)
        fill(running, "busy", batches=10, size=10)
        ack_offsets(running, "busy", set(range(50)), 100)  # half live: above 30 %
    finally:
        running.stop()
    versions = {n: DeltaTable(layout.messages_uri(str(data), n)).version() for n in ("few", "busy")}

    # rows younger than keep_recent_s (5 minutes) stay whatever their state
    recent = {
        r.destination: r for r in compact_all(data, CompactionPolicy(force=True), dry_run=True)
    }
    assert recent["few"].rows_removed == recent["busy"].rows_removed == 0
    aged = CompactionPolicy(keep_recent_s=0)
    results = {r.destination: r for r in compact_all(data, aged)}
    assert results["few"].action == "skipped"
    assert "fewer than min_files=10" in results["few"].reason
    assert results["busy"].action == "skipped"
    assert "50% of rows are live" in results["busy"].reason

    forced = CompactionPolicy(force=True, keep_recent_s=0)
    dry = {r.destination: r for r in compact_all(data, forced, dry_run=True)}
    assert dry["few"].action == dry["busy"].action == "would compact"
    assert (dry["few"].rows_removed, dry["busy"].rows_removed) == (30, 50)
    for n, v in versions.items():
        assert DeltaTable(layout.messages_uri(str(data), n)).version() == v
        assert messages_in_delta(data, n).num_rows == {"few": 30, "busy": 100}[n]

    # the CLI prints the same plan as a table, and changes nothing either
    out = CliRunner().invoke(
        cli, ["compact", "--data-dir", str(data), "--dry-run", "--force", "--destination", "busy"]
    )
    assert out.exit_code == 0, out.output
    assert "would compact" in out.output and "busy" in out.output and "few " not in out.output
    assert messages_in_delta(data, "busy").num_rows == 100
    bad = CliRunner().invoke(cli, ["compact", "--data-dir", str(data), "--destination", "nope"])
    assert bad.exit_code == 2 and "nope" in bad.output
    empty = CliRunner().invoke(cli, ["compact", "--data-dir", str(data / "not-here")])
    assert empty.exit_code == 2 and "no sparkmq data under" in empty.output


@pytest.mark.spark
def test_spark_fans_out_one_task_per_destination(data: Path, clock: ManualClock, spark) -> None:
    running = start_inprocess(data, clock)
    try:
        with Admin(running.url) as admin:
            for n in ("s1", "s2"):
                admin.create_queue(n)
        for n in ("s1", "s2"):
            fill(running, n, batches=2, size=5)
            ack_offsets(running, n, set(range(7)), 10)
    finally:
        running.stop()
    results = compact_all(data, CompactionPolicy(force=True, keep_recent_s=0), spark=spark)
    assert sorted((r.destination, r.action, r.rows_removed) for r in results) == [
        ("s1", "compacted", 7),
        ("s2", "compacted", 7),
    ]
    for n in ("s1", "s2"):
        assert messages_in_delta(data, n)["offset"].to_pylist() == [7, 8, 9]


@pytest.mark.process
def test_compaction_racing_a_live_broker_loses_and_resurrects_nothing(tmp_path: Path) -> None:
    data = tmp_path / "data"
    broker = BrokerProcess(
        str(data),
        extra_args=["--set", "journal.move_interval_ms=20"],
        log_file=str(tmp_path / "broker.log"),
    ).start()
    total = 3000
    acked: set[int] = set()
    produced: list[int] = []
    stop = threading.Event()
    try:
        with Admin(broker.url) as admin:
            admin.create_queue("live")

        rounds = [0]  # compactions of every destination ended

        def produce() -> None:
            with Producer(broker.url, destination="live", linger_ms=1) as p:
                for n, i in enumerate(range(0, total, 30)):
                    if n and n % 25 == 0:  # (not all before a compaction ends, on a slow machine)
                        wait_for(lambda n=n: rounds[0] >= n // 25, what="a compaction's end")
                    produced.extend(p.send_batch([b"m%d" % j for j in range(i, i + 30)]))

        def consume() -> None:
            with Consumer(broker.url, "live", prefetch=200) as c:
                while len(acked) < total and not stop.is_set():
                    got = c.receive_many(100, timeout=1)
                    if got:
                        c.ack(got).result(timeout=30)
                        acked.update(m.offset for m in got)

        threads = [threading.Thread(target=produce), threading.Thread(target=consume)]
        for th in threads:
            th.start()
        runs = []
        # (on until it has removed acknowledged rows: those still in the hot tier when the load
        # ends are moved to Delta, and removed, by compactions after it)
        while threads[0].is_alive() or len(acked) < total or not any(r.rows_removed for r in runs):
            runs += compact_all(
                data, CompactionPolicy(force=True, retention_hours=1, keep_recent_s=0)
            )
            rounds[0] += 1
            if len(runs) > 200:
                break
        stop.set()
        for th in threads:
            th.join(60)
            assert not th.is_alive(), "a compaction or load thread hung"
        assert not [r for r in runs if r.action == "failed"], [r.reason for r in runs]
        with Admin(broker.url) as admin:  # the broker's own commits got through each time
            assert admin.stats("live")["hot_tier_move_failures"] == 0
        assert sum(r.rows_removed for r in runs) > 0  # it really ran against live data
        assert sorted(produced) == list(range(total)) and acked == set(range(total))
    finally:
        stop.set()
        broker.stop()
    # nothing acked comes back after a restart, and the log holds no row it should not
    (final,) = compact_all(data, CompactionPolicy(force=True, retention_hours=1, keep_recent_s=0))
    assert final.action == "compacted", final.reason
    assert messages_in_delta(data, "live").num_rows == 0, final
    broker = BrokerProcess(str(data), log_file=str(tmp_path / "broker.log")).start()
    try:
        with Admin(broker.url) as admin:
            stats = admin.stats("live")
            assert stats["depth"] == 0 and stats["end_offset"] == total
        with Consumer(broker.url, "live") as c:
            assert c.receive(timeout=0.5) is None
        with Producer(broker.url, destination="live") as p:
            assert p.send_sync(b"after") == total  # offsets carry on past the compacted ones
    finally:
        broker.stop()
    assert messages_in_delta(data, "live")["offset"].to_pylist() == [total]


def test_expired_rows_of_a_destination_with_an_expiry_queue_are_left_to_the_broker(
    data: Path, clock: ManualClock
) -> None:
    running = start_inprocess(data, clock)
    try:
        with Admin(running.url) as admin:
            admin.create_queue("moved", expiry="queue")
            admin.create_queue("dropped")
        for name in ("moved", "dropped"):
            fill(running, name, batches=2, size=5, ttl_s=60)
    finally:
        running.stop()
    later = datetime.fromtimestamp(clock.wall(), timezone.utc) + timedelta(minutes=10)
    policy = CompactionPolicy(force=True)
    results = {r.destination: r for r in compact_all(data, policy, now=later)}
    assert results["dropped"].expired == 10
    assert results["moved"].expired == 0  # the broker's reaper moves them to EXP.moved
    assert len(messages_in_delta(data, "moved")) == 10
    running = start_inprocess(data, clock)
    try:
        clock.advance(600)
        running.broker.run_timers(reap=True)
        with Consumer(running.url, "EXP.moved") as expired:
            assert len(receive_n(expired, 10)) == 10
    finally:
        running.stop()
