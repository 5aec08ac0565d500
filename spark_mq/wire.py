"""The direct wire: sparkmq's low-latency transport for producers and consumers (plain TCP, and
a local socket for clients on the broker's machine).

Arrow Flight stays the transport of administration, browsing, transactions and Spark; the SDK's
producers and consumers use this one when the broker offers it (``ping`` says on which port, and
the name of the local socket).
Each frame is a 5-byte header (body length, u32 little-endian; kind, u8) and a body:

* ``CONTROL``: one JSON frame of :mod:`spark_mq.protocol` (``Produce``, ``Consume``, ``Welcome``,
  ``Settle``, ``Reply``, ``Bye``, ``PutAck``, ``PutFailed``) or :class:`Failure`;
* ``BATCH``: a u32 sequence number, then one Arrow IPC record batch message without its schema:
  ``PRODUCE_SCHEMA`` from a producer, ``DELIVERY_SCHEMA`` to a consumer (both sides know it);
* ``COLUMNS``: from a producer, a batch of only some of ``PRODUCE_SCHEMA``'s columns (those a
  message uses: the SDK's plain message is a body and a dedup id): a u32 sequence number, a u16
  naming them (bit ``i``: field ``i``, in the schema's order), then the IPC record batch message
  of those columns. The absent ones are null; the broker need not look at them.
* ``PLAIN``: from a producer, messages of only a body and a dedup id (the SDK's plain message)
  laid out as Arrow lays out their columns, with no IPC metadata to write or read: a u32
  sequence number, a u32 message count ``n``, the dedup ids' ``n + 1`` i32 offsets, the
  bodies' ``n + 1`` i32 offsets, then the ids' UTF-8 bytes and the bodies' bytes. Brokers from
  wire version 2 on take it (``ping`` says which version a broker speaks).
* ``ONE``: to a consumer that asked for them (``Consume.compact``), a delivery of one message
  whose only fields are a body, a dedup id, a priority and the broker's (no message id, group,
  headers, expiry or delivery time): ``ONE_HEAD`` (a u32 sequence number, 0; the i64 offset,
  the i64 enqueue time in microseconds, the i32 priority, the i32 delivery count, the i32
  length of the dedup id, -1 for none), the id's UTF-8 bytes, then the body. A consumer reads
  it without Arrow, and the broker writes it without an IPC batch.

A connection does one thing, named by its first frame. A producer connection starts with
``Produce``; each batch is answered by a ``PutAck``/``PutFailed`` carrying its sequence number,
once durable. A consumer connection starts with ``Consume``; the broker answers ``Welcome``,
then sends deliveries and the replies to ``Settle`` frames; after ``Bye`` it answers what came
before and closes. A refusal is a :class:`Failure` frame, and the broker closes the connection.
"""

from __future__ import annotations

import itertools
import json
import socket
import ssl
import struct
from dataclasses import dataclass
from typing import Any, NamedTuple, TypeAlias

import pyarrow as pa

from spark_mq import protocol
from spark_mq.arrow_checks import checked
from spark_mq.errors import ProtocolError, SparkMQError, to_wire
from spark_mq.messages import PlainMessage
from spark_mq.schema import DEFAULT_PRIORITY, MESSAGE_SCHEMA, PRODUCE_SCHEMA

HEADER = struct.Struct("<IB")
SEQ = struct.Struct("<I")
CONTROL, BATCH, COLUMNS, PLAIN, ONE = 1, 2, 3, 4, 5
# a frame's body: bytes, or an Arrow buffer (a big frame's, received in place: FrameReader)
Body: TypeAlias = "bytes | pa.Buffer"
PRODUCE_KINDS = (BATCH, COLUMNS, PLAIN)  # the frames that carry a producer's messages
# 1: CONTROL, BATCH, COLUMNS; 2: and PLAIN, ONE; 3: and heartbeats (on Flight too); 4: and the
# settle verb "release"; 5: and settle frames with their entries as runs
VERSION = 5
MASK = struct.Struct("<H")
PLAIN_HEAD = struct.Struct("<II")  # sequence number, message count
_ONE_PLAIN = struct.Struct("<IBIIiiii")  # a one-message PLAIN frame up to its id: all but data
_ONE_PLAIN_OFFSETS = struct.Struct("<iiii")  # a one-message PLAIN frame's id and body offsets
_OFFSET = struct.Struct("<i")
_OFFSET_LIMIT = 2**31  # i32 offsets
ONE_HEAD = struct.Struct("<Iqqiii")
_ONE_FRAME = struct.Struct("<IBIqqiii")  # a ONE frame's header and ONE_HEAD
# what a frame may carry beyond a batch's own buffers (IPC metadata, padding)
FRAME_SLACK = 1024 * 1024
# the most a connection's frames may be before it says what it is (a login, a produce or a
# consume frame: small JSON): an unauthenticated client cannot make the broker buffer more
PRELOGIN_MAX_FRAME = 64 * 1024


@dataclass(frozen=True)
class Failure:
    """The broker refuses the connection's first frame (or something later): why, as on Flight."""

    error: dict[str, Any]


@dataclass(frozen=True)
class TooLarge:
    """A frame over the reader's limit; its body was skipped, the stream goes on."""

    kind: int
    seq: int
    size: int


def control(frame: protocol.Frame | Failure, *, runs: bool = False) -> bytes:
    """A control frame; ``runs``: a settle frame's entries as runs (wire version 5)."""
    if runs and type(frame) is protocol.Settle:
        body = protocol.encode_settle_runs(frame)
    elif isinstance(frame, Failure):
        doc = {"type": "failure", "error": frame.error}
        body = json.dumps(doc, separators=(",", ":")).encode()
    else:
        body = protocol.encode(frame)
    return HEADER.pack(len(body), CONTROL) + body


def failure(err: SparkMQError) -> bytes:
    return control(Failure(json.loads(to_wire(err))))


def control_bytes(body: Body) -> bytes:
    """A control frame's body: bytes (only other frames are received in place, as buffers)."""
    assert isinstance(body, bytes), "a control frame is never received in place"
    return body


def parse_control(body: bytes) -> protocol.Frame | Failure:
    if body.startswith(b'{"type":"failure"'):
        try:
            doc = json.loads(body)
        except ValueError as exc:
            raise ProtocolError(f"failure frame is not JSON: {exc}", fault="remote") from None
        if not isinstance(doc.get("error"), dict):
            raise ProtocolError("failure.error must be an object", fault="remote")
        return Failure(doc["error"])
    return protocol.parse(body)


def batch_parts(seq: int, batch: pa.RecordBatch) -> list[Any]:
    """A batch frame as buffers to hand to ``sendmsg`` (the batch is not copied)."""
    message = batch.serialize()
    return [HEADER.pack(SEQ.size + message.size, BATCH) + SEQ.pack(seq), message]


def read_batch(body: Body, schema: pa.Schema) -> tuple[int, pa.RecordBatch]:
    """A batch frame's sequence number and batch; a malformed one is a ``ProtocolError``."""
    if len(body) < SEQ.size:
        raise ProtocolError("batch frame shorter than its sequence number", fault="remote")
    (seq,) = SEQ.unpack_from(body)
    return seq, _batch(seq, pa.py_buffer(body)[SEQ.size :], schema)


def _batch(seq: int, message: pa.Buffer, schema: pa.Schema) -> pa.RecordBatch:
    try:
        batch = pa.ipc.read_record_batch(message, schema)
    except (pa.ArrowInvalid, OSError, ValueError) as exc:
        raise ProtocolError(
            f"batch {seq} is not an Arrow record batch of the expected schema: {exc}",
            fault="remote",
        ) from None
    return checked(batch, f"batch {seq}")


class ColumnSubsets:
    """The schemas of ``COLUMNS`` frames: subsets of ``full`` (in its order) by their mask."""

    def __init__(self, full: pa.Schema) -> None:
        if len(full) > 8 * MASK.size:
            raise ValueError(f"a column mask of {MASK.size} bytes names at most 16 columns")
        self.full = full
        self._schemas: dict[int, pa.Schema] = {}
        self._masks: dict[tuple[str, ...], int] = {}

    def schema(self, mask: int) -> pa.Schema:
        """The schema of the columns ``mask`` names; ``ValueError`` for bits past the last."""
        schema = self._schemas.get(mask)
        if schema is None:
            if not 0 < mask < 1 << len(self.full):
                raise ValueError(f"column mask {mask:#x} names no column or an unknown one")
            schema = pa.schema([f for i, f in enumerate(self.full) if mask >> i & 1])
            self._schemas[mask] = schema
            self._masks[tuple(schema.names)] = mask
        return schema

    def parts(self, seq: int, batch: pa.RecordBatch) -> list[Any]:
        """``batch`` (some of ``full``'s columns, in its order) as a ``COLUMNS`` frame."""
        names = tuple(batch.schema.names)
        mask = self._masks.get(names)
        if mask is None:
            at = {name: i for i, name in enumerate(self.full.names)}
            mask = sum(1 << at[name] for name in names if name in at)
        # types too, every time: the broker reads the frame with the schema its mask names
        if not mask or not batch.schema.equals(self.schema(mask)):
            raise ValueError(
                f"columns {batch.schema} are not some of {self.full.names} in that order, "
                "each of its type"
            )
        message = batch.serialize()
        head = HEADER.pack(SEQ.size + MASK.size + message.size, COLUMNS)
        return [head + SEQ.pack(seq) + MASK.pack(mask), message]

    def read(self, body: Body) -> tuple[int, pa.RecordBatch]:
        """A ``COLUMNS`` frame's sequence number and batch; a malformed one is a
        ``ProtocolError``."""
        if len(body) < SEQ.size + MASK.size:
            raise ProtocolError("columns frame shorter than its header", fault="remote")
        (seq,) = SEQ.unpack_from(body)
        (mask,) = MASK.unpack_from(body, SEQ.size)
        try:
            schema = self.schema(mask)
        except ValueError as exc:
            raise ProtocolError(f"batch {seq}: {exc}", fault="remote") from None
        return seq, _batch(seq, pa.py_buffer(body)[SEQ.size + MASK.size :], schema)


@dataclass(frozen=True, slots=True)
class Plain:
    """Messages of only a body and a dedup id, as a ``PLAIN`` frame carries them."""

    dedup_ids: list[bytes]
    bodies: list[bytes]

    @staticmethod
    def fits(total_bytes: int) -> bool:
        """Whether messages of this many bytes in all (ids and bodies) fit i32 offsets."""
        return total_bytes < _OFFSET_LIMIT

    def parts(self, seq: int) -> list[Any]:
        """The frame as buffers to hand to ``sendmsg`` (a single body is not copied)."""
        ids, bodies = self.dedup_ids, self.bodies
        n = len(bodies)
        if n == 1:  # the commonest frame: one pack, no offset lists (0.2 us, measured)
            (d,), (b,) = ids, bodies
            size = PLAIN_HEAD.size + 4 * _OFFSET.size + len(d) + len(b)
            return [_ONE_PLAIN.pack(size, PLAIN, seq, 1, 0, len(d), 0, len(b)) + d, b]
        id_ends = itertools.accumulate(map(len, ids), initial=0)
        body_ends = itertools.accumulate(map(len, bodies), initial=0)
        offsets = struct.pack(f"<{2 * (n + 1)}i", *id_ends, *body_ends)
        ids_data, bodies_data = b"".join(ids), b"".join(bodies)
        size = PLAIN_HEAD.size + len(offsets) + len(ids_data) + len(bodies_data)
        return [
            HEADER.pack(size, PLAIN) + PLAIN_HEAD.pack(seq, n) + offsets + ids_data,
            bodies_data,
        ]


def read_plain(body: Body) -> tuple[int, pa.RecordBatch]:
    """A ``PLAIN`` frame's sequence number and its messages, as a batch of ``PLAIN_SCHEMA``
    over the frame's own bytes; a malformed one is a ``ProtocolError``."""
    if len(body) < PLAIN_HEAD.size:
        raise ProtocolError("plain frame shorter than its header", fault="remote")
    seq, n = PLAIN_HEAD.unpack_from(body)
    ids_at = PLAIN_HEAD.size
    bodies_at = ids_at + _OFFSET.size * (n + 1)
    data_at = bodies_at + _OFFSET.size * (n + 1)
    if len(body) < data_at:
        raise ProtocolError(
            f"batch {seq}: a plain frame of {len(body)} bytes cannot hold the offsets of {n} "
            "messages",
            fault="remote",
        )
    (ids_size,) = _OFFSET.unpack_from(body, bodies_at - _OFFSET.size)
    (bodies_size,) = _OFFSET.unpack_from(body, data_at - _OFFSET.size)
    if ids_size < 0 or bodies_size < 0 or data_at + ids_size + bodies_size != len(body):
        raise ProtocolError(
            f"batch {seq}: a plain frame of {len(body)} bytes, but its offsets end at "
            f"{ids_size} (ids) and {bodies_size} (bodies) after {data_at} bytes of header",
            fault="remote",
        )
    buf = pa.py_buffer(body)
    bodies_data_at = data_at + ids_size
    try:
        ids = pa.Array.from_buffers(
            _STRING, n, [None, buf[ids_at:bodies_at], buf[data_at:bodies_data_at]]
        )
        bodies = pa.Array.from_buffers(
            _BINARY, n, [None, buf[bodies_at:data_at], buf[bodies_data_at:]]
        )
        ids.validate(full=True)  # offsets in order and in bounds, ids UTF-8
        bodies.validate(full=True)
    except (pa.ArrowInvalid, ValueError) as exc:
        raise ProtocolError(
            f"batch {seq}: a plain frame's offsets or dedup ids are invalid: {exc}",
            fault="remote",
        ) from None
    return seq, pa.RecordBatch.from_arrays([bodies, ids], schema=PLAIN_SCHEMA)


def read_plain_message(body: Body) -> tuple[int, PlainMessage] | None:
    """A well-formed ``PLAIN`` frame of exactly one message: its sequence number and the
    message (see :mod:`spark_mq.messages`); None for any other frame, which :func:`read_plain`
    reads (or refuses, saying what is wrong)."""
    data_at = PLAIN_HEAD.size + _ONE_PLAIN_OFFSETS.size
    if len(body) < data_at:
        return None
    seq, n = PLAIN_HEAD.unpack_from(body)
    ids_at, id_end, bodies_at, body_end = _ONE_PLAIN_OFFSETS.unpack_from(body, PLAIN_HEAD.size)
    if n != 1 or ids_at or bodies_at or id_end < 0 or body_end < 0:
        return None
    if data_at + id_end + body_end != len(body):
        return None
    if not isinstance(body, bytes):  # received in place (one big message): its bytes
        body = body.to_pybytes()
    try:
        dedup_id = body[data_at : data_at + id_end].decode()
    except UnicodeDecodeError:
        return None
    return seq, PlainMessage(dedup_id, body[data_at + id_end :])


class One(NamedTuple):
    """A ``ONE`` frame's message: what a consumer needs of it."""

    offset: int
    enqueue_time_us: int
    priority: int
    delivery_count: int
    dedup_id: str | None
    body: bytes


# the columns of MESSAGE_SCHEMA a ONE frame's message has no value in
_NOT_IN_ONE = [
    MESSAGE_SCHEMA.get_field_index(name)
    for name in ("message_id", "group_id", "expiry_time", "deliver_time", "headers")
]
_AT = {name: i for i, name in enumerate(MESSAGE_SCHEMA.names)}
_OFFSET_AT, _ENQUEUE_AT, _PRIORITY_AT = _AT["offset"], _AT["enqueue_time"], _AT["priority"]
_DEDUP_AT, _BODY_AT = _AT["dedup_id"], _AT["body"]


def one_parts(rows: pa.Table, state: list[tuple[int, bool]]) -> list[Any] | None:
    """A delivery (rows of ``MESSAGE_SCHEMA``, each one's delivery count and whether it is its
    group's first) as a ``ONE`` frame; None unless it is one message a ``ONE`` frame can carry.
    The body is not copied."""
    if len(state) != 1 or rows.num_rows != 1 or state[0][1]:
        return None
    if not rows.schema.equals(MESSAGE_SCHEMA) or any(
        rows.column(i).null_count != 1 for i in _NOT_IN_ONE
    ):
        return None
    priority, dedup = rows.column(_PRIORITY_AT)[0], rows.column(_DEDUP_AT)[0]
    if not priority.is_valid:
        return None
    dedup_id = dedup.as_buffer() if dedup.is_valid else None
    id_size = -1 if dedup_id is None else dedup_id.size
    body = rows.column(_BODY_AT)[0].as_buffer()
    head = _ONE_FRAME.pack(
        ONE_HEAD.size + max(id_size, 0) + body.size,
        ONE,
        0,
        rows.column(_OFFSET_AT)[0].as_py(),
        rows.column(_ENQUEUE_AT)[0].value,
        priority.as_py(),
        state[0][0],
        id_size,
    )
    return [head, body] if dedup_id is None else [head, dedup_id, body]


def plain_one_parts(message: PlainMessage, delivery_count: int) -> list[Any]:
    """A plain message's delivery as a ``ONE`` frame (the body is not copied)."""
    dedup = None if message.dedup_id is None else message.dedup_id.encode()
    id_size = -1 if dedup is None else len(dedup)
    head = _ONE_FRAME.pack(
        ONE_HEAD.size + max(id_size, 0) + len(message.body),
        ONE,
        0,
        message.offset,
        message.enqueue_time_us,
        DEFAULT_PRIORITY,
        delivery_count,
        id_size,
    )
    return [head, message.body] if dedup is None else [head, dedup, message.body]


def read_one(body: Body) -> One:
    """A ``ONE`` frame's message; a malformed one is a ``ProtocolError``."""
    if not isinstance(body, bytes):  # received in place (a big message)
        body = body.to_pybytes()
    if len(body) < ONE_HEAD.size:
        raise ProtocolError("a one-message delivery shorter than its header", fault="remote")
    _, offset, enqueue_us, priority, count, id_size = ONE_HEAD.unpack_from(body)
    id_end = ONE_HEAD.size + max(id_size, 0)
    if id_end > len(body):
        raise ProtocolError(
            f"a one-message delivery of {len(body)} bytes with a dedup id of {id_size}",
            fault="remote",
        )
    try:
        dedup_id = None if id_size < 0 else body[ONE_HEAD.size : id_end].decode()
    except UnicodeDecodeError as exc:
        raise ProtocolError(f"a delivered dedup id is not UTF-8: {exc}", fault="remote") from None
    return One(offset, enqueue_us, priority, count, dedup_id, body[id_end:])


# a frame body this big is received in place (see FrameReader.sink), not copied out of the
# reader's buffer: under batched produce of 1 MiB frames, copying them in and out of that
# buffer held the GIL for 43 % of the broker's time, three quarters of its wire loop's
RECEIVE_IN_PLACE_BYTES = 64 * 1024


class FrameReader:
    """Cuts a byte stream into ``(kind, body)`` frames; frames over ``max_body`` are skipped and
    reported as :class:`TooLarge` (a producer's oversized batch gets an answer, not a hang-up).

    A big batch frame's body (any kind but ``CONTROL``, of ``RECEIVE_IN_PLACE_BYTES`` or more)
    gets a buffer of its own once its header is in: the caller receives the rest of it straight
    there (:meth:`sink`, :meth:`filled`), and the frame's body is that buffer (``pa.Buffer``).
    """

    def __init__(self, max_body: int | None = None) -> None:
        self._buf = bytearray()
        self.max_body = max_body  # may change between frames (a connection's, once logged in)
        # cut one frame a feed and keep the rest (a connection not yet known: what follows its
        # first frame may have other limits); feed(b"") cuts the next
        self.one_at_a_time = False
        self._skip = 0
        self._kind = 0
        self._body: pa.Buffer | None = None  # a big frame's body, being received in place
        self._view: memoryview | None = None  # its bytes, writable
        self._have = 0  # how much of it has come

    @property
    def partial(self) -> int | None:
        """The size of the frame being received (0 while its header is incomplete), or None
        between frames."""
        if self._view is not None:
            return len(self._view)
        if self._skip:
            return self._skip
        if not self._buf:
            return None
        if len(self._buf) < HEADER.size:
            return 0
        size = HEADER.unpack_from(self._buf)[0]
        if len(self._buf) >= HEADER.size + size:
            return None  # whole, waiting to be cut (one_at_a_time): nothing is being received
        return size

    @property
    def buffered(self) -> int:
        """Bytes received and not cut into frames yet."""
        return len(self._buf)

    def sink(self) -> memoryview | None:
        """Where the next bytes of the stream go without a copy (the rest of a big frame's
        body: ``recv_into`` it, then call :meth:`filled`), or None: :meth:`feed` them."""
        return None if self._view is None else self._view[self._have :]

    def filled(self, n: int) -> list[tuple[int, Body] | TooLarge]:
        """``n`` bytes were received into :meth:`sink`: the frame, once it is whole."""
        assert self._view is not None and self._body is not None
        self._have += n
        if self._have < len(self._view):
            return []
        frame = (self._kind, self._body)
        self._body = self._view = None
        return [frame]

    def feed(self, data: bytes | memoryview) -> list[tuple[int, Body] | TooLarge]:
        """The frames ``data`` completes. ``data`` is copied: the caller may reuse its buffer
        (the readers receive into one buffer, over and over).

        Frames are cut from ``data`` itself when nothing is left over from before: each byte is
        copied once, into the frame's body (the start of a big frame came through here, 256 KiB
        of a 1 MiB one, and was copied three times: 0.3-0.6 ms of the loop's time a frame).
        """
        out: list[tuple[int, Body] | TooLarge] = []
        data = memoryview(data).cast("B")
        if self._view is not None:  # the rest of a big frame's body, then what follows it
            n = min(len(data), len(self._view) - self._have)
            self._view[self._have : self._have + n] = data[:n]
            out += self.filled(n)
            data = data[n:]
        if self._skip:
            n = min(self._skip, len(data))
            self._skip -= n
            data = data[n:]
        if self._buf:
            self._buf += data
            with memoryview(self._buf) as src:
                pos = self._cut(src, out)
            del self._buf[:pos]
        else:
            pos = self._cut(data, out)
            self._buf += data[pos:]  # a frame's start, to be completed by what comes next
        return out

    def _cut(self, src: memoryview, out: list[tuple[int, Body] | TooLarge]) -> int:
        """Append the frames ``src`` holds to ``out``; returns how much of it they took (a big
        frame's start is taken too: its body is being received in place)."""
        pos = 0
        while len(src) - pos >= HEADER.size:
            if self.one_at_a_time and out:
                break
            size, kind = HEADER.unpack_from(src, pos)
            body_at = pos + HEADER.size
            if self.max_body is not None and size > self.max_body:
                if len(src) - body_at < SEQ.size:
                    break  # wait for the sequence number, to say which batch it was
                (seq,) = SEQ.unpack_from(src, body_at)
                out.append(TooLarge(kind, seq, size))
                have = len(src) - body_at
                if have >= size:
                    pos = body_at + size
                    continue
                self._skip = size - have
                return len(src)
            have = len(src) - body_at
            if have < size:
                if size >= RECEIVE_IN_PLACE_BYTES and kind != CONTROL:
                    self._kind, self._body = kind, pa.allocate_buffer(size)
                    self._view = memoryview(self._body).cast("B")
                    self._view[:have] = src[body_at:]
                    self._have = have
                    return len(src)
                break
            out.append((kind, bytes(src[body_at : body_at + size])))
            pos = body_at + size
        return pos


# what a local (Unix) socket may hold unread. A Unix stream socket's queue is bounded by its
# sender's send buffer, 208 KiB by default: a 1 MiB batch then crossed in five steps, each
# waiting for the reader to wake, and under batched produce both sides idled half the time.
# 4 MiB: measured 303-309k msg/s of 1 KiB with sync=none against 204-242k (the kernel caps the
# request at net.core.wmem_max; TCP sockets keep the kernel's own buffer tuning).
LOCAL_SEND_BUFFER_BYTES = 4 * 1024 * 1024


def widen_local_send_buffer(sock: socket.socket) -> None:
    """Let a Unix socket hold a few big frames unread (:data:`LOCAL_SEND_BUFFER_BYTES`)."""
    if sock.family == socket.AF_UNIX:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, LOCAL_SEND_BUFFER_BYTES)


def send_parts(sock: socket.socket, parts: list[Any]) -> None:
    """Write every buffer of ``parts`` on a blocking socket (``sendmsg`` may write a part; a
    TLS socket has none: the parts go as one buffer)."""
    if isinstance(sock, ssl.SSLSocket):
        sock.sendall(b"".join(memoryview(p).cast("B") for p in parts))
        return
    views = [memoryview(p).cast("B") for p in parts]
    while views:
        sent = sock.sendmsg(views)
        while views and sent >= len(views[0]):
            sent -= len(views[0])
            views.pop(0)
        if sent:
            views[0] = views[0][sent:]


PRODUCE_SUBSETS = ColumnSubsets(PRODUCE_SCHEMA)  # what a producer's COLUMNS frames carry
# what a PLAIN frame is read as: the COLUMNS batch of the same messages
PLAIN_SCHEMA = PRODUCE_SUBSETS.schema(
    sum(1 << PRODUCE_SCHEMA.get_field_index(name) for name in ("body", "dedup_id"))
)
_STRING, _BINARY = pa.string(), pa.binary()
