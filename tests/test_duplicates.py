"""Duplicate detection through the SDK: resends are acknowledged with the original's offset."""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from spark_mq import Admin, Consumer, Producer
from spark_mq.clock import ManualClock
from spark_mq.launch import BrokerProcess
from spark_mq.service import RunningBroker
from tests.conftest import receive_n, start_inprocess


def bodies_in(running: RunningBroker, name: str, n: int) -> list[tuple[int, bytes]]:
    with Consumer(running.url, name, prefetch=1000) as c:
        got = receive_n(c, n)
        assert c.receive(timeout=0.2) is None  # and nothing more
    return sorted((m.offset, m.body) for m in got)


def test_resends_are_acked_with_the_original_offset_and_not_stored(
    broker: RunningBroker,
) -> None:
    with Admin(broker.url) as admin:
        admin.create_queue("pay")
    with Producer(broker.url, destination="pay") as p:
        assert p.send_sync(b"first", dedup_id="x1") == 0
        assert p.send_sync(b"resent", dedup_id="x1") == 0
        batch = pa.table(
            {
                "body": [b"again", b"new", b"new twice", b"no id"],
                "dedup_id": ["x1", "x2", "x2", None],
            }
        )
        assert p.send_batch(batch) == [0, 1, 1, 2]
        assert p.send_batch([b"generated ids are unique"]) == [3]
    with Admin(broker.url) as admin:
        stats = admin.stats("pay")
    assert (stats["end_offset"], stats["duplicates"]) == (4, 3)
    assert bodies_in(broker, "pay", 4) == [
        (0, b"first"),
        (1, b"new"),
        (2, b"no id"),
        (3, b"generated ids are unique"),
    ]


def test_racing_resends_store_each_id_once(broker: RunningBroker) -> None:
    with Admin(broker.url) as admin:
        admin.create_queue("race")
    results: list[list[int]] = []

    def send() -> None:
        with Producer(broker.url, destination="race", linger_ms=0) as p:
            futures = [p.send(b"m%d" % i, dedup_id=f"id-{i}") for i in range(200)]
            p.flush()
            results.append([f.result() for f in futures])

    threads = [threading.Thread(target=send) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
        assert not t.is_alive(), "a producer hung"
    assert len(results) == 3 and results[0] == results[1] == results[2]  # same answer for all
    assert sorted(results[0]) == list(range(200))
    with Admin(broker.url) as admin:
        assert admin.stats("race")["end_offset"] == 200
        assert admin.stats("race")["duplicates"] == 400


def test_window_is_bounded_by_count_and_by_time(tmp_path: Path, clock: ManualClock) -> None:
    running = start_inprocess(
        tmp_path / "data", clock, **{"duplicates.cache_size": 3, "duplicates.window_s": 60}
    )
    try:
        with Admin(running.url) as admin:
            admin.create_queue("q")
        with Producer(running.url, destination="q") as p:
            assert [p.send_sync(b"", dedup_id=f"d{i}") for i in range(4)] == [0, 1, 2, 3]
            assert p.send_sync(b"", dedup_id="d3") == 3  # still remembered
            assert p.send_sync(b"", dedup_id="d0") == 4  # pushed out by the newer three
            clock.advance(61)
            assert p.send_sync(b"", dedup_id="d3") == 5  # older than the window
            assert p.send_sync(b"", dedup_id="d3") == 5
    finally:
        running.stop()


def test_with_detection_off_only_kafka_producers_ids_are_checked_across_a_restart(
    tmp_path: Path, clock: ManualClock
) -> None:
    """``duplicates.cache_size = 0`` turns duplicate detection off for every id but an
    idempotent Kafka producer's (``kafka-<id>-<epoch>-<sequence>``: Kafka promises those once),
    and a restart reads back only those."""
    data, off = tmp_path / "data", {"duplicates.cache_size": 0}
    kafka = pa.table({"body": [b"k0", b"k1"], "dedup_id": ["kafka-7-0-0", "kafka-7-0-1"]})
    sdk = pa.table({"body": [b"s0", b"s1"], "dedup_id": ["s-0", "s-1"]})
    running = start_inprocess(data, clock, **off)
    try:
        with Admin(running.url) as admin:
            admin.create_queue("q")
        with Producer(running.url, destination="q") as p:
            assert p.send_batch(kafka) == [0, 1]
            assert p.send_batch(sdk) == [2, 3]
            assert p.send_batch(kafka) == [0, 1]  # sent again: stored once
            assert p.send_batch(sdk) == [4, 5]  # not checked
            assert p.send_sync(b"s", dedup_id="s-0") == 6
    finally:
        running.stop()
    running = start_inprocess(data, clock, **off)
    try:
        with Producer(running.url, destination="q") as p:
            assert p.send_batch(kafka) == [0, 1]
            assert p.send_batch(sdk) == [7, 8]
        with Admin(running.url) as admin:
            stats = admin.stats("q")
        assert (stats["end_offset"], stats["dedup_cache_ids"], stats["duplicates"]) == (9, 2, 2)
    finally:
        running.stop()


@pytest.mark.process
def test_a_resend_after_a_crash_is_still_caught(tmp_path: Path) -> None:
    data = str(tmp_path / "data")
    broker = BrokerProcess(data, log_file=str(tmp_path / "broker.log")).start()
    try:
        with Admin(broker.url) as admin:
            admin.create_queue("orders")
        with Producer(broker.url, destination="orders") as p:
            first = p.send_batch(
                pa.table({"body": [b"a", b"b", b"c"], "dedup_id": ["o1", "o2", "o3"]})
            )
        broker.kill()  # SIGKILL: the cache lives only in memory
        broker = BrokerProcess(data, log_file=str(tmp_path / "broker.log")).start()
        with Producer(broker.url, destination="orders") as p:
            again = p.send_batch(
                pa.table({"body": [b"a", b"b", b"c", b"d"], "dedup_id": ["o1", "o2", "o3", "o4"]})
            )
        assert first == [0, 1, 2] and again == [0, 1, 2, 3]
        with Admin(broker.url) as admin:
            stats = admin.stats("orders")
            assert (stats["end_offset"], stats["duplicates"], stats["depth"]) == (4, 3, 4)
    finally:
        broker.stop()


def test_sdk_numbered_batches_are_runs_and_resends_of_any_shape_are_caught(
    broker: RunningBroker,
) -> None:
    with Admin(broker.url) as admin:
        admin.create_queue("runs")
    ids = [f"p-{k}" for k in range(10, 20)]
    with Producer(broker.url, destination="runs") as p:
        assert p.send_batch(pa.table({"body": [b"a"] * 10, "dedup_id": ids})) == list(range(10))
        cache = broker.broker.destinations.get("runs").dedup
        assert len(cache) == 10 and len(cache._seen) == 1  # kept as one run
        # the same run again, a run overlapping its end, and single ids out of it
        assert p.send_batch(pa.table({"body": [b"b"] * 10, "dedup_id": ids})) == list(range(10))
        overlap = [f"p-{k}" for k in range(18, 23)]
        assert p.send_batch(pa.table({"body": [b"c"] * 5, "dedup_id": overlap})) == [
            8,
            9,
            10,
            11,
            12,
        ]
        assert p.send_sync(b"d", dedup_id="p-15") == 5
        assert p.send_sync(b"e", dedup_id="p-9") == 13  # not in the run: new
        assert p.send_sync(b"f", dedup_id="p-010") == 14  # not numbered the SDK's way: new
        # numbers in other digits than ASCII's are not numbers (before, "p-1\u0665", Arabic-Indic
        # 15, was a duplicate of p-15, and "p-\u00b2", a superscript 2, failed the send)
        assert p.send_sync(b"g", dedup_id="p-1\u0665") == 15
        assert p.send_sync(b"h", dedup_id="p-\u00b2") == 16
    assert broker.broker.stats("runs")["duplicates"] == 10 + 2 + 1
    assert len(bodies_in(broker, "runs", 17)) == 17


def test_runs_are_bounded_by_count_and_time(clock: ManualClock) -> None:
    from spark_mq.broker.dedup import DuplicateCache

    cache = DuplicateCache(size=25, window_s=60)
    first = pa.array([f"q-{k}" for k in range(20)])
    keep, dups, _ = cache.claim(first, clock.wall())
    assert len(keep) == 20 and not dups
    second = pa.array([f"q-{k}" for k in range(20, 30)])
    cache.claim(second, clock.wall())
    assert len(cache) == 25  # the oldest 5 ids of the first run went
    keep, dups, _ = cache.claim(pa.array(["q-4", "q-5"]), clock.wall())
    assert keep == [0] and list(dups) == [1]  # q-4 was forgotten, q-5 is still known
    clock.advance(61)
    keep, dups, _ = cache.claim(second, clock.wall())
    assert len(keep) == 10 and not dups  # the window passed


def test_a_stored_batch_leaves_only_its_offset_in_the_cache(clock: ManualClock) -> None:
    """Once stored, a cached id keeps no future (nor its lock and callbacks) alive, and a
    later duplicate still gets the original's offset."""
    import gc
    import weakref
    from concurrent.futures import Future

    from spark_mq.broker.dedup import DuplicateCache, combine
    from spark_mq.journal.base import AppendResult

    cache = DuplicateCache(size=100, window_s=60)
    for ids in (pa.array(["a", "b", "c"]), pa.array([f"r-{k}" for k in range(3)])):  # loose, run
        _, _, batch = cache.claim(ids, clock.wall())
        stored: Future = Future()
        cache.bind(batch, stored)
        stored.set_result(AppendResult("q", 40, 3))
        gone = weakref.ref(stored)
        del stored
        gc.collect()
        assert gone() is None
        keep, dups, _ = cache.claim(ids[1:], clock.wall())
        assert keep == [] and len(dups) == 2
        assert combine(2, keep, None, dups).result().offsets == [41, 42]


def test_ids_cached_one_by_one_are_plain_values_once_stored(clock: ManualClock) -> None:
    """Synchronous sends cache their ids one at a time, for the whole dedup window. Once stored
    (or read back at recovery) an entry holds plain values only, which the garbage collector
    stops walking: holding their batches, such entries were most of what each young collection
    in the broker walked."""
    import gc
    from concurrent.futures import Future

    from spark_mq.broker.dedup import DuplicateCache, combine
    from spark_mq.errors import JournalError
    from spark_mq.journal.base import AppendResult

    cache = DuplicateCache(size=100, window_s=60)
    _, _, batch = cache.claim(pa.array(["solo"]), clock.wall())
    stored: Future = Future()
    cache.bind(batch, stored)
    keep, dups, _ = cache.claim(pa.array(["solo"]), clock.wall())
    assert keep == [] and len(dups) == 1  # a duplicate of a pending original waits for it
    waiting = combine(1, keep, None, dups)
    assert not waiting.done()
    stored.set_result(AppendResult("q", 7, 1))
    assert waiting.result(0).offsets == [7]
    gc.collect()
    assert not gc.is_tracked(cache._seen["solo"])
    keep, dups, _ = cache.claim(pa.array(["solo"]), clock.wall())
    assert keep == [] and combine(1, keep, None, dups).result(0).offsets == [7]

    cache.remember("recovered", 3, clock.wall())
    gc.collect()
    assert not gc.is_tracked(cache._seen["recovered"])
    keep, dups, _ = cache.claim(pa.array(["recovered"]), clock.wall())
    assert keep == [] and combine(1, keep, None, dups).result(0).offsets == [3]

    _, _, failed = cache.claim(pa.array(["lost"]), clock.wall())
    lost: Future = Future()
    cache.bind(failed, lost)
    lost.set_exception(JournalError("the disk is full"))
    keep, dups, _ = cache.claim(pa.array(["lost"]), clock.wall())
    assert keep == [0] and not dups  # never stored: a retry is new


def test_a_single_new_id_is_claimed_in_one_pass_and_any_other_goes_the_general_way(
    clock: ManualClock,
) -> None:
    """``claim_one`` (a synchronous send's id) claims only an id it can tell is new; for the
    rest it answers None and ``claim`` decides, as before."""
    from concurrent.futures import Future

    from spark_mq.broker.dedup import DuplicateCache
    from spark_mq.journal.base import AppendResult

    cache = DuplicateCache(size=3, window_s=60)
    batch = cache.claim_one("s-1", clock.wall())
    assert batch is not None and len(cache) == 1
    stored: Future = Future()
    cache.bind(batch, stored)
    stored.set_result(AppendResult("q", 5, 1))
    assert cache.claim_one("s-1", clock.wall()) is None  # seen: claim() finds the original
    keep, dups, _ = cache.claim(["s-1"], clock.wall())
    assert keep == [] and list(dups) == [0]

    refused = cache.claim_one("s-2", clock.wall())
    assert refused is not None
    cache.release(refused)  # never stored: a retry is not a duplicate
    assert cache.claim_one("s-2", clock.wall()) is None
    keep, dups, _ = cache.claim(["s-2"], clock.wall())
    assert keep == [0] and not dups

    for k in range(3, 6):  # bounded by count: the oldest ids go
        assert cache.claim_one(f"s-{k}", clock.wall()) is not None
    assert len(cache) == 3 and "s-1" not in cache._seen
    clock.advance(61)  # and by time
    assert cache.claim_one("s-5", clock.wall()) is not None and len(cache) == 1

    cache.claim(pa.array([f"r-{k}" for k in range(4)]), clock.wall())  # a run of ids is held
    assert cache.claim_one("r-2", clock.wall()) is None  # which claim() looks into


def _stored(cache: Any, ids: list[str], first: int, now: float) -> None:
    """Claim ``ids`` and store them from offset ``first`` on (what the journal tells)."""
    from concurrent.futures import Future

    from spark_mq.journal.base import AppendResult

    _, _, batch = cache.claim(pa.array(ids) if len(ids) > 1 else ids, now)
    done: Future = Future()
    cache.bind(batch, done)
    done.set_result(AppendResult("d", first, len(ids)))


def test_the_newest_number_a_client_gave_its_ids_is_where_it_got_to_in_the_log(
    clock: ManualClock,
) -> None:
    """Where a producer numbering its ids got to (a Kafka producer's sequences, when its topic
    comes to a member): the newest id of its prefix stored or claimed, in runs, one by one or
    read back from the log; a batch that failed does not count; other prefixes do not; it stays
    once the ids are gone from the duplicate window; -1 for a prefix the log holds none of."""
    from concurrent.futures import Future

    from spark_mq.broker.dedup import DuplicateCache
    from spark_mq.errors import JournalError

    cache = DuplicateCache(size=100, window_s=60)
    assert cache.newest_number("kafka-7-0") == -1  # (an empty log: certainly none)
    cache.replayed(["kafka-7-0-1", "kafka-6-0-9", None, "plain", "kafka-7-0-3"])  # (read back)
    assert (cache.newest_number("kafka-7-0"), cache.newest_number("kafka-6-0")) == (3, 9)
    cache.claim(pa.array([f"kafka-7-0-{k}" for k in range(4, 8)]), clock.wall())  # a run
    _stored(cache, [f"kafka-8-0-{k}" for k in range(50, 60)], 0, clock.wall())
    assert cache.newest_number("kafka-7-0") == 7  # (claimed, not stored yet)
    assert cache.newest_number("kafka-8-0") == 59
    _, _, failed = cache.claim(pa.array([f"kafka-7-0-{k}" for k in range(8, 12)]), clock.wall())
    refused: Future = Future()
    cache.bind(failed, refused)
    refused.set_exception(JournalError("not stored"))
    assert cache.newest_number("kafka-7-0") == 7  # the failed batch's ids were never stored
    _stored(cache, ["kafka-7-0-8"], 10, clock.wall())  # one by one (its resend)
    assert cache.newest_number("kafka-7-0") == 8
    assert cache.newest_number("kafka-7") == -1  # (a prefix is matched whole)
    _, _, alone = cache.claim(pa.array(["kafka-9-0-0", "kafka-9-0-1"]), clock.wall())
    cache.release(alone)  # (refused before it reached the journal)
    assert cache.newest_number("kafka-9-0") == -1  # only a failed batch: never stored
    clock.advance(61)
    cache.claim(["other"], clock.wall())  # (the window passed: the ids are forgotten)
    assert (cache.newest_number("kafka-7-0"), cache.newest_number("kafka-8-0")) == (8, 59)
    assert cache.newest_number("kafka-10-0") == -1  # (nothing of it was ever here)


def test_a_cache_knows_whether_its_log_holds_anything_of_a_producer(clock: ManualClock) -> None:
    """A producer's number stays when its ids are evicted; a refill that read only the log's
    newest rows knows nothing of any producer it did not see (None), but what it read."""
    from spark_mq.broker.dedup import DuplicateCache

    cache = DuplicateCache(size=4, window_s=60)
    _stored(cache, [f"kafka-1-0-{k}" for k in range(3)], 0, clock.wall())
    _stored(cache, [f"kafka-2-0-{k}" for k in range(3)], 3, clock.wall())
    _stored(cache, ["kafka-3-0-0", "kafka-3-0-1"], 6, clock.wall())
    assert len(cache) == 4  # (1's ids all went)
    assert (cache.newest_number("kafka-1-0"), cache.newest_number("kafka-4-0")) == (2, -1)
    refilled = DuplicateCache(size=4, window_s=60)
    refilled.replayed(["kafka-6-0-3"])
    refilled.began_partway()
    assert refilled.newest_number("kafka-7-0") is None
    assert refilled.newest_number("kafka-6-0") == 3


def test_a_producer_state_is_handed_on_whole_or_not_at_all(clock: ManualClock) -> None:
    """What a destination's last owner handed on is begun from when the rows after it are read
    (a log that grew after the hand-over): its numbers, and that it holds every producer; not
    when it ended before the rows read or after the log's end, or does not read."""
    from spark_mq.broker.dedup import DuplicateCache

    cache = DuplicateCache(size=4, window_s=60)
    _stored(cache, ["kafka-1-0-0", "kafka-1-0-1"], 0, clock.wall())
    cache.claim(["kafka-2-0-5"], clock.wall())  # (stored, the journal's answer not in yet)
    cache.release(cache.claim(["kafka-4-0-7"], clock.wall())[2])  # (refused: never stored)
    handed = cache.handed(3)
    taken = DuplicateCache(size=4, window_s=60)
    taken.began_partway()  # (its log is longer than it reads)
    assert taken.begin_from(handed, 2, 5) == 3  # (rows 3 and 4 came after it)
    taken.replayed(["kafka-3-0-0"])
    assert [taken.newest_number(f"kafka-{p}-0") for p in (1, 2, 3, 4)] == [1, 5, 0, -1]
    for args in ((handed, 4, 9), (handed, 0, 2), ("{not json", 0, 9), ('{"end": 1}', 0, 9)):
        other = DuplicateCache(size=4, window_s=60)
        other.began_partway()
        assert other.begin_from(*args) is None
        assert other.newest_number("kafka-4-0") is None
    partial = DuplicateCache(size=4, window_s=60)
    partial.began_partway()
    after = DuplicateCache(size=4, window_s=60)
    assert after.begin_from(partial.handed(0), 0, 0) == 0
    assert after.newest_number("kafka-4-0") is None  # (what it was handed could not tell)


def test_a_refill_knows_whether_it_read_all_the_log_holds(
    broker: RunningBroker, clock: ManualClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A destination taken on (recovered, or come from another member) refills its cache from
    the log: it knows every producer the log holds (-1 for one it holds none of) when it read
    the whole log, every row there, or began from what the last owner handed on and read every
    row after that (up to REPLAY_ROWS, more than the cache holds); ids older than the window
    still tell where their producer got to."""
    from spark_mq.broker import registry as registry_module
    from spark_mq.broker.dedup import DuplicateCache

    with Admin(broker.url) as admin:
        admin.create_queue("refilled")
    ids = [f"kafka-1-0-{k}" for k in range(6)]
    with Producer(broker.url, destination="refilled") as p:
        p.send_batch(pa.table({"body": [b"x"] * 6, "dedup_id": ids}))
    registry = broker.broker.destinations

    def refilled(size: int = 100, handed: str | None = None) -> DuplicateCache:
        dest = registry.build("refilled", "queue")
        dest.dedup = cache = DuplicateCache(size, 300)
        registry.refill_dedup(dest, handed)
        return cache

    whole = refilled()
    assert (whole.newest_number("kafka-1-0"), whole.newest_number("kafka-2-0")) == (5, -1)
    partway = refilled(size=4)  # (the log's newest 4 rows)
    assert (partway.newest_number("kafka-1-0"), partway.newest_number("kafka-2-0")) == (5, None)
    handed = whole.handed(4)  # (as if handed on with the log ending at 4: rows 4, 5 after it)
    assert refilled(size=4, handed=handed).newest_number("kafka-2-0") == -1
    assert refilled(size=1, handed=handed).newest_number("kafka-2-0") == -1  # (4 read too)
    monkeypatch.setattr(registry_module, "REPLAY_ROWS", 1)  # (only 5 read back: 4 missed)
    assert refilled(size=1, handed=handed).newest_number("kafka-2-0") is None
    monkeypatch.undo()
    read = registry.journal.read_messages
    monkeypatch.setattr(
        registry.journal,
        "read_messages",
        lambda name, start, end, *cols: read(name, start, end, *cols)[1:],
    )  # (a compaction removed a row)
    assert refilled().newest_number("kafka-2-0") is None
    assert refilled(size=4, handed=handed).newest_number("kafka-2-0") == -1  # (before 4)
    monkeypatch.undo()
    clock.advance(301)
    old = refilled()  # (the window passed: the ids are not held, where they got to is)
    assert (old.newest_number("kafka-1-0"), old.newest_number("kafka-2-0")) == (5, -1)
    assert old.claim(["kafka-1-0-5"], clock.wall())[1] == {}  # (not a duplicate any more)


def test_a_cache_that_forgot_too_many_producers_says_it_cannot_tell(
    clock: ManualClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The producers stored to longest ago go past a bound (memory), and are noted up to
    another: a forgotten one is not known, and past the second bound, no producer is."""
    from spark_mq.broker import dedup, producer_state

    monkeypatch.setattr(producer_state, "_FOLLOWED", 2)
    monkeypatch.setattr(producer_state, "_FORGOTTEN", 2)
    cache = dedup.DuplicateCache(size=1, window_s=60)
    for p in range(4):
        _stored(cache, [f"kafka-{p}-0-0"], p, clock.wall())
    assert [cache.newest_number(f"kafka-{p}-0") for p in range(5)] == [None, None, 0, 0, -1]
    _stored(cache, ["kafka-4-0-0"], 4, clock.wall())  # the third forgotten: past the bound
    assert [cache.newest_number(f"kafka-{p}-0") for p in (3, 4, 9)] == [0, 0, None]


def test_the_producer_state_a_commit_carries_is_read_without_the_destination_map(
    broker: RunningBroker,
) -> None:
    """A cluster member's commits carry each destination's producer state, asked of the
    broker by the hot tier's mover (or the writer) as it commits. A deletion holds the
    destination map's lock while it waits for that mover or writer to stop, so the asking must
    not take the lock: before, it did, and deleting a partition on a cluster member hung while
    its mover was moving (a full run of the suite saw it once)."""
    with Admin(broker.url) as admin:
        admin.create_queue("carried")
    with Producer(broker.url, destination="carried") as p:
        p.send_sync(b"a", dedup_id="p-0")
    journal = broker.broker.journal
    state_at = journal.producer_state  # (what the mover or writer asks)
    assert state_at is not None
    end = journal.end_offset("carried")
    asked: list[str | None] = []
    with broker.broker.destinations.lock:  # (as a deletion holds it)
        mover = threading.Thread(target=lambda: asked.append(state_at("carried", end)))
        mover.start()
        mover.join(10)
        assert not mover.is_alive(), "the producer state waited for the map's lock"
    assert asked and json.loads(asked[0] or "")["newest"] == {"p": 0}


@pytest.mark.parametrize("size", [1000, 150])
def test_ids_read_back_in_runs_are_found_as_when_remembered_one_by_one(size: int) -> None:
    """A refill enters runs of numbered ids at consecutive offsets as one entry each
    (DuplicateCache.remember_all), and every id is then found at the offset it is found at
    when each is remembered on its own, and forgotten as it is when the cache is full."""
    import numpy as np

    from spark_mq.broker.dedup import DuplicateCache, recovered_runs

    ids: list[str | None] = [f"p-{k}" for k in range(100)]  # sent one by one: one run
    ids += [f"k{k % 2}-0-{k // 2}" for k in range(20)]  # two producers taking turns: no runs
    ids += [f"k0-0-{k}" for k in range(10, 15)] + [None, "uuid-a", "uuid-b"]
    ids += [f"r-{k}" for k in range(5)] + ["r-2"]  # r-2 twice: r's kept one by one
    ids += ["p-1\u0665", "p-010", "big-1234567890123456789", "big-1234567890123456790"]
    ids += [f"p-{k}" for k in range(100, 140)]  # p again, after a gap: a second run of p
    offsets = np.arange(len(ids), dtype=np.int64) + 7
    offsets[-40:] += 3  # (rows between compacted away)
    times = np.linspace(1000.0, 1001.0, len(ids))
    runs = recovered_runs(pa.array(ids, pa.string()), offsets)
    assert [(r[2], r[3], r[1] - r[0]) for r in runs] == [
        ("p", 0, 100),
        ("k0-0", 10, 5),
        ("p", 100, 40),
    ]
    one_by_one, together = DuplicateCache(size, 60), DuplicateCache(size, 60)
    for dedup_id, offset, at in zip(ids, offsets.tolist(), times.tolist(), strict=True):
        if dedup_id is not None:
            one_by_one.remember(dedup_id, offset, at)
    together.remember_all(pa.array(ids, pa.string()), offsets, times)
    distinct = {i for i in ids if i is not None}
    assert len(together) == len(one_by_one) == min(size, len(distinct))
    assert len(together._seen) < len(one_by_one._seen) - 100  # (three runs, one entry each)
    for dedup_id in distinct | {"p-140", "k0-0-15", "r-5"}:
        found, expected = together._find(dedup_id), one_by_one._find(dedup_id)
        assert (found and found[2]) == (expected and expected[2]), dedup_id
