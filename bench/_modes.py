"""What the mode benches share (security_bench.py, replication_bench.py): every mode on a broker
of its own for synchronous sends, latency at 1,000 msg/s and batched produce, rounds in ABBA
order (this machine's speed drifts within a run), and a table of medians."""

from __future__ import annotations

import shutil
import statistics
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from broker_bench import Figures, KiB, batched, latency, sync_sends

from spark_mq import Admin


def measure(url: str, total: int) -> dict[str, Figures]:
    body = bytes(KiB)
    with Admin(url) as admin:
        for q in ("sync", "bulk", "latency-receive"):
            admin.create_queue(q)
    return {
        "sync": sync_sends(url, body, 5000),
        "latency": latency(url, body, listen=False),
        "batched": batched(url, body, total),
    }


def line(mode: str, round_no: int, figures: dict[str, Figures]) -> str:
    s, lat, b = figures["sync"], figures["latency"], figures["batched"]
    return (
        f"{mode:10s} round {round_no}: sync {s['rate']:7,.0f} msg/s (p50 {s['p50']:.3f} ms, "
        f"p99 {s['p99']:.3f})  latency@1000/s p50 {lat['p50']:.3f} ms p99 {lat['p99']:.3f}  "
        f"batched {b['rate']:9,.0f} msg/s"
    )


def run_modes(
    modes: list[str], rounds: int, run: Callable[[str, Path, int], dict[str, Figures]]
) -> None:
    """``run(mode, scratch directory, round)`` for every mode and round (ABBA), then medians."""
    data = Path(tempfile.mkdtemp(prefix="sparkmq-bench-"))
    results: dict[str, list[dict[str, Figures]]] = {m: [] for m in modes}
    try:
        for r in range(1, rounds + 1):
            for mode in modes if r % 2 else list(reversed(modes)):  # drift falls on both
                where = data / f"{mode}-{r}"
                where.mkdir(parents=True)
                figures = run(mode, where, r)
                results[mode].append(figures)
                print(line(mode, r, figures), flush=True)
    finally:
        shutil.rmtree(data, ignore_errors=True)
    print(f"\n== median of {rounds} round(s) ==")
    print(f"{'mode':10s} {'sync msg/s':>11s} {'sync p50 ms':>12s} {'lat p50 ms':>11s} "
          f"{'lat p99 ms':>11s} {'batched msg/s':>14s}")  # fmt: skip
    for mode in modes:
        rs = results[mode]

        def med(key: str, field: str, rs: list[dict[str, Figures]] = rs) -> float:
            return statistics.median(r[key][field] for r in rs)

        print(
            f"{mode:10s} {med('sync', 'rate'):11,.0f} {med('sync', 'p50'):12.3f} "
            f"{med('latency', 'p50'):11.3f} {med('latency', 'p99'):11.3f} "
            f"{med('batched', 'rate'):14,.0f}"
        )
