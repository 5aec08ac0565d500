"""The asyncio admin: :class:`~spark_mq.Admin`'s calls as coroutines.

Administration goes over Arrow Flight, whose calls block: each runs in a worker thread
(``asyncio.to_thread``), so the loop serves its other tasks meanwhile."""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from spark_mq.client._transport import DEFAULT_URL
from spark_mq.client.admin import Admin

_T = TypeVar("_T")


class AsyncAdmin:
    """Administration of a broker from asyncio code (arguments as :class:`~spark_mq.Admin`'s).

    ``async with AsyncAdmin(url) as admin: await admin.create_queue("orders")``."""

    def __init__(self, url: str | Sequence[str] = DEFAULT_URL, **options: Any) -> None:
        self._make = functools.partial(Admin, url, **options)
        self._admin: Admin | None = None

    async def __aenter__(self) -> AsyncAdmin:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def start(self) -> None:
        if self._admin is None:
            self._admin = await asyncio.to_thread(self._make)

    async def close(self) -> None:
        if self._admin is not None:
            admin, self._admin = self._admin, None
            await asyncio.to_thread(admin.close)

    async def _run(self, call: Callable[[Admin], _T]) -> _T:
        await self.start()
        admin = self._admin
        assert admin is not None
        return await asyncio.to_thread(call, admin)

    async def ping(self) -> bool:
        return await self._run(Admin.ping)

    async def create_queue(self, name: str, **settings: Any) -> bool:
        return await self._run(lambda a: a.create_queue(name, **settings))

    async def create_topic(self, name: str, **settings: Any) -> bool:
        return await self._run(lambda a: a.create_topic(name, **settings))

    async def configure(self, name: str, **settings: Any) -> dict[str, Any]:
        return await self._run(lambda a: a.configure(name, **settings))

    async def delete_destination(self, name: str) -> None:
        await self._run(lambda a: a.delete_destination(name))

    async def list_destinations(self) -> list[dict[str, Any]]:
        return await self._run(Admin.list_destinations)

    async def create_subscription(
        self, topic: str, name: str, *, selector: str | None = None
    ) -> bool:
        return await self._run(lambda a: a.create_subscription(topic, name, selector=selector))

    async def delete_subscription(self, topic: str, name: str) -> None:
        await self._run(lambda a: a.delete_subscription(topic, name))

    async def purge(self, name: str, subscription: str | None = None) -> int:
        return await self._run(lambda a: a.purge(name, subscription))

    async def browse(self, name: str, **options: Any) -> Any:
        """Waiting messages, without leasing them (a ``pyarrow.Table``; options as
        :meth:`spark_mq.Admin.browse`'s)."""
        return await self._run(lambda a: a.browse(name, **options))

    async def stats(self, name: str) -> dict[str, Any]:
        return await self._run(lambda a: a.stats(name))

    async def move(self, source: str, target: str | None = None, **options: Any) -> dict[str, Any]:
        return await self._run(lambda a: a.move(source, target, **options))

    async def status(self) -> dict[str, Any]:
        return await self._run(Admin.status)
