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
    collapse_marks,
    low_water,
    released_claimants,
    returned_counts,
    settled_by_subscription,
)
from spark_mq.clock import ManualClock
from spark_mq.journal import DeltaStore, MemoryStore, layout
from spark_mq.journal.base import DestinationInfo, LogStore, SubscriptionInfo
from spark_mq.journal.settlements import Settlement, settlement_table
from spark_mq.schema import (
    COMPACTED,
    RELEASED_PREFIX,
    equal_to,
    normalize_produce_batch,
    with_offsets,
)
from tests.conftest import start_inprocess

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
    settled = settled_by_subscription(rows)
    returned, released = returned_counts(rows), released_claimants(rows)
    claims = claims_of(rows, released)
    out = {}
    for sub in info.subscriptions.values():
        low, above = low_water(sub.start_offset, settled.get(sub.name))
        out[sub.name] = (
            low,
            above,
            {o: n for o, n in returned.get(sub.name, {}).items() if o >= low and o not in above},
            {
                c: {k: [o for o in offs if o >= low and o not in above] for k, offs in ns.items()}
                for c, ns in claims.get(sub.name, {}).items()
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

    marks = collapse_marks(before, info)
    assert marks == {QUEUE: 500, "late": 2_100}
    removed = store.collapse_settlements("d", marks, 3_000_000)

    after = store.read_settlements("d")
    assert _view(after, info) == _view(before, info)
    assert _view(after, info)[QUEUE][:2] == (500, set(range(501, 1_000)) | {1_001, 1_003})
    assert removed == before.num_rows - after.num_rows + 2  # (and a mark written each)
    assert removed >= 500 + 100  # (the claim of 400 too; the release of 30 stays)
    released = after.filter(equal_to(after["reason"], f"{RELEASED_PREFIX}q0"))
    assert released.num_rows == 1
    if kind == "delta":
        assert _files(str(tmp_path / "root")) < 3 < files_before

    # 500 is settled at last: the next collapse moves the queue's mark past the rest, and its
    # older mark goes with the rows below the new one
    _commit(store, _ack([500]))
    again = collapse_marks(store.read_settlements("d"), info)
    assert again == {QUEUE: 1_000}  # ("late" has not moved)
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
    assert collapse_marks(final, info) == {}  # (nothing to collapse)


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
            marks = collapse_marks(store.read_settlements("d"), info)
            if collapses == 0:
                assert marks == {QUEUE: 2_000}
            store.collapse_settlements("d", marks or {QUEUE: 2_000}, 5_000_000)
            collapses += 1
    finally:
        stop.set()
        thread.join(30)
    assert not errors
    low, above = low_water(0, settled_by_subscription(store.read_settlements("d")).get(QUEUE))
    assert low == 2_000
    assert above == set(written)


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
            # (the mark stops at the first unsettled offset: the last ten stay unacked)
            unacked = {m.offset for m in got if m.offset >= 590}
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
        messages = DeltaTable(layout.messages_uri(str(data), "q"))
        assert len(messages.file_uris()) < 20  # (60 commits, their files merged)
        rows = DeltaTable(layout.settlements_uri(str(data), "q")).to_pyarrow_table()
        assert rows.filter(equal_to(rows["outcome"], COMPACTED)).num_rows == 1
        assert rows.num_rows < len(acked) / 2  # (collapsed: far fewer rows than acks)
    finally:
        running.stop()

    running = start_inprocess(data, clock, **settings)
    try:
        with Consumer(running.url, "q") as c:
            again = c.receive_many(100, timeout=5)
            assert {m.offset for m in again} == unacked
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
