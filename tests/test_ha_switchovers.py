"""A replicating pair switched over again and again, with real broker processes: a broker that
stepped down (after a pause or a promote) takes over again when the new primary goes; clients
connected to a silent (paused) primary move to the backup within seconds of its takeover, on the
direct wire and on Flight; stepping down takes about the shutdown grace and says what it leaves;
and ten switchovers of mixed kinds (kill, pause, promote) under load lose nothing acknowledged."""

from __future__ import annotations

import os
import shutil
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from spark_mq import Admin, Consumer, Producer
from spark_mq.errors import SparkMQError
from spark_mq.ha.ownership import Ownership
from spark_mq.journal.delta_store import DeltaStore
from tests.conftest import wait_for
from tests.ha_kit import Member, in_sync, pair

pytestmark = pytest.mark.process


def _start_pair(tmp_path: Path, **settings: object) -> tuple[Member, Member]:
    a, b = pair(tmp_path)
    a.launch(**settings).wait_ready(60)
    b.launch(**settings)
    wait_for(lambda: in_sync(a.url), timeout=60, what="the backup in sync")
    return a, b


def _stop(*members: Member) -> None:
    for m in members:
        if m.process is not None and m.process.proc is not None:
            if m.process.proc.poll() is None:
                m.process.proc.send_signal(signal.SIGCONT)  # (a paused one stops too)
            m.process.stop()


def _pause(member: Member) -> None:
    assert member.process is not None and member.process.proc is not None
    member.process.proc.send_signal(signal.SIGSTOP)


def _resume(member: Member) -> None:
    assert member.process is not None and member.process.proc is not None
    member.process.proc.send_signal(signal.SIGCONT)


def _took_over(member: Member, epoch: int) -> Callable[[], bool]:
    """Whether ``member`` serves as the primary of ``epoch`` (its ready file says so)."""

    def check() -> bool:
        try:
            with Admin(member.url, timeout_s=2) as admin:
                return admin.broker_state()["epoch"] == epoch
        except SparkMQError:
            return False

    return check


def test_a_broker_that_stepped_down_takes_over_again(tmp_path: Path) -> None:
    """Promote hands a's term to b; a follows. When b is killed, a takes over again (it used to
    crash: its stepped-down replication listener still held the port). Then a is paused, b takes
    over; resumed, a steps down and follows; killing b makes a primary a third time."""
    a, b = _start_pair(tmp_path)
    urls = [a.url, b.url]
    with Producer(urls, destination="q") as p:
        p.send_sync("1")
    with Admin(a.url) as admin:
        admin.promote()  # epoch 2: b
    wait_for(_took_over(b, 2), timeout=60, what="b to take over")
    wait_for(lambda: in_sync(b.url), timeout=60, what="a to follow b")
    with Producer(urls, destination="q") as p:
        p.send_sync("2")
    assert b.process is not None
    b.process.kill()  # epoch 3: a, which stepped down once already
    wait_for(_took_over(a, 3), timeout=60, what="a to take over again")
    b.launch()
    wait_for(lambda: in_sync(a.url), timeout=60, what="b to follow a")
    with Producer(urls, destination="q") as p:
        p.send_sync("3")
    _pause(a)  # epoch 4: b
    try:
        wait_for(_took_over(b, 4), timeout=60, what="b to take over from the paused a")
    finally:
        _resume(a)
    wait_for(lambda: in_sync(b.url), timeout=60, what="the resumed a to follow b")
    with Producer(urls, destination="q") as p:
        p.send_sync("4")
    b.process.kill()  # epoch 5: a, after a pause and a step-down
    wait_for(_took_over(a, 5), timeout=60, what="a to take over a third time")
    with Producer(urls, destination="q") as p:
        p.send_sync("5")
    with Admin(urls) as admin:
        assert admin.stats("q")["end_offset"] == 5
    assert "Address already in use" not in a.log_text()
    _stop(a, b)
    bodies = DeltaStore(str(a.root)).read_messages("q", 0, None)["body"].to_pylist()
    assert bodies == [b"1", b"2", b"3", b"4", b"5"]


def _silent_primary_clients(urls: list[str], transport: str, stop: threading.Event, log: dict):
    """A producer sending synchronously and a consumer receiving, each noting when it last made
    progress (``log[transport + ' sent' / ' received']``: monotonic times)."""
    sent, received = (
        log.setdefault(f"{transport} sent", []),
        log.setdefault(f"{transport} received", []),
    )
    errors = log.setdefault("errors", [])

    def produce() -> None:
        try:
            with Producer(
                urls, destination=f"q-{transport}", transport=transport, timeout_s=60
            ) as p:  # type: ignore[arg-type]
                i = 0
                while not stop.is_set():
                    p.send_sync(f"{i}", dedup_id=f"{transport}-{i}")
                    sent.append(time.monotonic())
                    i += 1
                    time.sleep(0.02)
        except BaseException as exc:
            errors.append(exc)

    def consume() -> None:
        try:
            with Consumer(urls, f"q-{transport}", transport=transport, timeout_s=60) as c:  # type: ignore[arg-type]
                while not stop.is_set():
                    for m in c.receive_many(50, timeout=0.2):
                        received.append(time.monotonic())
                        c.ack(m)
        except BaseException as exc:
            errors.append(exc)

    return [threading.Thread(target=produce), threading.Thread(target=consume)]


def test_clients_on_a_paused_primary_move_to_the_backup_within_seconds(tmp_path: Path) -> None:
    """A paused primary (a hung machine, a stall, a partition) keeps its TCP connections open:
    the clients notice its silence (the heartbeats they asked for stop) and go to the backup
    that took over, on the direct wire and on Flight alike, while the old one is still paused."""
    a, b = _start_pair(tmp_path)
    urls = [a.url, b.url]
    stop = threading.Event()
    progress: dict = {}
    threads = [
        *_silent_primary_clients(urls, "wire", stop, progress),
        *_silent_primary_clients(urls, "flight", stop, progress),
    ]
    for t in threads:
        t.start()
    try:
        wait_for(
            lambda: all(len(progress.get(k, [])) > 5 for k in progress if k != "errors"),
            timeout=30,
            what="every client to make progress",
        )
        paused_at = time.monotonic()
        _pause(a)
        wait_for(_took_over(b, 2), timeout=30, what="b to take over")
        took_over = time.monotonic()

        def moved() -> bool:
            return all(any(t > took_over for t in progress[k]) for k in progress if k != "errors")

        wait_for(moved, timeout=15, what="every client to make progress on b")
        moved_at = time.monotonic()
        assert not progress["errors"], progress["errors"]
        # (the liveness checks take the broker for dead after 4 s of silence: each client moved
        # a few seconds after the pause, whatever timeout_s says)
        assert moved_at - took_over < 8, (took_over - paused_at, moved_at - took_over)
        assert moved_at - paused_at < 12
        assert a.process is not None and a.process.proc is not None
        assert a.process.proc.poll() is None  # still paused, not gone
    finally:
        stop.set()
        _resume(a)
        for t in threads:
            t.join(60)
    assert not progress["errors"], progress["errors"]
    _stop(a, b)


def test_stepping_down_takes_about_the_grace_and_says_what_it_leaves(tmp_path: Path) -> None:
    """Under load, a primary paused until its backup took over, then resumed, is deposed and
    steps down within its shutdown grace (2 s here; it waited 10 s more for moves to Delta it
    could not make any more), and its log says the truth about what it leaves behind."""
    a, b = _start_pair(tmp_path, **{"broker.shutdown_grace_s": 2})
    urls = [a.url, b.url]
    stop = threading.Event()
    progress: dict = {}
    threads = _silent_primary_clients(urls, "wire", stop, progress)
    for t in threads:
        t.start()
    try:
        wait_for(lambda: len(progress["wire sent"]) > 20, timeout=30, what="load")
        _pause(a)
        wait_for(_took_over(b, 2), timeout=30, what="b to take over")
        took_over = time.monotonic()  # (a stays paused until its clients moved on to b)
        wait_for(
            lambda: any(t > took_over for t in progress["wire sent"]),
            timeout=30,
            what="the clients to send to b",
        )
        resumed = time.monotonic()
        _resume(a)
        wait_for(lambda: "stepped down" in a.log_text(), timeout=30, what="a to step down")
        took = time.monotonic() - resumed
        assert took < 5, f"stepping down took {took:.1f} s"
    finally:
        stop.set()
        for t in threads:
            t.join(60)
    assert not progress["errors"], progress["errors"]
    text = a.log_text()
    stopped = [line for line in text.splitlines() if "broker stopped" in line]
    assert stopped and "deposed" in stopped[-1], stopped
    assert "every acknowledged message is durable" not in stopped[-1]
    wait_for(lambda: in_sync(b.url), timeout=60, what="a to follow b")
    _stop(a, b)


def _ten_switchovers(tmp_path: Path, kinds: list[str]) -> None:
    a, b = _start_pair(tmp_path)
    urls = [a.url, b.url]
    acked: dict[str, str] = {}
    failures: list[BaseException] = []
    stop = threading.Event()

    def produce(k: int) -> None:
        try:
            with Producer(urls, destination="orders", timeout_s=60) as p:
                i = 0
                while not stop.is_set():
                    dedup = f"p{k}-{i}"
                    p.send_sync(f"message {k}/{i}", dedup_id=dedup)
                    acked[dedup] = f"message {k}/{i}"
                    i += 1
        except BaseException as exc:
            failures.append(exc)

    seen: dict[int, str] = {}
    draining = threading.Event()

    def consume() -> None:
        try:
            with Consumer(urls, "orders", prefetch=200, timeout_s=60) as consumer:
                while not (draining.is_set() and len(seen) >= len(acked) and _empty()):
                    for m in consumer.receive_many(200, timeout=0.5):
                        seen.setdefault(m.offset, m.text)
                        consumer.ack(m)
        except BaseException as exc:
            failures.append(exc)

    def _empty() -> bool:
        with Admin(urls) as admin:
            return admin.stats("orders")["depth"] == 0

    threads = [threading.Thread(target=produce, args=(k,)) for k in range(2)]
    threads.append(threading.Thread(target=consume))
    for t in threads:
        t.start()
    primary, backup = a, b
    epoch = 1
    try:
        for kind in kinds:
            wait_for(lambda p=primary: in_sync(p.url), timeout=60, what="the backup in sync")
            before = len(acked)
            time.sleep(0.5)  # load on the primary
            assert primary.process is not None and backup.process is not None
            if kind == "kill":  # the machine is gone, its disk with it; a new one replaces it
                primary.process.kill()
                shutil.rmtree(primary.hot, ignore_errors=True)
                wait_for(_took_over(backup, epoch + 1), timeout=60, what=f"takeover ({kind})")
                primary.launch()
            elif kind == "pause":  # a hang: resumed once the backup took over, it steps down
                _pause(primary)
                try:
                    wait_for(_took_over(backup, epoch + 1), timeout=60, what="takeover (pause)")
                finally:
                    _resume(primary)
            else:  # promote: a planned switchover
                with Admin(primary.url) as admin:
                    admin.promote()
                wait_for(_took_over(backup, epoch + 1), timeout=60, what="takeover (promote)")
            epoch += 1
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
    assert Ownership(str(a.root)).epoch() == epoch == len(kinds) + 1
    with Admin(urls) as admin:
        assert admin.stats("orders")["end_offset"] == len(acked)  # stored once each
    assert sorted(seen.values()) == sorted(acked.values())  # every acknowledged one delivered
    _stop(a, b)
    dedups = DeltaStore(str(a.root)).read_messages("orders", 0, None)["dedup_id"].to_pylist()
    assert len(dedups) == len(set(dedups)) == len(acked)


def test_ten_switchovers_of_mixed_kinds_under_load_lose_nothing(tmp_path: Path) -> None:
    rounds = int(os.environ.get("SPARKMQ_SWITCHOVER_ROUNDS", "10"))
    kinds = [("kill", "pause", "promote")[i % 3] for i in range(rounds)]
    _ten_switchovers(tmp_path, kinds)


def test_the_pairs_brokers_write_logs_of_their_own(tmp_path: Path) -> None:
    """Both brokers of a pair on one data_dir, with the default (relative) log and audit files:
    each writes its own, under logs/<broker_id>/."""
    from spark_mq.config import load_config

    common = {"broker.data_dir": str(tmp_path), "ha.mode": "shared-store"}
    one = load_config(overrides={**common, "ha.broker_id": "mq1"}, environ={})
    two = load_config(overrides={**common, "ha.broker_id": "mq2"}, environ={})
    assert one.log_path() == tmp_path / "logs" / "mq1" / "log.txt"
    assert two.log_path() == tmp_path / "logs" / "mq2" / "log.txt"
    assert one.audit_path() != two.audit_path()
    alone = load_config(overrides={"broker.data_dir": str(tmp_path)}, environ={})
    assert alone.log_path() == tmp_path / "logs" / "log.txt"  # one broker: as it was
    with pytest.raises(SparkMQError, match="broker_id"):
        load_config(overrides={**common, "ha.broker_id": "../x"}, environ={})


@pytest.mark.parametrize("transport", ["wire", "stomp"])
def test_a_commit_waiting_for_the_backup_does_not_hold_up_the_loop(
    tmp_path: Path, transport: str
) -> None:
    """With replicated acknowledgements a commit waits for the backup; the backup paused, a
    send waits until the primary goes on alone (ha.failover_timeout_s). Meanwhile the loop
    that took the send serves everyone else: a consumer on another queue attaches, gets its
    message and acknowledges it while the send still waits."""
    from tests import stomp_kit

    a, b = _start_pair(tmp_path, **{"ha.failover_timeout_s": 6})
    try:
        with Producer(a.url, destination="other", transport="wire") as p:
            p.send_sync("stored before the pause")
        assert a.process is not None and a.process.stomp_port is not None
        _pause(b)
        sent = threading.Event()
        failures: list[BaseException] = []

        def send() -> None:
            try:
                if transport == "wire":
                    with Producer(a.url, destination="q", transport="wire") as p:
                        p.send_sync("waits for the backup")
                else:
                    conn, inbox = stomp_kit.connect(a.process.stomp_port)  # type: ignore[union-attr, arg-type]
                    conn.send("/queue/q", b"waits for the backup", receipt="r1")
                    inbox.wait_receipt("r1", timeout=30)
                    conn.disconnect()
                sent.set()
            except BaseException as exc:
                failures.append(exc)

        sender = threading.Thread(target=send, daemon=True)
        sender.start()
        time.sleep(0.5)  # the send is taken, and its commit waits for the paused backup
        assert not sent.is_set(), "the send did not wait for the backup"
        started = time.monotonic()
        if transport == "wire":
            with Consumer(a.url, "other", transport="wire", timeout_s=30) as c:
                got = c.receive(timeout=10)
                assert got is not None and got.text == "stored before the pause"
        else:
            conn, inbox = stomp_kit.connect(a.process.stomp_port)
            conn.subscribe("/queue/other", id="s", ack="auto")
            assert inbox.wait_messages(1, timeout=10)[0].body == b"stored before the pause"
            conn.disconnect()
        served_in = time.monotonic() - started
        assert not sent.is_set(), "the backup was given up on before the loop was tried"
        assert served_in < 2.0, f"the loop was held {served_in:.1f} s by a commit's wait"
        sender.join(30)
        assert sent.is_set() and not failures, failures  # acknowledged once it went on alone
    finally:
        _stop(a, b)
