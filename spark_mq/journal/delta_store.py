"""The Delta store: every log is a Delta table written with delta-rs (the ``deltalake`` package).

One writer per table (the journal guarantees it); message-log commits carry an app transaction
``(sparkmq.messages, end_offset)`` so a retried commit is recognised — delta-rs does not enforce
app-transaction versions itself, so :meth:`commit_messages` checks ``transaction_version`` first.
Tables are created with ``delta.checkpointInterval`` so reading the log stays cheap.
Settlement-log commits made by the hot tier's mover carry ``(sparkmq.settlements, lsn)`` the same
way. Every ``deltalake`` / OS error is translated to :class:`JournalError` (``boundary.translate``).
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TypeVar

import pyarrow as pa
import pyarrow.dataset as pds
from deltalake import (
    ColumnProperties,
    CommitProperties,
    DeltaTable,
    Transaction,
    WriterProperties,
    write_deltalake,
)
from deltalake.exceptions import CommitFailedError, DeltaError, TableNotFoundError
from deltalake.fs import DeltaStorageHandler

from spark_mq.errors import Deposed
from spark_mq.journal import layout
from spark_mq.journal.boundary import translate
from spark_mq.journal.layout import OWNER_APP_ID
from spark_mq.journal.settlements import Collapse
from spark_mq.schema import (
    BINDING_SCHEMA,
    MESSAGE_SCHEMA,
    SETTLEMENT_SCHEMA,
    TRANSACTION_SCHEMA,
    by_offset,
    conform,
    finished_transactions,
    ints,
    message_columns,
)

log = logging.getLogger(__name__)

T = TypeVar("T")

COMMIT_ATTEMPTS = 5  # per append, each after reloading the table's latest version
# A DeltaTable object appended to again and again holds more memory with every commit and
# commits more slowly (delta-rs 1.x): 2,000 appends of 1,000 rows through one object took the
# process from 226 to 445 MiB and 273 s, against 297 MiB and 59 s with the object opened anew
# every 50 (measured here). So a cached table is dropped after this many commits through it,
# and opened again at its next use (a few milliseconds, from its last checkpoint).
REOPEN_AFTER_COMMITS = 50
# the bindings and transaction logs take a small file a commit, and are read whole at every
# start and by a cluster member at every takeover: with 200 destinations a read of the bindings
# took 220-260 ms (200 files), and grew with them. Each time one reaches a multiple of this many
# versions it is compacted into one file and checkpointed: 9-15 ms after (measured).
COMPACT_SMALL_LOGS_EVERY = 50
# ... and they keep no history: the commit files before that checkpoint are removed then, once
# a second old (a reader that listed the log that long ago and reads on finds them gone), and
# the data files compaction replaced once a minute old (vacuumed). Their readers read the newest
# version only, and a writer holding an older one reloads it from the checkpoint. Kept for the
# week Delta keeps by default, every commit listed them all (a local file system's listing is
# not from an offset): a commit of the transaction log took 18 ms after 100 transactions and
# 49 ms after 800, growing by 4 ms every 100 (measured).
SMALL_LOG_PROPERTIES = {
    "delta.logRetentionDuration": "interval 1 seconds",
    "delta.deletedFileRetentionDuration": "interval 1 minutes",
}
# A message's body is opaque: min/max statistics of it skip nothing (readers select by offset)
# and took a fifth of a move's time (130,000 random 1 KiB bodies: 194-231 ms against 224-311,
# four runs each; 72-87 against 82-93 for one body repeated). Snappy, as without properties.
# Row groups of 8,192 rows: a reader of a window of the log (a Kafka fetch reads 8,192 rows at
# a time) decodes only the groups holding it, which the offsets' statistics tell; a move's file
# was one row group, decoded whole for every window in it (16-222 ms a window of a 50,000-row
# file, 4-15 ms now; a group member reading a moved backlog 100-115k -> 276-293k msg/s).
# files a message log's merge (merge_message_files) makes and takes: Databricks' auto compaction's
# 128 MiB
MERGED_FILE_BYTES = 128 * 1024 * 1024
DEFAULT_WRITER = WriterProperties()  # (what delta-rs uses when given none)
MESSAGE_WRITER = WriterProperties(
    compression="SNAPPY",
    column_properties={"body": ColumnProperties(statistics_enabled="NONE")},
    max_row_group_size=8192,
)

# a message log's commit info key holding the producer state (spark_mq.broker.producer_state)
# its owner handed on (letting it go, or with its commits at most every second:
# spark_mq.journal.sinks.ProducerStateCarrier; compaction carries it past the rows it removes),
# and how many of the log's newest commits are looked through for it (a hand-over's is followed
# by the next owner's fence; an older state is of no use once more rows follow it than a member
# taking the log on reads back: registry.REPLAY_ROWS)
PRODUCERS_KEY = "sparkmq.producers"
PRODUCERS_WITHIN = 20


def newest_producer_state(messages: DeltaTable) -> str | None:
    """The newest producer state (:mod:`spark_mq.broker.producer_state`) among the commit
    info of a message log's last ``PRODUCERS_WITHIN`` commits (None: none there)."""
    for commit in messages.history(PRODUCERS_WITHIN):
        state = commit.get(PRODUCERS_KEY)
        if isinstance(state, str):
            return state
    return None


def _append(
    dt: DeltaTable,
    rows: pa.Table,
    app_id: str | None,
    version: int | None,
    writer: WriterProperties | None = None,
    epoch: int | None = None,
    destination: str | None = None,
    metadata: dict[str, str] | None = None,
) -> None:
    """Append idempotently, reloading the table when another writer's commit got in first.

    Our appends are blind, but delta-rs checks them against the snapshot the table object holds:
    once compaction (another process) has deleted rows, every append from the stale snapshot
    fails with "a concurrent transaction deleted data this operation read" until it reloads.
    """
    txns = []
    if app_id is not None and version is not None:
        txns.append(Transaction(app_id, version))
    if epoch is not None:  # fenced: see spark_mq.ha.ownership
        txns.append(Transaction(OWNER_APP_ID, epoch))
    props = (
        CommitProperties(app_transactions=txns or None, custom_metadata=metadata)
        if txns or metadata
        else None
    )
    for attempt in range(COMMIT_ATTEMPTS):
        if epoch is not None:
            _check_owner(dt, epoch, destination)
        if (
            app_id is not None
            and version is not None
            and (dt.transaction_version(app_id) or 0) >= version
        ):
            return  # a retry of a commit that already landed
        try:
            # merge: a table written by an older version gains the columns added since
            write_deltalake(
                dt,
                rows,
                mode="append",
                commit_properties=props,
                schema_mode="merge",
                writer_properties=writer or DEFAULT_WRITER,
            )
            return
        except CommitFailedError:
            if attempt == COMMIT_ATTEMPTS - 1:
                raise
            dt.update_incremental()
        except DeltaError as exc:  # (its version's commit file gone: a small log cleaned up)
            if "Invalid table version" not in str(exc) or attempt == COMMIT_ATTEMPTS - 1:
                raise
            dt.update_incremental()


def _check_owner(dt: DeltaTable, epoch: int, destination: str | None = None) -> None:
    """``Deposed`` if a broker with a greater epoch has committed to ``dt`` (a table of
    ``destination``'s, when a cluster fences each destination with its own epoch)."""
    newer = dt.transaction_version(OWNER_APP_ID) or 0
    if newer > epoch:
        if destination is not None:
            raise Deposed(
                f"another cluster member owns {destination!r} now (epoch {newer}; this "
                f"member's is {epoch}): this member commits nothing more to it",
                epoch=epoch,
                owner_epoch=newer,
                destination=destination,
            )
        raise Deposed(
            f"another broker owns this data root now (epoch {newer}; this broker's is {epoch}): "
            "this broker commits nothing more",
            epoch=epoch,
            owner_epoch=newer,
        )


@dataclass(eq=False, slots=True)
class _Queued:
    """Rows for the transaction log, and how their write went (``written`` once tried)."""

    rows: pa.Table
    written: bool = False
    error: BaseException | None = None


class DeltaStore:
    durable = True

    @property
    def storage_options(self) -> dict[str, str] | None:
        return self._opts

    def __init__(
        self,
        root: str,
        *,
        checkpoint_interval: int = 100,
        storage_options: dict[str, str] | None = None,
    ) -> None:
        self._opts = storage_options or layout.storage_options(root) or None
        self.root = layout.with_options(root, self._opts)
        self._config = {"delta.checkpointInterval": str(checkpoint_interval)}
        self._tables: dict[str, DeltaTable] = {}
        self._commits: dict[str, int] = {}  # per cached table: commits made through it
        # readers' own snapshots of message logs (never the table appended through: another
        # thread's), brought up to date when a read asks past them: see read_messages
        self._readers: dict[str, _Reader] = {}
        self._lock = threading.Lock()
        self._bindings_lock = threading.Lock()
        self._txn_queue_lock = threading.Lock()
        self._txn_queue: list[_Queued] = []  # transaction log rows waiting for a writer
        self.epoch: int | None = None  # the ownership epoch every commit carries (None: unfenced)
        # a cluster member's: each destination it owns fenced with its own epoch (see
        # fence_destination); the root's epoch for the others
        self._epochs: dict[str, int] = {}
        # told (once per refusal, from the committing thread) when a commit finds a newer owner
        self.on_deposed: Callable[[Deposed], None] | None = None
        # told (from the committing thread) of each commit to a message or settlement log: its
        # destination and rows
        self.on_log_commit: Callable[[str, int], None] | None = None
        self._fenced: set[str] = set()  # tables this epoch has been stamped on

    # -- fencing (spark_mq.ha.ownership) -----------------------------------------------------
    def fence(self, epoch: int) -> None:
        """From now on every commit carries ``epoch`` and is refused (``Deposed``) once a table
        holds a greater one. Each table is stamped with it (an empty commit) before this store
        first reads or writes it, so nothing a deposed owner might still commit lands after."""
        with self._lock:
            self.epoch = epoch
            self._fenced.clear()
            self._tables.clear()
            self._commits.clear()
            self._readers.clear()
        self._stamp(layout.bindings_uri(self.root), BINDING_SCHEMA, epoch)
        self._stamp(layout.transactions_uri(self.root), TRANSACTION_SCHEMA, epoch)

    def fence_destination(self, destination: str, epoch: int) -> None:
        """A cluster member takes ``destination`` over with ``epoch`` (its assignment's): its
        tables are stamped with it now, before anything of it is read, and every later commit
        to them carries it. ``Deposed`` when a table already holds a greater one (a newer owner
        was assigned since)."""
        uris = [
            (layout.messages_uri(self.root, destination), MESSAGE_SCHEMA),
            (layout.settlements_uri(self.root, destination), SETTLEMENT_SCHEMA),
        ]
        with self._lock:
            self._epochs[destination] = epoch
            for uri, _ in uris:
                self._fenced.discard(uri)
                self._tables.pop(uri, None)
                self._commits.pop(uri, None)
                self._readers.pop(uri, None)
        # both at once: each reads its log and commits (40-90 ms each under a move's load)
        with ThreadPoolExecutor(len(uris), thread_name_prefix="fence") as pool:
            stamps = [pool.submit(self._stamp, u, s, epoch, destination) for u, s in uris]
        for stamp in stamps:
            stamp.result()  # (Deposed, when a table holds a greater epoch)

    def release_destination(self, destination: str) -> None:
        """This member no longer owns ``destination``: its epoch and cached tables go."""
        uri = layout.destination_uri(self.root, destination)
        with self._lock:
            self._epochs.pop(destination, None)
            for cache in (self._tables, self._commits, self._readers):
                for key in [k for k in cache if k.startswith(uri + "/")]:
                    del cache[key]
            self._fenced.difference_update([k for k in self._fenced if k.startswith(uri + "/")])

    def hand_on_producers(self, destination: str, state: str) -> None:
        """The producer state, in the commit info of a commit of no rows to the message log
        (fenced with this member's epoch: a member deposed meanwhile writes nothing)."""
        with translate("handing the producer state on", destination):
            self._append(
                self._messages(destination),
                MESSAGE_SCHEMA.empty_table(),
                None,
                None,
                epoch=self._epoch(destination),
                destination=destination,
                metadata={PRODUCERS_KEY: state},
            )
            self._committed(layout.messages_uri(self.root, destination))

    def handed_producers(self, destination: str) -> str | None:
        """The newest producer state among the message log's last ``PRODUCERS_WITHIN``
        commits (the next owner's fence follows a hand-over; a member lost left the one its
        last commits carried: :class:`spark_mq.journal.sinks.ProducerStateCarrier`)."""
        with translate("reading the producer state handed on", destination):
            dt = self._messages(destination)
            dt.update_incremental()
            return newest_producer_state(dt)

    def _epoch(self, destination: str) -> int | None:
        return self._epochs.get(destination, self.epoch)

    def _append(
        self,
        dt: DeltaTable,
        rows: pa.Table,
        app_id: str | None,
        version: int | None,
        writer: WriterProperties | None = None,
        *,
        epoch: int | None,
        destination: str | None = None,
        metadata: dict[str, str] | None = None,
    ) -> None:
        fenced_alone = destination is not None and destination in self._epochs
        try:
            _append(
                dt,
                rows,
                app_id,
                version,
                writer,
                epoch,
                destination if fenced_alone else None,
                metadata,
            )
        except Deposed as exc:
            if self.on_deposed is not None:
                self.on_deposed(exc)
            raise

    def stamp_destinations(self, names: list[str], workers: int = 8) -> None:
        """Stamp the epoch on these destinations' tables now, several at a time (delta-rs
        commits off the GIL): a takeover stamps every table before it reads it, two commits a
        destination, which one after the other made a failover with 100 destinations take
        3.4 s instead of 1.9 (bench/failover_bench.py)."""
        if self.epoch is None or not names:
            return
        tables = [
            (uri, schema)
            for n in names
            for uri, schema in (
                (layout.messages_uri(self.root, n), MESSAGE_SCHEMA),
                (layout.settlements_uri(self.root, n), SETTLEMENT_SCHEMA),
            )
        ]
        epoch = self.epoch
        with ThreadPoolExecutor(min(workers, len(tables)), "stamp-epoch") as pool:
            for done in [pool.submit(self._stamp, uri, schema, epoch) for uri, schema in tables]:
                done.result()

    def _stamp(
        self, uri: str, schema: pa.Schema, epoch: int | None, destination: str | None = None
    ) -> None:
        if epoch is None or uri in self._fenced:
            return
        with translate("stamping the ownership epoch", destination):
            dt = self._open_or_create(uri, schema, epoch, stamp=False)
            dt.update_incremental()
            if (dt.transaction_version(OWNER_APP_ID) or 0) < epoch:
                self._append(
                    dt, schema.empty_table(), None, None, epoch=epoch, destination=destination
                )
            else:
                _check_owner(dt, epoch, destination)
        with self._lock:
            self._fenced.add(uri)

    # -- tables ------------------------------------------------------------------------------
    def _open_or_create(
        self,
        uri: str,
        schema: pa.Schema,
        epoch: int | None,
        *,
        stamp: bool = True,
        destination: str | None = None,
    ) -> DeltaTable:
        with self._lock:
            dt = self._tables.get(uri)
            stamped = epoch is None or uri in self._fenced
        if stamp and not stamped:
            self._stamp(uri, schema, epoch, destination)
            with self._lock:
                dt = self._tables.get(uri)
        if dt is not None:
            return dt
        try:
            dt = DeltaTable(uri, storage_options=self._opts)
        except TableNotFoundError:
            dt = DeltaTable.create(
                uri, schema, mode="ignore", configuration=self._config, storage_options=self._opts
            )
        with self._lock:
            return self._tables.setdefault(uri, dt)

    def _committed(self, uri: str) -> None:
        """One more commit through the cached table at ``uri``; see ``REOPEN_AFTER_COMMITS``."""
        with self._lock:
            n = self._commits.get(uri, 0) + 1
            if n < REOPEN_AFTER_COMMITS:
                self._commits[uri] = n
                return
            self._commits.pop(uri, None)
            self._tables.pop(uri, None)

    @staticmethod
    def _compact_small_log(
        dt: DeltaTable, what: str, prune: Callable[[DeltaTable], None] | None = None
    ) -> None:
        """See ``COMPACT_SMALL_LOGS_EVERY`` and ``SMALL_LOG_PROPERTIES``; ``prune`` first
        deletes what the log no longer needs. (Rows are read in no file order: each carries
        its sequence.) A compaction that meets another writer's commit is left to the next
        time."""
        if dt.version() % COMPACT_SMALL_LOGS_EVERY:
            return
        try:
            configured = dt.metadata().configuration
            if any(configured.get(k) != v for k, v in SMALL_LOG_PROPERTIES.items()):
                dt.alter.set_table_properties(SMALL_LOG_PROPERTIES)
            if prune is not None:
                prune(dt)
            dt.optimize.compact()
            dt.create_checkpoint()
            dt.cleanup_metadata()
            dt.vacuum(dry_run=False)  # (files replaced over a minute ago: the table's setting)
        except DeltaError as exc:
            log.info("the %s log was not compacted this time: %s", what, exc)

    def read_bindings(self) -> pa.Table:
        uri = layout.bindings_uri(self.root)
        with translate("reading the bindings log"):
            try:
                dt = DeltaTable(uri, storage_options=self._opts)
            except TableNotFoundError:
                return BINDING_SCHEMA.empty_table()
            return conform(dt.to_pyarrow_table(), BINDING_SCHEMA)

    def reachable(self) -> None:
        """Raise (``JournalError``) unless the root's bindings log can be read now (readiness
        probes: the store is there and the credentials work)."""
        uri = layout.bindings_uri(self.root)
        with translate("reaching the Delta root"):
            try:
                DeltaTable(uri, storage_options=self._opts, without_files=True)
            except TableNotFoundError:
                return  # a new root: nothing committed yet, and the store answered

    def append_bindings(self, rows: pa.Table) -> None:
        uri = layout.bindings_uri(self.root)
        with self._bindings_lock, translate("writing the bindings log"):
            dt = self._open_or_create(uri, BINDING_SCHEMA, self.epoch)
            self._append(dt, rows, None, None, epoch=self.epoch)
            self._compact_small_log(dt, "bindings")
            self._committed(uri)

    def read_transactions(self) -> pa.Table:
        uri = layout.transactions_uri(self.root)
        with translate("reading the transaction log"):
            try:
                dt = DeltaTable(uri, storage_options=self._opts)
            except TableNotFoundError:
                return TRANSACTION_SCHEMA.empty_table()
            return conform(dt.to_pyarrow_table(), TRANSACTION_SCHEMA)

    def append_transactions(self, rows: pa.Table) -> None:
        """Durable when this returns. Rows of transactions committing at once go in one Delta
        commit (group commit): each caller queues its rows; whoever holds the log's lock next
        writes everything queued, so those queued behind it find theirs written (or its
        error) when they get the lock. One commit of the log costs about 10 ms whatever it
        holds, so N producers committing at once no longer wait N of them in turn."""
        pending = _Queued(rows)
        with self._txn_queue_lock:
            self._txn_queue.append(pending)
        with self._bindings_lock:
            if not pending.written:
                with self._txn_queue_lock:
                    batch, self._txn_queue = self._txn_queue, []
                try:
                    self._write_transactions(pa.concat_tables([q.rows for q in batch]))
                except BaseException as exc:
                    for q in batch:
                        q.error = exc
                finally:
                    for q in batch:
                        q.written = True
        if pending.error is not None:
            raise pending.error

    def _write_transactions(self, rows: pa.Table) -> None:
        uri = layout.transactions_uri(self.root)
        with translate("writing the transaction log"):
            dt = self._open_or_create(uri, TRANSACTION_SCHEMA, self.epoch)
            self._append(dt, rows, None, None, epoch=self.epoch)
            self._compact_small_log(dt, "transaction", _prune_finished)
            self._committed(uri)

    def create_logs(self, destination: str) -> None:
        with translate("creating logs", destination):
            self._messages(destination)
            self._settlements(destination)

    def drop_logs(self, destination: str) -> None:
        uri = layout.destination_uri(self.root, destination)
        with self._lock:
            for key in [k for k in self._tables if k.startswith(uri + "/") or k == uri]:
                del self._tables[key]
                self._commits.pop(key, None)
            for key in [k for k in self._readers if k.startswith(uri + "/") or k == uri]:
                del self._readers[key]
        with translate("deleting logs", destination):
            if layout.is_local(self.root):
                if os.path.exists(uri):
                    shutil.rmtree(uri)
            else:  # (through delta-rs's own object store: the same options reach it)
                DeltaStorageHandler(uri, self._opts).delete_dir("")  # (all under uri)

    # -- message log -------------------------------------------------------------------------
    def _messages(self, destination: str) -> DeltaTable:
        return self._open_or_create(
            layout.messages_uri(self.root, destination),
            MESSAGE_SCHEMA,
            self._epoch(destination),
            destination=destination,
        )

    def end_elsewhere(self, destination: str) -> int:
        """At most the end offset of a destination another cluster member serves: what its
        message log's newest version holds (read only: nothing cached or stamped here)."""
        with translate("reading the message log version", destination):
            try:
                dt = DeltaTable(
                    layout.messages_uri(self.root, destination), storage_options=self._opts
                )
            except TableNotFoundError:
                return 0
            return _committed_end(dt)

    def committed_end(self, destination: str) -> int:
        with translate("reading the message log version", destination):
            dt = self._messages(destination)
            dt.update_incremental()
            return dt.transaction_version(layout.MESSAGES_APP_ID) or 0

    def commit_messages(
        self, destination: str, rows: pa.Table, end_offset: int, producers: str | None = None
    ) -> None:
        with translate("committing messages", destination):
            table = self._messages(destination)
            self._append(
                table,
                rows,
                layout.MESSAGES_APP_ID,
                end_offset,
                MESSAGE_WRITER,
                epoch=self._epoch(destination),
                destination=destination,
                metadata=None if producers is None else {PRODUCERS_KEY: producers},
            )
            self._committed(layout.messages_uri(self.root, destination))
        if self.on_log_commit is not None:
            self.on_log_commit(destination, rows.num_rows)

    def read_messages(
        self,
        destination: str,
        start: int,
        end: int | None,
        columns: Sequence[str] | None = None,
    ) -> pa.Table:
        """Rows with ``start <= offset < end``, through a snapshot kept for readers: opening
        the table and making its dataset (41-47 ms for a log of 200 moves) were paid by a
        consumer going through a backlog for every window it read (a read is 14-19 ms now).
        The snapshot is brought up to date (only the new commits read) when the rows asked for
        are past it, and opened anew when its files are gone (compaction vacuumed them) or
        after ``REOPEN_AFTER_COMMITS`` updates."""
        uri = layout.messages_uri(self.root, destination)
        cond = pds.field("offset") >= start
        if end is not None:
            cond = cond & (pds.field("offset") < end)
        schema = message_columns(columns)

        def read() -> pa.Table:
            dataset = self._dataset(uri, end)
            # (a column a later version added is not in older logs: conform makes it nulls)
            names = None if columns is None else [n for n in columns if n in dataset.schema.names]
            return dataset.to_table(filter=cond, columns=names)

        with translate("reading messages", destination):
            try:
                table = read()
            except (OSError, DeltaError):  # (a file vacuumed since: a fresh snapshot, once)
                with self._lock:
                    self._readers.pop(uri, None)
                table = read()
            return by_offset(conform(table, schema))

    def _dataset(self, uri: str, end: int | None) -> pds.Dataset:
        with self._lock:
            reader = self._readers.get(uri)
            if reader is None:
                reader = self._readers[uri] = _Reader(threading.Lock())
        with reader.lock:
            if reader.table is None or reader.updates >= REOPEN_AFTER_COMMITS:
                reader.table = DeltaTable(uri, storage_options=self._opts)
                reader.updates, reader.dataset = 0, None
            elif end is None or _committed_end(reader.table) < end:
                before = reader.table.version()
                reader.table.update_incremental()
                if reader.table.version() != before:
                    reader.updates, reader.dataset = reader.updates + 1, None
            if reader.dataset is None:  # (41-47 ms for a log of 200 files: once a snapshot)
                reader.dataset = reader.table.to_pyarrow_dataset()
            return reader.dataset

    # -- settlement log ----------------------------------------------------------------------
    def _settlements(self, destination: str) -> DeltaTable:
        return self._open_or_create(
            layout.settlements_uri(self.root, destination),
            SETTLEMENT_SCHEMA,
            self._epoch(destination),
            destination=destination,
        )

    def settlements_version(self, destination: str) -> int:
        with translate("reading the settlement log version", destination):
            dt = self._settlements(destination)
            dt.update_incremental()
            return dt.transaction_version(layout.SETTLEMENTS_APP_ID) or 0

    def commit_settlements(
        self, destination: str, rows: pa.Table, version: int | None = None
    ) -> None:
        with translate("committing settlements", destination):
            self._append(
                self._settlements(destination),
                rows,
                layout.SETTLEMENTS_APP_ID,
                version,
                epoch=self._epoch(destination),
                destination=destination,
            )
            self._committed(layout.settlements_uri(self.root, destination))
        if self.on_log_commit is not None:
            self.on_log_commit(destination, rows.num_rows)

    def collapse_settlements(self, destination: str, collapse: Collapse, now_us: int) -> int:
        """See ``LogStore.collapse_settlements``: the new rows committed with this store's
        epoch for ``destination`` (``Deposed`` when a newer owner fenced it), then the rows
        they stand for deleted, then the log's small files merged and a checkpoint written,
        through a table object of its own (the writer's is another thread's). A delete or a
        merge that keeps meeting other commits is left to the next collapse (each retried on
        its own: a merge that conflicts does not run the delete again)."""
        uri = layout.settlements_uri(self.root, destination)
        with translate("collapsing the settlement log", destination):
            dt = DeltaTable(uri, storage_options=self._opts)
            written = collapse.rows(now_us, "settled below; collapsed by its owner")
            epoch = self._epoch(destination)
            self._append(dt, written, None, None, epoch=epoch, destination=destination)
            done = _retried(
                dt,
                "deleting the rows collapsed",
                destination,
                lambda: dt.delete(collapse.predicate()),
            )
            if _retried(dt, "merging the settlement log's files", destination, dt.optimize.compact):
                dt.create_checkpoint()
            return 0 if done is None else int(done["num_deleted_rows"])

    def merge_message_files(self, destination: str, at_least: int) -> int:
        """See ``LogStore.merge_message_files``: delta-rs's OPTIMIZE (no data change: a Delta
        stream skips it), with the message log's writer properties, through a table object of
        its own. A merge that meets another commit is left to the next time."""
        uri = layout.messages_uri(self.root, destination)
        with translate("merging the message log's small files", destination):
            dt = DeltaTable(uri, storage_options=self._opts)
            sizes = ints(pa.table(dt.get_add_actions(flatten=True))["size_bytes"])
            if len([size for size in sizes if size < MERGED_FILE_BYTES]) < at_least:
                return 0
            try:
                done = dt.optimize.compact(
                    target_size=MERGED_FILE_BYTES, writer_properties=MESSAGE_WRITER
                )
            except CommitFailedError as exc:
                log.info("%s: the message log's files not merged this time: %s", destination, exc)
                return 0
            return int(done.get("numFilesRemoved", 0))

    def read_settlements(self, destination: str) -> pa.Table:
        with translate("reading settlements", destination):
            dt = DeltaTable(
                layout.settlements_uri(self.root, destination), storage_options=self._opts
            )
            return conform(dt.to_pyarrow_table(), SETTLEMENT_SCHEMA)

    def close(self) -> None:
        with self._lock:
            self._tables.clear()
            self._commits.clear()


@dataclass
class _Reader:
    """A message log's snapshot for readers, and how often it was brought up to date."""

    lock: threading.Lock
    table: DeltaTable | None = None
    dataset: pds.Dataset | None = None  # (the snapshot's)
    updates: int = 0


def _retried(dt: DeltaTable, what: str, destination: str, step: Callable[[], T]) -> T | None:
    """``step`` on ``dt`` brought up to date, again while it meets another commit (up to
    ``COMMIT_ATTEMPTS`` times); None when it never got through (logged: the next time)."""
    for attempt in range(COMMIT_ATTEMPTS):
        try:
            dt.update_incremental()
            return step()
        except CommitFailedError as exc:
            if attempt == COMMIT_ATTEMPTS - 1:
                log.info("%s: %s left to the next time: %s", destination, what, exc)
    return None


_TXID = re.compile(r"[0-9A-Za-z]+(-[A-Za-z0-9._-]+)?")  # (a transaction's id, its member's)


def _prune_finished(dt: DeltaTable) -> None:
    """The transaction log's rows of transactions that are done (applied: recovery has
    nothing to do for them), deleted: the log holds what is unfinished, not every transaction
    ever committed."""
    rows = dt.to_pyarrow_table(columns=["txid", "event", "acks", "ends"])
    done = sorted(finished_transactions(rows)[0])
    done = [t for t in done if _TXID.fullmatch(t)]  # (hex, and a member's id: quoted safely)
    if done:
        dt.delete("txid IN (" + ", ".join(f"'{t}'" for t in done) + ")")


def _committed_end(dt: DeltaTable) -> int:
    """The end offset of what ``dt``'s snapshot holds (its commits' transaction version)."""
    return dt.transaction_version(layout.MESSAGES_APP_ID) or 0
