"""What a consumer receives."""

from __future__ import annotations

from concurrent.futures import Future
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any

import pyarrow as pa

if TYPE_CHECKING:
    from spark_mq.client.consumer import Consumer


def rows_of(batch: pa.Table | pa.RecordBatch) -> list[dict[str, Any]]:
    """A delivery batch as Python rows, times as UTC datetimes.

    pyarrow turns zoned timestamps into datetimes through pandas, importing it on first use: in
    a fresh consumer process that held up the first delivery 0.2-1 s. Read as naive UTC and
    zoned here instead, no pandas is needed.
    """
    zoned = [
        i
        for i, f in enumerate(batch.schema)
        if pa.types.is_timestamp(f.type) and f.type.tz is not None
    ]
    if not zoned:
        return batch.to_pylist()
    for i in zoned:
        f = batch.schema.field(i)
        batch = batch.set_column(i, f.name, batch.column(i).cast(pa.timestamp(f.type.unit)))
    names = [batch.schema.field(i).name for i in zoned]
    rows = batch.to_pylist()
    for row in rows:
        for name in names:
            if (value := row[name]) is not None:
                row[name] = value.replace(tzinfo=timezone.utc)
    return rows


@dataclass(frozen=True, eq=False)
class Message:
    """A delivered message. ``delivery_count`` starts at 1; ``redelivered`` is ``count > 1``;
    ``group_first`` marks the first message of a group since this consumer became its owner
    (the JMSXGroupFirstForConsumer of Artemis)."""

    destination: str
    offset: int
    body: bytes
    message_id: str | None
    dedup_id: str | None
    group_id: str | None
    priority: int
    enqueue_time: datetime
    expiry_time: datetime | None
    headers: dict[str, str]
    delivery_count: int
    redelivered: bool
    deliver_time: datetime | None = None
    group_first: bool = False
    _consumer: Consumer | None = field(default=None, repr=False)

    @classmethod
    def from_row(cls, destination: str, row: dict[str, Any], consumer: Consumer) -> Message:
        headers = row.get("headers") or []
        return cls(
            destination=destination,
            offset=row["offset"],
            body=row["body"],
            message_id=row["message_id"],
            dedup_id=row["dedup_id"],
            group_id=row["group_id"],
            priority=row["priority"],
            enqueue_time=row["enqueue_time"],
            expiry_time=row["expiry_time"],
            headers=dict(headers),
            delivery_count=row["delivery_count"],
            redelivered=row["redelivered"],
            deliver_time=row["deliver_time"],
            group_first=row["group_first"],
            _consumer=consumer,
        )

    @property
    def text(self) -> str:
        return self.body.decode("utf-8")

    def _owner(self) -> Consumer:
        if self._consumer is None:
            raise RuntimeError("this message was not received through a Consumer")
        return self._consumer

    def ack(self) -> Future:
        """Settle: never delivered again. The future resolves once the ack is durable."""
        return self._owner().ack(self)

    def nack(self) -> Future:
        """Give back for immediate redelivery, with a higher delivery count."""
        return self._owner().nack(self)

    def extend_lease(self) -> Future:
        """Keep it invisible to other consumers for another mark interval."""
        return self._owner().extend_lease(self)
