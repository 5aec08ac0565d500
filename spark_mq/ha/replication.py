"""Replication of the hot tier to a backup with a disk of its own (``ha.mode = "replication"``).

The primary ships every record its hot tier writes, exactly as written and with its lsn, to
the backup over one TCP connection (the replication port); the backup appends the same bytes to
its own segment log and fsyncs them, then acknowledges. With ``ha.ack = "replicated"`` the
primary's group commit completes a flush only once both its own sync and the backup's
acknowledgement are in: one round trip per flush, not per message.

Who may take over is decided in the ownership record (:mod:`spark_mq.ha.ownership`), not by
the two brokers talking: once a new backup has a copy of every unmoved record (the initial
copy), the primary records it as *in sync*; when it loses the backup, it records that it has
none *before* it acknowledges anything alone. A backup takes over (the next epoch) only if the
latest record names it in sync, and the two commits race in Delta, so exactly one wins. A
backup that is still copying, or was left behind, refuses to take over and says so.

The channel goes through the security layer like every other (the service hands it over as a
:class:`ChannelSecurity`): with security on, the backup logs in with its environment's
credentials (``SPARKMQ_USERNAME`` / ``SPARKMQ_PASSWORD`` or ``SPARKMQ_TOKEN``, as any client)
and must be allowed the ``admin`` verb on the broker; with TLS configured
(``security.tls_cert_file``) the connection is TLS, the backup trusting ``SPARKMQ_TLS_CA_FILE``.

Frames (both ways): ``length u32 | kind u8 | payload``; control payloads are JSON, a records
frame is a JSON header (its length first, u32) and the records' bytes.
"""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import os
import shutil
import socket
import ssl
import struct
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from spark_mq.errors import ConfigError, Deposed
from spark_mq.ha.ownership import Owner, Ownership
from spark_mq.journal.dir_lock import StoppedWaiting
from spark_mq.journal.segments import SegmentLog

if TYPE_CHECKING:
    from spark_mq.journal.hot_tier import HotTier
    from spark_mq.journal.journal import Journal

log = logging.getLogger(__name__)

_FRAME = struct.Struct("<IB")
_LEN = struct.Struct("<I")
HELLO, WELCOME, BEGIN, RECORDS, SYNCED, MOVED, DROP, PING, ACK, REFUSED = range(1, 11)


@dataclass(frozen=True)
class ChannelSecurity:
    """How the replication channel is secured, as the service's security layer says (this
    package knows nothing of users, tokens or rules): the primary checks a backup's HELLO with
    ``authorize`` (its credentials and peer -> why it may not follow, or None) and wraps the
    connection with ``server_tls``; the backup presents ``credentials`` and wraps with
    ``client_tls``."""

    authorize: Callable[[dict[str, Any], str], str | None] | None = None
    server_tls: Callable[[], ssl.SSLContext] | None = None
    client_tls: ssl.SSLContext | None = None
    credentials: dict[str, str | None] = field(default_factory=dict)


OPEN_CHANNEL = ChannelSecurity()


def _send(sock: socket.socket, kind: int, payload: bytes) -> None:
    sock.sendall(_FRAME.pack(len(payload), kind) + payload)


def _control(sock: socket.socket, kind: int, **doc: Any) -> None:
    _send(sock, kind, json.dumps(doc).encode())


def _records_payload(doc: dict[str, Any], data: bytes) -> bytes:
    head = json.dumps(doc).encode()
    return _LEN.pack(len(head)) + head + data


class _Reader:
    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.buf = bytearray()

    def frame(self) -> tuple[int, bytes] | None:
        """The next frame (blocking, with the socket's timeout); None at the end."""
        while True:
            if len(self.buf) >= _FRAME.size:
                length, kind = _FRAME.unpack_from(self.buf, 0)
                if len(self.buf) >= _FRAME.size + length:
                    payload = bytes(self.buf[_FRAME.size : _FRAME.size + length])
                    del self.buf[: _FRAME.size + length]
                    return kind, payload
            chunk = self.sock.recv(1 << 20)
            if not chunk:
                return None
            self.buf += chunk

    @property
    def buffered(self) -> bool:
        if len(self.buf) < _FRAME.size:
            return False
        length, _ = _FRAME.unpack_from(self.buf, 0)
        return len(self.buf) >= _FRAME.size + length


def listen(
    host: str, port: int, *, until: threading.Event | None = None, wait_s: float = 30.0
) -> socket.socket:
    """The replication port's listening socket. A port still held (by a process that is going
    away) is tried again every half second for up to ``wait_s``, saying so; then ``ConfigError``
    naming the setting. Bound before this broker takes an epoch: a primary that owns the data
    but cannot let its backup follow would leave the pair without a backup."""
    deadline = time.monotonic() + wait_s
    said = False
    while True:
        try:
            return socket.create_server((host, port), reuse_port=False)
        except OSError as exc:
            if exc.errno != errno.EADDRINUSE or time.monotonic() >= deadline:
                raise ConfigError(
                    f"cannot listen for the backup on {host}:{port}: {exc.strerror or exc} "
                    "(ha.replication_port)",
                    setting="ha.replication_port",
                ) from None
            if not said:
                said = True
                log.warning(
                    "replication: port %d is in use; trying again for up to %.0f s", port, wait_s
                )
        if until is not None and until.wait(0.5):
            raise StoppedWaiting("stopped while waiting for the replication port")
        if until is None:
            time.sleep(0.5)


# -- the primary's side ------------------------------------------------------------------------
class Replicator:
    """The primary's end: a listener the backup connects to, the copy of what it lacks, and
    every record written since, shipped as written."""

    def __init__(
        self,
        journal: Journal,
        ownership: Ownership,
        owner: Owner,
        *,
        host: str,
        port: int,
        replicated_acks: bool,
        timeout_s: float,
        heartbeat_s: float,
        on_deposed: Any,
        channel: ChannelSecurity | None = None,
        listener: socket.socket | None = None,
    ) -> None:
        self.journal, self.ownership, self.owner = journal, ownership, owner
        self.channel = channel or OPEN_CHANNEL
        self.replicated_acks = replicated_acks
        self.timeout_s, self.heartbeat_s = timeout_s, heartbeat_s
        self._on_deposed = on_deposed
        self._cond = threading.Condition()
        self.state = "alone"  # alone | copying | in_sync | clearing
        self.backup_id = ""
        self._sock: socket.socket | None = None
        self._out: deque[bytes] = deque()
        self._seq = 0
        self._acked = 0
        self._synced_seq = 0  # the SYNCED frame's: acknowledged, the backup has everything
        self._begun: set[str] = set()
        self.deposed: Deposed | None = None
        self.shipped_bytes = 0
        self.acked_bytes = 0
        self.shipped_records = 0
        self.acked_records = 0
        self._base_bytes = self._base_records = 0  # shipped before the backup connected
        self._closing = False
        # (bound before the epoch was taken, so a port in use cannot leave an owner that never
        # serves: see listen())
        self._listener = listener if listener is not None else listen(host, port)
        self.port = self._listener.getsockname()[1]
        self._threads = [
            threading.Thread(target=self._accept_loop, name="replication-accept", daemon=True),
            threading.Thread(target=self._send_loop, name="replication-send", daemon=True),
        ]

    def start(self) -> None:
        for t in self._threads:
            t.start()
        log.info("replication: listening for the backup on port %d", self.port)

    # -- what the hot tier calls -------------------------------------------------------------
    def ship(self, tier: HotTier, first_lsn: int, count: int, buffers: list) -> int:
        """(The tier's writer, under its ship lock.) Queue records just written; their
        sequence number (0: no backup to ship to)."""
        with self._cond:
            if self.state not in ("copying", "in_sync"):
                return 0
            if tier.destination not in self._begun:
                return self._begin(tier)  # (the copy holds what was just written)
            data = b"".join(bytes(b) for b in buffers)
            return self._queue_records(tier.destination, first_lsn, count, data)

    def wait(self, seq: int) -> None:
        """(A tier's syncer.) Return once records up to ``seq`` may be acknowledged: the backup
        has them durable, or no backup is recorded in sync (so acknowledging alone is safe).
        ``Deposed`` when a broker with a greater epoch took over meanwhile."""
        if not self.replicated_acks:
            return
        deadline = time.monotonic() + self.timeout_s
        with self._cond:
            while True:
                if self.deposed is not None:
                    raise self.deposed
                if self.state == "clearing":  # not before the record says no backup is in sync
                    self._cond.wait(0.05)
                    continue
                if seq == 0 or self._acked >= seq or self.state in ("alone", "copying"):
                    return
                if time.monotonic() >= deadline and self.state == "in_sync":
                    self._lose_backup(f"no acknowledgement within {self.timeout_s:g} s")
                self._cond.wait(0.05)

    def moved(self, destination: str, lsn: int) -> None:
        with self._cond:
            if destination in self._begun:
                self._queue(MOVED, json.dumps({"d": destination, "lsn": lsn}).encode())

    def dropped(self, destination: str) -> None:
        with self._cond:
            if destination in self._begun:
                self._begun.discard(destination)
                self._queue(DROP, json.dumps({"d": destination}).encode())

    def stats(self) -> dict[str, Any]:
        with self._cond:
            return {
                "replication_state": self.state,
                "replication_backup": self.backup_id,
                "replication_lag_records": self.shipped_records - self.acked_records,
                "replication_lag_bytes": self.shipped_bytes - self.acked_bytes,
            }

    # -- inside (callers hold _cond) -----------------------------------------------------------
    def _queue(self, kind: int, payload: bytes) -> None:
        self._out.append(_FRAME.pack(len(payload), kind) + payload)
        self._cond.notify_all()

    def _queue_records(self, dest: str, first_lsn: int, count: int, data: bytes) -> int:
        self._seq += 1
        doc = {"seq": self._seq, "d": dest, "lsn": first_lsn, "n": count}
        self._queue(RECORDS, _records_payload(doc, data))
        self.shipped_bytes += len(data)
        self.shipped_records += count
        return self._seq

    def _begin(self, tier: HotTier) -> int:
        """Copy one destination's unmoved records (what the backup lacks), then ship its writes
        as they come. (Under the tier's ship lock: no write runs meanwhile.)"""
        first = tier.first_unmoved_lsn()
        self._queue(BEGIN, json.dumps({"d": tier.destination, "lsn": first}).encode())
        seq = 0
        for lsn, count, data in tier.raw_records_from(first):
            seq = self._queue_records(tier.destination, lsn, count, data)
        self._begun.add(tier.destination)
        return seq

    def _lose_backup(self, why: str) -> None:
        sock, self._sock = self._sock, None
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()
        self._out.clear()
        self._begun.clear()
        was = self.state
        if was == "in_sync":
            log.warning("replication: lost the backup %s (%s): recording it", self.backup_id, why)
            self.state = "clearing"
            threading.Thread(target=self._clear, name="replication-clear", daemon=True).start()
        elif was == "copying":
            log.warning("replication: lost the backup %s while copying (%s)", self.backup_id, why)
            self.state = "alone"
        self._cond.notify_all()

    def _was_deposed(self, exc: Deposed) -> None:
        """A broker with a greater epoch took over: acknowledge nothing more, step down."""
        with self._cond:
            self.deposed = exc
            self._cond.notify_all()
        self._on_deposed(exc)

    def _clear(self) -> None:
        """Record that no backup is in sync, before anything is acknowledged alone."""
        try:
            self.owner = self.ownership.mark_in_sync(self.owner, "")
        except Deposed as exc:
            self._was_deposed(exc)
            return
        except Exception as exc:  # the store out of reach: acknowledgements wait, and retry
            log.error("replication: could not record the backup's loss: %s; retrying", exc)
            time.sleep(1.0)
            self._clear()
            return
        with self._cond:
            if self.state == "clearing":
                self.state = "alone"
                log.warning("replication: no backup in sync: acknowledging alone")
            self._cond.notify_all()

    def _mark_in_sync(self, backup: str) -> None:
        try:
            owner = self.ownership.mark_in_sync(self.owner, backup)
        except Deposed as exc:
            self._was_deposed(exc)
            return
        with self._cond:
            self.owner = owner
            if self.state == "copying" and self.backup_id == backup:
                self.state = "in_sync"
                log.info("replication: backup %s is in sync (epoch %d)", backup, owner.epoch)
            self._cond.notify_all()

    # -- threads -----------------------------------------------------------------------------
    def _accept_loop(self) -> None:
        while not self._closing:
            try:
                sock, peer = self._listener.accept()
            except OSError:
                return
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            try:
                sock.settimeout(self.timeout_s)
                if self.channel.server_tls is not None:
                    sock = self.channel.server_tls().wrap_socket(sock, server_side=True)
                reader = _Reader(sock)
                hello = reader.frame()
                if hello is None or hello[0] != HELLO:
                    sock.close()
                    continue
                doc = json.loads(hello[1])
                backup = str(doc["broker_id"])
                authorize = self.channel.authorize
                refused = authorize(doc, str(peer)) if authorize is not None else None
                if refused is not None:
                    log.warning("replication: refusing %s from %s: %s", backup, peer, refused)
                    _control(sock, REFUSED, message=refused)
                    sock.close()
                    continue
                _control(sock, WELCOME, epoch=self.owner.epoch, broker_id=self.owner.broker_id)
            except (OSError, ValueError, KeyError, TypeError) as exc:
                log.info("replication: a connection from %s failed: %s", peer, exc)
                sock.close()
                continue
            with self._cond:
                if self.state == "clearing" or self.deposed is not None:
                    sock.close()
                    continue
                if self._sock is not None:
                    self._lose_backup("another backup connected")
                self._sock, self.backup_id, self.state = sock, backup, "copying"
                self._base_bytes, self._base_records = self.shipped_bytes, self.shipped_records
                self._acked = self._seq
                self.acked_bytes, self.acked_records = self.shipped_bytes, self.shipped_records
                log.info("replication: backup %s connected from %s: copying", backup, peer)
                tiers = list(self.journal.hot_tiers())
            for tier in tiers:  # each under its ship lock, as its writes are
                with tier.ship_lock, self._cond:
                    if self._sock is sock and tier.destination not in self._begun:
                        self._begin(tier)
            with self._cond:
                if self._sock is sock:
                    self._seq += 1
                    self._synced_seq = self._seq
                    self._queue(SYNCED, json.dumps({"seq": self._seq}).encode())
            threading.Thread(
                target=self._ack_loop, args=(sock, reader), name="replication-acks", daemon=True
            ).start()

    def _send_loop(self) -> None:
        last = time.monotonic()
        while True:
            with self._cond:
                while not self._out and not self._closing:
                    left = self.heartbeat_s - (time.monotonic() - last)
                    if left <= 0 and self._sock is not None:
                        self._seq += 1
                        self._queue(PING, json.dumps({"seq": self._seq}).encode())
                        break
                    self._cond.wait(max(left, 0.01))
                if self._closing:
                    return
                sock = self._sock
                frames = list(self._out)
                self._out.clear()
            if sock is None:
                continue
            try:
                sock.sendall(b"".join(frames))
                last = time.monotonic()
            except OSError as exc:
                with self._cond:
                    if self._sock is sock:
                        self._lose_backup(f"sending failed: {exc}")

    def _ack_loop(self, sock: socket.socket, reader: _Reader) -> None:
        sock.settimeout(self.timeout_s + self.heartbeat_s)
        while True:
            try:
                frame = reader.frame()
            except OSError as exc:
                frame, why = None, str(exc)
            else:
                why = "the backup closed the connection"
            if frame is None:
                with self._cond:
                    if self._sock is sock:
                        self._lose_backup(why)
                return
            kind, payload = frame
            if kind != ACK:
                continue
            doc = json.loads(payload)
            mark = None
            with self._cond:
                if self._sock is not sock:
                    return
                self._acked = max(self._acked, int(doc["seq"]))
                # (counted from the backup's connection: what was shipped before it, too)
                self.acked_bytes = self._base_bytes + int(doc.get("bytes", 0))
                self.acked_records = self._base_records + int(doc.get("records", 0))
                if self.state == "copying" and self._synced_seq and self._acked >= self._synced_seq:
                    mark = self.backup_id
                    self._synced_seq = 0
                self._cond.notify_all()
            if mark is not None:
                self._mark_in_sync(mark)

    def close(self) -> None:
        with self._cond:
            self._closing = True
            sock, self._sock = self._sock, None
            self._cond.notify_all()
        # shut down before closing: a close alone leaves the accept thread blocked in accept(),
        # and the kernel keeps the port listening for as long as it is (a broker that stepped
        # down then could not listen on it again when it next took over)
        with contextlib.suppress(OSError):
            self._listener.shutdown(socket.SHUT_RDWR)
        with contextlib.suppress(OSError):
            self._listener.close()
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()
        for t in self._threads:
            if t.is_alive() and t is not threading.current_thread():
                t.join(5)
                if t.is_alive():
                    log.warning("replication: thread %s did not end within 5 s", t.name)


# -- the backup's side -------------------------------------------------------------------------
class Follower:
    """The backup's end: keeps a copy of the primary's unmoved records in its own hot
    directory, from the primary's stream, until the stream ends or falls silent."""

    def __init__(
        self,
        hot_root: str,
        broker_id: str,
        *,
        segment_bytes: int,
        timeout_s: float,
        channel: ChannelSecurity | None = None,
    ) -> None:
        self.hot_root, self.broker_id = hot_root, broker_id
        self.segment_bytes, self.timeout_s = segment_bytes, timeout_s
        self.channel = channel or OPEN_CHANNEL  # its credentials and TLS, as any client's
        self.primary = ""
        self.in_sync = False
        self.refused = ""  # why the primary last refused this backup
        self.written_bytes = self.written_records = 0  # appended since this connection began

    def follow(self, address: tuple[str, int], until: threading.Event | None) -> str | None:
        """Follow the primary at ``address`` until its stream ends; returns its broker id (None
        if it could not be reached)."""
        try:
            sock = socket.create_connection(address, timeout=min(self.timeout_s, 2.0))
        except OSError:
            return None
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.settimeout(self.timeout_s)
        logs: dict[str, SegmentLog] = {}
        last_of: dict[str, dict[int, int]] = {}  # destination -> segment -> its last lsn
        self.primary = ""
        try:
            if self.channel.client_tls is not None:
                sock = self.channel.client_tls.wrap_socket(sock, server_hostname=address[0])
            reader = _Reader(sock)
            _control(sock, HELLO, broker_id=self.broker_id, **self.channel.credentials)
            welcome = reader.frame()
            if welcome is not None and welcome[0] == REFUSED:
                why = json.loads(welcome[1]).get("message", "")
                if why != self.refused:
                    log.error("backup: the primary at %s:%d refused it: %s", *address, why)
                self.refused = why
                return None
            if welcome is None or welcome[0] != WELCOME:
                return None
            doc = json.loads(welcome[1])
            self.primary = doc["broker_id"]
            log.info(
                "backup: following %s (epoch %d) from %s:%d; copying what it has not moved",
                self.primary,
                doc["epoch"],
                *address,
            )
            self._wipe()
            self.in_sync = False
            acked = self.written_bytes = self.written_records = 0
            unsynced: set[str] = set()  # logs written since their last sync
            while until is None or not until.is_set():
                frame = reader.frame()  # (a silent primary: the socket's timeout)
                if frame is None:
                    break
                kind, payload = frame
                seq = self._apply(kind, payload, logs, last_of, unsynced)
                if seq:
                    acked = seq
                if not reader.buffered:  # what came together is synced together, then acked
                    for dest in unsynced:
                        if dest in logs:
                            logs[dest].sync()
                    unsynced.clear()
                    _control(
                        sock, ACK, seq=acked, bytes=self.written_bytes, records=self.written_records
                    )
        except (OSError, ValueError, KeyError) as exc:
            log.warning("backup: the stream from %s ended: %s", self.primary or address, exc)
        finally:
            for seglog in logs.values():
                seglog.close()
            with contextlib.suppress(OSError):
                sock.close()
        return self.primary or None  # (None: it never welcomed this backup)

    def _apply(
        self,
        kind: int,
        payload: bytes,
        logs: dict[str, SegmentLog],
        last_of: dict[str, dict[int, int]],
        unsynced: set[str],
    ) -> int:
        if kind == RECORDS:
            (n,) = _LEN.unpack_from(payload, 0)
            doc = json.loads(payload[_LEN.size : _LEN.size + n])
            data = payload[_LEN.size + n :]
            dest = doc["d"]
            segment = logs[dest].append_raw(int(doc["lsn"]), data, int(doc["n"]), sync=False)
            self.written_bytes += len(data)  # (since this connection: the primary adds its base)
            self.written_records += int(doc["n"])
            unsynced.add(dest)
            last_of[dest][segment] = int(doc["lsn"]) + int(doc["n"]) - 1
            return int(doc["seq"])
        doc = json.loads(payload)
        if kind == BEGIN:
            dest = doc["d"]
            if dest in logs:
                logs.pop(dest).close()
            directory = os.path.join(self.hot_root, dest)
            shutil.rmtree(directory, ignore_errors=True)
            seglog = SegmentLog(directory, segment_bytes=self.segment_bytes, sync="fdatasync")
            seglog.open(first_lsn=int(doc["lsn"]))
            logs[dest], last_of[dest] = seglog, {}
        elif kind == MOVED:
            dest, lsn = doc["d"], int(doc["lsn"])
            moving = logs.get(dest)
            if moving is not None:
                done = [
                    s for s, last in last_of[dest].items()
                    if s != moving.active_segment and last <= lsn
                ]  # fmt: skip
                if done and moving.retire(done):
                    for s in done:
                        last_of[dest].pop(s, None)
        elif kind == DROP:
            dest = doc["d"]
            if dest in logs:
                logs.pop(dest).close()
            shutil.rmtree(os.path.join(self.hot_root, dest), ignore_errors=True)
        elif kind == SYNCED:
            if not self.in_sync:
                log.info("backup: in sync with %s", self.primary)
            self.in_sync = True
            return int(doc["seq"])
        elif kind == PING:
            return int(doc["seq"])
        return 0

    def _wipe(self) -> None:
        """Forget whatever this hot directory held (it is copied again from the primary)."""
        os.makedirs(self.hot_root, exist_ok=True)
        for name in os.listdir(self.hot_root):
            path = os.path.join(self.hot_root, name)
            if os.path.isdir(path) and not name.startswith("."):
                shutil.rmtree(path, ignore_errors=True)
