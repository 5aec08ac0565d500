"""Broker benchmarks: prints figures, asserts nothing.

    .venv/bin/python bench/broker_bench.py [--messages 200000] [--data-dir DIR] [--modes hot,delta]

For each journal mode in the same run (``hot``: the hot tier, the default; ``delta``: every
flush a Delta commit, ``journal.hot_tier=false``):

1. synchronous single sends of 1 KiB persistent messages (one at a time, each waits for its ack);
2. batched produce (1,000 x 1 KiB per batch, pipelined), and how far Delta trailed meanwhile;
3. consume with a per-message ack;
4. produce-to-consume latency p50/p99 at a fixed 1,000 msg/s, the consumer calling
   ``receive_many``, then taking messages in an ``on_message`` callback;

then this disk's fsync'd sequential write bandwidth (the ceiling for any persistent broker) and
each mode's batched produce as a fraction of it. The disk is measured last, so its 256 MiB of
writes cannot disturb a mode. On this machine the first mode of a run still gets a lower batched
figure than the same mode run later (by 40-120k msg/s): compare modes in both orders.
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

from spark_mq import Admin, Consumer, Message, Producer
from spark_mq.launch import BrokerProcess

KiB = 1024
MODES = {
    "hot": [],
    "delta": ["--set", "journal.hot_tier=false"],
    # duplicate detection off: compare with "hot" for what dedup costs (every SDK message has
    # a dedup id, so "hot" checks each one)
    "hot-nodedup": ["--set", "duplicates.cache_size=0"],
    # no direct wire: producers and consumers use Arrow Flight (compare with "hot")
    "hot-flight": ["--set", "broker.wire=false"],
}


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


def idle_policy() -> str:
    """How this machine's CPUs idle, which the latency figures depend on: a CPU that halts
    between messages wakes slower. Measured on a 2-core VM with guest halt polling off (its
    default here), turning it on (``guest_halt_poll_ns`` 200000) took the on_message p50 from
    0.76-0.81 to 0.68-0.71 ms and a 1 ms-apart fdatasync from ~156 to ~107 us."""
    try:
        with open("/sys/devices/system/cpu/cpuidle/current_driver") as fh:
            driver = fh.read().strip()
    except OSError:
        return "unknown"
    try:
        with open("/sys/module/haltpoll/parameters/guest_halt_poll_ns") as fh:
            poll_ns = int(fh.read())
    except (OSError, ValueError):
        return driver
    return f"{driver}, guest halt polling {'off' if poll_ns == 0 else f'up to {poll_ns} ns'}"


def pct(values: list[float], p: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(len(values) * p))]


def sync_sends(url: str, body: bytes, n: int) -> str:
    with Producer(url, destination="sync", linger_ms=0) as p:
        p.send_sync(body)  # warm the stream up
        lat: list[float] = []
        started = time.perf_counter()
        while len(lat) < n and time.perf_counter() - started < 10:  # at most 10 s
            t = time.perf_counter()
            p.send_sync(body)
            lat.append((time.perf_counter() - t) * 1000)
        took = time.perf_counter() - started
    p50, p99 = pct(lat, 0.5), pct(lat, 0.99)
    return f"{len(lat) / took:,.0f} msg/s (latency p50 {p50:.2f} ms, p99 {p99:.2f} ms)"


class LagSampler(threading.Thread):
    """Samples how far Delta trails the broker for one destination."""

    def __init__(self, url: str, destination: str) -> None:
        super().__init__(daemon=True)
        self.url, self.destination = url, destination
        self.stop = threading.Event()
        self.max_messages = 0
        self.max_ms = 0.0

    def run(self) -> None:
        with Admin(self.url) as admin:
            while not self.stop.wait(0.05):
                s = admin.stats(self.destination)
                self.max_messages = max(self.max_messages, s.get("delta_lag_messages") or 0)
                self.max_ms = max(self.max_ms, s.get("delta_lag_ms") or 0.0)


def batched(url: str, body: bytes, total: int) -> tuple[float, str, str]:
    sampler = LagSampler(url, "bulk")
    sampler.start()
    with Producer(url, destination="bulk", max_in_flight_batches=64) as p:
        started = time.perf_counter()
        bodies = [body] * 1000
        futures = [p.send_batch(bodies, wait=False) for _ in range(total // 1000)]
        for f in futures:
            f.result()
        took = time.perf_counter() - started
    caught_up = time.perf_counter()
    with Admin(url) as admin:
        while admin.stats("bulk").get("delta_lag_messages"):
            time.sleep(0.05)
    catch_up_s = time.perf_counter() - caught_up
    sampler.stop.set()
    sampler.join()
    mib = total * KiB / took / 2**20
    figure = f"{total / took:,.0f} msg/s ({mib:,.0f} MiB/s)"
    lag = (
        f"at most {sampler.max_messages:,} messages / {sampler.max_ms:,.0f} ms behind; "
        f"caught up {catch_up_s:.2f} s after the last ack"
    )
    return mib, figure, lag


def consume_with_acks(url: str, total: int) -> str:
    with Consumer(url, "bulk", prefetch=5000, settle_batch=1000) as c:
        started, got = time.perf_counter(), 0
        last = None
        while got < total:
            for m in c.receive_many(1000, timeout=30):
                last = m.ack()
                got += 1
        last.result()
        took = time.perf_counter() - started
    return f"{total / took:,.0f} msg/s"


def latency(url: str, body: bytes, rate: int = 1000, seconds: int = 5, *, listen: bool) -> str:
    """Produce-to-consume latency at a steady ``rate``; ``listen``: the consumer takes messages
    in an ``on_message`` callback (on its reader thread), else it calls ``receive_many``. Each
    way has its own queue: with Delta-only journals a commit's cost grows with its log."""
    queue = "latency-listen" if listen else "latency-receive"
    lat: list[float] = []
    done = threading.Event()

    def record(m: Message) -> None:
        sent = struct.unpack("d", m.body[:8])[0]
        if sent:  # 0: the warm-up message
            lat.append((time.time() - sent) * 1000)
        m.ack()
        if len(lat) >= rate * seconds:
            done.set()

    def consume() -> None:
        with Consumer(url, queue, prefetch=1000) as c:
            while len(lat) < rate * seconds:
                for m in c.receive_many(100, timeout=10):
                    record(m)

    if listen:
        consumer = Consumer(url, queue, prefetch=1000, on_message=record)
    else:
        t = threading.Thread(target=consume)
        t.start()
    with Producer(url, destination=queue, linger_ms=0) as p:
        p.send_sync(struct.pack("d", 0.0) + body[8:])  # opens the stream: not a figure
        start = time.perf_counter()
        for i in range(rate * seconds):
            due = start + i / rate
            while (now := time.perf_counter()) < due:
                time.sleep(min(due - now, 0.0005))
            p.send(struct.pack("d", time.time()) + body[8:])
        p.flush()
    done.wait(60)
    if listen:
        consumer.close()
    else:
        t.join(60)
    return (
        f"p50 {statistics.median(lat):.2f} ms, p99 {pct(lat, 0.99):.2f} ms, "
        f"max {max(lat):.1f} ms ({len(lat):,} messages)"
    )


def run_mode(name: str, data: str, total: int) -> float:
    """Run every figure for journal mode ``name``; returns its batched produce in MiB/s."""
    body = os.urandom(KiB)
    broker = BrokerProcess(
        os.path.join(data, f"broker-{name}"),
        extra_args=MODES[name],
        log_file=os.path.join(data, f"broker-{name}.log"),
    ).start()
    print(f"\n== journal mode: {name} ==", flush=True)
    try:
        with Admin(broker.url) as admin:
            for q in ("sync", "bulk", "latency-receive", "latency-listen"):
                admin.create_queue(q)
        print(f"synchronous single sends:   {sync_sends(broker.url, body, 5000)}", flush=True)
        mib, figure, lag = batched(broker.url, body, total)
        print(f"batched produce, 1 KiB:     {figure}", flush=True)
        print(f"Delta behind the broker:    {lag}", flush=True)
        print(f"consume, per-message ack:   {consume_with_acks(broker.url, total)}", flush=True)
        for listen, how in ((False, "receive"), (True, "on_message")):
            figure = latency(broker.url, body, listen=listen)
            print(f"latency at 1,000 msg/s, {how + ':':11s} {figure}", flush=True)
    finally:
        broker.stop()
    return mib


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--messages", type=int, default=200_000)
    ap.add_argument("--data-dir", default=None)
    ap.add_argument("--modes", default="hot,delta", help=f"comma-separated: {', '.join(MODES)}")
    args = ap.parse_args()
    data = args.data_dir or tempfile.mkdtemp(prefix="sparkmq-bench-")
    os.makedirs(data, exist_ok=True)
    try:
        print(f"{os.cpu_count()} CPU cores; CPU idle: {idle_policy()}", flush=True)
        batched_mib = {mode: run_mode(mode, data, args.messages) for mode in args.modes.split(",")}
        mib_s = fsync_bandwidth(data)
        print(
            f"\ndisk: fsync'd sequential write {mib_s:,.0f} MiB/s (1 MiB writes) "
            f"= {mib_s * 1024:,.0f} KiB-messages/s ceiling"
        )
        for mode, mib in batched_mib.items():
            print(f"batched produce, {mode}: {mib / mib_s:.0%} of fsync'd bandwidth")
    finally:
        if args.data_dir is None:
            shutil.rmtree(data, ignore_errors=True)


if __name__ == "__main__":
    main()
