"""Reading a message log straight from Delta, on the driver (end offsets) and on executors
(offset ranges as Arrow batches). Files are pruned by the ``offset`` column's statistics."""

from __future__ import annotations

from collections.abc import Iterator

import pyarrow as pa
import pyarrow.dataset as pds
from deltalake import DeltaTable
from deltalake.exceptions import TableNotFoundError

from spark_mq.errors import DestinationNotFound
from spark_mq.journal import layout
from spark_mq.schema import MESSAGE_SCHEMA

SOURCE_SCHEMA = pa.schema([pa.field("destination", pa.string()), *MESSAGE_SCHEMA])
SOURCE_DDL = (
    "destination string, offset bigint, message_id string, dedup_id string, group_id string, "
    "priority int, enqueue_time timestamp, expiry_time timestamp, "
    "headers map<string,string>, body binary"
)


def _table(root: str, destination: str) -> DeltaTable:
    uri = layout.messages_uri(root, destination)
    try:
        return DeltaTable(uri)
    except TableNotFoundError:
        raise DestinationNotFound(
            f"no message log for destination {destination!r} under {root} (expected {uri})",
            destination=destination,
        ) from None


def end_offset(root: str, destination: str) -> int:
    """One past the last committed offset (the commit's app-transaction version)."""
    return _table(root, destination).transaction_version(layout.MESSAGES_APP_ID) or 0


def read_range(root: str, destination: str, start: int, end: int) -> Iterator[pa.RecordBatch]:
    """Rows with ``start <= offset < end`` as batches of ``SOURCE_SCHEMA``, in offset order."""
    dataset = _table(root, destination).to_pyarrow_dataset()
    cond = (pds.field("offset") >= start) & (pds.field("offset") < end)
    table = dataset.to_table(filter=cond).sort_by("offset")
    table = table.select(MESSAGE_SCHEMA.names).cast(MESSAGE_SCHEMA)
    dest = pa.array([destination] * table.num_rows, pa.string())
    table = table.add_column(0, SOURCE_SCHEMA.field("destination"), dest)
    yield from table.to_batches()
