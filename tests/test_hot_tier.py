"""The hot tier: segment format, torn tails, the mover's idempotence, freshness."""

from __future__ import annotations

import os
import random
from pathlib import Path

import pyarrow as pa
import pytest

from spark_mq import Admin, Consumer, Producer
from spark_mq.errors import SchemaMismatch
from spark_mq.journal import DeltaStore, Journal
from spark_mq.journal.hot_tier import HotTierSettings
from spark_mq.journal.records import (
    KIND_MESSAGES,
    KIND_PLAIN,
    KIND_PLAIN_SETTLEMENTS,
    KIND_SETTLEMENTS,
)
from spark_mq.journal.segments import FIRST_SEGMENT_BYTES, SPARE, SegmentLog
from spark_mq.journal.settlements import Settlement, SettlementRows
from spark_mq.launch import BrokerProcess
from spark_mq.messages import Messages, PlainMessage
from spark_mq.schema import with_offsets
from tests.conftest import receive_n, start_inprocess, wait_for
from tests.test_journal_conformance import rows as unoffset  # rows as the journal gets them


def rows(bodies: list[bytes], first: int = 0) -> pa.Table:
    """Rows as the journal writes them to a segment."""
    return with_offsets(unoffset(bodies), first)


def plain(bodies: list[bytes], first: int = 0) -> Messages:
    """Plain messages as the journal writes them to a segment (every other without an id)."""
    return Messages.of_plain(
        [
            PlainMessage(
                None if k % 2 else f"p-{first + k}", b, 1_700_000_000_000_000 + k, first + k
            )
            for k, b in enumerate(bodies)
        ]
    )


def settled(offsets: list[int]) -> SettlementRows:
    """Settlements as the journal writes them to a segment: an ack, and a dead-lettering."""
    return SettlementRows(
        [
            Settlement(offsets, "sub", "ack", 1_700_000_000_000_000),
            Settlement([offsets[0]], "", "dead", 1_700_000_000_000_001, "5 delivery attempts"),
        ]
    )


def as_table(records: pa.Table | Messages | SettlementRows) -> pa.Table:
    return records if isinstance(records, pa.Table) else records.table()


def segment_files(directory: Path) -> list[Path]:
    return sorted(directory.glob("segment-*.log"))


# -- the segment format ------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("sync", "write_syncs"), [("fdatasync", True), ("fdatasync", False), ("fsync", False)]
)
def test_segment_round_trip_across_segments(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, sync: str, write_syncs: bool
) -> None:
    """``write_syncs``: the writes sync themselves (RWF_DSYNC), or, as on a system without
    those flags, a separate fdatasync / fsync follows each."""
    if not write_syncs:
        import spark_mq.journal.segments as segments

        monkeypatch.setattr(segments, "_WRITE_FLAGS", {})
    log = SegmentLog(str(tmp_path), segment_bytes=64 * 1024, sync=sync)
    assert log.open() == []
    written = []
    offset = 0
    for i in range(40):
        table = rows([os.urandom(random.Random(i).randint(10, 3000)) for _ in range(5)], offset)
        written.append((KIND_MESSAGES, offset, table))
        offset += 5
        if i % 4 == 1:  # plain messages: one, or several with an empty body among them
            bodies = [os.urandom(100)] if i % 8 == 1 else [b"x" * 2000, b"", b"\xff" * 7]
            written.append((KIND_PLAIN, offset, plain(bodies, offset)))
            offset += len(bodies)
        if i % 3 == 0:  # as versions before KIND_PLAIN_SETTLEMENTS wrote them
            settle = pa.table({"offset": pa.array([offset - 1], pa.int64())})
            written.append((KIND_SETTLEMENTS, -1, settle))
        if i % 3 == 1:
            written.append((KIND_PLAIN_SETTLEMENTS, -1, settled(list(range(offset - i, offset)))))
    refs = []
    for k in range(0, len(written), 4):  # several records per sync
        refs += log.append(written[k : k + 4])
    log.close()
    assert len(segment_files(tmp_path)) > 1, "the log should have rolled to new segments"
    assert [r.lsn for r in refs] == list(range(1, len(written) + 1))

    reopened = SegmentLog(str(tmp_path), segment_bytes=64 * 1024, sync=sync)
    found = reopened.open()
    assert found == refs
    for ref, (kind, first, table) in zip(found, written, strict=True):
        assert (ref.kind, ref.first_offset, ref.rows) == (kind, first, table.num_rows)
        assert reopened.read(ref).equals(as_table(table))
    # numbering continues after a reopen
    assert reopened.append([written[0]])[0].lsn == len(written) + 1
    reopened.close()


def test_segments_are_written_over_zeros_from_a_spare_zeroed_ahead(tmp_path: Path) -> None:
    """With no sealed segment to reuse (the first rolls after a start), spares are zeroed.
    Segments of twice the short first one: that one is too small to be reused."""
    size = 2 * FIRST_SEGMENT_BYTES
    log = SegmentLog(str(tmp_path), segment_bytes=size, sync="fdatasync")
    log.open()
    assert segment_files(tmp_path) == []  # a log never written to has no file
    written = [(KIND_MESSAGES, 0, rows([b"first"], 0))]
    refs = log.append(written)
    (first,) = segment_files(tmp_path)
    # the first append made the first segment, zeroed and short
    assert first.stat().st_size == FIRST_SEGMENT_BYTES
    data = first.read_bytes()
    assert data[refs[0].position + refs[0].size :] == bytes(len(data) - refs[0].size)
    spare = tmp_path / SPARE
    offset = 1
    rolls = 0
    while len(segment_files(tmp_path)) < 3:
        table = rows([os.urandom(8 * 1024)], offset)  # (small appends: under 16 KiB)
        written.append((KIND_MESSAGES, offset, table))
        refs += log.append([written[-1]])
        offset += 1
        if len(segment_files(tmp_path)) - 1 > rolls:  # this append rolled: into the spare
            rolls += 1
            assert not spare.exists(), "the roll did not take the zeroed spare"
        active = segment_files(tmp_path)[-1]
        if (refs[-1].position + refs[-1].size) * 2 >= active.stat().st_size:
            wait_for(spare.exists, 20, SPARE)  # half full: the next segment is being zeroed
            assert spare.stat().st_size == size and spare.read_bytes() == bytes(size)
    # each roll took the spare: the active segment is full size (sealed ones give back their
    # unused tail), and the segment sealed after it was filled up to its last record
    assert segment_files(tmp_path)[2].stat().st_size == size
    assert segment_files(tmp_path)[1].stat().st_size > size - 9 * 1024
    log.close()

    (tmp_path / "spare.log.tmp").write_bytes(b"half-zeroed when the broker died")
    reopened = SegmentLog(str(tmp_path), segment_bytes=size, sync="fdatasync")
    assert reopened.open() == refs  # neither spare file is read as a segment
    assert not (tmp_path / "spare.log.tmp").exists() and not spare.exists()
    for ref, (_, _, table) in zip(refs, written, strict=True):
        assert reopened.read(ref).equals(table)
    reopened.close()


def test_a_segment_of_big_appends_rolls_into_reserved_space_not_a_zeroed_spare(
    tmp_path: Path,
) -> None:
    """Batches (appends of 16 KiB and more on average) would pay for the zeros twice: written,
    then written over; their segments roll into reserved space. Appends of 64 KiB, a
    partition's commit of a batch or two of 500 messages, are batches (they were not below
    256 KiB: each partition zeroed 64 MiB spares while it was written)."""
    size = 4 * FIRST_SEGMENT_BYTES
    log = SegmentLog(str(tmp_path), segment_bytes=size, sync="fdatasync")
    log.open()
    refs, offset = [], 0
    while len(segment_files(tmp_path)) < 4:
        table = rows([os.urandom(64 * 1024)], offset)
        refs += log.append([(KIND_MESSAGES, offset, table)])
        offset += 1
        assert log._spare is None, "a spare is being zeroed"
    assert log.spares_zeroed == 0 and not (tmp_path / SPARE).exists()
    assert segment_files(tmp_path)[-1].stat().st_size == size  # reserved at the roll
    log.close()
    reopened = SegmentLog(str(tmp_path), segment_bytes=size, sync="fdatasync")
    assert reopened.open() == refs
    reopened.close()


def test_the_encoding_buffer_is_reused_and_each_payload_decodes_to_its_table() -> None:
    from spark_mq.journal.ipc_payloads import Scratch, decode_table

    scratch = Scratch(keep_bytes=512 * 1024)
    held = []
    for sizes in (
        [100_000, 10],
        [80_000],
        [150_000, 150_000],  # grow
        [90_000],  # shrink
        [300_000, 300_000],  # over keep_bytes
        [3000, 10],  # small records: encoded on their own, the buffer is left alone
    ):
        tables = [rows([os.urandom(n)], k) for k, n in enumerate(sizes)]
        payloads = scratch.encode(tables)
        for payload, table in zip(payloads, tables, strict=True):
            assert decode_table(payload).equals(table)
        held.append(scratch._buffer)
    first, same, grown, reused, dropped, untouched = held
    assert same is first and grown is not first and reused is grown  # no new memory if it fits
    assert dropped is None and untouched is None  # over keep_bytes: not held on to


def _written_by_a_stream_writer(table: pa.Table) -> bytes:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return sink.getvalue().to_pybytes()


def test_small_records_are_the_very_ipc_streams_a_stream_writer_gives() -> None:
    """Small records are put together from the schema's message, encoded once, and each batch's;
    the bytes must be what pyarrow's stream writer makes, whatever the rows and chunks."""
    from spark_mq.journal.ipc_payloads import Scratch, decode_table
    from spark_mq.schema import SETTLEMENT_SCHEMA

    settle_time = pa.array([1, None], pa.int64()).cast(SETTLEMENT_SCHEMA.field("settle_time").type)
    acks = pa.table(
        [
            pa.array([3, 4]),
            pa.array(["", "s"]),
            pa.array(["ack", "dead"]),
            settle_time,
            pa.array([None, "too many attempts"]),
        ],
        schema=SETTLEMENT_SCHEMA,
    )
    tables = [
        rows([b"one"]),
        rows([]),
        pa.concat_tables([rows([b"a"], 0), rows([b"b", b"c"], 1), rows([b"d"], 3)]),  # 3 chunks
        acks,
        pa.table({"other": [1, 2]}),  # not a journal schema: written the general way
    ]
    payloads = Scratch().encode(tables)
    for payload, table in zip(payloads, tables, strict=True):
        assert payload.to_pybytes() == _written_by_a_stream_writer(table)
        assert decode_table(payload).equals(table)


@pytest.mark.parametrize(
    "last_kind",
    [KIND_MESSAGES, KIND_PLAIN, KIND_PLAIN_SETTLEMENTS],
    ids=["arrow", "plain", "settlements"],
)
@pytest.mark.parametrize("damage", ["cut", "flip"])
def test_torn_tail_is_truncated_at_every_byte_of_the_last_record(
    tmp_path: Path, damage: str, last_kind: int
) -> None:
    src = tmp_path / "src"
    log = SegmentLog(str(src), segment_bytes=64 * 1024, sync="none")
    log.open()
    third = {
        KIND_MESSAGES: rows([b"third" * 20], 3),
        KIND_PLAIN: plain([b"third" * 20], 3),
        KIND_PLAIN_SETTLEMENTS: settled([0, 1, 2]),
    }[last_kind]
    third_first = -1 if last_kind == KIND_PLAIN_SETTLEMENTS else 3
    tables = [rows([b"first"], 0), rows([b"second", b"2nd"], 1), third]
    kinds = [KIND_MESSAGES, KIND_MESSAGES, last_kind]
    refs = [
        log.append([(kind, first, t)])[0]
        for kind, first, t in zip(kinds, [0, 1, third_first], tables, strict=True)
    ]
    log.close()
    (segment,) = segment_files(src)
    last = refs[-1]
    data = segment.read_bytes()[: last.position + last.size]

    for k in range(last.size):
        work = tmp_path / f"{damage}-{k}"
        work.mkdir()
        if damage == "cut":  # the crash left only k bytes of the last record (rest zeros)
            torn = data[: last.position + k] + bytes(last.size - k)
        else:  # one byte of the last record is wrong
            torn = bytearray(data)
            torn[last.position + k] ^= 0xFF
            torn = bytes(torn)
        (work / segment.name).write_bytes(torn)
        reopened = SegmentLog(str(work), segment_bytes=64 * 1024, sync="none")
        found = reopened.open()
        if torn == data:  # the record ends in zero bytes: cutting those loses nothing
            assert found == refs
            reopened.close()
            continue
        assert found == refs[:2], f"byte {k}: the torn record was served"
        # the next append reuses the torn record's place and number; a reopen sees it whole
        again = reopened.append([(last_kind, third_first, tables[2])])[0]
        assert again.lsn == 3 and again.position == last.position
        reopened.close()
        final = SegmentLog(str(work), segment_bytes=64 * 1024, sync="none")
        found = final.open()
        assert [r.lsn for r in found] == [1, 2, 3]
        assert final.read(found[2]).equals(as_table(tables[2]))
        final.close()


# -- the mover ---------------------------------------------------------------------------------
CRASHING_MOVE = """
import sys
import pyarrow as pa
from spark_mq.journal import DeltaStore, Journal
from spark_mq.journal.hot_tier import HotTierSettings
from spark_mq.messages import Messages
from spark_mq.schema import normalize_produce_batch

root, hot = sys.argv[1:3]
j = Journal(DeltaStore(root), hot_tier=HotTierSettings(hot, move_interval_s=3600))
j.open()
j.create_destination("q", "queue")
for i in range(5):
    batch = pa.table({"body": pa.array([b"m%d-%d" % (i, k) for k in range(3)], pa.binary())})
    rows = normalize_produce_batch(batch, enqueue_time_us=0, max_message_bytes=1 << 20,
                                   destination="q")
    j.append("q", Messages.of(rows)).result()
j.settle("q", [0, 1, 2], subscription="").result()
j.move()  # the armed failpoint kills this process in here
sys.exit(3)
"""


@pytest.mark.process
@pytest.mark.parametrize("point", ["hot-tier-messages-moved", "hot-tier-moved"])
def test_move_is_idempotent_after_a_crash_between_commit_and_retirement(
    tmp_path: Path, point: str
) -> None:
    import subprocess
    import sys

    root, hot = str(tmp_path / "root"), str(tmp_path / "hot")
    env = {**os.environ, "SPARKMQ_FAILPOINTS": point}
    done = subprocess.run(
        [sys.executable, "-c", CRASHING_MOVE, root, hot], env=env, timeout=120, check=False
    )
    assert done.returncode == -9, "the failpoint should have killed the process (SIGKILL)"
    delta = DeltaStore(root)
    assert delta.committed_end("q") == 15  # the messages' commit landed before the crash

    j = Journal(DeltaStore(root), hot_tier=HotTierSettings(hot, move_interval_s=3600))
    j.open()
    try:
        assert j.end_offset("q") == 15
        assert j.read_messages("q")["offset"].to_pylist() == list(range(15))
        assert j.move(timeout=60)
        stats = j.tier_stats("q")
        assert stats is not None and stats.pending_records == 0
    finally:
        j.close()
    # Delta holds every message and every settlement exactly once
    assert sorted(delta.read_messages("q", 0, None)["offset"].to_pylist()) == list(range(15))
    assert sorted(delta.read_settlements("q")["offset"].to_pylist()) == [0, 1, 2]


def test_reads_span_both_tiers_while_moving(tmp_path: Path) -> None:
    hot = HotTierSettings(str(tmp_path / "hot"), move_interval_s=3600, segment_bytes=64 * 1024)
    j = Journal(DeltaStore(str(tmp_path / "root")), hot_tier=hot)
    j.open()
    try:
        j.create_destination("q", "queue")
        for i in range(30):
            j.append("q", Messages.of(unoffset([b"%d" % i] + [os.urandom(900)] * 9))).result()
            if i % 10 == 9:
                assert j.move(timeout=60)  # 0..99, 100..199, 200..299 in Delta
        j.append("q", Messages.of(unoffset([b"hot"]))).result()
        with pytest.raises(SchemaMismatch):
            j.append("q", Messages.of(rows([b"already has offsets"])))
        stats = j.tier_stats("q")
        assert stats is not None
        assert (stats.delta_end_offset, stats.pending_records) == (300, 1)
        table = j.read_messages("q", 295, 301)
        assert table["offset"].to_pylist() == list(range(295, 301))
        assert table["body"][-1].as_py() == b"hot"
        # what a loop may read (the tail still in memory), and what it may not (Delta's)
        assert j.read_recent("q", 295, 301) is None
        (recent,) = j.read_recent("q", 300, 301)["body"].to_pylist()  # type: ignore[index]
        assert recent == b"hot"
        # moved segments were deleted; the one being written stays
        assert stats.segments <= 2
    finally:
        j.close()


def test_a_move_of_records_of_different_schemas_gives_rows_of_the_current_one() -> None:
    from spark_mq.journal.move_rows import few_batches
    from spark_mq.schema import MESSAGE_SCHEMA, conform

    current = [rows([b"a"], 0), rows([b"b", b"c"], 1)]
    # a record from a version without deliver_time, with a wider body type
    old = rows([b"d"], 3).drop_columns(["deliver_time"])
    old = old.set_column(
        old.schema.get_field_index("body"), "body", old["body"].cast(pa.large_binary())
    )
    for records in (current, [*current, old], [old, *current]):
        got = few_batches(records, MESSAGE_SCHEMA)
        want = pa.concat_tables([conform(t, MESSAGE_SCHEMA) for t in records])
        assert got.schema.equals(MESSAGE_SCHEMA)
        assert got.equals(want)
        assert got["body"].num_chunks == 1  # one batch for delta-rs, not one per record


def test_a_move_combines_runs_of_small_records_and_passes_big_batches_as_they_are() -> None:
    from spark_mq.journal.move_rows import _BIG_BATCH_ROWS, few_batches
    from spark_mq.schema import MESSAGE_SCHEMA

    big = [b"x"] * _BIG_BATCH_ROWS
    records = [
        rows([b"a"], 0),
        rows([b"b"], 1),
        rows(big, 2),  # a produced batch
        rows([b"c"], 2 + len(big)),
        rows(big, 3 + len(big)),
        rows(big, 3 + 2 * len(big)),
        rows([b"d"], 3 + 3 * len(big)),
        rows([b"e"], 4 + 3 * len(big)),
    ]
    got = few_batches(records, MESSAGE_SCHEMA)
    assert got.equals(pa.concat_tables(records))
    sizes = [b.num_rows for b in got.to_batches()]
    assert sizes == [2, len(big), 1, len(big), len(big), 2]
    # the big batches' data is not copied
    assert got.to_batches()[1]["body"].buffers()[2].address == (
        records[2]["body"].chunk(0).buffers()[2].address
    )


# -- freshness through the broker --------------------------------------------------------------
@pytest.mark.spark
def test_consumers_see_messages_before_delta_does(spark, tmp_path: Path, clock) -> None:
    running = start_inprocess(tmp_path / "data", clock, **{"journal.move_interval_ms": 3_600_000})
    root = str(tmp_path / "data")
    try:
        with Admin(running.url) as admin:
            admin.create_queue("q")
            with Producer(running.url, destination="q") as p:
                p.send_batch([b"a", b"b", b"c"])
            stats = admin.stats("q")
            assert (stats["end_offset"], stats["delta_end_offset"]) == (3, 0)
            assert stats["delta_lag_messages"] == 3
            with Consumer(running.url, "q") as c:  # served from the hot tier at once
                assert [m.body for m in receive_n(c, 3)] == [b"a", b"b", b"c"]
            reader = spark.read.format("sparkmq").option("root", root).option("destination", "q")
            assert reader.load().count() == 0  # Spark reads Delta: not there yet
            assert running.broker.journal.move(timeout=60)
            stats = admin.stats("q")
            assert (stats["delta_end_offset"], stats["delta_lag_messages"]) == (3, 0)
            got = spark.read.format("sparkmq").option("root", root).option("destination", "q")
            assert [bytes(r.body) for r in got.load().orderBy("offset").collect()] == [
                b"a",
                b"b",
                b"c",
            ]
    finally:
        running.stop()


def test_graceful_stop_moves_everything_to_delta(tmp_path: Path, clock) -> None:
    running = start_inprocess(tmp_path / "data", clock, **{"journal.move_interval_ms": 3_600_000})
    with Admin(running.url) as admin:
        admin.create_topic("t")
    with Producer(running.url, destination="t") as p:
        p.send_batch([b"x"] * 50)
    running.stop()
    assert DeltaStore(str(tmp_path / "data")).committed_end("t") == 50


@pytest.mark.process
def test_broker_killed_at_a_move_restarts_without_duplicates(tmp_path: Path) -> None:
    data = str(tmp_path / "data")
    proc = BrokerProcess(
        data, env={"SPARKMQ_FAILPOINTS": "hot-tier-moved"}, log_file=str(tmp_path / "b1.log")
    ).start()
    with Admin(proc.url) as admin:
        admin.create_queue("q")
    with Producer(proc.url, destination="q") as p:
        offsets = [p.send_sync(b"m%d" % i) for i in range(20)]
    assert offsets == list(range(20))
    assert proc.proc is not None
    assert proc.proc.wait(60) == -9  # the first move killed it after its Delta commits

    again = BrokerProcess(data, log_file=str(tmp_path / "b2.log")).start()
    try:
        with Consumer(again.url, "q", prefetch=100) as c:
            got = receive_n(c, 20)
            assert [m.body for m in got] == [b"m%d" % i for i in range(20)]
            c.ack(got).result(timeout=10)
    finally:
        assert again.stop() == 0
    delta = DeltaStore(data)
    assert sorted(delta.read_messages("q", 0, None)["offset"].to_pylist()) == list(range(20))
    assert sorted(delta.read_settlements("q")["offset"].to_pylist()) == list(range(20))


FILE_SIZE_LIMITED = """
import resource, signal, sys
import pyarrow as pa
from spark_mq.errors import JournalError
from spark_mq.journal import DeltaStore, Journal
from spark_mq.journal.hot_tier import HotTierSettings
from spark_mq.messages import Messages
from spark_mq.schema import normalize_produce_batch

root, hot = sys.argv[1:3]
# every file this process writes is capped at 256 KiB: a write past that fails with EFBIG,
# as a write to a full disk fails with ENOSPC
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
resource.setrlimit(resource.RLIMIT_FSIZE, (256 * 1024, 256 * 1024))

def rows(bodies):
    return normalize_produce_batch(pa.table({"body": pa.array(bodies, pa.binary())}),
                                   enqueue_time_us=0, max_message_bytes=1 << 22, destination="q")

settings = HotTierSettings(hot, segment_bytes=64 * 1024, move_interval_s=3600)
j = Journal(DeltaStore(root), hot_tier=settings)
j.open()
j.create_destination("q", "queue")
assert j.append("q", Messages.of(rows([b"kept-1"]))).result().first_offset == 0
try:
    j.append("q", Messages.of(rows([b"x" * (400 * 1024)]))).result()
except JournalError as exc:
    print("REFUSED:", exc)
else:
    sys.exit("the oversized write was accepted")
assert j.append("q", Messages.of(rows([b"kept-2"]))).result().first_offset == 1
j.flush()
"""


@pytest.mark.process
def test_a_write_the_disk_refuses_fails_cleanly_and_leaves_no_trace(tmp_path: Path) -> None:
    import subprocess
    import sys

    root, hot = str(tmp_path / "root"), str(tmp_path / "hot")
    done = subprocess.run(
        [sys.executable, "-c", FILE_SIZE_LIMITED, root, hot],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert "REFUSED: appending to the hot tier failed" in done.stdout
    # the process ended without a clean close (no move): a reopen recovers from the segments
    j = Journal(DeltaStore(root), hot_tier=HotTierSettings(hot, move_interval_s=3600))
    j.open()
    try:
        assert j.read_messages("q")["body"].to_pylist() == [b"kept-1", b"kept-2"]
        assert j.end_offset("q") == 2
    finally:
        j.close()


@pytest.mark.process
def test_delta_only_start_refuses_segments_a_crash_left(tmp_path: Path, clock) -> None:
    import subprocess
    import sys

    from spark_mq.errors import ConfigError

    root, hot = str(tmp_path / "root"), str(tmp_path / "hot")
    env = {**os.environ, "SPARKMQ_FAILPOINTS": "hot-tier-messages-moved"}
    done = subprocess.run(
        [sys.executable, "-c", CRASHING_MOVE, root, hot], env=env, timeout=120, check=False
    )
    assert done.returncode == -9  # the settlements were never moved to Delta
    settings = {"journal.hot_dir": hot}
    with pytest.raises(ConfigError, match=r"journal\.hot_tier = true"):
        start_inprocess(Path(root), clock, **settings, **{"journal.hot_tier": "false"})
    # with the hot tier once more, a clean stop moves everything and clears the segments
    start_inprocess(Path(root), clock, **settings).stop()
    assert not segment_files(Path(hot) / "q")
    delta_only = start_inprocess(Path(root), clock, **settings, **{"journal.hot_tier": "false"})
    try:
        with Admin(delta_only.url) as admin:
            assert admin.stats("q")["depth"] == 12  # 15 produced, 3 settled before the crash
    finally:
        delta_only.stop()
