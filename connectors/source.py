"""``spark.readStream.format("sparkmq")`` and ``spark.read.format("sparkmq")``.

Reads a destination's message log straight from its Delta table (no broker needed). Offsets are
``{"<destination>": <next offset>}``. Options: see ``options.py`` and the README.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import pyarrow as pa
from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    InputPartition,
)
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import StructType

from spark_mq.connectors.delta_read import SOURCE_DDL, end_offset, read_range
from spark_mq.connectors.options import SourceOptions


@dataclass(frozen=True)
class OffsetRange(InputPartition):
    root: str
    destination: str
    start: int
    end: int


def _ranges(opts: SourceOptions, start: int, end: int) -> list[OffsetRange]:
    step = opts.max_messages_per_partition
    return [
        OffsetRange(opts.root, opts.destination, lo, min(lo + step, end))
        for lo in range(start, end, step)
    ]


def _read(partition: InputPartition) -> Iterator[pa.RecordBatch]:
    if not isinstance(partition, OffsetRange):
        return  # Spark hands one placeholder partition to a batch read of an empty log
    yield from read_range(partition.root, partition.destination, partition.start, partition.end)


class SparkMQDataSource(DataSource):
    """Register with ``spark.dataSource.register(SparkMQDataSource)`` (or ``register(spark)``)."""

    @classmethod
    def name(cls) -> str:
        return "sparkmq"

    def __init__(self, options: dict[str, str]) -> None:
        super().__init__(options)
        self.parsed = SourceOptions.parse(options)

    def schema(self) -> str:
        return SOURCE_DDL

    def reader(self, schema: StructType) -> DataSourceReader:
        return BatchReader(self.parsed)

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        return StreamReader(self.parsed)


class BatchReader(DataSourceReader):
    def __init__(self, opts: SourceOptions) -> None:
        self.opts = opts
        self.end = end_offset(opts.root, opts.destination)

    def partitions(self) -> list[OffsetRange]:
        return _ranges(self.opts, 0, self.end)

    def read(self, partition: OffsetRange) -> Iterator[pa.RecordBatch]:  # type: ignore[override]
        return _read(partition)


class StreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    def __init__(self, opts: SourceOptions) -> None:
        self.opts = opts
        self._target: int | None = None  # set by Trigger.AvailableNow

    def _offset(self, value: int) -> dict[str, int]:
        return {self.opts.destination: value}

    def _end(self) -> int:
        latest = end_offset(self.opts.root, self.opts.destination)
        return latest if self._target is None else min(latest, self._target)

    def initialOffset(self) -> dict[str, int]:
        if self.opts.starting == "latest":
            return self._offset(end_offset(self.opts.root, self.opts.destination))
        return self._offset(0)

    def getDefaultReadLimit(self) -> ReadLimit:
        if self.opts.max_messages_per_trigger is not None:
            return ReadMaxRows(self.opts.max_messages_per_trigger)
        return ReadAllAvailable()

    def latestOffset(self, start: dict[str, int], limit: ReadLimit) -> dict[str, int]:
        begin = int(start[self.opts.destination])
        end = self._end()
        if isinstance(limit, ReadMaxRows):
            end = min(end, begin + limit.max_rows)
        return self._offset(max(begin, end))

    def reportLatestOffset(self) -> dict[str, int]:
        return self._offset(end_offset(self.opts.root, self.opts.destination))

    def prepareForTriggerAvailableNow(self) -> None:
        self._target = end_offset(self.opts.root, self.opts.destination)

    def partitions(self, start: dict[str, int], end: dict[str, int]) -> list[OffsetRange]:
        d = self.opts.destination
        return _ranges(self.opts, int(start[d]), int(end[d]))

    def read(self, partition: OffsetRange) -> Iterator[pa.RecordBatch]:  # type: ignore[override]
        return _read(partition)

    def commit(self, end: dict[str, int]) -> None:
        pass  # the log is read in place; compaction jobs decide what may go
