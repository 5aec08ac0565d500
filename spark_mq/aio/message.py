"""What an :class:`~spark_mq.aio.AsyncConsumer` delivers: a :class:`~spark_mq.Message` whose
settling verbs return awaitables, and ``process()``."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Iterable
from typing import Protocol, cast

from spark_mq.client.message import Message, MessageBatch, Settled


class AsyncSettler(Protocol):
    """What settles an :class:`AsyncMessage`: the :class:`~spark_mq.aio.AsyncConsumer` it came
    through."""

    def ack(self, messages: Message | Iterable[Message]) -> asyncio.Future[None]: ...
    def nack(self, messages: Message | Iterable[Message]) -> asyncio.Future[None]: ...
    def extend_lease(self, messages: Message | Iterable[Message]) -> asyncio.Future[None]: ...
    def keep_leased(self, message: Message) -> None: ...
    def release_lease(self, message: Message) -> None: ...


class AsyncSettled(Settled):
    """:class:`~spark_mq.client.message.Settled` whose verbs return a future to ``await``
    (resolved once the broker made the settle durable) or to leave: a settle left alone still
    happens, and a failure of it is logged, not raised."""

    __slots__ = ()

    def _async_owner(self) -> AsyncSettler:
        return cast(AsyncSettler, self._owner())

    def ack(self) -> asyncio.Future[None]:  # type: ignore[override]
        """Settle: never delivered again."""
        return self._async_owner().ack(self)  # type: ignore[arg-type]

    def nack(self) -> asyncio.Future[None]:  # type: ignore[override]
        """Give back for redelivery (dead-lettered after ``max_delivery_attempts``)."""
        return self._async_owner().nack(self)  # type: ignore[arg-type]

    def extend_lease(self) -> asyncio.Future[None]:  # type: ignore[override]
        """Keep it invisible to other consumers for another lease."""
        return self._async_owner().extend_lease(self)  # type: ignore[arg-type]


class AsyncMessage(AsyncSettled, Message):
    """A delivered message (read-only, as :class:`~spark_mq.Message`), settled as
    :class:`AsyncSettled` says."""

    __slots__ = ()

    @contextlib.asynccontextmanager
    async def process(self) -> AsyncIterator[AsyncMessage]:
        """``async with message.process():`` handle it; acked when the block ends, nacked if it
        raises (or is cancelled: the exception goes on). Its lease is extended in the
        background while the block runs, however long it takes."""
        consumer = self._async_owner()
        consumer.keep_leased(self)
        try:
            yield self
        except BaseException:
            consumer.release_lease(self)
            consumer.nack(self)  # (not awaited: the block's own exception is what goes on)
            raise
        consumer.release_lease(self)
        await consumer.ack(self)


class AsyncMessageBatch(AsyncSettled, MessageBatch):
    """A delivery as one Arrow record batch (:class:`~spark_mq.MessageBatch`), from
    ``AsyncConsumer.get_batch``: its messages are :class:`AsyncMessage`\\ s, and ``ack()``,
    ``nack()`` and ``extend_lease()`` settle them all in one frame (:class:`AsyncSettled`)."""

    __slots__ = ()
