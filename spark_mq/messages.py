"""Messages: one value from a transport's frame, through the session, the broker and the
journal, and back out to a consumer.

A :class:`Messages` holds its messages in one of two forms, and only code that does something
cheaper with one of them asks which:

* **rows**: an Arrow table or record batch with any of the columns a message may have (headers,
  a group, a priority, an expiry or delivery time): a produced batch, a commit's rows of
  ``MESSAGE_SCHEMA``, what Delta holds;
* **plain messages** (:class:`PlainMessage`): a body and a dedup id each, nothing else.

The commonest produce is one message of a body and a dedup id (a synchronous send, a producer
sending one at a time). Carried as Arrow, its way through the broker built and took apart one-row
tables about forty times (reading the frame, the stored columns, the offset, the segment record,
the store's chunk, the delivery), most of the broker's CPU for such a message. Plain, it goes
through the group commit, the hot tier's segment log and the message store as it came, and
reaches a consumer as a ``ONE`` frame of the direct wire. A table is built only where one is
needed (the mover's Delta commit, a browse, a Flight consumer, a selector), once for many
messages: :meth:`Messages.table`.

A plain message's stored row has the default priority, its enqueue time, dedup id and body, and
nulls everywhere else: exactly the row the general path stores for the same message.
"""

from __future__ import annotations

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

_STRING, _BINARY, _INT32 = pa.string(), pa.binary(), pa.int32()


class PlainMessage:
    """One plain message; ``offset`` is -1 until the journal's commit gives it one."""

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


class Messages:
    """Messages as rows or as plain messages (see the module); exactly one of the two.

    ``plain`` is the plain messages (None: rows); ``rows`` the Arrow data as given (None:
    plain). Once the journal has committed them they are in offset order, and plain messages
    carry their offsets.
    """

    __slots__ = ("_table", "num_rows", "plain", "rows")

    def __init__(
        self,
        rows: pa.Table | pa.RecordBatch | None = None,
        plain: list[PlainMessage] | None = None,
    ) -> None:
        self.rows = rows
        self.plain = plain
        if plain is not None:
            self._table: pa.Table | None = None
            self.num_rows: int = len(plain)  # (an attribute: read five times a produce)
        else:
            assert rows is not None
            self._table = rows if isinstance(rows, pa.Table) else None
            self.num_rows = rows.num_rows

    @classmethod
    def of(cls, rows: pa.Table | pa.RecordBatch) -> Messages:
        return cls(rows)

    @classmethod
    def one(cls, message: PlainMessage) -> Messages:
        return cls(None, [message])

    @classmethod
    def of_plain(cls, messages: list[PlainMessage]) -> Messages:
        return cls(None, messages)

    @classmethod
    def joined(cls, parts: list[Messages]) -> Messages:
        """One value for the messages of ``parts``, in order: plain if every part is."""
        if len(parts) == 1:
            return parts[0]
        if all(p.plain is not None for p in parts):
            return cls(None, [m for p in parts for m in p.plain or ()])
        return cls(pa.concat_tables([p.table() for p in parts]))

    @property
    def nbytes(self) -> int:
        """About what the messages take in memory (the size of the rows' buffers: ``.nbytes``
        walks every array to find shared ones, ~17 us a batch)."""
        plain = self.plain
        if plain is None:
            return self._given().get_total_buffer_size()
        if len(plain) == 1:  # the usual produce and commit of a plain message: inline
            m = plain[0]
            return len(m.body) + (len(m.dedup_id) if m.dedup_id else 0) + 40
        return sum(m.nbytes for m in plain)

    def table(self) -> pa.Table:
        """The messages as a table (built once): the rows as given, or plain messages as rows
        of ``MESSAGE_SCHEMA`` (with their offsets: built after the journal's commit)."""
        if self._table is None:
            rows = self.rows
            if rows is None:
                assert self.plain is not None
                self._table = plain_table(self.plain)
            else:
                self._table = rows if isinstance(rows, pa.Table) else pa.Table.from_batches([rows])
        return self._table

    def _given(self) -> pa.Table | pa.RecordBatch:
        assert self.rows is not None
        return self.rows

    def __repr__(self) -> str:
        form = "plain" if self.plain is not None else "rows"
        return f"Messages({self.num_rows} {form})"


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


def plain_batch(messages: list[PlainMessage]) -> pa.RecordBatch:
    """Plain messages as the produce batch a ``PLAIN`` frame is read as (for the general
    path)."""
    columns = {
        "body": variable_column(_BINARY, [m.body for m in messages]),
        "dedup_id": variable_column(
            _STRING, [None if m.dedup_id is None else m.dedup_id.encode() for m in messages]
        ),
    }
    return pa.record_batch([columns[n] for n in _PLAIN_PRODUCE.names], schema=_PLAIN_PRODUCE)
