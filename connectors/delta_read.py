"""Reading message logs straight from Delta, on the driver (which offsets exist, where to start)
and on executors (offset ranges as Arrow batches). Files are pruned by the ``offset`` column's
statistics; no row becomes a Python object on the read path.
"""

from __future__ import annotations

import re
import zlib
from collections.abc import Iterator
from typing import Any, cast

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as pds
from deltalake import DeltaTable
from deltalake.exceptions import TableNotFoundError

from spark_mq.errors import DestinationNotFound
from spark_mq.journal import bindings, layout
from spark_mq.names import logical_name, partition_name, partition_of
from spark_mq.schema import MESSAGE_SCHEMA, TS, ints, schema_of, strings

SOURCE_SCHEMA = pa.schema([pa.field("destination", pa.string()), *MESSAGE_SCHEMA])
_DDL_TYPES = {
    "destination": "string",
    "offset": "bigint",
    "message_id": "string",
    "dedup_id": "string",
    "group_id": "string",
    "priority": "int",
    "enqueue_time": "timestamp",
    "expiry_time": "timestamp",
    "deliver_time": "timestamp",
    "headers": "map<string,string>",
    "body": "binary",
}


# option kafkaColumns: Kafka's columns as well (a key as bytes, the topic, the timestamp), and
# the headers as Kafka has them
KAFKA_HEADERS = pa.list_(pa.struct([pa.field("key", pa.string()), pa.field("value", pa.binary())]))
KAFKA_COLUMNS: list[pa.Field] = [
    pa.field("key", pa.binary()),
    pa.field("value", pa.binary()),
    pa.field("topic", pa.string()),
    pa.field("partition", pa.int32()),
    pa.field("timestamp", TS),
]
_KAFKA_DDL = {
    "key": "binary",
    "value": "binary",
    "topic": "string",
    "partition": "int",
    "timestamp": "timestamp",
    "headers": "array<struct<key:string,value:binary>>",
}


def source_schema(include_headers: bool, kafka: bool = False) -> pa.Schema:
    fields = [f for f in SOURCE_SCHEMA if include_headers or f.name != "headers"]
    if not kafka:
        return schema_of(*fields)
    fields = [pa.field("headers", KAFKA_HEADERS) if f.name == "headers" else f for f in fields]
    return schema_of(*fields, *KAFKA_COLUMNS)


def source_ddl(include_headers: bool, kafka: bool = False) -> str:
    types = {**_DDL_TYPES, **_KAFKA_DDL} if kafka else _DDL_TYPES
    return ", ".join(f"{f.name} {types[f.name]}" for f in source_schema(include_headers, kafka))


def kafka_shaped(table: pa.Table) -> pa.Table:
    """A batch of ``SOURCE_SCHEMA`` with Kafka's columns added: ``key`` (the group id as UTF-8
    bytes), ``value`` (the body), ``topic`` (the destination; a partition's, its destination),
    ``partition`` (a partition's index; 0 for a destination without partitions), ``timestamp``
    (enqueue time), and the headers as Kafka's list of (key, binary value)."""
    if "headers" in table.column_names:
        maps = cast(pa.MapArray, table["headers"].combine_chunks())
        entries = pa.StructArray.from_arrays(
            [maps.keys, maps.items.cast(pa.binary())], names=["key", "value"]
        )
        offsets = pc.subtract(maps.offsets, maps.offsets[0])
        lists = pa.ListArray.from_arrays(offsets, entries, mask=maps.is_null())
        table = table.set_column(
            table.schema.get_field_index("headers"), pa.field("headers", KAFKA_HEADERS), lists
        )
    names = cast(pa.DictionaryArray, pc.dictionary_encode(table["destination"].combine_chunks()))
    parts = [partition_of(str(n)) for n in names.dictionary.to_pylist()]
    topics = pa.array([p[0] if p else str(n) for p, n in zip(parts, names.dictionary.to_pylist(),
                                                            strict=True)], pa.string())  # fmt: skip
    indices = pa.array([p[1] if p else 0 for p in parts], pa.int32())
    return (
        table.append_column(KAFKA_COLUMNS[0], table["group_id"].cast(pa.binary()))
        .append_column(KAFKA_COLUMNS[1], table["body"])
        .append_column(KAFKA_COLUMNS[2], topics.take(names.indices))
        .append_column(KAFKA_COLUMNS[3], indices.take(names.indices))
        .append_column(KAFKA_COLUMNS[4], table["enqueue_time"])
    )


SOURCE_DDL = source_ddl(True)


def _table(root: str, destination: str) -> DeltaTable:
    uri = layout.messages_uri(root, destination)
    try:
        return DeltaTable(uri, storage_options=layout.storage_options(root))
    except TableNotFoundError:
        raise DestinationNotFound(
            f"no message log for destination {destination!r} under {root} (expected {uri})",
            destination=destination,
        ) from None


def recorded(root: str) -> dict[str, Any]:
    """The root's destinations as its bindings record them now (none: no bindings yet)."""
    try:
        bindings_log = DeltaTable(
            layout.bindings_uri(root), storage_options=layout.storage_options(root)
        )
        rows = bindings_log.to_pyarrow_table()
    except TableNotFoundError:
        return {}
    infos, _ = bindings.replay(pa.table(rows))
    return infos


def matching_destinations(root: str, pattern: str) -> list[str]:
    """Destinations whose whole name matches ``pattern``, sorted (a partitioned destination's
    partitions, ``<name>~<i>``, when its name matches)."""
    rx = re.compile(pattern)
    return sorted(n for n in recorded(root) if rx.fullmatch(logical_name(n)))


def partitions_of(root: str, name: str) -> list[str] | None:
    """What reading ``name`` reads: itself, or a partitioned destination's partitions (in
    order); None when the root has no such destination (yet)."""
    infos = recorded(root)
    if name in infos:
        return [name]
    first = infos.get(partition_name(name, 0))
    if first is None:
        return None
    return [partition_name(name, i) for i in range(int(first.settings.get("partitions", 1)))]


def end_offset(root: str, destination: str) -> int:
    """One past the last committed offset (the commit's app-transaction version)."""
    return _table(root, destination).transaction_version(layout.MESSAGES_APP_ID) or 0


def _offsets(root: str, destination: str, cond: pds.Expression) -> pa.Array:
    ds = _table(root, destination).to_pyarrow_dataset()
    return ds.to_table(columns=["offset"], filter=cond)["offset"].combine_chunks()


def first_offset(root: str, destination: str) -> int:
    """The oldest offset still in the log (compaction removes settled ones), or its end."""
    files = pa.table(_table(root, destination).get_add_actions(flatten=True))
    if not files.num_rows:
        return end_offset(root, destination)  # empty, or everything compacted away
    if "min.offset" in files.column_names and files["min.offset"].null_count == 0:
        return int(pc.min(files["min.offset"]).as_py())
    present = _offsets(root, destination, pds.scalar(True))  # files without statistics
    return int(pc.min(present).as_py()) if len(present) else end_offset(root, destination)


def offset_at_timestamp(root: str, destination: str, timestamp_ms: int) -> int:
    """The first offset enqueued at or after ``timestamp_ms``, or the log's end."""
    when = pa.scalar(timestamp_ms * 1000, TS)
    found = _offsets(root, destination, pds.field("enqueue_time") >= when)
    return int(pc.min(found).as_py()) if len(found) else end_offset(root, destination)


def missing_offsets(root: str, destination: str, start: int, end: int) -> np.ndarray:
    """Offsets in ``[start, end)`` no longer in the log (the log itself has no gaps)."""
    if end <= start:
        return np.empty(0, np.int64)
    files = pa.table(_table(root, destination).get_add_actions(flatten=True))
    if files.num_rows and "min.offset" in files.column_names:
        low = files["min.offset"].to_numpy(zero_copy_only=False)
        high = files["max.offset"].to_numpy(zero_copy_only=False)
        touching = (high >= start) & (low < end)
        inside = touching & (low >= start) & (high < end)
        rows = files["num_records"].to_numpy(zero_copy_only=False)
        if (touching == inside).all() and rows[inside].sum() == end - start:
            return np.empty(0, np.int64)  # the statistics prove the range complete
    cond = (pds.field("offset") >= start) & (pds.field("offset") < end)
    present = _offsets(root, destination, cond).to_numpy()
    if len(present) == end - start:
        return np.empty(0, np.int64)
    return np.setdiff1d(np.arange(start, end, dtype=np.int64), present)


def average_row_bytes(root: str, destination: str) -> float:
    """Bytes per row in the log's files (what ``maxBytesPerTrigger`` counts, as Delta does)."""
    files = pa.table(_table(root, destination).get_add_actions(flatten=True))
    rows = pc.sum(files["num_records"]).as_py() if files.num_rows else 0
    size = pc.sum(files["size_bytes"]).as_py() if files.num_rows else 0
    return size / rows if rows else 1024.0


def data_files(
    root: str, destination: str, start: int, end: int
) -> list[tuple[str, int, int, int]] | None:
    """The data files holding offsets in ``[start, end)``: ``(uri, min, max, rows)``, oldest
    first, chosen by their ``offset`` statistics; None when statistics are missing."""
    if not layout.is_local(root):
        return None  # executors reach object stores through delta-rs, which has the credentials
    dt = _table(root, destination)
    files = pa.table(dt.get_add_actions(flatten=True))
    if not files.num_rows:
        return []
    if "min.offset" not in files.column_names or files["min.offset"].null_count:
        return None
    uris = dt.file_uris()
    rows = zip(
        uris,
        strings(files["path"]),
        ints(files["min.offset"]),
        ints(files["max.offset"]),
        ints(files["num_records"]),
        strict=True,
    )
    chosen = []
    for uri, path, low, high, n in rows:
        if not uri.endswith(path.rsplit("/", 1)[-1]):
            return None  # not the order we rely on: let delta-rs read
        if high >= start and low < end:
            chosen.append((low, high, uri, n))
    return [(uri, low, high, n) for low, high, uri, n in sorted(chosen)]


def buckets_of(keys: pa.ChunkedArray | pa.Array, offsets: np.ndarray, n: int) -> np.ndarray:
    """Each row's bucket in ``0 .. n-1``: a stable hash of its key (the same in every process
    and micro-batch), or its offset when it has no key. Hashes each distinct key once."""
    encoded = pc.dictionary_encode(keys)
    if isinstance(encoded, pa.ChunkedArray):
        encoded = encoded.combine_chunks()
    encoded = cast(pa.DictionaryArray, encoded)
    by_key = np.array(
        [zlib.crc32(k.encode()) % n for k in strings(encoded.dictionary)], dtype=np.int64
    )
    indices = encoded.indices
    buckets = offsets % n
    if len(by_key):
        has_key = indices.is_valid().to_numpy(zero_copy_only=False)
        idx = indices.fill_null(0).to_numpy()
        buckets = np.where(has_key, by_key[idx], buckets)
    return buckets


def read_range(
    root: str,
    destination: str,
    start: int,
    end: int,
    *,
    include_headers: bool = True,
    bucket: int | None = None,
    buckets: int | None = None,
    grouping_key: str = "group_id",
    files: tuple[str, ...] | None = None,
    kafka: bool = False,
) -> Iterator[pa.RecordBatch]:
    """Rows with ``start <= offset < end`` as ``source_schema`` batches, in offset order;
    with ``bucket``/``buckets``, only the rows whose grouping key hashes to ``bucket``.

    ``files`` (from :func:`data_files`): read just those Parquet files, without opening the
    Delta log on the executor."""
    if files is not None:
        # read as MESSAGE_SCHEMA: files delta-rs wrote may hold view types pyarrow cannot filter
        dataset = pds.dataset(list(files), format="parquet", schema=MESSAGE_SCHEMA)
    else:
        dataset = cast(pds.FileSystemDataset, _table(root, destination).to_pyarrow_dataset())
    cond = (pds.field("offset") >= start) & (pds.field("offset") < end)
    table = dataset.to_table(filter=cond).sort_by("offset")
    table = table.select(MESSAGE_SCHEMA.names).cast(MESSAGE_SCHEMA)
    if buckets is not None and table.num_rows:
        mine = buckets_of(table[grouping_key], table["offset"].to_numpy(), buckets) == bucket
        table = table.filter(pa.array(mine))
    dest = pa.array([destination] * table.num_rows, pa.string())
    table = table.add_column(0, SOURCE_SCHEMA.field("destination"), dest)
    if not include_headers:
        table = table.drop_columns(["headers"])
    if kafka:
        table = kafka_shaped(table)
    yield from table.to_batches()
