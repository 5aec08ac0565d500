"""``df.writeStream.format("sparkmq")`` and ``df.write.format("sparkmq")``: produce through the
broker (so offsets stay single-writer), with dedup ids that make retries harmless.

Columns, as Spark's Kafka sink maps them: ``body`` (binary or string, required; ``value`` is
accepted as its Kafka name), ``group_id`` (or ``key``), ``headers`` (map<string,string>),
``dedup_id``, ``message_id``, ``priority`` (int), ``ttl_ms`` (long) and ``destination`` (per row;
else the ``destination`` option). Any other column, or a column of the wrong type, is an error
naming it, before anything is sent.

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

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql.datasource import (
    DataSourceArrowWriter,
    DataSourceStreamArrowWriter,
    WriterCommitMessage,
)
from pyspark.sql.types import (
    BinaryType,
    DataType,
    IntegerType,
    LongType,
    MapType,
    StringType,
    StructType,
)

from spark_mq.connectors.options import AUTH_OPTION_NAMES, BrokerAuth
from spark_mq.errors import ConfigError, SchemaMismatch
from spark_mq.names import validate_name
from spark_mq.schema import numbered_ids

_ALIASES = {"value": "body", "key": "group_id"}
_ALLOWED: dict[str, tuple[type[DataType], ...]] = {
    "body": (BinaryType, StringType),
    "group_id": (StringType,),
    "headers": (MapType,),
    "dedup_id": (StringType,),
    "message_id": (StringType,),
    "priority": (IntegerType,),
    "ttl_ms": (LongType, IntegerType),
    "destination": (StringType,),
}
_SPARKS_OWN = {"path", "checkpointlocation"}  # Spark passes these along; they are not ours
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
        opts = {k.lower(): v for k, v in options.items() if k.lower() not in _SPARKS_OWN}
        unknown = sorted(k for k in opts if k not in _KNOWN_OPTIONS)
        if unknown:
            raise ConfigError(f"unknown sparkmq sink option(s) {unknown}", setting=unknown[0])
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
        elif "destination" not in schema.fieldNames():
            raise ConfigError(
                "give option 'destination' or a 'destination' column", setting="destination"
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
    names = [_ALIASES.get(f.name, f.name) for f in schema.fields]
    if "body" not in names:
        raise SchemaMismatch("the sparkmq sink needs a 'body' (or 'value') column", column="body")
    if len(set(names)) != len(names):
        raise SchemaMismatch(
            "a column and its alias are both present (value/body or key/group_id)",
            column="body",
        )
    for column in schema.fields:
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
            raise SchemaMismatch("column 'headers' must be map<string,string>", column="headers")


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
                table = pa.table(part).rename_columns(
                    [_ALIASES.get(n, n) for n in part.schema.names]
                )
                ids = numbered_ids(prefix, row, table.num_rows, ":")
                row += table.num_rows
                _produce(producer, opts, table, ids)
                _maybe_die(opts, row)
    return Sent(row)


def _produce(producer: object, opts: SinkOptions, table: pa.Table, ids: pa.Array) -> None:
    if "dedup_id" in table.column_names:
        ids = pc.coalesce(table["dedup_id"], ids)
        table = table.drop_columns(["dedup_id"])
    table = table.append_column("dedup_id", ids)
    if "destination" not in table.column_names:
        producer.send_batch(table, destination=opts.destination)  # type: ignore[attr-defined]
        return
    routes = table["destination"]
    table = table.drop_columns(["destination"])
    if opts.destination is not None:
        routes = pc.fill_null(routes, opts.destination)
    if routes.null_count:
        raise SchemaMismatch(
            "a row has no destination (null in the 'destination' column and no 'destination' "
            "option)",
            column="destination",
        )
    for dest in pc.unique(routes).to_pylist():
        producer.send_batch(table.filter(pc.equal(routes, dest)), destination=dest)  # type: ignore[attr-defined]


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

    def write(self, iterator: Iterator[pa.RecordBatch]) -> Sent:
        return _send(self.opts, iterator)


class StreamWriter(DataSourceStreamArrowWriter):
    def __init__(self, opts: SinkOptions) -> None:
        self.opts = opts

    def write(self, iterator: Iterator[pa.RecordBatch]) -> Sent:
        return _send(self.opts, iterator)

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        pass  # every row is durable in the broker once its task's write returned

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        pass  # a replay resends the same dedup ids; the broker keeps each message once
