"""Consuming a queue (or a topic's durable subscription) through the broker: option
``consumer`` turns the source from reading the Delta log in place into a consumer whose
micro-batches are broker *claims* (``spark_mq.broker.claims``).

Offsets are ``{"claim": n}``: batch n holds claim n. ``latestOffset`` makes the next claim (up
to ``maxMessagesPerTrigger``); executors fetch its messages from the broker; ``commit`` acks it.
A query restarted from its checkpoint replays a batch with exactly the same messages, and what
it holds is invisible to other consumers until it commits.

A partitioned destination's partitions each have claims of their own, numbered on their own:
offsets are ``{"claims": {"<i>": n_i}}`` (partition i's claims up to n_i), and a micro-batch
makes at most one claim of each partition (a claim acks the one before), each an even share of
``maxMessagesPerTrigger`` (a partition that has less passes the rest on; the partitions take
turns at going first). Partitions added while the query runs are found at its
next micro-batch (the count is asked each time) and consumed from where their subscription is.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)

from spark_mq.client.admin import Admin
from spark_mq.connectors import delta_read as dr
from spark_mq.connectors.options import BrokerAuth, SourceOptions
from spark_mq.errors import ConfigError
from spark_mq.names import partition_name

Offset = dict[str, Any]


@dataclass(frozen=True)
class ClaimSlice(InputPartition):
    url: str
    destination: str
    subscription: str | None
    consumer: str
    number: int
    include_headers: bool
    auth: BrokerAuth


def read_claim(part: ClaimSlice) -> Iterator[pa.RecordBatch]:
    with Admin(part.url, **part.auth.kwargs()) as admin:
        rows = admin.claimed(
            part.destination, part.consumer, part.number, subscription=part.subscription
        )
    schema = dr.source_schema(part.include_headers)
    dest = pa.array([part.destination] * rows.num_rows, pa.string())
    table = rows.add_column(0, "destination", dest).select(schema.names).cast(schema)
    yield from table.to_batches()


class BrokerStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    def __init__(self, opts: SourceOptions) -> None:
        self.opts = opts
        self.destination = opts.destinations[0]
        # Trigger.AvailableNow: what existed when it began (of each partition, by name)
        self._below: dict[str, int] | None = None
        self._admin: Admin | None = None

    @property
    def admin(self) -> Admin:
        if self._admin is None:
            self._admin = Admin(self.opts.url, **self.opts.auth.kwargs())
        return self._admin

    def initialOffset(self) -> Offset:
        return {"claim": 0}

    def getDefaultReadLimit(self) -> ReadLimit:
        return ReadMaxRows(self.opts.max_messages_per_trigger)

    def latestOffset(self, start: Offset, limit: ReadLimit) -> Offset:
        rows = self.opts.max_messages_per_trigger or 1
        if isinstance(limit, ReadMaxRows):
            rows = limit.max_rows
        elif isinstance(limit, ReadAllAvailable):
            rows = max(rows, 1)
        count = self.admin.partitions(self.destination, use="consume")
        numbers = _claims_of(start, self.destination, count)
        if numbers is None:
            number = int(start["claim"]) + 1
            got = self._claim(self.destination, number, rows)
            return {"claim": number} if got else {"claim": number - 1}
        ended = dict(numbers)
        first = sum(numbers.values()) % count  # (each partition goes first in turn)
        order = [*range(first, count), *range(first)]
        for left, index in zip(range(count, 0, -1), order, strict=True):
            share = -(-rows // left)  # (an even share of what is left; a short one passes it on)
            if share <= 0:
                break
            number = numbers.get(str(index), 0) + 1
            got = self._claim(partition_name(self.destination, index), number, share)
            if got:
                ended[str(index)] = number
                rows -= got
        if ended == numbers and "claims" not in start:
            return start  # (nothing yet: the same offset, so no micro-batch)
        return {"claims": ended}

    def _claim(self, destination: str, number: int, rows: int) -> int:
        below = None if self._below is None else self._below.get(destination, 0)
        return self.admin.claim(
            destination,
            self.opts.consumer,
            number,
            rows,
            subscription=self.opts.subscription,
            below=below,
        )

    def prepareForTriggerAvailableNow(self) -> None:
        stats = self.admin.stats(self.destination)
        parts = stats.get("partitions") or [stats]
        self._below = {str(p["name"]): int(p["end_offset"]) for p in parts}

    def partitions(self, start: Offset, end: Offset) -> list[ClaimSlice]:
        return [
            ClaimSlice(
                self.opts.url,
                destination,
                self.opts.subscription,
                self.opts.consumer,
                n,
                self.opts.include_headers,
                self.opts.auth,
            )
            for destination, before, upto in self._spans(start, end)
            for n in range(before + 1, upto + 1)
        ]

    def _spans(self, start: Offset, end: Offset) -> list[tuple[str, int, int]]:
        """Each destination (partition) of a batch: the claims it held before and after."""
        if "claims" not in end:
            return [(self.destination, int(start.get("claim", 0)), int(end["claim"]))]
        before = start.get("claims", {})
        return [
            (partition_name(self.destination, int(i)), int(before.get(i, 0)), int(n))
            for i, n in sorted(end["claims"].items(), key=lambda kv: int(kv[0]))
        ]

    def read(self, partition: ClaimSlice) -> Iterator[pa.RecordBatch]:  # type: ignore[override]
        return read_claim(partition)

    def commit(self, end: Offset) -> None:
        for destination, _, upto in self._spans(end, end):
            if upto:
                self.admin.ack_claims(
                    destination, self.opts.consumer, upto, subscription=self.opts.subscription
                )

    def stop(self) -> None:
        if self._admin is not None:
            self._admin.close()
            self._admin = None


def _claims_of(start: Offset, destination: str, count: int) -> dict[str, int] | None:
    """Each partition's claims so far (None: a destination without partitions), checked
    against what the destination is now."""
    if count == 1:
        if "claim" not in start:
            raise ConfigError(
                f"{destination!r} has no partitions, but this query's checkpoint consumed it "
                "when it had: it was deleted and made again; start the query with a new "
                "checkpoint (and consumer name)",
                setting="destination",
            )
        return None
    if "claims" in start:
        return {str(k): int(v) for k, v in start["claims"].items()}
    if int(start.get("claim", 0)):
        raise ConfigError(
            f"{destination!r} has {count} partitions, but this query's checkpoint consumed it "
            "when it had none: it was deleted and made again; start the query with a new "
            "checkpoint (and consumer name)",
            setting="destination",
        )
    return {}
