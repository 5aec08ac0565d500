"""Kafka consumer groups' committed offsets, durable in the journal.

A commit is a message of the internal topic ``sparkmq.kafka-offsets`` (one per group, topic and
partition, its body ``{"offset": n, "metadata": "..."}`` in JSON), appended past every limit
as the broker's own: it is as durable as any acknowledged message (synced, replicated to a
pair's backup, moved to Delta), so committed offsets survive a SIGKILL and a failover. The
latest commit of each group, topic and partition is kept in memory, read back from the topic
at first use after a start (the last one wins). Deleting a group's offsets appends tombstones
(offset -1).

The topic grows by one message per commit; a compaction of the log (keeping each key's last
commit) is future work, see the README.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass

import pyarrow as pa

from spark_mq.broker.registry import Destinations
from spark_mq.journal import Journal
from spark_mq.names import KAFKA_OFFSETS
from spark_mq.schema import HEADERS

OFFSETS_TOPIC = KAFKA_OFFSETS
_ROWS = pa.schema([pa.field("body", pa.binary()), pa.field("headers", HEADERS)])


@dataclass(frozen=True, slots=True)
class Committed:
    offset: int
    metadata: str | None


Key = tuple[str, int]  # a topic and a partition


class GroupOffsets:
    def __init__(
        self,
        destinations: Destinations,
        journal: Journal,
        store: Callable[[str, pa.Table], Future],
        create: Callable[[str], object],
    ) -> None:
        self.destinations = destinations
        self.journal = journal
        self._store = store  # (Producing.store_checked: the broker's own, past every limit)
        self._create = create
        self._lock = threading.Lock()
        self._groups: dict[str, dict[Key, Committed]] | None = None  # loaded at first use

    def commit(self, group: str, entries: list[tuple[str, int, int, str | None]]) -> Future:
        """Commit ``(topic, partition, offset, metadata)`` for ``group``: the future resolves
        once durable (and the offsets are what :meth:`fetch` answers from then on)."""
        groups = self._loaded()
        rows = pa.table(
            [
                pa.array(
                    [json.dumps({"offset": o, "metadata": m}).encode() for _, _, o, m in entries],
                    pa.binary(),
                ),
                pa.array(
                    [
                        [("group", group), ("topic", t), ("partition", str(p))]
                        for t, p, _, _ in entries
                    ],
                    HEADERS,
                ),
            ],
            schema=_ROWS,
        )
        stored = self._store(OFFSETS_TOPIC, rows)
        out: Future = Future()

        def durable(f: Future) -> None:
            exc = f.exception()
            if exc is not None:
                out.set_exception(exc)
                return
            with self._lock:
                mine = groups.setdefault(group, {})
                for topic, partition, offset, metadata in entries:
                    if offset < 0:
                        mine.pop((topic, partition), None)
                    else:
                        mine[(topic, partition)] = Committed(offset, metadata)
                if not mine:
                    groups.pop(group, None)
            out.set_result(None)

        stored.add_done_callback(durable)
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

    def _loaded(self) -> dict[str, dict[Key, Committed]]:
        with self._lock:
            if self._groups is not None:
                return self._groups
        groups: dict[str, dict[Key, Committed]] = {}
        if not self.destinations.has(OFFSETS_TOPIC):
            self._create(OFFSETS_TOPIC)
        else:
            rows = self.journal.read_messages(OFFSETS_TOPIC, 0, None)
            for body, headers in zip(
                rows["body"].to_pylist(), rows["headers"].to_pylist(), strict=True
            ):
                h = dict(headers or [])
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
        with self._lock:
            if self._groups is None:
                self._groups = groups
            return self._groups
