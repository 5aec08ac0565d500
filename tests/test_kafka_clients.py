"""Kafka clients of other languages and libraries against a real broker process, and what they
produce read by the SDK, STOMP and Spark (and the other way round): kafkajs (npm, under Node),
kcat (Debian), aiokafka (PyPI)."""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import TopicPartition

from spark_mq import Admin
from spark_mq.client import Consumer, Producer
from spark_mq.launch import BrokerProcess
from tests.kafka_kit import consumer, produce_all, producer, read_from
from tests.stomp_kit import connect

pytestmark = pytest.mark.process

NODE_DIR = Path(__file__).parent / "node"


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    base = tmp_path_factory.mktemp("kafka-clients")
    process = BrokerProcess(str(base / "data"), log_file=str(base / "broker.out")).start()
    try:
        yield process
    finally:
        process.stop()


def _name(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def _node(*args: str) -> list[str]:
    assert shutil.which("node"), "node is needed (scripts/setup.sh installs it)"
    assert (NODE_DIR / "node_modules" / "kafkajs").is_dir(), "run scripts/setup.sh (npm ci)"
    done = subprocess.run(
        ["node", str(NODE_DIR / "kafka_client.js"), *args],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return done.stdout.splitlines()


def test_kafkajs_produces_and_the_sdk_and_stomp_read_it(broker: BrokerProcess) -> None:
    assert broker.kafka_port and broker.stomp_port
    q = _name("from-kafkajs")
    with Admin(broker.url) as admin:
        admin.create_queue(q)
    (answer,) = _node("produce", str(broker.kafka_port), q, "30")
    assert json.loads(answer)[0]["errorCode"] == 0
    with Consumer(broker.url, q) as sdk:
        got = sdk.receive_many(20, timeout=10)
        sdk.ack(got)
    assert [m.body for m in got] == [f"kjs-{i}".encode() for i in range(20)]
    assert [m.group_id for m in got[:3]] == ["k0", "k1", "k2"]
    assert got[0].headers["from"] == "kafkajs"
    conn, inbox = connect(broker.stomp_port)
    conn.subscribe(f"/queue/{q}", id="s", ack="client-individual")
    frames = inbox.wait_messages(10)[:10]
    for f in frames:
        conn.ack(f.headers["ack"])
    conn.disconnect()
    assert [f.body for f in frames] == [f"kjs-{i}".encode() for i in range(20, 30)]
    assert {f.headers["JMSXGroupID"] for f in frames} == {"k0", "k1", "k2"}


def test_kafkajs_consumes_in_a_group_what_the_sdk_produced(broker: BrokerProcess) -> None:
    assert broker.kafka_port
    topic = _name("to-kafkajs")
    with Admin(broker.url) as admin:
        admin.create_topic(topic)
    with Producer(broker.url, destination=topic) as p:
        for i in range(10):
            p.send(f"sdk-{i}".encode(), group_id="g", headers={"from": "sdk"}).result()
    lines = _node("consume", str(broker.kafka_port), topic, _name("group"), "10")
    assert lines == [f"{i} g sdk-{i} sdk" for i in range(10)]


def test_kafkajs_transactions_commit_abort_and_carry_offsets(broker: BrokerProcess) -> None:
    """kafkajs's transactional producer: what it commits the SDK reads (and the group's offset
    it sent is committed); what it aborts no one ever sees."""
    assert broker.kafka_port
    topic, group = _name("kjs-txn"), _name("group")
    with Admin(broker.url) as admin:
        admin.create_topic(topic)
        admin.create_subscription(topic, "reader")
    assert _node("transact", str(broker.kafka_port), topic, group) == ["done"]
    with Consumer(broker.url, topic, subscription="reader") as sdk:
        got = sdk.receive_many(5, timeout=5)
        sdk.ack(got)
    assert [m.body for m in got] == [b"tx-0", b"tx-1", b"tx-2", b"tx-3"]
    c = consumer(broker.kafka_port, **{"group.id": group})
    try:
        assert c.committed([TopicPartition(topic, 0)], 10)[0].offset == 3
    finally:
        c.close()


def test_kcat_produces_and_consumes(broker: BrokerProcess) -> None:
    assert shutil.which("kcat"), "kcat is needed (scripts/setup.sh installs it)"
    assert broker.kafka_port
    topic, bootstrap = _name("kcat"), f"127.0.0.1:{broker.kafka_port}"
    lines = "".join(f"key{i}:value-{i}\n" for i in range(25))
    subprocess.run(
        ["kcat", "-b", bootstrap, "-P", "-t", topic, "-K", ":", "-X", "acks=all"],
        input=lines, text=True, check=True, timeout=60,
    )  # fmt: skip
    out = subprocess.run(
        ["kcat", "-b", bootstrap, "-C", "-t", topic, "-o", "beginning", "-e", "-f", "%o %k %s\n"],
        capture_output=True, text=True, check=True, timeout=60,
    ).stdout.splitlines()  # fmt: skip
    assert out == [f"{i} key{i} value-{i}" for i in range(25)]
    listing = subprocess.run(
        ["kcat", "-b", bootstrap, "-L", "-t", topic, "-J"],
        capture_output=True, text=True, check=True, timeout=60,
    ).stdout  # fmt: skip
    (described,) = json.loads(listing)["topics"]
    assert described["topic"] == topic and len(described["partitions"]) == 1


def test_aiokafka_produces_and_consumes_in_a_group(broker: BrokerProcess) -> None:
    from aiokafka import AIOKafkaConsumer, AIOKafkaProducer

    assert broker.kafka_port
    topic, group = _name("aiokafka"), _name("group")
    bootstrap = f"127.0.0.1:{broker.kafka_port}"

    async def run() -> list[tuple[int, bytes | None, bytes | None]]:
        p = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all")
        await p.start()
        try:
            for i in range(15):
                await p.send_and_wait(topic, f"aio-{i}".encode(), key=b"k")
        finally:
            await p.stop()
        c = AIOKafkaConsumer(
            topic, bootstrap_servers=bootstrap, group_id=group, auto_offset_reset="earliest",
            enable_auto_commit=False,
        )  # fmt: skip
        await c.start()
        got = []
        try:
            deadline = time.monotonic() + 30
            while len(got) < 15 and time.monotonic() < deadline:
                batch = await c.getmany(timeout_ms=500)
                for records in batch.values():
                    got += [(r.offset, r.key, r.value) for r in records]
            await c.commit()
        finally:
            await c.stop()
        return got

    got = asyncio.run(run())
    assert got == [(i, b"k", f"aio-{i}".encode()) for i in range(15)]
    assert read_from(broker.kafka_port, topic, 14, 1)[0].value() == b"aio-14"


@pytest.mark.spark
def test_spark_reads_what_kafka_produced(broker: BrokerProcess, spark) -> None:  # type: ignore[no-untyped-def]
    assert broker.kafka_port
    topic = _name("to-spark")
    values = [f"for-spark-{i}".encode() for i in range(40)]
    produce_all(producer(broker.kafka_port), topic, values, key=b"acct-1")
    with Admin(broker.url) as admin:  # (Spark reads Delta: wait until the hot tier moved it)
        deadline = time.monotonic() + 30
        while admin.stats(topic).get("delta_lag_messages", 0) and time.monotonic() < deadline:
            time.sleep(0.1)
    df = (
        spark.read.format("sparkmq")
        .option("root", broker.data_dir)
        .option("destination", topic)
        .load()
        .orderBy("offset")
    )
    rows = df.select("offset", "group_id", "body").collect()
    assert [(r.offset, r.group_id, bytes(r.body)) for r in rows] == [
        (i, "acct-1", v) for i, v in enumerate(values)
    ]
