"""Kafka transactions (spark_mq.transports.kafka.transactions) with clients no one here wrote:
confluent-kafka (librdkafka), kafka-python and aiokafka, against real broker processes."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition

from spark_mq.launch import BrokerProcess
from tests.kafka_kit import consumer, produce_all, producer
from tests.ports import free_port

pytestmark = pytest.mark.process


def _broker(base: Path, kafka_port: int = 0) -> BrokerProcess:
    return BrokerProcess(
        str(base / "data"),
        extra_args=["--set", f"logging.file={base / 'broker.log'}"]
        + (["--kafka-port", str(kafka_port)] if kafka_port else []),
        log_file=str(base / "broker.out"),
    )


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    process = _broker(tmp_path_factory.mktemp("kafka-txn")).start()
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


def _transactional(port: int, tid: str, **settings: Any) -> Producer:
    p = producer(port, **{"transactional.id": tid, **settings})
    p.init_transactions(20)
    return p


def _reader(port: int, topic: str, **settings: Any) -> Consumer:
    c = consumer(port, **{"isolation.level": "read_committed", **settings})
    c.assign([TopicPartition(topic, 0, 0)])
    return c


def _poll(c: Consumer, want: int, timeout: float = 10.0) -> list[bytes]:
    """What ``c`` reads until it has ``want`` messages (or ``timeout`` passed)."""
    got: list[bytes] = []
    deadline = time.monotonic() + timeout
    while len(got) < want and time.monotonic() < deadline:
        m = c.poll(0.1)
        if m is not None and m.error() is None:
            got.append(m.value())
    return got


def _end(port: int, topic: str) -> int:
    c = consumer(port)
    try:
        return int(c.get_watermark_offsets(TopicPartition(topic, 0), timeout=10)[1])
    finally:
        c.close()


def _metrics(broker: BrokerProcess) -> dict[str, float]:
    from prometheus_client.parser import text_string_to_metric_families

    from tests.ops_kit import http

    status, _, body = http(f"{broker.http_url}/metrics")
    assert status == 200
    return {
        s.name: s.value
        for f in text_string_to_metric_families(body.decode())
        for s in f.samples
        if s.name.startswith("sparkmq_kafka_transaction")
    }


def _error(exc: pytest.ExceptionInfo[KafkaException]) -> KafkaError:
    err = exc.value.args[0]
    assert isinstance(err, KafkaError)
    return err


def test_a_transaction_s_records_are_seen_once_committed_and_an_aborted_one_s_never(
    port: int, broker: BrokerProcess
) -> None:
    """Nothing of an open transaction is in the log (a read_committed and a read_uncommitted
    reader see nothing, the end offset does not move; the metrics count it open); its commit
    shows every record at once; an abort's records never reach the log."""
    topic = _name("txn")
    p = _transactional(port, _name("tid"))
    committed_reader = _reader(port, topic)
    uncommitted_reader = _reader(port, topic, **{"isolation.level": "read_uncommitted"})
    try:
        p.begin_transaction()
        for i in range(10):
            p.produce(topic, f"a{i}".encode(), key=b"k")
        assert p.flush(10) == 0  # (answered: kept with the transaction)
        assert _poll(committed_reader, 1, 0.5) == []
        assert _poll(uncommitted_reader, 1, 0.5) == []
        assert _end(port, topic) == 0
        open_now = _metrics(broker)
        assert open_now["sparkmq_kafka_transactions_open"] >= 1
        assert open_now["sparkmq_kafka_transactions_kept_bytes"] > 0
        p.commit_transaction(20)
        assert _end(port, topic) == 10
        assert (
            _metrics(broker)["sparkmq_kafka_transactions_open"]
            == open_now["sparkmq_kafka_transactions_open"] - 1
        )
        want = [f"a{i}".encode() for i in range(10)]
        assert _poll(committed_reader, 10) == want
        assert _poll(uncommitted_reader, 10) == want

        p.begin_transaction()
        for i in range(5):
            p.produce(topic, f"gone{i}".encode())
        assert p.flush(10) == 0
        p.abort_transaction(20)
        p.begin_transaction()
        p.produce(topic, b"after")
        p.commit_transaction(20)
        assert _poll(committed_reader, 1) == [b"after"]
        assert _poll(uncommitted_reader, 1) == [b"after"]
        assert _end(port, topic) == 11  # (the aborted five never were in the log)
    finally:
        committed_reader.close()
        uncommitted_reader.close()


def test_consume_transform_produce_handles_each_input_once_with_its_offsets(port: int) -> None:
    """The exactly-once loop: a group consumer (read_committed) and a transactional producer
    whose transactions carry the consumer's offsets. One transaction fails and is aborted:
    its outputs never appear, its offsets are not committed, and the loop reads its inputs
    again from the group's committed offsets. In the end every input is in the output once,
    and the group's committed offset is the input's end."""
    source, sink, group = _name("in"), _name("out"), _name("g")
    produce_all(producer(port), source, [f"m{i}".encode() for i in range(60)])
    p = _transactional(port, _name("tid"))
    c = consumer(
        port,
        **{
            "group.id": group,
            "isolation.level": "read_committed",
            "auto.offset.reset": "earliest",
        },
    )
    c.subscribe([source])
    batches, failed_once = 0, False
    deadline = time.monotonic() + 60
    try:
        while time.monotonic() < deadline:
            msgs = [m for m in c.consume(10, 0.5) if m.error() is None]
            if not msgs:
                positions = c.committed([TopicPartition(source, 0)], 10)
                if positions[0].offset == 60:
                    break
                continue
            p.begin_transaction()
            for m in msgs:
                p.produce(sink, m.value().upper())
            p.send_offsets_to_transaction(
                c.position(c.assignment()), c.consumer_group_metadata(), 10
            )
            batches += 1
            if batches == 3 and not failed_once:  # the application fails this one
                failed_once = True
                p.abort_transaction(20)
                for tp in c.committed(c.assignment(), 10):  # (back to what is committed)
                    c.seek(tp)
                continue
            p.commit_transaction(20)
    finally:
        c.close()
    assert failed_once
    out = _reader(port, sink)
    try:
        got = _poll(out, 61, timeout=5)
    finally:
        out.close()
    assert got == [f"M{i}".encode() for i in range(60)]
    again = consumer(port, **{"group.id": group})
    try:
        assert again.committed([TopicPartition(source, 0)], 10)[0].offset == 60
    finally:
        again.close()


def test_a_newer_producer_fences_the_older_and_aborts_its_open_transaction(port: int) -> None:
    topic, tid = _name("fence"), _name("tid")
    zombie = _transactional(port, tid)
    zombie.begin_transaction()
    zombie.produce(topic, b"zombie")
    assert zombie.flush(10) == 0
    fresh = _transactional(port, tid)  # (the zombie's open transaction is aborted)
    fresh.begin_transaction()
    fresh.produce(topic, b"fresh")
    fresh.commit_transaction(20)
    with pytest.raises(KafkaException) as fenced:
        zombie.commit_transaction(20)
    err = _error(fenced)
    assert err.fatal() and err.code() == KafkaError._FENCED
    reader = _reader(port, topic)
    try:
        assert _poll(reader, 2, timeout=2) == [b"fresh"]
    finally:
        reader.close()
    assert _end(port, topic) == 1


def test_a_transaction_open_past_its_timeout_is_aborted_and_its_producer_fenced(
    port: int, broker: BrokerProcess
) -> None:
    topic = _name("late")
    p = _transactional(port, _name("tid"), **{"transaction.timeout.ms": 1000})
    p.begin_transaction()
    p.produce(topic, b"late")
    assert p.flush(10) == 0
    log = Path(broker.data_dir).parent / "broker.log"
    deadline = time.monotonic() + 10
    while "open for longer than its timeout" not in log.read_text():
        assert time.monotonic() < deadline, "the transaction was not aborted"
        time.sleep(0.1)
    assert _metrics(broker)["sparkmq_kafka_transactions_timed_out_total"] >= 1
    with pytest.raises(KafkaException) as fenced:
        p.commit_transaction(20)
    assert _error(fenced).code() == KafkaError._FENCED
    assert _end(port, topic) == 0


def test_a_killed_broker_s_open_transaction_is_gone_and_its_committed_ones_stay(
    tmp_path: Path,
) -> None:
    """SIGKILL with one transaction committed and the next open: after the restart the
    committed records are there, nothing of the open one is; its producer is told to abort
    (an abortable error, not a fatal one), and then commits a new transaction."""
    kafka_port = free_port()
    process = _broker(tmp_path, kafka_port).start()
    topic = _name("killed")
    try:
        p = _transactional(kafka_port, _name("tid"))
        p.begin_transaction()
        for i in range(3):
            p.produce(topic, f"kept{i}".encode())
        p.commit_transaction(20)
        p.begin_transaction()
        for i in range(3):
            p.produce(topic, f"open{i}".encode())
        assert p.flush(10) == 0
        process.kill()
        process = _broker(tmp_path, kafka_port).start()
        with pytest.raises(KafkaException) as refused:
            p.commit_transaction(30)
        err = _error(refused)
        assert err.txn_requires_abort() and not err.fatal(), err
        p.abort_transaction(30)
        p.begin_transaction()
        p.produce(topic, b"again")
        p.commit_transaction(30)
        reader = _reader(kafka_port, topic)
        try:
            got = _poll(reader, 5, timeout=5)
        finally:
            reader.close()
        assert got == [b"kept0", b"kept1", b"kept2", b"again"]
    finally:
        process.stop()


def test_kafka_python_and_aiokafka_transactions_commit_and_abort(port: int) -> None:
    from aiokafka import AIOKafkaProducer
    from kafka import KafkaProducer
    from kafka import TopicPartition as KTopicPartition
    from kafka.structs import OffsetAndMetadata

    topic, group = _name("py"), _name("g")
    p = KafkaProducer(bootstrap_servers=f"127.0.0.1:{port}", transactional_id=_name("kp"))
    try:
        p.init_transactions()
        p.begin_transaction()
        for i in range(3):
            p.send(topic, f"k{i}".encode())
        p.commit_transaction()
        p.begin_transaction()
        p.send(topic, b"gone")
        p.flush()
        p.abort_transaction()
        p.begin_transaction()
        p.send(topic, b"k3")
        p.send_offsets_to_transaction({KTopicPartition(topic, 0): OffsetAndMetadata(3, "", -1)},
                                      group)  # fmt: skip
        p.commit_transaction()
    finally:
        p.close()

    async def aio() -> None:
        ap = AIOKafkaProducer(bootstrap_servers=f"127.0.0.1:{port}", transactional_id=_name("ak"))
        await ap.start()
        try:
            async with ap.transaction():
                await ap.send_and_wait(topic, b"a0")
            with pytest.raises(RuntimeError):
                async with ap.transaction():
                    await ap.send_and_wait(topic, b"gone too")
                    raise RuntimeError("the application failed")
            async with ap.transaction():
                await ap.send_and_wait(topic, b"a1")
        finally:
            await ap.stop()

    asyncio.run(aio())
    reader = _reader(port, topic)
    try:
        assert _poll(reader, 7, timeout=5) == [b"k0", b"k1", b"k2", b"k3", b"a0", b"a1"]
    finally:
        reader.close()
    c = consumer(port, **{"group.id": group})
    try:
        assert c.committed([TopicPartition(topic, 0)], 10)[0].offset == 3
    finally:
        c.close()


def test_a_group_s_consumer_waits_for_offsets_an_open_transaction_commits(port: int) -> None:
    """KIP-447: a read_committed consumer joining a group whose offsets an open transaction
    commits is told they are unstable (it asks again) rather than starting from what was
    committed before; once the transaction commits it starts from the new offsets."""
    source, group = _name("in"), _name("g")
    produce_all(producer(port), source, [f"m{i}".encode() for i in range(10)])
    p = _transactional(port, _name("tid"))
    p.begin_transaction()
    p.produce(_name("out"), b"x")
    probe = consumer(port, **{"group.id": group})
    try:
        p.send_offsets_to_transaction(
            [TopicPartition(source, 0, 5)], probe.consumer_group_metadata(), 10
        )
    finally:
        probe.close()
    c = consumer(
        port,
        **{
            "group.id": group,
            "isolation.level": "read_committed",
            "auto.offset.reset": "earliest",
        },
    )
    try:
        c.subscribe([source])
        assert _poll(c, 1, timeout=2) == []  # (without KIP-447: m0, from the earliest)
        p.commit_transaction(20)
        assert _poll(c, 5) == [f"m{i}".encode() for i in range(5, 10)]
    finally:
        c.close()


def test_admin_tools_list_describe_and_abort_transactions(port: int) -> None:
    """kafka-python's KafkaAdminClient (KIP-664, as ``kafka-transactions.sh``): the listing
    with each filter, a description of an open transaction (its partitions, timeout, start),
    a partition's producers, and an abort, which fences the producer and leaves nothing."""
    from kafka import KafkaAdminClient
    from kafka import TopicPartition as KTopicPartition
    from kafka.admin._transactions import AbortTransactionSpec
    from kafka.errors import TransactionalIdNotFoundError, UnknownError

    topic, tag = _name("adm"), uuid.uuid4().hex[:8]
    open_id, idle_id, done_id = f"open-{tag}", f"idle-{tag}", f"done-{tag}"
    opened = _transactional(port, open_id, **{"transaction.timeout.ms": 60_000})
    _transactional(port, idle_id)  # (initialised, no transaction yet)
    done = _transactional(port, done_id)
    admin = KafkaAdminClient(bootstrap_servers=f"127.0.0.1:{port}")
    try:
        done.begin_transaction()
        done.produce(topic, b"d")
        done.commit_transaction(20)
        began = time.time()
        opened.begin_transaction()
        for i in range(3):
            opened.produce(topic, f"o{i}".encode())
        assert opened.flush(10) == 0

        def listed(**filters: Any) -> dict[str, tuple[int, str]]:
            (node,) = admin.list_transactions(**filters).values()
            return {t.transactional_id: (t.producer_id, t.state.value) for t in node
                    if t.transactional_id.endswith(tag)}  # fmt: skip

        every = listed()
        assert {tid: state for tid, (_, state) in every.items()} == {
            open_id: "Ongoing",
            idle_id: "Empty",
            done_id: "CompleteCommit",
        }
        assert set(listed(state_filters=["Ongoing"])) == {open_id}
        assert set(listed(producer_id_filters=[every[idle_id][0]])) == {idle_id}
        assert set(listed(duration_filter_ms=0)) == {open_id}
        assert set(listed(duration_filter_ms=3_600_000)) == set()
        assert set(listed(transactional_id_pattern=f"(idle|done)-{tag}")) == {idle_id, done_id}
        with pytest.raises(UnknownError, match="Error 128"):  # (INVALID_REGULAR_EXPRESSION)
            listed(transactional_id_pattern="(unclosed")
        # a pattern a backtracking matcher takes years over is answered at once (RE2)
        slow = _transactional(port, "a" * 40 + tag)
        t0 = time.monotonic()
        assert listed(transactional_id_pattern="(a+)+b" + tag) == {}
        assert time.monotonic() - t0 < 5
        slow.close()

        d = admin.describe_transactions([open_id])[open_id]
        assert d.state.value == "Ongoing" and d.producer_id == every[open_id][0]
        assert d.topic_partitions == {KTopicPartition(topic, 0)}
        assert d.transaction_timeout_ms == 60_000
        assert abs(d.transaction_start_time_ms / 1000 - began) < 5
        idle_d = admin.describe_transactions([idle_id])[idle_id]
        assert idle_d.transaction_start_time_ms == -1 and not idle_d.topic_partitions
        with pytest.raises(TransactionalIdNotFoundError):
            admin.describe_transactions([f"never-{tag}"])

        producers = admin.describe_producers([KTopicPartition(topic, 0)])
        (state,) = [
            p for p in producers[KTopicPartition(topic, 0)].active_producers
            if p.producer_id == d.producer_id
        ]  # fmt: skip
        assert (state.producer_epoch, state.last_sequence) == (d.producer_epoch, 2)

        admin.abort_transaction(
            AbortTransactionSpec(KTopicPartition(topic, 0), d.producer_id, d.producer_epoch)
        )
        after = admin.describe_transactions([open_id])[open_id]
        assert after.state.value == "CompleteAbort" and after.producer_epoch == d.producer_epoch + 1
        with pytest.raises(KafkaException) as fenced:
            opened.commit_transaction(20)
        assert _error(fenced).fatal(), _error(fenced)
        assert _end(port, topic) == 1  # (the committed "d" only)
    finally:
        admin.close()


def test_the_cli_lists_transactions_and_aborts_one(port: int) -> None:
    """``sparkmq kafka transactions`` shows an open transaction (its state, partitions and
    how long it has been open); ``sparkmq kafka abort-transaction`` aborts it, which fences
    its producer; a second abort says there is nothing open."""
    import json
    import subprocess
    import sys

    def sparkmq(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "spark_mq", "kafka", *args, "--bootstrap",
             f"127.0.0.1:{port}"],
            capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip

    topic, tid = _name("cli"), _name("cli-tid")
    p = _transactional(port, tid)
    p.begin_transaction()
    p.produce(topic, b"x")
    assert p.flush(10) == 0
    shown = sparkmq("transactions", "--json")
    assert shown.returncode == 0, shown.stderr
    (row,) = [r for r in json.loads(shown.stdout) if r["transactional_id"] == tid]
    assert row["state"] == "Ongoing" and row["partitions"] == [f"{topic}[0]"]
    assert 0 <= row["open_for_ms"] < 60_000
    aborted = sparkmq("abort-transaction", tid)
    assert aborted.returncode == 0, aborted.stderr
    assert f"aborted the open transaction of {tid}" in aborted.stdout
    with pytest.raises(KafkaException) as fenced:
        p.commit_transaction(20)
    assert _error(fenced).fatal()
    again = sparkmq("abort-transaction", tid)
    assert again.returncode == 1 and "has no open transaction (CompleteAbort)" in again.stderr
    assert _end(port, topic) == 0
