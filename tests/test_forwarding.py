"""A member's forwarding (spark_mq.connection.forwarding) against a real broker in this process,
standing in for the member that owns the destinations: produces batched a destination at a
time and answered each with its own offsets, a batch that cannot be sent answered with why
without holding up the next, and the stop refusing what comes after it. (Through real cluster
members and STOMP clients: tests/test_cluster.py.)"""

from __future__ import annotations

from concurrent.futures import Future

import pyarrow as pa
import pytest

from spark_mq import Admin, Consumer
from spark_mq.connection.forwarding import Forwarding
from spark_mq.errors import BrokerUnavailable, NotOwner, SchemaMismatch
from spark_mq.messages import Messages, PlainMessage
from tests.conftest import RunningBroker, receive_n


def test_produces_go_in_order_and_a_bad_batch_holds_up_nothing(broker: RunningBroker) -> None:
    """Forty produces of a destination, plain and with headers, handed over at once: each
    answered with its own offsets, stored in the order handed over. A produce whose rows
    cannot be sent is refused with why, and the produce sent with it goes; after the stop,
    a produce is refused at once."""
    with Admin(broker.url) as admin:
        admin.create_queue("fq")
    owner = NotOwner("'fq' is served by cluster member m1", endpoint=broker.url, member="m1")
    forwarding = Forwarding(timeout_s=10)
    forwarding.home = broker.url
    try:
        futures: list[Future] = []
        for i in range(40):
            if i % 3:
                messages = Messages(None, [PlainMessage(f"p{i}", b"m%d" % i)])
            else:
                rows = pa.table(
                    {
                        "body": [b"m%d" % i],
                        "headers": pa.array([[("i", str(i))]], pa.map_(pa.string(), pa.string())),
                    }
                )
                messages = Messages.of(rows)
            futures.append(forwarding.produce(owner, "fq", messages))
        offsets = [f.result(10) for f in futures]
        assert [len(o) for o in offsets] == [1] * 40
        assert [o[0] for o in offsets] == sorted(o[0] for o in offsets)  # (in the order given)
        bad = forwarding.produce(owner, "fq", Messages.of(pa.table({"nobody": [1]})))
        after = forwarding.produce(owner, "fq", Messages(None, [PlainMessage("last", b"last")]))
        with pytest.raises(SchemaMismatch, match="nobody"):
            bad.result(10)
        assert after.result(10) == [40]
    finally:
        forwarding.close()
    refused = forwarding.produce(owner, "fq", Messages(None, [PlainMessage("x", b"x")]))
    with pytest.raises(BrokerUnavailable, match="stopping"):
        refused.result(1)
    with Consumer(broker.url, "fq", prefetch=50) as c:
        got = receive_n(c, 41)
        c.ack(got)
    assert [m.body for m in got] == [b"m%d" % i for i in range(40)] + [b"last"]
    assert got[0].headers == {"i": "0"} and got[1].headers == {}
