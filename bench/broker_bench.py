"""Broker benchmarks: prints figures, asserts nothing.

    .venv/bin/python bench/broker_bench.py [--messages 200000] [--rounds 3] [--data-dir DIR]
                                           [--modes hot,delta]

For each journal mode (``hot``: the hot tier, the default; ``delta``: every flush a Delta
commit, ``journal.hot_tier=false``), each on a fresh broker:

1. synchronous single sends of 1 KiB persistent messages (one at a time, each waits for its ack);
2. batched produce (1,000 x 1 KiB per batch, pipelined), and how far Delta trailed meanwhile;
3. consume with a per-message ack;
4. produce-to-consume latency p50/p99 at a fixed 1,000 msg/s, the consumer calling
   ``receive_many``, then taking messages in an ``on_message`` callback;

then this disk's fsync'd sequential write bandwidth (the ceiling for any persistent broker) and
each mode's batched produce as a fraction of it. The disk is measured last, so its 256 MiB of
writes cannot disturb a mode.

This machine's figures move by 20-40 % from one minute to the next (the same build gave
182-270k msg/s batched and 1,390-1,910 sync sends/s within an hour), and the first mode of a
run got a lower batched figure than the same mode run later. So every mode runs ``--rounds``
times, the modes' order reversed each round, and the summary gives each figure's median and
range over the rounds. Each round starts with ``floor_bench.py``'s socket floor (one Python
thread, sockets and ``fdatasync``, no broker): what the machine allowed in that round, which
the broker's synchronous sends and latency are set against at the end.
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
from collections.abc import Callable

from floor_bench import pct, socket_floor

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


Figures = dict[str, float]


def timed_sends(send: Callable[[], object], n: int) -> Figures:
    """``n`` synchronous sends (at most 10 s of them) after one that opens the way: their rate
    and latency percentiles (ms). What compare_brokers.py times other brokers' clients with."""
    send()  # warm the stream up: not a figure
    lat: list[float] = []
    started = time.perf_counter()
    while len(lat) < n and time.perf_counter() - started < 10:  # at most 10 s
        t = time.perf_counter()
        send()
        lat.append((time.perf_counter() - t) * 1000)
    took = time.perf_counter() - started
    sent = len(lat) + 1  # with the first
    return {"rate": len(lat) / took, "p50": pct(lat, 0.5), "p99": pct(lat, 0.99), "sent": sent}


def sync_sends(url: str, body: bytes, n: int) -> Figures:
    with Producer(url, destination="sync", linger_ms=0) as p:
        return timed_sends(lambda: p.send_sync(body), n)


def paced_sends(send: Callable[[bytes], object], body: bytes, rate: int, seconds: int) -> None:
    """``rate`` messages a second for ``seconds``, each ``body`` with its send time (``time.time``,
    a little-endian double) in its first 8 bytes."""
    start = time.perf_counter()
    for i in range(rate * seconds):
        due = start + i / rate
        while (now := time.perf_counter()) < due:
            time.sleep(min(due - now, 0.0005))
        send(struct.pack("d", time.time()) + body[8:])


def latency_figures(lat: list[float]) -> Figures:
    return {"p50": statistics.median(lat), "p99": pct(lat, 0.99), "max": max(lat), "n": len(lat)}


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


def batched(url: str, body: bytes, total: int) -> Figures:
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
    return {
        "rate": total / took,
        "mib": total * KiB / took / 2**20,
        "lag_messages": sampler.max_messages,
        "lag_ms": sampler.max_ms,
        "catch_up_s": catch_up_s,
    }


def consume_with_acks(url: str, total: int, queue: str = "bulk") -> Figures:
    """Drain ``total`` waiting messages, acking each: the batched ones ("bulk"), or those
    sent one at a time ("sync": plain messages, each a commit of its own)."""
    with Consumer(url, queue, prefetch=5000, settle_batch=1000) as c:
        started, got = time.perf_counter(), 0
        last = None
        while got < total:
            for m in c.receive_many(1000, timeout=30):
                last = m.ack()
                got += 1
        last.result()
        took = time.perf_counter() - started
    return {"rate": total / took}


def latency(url: str, body: bytes, rate: int = 1000, seconds: int = 5, *, listen: bool) -> Figures:
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
        paced_sends(p.send, body, rate, seconds)
        p.flush()
    done.wait(60)
    if listen:
        consumer.close()
    else:
        t.join(60)
    return latency_figures(lat)


SENDS = "{rate:,.0f} msg/s (latency p50 {p50:.2f} ms, p99 {p99:.2f} ms)"
LATENCY = "p50 {p50:.2f} ms, p99 {p99:.2f} ms, max {max:.1f} ms ({n:,.0f} messages)"
Lines = list[tuple[str, str, str]]  # (the figure, which measurement gives it, how it reads)
LINES: Lines = [
    ("synchronous single sends", "sync", SENDS),
    ("batched produce, 1 KiB", "batched", "{rate:,.0f} msg/s ({mib:,.0f} MiB/s)"),
    (
        "Delta behind the broker",
        "batched",
        "at most {lag_messages:,.0f} messages / {lag_ms:,.0f} ms behind; "
        "caught up {catch_up_s:.2f} s after the last ack",
    ),
    ("consume, per-message ack", "consume", "{rate:,.0f} msg/s"),
    ("consume the sync sends, each acked", "consume_sync", "{rate:,.0f} msg/s"),
    ("latency at 1,000 msg/s, receive", "receive", LATENCY),
    ("latency at 1,000 msg/s, on_message", "on_message", LATENCY),
]
FLOOR_LINES: Lines = [
    ("synchronous single sends", "sync", SENDS),
    ("latency at 1,000 msg/s", "latency", LATENCY),
]


def show(figures: dict[str, Figures], lines: Lines, key: str, measured: Figures) -> None:
    """Keep ``measured`` as ``figures[key]`` and print the lines it gives."""
    figures[key] = measured
    for label, of, fmt in lines:
        if of == key:
            print(f"{label + ':':36s}{fmt.format(**measured)}", flush=True)


def run_floor(round_no: int) -> dict[str, Figures]:
    """What this machine gives a Python hot path right now (``floor_bench.py``'s socket floor):
    the yardstick for the same round's broker figures."""
    print(f"\n== floor: one Python thread, sockets + fdatasync (round {round_no}) ==", flush=True)
    figures: dict[str, Figures] = {}
    sync, lat = socket_floor(os.urandom(KiB), 3000, 1000, 5)
    show(figures, FLOOR_LINES, "sync", sync)
    show(figures, FLOOR_LINES, "latency", lat)
    return figures


def run_mode(name: str, data: str, total: int, round_no: int) -> dict[str, Figures]:
    """Every figure for journal mode ``name``, on a broker of its own."""
    body = os.urandom(KiB)
    where = os.path.join(data, f"broker-{name}-{round_no}")
    broker = BrokerProcess(where, extra_args=MODES[name], log_file=where + ".log").start()
    print(f"\n== journal mode: {name} (round {round_no}) ==", flush=True)
    figures: dict[str, Figures] = {}

    try:
        with Admin(broker.url) as admin:
            for q in ("sync", "bulk", "latency-receive", "latency-listen"):
                admin.create_queue(q)
        show(figures, LINES, "sync", sync_sends(broker.url, body, 5000))
        show(figures, LINES, "batched", batched(broker.url, body, total))
        show(figures, LINES, "consume", consume_with_acks(broker.url, total))
        sent = int(figures["sync"]["sent"])
        show(figures, LINES, "consume_sync", consume_with_acks(broker.url, sent, "sync"))
        for listen, key in ((False, "receive"), (True, "on_message")):
            show(figures, LINES, key, latency(broker.url, body, listen=listen))
    finally:
        broker.stop()
        shutil.rmtree(where, ignore_errors=True)  # its log stays; six brokers' data would not
    return figures


def summary(name: str, rounds: list[dict[str, Figures]], lines: Lines = LINES) -> None:
    """Each figure's median over the rounds, with its range when there were several."""
    print(f"\n== {name}: median of {len(rounds)} round(s) ==")
    for label, key, fmt in lines:
        values = [r[key] for r in rounds]
        mid = {f: statistics.median(v[f] for v in values) for f in values[0]}
        print(f"{label + ':':36s}{fmt.format(**mid)}")
        if len(values) > 1:
            spans = [
                f"{f} {_num(min(v[f] for v in values))}-{_num(max(v[f] for v in values))}"
                for f in values[0]
                if f != "n" and f"{{{f}" in fmt
            ]
            print(f"{'':36s}range: {', '.join(spans)}")


def _num(x: float) -> str:
    return f"{x:,.0f}" if abs(x) >= 100 else f"{x:.2f}"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--messages", type=int, default=200_000)
    ap.add_argument("--rounds", type=int, default=3, help="runs of every mode (default 3)")
    ap.add_argument("--data-dir", default=None)
    ap.add_argument("--modes", default="hot,delta", help=f"comma-separated: {', '.join(MODES)}")
    args = ap.parse_args()
    modes = args.modes.split(",")
    if unknown := [m for m in modes if m not in MODES]:
        ap.error(f"unknown mode(s) {', '.join(unknown)}: choose from {', '.join(MODES)}")
    if args.rounds < 1:
        ap.error("--rounds must be at least 1")
    data = args.data_dir or tempfile.mkdtemp(prefix="sparkmq-bench-")
    os.makedirs(data, exist_ok=True)
    try:
        print(f"{os.cpu_count()} CPU cores; CPU idle: {idle_policy()}", flush=True)
        results: dict[str, list[dict[str, Figures]]] = {m: [] for m in ["floor", *modes]}
        for round_no in range(1, args.rounds + 1):
            results["floor"].append(run_floor(round_no))
            order = modes if round_no % 2 else modes[::-1]  # no mode always runs first
            for mode in order:
                results[mode].append(run_mode(mode, data, args.messages, round_no))
        summary("floor", results["floor"], FLOOR_LINES)
        for mode in modes:
            summary(mode, results[mode])
        print("\nagainst the floor of the same round (median, then each round):")
        for mode in modes:
            pairs = list(zip(results[mode], results["floor"], strict=True))
            sync = [m["sync"]["rate"] / f["sync"]["rate"] for m, f in pairs]
            p50 = [m["receive"]["p50"] / f["latency"]["p50"] for m, f in pairs]
            print(
                f"  {mode}: synchronous sends {statistics.median(sync):.0%} of the floor's "
                f"({', '.join(f'{x:.0%}' for x in sync)}); latency p50 (receive) "
                f"{statistics.median(p50):.1f}x the floor's ({', '.join(f'{x:.1f}' for x in p50)})"
            )
        mib_s = fsync_bandwidth(data)
        print(
            f"\ndisk: fsync'd sequential write {mib_s:,.0f} MiB/s (1 MiB writes) "
            f"= {mib_s * 1024:,.0f} KiB-messages/s ceiling"
        )
        for mode in modes:
            mib = [r["batched"]["mib"] for r in results[mode]]
            print(
                f"batched produce, {mode}: {statistics.median(mib) / mib_s:.0%} of fsync'd "
                f"bandwidth (rounds: {', '.join(f'{m / mib_s:.0%}' for m in mib)})"
            )
    finally:
        if args.data_dir is None:
            shutil.rmtree(data, ignore_errors=True)


if __name__ == "__main__":
    main()
