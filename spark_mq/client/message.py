"""What a consumer receives."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from concurrent.futures import Future
from datetime import datetime, timedelta, timezone
from typing import Any, Generic, Protocol, TypeVar, cast, overload

import pyarrow as pa

from spark_mq import protocol, wire
from spark_mq.names import partition_of
from spark_mq.schema import DELIVERY_SCHEMA, TS, column_numpy, ints


class Settler(Protocol):
    """What settles a message: the consumer it came through (a transaction's acks name it)."""

    consumer_id: int | None
    subscription: str | None
    durable: bool

    def ack(self, messages: Message | Iterable[Message]) -> Future: ...
    def nack(self, messages: Message | Iterable[Message]) -> Future: ...
    def extend_lease(self, messages: Message | Iterable[Message]) -> Future: ...


def messages_of(
    destination: str,
    batch: pa.Table | pa.RecordBatch,
    consumer: Settler | None,
    kind: type[Message] | None = None,
) -> list[Message]:
    """A delivery batch as messages.

    What every consumer reads (offset, body, delivery count) is made Python values at once; the
    rest a column at a time, for every message of the batch, when a message's field is first
    read. Measured in a loop: a one-row delivery took 15 us when all thirteen columns were
    converted at once, a 1,000-row one 2.2 ms.
    """
    if batch.num_rows == 0:
        return []
    if isinstance(batch, pa.Table):
        batch = batch.combine_chunks().to_batches()[0]
    rest = _Columns(batch.drop_columns(["body"]))
    kind = kind or Message  # (the asyncio SDK's consumer makes AsyncMessages)
    return [
        kind(destination, offset, body, count, rest, row, consumer)
        for row, (offset, body, count) in enumerate(
            zip(
                ints(batch.column("offset")),
                cast("list[bytes]", batch.column("body").to_pylist()),
                ints(batch.column("delivery_count")),
                strict=True,
            )
        )
    ]


def message_of_one(
    destination: str, one: wire.One, consumer: Settler | None, kind: type[Message] | None = None
) -> Message:
    """A ``ONE`` frame's message (one plain message, delivered without a batch)."""
    return (kind or Message)(
        destination, one.offset, one.body, one.delivery_count, _OneFields(one), 0, consumer
    )


class _OneFields:
    """The other fields of a ``ONE`` frame's message, as :class:`_Columns` gives them (a list
    of one value each). The fields a ``ONE`` frame has no value in are empty."""

    __slots__ = ("_one",)

    def __init__(self, one: wire.One) -> None:
        self._one = one

    def get(self, name: str) -> list[Any]:
        one = self._one
        match name:
            case "dedup_id":
                return [one.dedup_id]
            case "priority":
                return [one.priority]
            case "enqueue_time":
                return [_EPOCH + timedelta(microseconds=one.enqueue_time_us)]
            case "redelivered":
                return [one.delivery_count > 1]
            case "group_first":
                return [False]
            case "headers":
                return [{}]
            case "message_id" | "group_id" | "expiry_time" | "deliver_time":
                return [None]
        raise KeyError(name)


T = TypeVar("T")
_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)
_TIMES = frozenset({"enqueue_time", "expiry_time", "deliver_time"})


class _Columns:
    """A delivery batch's other columns, each made Python values (for every row) on first read.

    Bodies are not among them: a message kept long after its batch was read keeps alive only
    the batch's small columns. Two threads reading one column at once both convert it and
    store equal lists; no lock is needed.
    """

    __slots__ = ("_batch", "_values")

    def __init__(self, batch: pa.RecordBatch) -> None:
        self._batch = batch
        self._values: dict[str, list[Any]] = {}

    def get(self, name: str) -> list[Any]:
        values = self._values.get(name)
        if values is None:
            values = self._values[name] = self._convert(name)
        return values

    def _convert(self, name: str) -> list[Any]:
        column, n = self._batch.column(name), self._batch.num_rows
        if name == "headers":  # a dict each, empty when there are none
            if column.null_count == n:
                return [{} for _ in range(n)]
            return [dict(h) if h else {} for h in column.to_pylist()]
        if column.null_count == n:
            return [None] * n
        if name in _TIMES:
            # as integer microseconds, made UTC datetimes here: reading zoned timestamps through
            # pyarrow imports pandas (0.2-1 s on a consumer's first delivery)
            typed = column if column.type == TS else column.cast(TS)
            micros = typed.view(pa.int64()).to_pylist()
            return [None if us is None else _EPOCH + timedelta(microseconds=us) for us in micros]
        return column.to_pylist()


class _Field(Generic[T]):
    """A read-only field of :class:`Message` taken from its batch's other columns when read."""

    def __set_name__(self, owner: type, name: str) -> None:
        self._name = name

    def __get__(self, message: Message | None, owner: type | None = None) -> T:
        if message is None:  # on the class: the descriptor itself
            return self  # type: ignore[return-value]
        return message._rest.get(self._name)[message._row]


class Settled:
    """What is settled through the consumer it came by: a :class:`Message`, or a
    :class:`MessageBatch` (all of it, in one frame)."""

    __slots__ = ()
    _consumer: Settler | None

    def _owner(self) -> Settler:
        if self._consumer is None:
            raise RuntimeError("this was not received through a Consumer")
        return self._consumer

    def ack(self) -> Future:
        """Settle: never delivered again. The future resolves once the ack is durable."""
        return self._owner().ack(self)  # type: ignore[arg-type]

    def nack(self) -> Future:
        """Give back for immediate redelivery, with a higher delivery count."""
        return self._owner().nack(self)  # type: ignore[arg-type]

    def extend_lease(self) -> Future:
        """Keep it invisible to other consumers for another mark interval."""
        return self._owner().extend_lease(self)  # type: ignore[arg-type]


class Message(Settled):
    """A delivered message. ``delivery_count`` starts at 1; ``redelivered`` is ``count > 1``;
    ``group_first`` marks the first message of a group since this consumer became its owner
    (the JMSXGroupFirstForConsumer of Artemis). Read-only."""

    __slots__ = ("_body", "_consumer", "_count", "_destination", "_offset", "_rest", "_row")

    def __init__(
        self,
        destination: str,
        offset: int,
        body: bytes,
        delivery_count: int,
        rest: _Columns | _OneFields,
        row: int,
        consumer: Settler | None = None,
    ) -> None:
        self._destination, self._offset, self._body = destination, offset, body
        self._count, self._rest, self._row, self._consumer = delivery_count, rest, row, consumer

    @property
    def destination(self) -> str:
        return self._destination

    @property
    def offset(self) -> int:
        """Its offset in its destination (a partitioned one's: in its partition)."""
        return self._offset

    @property
    def partition(self) -> int | None:
        """Which partition of a partitioned destination it came from (its ``destination`` is
        that partition, ``<name>~<index>``); None for a destination without partitions."""
        parts = partition_of(self._destination)
        return None if parts is None else parts[1]

    @property
    def body(self) -> bytes:
        return self._body

    @property
    def delivery_count(self) -> int:
        return self._count

    message_id = _Field[str | None]()
    dedup_id = _Field[str | None]()
    group_id = _Field[str | None]()
    priority = _Field[int]()
    enqueue_time = _Field[datetime]()
    expiry_time = _Field[datetime | None]()
    deliver_time = _Field[datetime | None]()
    headers = _Field[dict[str, str]]()
    redelivered = _Field[bool]()
    group_first = _Field[bool]()

    @property
    def text(self) -> str:
        return self.body.decode("utf-8")

    def __repr__(self) -> str:
        return (
            f"Message(destination={self.destination!r}, offset={self.offset}, "
            f"delivery_count={self.delivery_count}, body={self.body[:64]!r}"
            f"{'...' if len(self.body) > 64 else ''})"
        )


class MessageBatch(Sequence[Message], Settled):
    """Messages delivered together, as one Arrow record batch (``Consumer.receive_batch``).

    What a consumer that works on batches reads without a Python object a message: ``arrow``
    holds the delivery's columns (those of ``Message``: ``offset``, ``body``,
    ``delivery_count``, ``headers``, ...), and ``ack()``, ``nack()`` and ``extend_lease()``
    settle every message of it in one go. It is a sequence of :class:`Message` too, made on
    first use. All its messages came through one consumer (one partition of a partitioned
    destination: ``partition``).
    """

    __slots__ = ("_arrow", "_consumer", "_destination", "_kind", "_messages")

    def __init__(
        self,
        destination: str,
        arrow: pa.RecordBatch | None,
        consumer: Settler | None,
        messages: list[Message] | None = None,
        kind: type[Message] | None = None,
    ) -> None:
        # one of arrow (a delivery) and messages (ONE frames' messages, or some left over from
        # a receive_many) is given; the other is made from it when asked for (messages of
        # ``kind``: the asyncio SDK's are AsyncMessages)
        self._destination, self._arrow, self._consumer = destination, arrow, consumer
        self._messages, self._kind = messages, kind

    @property
    def destination(self) -> str:
        return self._destination

    @property
    def partition(self) -> int | None:
        parts = partition_of(self._destination)
        return None if parts is None else parts[1]

    @property
    def arrow(self) -> pa.RecordBatch:
        """The messages as a record batch of the delivery's columns (``DELIVERY_SCHEMA``)."""
        if self._arrow is None:
            rows = [_row_of(m) for m in self._messages or ()]
            self._arrow = pa.RecordBatch.from_pylist(rows, schema=DELIVERY_SCHEMA)
        return self._arrow

    @property
    def bodies(self) -> list[bytes]:
        if self._messages is not None:
            return [m.body for m in self._messages]
        return cast("list[bytes]", self.arrow.column("body").to_pylist())

    @property
    def offsets(self) -> list[int]:
        if self._messages is not None:
            return [m.offset for m in self._messages]
        return ints(self.arrow.column("offset"))

    def _entries(self) -> tuple[Sequence[int], Sequence[tuple[int, int]]]:
        """Its offsets, and (offset, delivery count) pairs: what settling it sends (from its
        columns when no messages were made of them: two arrays, no tuple a message)."""
        if self._messages is not None:
            offsets = [m.offset for m in self._messages]
            counts = [m.delivery_count for m in self._messages]
            return offsets, list(zip(offsets, counts, strict=True))
        arrow = self.arrow
        pairs = protocol.SettlePairs(
            column_numpy(arrow.column("offset")), column_numpy(arrow.column("delivery_count"))
        )
        return cast(Sequence[int], pairs.offsets), pairs  # (an array: looked in on refusals)

    def _split(self, n: int) -> tuple[MessageBatch, MessageBatch]:
        """Its first ``n`` messages, and the rest."""
        d, c, k, cls = self._destination, self._consumer, self._kind, type(self)
        if self._messages is not None:
            return cls(d, None, c, self._messages[:n], k), cls(d, None, c, self._messages[n:], k)
        arrow = self.arrow
        return cls(d, arrow.slice(0, n), c, None, k), cls(d, arrow.slice(n), c, None, k)

    def _as_messages(self) -> list[Message]:
        if self._messages is None:
            self._messages = messages_of(self._destination, self.arrow, self._consumer, self._kind)
        return self._messages

    def __len__(self) -> int:
        return len(self._messages) if self._messages is not None else self.arrow.num_rows

    @overload
    def __getitem__(self, index: int) -> Message: ...
    @overload
    def __getitem__(self, index: slice) -> Sequence[Message]: ...
    def __getitem__(self, index: int | slice) -> Message | Sequence[Message]:
        return self._as_messages()[index]

    def __iter__(self) -> Iterator[Message]:
        return iter(self._as_messages())

    def __repr__(self) -> str:
        return f"MessageBatch(destination={self._destination!r}, messages={len(self)})"


def _row_of(m: Message) -> dict[str, Any]:
    return {name: getattr(m, name) for name in DELIVERY_SCHEMA.names}
