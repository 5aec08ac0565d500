"""One direct-wire connection on an event loop, and how the asyncio SDK finds the broker.

The link is an :class:`asyncio.Protocol`: bytes are cut into frames as they arrive
(:class:`~spark_mq.wire.FrameReader`) and handed, in order, to its owner's ``on_frame`` within
the same callback. No caller ever reads the socket: a caller that sends something waits for a
future the owner resolves from the answer's frame, by its sequence number or request id. A
caller cancelled while waiting leaves that future cancelled and nothing else: the answer, when
it comes, finds it done and is dropped, and the next caller's answer is still its own (the
pattern of redis-py's CVE-2023-28858, where a cancelled command's reply reached the next one,
cannot happen). Frames are written whole with one ``writelines`` (a synchronous call that no
cancellation cuts in half).

Finding the broker takes a Flight ``ping`` (the wire's port and local socket), which is a
blocking call: it runs in a worker thread, as every Flight call of this SDK does.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import socket
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

from spark_mq import protocol, wire
from spark_mq.client import _liveness as liveness
from spark_mq.client._routes import PLACING_RETRY_S
from spark_mq.client._transport import Connection, broker_urls, call_action, connect
from spark_mq.client._wire import Address, discover, heartbeat_ms
from spark_mq.errors import BrokerUnavailable, SparkMQError
from spark_mq.security.credentials import Auth

FrameHandler = Callable[[int, wire.Body], None]
_TICK_S = 0.25  # how often a watched link notes that its loop runs


class Broker:
    """Where a client's broker is: its Flight connection (for the address, credentials and
    TLS) and the direct wire's address. Found again after a failover (:meth:`find`).

    ``keep_flight=False`` (a consumer's): the Flight client is closed once the wire's address
    is found, and made again for the rare call that needs it (a partitioned destination's
    count): a gRPC client holds a thread and two descriptors, which a consumer that only
    reads its direct wire has no use for (an application or a cluster member with hundreds of
    consumers would hold hundreds of idle threads)."""

    def __init__(
        self, url: str | Sequence[str], timeout_s: float, auth: Auth, *, keep_flight: bool = True
    ) -> None:
        self.urls = broker_urls(url)
        self.timeout_s = timeout_s
        self.auth = auth
        self.keep_flight = keep_flight
        self.conn: Connection | None = None  # (its client closed unless keep_flight)
        self.address: Address | None = None
        self.generation = 0  # how many times it was found (a failover finds it again)
        # a cluster member's (its ping says so, or it answered NotOwner): every member heard
        # of is a place to start again from when the one used goes away
        self.clustered = False
        self.known: dict[str, None] = dict.fromkeys(self.urls)
        self._target: list[str] | None = None  # where the next find goes (a member named)
        self._finding: asyncio.Lock | None = None

    @property
    def may_fail_over(self) -> bool:
        """Whether a lost broker is looked for again (a primary and its backup given, or a
        cluster's members)."""
        return len(self.urls) > 1 or self.clustered

    async def go(self, endpoint: object) -> None:
        """A cluster member answered ``NotOwner`` naming ``endpoint``: the next :meth:`find`
        connects there (one round trip: the refusal said where). Naming none (the
        destination is being placed just now), the caller asks again where it asked, after
        a moment."""
        self.clustered = True
        if not isinstance(endpoint, str) or not endpoint:
            await asyncio.sleep(PLACING_RETRY_S)
            return
        if self._finding is None:
            self._finding = asyncio.Lock()
        async with self._finding:
            self.known.setdefault(endpoint, None)
            old, self.conn, self.address = self.conn, None, None
            self._target = [endpoint]
            if old is not None and self.keep_flight:
                with contextlib.suppress(Exception):
                    await asyncio.to_thread(old.client.close)

    async def find(self, seen: int | None = None) -> Address:
        """The wire's address, found (again, if ``seen`` is the generation a caller saw fail);
        callers that lost the same connection wait for one search, not one each."""
        if self._finding is None:
            self._finding = asyncio.Lock()
        async with self._finding:
            if self.address is not None and (seen is None or seen != self.generation):
                return self.address
            old, self.conn, self.address = self.conn, None, None
            if old is not None and self.keep_flight:
                with contextlib.suppress(Exception):
                    await asyncio.to_thread(old.client.close)
            # a member named (once), else, in a cluster that lost the member used, any member
            # heard of (its destinations are served again elsewhere), else the URLs given
            urls, self._target = self._target, None
            if urls is None:
                urls = list(self.known) if self.clustered and seen is not None else self.urls
            conn, address, answer = await asyncio.to_thread(self._find, urls)
            self.clustered = self.clustered or bool(answer.get("cluster"))
            self.conn, self.address = conn, address
            self.generation += 1
            return address

    def _find(self, urls: list[str]) -> tuple[Connection, Address, dict[str, Any]]:
        conn = connect(urls, self.timeout_s, self.auth)
        try:
            address, answer = discover(conn.client, conn.options, conn.url, "wire")
        except BaseException:
            conn.client.close()
            raise
        assert address is not None  # ("wire" insists: it raises instead)
        if address.version < 3:
            conn.client.close()
            raise BrokerUnavailable(
                f"the broker at {conn.url} speaks wire version {address.version}; the asyncio "
                "SDK needs 3 or later (upgrade the broker, or use the synchronous SDK)"
            )
        if not self.keep_flight:
            conn.client.close()  # (its credentials, TLS and URL are what the wire needs)
        return conn, address, answer

    def _partitions(self, conn: Connection, name: str) -> Any:
        """(In a worker thread.) The ``partitions`` action at the broker found: on its Flight
        client, or on one made for the call (``keep_flight=False``)."""
        if self.keep_flight:
            return call_action(conn.client, conn.options, "partitions", name=name)
        once = connect(conn.url, self.timeout_s, self.auth)  # (one URL: no round trip yet)
        try:
            return call_action(once.client, once.options, "partitions", name=name)
        finally:
            once.client.close()

    async def partitions(self, name: str) -> int:
        """How many partitions destination ``name`` has (1: none). A broker that cannot say
        (one before partitions, or a refusal the send will report) is taken to say one."""
        await self.find()
        conn = self.conn
        assert conn is not None
        try:
            answer = await asyncio.to_thread(self._partitions, conn, name)
        except BrokerUnavailable:
            raise
        except SparkMQError:
            return 1
        return int(answer.get("partitions", 1)) if isinstance(answer, dict) else 1

    def close(self) -> None:
        if self.conn is not None:
            if self.keep_flight:  # (else closed once found)
                self.conn.client.close()
            self.conn = None


class Link(asyncio.Protocol):
    """A direct-wire connection on the loop (see the module's docstring)."""

    def __init__(self, on_frame: FrameHandler, on_lost: Callable[[SparkMQError], None]) -> None:
        self._on_frame = on_frame
        self._on_lost = on_lost
        self._reader = wire.FrameReader()
        self._transport: asyncio.Transport | None = None
        self._loop = asyncio.get_running_loop()
        self._writable: asyncio.Future[None] | None = None  # set while writing is paused
        self.received = 0  # reads that brought something (the liveness watchdog looks)
        self.waiting = 0  # answers or deliveries someone waits for (the watchdog asks)
        self.cut_reason: str | None = None
        self.lost: SparkMQError | None = None
        # when the loop last ran this link's tick: a loop held up by its own code reads nothing
        # meanwhile, and that silence is not the broker's (the watchdog asks, expecting())
        self._loop_seen = time.monotonic()
        self._ticking: asyncio.TimerHandle | None = None
        self.runs = False  # the broker reads settle entries as runs (wire version 5)

    # -- asyncio.Protocol ------------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self._transport = transport

    def data_received(self, data: bytes) -> None:
        self.received += 1
        try:
            frames = self._reader.feed(data)
            for item in frames:
                assert not isinstance(item, wire.TooLarge)  # (this reader has no limit)
                self._on_frame(*item)
        except SparkMQError as exc:  # the broker sent something unreadable: this link is done
            self.fail(exc)

    def connection_lost(self, exc: Exception | None) -> None:
        why = self.cut_reason or (
            f"the connection to the broker broke: {exc}" if exc else "the broker closed the link"
        )
        self._lose(BrokerUnavailable(why))
        if self._writable is not None and not self._writable.done():
            self._writable.set_result(None)

    def pause_writing(self) -> None:
        if self._writable is None or self._writable.done():
            self._writable = self._loop.create_future()

    def resume_writing(self) -> None:
        if self._writable is not None and not self._writable.done():
            self._writable.set_result(None)

    # -- what the owner does -----------------------------------------------------------------------
    def write(self, parts: list[Any]) -> None:
        """Write one frame (or several) whole, now; ``BrokerUnavailable`` once the link is lost."""
        if self.lost is not None:
            raise self.lost
        assert self._transport is not None
        self._transport.writelines(parts)

    def send(self, frame: protocol.Frame) -> None:
        self.write([wire.control(frame, runs=self.runs)])

    async def drain(self) -> None:
        """Wait while the socket's buffer is over its high-water mark (the loop's flow
        control): a fast producer waits here rather than piling bytes up in memory."""
        if self._writable is not None and not self._writable.done():
            await asyncio.shield(self._writable)  # (a cancelled caller leaves it for others)

    def _lose(self, err: SparkMQError) -> None:
        if self.lost is None:
            self.lost = err
            liveness.forget(self)
            self._stop_ticking()
            self._on_lost(err)

    def fail(self, err: SparkMQError) -> None:
        """End the link for ``err`` (the broker refused something, or sent nonsense): what
        waits on it fails with ``err``."""
        self._lose(err)
        self.abort()

    def abort(self) -> None:
        if self._transport is not None:
            self._transport.abort()

    def close(self) -> None:
        liveness.forget(self)
        self._stop_ticking()
        if self._transport is not None:
            self._transport.close()

    # -- what the liveness watchdog asks (spark_mq.client._liveness; from its thread) --------------
    def watch(self, heartbeat_s: float) -> None:
        """Be watched for a silent broker, which was asked for a heartbeat every
        ``heartbeat_s``; the loop's own stalls are told apart (:meth:`expecting`)."""
        self._tick()
        liveness.watch(self, heartbeat_s)

    def _tick(self) -> None:
        self._loop_seen = time.monotonic()
        self._ticking = self._loop.call_later(_TICK_S, self._tick)

    def _stop_ticking(self) -> None:
        if self._ticking is not None:
            self._ticking.cancel()
            self._ticking = None

    def expecting(self) -> bool:
        # (a loop that has not run its tick for a while is held up by its caller's code: what
        # the broker sent waits unread in the socket, so no silence counts against it)
        return self.waiting > 0 and time.monotonic() - self._loop_seen < 2 * _TICK_S

    def cut(self, reason: str) -> None:
        self.cut_reason = reason
        with contextlib.suppress(RuntimeError):  # (the loop is closed: nothing to cut)
            self._loop.call_soon_threadsafe(self.abort)


async def open_link(
    broker: Broker,
    first: protocol.Produce | protocol.Consume,
    on_frame: FrameHandler,
    on_lost: Callable[[SparkMQError], None],
    heartbeat_s: float,
) -> Link:
    """A link to the broker's direct wire (its local socket when this process can reach it, else
    TCP, with TLS when the URL says ``grpc+tls``), logged in, its first frame sent (heartbeats
    asked for in it)."""
    address = await broker.find()
    conn = broker.conn
    assert conn is not None
    loop = asyncio.get_running_loop()

    def factory() -> Link:
        return Link(on_frame, on_lost)

    link: Link | None = None
    try:
        async with asyncio.timeout(broker.timeout_s):
            sock = _local_socket(address, conn)
            if sock is not None:
                _, link = await loop.create_connection(factory, sock=sock)
            else:
                tls = conn.wire_tls()
                _, link = await loop.create_connection(
                    factory,
                    address.host,
                    address.port,
                    ssl=tls,
                    server_hostname=conn.host if tls is not None else None,
                )
    except (OSError, TimeoutError) as exc:
        raise BrokerUnavailable(
            f"cannot reach the broker's direct wire at {address.host}:{address.port}: "
            f"{exc or 'no answer in time'}"
        ) from exc
    beat = heartbeat_ms(address.version, heartbeat_s)
    link.runs = address.version >= 5
    login = conn.auth.login_frame()
    frames = [wire.control(login)] if login is not None else []
    frames.append(wire.control(dataclasses.replace(first, heartbeat_ms=beat)))
    link.write(frames)
    if beat:
        link.watch(beat / 1000)
    return link


def _local_socket(address: Address, conn: Connection) -> socket.socket | None:
    """The broker's local socket, connected, when this process can reach it (and presents no
    client certificate, an identity only TLS carries); else None (TCP it is). A local connect
    does not block for long: it is made here, on the loop."""
    if address.local is None or not sys.platform.startswith("linux"):
        return None
    if conn.tls and conn.auth.tls_cert_file:
        return None
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.setblocking(False)
    try:
        sock.connect("\0" + address.local)
    except (BlockingIOError, InterruptedError, OSError):  # another machine's broker, or busy
        sock.close()
        return None
    wire.widen_local_send_buffer(sock)
    return sock
