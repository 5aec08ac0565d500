"""Broker benchmarks (issue 2's figures): prints, asserts nothing.

    .venv/bin/python bench/broker_bench.py [--messages 100000] [--data-dir DIR]

1. this disk's fsync'd sequential write bandwidth (the ceiling for any persistent broker);
2. produce throughput, 1 KiB persistent messages: synchronous single sends, and batched;
3. consume throughput with a per-message ack;
4. produce-to-consume latency p50/p99 at a fixed 1,000 msg/s.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import struct
import tempfile
import threading
import time

from spark_mq import Admin, Consumer, Producer
from spark_mq.launch import BrokerProcess

KiB = 1024


def fsync_bandwidth(directory: str, total_mib: int = 256, chunk_kib: int = 1024) -> float:
    path = os.path.join(directory, "fsync-probe.bin")
    chunk = os.urandom(chunk_kib * KiB)
    started = time.perf_counter()
    with open(path, "wb") as fh:
        for _ in range(total_mib * 1024 // chunk_kib):
            fh.write(chunk)
            fh.flush()
            os.fsync(fh.fileno())
    took = time.perf_counter() - started
    os.remove(path)
    return total_mib / took


def pct(values: list[float], p: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(len(values) * p))]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--messages", type=int, default=100_000)
    ap.add_argument("--data-dir", default=None)
    args = ap.parse_args()
    data = args.data_dir or tempfile.mkdtemp(prefix="sparkmq-bench-")
    os.makedirs(data, exist_ok=True)
    body = os.urandom(KiB)

    mib_s = fsync_bandwidth(data)
    print(
        f"disk: fsync'd sequential write {mib_s:,.0f} MiB/s (1 MiB writes) "
        f"= {mib_s * 1024:,.0f} KiB-messages/s ceiling"
    )

    broker = BrokerProcess(
        os.path.join(data, "broker"), log_file=os.path.join(data, "broker.log")
    ).start()
    try:
        with Admin(broker.url) as admin:
            admin.create_queue("sync")
            admin.create_queue("bulk")
            admin.create_queue("latency")

        with Producer(broker.url, destination="sync") as p:
            n, started = 300, time.perf_counter()
            lat = []
            for _ in range(n):
                t = time.perf_counter()
                p.send_sync(body)
                lat.append((time.perf_counter() - t) * 1000)
            took = time.perf_counter() - started
        print(
            f"produce, synchronous single sends: {n / took:,.0f} msg/s "
            f"(latency p50 {pct(lat, 0.5):.1f} ms, p99 {pct(lat, 0.99):.1f} ms)"
        )

        total = args.messages
        with Producer(broker.url, destination="bulk", max_in_flight_batches=64) as p:
            started = time.perf_counter()
            futures = []
            bodies = [body] * 1000
            for _ in range(total // 1000):
                futures += p.send_batch(bodies, wait=False)
            for f in futures:
                f.result()
            took = time.perf_counter() - started
        print(
            f"produce, batched (1,000 x 1 KiB per batch, pipelined): {total / took:,.0f} msg/s "
            f"({total * KiB / took / 2**20:,.0f} MiB/s, "
            f"{total * KiB / took / 2**20 / mib_s:.0%} of fsync'd bandwidth)"
        )

        with Consumer(broker.url, "bulk", prefetch=5000, settle_batch=1000) as c:
            started, got = time.perf_counter(), 0
            last = None
            while got < total:
                for m in c.receive_many(1000, timeout=30):
                    last = m.ack()
                    got += 1
            last.result()
            took = time.perf_counter() - started
        print(f"consume with a per-message ack: {total / took:,.0f} msg/s")

        rate, seconds = 1000, 5
        lat = []
        done = threading.Event()

        def consume() -> None:
            with Consumer(broker.url, "latency", prefetch=1000) as c:
                while len(lat) < rate * seconds:
                    for m in c.receive_many(100, timeout=10):
                        sent = struct.unpack("d", m.body[:8])[0]
                        lat.append((time.time() - sent) * 1000)
                        m.ack()
            done.set()

        t = threading.Thread(target=consume)
        t.start()
        with Producer(broker.url, destination="latency", linger_ms=0.5) as p:
            start = time.perf_counter()
            for i in range(rate * seconds):
                due = start + i / rate
                while (now := time.perf_counter()) < due:
                    time.sleep(min(due - now, 0.0005))
                p.send(struct.pack("d", time.time()) + body[8:])
            p.flush()
        done.wait(60)
        t.join(60)
        print(
            f"produce-to-consume latency at {rate:,} msg/s: p50 {statistics.median(lat):.1f} ms, "
            f"p99 {pct(lat, 0.99):.1f} ms, max {max(lat):.1f} ms ({len(lat)} messages)"
        )
    finally:
        broker.stop()
        if args.data_dir is None:
            shutil.rmtree(data, ignore_errors=True)


if __name__ == "__main__":
    main()
