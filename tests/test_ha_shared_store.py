"""A shared-store pair of real broker processes: the backup takes over when the primary is
SIGKILLed, again and again with the old primary back as the backup each time, while producers
that list both URLs keep sending; nothing acknowledged is lost and nothing is stored twice."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from spark_mq import Admin, Consumer, Message, Producer
from spark_mq.errors import SparkMQError
from spark_mq.ha.ownership import Ownership
from spark_mq.journal.delta_store import DeltaStore
from spark_mq.launch import BrokerProcess
from tests.conftest import wait_for
from tests.ports import free_port

pytestmark = pytest.mark.process


class Member:
    """One broker of the pair: its own ports and log, the shared data directory."""

    def __init__(self, name: str, data: Path, logs: Path) -> None:
        self.name, self.data, self.logs = name, data, logs
        self.port, self.wire_port = free_port(), free_port()
        self.url = f"grpc://127.0.0.1:{self.port}"
        self.process: BrokerProcess | None = None

    def launch(self) -> BrokerProcess:
        args = [
            "--port", str(self.port), "--wire-port", str(self.wire_port), "--stomp-port", "0",
            "--kafka-port", "0",
            "--set", "ha.mode=shared-store",
            "--set", f"ha.broker_id={self.name}",
            "--set", "ha.lock_poll_s=0.1",
            "--set", f"logging.file={self.logs / f'{self.name}.log'}",
        ]  # fmt: skip
        self.process = BrokerProcess(
            str(self.data), extra_args=args, log_file=str(self.logs / f"{self.name}.out")
        ).launch()
        return self.process


def test_the_backup_takes_over_each_time_the_primary_is_killed(tmp_path: Path) -> None:
    data, logs = tmp_path / "shared", tmp_path / "logs"
    logs.mkdir()
    a, b = Member("a", data, logs), Member("b", data, logs)
    urls = [a.url, b.url]
    a.launch().wait_ready(60)
    b.launch()
    with Admin(urls) as admin:
        admin.create_queue("orders")
    acked: dict[str, str] = {}  # dedup id -> body, once the broker said it is durable
    failures: list[BaseException] = []
    stop = threading.Event()

    def produce(k: int) -> None:
        try:
            with Producer(urls, destination="orders", timeout_s=60) as p:
                i = 0
                while not stop.is_set():
                    dedup, body = f"p{k}-{i}", f"message {k}/{i}"
                    p.send_sync(body, dedup_id=dedup, group_id=f"g{i % 3}")
                    acked[dedup] = body
                    i += 1
        except BaseException as exc:  # the test fails on it below
            failures.append(exc)

    first_seen: dict[int, str] = {}  # offset -> body, at its first delivery
    order: list[tuple[str, str, int]] = []  # (producer, group, i) in first-delivery order
    consuming = threading.Event()

    def consume() -> None:  # one consumer through every failover: it attaches again
        try:
            with Consumer(urls, "orders", prefetch=200, timeout_s=60) as consumer:
                while not consuming.is_set() or len(first_seen) < len(acked):
                    for m in consumer.receive_many(200, timeout=0.5):
                        if m.offset not in first_seen:
                            first_seen[m.offset] = m.text
                            k, i = m.text.split(" ")[1].split("/")
                            order.append((k, m.group_id or "", int(i)))
                        consumer.ack(m)  # (an ack the old broker took with it is refused)
        except BaseException as exc:
            failures.append(exc)

    def produce_async(k: int) -> None:  # futures, batched: what meets a failover is resent
        try:
            with Producer(urls, destination="orders", timeout_s=60) as p:
                i = 0
                while not stop.is_set():
                    sent = []
                    for _ in range(50):
                        dedup, body = f"p{k}-{i}", f"message {k}/{i}"
                        sent.append(
                            (dedup, body, p.send(body, dedup_id=dedup, group_id=f"g{i % 3}"))
                        )
                        i += 1
                    for dedup, body, fut in sent:
                        fut.result(90)
                        acked[dedup] = body
        except BaseException as exc:
            failures.append(exc)

    producers = [threading.Thread(target=produce, args=(k,)) for k in range(2)]
    producers.append(threading.Thread(target=produce_async, args=(2,)))
    for t in producers:
        t.start()
    consumer_thread = threading.Thread(target=consume)
    consumer_thread.start()
    primary, backup = a, b
    epochs = [1]
    try:
        for _ in range(6):
            time.sleep(0.8)  # load on the primary
            before = len(acked)
            assert primary.process is not None and backup.process is not None
            primary.process.kill()  # SIGKILL: no flush, no goodbye
            backup.process.wait_ready(60)
            primary.launch()  # back, as the backup
            primary, backup = backup, primary
            epochs.append(Ownership(str(data)).epoch())
            wait_for(lambda b=before: len(acked) > b + 10, timeout=60, what="sends to go on")
            assert not failures, failures
    finally:
        stop.set()
        for t in producers:
            t.join(90)
        consuming.set()  # (now it drains what is left, then ends)
        consumer_thread.join(120)
    assert not failures, failures
    assert not consumer_thread.is_alive()
    assert epochs == sorted(set(epochs)) and len(epochs) == 7  # a new epoch each takeover
    with Admin(urls) as admin:
        assert admin.broker_state()["epoch"] == epochs[-1]
        end = admin.stats("orders")["end_offset"]
    assert end == len(acked)  # every acknowledged message once: resends were duplicates
    assert sorted(first_seen.values()) == sorted(acked.values())
    by_group: dict[tuple[str, str], list[int]] = {}
    for k, g, i in order:
        by_group.setdefault((k, g), []).append(i)
    for seq in by_group.values():  # per producer and group, in the order they were sent
        assert seq == sorted(seq)
    for m in (a, b):
        if m.process is not None:
            m.process.stop()
    dedups = DeltaStore(str(data)).read_messages("orders", 0, None)["dedup_id"].to_pylist()
    assert len(dedups) == len(set(dedups)) == len(acked)


def test_promote_hands_over_to_the_backup_without_losing_anything(tmp_path: Path) -> None:
    data, logs = tmp_path / "shared", tmp_path / "logs"
    logs.mkdir()
    a, b = Member("a", data, logs), Member("b", data, logs)
    urls = [a.url, b.url]
    a.launch().wait_ready(60)
    b.launch()
    heard: list[str] = []

    def on_message(m: Message) -> None:  # a listener: its reader thread attaches again
        heard.append(m.text)
        m.ack()

    try:
        listener = Consumer(urls, "q", on_message=on_message, timeout_s=60)
        with Producer(urls, destination="q") as p:
            for i in range(20):
                p.send_sync(f"before {i}")
            with Admin(a.url) as admin:
                answer = admin.promote()
                assert answer["handing_over"] and answer["epoch"] == 1
            assert b.process is not None
            b.process.wait_ready(60)
            for i in range(20):
                p.send_sync(f"after {i}")  # follows to b
        with Admin(urls) as admin:
            state = admin.broker_state()
            assert (state["broker_id"], state["epoch"]) == ("b", 2)
            assert admin.stats("q")["end_offset"] == 40
        expected = {f"before {i}" for i in range(20)} | {f"after {i}" for i in range(20)}
        wait_for(lambda: set(heard) >= expected, timeout=60, what="the listener to hear all")
        listener.close()
        # a stepped down and waits as the backup: it takes over again when b goes
        assert a.process is not None and a.process.proc is not None
        assert a.process.proc.poll() is None
        b.process.kill()
        wait_for(lambda: _answers(a.url), timeout=60, what="a to take over again")
        with Admin(a.url) as admin:
            assert admin.broker_state()["epoch"] == 3
            assert admin.stats("q")["end_offset"] == 40
    finally:
        for m in (a, b):
            if m.process is not None:
                m.process.stop()


def _answers(url: str) -> bool:
    try:
        with Admin(url, timeout_s=2) as admin:
            return admin.ping()
    except SparkMQError:
        return False


@pytest.mark.spark
def test_the_spark_sink_and_broker_source_take_the_pair(spark, tmp_path: Path) -> None:
    """The connector's url option lists both brokers, as the SDK's: with the first one down
    (a backup waiting, or a dead primary), the sink writes to and the broker-consuming source
    claims from whichever serves."""
    import tempfile

    data, logs = tmp_path / "shared", tmp_path / "logs"
    logs.mkdir()
    a, b = Member("a", data, logs), Member("b", data, logs)
    a.launch().wait_ready(60)
    b.launch()
    assert a.process is not None and b.process is not None
    a.process.kill()  # the first URL listed is gone: b takes over
    b.process.wait_ready(60)
    both = f"{a.url},{b.url}"
    try:
        df = spark.createDataFrame([(f"row {i}",) for i in range(30)], "body string")
        df.write.format("sparkmq").option("url", both).option("destination", "q").mode(
            "append"
        ).save()
        with Admin(b.url) as admin:
            assert admin.stats("q")["end_offset"] == 30
        seen: list[str] = []
        query = (
            spark.readStream.format("sparkmq")
            .option("url", both)
            .option("consumer", "etl")
            .option("destination", "q")
            .load()
            .writeStream.foreachBatch(
                lambda batch, _: seen.extend(r.body.decode() for r in batch.collect())
            )
            .option("checkpointLocation", tempfile.mkdtemp())
            .trigger(availableNow=True)
            .start()
        )
        query.awaitTermination(120)
        assert sorted(seen) == sorted(f"row {i}" for i in range(30))
    finally:
        b.process.stop()
