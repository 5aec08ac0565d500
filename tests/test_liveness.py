"""Clients notice a silent broker (heartbeats they ask for, and a watchdog that cuts a connection
silent for four intervals while the client waits), and only a silent one: a client that does
not read for a while, or waits on a broker that answers slowly but beats, keeps its
connection."""

from __future__ import annotations

import logging
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from spark_mq import Consumer, Producer
from spark_mq.client import _liveness
from spark_mq.clock import ManualClock
from spark_mq.errors import BrokerUnavailable
from spark_mq.launch import BrokerProcess
from spark_mq.service import RunningBroker
from tests.conftest import start_inprocess, wait_for


@pytest.mark.process
@pytest.mark.parametrize("transport", ["wire", "flight"])
def test_a_paused_broker_fails_sends_and_receives_within_seconds(
    tmp_path: Path, transport: str
) -> None:
    """One broker, paused: a synchronous send and a waiting receive fail with BrokerUnavailable
    a few seconds later (the heartbeat interval is 0.5 s: dead after 2 s), not when timeout_s
    (60 s) runs out nor when the broker resumes."""
    process = BrokerProcess(str(tmp_path / "data")).start()
    assert process.proc is not None
    try:
        with (
            Producer(
                process.url, destination="q", transport=transport, timeout_s=60, heartbeat_s=0.5
            ) as producer,
            Consumer(
                process.url, "q", transport=transport, timeout_s=60, heartbeat_s=0.5
            ) as consumer,
        ):
            producer.send_sync("before")
            m = consumer.receive(timeout=10)
            assert m is not None
            m.ack().result(10)
            process.proc.send_signal(signal.SIGSTOP)
            pid = process.proc.pid  # (stopped before the send: a signal lands when it lands)
            wait_for(lambda: _state(pid) == "T", timeout=10, what="the broker stopped")
            started = time.monotonic()
            with pytest.raises(BrokerUnavailable, match="taken for dead"):
                producer.send_sync("while paused")
            assert time.monotonic() - started < 6
            started = time.monotonic()
            with pytest.raises(BrokerUnavailable, match="taken for dead"):
                consumer.receive(timeout=30)
            assert time.monotonic() - started < 6
    finally:
        process.proc.send_signal(signal.SIGCONT)
        process.stop()


@pytest.mark.process
def test_a_flight_producer_closes_within_its_timeout_while_its_broker_is_paused(
    tmp_path: Path,
) -> None:
    """Nothing in flight, so no watchdog cuts the stream: closing it waits for the broker to end
    its answers, and a paused broker never does. The close gives up after ``timeout_s`` (it
    waited 300 s once, in the test above)."""
    process = BrokerProcess(str(tmp_path / "data")).start()
    assert process.proc is not None
    try:
        producer = Producer(process.url, destination="q", transport="flight", timeout_s=2)
        producer.send_sync("before")
        process.proc.send_signal(signal.SIGSTOP)
        pid = process.proc.pid
        wait_for(lambda: _state(pid) == "T", timeout=10, what="the broker stopped")
        started = time.monotonic()
        producer.close()
        assert time.monotonic() - started < 8
    finally:
        process.proc.send_signal(signal.SIGCONT)
        process.stop()


def _state(pid: int) -> str:
    """A process's state letter (``T``: stopped by a signal)."""
    with open(f"/proc/{pid}/stat") as fh:
        return fh.read().rsplit(")", 1)[1].split()[0]


@pytest.fixture
def unsynced_broker(tmp_path: Path, clock: ManualClock) -> Iterator[RunningBroker]:
    """An in-process broker that does not sync its journal: its loop never waits on the disk,
    which a busy machine can make slower than the heartbeats (a CI run once saw this test's
    client take its broker for dead: 1 s of silence, cause not found; the intervals here are
    twice as long since)."""
    running = start_inprocess(tmp_path / "data", clock, **{"journal.sync": "none"})
    try:
        yield running
    finally:
        running.stop()


def test_a_client_that_reads_nothing_for_a_while_keeps_its_connection(
    unsynced_broker: RunningBroker, caplog: pytest.LogCaptureFixture
) -> None:
    """A consumer busy with a message (not reading) for longer than the dead-after time, and a
    producer idle as long, are not cut: silence counts only while the client waits."""
    caplog.set_level(logging.WARNING, logger="spark_mq.client._liveness")
    broker = unsynced_broker
    with (
        Producer(broker.url, destination="q", heartbeat_s=0.5, linger_ms=0) as producer,
        Consumer(broker.url, "q", heartbeat_s=0.5, prefetch=10) as consumer,
    ):
        producer.send_sync("one")
        first = consumer.receive(timeout=10)
        assert first is not None
        attached = consumer.consumer_id
        # dead after 2 s of silence while waiting: 12 looks (3 s), and this is not waiting
        assert _liveness.wait_ticks(12)
        first.ack().result(10)
        producer.send_sync("two")
        second = consumer.receive(timeout=10)
        assert second is not None and second.text == "two"
        assert consumer.consumer_id == attached  # the same link: never cut
        assert _liveness.wait_ticks(12)  # an empty queue, a consumer waiting: heartbeats
        assert consumer.receive(timeout=3) is None
        assert consumer.consumer_id == attached
    assert "taken for dead" not in caplog.text


class _Silent:
    """A watched connection the test controls."""

    def __init__(self) -> None:
        self.received = 0
        self.waiting = True
        self.reason: str | None = None

    def expecting(self) -> bool:
        return self.waiting

    def cut(self, reason: str) -> None:
        self.reason = reason


def test_the_watchdog_counts_silence_only_while_the_client_waits() -> None:
    dog = _liveness.Watchdog(tick_s=0.01)
    beating, idle, silent = _Silent(), _Silent(), _Silent()
    idle.waiting = False
    for conn in (beating, idle, silent):
        dog.watch(conn, heartbeat_s=0.05)  # dead after 0.2 s
    for _ in range(60):  # 0.6 s
        beating.received += 1
        time.sleep(0.01)
    assert beating.reason is None and idle.reason is None
    assert silent.reason is not None and "taken for dead" in silent.reason
