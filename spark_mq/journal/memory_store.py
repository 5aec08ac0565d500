"""The in-memory store: the seeds' "persistence disabled" mode. Nothing survives a restart."""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence

import pyarrow as pa
import pyarrow.compute as pc

from spark_mq.journal.settlements import Collapse
from spark_mq.schema import (
    BINDING_SCHEMA,
    MESSAGE_SCHEMA,
    SETTLEMENT_SCHEMA,
    TRANSACTION_SCHEMA,
    message_columns,
)


class _Logs:
    def __init__(self) -> None:
        self.messages: list[pa.Table] = []
        self.settlements: list[pa.Table] = []
        self.end = 0
        self.settlements_version = 0
        self.producers: str | None = None


class MemoryStore:
    durable = False

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._bindings: list[pa.Table] = []
        self._transactions: list[pa.Table] = []
        self._logs: dict[str, _Logs] = {}
        self.on_log_commit: Callable[[str, int], None] | None = None

    def read_bindings(self) -> pa.Table:
        with self._lock:
            return pa.concat_tables([BINDING_SCHEMA.empty_table(), *self._bindings])

    def append_bindings(self, rows: pa.Table) -> None:
        with self._lock:
            self._bindings.append(rows)

    def read_transactions(self) -> pa.Table:
        with self._lock:
            return pa.concat_tables([TRANSACTION_SCHEMA.empty_table(), *self._transactions])

    def append_transactions(self, rows: pa.Table) -> None:
        with self._lock:
            self._transactions.append(rows)

    def create_logs(self, destination: str) -> None:
        with self._lock:
            self._logs.setdefault(destination, _Logs())

    def drop_logs(self, destination: str) -> None:
        with self._lock:
            self._logs.pop(destination, None)

    def _get(self, destination: str) -> _Logs:
        with self._lock:
            return self._logs.setdefault(destination, _Logs())

    def committed_end(self, destination: str) -> int:
        return self._get(destination).end

    def commit_messages(
        self, destination: str, rows: pa.Table, end_offset: int, producers: str | None = None
    ) -> None:
        logs = self._get(destination)
        with self._lock:
            if logs.end >= end_offset:
                return
            logs.messages.append(rows)
            logs.end = end_offset
            if producers is not None:
                logs.producers = producers
        if self.on_log_commit is not None:
            self.on_log_commit(destination, rows.num_rows)

    def settlements_version(self, destination: str) -> int:
        return self._get(destination).settlements_version

    def commit_settlements(
        self, destination: str, rows: pa.Table, version: int | None = None
    ) -> None:
        logs = self._get(destination)
        with self._lock:
            if version is not None:
                if logs.settlements_version >= version:
                    return
                logs.settlements_version = version
            logs.settlements.append(rows)
        if self.on_log_commit is not None:
            self.on_log_commit(destination, rows.num_rows)

    def read_messages(
        self,
        destination: str,
        start: int,
        end: int | None,
        columns: Sequence[str] | None = None,
    ) -> pa.Table:
        logs = self._get(destination)
        with self._lock:
            table = pa.concat_tables([MESSAGE_SCHEMA.empty_table(), *logs.messages])
        mask = pc.greater_equal(table["offset"], pa.scalar(start))
        if end is not None:
            mask = pc.and_(mask, pc.less(table["offset"], pa.scalar(end)))
        return table.filter(mask).select(message_columns(columns).names)

    def collapse_settlements(self, destination: str, collapse: Collapse, now_us: int) -> int:
        logs = self._get(destination)
        written = collapse.rows(now_us, "settled below; collapsed by its owner")
        with self._lock:
            rows = pa.concat_tables([SETTLEMENT_SCHEMA.empty_table(), *logs.settlements])
            kept = collapse.apply(rows)
            logs.settlements = [kept, written]
        return rows.num_rows - kept.num_rows

    def merge_message_files(self, destination: str, at_least: int) -> int:
        return 0  # (nothing to merge in memory)

    def read_settlements(self, destination: str) -> pa.Table:
        logs = self._get(destination)
        with self._lock:
            return pa.concat_tables([SETTLEMENT_SCHEMA.empty_table(), *logs.settlements])

    def fence_destination(self, destination: str, epoch: int) -> None:
        pass  # (one process: nobody else commits)

    def release_destination(self, destination: str) -> None:
        pass

    def hand_on_producers(self, destination: str, state: str) -> None:
        self._get(destination).producers = state

    def handed_producers(self, destination: str) -> str | None:
        return self._get(destination).producers

    def close(self) -> None:
        pass
