"""How long a shared-store failover takes, as a producer sees it, and what taking over costs.

A pair of broker processes (``ha.mode = "shared-store"``) on one data directory with
``--destinations`` queues; a producer listing both URLs sends synchronously; the primary is
SIGKILLed and the time until the producer's next send is acknowledged by the backup is measured
(the lock poll, the backup's start and recovery, stamping every table with the new epoch, and
the client finding the new primary). Then the old primary comes back as the backup and the next
round kills the other. Prints each round and the median.

    .venv/bin/python bench/failover_bench.py [--rounds 5] [--destinations 20]
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from spark_mq import Admin, Producer
from spark_mq.launch import BrokerProcess
from tests.ha_kit import free_port


def launch(name: str, data: Path, port: int, wire_port: int, poll_s: float) -> BrokerProcess:
    args = [
        "--port", str(port), "--wire-port", str(wire_port), "--stomp-port", "0",
        "--kafka-port", "0",
        "--set", "ha.mode=shared-store", "--set", f"ha.broker_id={name}",
        "--set", f"ha.lock_poll_s={poll_s}",
        "--set", f"logging.file={data.parent / f'{name}.log'}",
    ]  # fmt: skip
    return BrokerProcess(str(data), extra_args=args).launch()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--destinations", type=int, default=20)
    ap.add_argument("--lock-poll-s", type=float, default=0.2)
    a = ap.parse_args()
    root = Path(tempfile.mkdtemp(prefix="sparkmq-failover-"))
    data = root / "shared"
    ports = {n: (free_port(), free_port()) for n in ("a", "b")}
    urls = [f"grpc://127.0.0.1:{ports[n][0]}" for n in ("a", "b")]
    procs = {n: launch(n, data, *ports[n], a.lock_poll_s) for n in ("a",)}
    procs["a"].wait_ready(60)
    procs["b"] = launch("b", data, *ports["b"], a.lock_poll_s)
    took: list[float] = []
    try:
        with Admin(urls) as admin:
            for i in range(a.destinations):
                admin.create_queue(f"q{i}")
        primary, backup = "a", "b"
        with Producer(urls, destination="q0", timeout_s=60) as p:
            for _ in range(200):
                p.send_sync(b"x" * 1024)
            for r in range(1, a.rounds + 1):
                procs[primary].kill()
                killed = time.perf_counter()
                p.send_sync(b"after the failover")  # waits for the backup, then resends
                took.append(time.perf_counter() - killed)
                print(
                    f"round {r}: {primary} killed, {backup} serving after "
                    f"{took[-1] * 1000:,.0f} ms ({a.destinations} destinations)",
                    flush=True,
                )
                procs[primary] = launch(primary, data, *ports[primary], a.lock_poll_s)
                primary, backup = backup, primary
                for _ in range(100):
                    p.send_sync(b"x" * 1024)
    finally:
        for proc in procs.values():
            proc.stop()
        shutil.rmtree(root, ignore_errors=True)
    median, worst = statistics.median(took) * 1000, max(took) * 1000
    print(
        f"\nfailover as a synchronous producer sees it: median {median:,.0f} ms, "
        f"max {worst:,.0f} ms over {len(took)} round(s)"
    )


if __name__ == "__main__":
    main()
