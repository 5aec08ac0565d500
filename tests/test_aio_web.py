"""The asyncio SDK inside a web service (aiohttp, one loop): a producer and a consumer opened
with the application and closed with it, every request publishing and answering with its
offset, a pool of handler tasks consuming in the background, and the HTTP clients on the same
loop: nothing lost, nothing twice, each customer's messages in order, a clean shutdown."""

from __future__ import annotations

import asyncio
import collections
from collections.abc import AsyncIterator

from aiohttp import ClientSession, TCPConnector, web

from spark_mq.aio import AsyncConsumer, AsyncMessage, AsyncProducer

REQUESTS = 1000
CUSTOMERS = 20
PRODUCER = web.AppKey("producer", AsyncProducer)


def test_an_aiohttp_service_publishes_per_request_and_consumes_in_the_background(broker) -> None:
    handled: dict[str, list[int]] = collections.defaultdict(list)
    done = asyncio.Event()

    async def handle(message: AsyncMessage) -> None:
        assert message.group_id is not None
        handled[message.group_id].append(message.offset)
        await asyncio.sleep(0)  # (a handler's await: the pool interleaves them)
        if sum(map(len, handled.values())) == REQUESTS:
            done.set()

    async def sparkmq(app: web.Application) -> AsyncIterator[None]:
        # opened with the application, closed with it (aiohttp's cleanup context)
        async with (
            AsyncProducer(broker.url, destination="orders") as producer,
            AsyncConsumer(broker.url, "orders", prefetch=100) as consumer,
        ):
            app[PRODUCER] = producer
            serving = asyncio.create_task(consumer.serve(handle, concurrency=10))
            yield
        await serving  # (returns once its consumer is closed)

    async def order(request: web.Request) -> web.Response:
        body, who = await request.read(), request.match_info["who"]
        offset = await request.app[PRODUCER].send(body, group_id=who)
        return web.json_response({"offset": offset})

    async def main() -> list[int]:
        app = web.Application()
        app.cleanup_ctx.append(sparkmq)
        app.router.add_post("/orders/{who}", order)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = runner.addresses[0][1]
        try:
            async with ClientSession(connector=TCPConnector(limit=100)) as http:

                async def post(i: int) -> int:
                    who = f"customer-{i % CUSTOMERS}"
                    url = f"http://127.0.0.1:{port}/orders/{who}"
                    async with http.post(url, data=f"{who}:{i}".encode()) as response:
                        assert response.status == 200, await response.text()
                        return (await response.json())["offset"]

                offsets = await asyncio.gather(*(post(i) for i in range(REQUESTS)))
            await asyncio.wait_for(done.wait(), 60)
        finally:
            await runner.cleanup()  # closes the producer and the consumer, ends serve
        return offsets

    offsets = asyncio.run(main())
    assert sorted(offsets) == list(range(REQUESTS))  # each request's message stored once
    assert sorted(o for seen in handled.values() for o in seen) == list(range(REQUESTS))
    for who, seen in handled.items():  # one group at a time, in order
        assert seen == sorted(seen), who
    assert len(handled) == CUSTOMERS
