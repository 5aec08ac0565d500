"""The asyncio SDK: :class:`AsyncProducer`, :class:`AsyncConsumer` (with ``serve``, a pool of
handler tasks) and :class:`AsyncAdmin`, for services that run on one event loop (FastAPI,
aiohttp). Producers and consumers speak the broker's direct wire on the loop itself; the few
Flight calls (finding the broker, administration) run in worker threads. Errors are the
synchronous SDK's (:mod:`spark_mq.errors`)."""

from spark_mq.aio.admin import AsyncAdmin
from spark_mq.aio.consumer import AsyncConsumer
from spark_mq.aio.message import AsyncMessage, AsyncMessageBatch
from spark_mq.aio.producer import AsyncProducer

__all__ = ["AsyncAdmin", "AsyncConsumer", "AsyncMessage", "AsyncMessageBatch", "AsyncProducer"]
