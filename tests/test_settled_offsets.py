"""A subscription's settled offsets above its mark (spark_mq.broker.settled) answer as a Python
set of the same offsets would, whatever is added (one at a time, runs, scattered batches, below
what it holds, far above it) and forgotten; a held message with a million offsets settled after
it costs the subscription's tick little and a byte an offset; and the rows settled past a held
message leave the broker's memory (``MessageStore.drop_settled``), those still owed stay, and an
operator sees the mark held in the stats and the metrics."""

from __future__ import annotations

import time

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, generate_latest

from spark_mq import Admin, Consumer, Producer
from spark_mq.broker.message_store import MessageStore
from spark_mq.broker.settled import SettledOffsets
from spark_mq.clock import ManualClock
from spark_mq.messages import Messages
from spark_mq.ops.metrics import BrokerCollector, Scrape
from tests.conftest import Restartable, RunningBroker, receive_n
from tests.test_dispatch import rows, subscription

_MOVES = st.lists(
    st.tuples(
        st.sampled_from(["add", "run", "scattered", "forget", "far"]),
        st.integers(0, 3_000),
        st.integers(0, 40),
    ),
    max_size=50,
)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.integers(0, 2_000), max_size=30), _MOVES)
def test_it_answers_as_a_set_of_the_same_offsets(
    first: list[int], moves: list[tuple[str, int, int]]
) -> None:
    got = SettledOffsets(first)
    model = set(first)
    for move, at, size in moves:
        match move:
            case "add":
                got.add(at)
                model.add(at)
            case "run":  # consecutive (a batch of acks)
                got.update(list(range(at, at + size)))
                model.update(range(at, at + size))
            case "scattered":
                batch = sorted({at + 7 * i for i in range(size)})
                got.update(batch[::-1])
                model.update(batch)
            case "far":  # far above what it holds
                got.add(at + 1_000_000)
                model.add(at + 1_000_000)
            case "forget":
                got.forget_below(at)
                model = {o for o in model if o >= at}
        assert len(got) == len(model) and bool(got) == bool(model)
        assert got.offsets().tolist() == sorted(model) == list(got)
        assert got.highest() == max(model, default=-1)
        probe = np.array([at - 1, at, at + 1, at + size, 0, 1_000_000 + at], np.int64)
        assert got.mask(probe).tolist() == [int(o) in model for o in probe]
        assert got.settled(probe, at).tolist() == [o < at or int(o) in model for o in probe]
        assert [int(o) in got for o in probe] == [int(o) in model for o in probe]
        assert got.count_from(at) == sum(1 for o in model if o >= at)
    assert got == SettledOffsets(sorted(model))


def test_forgetting_most_of_a_big_window_lets_its_memory_go() -> None:
    s = SettledOffsets()
    s.update(list(range(1, 4_000_001)))
    s.forget_below(3_999_000)
    assert len(s) == 1_001 and 3_999_000 in s and 3_998_999 not in s
    assert s._flags.base is None and len(s._flags) < 100_000  # a copy, not a view of 4 MB


def test_a_held_message_and_a_million_acked_after_it_cost_the_tick_little() -> None:
    """A consumer keeps the first message (a long lease) while a million after it are taken and
    acked: the subscription's low-water mark stays at the held one, and each tick's mark (what
    ``run_timers`` asks for every 100 ms, under the subscription's lock) takes well under a
    millisecond (the offsets a set: 30-60 ms, copied whole each time), a byte an offset."""
    n = 1_000_000
    store = MessageStore()
    store.add(Messages.of(rows(0, n + 1)))
    sub = subscription(store, ManualClock())
    assert [o for o, _, _ in sub.take(1, 1, lease_s=3600)] == [0]
    while taken := sub.take(2, 10_000):
        ok, refused = sub.begin_ack(2, [(o, count) for o, count, _ in taken])
        assert not refused
        sub.end_ack(ok, durable=True)
    assert sub.low_water() == 0
    started = time.perf_counter()
    for _ in range(100):
        assert sub.low_water() == 0
    per_tick = (time.perf_counter() - started) / 100
    assert per_tick < 0.001, f"a tick's low-water mark took {per_tick * 1000:.1f} ms"
    assert sub._settled._flags.nbytes < 2 * n
    assert sub.stats(n + 1)["depth"] == 1
    assert sub.begin_ack(2, [(n, 1)])[1][0].reason == "already settled"


def test_a_subscription_s_mark_is_where_it_begins_before_any_tick(
    restartable: Restartable,
) -> None:
    """A topic subscription made after 50 messages reads its low-water mark at 50 at once (it
    read 0 until the timers' first tick found it), and after a restart each subscription's
    mark is the one recovered, before any tick."""
    url = restartable.url
    with Admin(url) as admin:
        admin.create_topic("late")
        admin.create_subscription("late", "first")
        with Producer(url, destination="late") as p:
            p.send_batch([b"m%d" % i for i in range(50)])
        admin.create_subscription("late", "second")
        subs = admin.stats("late")["subscriptions"]
    assert (subs["first"]["low_water_mark"], subs["second"]["low_water_mark"]) == (0, 50)
    with Consumer(url, "late", subscription="first", prefetch=50) as c:
        c.ack(receive_n(c, 30)).result(timeout=10)
    restartable.restart()
    with Admin(restartable.url) as admin:
        subs = admin.stats("late")["subscriptions"]
    assert (subs["first"]["low_water_mark"], subs["second"]["low_water_mark"]) == (30, 50)


def test_rows_acked_past_a_held_message_leave_memory_those_owed_stay(
    broker: RunningBroker, clock: ManualClock
) -> None:
    """A queue's first message is scheduled an hour on: the 2,000 sent and acked after it leave
    the broker's memory at the next tick (its mark stays at the held one), and the held one is
    delivered, whole, when its time comes. A topic whose one subscription acked everything and
    the other nothing keeps every row the other is owed, and delivers them whole."""
    with Admin(broker.url) as admin:
        admin.create_queue("q")
        admin.create_queue("sync")  # (every message a commit: a chunk a row)
        admin.create_topic("t")
        admin.create_subscription("t", "fast")
        admin.create_subscription("t", "slow")
    with Producer(broker.url, destination="q") as p:
        p.send_sync("held", delay_s=3600)
        for i in range(0, 2_000, 100):
            p.send_batch([b"m%d" % o for o in range(i, i + 100)])
    with Producer(broker.url, destination="t") as p:
        for i in range(0, 1_000, 100):
            p.send_batch([b"t%d" % o for o in range(i, i + 100)])
    with Producer(broker.url, destination="sync") as p:
        p.send_sync("held", delay_s=3600)
        for i in range(300):
            p.send_sync(b"s%d" % i)
    with Consumer(broker.url, "sync", prefetch=300) as c:
        c.ack(receive_n(c, 300)).result(timeout=10)
    with Consumer(broker.url, "q", prefetch=2_000) as c:
        c.ack(receive_n(c, 2_000)).result(timeout=10)
    with Consumer(broker.url, "t", subscription="fast", prefetch=1_000) as c:
        c.ack(receive_n(c, 1_000)).result(timeout=10)
    queue, topic = broker.broker.destinations.get("q"), broker.broker.destinations.get("t")
    sync = broker.broker.destinations.get("sync")
    assert queue.store.rows == 2_001 and topic.store.rows == 1_000 and sync.store.rows == 301
    clock.advance(1.0)  # (the look for settled rows: once a second)
    broker.broker.run_timers()
    assert queue.store.rows == 1  # the held message's
    assert sync.store.rows == 1
    assert topic.store.rows == 1_000  # "slow" is owed every one
    with Admin(broker.url) as admin:  # (what an operator sees: a mark held, acks past it)
        stats = admin.stats("q")
        assert (stats["low_water_mark"], stats["settled_past_mark"]) == (0, 2_000)
        assert stats["oldest_unsettled_age_s"] == pytest.approx(1.0, abs=0.01)
        subs = admin.stats("t")["subscriptions"]
        assert (subs["fast"]["low_water_mark"], subs["fast"]["settled_past_mark"]) == (1_000, 0)
        assert subs["fast"]["oldest_unsettled_age_s"] == 0.0
        assert (subs["slow"]["low_water_mark"], subs["slow"]["settled_past_mark"]) == (0, 0)
    registry = CollectorRegistry()
    registry.register(BrokerCollector(Scrape(broker.broker)))
    scraped = generate_latest(registry).decode()
    assert (
        'sparkmq_destination_settled_past_mark_messages{destination="q",kind="queue",'
        'subscription=""} 2000.0' in scraped
    )
    clock.advance(3600)
    broker.broker.run_timers()
    with Consumer(broker.url, "q") as c:
        (held,) = receive_n(c, 1)
        assert held.text == "held"
        held.ack().result(timeout=10)
    with Consumer(broker.url, "t", subscription="slow", prefetch=1_000) as c:
        got = receive_n(c, 1_000)
        assert [m.body for m in got] == [b"t%d" % o for o in range(1_000)]
        c.ack(got).result(timeout=10)
    clock.advance(1.0)
    broker.broker.run_timers()
    assert queue.store.rows == 0 and topic.store.rows == 0


def test_a_look_for_settled_chunks_goes_on_where_the_last_stopped() -> None:
    """``most_rows`` rows and ``most_chunks`` chunks at most a look (one at least), none past
    ``upto``; the next starts after them, and 0 once it looked as far as it could; a chunk with
    one offset unsettled stays whole, and the log's end does not move."""
    store = MessageStore()
    for first in range(0, 50, 10):
        store.add(Messages.of(rows(first, 10)))
    unsettled = {23}

    def settled(offsets: np.ndarray) -> np.ndarray:
        return ~np.isin(offsets, list(unsettled))

    assert store.drop_settled(settled, 0, 49, 25, 100) == (20, 20)
    assert store.drop_settled(settled, 20, 49, 100, 2) == (10, 40)  # 20-29 stays
    assert store.drop_settled(settled, 40, 49, 5, 100) == (10, 0)  # (one chunk at least)
    assert store.rows == 10 and store.end == 50
    assert store.take([23]).column("offset").to_pylist() == [23]
    unsettled.clear()
    assert store.drop_settled(settled, 0, 28, 100, 100) == (0, 0)  # (none settled past 28)
    assert store.drop_settled(settled, 0, 29, 100, 100) == (10, 0) and store.rows == 0
    assert store.drop_settled(settled, 0, 100, 100, 100) == (0, 0)


def test_a_held_message_s_enqueue_time_is_read_from_rows_and_from_plain_messages() -> None:
    """(What the age of the oldest unsettled message is made of.) A plain chunk answers from its
    messages, without building its table; a chunk of rows from its column; None if not held."""
    from spark_mq.messages import PlainMessage

    store = MessageStore()
    store.add(Messages.of(rows(0, 3)))  # (enqueue_time 0 in the rows)
    store.add(Messages.of_plain([PlainMessage(None, b"p", 1_234_000 + i, 3 + i) for i in range(2)]))
    assert store.enqueue_time_us(1) == 0
    assert store.enqueue_time_us(4) == 1_234_001
    assert store.enqueue_time_us(9) is None
    (_, plain) = store._chunks
    assert plain._table is None
