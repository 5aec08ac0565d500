"""The journal writer's pipeline over the hot tier: a flush is written, then synced on another
thread while the next one is written. What it must keep: nothing answered before it is durable,
offsets and commits in order, and a failed sync failing exactly what it may have lost."""

from __future__ import annotations

import contextlib
import errno
import threading
from pathlib import Path

import pyarrow as pa
import pytest

from spark_mq import Admin, Producer
from spark_mq.errors import JournalError, SparkMQError
from spark_mq.journal import DeltaStore
from spark_mq.journal.group_commit import DestinationWriter
from spark_mq.journal.hot_tier import HotTier, HotTierSettings
from spark_mq.journal.inline_commit import WRITE_BEHIND_FROM, InlineCommit
from spark_mq.journal.memory_store import MemoryStore
from spark_mq.journal.records import KIND_MESSAGES
from spark_mq.journal.segments import SegmentLog
from spark_mq.launch import BrokerProcess
from spark_mq.messages import Messages
from tests.conftest import wait_for
from tests.test_hot_tier import rows
from tests.test_journal_conformance import rows as unoffset


class _Disk(SegmentLog):
    """A segment log whose syncs can be made to fail (as a disk's EIO) or to wait."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.fail_syncs = 0
        self.hold = threading.Event()
        self.hold.set()
        self.syncing = threading.Event()
        self.writes = threading.Event()  # cleared: a write waits (while writing is set)
        self.writes.set()
        self.writing = threading.Event()

    def append(self, *args, **kwargs):
        self.writing.set()
        self.writes.wait(10)
        return super().append(*args, **kwargs)

    def _sync_file(self, fd: int) -> None:
        self.syncing.set()
        self.hold.wait(10)
        if self.fail_syncs:
            self.fail_syncs -= 1
            raise OSError(errno.EIO, "Input/output error (injected)")
        super()._sync_file(fd)


def _bodies(log: SegmentLog) -> list[list[bytes]]:
    reopened = SegmentLog(log.directory, segment_bytes=log.segment_bytes, sync="fdatasync")
    try:
        return [reopened.read(ref)["body"].to_pylist() for ref in reopened.open()]
    finally:
        reopened.close()


def test_records_written_apart_from_their_sync_are_durable_once_synced(tmp_path: Path) -> None:
    log = SegmentLog(str(tmp_path), segment_bytes=64 * 1024, sync="fdatasync")
    log.open()
    log.append([(KIND_MESSAGES, 0, rows([b"a"]))], sync=False)
    assert (log.next_lsn, log.synced_lsn) == (2, 0)  # written, not yet durable
    assert log.sync() == 1
    big = b"x" * 40_000
    log.append([(KIND_MESSAGES, 1, rows([big], 1))], sync=False)
    # the next one does not fit: the segment is synced before it is sealed
    log.append([(KIND_MESSAGES, 2, rows([big], 2))], sync=False)
    assert (log.next_lsn, log.synced_lsn, log.active_segment) == (4, 2, 1)
    log.append([(KIND_MESSAGES, 3, rows([b"d"], 3))], sync=True)  # syncs what came before too
    assert log.synced_lsn == 4
    log.close()
    assert _bodies(log) == [[b"a"], [big], [big], [b"d"]]


@pytest.mark.pure_python
def test_a_failed_sync_refuses_appends_until_what_it_may_have_lost_is_cut_off(
    tmp_path: Path,
) -> None:
    log = _Disk(str(tmp_path), segment_bytes=1 << 20, sync="fdatasync")
    log.open()
    log.append([(KIND_MESSAGES, 0, rows([b"kept"]))], sync=False)
    assert log.sync() == 1
    log.append([(KIND_MESSAGES, 1, rows([b"lost-1"], 1))], sync=False)
    log.append([(KIND_MESSAGES, 2, rows([b"lost-2"], 2))], sync=False)
    log.fail_syncs = 1
    with pytest.raises(OSError, match="injected"):
        log.sync()
    assert log.synced_lsn == 1
    with pytest.raises(OSError, match="unsynced records go first"):
        log.append([(KIND_MESSAGES, 1, rows([b"refused"], 1))], sync=False)
    with pytest.raises(OSError, match="unsynced records go first"):
        log.sync()  # a second sync may report success for data the first one lost
    log.drop_unsynced()
    assert log.next_lsn == 2
    log.append([(KIND_MESSAGES, 1, rows([b"after"], 1))], sync=True)
    log.close()
    assert _bodies(log) == [[b"kept"], [b"after"]]


def _table(r: Messages) -> pa.Table:
    return r.table()


class _Tier(HotTier):
    """The hot tier over a :class:`_Disk`."""

    def __init__(self, store: MemoryStore, directory: str) -> None:
        super().__init__(store, "q", directory, HotTierSettings(directory, move_interval_s=3600))
        self._log = self.disk = _Disk(directory, segment_bytes=1 << 20, sync="fdatasync")


@pytest.fixture
def pipeline(tmp_path: Path):
    store = MemoryStore()
    store.create_logs("q")
    tier = _Tier(store, str(tmp_path / "hot"))
    committed: list[list[int]] = []
    writer = DestinationWriter(
        tier,
        "q",
        tier.open(),
        buffer_timeout_s=0.0,
        buffer_size_bytes=1 << 20,
        max_pending_bytes=1 << 30,
        on_commit=lambda dest, r: committed.append(_table(r)["offset"].to_pylist()),
    )
    yield writer, tier, committed
    writer.close()


@pytest.mark.pure_python
def test_flushes_are_written_while_the_last_one_syncs_and_answered_in_order(pipeline) -> None:
    writer, tier, committed = pipeline
    tier.disk.hold.clear()  # the first sync waits
    first = writer.submit(Messages.of(unoffset([b"a", b"b"])))
    assert tier.disk.syncing.wait(10)
    later = [writer.submit(Messages.of(unoffset([b"c%d" % k]))) for k in range(20)]
    wait_for(lambda: tier.disk.next_lsn > 2, what="the next flush written during the sync")
    assert not first.done() and not any(f.done() for f in later)  # none durable: none answered
    tier.disk.hold.set()
    assert first.result(10).first_offset == 0
    assert [f.result(10).first_offset for f in later] == list(range(2, 22))
    flat = [o for offsets in committed for o in offsets]
    assert flat == list(range(22))  # on_commit saw every offset once, in order
    assert tier.read_messages(0, None)["offset"].to_pylist() == list(range(22))


@pytest.mark.pure_python
def test_an_inline_commit_waits_behind_the_flushes_being_synced(pipeline) -> None:
    writer, tier, committed = pipeline
    tier.disk.hold.clear()
    first = writer.submit(Messages.of(unoffset([b"a"])))  # the writer thread's, syncing
    assert tier.disk.syncing.wait(10)
    inline = InlineCommit()
    second = writer.submit(Messages.of(unoffset([b"b"])), inline)
    inline.commit()
    assert not second.done()  # not committed ahead of the flush before it
    tier.disk.hold.set()
    assert (first.result(10).first_offset, second.result(10).first_offset) == (0, 1)
    assert [o for offsets in committed for o in offsets] == [0, 1]


@pytest.mark.pure_python
def test_an_inline_commit_writes_a_big_flush_behind_and_returns_before_its_sync(pipeline) -> None:
    """A loop's turn that produced a lot leaves its sync to the writer's syncer thread and goes
    on with its next turn (the disk syncs while the loop reads and checks the next frames);
    what the next turns commit inline still goes after it, and nothing is answered before it
    is durable."""
    writer, tier, committed = pipeline
    tier.disk.hold.clear()  # syncs wait
    inline = InlineCommit()
    big = writer.submit(Messages.of(unoffset([b"x" * WRITE_BEHIND_FROM])), inline)
    committing = threading.Thread(target=inline.commit)
    committing.start()
    committing.join(5)
    assert not committing.is_alive(), "the commit waited for its sync"
    assert tier.disk.syncing.wait(10) and not big.done()  # the syncer's, under way
    inline = InlineCommit()
    small = writer.submit(Messages.of(unoffset([b"small"])), inline)
    inline.commit()  # (small: it would sync inline, but not ahead of the flush being synced)
    assert not small.done() and committed == []
    tier.disk.hold.set()
    assert (big.result(10).first_offset, small.result(10).first_offset) == (0, 1)
    assert [o for offsets in committed for o in offsets] == [0, 1]
    assert tier.read_messages(0, None)["body"].to_pylist() == [b"x" * WRITE_BEHIND_FROM, b"small"]


@pytest.mark.pure_python
def test_a_flush_written_behind_as_its_writer_closes_is_still_synced_and_answered(
    pipeline,
) -> None:
    """A loop writing behind while the destination's writer closes (a member letting it go):
    its syncer may have stopped before the flush was listed; the closing thread syncs it."""
    writer, tier, committed = pipeline
    tier.disk.writes.clear()  # the write waits inside the segment log
    inline = InlineCommit()
    big = writer.submit(Messages.of(unoffset([b"x" * WRITE_BEHIND_FROM])), inline)
    loop = threading.Thread(target=inline.commit)
    loop.start()
    assert tier.disk.writing.wait(10)  # taken, being written: the commit lock held
    closing = threading.Thread(target=writer.close)
    closing.start()
    wait_for(lambda: writer._syncer is not None and not writer._syncer.is_alive(),
             what="the syncer stopped (nothing was listed for it)")  # fmt: skip
    tier.disk.writes.set()
    loop.join(10)
    closing.join(10)
    assert not closing.is_alive()
    assert big.result(10).first_offset == 0
    assert committed == [[0]]


@pytest.fixture
def four(tmp_path: Path):
    """Four destinations' writers, each over a hot tier of its own."""
    made = []
    for name in ("q", "r", "s", "t"):
        store = MemoryStore()
        store.create_logs("q")
        tier = _Tier(store, str(tmp_path / name))
        writer = DestinationWriter(
            tier, "q", tier.open(), buffer_timeout_s=0.0, buffer_size_bytes=1 << 20,
            max_pending_bytes=1 << 30,
        )  # fmt: skip
        made.append((writer, tier))
    yield made
    for writer, _ in made:
        writer.close()


@pytest.mark.pure_python
def test_an_inline_commit_of_four_destinations_syncs_them_at_once_and_fails_only_one(
    four,
) -> None:
    """A loop's turn that produced to four destinations writes to each, then syncs them all at
    once (before, one after the other: 16 syncs took 3.1 ms, at once 1.2); a sync that fails
    fails its own destination's flush only, which leaves no gap."""
    for _, tier in four:
        tier.disk.hold.clear()
        tier.disk.syncing.clear()
    inline = InlineCommit()
    sent = [w.submit(Messages.of(unoffset([b"%d-0" % k])), inline) for k, (w, _) in enumerate(four)]
    committing = threading.Thread(target=inline.commit)
    committing.start()
    for _, tier in four:
        assert tier.disk.syncing.wait(10)  # all under way at once
    assert not any(f.done() for f in sent)
    for _, tier in four:
        tier.disk.hold.set()
    committing.join(10)
    assert [f.result(10).first_offset for f in sent] == [0, 0, 0, 0]
    failing = four[1][1]
    failing.disk.fail_syncs = 1
    inline = InlineCommit()
    sent = [w.submit(Messages.of(unoffset([b"%d-1" % k])), inline) for k, (w, _) in enumerate(four)]
    inline.commit()
    with pytest.raises(JournalError, match="injected"):
        sent[1].result(10)
    assert [sent[k].result(10).first_offset for k in (0, 2, 3)] == [1, 1, 1]
    assert four[1][0].submit(Messages.of(unoffset([b"after"]))).result(10).first_offset == 1
    assert failing.read_messages(0, None)["body"].to_pylist() == [b"1-0", b"after"]
    assert four[3][1].read_messages(0, None)["body"].to_pylist() == [b"3-0", b"3-1"]


@pytest.mark.pure_python
def test_a_failed_sync_fails_what_it_may_have_lost_and_leaves_no_gap(pipeline) -> None:
    writer, tier, committed = pipeline
    assert writer.submit(Messages.of(unoffset([b"kept"]))).result(10).first_offset == 0
    tier.disk.fail_syncs = 1
    tier.disk.hold.clear()
    tier.disk.syncing.clear()
    lost = writer.submit(Messages.of(unoffset([b"lost-1", b"lost-2"])))
    assert tier.disk.syncing.wait(10)  # its sync is under way (and will fail)
    assert tier.disk.next_lsn == 3
    also_lost = writer.submit(Messages.of(unoffset([b"lost-3"])))  # written behind it meanwhile
    wait_for(lambda: tier.disk.next_lsn == 4, what="the flush after the failing one written")
    tier.disk.hold.set()
    for f in (lost, also_lost):
        with pytest.raises(JournalError, match="injected"):
            f.result(10)
    assert writer.submit(Messages.of(unoffset([b"after"]))).result(10).first_offset == 1  # no gap
    assert [o for offsets in committed for o in offsets] == [0, 1]
    bodies = tier.read_messages(0, None)["body"].to_pylist()
    assert bodies == [b"kept", b"after"]
    assert writer.stats.failed_commits >= 1


@pytest.mark.process
@pytest.mark.parametrize("per_batch", [300, 40], ids=["writer-thread", "written-behind"])
def test_a_broker_killed_while_big_batches_are_pipelined_keeps_each_acknowledged_one(
    tmp_path: Path, per_batch: int
) -> None:
    """Batches of 300 KiB go through the pipeline (the wire loop hands them to the writer
    thread); batches of 40 KiB the wire loop writes itself, behind, and leaves their syncs to
    the syncer thread: SIGKILL with flushes written, synced and answered at every stage."""
    data = str(tmp_path / "data")
    proc = BrokerProcess(data, log_file=str(tmp_path / "b1.log")).start()
    with Admin(proc.url) as admin:
        admin.create_queue("q")
    acked: dict[int, list[int]] = {}
    lock = threading.Condition()

    def body(k: int, i: int) -> bytes:
        return b"%06d-%04d-" % (k, i) + b"x" * 1012

    def produce() -> None:
        with (
            contextlib.suppress(SparkMQError),
            Producer(proc.url, destination="q", max_in_flight_batches=8) as p,
        ):
            for k in range(10_000):
                fut = p.send_batch([body(k, i) for i in range(per_batch)], wait=False)
                fut.add_done_callback(lambda f, k=k: _record(f, k))

    def _record(f, k: int) -> None:
        if f.exception() is None:
            with lock:
                acked[k] = f.result()
                lock.notify_all()

    t = threading.Thread(target=produce, daemon=True)
    t.start()
    with lock:
        assert lock.wait_for(lambda: len(acked) >= 20, 60), "batches were not acknowledged"
    assert proc.proc is not None
    proc.proc.kill()
    assert proc.proc.wait(60) == -9
    t.join(60)
    assert not t.is_alive()

    again = BrokerProcess(data, log_file=str(tmp_path / "b2.log")).start()
    assert again.stop() == 0  # a clean stop moves everything to Delta
    stored = DeltaStore(data).read_messages("q", 0, None).sort_by("offset")
    offsets, bodies = stored["offset"].to_pylist(), stored["body"].to_pylist()
    assert offsets == list(range(len(offsets)))  # no gap, nothing twice
    assert len(set(bodies)) == len(bodies)
    at = dict(zip(offsets, bodies, strict=True))
    for k, got in acked.items():  # every acknowledged batch, where it was said to be
        assert [at.get(o) for o in got] == [body(k, i) for i in range(per_batch)]


def test_delta_reads_see_later_commits_and_survive_compacted_files(tmp_path: Path) -> None:
    """The store's readers keep a snapshot of a message log (opening one cost 40-60 ms a
    read): a read past it brings it up to date, and one whose files a compaction removed
    opens the log again."""
    from deltalake import DeltaTable

    from spark_mq.journal import layout

    store = DeltaStore(str(tmp_path / "root"))
    store.create_logs("q")
    store.commit_messages("q", rows([b"a", b"b"]), 2)
    assert store.read_messages("q", 0, 2)["body"].to_pylist() == [b"a", b"b"]
    store.commit_messages("q", rows([b"c"], first=2), 3)  # (another writer's table)
    assert store.read_messages("q", 0, 3)["body"].to_pylist() == [b"a", b"b", b"c"]
    assert store.read_messages("q", 1, None)["offset"].to_pylist() == [1, 2]
    # a compaction rewrites the log and vacuums the files the reader's snapshot points at
    table = DeltaTable(layout.messages_uri(store.root, "q"))
    table.delete("offset < 1")
    table.optimize.compact()
    table.vacuum(retention_hours=0, enforce_retention_duration=False, dry_run=False)
    assert store.read_messages("q", 0, 3)["body"].to_pylist() == [b"b", b"c"]


def test_moved_messages_are_written_in_row_groups_a_read_can_skip(tmp_path: Path) -> None:
    """A reader of a window (a Kafka fetch, 8,192 rows) decodes only the row groups holding
    it: a file of one row group had to be decoded whole for every window it held."""
    import pyarrow.parquet as pq
    from deltalake import DeltaTable

    from spark_mq.journal import layout

    store = DeltaStore(str(tmp_path / "root"))
    store.create_logs("q")
    store.commit_messages("q", rows([b"x" * 100] * 20_000), 20_000)
    (uri,) = DeltaTable(layout.messages_uri(store.root, "q")).file_uris()
    meta = pq.ParquetFile(uri).metadata
    assert meta.num_row_groups == 3
    assert max(meta.row_group(i).num_rows for i in range(3)) == 8192
    window = store.read_messages("q", 9000, 17192)
    assert window["offset"].to_pylist() == list(range(9000, 17192))
