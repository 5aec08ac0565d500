"""The asyncio consumer: ``async for message in consumer``, ``receive``, ``get_many``, awaitable
settles, ``message.process()``, and ``serve``: a pool of handler tasks.

Deliveries come on the consumer's direct-wire connection and are cut in the loop's read
callback (a one-message ``ONE`` frame costs no Arrow). A delivery batch of
``decode_in_thread_bytes`` or more is decoded in a worker thread, so a big backlog does not
hold the loop; frames after it wait for it, in order. A delivery waits as its record batch:
``get_many`` makes messages of it, ``get_batch`` hands it over whole (an
:class:`~spark_mq.aio.AsyncMessageBatch`, settled in one frame); a big delivery's messages
are made in the worker thread too once ``get_many`` was called. The broker sends at most
``prefetch`` messages not yet settled (the credit); settling one lets another come.

Acks, nacks and extends issued in one turn of the loop travel in one frame. Given a cluster
member, a consumer attaches at the member serving its destination (a ``NotOwner`` answer names
it) and attaches again there when the destination moves. Given a primary and
its backup, a consumer whose broker went away attaches again to whichever serves then:
messages delivered and not acked come again from there (redelivered), and settles of the old
deliveries fail (their leases were the old broker's), as with the synchronous consumer.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import itertools
import json
import logging
from collections.abc import Awaitable, Callable, Iterable, Sequence
from typing import Any, Literal, cast

from spark_mq import protocol, wire
from spark_mq.aio._link import Broker, Link, open_link
from spark_mq.aio.message import AsyncMessage, AsyncMessageBatch
from spark_mq.client._lanes import Lanes
from spark_mq.client._liveness import DEFAULT_HEARTBEAT_S
from spark_mq.client._outcome import coming_again, refusals, settle_refusal
from spark_mq.client._partition_watch import DEFAULT_RECHECK_S, checked_recheck_s
from spark_mq.client._transport import DEFAULT_URL
from spark_mq.client.message import Message, MessageBatch, Settler, message_of_one
from spark_mq.errors import (
    BrokerUnavailable,
    NotOwner,
    Partitioned,
    ProtocolError,
    SparkMQError,
    from_wire,
)
from spark_mq.names import partition_name, validate_name, validate_stored_name
from spark_mq.schema import DELIVERY_SCHEMA
from spark_mq.security.credentials import Auth

log = logging.getLogger(__name__)

Verb = Literal["ack", "nack", "extend", "release"]
Handler = Callable[[AsyncMessage], Awaitable[object]]
_END = object()  # in the queue: the stream ended (closed, or broken for good)
DECODE_IN_THREAD_BYTES = 256 * 1024


class AsyncConsumer:
    """Receive from a queue or a topic subscription in asyncio code (the arguments as
    :class:`~spark_mq.Consumer`'s; see the module's docstring)."""

    def __init__(
        self,
        url: str | Sequence[str] = DEFAULT_URL,
        destination: str = "",
        *,
        subscription: str | None = None,
        selector: str | None = None,
        durable: bool = True,
        temporary: bool = False,
        prefetch: int = 100,
        timeout_s: float = 30.0,
        username: str | None = None,
        password: str | None = None,
        token: str | None = None,
        tls_ca_file: str | None = None,
        tls_cert_file: str | None = None,
        tls_key_file: str | None = None,
        heartbeat_s: float = DEFAULT_HEARTBEAT_S,
        decode_in_thread_bytes: int = DECODE_IN_THREAD_BYTES,
        partitions_recheck_s: float = DEFAULT_RECHECK_S,
        reattach: bool = True,
    ) -> None:
        self.destination = destination if temporary else validate_stored_name(destination)
        # reattach: a cluster member that does not serve the destination (or no longer does)
        # sends it to the member that does, and a lost broker is looked for again (a pair's
        # backup, a cluster's members); False: it ends, its error saying why (a NotOwner naming
        # where), for a caller that follows itself (a member forwarding a STOMP subscription)
        self._reattach_ok = reattach
        if subscription is not None:
            validate_name(subscription, "subscription")
        self.subscription = subscription
        self.durable = durable
        self._command = protocol.Consume(
            destination, subscription, prefetch, selector, durable, temporary, compact=True
        )
        auth = Auth.of(username, password, token, tls_ca_file, tls_cert_file, tls_key_file)
        # (its Flight client closed once the wire is found: a consumer reads only the wire)
        self._broker = Broker(url, timeout_s, auth, keep_flight=False)
        self._timeout_s = timeout_s
        self._heartbeat_s = heartbeat_s
        self._decode_in_thread = decode_in_thread_bytes
        self.consumer_id: int | None = None
        self.lease_s: float | None = None
        self.error: SparkMQError | None = None
        self._link: Link | None = None
        self._welcome: asyncio.Future[None] | None = None
        # deliveries in order, each an AsyncMessageBatch (a record batch, or a ONE frame's
        # message), then _END; _held: taken from the queue, not yet received (a batch, or the
        # messages left of one a get_many took part of)
        self._queue: asyncio.Queue[object] | None = None
        self._held: collections.deque[AsyncMessageBatch | collections.deque[AsyncMessage]] = (
            collections.deque()
        )
        self._wants_messages = False  # get_many was called: big deliveries' messages are made
        # in the worker thread that decodes them
        self._decoding = False  # a batch is being decoded in a thread: frames wait behind it
        self._backlog: collections.deque[tuple[int, wire.Body]] = collections.deque()
        self._settles: list[tuple[Verb, Sequence[tuple[int, int]], asyncio.Future[None]]] = []
        self._requests: dict[int, list[tuple[Sequence[int], asyncio.Future[None]]]] = {}
        self._request_ids = itertools.count(1)
        self._kept: dict[int, Message] = {}  # id(message): messages whose leases are renewed
        self._keeper: asyncio.Task[None] | None = None
        self._reattaching: asyncio.Task[None] | None = None
        self._ended: asyncio.Future[None] | None = None  # the link's end, once asked (close)
        self._handlers: set[asyncio.Task[None]] = set()  # serve()'s handler tasks, running
        self._detaching: asyncio.Task[None] | None = None
        self._closing_reason: str | None = None
        self._closed = False
        self._started = False
        self._starting = False  # (the first attach: what it meets, start() raises)
        # a partitioned destination's: a consumer of each partition, and the tasks that move
        # their messages into this one's queue
        self._parts: list[AsyncConsumer] = []
        self._pumps: list[asyncio.Task[None]] = []
        # asks every partitions_recheck_s whether partitions were added, and consumes those too
        self._recheck_s = checked_recheck_s(partitions_recheck_s)
        self._growing: asyncio.Task[None] | None = None
        self._make_part = lambda part: AsyncConsumer(
            url, part, subscription=subscription, selector=selector, durable=durable,
            prefetch=prefetch, timeout_s=timeout_s, username=username, password=password,
            token=token, tls_ca_file=tls_ca_file, tls_cert_file=tls_cert_file,
            tls_key_file=tls_key_file, heartbeat_s=heartbeat_s,
            decode_in_thread_bytes=decode_in_thread_bytes, reattach=reattach,
        )  # fmt: skip

    # -- attaching -------------------------------------------------------------------------------
    async def __aenter__(self) -> AsyncConsumer:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def start(self) -> None:
        """Attach (``async with`` does it): the broker's welcome, or its refusal, raised."""
        if self._started:
            return
        self._started = True
        self._queue = asyncio.Queue()
        self._starting = True
        try:
            await self._attach_following()
        except Partitioned as exc:
            await self._attach_partitions(int(exc.fields.get("partitions", 1)))
        except BaseException:
            self._started, self._queue, self._link = False, None, None  # (may be tried again)
            self.error = None
            raise
        finally:
            self._starting = False

    async def _attach_following(self) -> None:
        """Attach; refused by a cluster member that does not serve the destination, attach
        where the refusal says (one round trip), or, while it is being placed, again a moment
        later, for up to ``timeout_s``."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._timeout_s
        while True:
            try:
                await self._attach()
                return
            except NotOwner as exc:
                if not self._reattach_ok or self._closed or loop.time() >= deadline:
                    raise
                await self._broker.go(exc.fields.get("endpoint"))

    async def _attach(self) -> None:
        loop = asyncio.get_running_loop()
        self._welcome = loop.create_future()
        self._decoding = False
        self._backlog.clear()
        link = await open_link(
            self._broker, self._command, self._on_frame, self._on_lost, self._heartbeat_s
        )
        link.waiting = 1  # (a consumer's broker always has something for it: heartbeats)
        self._link = link
        try:
            async with asyncio.timeout(self._timeout_s):
                await asyncio.shield(self._welcome)
        except TimeoutError:
            link.abort()
            raise BrokerUnavailable(
                f"the broker did not welcome the consumer within {self._timeout_s:g} s"
            ) from None
        except BaseException:
            link.abort()
            raise

    async def _attach_partitions(self, n: int) -> None:
        """A partitioned destination: a consumer of each partition, their messages moved into
        this one's queue as they come (order holds within a partition, so within a group);
        each message is settled through the consumer that delivered it."""
        # its own link was refused: nothing of it stays (its end was told to the queue)
        self._link, self.error, self._queue = None, None, asyncio.Queue()
        await asyncio.to_thread(self._broker.close)
        try:
            for index in range(n):
                part = self._make_part(partition_name(self.destination, index))
                await part.start()
                self._parts.append(part)
        except BaseException:
            for part in self._parts:
                await part.close()
            self._parts.clear()
            raise
        first = self._parts[0]
        self.lease_s, self.consumer_id = first.lease_s, first.consumer_id
        self._pumps = [asyncio.ensure_future(self._pump(p)) for p in self._parts]
        if self._recheck_s:
            self._growing = asyncio.ensure_future(self._grow())

    async def _grow(self) -> None:
        """Every ``partitions_recheck_s``: the destination's partitions added since, each
        attached and pumped as the first were (one that cannot attach yet: next time)."""
        while True:
            await asyncio.sleep(self._recheck_s)
            try:
                # (partition 0's consumer asks: its connection goes where partition 0 is)
                count = await self._parts[0]._broker.partitions(self.destination)
                for index in range(len(self._parts), count):
                    part = self._make_part(partition_name(self.destination, index))
                    try:
                        await part.start()
                    except BaseException:
                        await part.close()
                        raise
                    self._parts.append(part)
                    self._pumps.append(asyncio.ensure_future(self._pump(part)))
                    log.info("%s: consuming its new partition %d", self.destination, index)
            except SparkMQError as exc:
                log.warning("could not take on %s's new partitions yet: %s", self.destination,
                            exc.message)  # fmt: skip

    async def _pump(self, part: AsyncConsumer) -> None:
        assert self._queue is not None
        try:
            while True:
                got = await part.get_batch(1_000_000)  # (a delivery whole: one partition's)
                if got is None:
                    break
                self._queue.put_nowait(got)
        except SparkMQError as exc:  # (the partition's consumer broke for good)
            self.error = exc
            self._queue.put_nowait(_END)

    @property
    def partitions(self) -> list[AsyncConsumer] | None:
        """A partitioned destination's consumer: the consumer of each partition (None for
        any other)."""
        return list(self._parts) if self._parts else None

    def _on_lost(self, err: SparkMQError) -> None:
        if self._welcome is not None and not self._welcome.done():
            self._welcome.set_exception(err)
            self._welcome.exception()  # (retrieved: _attach raises it)
        for items in self._requests.values():  # settles the link took with it
            for _, fut in items:
                if not fut.done():
                    fut.set_exception(err)
        self._requests.clear()
        if self._ended is not None and not self._ended.done():
            self._ended.set_result(None)
        if self._closed or self._link is None or self._starting:
            return  # (closing; or the first attach failing, which raises)
        if self._reattaching is not None and not self._reattaching.done():
            return  # (a link the reattaching made, lost before its welcome: it tries again)
        why = BrokerUnavailable(self._closing_reason) if self._closing_reason else err
        if (
            self._reattach_ok
            and self._broker.may_fail_over
            and not self._command.temporary
            and isinstance(why, BrokerUnavailable)
        ):
            self._reattaching = asyncio.ensure_future(self._reattach(why))
        else:
            self._end(why)

    async def _reattach(self, err: BrokerUnavailable) -> None:
        """Attach again to whichever broker serves now (a failover), or where a cluster member
        said its destination went (``NotOwner``)."""
        log.info("consumer: %s; attaching again where the data is served now", err)
        queue = self._queue
        assert queue is not None
        self._held.clear()
        while not queue.empty():  # delivered by the old broker: its leases went with it
            if queue.get_nowait() is _END:
                queue.put_nowait(_END)
                break
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._timeout_s
        seen = self._broker.generation
        moved: NotOwner | None = err if isinstance(err, NotOwner) else None
        while not self._closed:
            try:
                if moved is not None:
                    await self._broker.go(moved.fields.get("endpoint"))
                    moved = None
                await self._broker.find(seen=seen)
                seen = self._broker.generation
                self._closing_reason = None
                await self._attach()
                return
            except NotOwner as exc:  # (sent on: where the refusal says)
                if loop.time() >= deadline:
                    self._end(exc)
                    return
                moved, seen = exc, self._broker.generation
            except BrokerUnavailable as exc:
                if loop.time() >= deadline:
                    self._end(exc)
                    return
                await asyncio.sleep(0.2)
            except SparkMQError as exc:  # refused there (credentials, permissions...)
                self._end(exc)
                return

    def _end(self, err: SparkMQError | None) -> None:
        if err is not None and self.error is None:
            self.error = err
        if self._queue is not None:
            self._queue.put_nowait(_END)

    # -- frames in ---------------------------------------------------------------------------------
    def _on_frame(self, kind: int, body: wire.Body) -> None:
        if self._decoding:
            self._backlog.append((kind, body))
            return
        self._handle(kind, body)

    def _handle(self, kind: int, body: wire.Body) -> None:
        if kind == wire.ONE:
            one = wire.read_one(body)
            message = message_of_one(self.destination, one, self._settler, AsyncMessage)
            self._deliver(self._batch(None, [message]))
        elif kind == wire.BATCH:
            if len(body) < self._decode_in_thread:
                self._deliver(self._decode(body))
                return
            self._decoding = True
            link = self._link
            loop = asyncio.get_running_loop()
            decoding = loop.run_in_executor(None, self._decode_off_loop, body)
            decoding.add_done_callback(lambda done: self._decoded(link, done))
        elif kind == wire.CONTROL:
            self._control(wire.control_bytes(body))
        else:
            raise ProtocolError(f"unexpected frame of kind {kind} from the broker", fault="remote")

    @property
    def _settler(self) -> Settler:
        return cast("Settler", self)  # (its verbs return asyncio futures: AsyncMessage's)

    def _batch(self, arrow: Any, messages: list[Message] | None = None) -> AsyncMessageBatch:
        return AsyncMessageBatch(self.destination, arrow, self._settler, messages, AsyncMessage)

    def _decode(self, body: wire.Body) -> AsyncMessageBatch:
        # (its messages are made when received: get_many, or never: get_batch)
        return self._batch(wire.read_batch(body, DELIVERY_SCHEMA)[1])

    def _decode_off_loop(self, body: wire.Body) -> AsyncMessageBatch:
        """A big delivery, in a worker thread: its messages are made here too once this
        consumer has been asked for messages (get_many), not on the loop."""
        batch = self._decode(body)
        if self._wants_messages:
            batch._as_messages()
        return batch

    def _decoded(self, link: Link | None, done: asyncio.Future[AsyncMessageBatch]) -> None:
        if link is not self._link or link is None or link.lost is not None:
            return  # (the link it came on is gone: so are its leases)
        self._decoding = False
        try:
            self._deliver(done.result())
            while self._backlog and not self._decoding:
                kind, body = self._backlog.popleft()
                self._handle(kind, body)
        except SparkMQError as exc:
            link.fail(exc)
        except Exception as exc:
            link.fail(ProtocolError(f"an unreadable delivery: {exc}", fault="remote"))

    def _deliver(self, batch: AsyncMessageBatch) -> None:
        queue = self._queue
        assert queue is not None
        if len(batch):
            queue.put_nowait(batch)

    def _control(self, data: bytes) -> None:
        if data.startswith(b'{"type":"failure"'):
            frame = wire.parse_control(data)
            assert isinstance(frame, wire.Failure)
            err = from_wire(json.dumps(frame.error).encode(), "the broker refused the consumer")
            assert self._link is not None
            self._link.fail(err)
            return
        match protocol.parse(data):
            case protocol.Welcome(consumer_id=cid, lease_s=lease, destination=name):
                self.consumer_id, self.lease_s = cid, lease
                self.destination = name or self.destination
                if self._welcome is not None and not self._welcome.done():
                    self._welcome.set_result(None)
            case protocol.Reply(request_id=rid) as reply:
                refused, again = refusals(reply), coming_again(reply)
                for offsets, fut in self._requests.pop(rid, []):
                    if fut.done():
                        continue  # (its caller was cancelled: dropped, nothing else)
                    refusal = settle_refusal(refused, offsets, self.destination, again)
                    if refusal is not None:
                        fut.set_exception(refusal)
                    else:
                        fut.set_result(None)
            case protocol.Heartbeat():
                pass
            case protocol.Closing(reason=reason):
                # the broker is shutting down: say bye (it answers the settles before it and
                # ends the stream), then attach again elsewhere, or end with the reason
                self._closing_reason = reason
                with contextlib.suppress(SparkMQError):
                    assert self._link is not None
                    self._link.send(protocol.Bye())
            case frame:
                raise ProtocolError(f"unexpected frame from the broker: {frame}", fault="remote")

    # -- receiving ---------------------------------------------------------------------------------
    async def receive(self, timeout: float | None = None) -> AsyncMessage | None:
        """The next message; None after ``timeout`` seconds (None: wait as long as it takes),
        or once the consumer is closed. Raises why if the stream broke for good."""
        got = await self.get_many(1, timeout)
        return got[0] if got else None

    async def get_many(self, max_messages: int, timeout: float | None = None) -> list[AsyncMessage]:
        """Up to ``max_messages``: waits ``timeout`` for the first, then takes what is here."""
        self._wants_messages = True
        if not await self._wait_held(timeout):
            return []
        held, out = self._held, cast("list[AsyncMessage]", [])
        while True:
            chunk = held[0]
            if isinstance(chunk, MessageBatch):  # (made messages, taken one by one)
                chunk = held[0] = collections.deque(cast("list[AsyncMessage]", list(chunk)))
            want = max_messages - len(out)
            if len(chunk) > want:
                out.extend([chunk.popleft() for _ in range(want)])
                return out
            out.extend(chunk)
            held.popleft()
            if len(out) == max_messages or not (held or self._hold_next()):
                return out

    async def get_batch(
        self, max_messages: int, timeout: float | None = None
    ) -> AsyncMessageBatch | None:
        """Up to ``max_messages`` of one delivery as an :class:`AsyncMessageBatch` (its Arrow
        record batch; ``await batch.ack()`` settles it whole), or None after ``timeout``
        seconds: as ``Consumer.receive_batch``, with no Python object made for a message
        unless asked for. A partitioned destination's batches each hold one partition's."""
        if not await self._wait_held(timeout):
            return None
        held = self._held
        chunk = held[0]
        if isinstance(chunk, AsyncMessageBatch):
            if len(chunk) <= max_messages:
                return cast(AsyncMessageBatch, held.popleft())
            head, rest = chunk._split(max_messages)
            held[0] = cast(AsyncMessageBatch, rest)
            return cast(AsyncMessageBatch, head)
        messages: list[Message] = [chunk.popleft() for _ in range(min(max_messages, len(chunk)))]
        if not chunk:
            held.popleft()
        first = messages[0]
        return AsyncMessageBatch(first.destination, None, first._consumer, messages, AsyncMessage)

    async def _wait_held(self, timeout: float | None) -> bool:
        """Whether a delivery is held, waiting ``timeout`` for one; False at the end (raising
        why if the stream broke for good)."""
        if self._queue is None:
            await self.start()
        if self._held:
            return True
        queue = self._queue
        assert queue is not None
        try:
            async with asyncio.timeout(timeout):
                item = await queue.get()
        except TimeoutError:
            return False
        if item is _END:
            queue.put_nowait(_END)  # (for every other receiver too)
            if self.error is not None and not self._closed:
                raise self.error
            return False
        self._held.append(cast(AsyncMessageBatch, item))
        return True

    def _hold_next(self) -> bool:
        """Take the next delivery from the queue, if one is there now (not the end)."""
        queue = self._queue
        if queue is None or queue.empty():
            return False
        item = queue.get_nowait()
        if item is _END:
            queue.put_nowait(_END)
            return False
        self._held.append(cast(AsyncMessageBatch, item))
        return True

    def __aiter__(self) -> AsyncConsumer:
        return self

    async def __anext__(self) -> AsyncMessage:
        message = await self.receive()
        if message is None:
            raise StopAsyncIteration
        return message

    # -- settling ----------------------------------------------------------------------------------
    def ack(self, messages: Message | Iterable[Message]) -> asyncio.Future[None]:
        return self._settle("ack", messages)

    def nack(self, messages: Message | Iterable[Message]) -> asyncio.Future[None]:
        return self._settle("nack", messages)

    def extend_lease(self, messages: Message | Iterable[Message]) -> asyncio.Future[None]:
        return self._settle("extend", messages)

    def _give_back(self, messages: list[AsyncMessage]) -> asyncio.Future[None]:
        """Nack, for another consumer to take when there is one (brokers before wire version 4
        know only the nack)."""
        address = self._broker.address
        return self._settle("release" if address and address.version >= 4 else "nack", messages)

    def settle_entries(
        self, verb: Verb, entries: Sequence[tuple[int, int]]
    ) -> asyncio.Future[None]:
        """Settle this consumer's deliveries named by ``(offset, delivery count)`` pairs, for a
        caller that keeps no message objects (a cluster member forwarding its clients' acks);
        ``release`` is a nack to a broker that has none. Not for a partitioned destination's
        consumer: each message is settled through the partition's that delivered it."""
        if self._parts:
            raise TypeError(
                f"{self.destination} is partitioned: settle its messages (or through the "
                "consumer of the partition that delivered them, .partitions)"
            )
        if verb == "release" and not ((a := self._broker.address) and a.version >= 4):
            verb = "nack"
        return self._settle_entries(verb, entries)

    def _settle(self, verb: Verb, messages: Message | Iterable[Message]) -> asyncio.Future[None]:
        if isinstance(messages, MessageBatch):  # (one delivery's: its columns, no messages)
            owner = cast(AsyncConsumer, messages._owner())
            if owner is not self:  # (a partition's)
                return owner._settle(verb, messages)
            entries = messages._entries()[1]
            return self._settle_entries(verb, entries)
        msgs = [messages] if isinstance(messages, Message) else list(messages)
        if self._parts:  # (each by the partition's consumer that delivered it)
            by_part: dict[int, tuple[AsyncConsumer, list[Message]]] = {}
            for m in msgs:
                owner = cast(AsyncConsumer, m._owner())
                by_part.setdefault(id(owner), (owner, []))[1].append(m)
            settled = [owner._settle(verb, ms) for owner, ms in by_part.values()]
            return cast("asyncio.Future[None]", asyncio.ensure_future(_all_of(settled)))
        return self._settle_entries(verb, [(m.offset, m.delivery_count) for m in msgs])

    def _settle_entries(
        self, verb: Verb, entries: Sequence[tuple[int, int]]
    ) -> asyncio.Future[None]:
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[None] = loop.create_future()
        fut.add_done_callback(_logged)
        link = self._link
        if link is None or (self._closed and self._ended is not None):
            fut.set_exception(self.error or BrokerUnavailable("the consumer is closed"))
            return fut
        if not self._settles:
            loop.call_soon(self._send_settles)
        self._settles.append((verb, entries, fut))
        return fut

    def _send_settles(self) -> None:
        work, self._settles = self._settles, []
        by_verb: dict[Verb, list[tuple[Sequence[tuple[int, int]], asyncio.Future[None]]]] = {}
        for verb, entries, fut in work:
            by_verb.setdefault(verb, []).append((entries, fut))
        for verb, items in by_verb.items():
            request_id = next(self._request_ids)
            entries = protocol.joined_entries([es for es, _ in items])
            frame = protocol.Settle(verb, request_id, entries)
            self._requests[request_id] = [(_offsets(es), f) for es, f in items]
            try:
                assert self._link is not None
                self._link.send(frame)
            except SparkMQError as err:
                for _, fut in self._requests.pop(request_id, []):
                    if not fut.done():
                        fut.set_exception(err)

    # -- leases kept while a message is handled --------------------------------------------------
    def keep_leased(self, message: Message) -> None:
        """Extend ``message``'s lease in the background until :meth:`release_lease`."""
        if self._parts:
            cast(AsyncConsumer, message._owner()).keep_leased(message)
            return
        self._kept[id(message)] = message
        if self._keeper is None or self._keeper.done():
            self._keeper = asyncio.ensure_future(self._keep())

    def release_lease(self, message: Message) -> None:
        if self._parts:
            cast(AsyncConsumer, message._owner()).release_lease(message)
            return
        self._kept.pop(id(message), None)

    async def _keep(self) -> None:
        while self._kept and self._ended is None:  # (until the bye: handlers finish first)
            await asyncio.sleep(max((self.lease_s or 30.0) / 3, 0.05))
            if self._kept and self._ended is None:
                self.extend_lease(list(self._kept.values()))

    # -- a pool of handlers ------------------------------------------------------------------------
    async def serve(
        self, handler: Handler, *, concurrency: int = 10, start_timeout_s: float | None = None
    ) -> None:
        """Hand each message to ``handler`` (a coroutine function) in a pool of
        ``concurrency`` tasks (seed 001's activation specification: ``maxPoolDepth`` 10 by
        default), until the consumer is closed (then return) or breaks (then raise why).

        A message is acked when its handler returns and nacked when it raises; its lease is
        extended while the handler runs. Messages of one group go to one handler at a time,
        in order. A message that finds no free handler within ``start_timeout_s`` is given back
        (nacked) for another consumer to take (None: it waits as long as it takes)."""
        if concurrency < 1:
            raise ValueError(f"concurrency must be 1 or more, got {concurrency}")
        await self.start()
        loop = asyncio.get_running_loop()
        lanes: Lanes[AsyncMessage] = Lanes(lambda m: m.group_id)
        wake = asyncio.Event()
        feeding = True

        async def worker() -> None:
            while True:
                message = lanes.take()
                if message is None:
                    if not feeding:
                        return
                    wake.clear()
                    await wake.wait()
                    continue
                while message is not None and not self._closed:
                    self.keep_leased(message)
                    try:
                        await handler(message)
                    except Exception:
                        log.exception(
                            "handler raised for %s offset %d: it is nacked",
                            self.destination,
                            message.offset,
                        )
                        self.release_lease(message)
                        self.nack(message)
                    else:
                        self.release_lease(message)
                        self.ack(message)
                    message = lanes.done(message)

        async def expire(limit_s: float) -> None:
            while True:
                await asyncio.sleep(max(limit_s / 4, 0.01))
                late = lanes.expired(loop.time(), limit_s)
                if late:
                    log.info(
                        "%d message(s) found no free handler in %g s: given back",
                        len(late),
                        limit_s,
                    )
                    self._give_back(late)

        workers = [asyncio.ensure_future(worker()) for _ in range(concurrency)]
        self._handlers.update(workers)
        expirer = asyncio.ensure_future(expire(start_timeout_s)) if start_timeout_s else None
        try:
            async for message in self:
                lanes.add(message, loop.time())
                wake.set()
        finally:
            feeding = False
            lanes.drain()  # (not handled: they go back when the consumer detaches)
            wake.set()
            if expirer is not None:
                expirer.cancel()
            try:
                await asyncio.gather(*workers)
            finally:
                self._handlers.difference_update(workers)

    # -- closing -----------------------------------------------------------------------------------
    async def close(self) -> None:
        """Let running ``serve`` handlers finish, send pending settles, then detach; what was
        delivered and not acked goes back to the broker."""
        if self._closed:
            if self._detaching is not None and asyncio.current_task() not in self._handlers:
                await asyncio.shield(self._detaching)
            return
        self._closed = True
        if self._queue is not None:
            self._queue.put_nowait(_END)  # receivers and serve() end
        self._detaching = asyncio.ensure_future(self._detach())
        if asyncio.current_task() in self._handlers:
            return  # (a handler closing its consumer: the rest once the handlers are done)
        await asyncio.shield(self._detaching)

    async def _detach(self) -> None:
        if self._handlers:  # running handlers finish (and settle) first
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self._timeout_s):
                    running = [asyncio.shield(t) for t in self._handlers]
                    await asyncio.gather(*running, return_exceptions=True)
        if self._parts:
            if self._growing is not None:
                self._growing.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await self._growing
            for pump in self._pumps:
                pump.cancel()
            await asyncio.gather(*(p.close() for p in self._parts), return_exceptions=True)
            return
        if self._reattaching is not None:
            self._reattaching.cancel()
        if self._keeper is not None:
            self._keeper.cancel()
        link = self._link
        if link is not None and link.lost is None:
            if self._settles:
                self._send_settles()
            self._ended = asyncio.get_running_loop().create_future()
            try:
                link.send(protocol.Bye())  # the broker answers what came before, then ends
                async with asyncio.timeout(self._timeout_s):
                    await asyncio.shield(self._ended)
            except (SparkMQError, TimeoutError):
                pass
            link.close()
        await asyncio.to_thread(self._broker.close)


def _offsets(entries: Sequence[tuple[int, int]]) -> Sequence[int]:
    """The offsets of a settle's entries (a batch's array as it is)."""
    if isinstance(entries, protocol.SettlePairs):
        return cast(Sequence[int], entries.offsets)  # (an array: looked in on refusals)
    return [o for o, _ in entries]


def _logged(fut: asyncio.Future[Any]) -> None:
    """A settle nobody awaited that failed is logged (not "never retrieved")."""
    if not fut.cancelled() and (exc := fut.exception()) is not None:
        log.debug("a settle failed: %s", exc)


async def _all_of(settled: list[asyncio.Future[None]]) -> None:
    """Every partition's settle; the first failure raised."""
    for outcome in await asyncio.gather(*settled, return_exceptions=True):
        if isinstance(outcome, BaseException):
            raise outcome
