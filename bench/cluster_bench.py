"""What a cluster's members add: the aggregate produce and consume rate over many destinations
with one member and with two (each a broker process on one shared data root, coordinated by a
real ZooKeeper), beside one broker of its own (no cluster, its hot tier on) for reference.

Client processes (``--clients``) each take a share of the destinations: they send
``--messages`` to each in batches (``send_batch``, waiting for each), then read them all back
with acks. Each mode runs ``--rounds`` times; the median and the range are printed, and what
CPU the brokers and the clients used while they ran (this machine has two cores for all of
them). 20,000 messages a destination by default: with 5,000, opening a consumer for each
destination (a round trip or two, and a redirection to its owner) took a third of the clients'
reading time. Needs ZooKeeper's jars (``apt-get install zookeeper``: scripts/setup.sh does).

    .venv/bin/python bench/cluster_bench.py [--destinations 16] [--messages 20000] [--rounds 3]
    .venv/bin/python bench/cluster_bench.py --stomp   # what forwarding costs a STOMP client
    .venv/bin/python bench/cluster_bench.py --partitions 4   # one hot destination, 1 vs 4
    .venv/bin/python bench/cluster_bench.py --partitions 4 --kafka   # ... with librdkafka
    .venv/bin/python bench/cluster_bench.py --kafka   # many topics, librdkafka clients
    .venv/bin/python bench/cluster_bench.py --moves 10   # what moving a destination costs
    .venv/bin/python bench/cluster_bench.py --moves 10 --kafka   # ... librdkafka's clients
    .venv/bin/python bench/cluster_bench.py --moves 10 --aio   # ... the asyncio SDK's
    .venv/bin/python bench/cluster_bench.py --moves 10 --hold   # ... a message held throughout
    .venv/bin/python bench/cluster_bench.py --transactions 200 --batch 10   # over two members
    .venv/bin/python bench/cluster_bench.py --targets   # many destinations, then 1 vs 4 partitions
    sudo .venv/bin/python bench/cluster_bench.py --targets --member-cores 0.5   # ... capped

``--kafka`` (without ``--partitions``): the destinations are topics, and each client process
is a librdkafka producer, then a consumer of a group of its own. A cluster's first group
places the groups' offsets topic; its FindCoordinator is answered once that is done (from
subscribing to the first four messages, 2026-12-04: 0.94 s on two members, 0.79 s on a single
broker; when it was answered "not available" at once, librdkafka asked again a second later).

``--partitions N``: one destination on two members, made of one partition and of N, in
interleaved rounds; the client processes send ``--messages`` each to it (batches pipelined)
and then read it together (competing consumers, each attached to every partition) until all
are read.

``--targets``: the issue's two speed figures in one run: the many-destination comparison, then
one destination of 1 and of ``--partitions`` (4) partitions with ``--hot-messages`` a client.
``--member-cores Q`` limits each broker process to ``Q`` cores (a cgroup of its own with a CFS
quota: needs root and a cgroup cpu controller), as each would be limited by its own machine's
cores: on this 2-core machine one broker and its clients already take most of both cores, so
uncapped, a second member has little left to add (the runs print the CPU each used).

``--moves N``: one queue on two members, moved from one to the other N times (an operator's
pin) while a client sends to it synchronously and another reads and acks it: how long each
move takes (from the pin to the new owner serving it), the longest a send waited across it,
and the sends and acks a fence refused on the way (the old owner's log). ``--hold``: its first
message is scheduled an hour on, so its low-water mark stays below everything acked after it
(as a message in a long lease, or one a consumer holds, keeps it). With ``--kafka``,
librdkafka's producer (each message flushed) and a consumer of the topic, which also prints
the longest wait between two messages read across a move.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import multiprocessing as mp
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import pyarrow as pa

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from spark_mq import Admin, Consumer, Producer, Transaction
from spark_mq.launch import BrokerProcess
from tests.zk_kit import ZooKeeper


def _cpu_s(pid: int) -> float:
    """CPU seconds process ``pid`` has used (user and system), from /proc."""
    with open(f"/proc/{pid}/stat") as fh:
        fields = fh.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _pid(proc: BrokerProcess) -> int:
    assert proc.proc is not None
    return proc.proc.pid


def _client(urls: list[str], names: list[str], n: int, batch: int, api: str, out: mp.Queue) -> None:
    """Send ``n`` to each of ``names``, then read them all back with acks. ``api``: "messages"
    sends lists of bodies, waiting for each batch, and receives ``Message`` objects
    (``receive_many``, prefetch 2,000: a round trip a batch each way); "arrow" sends Arrow
    tables, 8 batches on their way at most, and receives and acks ``MessageBatch``es with a
    prefetch of twice what it takes at a time (the broker delivers on while the client acks)."""
    body = b"x" * 100
    table = pa.table({"body": pa.array([body] * batch, pa.binary())})
    cpu = time.process_time()
    started = time.perf_counter()
    with Producer(urls, timeout_s=60) as producer:
        for name in names:
            if api == "messages":
                for _ in range(n // batch):
                    producer.send_batch([body] * batch, destination=name)
                continue
            waiting: list[Any] = []
            for _ in range(n // batch):
                waiting.append(producer.send_batch(table, destination=name, wait=False))
                if len(waiting) >= 8:
                    waiting.pop(0).result(60)
            for f in waiting:
                f.result(60)
    produced = time.perf_counter()
    for name in names:
        with Consumer(urls, name, prefetch=2000 if api == "messages" else 4000) as consumer:
            left = n
            while left > 0:
                if api == "messages":
                    got: Any = consumer.receive_many(2000, timeout=30)
                    if got:
                        consumer.ack(got)
                else:
                    got = consumer.receive_batch(2000, timeout=30)
                    if got:
                        got.ack()
                if not got:
                    raise RuntimeError(f"{name}: {left} messages never came")
                left -= len(got)
    out.put((produced - started, time.perf_counter() - produced, time.process_time() - cpu))


def _produce(producer: Any, topic: str, body: bytes, key: bytes | None = None) -> None:
    """One message into librdkafka's queue; while the queue is full, it sends."""
    while True:
        try:
            producer.produce(topic, body, key=key)
            return
        except BufferError:
            producer.poll(0.01)


def _delivered(producer: Any) -> None:
    if producer.flush(120) != 0:
        raise RuntimeError("messages were not delivered")


def _kafka_client(
    bootstrap: str, names: list[str], n: int, batch: int, group: str, out: mp.Queue
) -> None:
    """:func:`_client` with librdkafka: an idempotent producer (``acks=all``, batches of
    ``linger.ms=5``) sends ``n`` to each of ``names`` (topics of one partition), then a consumer
    of its own group reads them all back, committing as it goes."""
    from confluent_kafka import Consumer as KafkaConsumer
    from confluent_kafka import Producer as KafkaProducer

    body = b"x" * 100
    producer = KafkaProducer({"bootstrap.servers": bootstrap, "linger.ms": 5,
                              "batch.num.messages": batch, "enable.idempotence": True})  # fmt: skip
    cpu = time.process_time()
    started = time.perf_counter()
    for i in range(n):
        for name in names:
            _produce(producer, name, body)
        if i % 100 == 0:
            producer.poll(0)
    _delivered(producer)
    produced = time.perf_counter()
    consumer = KafkaConsumer({"bootstrap.servers": bootstrap, "group.id": group,
                              "auto.offset.reset": "earliest", "enable.auto.commit": True,
                              "fetch.wait.max.ms": 50})  # fmt: skip
    consumer.subscribe(names)
    left = n * len(names)
    while left > 0:
        got = consumer.consume(2000, timeout=30)
        if not got:
            raise RuntimeError(f"{left} messages never came")
        left -= sum(1 for m in got if m.error() is None)
    consumer.close()
    out.put((produced - started, time.perf_counter() - produced, time.process_time() - cpu))


def _hot_client(urls: list[str], n: int, batch: int, total: int, read: Any, out: mp.Queue) -> None:
    """Send ``n`` to "hot" (batches pipelined, 8 on their way at most: a throughput load), then
    read it with the others until ``total`` were read by all."""
    body = b"x" * 100
    cpu = time.process_time()
    started = time.perf_counter()
    with Producer(urls, timeout_s=60) as producer:
        waiting: list[Any] = []
        for _ in range(n // batch):
            waiting.append(producer.send_batch([body] * batch, destination="hot", wait=False))
            if len(waiting) >= 8:
                waiting.pop(0).result(60)
        for f in waiting:
            f.result(60)
    produced = time.perf_counter()
    out.put(("produced", produced - started))
    with Consumer(urls, "hot", prefetch=4000) as consumer:
        while read.value < total:
            got = consumer.receive_batch(2000, timeout=0.2)
            if got is not None:
                got.ack()
                with read.get_lock():
                    read.value += len(got)
    out.put(("consumed", time.perf_counter() - produced))
    out.put(("cpu", time.process_time() - cpu))


def _hot_kafka_client(
    bootstrap: str, n: int, batch: int, total: int, read: Any, out: mp.Queue
) -> None:
    """:func:`_hot_client` with librdkafka: an idempotent producer (``acks=all``, batches of
    ``linger.ms=5``) of messages keyed by 64 keys (without keys librdkafka's sticky partitioner
    sends a while to one partition, then another), then a consumer of the group "bench"
    (partitions shared by the assignor)."""
    from confluent_kafka import Consumer as KafkaConsumer
    from confluent_kafka import Producer as KafkaProducer

    body = b"x" * 100
    keys = [f"key-{i}".encode() for i in range(64)]
    cpu = time.process_time()
    producer = KafkaProducer({"bootstrap.servers": bootstrap, "linger.ms": 5,
                              "batch.num.messages": batch, "enable.idempotence": True})  # fmt: skip
    started = time.perf_counter()
    for i in range(n):
        _produce(producer, "hot", body, keys[i % 64])
        if i % 1000 == 0:
            producer.poll(0)
    _delivered(producer)
    produced = time.perf_counter()
    out.put(("produced", produced - started))
    consumer = KafkaConsumer({"bootstrap.servers": bootstrap, "group.id": "bench",
                              "auto.offset.reset": "earliest", "enable.auto.commit": True,
                              "fetch.wait.max.ms": 50})  # fmt: skip
    consumer.subscribe(["hot"])
    while read.value < total:
        got = consumer.consume(2000, timeout=0.2)
        if got:
            with read.get_lock():
                read.value += sum(1 for m in got if m.error() is None)
    consumer.close()
    out.put(("consumed", time.perf_counter() - produced))
    out.put(("cpu", time.process_time() - cpu))


def run_partitioned(zk: ZooKeeper, a: argparse.Namespace, k: int, partitions: int) -> Any:
    """(produce, consume) msg/s of one destination of ``partitions`` on two members, and the
    cores its processes kept busy (CPU seconds of the members and the clients, over the wall
    time from the first send to the last read)."""
    root = Path(tempfile.mkdtemp(prefix=f"sparkmq-cluster-bench-p{partitions}-"))
    procs = _members(zk, root, 2, f"bench{k}")
    urls = [p.url for p in procs]
    groups: list[Path] = []
    try:
        if a.member_cores:
            _cap_cpu(procs, a.member_cores, groups)
        with Admin(urls) as admin:
            if a.kafka:  # (a topic: Kafka's consumers read logs; kept while the bench runs)
                admin.create_topic("hot", partitions=partitions, retention_s=3600)
            else:
                admin.create_queue("hot", partitions=partitions)
        _wait_served(urls, {"hot"} if partitions == 1 else {f"hot~{i}" for i in range(partitions)})
        spawn = mp.get_context("spawn")
        out: mp.Queue = spawn.Queue()
        total = a.messages * a.clients
        read = spawn.Value("q", 0)
        if a.kafka:
            bootstrap = ",".join(f"127.0.0.1:{p.kafka_port}" for p in procs)
            target: Any = _hot_kafka_client
            args: tuple[Any, ...] = (bootstrap, a.messages, a.batch, total, read, out)
        else:
            target, args = _hot_client, (urls, a.messages, a.batch, total, read, out)
        workers = [spawn.Process(target=target, args=args) for _ in range(a.clients)]
        members_cpu = sum(_cpu_s(_pid(p)) for p in procs)
        for w in workers:
            w.start()
        times: dict[str, list[float]] = {"produced": [], "consumed": [], "cpu": []}
        for _ in range(3 * a.clients):
            what, t = out.get(timeout=600)
            times[what].append(t)
        for w in workers:
            w.join()
        members_cpu = sum(_cpu_s(_pid(p)) for p in procs) - members_cpu
        wall = max(times["produced"]) + max(times["consumed"])
        busy = (members_cpu + sum(times["cpu"])) / wall
        # consuming starts when each client's sends are done: the slowest client's time
        return total / max(times["produced"]), total / max(times["consumed"]), busy
    finally:
        for p in procs:
            p.stop()
        _uncap(groups)


def many_destinations(zk: ZooKeeper, a: argparse.Namespace) -> float:
    """A single broker, 1 member and 2 members over many destinations, interleaved rounds;
    returns how many times a single broker's rate (produce and consume, harmonic) 2 members
    gave (medians)."""
    modes = ["single broker", "1 member", "2 members"]
    figures: dict[str, list[tuple[float, float, float]]] = {m: [] for m in modes}
    k = 0
    for r in range(a.rounds):  # (interleaved: this machine's speed moves within an hour)
        for mode in modes:
            k += 1
            p, c, busy, cpu = run_mode(mode, zk, a, k)
            figures[mode].append((p, c, busy))
            print(
                f"round {r + 1} {mode:>13}: produce {p:9,.0f} msg/s  consume+ack {c:9,.0f}  ({cpu})"
            )
    print(
        f"\n{a.destinations} destinations x {a.messages} messages of 100 bytes, batches of "
        f"{a.batch} ({'librdkafka' if a.kafka else a.api}), {a.clients} client processes"
        + (f", each broker limited to {a.member_cores} cores" if a.member_cores else "")
        + f"; median (min-max) of {a.rounds} rounds"
    )
    medians = {}
    for mode in modes:
        ps = [f[0] for f in figures[mode]]
        cs = [f[1] for f in figures[mode]]
        both = [2 / (1 / p + 1 / c) for p, c, _ in figures[mode]]  # (produce then consume)
        med = medians[mode] = statistics.median(both)
        ratio = (
            f"  x{med / medians['1 member']:.2f} of 1 member, x{med / medians['single broker']:.2f}"
            " of a single broker"
            if mode == "2 members"
            else ""
        )
        print(
            f"{mode:>13}: produce {statistics.median(ps):9,.0f} ({min(ps):,.0f}-{max(ps):,.0f})"
            f"  consume+ack {statistics.median(cs):9,.0f} ({min(cs):,.0f}-{max(cs):,.0f})"
            f"  both {med:9,.0f}{ratio}"
        )
    busy = statistics.median(f[2] for f in figures["1 member"])
    cores = os.cpu_count() or 1
    if not a.member_cores:
        print(
            f"1 member kept {busy:.2f} of the {cores} cores busy (broker and clients): spread "
            f"perfectly, 2 members could go at most x{min(2.0, cores / busy):.2f} as fast on "
            "this machine"
        )
    return medians["2 members"] / medians["single broker"]


def partitioned(zk: ZooKeeper, a: argparse.Namespace) -> float:
    """1 partition vs ``a.partitions``, interleaved rounds; returns how many times as fast
    (produce and consume, harmonic) the partitioned destination went (medians)."""
    counts = [1, a.partitions]
    figures: dict[int, list[tuple[float, float, float]]] = {c: [] for c in counts}
    k = 1000
    for r in range(a.rounds):  # (interleaved: this machine's speed moves within an hour)
        for c in counts:
            k += 1
            figures[c].append(run_partitioned(zk, a, k, c))
            p, s, busy = figures[c][-1]
            print(
                f"round {r + 1} {c} partition(s): produce {p:9,.0f} msg/s  consume+ack "
                f"{s:9,.0f}  cores busy {busy:.2f} of {os.cpu_count()}"
            )
    print(
        f"\none destination on 2 members; {a.clients} {'librdkafka' if a.kafka else 'SDK'} "
        f"client processes x {a.messages} messages of 100 bytes, batches of {a.batch}; median "
        f"(min-max) of {a.rounds} rounds"
    )
    base = None
    for c in counts:
        ps = [f[0] for f in figures[c]]
        cs = [f[1] for f in figures[c]]
        both = [2 / (1 / p + 1 / s) for p, s, _ in figures[c]]
        med = statistics.median(both)
        base = base or med
        print(
            f"{c:>3} partition(s): produce {statistics.median(ps):9,.0f} ({min(ps):,.0f}-"
            f"{max(ps):,.0f})  consume+ack {statistics.median(cs):9,.0f} ({min(cs):,.0f}-"
            f"{max(cs):,.0f})  both {med:9,.0f}  x{med / base:.2f}"
        )
    busy = statistics.median(f[2] for f in figures[1])
    cores = os.cpu_count() or 1
    if a.member_cores:  # (what bounds it is the members' quota, not the machine)
        print(
            f"each member limited to {a.member_cores} cores: the partitions' two members could "
            "go at most x2.00 as fast as the one serving a single partition"
        )
        return med / base if base else 0.0
    print(
        f"one partition kept {busy:.2f} of the {cores} cores busy (members and clients): spread "
        f"perfectly, more partitions could go at most x{cores / busy:.2f} as fast on this machine"
    )
    return med / base if base else 0.0


def _wait_served(urls: list[str], want: set[str]) -> None:
    """Until every destination of ``want`` is served by a member (taken on, not only placed:
    the clock starts after that)."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        served: set[str] = set()
        for url in urls:
            with Admin(url) as admin:
                served |= set(admin.cluster()["serving"])
        if want <= served:
            return
        time.sleep(0.1)
    raise RuntimeError(f"not served within 60 s: {sorted(want - served)}")


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


CGROUP_V1 = Path("/sys/fs/cgroup/cpu")  # (cgroup v1's cpu controller)
CGROUP_V2 = Path("/sys/fs/cgroup")


def _cap_cpu(procs: list[BrokerProcess], cores: float, groups: list[Path]) -> None:
    """Each broker process limited to ``cores`` of CPU time (a cgroup of its own, its CFS
    quota), as a broker on a machine of its own is by its cores: the clients' CPU no longer
    comes out of the brokers'. Needs root and a cgroup cpu controller (v1 or v2); the groups
    made go into ``groups``, for :func:`_uncap`."""
    period = 100_000
    quota = max(1000, int(cores * period))
    v2 = (CGROUP_V2 / "cgroup.controllers").exists()
    if v2 and "cpu" not in (CGROUP_V2 / "cgroup.subtree_control").read_text().split():
        raise SystemExit("--member-cores: cgroup v2 without the cpu controller enabled at its root")
    if not v2 and not (CGROUP_V1 / "cpu.cfs_quota_us").exists():
        raise SystemExit("--member-cores needs a cgroup cpu controller (v1 or v2)")
    for p in procs:
        group = (CGROUP_V2 if v2 else CGROUP_V1) / f"sparkmq-bench-{_pid(p)}"
        try:
            group.mkdir(exist_ok=True)
            groups.append(group)
            if v2:
                (group / "cpu.max").write_text(f"{quota} {period}")
            else:
                (group / "cpu.cfs_period_us").write_text(str(period))
                (group / "cpu.cfs_quota_us").write_text(str(quota))
            (group / "cgroup.procs").write_text(str(_pid(p)))  # (all its threads, and new ones)
        except OSError as exc:
            raise SystemExit(
                f"--member-cores: cannot limit a broker's CPU ({exc}): run as root"
            ) from exc


def _uncap(groups: list[Path]) -> None:
    """The groups of :func:`_cap_cpu` removed (their processes have stopped)."""
    for group in groups:
        for _ in range(50):
            try:
                group.rmdir()
                break
            except OSError:
                time.sleep(0.1)  # (a stopped process leaves its group a moment later)


def _single(root: Path) -> list[BrokerProcess]:
    args = ["--set", f"logging.file={root / 'single.log'}"]
    return [BrokerProcess(str(root / "data"), extra_args=args).start()]


def run_mode(
    mode: str, zk: ZooKeeper, a: argparse.Namespace, k: int
) -> tuple[float, float, float, str]:
    """(produce, consume) msg/s, the cores the brokers and clients kept busy (their CPU seconds
    over the wall time), and what CPU each used, said."""
    root = Path(tempfile.mkdtemp(prefix=f"sparkmq-cluster-bench-{mode}-"))
    if mode == "single broker":
        procs = _single(root)
    else:
        procs = _members(zk, root, 1 if mode == "1 member" else 2, f"bench{k}")
    urls = [p.url for p in procs]
    names = [f"d{i}" for i in range(a.destinations)]
    groups: list[Path] = []
    try:
        if a.member_cores:
            _cap_cpu(procs, a.member_cores, groups)
        with Admin(urls) as admin:
            for n in names:
                if a.kafka:
                    admin.create_topic(n, retention_s=3600)
                else:
                    admin.create_queue(n)
        if mode != "single broker":
            _wait_served(urls, set(names))
        spawn = mp.get_context("spawn")  # (a fork would inherit this process's gRPC state)
        out: mp.Queue = spawn.Queue()
        shares = [names[i :: a.clients] for i in range(a.clients)]
        if a.kafka:
            bootstrap = ",".join(f"127.0.0.1:{p.kafka_port}" for p in procs)
            workers = [
                spawn.Process(
                    target=_kafka_client, args=(bootstrap, s, a.messages, a.batch, f"g{i}", out)
                )
                for i, s in enumerate(shares)
            ]
        else:
            workers = [
                spawn.Process(target=_client, args=(urls, s, a.messages, a.batch, a.api, out))
                for s in shares
            ]
        brokers_cpu = sum(_cpu_s(_pid(p)) for p in procs)
        for w in workers:
            w.start()
        times = [out.get(timeout=600) for _ in workers]
        for w in workers:
            w.join()
        brokers_cpu = sum(_cpu_s(_pid(p)) for p in procs) - brokers_cpu
        total = a.messages * a.destinations
        produce = total / max(t[0] for t in times)
        consume = total / max(t[1] for t in times)
        wall = max(t[0] + t[1] for t in times)
        clients_cpu = sum(t[2] for t in times)
        cpu = (
            f"cpu: brokers {brokers_cpu:.1f} s, clients {clients_cpu:.1f} s, in {wall:.1f} s "
            f"(x{os.cpu_count()} cores: {(os.cpu_count() or 1) * wall:.1f})"
        )
        return produce, consume, (brokers_cpu + clients_cpu) / wall, cpu
    finally:
        for p in procs:
            p.stop()
        _uncap(groups)


class _StompInbox:
    """What one stomp.py connection received (its listener's calls, on stomp.py's thread)."""

    def __init__(self, q: str) -> None:
        self.q = q
        self.got: list[Any] = []
        self.receipts: set[str] = set()
        self.cond = threading.Condition()

    def message(self, frame: Any) -> None:
        with self.cond:
            self.got.append(frame)
            self.cond.notify_all()

    def receipt_came(self, frame: Any) -> None:
        with self.cond:
            self.receipts.add(frame.headers["receipt-id"])
            self.cond.notify_all()

    def receipt(self, name: str, timeout: float) -> None:
        with self.cond:
            if not self.cond.wait_for(lambda: name in self.receipts, timeout):
                raise RuntimeError(f"{self.q}: no receipt {name}")

    def ack_all(self, conn: Any, n: int) -> int:
        """Ack each message as it comes until ``n`` came; how many."""
        acked = 0
        while acked < n:
            with self.cond:
                self.cond.wait_for(lambda: bool(self.got), 60)
                batch, self.got[:] = list(self.got), []
            if not batch:
                raise RuntimeError(f"{self.q}: {n - acked} messages never came")
            for frame in batch:
                conn.ack(frame.headers["ack"])
            acked += len(batch)
        return acked


def _stomp_connect(port: int, q: str) -> tuple[Any, _StompInbox]:
    import stomp  # (the bench extra's)

    inbox = _StompInbox(q)

    class Listener(stomp.ConnectionListener):
        def on_message(self, frame: Any) -> None:
            inbox.message(frame)

        def on_receipt(self, frame: Any) -> None:
            inbox.receipt_came(frame)

    conn = stomp.Connection12([("127.0.0.1", port)], auto_decode=False)
    conn.set_listener("bench", Listener())
    conn.connect(wait=True)
    return conn, inbox


def _stomp_round(port: int, q: str, n: int, sync_n: int) -> tuple[float, float, float]:
    """One STOMP client's synchronous sends, pipelined sends, and reading with acks."""
    conn, inbox = _stomp_connect(port, q)
    body = b"x" * 100
    started = time.perf_counter()
    for i in range(sync_n):  # one at a time: each waits for its receipt
        conn.send(f"/queue/{q}", body, headers={"receipt": f"s{i}"})
        inbox.receipt(f"s{i}", 30)
    sync_rate = sync_n / (time.perf_counter() - started)
    started = time.perf_counter()
    for i in range(n):  # pipelined: a receipt on the last only
        conn.send(f"/queue/{q}", body, headers={"receipt": "last"} if i == n - 1 else {})
    inbox.receipt("last", 120)
    send_rate = n / (time.perf_counter() - started)
    started = time.perf_counter()
    conn.subscribe(f"/queue/{q}", id="s", ack="client-individual")
    acked = inbox.ack_all(conn, n + sync_n)
    read_rate = acked / (time.perf_counter() - started)
    conn.disconnect()
    return sync_rate, send_rate, read_rate


def _stomp_moved_back_round(procs: list[BrokerProcess], q: str, n: int) -> tuple[float, float]:
    """A STOMP client of m0 subscribed to ``q`` while m1 served it (forwarded), then ``q``
    moved to m0: ``n`` messages (sent by the SDK beforehand) consumed and acked; the rate,
    and m0's CPU microseconds a message meanwhile."""
    urls = [p.url for p in procs]
    with Admin(urls) as admin:
        admin.create_queue(q)
        admin.pin(q, "m1")
    _wait_served([procs[1].url], {q})
    assert procs[0].stomp_port is not None
    conn, inbox = _stomp_connect(procs[0].stomp_port, q)
    conn.subscribe(f"/queue/{q}", id="s", ack="client-individual", headers={"receipt": "sub"})
    inbox.receipt("sub", 30)
    with Admin(urls) as admin:
        admin.pin(q, "m0")
    _wait_served([procs[0].url], {q})
    time.sleep(1.0)  # (the subscription follows it)
    with Producer(urls, destination=q) as producer:
        for start in range(0, n, 1000):
            producer.send_batch([b"x" * 100] * min(1000, n - start))
    cpu = _cpu_s(_pid(procs[0]))
    started = time.perf_counter()
    acked = inbox.ack_all(conn, n)
    wall = time.perf_counter() - started
    used = _cpu_s(_pid(procs[0])) - cpu
    conn.disconnect()
    return acked / wall, used / acked * 1e6


def _threads_fds(pid: int) -> tuple[int, int]:
    """Process ``pid``'s threads and open file descriptors, from /proc."""
    return len(os.listdir(f"/proc/{pid}/task")), len(os.listdir(f"/proc/{pid}/fd"))


def _stomp_many_round(procs: list[BrokerProcess], q: str, subs: int) -> str:
    """``subs`` STOMP subscriptions of member m0 to queue ``q``, which m1 serves (each a
    forwarded consumer): the time until all are receipted, m0's threads and descriptors
    before, with them, and after they went; a message sent to each came to one of them."""
    pid = _pid(procs[0])
    before = _threads_fds(pid)
    assert procs[0].stomp_port is not None
    conn, inbox = _stomp_connect(procs[0].stomp_port, q)
    started = time.perf_counter()
    for i in range(subs):
        conn.subscribe(f"/queue/{q}", id=f"s{i}", ack="client-individual",
                       headers={"receipt": f"sub{i}"})  # fmt: skip
    for i in range(subs):
        inbox.receipt(f"sub{i}", 60)
    attached_s = time.perf_counter() - started
    with_them = _threads_fds(pid)
    with Producer([p.url for p in procs], destination=q) as producer:
        producer.send_batch([b"x" * 100] * subs)
    acked = inbox.ack_all(conn, subs)
    conn.disconnect()
    deadline = time.monotonic() + 30
    after = _threads_fds(pid)
    while max(after[0] - before[0], after[1] - before[1]) > 2 and time.monotonic() < deadline:
        time.sleep(0.2)
        after = _threads_fds(pid)
    return (
        f"{subs} forwarded subscriptions receipted in {attached_s:5.2f} s; m0's threads "
        f"{before[0]} -> {with_them[0]} -> {after[0]}, descriptors {before[1]} -> "
        f"{with_them[1]} -> {after[1]}; {acked} messages consumed and acked through them"
    )


def stomp_forwarding(zk: ZooKeeper, a: argparse.Namespace) -> None:
    """What forwarding costs a STOMP client (stomp.py): the same sends and reads, through the
    member that owns the queue and through the other one, which forwards them."""
    root = Path(tempfile.mkdtemp(prefix="sparkmq-cluster-bench-stomp-"))
    procs = _members(zk, root, 2, "bench-stomp")
    try:
        with Admin([p.url for p in procs]) as admin:
            for q, member in (("here", "m0"), ("there", "m1")):
                admin.create_queue(q)
                admin.pin(q, member)
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                owners = {q: o["member"] for q, o in admin.cluster()["owners"].items()}
                if owners == {"here": "m0", "there": "m1"}:
                    break
                time.sleep(0.1)
        port = procs[0].stomp_port  # (m0's: "there" is forwarded to m1)
        assert port is not None
        for r in range(a.rounds):
            for q, how in (("here", "to its owner"), ("there", "forwarded")):
                sync, sent, read = _stomp_round(port, q, a.stomp_messages, a.stomp_sync)
                print(
                    f"round {r + 1} STOMP {how:>12}: synchronous sends {sync:6,.0f}/s  "
                    f"pipelined sends {sent:8,.0f} msg/s  consume+ack {read:8,.0f} msg/s"
                )
            rate, us = _stomp_moved_back_round(procs, f"back{r}", a.stomp_messages)
            print(
                f"round {r + 1} STOMP subscribed while forwarded, its queue then moved to its "
                f"member: consume+ack {rate:8,.0f} msg/s, that member's CPU {us:5.1f} us/msg"
            )
            print(f"round {r + 1} STOMP {_stomp_many_round(procs, 'there', a.stomp_subs)}")
    finally:
        for p in procs:
            p.stop()


def transactions_over_members(zk: ZooKeeper, a: argparse.Namespace) -> None:
    """What a transaction spanning two members costs: SDK transactions of a consumed batch
    of ``--batch`` messages acked and sent on (consume-transform-produce), committed at the
    source queue's member, with the target queue on the same member and on the other one."""
    root = Path(tempfile.mkdtemp(prefix="sparkmq-cluster-bench-tx-"))
    procs = _members(zk, root, 2, "bench-tx")
    urls = [p.url for p in procs]
    pins = {"src": "m0", "near": "m0", "far": "m1"}
    try:
        with Admin(urls) as admin:
            for q, member in pins.items():
                admin.create_queue(q)
                admin.pin(q, member)
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                owners = {q: o["member"] for q, o in admin.cluster()["owners"].items()}
                if all(owners.get(q) == m for q, m in pins.items()):
                    break
                time.sleep(0.1)
        for r in range(a.rounds):
            for target in ("near", "far"):
                n = a.transactions * a.batch
                with Producer(urls, destination="src") as producer:
                    producer.send_batch([b"x" * 100] * n)
                times = []
                with Consumer(urls, "src", prefetch=a.batch) as consumer:
                    started = time.perf_counter()
                    for _ in range(a.transactions):
                        got: list[Any] = []
                        while len(got) < a.batch:
                            got += consumer.receive_many(a.batch - len(got), timeout=10)
                        t0 = time.perf_counter()
                        with Transaction(urls) as tx:
                            for m in got:
                                tx.send(target, m.body)
                            tx.ack(got)
                        times.append(time.perf_counter() - t0)
                    wall = time.perf_counter() - started
                times.sort()
                where = "on the source's member" if target == "near" else "on the other member"
                print(
                    f"round {r + 1} target {where:>22}: {a.transactions} transactions of "
                    f"{a.batch} in {wall:.2f} s ({n / wall:8,.0f} msg/s); commit p50 "
                    f"{times[len(times) // 2] * 1000:6.1f} ms, p90 "
                    f"{times[int(len(times) * 0.9)] * 1000:6.1f} ms"
                )
        with Admin(urls) as admin:
            stored = admin.stats("near")["end_offset"] + admin.stats("far")["end_offset"]
            assert stored == 2 * a.rounds * a.transactions * a.batch, stored
    finally:
        for p in procs:
            p.stop()


def _moving_sender(
    url: list[str], stop: Any, times: list[float], errors: list[str], dest: str = "mv"
) -> None:
    with Producer(url, linger_ms=0, timeout_s=30) as producer:
        i = 0
        while not stop.is_set():
            try:
                producer.send_sync(f"m{i}", destination=dest, group_id=f"g{i % 4}")
                times.append(time.monotonic())
            except Exception as exc:  # (counted: a move should cost none)
                errors.append(repr(exc))
            i += 1


def _moving_reader(url: list[str], stop: Any, times: list[float], errors: list[str]) -> None:
    """The SDK's consumer, acking each batch it gets (when each message came)."""
    try:
        with Consumer(url, "mv", prefetch=200) as consumer:
            while not stop.is_set():
                batch = consumer.receive_many(200, timeout=0.05)
                if batch:
                    times.extend([time.monotonic()] * len(batch))
                    consumer.ack(batch)
    except Exception as exc:
        errors.append(repr(exc))


def _aio_moving_sender(
    url: list[str], stop: Any, times: list[float], errors: list[str], dest: str = "mv"
) -> None:
    """The asyncio SDK's producer, each send awaited before the next."""
    import asyncio

    from spark_mq.aio import AsyncProducer

    async def run() -> None:
        async with AsyncProducer(url, timeout_s=30) as producer:
            i = 0
            while not stop.is_set():
                try:
                    await producer.send(f"m{i}", destination=dest, group_id=f"g{i % 4}")
                    times.append(time.monotonic())
                except Exception as exc:  # (counted: a move should cost none)
                    errors.append(repr(exc))
                i += 1

    asyncio.run(run())


def _aio_moving_reader(url: list[str], stop: Any, times: list[float], errors: list[str]) -> None:
    """The asyncio SDK's consumer, acking each batch it gets (when each message came)."""
    import asyncio

    from spark_mq.aio import AsyncConsumer
    from spark_mq.errors import BrokerUnavailable, LeaseError

    async def run() -> None:
        async with AsyncConsumer(url, "mv", prefetch=200) as consumer:
            while not stop.is_set():
                batch = await consumer.get_many(200, timeout=0.05)
                if batch:
                    times.extend([time.monotonic()] * len(batch))
                    with contextlib.suppress(LeaseError, BrokerUnavailable):  # (comes again)
                        await consumer.ack(batch)

    try:
        asyncio.run(run())
    except Exception as exc:
        errors.append(repr(exc))


def _kafka_moving_sender(
    ports: list[int], stop: Any, times: list[float], errors: list[str], dest: str = "mv"
) -> None:
    """librdkafka's producer, each message flushed before the next (acks=all)."""
    from confluent_kafka import Producer as KafkaProducer

    servers = ",".join(f"127.0.0.1:{p}" for p in ports)
    producer = KafkaProducer({"bootstrap.servers": servers, "linger.ms": 0, "acks": "all"})

    def done(err: Any, _msg: Any) -> None:
        if err is None:
            times.append(time.monotonic())
        else:  # (counted: a move should cost none)
            errors.append(str(err))

    i = 0
    while not stop.is_set():
        producer.produce(dest, f"m{i}".encode(), on_delivery=done)
        producer.flush(30)
        i += 1


def _kafka_moving_reader(
    ports: list[int], stop: Any, times: list[float], errors: list[str]
) -> None:
    """librdkafka's consumer of the topic's partition from its start (no group)."""
    from confluent_kafka import Consumer as KafkaConsumer
    from confluent_kafka import TopicPartition

    servers = ",".join(f"127.0.0.1:{p}" for p in ports)
    consumer = KafkaConsumer(
        {"bootstrap.servers": servers, "group.id": "bench", "fetch.wait.max.ms": 100}
    )
    consumer.assign([TopicPartition("mv", 0, 0)])
    try:
        while not stop.is_set():
            m = consumer.poll(0.05)
            if m is None:
                continue
            if m.error() is not None:
                errors.append(str(m.error()))
            else:
                times.append(time.monotonic())
    finally:
        consumer.close()


def _longest_gap(times: list[float], since: float) -> float:
    window = [t for t in times if t >= since - 0.2]
    return max((b - x for x, b in itertools.pairwise(window)), default=0.0)


def moves(zk: ZooKeeper, a: argparse.Namespace) -> None:
    """What moving a destination costs its clients (see the module)."""
    root = Path(tempfile.mkdtemp(prefix="sparkmq-cluster-bench-moves-"))
    procs = _members(zk, root, 2, f"bench-moves-{os.getpid()}")
    urls = [p.url for p in procs]
    ports = [int(p.kafka_port or 0) for p in procs]
    stop = threading.Event()
    times: list[float] = []
    read: list[float] = []  # (Kafka's reader: when each message came)
    errors: list[str] = []
    try:
        with Admin(urls) as admin:
            make = admin.create_topic if a.kafka else admin.create_queue
            make("mv")
            make("still")  # (another, on m0 throughout)
            admin.pin("still", "m0")
        _wait_served(urls, {"mv", "still"})
        if a.hold and not a.kafka:  # (scheduled an hour on: unsettled throughout)
            with Producer(urls, destination="mv") as held:
                held.send_sync("held", delay_s=3_600)
        still: list[float] = []
        if a.kafka:
            threads = [
                threading.Thread(target=_kafka_moving_sender, args=(ports, stop, times, errors)),
                threading.Thread(target=_kafka_moving_reader, args=(ports, stop, read, errors)),
                threading.Thread(
                    target=_kafka_moving_sender, args=(ports, stop, still, errors, "still")
                ),
            ]
        else:  # (the asyncio SDK's clients, or the SDK's)
            sender, reader = (
                (_aio_moving_sender, _aio_moving_reader)
                if a.aio
                else (_moving_sender, _moving_reader)
            )
            threads = [
                threading.Thread(target=sender, args=(urls, stop, times, errors)),
                threading.Thread(target=reader, args=(urls, stop, read, errors)),
                threading.Thread(target=sender, args=(urls, stop, still, errors, "still")),
            ]
        for t in threads:
            t.start()
        took, stalls, others, reads = [], [], [], []
        with Admin(urls) as admin:
            for _ in range(a.moves):
                time.sleep(1.0)  # (sending at its pace between moves)
                owner = admin.cluster()["owners"]["mv"]["member"]
                target = "m1" if owner == "m0" else "m0"
                url = urls[int(target[1])]
                started = time.monotonic()
                admin.pin("mv", target)
                while True:
                    with Admin(url) as there:
                        if "mv" in there.cluster()["serving"]:
                            break
                    time.sleep(0.005)
                took.append(time.monotonic() - started)
                time.sleep(0.5)
                stalls.append(_longest_gap(times, started))
                reads.append(_longest_gap(read, started))
                if target == "m0":  # (moved to the member serving the other queue)
                    others.append(_longest_gap(still, started))
        stop.set()
        for t in threads:
            t.join(60)
    finally:
        for p in procs:
            p.stop()
        zk.stop()
    logs = "".join((root / f"m{i}.log").read_text() for i in range(2))
    refused = logs.count("another member took it over") + logs.count("a newer owner fenced it")
    took.sort()
    stalls.sort()
    gap = statistics.median([b - x for x, b in itertools.pairwise(still)])
    print(
        f"{a.moves} moves under synchronous sends ({len(times)} acknowledged) and a reader"
        f" ({'librdkafka' if a.kafka else 'the asyncio SDK' if a.aio else 'the SDK'}):\n"
        f"  pin to served at the new owner: median {statistics.median(took) * 1000:.0f} ms, "
        f"max {took[-1] * 1000:.0f} ms\n"
        f"  longest wait between two acknowledged sends across a move: median "
        f"{statistics.median(stalls) * 1000:.0f} ms, max {stalls[-1] * 1000:.0f} ms\n"
        f"  longest wait of a synchronous send to another queue of the member it moved to: "
        f"median {statistics.median(others) * 1000:.0f} ms, max {max(others) * 1000:.0f} ms "
        f"(its median gap {gap * 1000:.1f} ms)\n"
        + (
            f"  longest wait between two messages read across a move: median "
            f"{statistics.median(reads) * 1000:.0f} ms, max {max(reads) * 1000:.0f} ms\n"
            if read
            else ""
        )
        + f"  refused by a fence (old owner's log): {refused}; client errors: {len(errors)}"
        + (f" ({errors[0]})" if errors else "")
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--destinations", type=int, default=16)
    ap.add_argument("--messages", type=int, default=20000, help="per destination")
    ap.add_argument("--batch", type=int, default=500)
    ap.add_argument("--clients", type=int, default=2)
    ap.add_argument(
        "--api",
        choices=["arrow", "messages"],
        default="arrow",
        help="arrow: Arrow tables sent pipelined, MessageBatches received; messages: lists of "
        "bodies sent one batch at a time, Message objects received",
    )
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--stomp", action="store_true", help="only: what forwarding costs STOMP")
    ap.add_argument("--stomp-messages", type=int, default=5000)
    ap.add_argument("--stomp-sync", type=int, default=100)
    ap.add_argument(
        "--stomp-subs", type=int, default=200, help="forwarded subscriptions of one client"
    )
    ap.add_argument("--partitions", type=int, default=0, help="only: one destination, 1 vs N")
    ap.add_argument(
        "--targets",
        action="store_true",
        help="the many-destination run, then one destination of 1 vs --partitions (4)",
    )
    ap.add_argument(
        "--hot-messages", type=int, default=200_000, help="with --targets: per client, 1 vs N"
    )
    ap.add_argument("--kafka", action="store_true", help="librdkafka clients (topics)")
    ap.add_argument(
        "--transactions",
        type=int,
        default=0,
        help="only: consume-transform-produce transactions of --batch, to a queue on one "
        "member and on two",
    )
    ap.add_argument("--aio", action="store_true", help="with --moves: the asyncio SDK's clients")
    ap.add_argument("--moves", type=int, default=0, help="only: what moving a destination costs")
    ap.add_argument(
        "--hold",
        action="store_true",
        help="with --moves: the queue's first message is scheduled an hour on (its mark stays)",
    )
    ap.add_argument(
        "--member-cores",
        type=float,
        default=0.0,
        help="each broker process limited to this much CPU (a cgroup's quota; root), as "
        "members on machines of their own are: the clients no longer take the brokers' cores",
    )
    a = ap.parse_args()
    zk = ZooKeeper(Path(tempfile.mkdtemp(prefix="sparkmq-cluster-bench-zk-")))
    zk.start()
    if a.moves:
        moves(zk, a)
        return
    if a.stomp:
        try:
            stomp_forwarding(zk, a)
        finally:
            zk.stop()
        return
    if a.transactions:
        try:
            transactions_over_members(zk, a)
        finally:
            zk.stop()
        return
    try:
        if a.targets:  # (both of the cluster's speed figures, one after the other)
            spread = many_destinations(zk, a)
            a.messages, a.partitions = a.hot_messages, a.partitions or 4
            hot = partitioned(zk, a)
            capped = f" (each broker limited to {a.member_cores} cores)" if a.member_cores else ""
            print(
                f"\ntargets{capped}: 2 members x{spread:.2f} a single broker's rate over many "
                f"destinations (target x1.6); {a.partitions} partitions x{hot:.2f} one (target "
                "x1.5)"
            )
        elif a.partitions:
            partitioned(zk, a)
        else:
            many_destinations(zk, a)
    finally:
        zk.stop()


if __name__ == "__main__":
    main()
