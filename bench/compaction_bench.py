"""Compaction benchmark: prints figures, asserts nothing.

    .venv/bin/python bench/compaction_bench.py [--messages 10000000] [--settled 0.9] [--body 100]

Builds a queue of ``--messages`` messages straight in Delta (in 20 commits, so 20 files) with
the first ``--settled`` share acked, starts a broker on it, then in the same run:

1. synchronous produce latency to another queue for ``--probe-seconds`` with no compaction;
2. the same while ``sparkmq compact`` runs on the big queue: compaction time, rows removed,
   files before/after and bytes the live tables shrank by.
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import threading
import time

import numpy as np
import pyarrow as pa

from spark_mq import Admin, Producer
from spark_mq.jobs.compaction import CompactionPolicy, compact_all
from spark_mq.jobs.report import human_bytes, summary_table
from spark_mq.journal import DeltaStore, Journal
from spark_mq.launch import BrokerProcess
from spark_mq.schema import MESSAGE_SCHEMA, SETTLEMENT_SCHEMA, TS

CHUNKS = 20


def build(root: str, total: int, settled: float, body_bytes: int) -> None:
    journal = Journal(DeltaStore(root))
    journal.open()
    journal.create_destination("big", "queue")
    journal.close()
    store = DeltaStore(root)
    rng = np.random.default_rng(7)
    per = -(-total // CHUNKS)
    now = int((time.time() - 3600) * 1_000_000)  # an hour old: past compaction's keep_recent_s
    started = time.perf_counter()
    for c in range(CHUNKS):
        lo, hi = c * per, min((c + 1) * per, total)
        n = hi - lo
        if n <= 0:
            break
        data = rng.integers(0, 256, n * body_bytes, dtype=np.uint8).tobytes()
        offsets = pa.array(np.arange(0, (n + 1) * body_bytes, body_bytes, dtype=np.int32))
        body = pa.BinaryArray.from_buffers(
            pa.binary(), n, [None, offsets.buffers()[1], pa.py_buffer(data)]
        )
        rows = pa.table(
            {
                "offset": pa.array(np.arange(lo, hi), pa.int64()),
                "message_id": pa.nulls(n, pa.string()),
                "dedup_id": pa.nulls(n, pa.string()),
                "group_id": pa.nulls(n, pa.string()),
                "priority": pa.array(np.full(n, 4, np.int32)),
                "enqueue_time": pa.array(np.full(n, now, np.int64)).cast(TS),
                "expiry_time": pa.nulls(n, TS),
                "deliver_time": pa.nulls(n, TS),
                "headers": pa.nulls(n, MESSAGE_SCHEMA.field("headers").type),
                "body": body,
            },
            schema=MESSAGE_SCHEMA,
        )
        store.commit_messages("big", rows, hi)
        acked_hi = min(hi, int(total * settled))
        if acked_hi > lo:
            k = acked_hi - lo
            store.commit_settlements(
                "big",
                pa.table(
                    {
                        "offset": pa.array(np.arange(lo, acked_hi), pa.int64()),
                        "subscription": pa.array([""] * k, pa.string()),
                        "outcome": pa.array(["ack"] * k, pa.string()),
                        "settle_time": pa.array(np.full(k, now, np.int64)).cast(TS),
                        "reason": pa.nulls(k, pa.string()),
                    },
                    schema=SETTLEMENT_SCHEMA,
                ),
            )
        print(
            f"  built {hi:,} / {total:,} messages ({time.perf_counter() - started:.0f}s)",
            flush=True,
        )


def probe(url: str, seconds: float, stop: threading.Event | None = None) -> list[float]:
    lat: list[float] = []
    with Producer(url, destination="probe", linger_ms=0) as p:
        p.send_sync(b"warm-up")
        end = time.perf_counter() + seconds
        while time.perf_counter() < end and not (stop and stop.is_set()):
            t = time.perf_counter()
            p.send_sync(b"x" * 1024)
            lat.append((time.perf_counter() - t) * 1000)
            time.sleep(0.002)  # about 400 sends/s: a steady producer, not a saturating one
    return lat


def pcts(lat: list[float]) -> str:
    a = np.array(lat)
    return (
        f"p50 {np.percentile(a, 50):.2f} ms, p99 {np.percentile(a, 99):.2f} ms ({len(a):,} sends)"
    )


def du(path: str) -> int:
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(path) for f in fs)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--messages", type=int, default=10_000_000)
    ap.add_argument("--settled", type=float, default=0.9)
    ap.add_argument("--body", type=int, default=100, help="body bytes per message")
    ap.add_argument("--probe-seconds", type=float, default=10.0)
    ap.add_argument("--data-dir", default=None)
    args = ap.parse_args()
    root = args.data_dir or tempfile.mkdtemp(prefix="sparkmq-compaction-bench-")
    try:
        print(f"building {args.messages:,} messages of {args.body} B, {args.settled:.0%} acked")
        build(root, args.messages, args.settled, args.body)
        big = os.path.join(root, "destinations", "big")
        print(f"on disk: {human_bytes(du(big))}")
        broker = BrokerProcess(root, log_file=os.path.join(root, "broker.log")).start()
        try:
            with Admin(broker.url) as admin:
                admin.create_queue("probe")
                print(f"broker up; big queue depth {admin.stats('big')['depth']:,}")
            quiet = probe(broker.url, args.probe_seconds)
            print(f"produce latency, no compaction:     {pcts(quiet)}", flush=True)
            during: list[float] = []
            stop = threading.Event()
            t = threading.Thread(
                target=lambda: during.extend(probe(broker.url, 3600, stop)), daemon=True
            )
            t.start()
            started = time.perf_counter()
            results = compact_all(root, CompactionPolicy(), only=["big"])
            took = time.perf_counter() - started
            stop.set()
            t.join()
            print(f"produce latency, during compaction: {pcts(during)}")
            print(f"compaction of 'big': {took:.1f} s")
            print(summary_table(results))
            r = results[0]
            print(
                f"live tables {human_bytes(r.bytes_before)} -> {human_bytes(r.bytes_after)}; "
                f"on disk now {human_bytes(du(big))} (vacuum frees replaced files after "
                f"retention_hours)"
            )
        finally:
            broker.stop()
    finally:
        if args.data_dir is None:
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
