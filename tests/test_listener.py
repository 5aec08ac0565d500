"""The JMS message listener: a consumer made with ``on_message`` is called on its reader thread,
in order; a raise nacks; the callback may close the consumer; ``wait()`` says why a stream ended.
Both transports, against a real broker."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from spark_mq import Admin, BrokerUnavailable, Consumer, Message, Producer
from spark_mq.clock import ManualClock
from spark_mq.service import RunningBroker
from tests.conftest import receive_n, start_inprocess, wait_for


@pytest.mark.parametrize("transport", ["wire", "flight"])
def test_an_on_message_consumer_is_called_in_order_and_a_raise_redelivers(
    broker: RunningBroker, transport: str
) -> None:
    calls: list[tuple[bytes, int, str]] = []
    failed_once: list[bytes] = []

    def on_message(m: Message) -> None:
        calls.append((m.body, m.delivery_count, threading.current_thread().name))
        if m.body == b"m2" and not failed_once:
            failed_once.append(m.body)
            raise ValueError("cannot handle m2 yet")
        m.ack()

    with Producer(broker.url, destination="q") as producer:
        for i in range(5):
            producer.send(b"m%d" % i)
    with Consumer(broker.url, "q", on_message=on_message, transport=transport) as consumer:  # type: ignore[arg-type]
        with pytest.raises(RuntimeError, match="on_message"):
            consumer.receive(timeout=0.1)
        wait_for(lambda: len(calls) == 6, what="five messages and one redelivery")
    assert [(b, c) for b, c, _ in calls[:5]] == [(b"m%d" % i, 1) for i in range(5)]
    assert calls[5][:2] == (b"m2", 2)  # nacked by the raise: delivered again, counted
    assert {t for _, _, t in calls} == {"consumer-read"}  # no hand-off to another thread
    with Admin(broker.url) as admin:
        wait_for(lambda: admin.stats("q")["depth"] == 0, what="every ack")


@pytest.mark.parametrize("transport", ["wire", "flight"])
def test_on_message_may_close_its_consumer_and_the_rest_go_back(
    broker: RunningBroker, transport: str
) -> None:
    got: list[bytes] = []
    consumers: list[Consumer] = []
    made = threading.Event()  # the first call may come before the constructor returns

    def on_message(m: Message) -> None:
        got.append(m.body)
        m.ack()
        made.wait(10)
        consumers[0].close()  # on the reader thread: no deadlock, no second call

    with Producer(broker.url, destination="q") as producer:
        producer.send_batch([b"a", b"b", b"c"])
    consumers.append(
        Consumer(broker.url, "q", on_message=on_message, prefetch=10, transport=transport)  # type: ignore[arg-type]
    )
    made.set()
    assert consumers[0].wait(10) is True  # ended by close(): no error
    assert got == [b"a"]
    with Consumer(broker.url, "q") as again:
        assert [m.body for m in receive_n(again, 2)] == [b"b", b"c"]


def test_waiting_on_an_on_message_consumer_says_when_the_broker_went_away(
    tmp_path: Path, clock: ManualClock
) -> None:
    broker = start_inprocess(tmp_path / "data", clock)
    got: list[bytes] = []
    try:
        with Producer(broker.url, destination="q") as producer:
            producer.send_sync(b"one")
        consumer = Consumer(broker.url, "q", on_message=lambda m: got.append(m.body))
        assert consumer.wait(0.2) is False  # still serving
        assert got == [b"one"]
    finally:
        broker.stop()
    with pytest.raises(BrokerUnavailable, match="the broker"):  # closed the stream, or broke
        consumer.wait(10)
    consumer.close()
