"""Crash recovery with a real broker process killed by SIGKILL, and graceful SIGTERM."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from spark_mq import Admin, Consumer, Producer, SparkMQError
from spark_mq.journal import DeltaStore
from spark_mq.launch import BrokerProcess

pytestmark = pytest.mark.process


MODES = {
    "hot-tier": [],
    # the mover runs all the time, so the kill lands in the middle of moves too
    "hot-tier-busy-mover": ["--set", "journal.move_interval_ms=5"],
    "delta-only": ["--set", "journal.hot_tier=false"],
}


@pytest.mark.parametrize("mode", list(MODES))
def test_sigkill_mid_load_loses_no_acknowledged_message(tmp_path: Path, mode: str) -> None:
    data = str(tmp_path / "data")
    args = MODES[mode]
    proc = BrokerProcess(data, extra_args=args, log_file=str(tmp_path / "broker1.log")).start()
    with Admin(proc.url) as admin:
        admin.create_queue("q")

    produced: dict[int, bytes] = {}  # offset -> body, for every send the broker confirmed
    confirmed_acks: set[int] = set()  # offsets whose ack the broker confirmed
    sent_acks: set[int] = set()  # acks sent; unconfirmed ones have an unknown outcome
    stop = threading.Event()
    enough = threading.Event()  # set once the load has produced and acked enough to crash
    errors: list[BaseException] = []

    def check_enough() -> None:
        if len(produced) >= 300 and len(confirmed_acks) >= 100:
            enough.set()

    def produce(worker: int) -> None:
        try:
            with Producer(proc.url, destination="q", linger_ms=1) as p:
                i = 0
                while not stop.is_set():
                    body = b"w%d-%d" % (worker, i)
                    try:
                        produced[p.send_sync(body)] = body
                        check_enough()
                    except SparkMQError:
                        return  # the broker died: this send's outcome is unknown
                    i += 1
        except SparkMQError:
            return
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    def consume() -> None:
        try:
            # a prefetch large enough that the unacked half never fills the window
            with Consumer(proc.url, "q", prefetch=100_000) as c:
                while not stop.is_set():
                    batch = c.receive_many(200, timeout=0.5)
                    if not batch:
                        continue
                    # ack half; the other half stays unsettled
                    to_ack = [m for m in batch if m.offset % 2 == 0]
                    sent_acks.update(m.offset for m in to_ack)
                    try:
                        c.ack(to_ack).result(timeout=10)
                    except SparkMQError:
                        return
                    confirmed_acks.update(m.offset for m in to_ack)
                    check_enough()
        except SparkMQError:
            return
        except BaseException as exc:  # pragma: no cover
            errors.append(exc)

    threads = [threading.Thread(target=produce, args=(w,)) for w in range(3)]
    threads.append(threading.Thread(target=consume))
    for t in threads:
        t.start()
    assert enough.wait(60), "the load never reached the point where the broker is killed"
    proc.kill()  # SIGKILL mid-load
    stop.set()
    for t in threads:
        t.join(30)
        assert not t.is_alive(), "a load thread hung after the kill"
    assert not errors, errors
    assert len(produced) >= 300 and len(confirmed_acks) >= 100

    restarted = BrokerProcess(data, extra_args=args, log_file=str(tmp_path / "broker2.log"))
    restarted.start()
    try:
        with Admin(restarted.url) as admin:
            waiting = admin.stats("q")["depth"]
        with Consumer(restarted.url, "q", prefetch=1000) as c:
            seen: dict[int, bytes] = {}
            while len(seen) < waiting:
                batch = c.receive_many(1000, timeout=10)
                assert batch, f"{len(seen)} of {waiting} waiting messages delivered"
                for m in batch:
                    assert m.offset not in seen, f"offset {m.offset} delivered twice"
                    seen[m.offset] = m.body
                c.ack(batch).result(timeout=10)
        # settled messages are never delivered again
        assert not confirmed_acks & set(seen)
        # every acknowledged produce is either settled or delivered now, body intact
        for offset, body in produced.items():
            if offset in sent_acks and offset not in confirmed_acks:
                assert offset not in seen or seen[offset] == body  # either outcome is right
            elif offset not in confirmed_acks:
                assert seen.get(offset) == body, f"acknowledged message at offset {offset} lost"
        with Admin(restarted.url) as admin:
            assert admin.stats("q")["depth"] == 0
            end = admin.stats("q")["end_offset"]
    finally:
        assert restarted.stop() == 0
    if mode == "hot-tier":  # the restart really recovered records from the segments
        assert "not yet in Delta" in (tmp_path / "broker2.log").read_text()
    # after the clean stop Delta holds the whole log, each offset once
    assert sorted(DeltaStore(data).read_messages("q", 0, None)["offset"].to_pylist()) == list(
        range(end)
    )


def test_sigterm_flushes_and_restart_keeps_everything(tmp_path: Path) -> None:
    data = str(tmp_path / "data")
    proc = BrokerProcess(data).start()
    with Admin(proc.url) as admin:
        admin.create_queue("q")
        admin.create_topic("t")
        admin.create_subscription("t", "s")
    with Producer(proc.url) as p:
        p.send_batch([b"a", b"b", b"c"], destination="q")
        p.send_batch([b"x", b"y"], destination="t")
    with Consumer(proc.url, "q") as c:
        first = c.receive(timeout=5)
        assert first is not None
        first.ack().result(timeout=5)
    assert proc.stop() == 0  # SIGTERM: a clean exit
    assert (Path(data) / "logs" / "log.txt").read_text().count("broker stopped") == 1

    again = BrokerProcess(data).start()
    try:
        with Admin(again.url) as admin:
            names = {d["name"]: d for d in admin.list_destinations()}
            assert set(names) == {"q", "t"}
            assert names["q"]["depth"] == 2
        with Consumer(again.url, "q") as c:
            assert [m.body for m in c.receive_many(10, timeout=5)] == [b"b", b"c"]
        with Consumer(again.url, "t", subscription="s") as c:
            assert [m.body for m in c.receive_many(10, timeout=5)] == [b"x", b"y"]
    finally:
        again.stop()


def test_invalid_setting_stops_startup_naming_it(tmp_path: Path) -> None:
    proc = BrokerProcess(
        str(tmp_path),
        extra_args=["--set", "delivery.mark_interval_s=-1"],
        log_file=str(tmp_path / "out.log"),
    )
    with pytest.raises(SparkMQError, match="exited with code 2"):
        proc.start()
    assert "delivery.mark_interval_s" in (tmp_path / "out.log").read_text()
