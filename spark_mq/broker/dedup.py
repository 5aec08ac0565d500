"""Duplicate detection: a message whose dedup id was seen recently is acknowledged, not stored.

One cache per destination, bounded two ways: the newest ``size`` ids (Artemis' id-cache-size,
20,000) seen within ``window_s`` seconds (SQS FIFO's five-minute deduplication interval). An id
is claimed when its batch arrives, so a resend racing the original is caught too; it gets its
offset once the original is durable and is forgotten again if the original fails (a retry must
then be stored). After a restart the cache is refilled from the message log's newest rows.

A duplicate is answered with the offset the original got, like Artemis answering a duplicate send
as a success without storing it.

Each prefix's newest number stored stays after its ids go (the destination's producer state,
:mod:`spark_mq.broker.producer_state`): a Kafka producer's first batch to a topic just taken on
is checked against it (:meth:`DuplicateCache.newest_number`).

With duplicate detection off (``duplicates.cache_size = 0``) a destination still keeps a cache
for one kind of id: an idempotent Kafka producer's (``kafka-<producer id>-<epoch>-<sequence>``,
:data:`KAFKA_ONLY`). A Kafka client is promised that a batch it sends again is stored once,
whatever the broker's settings, as a Kafka broker always keeps its producers' state; before,
such a broker stored the batch twice, and took a producer's first batch to a topic whatever
its sequence (no producer state to check it against). Other ids are not looked at: a batch
whose first id does not begin ``kafka-`` is stored as it comes (a Kafka batch's ids share one
prefix, so its first tells).

The SDK numbers its ids (``<producer prefix>-<n>``, consecutive in a batch), so a batch's ids
usually form a *run*: recognised with one vectorised comparison and kept as one entry, which
makes detection cost per batch rather than per message. Other ids are kept one by one.
"""

from __future__ import annotations

import threading
from collections import Counter, OrderedDict
from concurrent.futures import Future
from typing import cast

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from spark_mq.broker.producer_state import ProducerState, newest_numbers
from spark_mq.broker.producer_state import numbered as _numbered  # (locals are "numbered")
from spark_mq.commands import ProduceResult
from spark_mq.journal.base import AppendResult
from spark_mq.names import KAFKA_DEDUP_PREFIX
from spark_mq.schema import numbered_id_buffers, numpy_buffer


class _Batch:
    """One stored batch the cache's ids point into: an id's offset is ``first + position``."""

    __slots__ = ("failed", "first", "future", "ids", "newest")

    def __init__(self) -> None:
        # set by bind() until the rows are stored; None for ids read back at recovery
        self.future: Future | None = None
        self.first: int | None = None
        self.failed = False
        self.ids: list[tuple[str, int]] | None = None  # (id, position) cached one by one
        # the newest number of each numbered prefix among its ids: the producer state's once
        # the rows are stored
        self.newest: dict[str, int] | None = None

    @property
    def pending(self) -> bool:
        """Claimed, and neither stored nor failed yet."""
        return self.first is None and not self.failed


# the ids a Kafka-only cache holds (duplicate detection off): the default cache's size
KAFKA_ONLY = 20_000

_RECOVERED = _Batch()
_RECOVERED.first = 0  # a recovered id's "position" is its offset

# dedup id -> (when it arrived, the batch storing it, its position among that batch's rows);
# once stored, (when it arrived, None, its offset): a tuple of plain values, which the garbage
# collector stops tracking. Ids cached one at a time (synchronous sends) stay for the whole
# dedup window: a full cache of them (20,000 by default) held 40,000 tracked objects for every
# full collection to walk, now none (in a loop, with the modules frozen as in the broker: a
# full collection 1.3 ms -> 0.2 ms, and under load the walk is colder and slower).
_Entry = tuple[float, _Batch | None, int]


class _Run:
    """Ids ``<prefix>-<first>`` .. ``<prefix>-<last>``; id k sits at ``base + k - origin``."""

    __slots__ = ("at", "base", "batch", "first", "last", "origin", "prefix")

    def __init__(self, prefix: str, first: int, last: int, at: float, batch: _Batch) -> None:
        self.prefix, self.first, self.last, self.at, self.batch = prefix, first, last, at, batch
        self.origin, self.base = first, 0

    def __len__(self) -> int:
        return self.last - self.first + 1


def as_run(ids: pa.Array | pa.ChunkedArray) -> tuple[str, int] | None:
    """``(prefix, first)`` when ``ids`` are exactly ``prefix-first``, ``prefix-first+1``...

    Every id starts with ``prefix-``, what follows is consecutive integers written plainly (no
    sign, no leading zero). Ids of one length (the usual case) are compared byte for byte with
    the ids the run would be (:func:`~spark_mq.schema.numbered_id_buffers`).
    """
    n = len(ids)
    if n < 2 or ids.null_count:
        return None
    head = _numbered(ids[0].as_py())
    if head is None:
        return None
    prefix, first = head
    arr = ids.combine_chunks() if isinstance(ids, pa.ChunkedArray) else ids
    run = numbered_id_buffers(f"{prefix}-".encode(), first, n)
    if arr.type != pa.string() or run is None:  # (the numbers cross a power of ten)
        return _as_run_slow(arr, prefix, np.arange(first, first + n, dtype=np.int64))
    _, offsets, chars = arr.buffers()
    assert offsets is not None and chars is not None  # (a string array has both)
    ends = offsets.slice(4 * arr.offset, 4 * (n + 1))  # (int32 each; compared as bytes)
    start = int(np.frombuffer(memoryview(ends[:4]), np.int32)[0])
    want_ends, want_data = run
    if start:
        want_ends = want_ends + start
    if not ends.equals(numpy_buffer(want_ends)):
        return None
    return head if chars.slice(start, want_data.size).equals(want_data) else None


def _as_run_slow(arr: pa.Array, prefix: str, expected: np.ndarray) -> tuple[str, int] | None:
    if not pc.all(pc.starts_with(arr, prefix + "-")).as_py():
        return None
    try:
        numbers = pc.utf8_slice_codeunits(arr, len(prefix) + 1).cast(pa.int64())
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        return None
    if not np.array_equal(numbers.to_numpy(), expected):
        return None
    plain = np.searchsorted(_TENS, expected, side="right") + 1  # (digits; log10 rounds 10**15-1 up)
    lengths = pc.binary_length(cast(pa.StringArray, arr)).to_numpy()
    if not np.array_equal(lengths, plain + len(prefix.encode()) + 1):
        return None
    return prefix, int(expected[0])


_TENS = 10 ** np.arange(1, 19, dtype=np.int64)  # 10 .. 10**18: a number has one digit more than
# the powers of ten it reaches

# an id numbered as runs are (numbered(): ASCII digits, no leading zero), up to 18 digits (an
# int64; an id with more is kept on its own)
_NUMBERED = r"^(?P<prefix>.*)-(?P<number>0|[1-9][0-9]{0,17})$"


def recovered_runs(ids: pa.Array, offsets: np.ndarray) -> list[tuple[int, int, str, int]]:
    """The runs among ids read back from a log in offset order: ``(start, stop, prefix,
    first)`` for each stretch of two or more rows ``start`` to ``stop`` whose ids are
    ``<prefix>-<first>``, ``<prefix>-<first + 1>``... at consecutive offsets. A prefix with a
    number seen twice among the rows has none (each of its ids kept on its own tells which
    offset is the newest). Vectorised: a refill reads up to 20,000 ids."""
    n = len(ids)
    if n < 2:
        return []
    parts = pc.extract_regex(ids, _NUMBERED)
    matched = parts.is_valid()
    valid = matched.to_numpy(zero_copy_only=False)
    if not valid.any():
        return []
    prefix = parts.field("prefix")  # ("" where no match, as the number: masked by valid)
    number = pc.if_else(matched, parts.field("number"), "-2").cast(pa.int64()).to_numpy()
    same = pc.equal(prefix[1:], prefix[:-1]).fill_null(False).to_numpy(zero_copy_only=False)
    step = same & (number[1:] == number[:-1] + 1) & (offsets[1:] == offsets[:-1] + 1)
    step &= valid[1:] & valid[:-1]
    breaks = np.flatnonzero(~step) + 1
    starts = np.concatenate(([0], breaks))
    stops = np.concatenate((breaks, [n]))
    long = stops - starts >= 2
    if not long.any():
        return []
    # a (prefix, number) seen twice: sorted by both, two neighbours alike
    codes = cast("pa.DictionaryArray", pc.dictionary_encode(prefix)).indices.to_numpy()[valid]
    numbers = number[valid]
    order = np.lexsort((numbers, codes))
    codes, numbers = codes[order], numbers[order]
    alike = (codes[1:] == codes[:-1]) & (numbers[1:] == numbers[:-1])
    twice = set(prefix.filter(matched).take(order[1:][alike]).to_pylist())
    runs = []
    for start, stop in zip(starts[long].tolist(), stops[long].tolist(), strict=True):
        name = prefix[start].as_py()
        if name not in twice:
            runs.append((start, stop, name, int(number[start])))
    return runs


class DuplicateCache:
    def __init__(self, size: int, window_s: float, only: str | None = None) -> None:
        self.size = size
        self.window_s = window_s
        self.only = only  # (set: only batches whose first id begins with it are checked)
        self._lock = threading.Lock()
        self._seen: OrderedDict[str | _Run, _Entry | _Run] = OrderedDict()
        self._runs: dict[str, list[_Run]] = {}  # prefix -> its runs
        self._loose: Counter[str] = Counter()  # prefix -> numbered ids kept one by one
        self._count = 0  # ids held, runs counted by their length
        self.duplicates_total = 0
        # each prefix's newest number stored (kept after its ids go), and its number of
        # changes when last handed on
        self.producers = ProducerState()
        self._handed_at = -1
        # batches claimed with numbered ids and neither stored nor failed yet, in claim order:
        # what a state handed on adds (a walk of the whole cache for them held its lock 1.9 ms)
        self._pending: dict[_Batch, None] = {}

    def __len__(self) -> int:
        return self._count

    @classmethod
    def kafka_only(cls, window_s: float) -> DuplicateCache:
        """The cache of a broker whose duplicate detection is off: Kafka producers' ids only."""
        return cls(KAFKA_ONLY, window_s, only=KAFKA_DEDUP_PREFIX)

    def looked_at(self, ids: pa.Array) -> pa.Array:
        """``ids`` read back from the log, those the cache does not check made null."""
        if self.only is None:
            return ids
        return pc.if_else(pc.starts_with(ids, self.only), ids, pa.scalar(None, ids.type))

    # -- bookkeeping (callers hold the lock) ---------------------------------------------------
    def _add(self, dedup_id: str, entry: _Entry) -> tuple[str, int] | None:
        if dedup_id in self._seen:
            self._drop(dedup_id, self._seen.pop(dedup_id))
        self._seen[dedup_id] = entry
        self._count += 1
        numbered = _numbered(dedup_id)
        if numbered is not None:
            self._loose[numbered[0]] += 1
        return numbered

    def _add_run(self, run: _Run) -> None:
        self._seen[run] = run
        self._runs.setdefault(run.prefix, []).append(run)
        self._count += len(run)

    def _drop(self, key: str | _Run, entry: _Entry | _Run) -> None:
        if isinstance(key, _Run):
            self._count -= len(key)
            runs = self._runs[key.prefix]
            runs.remove(key)
            if not runs:
                del self._runs[key.prefix]
            return
        self._count -= 1
        numbered = _numbered(key)
        if numbered is not None:
            self._loose[numbered[0]] -= 1
            if not self._loose[numbered[0]]:
                del self._loose[numbered[0]]

    def _evict(self, now: float) -> None:
        seen = self._seen
        while self._count > self.size and seen:
            key = next(iter(seen))
            excess = self._count - self.size
            if isinstance(key, _Run) and len(key) > excess:
                key.first += excess  # forget the run's oldest ids only
                self._count -= excess
                break
            self._drop(key, seen.popitem(last=False)[1])
        oldest = now - self.window_s
        while seen:
            key, entry = next(iter(seen.items()))
            at = entry.at if isinstance(entry, _Run) else entry[0]
            if at >= oldest:
                break
            self._drop(key, seen.popitem(last=False)[1])

    def _find(self, dedup_id: str) -> tuple[float, _Batch, int] | None:
        entry = cast("_Entry | None", self._seen.get(dedup_id))  # an id key holds no run
        if entry is not None:
            at, batch, position = entry
            return at, batch or _RECOVERED, position
        if self._runs:
            numbered = _numbered(dedup_id)
            if numbered is not None:
                for run in self._runs.get(numbered[0], ()):
                    if run.first <= numbered[1] <= run.last:
                        return run.at, run.batch, run.base + numbered[1] - run.origin
        return None

    # -- the interface -------------------------------------------------------------------------
    def remember(self, dedup_id: str, offset: int, at: float) -> None:
        """Record a stored message (recovery reads them back from the log, oldest first)."""
        with self._lock:
            self._add(dedup_id, (at, None, offset))
            self._evict(at)

    def remember_all(self, ids: pa.Array, offsets: np.ndarray, times: np.ndarray) -> None:
        """:meth:`remember` each stored message read back from the log, oldest first (null
        ids skipped), into a cache that holds none yet: a run of numbered ids at consecutive
        offsets (:func:`recovered_runs`: a producer's, sent one by one or in batches) is one
        entry, as a batch claimed whole is, the time of its newest id its time. Entered one by
        one, 20,000 ids took 82-86 ms of a restart's recovery (28-54 ms now, cProfile)."""
        if not len(ids):
            return
        runs = recovered_runs(ids, offsets)
        names = ids.to_pylist()
        with self._lock:
            if self._count:  # (runs are not checked against what a cache holds)
                runs = []
            done = 0
            for start, stop, prefix, first in [*runs, (len(names), len(names), "", 0)]:
                for k in range(done, start):
                    dedup_id = names[k]
                    if dedup_id is not None:
                        self._add(dedup_id, (float(times[k]), None, int(offsets[k])))
                if stop > start:
                    run = _Run(prefix, first, first + stop - start - 1, float(times[stop - 1]),
                               _RECOVERED)  # fmt: skip
                    run.base = int(offsets[start])
                    self._add_run(run)
                done = stop
            self._evict(float(times.max()))

    def replayed(self, ids: list[str | None]) -> None:
        """Ids the log holds, read back in log order: where each producer got to (the
        producer state's; :meth:`remember` is the duplicate detection's). Only each prefix's
        last id is parsed, under the lock once: a refill may read 200,000 rows."""
        newest = newest_numbers(ids)
        with self._lock:
            self.producers.replayed(newest)

    def began_partway(self) -> None:
        """The refill read only the log's newest rows: what is older is not known."""
        with self._lock:
            self.producers.began_partway()

    def begin_from(self, handed: str, start: int, end: int) -> int | None:
        """The producer state its last owner handed on
        (:meth:`ProducerState.begin_from`)."""
        with self._lock:
            return self.producers.begin_from(handed, start, end)

    def handed(self, end: int) -> str:
        """The producer state to hand on with the log ending at ``end`` (every claim that has
        not failed counted: a move's last commits may not have told the cache yet)."""
        with self._lock:
            self._handed_at = self.producers.changes
            return self.producers.handed(end, self._pending_newest())

    def handed_if_changed(self, end: int) -> str | None:
        """:meth:`handed`, unless nothing changed since it was last handed (None)."""
        with self._lock:
            if self.producers.changes == self._handed_at:
                return None
        return self.handed(end)

    def _pending_newest(self) -> dict[str, int]:
        newest: dict[str, int] = {}
        for batch in self._pending:  # (in the order claimed: the last one wins)
            if batch.newest:
                newest.update(batch.newest)
        return newest

    def claim(
        self, ids: pa.Array | pa.ChunkedArray | list[str | None], now: float
    ) -> tuple[list[int], dict[int, tuple[_Batch, int]], _Batch]:
        """Split a batch: the rows to store, and for each duplicate row where its original is.

        New ids are claimed for the returned batch at once (:meth:`bind` ties it to the
        append); an id seen twice in one batch is a duplicate of its first row. ``ids`` may be
        a list (a plain message's one id).
        """
        batch = _Batch()
        run = None if isinstance(ids, list) else as_run(ids)
        with self._lock:
            self._evict(now)
            if run is not None:
                prefix, first = run
                last = first + len(ids) - 1
                if prefix not in self._loose and not any(
                    r.first <= last and first <= r.last for r in self._runs.get(prefix, ())
                ):
                    # the usual case: a fresh run of SDK-numbered ids, one entry for them all
                    self._add_run(_Run(prefix, first, last, now, batch))
                    batch.newest = {prefix: last}
                    self._pending[batch] = None
                    self._evict(now)
                    return list(range(len(ids))), {}, batch
        names = ids if isinstance(ids, list) else ids.to_pylist()
        with self._lock:
            self._evict(now)
            named = [i for i in names if i is not None]
            if (
                not self._runs
                and len(set(named)) == len(named)
                and self._seen.keys().isdisjoint(named)
            ):
                # no duplicate: claim them all in one go
                batch.ids = []
                newest: dict[str, int] = {}
                for row, i in enumerate(names):
                    if i is not None:
                        numbered = self._add(i, (now, batch, row))
                        batch.ids.append((i, row))
                        if numbered is not None:
                            newest[numbered[0]] = numbered[1]
                batch.newest = newest
                if newest:
                    self._pending[batch] = None
                self._evict(now)
                return list(range(len(names))), {}, batch
            keep: list[int] = []
            dups: dict[int, tuple[_Batch, int]] = {}
            batch.ids = []
            batch.newest = newest = {}
            for row, dedup_id in enumerate(names):
                if dedup_id is None:
                    keep.append(row)
                    continue
                entry = self._find(dedup_id)
                if entry is not None and not entry[1].failed and entry[0] >= now - self.window_s:
                    dups[row] = (entry[1], entry[2])
                    continue
                numbered = self._add(dedup_id, (now, batch, len(keep)))
                batch.ids.append((dedup_id, len(keep)))
                keep.append(row)
                if numbered is not None:
                    newest[numbered[0]] = numbered[1]
            if newest:
                self._pending[batch] = None
            self._evict(now)
            self.duplicates_total += len(dups)
        return keep, dups, batch

    def claim_one(self, dedup_id: str, now: float) -> _Batch | None:
        """:meth:`claim` of one id that is new and that no run of ids could hold (a synchronous
        send's): the batch claiming it, in one pass under the lock. None for any other id,
        :meth:`claim` then tells. Timed in the broker's loop: 10 us a message, against 20-23."""
        with self._lock:
            self._evict(now)
            if self._runs or dedup_id in self._seen:
                return None
            batch = _Batch()
            batch.ids = [(dedup_id, 0)]
            numbered = self._add(dedup_id, (now, batch, 0))
            if numbered is not None:
                batch.newest = {numbered[0]: numbered[1]}
                self._pending[batch] = None
            if self._count > self.size:
                self._evict(now)
            return batch

    def newest_number(self, prefix: str) -> int | None:
        """The number of the newest id ``<prefix>-<n>`` stored, or claimed by a batch that has
        not failed; -1 when the log certainly holds none; None when that is not known. Where a
        client numbering its ids got to: a Kafka producer's sequence, when its topic has just
        come to this member (:mod:`spark_mq.transports.kafka.sequences`). Once a producer and
        term: a walk from the newest id back to its own, for a claim not yet stored."""
        with self._lock:
            if prefix in self._runs or prefix in self._loose:
                for key, entry in reversed(self._seen.items()):
                    if isinstance(key, _Run):
                        if key.prefix == prefix and not key.batch.failed:
                            if key.batch.pending:
                                return key.last
                            break
                        continue
                    numbered = _numbered(key)
                    if numbered is not None and numbered[0] == prefix:
                        batch = cast("_Entry", entry)[1]
                        if batch is not None and batch.pending:
                            return numbered[1]
                        if batch is None or not batch.failed:
                            break
            return self.producers.newest(prefix)

    def release(self, batch: _Batch) -> None:
        """The batch was refused before it reached the journal: its ids were never stored."""
        batch.failed = True
        self._settled(batch)

    def _settled(self, batch: _Batch) -> None:
        """A batch that failed is pending no more."""
        if batch.newest:
            with self._lock:
                self._pending.pop(batch, None)

    def bind(self, batch: _Batch, future: Future) -> None:
        """Tie a claimed batch to the append storing its rows."""
        batch.future = future

        def done(f: Future) -> None:
            if f.exception() is None:
                first = batch.first = f.result().first_offset
                # stored: the offset is all a duplicate needs. Dropping the future (its lock,
                # its callbacks and what they hold), and the batch from the ids' entries, keeps
                # a cached id small and off the garbage collector's hands for the whole window.
                batch.future = None
                ids, batch.ids = batch.ids, None
                newest = batch.newest
                if not (ids or newest):
                    return
                with self._lock:
                    if newest:  # (under the lock: a state handed on sees it one way or other)
                        batch.newest = None
                        self._pending.pop(batch, None)
                        for prefix, number in newest.items():
                            self.producers.stored(prefix, number)
                    if ids:
                        for dedup_id, position in ids:
                            entry = self._seen.get(dedup_id)
                            if isinstance(entry, tuple) and entry[1] is batch:  # its own
                                self._seen[dedup_id] = (entry[0], None, first + position)
            else:  # not stored: a retry must not be taken for a duplicate
                batch.failed = True
                self._settled(batch)

        future.add_done_callback(done)


def combine(
    rows: int, keep: list[int], stored: Future | None, dups: dict[int, tuple[_Batch, int]]
) -> Future:
    """One future of a batch's :class:`ProduceResult`, once its rows and originals are durable."""
    waits = {id(b.future): b.future for b, _ in dups.values() if b.future is not None}
    if stored is not None:
        waits[id(stored)] = stored
    result: Future = Future()
    left = [len(waits)]
    lock = threading.Lock()

    def finish() -> None:
        offsets = [0] * rows
        try:
            if stored is not None:
                first = stored.result().first_offset
                for pos, row in enumerate(keep):
                    offsets[row] = first + pos
            for row, (batch, position) in dups.items():
                original = batch.future  # read once: bind's callback clears it once stored
                if original is not None:
                    res: AppendResult = original.result()  # raises if the original failed
                    offsets[row] = res.first_offset + position
                else:  # stored (first is set before the future is dropped) or recovered
                    offsets[row] = (batch.first or 0) + position
        except Exception as exc:
            result.set_exception(exc)
            return
        result.set_result(ProduceResult(offsets, len(dups)))

    def one_done(_: Future) -> None:
        with lock:
            left[0] -= 1
            if left[0]:
                return
        finish()

    if not waits:
        finish()
    for f in waits.values():
        f.add_done_callback(one_done)
    return result
