"""SIGTERM ends every connection within broker.shutdown_grace_s: what was taken is answered,
Flight clients are told to end their streams, consumers' messages go back, the hot tier moves
to Delta, and the log says what it waited for. An idle Flight client kept the broker up for
minutes."""

from __future__ import annotations

import signal
import time
import urllib.request
from pathlib import Path

import pyarrow.flight as fl
import pytest
from prometheus_client.parser import text_string_to_metric_families

from spark_mq import BrokerUnavailable, Consumer, Producer, protocol
from spark_mq.journal import DeltaStore
from spark_mq.launch import BrokerProcess
from spark_mq.schema import PRODUCE_SCHEMA
from tests.conftest import receive_n, wait_for

pytestmark = pytest.mark.process


def _flight_calls(broker: BrokerProcess) -> float:
    """The Flight calls the broker is serving (its /metrics)."""
    with urllib.request.urlopen(broker.http_url + "/metrics", timeout=10) as r:
        text = r.read().decode()
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "sparkmq_broker_connections" and sample.labels == {
                "transport": "flight"
            }:
                return sample.value
    return 0.0


def sigterm(broker: BrokerProcess, within_s: float) -> float:
    """SIGTERM, then the seconds until it exited (which must be 0, within ``within_s``)."""
    assert broker.proc is not None
    started = time.monotonic()
    broker.proc.send_signal(signal.SIGTERM)
    assert broker.proc.wait(within_s) == 0
    return time.monotonic() - started


def test_flight_clients_are_told_and_the_broker_exits_at_once(tmp_path: Path) -> None:
    data, log = tmp_path / "data", tmp_path / "broker.log"
    broker = BrokerProcess(
        str(data), log_file=str(log), extra_args=["--set", "broker.wire=false"]
    ).start()
    producer = Producer(broker.url, destination="q")
    consumer = Consumer(broker.url, "q", prefetch=10)
    try:
        for i in range(5):
            producer.send_sync(f"m{i}")
        held = receive_n(consumer, 5)
        consumer.ack(held[:2]).result(timeout=10)  # 3 stay unacked: they go back
        took = sigterm(broker, within_s=10)
        assert took < 5, f"SIGTERM took {took:.1f} s with two idle Flight clients"
        with pytest.raises(BrokerUnavailable, match="shutting down"):
            consumer.wait(timeout=5)
        with pytest.raises(BrokerUnavailable):
            producer.send_sync("after")
    finally:
        producer.close()
        consumer.close()
    store = DeltaStore(str(data))
    assert store.read_messages("q", 0, None).num_rows == 5  # moved to Delta on the way out
    again = BrokerProcess(str(data), log_file=str(log)).start()
    try:
        with Consumer(again.url, "q") as c:
            back = receive_n(c, 3)
            assert sorted(m.text for m in back) == ["m2", "m3", "m4"]
    finally:
        again.stop()


def test_a_client_that_never_ends_its_stream_is_not_waited_for_past_the_grace(
    tmp_path: Path,
) -> None:
    data, log = tmp_path / "data", tmp_path / "broker.log"
    grace = ["--set", "broker.shutdown_grace_s=2", "--set", "broker.wire=false"]
    broker = BrokerProcess(str(data), log_file=str(log), extra_args=grace).start()
    client = fl.connect(broker.url)
    try:
        # a produce stream opened by hand and left open: it never reads, never half-closes
        descriptor = fl.FlightDescriptor.for_command(protocol.encode(protocol.Produce("q")))
        _writer, _ = client.do_put(descriptor, PRODUCE_SCHEMA)
        wait_for(lambda: _flight_calls(broker) >= 1, what="the broker to serve the stream")
        took = sigterm(broker, within_s=20)
        assert took < 6, f"SIGTERM took {took:.1f} s past a 2 s grace"
    finally:
        client.close()
    text = log.read_text()
    assert "shutting down: waiting" in text and "a producer to q" in text
    assert "Flight call(s) still open after 2 s (broker.shutdown_grace_s), not waited" in text
    assert "broker stopped; every acknowledged message is durable" in text


def test_unanswered_produces_on_the_wire_are_answered_before_it_stops(tmp_path: Path) -> None:
    data, log = tmp_path / "data", tmp_path / "broker.log"
    broker = BrokerProcess(str(data), log_file=str(log)).start()
    with Producer(broker.url, destination="q", linger_ms=0) as producer:
        futures = [producer.send(f"m{i}") for i in range(2000)]
        assert broker.proc is not None
        broker.proc.send_signal(signal.SIGTERM)
        answered = []
        for f in futures:
            try:
                answered.append(f.result(timeout=30))
            except BrokerUnavailable:
                pass  # sent after the broker stopped reading: never stored, safe to resend
        assert broker.proc.wait(30) == 0
    # everything acknowledged is there, in order, and nothing else
    stored = DeltaStore(str(data)).read_messages("q", 0, None)
    assert sorted(stored["offset"].to_pylist()) == sorted(answered)
    assert answered == list(range(len(answered))) and answered
