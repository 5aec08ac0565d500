"""What replication costs: synchronous sends, latency at 1,000 msg/s and batched produce on a
single broker, on a replicating pair acknowledging once the primary has a flush (``ha.ack =
"local"``), and once the backup has it too (``"replicated"``), in the same run (this machine's
speed moves 20-50 % within an hour: compare figures within one run only). Both brokers of a
pair run on this machine, so the backup's work competes for the same two cores.

    .venv/bin/python bench/replication_bench.py [--rounds 2] [--messages 100000]
"""

from __future__ import annotations

import argparse
import shutil
import socket
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from broker_bench import Figures, KiB, batched, latency, sync_sends

from spark_mq import Admin
from spark_mq.launch import BrokerProcess

MODES = ("single", "local", "replicated")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start(mode: str, where: Path) -> list[BrokerProcess]:
    if mode == "single":
        return [BrokerProcess(str(where / "root"), log_file=str(where / "a.out")).start()]
    repl = {n: _free_port() for n in ("a", "b")}
    procs = []
    for name, other in (("a", "b"), ("b", "a")):
        args = [
            "--set", "ha.mode=replication", "--set", f"ha.broker_id={name}",
            "--set", f"ha.peer=127.0.0.1:{repl[other]}",
            "--set", f"ha.replication_port={repl[name]}",
            "--set", f"ha.ack={mode}",
            "--set", f"journal.hot_dir={where / f'hot-{name}'}",
            "--set", f"logging.file={where / f'{name}.log'}",
        ]  # fmt: skip
        proc = BrokerProcess(
            str(where / "root"), extra_args=args, log_file=str(where / f"{name}.out")
        )
        procs.append(proc.launch())
        if name == "a":
            proc.wait_ready(60)
    deadline = time.monotonic() + 60
    with Admin(procs[0].url) as admin:
        while admin.broker_state().get("replication_state") != "in_sync":
            if time.monotonic() > deadline:
                raise RuntimeError("the backup did not get in sync")
            time.sleep(0.1)
    return procs


def run(mode: str, data: Path, total: int, round_no: int) -> dict[str, Figures]:
    where = data / f"{mode}-{round_no}"
    where.mkdir(parents=True)
    procs = start(mode, where)
    url = procs[0].url
    body = bytes(KiB)
    try:
        with Admin(url) as admin:
            for q in ("sync", "bulk", "latency-receive"):
                admin.create_queue(q)
        figures = {
            "sync": sync_sends(url, body, 5000),
            "latency": latency(url, body, listen=False),
            "batched": batched(url, body, total),
        }
    finally:
        for p in procs:
            p.stop()
        shutil.rmtree(where, ignore_errors=True)
    s, lat, b = figures["sync"], figures["latency"], figures["batched"]
    print(
        f"{mode:10s} round {round_no}: sync {s['rate']:7,.0f} msg/s (p50 {s['p50']:.3f} ms, "
        f"p99 {s['p99']:.3f})  latency@1000/s p50 {lat['p50']:.3f} ms p99 {lat['p99']:.3f}  "
        f"batched {b['rate']:9,.0f} msg/s",
        flush=True,
    )
    return figures


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--messages", type=int, default=100_000, help="batched produce, 1 KiB each")
    ap.add_argument("--modes", default=",".join(MODES))
    a = ap.parse_args()
    modes = a.modes.split(",")
    data = Path(tempfile.mkdtemp(prefix="sparkmq-replication-bench-"))
    results: dict[str, list[dict[str, Figures]]] = {m: [] for m in modes}
    try:
        for r in range(1, a.rounds + 1):
            for mode in modes if r % 2 else list(reversed(modes)):  # ABBA
                results[mode].append(run(mode, data, a.messages, r))
    finally:
        shutil.rmtree(data, ignore_errors=True)
    print(f"\n== median of {a.rounds} round(s) ==")
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


if __name__ == "__main__":
    main()
