"""The Arrow rows of one destination that some subscription may still need.

Rows arrive in offset order (one chunk per group commit, or the unsettled rows read back at
recovery); chunks whose every offset is below all subscriptions' low-water marks are dropped.
Next to each chunk sit the columns dispatch decides on (priority, group, expiry, scheduled
time) as numpy arrays or lists, computed once per chunk, never per message; a chunk where a
column is all null keeps ``None`` for it, so plain queues pay nothing for features unused.
Bodies can be evicted (the broker's memory states): a chunk then keeps its dispatch columns
and re-reads bodies from the journal when its messages are delivered.
"""

from __future__ import annotations

import bisect
import itertools
import threading
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any, cast

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from spark_mq.broker.settled import sorted_unique
from spark_mq.messages import Messages, PlainMessage
from spark_mq.schema import DEFAULT_PRIORITY, Column, fill_null

NEVER = np.iinfo(np.int64).max  # an absent expiry / delivery time, in microseconds
_ONE_PRIORITY = np.array([DEFAULT_PRIORITY], np.int32)  # a plain message's (shared, read only)
_ONE_PRIORITY.flags.writeable = False


def _micros(column: pa.ChunkedArray, absent: int) -> np.ndarray | None:
    if column.null_count == len(column):
        return None
    return fill_null(column.cast(pa.int64()), absent).to_numpy()


@dataclass
class Chunk:
    """One commit's rows (a table, or plain messages whose table is built only when asked for)
    and their dispatch columns."""

    offsets: np.ndarray
    _table: pa.Table | None  # None until a plain chunk's table is asked for
    priority: np.ndarray
    groups: list[str | None] | None
    expiry_us: np.ndarray | None  # NEVER where absent
    deliver_us: np.ndarray | None  # 0 where absent
    plain: Messages | None = None  # plain messages as they came, while their bodies are held
    evicted: bool = False  # bodies dropped from memory (re-read from the journal on delivery)
    _props: list[dict[str, Any]] | None = field(default=None, repr=False)

    @property
    def table(self) -> pa.Table:
        if self._table is None:
            assert self.plain is not None
            self._table = self.plain.table()
        return self._table

    @table.setter
    def table(self, table: pa.Table) -> None:
        self._table = table

    @property
    def nbytes(self) -> int:
        """What the chunk counts for in the store's size: the same from its add to its drop,
        unless its bodies are evicted. A plain chunk's table, once built, is not counted: for
        one message (the usual plain chunk) it shares the body, for more it copies them."""
        if self.plain is not None:
            return self.plain.nbytes
        return self.table.get_total_buffer_size()

    @classmethod
    def of(cls, messages: Messages) -> Chunk:
        if messages.plain is not None:
            return cls.of_plain(messages, messages.plain)
        rows = messages.table()
        # the rows stay as committed (one flush can hold several produced batches): combining
        # them copied every body into freshly mapped memory, per flush
        groups, priority = rows["group_id"], cast(Column, rows["priority"])
        if priority.null_count:  # the broker fills priorities in; older data may lack them
            priority = fill_null(priority, DEFAULT_PRIORITY)
        return cls(
            rows["offset"].to_numpy(),
            rows,
            priority.to_numpy(),
            None if groups.null_count == len(groups) else groups.to_pylist(),
            _micros(rows["expiry_time"], NEVER),
            _micros(rows["deliver_time"], 0),  # no delivery time: deliverable at once
        )

    @classmethod
    def of_plain(cls, messages: Messages, plain: list[PlainMessage]) -> Chunk:
        """Plain messages (``messages`` holds them): the default priority, no group, expiry or
        delivery time."""
        n = len(plain)
        if n == 1:
            offsets = np.array([plain[0].offset], np.int64)
        else:
            offsets = np.fromiter((m.offset for m in plain), np.int64, n)
        priority = _ONE_PRIORITY if n == 1 else np.full(n, DEFAULT_PRIORITY, np.int32)
        return cls(offsets, None, priority, None, None, None, plain=messages)

    def props(self, i: int) -> dict[str, Any]:
        """What a selector sees of row ``i``: its headers, then the JMS fields."""
        if self._props is None:
            t = self.table
            ms = {
                name: pc.divide(t[name].cast(pa.int64()), 1000).to_pylist()
                for name in ("enqueue_time", "expiry_time", "deliver_time")
            }
            self._props = [
                {
                    **dict(headers or ()),
                    "JMSMessageID": mid,
                    "JMSDedupID": did,
                    "JMSXGroupID": gid,
                    "JMSPriority": prio,
                    "JMSTimestamp": ts,
                    "JMSExpiration": exp or 0,
                    "JMSDeliveryTime": dt if dt is not None else ts,
                }
                for headers, mid, did, gid, prio, ts, exp, dt in zip(
                    t["headers"].to_pylist(),
                    t["message_id"].to_pylist(),
                    t["dedup_id"].to_pylist(),
                    t["group_id"].to_pylist(),
                    t["priority"].to_pylist(),
                    ms["enqueue_time"],
                    ms["expiry_time"],
                    ms["deliver_time"],
                    strict=True,
                )
            ]
        return self._props[i]


@dataclass(slots=True)
class Entries:
    """A slice of one chunk: offsets and their dispatch columns (``None``: all absent)."""

    chunk: Chunk
    start: int  # index of the first entry within the chunk

    @property
    def offsets(self) -> np.ndarray:
        return self.chunk.offsets[self.start :]

    @property
    def priority(self) -> np.ndarray:
        return self.chunk.priority[self.start :]

    @property
    def groups(self) -> list[str | None] | None:
        g = self.chunk.groups
        return None if g is None else g[self.start :]

    @property
    def expiry_us(self) -> np.ndarray | None:
        e = self.chunk.expiry_us
        return None if e is None else e[self.start :]

    @property
    def deliver_us(self) -> np.ndarray | None:
        d = self.chunk.deliver_us
        return None if d is None else d[self.start :]


Loader = Callable[[int, int], pa.Table]  # (start, end) -> rows of the journal


class MessageStore:
    """``loader`` reads rows back from the journal: with it, bodies can be evicted."""

    def __init__(self, loader: Loader | None = None) -> None:
        self._lock = threading.Lock()
        self._firsts: list[int] = []
        self._chunks: list[Chunk] = []
        self._loader = loader
        self._rows = 0  # kept as chunks come and go: the timers read them every tick
        self._nbytes = 0
        self._end = 0  # one past the last chunk's last offset (0: none), asked at every delivery

    def add(self, messages: Messages) -> None:
        """Add messages whose offsets are sorted and above every offset already held."""
        if messages.num_rows == 0:
            return
        chunk = Chunk.of(messages)
        first, end = int(chunk.offsets[0]), int(chunk.offsets[-1]) + 1
        with self._lock:
            if self._chunks and first < self._end:
                raise ValueError("rows must be added in increasing offset order")
            self._firsts.append(first)
            self._chunks.append(chunk)
            self._rows += len(chunk.offsets)
            self._nbytes += chunk.nbytes
            self._end = end

    @property
    def end(self) -> int:
        """One past the highest offset held (0 when empty)."""
        return self._end

    def entries(self, start: int) -> Iterator[Entries]:
        """The held offsets >= ``start`` with their dispatch columns, chunk by chunk."""
        with self._lock:
            i = max(bisect.bisect_right(self._firsts, start) - 1, 0)
            chunks, firsts = self._chunks[i:], self._firsts[i:]
        for chunk, first in zip(chunks, firsts, strict=True):
            # from its start (the usual case: a subscription taking in a new commit) without
            # numpy's search: a call on a one-row chunk cost more than the rest of this
            j = 0 if start <= first else int(chunk.offsets.searchsorted(start))
            if j < len(chunk.offsets):
                yield Entries(chunk, j)

    def _locate(self, offset: int) -> tuple[Chunk, int] | None:
        with self._lock:
            i = bisect.bisect_right(self._firsts, offset) - 1
            if i < 0:
                return None
            chunk = self._chunks[i]
        j = int(np.searchsorted(chunk.offsets, offset))
        if j < len(chunk.offsets) and chunk.offsets[j] == offset:
            return chunk, j
        return None

    def props(self, offset: int) -> dict[str, Any]:
        """A held message's headers and JMS fields (what selectors read); {} if not held."""
        found = self._locate(offset)
        return found[0].props(found[1]) if found else {}

    def enqueue_time_us(self, offset: int) -> int | None:
        """When the held message at ``offset`` was appended (us since the epoch); None if it
        is not held."""
        found = self._locate(offset)
        if found is None:
            return None
        chunk, i = found
        if chunk.plain is not None and chunk.plain.plain is not None:  # (its table not built)
            return chunk.plain.plain[i].enqueue_time_us
        value = chunk.table["enqueue_time"][i].value
        return None if value is None else int(value)

    def plain(self, offsets: list[int]) -> list[PlainMessage] | None:
        """The held messages at ``offsets`` as they came, in that order, when every one came as
        a plain message (and its body is held); else None (:meth:`take` has them)."""
        out = []
        with self._lock:
            firsts, chunks = self._firsts, self._chunks
            for offset in offsets:
                i = bisect.bisect_right(firsts, offset) - 1
                held = chunks[i].plain if i >= 0 else None  # evicted chunks have none
                if held is None or (rows := held.plain) is None:
                    return None
                j = offset - firsts[i]  # a commit's plain messages have consecutive offsets
                if j >= len(rows) or rows[j].offset != offset:
                    return None
                out.append(rows[j])
        return out

    def take(self, offsets: Iterable[int]) -> pa.Table:
        """The rows of ``offsets`` (held ones), in increasing offset order."""
        if isinstance(offsets, list) and len(offsets) == 1:  # a one-message delivery
            found = self._locate(offsets[0])
            if found is not None and not found[0].evicted:
                return found[0].table.slice(found[1], 1)
        wanted = np.fromiter(offsets, dtype=np.int64)
        if len(wanted) == 0:
            raise KeyError("no offsets requested")
        if len(wanted) > 1 and not (wanted[1:] > wanted[:-1]).all():
            wanted = sorted_unique(wanted)  # deliveries come sorted; anything else is sorted here
        parts = []
        with self._lock:
            # only the chunks that can hold wanted offsets: O(log chunks + chunks touched)
            first = max(bisect.bisect_right(self._firsts, int(wanted[0])) - 1, 0)
            last = bisect.bisect_right(self._firsts, int(wanted[-1]))
            chunks = self._chunks[first:last]
        for chunk in chunks:
            offs = chunk.offsets
            lo = np.searchsorted(wanted, offs[0])
            hi = np.searchsorted(wanted, offs[-1], side="right")
            if lo == hi:
                continue
            if chunk.evicted and self._loader is not None:
                parts.append(self._reload(wanted[lo:hi], chunk.table.schema))
                continue
            idx = np.searchsorted(offs, wanted[lo:hi])
            if idx[-1] - idx[0] + 1 == len(idx):  # a run of rows: a slice, no copy
                parts.append(chunk.table.slice(int(idx[0]), len(idx)))
            else:
                parts.append(chunk.table.take(idx))
        if not parts:
            raise KeyError("none of the requested offsets is held")
        return parts[0] if len(parts) == 1 else pa.concat_tables(parts)

    def _reload(self, wanted: np.ndarray, schema: pa.Schema) -> pa.Table:
        """Rows of ``wanted`` (sorted offsets) read back from the journal, bodies included."""
        assert self._loader is not None
        rows = self._loader(int(wanted[0]), int(wanted[-1]) + 1)
        rows = rows.filter(pc.is_in(rows["offset"], value_set=pa.array(wanted)))
        return rows.select(schema.names).cast(schema)

    def evict_bodies(self, target_bytes: int) -> int:
        """Drop bodies from memory, oldest chunks first and never the newest, until at most
        ``target_bytes`` are held; returns the bytes freed. Without a loader: nothing."""
        if self._loader is None:
            return 0
        freed = 0
        with self._lock:
            held = self._nbytes
            for chunk in self._chunks[:-1]:
                if held - freed <= target_bytes:
                    break
                if chunk.evicted:
                    continue
                before = chunk.nbytes
                t = chunk.table
                i = t.schema.get_field_index("body")
                chunk.table = t.set_column(i, t.schema.field(i), pa.nulls(t.num_rows, pa.binary()))
                chunk.plain = None  # its messages held the bodies too
                chunk.evicted = True
                freed += before - chunk.nbytes
            self._nbytes -= freed
        return freed

    @property
    def evicted_rows(self) -> int:
        with self._lock:
            return sum(len(c.offsets) for c in self._chunks if c.evicted)

    def drop_below(self, offset: int) -> int:
        """Forget whole chunks entirely below ``offset``; returns how many rows went."""
        dropped = 0
        with self._lock:
            while self._chunks and self._chunks[0].offsets[-1] < offset:
                dropped += len(self._chunks[0].offsets)
                self._nbytes -= self._chunks[0].nbytes
                del self._firsts[0], self._chunks[0]
            self._rows -= dropped
            if not self._chunks:
                self._end = 0
        return dropped

    def drop_settled(
        self,
        settled: Callable[[np.ndarray], np.ndarray],
        start: int,
        upto: int,
        most_rows: int,
        most_chunks: int,
    ) -> tuple[int, int]:
        """Forget the chunks from offset ``start`` to ``upto`` (inclusive: none above it is
        settled) whose every offset ``settled`` says is settled (it answers for many offsets at
        once, a flag each: for every subscription, so a message held unacknowledged keeps its
        own chunk, not every one after it), looking at ``most_rows`` rows and ``most_chunks``
        chunks at most (one at least); returns the rows that went and where to start next time
        (0 once it looked as far as it could). ``settled`` is asked without the store's lock
        (it takes subscriptions' locks, which come first)."""
        with self._lock:
            i = max(bisect.bisect_right(self._firsts, start) - 1, 0)
            looked: list[Chunk] = []
            rows = 0
            more = False
            for chunk in itertools.islice(self._chunks, i, None):
                if chunk.offsets[-1] > upto:
                    break
                if looked and (rows + len(chunk.offsets) > most_rows or len(looked) >= most_chunks):
                    more = True
                    break
                looked.append(chunk)
                rows += len(chunk.offsets)
        if not looked:
            return 0, 0
        resume = int(looked[-1].offsets[-1]) + 1 if more else 0
        sizes = np.fromiter((len(c.offsets) for c in looked), np.int64, len(looked))
        flags = settled(np.concatenate([c.offsets for c in looked]))
        whole = np.logical_and.reduceat(flags, np.r_[0, np.cumsum(sizes)[:-1]])
        gone = {id(looked[k]) for k in np.flatnonzero(whole).tolist()}
        if not gone:
            return 0, resume
        dropped = 0
        with self._lock:
            # (only the chunks looked at are rebuilt: where they are now, the front dropped
            # meanwhile perhaps; a store of a million one-row chunks is not copied a look)
            k = bisect.bisect_left(self._firsts, int(looked[0].offsets[0]))
            end = k + len(looked)
            firsts, chunks = self._firsts[k:end], self._chunks[k:end]
            kept = [m for m, chunk in enumerate(chunks) if id(chunk) not in gone]
            for chunk in chunks:
                if id(chunk) in gone:
                    dropped += len(chunk.offsets)
                    self._nbytes -= chunk.nbytes
            self._firsts[k:end] = [firsts[m] for m in kept]
            self._chunks[k:end] = [chunks[m] for m in kept]
            self._rows -= dropped
            # (the end stays: it is the log's, which a dropped last chunk does not move)
        return dropped, resume

    @property
    def rows(self) -> int:
        return self._rows

    @property
    def nbytes(self) -> int:
        return self._nbytes
