"""Retired segments are reused as the next ones (``SegmentLog.retire``): no zeroing, and the
records they held before are never served, not even after a crash."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from spark_mq import Admin, Consumer, Producer
from spark_mq.broker.recovery import low_water, settled_by_subscription
from spark_mq.journal import DeltaStore
from spark_mq.journal.records import HEADER_BYTES, KIND_MESSAGES, RecordRef
from spark_mq.journal.segments import SPARE, SegmentLog
from spark_mq.launch import BrokerProcess
from tests.conftest import receive_n, wait_for
from tests.test_hot_tier import rows, segment_files

SIZE = 256 * 1024  # the first segment is as big: it can be reused too


def append_one(log: SegmentLog, written: list) -> RecordRef:
    """A record of the one size every record here has (old records line up with new ones)."""
    offset = len(written)
    written.append((KIND_MESSAGES, offset, rows([b"%06d" % offset + b"r" * 3000], offset)))
    return log.append([written[-1]])[0]


def test_a_retired_segment_becomes_the_next_one_and_its_old_records_are_never_read(
    tmp_path: Path,
) -> None:
    log = SegmentLog(str(tmp_path), segment_bytes=SIZE, sync="fdatasync")
    log.open()
    spare = tmp_path / SPARE
    written: list = []
    refs = [append_one(log, written)]
    while (refs[-1].position + refs[-1].size) * 2 < SIZE:
        refs.append(append_one(log, written))
    wait_for(spare.exists, 20, SPARE)  # the first roll's spare: nothing to reuse yet, zeroed
    while refs[-1].segment < 1:
        refs.append(append_one(log, written))
    assert not spare.exists()  # the roll took it

    seg0 = segment_files(tmp_path)[0]
    inode, old = seg0.stat().st_ino, seg0.read_bytes()
    assert log.retire([0]) == 1  # all moved: segment 0 is the spare now
    assert not seg0.exists() and spare.stat().st_ino == inode
    assert spare.stat().st_size == SIZE
    reused = spare.read_bytes()
    assert reused[:HEADER_BYTES] == bytes(HEADER_BYTES)  # the first record's header is wiped
    assert reused[HEADER_BYTES:] == (old + bytes(SIZE))[HEADER_BYTES:SIZE]  # nothing else

    while refs[-1].segment < 2:
        refs.append(append_one(log, written))
    assert not spare.exists() and segment_files(tmp_path)[-1].stat().st_ino == inode
    last = refs[-1]
    assert last.position == 0  # one record in the reused segment so far
    # behind it, segment 0's second record, whole and where a scan looks next
    now = segment_files(tmp_path)[-1].read_bytes()
    assert now[last.size : len(old)] == old[last.size :]
    assert log.spares_zeroed == 1 and log.spares_reused == 1
    log.close()

    spare.write_bytes(b"a spare left by a crash")
    reopened = SegmentLog(str(tmp_path), segment_bytes=SIZE, sync="fdatasync")
    found = reopened.open()
    assert not spare.exists()
    # segment 0's records are gone with it; every other record is found, and nothing else
    assert found == [r for r in refs if r.segment != 0]
    for ref in found:
        assert reopened.read(ref).equals(written[ref.first_offset][2])
    # the old records behind the last one were cut off at the open
    data = segment_files(tmp_path)[-1].read_bytes()
    assert data[last.size :] == bytes(len(data) - last.size)
    reopened.close()


@pytest.mark.process
def test_a_broker_killed_while_reusing_segments_serves_exactly_what_it_acknowledged(
    tmp_path: Path,
) -> None:
    """Tiny segments moved to Delta at once: the broker reuses one every ~60 messages, so the
    kill finds a reused active segment with old records behind the new ones."""
    data = str(tmp_path / "data")
    args = ["--set", "journal.segment_bytes=65536", "--set", "journal.move_interval_ms=20"]
    broker = BrokerProcess(data, extra_args=args, log_file=str(tmp_path / "b1.log")).start()
    try:
        with Producer(broker.url, destination="q", linger_ms=0) as p:
            for i in range(400):
                assert p.send_sync(b"%04d" % i + os.urandom(1000), dedup_id=f"r-{i}") == i
        with Consumer(broker.url, "q", prefetch=200) as c:
            got = receive_n(c, 150)
            c.ack(got).result(timeout=10)  # durable: the kill must not undo them
        with Admin(broker.url) as admin:
            assert admin.stats("q")["hot_tier_segments_reused"] > 0
    finally:
        broker.kill()

    again = BrokerProcess(data, extra_args=args, log_file=str(tmp_path / "b2.log")).start()
    try:
        with Consumer(again.url, "q", prefetch=500) as c:
            back = receive_n(c, 250)
            assert [(m.offset, m.dedup_id) for m in back] == [
                (i, f"r-{i}") for i in range(150, 400)
            ]
            assert [m.body[:4] for m in back] == [b"%04d" % i for i in range(150, 400)]
            assert c.receive(timeout=0.5) is None  # nothing more: no old record came back
            c.ack(back).result(timeout=10)
    finally:
        assert again.stop() == 0
    delta = DeltaStore(data)
    assert sorted(delta.read_messages("q", 0, None)["offset"].to_pylist()) == list(range(400))
    # every offset settled (the owner may have collapsed the acks into a mark meanwhile)
    settled = settled_by_subscription(delta.read_settlements("q")).get("")
    low, above = low_water(0, settled)
    assert (low, set(above)) == (400, set())
