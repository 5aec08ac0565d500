"""Message-driven consumers with a pool of handlers (seed 001's activation specification):
``Consumer(on_message=..., concurrency=N, start_timeout_s=...)`` against real brokers, and the
pool's bookkeeping (spark_mq.client._lanes) on its own."""

from __future__ import annotations

import collections
import threading
import time
from pathlib import Path

import pytest

from spark_mq import Consumer, Producer
from spark_mq.client._lanes import Lanes
from spark_mq.launch import BrokerProcess
from tests.conftest import wait_for


def test_lanes_keep_a_group_with_one_handler_and_time_out_only_the_unstarted() -> None:
    lanes: Lanes[tuple[str, str | None]] = Lanes(lambda m: m[1])
    for m in [("a1", "a"), ("b1", "b"), ("a2", "a"), ("x", None), ("a3", "a")]:
        lanes.add(m, now=0.0)
    assert lanes.take() == ("a1", "a")
    assert lanes.take() == ("b1", "b")
    assert lanes.take() == ("x", None)  # a2 waits behind a1, for a1's handler
    assert lanes.take() is None
    assert lanes.done(("a1", "a")) == ("a2", "a")  # the same handler goes on with the group
    assert lanes.done(("b1", "b")) is None  # b is free again
    lanes.add(("b2", "b"), now=5.0)
    assert lanes.expired(now=6.0, limit_s=2.0) == []  # a3 waits for its group, not a handler
    assert lanes.expired(now=7.5, limit_s=2.0) == [("b2", "b")]
    assert lanes.done(("a2", "a")) == ("a3", "a")
    assert lanes.done(("a3", "a")) is None and len(lanes) == 0


def test_a_pool_is_refused_clearly_when_it_cannot_be(broker) -> None:
    with pytest.raises(ValueError, match="1 or more"):
        Consumer(broker.url, "q", on_message=print, concurrency=0)
    with pytest.raises(ValueError, match="on_message"):
        Consumer(broker.url, "q", concurrency=4)


def test_ten_handlers_run_at_once_and_each_group_keeps_its_order(broker) -> None:
    groups, per_group = 4, 10
    with Producer(broker.url, destination="pooled", linger_ms=0) as p:
        for i in range(per_group):
            for g in range(groups):
                p.send_sync(f"{i}", group_id=f"g{g}")
        for i in range(60):
            p.send_sync(f"free-{i}")
    total = groups * per_group + 60
    lock = threading.Lock()
    state = {"running": 0, "most": 0, "handled": 0}
    busy: set[str] = set()
    overlaps: list[str] = []
    order: dict[str, list[int]] = collections.defaultdict(list)
    all_done = threading.Event()

    def handler(m) -> None:
        g = m.group_id
        with lock:
            state["running"] += 1
            state["most"] = max(state["most"], state["running"])
            if g is not None:
                if g in busy:
                    overlaps.append(g)
                busy.add(g)
                order[g].append(int(m.text))
        time.sleep(0.03)
        with lock:
            busy.discard(g)
            state["running"] -= 1
        m.ack().result(10)
        with lock:
            state["handled"] += 1
            if state["handled"] == total:
                all_done.set()

    c = Consumer(broker.url, "pooled", on_message=handler, concurrency=10, prefetch=200)
    try:
        assert all_done.wait(60)
    finally:
        c.close()
    assert state["most"] == 10
    assert not overlaps
    assert dict(order) == {f"g{g}": list(range(per_group)) for g in range(groups)}
    with Consumer(broker.url, "pooled") as check:
        assert check.receive(timeout=0.3) is None  # every one acked


def test_a_message_no_handler_took_in_time_goes_to_another_consumer(broker) -> None:
    with Producer(broker.url, destination="waits", linger_ms=0) as p:
        for i in range(4):
            p.send_sync(f"{i}")
    release = threading.Event()
    started: list[str] = []

    def slow(m) -> None:
        started.append(m.text)
        release.wait(30)
        m.ack()

    busy = Consumer(
        broker.url, "waits", on_message=slow, concurrency=1, start_timeout_s=0.3, prefetch=4
    )
    try:
        wait_for(lambda: started, timeout=10, what="the busy handler to start")
        taken = []
        with Consumer(broker.url, "waits") as other:
            while len(taken) < 3:
                m = other.receive(timeout=10)
                assert m is not None, f"the other consumer got only {taken}"
                taken.append(m.text)
                m.ack().result(10)
        assert sorted(taken) == sorted({"0", "1", "2", "3"} - set(started))
    finally:
        release.set()
        busy.close()
    assert len(started) == 1


@pytest.mark.process
def test_a_slow_handlers_lease_is_extended_while_it_runs(tmp_path: Path) -> None:
    """A lease of 1 s and a handler that runs until another consumer has polled for its message
    15 times in vain (3 s, three leases): nobody else gets it meanwhile, and it is delivered
    once."""
    b = BrokerProcess(
        str(tmp_path / "data"), extra_args=["--set", "delivery.mark_interval_s=1"]
    ).launch()
    try:
        b.wait_ready(60)
        with Producer(b.url, destination="slow", linger_ms=0) as p:
            p.send_sync("job")
        counts: list[int] = []
        finished = threading.Event()
        polled_long_enough = threading.Event()

        def handler(m) -> None:
            counts.append(m.delivery_count)
            assert polled_long_enough.wait(60)
            m.ack().result(10)
            finished.set()

        pooled = Consumer(b.url, "slow", on_message=handler, concurrency=2)
        stolen = []
        try:
            with Consumer(b.url, "slow") as other:
                polls = 0
                while not finished.is_set():
                    m = other.receive(timeout=0.2)
                    if m is not None:
                        stolen.append(m.text)
                    polls += 1
                    if polls >= 15 and counts:
                        polled_long_enough.set()
        finally:
            pooled.close()
        assert counts == [1] and stolen == []
    finally:
        b.stop()
