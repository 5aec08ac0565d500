"""The delivery semantics under repeated crashes: a real broker process SIGKILLed 20 times while
producers with dedup ids retry and consumers ack (and nack poison messages), then checked:

* no acknowledged message lost;
* no message delivered after its ack was confirmed;
* no duplicate among messages with dedup ids (each id is stored once);
* per-group order preserved (within a consumer's session, a group's messages come in order);
* every poison message that exhausted its attempts is in the DLQ exactly once.
"""

from __future__ import annotations

import os
import random
import threading
import time
from collections import Counter
from pathlib import Path

import pyarrow as pa
import pytest

from spark_mq import Admin, Consumer, Producer, SparkMQError
from spark_mq.broker.recovery import NOT_SETTLED, settled_by_subscription
from spark_mq.journal import DeltaStore
from spark_mq.launch import BrokerProcess
from spark_mq.schema import COMPACTED
from tests.conftest import wait_for

pytestmark = pytest.mark.process

KILLS = 20
GROUPS = 8
BATCH = 20
POISON_EVERY = 37  # every 37th message is poison: ungrouped, always nacked
ATTEMPTS = 3


class Ledger:
    """What the clients know for sure, across every broker incarnation."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.progress = threading.Condition(self.lock)  # notified as produces are confirmed
        self.produced: dict[str, int] = {}  # dedup id -> offset, confirmed
        self.acked: set[str] = set()  # dedup ids whose ack the broker confirmed
        self.violations: list[str] = []


class Source:
    """One producer's sequence: its own groups, so its send order is each group's order."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.next_seq = 0
        self.unconfirmed: pa.Table | None = None  # the batch whose outcome is unknown: resend

    def batch(self) -> pa.Table:
        if self.unconfirmed is not None:
            return self.unconfirmed
        seqs = range(self.next_seq, self.next_seq + BATCH)
        self.next_seq += BATCH
        poison = [s % POISON_EVERY == 0 for s in seqs]
        self.unconfirmed = pa.table(
            {
                "body": [(b"poison" if p else b"ok") for p in poison],
                "dedup_id": [f"{self.name}-{s}" for s in seqs],
                "group_id": [
                    None if p else f"{self.name}-g{s % GROUPS}"
                    for s, p in zip(seqs, poison, strict=True)
                ],
                "headers": pa.array(
                    [[("seq", str(s))] for s in seqs], pa.map_(pa.string(), pa.string())
                ),
            }
        )
        return self.unconfirmed


def produce(url: str, source: Source, ledger: Ledger, stop: threading.Event) -> None:
    try:
        with Producer(url, destination="q", linger_ms=0) as producer:
            while not stop.is_set():
                table = source.batch()
                offsets = producer.send_batch(table)
                with ledger.lock:
                    for dedup_id, offset in zip(
                        table["dedup_id"].to_pylist(), offsets, strict=True
                    ):
                        known = ledger.produced.setdefault(dedup_id, offset)
                        if known != offset:
                            ledger.violations.append(f"{dedup_id} stored twice: {known}, {offset}")
                    ledger.progress.notify_all()
                source.unconfirmed = None
    except SparkMQError:
        return  # the broker died: the batch in flight stays unconfirmed and is resent


def consume(url: str, ledger: Ledger, stop: threading.Event) -> None:
    last_seq: dict[str, int] = {}  # per group, in this session
    try:
        with Consumer(url, "q", prefetch=50) as consumer:
            while not stop.is_set():
                batch = consumer.receive_many(50, timeout=0.2)
                if not batch:
                    continue
                good = []
                for m in batch:
                    seq = int(m.headers["seq"])
                    with ledger.lock:
                        if m.dedup_id in ledger.acked:
                            ledger.violations.append(f"{m.dedup_id} delivered after its ack")
                    if m.group_id is not None:
                        if seq <= last_seq.get(m.group_id, -1):
                            ledger.violations.append(
                                f"group {m.group_id}: seq {seq} after {last_seq[m.group_id]}"
                            )
                        last_seq[m.group_id] = seq
                    if m.body != b"poison":
                        good.append(m)
                poison = [m for m in batch if m.body == b"poison"]
                if poison:
                    consumer.nack(poison)
                if good:
                    consumer.ack(good).result(timeout=10)
                    with ledger.lock:
                        ledger.acked.update(m.dedup_id for m in good)
    except SparkMQError:
        return


def start(data: str, log: Path) -> BrokerProcess:
    return BrokerProcess(data, log_file=str(log)).start()


def test_twenty_sigkills_lose_nothing_duplicate_nothing_reorder_nothing(tmp_path: Path) -> None:
    seed = int(os.environ.get("SPARKMQ_CRASH_SEED", time.time()))
    rng = random.Random(seed)
    data = str(tmp_path / "data")
    log = tmp_path / "broker.log"
    ledger = Ledger()
    sources = [Source("a"), Source("b")]
    started = time.monotonic()
    proc = start(data, log)
    with Admin(proc.url) as admin:
        admin.create_queue("q", max_delivery_attempts=ATTEMPTS)
    for _ in range(KILLS):
        stop = threading.Event()
        threads = [
            *(threading.Thread(target=produce, args=(proc.url, s, ledger, stop)) for s in sources),
            threading.Thread(target=consume, args=(proc.url, ledger, stop)),
        ]
        for t in threads:
            t.start()
        # kill after a random amount of confirmed work (not a fixed time): mid-load, always
        with ledger.progress:
            target = len(ledger.produced) + rng.randint(BATCH, 60 * BATCH)
            ledger.progress.wait_for(lambda t=target: len(ledger.produced) >= t, timeout=30)
        proc.kill()
        stop.set()
        for t in threads:
            t.join(30)
            assert not t.is_alive()
        proc = start(data, log)
    # drain what is left with a clean broker
    stop = threading.Event()
    drain = threading.Thread(target=consume, args=(proc.url, ledger, stop))
    drain.start()
    with Admin(proc.url) as admin:
        wait_for(lambda: admin.stats("q")["depth"] == 0, 60, "the queue to drain")
        assert admin.stats("q")["depth"] == 0
        dead_letters = admin.stats("DLQ.q")["depth"]  # every one of them, duplicates too
    stop.set()
    drain.join(30)
    assert not drain.is_alive(), "the draining consumer hung"
    with Consumer(proc.url, "DLQ.q", prefetch=1000) as dlq:
        dead = []
        while len(dead) < dead_letters:
            batch = dlq.receive_many(1000, timeout=10)
            assert batch, f"seed {seed}: {len(dead)} of {dead_letters} dead letters delivered"
            dead += batch
            dlq.ack(batch).result(timeout=10)
    assert proc.stop() == 0
    elapsed = time.monotonic() - started

    assert not ledger.violations, f"seed {seed}: {ledger.violations[:10]}"
    poison = {i for i in ledger.produced if int(i.split("-")[-1]) % POISON_EVERY == 0}
    good = set(ledger.produced) - poison
    assert len(good) > 200 and poison, f"seed {seed}: too little load to mean anything"
    # nothing acknowledged was lost: every good message was acked (an ack whose answer the
    # crash swallowed is in the settlement log though the consumer never heard of it)
    # (below its mark the owner may have collapsed the settlements into one row: every offset
    # there is settled; above it, each row says how)
    settles = DeltaStore(data).read_settlements("q")
    mine = settled_by_subscription(settles).get("")
    settled = set(range(mine.below)) | set(mine.offsets.tolist()) if mine else set()
    otherwise = {
        r["offset"]
        for r in settles.to_pylist()
        if r["subscription"] == "" and r["outcome"] not in ("ack", COMPACTED, *NOT_SETTLED)
    }
    acked_offsets = settled - otherwise
    confirmed = {ledger.produced[i] for i in ledger.acked if i in ledger.produced}
    assert confirmed <= acked_offsets, f"seed {seed}: a confirmed ack is not durable"
    lost = sorted(i for i in good if ledger.produced[i] not in acked_offsets)
    assert not lost, f"seed {seed}: {len(lost)} lost, e.g. {lost[:5]}"
    # each dedup id stored once in the log
    log_ids = DeltaStore(data).read_messages("q", 0, None)["dedup_id"].to_pylist()
    assert len(log_ids) >= len(ledger.produced)
    twice = [i for i, n in Counter(log_ids).items() if n > 1]
    assert not twice, f"seed {seed}: stored twice: {twice[:10]}"
    # every poison message is in the DLQ exactly once
    dead_offsets = Counter(m.headers["sparkmq.original_offset"] for m in dead)
    assert all(n == 1 for n in dead_offsets.values()), f"seed {seed}: {dead_offsets}"
    # (the log may hold poison whose produce answer a crash swallowed: it is dead-lettered too)
    messages = DeltaStore(data).read_messages("q", 0, None)
    in_log = {
        str(o)
        for o, body in zip(
            messages["offset"].to_pylist(), messages["body"].to_pylist(), strict=True
        )
        if body == b"poison"
    }
    assert {str(ledger.produced[i]) for i in poison} <= in_log
    assert set(dead_offsets) == in_log, f"seed {seed}: {set(dead_offsets) ^ in_log}"
    print(f"{KILLS} kills in {elapsed:.0f}s: {len(ledger.produced)} messages, seed {seed}")
