"""Delivery semantics survive SIGKILL: settings, selectors, priority, scheduled delivery and
exact delivery counts (with persist_delivery_count) are all on disk, not in the dead process."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from spark_mq import Admin, Consumer, ConsumerRefused, Producer
from spark_mq.launch import BrokerProcess
from tests.conftest import receive_n

pytestmark = pytest.mark.process

ARGS = ["--set", "delivery.persist_delivery_count=true"]


def test_semantics_survive_sigkill(tmp_path: Path) -> None:
    data, log = str(tmp_path / "data"), str(tmp_path / "broker.log")
    proc = BrokerProcess(data, extra_args=ARGS, log_file=log).start()
    with Admin(proc.url) as admin:
        admin.create_queue("q", delivery_policy="single", max_delivery_attempts=2)
        admin.create_topic("t")
        admin.create_subscription("t", "reds", selector="color = 'red'")
    with Producer(proc.url) as producer:
        producer.send("low", destination="q", priority=1)
        producer.send("high", destination="q", priority=9)
        sent_later = time.time()
        producer.send("later", destination="q", delay_s=0.5)
        for color in ("red", "blue", "red"):
            producer.send(color, destination="t", headers={"color": color})
    with Consumer(proc.url, "q", prefetch=1) as consumer:
        (high,) = receive_n(consumer, 1)
        assert high.text == "high" and high.delivery_count == 1
        proc.kill()  # mid-delivery: never acked, never returned
    proc = BrokerProcess(data, extra_args=ARGS, log_file=log).start()
    try:
        with Admin(proc.url) as admin:
            assert admin.stats("q")["settings"]["delivery_policy"] == "single"
        with Consumer(proc.url, "q", prefetch=1) as consumer:
            with pytest.raises(ConsumerRefused):
                Consumer(proc.url, "q")
            (again,) = receive_n(consumer, 1)
            # the interrupted delivery was counted: this is the second, and the last allowed
            assert again.text == "high" and again.delivery_count == 2
            again.nack().result(timeout=10)
            # "later" (priority 4) may already be due and come before "low" (priority 1)
            got = {}
            for _ in range(2):
                (msg,) = receive_n(consumer, 1)
                got[msg.text] = msg
                msg.ack().result(timeout=10)
            low, later = got["low"], got["later"]
            assert low.text == "low"
            assert later.text == "later" and time.time() >= sent_later + 0.5
            # its delivery time came back from disk, not from the dead process
            assert abs(later.deliver_time.timestamp() - (sent_later + 0.5)) < 0.5
        with Consumer(proc.url, "DLQ.q") as dlq:
            (dead,) = receive_n(dlq, 1)
            assert dead.text == "high" and dead.headers["sparkmq.delivery_count"] == "2"
        with Consumer(proc.url, "t", subscription="reds") as reds:
            got = receive_n(reds, 2)
            assert [m.text for m in got] == ["red", "red"]
            assert reds.receive(timeout=0.5) is None
    finally:
        assert proc.stop() == 0
