"""A batch the broker cannot read: refused before it is acknowledged on every transport, and
a record that cannot be read (stored by an older version) quarantined at start, never a crash."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.flight as fl
import pytest

from spark_mq import Admin, Consumer, Producer, ProtocolError, protocol, wire
from spark_mq.jobs.compaction import CompactionPolicy, compact_all
from spark_mq.launch import BrokerProcess
from spark_mq.messages import Messages
from spark_mq.schema import PRODUCE_SCHEMA
from spark_mq.service import RunningBroker
from tests.conftest import receive_n

# a binary column whose third offset points far past its 30 bytes of data
BAD_OFFSETS = np.array([0, 10, 7_536_695, 30], np.int32)


def bad_body() -> pa.Array:
    data = pa.py_buffer(b"x" * 30)
    return pa.Array.from_buffers(pa.binary(), 3, [None, pa.py_buffer(BAD_OFFSETS), data])


def bad_batch() -> pa.RecordBatch:
    columns = [bad_body() if f.name == "body" else pa.nulls(3, f.type) for f in PRODUCE_SCHEMA]
    return pa.RecordBatch.from_arrays(columns, schema=PRODUCE_SCHEMA)


def frame_bytes(parts: list) -> bytes:
    return b"".join(p.to_pybytes() if isinstance(p, pa.Buffer) else bytes(p) for p in parts)


def test_a_batch_with_offsets_past_its_data_is_refused_on_the_direct_wire(
    broker: RunningBroker,
) -> None:
    with socket.create_connection(("127.0.0.1", broker.wire_port), timeout=10) as sock:
        sock.sendall(wire.control(protocol.Produce("q")))
        sock.sendall(frame_bytes(wire.batch_parts(0, bad_batch())))
        reader, frames = wire.FrameReader(), []
        while data := sock.recv(65536):
            frames += reader.feed(data)
    ((_, body),) = frames
    answer = wire.parse_control(body)
    assert isinstance(answer, wire.Failure)  # not a put_ack
    assert answer.error["code"] == "protocol"
    assert "offset for slot 2 out of bounds: 7536695 > 30" in answer.error["message"]
    with Producer(broker.url, destination="q") as producer:
        assert producer.send_sync("still serving") == 0  # nothing of the bad batch was stored


def test_a_batch_with_offsets_past_its_data_is_refused_over_flight(broker: RunningBroker) -> None:
    client = fl.connect(broker.url)
    descriptor = fl.FlightDescriptor.for_command(protocol.encode(protocol.Produce("q")))
    writer, reader = client.do_put(descriptor, PRODUCE_SCHEMA)
    writer.write_batch(bad_batch())
    writer.done_writing()
    answer = protocol.parse(reader.read().to_pybytes())
    writer.close()
    client.close()
    assert isinstance(answer, protocol.PutFailed)
    assert answer.error["code"] == "protocol" and "out of bounds" in answer.error["message"]
    with Admin(broker.url) as admin:
        assert admin.stats("q")["end_offset"] == 0


def test_a_transaction_with_offsets_past_its_data_is_refused(broker: RunningBroker) -> None:
    columns = [pa.array(["q"] * 3), *bad_batch().columns]
    table = pa.table(columns, names=["destination", *PRODUCE_SCHEMA.names])
    client = fl.connect(broker.url)
    with pytest.raises(fl.FlightServerError, match="not valid Arrow data"):
        list(client.do_action(fl.Action("commit_transaction", protocol.encode_commit([], table))))
    client.close()
    with Admin(broker.url) as admin:
        assert "q" not in {d["name"] for d in admin.list_destinations()}


# An older version stored such a batch in the hot tier; then the process died (no move).
STORE_UNREADABLE = """
import os, sys
import numpy as np
import pyarrow as pa
from spark_mq.journal import DeltaStore, Journal
from spark_mq.journal.hot_tier import HotTierSettings
from spark_mq.messages import Messages
from spark_mq.schema import UNOFFSET_SCHEMA, normalize_produce_batch

root, BAD_OFFSETS = sys.argv[1], [int(o) for o in sys.argv[2].split(",")]
j = Journal(DeltaStore(root), hot_tier=HotTierSettings(root + "/_hot", move_interval_s=3600))
j.open()
j.create_destination("q", "queue")

def rows(bodies):
    return normalize_produce_batch(pa.table({"body": pa.array(bodies, pa.binary())}),
                                   enqueue_time_us=0, max_message_bytes=1 << 22, destination="q")

assert j.append("q", Messages.of(rows([b"before-0", b"before-1"]))).result().first_offset == 0
good = rows([b"a", b"b", b"c"])
body = pa.Array.from_buffers(pa.binary(), 3, [None, pa.py_buffer(np.array(BAD_OFFSETS, np.int32)),
                                              pa.py_buffer(b"x" * 30)])
bad = pa.Table.from_arrays([*good.columns[:-1], body], schema=UNOFFSET_SCHEMA)
assert j.append("q", Messages.of(bad)).result().first_offset == 2
assert j.append("q", Messages.of(rows([b"after-5"]))).result().first_offset == 5
os._exit(0)
"""


@pytest.mark.process
def test_an_unreadable_record_in_the_hot_tier_is_quarantined_and_the_rest_recovers(
    tmp_path: Path,
) -> None:
    data = tmp_path / "data"
    done = subprocess.run(
        [sys.executable, "-c", STORE_UNREADABLE, str(data), ",".join(map(str, BAD_OFFSETS))],
        timeout=120,
        check=False,
    )
    assert done.returncode == 0
    log = tmp_path / "broker.log"
    broker = BrokerProcess(str(data), log_file=str(log)).start()  # it crashed here (SIGSEGV)
    try:
        with Consumer(broker.url, "q", prefetch=10) as consumer:
            got = receive_n(consumer, 3)
            assert [(m.offset, m.body) for m in got] == [
                (0, b"before-0"),
                (1, b"before-1"),
                (5, b"after-5"),
            ]
            consumer.ack(got).result(timeout=10)
        with Producer(broker.url, destination="q") as producer:
            assert producer.send_sync("new") == 6  # offsets 2-4 are never given again
        with Admin(broker.url) as admin:
            assert admin.stats("q")["hot_tier_quarantined"] == 1
    finally:
        assert broker.stop() == 0
    assert "record 2 (3 message(s) at offsets 2-4) cannot be read and is quarantined" in (
        log.read_text()
    )
    kept = data / "_hot" / ".quarantine" / "q"
    about = json.loads((kept / "record-000000000002.json").read_text())
    assert (about["first_offset"], about["rows"], about["destination"]) == (2, 3, "q")
    assert "out of bounds" in about["problem"]
    assert (kept / "record-000000000002.payload").stat().st_size == about["payload_bytes"]
    # the clean stop moved everything past it to Delta: a restart does not meet it again
    again = BrokerProcess(str(data), log_file=str(log)).start()
    try:
        with Admin(again.url) as admin:
            stats = admin.stats("q")
            assert stats["hot_tier_quarantined"] == 0 and stats["end_offset"] == 7
            assert stats["depth"] == 1  # "new"
    finally:
        assert again.stop() == 0
    # compaction's low-water mark passes the gap too (2-4 have no rows; 0, 1 and 5 were acked)
    (result,) = compact_all(str(data), CompactionPolicy(force=True, keep_recent_s=0))
    assert result.low_water == {"": 6}


def test_the_protocol_error_class_is_exported() -> None:
    assert issubclass(ProtocolError, Exception)


def test_an_unreadable_record_met_by_a_move_is_quarantined_and_the_rest_moves(
    tmp_path: Path,
) -> None:
    from spark_mq.journal import DeltaStore, Journal
    from spark_mq.journal.hot_tier import HotTierSettings
    from spark_mq.schema import UNOFFSET_SCHEMA, normalize_produce_batch

    def rows(bodies: list[bytes]) -> pa.Table:
        return normalize_produce_batch(
            pa.table({"body": pa.array(bodies, pa.binary())}),
            enqueue_time_us=0,
            max_message_bytes=1 << 22,
            destination="q",
        )

    root, hot = str(tmp_path / "root"), str(tmp_path / "hot")
    journal = Journal(DeltaStore(root), hot_tier=HotTierSettings(hot, move_interval_s=0.05))
    journal.open()
    try:
        journal.create_destination("q", "queue")
        journal.append("q", Messages.of(rows([b"m0"]))).result()
        good = rows([b"a", b"b", b"c"])
        bad = pa.Table.from_arrays([*good.columns[:-1], bad_body()], schema=UNOFFSET_SCHEMA)
        journal.append(
            "q", Messages.of(bad)
        ).result()  # (the journal trusts its caller: the broker checks)
        journal.append("q", Messages.of(rows([b"m4"]))).result()
        deadline = time.monotonic() + 30
        # (a move commits to Delta, then lets go of its records: wait for both)
        while (stats := journal.tier_stats("q")).delta_end_offset < 5 or stats.pending_records:
            assert time.monotonic() < deadline, stats
            time.sleep(0.02)
        assert stats.quarantined == 1
    finally:
        journal.close()
    moved = DeltaStore(root).read_messages("q", 0, None)
    assert moved["offset"].to_pylist() == [0, 4]
    assert (Path(hot) / ".quarantine" / "q" / "record-000000000002.json").exists()
