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
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace

import pyarrow as pa
from deltalake import CommitProperties, DeltaTable, Transaction, write_deltalake
from deltalake.exceptions import CommitFailedError, TableNotFoundError

from spark_mq.errors import Deposed
from spark_mq.journal import layout
from spark_mq.journal.layout import OWNER_APP_ID
from spark_mq.schema import schema_of

OWNERSHIP_SCHEMA = schema_of(
    pa.field("epoch", pa.int64()),
    pa.field("broker_id", pa.string()),
    pa.field("host", pa.string()),
    pa.field("pid", pa.int64()),
    pa.field("since_ms", pa.int64()),
    # replication: the backup that has every record the owner acknowledged ("" = none);
    # only it may take over from this owner (spark_mq.ha.replication)
    pa.field("in_sync_backup", pa.string()),
    pa.field("n", pa.int64()),  # the row's place in the record (the latest has the greatest)
)


@dataclass(frozen=True)
class Owner:
    epoch: int
    broker_id: str
    host: str
    pid: int
    since_ms: int
    in_sync_backup: str = ""
    n: int = 0

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
        return _latest(dt)

    def epoch(self) -> int:
        dt = self._table()
        return (dt.transaction_version(OWNER_APP_ID) or 0) if dt is not None else 0

    def take(
        self, broker_id: str, may: Callable[[Owner | None], str | None] | None = None
    ) -> Owner:
        """Become the owner with the next epoch. ``may``, given the latest owner of the very
        snapshot the commit is made from, returns why this broker may not (``NotEligible``);
        ``Deposed`` if another broker took it, or changed the record, at the same moment."""
        dt = self._table()
        if dt is None:
            dt = DeltaTable.create(
                self.uri, OWNERSHIP_SCHEMA, mode="ignore", storage_options=self._opts
            )
        latest = _latest(dt)
        if may is not None and (why := may(latest)) is not None:
            raise NotEligible(why)
        epoch = (dt.transaction_version(OWNER_APP_ID) or 0) + 1
        me = Owner(
            epoch,
            broker_id,
            socket.gethostname(),
            os.getpid(),
            int(time.time() * 1000),
            "",
            (latest.n + 1) if latest else 1,
        )
        try:
            self._append(dt, me)
        except CommitFailedError:
            winner = self.current()
            raise Deposed(
                f"another broker took ownership of the data root at the same moment: "
                f"{winner.describe() if winner else 'unknown'}",
                epoch=epoch - 1,
            ) from None
        return me

    def mark_in_sync(self, owner: Owner, backup: str) -> Owner:
        """The owner records which backup has everything it acknowledged ("" = none, before it
        acknowledges anything alone). ``Deposed`` if a broker with a greater epoch took over."""
        for _ in range(5):
            dt = self._table()
            assert dt is not None
            newer = dt.transaction_version(OWNER_APP_ID) or 0
            if newer > owner.epoch:
                raise Deposed(
                    f"another broker owns the data root now (epoch {newer}; this broker's is "
                    f"{owner.epoch})",
                    epoch=owner.epoch,
                    owner_epoch=newer,
                )
            latest = _latest(dt)
            row = replace(
                owner,
                in_sync_backup=backup,
                since_ms=int(time.time() * 1000),
                n=(latest.n + 1) if latest else 1,
            )
            try:
                self._append(dt, row)
                return row
            except CommitFailedError:
                continue  # re-read: a takeover, or our own concurrent mark
        raise Deposed("the ownership record kept changing under this broker", epoch=owner.epoch)

    def _append(self, dt: DeltaTable, row: Owner) -> None:
        write_deltalake(
            dt,
            pa.Table.from_pylist([asdict(row)], schema=OWNERSHIP_SCHEMA),
            mode="append",
            schema_mode="merge",
            commit_properties=CommitProperties(
                app_transactions=[Transaction(OWNER_APP_ID, row.epoch)]
            ),
        )


class NotEligible(Exception):
    """This broker may not take over (a backup not in sync with the last owner); says why."""


def _latest(dt: DeltaTable) -> Owner | None:
    if not (dt.transaction_version(OWNER_APP_ID) or 0):
        return None
    rows = dt.to_pyarrow_table().to_pylist()
    if not rows:
        return None
    row = max(rows, key=lambda r: (r["epoch"], r.get("n") or 0))
    return Owner(
        int(row["epoch"]),
        str(row["broker_id"]),
        str(row["host"]),
        int(row["pid"]),
        int(row["since_ms"]),
        row.get("in_sync_backup") or "",
        int(row.get("n") or 0),
    )
