"""The consumer: receives leased messages from a queue or a topic subscription.

The broker delivers up to ``prefetch`` unsettled messages ahead; each is invisible to other
consumers until it is acked, nacked, or its lease (the mark interval) lapses — then it is
delivered again with ``redelivered=True`` and a higher ``delivery_count``.

What a consumer reads: a queue; on a topic, a durable subscription (``subscription="name"``,
created with ``Admin.create_subscription``) or, with ``durable=False``, a non-durable one that
lives while consumers use it (private without a name, shared by all giving the same name).
``selector`` (SQL-92, over headers and JMS fields) filters what this consumer receives.
``temporary=True`` makes a new queue only this consumer reads (``consumer.destination`` is its
name: give it to others as a reply-to); it lives in memory only and goes when the consumer does.

Consumption is synchronous (``receive``, ``receive_many``, iteration) or, with ``on_message``, a
callback (the JMS message listener): the consumer's reader thread calls it with each message as
it arrives, one at a time, in delivery order, with no hand-off to another thread. Over the
direct wire, a ``receive`` that finds nothing delivered reads the connection itself
(:mod:`~spark_mq.client._turn`), so its message comes without a hand-off too (at 1,000 msg/s,
0.04-0.06 ms less produce-to-consume p50 than through the reader thread, interleaved runs); over
Flight, the reader thread queues messages for it. The callback settles messages as ``receive``'s
caller would; one that raises has its message nacked (delivered again, or dead-lettered after
``max_delivery_attempts``). It may call ``close``; its first call may come before the
constructor has returned. With ``concurrency=N`` (more than 1) the callback runs in a pool of N
handler threads (:mod:`~spark_mq.client._pool`, seed 001's activation specification): messages
of one group one at a time and in order, a handler's message's lease extended while it runs,
and with ``start_timeout_s`` a message that found no free handler in time given back for
another consumer to take. ``receive`` is then not available; ``wait`` blocks until the stream
ends, and raises why if it broke.

The ack vocabulary, each verb by its redelivery effect:

* ``ack``: never delivered again (the future resolves once that is durable);
* ``nack``: delivered again (after the destination's redelivery delay), to any consumer, or
  dead-lettered once it was delivered ``max_delivery_attempts`` times;
* ``extend_lease``: not delivered elsewhere for another mark interval.

Acks, nacks and extends issued within ``settle_linger_ms`` travel in one frame.
Not guaranteed: a message whose ack future failed may be delivered again.
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import logging
import queue
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import Future
from typing import Literal, cast

import pyarrow as pa
import pyarrow.flight as fl

from spark_mq import protocol, wire
from spark_mq.client import _liveness as liveness
from spark_mq.client._liveness import DEFAULT_HEARTBEAT_S
from spark_mq.client._outcome import coming_again, refusals, settle_refusal
from spark_mq.client._partition_watch import DEFAULT_RECHECK_S, PartitionWatch
from spark_mq.client._partitioned import Batches, PartitionConsumers
from spark_mq.client._pool import HandlerPool
from spark_mq.client._routes import PLACING_RETRY_S
from spark_mq.client._transport import (
    DEFAULT_URL,
    Connection,
    broker_urls,
    call_action,
    connect,
    translate_flight_error,
    translated,
)
from spark_mq.client._turn import ReadTurn
from spark_mq.client._wire import (
    Transport,
    WireConsumeLink,
    broker_version,
    discover,
    heartbeat_ms,
)
from spark_mq.client.message import Message, MessageBatch, message_of_one, messages_of
from spark_mq.errors import BrokerUnavailable, NotOwner, Partitioned, ProtocolError, SparkMQError
from spark_mq.names import validate_name, validate_stored_name
from spark_mq.security.credentials import Auth

log = logging.getLogger(__name__)

Verb = Literal["ack", "nack", "extend", "release"]
Entries = Sequence[tuple[int, int]]  # (offset, delivery count) pairs: a list, or SettlePairs
_CLOSED = object()
# what _ready holds, in delivery order: a delivery's record batch (made messages when received),
# or messages (ONE frames', or the rest of a delivery a receive_many took part of)
_Chunk = pa.RecordBatch | deque[Message]


class Consumer:
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
        settle_linger_ms: float = 1.0,
        settle_batch: int = 256,
        timeout_s: float = 30.0,
        transport: Transport = "auto",
        on_message: Callable[[Message], object] | None = None,
        concurrency: int = 1,
        start_timeout_s: float | None = None,
        username: str | None = None,
        password: str | None = None,
        token: str | None = None,
        tls_ca_file: str | None = None,
        tls_cert_file: str | None = None,
        tls_key_file: str | None = None,
        heartbeat_s: float = DEFAULT_HEARTBEAT_S,
        partitions_recheck_s: float = DEFAULT_RECHECK_S,
        reattach: bool = True,
        on_end: Callable[[SparkMQError], object] | None = None,
    ) -> None:
        # reattach: its destination moved to another cluster member, or its broker went:
        # attach again, where it is served now (False: the consumer ends, its ``error`` saying
        # why: a NotOwner naming where, or BrokerUnavailable; for a caller that follows
        # itself, as a member forwarding its clients' consumers does)
        self._reattach_ok = reattach
        # on_end: an on_message consumer's reader stopped for good, other than by close():
        # called with why, once, on its thread
        self._on_end = on_end
        # heartbeat_s: the broker is asked to send something at least this often; silent for
        # four times that, it is taken for dead (paused, hung, cut off) and the consumer
        # attaches again, to the pair's other broker when given one (0: never)
        self._heartbeat_s = heartbeat_s
        # partitions_recheck_s: a partitioned destination's consumer asks this often whether
        # partitions were added, and consumes the new ones too (0: never)
        self._watch = PartitionWatch(partitions_recheck_s, self._count_of, self._grown, "consumer")
        # temporary: a new queue only this consumer reads, gone when it closes (for replies);
        # its name is self.destination once connected
        self.destination = destination if temporary else validate_stored_name(destination)
        if subscription is not None:
            validate_name(subscription, "subscription")
        self.subscription = subscription
        self.durable = durable
        auth = Auth.of(username, password, token, tls_ca_file, tls_cert_file, tls_key_file)
        self._conn = connect(url, timeout_s, auth)
        self._client, self._options = self._conn.client, self._conn.options
        command = protocol.Consume(
            destination, subscription, prefetch, selector, durable, temporary
        )
        # whole delivery batches travel through the queue (a delivery's record batch, or ONE
        # frames' messages); receive() takes from _ready, the batches taken from it in order
        self._messages: queue.Queue[object] = queue.Queue()
        self._ready: deque[_Chunk] = deque()
        self._receive_lock = threading.Lock()  # receivers in several threads take turns
        self._write_lock = threading.Lock()
        self._settle_cond = threading.Condition()
        # (verb, offsets, (offset, delivery count) pairs, future)
        self._settles: list[tuple[Verb, Sequence[int], Entries, Future]] = []
        self._queued = 0  # settle entries in _settles
        self._linger = settle_linger_ms / 1000
        self._timeout_s = timeout_s
        self._settle_batch = settle_batch
        self._requests: dict[int, list[tuple[Sequence[int], Future]]] = {}
        self._request_ids = itertools.count(1)
        self._closed = False
        if (concurrency != 1 or start_timeout_s is not None) and on_message is None:
            raise ValueError("concurrency and start_timeout_s are for an on_message consumer")
        if concurrency < 1:  # (said before connecting: nothing to let go of)
            raise ValueError(f"concurrency must be 1 or more, got {concurrency}")
        self._on_message = on_message
        self._pool: HandlerPool | None = None
        self._close_when_read = False  # close() was called by on_message, on the reader thread
        self.error: SparkMQError | None = None
        self._welcome = threading.Event()
        self.lease_s: float | None = None
        self.consumer_id: int | None = None
        self._link: _FlightLink | WireConsumeLink | None = None
        self._turn: ReadTurn | None = None  # receivers read the wire link themselves
        self._urls, self._command, self._transport = broker_urls(url), command, transport
        # a cluster: every member endpoint heard of (to start again from when the owner went
        # away), and whether the broker is a member (NotOwner answers, or its ping says so)
        self._known = dict.fromkeys(self._urls)
        self._clustered = False
        # a partitioned destination's: a consumer of each partition, this one their front
        self._partitions: PartitionConsumers | None = None
        self._broker_version = 1
        try:
            self._attach_following(time.monotonic() + timeout_s)
        except Partitioned as exc:
            self._closed = True  # (this one's own stream: never opened)
            self._partitions = PartitionConsumers(
                lambda part, handler: Consumer(
                    url,
                    part,
                    subscription=subscription,
                    selector=selector,
                    durable=durable,
                    prefetch=prefetch,
                    settle_linger_ms=settle_linger_ms,
                    settle_batch=settle_batch,
                    timeout_s=timeout_s,
                    transport=transport,
                    on_message=handler,
                    concurrency=concurrency,
                    start_timeout_s=start_timeout_s,
                    heartbeat_s=heartbeat_s,
                    reattach=reattach,
                    username=username,
                    password=password,
                    token=token,
                    tls_ca_file=tls_ca_file,
                    tls_cert_file=tls_cert_file,
                    tls_key_file=tls_key_file,
                ),
                self.destination,
                int(exc.fields.get("partitions", 1)),
                on_message,
            )
            first = self._partitions.parts[0]
            self.lease_s, self._broker_version = first.lease_s, first._broker_version
            self._watch.watch(self.destination, len(self._partitions.parts))
            return
        if on_message is not None and (concurrency > 1 or start_timeout_s is not None):
            self._pool = HandlerPool(
                on_message,
                self.nack,
                self._give_back,
                self.extend_lease,
                concurrency,
                start_timeout_s,
                self.lease_s or 30.0,
                f"consumer-{self.consumer_id}",
            )
        self._reader_thread = self._new_reader()
        self._reader_thread.start()
        self._settler = threading.Thread(
            target=self._settle_loop, name="consumer-settle", daemon=True
        )
        self._settler.start()

    def _count_of(self, name: str) -> int:
        """How many partitions ``name`` has now (what the partition watch asks): asked through
        partition 0's consumer (its connection goes where partition 0 is served)."""
        assert self._partitions is not None
        first = self._partitions.parts[0]
        answer = call_action(first._client, first._options, "partitions", name=name)
        return int(answer.get("partitions", 1)) if isinstance(answer, dict) else 1

    def _grown(self, _name: str, partitions: int) -> None:
        assert self._partitions is not None
        self._partitions.grow(partitions)

    def _attach(self) -> None:
        """Open the stream on the connection (the wire if the broker offers it) and read the
        welcome; the reader thread is made, not started."""
        command, timeout_s = self._command, self._timeout_s
        try:
            address, answer = discover(self._client, self._options, self._conn.url, self._transport)
            self._clustered = self._clustered or bool(answer.get("cluster"))
            self._broker_version = address.version if address is not None else 1
            if address is not None:  # plain messages may come as ONE frames, one each
                beat = heartbeat_ms(address.version, self._heartbeat_s)
                compact = dataclasses.replace(command, compact=True, heartbeat_ms=beat)
                self._link = WireConsumeLink(address, timeout_s, compact, self._conn)
                if self._on_message is None:
                    self._turn = ReadTurn(self._link, lambda: bool(self._requests))
            else:
                if self._heartbeat_s > 0:
                    version = broker_version(self._client, self._options)
                    self._broker_version = version
                    beat = heartbeat_ms(version, self._heartbeat_s)
                    command = dataclasses.replace(command, heartbeat_ms=beat)
                self._link = _FlightLink(self._conn, command)
            first = self._link.read()  # the Welcome, or the broker's refusal
            if not isinstance(first, bytes):
                raise ProtocolError("the broker did not start with a welcome", fault="remote")
            self._handle_metadata(first)
        except BaseException:
            self._abandon()
            raise

    def _new_reader(self) -> threading.Thread:
        return threading.Thread(target=self._read, name="consumer-read", daemon=True)

    def _attach_following(self, deadline: float) -> None:
        """Attach; refused by a cluster member that does not own the destination, attach
        where the refusal says (one round trip), or, while it is being placed, again a moment
        later, until ``deadline``."""
        while True:
            try:
                self._attach()
                return
            except NotOwner as exc:
                self._clustered = True
                if self._closed or time.monotonic() >= deadline or not self._reattach_ok:
                    raise
                self._go_where(exc, deadline)

    def _go_where(self, err: NotOwner, deadline: float) -> None:
        """Connect to the owner ``err`` names (none named: stay, and ask again shortly; a
        failed attach closed its client, so staying connects to the same member again)."""
        endpoint = err.fields.get("endpoint")
        if not isinstance(endpoint, str) or not endpoint or endpoint == self._conn.url:
            time.sleep(PLACING_RETRY_S)
            endpoint = self._conn.url
        self._known.setdefault(endpoint, None)
        old = self._conn
        self._conn = connect(endpoint, max(deadline - time.monotonic(), 0.1), old.auth)
        self._client, self._options = self._conn.client, self._conn.options
        self._turn = None
        with contextlib.suppress(Exception):
            old.client.close()

    def _may_fail_over(self) -> bool:
        return (
            self._reattach_ok
            and (len(self._urls) > 1 or self._clustered or isinstance(self.error, NotOwner))
            and not self._closed
            and not self._command.temporary  # a temporary queue goes with its broker
            and isinstance(self.error, BrokerUnavailable)
        )

    def _reattach(self, deadline: float) -> None:
        """The broker went away (a failover): attach again to whichever of the URLs serves now.
        What was delivered and not acked comes again from there as redeliveries; settles of the
        old deliveries are refused (their leases were the old broker's)."""
        self._reader_thread.join(1.0)
        self._relink(deadline)
        self._messages = queue.Queue()
        self._ready.clear()
        self._reader_thread = self._new_reader()
        self._reader_thread.start()

    def _relink(self, deadline: float) -> None:
        """Let go of the broken stream and attach to whichever of the URLs serves now."""
        log.info("consumer: %s; attaching again where the data is served now", self.error)
        err = self.error or BrokerUnavailable("the broker went away")
        for items in self._requests.values():  # settles the old broker took with it
            for _, f in items:
                if not f.done():
                    f.set_exception(err)
        self._requests.clear()
        if self._pool is not None:
            self._pool.drop_waiting()  # (their leases were the old broker's)
        self._release_link()
        while True:
            if self._closed:
                raise BrokerUnavailable("the consumer was closed while attaching again")
            try:
                left = max(deadline - time.monotonic(), 0.1)
                if isinstance(self.error, NotOwner):  # (its destination moved: go there)
                    self._clustered = True
                    self._go_where(self.error, deadline)
                else:  # a cluster: any member it knows of (its owner may be the one gone)
                    urls = list(self._known) if self._clustered else self._urls
                    self._conn = connect(urls, left, self._conn.auth)
                    self._client, self._options = self._conn.client, self._conn.options
                    self._turn = None
                self.error = None
                self._attach()
                return
            except BrokerUnavailable as exc:
                self.error = exc
                if time.monotonic() >= deadline:
                    raise
                time.sleep(0.2)

    @property
    def partitions(self) -> list[Consumer] | None:
        """A partitioned destination's consumer: the consumer of each of its partitions
        (``on_message`` is called on each one's reader thread); None for any other."""
        return None if self._partitions is None else list(self._partitions.parts)

    @property
    def serving(self) -> bool:
        """Whether its stream is open, or being attached again (False once it ended)."""
        if self._partitions is not None:
            return all(p.serving for p in self._partitions.parts)
        return self._reader_thread.is_alive()

    def __enter__(self) -> Consumer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- receiving ---------------------------------------------------------------------------
    def receive(self, timeout: float | None = None) -> Message | None:
        """The next message, or ``None`` after ``timeout`` seconds (block forever if None)."""
        got = self.receive_many(1, timeout)
        return got[0] if got else None

    def receive_many(self, max_messages: int, timeout: float | None = None) -> list[Message]:
        """Up to ``max_messages``: waits ``timeout`` for the first, then takes what is there."""
        if self._partitions is not None:
            return self._partitions.receive_many(max_messages, timeout)
        with self._receive_lock:
            if not self._wait_ready(timeout):
                return []
            ready, got = self._ready, cast("list[Message]", [])
            while True:
                chunk = ready[0]
                if isinstance(chunk, pa.RecordBatch):  # (made messages, taken one by one)
                    chunk = ready[0] = deque(messages_of(self.destination, chunk, self))
                want = max_messages - len(got)
                if len(chunk) > want:
                    got.extend([chunk.popleft() for _ in range(want)])
                    return got
                got.extend(chunk)
                ready.popleft()
                if len(got) == max_messages or not (ready or self._fill(None, block=False)):
                    return got

    def receive_batch(self, max_messages: int, timeout: float | None = None) -> MessageBatch | None:
        """Up to ``max_messages`` as one :class:`MessageBatch` (an Arrow record batch), or None
        after ``timeout`` seconds: waits for the first, then takes what is there. The way to
        read many messages with little CPU a message: no Python object is made for a message
        unless it is asked for, and ``batch.ack()`` settles them all at once. A partitioned
        destination's batches each hold one partition's messages."""
        if self._partitions is not None:
            return self._partitions.receive_batch(max_messages, timeout)
        with self._receive_lock:
            if not self._wait_ready(timeout):
                return None
            ready = self._ready
            if type(ready[0]) is not pa.RecordBatch:  # ONE frames' messages, or left over
                messages: list[Message] = []
                while ready and type(ready[0]) is deque and len(messages) < max_messages:
                    chunk = ready[0]
                    want = max_messages - len(messages)
                    if len(chunk) > want:
                        messages.extend([chunk.popleft() for _ in range(want)])
                        break
                    messages.extend(chunk)
                    ready.popleft()
                    if not ready:
                        self._fill(None, block=False)
                return MessageBatch(self.destination, None, self, messages)
            batches: list[pa.RecordBatch] = []
            rows = 0
            while ready and type(ready[0]) is pa.RecordBatch and rows < max_messages:
                batch = cast("pa.RecordBatch", ready.popleft())
                want = max_messages - rows
                if batch.num_rows > want:
                    ready.appendleft(batch.slice(want))
                    batch = batch.slice(0, want)
                batches.append(batch)
                rows += batch.num_rows
                if not ready:
                    self._fill(None, block=False)
            arrow = batches[0] if len(batches) == 1 else pa.concat_batches(batches)  # type: ignore[attr-defined]
            return MessageBatch(self.destination, arrow, self)

    def _wait_ready(self, timeout: float | None) -> bool:
        """Whether something is ready to receive, waiting ``timeout`` for it (the receive
        lock held); False after attaching again or at the end (raising why if it broke)."""
        if self._on_message is not None:
            raise RuntimeError(
                "this consumer hands its messages to its on_message callback; receive() is for "
                "consumers made without one"
            )
        if self._ready or self._fill(timeout):
            return True
        if self._may_fail_over():
            self._reattach(time.monotonic() + self._timeout_s)
            return False  # (the caller asks again: deliveries come from the new broker)
        if self.error is not None and not self._closed:
            raise self.error
        return False

    def _fill(self, timeout: float | None, *, block: bool = True) -> bool:
        """Move one delivered batch into ``_ready``; False when none came (or the stream ended)."""
        if not self._messages.queue:  # (a peek, without the queue's lock)
            if not block:
                return False
            if self._turn is not None:
                started = time.monotonic()
                got = self._read_link(timeout)
                if got is not None:
                    return got
                if timeout is not None:  # what is left of it, for the queue
                    timeout = max(timeout - (time.monotonic() - started), 0.0)
        try:
            item = self._messages.get(block, timeout)
        except queue.Empty:
            return False
        if item is _CLOSED:
            self._messages.put(_CLOSED)
            return False
        self._ready.append(item)  # type: ignore[arg-type]
        return True

    def _read_link(self, timeout: float | None) -> bool | None:
        """Read the link on the receiver's thread (see :mod:`~spark_mq.client._turn`) until a
        delivery comes (True) or ``timeout`` passes (False); None: take from the queue, which
        the reader thread filled before it let go of the turn, or will end (the stream ended or
        broke)."""
        assert self._turn is not None and isinstance(self._link, WireConsumeLink)
        deadline = None if timeout is None else time.monotonic() + timeout
        if not self._turn.take(timeout):
            return False
        try:
            if self._turn.broken:  # the reader thread's read broke it, and it is ending
                return None
            while not self._messages.queue:  # (a peek: the reader thread cannot add to it now)
                left = None if deadline is None else max(deadline - time.monotonic(), 0.0)
                try:
                    messages = self._messages_in(self._link.read(left))
                except TimeoutError:
                    if deadline is None or time.monotonic() >= deadline:
                        return False
                    continue  # the socket's timeout was a little short of what was left
                except (OSError, SparkMQError) as exc:
                    self._turn.fail(exc)  # the reader thread ends the stream with it
                    return None
                if messages is None:
                    self._turn.summon()  # the reader thread reads the end and reports it
                    return None
                if messages:
                    self._ready.append(messages)
                    # and the frames already read in (ONE frames bring a message each): one
                    # turn for them all, not a turn each. Iterating with an ack each over a
                    # backlog of 20,000 synchronous sends (ONE frames), two interleaved runs of
                    # three: 67-76k msg/s at 10.3-12.2 us of CPU a message before, 71-87k at
                    # 8.9-9.8 after
                    try:
                        while self._link.buffered:
                            more = self._messages_in(self._link.read(0))
                            if more:
                                self._ready.append(more)
                    except (OSError, SparkMQError) as exc:  # (the end came behind them)
                        self._turn.fail(exc)
                    return True
            return None
        finally:
            self._turn.give()

    def __iter__(self) -> Iterator[Message]:
        while (msg := self.receive()) is not None:
            yield msg

    def wait(self, timeout: float | None = None) -> bool:
        """Block until the stream ends: False if ``timeout`` seconds passed first, True once it
        was closed; if it broke (the broker went away), raise why. What an ``on_message``
        consumer's owner calls to serve until then."""
        if self._partitions is not None:
            return self._partitions.wait(timeout)
        if threading.current_thread() is self._reader_thread:
            raise RuntimeError("wait() from on_message would wait for itself: call close()")
        if self._turn is not None:
            self._turn.summon()  # it reads on, to see the end
        self._reader_thread.join(timeout)
        if self._reader_thread.is_alive():
            return False
        if self.error is not None:
            raise self.error
        return True

    # -- settling ----------------------------------------------------------------------------
    def ack(self, messages: Message | Iterable[Message]) -> Future:
        return self._settle("ack", messages)

    def nack(self, messages: Message | Iterable[Message]) -> Future:
        return self._settle("nack", messages)

    def extend_lease(self, messages: Message | Iterable[Message]) -> Future:
        return self._settle("extend", messages)

    def _give_back(self, messages: Iterable[Message]) -> Future:
        """Nack, for another consumer to take when there is one (brokers before wire version 4
        know only the nack)."""
        return self._settle("release" if self._broker_version >= 4 else "nack", messages)

    def _settle(self, verb: Verb, messages: Message | Iterable[Message]) -> Future:
        if self._partitions is not None:
            return self._partitions.settle(verb, messages)
        fut: Future = Future()
        if self._closed or self.error is not None:
            fut.set_exception(self.error or BrokerUnavailable("the consumer is closed"))
            return fut
        if type(messages) is MessageBatch:
            offsets, entries = messages._entries()
        else:
            msgs = [messages] if isinstance(messages, Message) else list(messages)
            offsets = [m.offset for m in msgs]
            entries = list(zip(offsets, [m.delivery_count for m in msgs], strict=True))
        with self._settle_cond:
            self._settles.append((verb, offsets, entries, fut))
            self._queued += len(entries)
            if self._queued >= self._settle_batch or len(self._settles) == 1:
                self._settle_cond.notify()
        return fut

    def _settle_loop(self) -> None:
        while True:
            with self._settle_cond:
                while not self._settles and not self._closed:
                    self._settle_cond.wait()
                if not self._settles and self._closed:
                    return
                if self._linger and not self._closed:
                    self._settle_cond.wait(self._linger)
                work, self._settles = self._settles, []
                self._queued = 0
            self._send_settles(work)

    def _send_settles(self, work: list[tuple[Verb, Sequence[int], Entries, Future]]) -> None:
        by_verb: dict[Verb, list[tuple[Sequence[int], Entries, Future]]] = {}
        for verb, offsets, entries, fut in work:
            by_verb.setdefault(verb, []).append((offsets, entries, fut))
        for verb, items in by_verb.items():
            request_id = next(self._request_ids)
            self._requests[request_id] = [(os, f) for os, _, f in items]
            pairs = protocol.joined_entries([es for _, es, _ in items])
            frame = protocol.Settle(verb, request_id, pairs)
            try:
                with self._write_lock:
                    self._link.send(frame)  # type: ignore[union-attr]
            except SparkMQError as err:
                for _, f in self._requests.pop(request_id, []):
                    f.set_exception(err)
            if self._turn is not None:
                self._turn.poke()  # someone reads the reply

    # -- the stream --------------------------------------------------------------------------
    def _handle_metadata(self, data: bytes) -> None:
        frame = protocol.parse(data)
        match frame:
            case protocol.Welcome(consumer_id=cid, lease_s=lease, destination=name):
                self.consumer_id, self.lease_s = cid, lease
                self.destination = name or self.destination
                self._welcome.set()
            case protocol.Reply(request_id=rid) as reply:
                refused, again = refusals(reply), coming_again(reply)
                for offsets, fut in self._requests.pop(rid, []):
                    err = settle_refusal(refused, offsets, self.destination, again)
                    if err is not None:
                        fut.set_exception(err)
                    else:
                        fut.set_result(None)
            case protocol.Heartbeat():
                pass  # the broker is alive (the liveness watchdog counted the read)
            case protocol.Closing(reason=reason):
                # the broker is shutting down: leave as close() does (it answers the settles
                # sent before the bye, then ends the stream), and say why once it has
                self.error = BrokerUnavailable(reason)
                with contextlib.suppress(SparkMQError), self._write_lock:
                    self._link.send(protocol.Bye())  # type: ignore[union-attr]
            case _:
                raise ProtocolError(f"unexpected frame from the broker: {frame}", fault="remote")

    def _messages_in(self, item: pa.RecordBatch | wire.One | bytes | None) -> _Chunk | None:
        """What ``item``, read from the link, delivers (replies are handled here): a delivery's
        record batch as it came (made messages when received, or by :meth:`_dispatch`), a ONE
        frame's message; None at the end of the stream."""
        if item is None:
            return None
        if isinstance(item, bytes):
            self._handle_metadata(item)
            return deque()
        if isinstance(item, wire.One):
            return deque((message_of_one(self.destination, item, self),))
        return item if item.num_rows else deque()

    def _read_next(self) -> bool:
        """Read and hand on the link's next item (the reader thread); False at the end."""
        if self._turn is None:
            messages = self._messages_in(self._link.read())  # type: ignore[union-attr]
        else:
            with self._turn.thread_reading() as readable:
                if not readable:
                    return True  # a receiver reads the link for now
                messages = self._messages_in(self._link.read())  # type: ignore[union-attr]
                if messages:  # queued before the turn goes: messages keep their order
                    self._messages.put(messages)
                return messages is not None
        if messages and self._on_message is None:
            self._messages.put(messages)
        elif messages:
            self._dispatch(messages)
        return messages is not None

    def _read(self) -> None:
        try:
            while True:
                try:
                    while self._read_next():
                        pass
                    if not self._closed and self.error is None:
                        self.error = BrokerUnavailable(
                            getattr(self._link, "cut_reason", None)
                            or "the broker closed the consumer stream"
                        )
                except (fl.FlightError, OSError, SparkMQError) as exc:
                    if not self._closed:
                        self.error = translate_flight_error(exc)
                # an on_message consumer's reader attaches again itself (a receiving one is
                # attached again by its receiver, which reads the link too)
                if self._on_message is None or not self._may_fail_over():
                    break
                try:
                    self._relink(time.monotonic() + self._timeout_s)
                except SparkMQError as exc:
                    self.error = exc
                    break
        finally:
            err = self.error or BrokerUnavailable("the consumer is closed")
            for items in self._requests.values():
                for _, f in items:
                    if not f.done():
                        f.set_exception(err)
            self._requests.clear()
            self._messages.put(_CLOSED)
            if self._close_when_read:
                self._release_link()
            if self._on_end is not None and not self._closed:
                try:
                    self._on_end(err)
                except Exception:  # (the caller's defect: logged, the reader ends anyway)
                    log.exception("consumer: on_end failed")

    def _dispatch(self, chunk: _Chunk) -> None:
        """Hand each message to the callback (on the reader thread); nack those it raises on."""
        assert self._on_message is not None
        if type(self._on_message) is Batches:  # (a merged consumer's partition: whole batches)
            if isinstance(chunk, pa.RecordBatch):
                self._on_message.fn(MessageBatch(self.destination, chunk, self))
            else:
                self._on_message.fn(MessageBatch(self.destination, None, self, list(chunk)))
            return
        messages = (
            messages_of(self.destination, chunk, self)
            if isinstance(chunk, pa.RecordBatch)
            else list(chunk)
        )
        if self._pool is not None:
            self._pool.put(messages)
            return
        for m in messages:
            if self._closed:  # the rest go back to the broker when the consumer detaches
                return
            try:
                self._on_message(m)
            except Exception:
                log.exception(
                    "on_message raised for %s offset %d: it is nacked", self.destination, m.offset
                )
                self.nack(m)

    def _release_link(self) -> None:
        with contextlib.suppress(SparkMQError):
            self._link.close()  # type: ignore[union-attr]
        self._client.close()

    def _abandon(self) -> None:
        if self._link is not None:
            with contextlib.suppress(SparkMQError):
                self._link.close()  # the refusal already raised is the error worth reporting
        self._client.close()

    def close(self) -> None:
        """Send pending settles, then detach; unacked messages go back to the broker."""
        if self._partitions is not None:
            self._watch.close()
            self._partitions.close()
            return
        if self._closed:
            return
        if self._pool is not None:  # running handlers finish (and settle) first
            self._pool.stop(self._timeout_s)
        with self._settle_cond:
            self._closed = True
            self._settle_cond.notify_all()
        self._settler.join()
        # never done_writing() here: if the broker died, the reader thread is finishing the call
        # and Arrow Flight aborts the process when both sides of a stream close it at once.
        # The bye asks the broker to end the stream after answering every settle sent before it.
        assert self._link is not None
        try:
            with self._write_lock:
                self._link.send(protocol.Bye())
        except SparkMQError:
            pass  # the broker is gone already: the reader thread sees the stream fail
        if self._turn is not None:
            self._turn.summon()  # the reader thread reads on to the end of the stream
        if threading.current_thread() is self._reader_thread:  # on_message closes its consumer
            self._close_when_read = True  # the reader thread lets go once the stream ends
            return
        self._reader_thread.join(timeout=self._timeout_s)
        if self._reader_thread.is_alive():  # a broker that neither answers nor fails
            self._link.cancel()  # thread-safe, unlike closing
            self._reader_thread.join(timeout=self._timeout_s)
        if self._reader_thread.is_alive():
            return  # left to the process's end: closing beside a live reader aborted it
        # the reader has finished: no one else touches the stream; its outcome was already
        # reported to every settle future
        self._release_link()


class _FlightLink:
    """A consumer's Flight ``DoExchange`` stream (the transport when there is no direct wire)."""

    def __init__(self, conn: Connection, command: protocol.Consume) -> None:
        descriptor = fl.FlightDescriptor.for_command(protocol.encode(command))
        with translated():
            self._writer, self._reader = conn.client.do_exchange(descriptor, conn.stream_options)
        self.received = 0  # chunks read (the liveness watchdog looks)
        self._blocked = 0  # threads in a read
        self.cut_reason: str | None = None
        if command.heartbeat_ms:
            liveness.watch(self, command.heartbeat_ms / 1000)

    def expecting(self) -> bool:
        return self._blocked > 0  # (see WireConsumeLink.expecting)

    def cut(self, reason: str) -> None:
        self.cut_reason = reason
        self.cancel()

    def read(self) -> pa.RecordBatch | bytes | None:
        """A delivery batch, a control frame's JSON, or None at the end of the stream."""
        while True:
            self._blocked += 1
            try:
                with translated():
                    chunk = self._reader.read_chunk()
                self.received += 1
            except StopIteration:
                return None
            except BrokerUnavailable as exc:
                if self.cut_reason is not None:  # (cancelled by the watchdog: say why)
                    raise BrokerUnavailable(self.cut_reason) from exc
                raise
            finally:
                self._blocked -= 1
            if chunk.data is not None and chunk.data.num_rows:
                return chunk.data
            if chunk.app_metadata is not None:
                return chunk.app_metadata.to_pybytes()

    def send(self, frame: protocol.Frame) -> None:
        with translated():
            self._writer.write_metadata(pa.py_buffer(protocol.encode(frame)))

    def cancel(self) -> None:
        self._reader.cancel()  # thread-safe, unlike closing

    def close(self) -> None:
        liveness.forget(self)
        with translated():
            self._writer.close()
