"""Kafka consumer groups' committed offsets, durable in the journal.

A commit is a message of the internal topic ``sparkmq.kafka-offsets`` (one per group, topic and
partition, its body ``{"offset": n, "metadata": "..."}`` in JSON), appended past every limit
as the broker's own: it is as durable as any acknowledged message (synced, replicated to a
pair's backup, moved to Delta), so committed offsets survive a SIGKILL and a failover. The
latest commit of each group, topic and partition is kept in memory, read back from the topic
at first use after a start (the last one wins). Deleting a group's offsets appends tombstones
(offset -1).

A cluster's group coordinator also keeps each group's membership there (a message with a
``membership`` header, its body the group as it last became stable: generation, leader,
protocol, members and their assignments; ``{}`` once it is empty), so the member that
coordinates the groups after the topic moved carries on with them: their members keep their ids
and generation, and nothing is rebalanced (Kafka's ``__consumer_offsets`` keeps group metadata
so). ``term`` grows each time the topic is let go, so the coordinator knows to read them again.

The topic grows by one message per commit, and is kept as a Kafka broker keeps its offsets:
it has a retention (``broker.kafka_retention_s``, a week), so the compaction job drops commits
older than that, and the latest commit of every group, topic and partition is appended again
(a *refresh*) at each start and every :data:`REFRESH_S`, so what is still committed is never
that old. A group that stays empty past the retention with no broker restart in between loses
nothing either: the refresh carries it along; only deleted groups' rows go (as Kafka's
``offsets.retention.minutes`` removes the offsets of groups gone for a week).
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from typing import TypeVar

import pyarrow as pa

from spark_mq.broker.registry import Destinations
from spark_mq.journal import Journal
from spark_mq.names import KAFKA_OFFSETS
from spark_mq.schema import HEADERS

OFFSETS_TOPIC = KAFKA_OFFSETS
REFRESH_S = 24 * 3600.0  # the live commits are appended again this often (and at each start)
_ROWS = pa.schema([pa.field("body", pa.binary()), pa.field("headers", HEADERS)])


@dataclass(frozen=True, slots=True)
class Committed:
    offset: int
    metadata: str | None


Key = tuple[str, int]  # a topic and a partition
T = TypeVar("T")


class GroupOffsets:
    def __init__(
        self,
        destinations: Destinations,
        journal: Journal,
        store: Callable[[str, pa.Table], Future],
        retained: Callable[[str], object],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.destinations = destinations
        self.journal = journal
        self._store = store  # (Producing.store_checked: the broker's own, past every limit)
        self._retained = retained  # (creates the topic, or sets its retention, as it must be)
        self._clock = clock
        self._lock = threading.Lock()
        self._groups: dict[str, dict[Key, Committed]] | None = None  # loaded at first use
        self._members: dict[str, dict[str, object]] = {}  # groups' memberships (loaded with)
        self.term = 0  # grows each time the topic is let go here (forget)
        self._refreshed = 0.0  # (clock) when the live commits were last appended again
        self._in_flight = 0  # commits appended, not yet durable

    def commit(self, group: str, entries: list[tuple[str, int, int, str | None]]) -> Future:
        """Commit ``(topic, partition, offset, metadata)`` for ``group``: the future resolves
        once durable (and the offsets are what :meth:`fetch` answers from then on)."""
        groups = self._loaded()
        with self._lock:  # (appended in the order refreshes see: see refresh)
            self._in_flight += 1
            stored = self._store(OFFSETS_TOPIC, _rows([(group, *e) for e in entries]))
        out: Future = Future()

        def durable(f: Future) -> None:
            exc = f.exception()
            if exc is not None:
                with self._lock:
                    self._in_flight -= 1
                out.set_exception(exc)
                return
            with self._lock:
                self._in_flight -= 1
                _apply(groups, group, entries)
            out.set_result(None)

        stored.add_done_callback(durable)
        return out

    def commit_with(
        self,
        entries: dict[str, list[tuple[str, int, int, str | None]]],
        commit: Callable[[pa.Table | None], T],
    ) -> T:
        """Commit groups' offsets (``group -> [(topic, partition, offset, metadata)]``) inside
        a transaction of the caller's: ``commit(rows)`` commits the offsets topic's ``rows``
        (a ``destination`` column and its produce columns; None: no offsets) with the rest,
        all or nothing (a Kafka transaction's TxnOffsetCommit, with its records). Once it
        returns, the offsets are what :meth:`fetch` answers."""
        if not any(entries.values()):
            return commit(None)
        groups = self._loaded()
        flat = [(g, *e) for g, es in entries.items() for e in es]
        rows = _rows(flat)
        rows = rows.append_column("destination", pa.array([OFFSETS_TOPIC] * len(flat)))
        with self._lock:  # (a refresh meanwhile waits for the next turn: see refresh)
            self._in_flight += 1
        try:
            out = commit(rows)
        finally:
            with self._lock:
                self._in_flight -= 1
        with self._lock:
            for group, es in entries.items():
                _apply(groups, group, es)
        return out

    def fetch(self, group: str) -> dict[Key, Committed]:
        """``group``'s committed offsets (a copy)."""
        groups = self._loaded()
        with self._lock:
            return dict(groups.get(group, {}))

    def groups(self) -> list[str]:
        """The groups with committed offsets."""
        groups = self._loaded()
        with self._lock:
            return sorted(groups)

    def keep_membership(self, group: str, membership: dict[str, object] | None) -> Future:
        """Keep ``group``'s membership as it became stable (None: it is empty now); durable
        when the future resolves."""
        self._loaded()
        doc = membership or {}
        with self._lock:
            self._in_flight += 1
            stored = self._store(OFFSETS_TOPIC, _membership_rows([(group, doc)]))
        out: Future = Future()

        def durable(f: Future) -> None:
            exc = f.exception()
            with self._lock:
                self._in_flight -= 1
                if exc is None and doc:
                    self._members[group] = doc
                elif exc is None:
                    self._members.pop(group, None)
            if exc is not None:
                out.set_exception(exc)
            else:
                out.set_result(None)

        stored.add_done_callback(durable)
        return out

    def memberships(self) -> tuple[int, dict[str, dict[str, object]]]:
        """The term, and every group's membership as kept (read from the topic at first use)."""
        term = self.term  # (before reading: a forget meanwhile makes the caller read again)
        self._loaded()
        with self._lock:
            return term, dict(self._members)

    def _loaded(self) -> dict[str, dict[Key, Committed]]:
        with self._lock:
            if self._groups is not None:
                return self._groups
        groups: dict[str, dict[Key, Committed]] = {}
        members: dict[str, dict[str, object]] = {}
        # (a cluster member: NotOwner unless it serves the topic, which it may have just made)
        existed = self.destinations.has(OFFSETS_TOPIC) or self.destinations.elsewhere is not None
        self._retained(OFFSETS_TOPIC)
        if existed:
            rows = self.journal.read_messages(OFFSETS_TOPIC, 0, None)
            for body, headers in zip(
                rows["body"].to_pylist(), rows["headers"].to_pylist(), strict=True
            ):
                h = dict(headers or [])
                if h.get("membership") and h.get("group"):  # (a group's membership)
                    try:
                        members[h["group"]] = json.loads(body or b"")
                    except ValueError:
                        continue
                    continue
                try:
                    value = json.loads(body or b"")
                    key = (h["topic"], int(h["partition"]))
                    group = h["group"]
                except (KeyError, ValueError, TypeError):
                    continue  # (not a commit: someone else's message; skipped)
                mine = groups.setdefault(group, {})
                if value["offset"] < 0:
                    mine.pop(key, None)
                else:
                    mine[key] = Committed(int(value["offset"]), value.get("metadata"))
            groups = {g: m for g, m in groups.items() if m}
            members = {g: m for g, m in members.items() if isinstance(m, dict) and m}
        with self._lock:
            if self._groups is not None:
                return self._groups
            self._groups = groups
            self._members = members
        self.refresh()
        return groups

    def forget(self) -> None:
        """(A cluster member letting the offsets topic go.) What was loaded is dropped: read
        again from the topic if it is served here again (others committed meanwhile)."""
        with self._lock:
            self._groups = None
            self._members = {}
            self.term += 1

    def refresh(self) -> Future | None:
        """Append the latest commit of every group, topic and partition again (what is
        committed is then as young as now: the retention never takes it). Durable when the
        future resolves; None if there was nothing to append, or a commit was still on its way
        (its row is in the log before the refresh's would be, with a newer offset than the
        refresh knows: it waits for the next turn of the timers)."""
        with self._lock:
            if self._in_flight:
                return None
            self._refreshed = self._clock()
            live = [
                (g, t, p, c.offset, c.metadata)
                for g, mine in (self._groups or {}).items()
                for (t, p), c in mine.items()
            ]
            if not live and not self._members:
                return None
            # (memberships too: the retention never takes them either)
            rows = pa.concat_tables([_rows(live), _membership_rows(list(self._members.items()))])
            return self._store(OFFSETS_TOPIC, rows)

    def refresh_due(self) -> None:
        """(The broker's timers.) A refresh, when one is due and the offsets are in use."""
        with self._lock:
            due = self._groups is not None and self._clock() - self._refreshed >= REFRESH_S
        if due:
            self.refresh()


def _apply(
    groups: dict[str, dict[Key, Committed]],
    group: str,
    entries: list[tuple[str, int, int, str | None]],
) -> None:
    """Durable commits of ``group`` made what it has committed (offset -1: deleted)."""
    mine = groups.setdefault(group, {})
    for topic, partition, offset, metadata in entries:
        if offset < 0:
            mine.pop((topic, partition), None)
        else:
            mine[(topic, partition)] = Committed(offset, metadata)
    if not mine:
        groups.pop(group, None)


def _rows(entries: list[tuple[str, str, int, int, str | None]]) -> pa.Table:
    """Commits ``(group, topic, partition, offset, metadata)`` as the topic's messages."""
    return pa.table(
        [
            pa.array(
                [json.dumps({"offset": o, "metadata": m}).encode() for _, _, _, o, m in entries],
                pa.binary(),
            ),
            pa.array(
                [[("group", g), ("topic", t), ("partition", str(p))] for g, t, p, _, _ in entries],
                HEADERS,
            ),
        ],
        schema=_ROWS,
    )


def _membership_rows(kept: list[tuple[str, dict[str, object]]]) -> pa.Table:
    """Groups' memberships ``(group, membership)`` (``{}``: empty now) as the topic's messages."""
    return pa.table(
        [
            pa.array([json.dumps(d, sort_keys=True).encode() for _, d in kept], pa.binary()),
            pa.array([[("group", g), ("membership", "1")] for g, _ in kept], HEADERS),
        ],
        schema=_ROWS,
    )
