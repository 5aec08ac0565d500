"""The README's Kafka client matrix: every client no one here wrote, driven through the same
command line (``produce``, ``consume`` in a group, be a group ``member``; see
tests/kafka_drivers/python_driver.py), against real broker processes, cell by cell: produce (read
by the SDK), consume in a group (what the SDK produced), a group of three that hands the
partition on as members leave, committed offsets resumed after a broker SIGKILL, SASL/PLAIN over
TLS, and ACL refusals (a topic, a group).

The clients: kafka-python and aiokafka (PyPI), kafkajs (npm, under Node), sarama (Go, built
offline from Debian's sources) and kcat (Debian). librdkafka's own cells (confluent-kafka) are
in tests/test_kafka.py."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import threading
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from spark_mq import Admin
from spark_mq.client import Consumer, Producer
from spark_mq.launch import BrokerProcess
from tests.conftest import wait_for
from tests.security_kit import ACL, PASSWORDS, Authority, security_settings

pytestmark = pytest.mark.process

HERE = Path(__file__).parent
DRIVERS = HERE / "kafka_drivers"
CLIENTS = ["kafka-python", "aiokafka", "kafkajs", "sarama", "kcat"]
# each client's words for a refused topic and a refused group: the Kafka error code where the
# client prints it (29 TOPIC_AUTHORIZATION_FAILED, 30 GROUP_AUTHORIZATION_FAILED), kcat's text
TOPIC_REFUSED = {"kcat": "Topic authorization failed"}
GROUP_REFUSED = {"kcat": "Group authorization failed"}


@pytest.fixture(scope="session")
def sarama_driver(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The Go driver, built with Debian's Go from Debian's sarama sources (no network)."""
    assert shutil.which("go"), "Go is needed (scripts/setup.sh installs golang-go)"
    gocode = Path("/usr/share/gocode")
    assert (gocode / "src/github.com/Shopify/sarama").is_dir(), (
        "sarama's sources are needed (scripts/setup.sh installs golang-github-shopify-sarama-dev)"
    )
    out = tmp_path_factory.mktemp("go")
    env = {
        **os.environ,
        "GO111MODULE": "off",
        "GOPATH": f"{out}:{gocode}",
        "GOCACHE": str(out / "cache"),
        "CGO_CFLAGS": "-Wno-deprecated-declarations",
    }
    binary = out / "sarama_driver"
    done = subprocess.run(
        ["go", "build", "-o", str(binary), str(DRIVERS / "sarama_driver.go")],
        cwd=out, env=env, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return binary


@dataclass
class Driver:
    client: str
    command: list[str]
    env: dict[str, str] = field(default_factory=dict)

    def run(self, *args: str, timeout: float = 90) -> list[str]:
        """Run one command to its end: its output's lines (a failure's ``error ...`` line)."""
        done = subprocess.run(
            [*self.command, *args],
            capture_output=True, text=True, timeout=timeout, check=False,
            env={**os.environ, **self.env},
        )  # fmt: skip
        lines = done.stdout.splitlines()
        if done.returncode not in (0, 3):
            raise AssertionError(f"{self.client} {args[0]} ended {done.returncode}: {done.stderr}")
        return lines

    def member(self, bootstrap: str, topic: str, group: str) -> Member:
        process = subprocess.Popen(
            [*self.command, "member", bootstrap, topic, group],
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
            env={**os.environ, **self.env},
        )  # fmt: skip
        return Member(process)

    def secured(self, user: str, ca: Path) -> Driver:
        more = {"KAFKA_USER": user, "KAFKA_PASSWORD": PASSWORDS[user], "KAFKA_CA": str(ca)}
        return Driver(self.client, self.command, {**self.env, **more})


class Member:
    """A group member in a process of its own; what it got, read off its output as it comes."""

    def __init__(self, process: subprocess.Popen[str]) -> None:
        self.process = process
        self.got: list[str] = []
        self.errors: list[str] = []  # (what the client raised: the driver's "error ..." lines)
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            if line.startswith("got "):
                self.got.append(line[4:].strip())
            elif line.startswith("error "):
                self.errors.append(line.strip())

    def leave(self) -> None:
        """SIGTERM: the client closes its consumer (it leaves the group) and exits."""
        self.process.terminate()
        self.process.wait(timeout=30)

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait(timeout=10)


@pytest.fixture(params=CLIENTS)
def driver(request: pytest.FixtureRequest) -> Driver:
    client: str = request.param
    if client in ("kafka-python", "aiokafka"):
        return Driver(client, [sys.executable, str(DRIVERS / "python_driver.py"), client])
    if client == "kafkajs":
        assert shutil.which("node"), "node is needed (scripts/setup.sh installs it)"
        assert (HERE / "node/node_modules/kafkajs").is_dir(), "run scripts/setup.sh (npm ci)"
        return Driver(client, ["node", str(HERE / "node/kafka_driver.js")])
    if client == "kcat":
        assert shutil.which("kcat"), "kcat is needed (scripts/setup.sh installs it)"
        return Driver(client, [sys.executable, str(DRIVERS / "kcat_driver.py")])
    return Driver(client, [str(request.getfixturevalue("sarama_driver"))])


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    base = tmp_path_factory.mktemp("kafka-matrix")
    process = BrokerProcess(str(base / "data"), log_file=str(base / "broker.out")).start()
    try:
        yield process
    finally:
        process.stop()


def _name(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def _bootstrap(process: BrokerProcess, host: str = "127.0.0.1") -> str:
    assert process.kafka_port
    return f"{host}:{process.kafka_port}"


def _sdk_sends(url: str, topic: str, values: list[str]) -> None:
    with Admin(url) as admin:
        admin.create_topic(topic)
    with Producer(url, destination=topic) as p:
        for v in values:
            p.send_sync(v.encode())


def _values(prefix: str, n: int, start: int = 0) -> list[str]:
    return [f"{prefix}-{i}" for i in range(start, n)]


def test_each_client_produces_what_the_sdk_reads_and_consumes_what_it_sent(
    broker: BrokerProcess, driver: Driver
) -> None:
    q = _name(f"from-{driver.client}")
    with Admin(broker.url) as admin:
        admin.create_queue(q)
    assert driver.run("produce", _bootstrap(broker), q, "12", "p") == ["produced 12"]
    got: list[Any] = []
    with Consumer(broker.url, q) as sdk:
        while len(got) < 12:
            more = sdk.receive_many(12 - len(got), timeout=10)
            assert more, f"only {len(got)} of 12"
            sdk.ack(more)
            got += more
    assert [m.body.decode() for m in got] == _values("p", 12)

    topic, group = _name(f"to-{driver.client}"), _name("group")
    _sdk_sends(broker.url, topic, _values("s", 8))
    assert driver.run("consume", _bootstrap(broker), topic, group, "8") == _values("s", 8)


def test_each_client_s_group_of_three_hands_the_partition_on(
    broker: BrokerProcess, driver: Driver
) -> None:
    from confluent_kafka.admin import AdminClient

    topic, group = _name(f"group-{driver.client}"), _name("three")
    _sdk_sends(broker.url, topic, [])
    bootstrap = _bootstrap(broker)
    members = [driver.member(bootstrap, topic, group) for _ in range(3)]
    try:
        admin = AdminClient({"bootstrap.servers": bootstrap})

        def stable_with(n: int) -> bool:
            failed = [e for m in members for e in m.errors]
            assert not failed, f"a member gave up: {failed}"  # (not a minute's wait for it)
            d = admin.describe_consumer_groups([group])[group].result(10)
            return str(d.state).endswith("STABLE") and len(d.members) == n

        wait_for(lambda: stable_with(3), 60, "three members in a stable group")
        _sdk_sends(broker.url, topic, _values("a", 10))
        wait_for(lambda: len({v for m in members for v in m.got}) == 10, 60, "the first ten")
        owners = [m for m in members if m.got]
        assert len(owners) == 1  # (one partition: one member at a time has it)
        (owner,) = owners
        owner.leave()  # it commits what it read and leaves: another member takes over
        rest = [m for m in members if m is not owner]
        wait_for(lambda: stable_with(2), 60, "the two left in a stable group")
        _sdk_sends(broker.url, topic, _values("b", 10))
        wait_for(lambda: len({v for m in rest for v in m.got}) >= 10, 60, "the next ten")
        assert sorted({v for m in rest for v in m.got}) == sorted(_values("b", 10))
    finally:
        for m in members:
            m.kill()


def test_each_client_resumes_from_committed_offsets_after_a_broker_sigkill(
    tmp_path: Path, sarama_driver: Path
) -> None:
    """One broker killed under every client: each read four in its group (committed), and
    after the SIGKILL each reads on from the fifth."""
    drivers = {
        "kafka-python": [sys.executable, str(DRIVERS / "python_driver.py"), "kafka-python"],
        "aiokafka": [sys.executable, str(DRIVERS / "python_driver.py"), "aiokafka"],
        "kafkajs": ["node", str(HERE / "node/kafka_driver.js")],
        "sarama": [str(sarama_driver)],
        "kcat": [sys.executable, str(DRIVERS / "kcat_driver.py")],
    }
    assert set(drivers) == set(CLIENTS)
    data = tmp_path / "data"
    first = BrokerProcess(str(data), log_file=str(tmp_path / "broker.out")).start()
    try:
        for client, command in drivers.items():
            _sdk_sends(first.url, f"durable-{client}", _values("d", 10))
            got = Driver(client, command).run(
                "consume", _bootstrap(first), f"durable-{client}", f"g-{client}", "4"
            )
            assert got == _values("d", 4), client
    finally:
        first.kill()  # SIGKILL: no flush, no goodbye
    second = BrokerProcess(str(data), log_file=str(tmp_path / "broker2.out")).start()
    try:
        for client, command in drivers.items():
            got = Driver(client, command).run(
                "consume", _bootstrap(second), f"durable-{client}", f"g-{client}", "6"
            )
            assert got == _values("d", 10, start=4), client
    finally:
        second.stop()


@pytest.fixture(scope="module")
def secure(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[BrokerProcess, Path]]:
    """Security on, the Kafka listener over TLS (a certificate for localhost), SASL/PLAIN."""
    base = tmp_path_factory.mktemp("kafka-matrix-secure")
    ca = Authority(base)
    server = ca.issue("localhost", server=True)
    settings = security_settings(
        base,
        acl=ACL,
        **{
            "security.tls_cert_file": str(server.cert_file),
            "security.tls_key_file": str(server.key_file),
            "broker.kafka_advertised_host": "localhost",
            "security.audit_file": str(base / "audit.log"),
        },
    )
    args = []
    for key, value in settings.items():
        args += ["--set", f"{key}={str(value).lower() if isinstance(value, bool) else value}"]
    process = BrokerProcess(
        str(base / "data"), extra_args=args, log_file=str(base / "broker.out")
    ).start()
    try:
        yield process, ca.cert_file
    finally:
        process.stop()


def test_each_client_logs_in_over_tls_and_is_refused_what_the_rules_do_not_allow(
    secure: tuple[BrokerProcess, Path], driver: Driver
) -> None:
    process, ca = secure
    bootstrap = _bootstrap(process, "localhost")
    bob = driver.secured("bob", ca)
    topic = _name(f"bob.{driver.client}")  # bob may produce and consume bob.*, in groups bob-*
    assert bob.run("produce", bootstrap, topic, "5", "t") == ["produced 5"]
    assert bob.run("consume", bootstrap, topic, _name("bob-g"), "5") == _values("t", 5)
    # a topic bob may not produce to
    (refused,) = bob.run("produce", bootstrap, _name("alice.only"), "1", "x")
    assert refused.startswith("error "), refused
    assert TOPIC_REFUSED.get(driver.client, "error 29 ") in refused, refused
    # a group bob may not use
    refused = bob.run("consume", bootstrap, topic, _name("alice-g"), "1")[-1]
    assert GROUP_REFUSED.get(driver.client, "error 30 ") in refused, refused
