"""The asyncio SDK (spark_mq.aio) against real brokers: thousands of tasks on one loop,
cancellation at every await, message.process(), the pool of handler tasks (serve), the sync
SDK's errors, and an `async for` consumer living through a SIGKILL and failover."""

from __future__ import annotations

import asyncio
import collections
import os
import threading
import time
from pathlib import Path

import pyarrow as pa
import pytest

from spark_mq import Admin, Consumer, Producer
from spark_mq.aio import AsyncAdmin, AsyncConsumer, AsyncMessage, AsyncProducer
from spark_mq.client import _liveness as liveness
from spark_mq.errors import DestinationNotFound, InvalidNameError, MessageRejected
from spark_mq.launch import BrokerProcess
from tests.conftest import receive_n, wait_for
from tests.ha_kit import in_sync, pair


def test_thousands_of_tasks_produce_and_consume_on_one_loop(broker) -> None:
    """2,000 producer tasks (some with headers, groups and priorities) and 8 consumer tasks on
    one loop: every message stored once, received once, with its fields."""
    n = 2000

    async def main() -> tuple[list[int], list[tuple[str, str | None, dict]]]:
        async with AsyncAdmin(broker.url) as admin:
            await admin.create_queue("tasks")
        async with AsyncProducer(broker.url, destination="tasks") as producer:

            async def one(i: int) -> int:
                if i % 10 == 0:
                    return await producer.send(
                        f"m{i}", headers={"i": str(i)}, group_id=f"g{i % 3}", priority=i % 10
                    )
                return await producer.send(f"m{i}")

            offsets = await asyncio.gather(*(one(i) for i in range(n)))
        got: list[tuple[str, str | None, dict]] = []
        async with AsyncConsumer(broker.url, "tasks", prefetch=500) as consumer:

            async def take() -> None:
                while len(got) < n:
                    for m in await consumer.get_many(50, timeout=0.5):
                        async with m.process():
                            got.append((m.text, m.group_id, m.headers))

            await asyncio.gather(*(take() for _ in range(8)))
        return offsets, got

    offsets, got = asyncio.run(main())
    assert sorted(offsets) == list(range(n))
    assert sorted(b for b, _, _ in got) == sorted(f"m{i}" for i in range(n))
    fields = {b: (g, h) for b, g, h in got}
    assert fields["m10"] == ("g1", {"i": "10"})
    assert fields["m11"] == (None, {})
    with Consumer(broker.url, "tasks") as c:  # every one was acked
        assert c.receive(timeout=0.3) is None


async def _yield(k: int) -> None:
    for _ in range(k):
        await asyncio.sleep(0)


def test_a_cancelled_call_never_takes_another_callers_answer(broker) -> None:
    """Sends, receives and acks cancelled after 0, 1, 2... turns of the loop (every await they
    pass through): each later call still gets its own answer (the offset of its own message;
    the next message in order), nothing delivered is lost, and the connections stay usable."""
    turns = 14
    mine: list[tuple[int, str]] = []
    received: list[tuple[int, str]] = []  # (offset, body)

    async def main() -> None:
        async with AsyncProducer(broker.url, destination="cancel") as producer:
            for k in range(turns):
                cancelled = asyncio.ensure_future(producer.send(f"cancelled-{k}"))
                await _yield(k)
                cancelled.cancel()
                body = f"kept-{k}"
                mine.append((await producer.send(body), body))
        async with AsyncConsumer(broker.url, "cancel", prefetch=4) as consumer:
            for k in range(turns):
                waiting = asyncio.ensure_future(consumer.receive())
                await _yield(k)
                if waiting.done():  # (it got one before the cancel: it counts)
                    m = waiting.result()
                else:
                    waiting.cancel()
                    m = await consumer.receive(timeout=5)
                assert m is not None
                received.append((m.offset, m.text))
                acking = asyncio.ensure_future(_await(m.ack()))
                await _yield(k)
                acking.cancel()  # (the ack still goes: its answer is dropped, nothing else)
            while (m := await consumer.receive(timeout=1)) is not None:
                received.append((m.offset, m.text))
                await m.ack()

    asyncio.run(main())
    with Admin(broker.url) as admin:
        assert admin.browse("cancel", limit=100).num_rows == 0  # every message acked
    bodies = [body for _, body in received]
    kept = [body for body in bodies if body.startswith("kept")]
    assert kept == [f"kept-{k}" for k in range(turns)]  # in order, each once
    assert len(bodies) == len(set(bodies))
    # each kept send was answered with its own message's offset, not a cancelled one's
    delivered = dict(received)
    assert {offset: delivered[offset] for offset, _ in mine} == dict(mine)


def test_sends_beyond_the_window_wait_and_a_cancelled_one_that_never_left_is_not_sent(
    broker,
) -> None:
    """``max_in_flight=3``: 200 concurrent sends, never more than 3 unanswered on the wire, all
    stored once; 30 more, 27 cancelled before their turn to leave: only the other 3 stored."""

    async def main() -> tuple[int, list[int]]:
        async with AsyncProducer(broker.url, destination="window", max_in_flight=3) as p:
            await p.send("warm")
            stream = p._streams["window"]
            most = 0
            write = stream.link.write

            def watched(parts: list) -> None:  # (the seam this test watches)
                nonlocal most
                write(parts)
                most = max(most, stream._on_wire)

            stream.link.write = watched  # type: ignore[method-assign]
            offsets = await asyncio.gather(*(p.send(f"{i}") for i in range(200)))
            tasks = [asyncio.ensure_future(p.send(f"c{i}")) for i in range(30)]
            await asyncio.sleep(0)  # (every one added, none written yet)
            for t in tasks[3:]:
                t.cancel()
            await asyncio.gather(*tasks[:3])
            await asyncio.gather(*tasks[3:], return_exceptions=True)
        return most, offsets

    most, offsets = asyncio.run(main())
    assert 1 <= most <= 3
    assert sorted(offsets) == list(range(1, 201))
    bodies = []
    with Consumer(broker.url, "window") as c:
        while (m := c.receive(timeout=0.5)) is not None:
            bodies.append(m.text)
            m.ack()
    assert bodies == ["warm", *(f"{i}" for i in range(200)), "c0", "c1", "c2"]


def test_submit_returns_before_the_answer_waits_only_for_room_and_a_cancelled_one_is_not_sent(
    broker,
) -> None:
    """``submit`` from one task, no task per message: 200 futures, never more than
    ``max_in_flight`` (3) messages waiting to leave, all stored in order; of 3 more, one future
    cancelled before the turn's end: only the other 2 stored."""

    async def main() -> tuple[int, bool, list[int]]:
        async with AsyncProducer(broker.url, destination="submitted", max_in_flight=3) as p:
            await p.send("warm")
            stream = p._streams["submitted"]
            futures, most = [], 0
            for i in range(200):
                futures.append(await p.submit(f"{i}"))
                most = max(most, len(stream._waiting))
            answered_at_once = futures[-1].done()
            offsets = await asyncio.gather(*futures)
            # as many as may wait, so none has been written yet: the last one cancelled
            late = [await p.submit(f"c{i}") for i in range(3)]
            late[2].cancel()
            await asyncio.gather(*late[:2])
        return most, answered_at_once, offsets

    most, answered_at_once, offsets = asyncio.run(main())
    assert 1 <= most <= 3
    assert not answered_at_once  # submit returned before its message was durable
    assert offsets == list(range(1, 201))
    bodies = []
    with Consumer(broker.url, "submitted") as c:
        while (m := c.receive(timeout=0.5)) is not None:
            bodies.append(m.text)
            m.ack()
    assert bodies == ["warm", *(f"{i}" for i in range(200)), "c0", "c1"]


async def _await(fut: asyncio.Future) -> None:
    await fut


def test_delivery_batches_are_decoded_off_the_loop_and_kept_in_order(broker) -> None:
    """A consumer told to decode every delivery batch in a worker thread (the default: those of
    256 KiB or more): batches, and the frames that came while one was decoded, reach the caller
    in the order sent, and none was decoded on the loop's thread."""
    n = 3000
    with Producer(broker.url, destination="big") as p:
        futures = [p.send(f"{i}", headers={"i": str(i)}) for i in range(n)]
        for f in futures:
            f.result(30)
    decoded_on: set[str] = set()

    async def main() -> list[str]:
        got: list[str] = []
        async with AsyncConsumer(broker.url, "big", prefetch=1000, decode_in_thread_bytes=1) as c:
            decode = c._decode

            def spied(body):  # (the seam this test watches: which thread decodes)
                decoded_on.add(threading.current_thread().name)
                return decode(body)

            c._decode = spied  # type: ignore[method-assign]
            while len(got) < n:
                batch = await c.get_many(500, timeout=10)
                assert batch, f"only {len(got)} of {n} came"
                for m in batch:
                    got.append(m.text)
                    assert m.headers == {"i": m.text}
                    m.ack()
        return got

    assert asyncio.run(main()) == [f"{i}" for i in range(n)]
    assert decoded_on and threading.current_thread().name not in decoded_on


def _threads() -> int:
    """This process's threads, gRPC's native ones too."""
    return len(os.listdir("/proc/self/task"))


def test_consumers_on_one_loop_hold_no_thread_each(broker) -> None:
    """Forty asyncio consumers on one loop cost no thread each: a consumer finds the broker's
    wire through a Flight client, then closes it (a gRPC client holds a thread and two
    descriptors, idle while the consumer reads its wire: before, forty consumers kept forty
    threads). Each still receives and settles."""

    async def main() -> tuple[int, list[str]]:
        async with AsyncAdmin(broker.url) as admin:
            await admin.create_queue("lean")
        consumers = [AsyncConsumer(broker.url, "lean", prefetch=2)]
        await consumers[0].start()  # (the loop's worker threads, the watchdog: started)
        before = _threads()
        for _ in range(40):
            consumers.append(AsyncConsumer(broker.url, "lean", prefetch=2))
            await consumers[-1].start()
        grown = _threads() - before
        async with AsyncProducer(broker.url, destination="lean") as producer:
            await asyncio.gather(*(producer.send(f"m{i}") for i in range(123)))
        got: list[str] = []

        async def take(consumer: AsyncConsumer) -> None:
            while (m := await consumer.receive(timeout=0.5)) is not None:
                got.append(m.text)
                await m.ack()

        await asyncio.gather(*(take(c) for c in consumers))
        for c in consumers:
            await c.close()
        return grown, got

    grown, got = asyncio.run(main())
    assert grown <= 6, f"{grown} threads more for 40 more consumers"
    assert sorted(got) == sorted(f"m{i}" for i in range(123))
    with Admin(broker.url) as admin:
        assert admin.stats("lean")["acked"] == 123


def test_sends_begun_together_to_a_new_destination_are_stored_in_the_order_begun(broker) -> None:
    """Fifty sends begun in one turn to a destination the producer has not used: stored in the
    order they were begun (each asked how many partitions it has in a thread of its own, and
    went on as the answers came: any order)."""

    async def main() -> list[int]:
        async with AsyncAdmin(broker.url) as admin:
            await admin.create_queue("fresh")
        async with AsyncProducer(broker.url) as producer:
            return await asyncio.gather(
                *(producer.send(f"m{i}", destination="fresh") for i in range(50))
            )

    offsets = asyncio.run(main())
    assert offsets == list(range(50)), offsets
    with Consumer(broker.url, "fresh", prefetch=50) as c:
        got = receive_n(c, 50)
        c.ack(got)
    assert [m.text for m in got] == [f"m{i}" for i in range(50)]


def test_a_loop_held_up_by_its_own_code_is_not_taken_for_a_silent_broker(broker) -> None:
    """Heartbeats every 0.2 s (a broker silent for 0.8 s is taken for dead), and the loop
    blocked by the caller's own code while the process's watchdog looks 12 times (3 s, past the
    0.8 s): what the broker sent waited in the socket, the consumer goes on (before, the
    watchdog cut it, and without a backup it ended)."""

    async def main() -> tuple[str, object]:
        async with AsyncConsumer(broker.url, "stall", heartbeat_s=0.2) as c:
            assert liveness.wait_ticks(12)  # (blocking the loop on purpose, through 12 looks)
            with Producer(broker.url, destination="stall", linger_ms=0) as p:
                p.send_sync("after the stall")
            m = await c.receive(timeout=5)
            assert m is not None
            await m.ack()
            return m.text, c.error

    assert asyncio.run(main()) == ("after the stall", None)


def test_process_acks_on_success_and_nacks_on_an_exception(broker) -> None:
    async def main() -> list[tuple[str, int]]:
        seen: list[tuple[str, int]] = []
        async with AsyncProducer(broker.url, destination="proc") as p:
            await p.send("a")
            await p.send("b")
        async with AsyncConsumer(broker.url, "proc") as c:
            async for m in c:
                seen.append((m.text, m.delivery_count))
                try:
                    async with m.process():
                        if m.text == "a" and m.delivery_count == 1:
                            raise RuntimeError("handler failed")
                except RuntimeError:
                    pass
                if len(seen) == 3:
                    break
        async with AsyncConsumer(broker.url, "proc") as c:
            assert await c.receive(timeout=0.3) is None  # a (second time) and b acked
        return seen

    seen = asyncio.run(main())
    assert seen == [("a", 1), ("b", 1), ("a", 2)]


def test_errors_are_the_sync_sdks(broker, strict_broker) -> None:
    async def main() -> None:
        async with AsyncProducer(strict_broker.url) as p:
            with pytest.raises(DestinationNotFound):
                await p.send("x", destination="nowhere")
            with pytest.raises(InvalidNameError):
                await p.send("x", destination="bad name!")
            with pytest.raises(MessageRejected):
                await p.send("x", destination="nowhere", priority=12)
        with pytest.raises(DestinationNotFound):
            async with AsyncConsumer(strict_broker.url, "nowhere"):
                pass
        consumer = AsyncConsumer(strict_broker.url, "later")
        with pytest.raises(DestinationNotFound):
            await consumer.start()
        async with AsyncAdmin(strict_broker.url) as admin:
            await admin.create_queue("later")
        await consumer.start()  # (tried again once the queue exists: it attaches)
        async with AsyncProducer(strict_broker.url, destination="later") as p:
            await p.send("here")
        m = await consumer.receive(timeout=5)
        assert m is not None and m.text == "here"
        await consumer.close()

    asyncio.run(main())


def test_serve_runs_ten_handlers_at_once_and_keeps_each_groups_order(broker) -> None:
    """``serve`` with the default pool of 10: ten handlers run at the same time; messages of
    one group are handled one at a time, in the order sent; every message is acked."""
    groups, per_group = 5, 12
    running = 0
    most = 0
    order: dict[str, list[int]] = collections.defaultdict(list)
    busy_groups: set[str] = set()
    overlaps: list[str] = []

    async def main() -> None:
        nonlocal running
        async with AsyncProducer(broker.url, destination="pool") as p:
            for i in range(per_group):
                for g in range(groups):
                    await p.send(f"{i}", group_id=f"g{g}")
            for i in range(40):  # and messages of no group
                await p.send(f"free-{i}")
        total = groups * per_group + 40
        handled = 0
        closing: list[asyncio.Future] = []
        consumer = AsyncConsumer(broker.url, "pool", prefetch=200)
        await consumer.start()

        async def handler(m: AsyncMessage) -> None:
            nonlocal running, most, handled
            running += 1
            most = max(most, running)
            g = m.group_id
            if g is not None:
                if g in busy_groups:
                    overlaps.append(g)
                busy_groups.add(g)
                order[g].append(int(m.text))
            await asyncio.sleep(0.02)
            if g is not None:
                busy_groups.discard(g)
            running -= 1
            handled += 1
            if handled == total:
                closing.append(asyncio.ensure_future(consumer.close()))  # (not awaited here:
                # close lets running handlers finish, this one among them)

        await asyncio.wait_for(consumer.serve(handler), 60)
        await asyncio.gather(*closing)

    asyncio.run(main())
    assert most == 10
    assert not overlaps
    assert {g: o for g, o in order.items()} == {
        f"g{g}": list(range(per_group)) for g in range(groups)
    }
    with Consumer(broker.url, "pool") as c:
        assert c.receive(timeout=0.3) is None  # all acked


def test_serve_gives_back_what_found_no_free_handler_in_time(broker) -> None:
    """One busy handler, a start timeout of 0.3 s: the messages waiting behind it go back to
    the queue, and another consumer takes them while the handler still runs."""

    async def main() -> list[str]:
        async with AsyncProducer(broker.url, destination="late") as p:
            for i in range(4):
                await p.send(f"{i}")
        release = asyncio.Event()
        busy = AsyncConsumer(broker.url, "late", prefetch=4)
        await busy.start()

        async def slow(m: AsyncMessage) -> None:
            await release.wait()

        serving = asyncio.ensure_future(busy.serve(slow, concurrency=1, start_timeout_s=0.3))
        taken: list[str] = []
        async with AsyncConsumer(broker.url, "late") as other:
            while len(taken) < 3:
                m = await other.receive(timeout=10)
                assert m is not None, f"the other consumer got only {taken}"
                taken.append(m.text)
                await m.ack()
        release.set()
        await busy.close()
        await serving
        return taken

    taken = asyncio.run(main())
    assert sorted(taken) == ["1", "2", "3"]


@pytest.mark.process
def test_a_slow_handlers_lease_is_extended_not_redelivered(tmp_path: Path) -> None:
    """A lease of 1 s, a handler that runs until another consumer has polled for the message
    15 times in vain (3 s, three leases): its lease is renewed in the background, so the other
    never gets it, and it is acked once, delivered once."""
    b = BrokerProcess(
        str(tmp_path / "data"), extra_args=["--set", "delivery.mark_interval_s=1"]
    ).launch()
    try:
        b.wait_ready(60)

        async def main() -> tuple[list[int], list[str]]:
            counts: list[int] = []
            async with AsyncProducer(b.url, destination="slow") as p:
                await p.send("job")
            consumer = AsyncConsumer(b.url, "slow")
            await consumer.start()

            polled_long_enough = asyncio.Event()

            async def handler(m: AsyncMessage) -> None:
                counts.append(m.delivery_count)
                await polled_long_enough.wait()
                await consumer.close()

            serving = asyncio.ensure_future(consumer.serve(handler))
            stolen: list[str] = []
            async with AsyncConsumer(b.url, "slow") as other:
                polls = 0
                while not serving.done():
                    m = await other.receive(timeout=0.2)
                    if m is not None:
                        stolen.append(m.text)
                    polls += 1
                    if polls >= 15 and counts:
                        polled_long_enough.set()
            await serving
            return counts, stolen

        counts, stolen = asyncio.run(main())
        assert counts == [1] and stolen == []
        with Consumer(b.url, "slow") as c:
            assert c.receive(timeout=1.5) is None  # acked (a lapsed lease would bring it back)
    finally:
        b.stop()


@pytest.mark.process
def test_async_for_lives_through_a_sigkill_and_failover(tmp_path: Path) -> None:
    """An HA pair; an `async for` consumer and a producer task on one loop; the primary is
    killed (SIGKILL) half-way: both go on with the backup, and every message sent is received
    (redeliveries of what was in flight allowed, losses not)."""
    a, b = pair(tmp_path)
    a.launch().wait_ready(60)
    b.launch()
    try:
        wait_for(lambda: in_sync(a.url), timeout=60, what="the backup in sync")
        urls = [a.url, b.url]
        with Admin(urls) as admin:
            admin.create_queue("ha")
        n, extra = 300, 20

        async def main() -> tuple[list[int], set[str]]:
            got: set[str] = set()
            offsets: list[int] = []
            async with (
                AsyncProducer(urls, destination="ha", timeout_s=60) as p,
                AsyncConsumer(urls, "ha", timeout_s=60) as c,
            ):

                async def produce() -> None:
                    burst: list[asyncio.Future[int]] = []
                    for i in range(n):
                        offsets.append(await p.send(f"{i}", dedup_id=f"ha-{i}"))
                        if i == n // 2:
                            assert a.process is not None
                            a.process.kill()
                            # submitted at once, some onto the dead connection: sent again
                            for j in range(extra):
                                burst.append(await p.submit(f"b{j}", dedup_id=f"hb-{j}"))
                        await asyncio.sleep(0.005)
                    offsets.extend(await asyncio.gather(*burst))

                async def consume() -> None:
                    async for m in c:
                        got.add(m.text)
                        m.ack()
                        if len(got) == n + extra:
                            return

                await asyncio.wait_for(asyncio.gather(produce(), consume()), 120)
            return offsets, got

        started = time.monotonic()
        offsets, got = asyncio.run(main())
        assert got == {f"{i}" for i in range(n)} | {f"b{j}" for j in range(extra)}
        assert len(set(offsets)) == n + extra  # each stored once (a resend found its dedup id)
        assert time.monotonic() - started < 120
    finally:
        for m in (a, b):
            if m.process is not None:
                m.process.stop()


def test_send_rows_sends_a_table_s_rows_whole_each_to_its_partition(broker) -> None:
    """``send_rows``: a table of PRODUCE_SCHEMA's columns (headers, group ids, priorities, a
    dedup id on some) to a 3-partition queue, each row to its group's partition, the offsets in
    the rows' order; a row sent again with its dedup id is stored once; plain messages too."""
    from spark_mq.messages import PlainMessage
    from spark_mq.names import choose_partition, partition_name

    with Admin(broker.url) as admin:
        admin.create_queue("rows", partitions=3)
    table = pa.table(
        {
            "body": [b"r%d" % i for i in range(12)],
            "group_id": [f"g{i % 4}" for i in range(12)],
            "priority": [i % 3 for i in range(12)],
            "headers": pa.array(
                [[("i", str(i))] for i in range(12)], pa.map_(pa.string(), pa.string())
            ),
            "dedup_id": [f"d{i}" if i < 6 else None for i in range(12)],
        }
    )

    async def main() -> tuple[list[int], list[int], list[int]]:
        async with AsyncProducer(broker.url) as p:
            offsets = await p.send_rows(table, destination="rows")
            again = await p.send_rows(table.slice(0, 1), destination="rows")
            plain = await p.send_rows(
                [PlainMessage("p0", b"plain-0"), PlainMessage(None, b"plain-1")],
                destination=partition_name("rows", 1),
            )
        return offsets, again, plain

    offsets, again, plain = asyncio.run(main())
    assert len(offsets) == 12 and again == offsets[:1]  # (d0 again: the first one's offset)
    with Consumer(broker.url, "rows", prefetch=20) as c:
        got = receive_n(c, 14)
        c.ack(got)
    by_body = {m.body: m for m in got}
    assert sorted(by_body) == sorted([b"r%d" % i for i in range(12)] + [b"plain-0", b"plain-1"])
    for i in range(12):
        m = by_body[b"r%d" % i]
        assert (m.group_id, m.priority, m.headers) == (f"g{i % 4}", i % 3, {"i": str(i)})
        assert m.partition == choose_partition(f"g{i % 4}", 3, 0)
        assert m.offset == offsets[i]
    assert [by_body[b"plain-0"].offset, by_body[b"plain-1"].offset] == plain


def test_a_partitioned_destination_through_the_asyncio_sdk(broker) -> None:
    """The asyncio producer places each message in its partition by group id (as the
    synchronous SDK does); the asyncio consumer reads every partition as one, `async for` and
    `serve` alike, each message settled by its partition's consumer."""
    from spark_mq.names import choose_partition

    with Admin(broker.url) as admin:
        admin.create_queue("aparts", partitions=3)

    async def main() -> tuple[list[AsyncMessage], list[AsyncMessage]]:
        async with AsyncProducer(broker.url, destination="aparts") as p:
            for i in range(60):
                await p.send(f"{i}", group_id=f"g{i % 6}")
            done = await p.submit("sub", group_id="g0")
            await done
            offsets = await p.send_batch([b"a", b"b", b"c"])
            assert len(offsets) == 3
        got: list[AsyncMessage] = []
        async with AsyncConsumer(broker.url, "aparts") as consumer:
            assert consumer.partitions is not None and len(consumer.partitions) == 3
            async for m in consumer:
                got.append(m)
                if len(got) == 40:
                    break
            await consumer.ack(got)
        served: list[AsyncMessage] = []
        closing: list[asyncio.Future] = []
        consumer = AsyncConsumer(broker.url, "aparts")
        await consumer.start()

        async def handler(m: AsyncMessage) -> None:
            served.append(m)
            if len(served) == 24:  # (not awaited here: close lets running handlers finish)
                closing.append(asyncio.ensure_future(consumer.close()))

        await asyncio.wait_for(consumer.serve(handler, concurrency=4), 30)
        await asyncio.gather(*closing)
        return got, served

    got, served = asyncio.run(main())
    everything = got + served
    assert sorted(m.body for m in everything) == sorted(
        [f"{i}".encode() for i in range(60)] + [b"sub", b"a", b"b", b"c"]
    )
    for m in everything:
        if m.group_id is not None:
            assert m.partition == choose_partition(m.group_id, 3, 0)
    by_group: dict[str, list[int]] = collections.defaultdict(list)
    for m in sorted(everything, key=lambda m: (m.partition, m.offset)):
        if m.group_id is not None and m.body != b"sub":
            by_group[m.group_id].append(int(m.body))
    assert all(v == sorted(v) and len(v) == 10 for v in by_group.values())
    with Consumer(broker.url, "aparts") as c:
        assert c.receive(timeout=0.3) is None  # all acked (serve acks what it handled)


def test_the_asyncio_sdk_takes_on_partitions_added_while_it_runs(broker) -> None:
    """Partitions added to a destination the asyncio producer and consumer already use: each
    asks again every ``partitions_recheck_s``, the producer places groups over them all, the
    consumer attaches to the new ones."""
    from spark_mq.names import choose_partition

    late = next(f"g{i}" for i in range(100) if choose_partition(f"g{i}", 3, 0) == 2)
    with Admin(broker.url) as admin:
        admin.create_queue("agrow", partitions=2)

    async def main() -> list[AsyncMessage]:
        got: list[AsyncMessage] = []
        async with (
            AsyncProducer(broker.url, destination="agrow", partitions_recheck_s=0.1) as p,
            AsyncConsumer(broker.url, "agrow", partitions_recheck_s=0.1) as consumer,
        ):
            await p.send("before", group_id=late)
            got += await consumer.get_many(1, timeout=10)
            with Admin(broker.url) as admin:
                assert await asyncio.to_thread(admin.add_partitions, "agrow", 3)
            deadline = time.monotonic() + 10
            while len(consumer.partitions or ()) < 3:
                assert time.monotonic() < deadline, "the consumer never attached to partition 2"
                await asyncio.sleep(0.02)
            while got[-1].partition != 2:
                assert time.monotonic() < deadline, "the producer never placed over 3"
                await p.send("after", group_id=late)
                got += await consumer.get_many(1, timeout=10)
            await consumer.ack(got)
        return got

    got = asyncio.run(main())
    assert got[0].partition == choose_partition(late, 2, 0)
    assert got[-1].partition == 2 and got[-1].body == b"after"
    with Admin(broker.url) as admin:
        assert admin.stats("agrow~2")["acked"] == 1


def test_get_batch_hands_deliveries_over_whole_in_order_and_settles_each_in_one_go(
    broker,
) -> None:
    """``get_batch`` gives a delivery as its record batch (an AsyncMessageBatch), taken in
    turn with ``get_many`` in delivery order; ``await batch.ack()`` settles it whole; over a
    partitioned destination each batch is one partition's."""
    from spark_mq.aio import AsyncMessageBatch
    from spark_mq.names import choose_partition

    with Admin(broker.url) as admin:
        admin.create_queue("bparts", partitions=2)
    with Producer(broker.url) as p:
        p.send_batch([b"%d" % i for i in range(30)], destination="bq")
        p.send_batch(
            pa.table({"body": [b"%d" % i for i in range(20)], "group_id": ["g1", "g2"] * 10}),
            destination="bparts",
        )

    async def main() -> None:
        async with AsyncConsumer(broker.url, "bq", prefetch=100) as c:
            taken: list[bytes] = []
            first = await c.get_many(4, timeout=10)
            taken += [m.body for m in first]
            rest = await c.get_batch(6, timeout=10)  # (the rest of the first delivery's)
            assert isinstance(rest, AsyncMessageBatch) and len(rest) == 6
            taken += rest.bodies
            while len(taken) < 30:
                batch = await c.get_batch(7, timeout=10)
                assert batch is not None and 0 < len(batch) <= 7
                assert batch.arrow.column("delivery_count").to_pylist() == [1] * len(batch)
                taken += batch.bodies
                await batch.ack()
            assert taken == [b"%d" % i for i in range(30)]
            await c.ack(first)
            await rest.nack()  # (delivered again: the last six of those first ten)
            again = await c.get_batch(100, timeout=10)
            assert again is not None and again.bodies == taken[4:10]
            assert all(m.redelivered for m in again)
            await again.ack()
            assert await c.get_batch(10, timeout=0.3) is None
        async with AsyncConsumer(broker.url, "bparts") as c:
            got = 0
            while got < 20:
                batch = await c.get_batch(100, timeout=10)
                assert batch is not None and batch.partition is not None
                for group in batch.arrow.column("group_id").to_pylist():
                    assert choose_partition(group, 2, 0) == batch.partition
                got += len(batch)
                await batch.ack()
            assert await c.get_batch(10, timeout=0.3) is None

    asyncio.run(main())
    with Admin(broker.url) as admin:
        assert admin.stats("bq")["acked"] == 30 and admin.stats("bparts")["acked"] == 20
