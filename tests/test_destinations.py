"""Auto-created queues (and their auto-deletion) and temporary queues."""

from __future__ import annotations

from pathlib import Path

import pytest

from spark_mq import Admin, Consumer, DestinationNotFound, NotAllowed, Producer
from spark_mq.clock import ManualClock
from spark_mq.service import RunningBroker
from tests.conftest import Restartable, receive_n, test_config


def names(url: str) -> set[str]:
    with Admin(url) as admin:
        return {d["name"] for d in admin.list_destinations()}


def test_first_use_creates_a_queue_that_goes_when_unused_and_empty(
    restartable: Restartable, clock: ManualClock
) -> None:
    broker = restartable
    with Producer(broker.url) as producer:
        producer.send_batch([b"a", b"b"], destination="drained")
        producer.send_batch([b"c"], destination="kept")
    with Consumer(broker.url, "fresh"):  # a consumer may create one too
        assert {"drained", "kept", "fresh"} <= names(broker.url)
    with Consumer(broker.url, "drained") as consumer:
        consumer.ack(receive_n(consumer, 2)).result(timeout=5)
        clock.advance(60)
        broker.broker.run_timers()
        assert "drained" in names(broker.url)  # a consumer is attached
    clock.advance(4)
    broker.broker.run_timers()
    assert "drained" in names(broker.url)  # idle for less than auto_delete_delay_s
    clock.advance(1)
    broker.broker.run_timers()
    assert names(broker.url) == {"kept"}  # holds a message: stays
    broker.restart()  # after a restart only "kept" comes back
    assert names(broker.url) == {"kept"}
    with Admin(broker.url) as admin:
        assert admin.stats("kept")["depth"] == 1


def test_explicitly_created_queues_are_not_auto_deleted(
    broker: RunningBroker, clock: ManualClock
) -> None:
    with Admin(broker.url) as admin:
        admin.create_queue("mine")
    clock.advance(3600)
    broker.broker.run_timers()
    assert "mine" in names(broker.url)


def test_temporary_queue_lives_with_its_consumer_and_never_touches_disk(
    broker: RunningBroker, tmp_path: Path
) -> None:
    with Consumer(broker.url, temporary=True) as replies:
        name = replies.destination
        assert name.startswith("tmp.")
        with Producer(broker.url) as producer:
            producer.send_sync("reply", destination=name)
        (msg,) = receive_n(replies, 1)
        assert msg.text == "reply" and msg.destination == name
        msg.ack().result(timeout=5)
        with Admin(broker.url) as admin:
            with pytest.raises(NotAllowed, match="temporary"):
                admin.delete_destination(name)
            with pytest.raises(NotAllowed):
                admin.purge(name)
        assert not list((tmp_path / "data").rglob(f"*{name}*"))
    assert name not in names(broker.url)
    with Admin(broker.url) as admin, pytest.raises(DestinationNotFound):
        admin.stats(name)


def test_auto_deletion_never_takes_an_acknowledged_message(tmp_path: Path) -> None:
    """Producers racing the auto-deleting timer (no delay, checked every millisecond): a send
    that got in between the emptiness check and the deletion was acknowledged, then deleted
    with the queue (181 acknowledged, 177 gone); every acknowledged message must be there."""
    import threading

    from spark_mq import SparkMQError
    from spark_mq.broker import Broker

    settings = {"broker.auto_delete_delay_s": 0, "delivery.lease_check_interval_ms": 1}
    running = RunningBroker(Broker(test_config(tmp_path / "data", **settings)), "127.0.0.1", 0)
    acked: dict[str, list[str]] = {}
    lock = threading.Lock()

    def produce(k: int) -> None:
        with Producer(running.url) as producer:
            for i in range(40):
                name = f"t{k}-q{i % 4}"
                try:
                    producer.send_sync(f"{k}-{i}", destination=name)
                except SparkMQError:
                    continue  # refused (never acknowledged): allowed
                with lock:
                    acked.setdefault(name, []).append(f"{k}-{i}")

    try:
        threads = [threading.Thread(target=produce, args=(k,)) for k in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=120)
        assert sum(map(len, acked.values())) >= 100
        running.broker._stop.set()  # no more auto-deletion while the test reads
        for name, bodies in acked.items():
            with Consumer(running.url, name, prefetch=1000) as consumer:
                got = receive_n(consumer, len(bodies))
                assert sorted(m.text for m in got) == sorted(bodies), name
    finally:
        running.stop()


def test_a_destination_deleted_while_they_are_listed_is_left_out_not_an_error(
    broker: RunningBroker, monkeypatch: pytest.MonkeyPatch
) -> None:
    """(``/metrics`` and the console list every destination: a delete between the names and
    one's figures answered the whole scrape 404.)"""
    with Admin(broker.url) as admin:
        admin.create_queue("stays")
        admin.create_queue("goes")
    core = broker.broker
    stats = core.admin.stats

    def deleted_meanwhile(name: str) -> dict[str, object]:
        if name == "goes":
            core.delete_destination("goes")
        return stats(name)

    monkeypatch.setattr(core.admin, "stats", deleted_meanwhile)
    with Admin(broker.url) as admin:
        assert {d["name"] for d in admin.list_destinations()} == {"stays"}
    assert names(broker.url) == {"stays"}
