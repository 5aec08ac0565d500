"""STOMP through stomp.py (a client no one here wrote) against a real broker process: the
header mapping both ways with the SDK, receipts, each ack mode, NACK to dead-letter,
transactions, selectors, durable and shared subscriptions, groups, dedup, temporary queues,
versions 1.0 and 1.1."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from spark_mq import Admin
from spark_mq.client import Consumer, Producer
from spark_mq.launch import BrokerProcess
from spark_mq.names import choose_partition
from tests.ops_kit import depth, http
from tests.stomp_kit import connect, send_all

pytestmark = pytest.mark.process


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    base = tmp_path_factory.mktemp("stomp")
    process = BrokerProcess(
        str(base / "data"),
        extra_args=[
            "--set", f"logging.file={base / 'broker.log'}",
            # a heart-beat every 100 ms to a client that asks: the broker's own clock, for the
            # tests that show nothing more comes (BEATING)
            "--set", "broker.stomp_heartbeat_ms=100",
            # subscriptions to partitioned destinations look for new partitions this often
            "--set", "broker.stomp_partitions_recheck_s=0.2",
        ],
        log_file=str(base / "broker.out"),
    ).start()  # fmt: skip
    try:
        yield process
    finally:
        process.stop()


@pytest.fixture
def port(broker: BrokerProcess) -> int:
    assert broker.stomp_port
    return broker.stomp_port


# the client asks for the broker's heart-beats (and waits ten of them before it takes the
# broker for dead: stomp.py's 1.5 gave up on one 150 ms late on a loaded machine)
BEATING: dict[str, Any] = {"heartbeats": (0, 100), "beats_late": 10.0}


def _name(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def test_stomp_to_sdk_keeps_headers_priority_expiry_group_and_binary_bodies(
    broker: BrokerProcess, port: int
) -> None:
    q = _name("to-sdk")
    conn, inbox = connect(port)
    expires = int(time.time() * 1000) + 3_600_000
    body = b"\x00binary\x00with NULs\xff"
    conn.send(
        f"/queue/{q}", body, content_type="application/octet-stream",
        headers={"receipt": "r1", "priority": "7", "expires": str(expires),
                 "JMSXGroupID": "g-1", "color": "red", "persistent": "true"},
    )  # fmt: skip
    inbox.wait_receipt("r1")
    conn.disconnect()
    with Consumer(broker.url, q) as consumer:
        (m,) = consumer.receive_many(1, timeout=10)
        consumer.ack(m)
    assert m.body == body
    assert m.priority == 7 and m.group_id == "g-1"
    assert m.headers["color"] == "red"
    assert m.headers["content-type"] == "application/octet-stream"
    assert "persistent" not in m.headers and "receipt" not in m.headers
    assert abs(m.expiry_time.timestamp() * 1000 - expires) < 2


def test_sdk_to_stomp_carries_the_message_headers(broker: BrokerProcess, port: int) -> None:
    q = _name("from-sdk")
    with Producer(broker.url, destination=q) as p:
        p.send_sync(b"plain")
        p.send_sync(b"rich", headers={"k": "v:with\ncolon"}, priority=9, group_id="g")
    conn, inbox = connect(port)
    conn.subscribe(f"/queue/{q}", id="s", ack="client-individual")
    first, second = sorted(inbox.wait_messages(2), key=lambda f: f.body)
    assert first.body == b"plain"
    assert first.headers["destination"] == f"/queue/{q}"
    assert first.headers["subscription"] == "s"
    assert first.headers["redelivered"] == "false"
    assert first.headers["JMSXDeliveryCount"] == "1"
    assert first.headers["priority"] == "4"
    assert abs(int(first.headers["timestamp"]) - time.time() * 1000) < 60_000
    assert second.body == b"rich"
    assert second.headers["priority"] == "9"
    assert second.headers["JMSXGroupID"] == "g"
    assert second.headers["k"] == "v:with\ncolon"  # (escaped on the wire, 1.2)
    for f in (first, second):
        conn.ack(f.headers["ack"])
    conn.disconnect(receipt="bye")
    assert "bye" in inbox.receipts


def test_auto_acks_consume_for_good(broker: BrokerProcess, port: int) -> None:
    q = _name("auto")
    conn, inbox = connect(port)
    send_all(conn, inbox, f"/queue/{q}", [b"a", b"b", b"c"])
    conn.subscribe(f"/queue/{q}", id="s")  # ack: auto
    assert [f.body for f in inbox.wait_messages(3)] == [b"a", b"b", b"c"]
    assert "ack" not in inbox.messages[0].headers
    conn.disconnect(receipt="bye")
    with Admin(broker.url) as admin:
        _wait(lambda: depth(admin, q) == 0, "the auto-acked messages gone")


def test_client_acks_are_cumulative_and_the_rest_come_back_redelivered(
    broker: BrokerProcess, port: int
) -> None:
    q = _name("client")
    conn, inbox = connect(port)
    send_all(conn, inbox, f"/queue/{q}", [b"1", b"2", b"3", b"4", b"5"])
    conn.subscribe(f"/queue/{q}", id="s", ack="client")
    frames = inbox.wait_messages(5)
    conn.ack(frames[2].headers["ack"], receipt="acked")  # 1, 2 and 3
    inbox.wait_receipt("acked")
    conn.disconnect()
    again, inbox2 = connect(port)
    again.subscribe(f"/queue/{q}", id="s", ack="client-individual")
    back = inbox2.wait_messages(2)
    assert [f.body for f in back] == [b"4", b"5"]
    assert all(f.headers["redelivered"] == "true" for f in back)
    assert back[0].headers["JMSXDeliveryCount"] == "2"
    for f in back:
        again.ack(f.headers["ack"])
    again.disconnect(receipt="bye")


def test_client_individual_acks_only_the_one_named(broker: BrokerProcess, port: int) -> None:
    q = _name("individual")
    conn, inbox = connect(port)
    send_all(conn, inbox, f"/queue/{q}", [b"1", b"2", b"3", b"4"])
    conn.subscribe(f"/queue/{q}", id="s", ack="client-individual")
    frames = inbox.wait_messages(4)
    conn.ack(frames[1].headers["ack"])
    conn.ack(frames[3].headers["ack"], receipt="acked")
    inbox.wait_receipt("acked")
    conn.disconnect()
    with Consumer(broker.url, q) as consumer:
        back = _receive(consumer, 2)
        consumer.ack(back)
        assert consumer.receive_many(1, timeout=0.3) == []
    assert sorted(m.body for m in back) == [b"1", b"3"]


def test_prefetch_bounds_what_is_unacknowledged(broker: BrokerProcess, port: int) -> None:
    q = _name("prefetch")
    conn, inbox = connect(port, **BEATING)
    send_all(conn, inbox, f"/queue/{q}", [b"1", b"2", b"3", b"4", b"5"])
    conn.subscribe(f"/queue/{q}", id="s", ack="client-individual",
                   headers={"activemq.prefetchSize": "2"})  # fmt: skip
    first = inbox.wait_messages(2)
    inbox.wait_heartbeats(4)  # the broker had nothing more to send for 0.4 s
    assert len(inbox.messages) == 2  # no more until one is acknowledged
    conn.ack(first[0].headers["ack"])
    inbox.wait_messages(3)
    inbox.wait_heartbeats(3)
    assert len(inbox.messages) == 3
    conn.disconnect()


def test_nack_redelivers_and_dead_letters_after_the_attempts(
    broker: BrokerProcess, port: int
) -> None:
    q = _name("poison")
    with Admin(broker.url) as admin:
        admin.create_queue(q, max_delivery_attempts=2)
    conn, inbox = connect(port)
    send_all(conn, inbox, f"/queue/{q}", [b"bad"])
    conn.subscribe(f"/queue/{q}", id="s", ack="client-individual")
    first = inbox.wait_messages(1)[0]
    conn.nack(first.headers["ack"])
    second = inbox.wait_messages(2)[1]
    assert second.body == b"bad" and second.headers["redelivered"] == "true"
    conn.nack(second.headers["ack"], receipt="nacked")
    inbox.wait_receipt("nacked")
    with Admin(broker.url) as admin:
        _wait(lambda: depth(admin, f"DLQ.{q}") == 1, "the message dead-lettered")
        # (the copy is durable first, then the original settled: a moment apart)
        _wait(lambda: depth(admin, q) == 0, "the original settled")
    conn.subscribe(f"/queue/DLQ.{q}", id="dlq", ack="client-individual")
    dead = inbox.wait_messages(3)[2]
    assert dead.body == b"bad" and dead.headers["subscription"] == "dlq"
    conn.ack(dead.headers["ack"])
    conn.disconnect(receipt="bye")


def test_a_transaction_commits_sends_and_acks_together_and_an_abort_undoes_them(
    broker: BrokerProcess, port: int
) -> None:
    src, out = _name("tx-in"), _name("tx-out")
    conn, inbox = connect(port)
    send_all(conn, inbox, f"/queue/{src}", [b"order-1", b"order-2"])
    conn.subscribe(f"/queue/{src}", id="s", ack="client-individual")
    one, two = inbox.wait_messages(2)

    conn.begin("t1")
    conn.send(f"/queue/{out}", b"shipped-1", transaction="t1")
    conn.ack(one.headers["ack"], transaction="t1")
    conn.abort("t1", receipt="aborted")
    inbox.wait_receipt("aborted")
    with Admin(broker.url) as admin:
        assert depth(admin, out) == 0  # nothing of an aborted transaction is sent
    again = inbox.wait_messages(3)[2]  # the acked message given back
    assert again.body == b"order-1" and again.headers["redelivered"] == "true"

    conn.begin("t2")
    conn.send(f"/queue/{out}", b"shipped-1", transaction="t2")
    conn.send(f"/queue/{out}", b"shipped-2", transaction="t2")
    conn.ack(again.headers["ack"], transaction="t2")
    conn.ack(two.headers["ack"], transaction="t2")
    with Admin(broker.url) as admin:
        assert depth(admin, out) == 0  # not before COMMIT
    conn.commit("t2", receipt="committed")
    inbox.wait_receipt("committed")
    conn.disconnect(receipt="bye")
    with Admin(broker.url) as admin:
        assert depth(admin, src) == 0 and depth(admin, out) == 2


def test_selectors_pick_by_header(broker: BrokerProcess, port: int) -> None:
    q = _name("selected")
    conn, inbox = connect(port, **BEATING)
    for i, color in enumerate(["red", "blue", "red"]):
        conn.send(f"/queue/{q}", f"m{i}", headers={"color": color, "receipt": f"r{i}"})
    inbox.wait_receipt("r2")
    conn.subscribe(f"/queue/{q}", id="s", ack="client-individual", selector="color = 'red'")
    frames = inbox.wait_messages(2)
    inbox.wait_heartbeats(3)
    assert [f.body for f in inbox.messages] == [b"m0", b"m2"]
    for f in frames:
        conn.ack(f.headers["ack"])
    conn.disconnect(receipt="bye")


def test_durable_subscriptions_keep_messages_while_away_until_unsubscribed(
    broker: BrokerProcess, port: int
) -> None:
    topic = _name("news")
    conn, inbox = connect(port, headers={"client-id": "reader"})
    conn.subscribe(f"/topic/{topic}", id="d", ack="client-individual",
                   headers={"durable-subscription-name": "daily"})  # fmt: skip
    conn.disconnect()  # away: the subscription stays
    pub, pub_inbox = connect(port)
    send_all(pub, pub_inbox, f"/topic/{topic}", [b"while-away"])
    with Admin(broker.url) as admin:
        assert "reader.daily" in admin.stats(topic)["subscriptions"]
    conn, inbox = connect(port, headers={"client-id": "reader"})
    conn.subscribe(f"/topic/{topic}", id="d", ack="client-individual",
                   headers={"activemq.subscriptionName": "daily"})  # fmt: skip
    (m,) = inbox.wait_messages(1)
    assert m.body == b"while-away" and m.headers["destination"] == f"/topic/{topic}"
    conn.ack(m.headers["ack"])
    conn.unsubscribe("d", headers={"durable-subscription-name": "daily"}, receipt="gone")
    inbox.wait_receipt("gone")
    with Admin(broker.url) as admin:
        assert "reader.daily" not in admin.stats(topic)["subscriptions"]
    conn.disconnect()
    pub.disconnect()


def test_topics_fan_out_and_shared_subscriptions_split(broker: BrokerProcess, port: int) -> None:
    topic = _name("events")
    a, inbox_a = connect(port)
    b, inbox_b = connect(port)
    s1, inbox_1 = connect(port, **BEATING)
    s2, inbox_2 = connect(port, **BEATING)
    a.subscribe(f"/topic/{topic}", id="a", receipt="a")
    b.subscribe(f"/topic/{topic}", id="b", receipt="b")
    share = {"sparkmq-shared-subscription": "workers"}
    s1.subscribe(f"/topic/{topic}", id="w", headers=share, receipt="w1", ack="client-individual")
    s2.subscribe(f"/topic/{topic}", id="w", headers=share, receipt="w2", ack="client-individual")
    for inbox, r in ((inbox_a, "a"), (inbox_b, "b"), (inbox_1, "w1"), (inbox_2, "w2")):
        inbox.wait_receipt(r)
    pub, pub_inbox = connect(port)
    send_all(pub, pub_inbox, f"/topic/{topic}", [f"e{i}".encode() for i in range(10)])
    assert len(inbox_a.wait_messages(10)) == 10 and len(inbox_b.wait_messages(10)) == 10
    inbox_1.wait(lambda: len(inbox_1.messages) + len(inbox_2.messages) == 10, "the shared ten")
    inbox_1.wait_heartbeats(3)
    inbox_2.wait_heartbeats(3)
    assert sorted(f.body for f in inbox_1.messages + inbox_2.messages) == sorted(
        f"e{i}".encode() for i in range(10)
    )
    for conn in (a, b, s1, s2, pub):
        conn.disconnect()


def test_a_group_goes_to_one_consumer(broker: BrokerProcess, port: int) -> None:
    q = _name("grouped")
    c1, in1 = connect(port)
    c2, in2 = connect(port)
    c1.subscribe(f"/queue/{q}", id="s", ack="client-individual", receipt="c1")
    c2.subscribe(f"/queue/{q}", id="s", ack="client-individual", receipt="c2")
    in1.wait_receipt("c1")
    in2.wait_receipt("c2")
    pub, pub_inbox = connect(port)
    for i in range(20):
        pub.send(f"/queue/{q}", f"{i}", headers={"JMSXGroupID": f"g{i % 2}", "receipt": f"r{i}"})
    pub_inbox.wait_receipt("r19")
    in1.wait(lambda: len(in1.messages) + len(in2.messages) == 20, "twenty messages")
    groups = [{f.headers["JMSXGroupID"] for f in inbox.messages} for inbox in (in1, in2)]
    assert not groups[0] & groups[1], f"a group split between consumers: {groups}"
    for inbox in (in1, in2):
        for g in ("g0", "g1"):
            bodies = [int(f.body) for f in inbox.messages if f.headers["JMSXGroupID"] == g]
            assert bodies == sorted(bodies), f"group {g} out of order"
    for conn, inbox in ((c1, in1), (c2, in2)):
        for f in inbox.messages:
            conn.ack(f.headers["ack"])
        conn.disconnect(receipt="bye")
    pub.disconnect()


def test_duplicate_ids_are_stored_once(broker: BrokerProcess, port: int) -> None:
    q = _name("dedup")
    conn, inbox = connect(port)
    send_all(conn, inbox, f"/queue/{q}", [b"first"], **{"_AMQ_DUPL_ID": "order-7"})
    send_all(conn, inbox, f"/queue/{q}", [b"again"], **{"_AMQ_DUPL_ID": "order-7"})
    send_all(conn, inbox, f"/queue/{q}", [b"again2"], **{"sparkmq-dedup-id": "order-7"})
    with Admin(broker.url) as admin:
        assert depth(admin, q) == 1
    conn.disconnect()


def test_scheduled_delivery_waits(broker: BrokerProcess, port: int) -> None:
    q = _name("later")
    conn, inbox = connect(port)
    conn.subscribe(f"/queue/{q}", id="s")
    sent = time.monotonic()
    conn.send(f"/queue/{q}", b"soon", headers={"AMQ_SCHEDULED_DELAY": "700"})
    inbox.wait_messages(1)
    assert time.monotonic() - sent >= 0.6
    conn.disconnect()


def test_temporary_reply_queues_carry_a_request_reply(broker: BrokerProcess, port: int) -> None:
    q = _name("requests")
    server, server_inbox = connect(port)
    server.subscribe(f"/queue/{q}", id="s", ack="client-individual")
    client, client_inbox = connect(port)
    client.subscribe("/temp-queue/replies", id="r")
    client.send(f"/queue/{q}", b"ping", headers={"reply-to": "/temp-queue/replies"})
    (request,) = server_inbox.wait_messages(1)
    reply_to = request.headers["reply-to"]
    assert reply_to.startswith("/queue/tmp.")
    server.send(reply_to, b"pong")
    server.ack(request.headers["ack"])
    (reply,) = client_inbox.wait_messages(1)
    assert reply.body == b"pong"
    client.disconnect()
    server.disconnect()


@pytest.mark.parametrize("version", ["1.0", "1.1"])
def test_older_versions_are_negotiated_and_ack_by_message_id(
    broker: BrokerProcess, port: int, version: str
) -> None:
    q = _name(f"v{version.replace('.', '')}")
    conn, inbox = connect(port, version=version)
    send_all(conn, inbox, f"/queue/{q}", [b"old"])
    if version == "1.0":
        conn.subscribe(f"/queue/{q}", ack="client", id="s")
        (m,) = inbox.wait_messages(1)
        conn.ack(m.headers["message-id"], receipt="acked")
    else:
        conn.subscribe(f"/queue/{q}", id="s", ack="client-individual")
        (m,) = inbox.wait_messages(1)
        conn.ack(m.headers["message-id"], "s", receipt="acked")
    inbox.wait_receipt("acked")
    conn.disconnect()
    with Admin(broker.url) as admin:
        assert depth(admin, q) == 0


def _receive(consumer: Consumer, n: int) -> list:
    got: list = []
    deadline = time.monotonic() + 15
    while len(got) < n and time.monotonic() < deadline:
        got += consumer.receive_many(n - len(got), timeout=1)
    return got


def _wait(check: object, what: str, timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():  # type: ignore[operator]
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


def test_stomp_connections_show_in_the_metrics_and_the_log(broker: BrokerProcess) -> None:
    assert broker.stomp_port
    conns = [connect(broker.stomp_port)[0] for _ in range(3)]
    status, _, body = http(broker.http_url + "/metrics")
    assert status == 200
    samples = {
        s.labels.get("transport"): s.value
        for family in text_string_to_metric_families(body.decode())
        for s in family.samples
        if s.name == "sparkmq_broker_connections"
    }
    assert samples.get("stomp") == 3
    for conn in conns:
        conn.disconnect()
    log = Path(broker.data_dir).parent / "broker.log"
    assert f"STOMP on port {broker.stomp_port}" in log.read_text()


def test_sends_to_a_partitioned_queue_are_placed_by_group_and_subscriptions_read_it_whole(
    broker: BrokerProcess, port: int
) -> None:
    """STOMP clients do not place messages: the broker places each as the SDK would (by its
    JMSXGroupID, else in turn). A subscription names a partition, or the destination: then
    its partitions are read under the one subscription."""
    q = _name("parted")
    with Admin(broker.url) as admin:
        admin.create_queue(q, partitions=3)
    conn, inbox = connect(port)
    for i in range(30):
        conn.send(f"/queue/{q}", f"{i}".encode(),
                  headers={"JMSXGroupID": f"g{i % 5}", "receipt": f"r{i}"})  # fmt: skip
    send_all(conn, inbox, f"/queue/{q}", [b"x", b"y", b"z"])  # (no group: in turn)
    inbox.wait_receipt("r29")
    assert not inbox.errors
    with Consumer(broker.url, q) as consumer:
        got = _receive(consumer, 33)
        consumer.ack(got)
    for m in got:
        if m.group_id is not None:
            assert m.partition == choose_partition(m.group_id, 3, 0)
    assert {m.partition for m in got if m.group_id is None} == {0, 1, 2}
    by_group: dict[str, list[int]] = {}
    for m in got:
        if m.group_id is not None:
            by_group.setdefault(m.group_id, []).append(int(m.body))
    assert all(v == sorted(v) and len(v) == 6 for v in by_group.values())
    # a subscription to one partition; the destination's own name is refused, saying why
    with Producer(broker.url) as producer:
        producer.send_sync(b"to-1", destination=f"{q}~1")
    conn.subscribe(f"/queue/{q}~1", id="one", ack="client-individual")
    (frame,) = inbox.wait_messages(1)
    assert frame.body == b"to-1"
    conn.ack(frame.headers["ack"], receipt="acked")
    inbox.wait_receipt("acked")
    conn.disconnect()
    # the destination's own name: one subscription over its 3 partitions, whose cumulative
    # ACK covers what every partition delivered before it
    with Producer(broker.url) as producer:  # (three batches: a small batch fills one partition)
        for k in range(3):
            producer.send_batch([f"w{i}".encode() for i in range(4 * k, 4 * k + 4)], destination=q)
    whole, whole_inbox = connect(port)
    whole.subscribe(f"/queue/{q}", id="all", ack="client")
    frames = whole_inbox.wait_messages(12)
    assert sorted(f.body for f in frames) == sorted(f"w{i}".encode() for i in range(12))
    assert {f.headers["subscription"] for f in frames} == {"all"}
    assert {f.headers["destination"] for f in frames} == {f"/queue/{q}"}
    assert len({f.headers["message-id"].rsplit(":", 1)[0] for f in frames}) == 3  # (partitions)
    whole.ack(frames[-1].headers["ack"], receipt="all-acked")
    whole_inbox.wait_receipt("all-acked")
    assert not whole_inbox.errors
    # a partition added while it is subscribed: read under the same subscription, its ACK too
    with Admin(broker.url) as admin:
        assert admin.add_partitions(q, 4)
    with Producer(broker.url) as producer:
        producer.send_sync(b"in-3", destination=f"{q}~3")
    (late,) = whole_inbox.wait_messages(13)[12:]
    assert (late.body, late.headers["subscription"]) == (b"in-3", "all")
    assert late.headers["destination"] == f"/queue/{q}"
    whole.ack(late.headers["ack"], receipt="late-acked")
    whole_inbox.wait_receipt("late-acked")
    assert not whole_inbox.errors
    whole.disconnect()
    with Consumer(broker.url, q) as consumer:  # every partition's messages were acked
        assert consumer.receive_many(20, timeout=1) == []
