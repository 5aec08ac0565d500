"""The hot tier's on-disk format: an append-only log of checksummed Arrow records in segments.

A destination's segment log is a directory of files ``segment-<seq>.log``, each pre-allocated to
``segment_bytes`` (so an append rarely has to grow the file) and filled with records
(:mod:`spark_mq.journal.records`: a checksummed header and a payload).

``lsn`` numbers the records of one log 1, 2, 3 ... without gaps across segments, so a scan
recognises the end of the log: the first record whose magic, length, checksum or lsn is not the
expected one ends it (a pre-allocated tail reads as zeros). A torn tail left by a crash is
therefore never served, and :meth:`SegmentLog.open` truncates it away.

Only the last segment is ever written; a segment is *sealed* once a later one exists. Sealed
segments whose records have all been moved to Delta are retired (:meth:`SegmentLog.retire`):
deleted, or kept as the spare for the next roll (below).

Segments are written over data already on disk, not over space merely reserved (the Artemis
journal's pre-filled files). A sync after writing into reserved space must also journal the file
system's note that the space now holds data: measured on this machine's ext4, ``fdatasync`` took
220-240 us in the broker that way against 145-180 us over written space. A log's first segment is
a short one, made and zeroed by its first append (:data:`FIRST_SEGMENT_BYTES`). Each roll takes
the *spare* (``spare.log``) if one is ready, and there are two ways to make one:

- **reuse** (as the Artemis journal pools its files): a retired full-size segment becomes the
  spare. The first record header is wiped and nothing else written, so a roll costs no writes
  beyond the records themselves. The old records behind the new ones are never read: a scan ends
  at the first record whose lsn is not the next one, and lsns only grow while the log is open.
  At open, everything after a segment's last valid record is cut off and any spare is deleted,
  so old records never outlive the process that numbered past them.
- **zeroing**: when the active segment is half full and no sealed segment waits to be reused
  (the first rolls after a start), a thread zeroes a full-size spare, paced; unless the
  segment's appends are big (:data:`_BIG_APPEND_BYTES` on average: batches, not single sends).

A roll finding no spare ready falls back to reserving space (why zeroing is not always worth
it: :mod:`spark_mq.journal.zeroing`). A crash while a spare is made leaves ``spare.log.tmp`` or
``reused.log.tmp``, which the next open deletes; no spare file is ever read as a segment.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import threading
import time

import pyarrow as pa

from spark_mq.journal.ipc_payloads import Scratch
from spark_mq.journal.records import (
    _HEADER,
    HEADER_BYTES,
    KIND_PLAIN,
    KIND_PLAIN_SETTLEMENTS,
    MAGIC,
    RecordRef,
    Records,
    decode_payload,
    encode_plain,
    encode_record,
    scan_segment,
)
from spark_mq.journal.settlements import SettlementRows
from spark_mq.journal.zeroing import ZEROS, SyncMode, zero
from spark_mq.messages import Messages

log = logging.getLogger(__name__)


# the write syncs itself where the system can (Linux 4.7+): one system call, not two. Measured
# here, 2,000 appends of 1 KiB to a zeroed file: p50 130-157 us against 143-167 with fdatasync
_WRITE_FLAGS = {
    mode: getattr(os, flag)
    for mode, flag in (("fdatasync", "RWF_DSYNC"), ("fsync", "RWF_SYNC"))
    if hasattr(os, flag)
}
FIRST_SEGMENT_BYTES = 1024 * 1024  # zeroed by the first append: about 3 ms, once per start
SPARE = "spare.log"
_SPARE_TMP = SPARE + ".tmp"  # being zeroed
_REUSE_TMP = "reused.log.tmp"  # a retired segment being made the spare
# Appends of this mean size or more are "big": no spare is zeroed for them. At 256 KiB, a
# partitioned destination's appends (each partition's commit merges fewer batches: one or two
# of 500 messages, 60-130 KiB) were small, and every partition zeroed its 64 MiB spares while
# it was written: produce to four partitions on two members 458-490k msg/s, 544-589k at 16 KiB
# (bench/cluster_bench.py --partitions 4, 200,000 messages a client, three rounds each, one
# run). Synchronous batches of 20, 200 and 1,000 messages of 100 bytes kept their latency (p50
# 1.23, 1.29-1.34 and 1.77-1.79 ms at 16 KiB against 1.23, 1.25-1.29 and 1.91-2.08 at 256).
_BIG_APPEND_BYTES = 16 * 1024


def _segment_name(seq: int) -> str:
    return f"segment-{seq:012d}.log"


def _parse_segment_name(name: str) -> int | None:
    if name.startswith("segment-") and name.endswith(".log"):
        digits = name[len("segment-") : -len(".log")]
        if digits.isdigit():
            return int(digits)
    return None


class SegmentLog:
    """One destination's segment files. Appends come from one thread; reads from any."""

    def __init__(self, directory: str, *, segment_bytes: int, sync: SyncMode) -> None:
        self.directory = directory
        self.segment_bytes = segment_bytes
        self.sync_mode = sync
        self._lock = threading.Lock()
        self._segments: dict[int, str] = {}  # seq -> path, oldest first
        self._fd = -1
        self._active = -1
        self._position = 0
        # bytes the active segment may take: its file grows as written past what was reserved
        self._capacity = 0
        self._scratch = Scratch()
        self._spare: threading.Thread | None = None  # zeroing the next segment
        # under _lock: spare.log is ready; a spare is being zeroed (told to stop once a segment
        # is reused instead) or reused; the sealed segments big enough to be reused once retired
        self._spare_ready = False
        self._zeroing = self._stop_zeroing = self._reusing = False
        self._reusable: set[int] = set()
        self._appends = 0  # to the active segment: its mean append size says whether to zero
        self._no_room_at = float("-inf")  # when _want_spare last found no room for a spare
        self.spares_zeroed = 0  # spares made by zeroing a new file
        self.spares_reused = 0  # spares made of a retired segment
        self._closing = False
        self.next_lsn = 1
        # appends may leave their sync to sync() (append(..., sync=False)), which another thread
        # calls while the next append is written. Under _lock: what is durable (the active
        # segment's bytes before _synced_position, the records up to synced_lsn)
        self._sync_lock = threading.Lock()  # one sync at a time, and no roll during one
        self._synced_position = 0
        self.synced_lsn = 0
        self._sync_failed = False  # until drop_unsynced: a failed sync may have lost anything since

    # -- opening and recovery ----------------------------------------------------------------
    def open(self, first_lsn: int = 1, *, create: bool = True) -> list[RecordRef]:
        """Scan every segment, truncate a torn tail, and return the valid records in lsn order.

        ``first_lsn`` is used when no segment holds a record (numbering continues from there).
        ``create``: make the directory if it is not there (else ``FileNotFoundError``: a
        cluster member's, which must never make again a directory another member sealed; see
        :mod:`spark_mq.journal.sealing`).
        """
        if create:
            os.makedirs(self.directory, exist_ok=True)
        self._drop_spares()
        seqs = sorted(
            s for n in os.listdir(self.directory) if (s := _parse_segment_name(n)) is not None
        )
        refs: list[RecordRef] = []
        for seq in seqs:
            path = os.path.join(self.directory, _segment_name(seq))
            self._segments[seq] = path
            with open(path, "rb") as fh:
                data = fh.read()
            expected = refs[-1].lsn + 1 if refs else None
            if expected is None:
                # the oldest surviving segment starts wherever retirement left the numbering
                head = _HEADER.unpack_from(data, 0) if len(data) >= _HEADER.size else None
                expected = head[4] if head and head[0] == MAGIC else first_lsn
            found, valid = scan_segment(data, seq, expected)
            refs.extend(found)
            tail = data[valid:]
            if tail.strip(b"\0"):
                log.warning(
                    "segment %s: %d byte(s) after the last valid record cut off (a torn write, "
                    "never acknowledged, or records of the reused segment's earlier use)",
                    path,
                    len(tail),
                )
                with open(path, "r+b") as fh:
                    fh.truncate(valid)
                    self._sync_cut(fh.fileno())
            if seq == seqs[-1]:
                self._active, self._position = seq, valid
        self.next_lsn = refs[-1].lsn + 1 if refs else first_lsn
        self._synced_position, self.synced_lsn = self._position, self.next_lsn - 1
        self._appends = sum(1 for r in refs if r.segment == self._active)  # (records, near enough)
        if self._active >= 0:
            # nothing is reserved here: a log opened on a nearly full disk (to serve reads and
            # acks) took a whole segment_bytes per destination, and on a small disk it could
            # never open again; the file grows as written, the next roll reserves space
            self._fd = os.open(self._segments[self._active], os.O_RDWR)
            self._capacity = max(os.fstat(self._fd).st_size, self.segment_bytes)
        # else the first append makes the first segment: a destination never written to after a
        # start costs no file and no zeroing
        return refs

    def _drop_spares(self) -> None:
        """A spare, half made or ready, goes: a reused one holds old records, which the numbering
        of this open might reach (it starts over when no segment holds a record)."""
        for name in (_SPARE_TMP, _REUSE_TMP, SPARE):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(os.path.join(self.directory, name))

    def _preallocate(self, fd: int, used: int) -> None:
        """Reserve the whole segment, if the file system will: reserving is for speed only (a
        full disk, or a file system without fallocate: the file grows as written)."""
        if used < self.segment_bytes and self._room_for_reserve():
            try:
                os.posix_fallocate(fd, 0, self.segment_bytes)
            except OSError as exc:
                if exc.errno not in (errno.EOPNOTSUPP, errno.ENOSPC, errno.EDQUOT):
                    raise
                if exc.errno != errno.EOPNOTSUPP:
                    log.warning(
                        "no room to reserve a %d-byte segment in %s (%s): it grows as written",
                        self.segment_bytes,
                        self.directory,
                        exc.strerror,
                    )

    def _roll(self) -> None:
        """Seal the active segment (if any) and start a new one, over written space if it can."""
        first = self._active < 0 and not self._spare_ready  # a log's first: short
        seq = self._active + 1 if self._active >= 0 else 0
        path = os.path.join(self.directory, _segment_name(seq))
        with self._lock:
            took_spare, self._spare_ready = self._spare_ready, False
            if took_spare:  # synced before it got its name
                os.rename(os.path.join(self.directory, SPARE), path)
        if took_spare:
            fd = os.open(path, os.O_RDWR)
        else:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
            try:
                if first:  # zeroed now
                    self._zero_first(fd)
                else:  # no spare ready (the last roll was too recent): space reserved only
                    self._preallocate(fd, 0)
            except BaseException:
                os.close(fd)
                os.unlink(path)
                raise
        try:
            self._sync_directory()
        except BaseException:
            os.close(fd)
            raise
        sealed = self._active if self._fd >= 0 else None
        if sealed is not None:
            # the sealed segment gives back its unused tail (a reused one: what it held before)
            os.ftruncate(self._fd, self._position)
            os.close(self._fd)
        with self._lock:
            if sealed is not None and self._position >= self.segment_bytes * 3 // 4:
                self._reusable.add(sealed)  # big enough to be the spare once retired
            self._segments[seq] = path
        self._fd, self._active, self._position, self._appends = fd, seq, 0, 0
        self._synced_position = 0  # everything before was synced first (see append)
        self._capacity = self.segment_bytes
        if first:
            self._capacity = min(self.segment_bytes, FIRST_SEGMENT_BYTES)

    def _zero_first(self, fd: int) -> None:
        """Zero a log's first, short segment; on a disk too full for it, leave it empty (it
        grows as written)."""
        size = min(self.segment_bytes, FIRST_SEGMENT_BYTES)
        try:
            st = os.statvfs(self.directory)
            if st.f_bavail * st.f_frsize < 4 * size:
                raise OSError(errno.ENOSPC, "too little space left to zero it ahead")
            zero(fd, size, self.sync_mode)
        except OSError as exc:
            if exc.errno not in (errno.ENOSPC, errno.EDQUOT):
                raise
            os.ftruncate(fd, 0)
            log.warning(
                "no room to prepare the first segment in %s (%s): it grows as written",
                self.directory,
                exc.strerror,
            )

    def _room_for_reserve(self) -> bool:
        """Whether the disk has room to reserve or zero a whole segment ahead and still hold
        as much again: ahead-of-time space is for speed, and must not take the last of it
        (zeroing a spare on a nearly full disk failed the appends beside it)."""
        try:
            st = os.statvfs(self.directory)
        except OSError:
            return False
        return st.f_bavail * st.f_frsize >= 2 * self.segment_bytes

    def _want_spare(self) -> None:
        """Zero the next segment in the background once the active one is half full, unless a
        sealed segment waits to be reused."""
        if self._closing or self._position * 2 < self._capacity:
            return
        if self._position >= _BIG_APPEND_BYTES * self._appends:
            return  # big appends: the zeros would cost them more than they save (see above)
        with self._lock:
            if self._spare_ready or self._zeroing or self._reusing or self._reusable:
                return
        # a system call: asked only when a spare is wanted, and after a "no" not for a second
        now = time.monotonic()
        if now - self._no_room_at < 1.0:
            return
        if not self._room_for_reserve():
            self._no_room_at = now
            return
        with self._lock:
            if self._spare_ready or self._zeroing or self._reusing or self._reusable:
                return
            self._zeroing, self._stop_zeroing = True, False
        self._spare = threading.Thread(
            target=self._make_spare, name="hot-tier-spare-segment", daemon=True
        )
        self._spare.start()

    def _make_spare(self) -> None:
        tmp = os.path.join(self.directory, _SPARE_TMP)
        try:
            fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
            try:
                stop = lambda: self._closing or self._stop_zeroing  # noqa: E731
                zero(fd, self.segment_bytes, self.sync_mode, paced=True, stop=stop)
            finally:
                os.close(fd)
            if stop() or not self._spare_is(tmp):
                os.unlink(tmp)
            else:
                self.spares_zeroed += 1
        except OSError as exc:  # a full disk, say: rolls reserve space instead
            log.warning("could not prepare a spare segment in %s: %s", self.directory, exc)
            with contextlib.suppress(OSError):
                os.unlink(tmp)
        finally:
            with self._lock:
                self._zeroing = False
            self._spare = None

    def _spare_is(self, tmp: str) -> bool:
        """``tmp``, made and synced, becomes the spare unless there is one; False: it did not
        (a roll's directory sync makes the rename durable; a spare is deleted at open anyway)."""
        with self._lock:
            if self._spare_ready:
                return False
            os.rename(tmp, os.path.join(self.directory, SPARE))
            self._spare_ready = True
            return True

    def _reuse(self, path: str) -> None:
        """Make the retired segment at ``path`` the spare: its first record header wiped, its
        cut-off tail written again (zeros), nothing else; else it is deleted."""
        tmp = os.path.join(self.directory, _REUSE_TMP)
        try:
            os.rename(path, tmp)
            self._sync_directory()  # no longer a segment, for good, before anything in it changes
            fd = os.open(tmp, os.O_RDWR)
            try:
                os.pwrite(fd, bytes(HEADER_BYTES), 0)
                size = os.fstat(fd).st_size
                while size < self.segment_bytes:
                    size += os.pwrite(
                        fd, memoryview(ZEROS)[: min(len(ZEROS), self.segment_bytes - size)], size
                    )
                if self.sync_mode != "none":
                    os.fdatasync(fd)
            finally:
                os.close(fd)
            if self._spare_is(tmp):
                self.spares_reused += 1
            else:
                os.unlink(tmp)
        except OSError as exc:
            log.warning("could not reuse a segment in %s: %s", self.directory, exc)
            for gone in (path, tmp):
                with contextlib.suppress(OSError):
                    os.unlink(gone)
        finally:
            with self._lock:
                self._reusing = False

    def _sync_directory(self) -> None:
        if self.sync_mode == "none":
            return
        dfd = os.open(self.directory, os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)

    # -- appending (the writer thread) -------------------------------------------------------
    def append(self, records: Records, *, sync: bool = True) -> list[RecordRef]:
        """Write ``(kind, first_offset, rows)`` records and make them durable with one sync
        (the rows of a ``KIND_PLAIN`` record are plain :class:`Messages`, of a
        ``KIND_PLAIN_SETTLEMENTS`` record :class:`SettlementRows`, of the others a table or
        messages as rows, written as an Arrow stream).

        With ``sync=False`` they are written only: :meth:`sync` makes them durable, and may run
        on another thread while the next append is written (the journal writer's pipeline).
        A synchronous append after such writes syncs them too.

        On failure nothing of this call is kept: the partial write is cut off again, so a later
        scan cannot find a record the caller was told had failed.
        """
        if self._sync_failed:
            raise OSError(errno.EIO, "a sync of this log failed: its unsynced records go first")
        first_lsn = lsn = self.next_lsn
        tables = [
            rows if isinstance(rows, pa.Table) else rows.table()
            for kind, _, rows in records
            if kind not in (KIND_PLAIN, KIND_PLAIN_SETTLEMENTS)
        ]
        streams = iter(self._scratch.encode(tables) if tables else ())
        buffers: list[bytes | pa.Buffer] = []  # header, payload, header, payload ...
        shapes = []  # each record's kind, first offset, rows and payload length
        for kind, first, rows in records:
            payload: bytes | pa.Buffer
            if kind == KIND_PLAIN_SETTLEMENTS:
                assert isinstance(rows, SettlementRows)
                payload = rows.encode()
            elif kind == KIND_PLAIN:
                assert isinstance(rows, Messages) and rows.plain is not None
                payload = encode_plain(rows.plain)
            else:
                payload = next(streams)
            n = rows.num_rows
            buffers += (encode_record(kind, lsn, first, n, payload), payload)
            shapes.append((kind, first, n, len(payload)))
            lsn += 1
        size = sum(map(len, buffers))
        if self._fd < 0 or (self._position > 0 and self._position + size > self._capacity):
            with self._sync_lock:  # a segment is sealed durable, and never under a sync
                if self.synced_lsn < self.next_lsn - 1:
                    self._sync_held()
                self._roll()
        start = pos = self._position
        refs = []
        for rec_lsn, (kind, first, n, length) in enumerate(shapes, first_lsn):
            refs.append(RecordRef(rec_lsn, kind, first, n, self._active, pos, length))
            pos += HEADER_BYTES + length
        # the write syncs itself only when nothing written before waits for a sync
        alone = self.synced_lsn == self.next_lsn - 1
        flags = _WRITE_FLAGS.get(self.sync_mode, 0) if sync and alone else 0
        try:
            written = os.pwritev(self._fd, buffers, start, flags)
            if written != size:  # (a full disk): writing the rest says why
                rest = b"".join(bytes(b) for b in buffers)[written:]
                if os.pwrite(self._fd, rest, start + written) != len(rest):
                    raise OSError(errno.EIO, f"short write to {self._segments[self._active]}")
                if flags:
                    self._sync_file(self._fd)
            if sync and not flags:
                self._sync_file(self._fd)
        except BaseException:
            self._cut(start)
            raise
        with self._lock:
            self._position = pos
            self._appends += 1
            self.next_lsn = lsn
            if sync:
                self._synced_position, self.synced_lsn = pos, lsn - 1
            if self.keep_written:
                self.last_written = buffers
        self._want_spare()
        return refs

    # -- replication (spark_mq.ha.replication) -------------------------------------------------
    keep_written = False  # a primary's log keeps each append's bytes for its backup
    last_written: list[bytes | pa.Buffer] | None = None

    def append_raw(self, first_lsn: int, data: bytes, count: int, *, sync: bool = True) -> int:
        """A backup's append: ``count`` records exactly as its primary wrote them (their lsns
        from ``first_lsn``, which must be this log's next), made durable (with ``sync``; else
        by :meth:`sync`). Returns the segment they went to."""
        if first_lsn != self.next_lsn:
            raise ValueError(f"records from lsn {first_lsn} do not follow {self.next_lsn - 1}")
        size = len(data)
        if self._fd < 0 or (self._position > 0 and self._position + size > self._capacity):
            with self._sync_lock:  # a segment is sealed durable
                if self.synced_lsn < self.next_lsn - 1:
                    self._sync_held()
                self._roll()
        start = self._position
        try:
            if os.pwrite(self._fd, data, start) != size:
                raise OSError(errno.EIO, f"short write to {self._segments[self._active]}")
            if sync:
                self._sync_file(self._fd)
        except BaseException:
            self._cut(start)
            raise
        with self._lock:
            self._position = start + size
            self.next_lsn = first_lsn + count
            if sync:
                self._synced_position, self.synced_lsn = self._position, self.next_lsn - 1
        return self._active

    def raw_from(self, lsn: int) -> list[tuple[int, int, bytes]]:
        """The records from ``lsn`` on as written, read back from the segment files (a backup's
        initial copy): ``(first lsn, count, bytes)`` per segment. Callers keep appends out."""
        out = []
        with self._lock:
            segments = sorted(self._segments.items())
            end = self._position
        for seq, path in segments:
            with open(path, "rb") as fh:
                data = fh.read() if seq != self._active else fh.read(end)
            head = _HEADER.unpack_from(data, 0) if len(data) >= _HEADER.size else None
            if head is None or head[0] != MAGIC:
                continue
            refs, _ = scan_segment(data, seq, head[4])
            wanted = [r for r in refs if r.lsn >= lsn]
            if wanted:
                first, last = wanted[0], wanted[-1]
                out.append(
                    (first.lsn, len(wanted), data[first.position : last.position + last.size])
                )
        return out

    def sync(self) -> int:
        """Make every record written so far durable; returns the lsn durable through.

        When the sync fails, what was written since the last good one may be lost: appends
        are refused until :meth:`drop_unsynced` has cut it off.
        """
        with self._sync_lock:
            return self._sync_held()

    def _sync_held(self) -> int:
        if self._sync_failed:
            raise OSError(errno.EIO, "a sync of this log failed: its unsynced records go first")
        with self._lock:
            fd, position, last = self._fd, self._position, self.next_lsn - 1
        if last > self.synced_lsn:
            try:
                self._sync_file(fd)
            except OSError:
                self._sync_failed = True
                raise
            with self._lock:
                self._synced_position, self.synced_lsn = position, last
        return self.synced_lsn

    def _sync_file(self, fd: int) -> None:
        if self.sync_mode != "none":
            (os.fdatasync if self.sync_mode == "fdatasync" else os.fsync)(fd)

    def _sync_cut(self, fd: int) -> None:
        """A file's new, shorter size made durable (fsync: a size is metadata), unless this log
        syncs nothing."""
        if self.sync_mode != "none":
            os.fsync(fd)

    def drop_unsynced(self) -> None:
        """After a failed sync: cut off every record written since the last durable one, and
        number on from there (the caller fails the appends it made meanwhile). No append may
        run meanwhile."""
        with self._sync_lock:
            with self._lock:
                position, lsn = self._synced_position, self.synced_lsn
            if self._fd >= 0:
                self._cut(position)
            with self._lock:
                self._position, self.next_lsn = position, lsn + 1
            self._sync_failed = False

    def _cut(self, position: int) -> None:
        """Forget everything from ``position`` on (after a failed append); best effort."""
        try:
            os.ftruncate(self._fd, position)
            self._sync_cut(self._fd)
        except OSError:
            log.exception("could not cut a failed append off %s", self._segments[self._active])

    # -- reading and retiring ----------------------------------------------------------------
    def read_payload(self, ref: RecordRef) -> bytes:
        """A record's payload, as written."""
        with self._lock:
            path = self._segments[ref.segment]
        with open(path, "rb") as fh:
            fh.seek(ref.position + HEADER_BYTES)
            return fh.read(ref.length)

    def read(self, ref: RecordRef) -> pa.Table:
        """A record's rows as a table, whatever its kind."""
        return decode_payload(ref, self.read_payload(ref))

    def retire(self, segments: list[int]) -> int:
        """Retire sealed segments (never the active one): one may become the spare, the others
        are deleted. Returns how many went."""
        gone = 0
        for seq in sorted(segments):
            if seq == self._active:
                continue
            with self._lock:
                path = self._segments.pop(seq, None)
                reuse = seq in self._reusable and not (
                    self._spare_ready or self._reusing or self._closing
                )
                self._reusable.discard(seq)
                if reuse:
                    # a zeroing under way stops: reusing this one writes next to nothing (under
                    # load, the paced zeroing of a spare took seconds, and no segment was reused)
                    self._reusing = True
                    self._stop_zeroing = self._zeroing
            if path is None:
                continue
            if reuse:
                self._reuse(path)
            else:
                os.unlink(path)
            gone += 1
        if gone:
            self._sync_directory()
        return gone

    @property
    def active_segment(self) -> int:
        return self._active

    @property
    def segment_count(self) -> int:
        with self._lock:
            return len(self._segments)

    def close(self) -> None:
        self._closing = True
        spare = self._spare
        if spare is not None:
            spare.join()
        for name in (_SPARE_TMP, _REUSE_TMP):
            with contextlib.suppress(OSError):
                os.unlink(os.path.join(self.directory, name))
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
