"""One suite every journal store passes (Delta and in-memory)."""

from __future__ import annotations

import os
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pyarrow as pa
import pytest

from spark_mq.errors import DestinationExists, DestinationNotFound, InvalidNameError, JournalError
from spark_mq.journal import DeltaStore, Journal, MemoryStore, layout
from spark_mq.journal.hot_tier import HotTierSettings
from spark_mq.journal.sinks import PRODUCERS_EVERY_S, DirectSink, ProducerStateCarrier
from spark_mq.messages import Messages
from spark_mq.schema import normalize_produce_batch, with_offsets


def rows(bodies: list[bytes]) -> pa.Table:
    return normalize_produce_batch(
        pa.table({"body": pa.array(bodies, pa.binary())}),
        enqueue_time_us=1_700_000_000_000_000,
        max_message_bytes=1 << 20,
        destination="q",
    )


@pytest.fixture(params=["delta", "delta+hot", "memory"])
def make_journal(request, tmp_path: Path):
    """A factory of journals over the same storage (so a second one sees a reopen)."""
    root = str(tmp_path / "root")
    if request.param == "delta":
        return lambda: Journal(DeltaStore(root, checkpoint_interval=10))
    if request.param == "delta+hot":
        hot = HotTierSettings(str(tmp_path / "hot"), move_interval_s=0.05)
        return lambda: Journal(DeltaStore(root, checkpoint_interval=10), hot_tier=hot)
    shared = MemoryStore()
    return lambda: Journal(shared)


@pytest.fixture
def journal(make_journal):
    j = make_journal()
    j.open()
    yield j
    j.close()


def test_offsets_are_gap_free_under_concurrent_appends(journal: Journal) -> None:
    journal.create_destination("q", "queue")

    def produce(i: int) -> list[int]:
        return list(
            journal.append("q", Messages.of(rows([b"%d-%d" % (i, k) for k in range(7)])))
            .result()
            .offsets
        )

    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(produce, range(60)))
    offsets = sorted(o for r in results for o in r)
    assert offsets == list(range(60 * 7))
    # each batch got a contiguous range
    assert all(r == list(range(r[0], r[0] + 7)) for r in results)
    assert journal.end_offset("q") == 420
    # group commit: far fewer commits than appends
    assert journal.stats("q").commits < 60
    table = journal.read_messages("q", 0)
    assert table["offset"].to_pylist() == list(range(420))


def test_read_range_and_settlements(journal: Journal) -> None:
    journal.create_destination("q", "queue")
    journal.append("q", Messages.of(rows([b"a", b"b", b"c", b"d"]))).result()
    assert journal.read_messages("q", 1, 3)["body"].to_pylist() == [b"b", b"c"]
    journal.settle("q", [0, 2], subscription="").result()
    journal.settle("q", [3], subscription="", outcome="ack").result()
    journal.settle("q", [1], subscription="", outcome="dead", reason="too many attempts").result()
    settled = journal.read_settlements("q").sort_by("offset")
    assert settled["offset"].to_pylist() == [0, 1, 2, 3]
    assert settled["subscription"].to_pylist() == [""] * 4
    assert settled["outcome"].to_pylist() == ["ack", "dead", "ack", "ack"]
    assert settled["reason"].to_pylist() == [None, "too many attempts", None, None]
    assert settled["settle_time"].null_count == 0


def test_a_read_of_some_columns_gives_those_alone_in_offset_order(journal: Journal) -> None:
    """A read that needs a few columns (a refill of the duplicate cache) decodes no bodies,
    whichever tier holds the rows (some moved to Delta, some not yet)."""
    journal.create_destination("q", "queue")
    journal.append("q", Messages.of(rows([b"a", b"b"]))).result()
    journal.move("q", timeout=10)
    journal.append("q", Messages.of(rows([b"c", b"d"]))).result()
    whole = journal.read_messages("q", 1, 4)
    some = journal.read_messages("q", 1, 4, ("offset", "dedup_id", "enqueue_time"))
    assert some.column_names == ["offset", "dedup_id", "enqueue_time"]
    assert some.to_pylist() == whole.select(some.column_names).to_pylist()
    assert some["offset"].to_pylist() == [1, 2, 3]


def test_bindings_and_kinds(journal: Journal) -> None:
    assert journal.create_destination("t", "topic")[1] is True
    assert journal.create_destination("t", "topic")[1] is False
    with pytest.raises(DestinationExists):
        journal.create_destination("t", "queue")
    with pytest.raises(InvalidNameError):
        journal.create_destination("../etc", "queue")
    journal.append("t", Messages.of(rows([b"x", b"y"]))).result()
    sub, created = journal.create_subscription("t", "s1")
    assert created and sub.start_offset == 2
    journal.delete_destination("t")
    with pytest.raises(DestinationNotFound):
        journal.append("t", Messages.of(rows([b"z"])))
    assert "t" not in journal.destinations


def test_recovery_after_reopen(make_journal) -> None:
    j = make_journal()
    j.open()
    j.create_destination("q", "queue")
    j.create_destination("t", "topic")
    j.create_subscription("t", "audit")
    j.append("q", Messages.of(rows([b"1", b"2", b"3"]))).result()
    j.settle("q", [1], subscription="").result()
    j.close()

    j2 = make_journal()
    dests = j2.open()
    try:
        store = j2.store
        if store.durable:
            assert set(dests) == {"q", "t"}
            assert set(dests["t"].subscriptions) == {"audit"}
            assert j2.end_offset("q") == 3
            assert j2.read_settlements("q")["offset"].to_pylist() == [1]
            # appends continue after the recovered end, without a gap
            assert j2.append("q", Messages.of(rows([b"4"]))).result().first_offset == 3
        else:
            # persistence disabled: a new store instance would be empty; the same one is shared
            assert j2.end_offset("q") == 3
    finally:
        j2.close()


@pytest.mark.parametrize("kind", ["delta", "memory"])
def test_commits_carry_a_changed_producer_state_at_most_every_second(
    kind: str, tmp_path: Path
) -> None:
    """A cluster member's commits to a message log carry its destination's producer state
    (spark_mq.broker.producer_state) when it changed, at most every ``PRODUCERS_EVERY_S``,
    and the store reads the newest one back for the next owner: a member lost without a hot
    tier left none before."""
    store = DeltaStore(str(tmp_path / "root")) if kind == "delta" else MemoryStore()
    store.create_logs("q")
    now = [100.0]
    sink = DirectSink(store, "q")
    sink.producers = ProducerStateCarrier(clock=lambda: now[0])
    changed = [True]
    asked: list[int] = []

    def state_at(name: str, end: int) -> str | None:
        asked.append(end)
        return f"{name} ending at {end}" if changed[0] else None

    sink.producers.state_at = state_at
    commits = iter(range(1, 100))

    def commit() -> None:
        end = next(commits)
        messages = Messages.of(with_offsets(rows([b"m"]), end - 1))
        assert sink.commit(messages, end, None) == (None, None)

    commit()
    commit()  # (within the second: not asked)
    assert asked == [1]
    assert store.handed_producers("q") == "q ending at 1"
    now[0] += PRODUCERS_EVERY_S
    changed[0] = False
    commit()  # (unchanged: nothing carried, and asked again at the next commit)
    commit()
    assert asked == [1, 3, 4]
    assert store.handed_producers("q") == "q ending at 1"
    changed[0] = True
    commit()
    assert store.handed_producers("q") == "q ending at 5"
    now[0] += PRODUCERS_EVERY_S

    def broken(name: str, end: int) -> str | None:
        raise RuntimeError("a bug in the producer state")

    sink.producers.state_at = broken
    commit()  # (carrying the state is a help: a failure to does not fail the commit)
    assert store.handed_producers("q") == "q ending at 5"
    assert store.committed_end("q") == 6


class FailingStore(MemoryStore):
    """A store whose message commits fail while ``failing`` is set (a full disk, say)."""

    def __init__(self) -> None:
        super().__init__()
        self.failing = threading.Event()

    def commit_messages(
        self, destination: str, rows: pa.Table, end_offset: int, producers: str | None = None
    ) -> None:
        if self.failing.is_set():
            raise OSError(28, "No space left on device")
        super().commit_messages(destination, rows, end_offset, producers)


def test_failed_commit_fails_the_append_and_leaves_no_gap() -> None:
    store = FailingStore()
    j = Journal(store)
    j.open()
    j.create_destination("q", "queue")
    try:
        assert j.append("q", Messages.of(rows([b"a"]))).result().first_offset == 0
        store.failing.set()
        fut = j.append("q", Messages.of(rows([b"lost", b"lost"])))
        with pytest.raises(JournalError, match="No space left"):
            fut.result()
        store.failing.clear()
        # the next append reuses the offsets the failed one would have taken
        assert j.append("q", Messages.of(rows([b"b"]))).result().first_offset == 1
        assert j.read_messages("q")["body"].to_pylist() == [b"a", b"b"]
    finally:
        j.close()


def test_delta_commit_is_idempotent_and_checkpointed(tmp_path: Path) -> None:
    store = DeltaStore(str(tmp_path), checkpoint_interval=5)
    j = Journal(store, buffer_timeout_s=0)
    j.open()
    j.create_destination("q", "queue")
    for i in range(12):
        j.append("q", Messages.of(rows([b"m%d" % i]))).result()
    j.close()
    # a retried commit (same end offset) writes nothing
    dup = rows([b"m11"])
    from spark_mq.schema import with_offsets

    store2 = DeltaStore(str(tmp_path))
    store2.commit_messages("q", with_offsets(dup, 11), 12)
    assert store2.read_messages("q", 0, None).num_rows == 12
    assert store2.committed_end("q") == 12
    log_dir = Path(layout.messages_uri(str(tmp_path), "q")) / "_delta_log"
    assert any(name.endswith(".checkpoint.parquet") for name in os.listdir(log_dir))


def test_message_files_keep_statistics_for_reads_by_offset_but_none_of_bodies(
    tmp_path: Path,
) -> None:
    import pyarrow.parquet as pq

    from spark_mq.schema import with_offsets

    store = DeltaStore(str(tmp_path))
    store.create_logs("q")
    store.commit_messages("q", with_offsets(rows([b"b", b"a"]), 0), 2)
    [path] = Path(layout.messages_uri(str(tmp_path), "q")).glob("*.parquet")
    group = pq.ParquetFile(path).metadata.row_group(0)
    stats = {
        group.column(i).path_in_schema: group.column(i).statistics for i in range(group.num_columns)
    }
    assert stats["offset"].has_min_max and (stats["offset"].min, stats["offset"].max) == (0, 1)
    assert stats["body"] is None or not stats["body"].has_min_max
    assert store.read_messages("q", 0, None)["body"].to_pylist() == [b"b", b"a"]


def test_a_cached_delta_table_is_opened_anew_every_so_many_commits(tmp_path: Path) -> None:
    """delta-rs holds more memory with every commit through one DeltaTable object (2,000
    appends: 226 -> 445 MiB, against 297 reopened every 50), so the store reopens it."""
    from spark_mq.journal.delta_store import REOPEN_AFTER_COMMITS
    from spark_mq.schema import MESSAGE_SCHEMA

    store = DeltaStore(str(tmp_path))
    store.create_logs("q")
    uri = layout.messages_uri(store.root, "q")

    def row(offset: int) -> pa.Table:
        columns = {f.name: pa.nulls(1, f.type) for f in MESSAGE_SCHEMA}
        columns["offset"] = pa.array([offset], pa.int64())
        columns["body"] = pa.array([b"m%d" % offset])
        return pa.table(columns, schema=MESSAGE_SCHEMA)

    seen = []
    for offset in range(REOPEN_AFTER_COMMITS * 2 + 1):
        store.commit_messages("q", row(offset), offset + 1)
        seen.append(id(store._tables.get(uri)))
    # the same object for REOPEN_AFTER_COMMITS commits, then another
    assert len(set(seen[: REOPEN_AFTER_COMMITS - 1])) == 1
    assert seen[REOPEN_AFTER_COMMITS - 1] == id(None)  # dropped after the last of them
    assert store.committed_end("q") == REOPEN_AFTER_COMMITS * 2 + 1
    assert store.read_messages("q", 0, None)["offset"].to_pylist() == list(
        range(REOPEN_AFTER_COMMITS * 2 + 1)
    )


def test_the_bindings_log_is_compacted_as_it_grows_and_reads_the_same(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Read whole at every start and at every takeover, the bindings log is compacted into one
    file every so many commits (with 200 destinations its 200 files took 220-260 ms to read,
    12-23 ms after), and reads as the events it holds."""
    from deltalake import DeltaTable

    from spark_mq.journal import delta_store

    monkeypatch.setattr(delta_store, "COMPACT_SMALL_LOGS_EVERY", 10)
    journal = Journal(DeltaStore(str(tmp_path)))
    journal.open()
    try:
        for i in range(24):
            journal.create_destination(f"q{i}", "queue" if i % 2 else "topic")
        journal.create_subscription("q0", "s")
        for i in range(0, 24, 3):
            journal.delete_destination(f"q{i}")
        kinds = journal.recorded_kinds()
    finally:
        journal.close()
    bindings = DeltaTable(layout.bindings_uri(str(tmp_path)))
    assert bindings.version() >= 30 and len(bindings.file_uris()) < 10  # (32 commits' worth)
    expected = {f"q{i}": ("queue" if i % 2 else "topic") for i in range(24) if i % 3}
    assert kinds == expected
    again = Journal(DeltaStore(str(tmp_path)))
    again.open()
    try:
        assert set(again.destinations) == set(expected)
    finally:
        again.close()
