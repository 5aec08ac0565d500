"""What a STOMP connection's frames mean: each one as a call of its ``ClientSession``
(:mod:`spark_mq.session`), and the broker's answers and deliveries as frames. The connection
(:mod:`spark_mq.transports.stomp_connection`) reads, writes and closes; this decides nothing
about delivery either: leases, redelivery, dead-lettering, groups, dedup and transactions are
the broker's, as for the SDK.

* SEND: stored through the session (a receipt once durable); with ``transaction``, kept until
  COMMIT. ``/temp-queue/<name>`` is this connection's temporary queue; a reply-to naming one
  becomes the ``/queue/tmp.<id>`` anyone may answer to.
* SUBSCRIBE: a consumer attached through the session; ``ack`` ``auto`` (acknowledged once
  written), ``client`` (an ACK covers every earlier message of the subscription) or
  ``client-individual``. Unacknowledged messages stay this client's while it is connected: their
  leases are extended (:meth:`StompSession.extend_leases`). A subscription to a partitioned
  destination is one *part* (a consumer) per partition under the one id; their deliveries are
  interleaved as they come, and a ``client`` ACK covers every earlier message of every part.
* ACK / NACK: settles, answered (the receipt) once durable; NACK gives the message back for
  redelivery, counted towards dead-lettering.
* BEGIN / COMMIT / ABORT: sends and acks of a transaction, committed as one broker transaction
  (all or nothing); ABORT gives its acked messages back.
"""

from __future__ import annotations

import functools
import itertools
import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any, Protocol

from spark_mq import commands as c
from spark_mq.connection.core import ConnState
from spark_mq.connection.listener import ListenerCore, pump
from spark_mq.deliveries import DeliveryState
from spark_mq.errors import NotOwner, Partitioned, SparkMQError
from spark_mq.messages import Messages
from spark_mq.names import partition_name, validate_name
from spark_mq.session import ClientSession, ConsumerHandle
from spark_mq.transports import stomp_headers as h
from spark_mq.transports.stomp_codec import Frame, StompError, encode

log = logging.getLogger(__name__)

ACK_MODES = ("auto", "client", "client-individual")
PREFETCH = ("activemq.prefetchSize", "sparkmq-prefetch")
DURABLE = ("activemq.subscriptionName", "durable-subscription-name", "sparkmq-durable-subscription")
SHARED = "sparkmq-shared-subscription"


@dataclass
class _Sub:
    """One consumer of a subscription: the subscription's only one, or one partition's."""

    id: str
    consumer: ConsumerHandle
    destination: str  # as the client named it
    stored_as: str  # the sparkmq destination (a partition's, for a part)
    ack: str
    # ack id -> (offset, delivery count), in delivery order: shared by a subscription's parts
    # (a cumulative ACK covers what any of them delivered before)
    pending: OrderedDict[str, tuple[int, int]] = field(default_factory=OrderedDict)
    attach: c.Attach | None = None  # how it was attached (None: a temporary queue's)
    # its forwarded consumer's owner could not be reached: not attached again before this
    follow_at: float | None = None


@dataclass
class _Receipt:
    """A receipt owed once every part's settle of one ACK or NACK is durable."""

    receipt: str | None
    waiting: int


@dataclass
class _Tx:
    rows: list[dict[str, Any]] = field(default_factory=list)
    acks: list[c.TransactionAck] = field(default_factory=list)
    acked: list[tuple[_Sub, list[tuple[int, int]]]] = field(default_factory=list)
    nacked: list[tuple[_Sub, list[tuple[int, int]]]] = field(default_factory=list)


class StompLink(Protocol):
    """What a session asks of its connection
    (:class:`~spark_mq.transports.stomp_connection.StompConnection`): frames written, work
    waited for with the frames behind it held, an ERROR, the connection's state."""

    version: str  # the STOMP version agreed
    peer: str
    paused_writing: bool  # the client is not reading: deliver nothing more for now

    @property
    def state(self) -> ConnState: ...

    def write_bytes(self, parts: list[bytes]) -> None: ...
    def reply(self, receipt: str | None) -> None: ...
    def receipt(self, frame: Frame) -> None: ...
    def error(self, message: str, *, receipt: str | None = None) -> None: ...
    def blocking(
        self, fn: Callable[[], Any], then: Callable[[Any], None], receipt: str | None
    ) -> None: ...
    def awaiting(
        self, work: Future[Any], then: Callable[[Any], None], receipt: str | None
    ) -> None: ...
    def threadsafe(self, fn: Callable[..., Any], *args: Any) -> None: ...
    def set(self) -> None:
        """Wake the connection to deliver (any thread)."""

    def maybe_finish(self) -> None:
        """After a DISCONNECT, once everything before it is answered: close."""


FOLLOW_AGAIN_S = 0.25  # a subscription whose owner could not be reached tries again after this


class StompSession:
    def __init__(
        self,
        conn: StompLink,
        listener: ListenerCore,
        session: ClientSession,
        client_id: str | None,
    ) -> None:
        self.conn = conn
        self.listener = listener
        self.session = session
        self.client_id = client_id
        self.pending_ops = 0  # sends and settles whose answer is to come
        self.subs: dict[str, list[_Sub]] = {}  # id -> its parts (one, or one a partition)
        self.retired: list[ConsumerHandle] = []  # unsubscribed, settles still to answer
        self.temps: dict[str, ConsumerHandle] = {}  # /temp-queue/<name> -> its consumer
        self.acks: dict[str, _Sub] = {}  # ack id -> the subscription it was delivered on
        self.by_message_id: dict[str, str] = {}  # 1.0/1.1 acks name the message id
        self.message_ids: dict[str, str] = {}  # ...and the other way round, to forget it
        self.settling: dict[tuple[int, int], tuple[str, _Receipt, bool]] = {}
        self.txs: dict[str, _Tx] = {}
        # ack ids of deliveries whose destination moved to another cluster member before they
        # were acknowledged: the member serving it now delivers them again; an ack of one is
        # answered and does nothing
        self.moved: set[str] = set()
        # a subscription could not follow its destination yet (being placed, or its owner
        # not reached): the connection's sweep wakes it to try again (nothing else may: an
        # idle subscriber sends nothing, and its consumer, let go, delivers nothing)
        self.follow_again = False
        self._tokens = itertools.count(1)
        self._requests = itertools.count(1)
        # subscriptions to a partitioned destination by its own name: the destination, and how
        # a part is attached (partitions added later are taken on: take_on_partitions)
        self.widening: dict[str, tuple[str, Callable[[str], tuple[ConsumerHandle, Any]]]] = {}
        self._taking_on: set[str] = set()  # (their parts being attached on a helper thread)

    def frame(self, frame: Frame) -> None:
        """One frame after CONNECT; a ``StompError`` or ``SparkMQError`` is the ERROR."""
        match frame.command:
            case "SEND":
                self._send(frame)
            case "SUBSCRIBE":
                self._subscribe(frame)
            case "UNSUBSCRIBE":
                self._unsubscribe(frame)
            case "ACK" | "NACK":
                self._settle(frame, frame.command.lower())
            case "BEGIN":
                name = _required(frame, "transaction")
                if name in self.txs:
                    raise StompError(f"transaction {name!r} has begun already")
                self.txs[name] = _Tx()
                self.conn.receipt(frame)
            case "COMMIT":
                self._commit(frame, self._tx(frame))
            case "ABORT":
                for sub, entries in self._tx(frame).acked:
                    self._settle_now(sub, "nack", entries, None, strict=False)
                self.conn.receipt(frame)
            case "CONNECT" | "STOMP":
                raise StompError("this connection is connected already")

    def close(self) -> None:
        """The connection ended: its consumers detached (what they held goes back)."""
        self.txs.clear()
        self.session.close()

    def extend_leases(self) -> float:
        """Messages delivered and not yet acknowledged stay this client's while it is
        connected (a JMS broker's rule; an SDK consumer extends its leases itself): their
        leases are extended; returns when to do it next (s from now)."""
        held: dict[int, tuple[_Sub, list[tuple[int, int]]]] = {
            id(part): (part, []) for part in self._parts()
        }
        for parts in self.subs.values():  # (a subscription's parts share what is pending)
            for token, entry in parts[0].pending.items():
                owner = held.get(id(self.acks.get(token)))
                if owner is not None:
                    owner[1].append(entry)
        for tx in self.txs.values():  # acked in a transaction: leased until it ends
            for sub, entries in tx.acked:
                if id(sub) in held:  # (still subscribed)
                    held[id(sub)][1].extend(entries)
        for part, entries in held.values():
            if entries:
                self._settle_now(part, "extend", entries, None, strict=False)
        if not self.subs:
            return 0.1  # (a subscription may come any moment; nothing to do meanwhile)
        return min(s.consumer.lease_s for s in self._parts()) / 3

    # -- SEND --------------------------------------------------------------------------------
    def _send(self, frame: Frame) -> None:
        session = self.session
        name = self._producing_to(h.target_of(frame.header("destination")))
        reply_to = self._reply_to(frame.header("reply-to"))
        message = h.send_row(frame, reply_to)
        receipt = frame.header("receipt")
        tx = frame.header("transaction")
        if tx is not None:
            self._tx(frame).rows.append({"destination": name, **h.as_row(message)})
            self.conn.receipt(frame)
            return
        produced = h.produced(message)
        # committed with the loop's turn; a big one by the writer thread while the loop serves
        # on; one that may wait for room (a block policy, memory short) on a helper thread,
        # the frames behind it waiting
        fut, waits = self.listener.produce(session, name, produced, len(frame.body))
        if waits:
            self.conn.awaiting(fut, lambda _: self.conn.reply(receipt), receipt)
            return
        self.pending_ops += 1
        fut.add_done_callback(lambda f: self.conn.threadsafe(self._produced, f, receipt))

    def _produced(self, fut: Future, receipt: str | None) -> None:
        self.pending_ops -= 1
        exc = fut.exception()
        if exc is not None:
            message = exc.message if isinstance(exc, SparkMQError) else str(exc)
            self.conn.error(f"the message was not stored: {message}", receipt=receipt)
            return
        self.conn.reply(receipt)
        self.conn.maybe_finish()

    def _producing_to(self, target: h.Target) -> str:
        if target.kind == "temp-queue":
            return self._temp(target.name).destination
        self.session.open_named(target.name, target.kind)
        return target.name

    def _reply_to(self, text: str | None) -> str | None:
        """A ``/temp-queue/`` reply-to becomes the ``/queue/`` its temporary queue is reached
        at (made now if it is not yet: a request goes out before its reply is subscribed to)."""
        if text is None or not text.startswith("/temp-queue/"):
            return None
        target = h.target_of(text, "reply-to")
        return f"/queue/{self._temp(target.name).destination}"

    def _temp(self, name: str, prefetch: int | None = None) -> ConsumerHandle:
        consumer = self.temps.get(name)
        if consumer is None:
            cmd = c.Attach("", prefetch=prefetch, temporary=True)
            consumer = self.session.attach(cmd, wakeup=self.conn)
            self.temps[name] = consumer
        return consumer

    # -- SUBSCRIBE, UNSUBSCRIBE --------------------------------------------------------------
    def _subscribe(self, frame: Frame) -> None:
        session = self.session
        text = frame.header("destination")
        sub_id = frame.header("id") or (text if self.conn.version == "1.0" else None)
        if not sub_id:
            raise StompError("SUBSCRIBE needs an id header (it names the subscription)")
        if sub_id in self.subs:
            raise StompError(f"this connection has a subscription {sub_id!r} already")
        target = h.target_of(text)
        ack = frame.header("ack") or "auto"
        if ack not in ACK_MODES:
            raise StompError(f"ack mode {ack!r} is not one of {', '.join(ACK_MODES)}")
        selector = frame.header("selector") or None
        prefetch = h.integer(frame, PREFETCH, 1, 100_000)
        durable = h.first(frame, DURABLE)
        name = target.name

        def attach(name: str) -> tuple[ConsumerHandle, c.Attach | None]:
            if target.kind == "temp-queue":
                consumer = self._temp(name, prefetch)
                if any(s.consumer is consumer for s in self._parts()):
                    raise StompError(f"{text} is subscribed to already on this connection")
                return consumer, None
            if target.kind == "queue":
                session.open_named(name, "queue")
                cmd = c.Attach(name, None, prefetch, selector)
            else:
                session.open_named(name, "topic")
                if durable is not None:
                    subscription = self._durable_name(durable)
                    session.subscribe_durable(name, subscription, selector)
                    cmd = c.Attach(name, subscription, prefetch, selector)
                else:
                    shared = frame.header(SHARED) or None
                    if shared is not None:
                        validate_name(shared, "subscription")
                    cmd = c.Attach(name, shared, prefetch, selector, durable=False)
            return session.attach(cmd, wakeup=self.conn), cmd

        def attach_all() -> list[tuple[ConsumerHandle, c.Attach | None]]:
            try:
                return [attach(name)]
            except Partitioned as parted:  # a part for each partition, under this one id
                if target.kind == "temp-queue":
                    raise
                count = int(parted.fields["partitions"])
                attached = self._attach_parts(
                    attach, [partition_name(name, i) for i in range(count)]
                )
                self.widening[sub_id] = (name, attach)
                return attached

        self._now_or_on_helper(
            frame,
            attach_all,
            lambda attached: self._subscribed_as(frame, sub_id, text, ack, attached),
        )

    def _now_or_on_helper(
        self, frame: Frame, work: Callable[[], Any], then: Callable[[Any], None]
    ) -> None:
        """``work()`` now, on the loop, and ``then`` with its result. On a cluster member, work
        that meets a destination being placed, or that must ask another member (a durable
        subscription's round trips), raises ``NotOwner`` here (the loop serves every client:
        it never waits); it is done again on a helper thread, which may wait, this connection's
        later frames behind it, and ``then`` follows on the loop."""
        try:
            done = work()
        except NotOwner:
            if self.session.forwarding is None:
                raise
            self.conn.awaiting(self.listener.run_blocking(work), then, frame.header("receipt"))
            return
        then(done)

    def _subscribed_as(
        self,
        frame: Frame,
        sub_id: str,
        text: str | None,
        ack: str,
        attached: list[tuple[ConsumerHandle, c.Attach | None]],
    ) -> None:
        pending: OrderedDict[str, tuple[int, int]] = OrderedDict()
        self.subs[sub_id] = [
            _Sub(sub_id, consumer, text or "", consumer.destination, ack, pending, cmd)
            for consumer, cmd in attached
        ]
        log.info(
            "stomp: %s subscribed to %s as %r (%s acks%s)", self.conn.peer, text, sub_id, ack,
            f", {len(attached)} partitions" if len(attached) > 1 else "",
        )  # fmt: skip
        # one forwarded to the member that serves it is attached there on a thread of its own:
        # its receipt waits for that (a receipt says the subscription exists: what is published
        # after it reaches it)
        forwarded = [f for c, _ in attached if (f := getattr(c, "attached", None)) is not None]
        if any(not f.done() for f in forwarded):
            self.pending_ops += 1
            joined = _all_done(forwarded)
            receipt = frame.header("receipt")
            joined.add_done_callback(lambda _: self.conn.threadsafe(self._subscribed, receipt))
        else:
            self.conn.receipt(frame)
        self.conn.set()

    def _subscribed(self, receipt: str | None) -> None:
        """A forwarded subscription was attached at its owner (or ended: then it says so)."""
        self.pending_ops -= 1
        self.conn.reply(receipt)
        self.conn.maybe_finish()

    def _durable_name(self, name: str) -> str:
        """A durable subscription is the client id's and the name's (JMS's), when there is a
        client id (``client-id`` in CONNECT), as Artemis names it."""
        full = f"{self.client_id}.{name}" if self.client_id else name
        validate_name(full, "durable subscription")
        return full

    def _unsubscribe(self, frame: Frame) -> None:
        sub_id = frame.header("id") or (
            frame.header("destination") if self.conn.version == "1.0" else None
        )
        if not sub_id:
            raise StompError("UNSUBSCRIBE needs an id header")
        parts = self.subs.pop(sub_id, None)
        if parts is None:
            raise StompError(f"there is no subscription {sub_id!r} on this connection")
        self.widening.pop(sub_id, None)
        self._forget_tokens(list(parts[0].pending))
        session = self.session
        for sub in parts:
            session.detach(sub.consumer)  # what it held unacknowledged goes back
            self.retired.append(sub.consumer)
            for name, consumer in list(self.temps.items()):
                if consumer is sub.consumer:
                    del self.temps[name]
        durable = h.first(frame, DURABLE)
        if durable is None:
            self.conn.receipt(frame)
            return
        # the durable subscription itself ends only when asked
        full, left = self._durable_name(durable), [sub.stored_as for sub in parts]

        def unsubscribe_left() -> None:
            while left:
                session.unsubscribe_durable(left[0], full)
                left.pop(0)

        self._now_or_on_helper(frame, unsubscribe_left, lambda _: self.conn.receipt(frame))

    def take_on_partitions(self) -> None:
        """(Every ``broker.stomp_partitions_recheck_s``.) A subscription to a partitioned
        destination by its name gets a part for each partition added since (their
        deliveries under its id, its cumulative ACK covering them too). A part that must be
        attached through another member is attached on a helper thread (the loop never
        waits); one that cannot be yet is tried next time."""
        for sub_id, (name, attach) in list(self.widening.items()):
            parts = self.subs.get(sub_id)
            if parts is None:  # (unsubscribed)
                del self.widening[sub_id]
                continue
            if sub_id in self._taking_on:
                continue
            count = self.session.partitions(name)  # (as the broker read it lately)
            if count <= len(parts):
                continue
            added = [partition_name(name, i) for i in range(len(parts), count)]
            try:
                self._took_on(sub_id, parts, self._attach_parts(attach, added))
            except NotOwner:
                if self.session.forwarding is None:
                    raise
                self._taking_on.add(sub_id)
                fut = self.listener.run_blocking(self._attach_parts, attach, added)
                fut.add_done_callback(
                    functools.partial(self._threadsafe_took_on_later, sub_id, parts)
                )
            except SparkMQError as exc:
                log.info("stomp: %s's subscription %r takes on %s's new partitions later: %s",
                         self.conn.peer, sub_id, name, exc.message)  # fmt: skip

    def _attach_parts(
        self, attach: Callable[[str], tuple[ConsumerHandle, Any]], names: list[str]
    ) -> list[tuple[ConsumerHandle, Any]]:
        """A part for each of ``names``; none kept when one cannot be attached."""
        attached: list[tuple[ConsumerHandle, Any]] = []
        try:
            for name in names:
                attached.append(attach(name))
        except BaseException:
            for consumer, _ in attached:
                self.session.detach(consumer)
            raise
        return attached

    def _threadsafe_took_on_later(self, sub_id: str, parts: list[_Sub], fut: Future) -> None:
        self.conn.threadsafe(self._took_on_later, sub_id, parts, fut)

    def _took_on_later(self, sub_id: str, parts: list[_Sub], fut: Future) -> None:
        self._taking_on.discard(sub_id)
        exc = fut.exception()
        if exc is not None:
            log.info("stomp: %s's subscription %r takes on new partitions later: %s",
                     self.conn.peer, sub_id, exc)  # fmt: skip
            return
        self._took_on(sub_id, parts, fut.result())

    def _took_on(
        self, sub_id: str, parts: list[_Sub], attached: list[tuple[ConsumerHandle, Any]]
    ) -> None:
        if self.subs.get(sub_id) is not parts:  # (unsubscribed meanwhile: let them go)
            for consumer, _ in attached:
                self.session.detach(consumer)
            return
        first = parts[0]
        for consumer, cmd in attached:
            parts.append(
                _Sub(
                    sub_id,
                    consumer,
                    first.destination,
                    consumer.destination,
                    first.ack,
                    first.pending,
                    cmd,
                )
            )
            log.info("stomp: %s's subscription %r reads %s too (a partition added)",
                     self.conn.peer, sub_id, consumer.destination)  # fmt: skip
        self.conn.set()

    def _parts(self) -> list[_Sub]:
        return [sub for parts in self.subs.values() for sub in parts]

    # -- ACK, NACK, transactions -------------------------------------------------------------
    def _settle(self, frame: Frame, verb: str) -> None:
        if self.conn.version == "1.2":
            token = _required(frame, "id")
        else:
            given = _required(frame, "message-id")
            token = self.by_message_id.get(given, given)
        sub = self.acks.get(token)
        if sub is None and token in self.moved:  # (redelivered by the member serving it now)
            self.moved.discard(token)
            self.conn.receipt(frame)
            return
        if sub is None or token not in sub.pending:
            raise StompError(
                f"{verb.upper()} of {token!r}: no message delivered on this connection awaits "
                "an acknowledgement under that id (acknowledged already, auto-acknowledged, or "
                "never delivered here)"
            )
        if sub.ack == "client":  # cumulative: every message delivered before it too
            tokens = [*itertools.takewhile(lambda t: t != token, sub.pending), token]
        else:
            tokens = [token]
        by_part: dict[int, tuple[_Sub, list[tuple[int, int]]]] = {}  # (its parts' in turn)
        for t in tokens:
            part = self.acks[t]
            by_part.setdefault(id(part), (part, []))[1].append(sub.pending.pop(t))
        self._forget_tokens(tokens)
        tx_name = frame.header("transaction")
        if tx_name is None:
            owed = _Receipt(frame.header("receipt"), len(by_part))
            for part, entries in by_part.values():
                self._settle_now(part, verb, entries, owed, strict=True)
            return
        tx = self._tx(frame)
        for part, entries in by_part.values():
            if verb == "nack":
                tx.nacked.append((part, entries))
            elif not part.consumer.durable:
                raise StompError(
                    "only messages of queues and durable subscriptions can be acknowledged in "
                    "a transaction"
                )
            else:
                sub_name = part.consumer.subscription_name
                cid = part.consumer.consumer_id
                tx.acks += [(part.stored_as, sub_name, cid, o, n) for o, n in entries]
                tx.acked.append((part, entries))
        self.conn.receipt(frame)

    def _forget_tokens(self, tokens: list[str]) -> None:
        for token in tokens:
            self.acks.pop(token, None)
            message_id = self.message_ids.pop(token, None)
            if message_id is not None and self.by_message_id.get(message_id) == token:
                del self.by_message_id[message_id]

    def _settle_now(
        self,
        sub: _Sub,
        verb: str,
        entries: list[tuple[int, int]],
        receipt: _Receipt | None,
        *,
        strict: bool,
    ) -> None:
        request = next(self._requests)
        owed = receipt or _Receipt(None, 1)
        self.settling[(sub.consumer.consumer_id, request)] = (verb, owed, strict)
        self.pending_ops += 1
        cmd = c.Settle(verb, request, tuple(entries))  # type: ignore[arg-type]
        self.session.settle(sub.consumer, cmd, self.listener.turn.inline)

    def _settled(self, consumer: ConsumerHandle, reply: c.SettleReply) -> None:
        verb, owed, strict = self.settling.pop((consumer.consumer_id, reply.request_id))
        self.pending_ops -= 1
        owed.waiting -= 1
        # refused because the destination moved on meanwhile (or the member serving it could
        # not be reached): the subscription follows it, and those messages come again (as
        # those delivered before a move and settled after do): not the client's mistake
        again = bool(reply.refused) and all(r.comes_again for r in reply.refused)
        if reply.refused and strict and not again:
            why = "; ".join(f"offset {r.offset}: {r.reason}" for r in reply.refused[:3])
            self.conn.error(f"{verb.upper()} refused: {why}", receipt=owed.receipt)
            return
        if again:
            log.info(
                "stomp: %s's %s of %d message(s) came as their destination moved: they are "
                "delivered again",
                self.conn.peer,
                verb,
                len(reply.refused),
            )
        elif reply.refused:
            log.info("stomp: %s's %s refused: %s", self.conn.peer, verb, reply.refused[:3])
        if owed.waiting == 0:  # (every part's settle durable)
            self.conn.reply(owed.receipt)

    def _commit(self, frame: Frame, tx: _Tx) -> None:
        receipt = frame.header("receipt")
        session = self.session
        acks, table = tuple(tx.acks), h.transaction_table(tx.rows)

        def committed(_: Any) -> None:
            for sub, entries in tx.acked:
                sub.consumer.forget([o for o, _ in entries])
            for sub, entries in tx.nacked:
                self._settle_now(sub, "nack", entries, None, strict=False)
            self.conn.reply(receipt)

        if not acks and table is None:
            committed(None)
            return
        commit = c.CommitTransaction(acks, table, here=True)  # (a STOMP client cannot follow)
        self.conn.blocking(lambda: session.execute(commit), committed, receipt)

    def _tx(self, frame: Frame) -> _Tx:
        name = _required(frame, "transaction")
        tx = self.txs.get(name)
        if tx is None:
            raise StompError(f"there is no transaction {name!r} on this connection (BEGIN it)")
        if frame.command in ("COMMIT", "ABORT"):
            del self.txs[name]
        return tx

    # -- deliveries ---------------------------------------------------------------------------
    def pump(self) -> None:
        """Answer settles that became durable, and deliver what the prefetch windows take."""
        for consumer in [s.consumer for s in self._parts()] + self.retired:
            for reply in consumer.replies():
                self._settled(consumer, reply)
                if self.conn.state.ended:
                    return
        self.retired = [r for r in self.retired if r.unanswered]
        state = self.conn.state
        if self.conn.paused_writing or state.ended or state is ConnState.CLOSING:
            self.conn.maybe_finish()  # (not reading, or going: nothing more delivered)
            return
        self.follow_again = False
        for sub in self._parts():
            if sub.consumer.closed:
                self._follow(sub)
            self._deliver(sub)
        self.conn.maybe_finish()

    def _follow(self, sub: _Sub) -> None:
        """A subscription whose destination moved to another cluster member (the broker
        detached its consumer, saying where): attached again, forwarded there, the deliveries
        it had not acknowledged given again by that member."""
        moved = sub.consumer.ended_by
        if moved is not None and not moved.retriable:  # (a forwarded one's end: refused)
            self.conn.error(f"subscription {sub.id!r} to {sub.destination} ended: {moved.message}")
            return
        if sub.attach is None or moved is None or self.session.forwarding is None:
            return
        if not isinstance(moved, NotOwner):
            # its owner could not be reached (killed, say, and its queue not placed again
            # yet): attached again a moment later, where the queue is then, not at once
            now = time.monotonic()
            if sub.follow_at is None:
                sub.follow_at = now + FOLLOW_AGAIN_S
            if now < sub.follow_at:
                self.follow_again = True
                return
        sub.follow_at = None
        try:
            consumer = self.session.attach(sub.attach, wakeup=self.conn)
        except SparkMQError as exc:
            if not exc.retriable:  # (its rights went meanwhile, say: not to be tried again)
                why = exc.message
                self.conn.error(f"subscription {sub.id!r} to {sub.destination} ended: {why}")
                return
            # (being placed just now: tried again at the next sweep)
            log.info("stomp: %s's subscription %r waits: %s", self.conn.peer, sub.id, exc.message)
            self.follow_again = True
            return
        tokens = [t for t in sub.pending if self.acks.get(t) is sub]  # (this part's)
        self._forget_tokens(tokens)
        self.moved.update(tokens)
        for t in tokens:
            del sub.pending[t]
        self.session.detach(sub.consumer)
        sub.consumer = consumer
        log.info("stomp: %s's subscription %r follows %s", self.conn.peer, sub.id, sub.stored_as)

    def _deliver(self, sub: _Sub) -> None:
        conn = self.conn
        pump(
            sub.consumer,
            lambda messages, state: self._write_messages(sub, messages, state),
            lambda: not conn.paused_writing and not conn.state.ended,
        )

    def _write_messages(self, sub: _Sub, leased: Messages, state: list[DeliveryState]) -> None:
        auto = sub.ack == "auto"
        messages = h.delivered(leased, [n for n, _ in state])
        parts = []
        for m in messages:
            token = None if auto else self._token(sub, m)
            frame = h.message_frame(
                m, destination=sub.destination, stored_as=sub.stored_as, subscription=sub.id,
                ack=token,
            )  # fmt: skip
            parts.append(encode(frame, self.conn.version))
        self.conn.write_bytes(parts)
        if auto:  # acknowledged once on its way (STOMP's auto mode: at most once)
            entries = [(m.offset, m.delivery_count) for m in messages]
            self._settle_now(sub, "ack", entries, None, strict=False)

    def _token(self, sub: _Sub, m: h.Delivered) -> str:
        token = str(next(self._tokens))
        sub.pending[token] = (m.offset, m.delivery_count)
        self.acks[token] = sub
        if self.conn.version != "1.2":
            message_id = h.message_id_of(m, sub.stored_as)
            self.by_message_id[message_id] = token
            self.message_ids[token] = message_id
        return token


def _required(frame: Frame, name: str) -> str:
    value = frame.header(name)
    if not value:
        raise StompError(f"{frame.command} needs a {name} header")
    return value


def _all_done(futures: list[Future]) -> Future:
    """One future, done (with None) once every one of ``futures`` is, however each ended."""
    joined: Future = Future()
    left = [len(futures)]
    lock = threading.Lock()

    def one_done(_: Future) -> None:
        with lock:
            left[0] -= 1
            last = left[0] == 0
        if last:
            joined.set_result(None)

    for f in futures:
        f.add_done_callback(one_done)
    return joined
