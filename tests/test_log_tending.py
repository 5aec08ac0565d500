"""An owner keeps its logs lean (spark_mq.broker.log_tending), so a take-on reads a short
settlement log and few files: what recovery reads from a collapsed settlement log is what it read
before, on real Delta tables (and the in-memory store), with commits landing meanwhile; a merged
message log reads the same; and a real broker tends its queue's logs as it is used, then
restarts on them."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import DeltaTable

from spark_mq import Admin, Consumer, Producer
from spark_mq.broker.recovery import (
    CLAIMED,
    RETURNED,
    claims_of,
    collapse_plan,
    low_water,
    released_claimants,
    returned_counts,
    settled_by_subscription,
)
from spark_mq.clock import ManualClock
from spark_mq.journal import DeltaStore, MemoryStore, layout
from spark_mq.journal.base import DestinationInfo, LogStore, SubscriptionInfo
from spark_mq.journal.settlements import Collapse, Settlement, settlement_table
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
from tests.conftest import receive_n, start_inprocess

QUEUE = ""  # a queue's one subscription


def _info(**starts: int) -> DestinationInfo:
    subs = {n: SubscriptionInfo("d", n, start) for n, start in starts.items()}
    return DestinationInfo("d", "topic", subs)


def _commit(store: LogStore, *settlements: Settlement) -> None:
    store.commit_settlements("d", settlement_table(list(settlements)))


def _ack(offsets: range | list[int], sub: str = QUEUE, outcome: str = "ack") -> Settlement:
    return Settlement(list(offsets), sub, outcome, 1_000_000)


def _view(rows: pa.Table, info: DestinationInfo) -> dict:
    """What recovery makes of ``rows``: per subscription its low-water mark, the settled
    offsets above it, the returns and the live claims above it, and the released claimants."""
    # (claim 7 below settles 400, 501 and 502: the collapse removes its rows, and recovery
    # restored nothing of it before either)
    settled = settled_by_subscription(rows)
    returned, released = returned_counts(rows), released_claimants(rows)
    claims = claims_of(rows, released)
    out = {}
    for sub in info.subscriptions.values():
        low, above = low_water(sub.start_offset, settled.get(sub.name))
        out[sub.name] = (
            low,
            set(above),
            {o: n for o, n in returned.get(sub.name, {}).items() if o >= low and o not in above},
            {  # (as recovery restores them: the claims with offsets still unsettled)
                c: live
                for c, ns in claims.get(sub.name, {}).items()
                if (
                    live := {
                        k: left
                        for k, offs in ns.items()
                        if (left := [o for o in offs if o >= low and o not in above])
                    }
                )
            },
            released.get(sub.name, set()),
        )
    return out


def _files(root: str) -> int:
    return len(DeltaTable(layout.settlements_uri(root, "d")).file_uris())


STORES: dict[str, Callable[[Path], LogStore]] = {
    "delta": lambda tmp: DeltaStore(str(tmp / "root")),
    "memory": lambda tmp: MemoryStore(),
}


@pytest.mark.parametrize("kind", list(STORES))
def test_a_collapsed_log_reads_back_as_it_did_and_keeps_one_mark_a_subscription(
    tmp_path: Path, kind: str
) -> None:
    store = STORES[kind](tmp_path)
    store.create_logs("d")
    info = _info(**{QUEUE: 0, "late": 2_000})
    # the queue: 0..999 settled but 500, which came back twice; a Spark query's claims, one
    # of them released; offsets 1_000.. settled out of order past a gap
    for start in range(0, 1_000, 20):
        _commit(store, _ack([o for o in range(start, start + 20) if o != 500]))
    _commit(store, _ack([500], outcome=RETURNED), _ack([500], outcome=RETURNED))
    _commit(store, Settlement([400, 501, 502], QUEUE, CLAIMED, 2_000_000, "q1#7"))
    _commit(store, Settlement([30], QUEUE, RETURNED, 2_000_000, f"{RELEASED_PREFIX}q0"))
    _commit(store, _ack([1_003, 1_001], outcome="dead"))
    # a subscription made at offset 2_000: nothing below that is its to settle
    _commit(store, _ack(range(2_000, 2_100), "late"))
    before = store.read_settlements("d")
    files_before = _files(str(tmp_path / "root")) if kind == "delta" else 0

    plan = collapse_plan(before, info)
    assert plan.marks == {QUEUE: 500, "late": 2_100}
    # above the queue's mark, 501..999 are settled: one run (1_001 and 1_003 are too few)
    assert plan.runs == {QUEUE: [(501, 1_000)]}
    removed = store.collapse_settlements("d", plan, 3_000_000)

    after = store.read_settlements("d")
    assert _view(after, info) == _view(before, info)
    assert _view(after, info)[QUEUE][:2] == (500, set(range(501, 1_000)) | {1_001, 1_003})
    assert removed == before.num_rows - after.num_rows + 3  # (and a mark each, and the run)
    # all but 500's returns, the dead-lettered and the release: the claims of 400, 501 and 502
    assert removed == before.num_rows - 5
    released = after.filter(equal_to(after["reason"], f"{RELEASED_PREFIX}q0"))
    assert released.num_rows == 1
    assert after.num_rows == 8
    if kind == "delta":
        assert _files(str(tmp_path / "root")) < 3 < files_before

    # 500 is settled at last: the next collapse moves the queue's mark past the rest, and its
    # older mark and its run go with the rows below the new one
    _commit(store, _ack([500]))
    again = collapse_plan(store.read_settlements("d"), info)
    assert again == Collapse({QUEUE: 1_000})  # ("late" has not moved)
    store.collapse_settlements("d", again, 4_000_000)
    final = store.read_settlements("d")
    assert _view(final, info)[QUEUE][:2] == (1_000, {1_001, 1_003})
    marks_left = final.filter(equal_to(final["outcome"], COMPACTED))
    assert sorted(
        zip(marks_left["subscription"].to_pylist(), marks_left["offset"].to_pylist(), strict=True)
    ) == [
        (QUEUE, 1_000),
        ("late", 2_100),
    ]
    assert final.filter(equal_to(final["outcome"], SETTLED_RUN)).num_rows == 0
    assert not collapse_plan(final, info)  # (nothing to collapse)


@pytest.mark.parametrize("kind", list(STORES))
def test_messages_held_unacknowledged_keep_no_more_than_a_row_a_run_above_them(
    tmp_path: Path, kind: str
) -> None:
    """A message held unacknowledged (a scheduled one, one in a long lease) stops its
    subscription's mark; the settlements above it collapse into one row a run of settled
    offsets, run after run as the acks come, and read back as they did."""
    store = STORES[kind](tmp_path)
    store.create_logs("d")
    info = _info(**{QUEUE: 0})
    held = {0, 1_234, 2_000}
    collapses = 0
    for start in range(0, 3_000, 20):
        _commit(store, _ack([o for o in range(start, start + 20) if o not in held]))
        if start % 400 == 380:  # (every 20 commits: what the owner's tending would do)
            rows = store.read_settlements("d")
            plan = collapse_plan(rows, info)
            assert not plan.marks  # (0 is held: the mark stays at 0)
            store.collapse_settlements("d", plan, 3_000_000)
            assert _view(store.read_settlements("d"), info) == _view(rows, info)
            collapses += 1
    assert collapses == 7
    rows = store.read_settlements("d")
    # 1..1_199 collapsed at the third collapse; 1_200..1_233, the 34 acks after it up to the
    # next held one, are too few to collapse again; 1_235.. collapsed at 1_599, then again
    # (one row in place of the earlier run's) at 1_999; the last collapse was at 2_799: what
    # came after is still a row an ack
    runs = rows.filter(equal_to(rows["outcome"], SETTLED_RUN))
    assert sorted(zip(ints(runs["offset"]), strings(runs["reason"]), strict=True)) == [
        (1, "1200"),
        (1_235, "2000"),
        (2_001, "2800"),
    ]
    assert rows.num_rows == 3 + 34 + 200
    low, above = _view(rows, info)[QUEUE][:2]
    assert (low, above) == (0, set(range(1, 3_000)) - held)

    # the held ones are acked: the mark passes them all, and every run goes
    _commit(store, _ack(sorted(held)))
    plan = collapse_plan(store.read_settlements("d"), info)
    assert plan == Collapse({QUEUE: 3_000})
    store.collapse_settlements("d", plan, 4_000_000)
    final = store.read_settlements("d")
    assert final.num_rows == 1
    assert _view(final, info)[QUEUE][:2] == (3_000, set())


def test_a_run_row_read_by_a_reader_that_does_not_know_runs_loses_nothing() -> None:
    """A ``settled-run`` row is at its run's first offset: a reader that knows only the
    other outcomes reads that offset settled (true) and the rest of the run unsettled (they
    would be delivered again): never an unsettled offset read as settled."""
    rows = Collapse({}, {QUEUE: [(5, 50)]}).rows(1_000_000, "collapsed")
    assert ints(rows["offset"]) == [5]
    assert strings(rows["outcome"]) == [SETTLED_RUN]
    assert strings(rows["reason"]) == ["50"]
    settled = settled_by_subscription(rows)[QUEUE]
    assert settled.below == 0
    assert settled.offsets.tolist() == list(range(5, 50))
    # a reason that names no end past the row's offset stands for that offset alone
    odd = Settlement([7], QUEUE, SETTLED_RUN, 1_000_000, "3")
    assert settled_by_subscription(settlement_table([odd]))[QUEUE].offsets.tolist() == [7]
    # a run past the log's end (never written by a broker): read as ending there, not a trillion
    # offsets made at a take-on
    far = Settlement([5], QUEUE, SETTLED_RUN, 1_000_000, str(10**12))
    assert settled_by_subscription(settlement_table([far]), 60)[QUEUE].offsets.tolist() == list(
        range(5, 60)
    )


def test_commits_landing_while_a_log_collapses_are_all_kept(tmp_path: Path) -> None:
    """The owner's writer goes on committing settlements while the log collapses: each of
    its commits is in the log after (delta-rs's delete and merge commit around them)."""
    store = DeltaStore(str(tmp_path / "root"))
    store.create_logs("d")
    info = _info(**{QUEUE: 0})
    for start in range(0, 2_000, 50):
        _commit(store, _ack(range(start, start + 50)))
    stop = threading.Event()
    written: list[int] = []
    errors: list[BaseException] = []

    def writer() -> None:
        offset = 10_000  # (past a gap: above the mark whatever the collapses do)
        try:
            while not stop.is_set():
                _commit(store, _ack([offset]))
                written.append(offset)
                offset += 1
        except BaseException as exc:  # (reported below)
            errors.append(exc)

    thread = threading.Thread(target=writer)
    thread.start()
    try:
        deadline = time.monotonic() + 30
        collapses = 0
        while collapses < 3 or len(written) < 20:
            assert time.monotonic() < deadline, "the writer made no progress beside collapses"
            plan = collapse_plan(store.read_settlements("d"), info)
            if collapses == 0:
                assert plan.marks == {QUEUE: 2_000}
            store.collapse_settlements("d", plan or Collapse({QUEUE: 2_000}), 5_000_000)
            collapses += 1
    finally:
        stop.set()
        thread.join(30)
    assert not errors
    low, above = low_water(0, settled_by_subscription(store.read_settlements("d")).get(QUEUE))
    assert low == 2_000
    assert set(above) == set(written)


def test_a_broker_collapses_the_log_of_a_queue_as_it_is_consumed(
    tmp_path: Path, clock: ManualClock
) -> None:
    """Sends and acks land as many commits; the broker tends the logs every so many
    (``TEND_EVERY``, its default of 50, and ``TEND_APART_S`` apart on its clock): the
    settlement log collapsed, the message log's files merged; a restart on them redelivers
    exactly what was not acked."""
    data = tmp_path / "data"
    settings = {"delivery.mark_interval_s": 3_600}  # (no lease lapses as the clock moves)
    running = start_inprocess(data, clock, **settings)
    try:
        broker = running.broker
        with Admin(running.url) as admin:
            admin.create_queue("q")
        with Producer(running.url, destination="q") as p:
            for i in range(0, 600, 10):  # (a commit, and a small file, each)
                p.send_batch([b"m%d" % o for o in range(i, i + 10)])
                assert broker.journal.move("q", timeout=10)
        with Consumer(running.url, "q", prefetch=1_000) as c:
            got: list = []
            while len(got) < 600:
                more = c.receive_many(600 - len(got), timeout=10)
                assert more, f"only {len(got)} of 600 delivered"
                got += more
            # (the mark stops at the first unsettled offset: 300..304 and the last ten stay
            # unacked, and the acks between them collapse into a run)
            unacked = {m.offset for m in got if m.offset >= 590 or 300 <= m.offset < 305}
            acked = sorted((m for m in got if m.offset not in unacked), key=lambda m: m.offset)
            for i in range(0, len(acked), 5):  # (a commit to Delta each: the hot tier moved)
                c.ack(acked[i : i + 5]).result(timeout=10)
                assert broker.journal.move("q", timeout=10)
                clock.advance(1)
            deadline = time.monotonic() + 20
            while broker.log_tending.collapsed < 2:
                assert time.monotonic() < deadline, (
                    f"{broker.log_tending.collapsed} collapse(s) of the settlement log"
                )
                time.sleep(0.01)
        assert broker.log_tending.merged >= 1
        broker.log_tending.tend("q")  # (the acks since its last tending, too)
        messages = DeltaTable(layout.messages_uri(str(data), "q"))
        assert len(messages.file_uris()) < 20  # (60 commits, their files merged)
        rows = DeltaTable(layout.settlements_uri(str(data), "q")).to_pyarrow_table()
        marks = rows.filter(equal_to(rows["outcome"], COMPACTED))
        assert ints(marks["offset"]) == [300]
        runs = rows.filter(equal_to(rows["outcome"], SETTLED_RUN))
        assert ints(runs["offset"]) == [305]
        assert strings(runs["reason"]) == ["590"]
        assert rows.num_rows < len(acked) / 2  # (collapsed: far fewer rows than acks)
    finally:
        running.stop()

    running = start_inprocess(data, clock, **settings)
    try:
        with Consumer(running.url, "q") as c:
            again: list = []
            while len(again) < len(unacked):
                more = c.receive_many(100, timeout=5)
                assert more, f"only {sorted(m.offset for m in again)} redelivered"
                again += more
            assert {m.offset for m in again} == unacked
            assert not c.receive_many(100, timeout=0.5)  # (nothing acked comes again)
            assert [m.body for m in again] == [b"m%d" % m.offset for m in again]
            c.ack(again).result(timeout=10)
    finally:
        running.stop()


def test_a_message_log_s_small_files_merge_once_there_are_enough(tmp_path: Path) -> None:
    store = DeltaStore(str(tmp_path / "root"))
    store.create_logs("d")
    batches = [
        normalize_produce_batch(
            pa.table({"body": [b"b%d" % o for o in range(i, i + 7)]}),
            enqueue_time_us=1_700_000_000_000_000,
            max_message_bytes=1 << 20,
            destination="d",
        )
        for i in range(0, 7 * 12, 7)
    ]
    for n, batch in enumerate(batches):
        store.commit_messages("d", with_offsets(batch, 7 * n), 7 * (n + 1))
    before = store.read_messages("d", 0, None)
    uri = layout.messages_uri(str(tmp_path / "root"), "d")
    assert store.merge_message_files("d", at_least=13) == 0  # (12 files: fewer than asked)
    assert len(DeltaTable(uri).file_uris()) == 12
    assert store.merge_message_files("d", at_least=12) == 12
    assert len(DeltaTable(uri).file_uris()) == 1
    assert store.read_messages("d", 0, None).equals(before)
    assert store.read_messages("d", 30, 40)["offset"].to_pylist() == list(range(30, 40))
    assert store.committed_end("d") == 84
    store.commit_messages("d", with_offsets(batches[0], 84), 91)  # (and commits go on)
    assert store.read_messages("d", 80, None)["offset"].to_pylist() == list(range(80, 91))


@pytest.mark.parametrize(
    "unacked",
    [
        pytest.param({0, 777, *range(1_950, 2_000)}, id="few-runs"),  # (read range by range)
        pytest.param({*range(0, 2_000, 7)}, id="many-runs"),  # (read in one go, then filtered)
    ],
)
def test_a_restart_reads_back_the_unsettled_rows_alone_past_held_messages(
    tmp_path: Path, clock: ManualClock, unacked: set[int]
) -> None:
    """Past a message held unacknowledged, a queue's restart reads its log's offsets, then
    only the unsettled rows whole: what it holds in memory is those, and they are delivered
    with their bodies, in order, and nothing acked comes again."""
    data = tmp_path / "data"
    running = start_inprocess(data, clock)
    try:
        with Admin(running.url) as admin:
            admin.create_queue("q")
        with Producer(running.url, destination="q") as p:
            for i in range(0, 2_000, 100):
                p.send_batch([b"m%d" % o for o in range(i, i + 100)])
        with Consumer(running.url, "q", prefetch=2_000) as c:
            got: list = []
            while len(got) < 2_000:
                more = c.receive_many(2_000 - len(got), timeout=10)
                assert more, f"only {len(got)} of 2,000 delivered"
                got += more
            c.ack([m for m in got if m.offset not in unacked]).result(timeout=10)
        assert running.broker.journal.move("q", timeout=10)
        running.broker.log_tending.tend("q")  # (with few runs, the acks collapse into them)
    finally:
        running.stop()

    running = start_inprocess(data, clock)
    try:
        assert running.broker.destinations.get("q").store.rows == len(unacked)
        with Consumer(running.url, "q", prefetch=2_000) as c:
            again: list = []
            while len(again) < len(unacked):
                more = c.receive_many(2_000, timeout=5)
                assert more, f"{len(again)} of {len(unacked)} redelivered"
                again += more
            assert [m.offset for m in again] == sorted(unacked)
            assert [m.body for m in again] == [b"m%d" % m.offset for m in again]
            assert not c.receive_many(10, timeout=0.5)
    finally:
        running.stop()


def test_a_destination_deleted_leaves_nothing_counted(tmp_path: Path, clock: ManualClock) -> None:
    """The tending counts each destination's commits; a deleted one's count goes with it (a
    broker serving many short-lived destinations keeps no entry for each)."""
    running = start_inprocess(tmp_path / "data", clock)
    try:
        broker = running.broker
        with Admin(running.url) as admin:
            admin.create_queue("short-lived")
            admin.create_queue("kept")
            for name in ("short-lived", "kept"):
                with Producer(running.url, destination=name) as p:
                    p.send_sync(b"x")
                assert broker.journal.move(name, timeout=10)
            assert {"short-lived", "kept"} <= broker.log_tending.tracked
            admin.delete_destination("short-lived")
        assert "short-lived" not in broker.log_tending.tracked
        assert "kept" in broker.log_tending.tracked
    finally:
        running.stop()


def test_a_topic_s_restart_reads_back_only_the_rows_some_subscription_is_owed(
    tmp_path: Path, clock: ManualClock
) -> None:
    """Past a message one subscription holds unacknowledged, a topic's restart reads back only
    the rows some subscription has not settled: "a" acked all but 0 and 1,500-1,599, "b" all
    but 0 and 700: 102 rows in memory, and each subscription is delivered what it is owed,
    whole, and nothing else."""
    data = tmp_path / "data"
    owed = {"a": {0, *range(1_500, 1_600)}, "b": {0, 700}}
    running = start_inprocess(data, clock)
    try:
        with Admin(running.url) as admin:
            admin.create_topic("t")
            for name in owed:
                admin.create_subscription("t", name)
        with Producer(running.url, destination="t") as p:
            for i in range(0, 2_000, 100):
                p.send_batch([b"m%d" % o for o in range(i, i + 100)])
        for name, unacked in owed.items():
            with Consumer(running.url, "t", subscription=name, prefetch=2_000) as c:
                got = receive_n(c, 2_000)
                c.ack([m for m in got if m.offset not in unacked]).result(timeout=10)
        assert running.broker.journal.move("t", timeout=10)
        running.broker.log_tending.tend("t")
    finally:
        running.stop()

    running = start_inprocess(data, clock)
    try:
        assert running.broker.destinations.get("t").store.rows == len(owed["a"] | owed["b"])
        for name, unacked in owed.items():
            with Consumer(running.url, "t", subscription=name, prefetch=2_000) as c:
                again = receive_n(c, len(unacked))
                assert [m.offset for m in again] == sorted(unacked)
                assert [m.body for m in again] == [b"m%d" % m.offset for m in again]
                assert not c.receive_many(10, timeout=0.3)
    finally:
        running.stop()
