"""Every live-broker command of the CLI against a real broker process with security on: tables
and --json parsed back, stdin and stdout for the console producer and consumer, moves and
redrives, and failures (unknown destinations, refused permissions, wrong passwords, an
unreachable broker) with their messages and exit codes."""

from __future__ import annotations

import base64
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from spark_mq import Admin, Consumer, Producer
from spark_mq.launch import BrokerProcess
from tests.conftest import receive_n, wait_for
from tests.ops_kit import cli, cli_json, depth, launch
from tests.security_kit import PASSWORDS

pytestmark = pytest.mark.process

ALICE = {"username": "alice", "password": PASSWORDS["alice"]}


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    process = launch(tmp_path_factory.mktemp("ops-cli"), secure=True)
    yield process
    process.stop()


def test_status_names_the_phase_and_the_config_is_redacted(broker: BrokerProcess) -> None:
    doc = cli_json(broker, "status")
    assert doc["phase"] == "serving" and doc["role"] == "primary"
    assert doc["version"] and doc["uptime_s"] >= 0
    config = cli_json(broker, "status", "--config")
    assert config["security"]["enabled"] is True
    human = cli(broker, "status")
    assert human.exit_code == 0 and "serving" in human.stdout and "memory_state" in human.stdout


def test_a_queue_from_creation_to_deletion(broker: BrokerProcess) -> None:
    made = cli(broker, "queue", "create", "cli.q", "--set", "max_delivery_attempts=4")
    assert made.exit_code == 0 and "created queue cli.q" in made.stdout
    again = cli_json(broker, "queue", "create", "cli.q")
    assert again == {"name": "cli.q", "created": False}
    assert "cli.q" in [r["name"] for r in cli_json(broker, "queue", "list")]
    assert cli_json(broker, "queue", "describe", "cli.q")["settings"]["max_delivery_attempts"] == 4

    settings = cli_json(broker, "queue", "configure", "cli.q", "--set", "redelivery_delay_ms=250")
    assert settings["redelivery_delay_ms"] == 250 and settings["max_delivery_attempts"] == 4

    sent = cli(broker, "produce", "cli.q", stdin="one\ntwo\nthree\nfour\nfive\n")
    assert sent.exit_code == 0, sent.output
    assert "sent 5 message(s) to cli.q" in sent.stderr

    stat = cli_json(broker, "queue", "stat", "cli.q", "--interval", "0.2")
    assert [(r["name"], r["depth"], r["produced"]) for r in stat] == [("cli.q", 5, 5)]
    assert stat[0]["produced_per_s"] == 0.0 and stat[0]["dlq_depth"] == 0

    browsed = cli_json(broker, "queue", "browse", "cli.q", "--limit", "3")
    assert [m["body"] for m in browsed] == ["one", "two", "three"]
    table = cli(broker, "queue", "list")
    assert table.exit_code == 0 and "cli.q" in table.stdout and "DEPTH" in table.stdout

    consumed = cli(broker, "consume", "cli.q", "--max-messages", "3")
    assert consumed.exit_code == 0, consumed.output
    assert consumed.stdout.splitlines() == ["one", "two", "three"]
    described = cli_json(broker, "queue", "describe", "cli.q")
    assert (described["depth"], described["acked"]) == (2, 3)
    assert described["delivered"] >= 3  # (what it leased past the three goes back)

    assert cli_json(broker, "queue", "purge", "cli.q", "--yes") == {"name": "cli.q", "purged": 2}
    assert cli_json(broker, "queue", "describe", "cli.q")["depth"] == 0
    deleted = cli(broker, "queue", "delete", "cli.q", "--yes")
    assert deleted.exit_code == 0 and "deleted queue cli.q" in deleted.stdout
    assert "cli.q" not in [r["name"] for r in cli_json(broker, "queue", "list")]


def test_partitions_are_added_from_the_command_line(broker: BrokerProcess) -> None:
    made = cli(broker, "queue", "create", "cli.parts", "--set", "partitions=2")
    assert made.exit_code == 0, made.output
    grown = cli_json(broker, "queue", "add-partitions", "cli.parts", "3")
    assert grown == {"name": "cli.parts", "partitions": 3, "added": True}
    again = cli(broker, "queue", "add-partitions", "cli.parts", "3")
    assert again.exit_code == 0 and "queue cli.parts already had 3 partitions" in again.stdout
    fewer = cli(broker, "queue", "add-partitions", "cli.parts", "2")
    assert fewer.exit_code != 0 and "added, not taken away" in fewer.output
    described = cli_json(broker, "queue", "describe", "cli.parts")
    assert [p["name"] for p in described["partitions"]] == [f"cli.parts~{i}" for i in range(3)]


def test_purge_and_delete_ask_first(broker: BrokerProcess) -> None:
    with Admin(broker.url, **ALICE) as admin:
        admin.create_queue("cli.ask")
    refused = cli(broker, "queue", "delete", "cli.ask", stdin="n\n")
    assert refused.exit_code == 1 and "Aborted" in refused.output
    assert "cli.ask" in [r["name"] for r in cli_json(broker, "queue", "list")]
    assert cli(broker, "queue", "delete", "cli.ask", stdin="y\n").exit_code == 0


def test_topics_and_their_subscriptions(broker: BrokerProcess) -> None:
    assert cli(broker, "topic", "create", "cli.t").exit_code == 0
    made = cli_json(broker, "subscription", "create", "cli.t", "eu", "--selector", "region = 'eu'")
    assert made["created"] is True
    assert cli(broker, "subscription", "create", "cli.t", "all").exit_code == 0
    with Producer(broker.url, destination="cli.t", **ALICE) as p:
        for region in ("eu", "us", "eu"):
            p.send_sync(f"order from {region}", headers={"region": region})
    subs = cli_json(broker, "subscription", "list", "cli.t")
    assert set(subs) == {"eu", "all"} and subs["all"]["depth"] == 3
    listed = {r["name"]: r for r in cli_json(broker, "topic", "list")}
    assert listed["cli.t"]["subscriptions"] == 2 and listed["cli.t"]["produced"] == 3
    eu = cli_json(broker, "topic", "browse", "cli.t", "--subscription", "eu")
    assert [m["headers"]["region"] for m in eu] == ["eu", "eu"]
    got = cli(broker, "consume", "cli.t", "--subscription", "all", "--max-messages", "3",
              "--print-headers")  # fmt: skip
    assert got.stdout.splitlines() == [
        "region:eu\torder from eu", "region:us\torder from us", "region:eu\torder from eu"
    ]  # fmt: skip
    missing = cli(broker, "subscription", "delete", "cli.t", "nope", "--yes")
    assert missing.exit_code == 3 and "no subscription 'nope'" in missing.stderr
    assert cli(broker, "subscription", "delete", "cli.t", "eu", "--yes").exit_code == 0
    assert set(cli_json(broker, "subscription", "list", "cli.t")) == {"all"}
    # a queue command on a topic says which command to use
    wrong = cli(broker, "queue", "describe", "cli.t")
    assert wrong.exit_code == 2 and "is a topic" in wrong.stderr


def test_redrive_sends_dead_letters_home_and_move_takes_a_limit(broker: BrokerProcess) -> None:
    with Admin(broker.url, **ALICE) as admin:
        admin.create_queue("cli.work", max_delivery_attempts=1)
        admin.create_queue("cli.parking")
    with Producer(broker.url, destination="cli.work", **ALICE) as p:
        for i in range(30):
            p.send(f"job {i}", headers={"n": str(i)}, priority=7 if i == 0 else None)
        p.flush()
    with Consumer(broker.url, "cli.work", **ALICE) as c:
        c.nack(receive_n(c, 30)).result(10)
    with Admin(broker.url, **ALICE) as admin:
        wait_for(lambda: depth(admin, "DLQ.cli.work") == 30, what="30 dead letters")
    stat = cli_json(broker, "queue", "stat", "cli.work", "--interval", "0")
    assert stat[0]["dlq_depth"] == 30 and stat[0]["produced_per_s"] is None

    redriven = cli(broker, "redrive", "DLQ.cli.work")
    assert redriven.exit_code == 0, redriven.output
    assert "moved 30 message(s) of DLQ.cli.work: 30 to cli.work" in redriven.stdout
    assert "30/30" in redriven.stderr  # the progress bar's last state
    with Admin(broker.url, **ALICE) as admin:
        assert admin.stats("DLQ.cli.work")["depth"] == 0
        assert admin.stats("cli.work")["depth"] == 30
        rows = admin.browse("cli.work", limit=30).to_pylist()
    # back as they were: bodies, priority and headers, without the dead-letter queue's own
    assert sorted(r["body"] for r in rows) == sorted(f"job {i}".encode() for i in range(30))
    assert all(set(dict(r["headers"])) == {"n"} for r in rows)
    assert rows[0]["body"] == b"job 0" and rows[0]["priority"] == 7

    moved = cli_json(broker, "move", "cli.work", "cli.parking", "--limit", "10")
    assert moved == {"source": "cli.work", "moved": 10, "targets": {"cli.parking": 10}}
    with Admin(broker.url, **ALICE) as admin:
        assert (admin.stats("cli.work")["depth"], admin.stats("cli.parking")["depth"]) == (20, 10)
    # dead letters whose queue was deleted meanwhile are refused, not sent to a new queue
    with Admin(broker.url, **ALICE) as admin:
        admin.create_queue("cli.gone", max_delivery_attempts=1)
    with Producer(broker.url, destination="cli.gone", **ALICE) as p:
        p.send_sync("orphan")
    with Consumer(broker.url, "cli.gone", **ALICE) as c:
        c.nack(receive_n(c, 1)).result(10)
    with Admin(broker.url, **ALICE) as admin:
        wait_for(lambda: depth(admin, "DLQ.cli.gone") == 1, what="the dead letter")
        admin.delete_destination("cli.gone")
    orphaned = cli(broker, "redrive", "DLQ.cli.gone")
    assert orphaned.exit_code == 1 and "no longer exists" in orphaned.stderr
    with Admin(broker.url, **ALICE) as admin:
        assert depth(admin, "DLQ.cli.gone") == 1 and depth(admin, "cli.gone") == 0
    not_a_dlq = cli(broker, "redrive", "cli.parking")
    assert not_a_dlq.exit_code == 1 and "no sparkmq.original_destination" in not_a_dlq.stderr
    with Admin(broker.url, **ALICE) as admin:
        assert admin.stats("cli.parking")["depth"] == 10  # a refused move loses nothing


def test_a_move_larger_than_a_batch_goes_in_batches(broker: BrokerProcess) -> None:
    with Admin(broker.url, **ALICE) as admin:
        admin.create_queue("cli.many")
        admin.create_queue("cli.many.copy")
    with Producer(broker.url, destination="cli.many", **ALICE) as p:
        p.send_batch([f"m{i}".encode() for i in range(2_500)])
    moved = cli_json(broker, "move", "cli.many", "cli.many.copy")
    assert moved["moved"] == 2_500  # (three calls of at most 1,000)
    with Admin(broker.url, **ALICE) as admin:
        assert (depth(admin, "cli.many"), depth(admin, "cli.many.copy")) == (0, 2_500)
        first = admin.browse("cli.many.copy", limit=3).to_pylist()
    assert [r["body"] for r in first] == [b"m0", b"m1", b"m2"]  # in order


def test_a_gone_querys_claims_are_released(broker: BrokerProcess) -> None:
    with Producer(broker.url, destination="cli.claimed", **ALICE) as p:
        for i in range(4):
            p.send_sync(f"m{i}")
    with Admin(broker.url, **ALICE) as admin:
        assert admin.claim("cli.claimed", "query-1", 1, 10) == 4
        assert admin.stats("cli.claimed")["in_flight"] == 4
    released = cli_json(broker, "claims", "release", "cli.claimed", "query-1")
    assert released["released"] == 4
    with Admin(broker.url, **ALICE) as admin:
        assert admin.stats("cli.claimed")["in_flight"] == 0


def test_bodies_are_shown_safely_and_the_producer_takes_headers_and_keys(
    broker: BrokerProcess,
) -> None:
    with Producer(broker.url, destination="cli.bin", **ALICE) as p:
        p.send_sync(b"\x00\x01\xfe binary")
    hexed = cli(broker, "queue", "browse", "cli.bin", "--body", "hex")
    assert b"\x00\x01\xfe binary".hex() in hexed.stdout
    auto = cli_json(broker, "queue", "browse", "cli.bin")
    assert auto[0]["encoding"] == "base64"
    assert base64.b64decode(auto[0]["body"]) == b"\x00\x01\xfe binary"
    escaped = cli(broker, "consume", "cli.bin", "--max-messages", "1")
    assert escaped.stdout.strip() == "\\x00\\x01\\xfe binary"

    sent = cli(broker, "produce", "cli.keys", "--header", "source=cli", "--key-separator", ":",
               "--priority", "9", stdin="customer-7:first\ncustomer-8:second\n")  # fmt: skip
    assert sent.exit_code == 0, sent.output
    rows = cli_json(broker, "queue", "browse", "cli.keys")
    assert [(r["group_id"], r["body"], r["priority"]) for r in rows] == [
        ("customer-7", "first", 9), ("customer-8", "second", 9)
    ]  # fmt: skip
    assert all(r["headers"] == {"source": "cli"} for r in rows)
    looked = cli(broker, "consume", "cli.keys", "--from-beginning", "--json")
    assert [json.loads(line)["body"] for line in looked.stdout.splitlines()] == [
        "first", "second"
    ]  # fmt: skip
    assert cli_json(broker, "queue", "describe", "cli.keys")["depth"] == 2  # only looked


def test_failures_say_what_and_exit_with_their_code(broker: BrokerProcess) -> None:
    unknown = cli(broker, "queue", "describe", "cli.nowhere")
    assert unknown.exit_code == 3
    assert "'cli.nowhere' does not exist" in unknown.stderr
    assert cli(broker, "queue", "purge", "cli.nowhere", "--yes").exit_code == 3

    with Admin(broker.url, **ALICE) as admin:
        admin.create_queue("cli.guarded")
    denied = cli(broker, "queue", "purge", "cli.guarded", "--yes", user="bob")
    assert denied.exit_code == 4 and "bob" in denied.stderr and "admin" in denied.stderr
    assert cli(broker, "move", "cli.guarded", "bob.mine", user="bob").exit_code == 4
    assert "cli.guarded" not in [r["name"] for r in cli_json(broker, "queue", "list", user="bob")]

    wrong = CliEnv(broker).run("queue", "list", password="Not-Alices-9")
    assert wrong.returncode == 4 and "password" in wrong.stderr.lower(), wrong.stderr

    bad = cli(broker, "queue", "create", "cli.bad", "--set", "no_equals_sign")
    assert bad.exit_code == 2 and "KEY=VALUE" in bad.stderr
    invalid = cli(broker, "queue", "create", "cli.bad", "--set", "max_delivery_attempts=-3")
    assert invalid.exit_code == 2 and "max_delivery_attempts" in invalid.stderr


class CliEnv:
    """The CLI as a separate process, as a script runs it."""

    def __init__(self, broker: BrokerProcess) -> None:
        self.broker = broker

    def run(self, *args: str, password: str, url: str | None = None) -> subprocess.CompletedProcess:
        env = {
            "PATH": "/usr/bin:/bin",
            "SPARKMQ_URL": url or self.broker.url,
            "SPARKMQ_USERNAME": "alice",
            "SPARKMQ_PASSWORD": password,
        }
        return subprocess.run(
            [sys.executable, "-m", "spark_mq", *args],
            capture_output=True,
            text=True,
            timeout=60,
            env=env,
            check=False,
        )


def test_as_a_separate_process_with_an_unreachable_broker(
    broker: BrokerProcess, tmp_path: Path
) -> None:
    env = CliEnv(broker)
    ok = env.run("queue", "list", "--json", password=PASSWORDS["alice"])
    assert ok.returncode == 0, ok.stderr
    assert isinstance(json.loads(ok.stdout), list)
    gone = env.run("status", "--timeout", "2", password="x", url="grpc://127.0.0.1:9")
    assert gone.returncode == 5
    assert gone.stderr.startswith("sparkmq: cannot reach the broker")
    assert "Traceback" not in gone.stderr
