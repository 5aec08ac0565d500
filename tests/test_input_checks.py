"""Bad input from clients: refused with an error that says what was wrong and what to do,
nothing stored, nothing left behind."""

from __future__ import annotations

import math

import pyarrow as pa
import pyarrow.flight as fl
import pytest

from spark_mq import (
    Admin,
    Consumer,
    DestinationNotFound,
    InvalidNameError,
    MessageRejected,
    Producer,
    Transaction,
)
from spark_mq.service import RunningBroker
from tests.conftest import receive_n


@pytest.mark.parametrize("name", ["x\n", "orders\n"])
def test_a_name_ending_in_a_newline_is_refused_and_leaves_nothing_behind(
    broker: RunningBroker, name: str
) -> None:
    data = broker.broker.config.broker.data_dir
    with Admin(broker.url) as admin:
        with pytest.raises(InvalidNameError):
            admin.create_queue(name)
        admin.create_topic("t")
        with pytest.raises(InvalidNameError):
            admin.create_subscription("t", name)
        admin.create_queue("q")
        with pytest.raises(InvalidNameError):
            admin.claim("q", name, 1, 10)
        assert {d["name"] for d in admin.list_destinations()} == {"q", "t"}
        assert not admin.stats("t")["subscriptions"]
    import os

    assert sorted(os.listdir(os.path.join(data, "destinations"))) == ["q", "t"]


def test_a_subscription_on_a_missing_topic_suggests_creating_a_topic(
    broker: RunningBroker,
) -> None:
    with Admin(broker.url) as admin, pytest.raises(DestinationNotFound) as info:
        admin.create_subscription("events", "billing")
    assert "Admin.create_topic('events')" in info.value.message
    assert "create_queue" not in info.value.message


@pytest.mark.parametrize(
    ("option", "value"),
    [
        ("ttl_s", -1),
        ("delay_s", -0.5),
        ("ttl_s", math.nan),
        ("priority", 12),
        ("priority", -1),
        ("priority", True),
    ],
)
def test_a_bad_option_is_refused_at_send_without_failing_other_messages(
    broker: RunningBroker, option: str, value: object
) -> None:
    with Producer(broker.url, destination="q", linger_ms=50) as producer:
        kept = producer.send("kept")
        with pytest.raises(MessageRejected, match=option):
            producer.send("bad", **{option: value})
        with pytest.raises(MessageRejected, match=option):
            producer.send_sync("bad", **{option: value})
        assert kept.result(timeout=10) == 0
    with Transaction(broker.url) as tx, pytest.raises(MessageRejected, match=option):
        tx.send("q", "bad", **{option: value})
    with Admin(broker.url) as admin:
        assert admin.stats("q")["end_offset"] == 1


@pytest.mark.parametrize("column", ["ttl_ms", "delay_ms"])
def test_the_broker_refuses_a_negative_ttl_or_delay_column(
    broker: RunningBroker, column: str
) -> None:
    batch = pa.table({"body": [b"a", b"b"], column: pa.array([1000, -1], pa.int64())})
    with Producer(broker.url, destination="q") as producer:
        with pytest.raises(MessageRejected, match=f"must not be negative \\({column} = -1\\)"):
            producer.send_batch(batch).result(timeout=10)
        producer.send_sync("after")
    with Admin(broker.url) as admin:
        assert admin.stats("q")["end_offset"] == 1  # only "after"


def test_a_transaction_closed_outside_with_rolls_back_and_releases_its_connection(
    broker: RunningBroker,
) -> None:
    with Producer(broker.url, destination="in") as producer:
        producer.send_sync("order")
    with Consumer(broker.url, "in", prefetch=1) as consumer:
        (msg,) = receive_n(consumer, 1)
        tx = Transaction(broker.url)
        tx.send("out", "never")
        tx.ack(msg)
        tx.close()
        (again,) = receive_n(consumer, 1)  # the ack was rolled back
        assert again.offset == msg.offset and again.redelivered
        tx.close()  # twice is fine
        with pytest.raises(pa.ArrowInvalid, match="closed"):  # the connection is gone
            list(tx._client.do_action(fl.Action("ping", b"{}")))
    with Admin(broker.url) as admin:
        assert "out" not in {d["name"] for d in admin.list_destinations()}  # nothing was sent
