"""The Kafka listener against a real broker process, with clients no one here wrote
(confluent-kafka over librdkafka, kafka-python): produce and fetch with keys, headers and
offsets, both ways with the SDK; every compression; ListOffsets; long polls; acks; a queue
refused as a log; malformed requests; SASL and ACLs."""

from __future__ import annotations

import json
import os
import random
import struct
import time
import uuid
from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException, TopicPartition
from kafka import KafkaConsumer as PyKafkaConsumer
from kafka import KafkaProducer as PyKafkaProducer

from spark_mq import Admin
from spark_mq.client import Consumer, Producer
from spark_mq.launch import BrokerProcess
from spark_mq.security.users import UsersFile
from tests.kafka_kit import (
    KioConnection,
    RawKafka,
    consumer,
    epoch_end,
    fetch_by_id,
    kio_call,
    produce_all,
    produce_by_id,
    producer,
    read_from,
    refused_transaction,
    values_of,
)
from tests.ports import free_port
from tests.security_kit import ACL, PASSWORDS, Keys, rsa_keys, security_settings

pytestmark = pytest.mark.process


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    base = tmp_path_factory.mktemp("kafka")
    process = BrokerProcess(
        str(base / "data"),
        extra_args=["--set", f"logging.file={base / 'broker.log'}"],
        log_file=str(base / "broker.out"),
    ).start()
    try:
        yield process
    finally:
        process.stop()


@pytest.fixture
def port(broker: BrokerProcess) -> int:
    assert broker.kafka_port
    return broker.kafka_port


def _name(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def test_librdkafka_produces_and_fetches_keys_headers_and_sparkmq_offsets(
    broker: BrokerProcess, port: int
) -> None:
    topic = _name("orders")
    with Admin(broker.url) as admin:  # (a subscription holds what comes after it is made)
        admin.create_topic(topic)
        admin.create_subscription(topic, "audit")
    values = [f"order-{i}".encode() for i in range(200)]
    offsets = produce_all(
        producer(port), topic, values, key=b"customer-7", headers=[("source", b"web")]
    )
    assert offsets == list(range(200))  # sparkmq's offsets, dense from 0
    got = read_from(port, topic, 0, 200)
    assert [m.value() for m in got] == values
    assert [m.offset() for m in got] == offsets
    assert {m.key() for m in got} == {b"customer-7"}
    assert got[0].headers() == [("source", b"web")]
    ts_type, ts = got[0].timestamp()
    assert ts_type != 0 and abs(ts / 1000 - time.time()) < 60  # the enqueue time
    # the same messages through the SDK: the key is the message group, headers are headers
    with Admin(broker.url) as admin:
        assert admin.stats(topic)["kind"] == "topic"
        rows = admin.browse(topic, "audit", limit=5).to_pylist()
    assert rows[0]["group_id"] == "customer-7"
    assert dict(rows[0]["headers"]) == {"source": "web"}
    assert rows[0]["body"] == b"order-0" and rows[0]["offset"] == 0


def test_sdk_messages_reach_kafka_consumers_with_key_and_headers(
    broker: BrokerProcess, port: int
) -> None:
    topic = _name("from-sdk")
    with Admin(broker.url) as admin:
        admin.create_topic(topic)
    with Producer(broker.url, destination=topic) as p:
        for i in range(5):
            p.send(f"m{i}".encode(), group_id=f"g{i % 2}", headers={"n": str(i)}).result()
    got = read_from(port, topic, 0, 5)
    assert [m.value() for m in got] == [f"m{i}".encode() for i in range(5)]
    assert [m.key() for m in got] == [f"g{i % 2}".encode() for i in range(5)]
    assert [m.headers() for m in got] == [[("n", str(i).encode())] for i in range(5)]


def test_binary_keys_come_back_as_they_were_sent(port: int) -> None:
    topic = _name("binary-keys")
    keys = [b"\x00\xff\xfe avro-ish", "ключ".encode(), b"plain"]
    produce_all(producer(port), topic, [b"a", b"b", b"c"])  # (no key)
    for k in keys:
        produce_all(producer(port), topic, [b"v"], key=k)
    got = read_from(port, topic, 0, 6)
    assert [m.key() for m in got] == [None, None, None, *keys]


@pytest.mark.parametrize("codec", ["gzip", "snappy", "lz4", "zstd"])
def test_every_compression_is_read(port: int, codec: str) -> None:
    topic = _name(f"compressed-{codec}")
    values = [(f"{codec}-{i} " * 50).encode() for i in range(300)]
    produce_all(producer(port, **{"compression.type": codec, "linger.ms": 50}), topic, values)
    assert [m.value() for m in read_from(port, topic, 0, 300)] == values


def test_kafka_python_produces_and_consumes(broker: BrokerProcess, port: int) -> None:
    topic = _name("kafka-python")
    p = PyKafkaProducer(bootstrap_servers=f"127.0.0.1:{port}", acks="all")
    futures = [p.send(topic, key=b"k", value=f"py-{i}".encode()) for i in range(50)]
    p.flush(30)
    assert [f.get(10).offset for f in futures] == list(range(50))
    p.close()
    c = PyKafkaConsumer(
        bootstrap_servers=f"127.0.0.1:{port}", enable_auto_commit=False,
        auto_offset_reset="earliest", consumer_timeout_ms=10_000,
    )  # fmt: skip
    from kafka import TopicPartition as PyTP

    c.assign([PyTP(topic, 0)])
    c.seek_to_beginning()
    got = []
    for m in c:
        got.append(m)
        if len(got) == 50:
            break
    c.close()
    assert [m.value for m in got] == [f"py-{i}".encode() for i in range(50)]
    assert all(m.key == b"k" for m in got)


def test_list_offsets_earliest_latest_and_by_time(port: int) -> None:
    topic = _name("offsets")
    p = producer(port)
    produce_all(p, topic, [b"early"] * 10)
    time.sleep(0.3)
    middle_ms = int(time.time() * 1000)
    time.sleep(0.3)
    produce_all(p, topic, [b"late"] * 5)
    c = consumer(port)
    try:
        low, high = c.get_watermark_offsets(TopicPartition(topic, 0), timeout=10)
        assert (low, high) == (0, 15)
        (at,) = c.offsets_for_times([TopicPartition(topic, 0, middle_ms)], timeout=10)
        assert at.offset == 10
        (after,) = c.offsets_for_times(
            [TopicPartition(topic, 0, int(time.time() * 1000) + 60_000)], timeout=10
        )
        assert after.offset == -1  # none enqueued since: the end (librdkafka's "latest")
    finally:
        c.close()


def test_a_fetch_waits_for_new_messages_and_wakes_when_they_come(port: int) -> None:
    topic = _name("long-poll")
    p = producer(port)
    produce_all(p, topic, [b"first"])
    c = consumer(port, **{"fetch.wait.max.ms": 5000})
    try:
        c.assign([TopicPartition(topic, 0, 1)])  # past the end: nothing yet
        assert c.poll(1.0) is None
        sent = time.monotonic()
        produce_all(p, topic, [b"second"])
        m = None
        while m is None and time.monotonic() - sent < 10:
            m = c.poll(0.1)
        waited = time.monotonic() - sent
        assert m is not None and m.value() == b"second" and m.offset() == 1
        assert waited < 1.0, f"the waiting fetch answered {waited:.2f} s after the produce"
    finally:
        c.close()


def test_a_woken_fetch_of_a_big_tail_is_answered_too(port: int) -> None:
    """A small tail is read on the loop from memory; one of big messages (more than a loop
    should encode) goes to a helper thread: both are answered."""
    topic = _name("big-tail")
    big = os.urandom(3 * 1024 * 1024)
    p = producer(port, **{"message.max.bytes": 8 * 1024 * 1024})
    produce_all(p, topic, [b"first"])
    c = consumer(port, **{"fetch.wait.max.ms": 5000, "fetch.max.bytes": 16 * 1024 * 1024})
    try:
        c.assign([TopicPartition(topic, 0, 1)])
        assert c.poll(1.0) is None
        produce_all(p, topic, [b"small", big])
        got: list[Any] = []
        deadline = time.monotonic() + 20
        while len(got) < 2 and time.monotonic() < deadline:
            m = c.poll(0.2)
            if m is not None:
                assert m.error() is None, m.error()
                got.append(m)
        assert [m.value() for m in got] == [b"small", big]
    finally:
        c.close()


def test_acks_zero_stores_and_acks_all_answers_with_the_offset(port: int) -> None:
    topic = _name("acks")
    produce_all(producer(port, acks=0), topic, [b"fire-and-forget"] * 20)
    offsets = produce_all(producer(port, acks="all"), topic, [b"acked"])
    assert offsets == [20]
    assert len(read_from(port, topic, 0, 21)) == 21


def test_a_queue_takes_kafka_produces_but_is_not_fetched_as_a_log(
    broker: BrokerProcess, port: int
) -> None:
    q = _name("jobs")
    with Admin(broker.url) as admin:
        admin.create_queue(q)
    produce_all(producer(port), q, [b"job-1", b"job-2"], key=b"tenant-1")
    with Consumer(broker.url, q) as sdk:
        got = sdk.receive_many(2, timeout=10)
        for m in got:
            sdk.ack(m)
    assert [m.body for m in got] == [b"job-1", b"job-2"]
    assert got[0].group_id == "tenant-1"
    c = consumer(port)
    try:
        c.assign([TopicPartition(q, 0, 0)])
        m = None
        deadline = time.monotonic() + 10
        while m is None and time.monotonic() < deadline:
            m = c.poll(0.5)
        assert m is not None and m.error() is not None
        assert m.error().code() == KafkaError.TOPIC_EXCEPTION
    finally:
        c.close()
    assert "use a share consumer" in Path(broker.data_dir).parent.joinpath("broker.log").read_text()


def test_malformed_requests_close_only_their_connection(port: int) -> None:
    # ApiVersions newer than served: UNSUPPORTED_VERSION (35) and the versions served (KIP-511)
    raw = RawKafka(port)
    raw.request(18, 99, 7)
    answer = raw.response()
    correlation, error = struct.unpack(">ih", answer[:6])
    assert (correlation, error) == (7, 35)
    (count,) = struct.unpack(">i", answer[6:10])
    keys = {struct.unpack(">h", answer[10 + 6 * i : 12 + 6 * i])[0] for i in range(count)}
    assert {0, 1, 2, 3, 17, 18, 36} <= keys
    raw.close()
    cases = [
        b"\x00\x00\x00\x05garbage-that-is-longer",  # a frame that is not a request
        struct.pack(">i", 500 * 1024 * 1024),  # a 500 MiB frame before any login
        struct.pack(">ihhi", 8, 999, 0, 1),  # an API no one serves
        struct.pack(">ihhih", 10, 3, 3, 2, 0),  # Metadata v3 cut short
    ]
    for data in cases:
        bad = RawKafka(port)
        bad.sock.sendall(data)
        assert bad.closed(), data[:20]
        bad.close()
    # everyone else is served as before
    topic = _name("after-garbage")
    assert produce_all(producer(port), topic, [b"still here"]) == [0]


@pytest.fixture(scope="module")
def secure(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    base = tmp_path_factory.mktemp("kafka-secure")
    acl = ACL + (
        '\n[[allow]]\nprincipals = ["bob"]\nverbs = ["consume"]\ndestinations = ["shared.*"]\n'
        'groups = ["bob-*"]\n'
    )
    (base / "keys").mkdir()
    keys = rsa_keys(base)  # (security_settings trusts its public key)
    (base / "keys" / "jwt.key").write_bytes(keys.private_pem)
    settings = security_settings(base, acl=acl)
    # alice may log in by SCRAM too (the users file keeps her SCRAM credentials); bob may not
    UsersFile(str(settings["security.users_file"])).put(
        "alice", PASSWORDS["alice"], ["admins"], scram=True
    )
    args = ["--set", f"logging.file={base / 'broker.log'}"]
    args += ["--set", f"security.audit_file={base / 'audit.log'}"]
    for key, value in settings.items():
        args += ["--set", f"{key}={str(value).lower() if isinstance(value, bool) else value}"]
    process = BrokerProcess(
        str(base / "data"), extra_args=args, log_file=str(base / "broker.out")
    ).start()
    try:
        yield process
    finally:
        process.stop()


def _sasl(user: str, password: str) -> dict[str, str]:
    return {
        "security.protocol": "SASL_PLAINTEXT",
        "sasl.mechanism": "PLAIN",
        "sasl.username": user,
        "sasl.password": password,
    }


def test_sasl_plain_logs_in_and_the_rules_hold(secure: BrokerProcess) -> None:
    port = secure.kafka_port
    assert port
    alice = _sasl("alice", PASSWORDS["alice"])
    assert produce_all(producer(port, **alice), "shared.news", [b"hello"]) == [0]
    # bob may produce to bob.* only
    bob = _sasl("bob", PASSWORDS["bob"])
    assert produce_all(producer(port, **bob), "bob.inbox", [b"mine"]) == [0]
    with pytest.raises(AssertionError, match="TOPIC_AUTHORIZATION_FAILED"):
        produce_all(producer(port, **bob, **{"message.timeout.ms": 5000}), "shared.news", [b"x"])
    # bob may consume shared.*: he reads alice's message
    c = consumer(port, **bob)
    try:
        c.assign([TopicPartition("shared.news", 0, 0)])
        m = None
        deadline = time.monotonic() + 10
        while m is None and time.monotonic() < deadline:
            m = c.poll(0.5)
        assert m is not None and m.error() is None and m.value() == b"hello"
    finally:
        c.close()


def test_kafka_transactions_keep_to_the_rules_and_to_each_user_s_transactional_ids(
    secure: BrokerProcess,
) -> None:
    """A transactional id is its principal's own: bob's producer with alice's id fences nothing
    of hers. bob's transaction may not take in a topic he may not produce to, nor a group he
    may not use (each an abortable error, saying which); alice's commits."""
    port = secure.kafka_port
    assert port
    alice, bob = _sasl("alice", PASSWORDS["alice"]), _sasl("bob", PASSWORDS["bob"])
    hers = producer(port, **alice, **{"transactional.id": "same-id"})
    hers.init_transactions(20)
    his = producer(port, **bob, **{"transactional.id": "same-id"})
    his.init_transactions(20)  # (not a newer producer of hers: she is not fenced)
    hers.begin_transaction()
    hers.produce("shared.txn", b"hers")
    his.begin_transaction()
    assert KafkaError.TOPIC_AUTHORIZATION_FAILED in refused_transaction(his, "shared.txn", b"his")
    his.abort_transaction(20)
    his.begin_transaction()
    his.produce("bob.txn", b"his")
    group = consumer(port, **bob, **{"group.id": "alices-group"})
    try:
        with pytest.raises(KafkaException) as refused:
            his.send_offsets_to_transaction(
                [TopicPartition("bob.txn", 0, 1)], group.consumer_group_metadata(), 20
            )
    finally:
        group.close()
    err = refused.value.args[0]
    assert err.code() == KafkaError.GROUP_AUTHORIZATION_FAILED and not err.fatal(), err
    his.abort_transaction(20)
    hers.commit_transaction(20)
    assert [m.value() for m in read_from(port, "shared.txn", 0, 1, settings=alice)] == [b"hers"]
    reader = consumer(port, **alice)
    try:
        _, high = reader.get_watermark_offsets(TopicPartition("bob.txn", 0), timeout=10)
    finally:
        reader.close()
    assert high == 0  # (bob's aborted transactions left nothing)


def test_admin_tools_see_and_abort_only_what_their_user_may(secure: BrokerProcess) -> None:
    """kafka-python's transaction admin (KIP-664) under SASL: bob lists and describes his own
    transactional ids only, may not see producers of a topic he may not consume, nor abort
    (CLUSTER_AUTHORIZATION_FAILED, and his transaction is left open); alice, the broker's
    admin, sees both users' ids, describes her own, and aborts his, which fences him."""
    from kafka import KafkaAdminClient
    from kafka import TopicPartition as KTopicPartition
    from kafka.admin._transactions import AbortTransactionSpec
    from kafka.errors import ClusterAuthorizationFailedError, TopicAuthorizationFailedError

    port = secure.kafka_port
    assert port
    tid, topic = f"ids-{uuid.uuid4().hex[:8]}", _name("bob.adm")

    def admin_of(user: str) -> KafkaAdminClient:
        return KafkaAdminClient(
            bootstrap_servers=f"127.0.0.1:{port}",
            security_protocol="SASL_PLAINTEXT",
            sasl_mechanism="PLAIN",
            sasl_plain_username=user,
            sasl_plain_password=PASSWORDS[user],
        )

    hers = producer(port, **_sasl("alice", PASSWORDS["alice"]), **{"transactional.id": tid})
    hers.init_transactions(20)
    his = producer(port, **_sasl("bob", PASSWORDS["bob"]), **{"transactional.id": tid})
    his.init_transactions(20)
    his.begin_transaction()
    his.produce(topic, b"his")
    assert his.flush(10) == 0
    bob, alice = admin_of("bob"), admin_of("alice")
    try:

        def listed(admin: KafkaAdminClient) -> list[tuple[int, str]]:
            (node,) = admin.list_transactions().values()
            return sorted((t.producer_id, t.state.value) for t in node if t.transactional_id == tid)

        (his_listing,) = listed(bob)
        his_pid = his_listing[0]
        assert his_listing == (his_pid, "Ongoing")
        assert bob.describe_transactions([tid])[tid].producer_id == his_pid
        both = listed(alice)
        assert len(both) == 2 and (his_pid, "Ongoing") in both
        (her_pid,) = [pid for pid, state in both if state == "Empty"]
        assert alice.describe_transactions([tid])[tid].producer_id == her_pid
        hidden = _name("alice.adm")  # (bob may not consume it)
        assert produce_all(producer(port, **_sasl("alice", PASSWORDS["alice"])), hidden, [b"s"])
        (node,) = bob.list_transactions().keys()  # (bob cannot see the topic's leader)
        with pytest.raises(TopicAuthorizationFailedError):
            bob.describe_producers([KTopicPartition(hidden, 0)], broker_id=node)
        assert alice.describe_producers([KTopicPartition(hidden, 0)])
        spec = AbortTransactionSpec(KTopicPartition(topic, 0), his_pid, 0)
        with pytest.raises(ClusterAuthorizationFailedError):
            bob.abort_transaction(spec)
        assert listed(bob) == [(his_pid, "Ongoing")]
        alice.abort_transaction(spec)
        assert listed(bob) == [(his_pid, "CompleteAbort")]
        audit = [
            json.loads(line)
            for line in (Path(secure.data_dir).parent / "audit.log").read_text().splitlines()
        ]
        seen = {(e["event"], e["principal"], e["verb"], e["destination"]) for e in audit}
        assert ("denied", "bob", "admin", None) in seen  # (his abort)
        assert ("admin", "alice", "AbortKafkaTransaction", f"{topic}[0]") in seen
    finally:
        bob.close()
        alice.close()
    with pytest.raises(KafkaException) as fenced:
        his.commit_transaction(20)
    assert fenced.value.args[0].fatal(), fenced.value.args[0]


def test_sasl_scram_sha_512_logs_in_users_with_scram_credentials(secure: BrokerProcess) -> None:
    port = secure.kafka_port
    assert port

    def scram(user: str, password: str) -> dict[str, str]:
        return {
            "security.protocol": "SASL_PLAINTEXT",
            "sasl.mechanism": "SCRAM-SHA-512",
            "sasl.username": user,
            "sasl.password": password,
        }

    topic = _name("scram")
    assert produce_all(producer(port, **scram("alice", PASSWORDS["alice"])), topic, [b"s"]) == [0]
    (m,) = read_from(port, topic, 0, 1, settings=scram("alice", PASSWORDS["alice"]))
    assert m.value() == b"s"
    # kafka-python's SCRAM too
    py = PyKafkaProducer(
        bootstrap_servers=f"127.0.0.1:{port}",
        security_protocol="SASL_PLAINTEXT",
        sasl_mechanism="SCRAM-SHA-512",
        sasl_plain_username="alice",
        sasl_plain_password=PASSWORDS["alice"],
    )
    assert py.send(topic, b"py").get(timeout=15).offset == 1
    py.close()
    # a wrong password; a user without SCRAM credentials; nobody: refused alike, saying what to do
    for user, password in (("alice", "wrong"), ("bob", PASSWORDS["bob"]), ("nobody", "x")):
        told: list[KafkaError] = []
        refused = producer(
            port, **scram(user, password), **{"message.timeout.ms": 3000, "error_cb": told.append}
        )
        with pytest.raises(AssertionError, match=r"still unacknowledged|MSG_TIMED_OUT"):
            produce_all(refused, topic, [b"no"])
        auth = [e.str() for e in told if e.code() == KafkaError._AUTHENTICATION]
        assert auth and "no SCRAM credentials" in auth[0], (user, told)
        assert "sparkmq user passwd NAME --scram" in auth[0]
    with Admin(secure.url, username="alice", password=PASSWORDS["alice"]) as admin:
        assert admin.stats(topic)["end_offset"] == 2  # (only alice's)


def test_a_consumer_s_check_of_its_position_finds_the_log_whole(secure: BrokerProcess) -> None:
    """OffsetForLeaderEpoch (KIP-320), which a consumer asks after its partition's leader
    changed: every epoch up to the leader's (one broker: 0) ends at the log's end, since
    nothing a fetch returned is ever truncated; a later epoch is not known (-1, -1); a current
    epoch newer than the leader's is UNKNOWN_LEADER_EPOCH. It needs what a fetch needs."""
    port = secure.kafka_port
    assert port
    produce_all(producer(port, **_sasl("alice", PASSWORDS["alice"])), "shared.epochs", [b"1"] * 3)
    produce_all(producer(port, **_sasl("alice", PASSWORDS["alice"])), "alice.epochs", [b"1"])
    with KioConnection(port, "bob", PASSWORDS["bob"]) as bob:
        assert epoch_end(bob, "shared.epochs", -1, 0) == (0, 0, 3)
        assert epoch_end(bob, "shared.epochs", 0, 0) == (0, 0, 3)
        assert epoch_end(bob, "shared.epochs", 0, 1) == (0, -1, -1)
        assert epoch_end(bob, "shared.epochs", 1, 0) == (75, -1, -1)  # UNKNOWN_LEADER_EPOCH
        assert epoch_end(bob, "alice.epochs", -1, 0) == (29, -1, -1)  # TOPIC_AUTHORIZATION_FAILED
        assert epoch_end(bob, "shared.none", -1, 0) == (3, -1, -1)  # UNKNOWN_TOPIC_OR_PARTITION


def test_a_wrong_password_or_no_login_gets_nothing(secure: BrokerProcess) -> None:
    port = secure.kafka_port
    assert port
    # (a topic of its own with one message of alice's: the test stands alone, whichever of the
    # module's tests ran before it on this broker)
    topic = _name("shared.locked")
    assert produce_all(producer(port, **_sasl("alice", PASSWORDS["alice"])), topic, [b"a"]) == [0]
    told: list[KafkaError] = []
    wrong = producer(
        port, **_sasl("alice", "not-her-password"),
        **{"message.timeout.ms": 4000, "error_cb": told.append},
    )  # fmt: skip
    with pytest.raises(AssertionError, match=r"still unacknowledged|MSG_TIMED_OUT"):
        produce_all(wrong, topic, [b"x"])
    auth = [e for e in told if e.code() == KafkaError._AUTHENTICATION]
    assert auth and "wrong user name or password" in auth[0].str(), told
    anonymous = producer(port, **{"message.timeout.ms": 4000})
    with pytest.raises(AssertionError, match=r"still unacknowledged|MSG_TIMED_OUT"):
        produce_all(anonymous, topic, [b"x"])
    log = Path(secure.data_dir).parent.joinpath("broker.log").read_text()
    assert "not logged in" in log and "SASL PLAIN" in log
    with Admin(secure.url, username="alice", password=PASSWORDS["alice"]) as admin:
        assert admin.stats(topic)["end_offset"] == 1  # (only alice's)


# -- consumer groups ------------------------------------------------------------------------
def _group_consumer(port: int, group: str, **settings: Any) -> Any:
    return consumer(
        port,
        **{
            "group.id": group,
            "auto.offset.reset": "earliest",
            "session.timeout.ms": 6000,
            "heartbeat.interval.ms": 500,
            **settings,
        },
    )


def test_a_group_of_three_hands_the_partition_on_and_resumes_from_committed_offsets(
    port: int,
) -> None:
    topic, group = _name("grouped"), _name("group")
    produce_all(producer(port), topic, [f"e{i}".encode() for i in range(90)])
    members = [_group_consumer(port, group) for _ in range(3)]
    for c in members:
        c.subscribe([topic])
    seen: list[tuple[int, int]] = []  # (member, offset)
    try:
        # poll all three until 30 messages are in; each commits what it read, synchronously
        deadline = time.monotonic() + 30
        while len(seen) < 30 and time.monotonic() < deadline:
            for i, c in enumerate(members):
                m = c.poll(0.05)
                if m is not None and m.error() is None and len(seen) < 30:
                    seen.append((i, m.offset()))
                    c.commit(m, asynchronous=False)
        assert len(seen) == 30
        owner = seen[0][0]
        assert {i for i, _ in seen} == {owner}  # one partition: one member reads it
        members[owner].close()  # (leaves the group: the others rebalance)
        rest = [c for i, c in enumerate(members) if i != owner]
        deadline = time.monotonic() + 30
        while len(seen) < 90 and time.monotonic() < deadline:
            for j, c in enumerate(rest):
                m = c.poll(0.05)
                if m is not None and m.error() is None:
                    seen.append((10 + j, m.offset()))
                    c.commit(m, asynchronous=False)
        offsets = [o for _, o in seen]
        assert offsets == list(range(90))  # resumed at the committed offset: none lost or twice
        assert len({i for i, _ in seen[30:]}) == 1
    finally:
        for i, c in enumerate(members):
            if not seen or i != seen[0][0]:
                c.close()


def test_groups_are_listed_and_described_and_offsets_read_back(port: int) -> None:
    from confluent_kafka.admin import AdminClient

    topic, group = _name("described"), _name("group")
    produce_all(producer(port), topic, [b"x"] * 5)
    c = _group_consumer(port, group)
    c.subscribe([topic])
    try:
        got = 0
        deadline = time.monotonic() + 20
        while got < 5 and time.monotonic() < deadline:
            m = c.poll(0.2)
            if m is not None and m.error() is None:
                got += 1
                c.commit(m, asynchronous=False)
        admin = AdminClient({"bootstrap.servers": f"127.0.0.1:{port}"})
        listed = admin.list_consumer_groups().result(10)
        assert group in {g.group_id for g in listed.valid}
        described = admin.describe_consumer_groups([group])[group].result(10)
        assert str(described.state).endswith("STABLE") and len(described.members) == 1
        (tp,) = c.committed([TopicPartition(topic, 0)], timeout=10)
        assert tp.offset == 5
    finally:
        c.close()


def _read_in_group(c: Any, want: int, timeout: float = 20) -> list[Any]:
    got: list[Any] = []
    deadline = time.monotonic() + timeout
    while len(got) < want and time.monotonic() < deadline:
        m = c.poll(0.2)
        if m is not None:
            got.append(m)
            if m.error() is not None:
                break
            c.commit(m, asynchronous=False)
    return got


def test_groups_are_resources_of_their_own_in_the_access_rules(secure: BrokerProcess) -> None:
    from confluent_kafka.admin import AdminClient

    port = secure.kafka_port
    assert port
    alice, bob = _sasl("alice", PASSWORDS["alice"]), _sasl("bob", PASSWORDS["bob"])
    topic = _name("shared.grouped")
    produce_all(producer(port, **alice), topic, [b"a", b"b"])
    # alice (admin of everything) uses a group of her own
    c = _group_consumer(port, "alice-readers", **alice)
    c.subscribe([topic])
    try:
        assert [m.value() for m in _read_in_group(c, 2)] == [b"a", b"b"]
    finally:
        c.close()
    # bob may consume the topic, but only in groups bob-*
    c = _group_consumer(port, "alice-readers", **bob)
    c.subscribe([topic])
    try:
        (refused,) = _read_in_group(c, 1)
        assert refused.error().code() == KafkaError.GROUP_AUTHORIZATION_FAILED, refused.error()
    finally:
        c.close()
    c = _group_consumer(port, "bob-readers", **bob)
    c.subscribe([topic])
    try:
        assert [m.value() for m in _read_in_group(c, 2)] == [b"a", b"b"]
    finally:
        c.close()
    # bob lists only his groups; he reads alice's offsets and deletes groups not at all
    admin = AdminClient({"bootstrap.servers": f"127.0.0.1:{port}", **bob})
    listed = {g.group_id for g in admin.list_consumer_groups().result(10).valid}
    assert "bob-readers" in listed and "alice-readers" not in listed
    from confluent_kafka import ConsumerGroupTopicPartitions

    with pytest.raises(Exception, match="GROUP_AUTHORIZATION_FAILED"):
        admin.list_consumer_group_offsets(
            [ConsumerGroupTopicPartitions("alice-readers", [TopicPartition(topic, 0)])]
        )["alice-readers"].result(10)
    with pytest.raises(Exception, match="GROUP_AUTHORIZATION_FAILED"):
        admin.delete_consumer_groups(["bob-readers"])["bob-readers"].result(10)
    # the refusals are audited
    audit = Path(secure.data_dir).parent / "audit.log"  # (the fixture's security.audit_file)
    assert audit.exists() and "group 'alice-readers'" in audit.read_text()


def test_admin_tools_describe_the_access_rules_as_kafka_acls(
    secure: BrokerProcess, port: int
) -> None:
    """DescribeAcls (librdkafka's v1, kafka-python's v3): the access rules as Kafka's ACL
    bindings, filtered as Kafka filters them (ANY, MATCH, a principal); only the broker's
    admin may see them (bob gets CLUSTER_AUTHORIZATION_FAILED, audited); a broker with
    security off answers SECURITY_DISABLED."""
    from confluent_kafka.admin import (
        AclBindingFilter,
        AclOperation,
        AclPermissionType,
        AdminClient,
        ResourcePatternType,
        ResourceType,
    )
    from kafka import KafkaAdminClient
    from kafka.admin import (
        ACLFilter,
        ACLOperation,
        ACLPermissionType,
        ACLResourcePatternType,
        ResourcePatternFilter,
    )
    from kafka.admin import ResourceType as PyResourceType
    from kafka.errors import ClusterAuthorizationFailedError, SecurityDisabledError

    secured = secure.kafka_port
    assert secured
    admin = AdminClient(
        {"bootstrap.servers": f"127.0.0.1:{secured}", **_sasl("alice", PASSWORDS["alice"])}
    )

    def described(
        kind: Any = ResourceType.ANY,
        name: str | None = None,
        pattern: Any = ResourcePatternType.ANY,
        principal: str | None = None,
        client: Any = admin,
    ) -> set[tuple[str, str, str, str, str]]:
        wanted = AclBindingFilter(
            kind, name, pattern, principal, None, AclOperation.ANY, AclPermissionType.ANY
        )
        got = client.describe_acls(wanted).result(timeout=20)
        assert {(b.host, b.permission_type.name) for b in got} <= {("*", "ALLOW")}
        return {
            (b.restype.name, b.name, b.resource_pattern_type.name, b.principal, b.operation.name)
            for b in got
        }

    admins = "Group:admins"
    every = {
        ("TOPIC", "*", "LITERAL", admins, "ALL"),
        ("GROUP", "*", "LITERAL", admins, "ALL"),
        ("BROKER", "kafka-cluster", "LITERAL", admins, "ALL"),  # (librdkafka's CLUSTER)
        ("TOPIC", "bob.", "PREFIXED", "User:bob", "WRITE"),
        ("TOPIC", "bob.", "PREFIXED", "User:bob", "READ"),
        ("TOPIC", "bob.", "PREFIXED", "User:bob", "CREATE"),
        ("GROUP", "bob-", "PREFIXED", "User:bob", "READ"),
        ("TOPIC", "shared.", "PREFIXED", "User:bob", "READ"),
    }
    assert described() == every
    # what applies to the topic bob.inbox: the wildcard, and bob's prefix
    assert described(ResourceType.TOPIC, "bob.inbox", ResourcePatternType.MATCH) == {
        ("TOPIC", "*", "LITERAL", admins, "ALL"),
        ("TOPIC", "bob.", "PREFIXED", "User:bob", "WRITE"),
        ("TOPIC", "bob.", "PREFIXED", "User:bob", "READ"),
        ("TOPIC", "bob.", "PREFIXED", "User:bob", "CREATE"),
    }
    assert described(ResourceType.GROUP, principal="User:bob") == {
        ("GROUP", "bob-", "PREFIXED", "User:bob", "READ")
    }
    assert described(ResourceType.TOPIC, "bob.", ResourcePatternType.LITERAL) == set()

    # kafka-python asks with the newest version (3, flexible)
    def py_admin(at: int, **login: str) -> KafkaAdminClient:
        return KafkaAdminClient(bootstrap_servers=f"127.0.0.1:{at}", **login)

    def _py_sasl(user: str) -> dict[str, str]:
        return {
            "security_protocol": "SASL_PLAINTEXT",
            "sasl_mechanism": "PLAIN",
            "sasl_plain_username": user,
            "sasl_plain_password": PASSWORDS[user],
        }

    everything = ACLFilter(
        principal=None,
        host=None,
        operation=ACLOperation.ANY,
        permission_type=ACLPermissionType.ANY,
        resource_pattern=ResourcePatternFilter(
            PyResourceType.ANY, None, ACLResourcePatternType.ANY
        ),
    )
    hers = py_admin(secured, **_py_sasl("alice"))
    try:
        acls, _ = hers.describe_acls(
            ACLFilter(
                principal="User:bob",
                host=None,
                operation=ACLOperation.READ,
                permission_type=ACLPermissionType.ANY,
                resource_pattern=ResourcePatternFilter(
                    PyResourceType.TOPIC, None, ACLResourcePatternType.ANY
                ),
            )
        )
        assert sorted(a.resource_pattern.resource_name for a in acls) == ["bob.", "shared."]
    finally:
        hers.close()

    # bob is not the broker's admin: refused, and audited
    bobs = AdminClient(
        {"bootstrap.servers": f"127.0.0.1:{secured}", **_sasl("bob", PASSWORDS["bob"])}
    )
    # (librdkafka's AdminClient shows an answer's top-level error as no bindings at all;
    # kafka-python raises it)
    assert described(client=bobs) == set()
    his = py_admin(secured, **_py_sasl("bob"))
    try:
        with pytest.raises(ClusterAuthorizationFailedError, match="'bob' may not admin"):
            his.describe_acls(everything)
    finally:
        his.close()
    audit = Path(secure.data_dir).parent / "audit.log"
    assert "'bob' may not admin" in audit.read_text()

    # no access rules at all
    plain = py_admin(port)
    try:
        with pytest.raises(SecurityDisabledError, match="security is off"):
            plain.describe_acls(everything)
    finally:
        plain.close()


def test_create_partitions_needs_admin_of_the_topic(secure: BrokerProcess) -> None:
    """Adding partitions is administering the topic (Kafka's ALTER): refused to a user who
    may only consume it, even to validate, and audited; its administrator adds them."""
    from confluent_kafka.admin import AdminClient, NewPartitions, NewTopic

    port = secure.kafka_port
    assert port
    alice, bob = _sasl("alice", PASSWORDS["alice"]), _sasl("bob", PASSWORDS["bob"])
    topic = _name("shared.widened")
    alice_admin = AdminClient({"bootstrap.servers": f"127.0.0.1:{port}", **alice})
    alice_admin.create_topics([NewTopic(topic, num_partitions=2)])[topic].result(10)
    bob_admin = AdminClient({"bootstrap.servers": f"127.0.0.1:{port}", **bob})
    for validate in (True, False):
        asked = bob_admin.create_partitions([NewPartitions(topic, 3)], validate_only=validate)
        with pytest.raises(Exception, match="TOPIC_AUTHORIZATION_FAILED"):
            asked[topic].result(10)
    checked = alice_admin.create_partitions([NewPartitions(topic, 3)], validate_only=True)
    checked[topic].result(10)
    assert sorted(alice_admin.list_topics(topic, timeout=10).topics[topic].partitions) == [0, 1]
    alice_admin.create_partitions([NewPartitions(topic, 3)])[topic].result(10)
    assert sorted(alice_admin.list_topics(topic, timeout=10).topics[topic].partitions) == [0, 1, 2]
    audit = Path(secure.data_dir).parent / "audit.log"
    denials = [line for line in audit.read_text().splitlines() if "denied" in line]
    assert any(topic in line and "bob" in line for line in denials), denials[-3:]


def test_offsets_are_deleted_by_offset_delete_and_with_their_group(port: int) -> None:
    from confluent_kafka import ConsumerGroupTopicPartitions
    from confluent_kafka.admin import AdminClient
    from kafka import KafkaAdminClient
    from kafka import TopicPartition as PyTopicPartition

    admin = AdminClient({"bootstrap.servers": f"127.0.0.1:{port}"})
    # (OffsetDelete: kafka-python's admin; confluent-kafka's has no call for it)
    py_admin = KafkaAdminClient(bootstrap_servers=f"127.0.0.1:{port}")
    topic, other, group = _name("deleted-offsets"), _name("kept-offsets"), _name("group")
    produce_all(producer(port), topic, [b"x"] * 3)
    produce_all(producer(port), other, [b"y"] * 3)
    c = _group_consumer(port, group)
    c.subscribe([topic, other])
    try:
        assert len(_read_in_group(c, 6)) == 6
        # while a member subscribes to the topic, its offsets stay (as Kafka)
        (outcome,) = py_admin.delete_group_offsets(group, [PyTopicPartition(topic, 0)]).values()
        assert outcome.__name__ == "GroupSubscribedToTopicError"
    finally:
        c.close()

    def committed() -> dict[str, int]:
        found = admin.list_consumer_group_offsets([ConsumerGroupTopicPartitions(group)])
        return {tp.topic: tp.offset for tp in found[group].result(10).topic_partitions}

    assert committed() == {topic: 3, other: 3}
    (outcome,) = py_admin.delete_group_offsets(group, [PyTopicPartition(topic, 0)]).values()
    assert outcome.__name__ == "NoError"
    assert committed() == {other: 3}
    admin.delete_consumer_groups([group])[group].result(10)
    assert committed() == {}
    py_admin.close()
    # the group starts again from the beginning
    c = _group_consumer(port, group)
    c.subscribe([other])
    try:
        assert [m.offset() for m in _read_in_group(c, 3)] == [0, 1, 2]
    finally:
        c.close()


def test_kafka_python_consumes_in_a_group_and_commits(port: int) -> None:
    topic, group = _name("py-group"), _name("group")
    produce_all(producer(port), topic, [f"p{i}".encode() for i in range(20)])
    c = PyKafkaConsumer(
        topic, bootstrap_servers=f"127.0.0.1:{port}", group_id=group,
        auto_offset_reset="earliest", enable_auto_commit=False, consumer_timeout_ms=15_000,
    )  # fmt: skip
    got = []
    for m in c:
        got.append(m.value)
        if len(got) == 20:
            break
    c.commit()
    c.close()
    assert got == [f"p{i}".encode() for i in range(20)]
    again = consumer(port, **{"group.id": group})
    try:
        (tp,) = again.committed([TopicPartition(topic, 0)], timeout=10)
        assert tp.offset == 20
    finally:
        again.close()


def test_committed_offsets_and_messages_survive_a_sigkill(tmp_path: Path) -> None:
    data = tmp_path / "data"
    first = BrokerProcess(str(data), log_file=str(tmp_path / "broker.out")).start()
    try:
        assert first.kafka_port
        port = first.kafka_port
        topic, group = _name("durable"), _name("group")
        produce_all(producer(port, acks="all"), topic, [f"d{i}".encode() for i in range(10)])
        c = _group_consumer(port, group)
        c.subscribe([topic])
        read = 0
        deadline = time.monotonic() + 20
        while read < 6 and time.monotonic() < deadline:
            m = c.poll(0.2)
            if m is not None and m.error() is None:
                read += 1
                c.commit(m, asynchronous=False)  # (answered once durable)
        assert read == 6
    finally:
        first.kill()  # SIGKILL: no flush, no goodbye
    second = BrokerProcess(str(data), log_file=str(tmp_path / "broker2.out")).start()
    try:
        assert second.kafka_port
        again = _group_consumer(second.kafka_port, group)
        again.subscribe([topic])
        rest = []
        deadline = time.monotonic() + 30
        while len(rest) < 4 and time.monotonic() < deadline:
            m = again.poll(0.2)
            if m is not None and m.error() is None:
                rest.append(m.value())
        again.close()
        assert rest == [f"d{i}".encode() for i in range(6, 10)]  # from the committed offset
    finally:
        second.stop()


def test_compaction_keeps_what_kafka_consumers_read_and_the_groups_offsets(
    tmp_path: Path,
) -> None:
    """A Kafka topic is a log its readers may read again (Kafka's retention.ms, a week by
    default): compaction keeps its messages that long although no sparkmq subscription owes
    them; the committed offsets (the internal topic, owed to nobody either) survive it too."""
    from spark_mq.jobs.compaction import CompactionPolicy, compact_all

    data = tmp_path / "data"
    first = BrokerProcess(str(data), log_file=str(tmp_path / "broker.out")).start()
    topic, group = _name("kept"), _name("group")
    try:
        assert first.kafka_port
        produce_all(producer(first.kafka_port), topic, [f"k{i}".encode() for i in range(6)])
        c = _group_consumer(first.kafka_port, group)
        c.subscribe([topic])
        assert [m.value() for m in _read_in_group(c, 2)] == [b"k0", b"k1"]
        c.close()
        with Admin(first.url) as admin:
            assert admin.stats(topic)["settings"]["retention_s"] == 7 * 24 * 3600
    finally:
        first.stop()  # (everything moved to Delta)
    runs = compact_all(data, CompactionPolicy(force=True, retention_hours=1, keep_recent_s=0))
    assert not [r for r in runs if r.action == "failed"], runs
    second = BrokerProcess(str(data), log_file=str(tmp_path / "broker2.out")).start()
    try:
        assert second.kafka_port
        # the group goes on from its committed offset; a new reader reads it all again
        again = _group_consumer(second.kafka_port, group)
        again.subscribe([topic])
        assert [m.value() for m in _read_in_group(again, 4)] == [b"k2", b"k3", b"k4", b"k5"]
        again.close()
        fresh = read_from(second.kafka_port, topic, 0, 6)
        assert [m.value() for m in fresh] == [f"k{i}".encode() for i in range(6)]
    finally:
        second.stop()


_SILENT_MEMBER = """
import sys, time
from confluent_kafka import Consumer
c = Consumer({"bootstrap.servers": sys.argv[1], "group.id": sys.argv[2],
              "auto.offset.reset": "earliest", "enable.auto.commit": False,
              "session.timeout.ms": 6000, "heartbeat.interval.ms": 500})
c.subscribe([sys.argv[3]])
while True:
    m = c.poll(0.2)
    if m is not None and m.error() is None:
        print(m.offset(), flush=True)
"""


def test_a_member_killed_is_out_after_its_session_timeout_and_another_takes_over(
    port: int, tmp_path: Path
) -> None:
    import subprocess
    import sys

    topic, group = _name("timeout"), _name("group")
    produce_all(producer(port), topic, [b"a"] * 3)
    script = tmp_path / "member.py"
    script.write_text(_SILENT_MEMBER)
    member = subprocess.Popen(
        [sys.executable, str(script), f"127.0.0.1:{port}", group, topic],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert member.stdout is not None
        assert member.stdout.readline().strip() == "0"  # it owns the partition
        member.kill()  # no LeaveGroup: only its silence tells
        killed = time.monotonic()
        other = _group_consumer(port, group)
        other.subscribe([topic])  # (its join waits for the dead member: rejoin or time out)
        m = None
        while m is None and time.monotonic() - killed < 30:
            m = other.poll(0.2)
            if m is not None and m.error() is not None:
                m = None
        taken = time.monotonic() - killed
        assert m is not None and m.offset() == 0  # nothing was committed: from the start
        assert 4.0 <= taken <= 15.0, f"taken over {taken:.1f} s after the kill"
        other.close()
    finally:
        member.kill()
        member.wait()


def test_sasl_oauthbearer_logs_in_with_a_bearer_token(secure: BrokerProcess) -> None:
    port = secure.kafka_port
    assert port
    private = Path(secure.data_dir).parent.joinpath("keys", "jwt.key").read_bytes()
    keys = Keys(private, Path(secure.data_dir).parent / "jwt.pub.pem")

    def token(groups: list[str]) -> dict[str, Any]:
        return {
            "security.protocol": "SASL_PLAINTEXT",
            "sasl.mechanism": "OAUTHBEARER",
            "oauth_cb": lambda _config: (keys.token("dave", groups=groups), time.time() + 300),
        }

    assert produce_all(producer(port, **token(["admins"])), "shared.oauth", [b"t"]) == [0]
    told: list[KafkaError] = []
    expired = {
        **token([]),
        "oauth_cb": lambda _c: (keys.token("dave", expires_in=-60), time.time() + 300),
        "error_cb": told.append,
        "message.timeout.ms": 4000,
    }
    with pytest.raises(AssertionError, match=r"still unacknowledged|MSG_TIMED_OUT"):
        produce_all(producer(port, **expired), "shared.oauth", [b"x"])
    assert any("expired" in e.str() for e in told), told


def test_kafka_admin_creates_queues_and_topics_and_deletes_them(
    broker: BrokerProcess, port: int
) -> None:
    from confluent_kafka.admin import (
        AdminClient,
        AlterConfigOpType,
        ConfigEntry,
        ConfigResource,
        NewTopic,
    )

    admin = AdminClient({"bootstrap.servers": f"127.0.0.1:{port}"})
    q, t, four = _name("made-queue"), _name("made-topic"), _name("four-partitions")
    futures = admin.create_topics(
        [
            NewTopic(
                q, 1, 1, config={"sparkmq.kind": "queue", "sparkmq.max_delivery_attempts": "3"}
            ),
            NewTopic(t, -1, -1, config={"cleanup.policy": "delete"}),
            NewTopic(four, 4, 1, config={"sparkmq.max_delivery_attempts": "4"}),
        ]
    )
    futures[q].result(10)
    futures[t].result(10)
    futures[four].result(10)
    with pytest.raises(Exception, match="exists"):
        admin.create_topics([NewTopic(t, 1, 1)])[t].result(10)
    with Admin(broker.url) as sdk:
        assert sdk.stats(q)["kind"] == "queue"
        assert sdk.stats(q)["settings"]["max_delivery_attempts"] == 3
        assert sdk.stats(t)["kind"] == "topic"
    # a partitioned topic's configs are its partitions', altered and deleted together
    described = admin.describe_configs([ConfigResource("topic", four)])
    configs = next(iter(described.values())).result(10)
    assert configs["sparkmq.max_delivery_attempts"].value == "4"
    assert configs["sparkmq.partitions"].value == "4"
    altered = admin.incremental_alter_configs([ConfigResource(
        "topic", four, incremental_configs=[ConfigEntry(
            "sparkmq.max_delivery_attempts", "6",
            incremental_operation=AlterConfigOpType.SET)])])  # fmt: skip
    next(iter(altered.values())).result(10)
    with Admin(broker.url) as sdk:
        parts = sdk.stats(four)["partitions"]
        assert {p["settings"]["max_delivery_attempts"] for p in parts} == {6}
    for deleted in admin.delete_topics([q, four]).values():
        deleted.result(10)
    with Admin(broker.url) as sdk:
        names = {d["name"] for d in sdk.list_destinations()}
    assert q not in names and not any(n.startswith(four) for n in names)


def _fuzz_cases(rng: random.Random) -> list[bytes]:
    """Valid requests (a Produce of a real record batch, Metadata, Fetch), then mutated."""
    import io

    from kafka.record.default_records import DefaultRecordBatchBuilder
    from kio.schema.fetch.v12 import request as fetch12
    from kio.schema.metadata.v12 import request as metadata12
    from kio.schema.produce.v9 import request as produce9
    from kio.schema.request_header.v2.header import RequestHeader
    from kio.serial import entity_writer

    def frame(key: int, version: int, body: Any) -> bytes:
        buf = io.BytesIO()
        entity_writer(RequestHeader)(
            buf, RequestHeader(request_api_key=key, request_api_version=version,
                               correlation_id=rng.randint(0, 1000), client_id="fuzz")
        )  # fmt: skip
        entity_writer(type(body))(buf, body)
        data = buf.getvalue()
        return struct.pack(">i", len(data)) + data

    builder = DefaultRecordBatchBuilder(2, 0, False, -1, -1, -1, 1 << 20)
    for i in range(3):
        builder.append(i, timestamp=None, key=None, value=f"fuzz-{i}".encode(), headers=[])
    records = bytes(builder.build())
    valid = [
        frame(0, 9, produce9.ProduceRequest(
            acks=-1, timeout=timedelta(seconds=5),
            topic_data=(produce9.TopicProduceData(name="fuzzed", partition_data=(
                produce9.PartitionProduceData(index=0, records=records),)),),
        )),
        frame(3, 12, metadata12.MetadataRequest(
            topics=None, allow_auto_topic_creation=True, include_topic_authorized_operations=False
        )),
        frame(1, 12, fetch12.FetchRequest(
            max_wait=timedelta(milliseconds=10), min_bytes=1,
            topics=(fetch12.FetchTopic(topic="fuzzed", partitions=(fetch12.FetchPartition(
                partition=0, fetch_offset=0, partition_max_bytes=1 << 20),)),),
            forgotten_topics_data=(),
        )),
    ]  # fmt: skip
    cases = list(valid)
    for _ in range(300):
        data = bytearray(rng.choice(valid))
        match rng.randrange(5):
            case 0:  # flip bytes after the size
                for _ in range(rng.randint(1, 8)):
                    data[rng.randrange(4, len(data))] = rng.randrange(256)
            case 1:  # cut short (the size says more: the frame deadline ends it)
                data = data[: rng.randrange(4, len(data))]
            case 2:  # a size that lies (bigger or smaller)
                data[:4] = struct.pack(">i", rng.choice([0, 1, 7, len(data) // 2, -5, 1 << 30]))
            case 3:  # garbage appended inside the frame
                extra = rng.randbytes(rng.randint(1, 64))
                data = bytearray(struct.pack(">i", len(data) - 4 + len(extra))) + data[4:] + extra
            case 4:  # a random API key and version
                data[4:8] = struct.pack(">hh", rng.randrange(-5, 120), rng.randrange(-2, 20))
        cases.append(bytes(data))
    return cases


def test_fuzzed_requests_never_crash_the_listener_nor_store_garbage(
    broker: BrokerProcess, port: int
) -> None:
    import selectors

    rng = random.Random(47)
    answered = closed = 0
    cases = _fuzz_cases(rng)
    for at in range(0, len(cases), 50):  # fifty connections at a time, each its own case
        socks = []
        for data in cases[at : at + 50]:
            raw = RawKafka(port)
            raw.sock.sendall(data)
            raw.sock.setblocking(False)
            socks.append(raw)
        sel = selectors.DefaultSelector()
        for raw in socks:
            sel.register(raw.sock, selectors.EVENT_READ, raw)
        deadline = time.monotonic() + 2.0
        while sel.get_map() and time.monotonic() < deadline:
            for key, _ in sel.select(0.1):
                try:
                    chunk = key.fileobj.recv(65536)  # type: ignore[union-attr]
                except OSError:
                    chunk = b""
                if chunk:
                    answered += 1
                else:
                    closed += 1
                sel.unregister(key.fileobj)
        sel.close()
        for raw in socks:  # (the rest wait for bytes that never come: closed by us)
            raw.close()
    assert answered > 0 and closed > 0  # (both kinds of endings were exercised)
    # what was stored is only what a valid batch held
    stored = read_from(port, "fuzzed", 0, 1, timeout=10) if answered else []
    bodies = {m.value() for m in stored}
    assert bodies <= {b"fuzz-0", b"fuzz-1", b"fuzz-2"}
    log = Path(broker.data_dir).parent.joinpath("broker.log").read_text()
    assert "Traceback" not in log and "failed to handle" not in log
    topic = _name("after-fuzz")  # everyone else is served as before
    assert produce_all(producer(port), topic, [b"fine"]) == [0]


# -- share groups (KIP-932: queues for Kafka clients) ---------------------------------------
def _share_consumer(port: int, group: str) -> Any:
    from confluent_kafka import ShareConsumer

    return ShareConsumer(
        {
            "bootstrap.servers": f"127.0.0.1:{port}",
            "group.id": group,
            "share.acknowledgement.mode": "explicit",
            "log_level": 3,
        }
    )


def _share_poll(consumers: list[Any], want: int, timeout: float = 30, **how: Any) -> list[Any]:
    """Poll ``consumers`` in turn until ``want`` records came; each is acknowledged as ``how``
    says (``ack(consumer, message)`` returns the type, or None to leave it unacknowledged)."""
    from confluent_kafka import AcknowledgeType

    ack = how.get("ack", lambda _c, _m: AcknowledgeType.ACCEPT)
    got: list[Any] = []
    deadline = time.monotonic() + timeout
    while len(got) < want and time.monotonic() < deadline:
        for i, c in enumerate(consumers):
            polled = c.poll(0.2)
            if polled is None:
                continue
            for m in polled:
                if m.error() is not None:
                    continue
                got.append((i, m))
                kind = ack(c, m)
                if kind is not None:
                    c.acknowledge(m, kind)
            c.commit_sync(10)
    return got


def test_three_share_consumers_on_a_queue_each_record_to_one(
    broker: BrokerProcess, port: int
) -> None:
    q, group = _name("shared-jobs"), _name("workers")
    with Admin(broker.url) as admin:
        admin.create_queue(q)
    produce_all(producer(port), q, [f"job-{i}".encode() for i in range(60)])
    members = [_share_consumer(port, group) for _ in range(3)]
    for c in members:
        c.subscribe([q])
    try:
        got = _share_poll(members, 60)
    finally:
        for c in members:
            c.close()
    values = [m.value() for _, m in got]
    assert sorted(values) == sorted(f"job-{i}".encode() for i in range(60))  # each once
    assert {m.delivery_count() for _, m in got} == {1}
    with Admin(broker.url) as admin:
        stats = admin.stats(q)
    assert stats["acked"] == 60 and stats["depth"] == 0


def test_share_consumers_of_a_partitioned_queue_get_every_partition_each_record_once(
    broker: BrokerProcess, port: int
) -> None:
    """Every member of a share group is assigned every partition of a partitioned queue: each
    record goes to one member, from its partition, and ShareGroupDescribe says so."""
    from kio.schema.share_group_describe.v1.request import ShareGroupDescribeRequest

    q, group = _name("parted-jobs"), _name("parted-workers")
    with Admin(broker.url) as admin:
        admin.create_queue(q, partitions=3)
    p = producer(port)
    for i in range(60):
        p.produce(q, f"job-{i}".encode(), key=f"k{i % 12}".encode())
    assert p.flush(30) == 0
    members = [_share_consumer(port, group) for _ in range(2)]
    for c in members:
        c.subscribe([q])
    try:
        got = _share_poll(members, 60)
        described = kio_call(
            port, ShareGroupDescribeRequest(group_ids=(group,), include_authorized_operations=False)
        )
    finally:
        for c in members:
            c.close()
    values = [m.value() for _, m in got]
    assert sorted(values) == sorted(f"job-{i}".encode() for i in range(60))  # each once
    assert {m.partition() for _, m in got} == {0, 1, 2}
    by_key: dict[bytes, set[int]] = {}
    for _, m in got:  # (a key is placed in one partition)
        by_key.setdefault(m.key(), set()).add(m.partition())
    assert all(len(parts) == 1 for parts in by_key.values())
    (found,) = described.groups
    for m in found.members:
        (assigned,) = m.assignment.topic_partitions
        assert tuple(assigned.partitions) == (0, 1, 2)
    with Admin(broker.url) as admin:
        stats = admin.stats(q)
    assert stats["acked"] == 60 and stats["depth"] == 0


def test_share_groups_are_described_and_listed(broker: BrokerProcess, port: int) -> None:
    """ShareGroupDescribe and ListGroups v5 (what kafka-share-groups.sh and the Java admin
    client ask; no Python client asks them yet: kio's requests)."""
    from kio.schema.errors import ErrorCode
    from kio.schema.list_groups.v5.request import ListGroupsRequest
    from kio.schema.share_group_describe.v1.request import ShareGroupDescribeRequest

    q, group = _name("described-jobs"), _name("share-described")
    with Admin(broker.url) as admin:
        admin.create_queue(q)
    produce_all(producer(port), q, [b"job"])
    member = _share_consumer(port, group)
    member.subscribe([q])
    try:
        assert len(_share_poll([member], 1)) == 1  # (a member, with its assignment)
        described = kio_call(
            port,
            ShareGroupDescribeRequest(
                group_ids=(group, "no-such-group"), include_authorized_operations=False
            ),
        )
        found, missing = described.groups
        assert found.error_code == ErrorCode.none and found.group_state == "Stable"
        (m,) = found.members
        assert m.subscribed_topic_names == (q,)
        assert [t.topic_name for t in m.assignment.topic_partitions] == [q]
        assert missing.error_code == ErrorCode.group_id_not_found
        listed = kio_call(port, ListGroupsRequest(states_filter=(), types_filter=("share",)))
        kinds = {(g.group_id, g.group_type) for g in listed.groups}
        assert (group, "share") in kinds and {k for _, k in kinds} == {"share"}
    finally:
        member.close()


def test_release_redelivers_with_its_count_and_reject_dead_letters(
    broker: BrokerProcess, port: int
) -> None:
    from confluent_kafka import AcknowledgeType

    q, group = _name("release-reject"), _name("workers")
    with Admin(broker.url) as admin:
        admin.create_queue(q)
    produce_all(producer(port), q, [b"release-me", b"reject-me", b"keep-me"])
    seen: dict[bytes, list[int]] = {}

    def ack(_c: Any, m: Any) -> Any:
        seen.setdefault(m.value(), []).append(m.delivery_count())
        if m.value() == b"release-me" and m.delivery_count() == 1:
            return AcknowledgeType.RELEASE
        if m.value() == b"reject-me":
            return AcknowledgeType.REJECT
        return AcknowledgeType.ACCEPT

    c = _share_consumer(port, group)
    c.subscribe([q])
    try:
        _share_poll([c], 4, ack=ack)
    finally:
        c.close()
    assert seen[b"release-me"] == [1, 2]  # released, then delivered again, counted
    assert seen[b"reject-me"] == [1] and seen[b"keep-me"] == [1]
    with Admin(broker.url) as admin:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and admin.stats(q)["dead_lettered"] < 1:
            time.sleep(0.1)
        assert admin.stats(q)["dead_lettered"] == 1
        with Consumer(broker.url, f"DLQ.{q}") as dlq:
            (dead,) = dlq.receive_many(1, timeout=10)
            dlq.ack(dead)
    assert dead.body == b"reject-me"


def test_a_lapsed_acquisition_lock_is_redelivered_to_another_member(
    broker: BrokerProcess, port: int
) -> None:
    q, group = _name("lapsing"), _name("workers")
    with Admin(broker.url) as admin:
        admin.create_queue(q)
    produce_all(producer(port), q, [b"slow job"])
    holder, other = _share_consumer(port, group), _share_consumer(port, group)
    holder.subscribe([q])
    other.subscribe([q])
    try:
        (first,) = [m for _, m in _share_poll([holder], 1, ack=lambda _c, _m: None)]
        assert first.delivery_count() == 1
        took = time.monotonic()
        (again,) = [m for _, m in _share_poll([other], 1, timeout=30)]
        assert again.value() == b"slow job" and again.delivery_count() == 2
        assert time.monotonic() - took < 20  # (the lease: delivery.mark_interval_s)
    finally:
        holder.close()
        other.close()


def test_share_consumers_keep_each_key_in_order_with_one_member(
    broker: BrokerProcess, port: int
) -> None:
    q, group = _name("keyed-jobs"), _name("workers")
    with Admin(broker.url) as admin:
        admin.create_queue(q)
    p = producer(port)
    for i in range(30):
        produce_all(p, q, [f"{i % 3}:{i}".encode()], key=f"account-{i % 3}".encode())
    members = [_share_consumer(port, group) for _ in range(2)]
    for c in members:
        c.subscribe([q])
    try:
        got = _share_poll(members, 30)
    finally:
        for c in members:
            c.close()
    for key in range(3):
        mine = [
            (i, int(m.value().split(b":")[1]))
            for i, m in got
            if m.key() == f"account-{key}".encode()
        ]
        assert [n for _, n in mine] == sorted(n for _, n in mine)  # in order
        assert len({i for i, _ in mine}) == 1  # with one member


def _failed_into(failed: list[Any]) -> Any:
    return lambda err, _msg: failed.append(err) if err else None


@pytest.mark.parametrize("dedup", ["on", "off"])
def test_an_idempotent_producer_retrying_across_a_sigkill_stores_each_message_once(
    tmp_path: Path, dedup: str
) -> None:
    """With duplicate detection off too: a Kafka producer's sequences are still checked."""
    import threading

    kafka_port = free_port()  # (the restarted broker listens where the producer retries)
    data = tmp_path / "data"
    off = ["--set", "duplicates.cache_size=0"] if dedup == "off" else []

    def start(log: str) -> BrokerProcess:
        return BrokerProcess(
            str(data),
            extra_args=["--kafka-port", str(kafka_port), *off],
            log_file=str(tmp_path / log),
        ).start()

    first = start("broker1.out")
    p = producer(
        kafka_port,
        **{"enable.idempotence": True, "acks": "all", "message.timeout.ms": 60_000,
           "linger.ms": 5, "retry.backoff.ms": 100},
    )  # fmt: skip
    topic, total = _name("idempotent"), 3000
    failed: list[Any] = []
    sent = threading.Event()

    def produce() -> None:
        for i in range(total):
            while True:
                try:
                    p.produce(topic, f"m-{i}".encode(), on_delivery=_failed_into(failed))
                    break
                except BufferError:
                    p.poll(0.01)
            if i % 100 == 0:
                p.poll(0)
                time.sleep(0.01)
            if i == total // 2:
                sent.set()

    thread = threading.Thread(target=produce)
    thread.start()
    sent.wait(30)
    first.kill()  # acknowledgements in flight are lost; the producer retries
    second = start("broker2.out")
    try:
        thread.join(60)
        assert p.flush(60) == 0 and not failed, failed[:3]
        c = consumer(kafka_port)
        try:
            _, end = c.get_watermark_offsets(TopicPartition(topic, 0), timeout=10)
        finally:
            c.close()
        assert end == total, f"{end} stored for {total} produced: some twice"
        values = [m.value() for m in read_from(kafka_port, topic, 0, total)]
        assert sorted(values) == sorted(f"m-{i}".encode() for i in range(total))
    finally:
        second.stop()


def test_metrics_show_kafka_groups_members_and_lag(broker: BrokerProcess, port: int) -> None:
    from prometheus_client.parser import text_string_to_metric_families

    from tests.ops_kit import http

    topic, group = _name("lagging"), _name("group")
    produce_all(producer(port), topic, [b"x"] * 8)
    c = _group_consumer(port, group)
    c.subscribe([topic])
    try:
        read = 0
        deadline = time.monotonic() + 20
        while read < 5 and time.monotonic() < deadline:
            m = c.poll(0.2)
            if m is not None and m.error() is None:
                read += 1
                c.commit(m, asynchronous=False)
        status, _, body = http(f"{broker.http_url}/metrics")
        assert status == 200
        samples = {
            (s.name, tuple(sorted(s.labels.items()))): s.value
            for f in text_string_to_metric_families(body.decode())
            for s in f.samples
        }
        assert (
            samples[("sparkmq_kafka_group_members", (("group", group), ("kind", "consumer")))] == 1
        )
        assert (
            samples[("sparkmq_kafka_group_lag_messages", (("group", group), ("topic", topic)))] == 3
        )
        assert samples[("sparkmq_broker_connections", (("transport", "kafka"),))] >= 1
    finally:
        c.close()


def test_committed_offsets_and_messages_survive_a_failover_of_an_ha_pair(tmp_path: Path) -> None:
    from tests.conftest import wait_for
    from tests.ha_kit import in_sync, pair

    a, b = pair(tmp_path)
    a.launch().wait_ready(60)
    b.launch()
    wait_for(lambda: in_sync(a.url), timeout=60, what="the backup to be in sync")
    bootstrap = f"127.0.0.1:{a.kafka_port},127.0.0.1:{b.kafka_port}"
    topic, group = _name("failover"), _name("group")
    p = producer(a.kafka_port, **{"bootstrap.servers": bootstrap, "acks": "all"})
    produce_all(p, topic, [f"f{i}".encode() for i in range(20)])
    c = _group_consumer(a.kafka_port, group, **{"bootstrap.servers": bootstrap})
    c.subscribe([topic])
    read = 0
    deadline = time.monotonic() + 20
    while read < 12 and time.monotonic() < deadline:
        m = c.poll(0.2)
        if m is not None and m.error() is None:
            read += 1
            c.commit(m, asynchronous=False)  # (durable: replicated before it is answered)
    c.close()
    assert read == 12
    assert a.process is not None and b.process is not None
    a.process.kill()  # the primary is gone; the backup takes over with what it was sent
    b.process.wait_ready(60)
    again = _group_consumer(b.kafka_port, group, **{"bootstrap.servers": bootstrap})
    again.subscribe([topic])
    rest = []
    deadline = time.monotonic() + 60
    while len(rest) < 8 and time.monotonic() < deadline:
        m = again.poll(0.2)
        if m is not None and m.error() is None:
            rest.append(m.value())
    again.close()
    b.process.stop()
    assert rest == [f"f{i}".encode() for i in range(12, 20)]


def test_topics_named_by_their_ids_are_produced_to_and_fetched(port: int) -> None:
    """Produce 13 and Fetch 13+ name a topic by its id (KIP-516), the one Metadata gives; an id
    that stands for no topic gets UNKNOWN_TOPIC_ID. (Fetch 18 adds a replica's high watermark,
    KIP-1166: a tagged field, ignored here.) librdkafka fetches by id (Fetch 16) once it is
    served: every other test here that consumes with it does so."""
    from kio.schema.errors import ErrorCode

    from spark_mq.transports.kafka.link import topic_id

    topic = _name("by-id")
    produce_all(producer(port), topic, [b"first"])
    tid = topic_id(topic)
    answer = produce_by_id(port, 13, tid, [b"a", b"b"])
    (t,) = answer.responses
    (p,) = t.partition_responses
    assert (t.topic_id, p.error_code, p.base_offset) == (tid, ErrorCode.none, 1)
    for version in (13, 16, 17, 18):
        (t,) = fetch_by_id(port, version, tid, 1).responses
        (p,) = t.partitions
        assert (t.topic_id, p.error_code, p.high_watermark) == (tid, ErrorCode.none, 3)
        assert values_of(p.records) == [(1, b"a"), (2, b"b")]
    (t,) = fetch_by_id(port, 12, topic, 0).responses  # (by name, as before)
    assert [v for _, v in values_of(t.partitions[0].records)] == [b"first", b"a", b"b"]
    nothing = uuid.uuid4()
    unknown = ErrorCode.unknown_topic_id
    (t,) = produce_by_id(port, 13, nothing, [b"lost"]).responses
    assert (t.topic_id, t.partition_responses[0].error_code) == (nothing, unknown)
    (t,) = fetch_by_id(port, 17, nothing, 0).responses
    assert (t.topic_id, t.partitions[0].error_code) == (nothing, unknown)
    assert [m.value() for m in read_from(port, topic, 0, 3)] == [b"first", b"a", b"b"]


def test_an_idempotent_producer_s_sequences_must_come_in_order(port: int) -> None:
    """Sequences past the next expected are refused (OUT_OF_ORDER_SEQUENCE_NUMBER, as Kafka
    refuses them: a batch before was lost), and so is a first batch past 0 from a producer the
    log holds nothing of; a resent batch is stored once."""
    _sequences_are_checked(port)


def test_with_duplicate_detection_off_kafka_sequences_are_still_checked(
    tmp_path: Path,
) -> None:
    """An idempotent Kafka producer is promised its batches once, whatever the broker's
    duplicate detection: with it off (``duplicates.cache_size = 0``) a resent batch is still
    stored once, while the SDK's messages are no longer checked (two with one dedup id are
    both stored)."""
    import pyarrow as pa

    process = BrokerProcess(
        str(tmp_path / "data"),
        extra_args=["--set", "duplicates.cache_size=0"],
        log_file=str(tmp_path / "broker.out"),
    ).start()
    try:
        assert process.kafka_port
        _sequences_are_checked(process.kafka_port)
        queue = _name("sdk")
        with Admin(process.url) as admin:
            admin.create_queue(queue)
            with Producer(process.url, destination=queue) as p:
                p.send(b"one", dedup_id="same").result()
                p.send(b"two", dedup_id="same").result()
                batch = pa.table({"body": [b"three", b"four"], "dedup_id": ["same", "same"]})
                p.send_batch(batch)
            assert admin.stats(queue)["depth"] == 4
    finally:
        process.stop()


def _sequences_are_checked(port: int) -> None:
    topic = _name("sequenced")
    produce_all(producer(port), topic, [b"first"])  # (the topic exists)

    def send(raw: RawKafka, first_seq: int, values: list[bytes]) -> tuple[int, int]:
        return raw.produce_sequenced(topic, 4242, first_seq, values)

    raw = RawKafka(port)
    try:
        assert send(raw, 2280, [b"my-first-batch-was-lost"]) == (45, -1)
        assert send(raw, 0, [b"a", b"b", b"c"]) == (0, 1)
        err, _ = send(raw, 10, [b"lost-before-me"])
        assert err == 45  # OUT_OF_ORDER_SEQUENCE_NUMBER
        assert send(raw, 3, [b"d"]) == (0, 4)
        assert send(raw, 0, [b"a", b"b", b"c"]) == (0, 1)  # resent: the originals' offsets
    finally:
        raw.close()
    values = [m.value() for m in read_from(port, topic, 0, 5)]
    assert values == [b"first", b"a", b"b", b"c", b"d"]
    c = consumer(port)
    try:
        assert c.get_watermark_offsets(TopicPartition(topic, 0), timeout=10)[1] == 5
    finally:
        c.close()


def test_the_cli_and_the_console_api_show_kafka_groups_and_lag(
    broker: BrokerProcess, port: int
) -> None:
    import json
    import subprocess
    import sys

    from tests.ops_kit import http

    topic, group = _name("shown"), _name("group")
    produce_all(producer(port), topic, [b"x"] * 6)
    c = _group_consumer(port, group)
    c.subscribe([topic])
    try:
        read = 0
        deadline = time.monotonic() + 20
        while read < 2 and time.monotonic() < deadline:
            m = c.poll(0.2)
            if m is not None and m.error() is None:
                read += 1
                c.commit(m, asynchronous=False)
        done = subprocess.run(
            [sys.executable, "-m", "spark_mq", "kafka", "groups", "--json",
             "--bootstrap", f"127.0.0.1:{port}"],
            capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        (row,) = [r for r in json.loads(done.stdout) if r["group"] == group]
        assert row == {"group": group, "state": "Stable", "members": 1, "lag": {topic: 4}}
        status, _, body = http(f"{broker.http_url}/api/kafka/groups")
        assert status == 200
        (shown,) = [g for g in json.loads(body) if g["group"] == group]
        assert shown["kind"] == "consumer" and shown["member_count"] == 1
        assert shown["lag"] == {topic: 4}
    finally:
        c.close()
    unreachable = subprocess.run(
        [sys.executable, "-m", "spark_mq", "kafka", "groups", "--bootstrap", "127.0.0.1:1"],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert unreachable.returncode != 0 and "cannot reach the Kafka listener" in unreachable.stderr


def test_kafka_admin_describes_and_alters_configs_and_the_cluster(
    broker: BrokerProcess, port: int
) -> None:
    from confluent_kafka.admin import (
        AdminClient,
        AlterConfigOpType,
        ConfigEntry,
        ConfigResource,
        ResourceType,
    )

    admin = AdminClient({"bootstrap.servers": f"127.0.0.1:{port}"})
    q = _name("configured")
    with Admin(broker.url) as sdk:
        sdk.create_queue(q)
    resource = ConfigResource(ResourceType.TOPIC, q)
    (described,) = admin.describe_configs([resource]).values()
    configs = described.result(10)
    assert configs["sparkmq.kind"].value == "queue"
    assert configs["sparkmq.max_delivery_attempts"].value == "10"
    change = ConfigResource(
        ResourceType.TOPIC, q,
        incremental_configs=[ConfigEntry("sparkmq.max_delivery_attempts", "7",
                                         incremental_operation=AlterConfigOpType.SET)],
    )  # fmt: skip
    (altered,) = admin.incremental_alter_configs([change]).values()
    altered.result(10)
    with Admin(broker.url) as sdk:
        assert sdk.stats(q)["settings"]["max_delivery_attempts"] == 7
    bad = ConfigResource(
        ResourceType.TOPIC, q,
        incremental_configs=[ConfigEntry("sparkmq.kind", "topic",
                                         incremental_operation=AlterConfigOpType.SET)],
    )  # fmt: skip
    (refused,) = admin.incremental_alter_configs([bad]).values()
    with pytest.raises(Exception, match="kind does not change"):
        refused.result(10)
    cluster = admin.describe_cluster().result(10)
    assert cluster.cluster_id.startswith("sparkmq-") and len(cluster.nodes) == 1
    assert cluster.nodes[0].port == port
    # every topic listed (librdkafka 2.16's Metadata v12 carries bytes past its fields, which
    # Kafka's brokers leave, and so does this one)
    listed = admin.list_topics(timeout=10)
    assert q in listed.topics and "sparkmq.kafka-offsets" not in listed.topics
    assert [b.port for b in listed.brokers.values()] == [port]


def test_a_partitioned_topic_is_n_kafka_partitions_read_by_a_group(
    broker: BrokerProcess, port: int
) -> None:
    """A topic of four partitions: CreateTopics makes it, Metadata lists four partitions,
    librdkafka's producer places keys itself, a group of two shares the partitions (each one
    member's), and the SDK reads the same messages as one destination."""
    from confluent_kafka.admin import AdminClient, NewTopic

    topic, group = _name("parted"), _name("pgroup")
    admin = AdminClient({"bootstrap.servers": f"127.0.0.1:{port}"})
    admin.create_topics([NewTopic(topic, num_partitions=4)])[topic].result(10)
    refused = admin.create_topics([NewTopic(_name("toomany"), num_partitions=5000)])
    with pytest.raises(Exception, match="1 to 1024 partitions"):
        next(iter(refused.values())).result(10)
    listed = admin.list_topics(topic, timeout=10).topics[topic]
    assert sorted(listed.partitions) == [0, 1, 2, 3]
    p = producer(port)
    keys = [f"k{i}".encode() for i in range(12)]
    placed: dict[bytes, set[int]] = {}

    def delivered(err: Any, msg: Any) -> None:
        assert err is None, err
        placed.setdefault(msg.key(), set()).add(msg.partition())

    for i in range(240):
        p.produce(topic, f"{i}".encode(), key=keys[i % 12], on_delivery=delivered)
    # a partition named outright, and one that is not there
    p.produce(topic, b"direct", partition=3, on_delivery=delivered)
    assert p.flush(15) == 0
    assert all(len(parts) == 1 for parts in placed.values())  # a key keeps its partition
    assert len({next(iter(s)) for s in placed.values()}) > 1  # ... and keys are spread
    with Admin(broker.url) as sdk:
        stats = sdk.stats(topic)
    assert stats["produced"] == 241 and len(stats["partitions"]) == 4
    by_partition = {i: s["produced"] for i, s in enumerate(stats["partitions"])}
    members = [_group_consumer(port, group) for _ in range(2)]
    for c in members:
        c.subscribe([topic])
    got: dict[int, list[Any]] = {0: [], 1: []}
    try:
        deadline = time.monotonic() + 30
        while sum(len(g) for g in got.values()) < 241 and time.monotonic() < deadline:
            for i, c in enumerate(members):
                m = c.poll(0.05)
                if m is not None and m.error() is None:
                    got[i].append(m)
        assert sum(len(g) for g in got.values()) == 241
        for c in members:
            assert len(c.assignment()) == 2  # the range assignor's two each
        parts = [{m.partition() for m in g} for g in got.values()]
        assert not parts[0] & parts[1] and parts[0] | parts[1] == {0, 1, 2, 3}
        for i in range(4):  # each partition's offsets dense from 0, in order
            offsets = [m.offset() for g in got.values() for m in g if m.partition() == i]
            assert offsets == list(range(by_partition[i]))
        for key in keys:  # each key in order
            values = [int(m.value()) for g in got.values() for m in g if m.key() == key]
            assert values == sorted(values) and len(values) == 20
        for c in members:
            c.commit(asynchronous=False)
        committed = members[0].committed([TopicPartition(topic, i) for i in range(4)], timeout=10)
        assert [tp.offset for tp in committed] == [by_partition[i] for i in range(4)]
    finally:
        for c in members:
            c.close()
    with Consumer(broker.url, topic, subscription=None, durable=False) as sdk_reader:
        assert sdk_reader.partitions is not None and len(sdk_reader.partitions) == 4


def test_create_partitions_grows_a_topic_and_a_group_consumes_the_new_partitions(
    broker: BrokerProcess, port: int
) -> None:
    """CreatePartitions (Kafka's API 37) grows a partitioned topic: Metadata lists the new
    partitions, a group reading it takes them on at its next metadata refresh, and a count
    that adds none, or a topic without partitions, is refused as Kafka refuses them."""
    from confluent_kafka.admin import AdminClient, NewPartitions, NewTopic

    topic, single, group = _name("widened"), _name("single"), _name("wgroup")
    admin = AdminClient({"bootstrap.servers": f"127.0.0.1:{port}"})
    made = admin.create_topics([NewTopic(topic, num_partitions=2), NewTopic(single, 1)])
    for future in made.values():
        future.result(10)
    reader = _group_consumer(port, group, **{"topic.metadata.refresh.interval.ms": 300})
    reader.subscribe([topic])
    try:
        p = producer(port, **{"topic.metadata.refresh.interval.ms": 300})
        p.produce(topic, b"before", partition=1)
        assert p.flush(10) == 0
        got = _poll_until(reader, lambda ms: len(ms) == 1)
        assert [(m.partition(), m.value()) for m in got] == [(1, b"before")]
        reader.commit(asynchronous=False)  # (read again from there after the rebalance)
        admin.create_partitions([NewPartitions(topic, 4)])[topic].result(10)
        assert sorted(admin.list_topics(topic, timeout=10).topics[topic].partitions) == [0, 1, 2, 3]
        for count, refusal in ((4, "already has 4"), (3, "added, not taken away")):
            with pytest.raises(Exception, match=refusal):
                admin.create_partitions([NewPartitions(topic, count)])[topic].result(10)
        with pytest.raises(Exception, match="has no partitions"):
            admin.create_partitions([NewPartitions(single, 2)])[single].result(10)
        deadline = time.monotonic() + 10  # (the producer finds partition 3 once it refreshes)
        while True:
            try:
                p.produce(topic, b"after", partition=3)
                break
            except KafkaException as exc:
                assert exc.args[0].code() == KafkaError._UNKNOWN_PARTITION
                assert time.monotonic() < deadline, "the producer never saw partition 3"
                p.poll(0.1)
        assert p.flush(10) == 0
        later = _poll_until(reader, lambda ms: any(m.partition() == 3 for m in ms))
        assert [(m.partition(), m.value(), m.offset()) for m in later] == [(3, b"after", 0)]
        assert {tp.partition for tp in reader.assignment()} == {0, 1, 2, 3}
    finally:
        reader.close()
    with Admin(broker.url) as sdk:
        assert sdk.partitions(topic) == 4


def _poll_until(reader: Any, done: Callable[[list[Any]], bool], timeout: float = 30) -> list[Any]:
    got: list[Any] = []
    deadline = time.monotonic() + timeout
    while not done(got):
        assert time.monotonic() < deadline, f"only {got} within {timeout}s"
        m = reader.poll(0.1)
        if m is not None and m.error() is None:
            got.append(m)
    return got
