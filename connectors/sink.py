"""``df.writeStream.format("sparkmq")`` and ``df.write.format("sparkmq")``: produce through the
broker (so offsets stay single-writer), with dedup ids that make retries harmless.

Columns, as Spark's Kafka sink maps them: ``body`` (binary or string, required; ``value`` is
accepted as its Kafka name), ``group_id`` (or Kafka's ``key``, string or UTF-8 binary: a key
orders its messages as a group does), ``headers`` (map<string,string>, or Kafka's
array<struct<key string, value binary>>), ``dedup_id``, ``message_id``, ``priority`` (int),
``ttl_ms`` (long) and ``destination`` (or Kafka's ``topic``; per row, else the ``destination``
option, or Kafka's ``topic`` option). The other columns of a frame read from Kafka
(``partition``, ``offset``, ``timestamp``, ``timestampType``) are left out: a destination has
one partition and gives its own offsets and times. Any other column, or a column of the wrong
type, is an error naming it, before anything is sent.

A row without a ``dedup_id`` gets ``spark:<query id>:<batch id>:<partition>:<row>`` in a stream
(``spark:<stage>:<partition>:<row>`` in a batch write). A retried task or a micro-batch replayed
after a restart sends the same ids, and the broker's duplicate detection stores each once: the
pipeline is exactly-once while replays come within the broker's window (``duplicates.window_s``,
5 minutes, and ``cache_size`` ids per destination).
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import cast

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql.datasource import (
    DataSourceArrowWriter,
    DataSourceStreamArrowWriter,
    WriterCommitMessage,
)
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    DataType,
    IntegerType,
    LongType,
    MapType,
    StringType,
    StructType,
)

from spark_mq.connectors.options import AUTH_OPTION_NAMES, BrokerAuth, canonical
from spark_mq.errors import ConfigError, SchemaMismatch
from spark_mq.names import validate_name
from spark_mq.schema import Column, equal_to, fill_null, numbered_ids, strings

_ALIASES = {"value": "body", "key": "group_id", "topic": "destination"}
_ALLOWED: dict[str, tuple[type[DataType], ...]] = {
    "body": (BinaryType, StringType),
    "group_id": (StringType, BinaryType),
    "headers": (MapType, ArrayType),
    "dedup_id": (StringType,),
    "message_id": (StringType,),
    "priority": (IntegerType,),
    "ttl_ms": (LongType, IntegerType),
    "destination": (StringType,),
}
_SPARKS_OWN = {"path", "checkpointlocation"}  # Spark passes these along; they are not ours
# a Kafka source's columns with no meaning here: dropped before sending
KAFKA_DROPPED = ("partition", "offset", "timestamp", "timestampType")
_KNOWN_OPTIONS = {
    "url",
    "destination",
    "timeout_s",
    "testing.killafterrows",
    "testing.markerdir",
    *AUTH_OPTION_NAMES,
}


@dataclass(frozen=True)
class SinkOptions:
    url: str
    destination: str | None
    timeout_s: float
    kill_after_rows: int | None  # tests only: the Python worker dies once, mid-partition
    marker_dir: str | None
    auth: BrokerAuth = field(default_factory=BrokerAuth)

    @classmethod
    def parse(cls, options: Mapping[str, str], schema: StructType) -> SinkOptions:
        opts = canonical(
            {("destination" if k.lower() == "topic" else k): v for k, v in options.items()
             if k.lower() not in _SPARKS_OWN},
            {k: k for k in _KNOWN_OPTIONS},
        )  # fmt: skip
        url = opts.get("url")
        if not url:
            raise ConfigError(
                "the sparkmq sink writes through the broker: option 'url' is required, e.g. "
                ".option('url', 'grpc://broker:7676')",
                setting="url",
            )
        check_schema(schema)
        dest = opts.get("destination")
        if dest is not None:
            validate_name(dest)
        elif not {"destination", "topic"} & set(schema.fieldNames()):
            raise ConfigError(
                "give option 'destination' (or Kafka's 'topic') or a 'destination' (or 'topic') "
                "column",
                setting="destination",
            )
        kill = opts.get("testing.killafterrows")
        return cls(
            url=url,
            destination=dest,
            timeout_s=float(opts.get("timeout_s", "60")),
            kill_after_rows=int(kill) if kill else None,
            marker_dir=opts.get("testing.markerdir"),
            auth=BrokerAuth.parse(opts),
        )


def check_schema(schema: StructType) -> None:
    fields = [f for f in schema.fields if f.name not in KAFKA_DROPPED]
    names = [_ALIASES.get(f.name, f.name) for f in fields]
    if "body" not in names:
        raise SchemaMismatch("the sparkmq sink needs a 'body' (or 'value') column", column="body")
    if len(set(names)) != len(names):
        raise SchemaMismatch(
            "a column and its alias are both present (value/body, key/group_id or "
            "topic/destination)",
            column="body",
        )
    for column in fields:
        name = _ALIASES.get(column.name, column.name)
        allowed = _ALLOWED.get(name)
        if allowed is None:
            raise SchemaMismatch(
                f"the sparkmq sink has no column {column.name!r}; it takes "
                f"{sorted([*_ALLOWED, *_ALIASES])} (select or drop the others)",
                column=column.name,
            )
        if not isinstance(column.dataType, allowed):
            raise SchemaMismatch(
                f"column {column.name!r} is {column.dataType.simpleString()}; the sparkmq sink "
                f"takes {' or '.join(t.typeName() for t in allowed)} there",
                column=column.name,
            )
        if isinstance(column.dataType, MapType) and not (
            isinstance(column.dataType.keyType, StringType)
            and isinstance(column.dataType.valueType, StringType)
        ):
            raise SchemaMismatch(
                "column 'headers' must be map<string,string> or Kafka's "
                "array<struct<key:string,value:binary>>",
                column="headers",
            )
        if isinstance(column.dataType, ArrayType) and not _kafka_headers(column.dataType):
            raise SchemaMismatch(
                f"column 'headers' is {column.dataType.simpleString()}; the sparkmq sink takes "
                "map<string,string> or Kafka's array<struct<key:string,value:binary>>",
                column="headers",
            )


def _kafka_headers(t: ArrayType) -> bool:
    e = t.elementType
    return (
        isinstance(e, StructType)
        and [f.name for f in e.fields] == ["key", "value"]
        and isinstance(e.fields[0].dataType, StringType)
        and isinstance(e.fields[1].dataType, BinaryType | StringType)
    )


def kafka_shaped(table: pa.Table) -> pa.Table:
    """A batch with Kafka's columns as the producer takes them: the dropped columns gone, a
    binary key as text (it must be UTF-8: a group id is), headers as a map of text."""
    table = table.drop_columns([c for c in KAFKA_DROPPED if c in table.column_names])
    if "group_id" in table.column_names and pa.types.is_binary(table["group_id"].type):
        try:
            key = table["group_id"].cast(pa.string())
        except pa.ArrowInvalid:
            raise SchemaMismatch(
                "a 'key' is not UTF-8 text: sparkmq keeps a key as the message's group id, "
                "which is text",
                column="key",
            ) from None
        table = table.set_column(table.schema.get_field_index("group_id"), "group_id", key)
    if "headers" in table.column_names and pa.types.is_list(table["headers"].type):
        i = table.schema.get_field_index("headers")
        table = table.set_column(i, "headers", _headers_map(table["headers"]))
    return table


def _headers_map(column: pa.ChunkedArray) -> pa.Array:
    """``array<struct<key, value binary>>`` as ``map<string, string>`` (values decoded as UTF-8;
    a null value as an empty string)."""
    lists = cast(pa.ListArray, column.combine_chunks())
    entries = cast(pa.StructArray, lists.flatten())
    values: Column = entries.field("value")
    if pa.types.is_binary(values.type):
        try:
            values = values.cast(pa.string())
        except pa.ArrowInvalid:
            raise SchemaMismatch(
                "a header value is not UTF-8 text: sparkmq headers are text",
                column="headers",
            ) from None
    values = fill_null(values, "")
    offsets = pc.subtract(lists.offsets, lists.offsets[0])  # (flatten starts at offsets[0])
    return pa.MapArray.from_arrays(  # type: ignore[call-overload]  # (a column, not an array)
        offsets, entries.field("key"), values, mask=lists.is_null()
    )


@dataclass
class Sent(WriterCommitMessage):
    rows: int


def _id_prefix() -> str:
    from pyspark import TaskContext

    tc = TaskContext.get()
    if tc is None:
        return "spark:local:0"
    query, batch = (
        tc.getLocalProperty("sql.streaming.queryId"),
        tc.getLocalProperty("streaming.sql.batchId"),
    )
    if query is not None and batch is not None:
        return f"spark:{query}:{batch}:{tc.partitionId()}"
    return f"spark:{tc.stageId()}:{tc.partitionId()}"


def _send(opts: SinkOptions, batches: Iterator[pa.RecordBatch]) -> Sent:
    from spark_mq.client.producer import Producer

    prefix = _id_prefix()
    row = 0
    chunk = opts.kill_after_rows or 1 << 62
    with Producer(opts.url, timeout_s=opts.timeout_s, **opts.auth.kwargs()) as producer:
        for batch in batches:
            for part in pa.table(batch).to_batches(max_chunksize=chunk):
                table = kafka_shaped(
                    pa.table(part).rename_columns([_ALIASES.get(n, n) for n in part.schema.names])
                )
                ids = numbered_ids(prefix, row, table.num_rows, ":")
                row += table.num_rows
                _produce(producer, opts, table, ids)
                _maybe_die(opts, row)
    return Sent(row)


def _produce(producer: object, opts: SinkOptions, table: pa.Table, ids: Column) -> None:
    if "dedup_id" in table.column_names:
        ids = pc.coalesce(table["dedup_id"], ids)
        table = table.drop_columns(["dedup_id"])
    table = table.append_column("dedup_id", ids)
    if "destination" not in table.column_names:
        producer.send_batch(table, destination=opts.destination)  # type: ignore[attr-defined]
        return
    routes: Column = table["destination"]
    table = table.drop_columns(["destination"])
    if opts.destination is not None:
        routes = fill_null(routes, opts.destination)
    if routes.null_count:
        raise SchemaMismatch(
            "a row has no destination (null in the 'destination' column and no 'destination' "
            "option)",
            column="destination",
        )
    for dest in strings(pc.unique(routes)):
        producer.send_batch(table.filter(equal_to(routes, dest)), destination=dest)  # type: ignore[attr-defined]


def _maybe_die(opts: SinkOptions, rows: int) -> None:
    """Tests: kill this Python worker once per partition and batch, after ``rows`` were sent."""
    if opts.kill_after_rows is None or rows < opts.kill_after_rows or not opts.marker_dir:
        return
    marker = os.path.join(opts.marker_dir, _id_prefix().replace(":", "_"))
    if not os.path.exists(marker):
        open(marker, "w").close()
        os._exit(137)


class BatchWriter(DataSourceArrowWriter):
    def __init__(self, opts: SinkOptions) -> None:
        self.opts = opts

    # (pyspark's Arrow writers take batches where the writer they extend takes rows)
    def write(self, iterator: Iterator[pa.RecordBatch]) -> Sent:  # type: ignore[override]
        return _send(self.opts, iterator)


class StreamWriter(DataSourceStreamArrowWriter):
    def __init__(self, opts: SinkOptions) -> None:
        self.opts = opts

    def write(self, iterator: Iterator[pa.RecordBatch]) -> Sent:  # type: ignore[override]
        return _send(self.opts, iterator)

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        pass  # every row is durable in the broker once its task's write returned

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        pass  # a replay resends the same dedup ids; the broker keeps each message once
