"""Leases (the seeds' browse-with-mark), driven by a manual clock instead of sleeps."""

from __future__ import annotations

import pytest

from spark_mq import Admin, Consumer, LeaseError, Producer
from spark_mq.clock import ManualClock
from spark_mq.service import RunningBroker


def setup_queue(url: str, n: int) -> None:
    with Admin(url) as admin:
        admin.create_queue("q")
    with Producer(url, destination="q") as producer:
        producer.send_batch([b"m%d" % i for i in range(n)])


def test_lapsed_lease_is_redelivered_to_another_consumer(
    broker: RunningBroker, clock: ManualClock
) -> None:
    setup_queue(broker.url, 1)
    with Consumer(broker.url, "q") as slow, Consumer(broker.url, "q") as other:
        msg = slow.receive(timeout=5)
        assert msg is not None and msg.delivery_count == 1
        assert slow.lease_s == 5.0  # the seeds' mark interval
        # invisible to others while the lease holds
        clock.advance(4.9)
        broker.broker.run_timers()
        assert other.receive(timeout=0.3) is None
        # the mark lapses: the message goes to the next consumer, flagged as redelivered
        clock.advance(0.2)
        assert broker.broker.run_timers() == 1
        again = other.receive(timeout=5) or slow.receive(timeout=5)
        assert again is not None
        assert (again.offset, again.redelivered, again.delivery_count) == (0, True, 2)
        # the first consumer's late ack names a stale delivery: refused (fenced)
        with pytest.raises(LeaseError, match="stale"):
            msg.ack().result(timeout=5)
        again.ack().result(timeout=5)


def test_extend_lease_keeps_the_message(broker: RunningBroker, clock: ManualClock) -> None:
    setup_queue(broker.url, 1)
    with Consumer(broker.url, "q") as holder, Consumer(broker.url, "q") as other:
        msg = holder.receive(timeout=5)
        assert msg is not None
        for _ in range(3):
            clock.advance(4.0)
            msg.extend_lease().result(timeout=5)
            assert broker.broker.run_timers() == 0
        assert other.receive(timeout=0.3) is None
        msg.ack().result(timeout=5)
        clock.advance(60)
        assert broker.broker.run_timers() == 0
        with Admin(broker.url) as admin:
            assert admin.stats("q")["depth"] == 0


def test_late_ack_before_anyone_else_took_it_is_accepted(
    broker: RunningBroker, clock: ManualClock
) -> None:
    setup_queue(broker.url, 1)
    # prefetch=1 and no other consumer: after the lapse nobody re-takes the message
    with Consumer(broker.url, "q", prefetch=1) as consumer:
        msg = consumer.receive(timeout=5)
        assert msg is not None
        clock.advance(10)
        sub = broker.broker.destinations.get("q").subscriptions[""]
        assert sub.expire_leases() == 1
        # nobody has taken it again yet, so the original delivery may still settle it
        msg.ack().result(timeout=5)
    with Admin(broker.url) as admin:
        stats = admin.stats("q")
    assert stats["acked"] == 1 and stats["depth"] == 0


def lapse(broker: RunningBroker, clock: ManualClock) -> None:
    clock.advance(5.1)
    assert broker.broker.run_timers() == 1


def test_a_lapsed_message_goes_to_another_consumer_not_back_to_the_stalled_one(
    broker: RunningBroker, clock: ManualClock
) -> None:
    """The one that let it lapse has stopped answering: it got the message back after every
    mark interval until it was dead-lettered, while the idle one got nothing."""
    setup_queue(broker.url, 1)
    with Consumer(broker.url, "q") as one, Consumer(broker.url, "q") as two:
        first = one.receive(timeout=5) or two.receive(timeout=5)
        assert first is not None
        holder, idle = (one, two) if first._owner() is one else (two, one)
        for count in (2, 3, 4, 5):
            lapse(broker, clock)
            again = idle.receive(timeout=5)
            assert again is not None and again.delivery_count == count
            assert holder.receive(timeout=0.2) is None
            holder, idle = idle, holder  # and now that one stops answering
        again.ack().result(timeout=5)


@pytest.mark.parametrize("case", ["alone", "selector", "full", "failover"])
def test_a_lapsed_message_comes_back_when_no_other_consumer_may_take_it(
    broker: RunningBroker, clock: ManualClock, case: str
) -> None:
    with Admin(broker.url) as admin:
        admin.create_queue("q", delivery_policy="failover" if case == "failover" else "round_robin")
    with Producer(broker.url, destination="q") as producer:
        producer.send_sync("m0", headers={"kind": "a"})
        if case == "full":
            producer.send_sync("m1", headers={"kind": "a"})
    with Consumer(broker.url, "q", prefetch=1) as stalled:
        msg = stalled.receive(timeout=5)
        assert msg is not None and msg.text == "m0"
        other = None
        if case == "full":
            clock.advance(3)  # the other one's lease of m1 lapses later than m0's
        if case == "selector":
            other = Consumer(broker.url, "q", selector="kind = 'b'")
        elif case in ("full", "failover"):
            other = Consumer(broker.url, "q", prefetch=1)
        try:
            if case == "full":  # the other one holds m1: no room for m0
                held = other.receive(timeout=5)  # type: ignore[union-attr]
                assert held is not None and held.text == "m1"
                clock.advance(2.1)
                assert broker.broker.run_timers() == 1
            else:
                lapse(broker, clock)
            again = stalled.receive(timeout=5)
            assert again is not None and (again.text, again.delivery_count) == ("m0", 2)
        finally:
            if other is not None:
                other.close()
