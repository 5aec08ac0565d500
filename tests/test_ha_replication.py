"""Replication of the hot tier to a backup with a disk of its own, with real broker processes:
the primary's machine is lost (SIGKILL, and its hot directory deleted) again and again under
load; the backup takes over with everything acknowledged; a backup that is not in sync refuses
to take over and says so; a paused primary that is resumed after the failover acknowledges
nothing more and steps down."""

from __future__ import annotations

import os
import shutil
import signal
import threading
import time
from pathlib import Path

import pytest

from spark_mq import Admin, Consumer, Producer
from spark_mq.errors import SparkMQError
from spark_mq.ha.ownership import Ownership
from spark_mq.journal.delta_store import DeltaStore
from tests.conftest import wait_for
from tests.ha_kit import in_sync, pair

pytestmark = pytest.mark.process


def test_losing_the_primarys_machine_loses_nothing_acknowledged(tmp_path: Path) -> None:
    a, b = pair(tmp_path)
    urls = [a.url, b.url]
    a.launch().wait_ready(60)
    b.launch()
    wait_for(lambda: in_sync(a.url), timeout=60, what="the backup to be in sync")
    with Admin(urls) as admin:
        admin.create_queue("orders", max_delivery_attempts=2)
    acked: dict[str, str] = {}
    failures: list[BaseException] = []
    stop = threading.Event()

    def produce(k: int) -> None:
        try:
            with Producer(urls, destination="orders", timeout_s=60) as p:
                i = 0
                while not stop.is_set():
                    poison = "poison " if i % 50 == 7 else ""
                    dedup, body = f"p{k}-{i}", f"{poison}message {k}/{i}"
                    p.send_sync(body, dedup_id=dedup, group_id=f"g{i % 3}")
                    acked[dedup] = body
                    i += 1
        except BaseException as exc:
            failures.append(exc)

    first_seen: dict[int, str] = {}  # offset -> body, at its first delivery
    order: list[tuple[str, str, int]] = []  # (producer, group, i) in first-delivery order
    draining = threading.Event()

    def consume() -> None:  # through every failover: it attaches again by itself
        try:
            with Consumer(urls, "orders", prefetch=200, timeout_s=60) as consumer:
                while not (draining.is_set() and len(first_seen) >= len(acked) and _empty()):
                    for m in consumer.receive_many(200, timeout=0.5):
                        if m.offset not in first_seen:
                            first_seen[m.offset] = m.text
                            k, i = m.text.split(" ")[-1].split("/")
                            order.append((k, m.group_id or "", int(i)))
                        if m.text.startswith("poison"):
                            consumer.nack(m)  # its second delivery dead-letters it
                        else:
                            consumer.ack(m)
        except BaseException as exc:
            failures.append(exc)

    def _empty() -> bool:  # every message settled: acked, or dead-lettered (the poison)
        with Admin(urls) as admin:
            return admin.stats("orders")["depth"] == 0

    threads = [threading.Thread(target=produce, args=(k,)) for k in range(2)]
    threads.append(threading.Thread(target=consume))
    for t in threads:
        t.start()
    primary, backup = a, b
    epochs = []
    # (12 in the suite, for its time; SPARKMQ_FAILOVER_ROUNDS=20 or more for a longer run)
    rounds = int(os.environ.get("SPARKMQ_FAILOVER_ROUNDS", "12"))
    try:
        for _ in range(rounds):
            wait_for(lambda p=primary: in_sync(p.url), timeout=60, what="the backup in sync")
            time.sleep(0.5)  # load on the primary
            before = len(acked)
            assert primary.process is not None and backup.process is not None
            primary.process.kill()  # the machine is gone: its process and its disk
            shutil.rmtree(primary.hot, ignore_errors=True)
            backup.process.wait_ready(60)
            epochs.append(Ownership(str(a.root)).epoch())
            primary.launch()  # a new machine in its place: the backup now
            primary, backup = backup, primary
            wait_for(lambda b=before: len(acked) > b + 10, timeout=60, what="sends to go on")
            assert not failures, failures
    finally:
        stop.set()
        for t in threads[:2]:
            t.join(90)
        draining.set()
        threads[2].join(180)
    assert not failures, failures
    assert not threads[2].is_alive()
    assert epochs == sorted(set(epochs)) and len(epochs) == rounds
    with Admin(urls) as admin:
        assert admin.stats("orders")["end_offset"] == len(acked)
    assert sorted(first_seen.values()) == sorted(acked.values())
    by_group: dict[tuple[str, str], list[int]] = {}
    for k, g, i in order:
        by_group.setdefault((k, g), []).append(i)
    for seq in by_group.values():  # per producer and group, in the order they were sent
        assert seq == sorted(seq)
    poison = sorted(v for v in acked.values() if v.startswith("poison"))
    assert poison
    with Admin(urls) as admin:  # each stored there exactly once: no more, no fewer
        assert admin.stats("DLQ.orders")["end_offset"] == len(poison)
    dead: dict[str, int] = {}
    with Consumer(urls, "DLQ.orders", prefetch=500) as dlq:
        deadline = time.monotonic() + 60
        while sum(dead.values()) < len(poison) and time.monotonic() < deadline:
            for m in dlq.receive_many(500, timeout=2):
                dead[m.text] = dead.get(m.text, 0) + 1
                dlq.ack(m)
    assert sorted(dead) == poison and set(dead.values()) == {1}  # each exactly once
    for m in (a, b):
        if m.process is not None:
            m.process.stop()
    dedups = DeltaStore(str(a.root)).read_messages("orders", 0, None)["dedup_id"].to_pylist()
    assert len(dedups) == len(set(dedups)) == len(acked)


def test_a_backup_that_is_not_in_sync_refuses_to_take_over(tmp_path: Path) -> None:
    a, b = pair(tmp_path)
    a.launch().wait_ready(60)
    with Producer(a.url, destination="q") as p:  # acknowledged by a alone: no backup yet
        for i in range(20):
            p.send_sync(f"alone {i}")
    assert a.process is not None
    a.process.kill()
    b.launch()
    wait_for(lambda: "not in sync with a (epoch 1)" in b.log_text(), timeout=30, what="b to say")
    assert b.process is not None and not b.process.serving  # it did not take over
    a.launch().wait_ready(60)  # a comes back with its disk: it owned the data last
    wait_for(lambda: in_sync(a.url), timeout=60, what="b to catch up")
    with Admin(a.url) as admin:
        assert admin.stats("q")["end_offset"] == 20
    for m in (a, b):
        if m.process is not None:
            m.process.stop()


def test_a_paused_primary_resumed_after_the_failover_acknowledges_nothing(tmp_path: Path) -> None:
    a, b = pair(tmp_path)
    urls = [a.url, b.url]
    a.launch().wait_ready(60)
    b.launch()
    wait_for(lambda: in_sync(a.url), timeout=60, what="the backup to be in sync")
    assert a.process is not None and a.process.proc is not None
    assert b.process is not None
    with Producer(a.url, destination="q") as p:
        for i in range(10):
            p.send_sync(f"before {i}")
    late = Producer(a.url, destination="q", transport="flight", timeout_s=5)
    a.process.proc.send_signal(signal.SIGSTOP)  # paused: the backup hears nothing
    try:
        b.process.wait_ready(60)  # it took over
        with Producer(b.url, destination="q") as p:
            for i in range(10):
                p.send_sync(f"after {i}")
    finally:
        a.process.proc.send_signal(signal.SIGCONT)
    late_result: list[object] = []
    try:
        late_result.append(late.send_sync("from the old primary"))
    except SparkMQError as exc:
        late_result.append(exc)
    finally:
        late.close()
    assert isinstance(late_result[0], SparkMQError), late_result  # never acknowledged
    wait_for(lambda: "deposed" in a.log_text(), timeout=30, what="a to step down")
    with Admin(b.url) as admin:
        assert admin.stats("q")["end_offset"] == 20
        assert admin.broker_state()["epoch"] == 2
    bodies = DeltaStore(str(a.root)).read_messages("q", 0, None)["body"].to_pylist()
    assert b"from the old primary" not in bodies
    for m in (a, b):
        if m.process is not None:
            m.process.stop()
    del urls


def test_the_replication_channel_authenticates_and_encrypts(tmp_path: Path) -> None:
    """With security and TLS on, the backup logs in (its environment's credentials, a user the
    rules allow admin) over TLS; a backup whose user may not is refused, saying why."""
    from spark_mq.ha.replication import ChannelSecurity, Follower
    from spark_mq.security.credentials import Auth
    from tests.security_kit import PASSWORDS, Authority, security_settings

    a, b = pair(tmp_path)
    ca = Authority(tmp_path)
    server = ca.issue("localhost", server=True)
    settings: dict[str, object] = {
        **security_settings(tmp_path),
        "security.tls_cert_file": server.cert_file,
        "security.tls_key_file": server.key_file,
    }
    env = {
        "SPARKMQ_USERNAME": "alice",
        "SPARKMQ_PASSWORD": PASSWORDS["alice"],
        "SPARKMQ_TLS_CA_FILE": str(ca.cert_file),
    }
    creds = {"username": "alice", "password": PASSWORDS["alice"], "tls_ca_file": str(ca.cert_file)}
    a.launch(env=env, **settings).wait_ready(60)
    assert a.process is not None and a.process.url.startswith("grpc+tls://")
    b.launch(env=env, **settings)
    tls_a = a.process.url
    wait_for(lambda: in_sync(tls_a, **creds), timeout=60, what="the backup in sync over TLS")
    # a backup of bob's (not allowed admin), set up as a broker sets up its own
    bobs = Auth.of("bob", PASSWORDS["bob"], tls_ca_file=str(ca.cert_file))
    channel = ChannelSecurity(client_tls=bobs.ssl_context(), credentials=bobs.hello())
    rogue = Follower(
        str(tmp_path / "hot-rogue"), "rogue", segment_bytes=1 << 20, timeout_s=5, channel=channel
    )
    assert rogue.follow(("127.0.0.1", a.repl_port), None) is None
    assert "'bob' may not admin" in rogue.refused
    plain = Follower(str(tmp_path / "hot-plain"), "plain", segment_bytes=1 << 20, timeout_s=5)
    assert plain.follow(("127.0.0.1", a.repl_port), None) is None  # no TLS: no handshake
    assert in_sync(tls_a, **creds)  # the real backup kept its place
    with Producer(tls_a, destination="q", **creds) as p:
        for i in range(10):
            p.send_sync(f"secret {i}")
    a.process.kill()
    assert b.process is not None
    b.process.wait_ready(60)
    with Admin(b.process.url, **creds) as admin:
        assert admin.stats("q")["end_offset"] == 10
    b.process.stop()


def test_promote_hands_over_to_the_replicating_backup(tmp_path: Path) -> None:
    a, b = pair(tmp_path)
    urls = [a.url, b.url]
    a.launch().wait_ready(60)
    b.launch()
    wait_for(lambda: in_sync(a.url), timeout=60, what="the backup in sync")
    with Producer(urls, destination="q") as p:
        for i in range(10):
            p.send_sync(f"before {i}")
        with Admin(a.url) as admin:
            lag = admin.broker_state()
            assert lag["replication_backup"] == "b" and lag["replication_lag_records"] == 0
            assert admin.promote()["handing_over"]
        assert b.process is not None
        b.process.wait_ready(60)
        for i in range(10):
            p.send_sync(f"after {i}")  # follows to b
    wait_for(lambda: in_sync(b.url), timeout=60, what="a to follow b")
    with Admin(b.url) as admin:
        state = admin.broker_state()
        assert (state["broker_id"], state["epoch"], state["replication_backup"]) == ("b", 2, "a")
        assert admin.stats("q")["end_offset"] == 20
    for m in (a, b):
        if m.process is not None:
            m.process.stop()
