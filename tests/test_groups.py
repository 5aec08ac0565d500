"""Message groups: one consumer per group, in order; handover only when nothing is in flight."""

from __future__ import annotations

import threading
import time
from collections import defaultdict

import pyarrow as pa

from spark_mq import Admin, Consumer, Producer
from spark_mq.service import RunningBroker
from tests.conftest import Restartable, receive_n


def send_groups(url: str, groups: int, per_group: int) -> None:
    with Producer(url, destination="q") as producer:
        bodies, keys = [], []
        for seq in range(per_group):
            for g in range(groups):
                bodies.append(f"{g}:{seq}".encode())
                keys.append(f"g{g}")
        producer.send_batch(pa.table({"body": bodies, "group_id": keys}))


def test_each_group_goes_to_one_consumer_in_order(broker: RunningBroker) -> None:
    with Admin(broker.url) as admin:
        admin.create_queue("q")
    send_groups(broker.url, groups=20, per_group=15)
    seen: dict[str, list[tuple[int, int]]] = defaultdict(list)
    lock = threading.Lock()
    consumers = [Consumer(broker.url, "q", prefetch=7) for _ in range(3)]
    try:

        def work(i: int) -> None:
            c = consumers[i]
            while True:
                with lock:
                    if sum(map(len, seen.values())) >= 300:  # 20 groups x 15
                        return
                batch = c.receive_many(50, timeout=0.2)
                with lock:
                    for m in batch:
                        g, seq = m.text.split(":")
                        seen[g].append((i, int(seq)))
                c.ack(batch).result(timeout=10)

        threads = [threading.Thread(target=work, args=(i,)) for i in range(3)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=60)
            assert not t.is_alive(), "a consumer never saw all 300 messages"
    finally:
        for c in consumers:
            c.close()
    assert sorted(seen) == sorted(str(g) for g in range(20))
    owners = set()
    for g, got in seen.items():
        assert [seq for _, seq in got] == list(range(15)), f"group {g} out of order: {got}"
        assert len({who for who, _ in got}) == 1, f"group {g} went to several consumers"
        owners.add(got[0][0])
    assert len(owners) > 1  # the groups were spread over the consumers


def test_a_group_moves_when_its_owner_leaves_flagged_and_in_order(broker: RunningBroker) -> None:
    with Admin(broker.url) as admin:
        admin.create_queue("q")
    send_groups(broker.url, groups=1, per_group=6)
    first = Consumer(broker.url, "q", prefetch=2)
    with Consumer(broker.url, "q", prefetch=10) as second:
        got = receive_n(first, 2)
        assert [m.text for m in got] == ["0:0", "0:1"]
        assert got[0].group_first and not got[1].group_first
        assert second.receive(timeout=0.3) is None  # the group is owned by the first
        got[0].ack().result(timeout=5)
        first.close()  # 0:1 was delivered and not acked: it goes to the next owner first
        moved = receive_n(second, 5)
        assert [m.text for m in moved] == ["0:1", "0:2", "0:3", "0:4", "0:5"]
        assert moved[0].group_first and moved[0].redelivered
        assert not any(m.group_first for m in moved[1:])


def test_autogroup_pins_a_producer_to_one_consumer(broker: RunningBroker) -> None:
    with Admin(broker.url) as admin:
        admin.create_queue("q")
    with Producer(broker.url, destination="q", autogroup=True) as producer:
        producer.send_batch([b"%d" % i for i in range(10)])
        producer.send("one more")
    with Consumer(broker.url, "q", prefetch=100) as a, Consumer(broker.url, "q", prefetch=100) as b:
        got: list = []
        deadline = time.monotonic() + 30
        while len(got) < 11:
            assert time.monotonic() < deadline, f"only {len(got)} of 11 delivered"
            got += a.receive_many(11, timeout=0.1) + b.receive_many(11, timeout=0.1)
        assert len({m.group_id for m in got}) == 1 and got[0].group_id.startswith("auto-")
        assert [m.text for m in got][-1] == "one more"


def test_bindings_are_bounded_by_buckets_and_rebuilt_after_restart(
    restartable: Restartable,
) -> None:
    broker = restartable
    with Admin(broker.url) as admin:
        admin.create_queue("q", group_buckets=4)
    send_groups(broker.url, groups=50, per_group=2)
    with Consumer(broker.url, "q", prefetch=1000) as consumer:
        got = receive_n(consumer, 100)
        assert broker.broker.stats("q")["groups_owned"] <= 4
        consumer.ack(got[:50]).result(timeout=5)  # the first message of every group
    broker.restart()
    with Consumer(broker.url, "q", prefetch=1000) as consumer:
        again = receive_n(consumer, 50)
        assert sorted(m.text for m in again) == sorted(f"{g}:1" for g in range(50))
        assert broker.broker.stats("q")["groups_owned"] <= 4


def test_a_consumer_that_acked_one_group_takes_the_next(broker: RunningBroker) -> None:
    """Its emptied group no longer counts against its share: a new group is not refused (it
    waited for ever, with the consumer attached and idle)."""
    with Producer(broker.url, destination="q") as producer, Consumer(broker.url, "q") as consumer:
        for group in ("A", "B", "C"):
            producer.send_sync(f"{group}1", group_id=group)
            (got,) = receive_n(consumer, 1)
            assert got.text == f"{group}1" and got.group_first
            got.ack().result(timeout=5)
        # a group it owned comes back to it, with no new-owner flag
        producer.send_sync("A2", group_id="A")
        (again,) = receive_n(consumer, 1)
        assert again.text == "A2" and not again.group_first


def test_groups_keep_flowing_to_two_consumers_as_each_empties(broker: RunningBroker) -> None:
    with Admin(broker.url) as admin:
        admin.create_queue("q")
    with (
        Producer(broker.url, destination="q") as producer,
        Consumer(broker.url, "q", prefetch=5) as one,
        Consumer(broker.url, "q", prefetch=5) as two,
    ):
        for round_ in range(6):
            for g in range(4):
                producer.send(f"{round_}:{g}", group_id=f"r{round_}g{g}")
            producer.flush()
            got = []
            deadline = time.monotonic() + 10
            while len(got) < 4:
                assert time.monotonic() < deadline, f"round {round_}: only {got}"
                for c in (one, two):
                    batch = c.receive_many(4, timeout=0.05)
                    got += [m.text for m in batch]
                    if batch:
                        c.ack(batch).result(timeout=5)
            assert sorted(got) == sorted(f"{round_}:{g}" for g in range(4))
