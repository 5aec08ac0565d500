"""A client's session: the one place where what it asks is authorized, counted and handed to the
broker (Artemis's ``ServerSession``, under its STOMP, AMQP and Core protocol managers).

A transport opens one per connection (the direct wire) or per call (Flight), for the
principal it authenticated, and closes it when the connection ends: the consumers attached
through it are detached then and their unsettled messages go back. Every command goes through
here: the hot path's (a produced batch, an attach, a settle) by methods of their own, the rest
through :meth:`ClientSession.execute`. Which verb each needs:

========================  ===========================================================
produce a batch           ``produce`` on the destination (and ``create`` if it does not
                          exist yet: producing creates it, when auto-creation is on)
attach a consumer         ``consume`` (and ``create`` likewise); a temporary queue:
                          ``create`` on ``tmp.*``
settle                    nothing more: the consumer was authorized when it attached
browse                    ``browse``
claim, ack claims,        ``consume`` (a Spark query consuming through the broker)
read a claim
create a destination      ``create``
list destinations         ``connect``; only those it may do anything with are listed
move (and redrive)        ``admin`` on the source and ``produce`` on every target
broker status             ``connect`` (where its data is: broker-wide ``admin``)
the configuration,        ``admin`` on the broker: a rule over every destination
promote, reload rules     (admin of some destinations is not admin of the broker)
everything else           ``admin`` on the destination named (configure, delete,
(admin)                   purge, stats, subscriptions, releasing a query's claims)
a transaction             ``produce`` on every destination it sends to and ``consume``
                          on every one it acks
a protocol's topic        ``create`` when it does not exist (STOMP's ``/topic/``)
durable subscribe         ``consume`` on the topic, and ``create`` when the subscription
                          does not exist yet (JMS's durable subscriber, through STOMP's
                          headers)
durable unsubscribe       ``admin`` on the topic (removing any subscription)
========================  ===========================================================
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import threading
from collections import Counter
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any, Protocol

import pyarrow as pa
import pyarrow.compute as pc

from spark_mq import commands as c
from spark_mq import serving_threads
from spark_mq.broker.consumers import ConsumerSession
from spark_mq.broker.core import Broker
from spark_mq.broker.subscription import Wakeup
from spark_mq.errors import (
    BrokerUnavailable,
    DestinationExists,
    DestinationNotFound,
    MessageRejected,
    NotAuthenticated,
    NotAuthorized,
    NotOwner,
    Partitioned,
    ProtocolError,
    SparkMQError,
)
from spark_mq.journal.base import Kind
from spark_mq.journal.inline_commit import InlineCommit
from spark_mq.messages import Messages
from spark_mq.names import choose_partition, partition_name
from spark_mq.schema import strings
from spark_mq.session.consumer import ConsumerHandle, ForwardedConsumer, Forwarder
from spark_mq.session.guard import OPEN, Guard, Verb
from spark_mq.session.principal import ANONYMOUS, Principal
from spark_mq.session.redact import redacted

log = logging.getLogger(__name__)

TEMPORARY = "tmp.*"  # what a temporary queue's name is checked as (they are tmp.<hex>)


class ClientSession:
    def __init__(
        self,
        broker: Broker,
        principal: Principal = ANONYMOUS,
        *,
        guard: Guard = OPEN,
        audit: Audit | None = None,
        reload_rules: Callable[[], tuple[bool, str]] | None = None,
        peer: str = "",
        transport: str = "",
    ) -> None:
        self.broker = broker
        self.principal = principal
        self.guard = guard
        self.audit = audit
        self._reload_rules = reload_rules
        self.peer = peer
        self.transport = transport
        self.counts: Counter[str] = Counter()  # commands taken, by kind
        self._consumers: dict[int, ConsumerSession | ForwardedConsumer] = {}
        self._producing: set[str] = set()  # destinations ``produce`` was allowed on
        self._reading: set[str] = set()  # destinations ``consume`` was allowed on, as a log
        self._groups_allowed: set[tuple[str, str]] = set()  # Kafka groups (verb, group) allowed
        self.closed = False
        # why its login no longer holds (the user was removed, or its password changed): every
        # command is refused from then on, and the transport is told (``on_revoke``, any
        # thread) so it can end the connection
        self.revoked: str | None = None
        self.on_revoke: Callable[[str], None] | None = None
        # a cluster member's, for a transport whose clients cannot follow a destination to
        # the member serving it (STOMP): what they do there is forwarded there
        self.forwarding: Forwarder | None = None
        # destinations with produces forwarded and not answered yet, how many, and where the
        # last went: the session's later produces to them are forwarded too (:meth:`_forward`)
        self._forwarded: dict[str, tuple[int, NotOwner]] = {}
        self._forwarded_lock = threading.Lock()  # (answers come on forwarding's threads)
        # for a transport whose clients do not place messages in a partitioned destination's
        # partitions (STOMP): the session places each as the SDK would
        self.places = False
        self._turn = itertools.count()  # (the round robin over partitions)
        self._check("connect")

    def __repr__(self) -> str:
        return f"ClientSession({self.principal} from {self.peer or '?'} over {self.transport})"

    # -- the hot path ------------------------------------------------------------------------
    def produce(
        self, destination: str, messages: Messages, inline: InlineCommit | None = None
    ) -> Future:
        """Store produced messages; the future resolves once they are durable."""
        if self.revoked is not None:
            raise NotAuthenticated(self.revoked)
        self._may_produce(destination)
        self.counts["produce"] += 1
        if self._forwarded and (behind := self._forwarded.get(destination)) is not None:
            return self._forward(behind[1], destination, messages)
        try:
            return self.broker.produce(destination, messages, inline)
        except NotOwner as elsewhere:
            if self.forwarding is None:
                raise
            return self._forward(elsewhere, destination, messages)
        except Partitioned as parted:
            if not self.places:
                raise
            partition = self._placed(destination, int(parted.fields["partitions"]), messages)
            return self.produce(partition, messages, inline)

    def _forward(self, owner: NotOwner, destination: str, messages: Messages) -> Future:
        """A produce forwarded to ``destination``'s owner (``owner``: where it was said to be).
        Until every one forwarded is answered, the session's later produces to it go the same
        way, in order behind them, even once it is served here: stored here at once, one would
        overtake those still on their way (forwarded while it was being placed here, or while
        its owner was gone)."""
        assert self.forwarding is not None
        with self._forwarded_lock:
            waiting, _ = self._forwarded.get(destination, (0, owner))
            self._forwarded[destination] = (waiting + 1, owner)
        fut = self.forwarding.produce(owner, destination, messages)
        fut.add_done_callback(lambda _: self._forward_answered(destination))
        return fut

    def _forward_answered(self, destination: str) -> None:
        with self._forwarded_lock:
            waiting, owner = self._forwarded[destination]
            if waiting > 1:
                self._forwarded[destination] = (waiting - 1, owner)
            else:
                del self._forwarded[destination]

    def _placed(self, destination: str, partitions: int, messages: Messages) -> str:
        """The partition of ``destination`` its messages go to: by the group id, else the
        dedup id, else in turn (:func:`~spark_mq.names.choose_partition`, as the SDK places
        them). Messages that would go to several are refused: a client that sends many at
        once places them itself (the SDK, Kafka's)."""
        keys: list[str | None]
        if messages.plain is not None:  # (their table is made once they have offsets)
            keys = [m.dedup_id for m in messages.plain]
        else:
            table = messages.table()
            keys = [None] * table.num_rows
            for column in ("dedup_id", "group_id"):  # (the group id wins)
                if column in table.column_names:
                    given = table[column].to_pylist()
                    keys = [k or was for k, was in zip(given, keys, strict=True)]
        turn = next(self._turn)
        chosen = {choose_partition(k, partitions, turn) for k in keys}
        if len(chosen) != 1:
            raise MessageRejected(
                f"{destination!r} has {partitions} partitions and these {messages.num_rows} "
                "messages go to several: send them one at a time, or name a partition",
                destination=destination,
            )
        return partition_name(destination, chosen.pop())

    def open_producer(self, destination: str) -> None:
        """A producer announces its destination (the direct wire's first frame): refused now
        rather than at its first batch, and created if it may be."""
        if self.revoked is not None:
            raise NotAuthenticated(self.revoked)
        self._may_produce(destination)
        self.broker.destination_for_use(destination)

    def open_named(
        self, destination: str, kind: Kind, settings: dict[str, Any] | None = None
    ) -> None:
        """A protocol that says whether it means a queue or a topic (STOMP's ``/queue/`` and
        ``/topic/``): the destination must be of that kind. A topic that does not exist is
        created (with ``settings``) when auto-creation is on (``create``), as STOMP brokers do;
        a queue is left to the produce or attach that follows (``destination_for_use``)."""
        if self.revoked is not None:
            raise NotAuthenticated(self.revoked)
        try:
            found = self.broker.destination_kind(destination)
        except NotOwner:
            if self.forwarding is None:
                raise
            # another member serves it (what is done with it is forwarded there): of the kind
            # recorded, or it does not exist yet (created by what follows, or not at all)
            found = self.broker.kind_elsewhere(destination)
            if found is None or found == kind:
                return
        if found == kind:
            return
        if found is not None:
            raise DestinationExists(
                f"{destination!r} is a {found}, not a {kind}: use /{found}/{destination}",
                destination=destination,
            )
        if kind == "queue":
            return
        if not self.broker.config.broker.auto_create_queues:
            raise DestinationNotFound(
                f"there is no topic {destination!r} (auto-creation is off: "
                "broker.auto_create_queues)",
                destination=destination,
            )
        self._check("create", destination)
        if self.broker.create_destination(destination, "topic", settings):
            self._audit("admin", "CreateDestination", destination, outcome="done")
            log.info("auto-created topic %s", destination, extra={"destination": destination})

    def subscribe_durable(self, destination: str, name: str, selector: str | None) -> None:
        """A consumer names a durable subscription of a topic (JMS's durable subscriber):
        ``consume`` on the topic to use one that exists; ``create`` too to make it when missing
        (it is kept after the consumer leaves, and holds every message from then on), as
        Artemis asks createDurableQueue."""
        if self.revoked is not None:
            raise NotAuthenticated(self.revoked)
        self._check("consume", destination)
        if self.broker.has_subscription(destination, name):
            return
        try:
            self.broker.destination_kind(destination)  # (here, or NotOwner: elsewhere)
        except NotOwner as elsewhere:
            if self.forwarding is None:
                raise
            self._subscribe_elsewhere(elsewhere, destination, name, selector)
            return
        self._check("create", destination)
        if self.broker.create_subscription(destination, name, selector):
            self._audit("admin", "CreateSubscription", f"{destination}/{name}", outcome="done")

    def _subscribe_elsewhere(
        self, owner: NotOwner, destination: str, name: str, selector: str | None
    ) -> None:
        """:meth:`subscribe_durable` of a topic another member serves (or one being placed),
        asked of it through the forwarding: round trips, so never on a loop thread, which
        serves many clients (``owner`` is raised there: the transport asks again on a thread
        that may wait)."""
        assert self.forwarding is not None
        if not serving_threads.may_wait():
            raise owner
        if self.forwarding.has_subscription(owner, destination, name):
            return
        self._check("create", destination)
        if self.forwarding.create_subscription(owner, destination, name, selector):
            self._audit("admin", "CreateSubscription", f"{destination}/{name}", outcome="done")

    def unsubscribe_durable(self, destination: str, name: str) -> None:
        """Remove a durable subscription its consumer asks to end (JMS's ``unsubscribe``):
        ``admin`` on the topic, as removing any subscription (it may be someone else's)."""
        self._check("admin", destination)
        try:
            self.broker.delete_subscription(destination, name)
        except NotOwner as elsewhere:
            # (a round trip, never on a loop: see _subscribe_elsewhere)
            if self.forwarding is None or not serving_threads.may_wait():
                raise
            self.forwarding.delete_subscription(elsewhere, destination, name)
        self._audit("admin", "DeleteSubscription", f"{destination}/{name}", outcome="done")

    def produce_may_wait(self, destination: str) -> bool:
        """Whether a produce to ``destination`` may have to wait for room (a ``block``
        overflow policy with limits, or the memory past green): the caller should not make it
        on a thread that serves others."""
        return self.broker.limits.may_wait(destination)

    def attach(self, cmd: c.Attach, wakeup: Wakeup | None = None) -> ConsumerHandle:
        """Attach a consumer; it lives until :meth:`detach` or :meth:`close`."""
        if self.revoked is not None:
            raise NotAuthenticated(self.revoked)
        consumer: ConsumerSession | ForwardedConsumer
        if cmd.temporary:
            self._check("create", TEMPORARY)
            consumer = self.broker.attach_temporary(cmd.prefetch, wakeup=wakeup)
        else:
            self._check("consume", cmd.destination)
            self._check_creating(cmd.destination)
            try:
                consumer = self.broker.attach(
                    cmd.destination,
                    cmd.subscription,
                    cmd.prefetch,
                    selector=cmd.selector,
                    durable=cmd.durable,
                    wakeup=wakeup,
                )
            except NotOwner as elsewhere:
                if self.forwarding is None:
                    raise
                consumer = self.forwarding.attach(elsewhere, cmd, wakeup)
        self.counts["attach"] += 1
        self._consumers[consumer.consumer_id] = consumer
        if self.closed:  # (attached on a helper thread as the connection ended)
            self.detach(consumer)
            raise BrokerUnavailable("the connection ended while its consumer was attached")
        return consumer

    # -- reading a destination as a log (Kafka's fetch): ``consume``, as Kafka's Read ----------
    def kind(self, destination: str) -> Kind | None:
        """Whether ``destination`` is a queue or a topic (None: there is none); a destination it
        may not use at all is refused (NotAuthorized), existing or not."""
        if self.revoked is not None:
            raise NotAuthenticated(self.revoked)
        if not self.may_see(destination):
            self._check("consume", destination)  # (raises, audited)
        return self.broker.destination_kind(destination)

    def partitions(self, destination: str, *, fresh: bool = False) -> int:
        """How many partitions ``destination`` has (1: none, or no such destination); what a
        protocol that names partitions (Kafka) maps them with. Asked after the access checks
        of what it is for. ``fresh``: read from the bindings log now (not on a loop), not the
        count held (read up to ``PARTITIONS_REREAD_S`` ago)."""
        return int(self.broker.partitions(destination, fresh=fresh)["partitions"])

    def newest_dedup_number(self, destination: str, prefix: str) -> int | None:
        """The number of the newest dedup id ``<prefix>-<n>`` stored in ``destination`` (as far
        as its duplicate cache reaches; None: none): where a producer numbering its ids got
        to. Asked by a producer of it (quick: the loops may ask)."""
        self._may_produce(destination)
        return self.broker.newest_dedup_number(destination, prefix)

    def log_end(self, destination: str) -> int:
        """One past its last durable offset (quick: the loops may ask)."""
        self._may_read(destination)
        return self.broker.log.end(destination)

    def read_log(self, destination: str, start: int, end: int) -> pa.Table:
        """Its messages ``start <= offset < end``, read as a log: nothing is leased or settled.
        Older ones come from Delta: call it off the loops."""
        self._may_read(destination)
        self.counts["read_log"] += 1
        return self.broker.log.read(destination, start, end)

    def read_log_recent(self, destination: str, start: int, end: int) -> pa.Table | None:
        """As :meth:`read_log`, when the messages are all still in memory (quick enough for a
        loop: the tail a waiting reader was woken for); else None."""
        self._may_read(destination)
        rows = self.broker.log.read_recent(destination, start, end)
        if rows is not None:
            self.counts["read_log"] += 1
        return rows

    def offset_at(self, destination: str, time_us: int) -> int | None:
        """The first offset enqueued at or after ``time_us`` (a read: off the loops)."""
        self._may_read(destination)
        return self.broker.log.offset_at(destination, time_us)

    def watch_log(self, destination: str, wake: Callable[[], None]) -> Callable[[], None]:
        """``wake()`` (on the committing thread) after each commit of messages to
        ``destination``; returns the function that stops it."""
        self._may_read(destination)
        return self.broker.log.watch(destination, wake)

    # -- Kafka consumer groups' committed offsets: ``consume`` on each topic -----------------
    def commit_offsets(self, group: str, entries: list[tuple[str, int, int, str | None]]) -> Future:
        """Commit ``(topic, partition, offset, metadata)`` for consumer group ``group``; the
        future resolves once durable."""
        self.check_group("consume", group)
        for topic in {e[0] for e in entries}:
            self._may_read(topic)
        self.counts["commit_offsets"] += 1
        return self.broker.group_offsets.commit(group, entries)

    def commit_kafka_transaction(
        self,
        messages: pa.Table | None,
        offsets: dict[str, list[tuple[str, int, int, str | None]]],
    ) -> dict[str, list[int]]:
        """A Kafka producer's transaction: its records (``messages``: a ``destination`` column
        and produce columns) and the consumer groups' offsets it sent (``group -> [(topic,
        partition, offset, metadata)]``), committed as one broker transaction, all or nothing
        (blocking: a helper thread's). ``produce`` on each destination, ``consume`` on each
        group and on each topic whose offsets it commits."""
        for dest in _destinations_of(messages):
            self._may_produce(dest)
        for group, entries in offsets.items():
            self.check_group("consume", group)
            for topic in {e[0] for e in entries}:
                self._may_read(topic)
        self.counts["commit_kafka_transaction"] += 1
        b = self.broker

        def commit(rows: pa.Table | None) -> dict[str, list[int]]:
            parts = [t for t in (messages, rows) if t is not None and t.num_rows]
            if not parts:
                return {}
            table = (
                parts[0] if len(parts) == 1 else pa.concat_tables(parts, promote_options="default")
            )
            return b.commit_transaction([], table, here=True)  # (its client cannot follow)

        return b.group_offsets.commit_with(offsets, commit)

    def committed_offsets(self, group: str) -> dict[tuple[str, int], tuple[int, str | None]]:
        """``group``'s committed offsets of the topics it may consume (a read: off the loops
        the first time after a start)."""
        self.check_group("consume", group)
        out = {}
        for key, done in self.broker.group_offsets.fetch(group).items():
            if self.guard.allows(self.principal, "consume", key[0]):
                out[key] = (done.offset, done.metadata)
        return out

    def may_consume(self, destination: str) -> bool:
        """Whether it may consume ``destination`` (asked, not audited)."""
        return self.revoked is None and self.guard.allows(self.principal, "consume", destination)

    def may_administer(self, destination: str) -> bool:
        """Whether it may administer ``destination`` (asked, not audited)."""
        return self.revoked is None and self.guard.allows(self.principal, "admin", destination)

    def may_administer_broker(self) -> bool:
        """Whether it is the broker's admin (``admin`` over every destination; asked, not
        audited)."""
        return self.revoked is None and self.guard.allows(self.principal, "admin")

    def check_broker_admin(self) -> None:
        """Return if it is the broker's admin; else ``NotAuthorized`` (audited)."""
        if self.revoked is not None:
            raise NotAuthenticated(self.revoked)
        self._check("admin")

    def audit_admin(self, what: str, target: str, detail: str = "") -> None:
        """An admin action done by a transport (as the session's own are audited)."""
        self._audit("admin", what, target, outcome="done", detail=detail)

    def delete_offsets(self, group: str, keys: list[tuple[str, int]] | None = None) -> Future:
        """Delete ``group``'s committed offsets of ``keys`` (``(topic, partition)``; ``None``:
        all of them): ``admin`` on the group. The future resolves once the deletion is
        durable."""
        self.check_group("admin", group)
        if keys is None:
            keys = list(self.broker.group_offsets.fetch(group))
        if not keys:
            done: Future = Future()
            done.set_result(None)
            return done
        self.counts["delete_offsets"] += 1
        return self.broker.group_offsets.commit(group, [(t, p, -1, None) for t, p in keys])

    def offsets_placed(self) -> None:
        """(A cluster member's Kafka listener, asked for the groups' coordinator before any
        member had it.) The groups' offsets topic created, to be placed on a member, which
        coordinates the groups from then on; its owner loads it. Nothing to say to the
        client: it asks again."""
        if self.revoked is not None:
            raise NotAuthenticated(self.revoked)
        with contextlib.suppress(SparkMQError):  # (served elsewhere, or being placed)
            self.broker.group_offsets.groups()

    def keep_group_membership(self, group: str, membership: dict[str, object] | None) -> Future:
        """(A cluster member's Kafka listener, coordinating.) Keep ``group``'s membership as it
        became stable (None: empty now) beside its offsets, so the member coordinating after
        a move carries on with it: ``consume`` on the group."""
        self.check_group("consume", group)
        return self.broker.group_offsets.keep_membership(group, membership)

    def group_memberships(self) -> tuple[int, dict[str, dict[str, object]]]:
        """(A cluster member's Kafka listener, now coordinating.) The groups' memberships as
        kept, and the term they were read in (a read: off the loops)."""
        if self.revoked is not None:
            raise NotAuthenticated(self.revoked)
        return self.broker.group_offsets.memberships()

    def groups_term(self) -> int:
        """How many times the groups' offsets were let go here (a cluster member's): a Kafka
        listener reads the memberships again when it changed."""
        return self.broker.group_offsets.term

    def offset_groups(self) -> list[str]:
        """The consumer groups that committed offsets (those it may use)."""
        if self.revoked is not None:
            raise NotAuthenticated(self.revoked)
        return [g for g in self.broker.group_offsets.groups() if self.may_group("consume", g)]

    # -- Kafka's consumer and share groups: ``consume`` uses one, ``admin`` deletes it ----------
    def check_group(self, verb: Verb, group: str) -> None:
        """Return if it may do ``verb`` on the Kafka group ``group``; else ``NotAuthorized``
        (audited, as every refusal)."""
        if self.revoked is not None:
            raise NotAuthenticated(self.revoked)
        if (verb, group) in self._groups_allowed:  # (the guard is asked once a group and verb)
            return
        if not self.guard.allows_group(self.principal, verb, group):
            where = f"group {group!r}"
            self._audit("denied", verb, where, detail="no rule allows it")
            raise NotAuthorized(
                f"{self.principal.name!r} may not {verb} the {where}: no rule allows it",
                verb=verb,
                destination=where,
                principal=self.principal.name,
            )
        self._groups_allowed.add((verb, group))

    def may_group(self, verb: Verb, group: str) -> bool:
        """Whether it may do ``verb`` on the Kafka group ``group`` (asked, not audited)."""
        return self.revoked is None and self.guard.allows_group(self.principal, verb, group)

    def _may_read(self, destination: str) -> None:
        if self.revoked is not None:
            raise NotAuthenticated(self.revoked)
        if destination not in self._reading:  # (the guard is asked once a destination)
            self._check("consume", destination)
            self._reading.add(destination)

    def settle(
        self, consumer: ConsumerHandle, cmd: c.Settle, inline: InlineCommit | None = None
    ) -> None:
        """Settle deliveries of a consumer of this session; the reply reaches its outbox."""
        if self.revoked is not None:
            raise NotAuthenticated(self.revoked)
        self.counts["settle"] += 1
        self._own(consumer).settle(cmd, inline)

    def detach(self, consumer: ConsumerHandle) -> None:
        """The consumer leaves: what it held unsettled goes back."""
        own = self._consumers.pop(consumer.consumer_id, None)
        if isinstance(own, ConsumerSession):
            self.broker.detach(own)
        elif own is not None:
            own.close()

    def _own(self, consumer: ConsumerHandle) -> ConsumerSession | ForwardedConsumer:
        """The broker's consumer behind a handle this session gave (only its own)."""
        own = self._consumers.get(consumer.consumer_id)
        if own is None or own is not consumer:
            raise ProtocolError(
                f"consumer {consumer.consumer_id} is not attached through this session",
                fault="remote",
            )
        return own

    def revoke(self, reason: str) -> None:
        """(Any thread.) Its principal's login no longer holds: refuse every command from now
        on, say so in the audit log, and tell the transport (which ends the connection)."""
        if self.revoked is not None or self.closed:
            return
        self.revoked = reason
        self._audit("session_revoked", "connect", None, detail=reason)
        log.warning("ending %r: %s", self, reason)
        on_revoke = self.on_revoke
        if on_revoke is not None:
            on_revoke(reason)

    def close(self) -> None:
        """The connection ended: every consumer it attached is detached."""
        if self.closed:
            return
        self.closed = True
        for consumer in list(self._consumers.values()):
            self.detach(consumer)

    # -- everything else ---------------------------------------------------------------------
    def execute(self, cmd: c.Command, elsewhere: Callable[[NotOwner], Any] | None = None) -> Any:
        """Authorize ``cmd`` and carry it out; returns what the broker answers. Admin commands
        are audited, done or failed (not where another member serves the destination: there
        it is audited when done). ``elsewhere``: what does it there, once authorized here
        (a cluster member's forwarding, for a protocol whose clients cannot be sent there),
        and its answer is this one's."""
        if self.revoked is not None:
            raise NotAuthenticated(self.revoked)
        self.counts[type(cmd).__name__] += 1
        if self.audit is None or not isinstance(cmd, _AUDITED):
            return self._execute_or(cmd, elsewhere)
        what = type(cmd).__name__
        target = getattr(cmd, "destination", None) or getattr(cmd, "name", None)
        try:
            result = self._execute_or(cmd, elsewhere)
        except SparkMQError as exc:
            # (a refusal is audited as one already; a NotOwner is no outcome)
            if not isinstance(exc, NotAuthorized | NotOwner):
                self._audit("admin", what, target, outcome="failed", detail=exc.message)
            raise
        self._audit("admin", what, target, outcome="done")
        log.info(
            "%s %s by %s over %s",
            what,
            target or "",
            self.principal,
            self.transport or "?",
            extra={"principal": self.principal.name, "destination": target},
        )
        return result

    def _execute_or(self, cmd: c.Command, elsewhere: Callable[[NotOwner], Any] | None) -> Any:
        try:
            return self._execute(cmd)
        except NotOwner as owner:
            if elsewhere is None:
                raise
            return elsewhere(owner)

    def _execute(self, cmd: c.Command) -> Any:
        b = self.broker
        match cmd:
            case c.Ping():
                return b.ha_state()  # (its role and epoch: which of a pair serves)
            case c.HandOver():
                self._check("admin")
                return b.hand_over()
            case c.PinDestination(name=name, member=member):
                self._check("admin")
                return b.pin(name, member)
            case c.BrokerStatus():
                status = b.status()
                if not self.guard.allows(self.principal, "admin"):  # (not the broker's admin)
                    status.pop("data_dir", None)
                return status
            case c.ShowConfig():
                self._check("admin")
                return redacted(b.config.model_dump(mode="json"))
            case c.Move(source=source, target=target):
                self._check("admin", source)
                if target is not None:
                    self._may_produce(target)
                return b.moves.move(
                    source, target, subscription=cmd.subscription, limit=cmd.limit,
                    selector=cmd.selector, may_send=self._may_produce,
                )  # fmt: skip
            case c.ReloadSecurity():
                self._check("admin")
                if self._reload_rules is None:
                    return False, "security is off: there are no access rules to reload"
                return self._reload_rules()
            case c.CreateDestination(name=name, kind=kind, settings=settings):
                self._check("create", name)
                return b.create_destination(name, kind, settings)
            case c.ConfigureDestination(name=name, settings=settings):
                self._check("admin", name)
                return b.configure_destination(name, settings)
            case c.AddPartitions(name=name, partitions=count):
                self._check("admin", name)
                return b.add_partitions(name, count)
            case c.DeleteDestination(name=name):
                self._check("admin", name)
                b.delete_destination(name)
                return None
            case c.ListDestinations():
                return [d for d in b.list_destinations() if self.may_see(d["name"])]
            case c.CreateSubscription(destination=dest, name=name, selector=selector):
                self._check("admin", dest)
                return b.create_subscription(dest, name, selector)
            case c.DeleteSubscription(destination=dest, name=name):
                self._check("admin", dest)
                b.delete_subscription(dest, name)
                return None
            case c.Purge(name=name, subscription=sub):
                self._check("admin", name)
                return b.purge(name, sub)
            case c.Stats(name=name):
                # an admin's, and a consumer's of what it consumes (its depth and end offset:
                # what the Spark source's Trigger.AvailableNow reads), as Kafka's Read implies
                # Describe
                if not self.guard.allows(self.principal, "consume", name):
                    self._check("admin", name)
                return b.stats(name)
            case c.Partitions(name=name, use=use):
                if not self.may_see(name):  # (refused in the terms of what it meant to do)
                    self._check(next((v for v in _USES if v == use), "produce"), name)
                return b.partitions(name, fresh=True)  # (a Flight thread: it may read)
            case c.Browse():
                self._check("browse", cmd.destination)
                return b.browse(
                    cmd.destination, cmd.subscription, limit=cmd.limit, selector=cmd.selector
                )
            case c.Claim():
                self._check("consume", cmd.destination)
                return b.claims.claim(
                    cmd.destination, cmd.subscription, cmd.consumer, cmd.number, cmd.limit,
                    cmd.below,
                )  # fmt: skip
            case c.ClaimedRows():
                self._check("consume", cmd.destination)
                return b.claims.rows(cmd.destination, cmd.subscription, cmd.consumer, cmd.number)
            case c.AckClaims():
                self._check("consume", cmd.destination)
                return b.claims.ack(cmd.destination, cmd.subscription, cmd.consumer, cmd.upto)
            case c.ReleaseClaims():
                self._check("admin", cmd.destination)
                return b.claims.release(cmd.destination, cmd.subscription, cmd.consumer)
            case c.CommitTransaction(acks=acks, messages=messages, here=here):
                for dest in _destinations_of(messages):
                    self._may_produce(dest)
                for dest in sorted({a[0] for a in acks}):
                    self._check("consume", dest)
                return b.commit_transaction(list(acks), messages, here=here)
        raise TypeError(f"not a command: {cmd!r}")

    # -- authorization -----------------------------------------------------------------------
    def may_see(self, destination: str) -> bool:
        """Whether it may do anything with ``destination`` (what listings and metrics show)."""
        return any(self.guard.allows(self.principal, v, destination) for v in _USES)

    def _check(self, verb: Verb, destination: str | None = None) -> None:
        try:
            self.guard.check(self.principal, verb, destination)
        except NotAuthorized as exc:
            self._audit("denied", verb, destination, detail=exc.message)
            raise

    def _audit(
        self, event: str, verb: str, destination: str | None, *, outcome: str = "", detail: str = ""
    ) -> None:
        if self.audit is not None:
            self.audit.event(
                event,
                principal=self.principal.name,
                verb=verb,
                destination=destination,
                peer=self.peer,
                transport=self.transport,
                outcome=outcome,
                detail=detail,
            )

    def _may_produce(self, destination: str) -> None:
        if destination not in self._producing:  # (the guard is asked once a destination)
            self._check("produce", destination)
            self._producing.add(destination)
        self._check_creating(destination)

    def _check_creating(self, destination: str) -> None:
        """Using a destination that does not exist creates it (auto-creation): ``create``."""
        if self.guard is not OPEN and not self.broker.has_destination(destination):
            self._check("create", destination)


# the commands the audit log records (every admin action)
_AUDITED = (
    c.ReloadSecurity,
    c.HandOver,
    c.PinDestination,
    c.CreateDestination,
    c.ConfigureDestination,
    c.AddPartitions,
    c.DeleteDestination,
    c.CreateSubscription,
    c.DeleteSubscription,
    c.Purge,
    c.Move,
    c.ReleaseClaims,
)


class Audit(Protocol):
    def event(
        self,
        event: str,
        *,
        principal: str | None = None,
        verb: str | None = None,
        destination: str | None = None,
        peer: str = "",
        transport: str = "",
        detail: str = "",
        outcome: str = "",
    ) -> None: ...


# the verbs that make a destination visible in a listing
_USES: tuple[Verb, ...] = ("produce", "consume", "browse", "create", "admin")


def _destinations_of(messages: pa.Table | None) -> list[str]:
    if messages is None or messages.num_rows == 0:
        return []
    return sorted(strings(pc.unique(messages["destination"])))
