"""What a cluster's members add: the aggregate produce and consume rate over many destinations
with one member and with two (each a broker process on one shared data root, coordinated by a
real ZooKeeper), beside one broker of its own (no cluster, its hot tier on) for reference.

Client processes (``--clients``) each take a share of the destinations: they send
``--messages`` to each in batches (``send_batch``, waiting for each), then read them all back
with acks. Each mode runs ``--rounds`` times; the median and the range are printed. Needs
ZooKeeper's jars (``apt-get install zookeeper``: scripts/setup.sh does).

    .venv/bin/python bench/cluster_bench.py [--destinations 16] [--messages 5000] [--rounds 3]
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from spark_mq import Admin, Consumer, Producer
from spark_mq.launch import BrokerProcess
from tests.zk_kit import ZooKeeper


def _client(urls: list[str], names: list[str], n: int, batch: int, out: mp.Queue) -> None:
    body = b"x" * 100
    started = time.perf_counter()
    with Producer(urls, timeout_s=60) as producer:
        for name in names:
            for _ in range(n // batch):
                producer.send_batch([body] * batch, destination=name)
    produced = time.perf_counter()
    for name in names:
        with Consumer(urls, name, prefetch=2000) as consumer:
            left = n
            while left > 0:
                got = consumer.receive_many(2000, timeout=30)
                if not got:
                    raise RuntimeError(f"{name}: {left} messages never came")
                consumer.ack(got)
                left -= len(got)
    out.put((produced - started, time.perf_counter() - produced))


def _members(zk: ZooKeeper, root: Path, count: int, name: str) -> list[BrokerProcess]:
    procs = []
    for i in range(count):
        args = [
            "--set", f"cluster.zookeeper={zk.hosts}", "--set", f"cluster.name={name}",
            "--set", "cluster.session_timeout_s=4", "--set", f"ha.broker_id=m{i}",
            "--set", f"logging.file={root / f'm{i}.log'}",
        ]  # fmt: skip
        procs.append(BrokerProcess(str(root / "data"), extra_args=args).start())
    return procs


def _single(root: Path) -> list[BrokerProcess]:
    args = ["--set", f"logging.file={root / 'single.log'}"]
    return [BrokerProcess(str(root / "data"), extra_args=args).start()]


def run_mode(mode: str, zk: ZooKeeper, a: argparse.Namespace, k: int) -> tuple[float, float]:
    root = Path(tempfile.mkdtemp(prefix=f"sparkmq-cluster-bench-{mode}-"))
    if mode == "single broker":
        procs = _single(root)
    else:
        procs = _members(zk, root, 1 if mode == "1 member" else 2, f"bench{k}")
    urls = [p.url for p in procs]
    names = [f"d{i}" for i in range(a.destinations)]
    try:
        with Admin(urls) as admin:
            for n in names:
                admin.create_queue(n)
        if len(procs) > 1:  # (placed before the clock starts)
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                with Admin(urls) as admin:
                    owners = admin.cluster()["owners"]
                if len(owners) == len(names) and len({o["member"] for o in owners.values()}) > 1:
                    break
                time.sleep(0.1)
        spawn = mp.get_context("spawn")  # (a fork would inherit this process's gRPC state)
        out: mp.Queue = spawn.Queue()
        shares = [names[i :: a.clients] for i in range(a.clients)]
        workers = [
            spawn.Process(target=_client, args=(urls, s, a.messages, a.batch, out))
            for s in shares
        ]
        for w in workers:
            w.start()
        times = [out.get(timeout=600) for _ in workers]
        for w in workers:
            w.join()
        total = a.messages * a.destinations
        produce = total / max(t[0] for t in times)
        consume = total / max(t[1] for t in times)
        return produce, consume
    finally:
        for p in procs:
            p.stop()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--destinations", type=int, default=16)
    ap.add_argument("--messages", type=int, default=5000, help="per destination")
    ap.add_argument("--batch", type=int, default=500)
    ap.add_argument("--clients", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args()
    zk = ZooKeeper(Path(tempfile.mkdtemp(prefix="sparkmq-cluster-bench-zk-")))
    zk.start()
    modes = ["single broker", "1 member", "2 members"]
    figures: dict[str, list[tuple[float, float]]] = {m: [] for m in modes}
    try:
        k = 0
        for r in range(a.rounds):  # (interleaved: this machine's speed moves within an hour)
            for mode in modes:
                k += 1
                figures[mode].append(run_mode(mode, zk, a, k))
                p, c = figures[mode][-1]
                print(f"round {r + 1} {mode:>13}: produce {p:9,.0f} msg/s  consume+ack {c:9,.0f}")
    finally:
        zk.stop()
    print(
        f"\n{a.destinations} destinations x {a.messages} messages of 100 bytes, batches of "
        f"{a.batch}, {a.clients} client processes; median (min-max) of {a.rounds} rounds"
    )
    base = None
    for mode in modes:
        ps = [f[0] for f in figures[mode]]
        cs = [f[1] for f in figures[mode]]
        both = [2 / (1 / p + 1 / c) for p, c in figures[mode]]  # (produce then consume)
        med = statistics.median(both)
        if mode == "1 member":
            base = med
        ratio = f"  x{med / base:.2f} of 1 member" if base and mode == "2 members" else ""
        print(
            f"{mode:>13}: produce {statistics.median(ps):9,.0f} ({min(ps):,.0f}-{max(ps):,.0f})"
            f"  consume+ack {statistics.median(cs):9,.0f} ({min(cs):,.0f}-{max(cs):,.0f})"
            f"  both {med:9,.0f}{ratio}"
        )


if __name__ == "__main__":
    main()
