"""What a message held unacknowledged costs the broker while everything after it is consumed.

A queue's low-water mark stops at its first unsettled message: a message scheduled far ahead,
one in a long lease, one a consumer keeps. Every offset acknowledged after it must still be
known settled until the mark passes it. This bench sends ``--messages`` to a queue whose first
message is scheduled an hour on (``--no-hold``: a plain first message, consumed with the rest),
and reads them back with acks in windows of ``--window``, printing each window's consume + ack
rate, the broker's resident memory and the queue's rows in it (what the broker's stats say: a
message held kept every row after it there until 2026-12-06); then it restarts the broker and
prints how long it took to be ready (the queue's state rebuilt) and its memory then. One broker
process, a client in this process (the SDK: Arrow tables sent, ``MessageBatch``es read and acked).

    .venv/bin/python bench/held_bench.py [--messages 1000000] [--window 200000] [--no-hold]
"""

from __future__ import annotations

import argparse
import re
import sys
import tempfile
import time
from pathlib import Path

import pyarrow as pa

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from spark_mq import Admin, Consumer, Producer
from spark_mq.launch import BrokerProcess

QUEUE = "held"
BATCH = 2000


def rss_mib(pid: int) -> float:
    """The resident memory of process ``pid``, MiB (from /proc)."""
    with open(f"/proc/{pid}/status") as fh:
        for line in fh:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for {pid}")


def pid_of(proc: BrokerProcess) -> int:
    assert proc.proc is not None
    return proc.proc.pid


def send(url: str, n: int) -> None:
    table = pa.table({"body": pa.array([b"x" * 100] * BATCH, pa.binary())})
    with Producer(url, destination=QUEUE, timeout_s=60) as p:
        waiting = []
        for _ in range(n // BATCH):
            waiting.append(p.send_batch(table, wait=False))
            if len(waiting) >= 8:
                waiting.pop(0).result(60)
        for f in waiting:
            f.result(60)


def consume(url: str, n: int, window: int, pid: int) -> None:
    with Consumer(url, QUEUE, prefetch=2 * BATCH) as c, Admin(url) as admin:
        left, started, in_window = n, time.perf_counter(), 0
        while left > 0:
            got = c.receive_batch(BATCH, timeout=30)
            if got is None:
                raise RuntimeError(f"{left} messages never came")
            got.ack()
            left -= len(got)
            in_window += len(got)
            if in_window >= window or left <= 0:
                now = time.perf_counter()
                done = n - left
                print(
                    f"  acked {done:>9,}: {in_window / (now - started):>9,.0f} msg/s over the "
                    f"last {in_window:,}; broker RSS {rss_mib(pid):,.0f} MiB, rows in its "
                    f"memory {admin.stats(QUEUE)['rows_in_memory']:,}",
                    flush=True,
                )
                started, in_window = now, 0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--messages", type=int, default=1_000_000)
    ap.add_argument("--window", type=int, default=200_000)
    ap.add_argument("--no-hold", action="store_true", help="a plain first message")
    ap.add_argument("--data-dir", default=None)
    a = ap.parse_args()
    root = Path(a.data_dir or tempfile.mkdtemp(prefix="sparkmq-held-bench-"))
    log = root / "broker.log"
    args = ["--set", f"logging.file={log}"]
    broker = BrokerProcess(str(root / "data"), extra_args=args).start()
    try:
        with Admin(broker.url) as admin:
            admin.create_queue(QUEUE)
        with Producer(broker.url, destination=QUEUE) as p:
            if a.no_hold:
                p.send_sync(b"first")
            else:
                p.send_sync(b"held", delay_s=3600)
        print(f"{'a plain' if a.no_hold else 'a held'} first message, then {a.messages:,}")
        print(f"  broker RSS {rss_mib(pid_of(broker)):,.0f} MiB before")
        send(broker.url, a.messages)
        consume(broker.url, a.messages + (1 if a.no_hold else 0), a.window, pid_of(broker))
    finally:
        broker.stop()
    started = time.perf_counter()
    broker = BrokerProcess(str(root / "data"), extra_args=args).start()
    took = time.perf_counter() - started
    try:
        with Admin(broker.url) as admin:
            depth = admin.stats(QUEUE)["depth"]
        line = re.findall(rf"destination {QUEUE} .*", log.read_text())
        print(f"  restarted (to ready) in {took:.2f} s, depth {depth}: {line[-1:]}; broker RSS "
              f"{rss_mib(pid_of(broker)):,.0f} MiB")  # fmt: skip
    finally:
        broker.stop()
    print(f"  (the broker's log: {log})")


if __name__ == "__main__":
    main()
