"""Consuming a queue (or a topic's durable subscription) through the broker: option
``consumer`` turns the source from reading the Delta log in place into a consumer whose
micro-batches are broker *claims* (``spark_mq.broker.claims``).

Offsets are ``{"claim": n}``: batch n holds claim n. ``latestOffset`` makes the next claim (up
to ``maxMessagesPerTrigger``); executors fetch its messages from the broker; ``commit`` acks it.
A query restarted from its checkpoint replays a batch with exactly the same messages, and what
it holds is invisible to other consumers until it commits.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

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

Offset = dict[str, int]


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
        self._below: int | None = None  # Trigger.AvailableNow: what existed when it began
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
        number = int(start["claim"]) + 1
        rows = self.opts.max_messages_per_trigger or 1
        if isinstance(limit, ReadMaxRows):
            rows = limit.max_rows
        elif isinstance(limit, ReadAllAvailable):
            rows = max(rows, 1)
        got = self.admin.claim(
            self.destination,
            self.opts.consumer,
            number,
            rows,
            subscription=self.opts.subscription,
            below=self._below,
        )
        return {"claim": number} if got else {"claim": number - 1}

    def prepareForTriggerAvailableNow(self) -> None:
        self._below = int(self.admin.stats(self.destination)["end_offset"])

    def partitions(self, start: Offset, end: Offset) -> list[ClaimSlice]:
        return [
            ClaimSlice(
                self.opts.url,
                self.destination,
                self.opts.subscription,
                self.opts.consumer,
                n,
                self.opts.include_headers,
                self.opts.auth,
            )
            for n in range(int(start["claim"]) + 1, int(end["claim"]) + 1)
        ]

    def read(self, partition: ClaimSlice) -> Iterator[pa.RecordBatch]:  # type: ignore[override]
        return read_claim(partition)

    def commit(self, end: Offset) -> None:
        self.admin.ack_claims(
            self.destination,
            self.opts.consumer,
            int(end["claim"]),
            subscription=self.opts.subscription,
        )

    def stop(self) -> None:
        if self._admin is not None:
            self._admin.close()
            self._admin = None
