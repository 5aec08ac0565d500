"""A STOMP client from another language's registry (stompit, from npm, run by Node) and the
Python SDK on the same queue, both ways."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from spark_mq import Admin
from spark_mq.client import Consumer, Producer
from spark_mq.launch import BrokerProcess
from tests.ops_kit import depth

pytestmark = pytest.mark.process

NODE_DIR = Path(__file__).parent / "node"


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    assert shutil.which("node"), "node is needed (scripts/setup.sh installs it)"
    assert (NODE_DIR / "node_modules" / "stompit").is_dir(), "run scripts/setup.sh (npm ci)"
    base = tmp_path_factory.mktemp("node")
    with BrokerProcess(str(base / "data"), log_file=str(base / "broker.out")) as process:
        yield process


def _node(*args: str) -> list[str]:
    done = subprocess.run(
        ["node", str(NODE_DIR / "stomp_client.js"), *args],
        capture_output=True, text=True, timeout=90, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return done.stdout.splitlines()


def test_node_produces_and_the_sdk_consumes(broker: BrokerProcess) -> None:
    assert broker.stomp_port
    _node("produce", str(broker.stomp_port), "/queue/from-node", "50")
    with Consumer(broker.url, "from-node") as consumer:
        got = []
        while len(got) < 50 and (batch := consumer.receive_many(50, timeout=5)):
            got += batch
            consumer.ack(batch)
    assert sorted(m.body for m in got) == sorted(f"node-{i}".encode() for i in range(50))
    assert {m.headers["from-node"] for m in got} == {"yes"}
    assert {m.headers["content-type"] for m in got} == {"text/plain"}
    assert {m.priority for m in got} == {6}


def test_the_sdk_produces_and_node_consumes(broker: BrokerProcess) -> None:
    assert broker.stomp_port
    with Producer(broker.url, destination="to-node") as p:
        for i in range(30):
            p.send_sync(f"py-{i}", headers={"origin": "python"})
    lines = _node("consume", str(broker.stomp_port), "/queue/to-node", "30")
    received = [json.loads(line) for line in lines]
    assert [r["body"] for r in received] == [f"py-{i}" for i in range(30)]
    assert all(r["headers"]["origin"] == "python" for r in received)
    assert all(r["headers"]["destination"] == "/queue/to-node" for r in received)
    with Admin(broker.url) as admin:  # every one acked by node
        deadline = time.monotonic() + 10
        while depth(admin, "to-node") and time.monotonic() < deadline:
            time.sleep(0.05)
        assert depth(admin, "to-node") == 0


def test_the_readmes_node_example_sends_a_message(broker: BrokerProcess) -> None:
    readme = (NODE_DIR.parent.parent / "README.md").read_text()
    example = readme.split("```js\n", 1)[1].split("```", 1)[0]
    assert broker.stomp_port
    done = subprocess.run(
        ["node", "-e", example.replace("61613", str(broker.stomp_port))],
        env={**os.environ, "NODE_PATH": str(NODE_DIR / "node_modules"), "MQ_PASSWORD": "x"},
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    with Consumer(broker.url, "orders") as consumer:
        (m,) = consumer.receive_many(1, timeout=10)
        consumer.ack(m)
    assert m.body == b'{"id": 1}'
