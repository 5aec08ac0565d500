"""What delivery semantics cost: prints figures, asserts nothing.

    .venv/bin/python bench/semantics_bench.py [--messages 200000] [--consumers 8] [--groups 1000]

In the same run, against one broker process per case (hot tier, default settings):

* produce throughput (batches of 1,000 x 100 B, pipelined) with duplicate detection on (the
  default: every SDK message carries a dedup id) and off (``duplicates.cache_size=0``);
* drain throughput of a pre-filled queue by N consumer processes acking every message, for a
  plain queue and for the same messages spread over G message groups (each group pinned to
  one consumer, in order).

The issue's target: neither groups nor dedup should cost more than 30 % of the plain figure.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import shutil
import statistics
import tempfile
import time

import pyarrow as pa

from spark_mq import Admin, Consumer, Producer
from spark_mq.launch import BrokerProcess

BODY = b"x" * 100
BATCH = 1000


def fill(url: str, total: int, groups: int) -> float:
    """Produce ``total`` messages; returns messages/s."""
    with Admin(url) as admin:
        admin.create_queue("q")
    tables = []
    for start in range(0, total, BATCH):
        n = min(BATCH, total - start)
        cols = {"body": pa.array([BODY] * n, pa.binary())}
        if groups:
            cols["group_id"] = pa.array([f"g{(start + i) % groups}" for i in range(n)])
        tables.append(pa.table(cols))
    with Producer(url, destination="q") as producer:
        started = time.perf_counter()
        futures = [producer.send_batch(t, wait=False) for t in tables]
        for f in futures:
            f.result()
        took = time.perf_counter() - started
    return total / took


def _drain(url: str, stop_at: int, counter, ready, go) -> None:
    with Consumer(url, "q", prefetch=2000) as consumer:
        ready.release()
        go.wait()
        while True:
            batch = consumer.receive_many(1000, timeout=1.0)
            if not batch:
                with counter.get_lock():
                    if counter.value >= stop_at:
                        return
                continue
            consumer.ack(batch).result(timeout=60)
            with counter.get_lock():
                counter.value += len(batch)


def drain(url: str, total: int, consumers: int) -> float:
    ctx = mp.get_context("spawn")
    counter = ctx.Value("q", 0)
    ready, go = ctx.Semaphore(0), ctx.Event()
    procs = [
        ctx.Process(target=_drain, args=(url, total, counter, ready, go)) for _ in range(consumers)
    ]
    for p in procs:
        p.start()
    for _ in procs:
        ready.acquire()
    started = time.perf_counter()
    go.set()
    while counter.value < total:
        time.sleep(0.01)
    took = time.perf_counter() - started
    for p in procs:
        p.join(30)
    return total / took


def case(name: str, total: int, consumers: int, groups: int, args: list[str]) -> dict:
    data = tempfile.mkdtemp(prefix=f"sparkmq-sem-{name}-")
    try:
        with BrokerProcess(data, extra_args=args) as proc:
            produce = fill(proc.url, total, groups)
            consume = drain(proc.url, total, consumers)
        return {"case": name, "produce": produce, "drain": consume}
    finally:
        shutil.rmtree(data, ignore_errors=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--messages", type=int, default=200_000)
    ap.add_argument("--consumers", type=int, default=8)
    ap.add_argument("--groups", type=int, default=1000)
    ap.add_argument("--repeat", type=int, default=3, help="runs per case; medians are shown")
    a = ap.parse_args()
    nodedup = ["--set", "duplicates.cache_size=0"]
    cases = [
        ("plain queue", 0, []),
        (f"{a.groups} groups", a.groups, []),
        ("plain, dedup off", 0, nodedup),
    ]
    runs: dict[str, list[dict]] = {name: [] for name, _, _ in cases}
    for i in range(a.repeat):  # interleaved, so a slow spell of the machine hits every case
        for name, groups, args in cases:
            r = case(name, a.messages, a.consumers, groups, args)
            runs[name].append(r)
            print(f"run {i + 1}: {name}: produce {r['produce']:,.0f}/s, drain {r['drain']:,.0f}/s")
    results = [
        {
            "case": name,
            "produce": statistics.median(r["produce"] for r in got),
            "drain": statistics.median(r["drain"] for r in got),
        }
        for name, got in runs.items()
    ]
    base = results[0]
    print(
        f"\n{a.messages:,} messages of {len(BODY)} B, {a.consumers} consumer processes, "
        f"median of {a.repeat}"
    )
    print(f"{'case':<20} {'produce msg/s':>14} {'vs plain':>9} {'drain msg/s':>12} {'vs plain':>9}")
    for r in results:
        print(
            f"{r['case']:<20} {r['produce']:>14,.0f} {r['produce'] / base['produce']:>8.0%} "
            f"{r['drain']:>12,.0f} {r['drain'] / base['drain']:>8.0%}"
        )
    print(
        "dedup on costs produce: "
        f"{1 - base['produce'] / results[2]['produce']:.0%} (plain vs dedup off)"
    )


if __name__ == "__main__":
    main()
