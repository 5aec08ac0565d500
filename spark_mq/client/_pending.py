"""Messages a producer buffered, and what a stream sends of them: a ``PLAIN`` frame when each
is only a body and a dedup id, else an Arrow batch (of every column of ``PRODUCE_SCHEMA``, or of
only those the messages use)."""

from __future__ import annotations

import struct
from collections.abc import Mapping
from concurrent.futures import Future
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Any

import numpy as np
import pyarrow as pa

from spark_mq import wire
from spark_mq.schema import PRODUCE_SCHEMA, null_column, numpy_buffer, numpy_column


@dataclass
class Pending:
    """One message given to ``send``, until its batch is sent."""

    body: bytes
    message_id: str | None
    dedup_id: str
    group_id: str | None
    priority: int | None
    headers: list[tuple[str, str]] | None
    ttl_ms: int | None
    expiry_time: datetime | None
    delay_ms: int | None
    deliver_time: datetime | None
    future: Future | Any  # (the asyncio SDK's producer keeps an asyncio future here)

    @classmethod
    def of(
        cls,
        body: bytes | str,
        dedup_id: str,
        future: Future | Any,
        *,
        message_id: str | None = None,
        group_id: str | None = None,
        priority: int | None = None,
        headers: Mapping[str, str] | None = None,
        ttl_s: float | None = None,
        expiry_time: datetime | None = None,
        delay_s: float | None = None,
        deliver_at: datetime | None = None,
    ) -> Pending:
        """A message as ``send``'s arguments give it (a text body as UTF-8, times in ms)."""
        return cls(
            body.encode() if isinstance(body, str) else body,
            message_id,
            dedup_id,
            group_id,
            priority,
            list(headers.items()) if headers else None,
            None if ttl_s is None else int(ttl_s * 1000),
            expiry_time,
            None if delay_s is None else int(delay_s * 1000),
            deliver_at,
            future,
        )


# built once: constructing and comparing DataTypes per column was a third of a send's cost
_BINARY, _STRING, _INT32, _INT64 = pa.binary(), pa.string(), pa.int32(), pa.int64()
_FIXED_WIDTH = {_INT32.id: np.int32, _INT64.id: np.int64}
_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)
_MICROSECOND = timedelta(microseconds=1)
_VARIABLE = {_BINARY.id, _STRING.id}
_NONE, _BYTES, _TEXT = {type(None)}, {bytes}, {bytes, str}
_INT, _DATETIME, _LIST = {int}, {datetime}, {list}
_ONE_VALUE = struct.Struct("<ii")  # the offsets of a one-value binary or string column
# a message's fields, named as in Pending, in PRODUCE_SCHEMA's order
_FIELDS = [(f.name, f.type) for f in PRODUCE_SCHEMA]


# the options of send() a PLAIN frame carries (besides the body): plain_of's test, for a message
# not yet made a Pending (Producer.send_sync's direct way)
PLAIN_OPTIONS = frozenset({"destination", "dedup_id"})


def plain_of(items: list[Pending]) -> wire.Plain | None:
    """Buffered messages as a ``PLAIN`` frame, when each is only a body (bytes) and a dedup id:
    what ``send`` makes of a message given no options. None for any other. Written, not built
    as an Arrow batch and serialized: a one-message frame takes 0.2 us, a batch 11 us
    (measured)."""
    ids, bodies, size = [], [], 0
    for i in items:
        if (
            type(i.body) is not bytes
            or i.message_id is not None
            or i.group_id is not None
            or i.priority is not None
            or i.headers is not None
            or i.ttl_ms is not None
            or i.expiry_time is not None
            or i.delay_ms is not None
            or i.deliver_time is not None
        ):
            return None
        dedup_id = i.dedup_id.encode()
        ids.append(dedup_id)
        bodies.append(i.body)
        size += len(dedup_id) + len(i.body)
    return wire.Plain(ids, bodies) if wire.Plain.fits(size) else None


def batch_of(items: list[Pending], *, every_column: bool) -> pa.RecordBatch:
    """Buffered messages as a batch: of every column of ``PRODUCE_SCHEMA``, or of only those
    some message uses. A plain message is then a body and a dedup id, and neither the SDK nor
    the broker handles the other eight columns (a one-message batch: 10 us built, against 16)."""
    columns, mask = [], 0
    for i, (name, typ) in enumerate(_FIELDS):
        values = [getattr(item, name) for item in items]
        if every_column or any(v is not None for v in values):
            columns.append(column(values, typ))
            mask |= 1 << i
    schema = PRODUCE_SCHEMA if every_column else wire.PRODUCE_SUBSETS.schema(mask)
    return pa.RecordBatch.from_arrays(columns, schema=schema)


def column(values: list[Any], typ: pa.DataType) -> pa.Array:
    """An Arrow column of ``values``, built from buffers where it can be.

    An unused field (all None) skips the conversion, which was most of a single message's cost.
    ``pa.array`` also imports pandas on its first call in a process (0.15-0.4 s measured): bytes,
    strings, integers, times and headers without gaps are assembled here instead, so a
    producer's first send is as fast as the rest.
    """
    n = len(values)
    # the values' types, in one pass: a batch of 1,000 bodies was checked in four (with a
    # union type built per value), 565 us of its 1 ms build; 190 us now
    kinds = set(map(type, values))
    if kinds == _NONE:
        return null_column(n, typ)  # shared: most fields of most messages are unused
    if type(None) in kinds:
        return pa.array(values, typ)
    if typ.id in _VARIABLE and kinds <= _TEXT:
        data = values if kinds == _BYTES else [v.encode() if type(v) is str else v for v in values]
        if n == 1:  # a single message: two offsets, no numpy round trip
            if len(data[0]) >= 2**31:
                return pa.array(values, typ)
            offsets = pa.py_buffer(_ONE_VALUE.pack(0, len(data[0])))
            return pa.Array.from_buffers(typ, 1, [None, offsets, pa.py_buffer(data[0])])
        ends = np.zeros(n + 1, dtype=np.int64)
        np.cumsum(np.fromiter(map(len, data), dtype=np.int64, count=n), out=ends[1:])
        if ends[-1] >= 2**31:  # over 32-bit offsets: let pyarrow say what is wrong
            return pa.array(values, typ)
        buffers = [None, numpy_buffer(ends.astype(np.int32)), pa.py_buffer(b"".join(data))]
        return pa.Array.from_buffers(typ, n, buffers)
    if typ.id in _FIXED_WIDTH and kinds == _INT:
        return numpy_column(np.array(values, _FIXED_WIDTH[typ.id]), typ)
    if isinstance(typ, pa.TimestampType) and typ.unit == "us" and kinds == _DATETIME:
        # as pyarrow reads them: a naive time is UTC; whole microseconds, no float rounding
        since = [(v if v.tzinfo else v.replace(tzinfo=timezone.utc)) - _EPOCH for v in values]
        return numpy_column(np.array([d // _MICROSECOND for d in since], np.int64), typ)
    if isinstance(typ, pa.MapType) and kinds == _LIST:  # headers
        pairs = [pair for v in values for pair in v]
        if all(type(k) is str and type(x) is str for k, x in pairs):
            ends = np.zeros(n + 1, np.int32)
            np.cumsum(np.fromiter(map(len, values), np.int32, count=n), out=ends[1:])
            keys = column([k for k, _ in pairs], typ.key_type)
            items = column([x for _, x in pairs], typ.item_type)
            return pa.MapArray.from_arrays(  # type: ignore[call-overload]  # (any map type)
                numpy_column(ends, _INT32), keys, items, type=typ
            )
    return pa.array(values, typ)
