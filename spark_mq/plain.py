"""A single plain message as Python values, from the wire to the consumer.

The commonest produce is one message of a body and a dedup id (a synchronous send, a producer
sending one at a time): a ``PLAIN`` frame of one message. Carried as Arrow, its way through the
broker built and took apart one-row tables about forty times (reading the frame, the stored
columns, the offset, the segment record, the store's chunk, the delivery), most of the broker's
CPU for such a message. As a :class:`PlainMessage` it goes through the group commit, the hot
tier's segment log (a record of kind ``KIND_PLAIN``) and the message store as it is, and reaches
a consumer as a ``ONE`` frame. A table of ``MESSAGE_SCHEMA`` is built only where one is needed
(the mover's Delta commit, a browse, a Flight consumer, a selector), once for many messages:
:meth:`PlainRows.table`.

A plain message's stored row has the default priority, its enqueue time, dedup id and body, and
nulls everywhere else: exactly the row the general path stores for the same message.
"""

from __future__ import annotations

import struct

import numpy as np
import pyarrow as pa

from spark_mq.schema import (
    DEFAULT_PRIORITY,
    MESSAGE_SCHEMA,
    PRODUCE_SCHEMA,
    TS,
    constant_column,
    null_column,
    numpy_column,
    variable_column,
)
from spark_mq.value_rows import ValueRows

# a message's fixed part in a segment record: enqueue time, dedup id length (-1: none), body length
_ENTRY = struct.Struct("<qiI")
_STRING, _BINARY, _INT32 = pa.string(), pa.binary(), pa.int32()


class PlainMessage:
    """One plain message; ``offset`` is -1 until the group commit gives it one."""

    __slots__ = ("body", "dedup_id", "enqueue_time_us", "offset")

    def __init__(
        self, dedup_id: str | None, body: bytes, enqueue_time_us: int = 0, offset: int = -1
    ) -> None:
        self.dedup_id = dedup_id
        self.body = body
        self.enqueue_time_us = enqueue_time_us
        self.offset = offset

    @property
    def nbytes(self) -> int:
        """About what its row takes in memory: what the limits and the memory monitor count."""
        return len(self.body) + (len(self.dedup_id) if self.dedup_id else 0) + 40

    def __repr__(self) -> str:
        return f"PlainMessage(offset={self.offset}, dedup_id={self.dedup_id!r}, {len(self.body)} B)"


class PlainRows(ValueRows[PlainMessage]):
    """Plain messages with offsets, in offset order: the messages of one commit."""

    __slots__ = ()

    @staticmethod
    def build(items: list[PlainMessage]) -> pa.Table:
        """The messages as rows of ``MESSAGE_SCHEMA``."""
        return plain_table(items)

    # -- the segment record (``KIND_PLAIN``) ------------------------------------------------
    def encode(self) -> bytes:
        """Each message's enqueue time, id and body lengths, id and body: its bytes as they came
        (the offsets are the record's: the first, then one more each)."""
        parts: list[bytes] = []
        for m in self.items:
            dedup = m.dedup_id.encode() if m.dedup_id is not None else b""
            id_size = -1 if m.dedup_id is None else len(dedup)
            parts += (_ENTRY.pack(m.enqueue_time_us, id_size, len(m.body)), dedup, m.body)
        return b"".join(parts)

    @classmethod
    def decode(cls, payload: bytes | memoryview, first_offset: int, rows: int) -> PlainRows:
        """What :meth:`encode` wrote; ``ValueError`` when the payload does not hold ``rows``."""
        view = memoryview(payload)
        messages, pos = [], 0
        for i in range(rows):
            enqueue, id_size, body_size = _ENTRY.unpack_from(view, pos)
            pos += _ENTRY.size
            id_end = pos + max(id_size, 0)
            end = id_end + body_size
            if end > len(view):
                raise ValueError(f"a plain record's message {i} runs past its payload")
            dedup = None if id_size < 0 else bytes(view[pos:id_end]).decode()
            messages.append(PlainMessage(dedup, bytes(view[id_end:end]), enqueue, first_offset + i))
            pos = end
        if pos != len(view):
            over = len(view) - pos
            raise ValueError(f"a plain record of {rows} message(s) has {over} byte(s) over")
        return cls(messages)


def plain_table(messages: list[PlainMessage]) -> pa.Table:
    """Rows of ``MESSAGE_SCHEMA`` for plain messages with offsets, built from buffers (no
    per-row Arrow calls, and no pandas import, which pyarrow's conversion of Python values does)."""
    n = len(messages)
    offsets = np.fromiter((m.offset for m in messages), np.int64, n)
    enqueue = np.fromiter((m.enqueue_time_us for m in messages), np.int64, n)
    ids = [m.dedup_id for m in messages]
    return pa.table(
        [
            numpy_column(offsets, pa.int64()),
            null_column(n, _STRING),
            variable_column(_STRING, [None if i is None else i.encode() for i in ids]),
            null_column(n, _STRING),
            constant_column(DEFAULT_PRIORITY, n, _INT32),
            numpy_column(enqueue, TS),
            null_column(n, TS),
            null_column(n, TS),
            null_column(n, MESSAGE_SCHEMA.field("headers").type),
            variable_column(_BINARY, [m.body for m in messages]),
        ],
        schema=MESSAGE_SCHEMA,
    )


_PLAIN_PRODUCE = pa.schema([f for f in PRODUCE_SCHEMA if f.name in ("body", "dedup_id")])


def plain_batch(message: PlainMessage) -> pa.RecordBatch:
    """The message as the produce batch a ``PLAIN`` frame is read as (for the general path)."""
    columns = {
        "body": variable_column(_BINARY, [message.body]),
        "dedup_id": variable_column(
            _STRING, [None if message.dedup_id is None else message.dedup_id.encode()]
        ),
    }
    return pa.record_batch([columns[n] for n in _PLAIN_PRODUCE.names], schema=_PLAIN_PRODUCE)
