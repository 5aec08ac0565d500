"""Arrow schemas: what sits in a Delta row and what crosses the wire.

* ``MESSAGE_SCHEMA``: one row of a destination's message log (the Delta table).
* ``PRODUCE_COLUMNS``: what a producer may send; :func:`normalize_produce_batch` checks and
  converts it into ``MESSAGE_SCHEMA`` minus the broker-assigned ``offset``.
* ``DELIVERY_SCHEMA``: what a consumer receives (message columns plus delivery state).
* ``SETTLEMENT_SCHEMA``: one row of a destination's settlement log (acks and other outcomes).
* ``BINDING_SCHEMA``: one event of the bindings log (destinations and subscriptions).
"""

from __future__ import annotations

import functools
import json
from collections.abc import Sequence
from typing import cast

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from spark_mq.errors import MessageRejected, MessageTooLarge, SchemaMismatch

# a table's column, or a batch's
Column = pa.Array | pa.ChunkedArray


def schema_of(*fields: pa.Field) -> pa.Schema:
    """A schema of ``fields`` (typed: a list of fields of several types is a list of objects
    to the type checker)."""
    return pa.schema(fields)


TS = pa.timestamp("us", tz="UTC")
HEADERS = pa.map_(pa.string(), pa.string())

MESSAGE_SCHEMA = schema_of(
    pa.field("offset", pa.int64()),
    pa.field("message_id", pa.string()),
    pa.field("dedup_id", pa.string()),
    pa.field("group_id", pa.string()),
    pa.field("priority", pa.int32()),
    pa.field("enqueue_time", TS),
    pa.field("expiry_time", TS),
    pa.field("deliver_time", TS),
    pa.field("headers", HEADERS),
    pa.field("body", pa.binary()),
)
UNOFFSET_SCHEMA = pa.schema([f for f in MESSAGE_SCHEMA if f.name != "offset"])

DELIVERY_SCHEMA = schema_of(
    *MESSAGE_SCHEMA,
    pa.field("delivery_count", pa.int32()),
    pa.field("redelivered", pa.bool_()),
    # the first message of a group this consumer received since it became the group's owner
    pa.field("group_first", pa.bool_()),
)

SETTLEMENT_SCHEMA = schema_of(
    pa.field("offset", pa.int64()),
    pa.field("subscription", pa.string()),
    pa.field("outcome", pa.string()),
    pa.field("settle_time", TS),
    pa.field("reason", pa.string()),
)

# A settlement row of this outcome says its subscription has settled every offset below the
# row's own: compaction and an owner's collapse of its settlement log write it in place of the
# rows they remove (the other outcomes are named in spark_mq.broker.recovery).
COMPACTED = "compacted"
# A row of this outcome says its subscription has settled every offset from the row's own up to
# the one its reason names (exclusive): an owner's collapse writes it in place of the rows of a
# long run of settled offsets above a low-water mark, past a message held unacknowledged. (A
# reader that knows only the outcomes above reads it as its own offset settled: the rest of the
# run would be delivered again, never lost.)
SETTLED_RUN = "settled-run"
# the reason of the ``returned`` rows that release a Spark query's claims
# (``released:<claimant>``): they count whatever their offset, so no collapse removes them
RELEASED_PREFIX = "released:"

BINDING_SCHEMA = schema_of(
    pa.field("seq", pa.int64()),
    pa.field("event", pa.string()),
    pa.field("destination", pa.string()),
    pa.field("kind", pa.string()),
    pa.field("subscription", pa.string()),
    pa.field("start_offset", pa.int64()),
    pa.field("time", TS),
    # JSON: a destination's settings overrides, a subscription's selector
    pa.field("settings", pa.string()),
)

# one event of the transaction log: a commit (what to apply), or done (it was applied)
TRANSACTION_SCHEMA = schema_of(
    pa.field("txid", pa.string()),
    pa.field("event", pa.string()),
    pa.field("time", TS),
    pa.field("messages", pa.binary()),  # Arrow IPC: UNOFFSET_SCHEMA plus "destination"
    pa.field("acks", pa.string()),  # JSON: [[destination, subscription, offset], ...]
    # JSON: a commit's destinations -> each one's end offset before applying (at most); a done
    # row's, the destinations whose part it marks done (null: all of them)
    pa.field("ends", pa.string()),
)
TRANSACTION_COMMIT, TRANSACTION_DONE = "commit", "done"  # a transaction log row's event

DEFAULT_PRIORITY = 4  # the JMS default
QUEUE_SUBSCRIPTION = ""  # a queue is consumed through one implicit subscription

# column -> the type it is cast to; ``ttl_ms`` is turned into ``expiry_time`` and ``delay_ms``
# into ``deliver_time`` (scheduled delivery).
PRODUCE_COLUMNS: dict[str, pa.DataType] = {
    "body": pa.binary(),
    "message_id": pa.string(),
    "dedup_id": pa.string(),
    "group_id": pa.string(),
    "priority": pa.int32(),
    "headers": HEADERS,
    "ttl_ms": pa.int64(),
    "expiry_time": TS,
    "delay_ms": pa.int64(),
    "deliver_time": TS,
}
PRODUCE_SCHEMA = pa.schema([pa.field(n, t) for n, t in PRODUCE_COLUMNS.items()])


def _cast_column(name: str, column: Column, target: pa.DataType) -> Column:
    if column.type == target:
        return column
    if name == "body" and not (
        pa.types.is_binary(column.type)
        or pa.types.is_large_binary(column.type)
        or pa.types.is_binary_view(column.type)
        or pa.types.is_string(column.type)
        or pa.types.is_large_string(column.type)
        or pa.types.is_string_view(column.type)
    ):
        raise SchemaMismatch(
            f"column 'body' must be binary or string, got {column.type}", column="body"
        )
    try:
        return column.cast(target)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
        raise SchemaMismatch(
            f"column {name!r} has type {column.type}, expected {target}: {exc}", column=name
        ) from exc


def normalize_produce_batch(
    batch: pa.RecordBatch | pa.Table,
    *,
    enqueue_time_us: int,
    max_message_bytes: int,
    destination: str,
) -> pa.Table:
    """Check a produced batch and convert it to ``UNOFFSET_SCHEMA``.

    Raises ``SchemaMismatch`` for a missing ``body``, an unknown column or a column of the wrong
    type, ``MessageTooLarge`` for a body over ``max_message_bytes`` and ``MessageRejected`` for a
    priority outside 0-9.
    """
    if isinstance(batch, pa.RecordBatch):
        plain = _plain_rows(batch, enqueue_time_us, max_message_bytes, destination)
        if plain is not None:
            return plain
    names = batch.schema.names
    unknown = [n for n in names if n not in PRODUCE_COLUMNS]
    if unknown:
        raise SchemaMismatch(
            f"unknown column(s) {unknown} in batch for {destination!r}; allowed: "
            f"{sorted(PRODUCE_COLUMNS)}",
            destination=destination,
            column=unknown[0],
        )
    if "body" not in names:
        raise SchemaMismatch(
            f"batch for {destination!r} has no 'body' column", destination=destination
        )
    n = batch.num_rows
    cols = {
        name: _cast_column(name, batch.column(i), PRODUCE_COLUMNS[name])
        for i, name in enumerate(names)
    }
    # an all-null column (what the SDK sends for unused fields) needs no compute kernel
    cols = {k: v for k, v in cols.items() if k == "body" or v.null_count < n}
    body = cols["body"]
    if body.null_count:
        raise SchemaMismatch("column 'body' must not contain nulls", destination=destination)
    if n and body.nbytes > max_message_bytes:
        _check_body_sizes(body, max_message_bytes, destination)
    given = cols.get("priority")
    priority: Column
    if given is None:
        priority = constant_column(DEFAULT_PRIORITY, n, _INT32)
    else:
        priority = fill_null(given, DEFAULT_PRIORITY)
        low, high = pc.min_max(priority).values()
        if low.as_py() < 0 or high.as_py() > 9:
            raise MessageRejected("priority must be between 0 and 9", destination=destination)
    for relative, what in (("ttl_ms", "a time to live"), ("delay_ms", "a delivery delay")):
        column = cols.get(relative)
        if column is not None and n and (least := pc.min(column).as_py()) is not None and least < 0:
            raise MessageRejected(
                f"{what} must not be negative ({relative} = {least}): the message would never "
                "be delivered",
                destination=destination,
            )
    enqueue = numpy_column(np.full(n, enqueue_time_us, np.int64), TS)
    expiry = _time_column(cols, "expiry_time", "ttl_ms", enqueue_time_us, n)
    deliver = _time_column(cols, "deliver_time", "delay_ms", enqueue_time_us, n)

    def opt(name: str, typ: pa.DataType) -> Column:
        return cols[name] if name in cols else null_column(n, typ)

    return pa.table(
        [
            opt("message_id", pa.string()),
            opt("dedup_id", pa.string()),
            opt("group_id", pa.string()),
            priority,
            enqueue,
            expiry,
            deliver,
            opt("headers", HEADERS),
            body,
        ],
        schema=UNOFFSET_SCHEMA,
    )


# where each column sits in a batch of PRODUCE_SCHEMA; _COMPUTED: those that, all null, leave
# nothing to compute (the SDK's usual batch)
_AT = {name: i for i, name in enumerate(PRODUCE_SCHEMA.names)}
_COMPUTED = [_AT[n] for n in ("priority", "ttl_ms", "expiry_time", "delay_ms", "deliver_time")]
# the columns a plain message may use: each is stored as it comes
_PLAIN_COLUMNS = ("body", "message_id", "dedup_id", "group_id", "headers")


def _sources(names: list[str]) -> list[int]:
    """Per column of ``UNOFFSET_SCHEMA``, where a plain batch of columns ``names`` has it (-1:
    it is filled in)."""
    taken = set(_PLAIN_COLUMNS)
    return [names.index(n) if n in names and n in taken else -1 for n in UNOFFSET_SCHEMA.names]


def _plain_subsets() -> dict[tuple[str, ...], tuple[pa.Schema, list[int]]]:
    """Every batch of some of ``PRODUCE_SCHEMA``'s plain columns (in its order, with a body):
    its schema and where each stored column comes from."""
    out = {}
    for mask in range(1, 1 << len(PRODUCE_SCHEMA)):
        fields = [f for i, f in enumerate(PRODUCE_SCHEMA) if mask >> i & 1]
        names = [f.name for f in fields]
        if "body" in names and set(names) <= set(_PLAIN_COLUMNS):
            out[tuple(names)] = (pa.schema(fields), _sources(names))
    return out


_PLAIN_SUBSETS = _plain_subsets()
_FULL_SOURCES = _sources(PRODUCE_SCHEMA.names)
_ENQUEUE_AT = UNOFFSET_SCHEMA.get_field_index("enqueue_time")
_BODY_AT = UNOFFSET_SCHEMA.get_field_index("body")


def _plain_rows(
    batch: pa.RecordBatch, enqueue_time_us: int, max_message_bytes: int, destination: str
) -> pa.Table | None:
    """``normalize_produce_batch`` for a plain batch: its columns are used as they are, no
    kernel runs (a one-message batch: 13 us against the general path's 22). A plain batch is
    exactly ``PRODUCE_SCHEMA`` without priorities, expiry or schedule, or has only some of the
    columns ``_PLAIN_COLUMNS`` names, as the SDK sends over the direct wire: the other columns
    need no null check then (8 us). None for any other batch."""
    schema = batch.schema
    n = batch.num_rows
    if schema.equals(PRODUCE_SCHEMA):
        if any(batch.column(i).null_count != n for i in _COMPUTED):
            return None
        sources = _FULL_SOURCES
    else:
        subset = _PLAIN_SUBSETS.get(tuple(schema.names))
        if subset is None or not schema.equals(subset[0]):
            return None
        sources = subset[1]
    body = batch.column(sources[_BODY_AT])
    if body.null_count:
        raise SchemaMismatch("column 'body' must not contain nulls", destination=destination)
    # a batch off the wire shares no buffers: their total bounds the bodies' (.nbytes is slower)
    if n and body.get_total_buffer_size() > max_message_bytes:
        _check_body_sizes(body, max_message_bytes, destination)
    filled = _filled_columns(n)
    columns = [batch.column(i) if i >= 0 else filled[j] for j, i in enumerate(sources)]
    columns[_ENQUEUE_AT] = numpy_column(np.full(n, enqueue_time_us, np.int64), TS)
    return pa.table(columns, schema=UNOFFSET_SCHEMA)


def _filled_columns(n: int) -> tuple[pa.Array, ...]:
    """Per column of ``UNOFFSET_SCHEMA``, what a plain batch of ``n`` rows without it stores:
    the default priority, else nulls (shared when small)."""
    return _shared_filled(n) if n <= 1024 else _filled(n)


def _filled(n: int) -> tuple[pa.Array, ...]:
    return tuple(
        _constant(DEFAULT_PRIORITY if f.name == "priority" else None, n, f.type)
        for f in UNOFFSET_SCHEMA
    )


_shared_filled = functools.lru_cache(maxsize=64)(_filled)


def _check_body_sizes(body: Column, max_message_bytes: int, destination: str) -> None:
    """``MessageTooLarge`` for a body over the limit (the bodies' total size bounds the largest
    one: only a batch over the limit in all needs this exact check)."""
    largest = pc.max(pc.binary_length(cast(pa.BinaryArray, body))).as_py()
    if largest > max_message_bytes:
        raise body_too_large(largest, max_message_bytes, destination)


def body_too_large(size: int, max_message_bytes: int, destination: str) -> MessageTooLarge:
    """The error for a message body of ``size`` bytes, over ``max_message_bytes``."""
    return MessageTooLarge(
        f"a message body of {size} bytes is over the limit of {max_message_bytes} bytes "
        f"(setting limits.max_message_bytes) for {destination!r}",
        destination=destination,
        size=size,
        limit=max_message_bytes,
    )


def _time_column(
    cols: dict[str, Column], absolute: str, relative_ms: str, enqueue_time_us: int, n: int
) -> Column:
    """An absolute time column, filled where null from a relative one (ms after enqueue)."""
    out = cols.get(absolute)
    if relative_ms in cols:
        base = pa.repeat(pa.scalar(enqueue_time_us, pa.int64()), n)
        later = pc.add(base, pc.multiply(cols[relative_ms], 1000)).cast(TS)
        out = later if out is None else pc.coalesce(out, later)
    return null_column(n, TS) if out is None else out


def numbered_ids(prefix: str, first: int, n: int, sep: str = "-") -> pa.Array:
    """``<prefix><sep><k>`` for k in ``first .. first+n-1``, built columnar (no per-row objects).

    Every value goes in as Arrow data, not Python: pyarrow's first conversion of Python values
    in a process imports pandas, and a producer's first ``send_batch`` took 150-180 ms instead
    of 4-8 (measured).
    """
    plain = numbered_id_buffers(f"{prefix}{sep}".encode(), first, n)
    if plain is not None:  # (the usual: numbers of one width; 16 us for 500, not 71)
        offsets, data = plain
        return pa.Array.from_buffers(pa.string(), n, [None, numpy_buffer(offsets), data])
    seqs = numpy_column(np.arange(first, first + n, dtype=np.int64), pa.int64()).cast(pa.string())
    joined = pc.binary_join_element_wise(  # type: ignore[call-overload]  # (scalars and arrays)
        string_scalar(prefix), seqs, string_scalar(sep)
    )
    return cast(pa.Array, joined)


def numbered_id_buffers(head: bytes, first: int, n: int) -> tuple[np.ndarray, pa.Buffer] | None:
    """The offsets (int32, from 0; read-only) and data of the strings ``head + str(k)`` for k in
    ``first .. first+n-1``, when the numbers are all written with as many digits (else None).

    The numbers follow each other: their last three digits are a slice of a table, and the
    digits before them change once in a thousand rows. The heads come from a copy of rows made
    for the last few (head, width, n) asked (a producer's batches repeat them), for batches of
    up to ``_CACHED_ROWS``. 500 ids in 16 us, where Arrow's cast and join took 71."""
    last = first + n - 1
    if first < 0 or n < 1 or len(str(first)) != len(str(last)):
        return None
    digits = len(str(first))
    width = len(head) + digits
    if n * width >= 2**31:
        return None
    # (a bigger batch's rows are made afresh: the cache holds at most 16 x 4,096 rows)
    template, offsets = (_id_rows if n <= _CACHED_ROWS else _id_rows.__wrapped__)(head, width, n)
    matrix = template.copy()
    low = min(digits, 3)  # the digits the table gives
    k = 10**low
    at = first % k
    table = _DIGITS[low]
    matrix[:, width - low :] = (
        table[at : at + n] if at + n <= len(table) else table[np.arange(at, at + n) % k]
    )
    for high in range(first // k, last // k + 1) if digits > low else ():
        rows = slice(max(0, high * k - first), min(n, (high + 1) * k - first))
        matrix[rows, len(head) : width - low] = np.frombuffer(str(high).encode(), np.uint8)
    return offsets, numpy_buffer(matrix.reshape(-1))


_CACHED_ROWS = 4096


@functools.lru_cache(maxsize=16)
def _id_rows(head: bytes, width: int, n: int) -> tuple[np.ndarray, np.ndarray]:
    """``n`` rows of ``width`` bytes starting with ``head``, and their offsets (read-only)."""
    rows = np.zeros((n, width), np.uint8)
    rows[:, : len(head)] = np.frombuffer(head, np.uint8)
    offsets = np.arange(0, (n + 1) * width, width, dtype=np.int32)
    rows.flags.writeable = offsets.flags.writeable = False
    return rows, offsets


# the numbers 0 .. 10**d - 1 written with d digits, a row each, over and over (d = 1, 2, 3):
# consecutive numbers' last d digits are a slice of it (up to 10,000 numbers)
_DIGITS = {
    d: np.frombuffer(b"".join(b"%0*d" % (d, i % 10**d) for i in range(11_000)), np.uint8).reshape(
        -1, d
    )
    for d in (1, 2, 3)
}


@functools.lru_cache(maxsize=64)
def string_scalar(value: str) -> pa.Scalar:
    """``value`` as an Arrow string scalar, assembled from buffers (no pandas import)."""
    data = value.encode()
    offsets = np.array([0, len(data)], np.int32)
    array = pa.Array.from_buffers(pa.string(), 1, [None, numpy_buffer(offsets), pa.py_buffer(data)])
    return array[0]


# -- columns as Python values, typed: what a schema keeps free of nulls, the type checker cannot
# know (a column's to_pylist() is a list of optional values to it)
def strings(column: Column) -> list[str]:
    """The values of a string column that holds no nulls."""
    return cast("list[str]", column.to_pylist())


def ints(column: Column) -> list[int]:
    """The values of an integer column that holds no nulls."""
    return cast("list[int]", column.to_pylist())


def message_columns(columns: Sequence[str] | None) -> pa.Schema:
    """``MESSAGE_SCHEMA``, or its ``columns`` alone (a read that needs only some: a message's
    body is most of what a read decodes), which must include ``offset``."""
    if columns is None:
        return MESSAGE_SCHEMA
    assert "offset" in columns, "rows are read in offset order"
    return pa.schema([MESSAGE_SCHEMA.field(name) for name in columns])


def by_offset(table: pa.Table) -> pa.Table:
    """``table`` in offset order: as it is when it already is (reads of a log mostly are:
    sorting copies every body, which a consumer of a backlog paid for each read)."""
    offsets = table["offset"].to_numpy()
    if len(offsets) < 2 or bool(np.all(offsets[1:] > offsets[:-1])):
        return table
    return table.sort_by("offset")


def fill_null(column: Column, value: object) -> Column:
    """``column`` with its nulls replaced by ``value``."""
    if type(value) is str and column.type == pa.string():
        # (pyarrow makes a scalar of a Python string through pandas, imported on first use)
        value = string_scalar(value)
    # (the stubs want the value typed as the column is: one type variable for both)
    return cast(Column, pc.fill_null(column, value))  # type: ignore[type-var]


def equal_to(column: Column, value: str | int) -> pa.ChunkedArray | pa.BooleanArray:
    """Where ``column`` equals ``value`` (a mask for ``filter``)."""
    return pc.equal(column, pa.scalar(value))


def null_column(n: int, typ: pa.DataType) -> pa.Array:
    """An all-null column (shared when small, see :func:`constant_column`)."""
    return constant_column(None, n, typ)


def constant_column(value: object, n: int, typ: pa.DataType) -> pa.Array:
    """``value`` (None: null) ``n`` times. Small ones are shared: they are immutable, and the hot
    path needs the same few again and again (the nulls of a one-message batch's unused fields,
    its default priority, an ack's subscription and outcome)."""
    return _shared_constant(value, n, typ) if n <= 1024 else _constant(value, n, typ)


def _constant(value: object, n: int, typ: pa.DataType) -> pa.Array:
    # (the stubs know these only for a type known statically)
    if value is None:
        return pa.nulls(n, typ)  # type: ignore[call-overload]
    return pa.repeat(pa.scalar(value, typ), n)  # type: ignore[call-overload]


_shared_constant = functools.lru_cache(maxsize=256)(_constant)


def numpy_column(values: np.ndarray, typ: pa.DataType) -> pa.Array:
    """A boolean or fixed-width Arrow column over a numpy array (of ``typ``'s own dtype),
    without ``pa.array``'s per-call overhead (tens of microseconds for a one-row delivery)."""
    if typ.id == _BOOL_ID:
        bits = np.packbits(values, bitorder="little")
        return pa.Array.from_buffers(typ, len(values), [None, numpy_buffer(bits)])
    return pa.Array.from_buffers(typ, len(values), [None, numpy_buffer(values)])


def column_numpy(column: Column, nulls_as: int | None = None) -> np.ndarray:
    """An integer column as a numpy array over its buffers (no copy when it is one chunk
    without nulls); its nulls as ``nulls_as`` (None: it has none). pyarrow's ``to_numpy``, and
    its scalars of Python values, import pandas on first use in a process: a consumer's first
    ``batch.ack()`` took 0.25 s more than the next."""
    typ = column.type
    if not pa.types.is_integer(typ) or (column.null_count and nulls_as is None):
        return column.to_numpy(zero_copy_only=False)  # (not what this is for: as pyarrow has it)
    dtype = np.dtype(f"{'i' if pa.types.is_signed_integer(typ) else 'u'}{typ.bit_width // 8}")
    parts = []
    for chunk in column.chunks if isinstance(column, pa.ChunkedArray) else [column]:
        if not len(chunk):
            continue
        at, n = chunk.offset, len(chunk)
        data = chunk.buffers()[1]
        values = np.frombuffer(memoryview(data), dtype)[at : at + n]  # type: ignore[arg-type]
        if chunk.null_count:
            values = np.where(_present(chunk), values, np.asarray(nulls_as, dtype))
        parts.append(values)
    if len(parts) == 1:
        return parts[0]
    return np.concatenate(parts) if parts else np.empty(0, dtype)


def null_mask(column: Column) -> np.ndarray:
    """Whether each value of ``column`` is null (from its validity bits; see column_numpy)."""
    masks = [
        ~_present(chunk) if chunk.null_count else np.zeros(len(chunk), np.bool_)
        for chunk in (column.chunks if isinstance(column, pa.ChunkedArray) else [column])
    ]
    return np.concatenate(masks) if masks else np.zeros(0, np.bool_)


def _present(chunk: pa.Array) -> np.ndarray:
    """Whether each value of an array with nulls is present (its validity bits)."""
    bits = np.frombuffer(memoryview(chunk.buffers()[0]), np.uint8)  # type: ignore[arg-type]
    at = chunk.offset
    return np.unpackbits(bits, axis=0, count=at + len(chunk), bitorder="little")[at:] == 1


def numpy_buffer(values: np.ndarray) -> pa.Buffer:
    """An Arrow buffer over a numpy array's memory (no copy)."""
    return pa.py_buffer(values)  # type: ignore[arg-type]  # (numpy's buffer protocol: 3.12 stubs)


def variable_column(typ: pa.DataType, values: Sequence[bytes | None]) -> pa.Array:
    """A string or binary column of ``values`` (None: null), from its buffers."""
    n = len(values)
    lengths = np.fromiter((0 if v is None else len(v) for v in values), np.int64, n)
    ends = np.zeros(n + 1, np.int64)
    np.cumsum(lengths, out=ends[1:])
    if ends[-1] >= 2**31:
        raise ValueError("2 GiB or more of strings or bytes in one column")
    data = pa.py_buffer(b"".join(v for v in values if v is not None))
    valid = None
    nulls = sum(v is None for v in values)
    if nulls:
        present = np.fromiter((v is not None for v in values), np.bool_, n)
        valid = numpy_buffer(np.packbits(present, bitorder="little"))
    return pa.Array.from_buffers(
        typ, n, [valid, numpy_buffer(ends.astype(np.int32)), data], null_count=nulls
    )


_BOOL_ID = pa.bool_().id
_INT32 = pa.int32()


def with_offsets(table: pa.Table, first_offset: int) -> pa.Table:
    """Prepend the broker-assigned, gap-free ``offset`` column."""
    n = table.num_rows
    offsets = numpy_column(np.arange(first_offset, first_offset + n, dtype=np.int64), pa.int64())
    return table.add_column(0, MESSAGE_SCHEMA.field("offset"), offsets)


def conform(table: pa.Table, schema: pa.Schema) -> pa.Table:
    """Cast what a reader returned (delta-rs may give string_view, large types) to ``schema``."""
    table = pa.table(table) if not isinstance(table, pa.Table) else table
    for field in schema:  # a column added in a later version reads as nulls from older data
        if field.name not in table.column_names and field.nullable:
            table = table.append_column(field.name, pa.nulls(table.num_rows, field.type))
    return table.select(schema.names).cast(schema)


def finished_transactions(rows: pa.Table) -> tuple[set[str], dict[str, set[str]]]:
    """Of a transaction log's rows (``txid``, ``event``, ``acks``, ``ends``): the transactions
    done (a done row for all of it, or done rows for parts that cover every destination its
    commit names), and the parts marked done of the others (txid -> destinations)."""
    done = rows.filter(equal_to(rows["event"], TRANSACTION_DONE))
    whole: set[str] = set()
    parts: dict[str, set[str]] = {}
    for txid, ends in zip(strings(done["txid"]), done["ends"].to_pylist(), strict=True):
        if ends is None:
            whole.add(txid)
        else:
            parts.setdefault(txid, set()).update(json.loads(ends))
    if parts:
        commits = rows.filter(equal_to(rows["event"], TRANSACTION_COMMIT))
        for txid, acks, ends in zip(
            strings(commits["txid"]),
            commits["acks"].to_pylist(),
            commits["ends"].to_pylist(),
            strict=True,
        ):
            named = set(json.loads(ends or "{}")) | {a[0] for a in json.loads(acks or "[]")}
            if txid in parts and named <= parts[txid]:
                whole.add(txid)
    return whole, {t: p for t, p in parts.items() if t not in whole}
