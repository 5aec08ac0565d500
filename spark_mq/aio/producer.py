"""The asyncio producer: ``await producer.send(...)`` returns the message's offset once it is
durable.

Sends from many tasks in one turn of the loop travel in one frame (a ``PLAIN`` frame when each
message is only a body and a dedup id, else an Arrow batch of the columns they use), written at
the end of that turn: no linger timer, no thread. One direct-wire connection per destination,
opened at its first send; on each, at most ``max_in_flight`` messages are sent and not yet
answered, and a send beyond that waits, in order, until answers make room (the backpressure is
the await; a send cancelled before it left is not sent at all). Waiting for room there, in the
connection's queue, costs a send nothing more than waiting for its answer: a semaphore in front
of it cost 7-70 us of CPU a send when tens of thousands of tasks waited (measured).
``submit`` puts a message in that queue and returns its future, waiting only while the queue
holds ``max_in_flight`` messages: many sends from one task without a task each.

Every message has a dedup id (given, or the producer's prefix and a sequence number). Given a
primary and its backup, a send whose connection broke is sent again, with the same dedup id, to
whichever serves then (for up to ``timeout_s``): stored once. Given a cluster member, each
destination's stream goes to the member that serves it (a ``NotOwner`` answer names it), and
what a move caught is sent on there the same way; either way, in the order sent
(``_Stream``). A ``send`` cancelled after its message left may still be stored, as a
timed-out one may: send it again with the same ``dedup_id`` to be sure.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import itertools
import logging
import uuid
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime

import pyarrow as pa

from spark_mq import protocol, wire
from spark_mq.aio._link import Broker, Link, open_link
from spark_mq.client._flight_put import conform_produce
from spark_mq.client._liveness import DEFAULT_HEARTBEAT_S
from spark_mq.client._options import check_options
from spark_mq.client._partition_watch import DEFAULT_RECHECK_S, checked_recheck_s
from spark_mq.client._pending import Pending, batch_of, plain_of
from spark_mq.client._routes import PLACING_RETRY_S
from spark_mq.client._transport import DEFAULT_URL
from spark_mq.errors import BrokerUnavailable, NotOwner, ProtocolError, SparkMQError, from_wire
from spark_mq.messages import PlainMessage
from spark_mq.names import choose_partition, partition_name, partition_of, validate_stored_name
from spark_mq.schema import PRODUCE_SCHEMA
from spark_mq.security.credentials import Auth

log = logging.getLogger(__name__)

_FRAME_MESSAGES = 1000  # the most messages one frame carries
_FRAME_BYTES = 1024 * 1024  # and about the most bytes of bodies


class AsyncProducer:
    """Send messages to queues and topics from asyncio code (see the module's docstring).

    ``async with AsyncProducer(url) as producer: offset = await producer.send(b"...",
    destination="orders")``. Credentials and TLS files as for :class:`~spark_mq.Producer`.
    """

    def __init__(
        self,
        url: str | Sequence[str] = DEFAULT_URL,
        *,
        destination: str | None = None,
        max_in_flight: int = 1000,
        timeout_s: float = 30.0,
        group_id: str | None = None,
        username: str | None = None,
        password: str | None = None,
        token: str | None = None,
        tls_ca_file: str | None = None,
        tls_cert_file: str | None = None,
        tls_key_file: str | None = None,
        heartbeat_s: float = DEFAULT_HEARTBEAT_S,
        partitions_recheck_s: float = DEFAULT_RECHECK_S,
    ) -> None:
        if destination is not None:
            validate_stored_name(destination)
        if max_in_flight < 1:
            raise ValueError(f"max_in_flight must be 1 or more, got {max_in_flight}")
        self.destination = destination
        self.group_id = group_id
        auth = Auth.of(username, password, token, tls_ca_file, tls_cert_file, tls_key_file)
        self._broker = Broker(url, timeout_s, auth)
        self._timeout_s = timeout_s
        self._heartbeat_s = heartbeat_s
        self._max_in_flight = max_in_flight
        self._prefix = uuid.uuid4().hex
        self._numbers = itertools.count()
        self._streams: dict[str, _Stream] = {}
        self._opening: dict[str, asyncio.Future[_Stream]] = {}
        # a cluster's: the member serving each destination a member sent it elsewhere for
        # (NotOwner, naming it), and a Broker a member (else the one it connected to)
        self._routes: dict[str, Broker] = {}
        self._members: dict[str, Broker] = {}
        # destinations whose names were checked, and how many partitions each has (1: none)
        self._partitions: dict[str, int] = {}
        self._counting: dict[str, asyncio.Future[int]] = {}  # (asked, not yet answered)
        self._turn = itertools.count()  # (the round robin over partitions)
        # asks now and then whether partitions were added to those it sends to (as the
        # synchronous Producer's partition watch does)
        self._recheck_s = checked_recheck_s(partitions_recheck_s)
        self._rechecking: asyncio.Task[None] | None = None
        self._closed = False

    async def __aenter__(self) -> AsyncProducer:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def start(self) -> None:
        """Find the broker (a Flight ``ping``, in a worker thread); ``send`` does it if not."""
        await self._broker.find()

    def next_dedup_id(self) -> str:
        return f"{self._prefix}-{next(self._numbers)}"

    def _dest(self, destination: str | None) -> str:
        dest = destination or self.destination
        if dest is None:
            raise ValueError("no destination: pass destination= here or to AsyncProducer()")
        if dest not in self._partitions:
            validate_stored_name(dest)
        return dest

    async def _count(self, dest: str) -> int:
        """How many partitions ``dest`` has (asked the first time; a partitioned one's again
        every ``partitions_recheck_s``: partitions may be added)."""
        n = self._partitions.get(dest)
        if n is not None:
            return n
        if partition_of(dest) is not None:
            self._partitions[dest] = 1
            return 1
        # one question a destination: the sends that come meanwhile wait for its answer and go
        # on in the order they came (a question each, answered in any order, let a task's
        # first sends to a destination overtake one another)
        asking = self._counting.get(dest)
        if asking is None:
            asking = asyncio.ensure_future(self._broker.partitions(dest))
            self._counting[dest] = asking
            asking.add_done_callback(lambda _: self._counting.pop(dest, None))
        n = await asyncio.shield(asking)  # (a cancelled caller leaves it for the others)
        if dest not in self._partitions:
            self._partitions[dest] = n
            if n > 1 and self._recheck_s and self._rechecking is None and not self._closed:
                self._rechecking = asyncio.ensure_future(self._recheck())
        return n

    async def _recheck(self) -> None:
        while True:
            await asyncio.sleep(self._recheck_s)
            for dest, n in list(self._partitions.items()):
                if n > 1:
                    try:
                        now = await self._broker.partitions(dest)
                    except SparkMQError as exc:  # (asked again next time)
                        log.warning("could not ask how many partitions %s has: %s", dest,
                                    exc.message)  # fmt: skip
                        continue
                    if now > n:
                        log.info("%s now has %d partitions (had %d)", dest, now, n)
                        self._partitions[dest] = now

    def _placed(self, dest: str, n: int, key: str | None) -> str:
        """The partition a message goes to, as the synchronous SDK places it (by group id,
        else the dedup id given, else in turn)."""
        return dest if n == 1 else partition_name(dest, choose_partition(key, n, next(self._turn)))

    async def send(
        self,
        body: bytes | str,
        *,
        destination: str | None = None,
        headers: Mapping[str, str] | None = None,
        group_id: str | None = None,
        priority: int | None = None,
        dedup_id: str | None = None,
        message_id: str | None = None,
        ttl_s: float | None = None,
        expiry_time: datetime | None = None,
        delay_s: float | None = None,
        deliver_at: datetime | None = None,
    ) -> int:
        """Send one message; returns its offset once it is durable. Options as
        :meth:`spark_mq.Producer.send`'s; to a partitioned destination, to the partition its
        group id (else dedup id) places it in."""
        dest = self._dest(destination)
        n = self._partitions.get(dest) or await self._count(dest)
        if n > 1:
            dest = self._placed(dest, n, group_id or self.group_id or dedup_id)
        item = self._item(
            body, dest, headers, group_id, priority, dedup_id, message_id, ttl_s, expiry_time,
            delay_s, deliver_at,
        )  # fmt: skip
        stream = self._streams.get(dest)
        if stream is None or stream.dead:
            return await self._send_one(dest, item)
        # the common case, without the general path's coroutines: the stream is open
        try:
            return await stream.add(item)
        except BrokerUnavailable:
            if not self._broker.may_fail_over or self._closed:
                raise
            return await self._send_one(dest, item)  # (its stream gave up: a new one)

    async def submit(
        self,
        body: bytes | str,
        *,
        destination: str | None = None,
        headers: Mapping[str, str] | None = None,
        group_id: str | None = None,
        priority: int | None = None,
        dedup_id: str | None = None,
        message_id: str | None = None,
        ttl_s: float | None = None,
        expiry_time: datetime | None = None,
        delay_s: float | None = None,
        deliver_at: datetime | None = None,
    ) -> asyncio.Future[int]:
        """Send one message without waiting for it: returns a future of its offset, resolved
        once it is durable (as aiokafka's ``send``). The await returns at once unless
        ``max_in_flight`` messages of the destination already wait to be sent: then when they
        have room (the backpressure). No task per message, so many messages from one task cost
        less this way than a task each awaiting :meth:`send`. Cancelling the future before the
        message left keeps it from being sent; failover and options as :meth:`send`'s."""
        dest = self._dest(destination)
        n = self._partitions.get(dest) or await self._count(dest)
        if n > 1:
            dest = self._placed(dest, n, group_id or self.group_id or dedup_id)
        item = self._item(
            body, dest, headers, group_id, priority, dedup_id, message_id, ttl_s, expiry_time,
            delay_s, deliver_at,
        )  # fmt: skip
        stream = self._streams.get(dest)
        if stream is None or stream.dead:
            return asyncio.ensure_future(self._send_one(dest, item))
        while stream.crowded:
            await stream.room()
        if stream.dead:
            return asyncio.ensure_future(self._send_one(dest, item))
        return stream.add(item)  # (sent on by its stream if the connection breaks or moves)

    def _item(
        self,
        body: bytes | str,
        dest: str,
        headers: Mapping[str, str] | None,
        group_id: str | None,
        priority: int | None,
        dedup_id: str | None,
        message_id: str | None,
        ttl_s: float | None,
        expiry_time: datetime | None,
        delay_s: float | None,
        deliver_at: datetime | None,
    ) -> Pending:
        check_options(priority, ttl_s, delay_s, dest)
        return Pending.of(
            body,
            dedup_id or self.next_dedup_id(),
            None,
            message_id=message_id,
            group_id=group_id or self.group_id,
            priority=priority,
            headers=headers,
            ttl_s=ttl_s,
            expiry_time=expiry_time,
            delay_s=delay_s,
            deliver_at=deliver_at,
        )

    async def _send_one(self, dest: str, item: Pending) -> int:
        return (await self._send(dest, [item]))[0]

    async def _recover(
        self, dest: str, broker: Broker, generation: int, err: BrokerUnavailable
    ) -> None:
        """Where ``dest``'s next stream goes after ``err`` on one made through ``broker``: the
        member a ``NotOwner`` names (none named, being placed: the same, a moment later); the
        member it connected to again when the member it was sent to went; that one found
        again when it went itself (a pair's backup, or any member of a cluster)."""
        if isinstance(err, NotOwner):
            self._follow(dest, err)
            if not err.fields.get("endpoint"):
                await asyncio.sleep(PLACING_RETRY_S)
        elif broker is not self._broker:
            if self._routes.get(dest) is broker:  # (its owner went: it is asked again where)
                del self._routes[dest]
        else:
            await self._broker.find(seen=generation)

    def _follow(self, dest: str, err: NotOwner) -> None:
        """A cluster member said another serves ``dest``: its next stream goes there."""
        home = self._broker
        home.clustered = True
        endpoint = err.fields.get("endpoint")
        if not isinstance(endpoint, str) or not endpoint:
            return  # (being placed: asked again where it was asked)
        home.known.setdefault(endpoint, None)
        if home.conn is not None and endpoint == home.conn.url:
            self._routes.pop(dest, None)
            return
        member = self._members.get(endpoint)
        if member is None:
            member = Broker(endpoint, self._timeout_s, home.auth, keep_flight=False)
            self._members[endpoint] = member
        self._routes[dest] = member

    async def send_rows(
        self, rows: pa.Table | list[PlainMessage], *, destination: str | None = None
    ) -> list[int]:
        """Send messages given as rows (``PRODUCE_SCHEMA``'s columns, as
        :meth:`spark_mq.Producer.send_batch` takes a table; a row without a dedup id is given
        one), or as plain messages (a body and a dedup id each): their offsets, in the rows'
        order, once every one is durable. Each goes where :meth:`send` would put it: a
        partitioned destination's rows by their group id (else dedup id)."""
        dest = self._dest(destination)
        items = self._pending(rows)
        if not items:
            return []
        n = self._partitions.get(dest) or await self._count(dest)
        if n == 1:
            return await self._send(dest, items)
        parts: dict[str, list[int]] = {}
        for at, item in enumerate(items):
            parts.setdefault(self._placed(dest, n, item.group_id or item.dedup_id), []).append(at)
        sent = await asyncio.gather(
            *(self._send(part, [items[at] for at in ats]) for part, ats in parts.items())
        )
        offsets = [0] * len(items)
        for ats, got in zip(parts.values(), sent, strict=True):
            for at, offset in zip(ats, got, strict=True):
                offsets[at] = offset
        return offsets

    def _pending(self, rows: pa.Table | list[PlainMessage]) -> list[Pending]:
        if isinstance(rows, list):
            return [Pending.of(m.body, m.dedup_id or self.next_dedup_id(), None) for m in rows]
        if not rows.schema.equals(PRODUCE_SCHEMA):
            rows = conform_produce(rows)
        items = [Pending(**row, future=None) for row in rows.to_pylist()]
        for item in items:
            if item.dedup_id is None:
                item.dedup_id = self.next_dedup_id()
            if item.headers is not None and not item.headers:
                item.headers = None
        return items

    async def send_batch(
        self, bodies: Iterable[bytes | str], *, destination: str | None = None
    ) -> list[int]:
        """Send many plain messages at once; their offsets once every one is durable. To a
        partitioned destination, as :meth:`spark_mq.Producer.send_batch` sends them: all to
        the producer's group id's partition; without one, a batch of up to a frame's messages
        whole to the next partition in turn, a bigger one in runs of a frame or more, one a
        partition."""
        dest = self._dest(destination)
        items = [Pending.of(b, self.next_dedup_id(), None, group_id=self.group_id) for b in bodies]
        if not items:
            return []
        n = await self._count(dest)
        runs = 1 if self.group_id is not None else max(1, min(n, len(items) // _FRAME_MESSAGES))
        if runs == 1:
            return await self._send(self._placed(dest, n, self.group_id), items)
        first = next(self._turn)
        cuts = [k * len(items) // runs for k in range(runs + 1)]
        sent = await asyncio.gather(
            *(
                self._send(partition_name(dest, (first + k) % n), items[cuts[k] : cuts[k + 1]])
                for k in range(runs)
            )
        )
        return [offset for part in sent for offset in part]

    async def _send(self, dest: str, items: list[Pending]) -> list[int]:
        loop = asyncio.get_running_loop()
        deadline: float | None = None
        while True:
            if self._closed:
                raise RuntimeError("the producer is closed")
            broker = self._routes.get(dest, self._broker)
            seen = broker.generation
            try:
                stream = await self._stream(dest)
            except BrokerUnavailable as exc:
                if not self._broker.may_fail_over:
                    raise
                deadline = deadline or loop.time() + self._timeout_s
                if loop.time() >= deadline:
                    raise
                if not isinstance(exc, NotOwner):
                    await asyncio.sleep(0.05)
                # (it went away before the link was made, or sent it elsewhere)
                await self._recover(dest, broker, seen, exc)
                continue
            futures = [stream.add(item) for item in items]
            try:
                if len(futures) == 1:
                    return [await futures[0]]
                outcomes = await asyncio.gather(*futures, return_exceptions=True)
                for outcome in outcomes:
                    if isinstance(outcome, BaseException):
                        raise outcome
                return outcomes  # type: ignore[return-value]  # (every one an offset)
            except BrokerUnavailable as exc:
                if not self._broker.may_fail_over or self._closed:
                    raise
                deadline = deadline or loop.time() + self._timeout_s
                if loop.time() >= deadline:
                    raise
                await self._recover(dest, stream.broker, stream.generation, exc)  # then again

    async def _stream(self, dest: str) -> _Stream:
        stream = self._streams.get(dest)
        if stream is not None and not stream.dead:
            return stream
        opening = self._opening.get(dest)
        if opening is None:
            opening = asyncio.ensure_future(self._open(dest))
            self._opening[dest] = opening
            opening.add_done_callback(lambda _: self._opening.pop(dest, None))
        return await asyncio.shield(opening)  # (a cancelled caller leaves it for the others)

    async def _open(self, dest: str) -> _Stream:
        broker = self._routes.get(dest, self._broker)
        await broker.find()
        stream = _Stream(self, dest, broker, self._max_in_flight)
        stream.link = await self._link(broker, stream)
        self._streams[dest] = stream
        return stream

    async def _link(self, broker: Broker, stream: _Stream) -> Link:
        return await open_link(
            broker, protocol.Produce(stream.dest), stream.on_frame, stream.on_lost,
            self._heartbeat_s,
        )  # fmt: skip

    def _sends_on(self, err: SparkMQError) -> bool:
        """Whether a stream lost for ``err`` sends what it held on to where its destination
        is served now (a pair's backup, a cluster's member), rather than failing it."""
        return isinstance(err, BrokerUnavailable) and self._broker.may_fail_over

    async def close(self) -> None:
        """Wait for the answers to every message sent (up to ``timeout_s``), then hang up."""
        if self._closed:
            return
        self._closed = True
        if self._rechecking is not None:
            self._rechecking.cancel()
        streams = list(self._streams.values())
        for opening in list(self._opening.values()):
            with contextlib.suppress(Exception):
                streams.append(await asyncio.shield(opening))
        for stream in streams:
            with contextlib.suppress(TimeoutError):  # (a broker that never answers: given up)
                async with asyncio.timeout(self._timeout_s):
                    await stream.idle()
            stream.stop(BrokerUnavailable("the producer closed before the broker answered"))
        await asyncio.to_thread(self._broker.close)
        for member in self._members.values():
            member.close()  # (their Flight clients were closed once found)


class _Stream:
    """One destination's connection: messages added in a turn go out at its end, in frames, as
    long as fewer than ``limit`` are on the wire unanswered; the rest wait here, in order, and go
    as answers come (a send cancelled before it left is not sent). Each frame's answer settles
    its messages.

    A connection lost (its broker gone: a pair's backup or a cluster's member serves now) or
    refused ``NotOwner`` (its destination served by another member: the refusal says which)
    is not the stream's end: what it had sent and not seen answered goes back in front of
    what waits, in order, and all of it goes on over a new connection to where the destination
    is served now, the messages with their dedup ids (stored once), for up to the producer's
    ``timeout_s``; messages added meanwhile wait behind them. So a destination's messages are
    stored in the order they were sent through a move or a failover (each group's order)."""

    link: Link

    def __init__(self, producer: AsyncProducer, dest: str, broker: Broker, limit: int) -> None:
        self._producer = producer
        self.dest = dest
        self.broker = broker  # (the one it was opened through, and which time it was found)
        self.generation = broker.generation
        self.sending_on: asyncio.Task[None] | None = None  # (lost: connecting again)
        self._failing_since: float | None = None  # (the first loss not followed by an answer)
        self._returned: list[tuple[Pending, asyncio.Future[int]]] = []  # (refused NotOwner)
        self._stopped = False
        self._limit = limit
        self._on_wire = 0  # messages sent and not answered
        self._loop = asyncio.get_running_loop()
        self._scheduled = False
        self._waiting: collections.deque[tuple[Pending, asyncio.Future[int]]] = collections.deque()
        self._in_flight: dict[int, list[tuple[Pending, asyncio.Future[int]]]] = {}
        self._seq = 0
        self._idle: asyncio.Future[None] | None = None
        self._room: asyncio.Future[None] | None = None  # for submit's backpressure

    @property
    def dead(self) -> bool:
        """Lost for good (not sending on): the next send opens another stream."""
        return self.link.lost is not None and self.sending_on is None

    @property
    def crowded(self) -> bool:
        """As many messages wait to be sent as may be on the wire (``submit`` waits then)."""
        return len(self._waiting) >= self._limit and not self.dead

    async def room(self) -> None:
        if self._room is None or self._room.done():
            self._room = self._loop.create_future()
        await asyncio.shield(self._room)  # (one waiter's cancellation is not the others')

    def _make_room(self) -> None:
        room = self._room
        if room is not None and not room.done() and not self.crowded:
            room.set_result(None)

    def add(self, item: Pending) -> asyncio.Future[int]:
        fut: asyncio.Future[int] = self._loop.create_future()
        if self.dead:
            assert self.link.lost is not None
            fut.set_exception(self.link.lost)
            return fut
        if not self._scheduled:
            self._scheduled = True
            self._loop.call_soon(self._flush)
        self._waiting.append((item, fut))
        return fut

    def _flush(self) -> None:
        try:
            self._send_waiting()
        finally:
            self._make_room()

    def _send_waiting(self) -> None:
        self._scheduled = False
        waiting = self._waiting
        if self.link.lost is not None:
            if self.sending_on is None:
                self._settle(list(waiting), self.link.lost)
                waiting.clear()
            return  # (else they go once it is connected again)
        while waiting and self._on_wire < self._limit:
            room = min(self._limit - self._on_wire, _FRAME_MESSAGES)
            chunk: list[tuple[Pending, asyncio.Future[int]]] = []
            size = 0
            while waiting and len(chunk) < room and size < _FRAME_BYTES:
                entry = waiting.popleft()
                if entry[1].cancelled():
                    continue  # (its caller gave up before it left: not sent)
                chunk.append(entry)
                size += len(entry[0].body)
            if not chunk:
                continue
            self._on_wire += len(chunk)
            seq = self._seq
            self._seq = (seq + 1) % 2**32
            items = [p for p, _ in chunk]
            plain = plain_of(items)
            try:
                if plain is not None:
                    parts = plain.parts(seq)
                else:
                    parts = wire.PRODUCE_SUBSETS.parts(seq, batch_of(items, every_column=False))
            except Exception as exc:  # a value Arrow cannot take: these messages only
                self._on_wire -= len(chunk)
                self._settle(chunk, SparkMQError(f"cannot encode the messages: {exc}"))
                continue
            self._in_flight[seq] = chunk
            self.link.waiting = len(self._in_flight)
            try:
                self.link.write(parts)
            except SparkMQError:
                return  # (on_lost has failed them)

    def on_frame(self, kind: int, body: wire.Body) -> None:
        if self.link.lost is not None:
            return  # (ended by an answer before this one: refused NotOwner)
        if kind != wire.CONTROL:
            raise ProtocolError(f"a frame of kind {kind} on a produce link", fault="remote")
        frame = wire.parse_control(wire.control_bytes(body))
        if isinstance(frame, wire.Failure):
            self.link.fail(from_wire(protocol.encode_action_body(**frame.error), "refused"))
            return
        if isinstance(frame, protocol.Heartbeat | protocol.Closing):
            return  # (closing: the broker answered everything; the end follows)
        if not isinstance(frame, protocol.PutAck | protocol.PutFailed):
            raise ProtocolError(f"unexpected answer to a produce: {frame}", fault="remote")
        chunk = self._in_flight.pop(frame.seq, None)
        self.link.waiting = len(self._in_flight)
        if chunk is None:
            raise ProtocolError(f"an answer to unknown batch {frame.seq}", fault="remote")
        self._on_wire -= len(chunk)
        if isinstance(frame, protocol.PutFailed):
            err = from_wire(protocol.encode_action_body(**frame.error), "failed")
            if isinstance(err, NotOwner):  # (it refuses every batch after this one too: this
                self._returned = chunk  # connection ends, and all it held goes on, in order,
                self.link.fail(err)  # where the refusal says)
                return
            self._settle(chunk, err)
            if self._waiting and not self._scheduled:  # room again: what waits goes now
                self._flush()
            return
        self._failing_since = None
        if self._waiting and not self._scheduled:
            self._flush()
        if frame.count != len(chunk) or (
            frame.offsets is not None and len(frame.offsets) != len(chunk)
        ):
            raise ProtocolError(f"{frame.count} offsets for {len(chunk)} messages", fault="remote")
        offsets = frame.offsets or range(frame.first_offset, frame.first_offset + frame.count)
        for (_, fut), offset in zip(chunk, offsets, strict=True):
            if not fut.done():  # (its caller may have been cancelled: dropped, nothing else)
                fut.set_result(offset)
        self._check_idle()

    def on_lost(self, err: SparkMQError) -> None:
        lost = self._returned + [entry for chunk in self._in_flight.values() for entry in chunk]
        self._returned = []
        self._in_flight.clear()
        self._on_wire = 0
        if not self._stopped and self._producer._sends_on(err):
            assert isinstance(err, BrokerUnavailable)
            self._waiting.extendleft(reversed(lost))  # (first, in the order they were sent)
            if self._failing_since is None:
                self._failing_since = self._loop.time()
            self.sending_on = asyncio.ensure_future(self._send_on(err))
            return
        waiting = list(self._waiting)
        self._waiting.clear()
        self._settle(lost + waiting, err)
        self._make_room()

    async def _send_on(self, err: BrokerUnavailable) -> None:
        """Connect again where the destination is served now, then send what waits (see the
        class's docstring); give up, failing it all, ``timeout_s`` after the first loss."""
        producer = self._producer
        assert self._failing_since is not None
        deadline = self._failing_since + producer._timeout_s
        broker, generation = self.broker, self.generation
        while True:
            try:
                await producer._recover(self.dest, broker, generation, err)
                broker = producer._routes.get(self.dest, producer._broker)
                await broker.find()
                generation = broker.generation
                link = await producer._link(broker, self)
                break
            except BrokerUnavailable as exc:
                if self._loop.time() >= deadline:
                    self.sending_on = None
                    self.stop(exc)
                    return
                err = exc
                if not isinstance(exc, NotOwner):
                    await asyncio.sleep(0.05)
        log.info(
            "producer: %s sent on through %s", self.dest, broker.conn.url if broker.conn else "?"
        )
        self.broker, self.generation, self.link = broker, generation, link
        self.sending_on = None
        self._flush()

    def stop(self, err: SparkMQError) -> None:
        """End it: what waits to be sent fails with ``err``, and what was sent and not
        answered fails as its connection closes (nothing is sent on)."""
        self._stopped = True
        if self.sending_on is not None:
            self.sending_on.cancel()
            self.sending_on = None
        waiting = list(self._waiting)
        self._waiting.clear()
        self._settle(waiting, err)
        self._make_room()
        if self.link.lost is None:
            self.link.close()  # (its end fails what it held: on_lost)

    def _settle(self, entries: list[tuple[Pending, asyncio.Future[int]]], err: Exception) -> None:
        for _, fut in entries:
            if not fut.done():
                fut.set_exception(err)
        self._check_idle()

    def _check_idle(self) -> None:
        idle = self._idle
        if idle is not None and not idle.done() and not self._in_flight and not self._waiting:
            idle.set_result(None)

    async def idle(self) -> None:
        """Wait until every message added was answered (or failed with the connection)."""
        if not self._in_flight and not self._waiting:
            return
        self._idle = self._loop.create_future()
        await self._idle
