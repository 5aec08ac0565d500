"""What a consumer receives."""

from __future__ import annotations

from concurrent.futures import Future
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from spark_mq.schema import TS

if TYPE_CHECKING:
    from spark_mq.client.consumer import Consumer


def messages_of(
    destination: str, batch: pa.Table | pa.RecordBatch, consumer: Consumer | None
) -> list[Message]:
    """A delivery batch as messages, built a column at a time.

    Most deliveries at a steady rate carry one message. Row dicts (``to_pylist`` on the batch)
    cost ~47 us for a one-row batch, and reading zoned timestamps through pyarrow imports pandas
    (0.2-1 s on a consumer's first delivery). Columns that are all null are not converted at all;
    times are read as integer microseconds and made UTC datetimes here.
    """
    n = batch.num_rows
    columns = dict(zip(batch.schema.names, batch.columns, strict=True))

    def column(name: str) -> list[Any]:
        c = columns[name]
        return [None] * n if c.null_count == n else c.to_pylist()

    def times(name: str) -> list[datetime | None]:
        c = columns[name]
        if c.null_count == n:
            return [None] * n
        micros = (c.view(pa.int64()) if c.type == TS else c.cast(TS).cast(pa.int64())).to_pylist()
        return [None if us is None else _EPOCH + timedelta(microseconds=us) for us in micros]

    headers = [dict(h) if h else {} for h in column("headers")]
    return [
        Message(destination, *fields, consumer)
        for fields in zip(
            column("offset"),
            column("body"),
            column("message_id"),
            column("dedup_id"),
            column("group_id"),
            column("priority"),
            times("enqueue_time"),
            times("expiry_time"),
            headers,
            column("delivery_count"),
            column("redelivered"),
            times("deliver_time"),
            column("group_first"),
            strict=True,
        )
    ]


_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)


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
