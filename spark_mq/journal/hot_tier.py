"""The hot tier: producers are acknowledged at disk speed, Delta catches up in the background.

A flush of the group-commit writer becomes one append to the destination's
:class:`~spark_mq.journal.segments.SegmentLog` (one ``fdatasync``), not a Delta commit. A mover
thread then appends what is durable in the segments to the Delta message and settlement logs in
large commits (offsets unchanged) and deletes sealed segments whose records are all in Delta.

Moves are idempotent, so a crash anywhere is harmless: message commits carry
``(sparkmq.messages, end_offset)`` and settlement commits ``(sparkmq.settlements, lsn)``; on
open, records at or below those versions count as moved and are not committed again.

A record that cannot be read (it does not decode, or its Arrow data is invalid: an older
version stored a client's batch with offsets past its data, and reading it crashed the broker
at every start) is *quarantined*: its payload and a description of where it was and what is
wrong go to ``<hot>/.quarantine/<destination>/``, it is logged and counted
(:attr:`HotTierStats.quarantined`), and it moves to Delta as no rows, so the log's end offset
passes it and it is not met again. Its offsets stay unused: readers see a gap there.

Delta is the system of record for Spark and the jobs; it trails the hot tier by at most
``move_interval_s`` plus one commit under normal load (:meth:`HotTier.stats` says by how much).

The Delta commits stay on this thread, in the broker's process, on purpose. Moving them to a
child process (which died with the broker) was built and measured on this 2-core machine,
interleaved with this design. Latency p99 at 1,000 msg/s was 3.5-6.3 ms against 3.1-4.5 (six
pairs) with the child reading the records back from the segment files, and 3.5-8.1 against
2.9-6.2 (six pairs) with the rows sent to it over a socket; batched produce with the latter was
211-405k msg/s against 286-411k (three pairs). The moves' CPU, not the GIL, is what the loop
competes with here, and a second process added work rather than taking any away.
"""

from __future__ import annotations

import errno
import logging
import os
import shutil
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import pyarrow as pa
import pyarrow.compute as pc

from spark_mq.errors import Deposed, DiskFull, SparkMQError
from spark_mq.journal import failpoints, priority
from spark_mq.journal.base import LogStore
from spark_mq.journal.boundary import translate, translated
from spark_mq.journal.move_rows import Pending, as_tables, few_batches
from spark_mq.journal.quarantine import quarantine, quarantine_dir, readable
from spark_mq.journal.records import (
    KIND_MESSAGES,
    KIND_PLAIN,
    KIND_PLAIN_SETTLEMENTS,
    MESSAGE_KINDS,
    SETTLEMENT_KINDS,
    RecordRef,
    Records,
)
from spark_mq.journal.segments import SegmentLog, SyncMode
from spark_mq.journal.settlements import SettlementRows
from spark_mq.journal.sinks import ProducerStateCarrier, as_journal_error
from spark_mq.messages import Messages
from spark_mq.schema import MESSAGE_SCHEMA, SETTLEMENT_SCHEMA, by_offset, conform, message_columns

log = logging.getLogger(__name__)


class Replica(Protocol):
    """Where a primary's hot tier ships its writes (spark_mq.ha.replication.Replicator)."""

    replicated_acks: bool  # whether a write is acknowledged only once the backup has it

    def ship(self, tier: HotTier, first_lsn: int, count: int, buffers: list) -> int: ...
    def wait(self, seq: int) -> None: ...
    def moved(self, destination: str, lsn: int) -> None: ...
    def dropped(self, destination: str) -> None: ...


@dataclass(frozen=True)
class HotTierSettings:
    directory: str  # the hot root; each destination gets a sub-directory
    segment_bytes: int = 64 * 1024 * 1024
    sync: SyncMode = "fdatasync"
    move_interval_s: float = 0.5
    move_max_bytes: int = 128 * 1024 * 1024
    max_bytes: int = 1024 * 1024 * 1024
    mover_nice: int = 10  # the movers' priority (spark_mq.journal.priority; 0: as the loop's)
    # a cluster member's: each owner writes a directory of its own, which the next owner seals
    # (spark_mq.journal.sealing); a write is acknowledged only while it is still there
    shared: bool = False


@dataclass(slots=True)
class _Pending:
    ref: RecordRef
    # as written since the start (messages, settlements); a table for every record recovered
    # at the start
    table: Pending
    written_at: float  # time.monotonic() of the append (of the open, for recovered records)


@dataclass(slots=True)
class Written:
    """A flush's records as written to the segment log (durable once synced)."""

    refs: list[RecordRef]
    tables: list[Pending]

    @property
    def last_lsn(self) -> int:
        return self.refs[-1].lsn


@dataclass
class HotTierStats:
    delta_end_offset: int
    pending_records: int
    pending_bytes: int
    delta_lag_ms: float
    moves: int
    move_failures: int
    segments: int
    spares_zeroed: int  # segments made ready by zeroing a new file
    spares_reused: int  # segments made ready by reusing a moved one
    quarantined: int  # records that could not be read, set aside (see the module's doc)
    disk_full: bool  # the last append failed for want of space (writes are refused until not)


class HotTier:
    """One destination's segment log plus its mover thread. A ``CommitSink`` for the writer."""

    def __init__(
        self, store: LogStore, destination: str, directory: str, settings: HotTierSettings
    ) -> None:
        self.destination = destination
        self.directory = directory
        self._store = store
        self._settings = settings
        self._log = SegmentLog(directory, segment_bytes=settings.segment_bytes, sync=settings.sync)
        self._mutex = threading.RLock()  # the condition's lock, entered directly
        self._cond = threading.Condition(self._mutex)
        self._pending: list[_Pending] = []
        self._pending_bytes = 0
        self._segment_last_lsn: dict[int, int] = {}
        self._delta_end = 0
        self._settled_version = 0
        self._moves = 0
        self._move_failures = 0
        self._move_target = 0  # lsn a caller wants moved now
        self._moved_lsn = 0  # every record up to this lsn is in Delta
        self._closing = False
        self._deposed = False  # the mover stopped: another broker owns the data
        self._mover: threading.Thread | None = None
        self._quarantined = 0
        self.disk_full = False  # the last append failed for want of space
        self.quarantine_dir = quarantine_dir(settings.directory, destination)
        # a member's: the directory whose presence says this member still owns the destination
        self._sealed_by_rename = directory if settings.shared else None
        self._told_deposed = False
        # replication (spark_mq.ha.replication): whom each write is shipped to, under this
        # lock (so the backup's copy of this destination never misses a write), and the
        # sequence number of the last one shipped (what a sync waits for the backup to have)
        self.replica: Replica | None = None
        self.ship_lock = threading.Lock()
        self._shipped = 0
        # (a cluster member's) what the moves' commits carry of the producer state
        self.producers = ProducerStateCarrier()

    # -- opening: what is durable, what is still to move -------------------------------------
    def open(self) -> int:
        """Recover the segments and start the mover; returns one past the last durable offset."""
        with translate("opening the hot tier", self.destination):
            self._delta_end = self._store.committed_end(self.destination)
            self._settled_version = self._store.settlements_version(self.destination)
            try:
                refs = self._log.open(
                    first_lsn=self._settled_version + 1, create=self._sealed_by_rename is None
                )
            except FileNotFoundError:
                if self._sealed_by_rename is None:
                    raise
                raise Deposed(  # (placed on it, then elsewhere at once: the other took it)
                    f"{self.destination}: another member took it over before this one opened "
                    "it (it sealed this member's hot tier)",
                    destination=self.destination,
                ) from None
            now = time.monotonic()
            end = self._delta_end
            for ref in refs:
                self._segment_last_lsn[ref.segment] = ref.lsn
                if ref.kind in MESSAGE_KINDS:
                    end = max(end, ref.end_offset)
                if self._is_moved(ref):
                    continue
                try:
                    table = readable(self._log.read(ref), ref)
                except Exception as exc:  # whatever reading it raised: it cannot be moved
                    table = self._quarantine(ref, exc)
                self._pending.append(_Pending(ref, table, now))
                self._pending_bytes += ref.size
            first_pending = self._pending[0].ref.lsn if self._pending else self._log.next_lsn
            self._moved_lsn = first_pending - 1
            self._retire_moved()
        if refs:
            log.info(
                "hot tier %s: %d record(s) in %d segment(s), %d not yet in Delta",
                self.destination,
                len(refs),
                self._log.segment_count,
                len(self._pending),
            )
        self._mover = threading.Thread(
            target=self._move_loop, name=f"hot-tier-mover-{self.destination}", daemon=True
        )
        self._mover.start()
        return end

    def first_unmoved_lsn(self) -> int:
        with self._mutex:
            return self._moved_lsn + 1

    def raw_records_from(self, lsn: int) -> list[tuple[int, int, bytes]]:
        """Records from ``lsn`` on, as written (a new backup's copy; call under ship_lock)."""
        return self._log.raw_from(lsn)

    def attach_replica(self, replica: Replica) -> None:
        self._log.keep_written = True
        self.replica = replica

    def _is_moved(self, ref: RecordRef) -> bool:
        if ref.kind in MESSAGE_KINDS:
            return ref.end_offset <= self._delta_end
        return ref.lsn <= self._settled_version

    # -- the writer side ---------------------------------------------------------------------
    # the group-commit writer may pipeline: write a flush, and sync it on another thread while
    # the next one is written (see spark_mq.journal.group_commit)
    pipelined = True

    def commit(
        self,
        messages: Messages | None,
        end_offset: int,
        settlements: SettlementRows | None,
    ) -> tuple[SparkMQError | None, SparkMQError | None]:
        written = self.write(messages, end_offset, settlements, sync=True)
        if isinstance(written, SparkMQError):
            return written, written
        self.published(written)
        return None, None

    def write(
        self,
        messages: Messages | None,
        end_offset: int,
        settlements: SettlementRows | None,
        *,
        sync: bool = False,
    ) -> Written | SparkMQError:
        """Append a flush's records to the segment log; durable once :meth:`sync` has run
        (or at once with ``sync``). Hand them to :meth:`published` when they are."""
        records: Records = []
        if messages is not None:
            kind = KIND_MESSAGES if messages.plain is None else KIND_PLAIN
            records.append((kind, end_offset - messages.num_rows, messages))
        if settlements is not None:
            records.append((KIND_PLAIN_SETTLEMENTS, -1, settlements))
        if self._pending_bytes > self._settings.max_bytes:  # (checked again under the lock)
            with self._mutex:
                # bounded: when Delta falls far behind, producers wait instead of filling the disk
                while self._pending_bytes > self._settings.max_bytes and not self._closing:
                    self._cond.wait()
        replica = self.replica
        try:
            if replica is None:
                refs = self._log.append(records, sync=sync)
            else:
                with self.ship_lock:
                    refs = self._log.append(records, sync=sync)
                    self._shipped = replica.ship(
                        self, refs[0].lsn, len(refs), self._log.last_written or []
                    )
                if sync:
                    replica.wait(self._shipped)
        except Exception as exc:
            if _no_space(exc) and not self.disk_full:
                self.disk_full = True
                log.warning(
                    "hot tier %s: the disk is full (%s): producers and acks are refused with a "
                    "retriable error until space comes back; reads go on, nothing acknowledged "
                    "is lost",
                    self.destination,
                    self.directory,
                )
            if _no_space(exc):  # (the disk filled before the broker's margin caught it)
                return DiskFull(
                    f"the disk holding {self.directory} is full ({exc}): free space or add disk "
                    "(limits.min_free_disk_bytes keeps a margin); retry later, nothing of this "
                    "was stored",
                    destination=self.destination,
                )
            err = translated(exc, "appending to the hot tier", self.destination)
            return as_journal_error(err, self.destination)
        if self.disk_full:
            self.disk_full = False
            log.warning("hot tier %s: there is space again: writes resume", self.destination)
        if sync and (sealed := self._sealed()) is not None:
            return sealed
        return Written(refs, [rows for _, _, rows in records])

    def _sealed(self) -> SparkMQError | None:
        """(After a sync.) A member's directory sealed by a newer owner: ``Deposed``, and what
        was just synced is acknowledged to no one (spark_mq.journal.sealing)."""
        if self._sealed_by_rename is None:
            return None
        try:
            os.stat(self._sealed_by_rename)
            return None
        except FileNotFoundError:
            err = Deposed(
                f"{self.destination}: another member took it over (it sealed this member's "
                "hot tier): nothing more is acknowledged here",
                destination=self.destination,
            )
        except OSError as exc:
            return as_journal_error(translated(exc, "looking at the hot tier", self.destination),
                                    self.destination)  # fmt: skip
        if not self._told_deposed:  # (the member lets the destination go)
            self._told_deposed = True
            log.warning("hot tier %s: %s", self.destination, err.message)
            on_deposed = getattr(self._store, "on_deposed", None)
            if on_deposed is not None:
                on_deposed(err)
        return err

    def sync(self) -> tuple[int, SparkMQError | None]:
        """Make every record written so far durable: the lsn durable through, and the error
        when the sync failed (then :meth:`drop_unsynced` must run before the next write)."""
        shipped, replica = self._shipped, self.replica
        before = self._log.synced_lsn
        try:
            lsn = self._log.sync()
        except Exception as exc:
            err = translated(exc, "syncing the hot tier", self.destination)
            return self._log.synced_lsn, as_journal_error(err, self.destination)
        if replica is not None:
            try:
                replica.wait(shipped)  # the backup has them too (replicated acknowledgements)
            except Exception as exc:  # (deposed): durable here, but acknowledged to no one
                err = translated(exc, "replicating the hot tier", self.destination)
                return before, as_journal_error(err, self.destination)
        if (sealed := self._sealed()) is not None:
            return before, sealed
        return lsn, None

    def drop_unsynced(self) -> None:
        """Forget what was written since the last durable record (after a failed sync)."""
        with translate("cutting off the hot tier's unsynced records", self.destination):
            self._log.drop_unsynced()

    def published(self, written: Written) -> None:
        """Durable records: now the mover's to take to Delta."""
        now = time.monotonic()
        with self._mutex:
            was_empty = not self._pending
            for ref, table in zip(written.refs, written.tables, strict=True):
                self._pending.append(_Pending(ref, table, now))
                self._pending_bytes += ref.size
                self._segment_last_lsn[ref.segment] = ref.lsn
            # the mover sleeps until the oldest pending record is due: it needs waking only to
            # start that clock or when enough waits; a wake per commit cost a context switch
            if was_empty or self._pending_bytes >= self._settings.move_max_bytes:
                self._cond.notify_all()

    # -- the mover ---------------------------------------------------------------------------
    def request_move(self, *, wait: bool = True, timeout: float | None = None) -> bool:
        """Move what is durable now to Delta; with ``wait``, return once it is there.

        Returns False when ``timeout`` passed first (Delta unreachable, say).
        """
        with self._mutex:
            target = self._pending[-1].ref.lsn if self._pending else self._moved_lsn
            self._move_target = max(self._move_target, target)
            self._cond.notify_all()
            if not wait:
                return True
            return (
                self._cond.wait_for(
                    lambda: self._moved_lsn >= target or self._closing or self._deposed, timeout
                )
                and self._moved_lsn >= target
            )

    def _due(self) -> bool:
        if not self._pending or self._closing:
            return False
        if self._move_target > self._moved_lsn:
            return True
        if self._pending_bytes >= self._settings.move_max_bytes:
            return True
        return time.monotonic() - self._pending[0].written_at >= self._settings.move_interval_s

    def _move_loop(self) -> None:
        priority.background(self._settings.mover_nice)
        backoff = 0.0
        while True:
            with self._mutex:
                while not self._due():
                    if self._closing:
                        return
                    if self._move_target > self._moved_lsn:  # nothing pending: all moved
                        self._moved_lsn = self._move_target
                        self._cond.notify_all()
                    timeout = None
                    if self._pending:
                        timeout = self._pending[0].written_at + self._settings.move_interval_s
                        timeout = max(timeout - time.monotonic(), 0.001)
                    self._cond.wait(timeout)
                batch = self._take_batch()
            try:
                self._move(batch)
                priority.background_runtime(self._settings.mover_nice)  # (threads it made)
            except Deposed as exc:  # another broker owns the data now: nothing more to move
                log.error(
                    "hot tier %s: %s; %d record(s) not moved by this broker stay in its "
                    "segments (the new owner has its own copy of what was acknowledged)",
                    self.destination, exc.message, len(self._pending),
                )  # fmt: skip
                with self._mutex:
                    self._deposed = True  # nobody waits for a move any more (close, flush)
                    self._cond.notify_all()
                return
            except Exception as exc:
                if self._set_aside_unreadable(batch):
                    continue  # the rest moves at once
                self._move_failures += 1
                backoff = min(max(backoff * 2, 0.1), 5.0)
                log.warning(
                    "hot tier %s: moving %d record(s) to Delta failed, retrying in %.1fs: %s",
                    self.destination,
                    len(batch),
                    backoff,
                    exc,
                )
                with self._mutex:
                    if self._closing:
                        return  # they stay in the segments; the next start moves them
                    self._cond.wait(backoff)
                continue
            backoff = 0.0
            with self._mutex:
                del self._pending[: len(batch)]
                self._pending_bytes -= sum(p.ref.size for p in batch)
                self._moves += 1
                self._moved_lsn = batch[-1].ref.lsn
                self._cond.notify_all()
            if self.replica is not None:  # the backup may let go of its copies too
                self.replica.moved(self.destination, batch[-1].ref.lsn)
            try:
                self._retire_moved()
            except OSError:
                log.exception("hot tier %s: could not delete moved segments", self.destination)
            self._let_go(batch)

    def _let_go(self, batch: list[_Pending]) -> None:
        """Drop the last references to a moved ``batch`` a few records at a time.

        Freeing a move's records (hundreds of small Arrow tables) takes 6-9 ms of CPU in the
        running broker; at once, it held up every client. Between two steps the mover yields
        the GIL, and while nothing waits for it (no flush, no close, no backlog) it also rests
        a millisecond, so the work is spread out rather than a burst on this machine's two
        busy cores. Measured at 1,000 msg/s for 15 s, six interleaved pairs: latency p99
        4.9-10.9 ms resting against 9.3-17.1 ms without (lower in every pair), p50 within the
        noise (1.2-1.9 ms either way).
        """
        while batch:
            del batch[-_LET_GO_EACH:]
            with self._mutex:
                rest = (
                    not self._closing
                    and self._move_target <= self._moved_lsn
                    and self._pending_bytes < self._settings.move_max_bytes
                )
            time.sleep(_LET_GO_REST_S if rest else 0)  # 0 still yields the GIL

    def _set_aside_unreadable(self, batch: list[_Pending]) -> bool:
        """After a failed move: quarantine the records of ``batch`` that cannot be read, as at
        open; True if there were any (a move that failed for another reason, Delta out of
        reach say, is retried as it was)."""
        found = False
        for p in batch:
            try:
                readable(as_tables([p.table])[0], p.ref)
            except Exception as exc:
                empty = self._quarantine(p.ref, exc)
                with self._mutex:
                    p.table = empty
                found = True
        return found

    def _quarantine(self, ref: RecordRef, problem: Exception) -> pa.Table:
        """Set record ``ref`` aside and count it; returns what moves in its place: no rows."""
        self._quarantined += 1
        log_, aside = self._log, self.quarantine_dir
        return quarantine(log_, self.destination, self.directory, aside, ref, problem)

    def _take_batch(self) -> list[_Pending]:
        batch: list[_Pending] = []
        size = 0
        for p in self._pending:
            if batch and size + p.ref.size > self._settings.move_max_bytes:
                break
            batch.append(p)
            size += p.ref.size
        return batch

    def _move(self, batch: list[_Pending]) -> None:
        """Commit ``batch`` (consecutive records, oldest first) to Delta, idempotently."""
        messages = [p for p in batch if p.ref.kind in MESSAGE_KINDS]
        settles = [p for p in batch if p.ref.kind in SETTLEMENT_KINDS]
        if messages:
            end = messages[-1].ref.end_offset
            rows = few_batches(as_tables([p.table for p in messages]), MESSAGE_SCHEMA)
            # nothing invalid reaches delta-rs, which would read past a bad offset and crash the
            # process (clients' batches are checked on arrival; this is the last line: a few
            # microseconds a thousand rows)
            rows.validate(full=True)
            if rows.num_rows and rows["offset"][0].as_py() < self._delta_end:  # a partial move
                rows = rows.filter(pc.greater_equal(rows["offset"], pa.scalar(self._delta_end)))
            producers = self.producers.due(self.destination, end)
            self._store.commit_messages(self.destination, rows, end, producers)
            failpoints.hit("hot-tier-messages-moved")
            self._delta_end = end
        if settles:
            version = settles[-1].ref.lsn
            rows = few_batches(as_tables([p.table for p in settles]), SETTLEMENT_SCHEMA)
            rows.validate(full=True)
            self._store.commit_settlements(self.destination, rows, version)
            self._settled_version = version
        failpoints.hit("hot-tier-moved")

    def _retire_moved(self) -> None:
        """Delete sealed segments none of whose records still waits for the mover."""
        with self._mutex:
            first_pending = self._pending[0].ref.lsn if self._pending else self._log.next_lsn
            active = self._log.active_segment
            done = [
                seq
                for seq, last in self._segment_last_lsn.items()
                if seq != active and last < first_pending
            ]
        if done and self._log.retire(done):
            with self._mutex:
                for seq in done:
                    self._segment_last_lsn.pop(seq, None)

    # -- reading -----------------------------------------------------------------------------
    def read_messages(
        self, start: int, end: int | None, columns: Sequence[str] | None = None
    ) -> pa.Table:
        """Rows with ``start <= offset < end`` (of ``columns`` only): from Delta, then from the
        records not yet moved."""
        with self._mutex:
            delta_end = self._delta_end
            lo = max(start, delta_end)
            # only the records holding offsets asked for (a reader of the tail, a Kafka fetch,
            # asks for a few of many)
            hot = as_tables(
                [
                    p.table
                    for p in self._pending
                    if p.ref.kind in MESSAGE_KINDS
                    and p.ref.end_offset > lo
                    and (end is None or p.ref.first_offset < end)
                ]
            )
        schema = message_columns(columns)
        parts = [schema.empty_table()]
        if start < delta_end:
            stop = delta_end if end is None else min(end, delta_end)
            parts.append(self._store.read_messages(self.destination, start, stop, columns))
        # a record the mover has just committed may still be listed: Delta already gave it
        for table in hot:
            table = conform(table, schema)
            mask = pc.greater_equal(table["offset"], pa.scalar(lo))
            if end is not None:
                mask = pc.and_(mask, pc.less(table["offset"], pa.scalar(end)))
            parts.append(table.filter(mask))
        return by_offset(pa.concat_tables(parts))

    def read_recent(self, start: int, end: int) -> pa.Table | None:
        """Rows ``start <= offset < end`` from the records not moved yet (memory: quick), or
        None when some of them are in Delta only (a read for another thread)."""
        with self._mutex:
            if start < self._delta_end:
                return None
            hot = as_tables(
                [
                    p.table
                    for p in self._pending
                    if p.ref.kind in MESSAGE_KINDS
                    and p.ref.end_offset > start
                    and p.ref.first_offset < end
                ]
            )
        parts = [MESSAGE_SCHEMA.empty_table()]
        for table in hot:
            table = conform(table, MESSAGE_SCHEMA)
            mask = pc.and_(
                pc.greater_equal(table["offset"], pa.scalar(start)),
                pc.less(table["offset"], pa.scalar(end)),
            )
            parts.append(table.filter(mask))
        return by_offset(pa.concat_tables(parts))

    def read_settlements(self) -> pa.Table:
        with self._mutex:
            hot = as_tables([p.table for p in self._pending if p.ref.kind in SETTLEMENT_KINDS])
        delta = self._store.read_settlements(self.destination)
        return pa.concat_tables([delta, *(conform(t, SETTLEMENT_SCHEMA) for t in hot)])

    def stats(self) -> HotTierStats:
        with self._mutex:
            lag = (time.monotonic() - self._pending[0].written_at) * 1000 if self._pending else 0
            return HotTierStats(
                delta_end_offset=self._delta_end,
                pending_records=len(self._pending),
                pending_bytes=self._pending_bytes,
                delta_lag_ms=lag,
                moves=self._moves,
                move_failures=self._move_failures,
                segments=self._log.segment_count,
                spares_zeroed=self._log.spares_zeroed,
                spares_reused=self._log.spares_reused,
                quarantined=self._quarantined,
                disk_full=self.disk_full,
            )

    # -- closing -----------------------------------------------------------------------------
    @property
    def deposed(self) -> bool:
        """Whether a newer owner refused this tier's moves (its mover stopped)."""
        return self._deposed

    @property
    def unmoved(self) -> int:
        """Records durable in the segments and not (yet) in Delta."""
        with self._mutex:
            return len(self._pending)

    def close(self, *, drain: bool) -> None:
        """Stop the mover; with ``drain`` it first moves what it can (failures stay on disk;
        a deposed broker moves nothing).

        When everything was moved, the segment directory goes too.
        """
        moving = drain and self._mover is not None and not self._deposed
        if moving and not self.request_move(wait=True, timeout=10):
            log.warning(
                "hot tier %s: %d record(s) could not be moved to Delta within 10 s; they stay "
                "in the segments and move at the next start",
                self.destination,
                self.unmoved,
            )
        with self._mutex:
            self._closing = True
            self._cond.notify_all()
        if self._mover is not None:
            self._mover.join()
            self._mover = None
        self._log.close()
        if drain and not self._pending:
            # everything is in Delta: no segment is left to say otherwise (see has_segments)
            shutil.rmtree(self.directory, ignore_errors=True)


def _no_space(exc: BaseException) -> bool:
    return isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT)


_LET_GO_EACH = 32
_LET_GO_REST_S = 0.001
