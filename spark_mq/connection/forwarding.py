"""A cluster member serving clients that cannot follow a destination to its owner (STOMP): what
such a client's session does to a destination another member serves is forwarded there, as
Artemis bridges, through the SDK (which routes each destination to its owner and follows it
when it moves).

* A produce goes out through one asyncio SDK producer of the member's (each destination's
  stream at its owner, in the order the produces came, through moves too); the client's
  future resolves with the owner's answer (durable there), or its error.
* A consumer attached is an asyncio SDK consumer on the owner behind a
  :class:`~spark_mq.session.consumer.ForwardedConsumer` (:class:`RemoteConsumer`): its deliveries
  reach the transport as the broker's own consumer's do, with their offsets and delivery
  counts, and the transport's acks, nacks and lease extensions go back to the owner, each
  answered once the owner made it durable. Leases, redelivery, groups and dead-lettering stay
  the owner's. Every one of them runs on the member's one :class:`ForwardingLoop`: a
  forwarded subscription costs its socket to the owner, no thread.
* A durable subscription is looked up, made and removed at the owner through one SDK ``Admin``
  of the member's (round trips: asked on a thread that may wait, never a listener's loop); so
  are Kafka's admin requests of a partition served elsewhere (deleted, configured, described).

Who may do what is checked here, by the client's session, before anything is forwarded (the
client's login and the access rules are this member's, and its audit says what it did). The
member logs in to the owner with its environment's credentials (``SPARKMQ_USERNAME`` /
``SPARKMQ_PASSWORD``, or ``SPARKMQ_TOKEN``; ``SPARKMQ_TLS_CA_FILE`` with TLS), as an HA
backup does: with security on, a user allowed to produce, consume and create every
destination (and to administer the topics whose STOMP clients remove durable subscriptions).

A transaction is committed by the client's member: acknowledging a forwarded delivery in one
is refused; its sends to destinations served elsewhere are stored through :meth:`Forwarding.produce`
(the broker's ``Transactions.store_elsewhere``) once its commit is recorded.
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import logging
import threading
from collections.abc import Awaitable, Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import pyarrow as pa

from spark_mq import commands as c
from spark_mq.aio.consumer import AsyncConsumer
from spark_mq.aio.consumer import Verb as AioVerb
from spark_mq.aio.producer import AsyncProducer
from spark_mq.client._flight_put import conform_produce
from spark_mq.client.admin import Admin
from spark_mq.client.message import MessageBatch
from spark_mq.deliveries import DeliveryState, delivery_table
from spark_mq.errors import (
    BrokerUnavailable,
    ForwardingRefused,
    LeaseError,
    NotAuthenticated,
    NotAuthorized,
    NotOwner,
    SparkMQError,
)
from spark_mq.messages import Messages, PlainMessage
from spark_mq.schema import MESSAGE_SCHEMA, PRODUCE_SCHEMA, ints

log = logging.getLogger(__name__)

_IDS = itertools.count(-1, -1)  # forwarded consumers' ids (the broker's own count up from 1)


class Forwarding:
    """A member's forwarding: one asyncio producer for every forwarded produce, and the
    consumers attached for its clients, all on one :class:`ForwardingLoop`."""

    def __init__(self, timeout_s: float = 30.0) -> None:
        self.timeout_s = timeout_s
        # this member's own URL (the service's, once it listens): the forwarding producer
        # starts there, which outlives any owner, and is sent on to each destination's owner
        self.home = ""
        self._producer: AsyncProducer | None = None  # (the loop's: made and used there)
        # (the loop's) produces waiting to go, by destination, in the order they came; the
        # destinations with a batch on its way; whether a look at what waits is due
        self._gathered: dict[str, list[tuple[NotOwner, Messages, Future]]] = {}
        self._sending: set[str] = set()
        self._scheduled = False
        self._admin: Admin | None = None  # (durable subscriptions made at their owner)
        self._admin_lock = threading.Lock()
        self._lock = threading.Lock()
        # the loop the forwarded produces and consumers run on (once there is one)
        self._loop: ForwardingLoop | None = None
        self._closed = False

    def _home(self) -> ForwardingLoop:
        """The forwarding's loop, started at its first use (BrokerUnavailable once stopping)."""
        with self._lock:
            if self._closed:
                raise BrokerUnavailable("the broker is stopping")
            if self._loop is None:
                self._loop = ForwardingLoop()
            return self._loop

    def produce(self, owner: NotOwner, destination: str, messages: Messages) -> Future:
        """``messages`` for ``destination``, sent to its owner (``owner``: where it was, the
        producer follows from there); the future resolves, with their offsets, once durable
        there. A destination's produces go in the order they came: one batch of them at a
        time, and the producer's stream to its owner keeps it through a move or the owner's
        loss too (each message with its dedup id: stored once)."""
        out: Future = Future()
        try:
            home = self._home()
        except BrokerUnavailable as exc:
            out.set_exception(exc)
            return out
        if not home.call(self._produce_there, owner, destination, messages, out):
            out.set_exception(BrokerUnavailable("the broker is stopping"))
        return out

    def _produce_there(
        self, owner: NotOwner, destination: str, messages: Messages, out: Future
    ) -> None:
        """(On the loop.) The produce waits with those of its destination that came since its
        last batch went; they go to the forwarding's producer as one batch once that one is
        answered (as a group commit does: a STOMP client's pipelined sends share a frame and a
        commit at the owner), one batch a destination at a time (its order)."""
        self._gathered.setdefault(destination, []).append((owner, messages, out))
        if destination not in self._sending and not self._scheduled:
            self._scheduled = True
            asyncio.get_running_loop().call_soon(self._send_gathered)

    def _send_gathered(self) -> None:
        self._scheduled = False
        for destination in [d for d in self._gathered if d not in self._sending]:
            items = self._gathered.pop(destination)
            if self._producer is None:
                # (one being placed names no member: the producer asks home again until it is)
                urls = [u for u in (self.home, items[0][0].fields.get("endpoint")) if u]
                self._producer = AsyncProducer(urls, timeout_s=self.timeout_s)
            runs, items = _runs(items)
            if not items:
                continue
            self._sending.add(destination)
            sent = asyncio.ensure_future(_send_runs(self._producer, destination, runs))
            sent.add_done_callback(functools.partial(self._sent, destination, items))

    def _sent(
        self,
        destination: str,
        items: list[tuple[NotOwner, Messages, Future]],
        sent: asyncio.Future[list[int]],
    ) -> None:
        try:
            _answer(sent, destination=destination, items=items)
        finally:  # (what came for it meanwhile goes next, whatever became of this batch)
            self._sending.discard(destination)
            if destination in self._gathered and not self._scheduled:
                self._scheduled = True
                asyncio.get_running_loop().call_soon(self._send_gathered)

    def attach(self, owner: NotOwner, cmd: c.Attach, wakeup: Any) -> RemoteConsumer:
        """A consumer of ``cmd``'s destination on its owner (connecting there: moments)."""
        if not owner.fields.get("endpoint"):  # (one being placed: said now, the caller's)
            raise owner
        return RemoteConsumer(self._home(), owner, cmd, wakeup, self.timeout_s)

    # -- durable subscriptions (a round trip each: not on a loop) -----------------------------
    def has_subscription(self, owner: NotOwner, destination: str, name: str) -> bool:
        """Whether topic ``destination``, served by another member, has subscription ``name``."""
        stats = self._administer(owner, lambda admin: admin.stats(destination))
        return name in stats.get("subscriptions", {})

    def create_subscription(
        self, owner: NotOwner, destination: str, name: str, selector: str | None
    ) -> bool:
        """A durable subscription of ``destination`` made at its owner (True: made now)."""
        return bool(
            self._administer(
                owner, lambda admin: admin.create_subscription(destination, name, selector=selector)
            )
        )

    def delete_subscription(self, owner: NotOwner, destination: str, name: str) -> None:
        """Durable subscription ``name`` of ``destination`` removed at its owner."""
        self._administer(owner, lambda admin: admin.delete_subscription(destination, name))

    def add_partitions(self, owner: NotOwner, name: str, count: int) -> bool:
        """Partitioned destination ``name`` grown to ``count`` partitions where its partition
        0 is served (for a client whose protocol cannot be sent there: Kafka's admin clients
        ask their controller); False when it had that many."""
        return bool(self._administer(owner, lambda admin: admin.add_partitions(name, count)))

    def administer(self, owner: NotOwner, cmd: c.Command) -> Any:
        """Admin command ``cmd`` of a destination (a partition) another member serves, done
        there, answered as the session's ``execute`` answers it here (for Kafka's admin
        requests: its clients send them to any broker, the controller)."""
        call: Callable[[Admin], Any]
        match cmd:
            case c.DeleteDestination(name=name):
                call = lambda admin: admin.delete_destination(name)  # noqa: E731
            case c.ConfigureDestination(name=name, settings=settings):
                call = lambda admin: admin.configure(name, **settings)  # noqa: E731
            case c.Stats(name=name):
                call = lambda admin: admin.stats(name)  # noqa: E731
            case _:
                raise TypeError(f"not forwarded: {cmd!r}")
        return self._administer(owner, call)

    def _administer(self, owner: NotOwner, call: Callable[[Admin], Any]) -> Any:
        """``call`` made with the member's administration client; the owner's refusal of this
        member's login or rights said as the forwarding's (the client's were checked here)."""
        with self._admin_lock:
            try:
                return call(self._admin_for(owner))
            except SparkMQError as exc:
                raise _as_forwarded(exc, owner) from None

    def _admin_for(self, owner: NotOwner) -> Admin:
        """(Under ``_admin_lock``.) The member's administration client: it starts here, and
        asks each destination's owner (one being placed: again, until it is)."""
        if self._admin is None:
            urls = [u for u in (self.home, owner.fields.get("endpoint")) if u]
            self._admin = Admin(urls, timeout_s=self.timeout_s)
        return self._admin

    def close(self) -> None:
        """What waits is sent (and answered), then the producer goes; the consumers still
        attached detach (an owner that does not answer holds the stop up 5 s at most)."""
        with self._lock:
            self._closed = True
            home, self._loop = self._loop, None
        if home is not None:
            home.stop(min(self.timeout_s, 5.0), before=self._close_producer)
        with self._admin_lock:
            admin, self._admin = self._admin, None
        if admin is not None:
            admin.close()

    async def _close_producer(self) -> None:
        producer, self._producer = self._producer, None
        if producer is not None:
            await producer.close()


class ForwardingLoop:
    """The event loop a member's forwarding runs on (one thread, however many clients): its
    producer (an :class:`~spark_mq.aio.AsyncProducer`) and every forwarded consumer (each an
    :class:`~spark_mq.aio.AsyncConsumer`), started at its first use. Finding an owner's
    direct wire is a Flight call: those run in a few worker threads."""

    FLIGHT_THREADS = 8

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.loop.set_default_executor(
            ThreadPoolExecutor(self.FLIGHT_THREADS, thread_name_prefix="forward-flight")
        )
        self.consumers: set[RemoteConsumer] = set()  # (the loop's own: touched there)
        # what other threads asked of the loop, in order: the loop is woken once for all that
        # came meanwhile (a STOMP client's pipelined sends, or its acks, a call each)
        self._calls: list[tuple[Callable[..., object], tuple[object, ...]]] = []
        self._calls_lock = threading.Lock()
        self._stopped = False
        self._thread = threading.Thread(
            target=self.loop.run_forever, name="forward-consumers", daemon=True
        )
        self._thread.start()

    def call(self, fn: Callable[..., object], *args: object) -> bool:
        """``fn(*args)`` on the loop, after what was asked of it before (from any thread);
        False once the loop is stopping (the broker is)."""
        with self._calls_lock:
            if self._stopped:
                return False
            self._calls.append((fn, args))
            if len(self._calls) > 1:
                return True  # (the loop is woken already)
        self.loop.call_soon_threadsafe(self._run_calls)
        return True

    def _run_calls(self) -> None:
        with self._calls_lock:
            calls, self._calls = self._calls, []
        for fn, args in calls:
            try:
                fn(*args)
            except Exception:  # (a defect: logged; the others' calls still run)
                log.exception("a call on the forwarding's loop failed")

    def stop(self, timeout_s: float, before: Callable[[], Awaitable[None]] | None = None) -> None:
        """``before()`` (the producer answered and closed), then the consumers still attached
        detached (what they held goes back to their owners), then the loop and its threads
        ended."""

        async def detach_all() -> None:
            if before is not None:
                try:
                    await before()
                except Exception:  # (the consumers detach all the same)
                    log.exception("the forwarding's producer did not close cleanly")
            closing = [c.detach() for c in list(self.consumers)]
            await asyncio.gather(*closing, return_exceptions=True)

        with self._calls_lock:
            self._stopped = True  # (asked from now on: refused; asked before: run first)
        try:
            asyncio.run_coroutine_threadsafe(detach_all(), self.loop).result(timeout_s)
        except Exception as exc:  # (a detach that hangs does not hold up the stop)
            log.warning("forwarded consumers not all detached at the stop: %r", exc)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout_s)
        if not self._thread.is_alive():
            self.loop.run_until_complete(self.loop.shutdown_default_executor())
            self.loop.close()


class RemoteConsumer:
    """A consumer on another member, as a transport sees the broker's own
    (:class:`~spark_mq.session.consumer.ForwardedConsumer`): an asyncio consumer on the
    forwarding's loop. The transport calls it from its own thread; what it asks of the owner
    (settles, the detach) is handed to the loop, in the order asked."""

    def __init__(
        self, home: ForwardingLoop, owner: NotOwner, cmd: c.Attach, wakeup: Any, timeout_s: float
    ) -> None:
        self.consumer_id = next(_IDS)
        self.closed = False
        self.ended_by: SparkMQError | None = None
        self._home = home
        self._cmd = cmd
        self._wakeup = wakeup
        self._timeout_s = timeout_s
        self._lock = threading.Lock()
        self._arrived: list[MessageBatch] = []  # delivered by the owner, not yet handed on
        self._held: dict[int, int] = {}  # handed on, not yet settled: offset -> delivery count
        self._replies: list[c.SettleReply] = []
        self._unanswered = 0
        self._sdk: AsyncConsumer | None = None  # once attached at the owner
        # done once it is attached there (True), or could not be (False: it ended, saying why)
        self.attached: Future = Future()
        # attached on the loop: the caller may be a loop serving many clients, and an owner
        # that is paused answers nothing until the timeout
        self._run = asyncio.run_coroutine_threadsafe(self._serve(owner), home.loop)

    async def _serve(self, owner: NotOwner) -> None:
        """Attach at the owner, then hand on what it delivers until the consumer ends."""
        self._home.consumers.add(self)
        try:
            sdk = await self._attach(owner)
            if sdk is None:
                return
            while (batch := await sdk.get_batch(1_000_000)) is not None:
                with self._lock:
                    self._arrived.append(batch)
                self._wakeup.set()
            self._end(BrokerUnavailable("the owner ended the forwarded consumer"))
        except SparkMQError as exc:  # (its owner refused it, moved it on, or went)
            self._end(exc)
        except Exception as exc:  # (a defect: its client hears it, not a silent subscription)
            log.exception("forwarded consumer of %s failed", self._cmd.destination)
            self._end(BrokerUnavailable(f"forwarding {self._cmd.destination!r} failed: {exc}"))
        finally:
            self._home.consumers.discard(self)
            if not self.attached.done():  # (ended as it attached)
                self.attached.set_result(False)

    async def _attach(self, owner: NotOwner) -> AsyncConsumer | None:
        cmd, endpoint = self._cmd, _endpoint(owner)
        sdk = AsyncConsumer(
            endpoint,
            cmd.destination,
            subscription=cmd.subscription,
            selector=cmd.selector,
            durable=cmd.durable,
            prefetch=cmd.prefetch or 100,
            timeout_s=self._timeout_s,
            # a move is followed by the transport, from here: attached again through its
            # session, here when it came here (not over the wire to this member: every
            # delivery handled twice), else forwarded anew
            reattach=False,
        )
        try:
            await sdk.start()
        except SparkMQError as exc:
            log.info("forwarding a consumer of %s to %s failed: %s", cmd.destination, endpoint,
                     exc.message, extra={"destination": cmd.destination})  # fmt: skip
            self._end(_as_forwarded(exc, owner))
            self.attached.set_result(False)
            return None
        except Exception as exc:  # (a defect: said, as above)
            log.exception("forwarding a consumer of %s to %s failed", cmd.destination, endpoint)
            self._end(
                BrokerUnavailable(f"forwarding a consumer of {cmd.destination!r} failed: {exc}")
            )
            self.attached.set_result(False)
            return None
        with self._lock:
            self._sdk = sdk
            closing = self.closed
        if closing:  # (detached while it attached)
            await sdk.close()
            self.attached.set_result(False)
            return None
        log.info(
            "forwarding a consumer of %s to %s (its owner)",
            cmd.destination,
            endpoint,
            extra={"destination": cmd.destination},
        )
        self.attached.set_result(True)
        return sdk

    def _end(self, why: SparkMQError) -> None:
        """The owner cannot serve it (refused, moved on, or gone for good): the transport
        hears why, and follows."""
        with self._lock:
            if self.closed:
                return
            self.closed, self.ended_by = True, why
        self._wakeup.set()

    # -- ConsumerHandle ------------------------------------------------------------------------
    @property
    def destination(self) -> str:
        return self._cmd.destination

    @property
    def subscription_name(self) -> str:
        return self._cmd.subscription or ""

    @property
    def durable(self) -> bool:
        return self._cmd.durable

    @property
    def lease_s(self) -> float:
        sdk = self._sdk
        return (sdk.lease_s if sdk is not None else None) or 30.0

    @property
    def unanswered(self) -> int:
        return self._unanswered

    def next_leased(self) -> tuple[Messages, list[DeliveryState]] | None:
        with self._lock:
            taken, self._arrived = self._arrived, []
        if not taken:
            return None  # (its end, if it ended: ended_by)
        rows = pa.Table.from_batches([b.arrow for b in taken])
        offsets = ints(rows.column("offset"))
        counts = ints(rows.column("delivery_count"))
        firsts = rows.column("group_first").to_pylist()
        with self._lock:
            self._held.update(zip(offsets, counts, strict=True))
        messages = pa.Table.from_arrays(
            [rows.column(name) for name in MESSAGE_SCHEMA.names], schema=MESSAGE_SCHEMA
        )
        states = [(n, bool(f)) for n, f in zip(counts, firsts, strict=True)]
        return Messages.of(messages), states

    def next_delivery(self) -> pa.Table | None:
        leased = self.next_leased()
        return None if leased is None else delivery_table(*leased)

    def forget(self, offsets: list[int]) -> None:
        with self._lock:
            for o in offsets:
                self._held.pop(o, None)

    def replies(self) -> list[c.SettleReply]:
        with self._lock:
            out, self._replies = self._replies, []
        return out

    def settle(self, cmd: c.Settle, inline: object = None) -> None:
        """Settle deliveries at the owner; the reply comes through :meth:`replies`."""
        with self._lock:
            counts = [self._held.get(o) for o, _ in cmd.entries]
            if cmd.verb != "extend":
                for o, _ in cmd.entries:
                    self._held.pop(o, None)
            self._unanswered += 1
            sdk = self._sdk
        missing = tuple(
            c.Refused(o, "not delivered to this consumer")
            for (o, _), n in zip(cmd.entries, counts, strict=True)
            if n is None
        )
        entries = [(o, n) for (o, _), n in zip(cmd.entries, counts, strict=True) if n is not None]
        if not entries or sdk is None:  # (none delivered through it: none to settle)
            self._answered(c.SettleReply(cmd.request_id, missing))
            return
        if not self._home.call(self._settle_there, sdk, cmd, entries, missing):
            stopping = tuple(c.Refused(o, "the broker is stopping", True) for o, _ in entries)
            self._answered(c.SettleReply(cmd.request_id, stopping + missing))

    def _settle_there(
        self,
        sdk: AsyncConsumer,
        cmd: c.Settle,
        entries: list[tuple[int, int]],
        missing: tuple[c.Refused, ...],
    ) -> None:
        """(On the loop.) ``entries`` settled at the owner (a STOMP reject is a nack there:
        the direct wire has no reject, and the owner dead-letters it once it is due)."""

        def done(f: asyncio.Future[None]) -> None:
            exc = None if f.cancelled() else f.exception()
            if f.cancelled() or exc is None:
                self._answered(c.SettleReply(cmd.request_id, missing))
                return
            why = exc.message if isinstance(exc, SparkMQError) else str(exc)
            # its destination moved on meanwhile (refused by the member it left), or the
            # connection to its owner went (closed to follow it, or broken): what this
            # consumer held goes back there and comes again
            again = isinstance(exc, BrokerUnavailable) or (  # (NotOwner is one)
                isinstance(exc, LeaseError) and exc.fields.get("comes_again") is True
            )
            refused = tuple(c.Refused(o, why, again) for o, _ in entries)
            self._answered(c.SettleReply(cmd.request_id, refused + missing))

        verb: AioVerb = "nack" if cmd.verb == "reject" else cmd.verb
        sdk.settle_entries(verb, entries).add_done_callback(done)

    def _answered(self, reply: c.SettleReply) -> None:
        with self._lock:
            self._replies.append(reply)
            self._unanswered -= 1
        self._wakeup.set()

    def close(self) -> None:
        """Detach at the owner (what it held unsettled goes back there), on the loop: the
        caller may be a loop serving others."""
        with self._lock:
            if self.closed and self.ended_by is None:
                return
            self.closed = True
        self._home.call(lambda: asyncio.ensure_future(self.detach()))

    async def detach(self) -> None:
        """(On the loop.) Detach at the owner, once attached (else it closes as it attaches)."""
        with self._lock:  # (as close() and the attach read them)
            self.closed = True
            sdk = self._sdk
        if sdk is not None:
            await sdk.close()


_Produce = tuple[NotOwner, Messages, Future]


def _runs(items: list[_Produce]) -> tuple[list[pa.Table | list[PlainMessage]], list[_Produce]]:
    """Produces of one destination as the fewest sends that keep their order (the plain
    messages of consecutive plain produces as one list, the rows of consecutive others as one
    table of ``PRODUCE_SCHEMA``), and the produces they hold: one whose rows cannot be sent is
    answered with why now, and left out (the others' go)."""
    runs: list[pa.Table | list[PlainMessage]] = []
    kept: list[_Produce] = []
    for item in items:
        m = item[1]
        if m.plain is not None:
            kept.append(item)
            if runs and isinstance(runs[-1], list):
                runs[-1].extend(m.plain)
            else:
                runs.append(list(m.plain))
            continue
        try:
            rows = m.table()
            rows = rows if rows.schema.equals(PRODUCE_SCHEMA) else conform_produce(rows)
        except SparkMQError as exc:
            item[2].set_exception(exc)
            continue
        kept.append(item)
        last = runs[-1] if runs else None
        if isinstance(last, pa.Table):
            runs[-1] = pa.concat_tables([last, rows])
        else:
            runs.append(rows)
    return runs, kept


async def _send_runs(
    producer: AsyncProducer, destination: str, runs: list[pa.Table | list[PlainMessage]]
) -> list[int]:
    """``runs`` sent in order (each begun before the next: a destination's stream keeps the
    order they were begun in); their offsets, or the first failure."""
    sends = [asyncio.ensure_future(producer.send_rows(r, destination=destination)) for r in runs]
    outcomes = await asyncio.gather(*sends, return_exceptions=True)
    offsets: list[int] = []
    for outcome in outcomes:
        if isinstance(outcome, BaseException):
            raise outcome
        offsets += outcome
    return offsets


def _answer(
    sent: asyncio.Future[list[int]],
    *,
    destination: str,
    items: list[tuple[NotOwner, Messages, Future]],
) -> None:
    """Each produce of a batch sent as one answered: its own offsets, or the batch's error."""
    exc = None if sent.cancelled() else sent.exception()
    if exc is None and not sent.cancelled():
        offsets, at = sent.result(), 0
        for _, m, out in items:
            if not out.done():
                out.set_result(offsets[at : at + m.num_rows])
            at += m.num_rows
        return
    for owner, _, out in items:
        if out.done():
            continue
        if isinstance(exc, SparkMQError):
            out.set_exception(_as_forwarded(exc, owner))
        else:  # (a defect, or cancelled at the stop: its clients hear it)
            out.set_exception(BrokerUnavailable(f"forwarding to {destination!r} failed: {exc}"))
    if exc is not None and not isinstance(exc, SparkMQError):
        log.error("forwarding to %s failed", destination, exc_info=exc)


def _endpoint(owner: NotOwner) -> str:
    endpoint = owner.fields.get("endpoint")
    if not isinstance(endpoint, str) or not endpoint:
        raise BrokerUnavailable(f"{owner.message} (it is forwarded once it is placed)")
    return endpoint


def _as_forwarded(exc: SparkMQError, owner: NotOwner) -> SparkMQError:
    """The owner refused this member's login or rights: the client asked nothing wrong (its
    own rights were checked here), the member's forwarding identity is missing one."""
    if not isinstance(exc, NotAuthenticated | NotAuthorized):
        return exc
    member = owner.fields.get("member") or "the member serving it"
    log.error(
        "forwarding to cluster member %s refused: %s (set SPARKMQ_USERNAME and "
        "SPARKMQ_PASSWORD, or SPARKMQ_TOKEN, in this member's environment: a user allowed "
        "to produce, consume and create every destination, and to administer topics whose "
        "STOMP clients remove durable subscriptions)",
        member,
        exc.message,
    )
    # (a ConfigError: not retriable, no client asking again mends it; a subscription ends)
    return ForwardingRefused(
        f"{owner.fields.get('destination')!r} is served by cluster member {member}, which "
        f"refused this member's forwarding ({exc.message}); the operator is to give the "
        "members a forwarding identity (see the broker's log)"
    )
