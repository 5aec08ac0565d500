"""A cluster of brokers on a real ZooKeeper, each member a broker process of its own on one
shared data root (spark_mq.cluster.member): the SDK is served by any member (a member that
does not own a destination names the one that does, and the client goes there); a member
killed with SIGKILL under load has its destinations served again by the others with nothing
acknowledged lost or stored twice and every group's order kept; a member paused past its
session commits nothing after it was replaced and comes back with new epochs; a member added
takes its share under load; ZooKeeper away moves nothing and stops nobody serving."""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from pathlib import Path
from typing import Any, Self

import pyarrow as pa
import pytest
from deltalake import DeltaTable
from prometheus_client.parser import text_string_to_metric_families

from spark_mq import Admin, Consumer, Producer, Transaction
from spark_mq.client._transport import call_action, connect
from spark_mq.errors import (
    BrokerUnavailable,
    ConfigError,
    DestinationNotFound,
    LeaseError,
    NotAllowed,
    NotOwner,
    SparkMQError,
)
from spark_mq.journal import layout
from spark_mq.launch import BrokerProcess
from tests.conftest import receive_n, wait_for
from tests.ops_kit import http
from tests.zk_kit import ZooKeeper

pytestmark = pytest.mark.process

SESSION_S = 2.0  # a dead member is given up within seconds
_clusters = itertools.count()


class Cluster:
    """Members of one cluster (a name of its own in the shared ZooKeeper), on one data root."""

    def __init__(self, zookeeper: ZooKeeper, base: Path) -> None:
        self.zookeeper = zookeeper
        self.name = f"c{next(_clusters)}-{os.getpid()}"
        self.root = base / "root"
        self.logs = base / "logs"
        self.logs.mkdir()
        self.members: dict[str, BrokerProcess] = {}

    def start(
        self, member_id: str, env: dict[str, str] | None = None, **settings: object
    ) -> BrokerProcess:
        args = [
            "--set", f"cluster.zookeeper={self.zookeeper.hosts}",
            "--set", f"cluster.name={self.name}",
            "--set", f"cluster.session_timeout_s={SESSION_S}",
            "--set", f"ha.broker_id={member_id}",
            "--set", f"logging.file={self.logs / f'{member_id}.log'}",
        ]  # fmt: skip
        for key, value in settings.items():
            args += ["--set", f"{key}={value}"]
        proc = BrokerProcess(
            str(self.root),
            extra_args=args,
            log_file=str(self.logs / f"{member_id}.out"),
            env=env,
        ).start()
        self.members[member_id] = proc
        return proc

    @property
    def urls(self) -> list[str]:
        return [p.url for p in self.members.values() if p.proc and p.proc.poll() is None]

    def state(self, member_id: str) -> dict[str, Any]:
        with Admin(self.members[member_id].url, timeout_s=5) as admin:
            return dict(admin.status()["cluster"])

    def owners(self, via: str) -> dict[str, str]:
        return {n: o["member"] for n, o in self.state(via)["owners"].items()}

    def serving(self, *only: str) -> dict[str, set[str]]:
        """What each running member (or each of ``only``) serves."""
        return {
            m: set(self.state(m)["serving"])
            for m, p in self.members.items()
            if p.proc and p.proc.poll() is None and (not only or m in only)
        }

    def log(self, member_id: str) -> str:
        path = self.logs / member_id / f"{member_id}.log"
        path = path if path.exists() else self.logs / f"{member_id}.log"
        return path.read_text() if path.exists() else ""

    def stop(self) -> None:
        for proc in self.members.values():
            proc.kill()


@pytest.fixture
def cluster(zookeeper: ZooKeeper, tmp_path: Path) -> Iterator[Cluster]:
    c = Cluster(zookeeper, tmp_path)
    yield c
    c.stop()


def _all_served(cluster: Cluster, names: set[str], members: set[str]) -> bool:
    """Every destination served by exactly one of ``members``, each serving some."""
    serving = cluster.serving()
    if set(serving) != members or not all(serving.values()):
        return False
    held = [n for s in serving.values() for n in s]
    return sorted(held) == sorted(names)


def _placed(cluster: Cluster, members: str, names: set[str] | list[str]) -> None:
    """Members started (one letter each), ``names`` created as queues and each served."""
    for m in members:
        cluster.start(m)
    with Admin(cluster.urls) as admin:
        for n in sorted(names):
            admin.create_queue(n)
    wait_for(lambda: _all_served(cluster, set(names), set(members)), 20, "placed")


def _one_on_two(cluster: Cluster, name: str, kind: str = "queue") -> None:
    """Members a and b started, ``name`` created (a queue or a topic) and served by one."""
    for m in "ab":
        cluster.start(m)
    with Admin(cluster.urls) as admin:
        if kind == "queue":
            admin.create_queue(name)
        else:
            admin.create_topic(name)
    wait_for(lambda: any(name in s for s in cluster.serving().values()), 20, "placed")


def _pinned_on_b(cluster: Cluster, name: str, kind: str = "queue") -> None:
    """Members a and b started, ``name`` created (a queue or a topic), pinned to b and served
    there (a's clients are forwarded to it)."""
    for m in "ab":
        cluster.start(m)
    with Admin(cluster.urls) as admin:
        (admin.create_queue if kind == "queue" else admin.create_topic)(name)
        admin.pin(name, "b")
    wait_for(lambda: name in cluster.serving("b")["b"], 20, f"{name} on b")


def _move_back_and_forth(
    cluster: Cluster,
    name: str,
    times: int,
    gap_s: float = 0.2,
    before: Callable[[], object] | None = None,
) -> None:
    """Pin ``name`` on the other of members a and b, ``times`` times, each once it is served
    where it was pinned and ``gap_s`` later (what runs meanwhile meets every move), and once
    ``before()`` has returned (it may wait for what runs meanwhile to have got on)."""
    with Admin(cluster.urls) as admin:
        for _ in range(times):
            time.sleep(gap_s)
            if before is not None:
                before()
            target = {"a": "b", "b": "a"}[cluster.owners("a")[name]]
            admin.pin(name, target)
            wait_for(lambda t=target: name in cluster.serving(t)[t], 20, f"{name} on {target}")


def _drain(url: str | list[str], name: str, expect: int | None = None) -> list[Any]:
    """Every message of ``name`` (each acked): ``expect`` of them, then whatever comes within a
    moment more (a message too many is caught); without ``expect``, until it is quiet."""
    got: list[Any] = []
    with Consumer(url, name, prefetch=500) as consumer:
        while True:
            done = expect is not None and len(got) >= expect
            batch = consumer.receive_many(500, timeout=0.2 if done else 10 if expect else 0.5)
            if not batch:
                return got
            got += batch
            consumer.ack(batch)


def test_members_creating_one_destination_at_once_take_turns(cluster: Cluster) -> None:
    """Two members asked to create the same destinations at the same moment (Kafka groups at
    two members make the offsets topic so): each is created once, by one of them, and served.
    Without the turns the second took the first's new tables for a deletion's leftovers and
    dropped them while their owner stamped them, and the destination was never served."""
    for m in "ab":
        cluster.start(m)
    names = [f"race{i}" for i in range(6)]
    together = threading.Barrier(2)
    made: dict[tuple[str, str], bool] = {}

    def create(member: str) -> None:
        with Admin(cluster.members[member].url) as admin:
            for n in names:
                together.wait(10)
                made[(member, n)] = admin.create_queue(n)

    threads = [threading.Thread(target=create, args=(m,)) for m in "ab"]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert all([made[(m, n)] for m in "ab"].count(True) == 1 for n in names), made
    wait_for(lambda: _all_served(cluster, set(names), {"a", "b"}), 30, "each served")
    with Producer(cluster.urls) as producer:
        for n in names:
            producer.send_sync(n, destination=n)
    for n in names:
        assert [m.body.decode() for m in _drain(cluster.urls, n, expect=1)] == [n]


def test_any_member_serves_the_sdk_each_destination_from_its_owner(cluster: Cluster) -> None:
    for m in ("a", "b", "c"):
        cluster.start(m)
    names = {f"q{i}" for i in range(9)}
    with Admin(cluster.members["a"].url) as admin:
        for n in sorted(names):
            assert admin.create_queue(n)
        assert not admin.create_queue("q0")  # (created once, whichever member is asked)
    wait_for(lambda: _all_served(cluster, names, {"a", "b", "c"}), 20, "9 queues on 3 members")
    assert all(len(s) == 3 for s in cluster.serving().values())
    owners = cluster.owners("b")
    assert owners == cluster.owners("c")

    # a member that does not own a destination says which does, and where
    elsewhere = next(n for n in sorted(names) if owners[n] != "a")
    conn = connect(cluster.members["a"].url, 5)  # (the answer itself, past the SDK's following)
    with pytest.raises(NotOwner) as refused:
        call_action(conn.client, conn.options, "stats", name=elsewhere)
    conn.client.close()
    fields = refused.value.fields
    assert fields["member"] == owners[elsewhere]
    assert fields["endpoint"] == cluster.members[owners[elsewhere]].url
    assert fields["epoch"] >= 1

    # the SDK follows: one producer on member b sends to all nine, buffered and synchronous
    with Producer(cluster.members["b"].url) as producer:
        futures = [
            producer.send(f"{n}-{i}", destination=n, group_id=f"g{i % 3}")
            for i in range(100)
            for n in sorted(names)
        ]
        offsets = [f.result(30) for f in futures]
        for n in sorted(names):
            assert producer.send_sync(f"{n}-sync", destination=n) == 100
    assert len(offsets) == 900
    # ... and each queue is read whole, in order, through member c
    for n in sorted(names):
        got = _drain(cluster.members["c"].url, n, expect=101)
        assert [m.body.decode() for m in got] == [f"{n}-{i}" for i in range(100)] + [f"{n}-sync"]
    with Admin(cluster.members["c"].url) as admin:
        assert all(admin.stats(n)["depth"] == 0 for n in names)  # (asked of each owner)

    # a transaction over destinations of two members commits at the one it reached, which
    # stores the other's sends there (before, it was refused); on one, it commits as ever
    two = sorted(names, key=lambda n: owners[n])
    far = next(n for n in two if owners[n] != owners[two[0]])
    with Transaction(cluster.members[owners[two[0]]].url) as tx:
        tx.send(two[0], "tx-1")
        tx.send(far, "tx-2")
        assert tx.commit() == {two[0]: [101], far: [101]}
    with Transaction(cluster.members[owners[two[0]]].url) as tx:
        tx.send(two[0], "tx-3")
        assert tx.commit() == {two[0]: [102]}
    assert [m.body.decode() for m in _drain(cluster.urls, far, expect=1)] == ["tx-2"]
    # ... and one over two destinations of one member, committed through another, goes there
    # (before, it was refused as if they were on two members)
    pair = sorted(n for n in names if owners[n] == owners[far] and n != far)[:2]
    other = next(m for m in ("a", "b", "c") if m != owners[far])
    with Transaction(cluster.members[other].url) as tx:
        tx.send(pair[0], "tx-4")
        tx.send(pair[1], "tx-5")
        assert tx.commit() == {pair[0]: [101], pair[1]: [101]}
    for n, body in zip(pair, ("tx-4", "tx-5"), strict=True):
        assert [m.body.decode() for m in _drain(cluster.urls, n, expect=1)] == [body]

    # an operator's move, from the command line of any member: the destination goes to the
    # member it is pinned to, under a new epoch, and its messages are there
    moved, to = two[0], next(m for m in ("a", "b", "c") if m != owners[two[0]])
    epoch = cluster.state("a")["owners"][moved]["epoch"]
    cli = _cli("cluster", "pin", moved, to, url=cluster.members["c"].url)
    assert cli.returncode == 0, cli.stderr
    assert f"pinned {moved} to {to}" in cli.stdout
    wait_for(lambda: moved in cluster.serving(to)[to], 20, "the pinned destination moved")
    shown = _cli("cluster", "status", "--json", url=cluster.members["a"].url)
    doc = json.loads(shown.stdout)
    assert doc["owners"][moved]["member"] == to and doc["owners"][moved]["epoch"] > epoch
    assert set(doc["members"]) == {"a", "b", "c"} and doc["session"] == "connected"
    assert [m.body.decode() for m in _drain(cluster.urls, moved, expect=2)] == ["tx-1", "tx-3"]
    refused = _cli("cluster", "pin", moved, "nobody", url=cluster.members["a"].url)
    assert refused.returncode != 0 and "no member 'nobody'" in refused.stderr
    # a listing asked of any member is the cluster's: every member's destinations, each row
    # naming the member serving it
    owners = cluster.owners("a")
    listed = _cli("queue", "list", "--json", url=cluster.members["b"].url)
    assert listed.returncode == 0, listed.stderr
    rows = {r["name"]: r for r in json.loads(listed.stdout)}
    assert {n: r["member"] for n, r in rows.items()} == {n: owners[n] for n in names}
    assert rows[moved]["depth"] == 0 and all(rows[n]["produced"] >= 101 for n in names)
    table = _cli("queue", "list", url=cluster.members["c"].url)
    assert "MEMBER" in table.stdout and all(n in table.stdout for n in names)


def test_the_asyncio_sdk_is_served_by_any_member_and_follows_moves(cluster: Cluster) -> None:
    """An asyncio producer and consumers given one member's URL: each destination is sent to
    and read at its owner (a NotOwner answer followed in one round trip; before, the asyncio
    SDK raised it), a queue that moves back and forth under a pipelined producer and its
    consumer loses nothing, keeps each group's order and is read once, and a consumer attached
    at a partitioned destination reads its partitions at their members."""
    import asyncio

    from spark_mq.aio import AsyncConsumer, AsyncProducer

    names = ["aq0", "aq1", "aq2", "aq3"]
    _placed(cluster, "ab", names)
    owners = cluster.owners("a")
    assert {owners[n] for n in names} == {"a", "b"}
    with Admin(cluster.urls) as admin:
        admin.create_queue("wide", partitions=4)
    url = cluster.members["a"].url  # (the only member the clients are told of)

    async def every_queue() -> dict[str, list[str]]:
        async with AsyncProducer(url) as producer:
            for n in names:
                await asyncio.gather(*(producer.send(f"{n}-{i}", destination=n) for i in range(20)))
            await producer.send_batch([f"w{i}" for i in range(40)], destination="wide")
        got: dict[str, list[str]] = {}
        for n in [*names, "wide"]:
            async with AsyncConsumer(url, n, prefetch=50) as consumer:
                got[n] = []
                while batch := await consumer.get_many(50, timeout=2):
                    got[n] += [m.text for m in batch]
                    await consumer.ack(batch)
        return got

    got = asyncio.run(every_queue())
    # (sends begun together: stored in the order begun, at whichever member serves each)
    assert {n: got[n] for n in names} == {n: [f"{n}-{i}" for i in range(20)] for n in names}
    assert sorted(got["wide"]) == sorted(f"w{i}" for i in range(40))

    moves_done = threading.Event()
    sent_n: list[int] = []  # (how many were sent: until the moves are done, 1,200 at least)

    async def through_moves() -> list[tuple[str, str, int]]:
        got: list[tuple[str, str, int]] = []
        async with (
            AsyncProducer(url, destination="aq0", max_in_flight=50) as producer,
            AsyncConsumer(url, "aq0", prefetch=100) as consumer,
        ):

            async def send() -> None:
                sent, i = [], 0
                while i < 1200 or not moves_done.is_set():
                    sent.append(await producer.submit(f"m{i}", group_id=f"g{i % 4}"))
                    i += 1
                    if i % 100 == 0:
                        await asyncio.sleep(0.05)  # (spread over the moves)
                await asyncio.gather(*sent)  # (each stored: an error is raised here)
                await producer.send("last", group_id="g0")
                sent_n.append(i)

            async def read() -> None:
                # (until every message came, then until a second passes with none: what a move
                # took back unacknowledged comes again)
                while not sent_n or not {"last", *(f"m{i}" for i in range(sent_n[0]))} <= {
                    t for t, _, _ in got
                }:
                    for m in await consumer.get_many(100, timeout=30):
                        got.append((m.text, m.group_id or "", m.delivery_count))
                        try:
                            await m.ack()
                        except LeaseError as exc:  # (its queue moved on as it was acked)
                            assert exc.fields.get("comes_again") is True, exc
                        except BrokerUnavailable:  # (the answer went with the link: it
                            pass  # may come again)

            await asyncio.gather(send(), read())
            while more := await consumer.get_many(100, timeout=1):
                for m in more:
                    got.append((m.text, m.group_id or "", m.delivery_count))
                await consumer.ack(more)
        return got

    def mover() -> None:
        try:
            _move_back_and_forth(cluster, "aq0", 4)
        finally:
            moves_done.set()

    moving = threading.Thread(target=mover)
    moving.start()
    try:
        moved = asyncio.run(through_moves())
    finally:
        moves_done.set()
        moving.join(120)
    texts = [t for t, _, _ in moved]
    wanted = [f"m{i}" for i in range(sent_n[0])] + ["last"]
    assert set(texts) == set(wanted), set(wanted) - set(texts)
    # once each, but for what a move took back unacknowledged (delivered again: counted so)
    again = [t for t, _, count in moved if count > 1]
    assert len(texts) - len(set(texts)) <= len(again), "a message delivered twice, not again"
    for g in range(4):  # each group in the order sent, first deliveries alike
        seen = [int(t[1:]) for t, grp, _ in moved if grp == f"g{g}" and t != "last"]
        firsts = list(dict.fromkeys(seen))  # (a redelivery's first delivery is its place)
        assert firsts == sorted(firsts), f"g{g} out of order: {seen}"
    with Admin(cluster.urls) as admin:
        assert admin.stats("aq0")["depth"] == 0


def test_a_partitioned_destination_spreads_over_the_members_and_is_read_whole(
    cluster: Cluster,
) -> None:
    """A destination of four partitions on two members: two partitions each; a producer
    reaching one member sends each message to its partition's owner, a consumer reaching the
    other reads every partition from its owner, each group in order; a partition moved under
    them is followed."""
    for m in ("a", "b"):
        cluster.start(m)
    with Admin(cluster.members["a"].url) as admin:
        assert admin.create_queue("hot", partitions=4)
    parts = {f"hot~{i}" for i in range(4)}
    wait_for(lambda: _all_served(cluster, parts, {"a", "b"}), 20, "4 partitions on 2 members")
    assert sorted(len(s) for s in cluster.serving().values()) == [2, 2]
    groups = [f"g{i}" for i in range(8)]
    with Producer(cluster.members["b"].url) as producer:
        futures = [
            producer.send(f"{i}", destination="hot", group_id=groups[i % 8]) for i in range(400)
        ]
        assert all(f.result(30) >= 0 for f in futures)
        # one partition moved to the other member while the producer goes on
        moved = "hot~0"
        to = "b" if cluster.owners("a")[moved] == "a" else "a"
        with Admin(cluster.urls) as admin:
            admin.pin(moved, to)
        wait_for(lambda: moved in cluster.serving(to)[to], 20, "the pinned partition moved")
        more = [
            producer.send(f"{i}", destination="hot", group_id=groups[i % 8])
            for i in range(400, 600)
        ]
        assert all(f.result(30) >= 0 for f in more)
        # pipelined batches too (each partition's kept until answered), one moved under them
        back = "a" if to == "b" else "b"
        batches = []
        for start in range(600, 1000, 50):
            if start == 800:
                with Admin(cluster.urls) as admin:
                    admin.pin(moved, back)
            rows = range(start, start + 50)
            batches.append(
                producer.send_batch(
                    pa.table({"body": [f"{i}".encode() for i in rows],
                              "group_id": [groups[i % 8] for i in rows]}),
                    destination="hot",
                    wait=False,
                )
            )  # fmt: skip
        assert all(len(f.result(30)) == 50 for f in batches)
    wait_for(lambda: moved in cluster.serving(back)[back], 20, "moved back")
    got = _drain(cluster.members["a"].url, "hot", expect=1000)
    assert len(got) == 1000
    seen: dict[str, list[int]] = defaultdict(list)
    for msg in got:
        seen[msg.group_id].append(int(msg.body))
    for group, bodies in seen.items():
        assert bodies == sorted(bodies) and len(bodies) == 125, group
    with Admin(cluster.members["b"].url) as admin:  # (each partition's asked of its owner)
        stats = admin.stats("hot")
        assert stats["produced"] == 1000 and stats["depth"] == 0
        assert sorted(p["name"] for p in stats["partitions"]) == sorted(parts)
    with Producer(cluster.members["b"].url) as producer:
        for i in range(8):
            producer.send_sync(f"{i}", destination="hot", group_id=groups[i])
    with Admin(cluster.members["a"].url) as admin:  # (a Spark query's claims, at each owner)
        claimed: list[bytes] = []
        for part in sorted(parts):
            if admin.claim(part, "etl", 1, 10):
                claimed += admin.claimed(part, "etl", 1)["body"].to_pylist()
        assert sorted(claimed) == [f"{i}".encode() for i in range(8)]
        assert admin.release_claims("hot", "etl") == 8
        admin.delete_destination("hot")
    wait_for(lambda: not any(cluster.serving().values()), 20, "the partitions deleted")
    _kafka_reads_a_partitioned_topic_from_each_partitions_owner(cluster)


def _kafka_reads_a_partitioned_topic_from_each_partitions_owner(cluster: Cluster) -> None:
    """librdkafka: a topic of four partitions made through one member's Kafka listener; its
    Metadata at the other names each partition's owner as its leader; keyed produces land on
    the owners, and a group of two reads every partition, each key in order."""
    from confluent_kafka import Consumer as KafkaConsumer
    from confluent_kafka import Producer as KafkaProducer
    from confluent_kafka.admin import AdminClient, NewTopic

    from spark_mq.transports.kafka.nodes import node_id

    kafka = {m: f"127.0.0.1:{cluster.members[m].kafka_port}" for m in ("a", "b")}
    admin = AdminClient({"bootstrap.servers": kafka["a"]})
    admin.create_topics([NewTopic("ktop", num_partitions=4)])["ktop"].result(20)
    parts = {f"ktop~{i}" for i in range(4)}
    wait_for(lambda: parts <= set(cluster.owners("a")), 20, "the topic's partitions placed")
    wait_for(lambda: _all_served(cluster, parts, {"a", "b"}), 20, "placed on both")

    def leaders() -> dict[int, int]:
        meta = AdminClient({"bootstrap.servers": kafka["b"]}).list_topics("ktop", timeout=10)
        return {i: p.leader for i, p in meta.topics["ktop"].partitions.items()}

    owners = cluster.owners("b")
    expected = {i: node_id(owners[f"ktop~{i}"]) for i in range(4)}
    wait_for(lambda: leaders() == expected, 20, "each partition led by its owner")
    assert len(set(expected.values())) == 2  # (two members lead)
    producer = KafkaProducer({"bootstrap.servers": kafka["b"], "enable.idempotence": True,
                              "linger.ms": 5})  # fmt: skip
    keys = [f"key{i}".encode() for i in range(10)]
    for i in range(400):
        producer.produce("ktop", f"{i}".encode(), key=keys[i % 10])
    assert producer.flush(30) == 0
    consumers = [
        KafkaConsumer(
            {
                "bootstrap.servers": ",".join(kafka.values()),
                "group.id": "kparts",
                "auto.offset.reset": "earliest",
                "session.timeout.ms": 6000,
                "heartbeat.interval.ms": 500,
            }
        )
        for _ in range(2)
    ]
    got: list[Any] = []
    try:
        for c in consumers:
            c.subscribe(["ktop"])
        deadline = time.monotonic() + 60
        while len({m.value() for m in got}) < 400 and time.monotonic() < deadline:
            for c in consumers:
                m = c.poll(0.1)
                if m is not None and m.error() is None:
                    got.append(m)
    finally:
        for c in consumers:
            c.close()
    # every record; one read again is Kafka's at-least-once across the group's rebalance (a
    # partition handed to the second consumer before the first's offsets were committed)
    assert len({m.value() for m in got}) == 400 and len(got) <= 420, len(got)
    assert {m.partition() for m in got} == {0, 1, 2, 3}
    for key in keys:
        values = list(dict.fromkeys(int(m.value()) for m in got if m.key() == key))
        assert values == sorted(values) and len(values) == 40
        assert len({m.partition() for m in got if m.key() == key}) == 1
    _kafka_adds_partitions_through_a_member_that_does_not_serve_partition_0(cluster, kafka)


def _kafka_adds_partitions_through_a_member_that_does_not_serve_partition_0(
    cluster: Cluster, kafka: dict[str, str]
) -> None:
    """CreatePartitions goes to the Kafka controller (the cluster's leader); with partition 0
    served by the other member, the leader has it done there (forwarded). Both members'
    Metadata then list the new partitions, each led by its owner (the leader, which holds a
    count it read, within a few seconds: it sees the cluster has a partition past it), and a
    record sent to one is read where it is served; the SDK's growth, asked of the leader,
    follows partition 0."""
    from confluent_kafka import Producer as KafkaProducer
    from confluent_kafka.admin import AdminClient, NewPartitions
    from kio.schema.metadata.v12 import request as metadata12

    from spark_mq.transports.kafka.nodes import node_id
    from tests.kafka_kit import kio_call

    def leaders(member: str) -> dict[int, int]:
        """Partition → leading node, as ``member`` itself answers (a client library asks
        whichever broker it likes)."""
        asked = metadata12.MetadataRequest(
            topics=(metadata12.MetadataRequestTopic(topic_id=None, name="ktop"),),
            allow_auto_topic_creation=False,
            include_topic_authorized_operations=False,
        )
        (topic,) = kio_call(cluster.members[member].kafka_port, asked).topics
        return {int(p.partition_index): int(p.leader_id) for p in topic.partitions}

    leader = cluster.state("a")["leader"]
    other = "b" if leader == "a" else "a"
    with Admin(cluster.urls) as admin:
        admin.pin("ktop~0", other)
    wait_for(lambda: "ktop~0" in cluster.serving(other)[other], 20, "partition 0 on the other")
    assert len(leaders(leader)) == 4  # (the leader holds the count it read)
    kafka_admin = AdminClient({"bootstrap.servers": kafka[leader]})  # (kept: it answers)
    kafka_admin.create_partitions([NewPartitions("ktop", 6)])["ktop"].result(30)
    parts = {f"ktop~{i}" for i in range(6)}
    wait_for(lambda: parts <= set(cluster.owners("a")), 20, "the new partitions placed")
    owners = cluster.owners("a")
    expected = {i: node_id(owners[f"ktop~{i}"]) for i in range(6)}
    # (not the 10 s a held count waits before it is read again)
    wait_for(lambda: leaders(leader) == expected, 4, f"6 partitions at {leader}")
    wait_for(lambda: leaders(other) == expected, 10, f"6 partitions at {other}")
    with Admin(cluster.members[leader].url) as admin:
        assert not admin.add_partitions("ktop", 6)  # (asked where partition 0 is: it has 6)
    with Consumer(cluster.urls, "ktop~5", durable=False) as reader:  # (from now on)
        producer = KafkaProducer({"bootstrap.servers": kafka[other]})
        reports: list[Any] = []
        producer.produce(
            "ktop", b"in the new one", partition=5, on_delivery=lambda e, m: reports.append(e)
        )
        assert producer.flush(30) == 0
        assert reports == [None], reports  # (delivered: flush only says nothing is left)
        (m,) = receive_n(reader, 1, timeout=20)
        assert (m.body, m.partition) == (b"in the new one", 5)
    _kafka_administers_a_topic_spread_over_members_at_either(cluster, kafka_admin, parts)


def _kafka_administers_a_topic_spread_over_members_at_either(
    cluster: Cluster, kafka_admin: Any, parts: set[str]
) -> None:
    """Kafka's configs altered and described, and the topic deleted, through a member that
    serves only some of its partitions: those the other serves are done there."""
    from confluent_kafka.admin import AlterConfigOpType, ConfigEntry, ConfigResource

    owners = cluster.owners("a")
    assert {owners[p] for p in parts} == {"a", "b"}  # (spread: each member has some)
    entry = ConfigEntry(
        "sparkmq.max_delivery_attempts", "6", incremental_operation=AlterConfigOpType.SET
    )
    change = ConfigResource(ConfigResource.Type.TOPIC, "ktop", incremental_configs=[entry])
    for altered in kafka_admin.incremental_alter_configs([change]).values():
        altered.result(30)
    with Admin(cluster.urls) as admin:
        stats = admin.stats("ktop")["partitions"]
        assert [p["settings"]["max_delivery_attempts"] for p in stats] == [6] * len(parts)
    (described,) = kafka_admin.describe_configs(
        [ConfigResource(ConfigResource.Type.TOPIC, "ktop")]
    ).values()
    assert described.result(30)["sparkmq.max_delivery_attempts"].value == "6"
    for deleted in kafka_admin.delete_topics(["ktop"]).values():
        deleted.result(30)
    wait_for(lambda: not parts & set(cluster.owners("a")), 20, "every partition deleted")
    with Admin(cluster.urls) as admin:
        assert admin.partitions("ktop") == 1  # (none: no such destination)


def _cli(*args: str, url: str) -> subprocess.CompletedProcess[str]:
    env = {"PATH": "/usr/bin:/bin", "SPARKMQ_URL": url}
    return subprocess.run(
        [sys.executable, "-m", "spark_mq", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
        check=False,
    )


class _Sending:
    """Sends in a thread of its own while the ``with`` block lasts; what each send was
    acknowledged with is kept, by queue."""

    def __init__(self, names: list[str]) -> None:
        self.names = names
        self.acked: dict[str, list[str]] = defaultdict(list)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        raise NotImplementedError

    def __enter__(self) -> Self:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(60)

    def count(self) -> int:
        return sum(len(v) for v in self.acked.values())


class Load(_Sending):
    """Synchronous sends of numbered messages in groups to several queues, from a producer
    given every member's URL."""

    def __init__(self, urls: list[str], names: list[str]) -> None:
        super().__init__(names)
        self.urls = urls
        self.errors: list[str] = []

    def _run(self) -> None:
        with Producer(self.urls, linger_ms=0, timeout_s=30) as producer:
            for i in itertools.count():
                if self._stop.is_set():
                    return
                name = self.names[i % len(self.names)]
                body = f"{name}:g{i % 4}:{i}"
                try:
                    producer.send_sync(body, destination=name, group_id=f"g{i % 4}")
                except SparkMQError as exc:
                    self.errors.append(f"{body}: {exc}")
                    continue
                self.acked[name].append(body)


class StompLoad(_Sending):
    """Receipted sends from a STOMP client to the same queues, through a member the client
    picks among the running ones, and another when that one goes: each send carries a dedup
    id, so one whose receipt never came is sent again and stored once. A member that does not
    own a queue forwards the send to its owner."""

    def __init__(self, cluster: Cluster, names: list[str]) -> None:
        super().__init__(names)
        self.cluster = cluster
        self.reconnects = 0

    def _run(self) -> None:
        from tests.stomp_kit import connect as stomp_connect

        i = 0
        while not self._stop.is_set():
            live = [p for p in self.cluster.members.values() if p.proc and p.proc.poll() is None]
            try:
                conn, inbox = stomp_connect(live[i % len(live)].stomp_port or 0)
            except Exception:
                time.sleep(0.1)
                continue
            try:
                while not self._stop.is_set():
                    name = self.names[i % len(self.names)]
                    body = f"{name}:s:{i}"
                    receipt = f"r{i}"
                    headers = {"receipt": receipt, "sparkmq-dedup-id": f"stomp-{i}",
                               "JMSXGroupID": "s"}  # fmt: skip
                    conn.send(f"/queue/{name}", body.encode(), headers=headers)
                    inbox.wait(
                        lambda r=receipt, box=inbox: (
                            r in box.receipts or bool(box.errors) or box.disconnected.is_set()
                        ),
                        "a receipt",
                        30,
                    )
                    if receipt not in inbox.receipts:
                        break  # (its member went, or refused: again, elsewhere)
                    self.acked[name].append(body)
                    i += 1
            except Exception:
                pass  # (the connection broke mid-send: again, elsewhere)
            finally:
                self.reconnects += 1
                with contextlib.suppress(Exception):
                    conn.disconnect()


class KafkaLoad(_Sending):
    """An idempotent librdkafka producer bootstrapped with every member's Kafka port, sending
    numbered records to the same queues (each topic's leader: its owner); what each delivery
    report acknowledged is kept."""

    def __init__(self, cluster: Cluster, names: list[str]) -> None:
        from confluent_kafka import Producer as KafkaProducer

        super().__init__(names)
        ports = [p.kafka_port for p in cluster.members.values()]
        self.failed: list[str] = []
        self._producer = KafkaProducer(
            {
                "bootstrap.servers": ",".join(f"127.0.0.1:{port}" for port in ports),
                "enable.idempotence": True,
                "linger.ms": 5,
                "message.timeout.ms": 60_000,
            }
        )

    def _delivered(self, err: Any, msg: Any) -> None:
        if err is not None:
            self.failed.append(str(err))
        else:
            self.acked[msg.topic()].append(msg.value().decode())

    def _run(self) -> None:
        for i in itertools.count():
            if self._stop.is_set():
                return
            name = self.names[i % len(self.names)]
            self._producer.produce(
                name, value=f"{name}:k:{i}".encode(), key=b"k", on_delivery=self._delivered
            )
            self._producer.poll(0.03)  # (about the others' pace)

    def __exit__(self, *exc: object) -> None:
        super().__exit__(*exc)
        assert self._producer.flush(60) == 0


class Reading:
    """A consumer on each queue from any member's URL, acking what it reads, in a thread."""

    def __init__(self, urls: list[str], names: list[str]) -> None:
        self.consumers = [Consumer(urls, n, prefetch=200) for n in names]
        self.read: dict[str, list[str]] = defaultdict(list)
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                for consumer in self.consumers:
                    batch = consumer.receive_many(200, timeout=0.02)
                    if batch:
                        consumer.ack(batch)
                        self.read[consumer.destination] += [m.body.decode() for m in batch]
        except SparkMQError as exc:  # (a consumer failed where it should have followed)
            self.errors.append(f"{type(exc).__name__}: {exc}")

    def __enter__(self) -> Reading:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(30)
        for consumer in self.consumers:
            consumer.close()


def _check_nothing_lost(
    load: Load,
    cluster: Cluster,
    read: dict[str, list[str]] | None = None,
    stomp: StompLoad | None = None,
    kafka: KafkaLoad | None = None,
) -> None:
    """Every acknowledged message stored once and read, each group's in the order sent
    (``read``: some already read, and acked, while destinations moved; what was delivered and
    not acked then comes again, a redelivery)."""
    for name in load.names:
        stored = DeltaTable(layout.messages_uri(str(cluster.root), name)).to_pyarrow_table()
        bodies = [b.decode() for b in stored["body"].to_pylist()]
        assert len(bodies) == len(set(bodies)), f"{name}: stored twice"
        earlier = (read or {}).get(name, [])
        # stored, and not read yet: what Delta has, and what was acknowledged (a member's hot
        # tier moves to Delta in the background: an acknowledged message may be there only)
        acked = set(load.acked[name])
        for other in (stomp, kafka):
            acked |= set(other.acked[name]) if other is not None else set()
        left = len((set(bodies) | acked) - set(earlier))
        got = earlier + [m.body.decode() for m in _drain(cluster.urls, name, expect=left)]
        if earlier:
            got = list(dict.fromkeys(got))
        assert len(got) == len(set(got)), f"{name}: stored twice: {len(got) - len(set(got))}"
        missing = set(load.acked[name]) - set(got)
        if stomp is not None:  # (receipted STOMP sends, through members that forwarded them)
            missing |= set(stomp.acked[name]) - set(got)
        if kafka is not None:  # (Kafka records a delivery report acknowledged)
            missing |= set(kafka.acked[name]) - set(got)
        assert not missing, f"{name}: acknowledged and lost: {sorted(missing)[:5]}"
        for group in ("g0", "g1", "g2", "g3", "s", "k"):
            mine = [int(b.rsplit(":", 1)[1]) for b in got if f":{group}:" in b]
            assert mine == sorted(mine), f"{name} {group} out of order"


def test_pipelined_batches_keep_each_group_s_order_while_their_queue_moves_back_and_forth(
    cluster: Cluster,
) -> None:
    """``send_batch(wait=False)`` of 40 messages in eight groups, eight batches on their way,
    while the queue moves between two members ten times: every acknowledged message is read
    once, each group's in the order sent. The batches refused by the member letting the queue
    go, and by the one still taking it on, go again in order. Before, the resender, writing
    those again, wrote a batch on a new stream while the one before it, refused again on the
    stream just given up, waited: the later batch was stored first (a group's run of messages
    after the next run; seen in most runs of this test)."""
    _one_on_two(cluster, "pipelined")
    groups = [f"g{i}" for i in range(8)]
    sent = dict.fromkeys(groups, 0)
    acked: list[str] = []
    errors: list[BaseException] = []
    stop = threading.Event()

    def send() -> None:
        with Producer(cluster.urls, timeout_s=60) as producer:
            waiting: list[tuple[Future, list[str]]] = []

            def settle(f: Future, bodies: list[str]) -> None:
                try:
                    f.result(60)
                    acked.extend(bodies)
                except Exception as exc:
                    errors.append(exc)

            while not stop.is_set():
                bodies = []
                for j in range(40):
                    group = groups[j % 8]
                    bodies.append(f"{group}:{sent[group]}")
                    sent[group] += 1
                table = pa.table(
                    {
                        "body": pa.array([b.encode() for b in bodies], pa.binary()),
                        "group_id": pa.array([b.split(":")[0] for b in bodies]),
                    }
                )
                f = producer.send_batch(table, destination="pipelined", wait=False)
                waiting.append((f, bodies))
                if len(waiting) >= 8:
                    settle(*waiting.pop(0))
            for f, bodies in waiting:
                settle(f, bodies)

    sender = threading.Thread(target=send)
    sender.start()
    try:
        _move_back_and_forth(cluster, "pipelined", 10)
    finally:
        stop.set()
        sender.join()
    assert not errors, errors[:3]
    got = [m.body.decode() for m in _drain(cluster.urls, "pipelined", expect=len(acked))]
    assert len(got) == len(set(got)) == len(acked) and set(got) == set(acked)
    for group in groups:
        mine = [int(b.split(":")[1]) for b in got if b.startswith(f"{group}:")]
        assert mine == sorted(mine), f"{group} out of order"


def test_a_hand_over_its_old_owner_does_not_make_in_time_is_fenced_anyway(
    cluster: Cluster,
) -> None:
    # the old owner is paused (for less than its session) when its queue is pinned elsewhere:
    # the new owner waits cluster.hand_over_wait_s for it to let go, then fences it anyway and
    # serves; the old owner, resumed, lets it go and loses nothing it acknowledged
    for m in "ab":
        cluster.start(m, **{"cluster.hand_over_wait_s": 0.5})
    owner, other = "b", "a"  # (a, the first, leads: it places while b is paused)
    with Admin(cluster.urls) as admin:
        admin.create_queue("w0")
        admin.pin("w0", owner)
    wait_for(lambda: "w0" in cluster.serving(owner)[owner], 20, "w0 on b")
    assert cluster.state("a")["leader"] == other
    with Producer(cluster.members[owner].url, linger_ms=0) as producer:
        for i in range(20):
            producer.send_sync(f"before-{i}", destination="w0")
    paused = cluster.members[owner].proc
    assert paused is not None
    os.kill(paused.pid, signal.SIGSTOP)
    try:
        with Admin(cluster.members[other].url) as admin:
            admin.pin("w0", other)
        # (served within its hand-over wait and a take-on: before the paused one's session ends)
        wait_for(lambda: "w0" in cluster.serving(other)[other], SESSION_S - 0.2, "w0 served")
        status = cluster.state(other)
        assert status["hand_overs_timed_out"] == 1 and status["awaiting_hand_over"] == []
        seen = _scrape(cluster.members[other])
        assert seen[("sparkmq_cluster_hand_over_timeouts_total", ())] == 1.0
        assert seen[("sparkmq_cluster_destinations_placing", ())] == 0.0
    finally:
        os.kill(paused.pid, signal.SIGCONT)
    assert f"{owner} has not handed w0 over within 0.5 s" in cluster.log(other)
    wait_for(lambda: "w0" not in cluster.serving(owner)[owner], 20, "the old owner let go")
    bodies = [m.body.decode() for m in _drain(cluster.urls, "w0", expect=20)]
    assert bodies == [f"before-{i}" for i in range(20)]


def test_killed_members_destinations_are_served_again_nothing_acknowledged_lost(
    cluster: Cluster,
) -> None:
    # one round in the suite (its time); SPARKMQ_CLUSTER_ROUNDS=10 for the issue's ten
    rounds = int(os.environ.get("SPARKMQ_CLUSTER_ROUNDS", "1"))
    names = [f"k{i}" for i in range(6)]
    _placed(cluster, "abc", names)
    served_again = []
    with (
        Load(cluster.urls, names) as load,
        StompLoad(cluster, names) as stomp,
        KafkaLoad(cluster, names) as kafka,
    ):
        for r in range(rounds):
            victim = "abc"[r % 3]
            enough = 50 * (r + 1)
            wait_for(lambda n=enough: load.count() > n, 30, "messages acknowledged")
            lost = cluster.serving()[victim]
            cluster.members[victim].kill()
            killed_at = time.monotonic()
            survivors = set(cluster.members) - {victim}
            wait_for(
                lambda s=survivors: _all_served(cluster, set(names), s),
                SESSION_S + 15,
                f"{victim}'s destinations served again",
            )
            served_again.append(time.monotonic() - killed_at)
            assert lost  # (it owned some)
            cluster.start(victim)  # back, with new epochs for what it is given
            wait_for(lambda: _all_served(cluster, set(names), {"a", "b", "c"}), 20, "rebalanced")
        before, before_stomp = load.count(), stomp.count()
        wait_for(lambda: load.count() > before + 30, 30, "sending after the last round")
        wait_for(lambda: stomp.count() > before_stomp + 30, 30, "STOMP sending after it")
        before_kafka = kafka.count()
        wait_for(lambda: kafka.count() > before_kafka + 30, 30, "Kafka producing after it")
    served_again.sort()
    print(f"served again after {served_again[len(served_again) // 2]:.2f} s (median), "
          f"{served_again[-1]:.2f} s (max), over {rounds} kills; {load.count()} SDK and "
          f"{stomp.count()} STOMP sends and {kafka.count()} Kafka records acknowledged, "
          f"STOMP connected {stomp.reconnects} time(s)")  # fmt: skip
    assert served_again[-1] < SESSION_S + 4, served_again
    assert stomp.count() > 60 and kafka.count() > 60 and not kafka.failed, kafka.failed[:3]
    _check_nothing_lost(load, cluster, stomp=stomp, kafka=kafka)


def test_a_member_paused_past_its_session_commits_nothing_after_it_was_replaced(
    cluster: Cluster,
) -> None:
    names = {f"p{i}" for i in range(4)}
    _placed(cluster, "ab", names)
    paused = sorted(cluster.serving()["b"])
    epochs = {n: cluster.state("a")["owners"][n]["epoch"] for n in paused}
    target = paused[0]
    # a send to b's destination, written to b just before it is paused: b takes it and stops
    producer = Producer(cluster.members["b"].url, linger_ms=0)
    producer.send_sync("before", destination=target)
    os.kill(cluster.members["b"].proc.pid, signal.SIGSTOP)  # type: ignore[union-attr]
    try:
        stuck = producer.send("while paused", destination=target)
        wait_for(lambda: cluster.serving("a")["a"] == names, SESSION_S + 15, "a serves all")
        new = {n: cluster.state("a")["owners"][n]["epoch"] for n in paused}
        assert all(new[n] > epochs[n] for n in paused)
    finally:
        os.kill(cluster.members["b"].proc.pid, signal.SIGCONT)  # type: ignore[union-attr]
    # b wakes: its commit is refused by a's fence (never acknowledged by b); the producer
    # goes where it is served now, and the message is stored once
    assert stuck.result(30) >= 1
    producer.close()
    table = DeltaTable(layout.messages_uri(str(cluster.root), target))
    assert (table.transaction_version(layout.OWNER_APP_ID) or 0) >= new[target]
    bodies = [m.body.decode() for m in _drain(cluster.members["a"].url, target, expect=2)]
    assert sorted(bodies) == ["before", "while paused"]
    # b said so, stepped aside, joined again, and is given its share with newer epochs
    wait_for(lambda: "ZooKeeper session lost" in cluster.log("b"), 10, "b lost its session")
    wait_for(lambda: _all_served(cluster, names, {"a", "b"}), 30, "b has its share again")
    again = cluster.owners("a")
    assert all(
        cluster.state("b")["owners"][n]["epoch"] > new.get(n, 0)
        for n, m in again.items()
        if m == "b" and n in new
    )


def test_a_member_added_takes_its_share_under_load_and_one_stopped_hands_over(
    cluster: Cluster,
) -> None:
    names = [f"j{i}" for i in range(6)]
    _placed(cluster, "a", names)
    # consumers read as their queues move to b and back: each follows its queue
    with Load(cluster.urls, names) as load, Reading(cluster.urls, names) as reading:
        wait_for(lambda: load.count() > 50, 30, "messages acknowledged")
        cluster.start("b")
        # (b's three are taken on one at a time, each as a lets it go: wait for all three)
        wait_for(
            lambda: (
                _all_served(cluster, set(names), {"a", "b"}) and len(cluster.serving()["b"]) == 3
            ),
            20,
            "b took its share, three of six",
        )
        before = load.count()
        wait_for(lambda: load.count() > before + 50, 30, "messages acknowledged on both")
        # a planned shutdown: b's destinations are placed on a while b still serves them
        assert cluster.members["b"].stop() == 0
        wait_for(lambda: _all_served(cluster, set(names), {"a"}), 20, "a serves everything")
        before = load.count()
        wait_for(lambda: load.count() > before + 50, 30, "messages acknowledged after")
        wait_for(lambda: sum(map(len, reading.read.values())) > 100, 30, "messages read")
    assert "handed its destinations over" in cluster.log("b")
    moved = cluster.serving()  # (all on a again)
    assert moved == {"a": set(names)}
    _check_nothing_lost(load, cluster, reading.read)


def test_zookeeper_away_moves_nothing_and_members_keep_serving(
    cluster: Cluster, zookeeper: ZooKeeper
) -> None:
    names = {f"z{i}" for i in range(4)}
    _placed(cluster, "ab", names)
    before = cluster.serving()
    zookeeper.stop()
    try:
        wait_for(
            lambda: {cluster.state(m)["session"] for m in ("a", "b")} == {"suspended"},
            10,
            "both suspended",
        )
        # its metrics and readiness say so: still ready (it serves what it owns)
        seen = _scrape(cluster.members["a"])
        assert seen[("sparkmq_cluster_session", (("state", "suspended"),))] == 1.0
        assert http(cluster.members["a"].http_url + "/readyz")[0] == 200
        # for twice a session: each member serves what it owns, and nothing moves
        deadline = time.monotonic() + 2 * SESSION_S
        with Producer(cluster.urls) as producer:
            while time.monotonic() < deadline:
                for n in sorted(names):
                    producer.send_sync("away", destination=n)
                assert cluster.serving() == before
    finally:
        zookeeper.start()

    # both connect again and serve what they served. (A member that reaches ZooKeeper only
    # after its session ran out, which ZooKeeper counts again from its own start, lets go of
    # everything, as a lost member must, and is given its share back: two of the four, not
    # always the two it had, as placement gives the other's smallest names; seen on a loaded
    # CI machine, where this waited for the same two for ever.)
    def recovered() -> bool:
        now = cluster.serving()
        return (
            {cluster.state(m)["session"] for m in ("a", "b")} == {"connected"}
            and _all_served(cluster, names, {"a", "b"})
            and sorted(map(len, now.values())) == [2, 2]
        )

    try:
        wait_for(recovered, 30, "both connected again, two destinations each")
    except AssertionError:
        raise AssertionError(
            f"not both connected, two each: {cluster.serving()}; the members' logs:\n"
            + "\n".join(f"--- {m}\n{cluster.log(m)[-6000:]}" for m in "ab")
        ) from None
    if cluster.serving() != before:  # (only once a session ran out)
        lost = [m for m in "ab" if "ZooKeeper session lost" in cluster.log(m)]
        assert lost, f"{before} became {cluster.serving()} though no session ran out"
        before = cluster.serving()
    seen = _scrape(cluster.members["a"])
    assert seen[("sparkmq_cluster_session", (("state", "connected"),))] == 1.0
    assert seen[("sparkmq_cluster_members", ())] == 2.0
    assert seen[("sparkmq_cluster_destinations", ())] == 4.0
    assert seen[("sparkmq_cluster_destinations_served", ())] == len(before["a"])
    assert seen[("sparkmq_cluster_moves_total", ())] >= len(before["a"])
    leaders = [_scrape(cluster.members[m])[("sparkmq_cluster_leader", ())] for m in "ab"]
    assert sorted(leaders) == [0.0, 1.0]


def test_a_stomp_client_of_one_member_is_served_every_destination_forwarded_to_its_owner(
    cluster: Cluster,
) -> None:
    """STOMP clients cannot follow a destination to its owner: the member they connected to
    forwards their sends and subscriptions there, acks and redeliveries included, and a
    subscription follows its destination when it moves."""
    from tests.stomp_kit import connect as stomp_connect
    from tests.stomp_kit import send_all

    names = [f"s{i}" for i in range(4)]
    _placed(cluster, "ab", names)
    via, other = "a", "b"  # the STOMP client's member; the topic's (pinned: it stays there)
    with Admin(cluster.urls) as admin:
        admin.create_topic("news")
        wait_for(lambda: "news" in cluster.owners("a"), 20, "the topic placed")
        admin.pin("news", other)
    wait_for(lambda: "news" in cluster.serving(other)[other], 20, "the topic on b")
    owners = cluster.owners("a")
    assert {owners[n] for n in names} == {"a", "b"}
    conn, inbox = stomp_connect(cluster.members[via].stomp_port)
    try:
        # sends: to the member's own queues, and forwarded to the other's
        for n in names:
            bodies = [f"{n}-{i}".encode() for i in range(20)]
            send_all(conn, inbox, f"/queue/{n}", bodies, **{"JMSXGroupID": "g", "tag": n})
        # subscriptions: delivered in order with their headers, each acked by its own id
        for n in names:
            conn.subscribe(f"/queue/{n}", id=f"sub-{n}", ack="client-individual")
        got = inbox.wait_messages(80)
        by_queue: dict[str, list[bytes]] = defaultdict(list)
        for frame in got:
            assert frame.headers["tag"] == frame.headers["destination"].rsplit("/", 1)[-1]
            by_queue[frame.headers["tag"]].append(frame.body)
            conn.ack(frame.headers["ack"], receipt=f"a-{frame.headers['ack']}")
        assert by_queue == {n: [f"{n}-{i}".encode() for i in range(20)] for n in names}
        inbox.wait(lambda: len(inbox.receipts) >= 80 + 80, "every ack's receipt")
        assert not inbox.errors
        # a queue of this member moves to the other while 5 of its messages are unacked: the
        # subscription follows it there, and those 5 come again (counted as redelivered)
        local = next(n for n in names if owners[n] == via)
        inbox.messages.clear()
        send_all(conn, inbox, f"/queue/{local}", [f"late-{i}".encode() for i in range(5)])
        unacked = inbox.wait_messages(5)
        with Admin(cluster.urls) as admin:
            admin.pin(local, other)
        again = inbox.wait_messages(10, timeout=20)[5:]
        assert [f.body for f in again] == [f.body for f in unacked]
        assert all(f.headers["JMSXDeliveryCount"] == "2" for f in again), again
        assert all(f.headers["redelivered"] == "true" for f in again)
        conn.ack(unacked[0].headers["ack"], receipt="stale")  # (the first delivery's: moved)
        inbox.wait_receipt("stale")
        for f in again:
            conn.ack(f.headers["ack"], receipt=f"r-{f.headers['ack']}")
        inbox.wait(lambda: all(f"r-{f.headers['ack']}" in inbox.receipts for f in again), "acks")
        # a topic another member serves, subscribed to here: what is published reaches it
        news = "news"
        # (its receipt comes once the subscription exists on the topic's member: what is
        # published from then on reaches it)
        conn.subscribe(f"/topic/{news}", id="sub-news", ack="auto", headers={"receipt": "s-n"})
        inbox.wait_receipt("s-n")
        inbox.messages.clear()
        with Producer(cluster.urls) as producer:
            for i in range(10):
                producer.send_sync(f"n-{i}", destination=news)
        assert [f.body for f in inbox.wait_messages(10)] == [f"n-{i}".encode() for i in range(10)]
        # a subscription to a partitioned queue by its name takes on partitions added (one
        # served here, one attached through the other member: broker.stomp_partitions_recheck_s)
        with Admin(cluster.urls) as admin:
            admin.create_queue("wide", partitions=2)
            conn.subscribe("/queue/wide", id="sub-wide", ack="auto", headers={"receipt": "s-w"})
            inbox.wait_receipt("s-w")
            assert admin.add_partitions("wide", 4)
            wait_for(lambda: {"wide~2", "wide~3"} <= set(cluster.owners("a")), 20, "placed")
            admin.pin("wide~2", via)
            admin.pin("wide~3", other)
        wait_for(lambda: "wide~3" in cluster.serving(other)[other], 20, "wide~3 on the other")
        inbox.messages.clear()
        with Producer(cluster.urls) as producer:
            for part in (2, 3):
                producer.send_sync(f"w-{part}", destination=f"wide~{part}")
        added = inbox.wait_messages(2, timeout=30)
        assert sorted(f.body for f in added) == [b"w-2", b"w-3"]
        assert {f.headers["subscription"] for f in added} == {"sub-wide"}
        # a temporary queue is its consumer's member's, reached from any member: the SDK
        # follows there, STOMP is forwarded there; once its consumer is gone, it is gone
        with Consumer(cluster.members[other].url, temporary=True) as replies:
            with Producer(cluster.members[via].url) as producer:
                producer.send_sync("via-sdk", destination=replies.destination)
            send_all(conn, inbox, f"/queue/{replies.destination}", [b"via-stomp"])
            got_replies = [replies.receive(10), replies.receive(10)]
            assert [m.body for m in got_replies if m] == [b"via-sdk", b"via-stomp"]
            replies.ack([m for m in got_replies if m])
        with (
            Producer(cluster.members[via].url) as producer,
            pytest.raises(DestinationNotFound, match="its consumer has gone"),
        ):
            producer.send_sync("too late", destination=replies.destination)
        # a transaction sending to a queue the other member serves commits here, and stores
        # its message there (before, it was refused: a STOMP client cannot commit elsewhere)
        remote = next(n for n in names if cluster.owners("a")[n] == other)
        inbox.messages.clear()
        conn.begin("tx1")
        conn.send(f"/queue/{remote}", b"in-tx", transaction="tx1")
        conn.commit("tx1", headers={"receipt": "c-tx1"})
        inbox.wait_receipt("c-tx1")
        (sent_in_tx,) = inbox.wait_messages(1)  # (to its subscription here, from b)
        assert sent_in_tx.body == b"in-tx"
        assert sent_in_tx.headers["destination"] == f"/queue/{remote}"
        conn.ack(sent_in_tx.headers["ack"], receipt="a-tx1")
        inbox.wait_receipt("a-tx1")
        assert not inbox.errors
        # ... but acknowledging there a message b serves is refused at COMMIT, saying what to do
        with Producer(cluster.urls) as producer:
            producer.send_sync(b"acked-in-tx", destination=remote)
        (delivered,) = inbox.wait_messages(2)[1:]
        conn.begin("tx2")
        conn.ack(delivered.headers["ack"], transaction="tx2")
        conn.commit("tx2")
        error = inbox.wait_error()
        assert f"which cluster member {other} serves".encode() in error.body, error.body
        assert b"acknowledge them outside the transaction" in error.body
    finally:
        with contextlib.suppress(Exception):
            conn.disconnect()
    # a destination the other member serves is of the kind recorded: a send naming the other
    # kind is refused here, saying which, as the owner would (nothing is forwarded)
    for wrong, says in [
        (f"/topic/{remote}", f"use /queue/{remote}"),
        ("/queue/news", "use /topic/news"),
    ]:
        conn, inbox = stomp_connect(cluster.members[via].stomp_port)
        try:
            conn.send(wrong, b"of the wrong kind", headers={"receipt": "wrong"})
            error = inbox.wait_error()
            assert says.encode() in error.body, error.body
            assert "wrong" not in inbox.receipts
        finally:
            with contextlib.suppress(Exception):
                conn.disconnect()
    # (the one acknowledged in the refused transaction is there again)
    assert [m.body for m in _drain(cluster.urls, remote, expect=1)] == [b"acked-in-tx"]
    # every acked message is gone, every other one is still there (none of the wrong kind)
    for n in names:
        assert _drain(cluster.urls, n, expect=0) == [], n


def test_a_stomp_subscriber_acking_while_its_queue_moves_back_and_forth_is_never_refused(
    cluster: Cluster,
) -> None:
    """A STOMP client of member a sends (each with a receipt) and another acks every message it
    gets (client-individual) while their queue moves between a and b ten times, so acks reach
    it here, forwarded there, and as it is let go. An ack that came as the queue moved on is
    not the client's mistake: its message comes again (counted twice here), and no ERROR ends
    the connection. Before, such an ack was refused with an ERROR (the member letting the
    queue go, or its forwarding consumer closed to follow it), the subscriber's connection
    closed, and it read nothing more."""
    from tests.stomp_kit import connect as stomp_connect

    _one_on_two(cluster, "moving")
    conn, inbox = stomp_connect(cluster.members["a"].stomp_port)
    conn.subscribe("/queue/moving", id="s", ack="client-individual")
    sent: list[bytes] = []
    errors: list[object] = []
    stop = threading.Event()

    def ack_all() -> None:
        done = 0
        while not stop.is_set() or done < len(inbox.messages):
            if done < len(inbox.messages):
                conn.ack(inbox.messages[done].headers["ack"])
                done += 1
            else:
                time.sleep(0.001)

    def send() -> None:
        sender, receipts = stomp_connect(cluster.members["a"].stomp_port)
        try:
            while not stop.is_set() and not receipts.errors:
                body = b"%d" % len(sent)
                sender.send("/queue/moving", body, headers={"receipt": body.decode()})
                receipts.wait_receipt(body.decode(), timeout=30)
                sent.append(body)
            errors.extend(receipts.errors)
        except Exception as exc:
            errors.append(exc)
        finally:
            sender.disconnect()

    threads = [threading.Thread(target=send), threading.Thread(target=ack_all)]
    for t in threads:
        t.start()
    marks = [0]

    def sent_on() -> None:  # (paced by the sends, not the clock: a loaded machine sends less)
        wait_for(lambda: len(sent) >= marks[-1] + 50 or errors, 30, "50 more sends")
        marks.append(len(sent))

    try:
        _move_back_and_forth(cluster, "moving", 10, before=sent_on)
    finally:
        stop.set()
        threads[0].join()
    try:
        inbox.wait(lambda: set(sent) <= {f.body for f in inbox.messages}, "every message", 30)
    except AssertionError as exc:
        missing = sorted(set(sent) - {f.body for f in inbox.messages}, key=int)
        with Admin(cluster.urls) as admin:
            stats = admin.stats("moving")
        raise AssertionError(
            f"{exc}; missing {missing[:20]} at marks {marks}; the queue: {stats}"
        ) from None
    finally:
        threads[1].join()
        conn.disconnect()
    assert not errors, errors
    assert not inbox.errors, [e.body for e in inbox.errors]
    assert len(sent) > 500


def test_an_idle_stomp_subscription_follows_each_move_of_its_queue(cluster: Cluster) -> None:
    """A STOMP subscriber of member a with nothing coming and nothing to acknowledge while its
    queue moves between a and b eight times: after each move the next message reaches it,
    once (each ack receipted before the next move). Its consumer is let go with the queue
    (or, forwarded to b, follows it back to a), with no frame from the client to wake its
    connection. Back on a, it is a's own consumer again: before, the forwarded consumer (an
    SDK consumer) followed the queue back to a by itself, over a's wire, and the subscription
    stayed on that loop, each delivery handled twice by a."""
    from tests.stomp_kit import connect as stomp_connect

    _one_on_two(cluster, "idle")
    conn, inbox = stomp_connect(cluster.members["a"].stomp_port)
    conn.subscribe("/queue/idle", id="s", ack="client-individual")
    try:
        with Producer(cluster.urls, destination="idle") as producer:
            for i in range(8):
                _move_back_and_forth(cluster, "idle", 1, gap_s=0)
                time.sleep(0.3)  # (the subscription follows, or waits, with nothing coming)
                producer.send(f"m{i}").result(30)
                inbox.wait(lambda n=i: len(inbox.messages) > n, f"m{i} after move {i}", 15)
                conn.ack(inbox.messages[i].headers["ack"], receipt=f"ack{i}")
                inbox.wait_receipt(f"ack{i}")  # (settled before the next move: not again)
        assert [f.body for f in inbox.messages] == [b"m%d" % i for i in range(8)]
        assert not inbox.errors, [e.body for e in inbox.errors]
    finally:
        conn.disconnect()
    # served by a's own consumer whenever the queue is there: never forwarded to a itself (a
    # consumer of it over a's wire, each delivery handled twice on a)
    assert "attached to idle over the wire" not in cluster.log("a")


def test_an_sdk_consumer_not_following_moves_ends_saying_where_its_queue_went(
    cluster: Cluster,
) -> None:
    """``reattach=False`` (what a member forwarding a STOMP subscription uses, as it follows
    moves itself): when the queue moves, the consumer is not attached again at the
    new owner; ``on_end`` hears the NotOwner naming where, once, and nothing more is
    delivered to it."""
    _one_on_two(cluster, "fixed")
    home = cluster.owners("a")["fixed"]
    away = "b" if home == "a" else "a"
    got: list[Any] = []
    ended: list[SparkMQError] = []
    consumer = Consumer(
        cluster.members[home].url,
        "fixed",
        on_message=got.append,
        reattach=False,
        on_end=ended.append,
    )
    try:
        with Producer(cluster.urls, destination="fixed") as producer:
            producer.send("before").result(30)
            wait_for(lambda: len(got) == 1, 15, "the first message")
            got[0].ack()
            with Admin(cluster.urls) as admin:
                admin.pin("fixed", away)
            wait_for(lambda: bool(ended), 15, "the consumer's end")
            producer.send("after").result(30)
        # (read by another consumer while the ended one is still open: had the ended one
        # been attached again, it would hold "after" and the drain would not get it)
        assert [m.body for m in _drain(cluster.urls, "fixed", expect=1)] == [b"after"]
        assert [m.body for m in got] == [b"before"]
        assert len(ended) == 1 and isinstance(ended[0], NotOwner), ended
        assert ended[0].fields.get("member") in (away, ""), ended[0].fields  # ("": being placed)
        assert isinstance(consumer.error, NotOwner)
    finally:
        consumer.close()


def test_a_stomp_subscription_forwarded_to_a_killed_member_goes_on_where_its_queue_goes(
    cluster: Cluster,
) -> None:
    """A STOMP subscriber of member a whose queue member b serves (forwarded there); b is
    SIGKILLed: once the queue is served again (by a), the subscription gets what b had
    delivered and not seen acknowledged, and what is sent after, with no ERROR."""
    from tests.stomp_kit import connect as stomp_connect

    _pinned_on_b(cluster, "orphan")
    conn, inbox = stomp_connect(cluster.members["a"].stomp_port)
    conn.subscribe("/queue/orphan", id="s", ack="client-individual", headers={"receipt": "sub"})
    inbox.wait_receipt("sub")
    try:
        with Producer(cluster.urls, destination="orphan") as producer:
            producer.send("before").result(30)
        inbox.wait(lambda: len(inbox.messages) == 1, "the first message", 15)
        cluster.members["b"].kill()  # (b's delivery not acknowledged: it comes again)
        wait_for(lambda: "orphan" in cluster.serving("a")["a"], SESSION_S + 20, "orphan on a")
        with Producer(cluster.members["a"].url, destination="orphan") as producer:
            producer.send("after").result(30)
        # (within seconds of being served again: before, the forwarded consumer tried its
        # dead owner for its whole timeout, 30 s, then ended the subscription with an ERROR)
        inbox.wait(lambda: b"after" in [f.body for f in inbox.messages], "after", 10)
        bodies = [f.body for f in inbox.messages]
        assert bodies.count(b"before") == 2 and bodies.count(b"after") == 1, bodies
        assert not inbox.errors, [e.body for e in inbox.errors]
    finally:
        conn.disconnect()


def _threads(proc: BrokerProcess) -> int:
    assert proc.proc is not None
    return len(os.listdir(f"/proc/{proc.proc.pid}/task"))


def test_a_member_forwarding_many_stomp_subscriptions_holds_no_thread_for_each(
    cluster: Cluster,
) -> None:
    """Sixty STOMP subscriptions of member a to a queue member b serves: each is a forwarded
    consumer, and all of them run on a's one forwarding loop (before, each was an SDK consumer
    with threads of its own: three each, 180 here). Each gets its share, its acks reach b,
    and once the client is gone b holds none of its consumers."""
    from tests.stomp_kit import connect as stomp_connect

    _pinned_on_b(cluster, "many")
    conn, inbox = stomp_connect(cluster.members["a"].stomp_port)
    try:
        conn.subscribe("/queue/many", id="s0", ack="client-individual", headers={"receipt": "r0"})
        inbox.wait_receipt("r0")  # (the forwarding's loop and its threads are started)
        with Admin(cluster.members["b"].url) as admin:
            wait_for(lambda: admin.stats("many")["consumers"] == 1, 15, "the first attached")
        first = _threads(cluster.members["a"])
        for i in range(1, 60):
            conn.subscribe("/queue/many", id=f"s{i}", ack="client-individual",
                           headers={"receipt": f"r{i}"})  # fmt: skip
        for i in range(1, 60):
            inbox.wait_receipt(f"r{i}")
        with Admin(cluster.members["b"].url) as admin:
            wait_for(lambda: admin.stats("many")["consumers"] == 60, 30, "all 60 attached at b")
        grown = _threads(cluster.members["a"]) - first
        assert grown <= 12, f"member a has {grown} more threads for 59 more subscriptions"
        with Producer(cluster.urls, destination="many") as producer:
            producer.send_batch([b"m%d" % i for i in range(120)])
        got = inbox.wait_messages(120, timeout=30)
        assert sorted(f.body for f in got) == sorted(b"m%d" % i for i in range(120))
        assert len({f.headers["subscription"] for f in got}) > 1  # (shared among them)
        for f in got:
            conn.ack(f.headers["ack"], receipt=f"a-{f.headers['ack']}")
        for f in got:
            inbox.wait_receipt(f"a-{f.headers['ack']}")
        assert not inbox.errors, [e.body for e in inbox.errors]
    finally:
        conn.disconnect()
    with Admin(cluster.members["b"].url) as admin:
        wait_for(lambda: admin.stats("many")["consumers"] == 0, 15, "every consumer detached")
        stats = admin.stats("many")
    assert (stats["acked"], stats["depth"]) == (120, 0), stats  # (acked there: none again)


def test_a_stomp_durable_subscriber_of_one_member_keeps_its_subscription_at_the_topic_s(
    cluster: Cluster,
) -> None:
    """A JMS durable subscriber over STOMP, connected to a member that does not serve the
    topic: its subscription is made at the topic's member, keeps what is published while it is
    away, and is removed there when it unsubscribes."""
    from tests.stomp_kit import connect as stomp_connect
    from tests.stomp_kit import send_all

    via, other = "a", "b"  # the client's member; the topic's
    _pinned_on_b(cluster, "alerts", "topic")
    port = cluster.members[via].stomp_port or 0
    durable = {"durable-subscription-name": "nightly"}
    conn, inbox = stomp_connect(port, headers={"client-id": "reader"})
    conn.subscribe("/topic/alerts", id="d", ack="client-individual",
                   headers={**durable, "receipt": "subscribed"})  # fmt: skip
    inbox.wait_receipt("subscribed")
    assert not inbox.errors, [e.body for e in inbox.errors]
    conn.disconnect()  # away: the subscription stays, at the topic's member
    with Admin(cluster.members[other].url) as admin:
        assert "reader.nightly" in admin.stats("alerts")["subscriptions"]
    publisher, published = stomp_connect(cluster.members[other].stomp_port or 0)
    send_all(publisher, published, "/topic/alerts", [b"while-away-1", b"while-away-2"])
    publisher.disconnect()
    conn, inbox = stomp_connect(port, headers={"client-id": "reader"})
    conn.subscribe("/topic/alerts", id="d", ack="client-individual", headers=durable)
    got = inbox.wait_messages(2)
    assert [m.body for m in got] == [b"while-away-1", b"while-away-2"]
    for m in got:
        conn.ack(m.headers["ack"], receipt=f"ack-{m.headers['ack']}")
    conn.unsubscribe("d", headers=durable, receipt="gone")
    inbox.wait_receipt("gone")
    assert not inbox.errors, [e.body for e in inbox.errors]
    with Admin(cluster.members[other].url) as admin:
        assert "reader.nightly" not in admin.stats("alerts")["subscriptions"]
    conn.disconnect()


def test_forwarding_checks_the_client_here_and_logs_in_there_as_the_member(
    cluster: Cluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With security on, the member a STOMP client reached checks that client's rights, then
    forwards with its own identity (its environment's credentials); a member without one is
    refused by the owner, and its client is told so clearly."""
    from tests.security_kit import PASSWORDS, security_settings
    from tests.stomp_kit import connect as stomp_connect
    from tests.stomp_kit import send_all

    secure = {k: str(v).lower() if isinstance(v, bool) else v
              for k, v in security_settings(tmp_path).items()}  # fmt: skip
    # the test's SDK calls and member a log in as alice (an admin); member b has no identity
    monkeypatch.setenv("SPARKMQ_USERNAME", "alice")
    monkeypatch.setenv("SPARKMQ_PASSWORD", PASSWORDS["alice"])
    cluster.start("a", **secure)
    cluster.start("b", env={"SPARKMQ_USERNAME": "", "SPARKMQ_PASSWORD": ""}, **secure)
    with Admin(cluster.urls) as admin:
        for name, member in (("bob.q", "b"), ("other.q", "b"), ("bob.here", "a")):
            admin.create_queue(name)
            admin.pin(name, member)
    wait_for(
        lambda: cluster.serving() == {"a": {"bob.here"}, "b": {"bob.q", "other.q"}},
        20,
        "pinned",
    )
    conn, inbox = stomp_connect(cluster.members["a"].stomp_port, login="bob",
                                passcode=PASSWORDS["bob"])  # fmt: skip
    try:
        send_all(conn, inbox, "/queue/bob.q", [b"forwarded"])  # (bob may; a forwards as alice)
        conn.send("/queue/other.q", b"not-bob's", headers={"receipt": "no"})
        assert b"'bob' may not produce on 'other.q'" in inbox.wait_error().body  # (here)
    finally:
        with contextlib.suppress(Exception):
            conn.disconnect()
    assert [m.body for m in _drain(cluster.urls, "bob.q", expect=1)] == [b"forwarded"]
    assert _drain(cluster.urls, "other.q", expect=0) == []
    conn, inbox = stomp_connect(cluster.members["b"].stomp_port, login="bob",
                                passcode=PASSWORDS["bob"])  # fmt: skip
    try:
        conn.send("/queue/bob.here", b"lost-nothing", headers={"receipt": "r"})
        error = inbox.wait_error()
        assert b"refused this member's forwarding" in error.body, error.body
    finally:
        with contextlib.suppress(Exception):
            conn.disconnect()
    conn, inbox = stomp_connect(cluster.members["b"].stomp_port, login="bob",
                                passcode=PASSWORDS["bob"])  # fmt: skip
    try:  # (a subscription is attached there in the background: its end is told as it comes)
        conn.subscribe("/queue/bob.here", id="s1")
        error = inbox.wait_error()
        assert b"subscription 's1' to /queue/bob.here ended" in error.body, error.body
        assert b"refused this member's forwarding" in error.body, error.body
    finally:
        with contextlib.suppress(Exception):
            conn.disconnect()
    assert "SPARKMQ_USERNAME" in cluster.log("b")
    assert _drain(cluster.urls, "bob.here", expect=0) == []


def test_kafka_clients_find_each_topic_on_its_owner_and_the_groups_on_the_offsets_owner(
    cluster: Cluster,
) -> None:
    """librdkafka against any member: Metadata names each topic's owner as its leader (node
    ids of the members), produces follow a topic's move, and a consumer group is coordinated
    by the member serving the offsets topic, its offsets kept when that topic moves."""
    from confluent_kafka import Consumer as KafkaConsumer
    from confluent_kafka import KafkaError, KafkaException, TopicPartition
    from confluent_kafka import Producer as KafkaProducer
    from confluent_kafka.admin import AdminClient

    from spark_mq.names import KAFKA_OFFSETS
    from spark_mq.transports.kafka.nodes import node_id

    _FINDING = {KafkaError.NOT_COORDINATOR, KafkaError.COORDINATOR_NOT_AVAILABLE}
    topics = [f"k{i}" for i in range(4)]
    for m in "abc":
        cluster.start(m)
    with Admin(cluster.urls) as admin:
        for t in topics:
            admin.create_topic(t)
    wait_for(lambda: _all_served(cluster, set(topics), {"a", "b", "c"}), 20, "4 topics placed")
    kafka = {m: f"127.0.0.1:{p.kafka_port}" for m, p in cluster.members.items()}
    sent: dict[str, list[str]] = defaultdict(list)
    failed: list[object] = []

    def produce(p: KafkaProducer, names: list[str], n: int, tag: str) -> None:
        for t in names:
            for i in range(n):
                value = f"{tag}-{i}"
                p.produce(t, value=value.encode(), key=b"k")
                sent[t].append(value)
        assert p.flush(30) == 0
        assert not failed, failed

    def delivered(err: object, _msg: object) -> None:
        if err is not None:
            failed.append(err)

    producer = KafkaProducer(
        {
            "bootstrap.servers": kafka["c"],
            "enable.idempotence": True,
            "linger.ms": 5,
            "on_delivery": delivered,
        }
    )
    # a topic a Kafka producer names is created, placed, and then led by its owner
    produce(producer, [*topics, "k-auto"], 30, "one")
    all_topics = [*topics, "k-auto"]
    owners = cluster.owners("a")
    meta = AdminClient({"bootstrap.servers": kafka["a"]}).list_topics(timeout=10)
    assert {b.id: f"{b.host}:{b.port}" for b in meta.brokers.values()} == {
        node_id(m): kafka[m] for m in "abc"
    }
    for t in all_topics:
        assert meta.topics[t].partitions[0].leader == node_id(owners[t]), t
    assert meta.cluster_id == f"sparkmq-{cluster.name}"

    # a topic moved under the producer: it is told NOT_LEADER_OR_FOLLOWER, and follows
    moved, to = "k0", next(m for m in "abc" if m != owners["k0"])
    with Admin(cluster.urls) as admin:
        admin.pin(moved, to)
    produce(producer, all_topics, 30, "two")
    wait_for(lambda: moved in cluster.serving(to)[to], 20, "k0 moved")
    produce(producer, all_topics, 10, "three")

    def consume(member: str, count: int) -> dict[str, list[str]]:
        c = KafkaConsumer(
            {
                "bootstrap.servers": kafka[member],
                "group.id": "g",
                "auto.offset.reset": "earliest",
                "enable.auto.commit": False,
                "fetch.wait.max.ms": 100,
                "heartbeat.interval.ms": 300,
            }
        )
        got: dict[str, list[str]] = defaultdict(list)
        read: dict[str, int] = {}
        assigned: list[int] = []  # (each assignment: a rebalance)
        try:
            c.subscribe(all_topics, on_assign=lambda _c, parts: assigned.append(len(parts)))
            deadline = time.monotonic() + 60
            while sum(map(len, got.values())) < count and time.monotonic() < deadline:
                msg = c.poll(0.5)
                if msg is not None and msg.error() is None:
                    got[msg.topic()].append(msg.value().decode())
                    read[msg.topic()] = msg.offset() + 1
            c.commit(asynchronous=False)
            offsets_owner = cluster.owners(member)[KAFKA_OFFSETS]
            (was,) = _groups(cluster.members[offsets_owner], "g")
            assert was["state"] == "Stable" and was["member_count"] == 1, was
            # the groups' offsets moved to another member: the next commit finds it there, and
            # the group's membership with them: the member carries on in its generation, not
            # rebalanced (explicit offsets: librdkafka skips a commit of what it committed)
            new_owner = next(m for m in "abc" if m != offsets_owner)
            with Admin(cluster.urls) as admin:
                admin.pin(KAFKA_OFFSETS, new_owner)
            wait_for(lambda: KAFKA_OFFSETS in cluster.serving(new_owner)[new_owner], 20, "moved")
            deadline = time.monotonic() + 30
            while True:
                try:
                    done = [TopicPartition(t, 0, o) for t, o in read.items()]
                    c.commit(offsets=done, asynchronous=False)
                    break
                except KafkaException as exc:  # (only while it finds the new coordinator)
                    assert exc.args[0].code() in _FINDING, exc
                    assert time.monotonic() < deadline, exc
                    msg = c.poll(0.5)
                    assert msg is None or msg.error() is not None, msg.value()  # (no repeat)
            (now,) = _groups(cluster.members[new_owner], "g")
            assert (now["state"], now["generation"]) == ("Stable", was["generation"]), now
            assert [m["member_id"] for m in now["members"]] == [
                m["member_id"] for m in was["members"]
            ]
            # heartbeats go on at the new coordinator: no rebalance after a few of them
            c.poll(0.9)  # (three heartbeats)
            (after,) = _groups(cluster.members[new_owner], "g")
            assert after["generation"] == was["generation"] and len(assigned) == 1, assigned
        finally:
            c.close()
        return got

    got = consume("a", 70 * len(all_topics))
    assert {t: got[t] for t in all_topics} == {t: sent[t] for t in all_topics}
    # a second consumer of the group, at another member, starts where the first committed
    produce(producer, all_topics, 5, "four")
    producer.flush(10)
    got = consume("b", 5 * len(all_topics))
    assert {t: got[t] for t in all_topics} == {t: sent[t][-5:] for t in all_topics}


def _groups(member: BrokerProcess, group: str) -> list[dict[str, Any]]:
    """``group`` as ``member``'s Kafka listener has it (none, or one)."""
    status, _, body = http(member.http_url + "/api/kafka/groups")
    assert status == 200, body
    return [g for g in json.loads(body) if g["group"] == group and g["kind"] == "consumer"]


def _scrape(member: BrokerProcess) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    status, _, body = http(member.http_url + "/metrics")
    assert status == 200, body
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(body.decode())
        for s in family.samples
    }


def test_members_reach_zookeeper_over_tls_with_their_own_certificates(tmp_path: Path) -> None:
    """ZooKeeper on its secureClientPort, asking each client for a certificate: a member with
    the cluster's CA and a certificate of its own joins and serves."""
    from tests.security_kit import Authority

    ca = Authority(tmp_path)
    server = ca.issue("zookeeper", server=True)
    keystore = tmp_path / "zookeeper-keystore.pem"  # (ZooKeeper reads its key and chain here)
    keystore.write_bytes(server.key_file.read_bytes() + server.cert_file.read_bytes())
    member = ca.issue("member-a", server=False)
    secure_zk = ZooKeeper(tmp_path / "zk", tls=(keystore, ca.cert_file))
    secure_zk.start()
    cluster = Cluster(secure_zk, tmp_path)
    try:
        cluster.start(
            "a",
            **{
                "cluster.zookeeper_tls": "true",
                "cluster.zookeeper_tls_ca_file": str(ca.cert_file),
                "cluster.zookeeper_tls_cert_file": str(member.cert_file),
                "cluster.zookeeper_tls_key_file": str(member.key_file),
            },
        )
        with Admin(cluster.urls) as admin:
            admin.create_queue("over-tls")
        wait_for(lambda: cluster.serving("a")["a"] == {"over-tls"}, 20, "served")
        assert cluster.state("a")["session"] == "connected"
        with Producer(cluster.urls) as producer:
            producer.send_sync("secret", destination="over-tls")
        assert [m.body for m in _drain(cluster.urls, "over-tls", expect=1)] == [b"secret"]
    finally:
        cluster.stop()
        secure_zk.stop()


def test_cluster_settings_are_checked(tmp_path: Path) -> None:
    from spark_mq.config import load_config

    with pytest.raises(ConfigError, match=r"ha\.broker_id"):
        load_config(overrides={"cluster.zookeeper": "127.0.0.1:1"})
    with pytest.raises(ConfigError, match=r"ha\.mode"):
        load_config(
            overrides={
                "cluster.zookeeper": "127.0.0.1:1",
                "ha.broker_id": "a",
                "ha.mode": "shared-store",
            }
        )
    with pytest.raises(ConfigError, match="persistence"):
        load_config(
            overrides={
                "cluster.zookeeper": "127.0.0.1:1",
                "ha.broker_id": "a",
                "broker.persistence": "memory",
            }
        )
    member = {"cluster.zookeeper": "127.0.0.1:1", "ha.broker_id": "a",
              "broker.data_dir": str(tmp_path)}  # fmt: skip
    ca = tmp_path / "ca.pem"
    ca.write_text("-")
    with pytest.raises(ConfigError, match="zookeeper_tls = false"):
        load_config(overrides={**member, "cluster.zookeeper_tls_ca_file": str(ca)})
    with pytest.raises(ConfigError, match="go together"):
        load_config(overrides={**member, "cluster.zookeeper_tls": True,
                               "cluster.zookeeper_tls_cert_file": str(ca)})  # fmt: skip
    nowhere = str(tmp_path / "nope.pem")
    with pytest.raises(ConfigError, match="no file"):
        load_config(overrides={**member, "cluster.zookeeper_tls": True,
                               "cluster.zookeeper_tls_ca_file": nowhere})  # fmt: skip


def _logged_at(text: str, *parts: str) -> str:
    """The time of the first log line holding every one of ``parts`` ("": none)."""
    line = next((ln for ln in text.splitlines() if all(p in ln for p in parts)), "")
    return line[:23]


def test_a_move_is_drained_by_the_old_owner_before_the_new_one_fences(
    cluster: Cluster,
) -> None:
    # an operator moves a queue back and forth under synchronous sends and a reader: each time
    # the old owner lets it go first (what it took committed, its consumers told where), and
    # only then does the new owner fence it, so no send or ack is refused by a fence
    names = ["h0", "h1"]
    _placed(cluster, "ab", names)
    moves = []
    with Load(cluster.urls, names) as load, Reading(cluster.urls, names) as reading:
        wait_for(lambda: load.count() > 50, 30, "messages acknowledged")
        with Admin(cluster.urls) as admin:
            for r in range(6):
                source = cluster.owners("a")["h0"]
                target = {"a": "b", "b": "a"}[source]
                admin.pin("h0", target)
                wait_for(lambda t=target: "h0" in cluster.serving(t)[t], 20, f"h0 on {target}")
                moves.append((source, target, cluster.state(target)["serving"]["h0"]))
                before = load.count()
                wait_for(lambda n=before: load.count() > n + 20, 30, f"sending after move {r}")
        wait_for(lambda: len(reading.read["h0"]) > 100, 30, "messages read")
    assert not load.errors, load.errors[:3]
    assert not reading.errors, reading.errors[:3]
    logs = {m: cluster.log(m) for m in "ab"}
    for source, target, epoch in moves:
        let_go = _logged_at(
            logs[source], "not serving h0 any more", f"member {target} at", f"(epoch {epoch})"
        )
        handed = _logged_at(logs[source], f"handed h0 over to {target} (epoch {epoch})")
        taking = _logged_at(logs[target], f"taking h0 on (epoch {epoch}) after its owner handed")
        served = _logged_at(logs[target], f"serving h0 from now on (epoch {epoch})")
        assert let_go and handed and served, (source, target, epoch)
        assert let_go <= taking <= served, (let_go, taking, served)
        # the line says where the take-on's time went (its parts add up to no more than it)
        line = next(
            ln for ln in logs[target].splitlines() if f"h0 from now on (epoch {epoch})" in ln
        )
        took = re.search(
            r"taken on in ([\d.]+)s \(fence ([\d.]+), transactions ([\d.]+), "
            r"delivery state ([\d.]+), duplicate cache ([\d.]+)\)",
            line,
        )
        assert took, line
        total, *parts = (float(x) for x in took.groups())
        assert sum(parts) <= total + 0.02, line
    for text in logs.values():
        assert "another member took it over" not in text  # (a sync refused by a fence)
        assert "a newer owner fenced it" not in text
        assert "has not handed" not in text  # (a hand-over that timed out)
    _check_nothing_lost(load, cluster, reading.read)


def test_a_kafka_producer_s_first_batch_after_a_move_follows_on_from_what_the_log_holds(
    cluster: Cluster,
) -> None:
    """An idempotent producer's topic moves to another member, and the first batch the new
    owner gets from it skips sequences the log lacks (a batch refused as the old owner let the
    topic go, still to be sent again): OUT_OF_ORDER_SEQUENCE_NUMBER, as a Kafka broker's new
    leader answers from the producer state it rebuilt from the log. Before, the new owner took
    it, and librdkafka, which counts a later batch's acknowledgement as every earlier one's,
    reported the missing batch delivered: it was never stored (four messages in a few hundred
    moves). The missing batch, sent again, is taken, then the refused one, in order."""
    from tests.kafka_kit import RawKafka, read_from

    _one_on_two(cluster, "sequenced", kind="topic")
    old = cluster.owners("a")["sequenced"]
    new = "b" if old == "a" else "a"
    values = [b"%d" % i for i in range(12)]
    raw = RawKafka(cluster.members[old].kafka_port)
    try:
        assert raw.produce_sequenced("sequenced", 77, 0, values[:4]) == (0, 0)
    finally:
        raw.close()
    with Admin(cluster.urls) as admin:
        admin.pin("sequenced", new)
    wait_for(lambda: "sequenced" in cluster.serving(new)[new], 20, "moved")
    raw = RawKafka(cluster.members[new].kafka_port)
    try:
        err, _ = raw.produce_sequenced("sequenced", 77, 8, values[8:])
        assert err == 45  # OUT_OF_ORDER_SEQUENCE_NUMBER: 4 to 7 are not stored
        assert raw.produce_sequenced("sequenced", 77, 4, values[4:8]) == (0, 4)
        assert raw.produce_sequenced("sequenced", 77, 8, values[8:]) == (0, 8)
        assert raw.produce_sequenced("sequenced", 77, 4, values[4:8]) == (0, 4)  # (resent: once)
    finally:
        raw.close()
    got = read_from(cluster.members[new].kafka_port, "sequenced", 0, 13, timeout=5)
    assert [m.value() for m in got] == values


def test_kafka_clients_follow_a_move_from_the_old_owner_s_answer_without_asking_metadata(
    cluster: Cluster,
) -> None:
    """KIP-951: a member asked to produce to or fetch from a topic it does not serve answers
    NOT_LEADER_OR_FOLLOWER naming the leader (its node and epoch, as Metadata has them) and
    where that node is. librdkafka's producer and consumer take the new leader from that
    answer, before any Metadata answer comes (they still ask Metadata too, and do not wait for
    it): a move costs them one round trip. Before, the answer named no leader, and they waited
    for Metadata's. The consumer fetches by topic id (Fetch 16), and checks its position at
    the new leader (OffsetForLeaderEpoch): nothing is truncated, it reads on from there. What
    they send the new owner while it takes the topic on waits until it serves it."""
    from confluent_kafka import TopicPartition
    from kio.schema.errors import ErrorCode

    from spark_mq.transports.kafka.link import topic_id
    from spark_mq.transports.kafka.nodes import node_id
    from tests.kafka_kit import (
        DebugLines,
        KioConnection,
        consumer,
        epoch_end,
        fetch_by_id,
        poll_n,
        produce_all,
        produce_by_id,
        producer,
    )

    _one_on_two(cluster, "followed", kind="topic")
    old = cluster.owners("a")["followed"]
    new = "b" if old == "a" else "a"
    epoch = cluster.state("a")["owners"]["followed"]["epoch"]
    elsewhere = cluster.members[new].kafka_port
    for version in (10, 12, 13):  # (Produce: by name, then by id)
        asked = topic_id("followed") if version >= 13 else "followed"
        answer = produce_by_id(elsewhere, version, asked, [b"refused"])
        (part,) = answer.responses[0].partition_responses
        assert part.error_code == ErrorCode.not_leader_or_follower
        assert (part.current_leader.leader_id, part.current_leader.leader_epoch) == (
            node_id(old),
            epoch,
        )
        (there,) = [e for e in answer.node_endpoints if e.node_id == node_id(old)]
        assert there.port == cluster.members[old].kafka_port
    answer = fetch_by_id(elsewhere, 16, topic_id("followed"), 0)
    (part,) = answer.responses[0].partitions
    assert part.error_code == ErrorCode.not_leader_or_follower
    leader = part.current_leader
    assert (leader.leader_id, leader.leader_epoch) == (node_id(old), epoch)
    assert [e.port for e in answer.node_endpoints] == [cluster.members[old].kafka_port]

    debug = {"debug": "metadata,protocol,msg,fetch", "topic.metadata.refresh.interval.ms": 600_000}
    plog, clog = DebugLines(), DebugLines()
    port = cluster.members[old].kafka_port
    p = producer(port, logger=plog.logger, **debug)
    c = consumer(port, logger=clog.logger, **debug)
    values = [b"%d" % i for i in range(200)]
    stop = threading.Event()

    def send() -> None:  # (one at a time, each acknowledged, through the move)
        while not stop.is_set():
            produce_all(p, "followed", [b"%d" % len(values)])
            values.append(b"%d" % len(values))

    sender = threading.Thread(target=send)
    try:
        produce_all(p, "followed", values)
        c.assign([TopicPartition("followed", 0, 0)])
        got = poll_n(c, 200)
        p.poll(0.2)
        since_p, since_c = len(plog.lines), len(clog.lines)
        sender.start()
        with Admin(cluster.urls) as admin:
            admin.pin("followed", new)
        wait_for(lambda: "followed" in cluster.serving(new)[new], 20, "moved")
        served = len(values)
        wait_for(lambda: len(values) >= served + 100, 20, "sent on at the new owner")
        stop.set()
        sender.join(30)
        got += poll_n(c, len(values) - 200)
    finally:
        stop.set()
        c.close()
    assert [m.value() for m in got] == values
    assert [m.offset() for m in got] == list(range(len(values)))
    moved = cluster.state("a")["owners"]["followed"]["epoch"]
    assert moved > epoch
    with KioConnection(cluster.members[new].kafka_port) as there:  # (KIP-320)
        assert epoch_end(there, "followed", moved, 0) == (0, 0, len(values))
        assert epoch_end(there, "followed", epoch, 0) == (74, -1, -1)  # FENCED_LEADER_EPOCH
    with KioConnection(cluster.members[old].kafka_port) as before:
        assert epoch_end(before, "followed", moved, 0) == (6, -1, -1)  # NOT_LEADER_OR_FOLLOWER
    assert any("Received OffsetForLeaderEpochResponse" in line for line in clog.lines[since_c:])
    # the new owner held what came while it took the topic on, and refused none of it
    assert not plog.refused_at(since_p, node_id(new)) and not clog.refused_at(since_c, node_id(new))
    assert plog.learned_leader(since_p, node_id(new), moved), plog.lines[since_p:]
    assert clog.learned_leader(since_c, node_id(new), moved), clog.lines[since_c:]


def _a_topic_on_two_members(cluster: Cluster, name: str, **settings: object) -> tuple[str, str]:
    """Members a and b, their duplicate caches 4 ids, and topic ``name`` placed on one:
    ``(its owner, the other)``."""
    for m in ("a", "b"):
        cluster.start(m, **{"duplicates.cache_size": 4}, **settings)
    with Admin(cluster.urls) as admin:
        admin.create_topic(name)
    wait_for(lambda: any(name in s for s in cluster.serving().values()), 20, "placed")
    old = cluster.owners("a")[name]
    return old, "b" if old == "a" else "a"


def test_a_topic_s_producer_state_goes_with_it_however_long_its_log(cluster: Cluster) -> None:
    """The old owner hands on where each producer got to (its producer state) when it lets a
    topic go, and the new owner checks first batches against that, however much longer the log
    is than its duplicate cache (here 4 ids; in use 20,000): a producer that sent nothing yet
    must begin at sequence 0, and one that did must go on where it got to. Before, a log
    longer than the cache left the new owner unable to tell, and it took any first batch: a
    new producer whose first batches the old owner refused while it let the topic go could
    have a later one taken first, leaving a gap that librdkafka reports delivered."""
    from tests.kafka_kit import RawKafka, read_from

    old, new = _a_topic_on_two_members(cluster, "long")
    raw = RawKafka(cluster.members[old].kafka_port)
    try:
        assert raw.produce_sequenced("long", 77, 0, [b"77-0", b"77-1"]) == (0, 0)
        for i in range(5):  # another producer's, its ids pushing 77's out of the cache
            assert raw.produce_sequenced("long", 66, 2 * i, [b"66", b"66"]) == (0, 2 + 2 * i)
    finally:
        raw.close()
    with Admin(cluster.urls) as admin:
        admin.pin("long", new)
    wait_for(lambda: "long" in cluster.serving(new)[new], 20, "moved")
    raw = RawKafka(cluster.members[new].kafka_port)
    try:
        assert raw.produce_sequenced("long", 88, 5, [b"88-5"]) == (45, -1)  # (it sent none)
        assert raw.produce_sequenced("long", 77, 3, [b"77-3"]) == (45, -1)  # (2 is missing)
        assert raw.produce_sequenced("long", 88, 0, [b"88-0"]) == (0, 12)
        assert raw.produce_sequenced("long", 77, 2, [b"77-2"]) == (0, 13)
        assert raw.produce_sequenced("long", 66, 10, [b"66"]) == (0, 14)
    finally:
        raw.close()
    got = read_from(cluster.members[new].kafka_port, "long", 12, 3, timeout=5)
    assert [m.value() for m in got] == [b"88-0", b"77-2", b"66"]
    assert "could not hand" not in cluster.log(old)


@pytest.mark.parametrize("hot_tier", ["true", "false"], ids=["hot-tier", "no-hot-tier"])
def test_a_lost_member_s_topics_keep_their_producer_state(cluster: Cluster, hot_tier: str) -> None:
    """A member's commits to Delta (its hot tier's moves, or without one each flush) carry the
    producer state of each topic it serves (at most every second, when it changed), so a
    member that takes a topic over from a member killed begins from that and the rows after
    it, however long the log: a producer that sent nothing must begin at 0. Before, the new
    owner could not tell once the log was longer than its duplicate cache (4 ids here), and
    took a first batch at any sequence (without a hot tier, until this step, still)."""
    from deltalake import DeltaTable

    from spark_mq.journal.delta_store import PRODUCERS_KEY
    from tests.kafka_kit import RawKafka

    old, new = _a_topic_on_two_members(cluster, "kept", **{"journal.hot_tier": hot_tier})
    raw = RawKafka(cluster.members[old].kafka_port)
    try:
        for i in range(5):
            assert raw.produce_sequenced("kept", 66, 2 * i, [b"66", b"66"]) == (0, 2 * i)
    finally:
        raw.close()
    log = DeltaTable(str(cluster.root / "destinations" / "kept" / "messages"))

    def carried() -> bool:
        log.update_incremental()
        return any(PRODUCERS_KEY in c for c in log.history(5))

    wait_for(carried, 10, "a commit carrying the producer state")
    raw = RawKafka(cluster.members[old].kafka_port)
    try:  # (two rows after it: the new owner reads them back)
        assert raw.produce_sequenced("kept", 77, 0, [b"77-0", b"77-1"]) == (0, 10)
    finally:
        raw.close()
    cluster.members[old].kill()
    wait_for(lambda: "kept" in cluster.serving(new)[new], SESSION_S + 15, "taken over")
    raw = RawKafka(cluster.members[new].kafka_port)
    try:
        assert raw.produce_sequenced("kept", 88, 5, [b"88-5"]) == (45, -1)  # (it sent none)
        assert raw.produce_sequenced("kept", 77, 3, [b"77-3"]) == (45, -1)  # (2 is missing)
        assert raw.produce_sequenced("kept", 66, 10, [b"66"]) == (0, 12)
        assert raw.produce_sequenced("kept", 88, 0, [b"88-0"]) == (0, 13)
    finally:
        raw.close()


def test_an_idempotent_kafka_producer_keeps_its_order_across_moves_back_and_forth(
    cluster: Cluster,
) -> None:
    """librdkafka, idempotent, five requests in flight, sending all along while its topic is
    moved from member to member and back: every message stored once and in the order sent,
    and none failed. A batch refused while the topic is being placed makes those behind it
    wait (OUT_OF_ORDER_SEQUENCE_NUMBER: the client sends them again after it), and what a
    member expected of the producer before the topic went away is not held against it when
    the topic comes back (before, that was a fatal error for the producer). Looped with 20
    moves on a busy machine, a batch was lost about once in five runs until each member's
    first batch of a term was checked against the log (the test above)."""
    from confluent_kafka import Consumer as KafkaConsumer
    from confluent_kafka import KafkaException, TopicPartition
    from confluent_kafka import Producer as KafkaProducer

    _one_on_two(cluster, "ordered", kind="topic")
    kafka = {m: f"127.0.0.1:{p.kafka_port}" for m, p in cluster.members.items()}
    failed: list[object] = []
    sent: list[bytes] = []
    stop = threading.Event()

    def delivered(err: object, _msg: object) -> None:
        if err is not None:
            failed.append(err)

    producer = KafkaProducer(
        {
            "bootstrap.servers": kafka["a"],
            "enable.idempotence": True,
            "max.in.flight.requests.per.connection": 5,
            "linger.ms": 2,
            "on_delivery": delivered,
        }
    )

    def send() -> None:
        i = 0
        while not stop.is_set():
            value = b"%d" % i
            try:
                producer.produce("ordered", value=value, key=b"k")
            except KafkaException as exc:  # (a fatal error: the producer is done)
                failed.append(exc)
                return
            sent.append(value)
            producer.poll(0)
            i += 1
            time.sleep(0.0005)

    sender = threading.Thread(target=send)
    sender.start()
    try:
        owner = cluster.owners("a")["ordered"]
        for _ in range(6):  # there and back, three times
            time.sleep(0.3)
            owner = "b" if owner == "a" else "a"
            with Admin(cluster.urls) as admin:
                admin.pin("ordered", owner)
            wait_for(lambda o=owner: "ordered" in cluster.serving(o)[o], 20, "moved")
        time.sleep(0.5)
    finally:
        stop.set()
        sender.join()
    assert producer.flush(30) == 0
    assert not failed, failed[:3]
    consumer = KafkaConsumer(
        {"bootstrap.servers": kafka["b"], "group.id": "reader", "enable.auto.commit": False}
    )
    got: list[bytes] = []
    try:
        consumer.assign([TopicPartition("ordered", 0, 0)])
        deadline = time.monotonic() + 60
        while len(got) < len(sent) and time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is not None and msg.error() is None:
                got.append(msg.value())
        time.sleep(0.2)
        extra = consumer.poll(0.5)
        assert extra is None or extra.error() is not None, extra.value()  # (nothing twice)
    finally:
        consumer.close()
    assert len(sent) > 1000
    assert got == sent


def test_a_kafka_transaction_commits_at_the_coordinating_member_and_not_over_two(
    cluster: Cluster,
) -> None:
    """A transactional producer reaching either member finds the coordinating one (the
    groups' offsets owner) and commits there: records and offsets of topics it serves. A
    partition served by the other member is refused (an abortable error), the member's log
    saying to pin it; the abort leaves nothing. When the offsets move to the other member,
    the transaction open then is aborted and the producer carries on there. An admin tool
    describing the transaction at the other member is sent to the coordinating one."""
    from confluent_kafka import Consumer as KafkaConsumer
    from confluent_kafka import KafkaError, KafkaException, TopicPartition
    from confluent_kafka import Producer as KafkaProducer
    from kafka import KafkaAdminClient

    from spark_mq.names import KAFKA_OFFSETS
    from tests.kafka_kit import refused_transaction

    for m in "ab":
        cluster.start(m)
    kafka = {m: f"127.0.0.1:{p.kafka_port}" for m, p in cluster.members.items()}
    first = KafkaProducer({"bootstrap.servers": kafka["b"], "transactional.id": "tx-first"})
    first.init_transactions(30)  # (the offsets topic placed: its member coordinates)
    coordinator, other = "a", "b"
    with Admin(cluster.urls) as admin:  # (pinned: placement's balancing moves none of them)
        admin.pin(KAFKA_OFFSETS, coordinator)
        for name, member in (("tx-here", coordinator), ("tx-there", other), ("tx-in", other)):
            admin.create_topic(name)
            admin.pin(name, member)
    wait_for(
        lambda: (
            {KAFKA_OFFSETS, "tx-here"} <= cluster.serving(coordinator)[coordinator]
            and {"tx-there", "tx-in"} <= cluster.serving(other)[other]
        ),
        20,
        "pinned",
    )
    producer = KafkaProducer({"bootstrap.servers": kafka[other], "transactional.id": "tx-c"})
    producer.init_transactions(30)
    group = KafkaConsumer({"bootstrap.servers": kafka[other], "group.id": "tx-g"})
    try:
        producer.begin_transaction()
        for i in range(5):
            producer.produce("tx-here", f"h{i}".encode())
        producer.send_offsets_to_transaction(
            [TopicPartition("tx-in", 0, 7)], group.consumer_group_metadata(), 30
        )
        producer.commit_transaction(30)
        assert group.committed([TopicPartition("tx-in", 0)], 10)[0].offset == 7
    finally:
        group.close()
    # an admin tool asking the other member is sent to the coordinating one (KIP-664)
    tools = KafkaAdminClient(bootstrap_servers=kafka[other])
    try:
        described = tools.describe_transactions(["tx-c"])["tx-c"]
        ports = {b["broker_id"]: b["port"] for b in tools.describe_cluster()["brokers"]}
    finally:
        tools.close()
    assert described.state.value == "CompleteCommit"
    assert ports[described.coordinator_id] == cluster.members[coordinator].kafka_port
    producer.begin_transaction()
    assert KafkaError.POLICY_VIOLATION in refused_transaction(producer, "tx-there", b"elsewhere")
    assert "must all be served by the member coordinating transactions" in cluster.log(coordinator)
    producer.abort_transaction(30)
    # the offsets (and so the coordinator) move while a transaction is open: it is aborted,
    # the producer begins again at the new coordinator
    producer.begin_transaction()
    producer.produce("tx-here", b"open when it moved")
    assert producer.flush(10) == 0
    with Admin(cluster.urls) as admin:
        admin.pin(KAFKA_OFFSETS, other)
    wait_for(lambda: KAFKA_OFFSETS in cluster.serving(other)[other], 20, "offsets moved")
    with pytest.raises(KafkaException) as refused:
        producer.commit_transaction(30)
    assert refused.value.args[0].txn_requires_abort(), refused.value.args[0]
    producer.abort_transaction(30)
    producer.begin_transaction()
    producer.produce("tx-there", b"t0")
    producer.commit_transaction(30)
    reader = KafkaConsumer(
        {"bootstrap.servers": kafka[other], "group.id": "r", "isolation.level": "read_committed"}
    )
    try:
        for topic, want in (
            ("tx-here", [f"h{i}".encode() for i in range(5)]),
            ("tx-there", [b"t0"]),
        ):
            reader.assign([TopicPartition(topic, 0, 0)])
            got: list[bytes] = []
            deadline = time.monotonic() + 20
            while len(got) < len(want) and time.monotonic() < deadline:
                msg = reader.poll(0.2)
                if msg is not None and msg.error() is None:
                    got.append(msg.value())
            assert got == want, topic
            end = reader.get_watermark_offsets(TopicPartition(topic, 0), timeout=10)[1]
            assert end == len(want), topic  # (nothing of the aborted ones)
    finally:
        reader.close()


def test_kafka_share_consumers_at_two_members_share_a_queue_partitioned_over_both(
    cluster: Cluster,
) -> None:
    """librdkafka share consumers (KIP-932), one bootstrapped at each member, in one share
    group, on a queue of four partitions placed on both members: every record comes once,
    from every partition, fetched from each partition's owner, and each accepted one is gone
    from the queue. Then a partition and the groups' coordinator (the offsets topic) move to
    the other member (the partition and back): the consumers follow both
    (NOT_LEADER_OR_FOLLOWER naming the new leader; NOT_COORDINATOR, and they join the new
    coordinator) and get what comes next, each once; a connection whose consumer was let go
    when its partition moved away attaches anew when it comes back (before, it fetched nothing
    more from it). Before that, a cluster member did not offer share groups at all
    (ApiVersions left them out), so these consumers got nothing."""
    from spark_mq.names import KAFKA_OFFSETS
    from tests.test_kafka import _share_consumer, _share_poll

    for m in "ab":
        cluster.start(m)
    with Admin(cluster.urls) as admin:
        admin.create_queue("jobs", partitions=4)
    parts = {f"jobs~{i}" for i in range(4)}
    wait_for(lambda: _all_served(cluster, parts, {"a", "b"}), 20, "4 partitions on 2 members")

    def send(start: int, n: int) -> list[bytes]:
        with Producer(cluster.urls, destination="jobs") as producer:
            futures = [
                producer.send(f"job-{i}", group_id=f"k{i % 16}") for i in range(start, start + n)
            ]
            assert all(f.result(30) >= 0 for f in futures)
        return [f"job-{i}".encode() for i in range(start, start + n)]

    sent = send(0, 80)
    members = [_share_consumer(cluster.members[m].kafka_port, "workers") for m in "ab"]
    for c in members:
        c.subscribe(["jobs"])
    try:
        got = _share_poll(members, 80, timeout=60)
        values = sorted(m.value() for _, m in got)
        assert values == sorted(sent), len(values)  # each once
        assert {m.partition() for _, m in got} == {0, 1, 2, 3}
        # (one at a time; the partition away and back, where its consumer was let go)
        for start, moved in ((80, "jobs~0"), (160, "jobs~0"), (240, KAFKA_OFFSETS)):
            to = "b" if cluster.owners("a")[moved] == "a" else "a"
            with Admin(cluster.urls) as admin:
                admin.pin(moved, to)
            wait_for(lambda m=moved, t=to: m in cluster.serving(t)[t], 20, f"{moved} moved")
            more = send(start, 80)
            got = _share_poll(members, 80, timeout=60)
            values = sorted(m.value() for _, m in got)
            assert values == sorted(more), (moved, len(values))  # each once, after the move
            assert 0 in {m.partition() for _, m in got}
    finally:
        for c in members:
            c.close()
    with Admin(cluster.urls) as admin:
        assert sum(admin.stats(p)["depth"] for p in parts) == 0


def test_kafka_share_consumers_lose_nothing_while_partitions_move_under_them(
    cluster: Cluster,
) -> None:
    """Share consumers at both members read a 2-partition queue while an SDK producer sends to
    it and its partitions move back and forth between the members six times: every record
    sent comes (what had been acquired, or acknowledged too late, at a partition's old owner
    comes again at the new one: at least once, as KIP-932 promises), and the queue is empty
    at the end: nothing was left acquired by a consumer a move let go."""
    from tests.test_kafka import _share_consumer, _share_poll

    for m in "ab":
        cluster.start(m)
    with Admin(cluster.urls) as admin:
        admin.create_queue("work", partitions=2)
    parts = {"work~0", "work~1"}
    wait_for(lambda: _all_served(cluster, parts, {"a", "b"}), 20, "2 partitions on 2 members")
    sent: list[bytes] = []
    stop = threading.Event()
    errors: list[BaseException] = []

    def produce() -> None:
        try:
            with Producer(cluster.urls, destination="work") as producer:
                while not stop.is_set():
                    body = f"w-{len(sent)}"
                    producer.send(body, group_id=f"k{len(sent) % 8}").result(30)
                    sent.append(body.encode())
                    time.sleep(0.002)
        except BaseException as exc:
            errors.append(exc)

    members = [_share_consumer(cluster.members[m].kafka_port, "movers") for m in "ab"]
    for c in members:
        c.subscribe(["work"])
    got: list[bytes] = []
    sender = threading.Thread(target=produce)
    sender.start()
    try:
        for i in range(6):
            got += [m.value() for _, m in _share_poll(members, 10**9, timeout=0.8)]
            moved = f"work~{i % 2}"
            to = "b" if cluster.owners("a")[moved] == "a" else "a"
            with Admin(cluster.urls) as admin:
                admin.pin(moved, to)
            wait_for(lambda m=moved, t=to: m in cluster.serving(t)[t], 20, f"{moved} moved")
        stop.set()
        sender.join()
        deadline = time.monotonic() + 60
        while not set(sent) <= set(got) and time.monotonic() < deadline:
            got += [m.value() for _, m in _share_poll(members, 10**9, timeout=0.5)]
    finally:
        stop.set()
        sender.join()
        for c in members:
            c.close()
    assert not errors, errors
    assert len(sent) > 100
    missing = sorted(set(sent) - set(got))
    assert not missing, (len(missing), missing[:10])
    assert set(got) <= set(sent)
    with Admin(cluster.urls) as admin:
        wait_for(lambda: sum(admin.stats(p)["depth"] for p in parts) == 0, 20, "all accepted")


def test_a_dead_letter_goes_to_its_queue_on_another_member(cluster: Cluster) -> None:
    """A message delivered too often is copied to its dead-letter queue, which another member
    serves: the copy goes there (forwarded, as a STOMP client's send is) and the original is
    settled. Before, the member refused to store the copy while the queue was another's (the
    timer's every round logged an error), and the message stayed until both happened to be on
    one member."""
    for m in ("a", "b"):
        cluster.start(m)
    with Admin(cluster.urls) as admin:
        admin.create_queue("poisoned", max_delivery_attempts=1)
        admin.create_queue("DLQ.poisoned")  # (placed with its queue unless pinned elsewhere)
        admin.pin("poisoned", "a")
        admin.pin("DLQ.poisoned", "b")
    wait_for(lambda: "poisoned" in cluster.serving("a")["a"], 20, "poisoned on a")
    wait_for(lambda: "DLQ.poisoned" in cluster.serving("b")["b"], 20, "its DLQ on b")
    with Producer(cluster.urls, destination="poisoned") as producer:
        producer.send_sync(b"bad")
    with Consumer(cluster.urls, "poisoned") as consumer:
        (got,) = consumer.receive_many(1, timeout=10)
        consumer.nack(got).result(timeout=10)
    (dead,) = _drain(cluster.urls, "DLQ.poisoned", expect=1)
    assert dead.body == b"bad"
    assert dead.headers["sparkmq.original_destination"] == "poisoned"
    with Admin(cluster.urls) as admin:
        wait_for(lambda: admin.stats("poisoned")["depth"] == 0, 10, "the original settled")
    assert "could not dispose" not in cluster.log("a")


def test_a_transaction_s_sends_to_another_member_are_stored_there_even_if_it_dies(
    cluster: Cluster,
) -> None:
    """A transaction acknowledging messages of a queue member a serves and sending to queues
    of a and of b commits (reached through b, it is told to commit at a, where its acks are),
    and b stores its part; acks of two members' messages in one transaction are refused,
    saying why. Then a member killed after its own part of a transaction was stored and
    before the other's: the other member stores its part once the dead one is gone, and the
    dead one's part, taken on elsewhere, is there once. Before, any transaction over two
    members was refused."""
    for m in ("a", "b"):
        cluster.start(m)
    with Admin(cluster.urls) as admin:
        for name, member in (("src", "a"), ("here", "a"), ("there", "b")):
            admin.create_queue(name)
            admin.pin(name, member)
    wait_for(lambda: {"src", "here"} <= cluster.serving("a")["a"], 20, "placed on a")
    wait_for(lambda: "there" in cluster.serving("b")["b"], 20, "placed on b")
    with Producer(cluster.urls, destination="src") as producer:
        producer.send_batch([b"s%d" % i for i in range(8)])
    with Consumer(cluster.urls, "src", prefetch=4) as consumer:
        batch = consumer.receive_many(4, timeout=10)
        assert len(batch) == 4
        with Transaction(cluster.members["b"].url) as tx:
            for m in batch:
                tx.send("there", b"t" + m.body, group_id="g")
            tx.send("here", b"h")
            tx.ack(batch)
            assert tx.commit() == {"there": [0, 1, 2, 3], "here": [0]}
        # acks of messages two members serve: refused, nothing of it done
        (one,) = consumer.receive_many(1, timeout=10)
        with Consumer(cluster.urls, "there") as other:
            (far,) = other.receive_many(1, timeout=10)
            tx = Transaction(cluster.members["a"].url)
            tx.send("here", b"never")
            tx.ack([one, far])
            with pytest.raises(NotAllowed, match="acknowledgements must all be"):
                tx.commit()
            tx.rollback()
            tx.close()
    assert [m.body for m in _drain(cluster.urls, "there", expect=4)] == [
        b"t" + m.body for m in batch
    ]
    assert [m.body for m in _drain(cluster.urls, "here", expect=1)] == [b"h"]
    assert len(_drain(cluster.urls, "src", expect=4)) == 4  # (the 4 acked are gone)

    # a member killed between its own part and the other's
    cluster.start("c", env={"SPARKMQ_FAILPOINTS": "transaction-applied-here"})
    with Admin(cluster.urls) as admin:
        admin.create_queue("mine")
        admin.pin("mine", "c")
    wait_for(lambda: "mine" in cluster.serving("c")["c"], 20, "placed on c")
    tx = Transaction(cluster.members["c"].url, timeout_s=5)
    tx.send("mine", b"m")
    for i in range(3):
        tx.send("there", b"x%d" % i)
    with pytest.raises(SparkMQError):  # (its member died answering)
        tx.commit()
    tx.close()
    assert cluster.members["c"].proc is not None
    assert cluster.members["c"].proc.wait(10) == -9
    with Admin(cluster.urls) as admin:  # (b looks once c is gone, and every 10 s anyway)
        wait_for(lambda: admin.stats("there")["end_offset"] == 7, 30, "b stored c's part")
    got = _drain(cluster.urls, "there", expect=3)
    assert [m.body for m in got] == [b"x0", b"x1", b"x2"]
    assert [m.body for m in _drain(cluster.urls, "mine", expect=1)] == [b"m"]
    assert "its part for there finished here (3 of 3 message(s) were missing)" in cluster.log("b")
    with Admin(cluster.urls) as admin:
        assert admin.stats("there")["produced"] == 7  # (stored once)
        assert admin.stats("mine")["produced"] == 1
    assert (
        _scrape(cluster.members["b"])[("sparkmq_cluster_transaction_parts_finished_total", ())] == 1
    )


@pytest.mark.parametrize("apart", [False, True], ids=["together", "apart"])
def test_a_transactional_consume_transform_produce_loop_across_moves_handles_each_once(
    cluster: Cluster, apart: bool
) -> None:
    """Messages taken from one queue and sent on to another in SDK transactions, through any
    member, while both queues move between two members (together: one, then the other;
    apart: always on different members, so every commit stores its sends at the other member):
    each message ends up once in the destination, or in the source's dead-letter queue (a
    commit refused while the source moves rolls back, which counts towards dead-lettering),
    and none is left. Looped over twenty moves before: dead-letter copies were refused while
    the DLQ was the other member's, and a message already copied there was delivered again
    after a move."""
    for m in ("a", "b"):
        cluster.start(m)
    with Admin(cluster.urls) as admin:
        for name in ("src", "dst"):
            admin.create_queue(name, max_delivery_attempts=3)
            admin.pin(name, "a")
    wait_for(lambda: {"src", "dst"} <= cluster.serving("a")["a"], 20, "placed on a")
    n = 300
    with Producer(cluster.urls, destination="src") as producer:
        producer.send_batch([b"%d" % i for i in range(n)])
    stop = threading.Event()
    refused: list[SparkMQError] = []

    def transform() -> None:
        while not stop.is_set():
            try:
                with Consumer(cluster.urls, "src", prefetch=5) as consumer:
                    while not stop.is_set():
                        batch = consumer.receive_many(5, timeout=0.2)
                        if not batch:
                            continue
                        with Transaction(cluster.urls) as tx:
                            for m in batch:
                                tx.send("dst", b"t" + m.body)
                            tx.ack(batch)
            except SparkMQError as exc:  # (rolled back: its messages come again)
                refused.append(exc)

    worker = threading.Thread(target=transform)
    worker.start()
    try:
        owner = "a"
        for _ in range(8):
            time.sleep(0.2)
            owner = "b" if owner == "a" else "a"
            other = ("b" if owner == "a" else "a") if apart else owner
            with Admin(cluster.urls) as admin:
                admin.pin("src", owner)
                admin.pin("dst", other)
            wait_for(lambda o=owner: "src" in cluster.serving(o)[o], 30, "moved")
            wait_for(lambda o=other: "dst" in cluster.serving(o)[o], 30, "moved")

        def drained() -> bool:
            with Admin(cluster.urls) as admin:
                return bool(admin.stats("src")["depth"] == 0)

        wait_for(drained, 60, "src drained")
    finally:
        stop.set()
        worker.join()
    sent_on = [m.body for m in _drain(cluster.urls, "dst")]
    dead = (
        [b"t" + m.body for m in _drain(cluster.urls, "DLQ.src")]
        if any("DLQ.src" in s for s in cluster.serving().values())
        else []
    )
    assert not _drain(cluster.urls, "src")
    if apart:  # (commits over two members go through: before, every one was refused)
        assert len(sent_on) >= n // 2, (len(sent_on), len(dead), refused[:3])
    assert sorted(sent_on + dead) == sorted(b"t%d" % i for i in range(n)), (
        len(sent_on),
        len(dead),
        refused[:3],
    )
