"""Who owns a data root's destinations: an epoch that only grows, kept in the Delta log itself.

The record is a Delta table, ``<root>/_ownership``, one row per takeover (epoch, broker id,
host, pid, time), each commit carrying the Delta app transaction ``(sparkmq.owner, epoch)``.
Taking ownership reads the latest epoch and commits the next one; Delta's commit is a
put-if-absent of the next log version (an atomic rename on local disks, a conditional put on
object stores: what delta-rs relies on for every commit), so of two brokers taking the same
epoch one commits and the other gets a conflict. No consensus of our own, no extra service.

The epoch then *fences* every table the owner writes: each of its commits carries
``(sparkmq.owner, epoch)`` as well (see :meth:`DeltaStore.fence`), and a commit is refused
(:class:`~spark_mq.errors.Deposed`) once the table holds a greater one. delta-rs makes the
race safe: two commits carrying the same app id conflict, so a deposed owner whose commit was
prepared before the new owner's fence commit fails, re-reads, and finds the greater epoch. A
new owner fences each destination's tables before it reads their state, so nothing the old one
might still commit lands after the new one has looked.
"""

from __future__ import annotations

import os
import socket
import time
from dataclasses import dataclass

import pyarrow as pa
from deltalake import CommitProperties, DeltaTable, Transaction, write_deltalake
from deltalake.exceptions import CommitFailedError, TableNotFoundError

from spark_mq.errors import Deposed
from spark_mq.journal import layout
from spark_mq.journal.layout import OWNER_APP_ID

OWNERSHIP_SCHEMA = pa.schema(
    [
        ("epoch", pa.int64()),
        ("broker_id", pa.string()),
        ("host", pa.string()),
        ("pid", pa.int64()),
        ("since_ms", pa.int64()),
    ]
)


@dataclass(frozen=True)
class Owner:
    epoch: int
    broker_id: str
    host: str
    pid: int
    since_ms: int

    def describe(self) -> str:
        since = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(self.since_ms / 1000))
        return (
            f"broker {self.broker_id} (pid {self.pid} on {self.host}, epoch {self.epoch}, "
            f"since {since})"
        )


def ownership_uri(root: str) -> str:
    return layout.join(root, "_ownership")


class Ownership:
    """The ownership record of one data root."""

    def __init__(self, root: str, storage_options: dict[str, str] | None = None) -> None:
        self.uri = ownership_uri(layout.normalize_root(root))
        self._opts = storage_options or None

    def _table(self) -> DeltaTable | None:
        try:
            return DeltaTable(self.uri, storage_options=self._opts)
        except TableNotFoundError:
            return None

    def current(self) -> Owner | None:
        """The latest owner, or None if nobody ever took the root."""
        dt = self._table()
        if dt is None:
            return None
        epoch = dt.transaction_version(OWNER_APP_ID) or 0
        if not epoch:
            return None
        rows = dt.to_pyarrow_table().to_pylist()
        row = max(rows, key=lambda r: r["epoch"])
        return Owner(**row)

    def epoch(self) -> int:
        dt = self._table()
        return (dt.transaction_version(OWNER_APP_ID) or 0) if dt is not None else 0

    def take(self, broker_id: str) -> Owner:
        """Become the owner with the next epoch. ``Deposed`` if another broker took it at the
        same moment (its commit won)."""
        dt = self._table()
        if dt is None:
            dt = DeltaTable.create(
                self.uri, OWNERSHIP_SCHEMA, mode="ignore", storage_options=self._opts
            )
        epoch = (dt.transaction_version(OWNER_APP_ID) or 0) + 1
        me = Owner(epoch, broker_id, socket.gethostname(), os.getpid(), int(time.time() * 1000))
        row = pa.Table.from_pylist([me.__dict__], schema=OWNERSHIP_SCHEMA)
        try:
            write_deltalake(
                dt,
                row,
                mode="append",
                commit_properties=CommitProperties(
                    app_transactions=[Transaction(OWNER_APP_ID, epoch)]
                ),
            )
        except CommitFailedError:
            winner = self.current()
            raise Deposed(
                f"another broker took ownership of the data root at the same moment: "
                f"{winner.describe() if winner else 'unknown'}",
                epoch=epoch - 1,
            ) from None
        return me
