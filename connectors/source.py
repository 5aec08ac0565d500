"""``spark.readStream.format("sparkmq")`` and ``spark.read.format("sparkmq")``.

Reads message logs straight from their Delta tables (no broker needed). Offsets are
``{"<destination>": <next offset>, ...}``, one entry per destination read. Options: see
``options.py`` and the README.

With ``groupingPartitions`` = N every micro-batch has exactly N partitions and partition i holds
the messages whose grouping key hashes to i, in offset order: a group always lands in the same
partition, batch after batch and after a restart (sticky delivery for per-group processing).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TypeVar

import pyarrow as pa
from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    DataSourceStreamWriter,
    DataSourceWriter,
    InputPartition,
)
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxBytes,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import StructType

from spark_mq.connectors import delta_read as dr
from spark_mq.connectors.options import EARLIEST, LATEST, SourceOptions
from spark_mq.errors import ConfigError, DataLoss
from spark_mq.names import partition_name, partition_of

log = logging.getLogger(__name__)

_T = TypeVar("_T")
# how long a partitioned destination's partition count, read from the bindings, is used before
# it is read again (partitions added reach a running query's micro-batches this much later)
PARTITIONS_RECHECK_S = 10.0
Offsets = dict[str, int]
Spans = list[tuple[str, int, int, int]]  # a destination's data files: (uri, min, max, rows)


@dataclass(frozen=True)
class Slice(InputPartition):
    """Offset ranges ``(destination, start, end)`` one task reads; with ``buckets``, only the
    rows of those ranges whose grouping key hashes to ``bucket``."""

    root: str
    # (destination, start, end, data files to read or None to go through the Delta log)
    ranges: tuple[tuple[str, int, int, tuple[str, ...] | None], ...]
    include_headers: bool
    grouping_key: str
    bucket: int | None = None
    buckets: int | None = None
    kafka_columns: bool = False


def _read(partition: InputPartition) -> Iterator[pa.RecordBatch]:
    if not isinstance(partition, Slice):
        return  # Spark hands one placeholder partition to a batch read of nothing
    for dest, start, end, files in partition.ranges:
        yield from dr.read_range(
            partition.root,
            dest,
            start,
            end,
            include_headers=partition.include_headers,
            bucket=partition.bucket,
            buckets=partition.buckets,
            grouping_key=partition.grouping_key,
            files=files,
            kafka=partition.kafka_columns,
        )


class ReadPlanner:
    """What both readers share: which destinations, where each starts, how ranges split."""

    def __init__(self, opts: SourceOptions) -> None:
        self.opts = opts
        # what each destination named reads: itself, or a partitioned one's partitions, and
        # when the bindings said so (asked again after PARTITIONS_RECHECK_S: partitions may be
        # added while a query runs)
        self._reads: dict[str, tuple[list[str], float]] = {}

    def destinations(self) -> list[str]:
        """The destinations read: those named (or matching the pattern), a partitioned one's
        partitions in its place (``<name>~<i>``, each with offsets of its own)."""
        if self.opts.pattern is not None:
            return dr.matching_destinations(self.opts.root, self.opts.pattern)
        out: list[str] = []
        now = time.monotonic()
        for name in self.opts.destinations:
            known = self._reads.get(name)
            if known is None or now - known[1] >= PARTITIONS_RECHECK_S:
                found = dr.partitions_of(self.opts.root, name)
                if found is None:  # (none yet: read as named, which says it is missing)
                    out.append(name)
                    continue
                known = self._reads[name] = (found, now)
            out += known[0]
        return out

    def first_read_of(self, dest: str, start: Offsets) -> int:
        """Where a micro-batch begins ``dest``, which the batch before did not read: a
        partition added to a destination the query reads (its other partitions in ``start``)
        from its first offset, as Spark's Kafka source reads partitions it finds while it runs;
        any other where the options say (:meth:`start_of`)."""
        parts = partition_of(dest)
        if parts is not None and start and partition_name(parts[0], 0) in start:
            return dr.first_offset(self.opts.root, dest)
        return self.start_of(dest)

    def start_of(self, dest: str) -> int:
        """Where reading ``dest`` begins the first time the query sees it."""
        root = self.opts.root
        if self.opts.starting_timestamp_ms is not None:
            return dr.offset_at_timestamp(root, dest, self.opts.starting_timestamp_ms)
        by_time = self.opts.starting_timestamps or {}
        at = self.given(by_time, dest, None)
        if at is not None:  # (Kafka's startingOffsetsByTimestamp: before startingOffsets)
            return dr.offset_at_timestamp(root, dest, at)
        starting = self.opts.starting
        wanted = (
            self.given(starting, dest, EARLIEST)
            if isinstance(starting, dict)
            else {"earliest": EARLIEST, "latest": LATEST}[starting]
        )
        if wanted == EARLIEST:
            return dr.first_offset(root, dest)
        if wanted == LATEST:
            return dr.end_offset(root, dest)
        return min(wanted, dr.end_offset(root, dest))

    @staticmethod
    def given(per_destination: dict[str, int], dest: str, default: _T) -> int | _T:
        """What an option's JSON gives ``dest``: its own entry; a partitioned destination's
        partition 0 may be given by the destination's name (Kafka's ``{"orders": {"0": 5}}``
        reads so)."""
        if dest in per_destination:
            return per_destination[dest]
        parts = partition_of(dest)
        if parts is not None and parts[1] == 0 and parts[0] in per_destination:
            return per_destination[parts[0]]
        return default

    def check_missing(self, ranges: dict[str, tuple[int, int]]) -> None:
        """Offsets compaction removed that the ranges need: an error, or a warning when
        ``failOnDataLoss`` is false."""
        opts = self.opts
        for dest, (start, end) in ranges.items():
            missing = dr.missing_offsets(opts.root, dest, start, end)
            if len(missing):
                shown = ", ".join(str(o) for o in missing[:5]) + (
                    ", ..." if len(missing) > 5 else ""
                )
                text = (
                    f"{len(missing):,} offset(s) of {dest!r} the query needs are no longer in "
                    f"the log (compaction removed them): {shown}"
                )
                if opts.fail_on_data_loss:
                    raise DataLoss(
                        f"{text}. Set failOnDataLoss=false to skip them, or restart the query "
                        "from a new checkpoint",
                        destination=dest,
                        offset=int(missing[0]),
                    )
                log.warning("%s; skipping them (failOnDataLoss=false)", text)

    def files_of(self, ranges: dict[str, tuple[int, int]]) -> dict[str, Spans | None]:
        """Per destination with rows to read: its data files (``dr.data_files``)."""
        root = self.opts.root
        return {d: dr.data_files(root, d, s, e) for d, (s, e) in sorted(ranges.items()) if e > s}

    def slices(
        self, ranges: dict[str, tuple[int, int]], files: dict[str, Spans | None] | None = None
    ) -> list[Slice]:
        """Check for offsets compaction removed, then split the ranges into tasks (cut from
        ``files``, the result of :meth:`files_of`, when given)."""
        opts = self.opts
        self.check_missing(ranges)
        live = [(d, s, e) for d, (s, e) in sorted(ranges.items()) if e > s]
        files = self.files_of(ranges) if files is None else files
        common = {
            "root": opts.root,
            "include_headers": opts.include_headers,
            "kafka_columns": opts.kafka_columns,
            "grouping_key": opts.grouping_key,
        }
        n = opts.grouping_partitions
        if n is not None:
            every = tuple((d, s, e, _uris(files[d])) for d, s, e in live)
            return [Slice(ranges=every, bucket=i, buckets=n, **common) for i in range(n)]
        step = opts.max_messages_per_partition
        out = []
        for d, s, e in live:
            spans = files[d]
            if spans is None:  # no statistics: split the offsets, each task reads via Delta
                out += [
                    Slice(ranges=((d, lo, min(lo + step, e), None),), **common)
                    for lo in range(s, e, step)
                ]
                continue
            group: list[str] = []
            rows = 0
            for uri, low, high, n_rows in spans:
                lo, hi = max(low, s), min(high + 1, e)
                if n_rows >= step and hi - lo > step:  # a big file: several tasks, by offsets
                    out += [
                        Slice(ranges=((d, a, min(a + step, hi), (uri,)),), **common)
                        for a in range(lo, hi, step)
                    ]
                    continue
                group.append(uri)  # small files: whole files per task, about ``step`` rows
                rows += n_rows
                if rows >= step:
                    out.append(Slice(ranges=((d, s, e, tuple(group)),), **common))
                    group, rows = [], 0
            if group:
                out.append(Slice(ranges=((d, s, e, tuple(group)),), **common))
        return out

    def row_budget(self, available: dict[str, int], limit: ReadLimit) -> int | None:
        """How many rows this micro-batch may take in all (admission control)."""
        if isinstance(limit, ReadAllAvailable):
            return None
        budgets = []
        if self.opts.max_messages_per_trigger is not None:
            budgets.append(self.opts.max_messages_per_trigger)
        if self.opts.max_bytes_per_trigger is not None:
            total = sum(available.values())
            if total:
                avg = (
                    sum(
                        dr.average_row_bytes(self.opts.root, d) * n
                        for d, n in available.items()
                        if n
                    )
                    / total
                )
                budgets.append(max(1, int(self.opts.max_bytes_per_trigger // max(avg, 1.0))))
        return min(budgets) if budgets else None


def _uris(spans: Spans | None) -> tuple[str, ...] | None:
    return None if spans is None else tuple(span[0] for span in spans)


def _share(available: dict[str, int], budget: int | None) -> dict[str, int]:
    """Split a row budget across destinations in proportion to their backlog (each gets one)."""
    if budget is None:
        return available
    total = sum(available.values())
    if total <= budget:
        return available
    return {d: min(n, max(1, budget * n // total)) if n else 0 for d, n in available.items()}


class SparkMQDataSource(DataSource):
    """Register with ``spark.dataSource.register(SparkMQDataSource)`` (or ``register(spark)``)."""

    @classmethod
    def name(cls) -> str:
        return "sparkmq"

    @property
    def parsed(self) -> SourceOptions:
        """The reading options (a sink has other ones: ``sink.SinkOptions``)."""
        return SourceOptions.parse(self.options)

    def schema(self) -> str:
        opts = self.parsed
        return dr.source_ddl(opts.include_headers, opts.kafka_columns)

    def reader(self, schema: StructType) -> DataSourceReader:
        opts = self.parsed
        if opts.through_broker:
            raise ConfigError(
                "option 'consumer' (consuming through the broker) is for streaming queries; a "
                "batch read reads the log in place: drop 'consumer'",
                setting="consumer",
            )
        return BatchReader(opts)

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        opts = self.parsed
        if opts.through_broker:
            from spark_mq.connectors.broker_read import BrokerStreamReader

            return BrokerStreamReader(opts)
        return StreamReader(opts)

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        from spark_mq.connectors.sink import BatchWriter, SinkOptions

        _append_only(overwrite)
        return BatchWriter(SinkOptions.parse(self.options, schema))

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:
        from spark_mq.connectors.sink import SinkOptions, StreamWriter

        _append_only(overwrite)
        return StreamWriter(SinkOptions.parse(self.options, schema))


class PythonSideSource(SparkMQDataSource):
    """The same source under the name the connector's Java provider delegates to (it owns
    ``"sparkmq"`` when its jar is on the classpath: see ``jvm.py``)."""

    @classmethod
    def name(cls) -> str:
        return "sparkmq_python"


def _append_only(overwrite: bool) -> None:
    if overwrite:
        raise ConfigError(
            "a sparkmq destination is an append-only log: write with mode('append')",
            setting="mode",
        )


class BatchReader(DataSourceReader):
    def __init__(self, opts: SourceOptions) -> None:
        self.plan = ReadPlanner(opts)
        self.ranges: dict[str, tuple[int, int]] = {}
        for dest in self.plan.destinations():
            end = dr.end_offset(opts.root, dest)
            if isinstance(opts.ending, dict):
                wanted = self.plan.given(opts.ending, dest, LATEST)
                end = end if wanted in (LATEST, EARLIEST) else min(wanted, end)
            self.ranges[dest] = (self.plan.start_of(dest), end)

    def partitions(self) -> list[Slice]:
        return self.plan.slices(self.ranges)

    def read(self, partition: Slice) -> Iterator[pa.RecordBatch]:  # type: ignore[override]
        return _read(partition)


class StreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    def __init__(self, opts: SourceOptions) -> None:
        self.opts = opts
        self.plan = ReadPlanner(opts)
        self._target: Offsets | None = None  # set by Trigger.AvailableNow
        self._last_batch_at = time.monotonic()  # (minMessagesPerTrigger's delay counts from it)

    def initialOffset(self) -> Offsets:
        return {d: self.plan.start_of(d) for d in self.plan.destinations()}

    def getDefaultReadLimit(self) -> ReadLimit:
        if self.opts.max_messages_per_trigger is not None:
            return ReadMaxRows(self.opts.max_messages_per_trigger)
        if self.opts.max_bytes_per_trigger is not None:
            return ReadMaxBytes(self.opts.max_bytes_per_trigger)
        return ReadAllAvailable()

    def _ends(self, start: Offsets) -> dict[str, tuple[int, int]]:
        """Per destination: where the next batch begins, and how far there is data."""
        out = {}
        for dest in self.plan.destinations():
            begin = int(start[dest]) if dest in start else self.plan.first_read_of(dest, start)
            end = dr.end_offset(self.opts.root, dest)
            if self._target is not None:  # Trigger.AvailableNow: nothing past its snapshot
                end = min(end, self._target.get(dest, begin))
            out[dest] = (begin, max(begin, end))
        return out

    def latestOffset(self, start: Offsets, limit: ReadLimit) -> Offsets:
        ends = self._ends(start)
        available = {d: e - b for d, (b, e) in ends.items()}
        if self._too_few(sum(available.values())):
            return {d: b for d, (b, _) in ends.items()}  # (no new data: no micro-batch yet)
        self._last_batch_at = time.monotonic()
        share = _share(available, self.plan.row_budget(available, limit))
        return {d: b + share[d] for d, (b, _) in ends.items()}

    def _too_few(self, available: int) -> bool:
        """``minMessagesPerTrigger`` (Kafka's ``minOffsetsPerTrigger``): fewer are waiting, and
        ``maxTriggerDelay`` has not passed since the last micro-batch (not under
        ``Trigger.AvailableNow``, which reads what there is)."""
        least = self.opts.min_messages_per_trigger
        if least is None or self._target is not None or available == 0:
            return False
        waited = time.monotonic() - self._last_batch_at
        return available < least and waited < self.opts.max_trigger_delay_s

    def reportLatestOffset(self) -> Offsets:
        return {d: dr.end_offset(self.opts.root, d) for d in self.plan.destinations()}

    def prepareForTriggerAvailableNow(self) -> None:
        self._target = self.reportLatestOffset()

    def ranges(self, start: Offsets, end: Offsets) -> dict[str, tuple[int, int]]:
        """What the batch ``(start, end]`` reads of each destination: ``[from, to)``."""
        out = {}
        for dest, stop in end.items():
            begin = int(start[dest]) if dest in start else self.plan.first_read_of(dest, start)
            out[dest] = (min(begin, int(stop)), int(stop))
        return out

    def partitions(self, start: Offsets, end: Offsets) -> list[Slice]:
        return self.plan.slices(self.ranges(start, end))

    def read(self, partition: Slice) -> Iterator[pa.RecordBatch]:  # type: ignore[override]
        return _read(partition)

    def commit(self, end: Offsets) -> None:
        pass  # the log is read in place; compaction jobs decide what may go
