"""Kafka's share groups (KIP-932, "queues for Kafka"): each record to one member of the group,
acquired for a while, then accepted, released or rejected, on sparkmq's queues.

A share group's consumption is a sparkmq consumer: of the **queue** itself, or of a **topic**'s
durable subscription ``kafka-share.<group>`` (made at first use, needing ``create``; every share
group of a topic gets every message once). What Kafka calls acquiring is sparkmq's lease
(``acquisition_lock_timeout_ms`` is the lease), the delivery count is sparkmq's, and the
acknowledgement types are settle verbs:

====================  ==========================================================
ACCEPT                ack
RELEASE               nack: redelivered, counted towards dead-lettering
REJECT                dead-lettered at once (``DLQ.<name>``, or as configured)
RENEW                 the lease extended
====================  ==========================================================

Message groups and selectors hold as for any consumer: a key (the message group) is with one
member at a time, in order.

Membership (ShareGroupHeartbeat) is the groups' coordinator's, on its listener's loop: one
broker, or the cluster member serving the groups' offsets (another answers NOT_COORDINATOR, and
when the offsets move the members join the new coordinator afresh). Every member is assigned
every partition of every topic it subscribes to (a share group's members share partitions; a
partitioned destination's are ``<topic>~<i>``, partition 0 of any other). The consumers are the
connection's: ShareFetch attaches one per group and partition through the connection's
session, on the partition's leader (its owner, in a cluster), and the connection's end detaches
them (what they held goes back). A partition served by another member, or moved away since, is
answered NOT_LEADER_OR_FOLLOWER naming its leader (KIP-951): the client fetches there, and what
it had acquired here comes again.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from spark_mq import commands as c
from spark_mq.errors import NotOwner, SparkMQError
from spark_mq.names import KAFKA_OFFSETS, partition_name
from spark_mq.schema import ints
from spark_mq.session import ClientSession, ConsumerHandle
from spark_mq.transports.kafka import codec
from spark_mq.transports.kafka.codec import ErrorCode, Request, build
from spark_mq.transports.kafka.link import (
    KafkaLink,
    TopicNames,
    current_leader,
    error_code,
    group_refused,
    message_of,
    node_endpoints,
    topic_id,
)
from spark_mq.transports.kafka.records import record_batch

log = logging.getLogger(__name__)

_ZERO = timedelta(0)
HEARTBEAT_S = 1.0  # a share member's heartbeat interval, as told to it
SESSION_S = 15.0  # a member not heard from this long is out of its share group
_VERBS = {1: "ack", 2: "nack", 3: "reject", 4: "extend"}  # Kafka's acknowledge types (0: gap)
SHARE_PREFIX = "kafka-share."


@dataclass(eq=False)
class ShareMember:
    id: str
    epoch: int
    topics: list[str]
    last_heard: float
    client_id: str = ""
    host: str = ""


@dataclass(eq=False)
class ShareGroup:
    id: str
    members: dict[str, ShareMember] = field(default_factory=dict)
    epoch: int = 0


class ShareGroups:
    """Share groups' members (the listener's loop: no locks)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self.groups: dict[str, ShareGroup] = {}

    def heartbeat(
        self,
        group_id: str,
        member_id: str,
        epoch: int,
        topics: list[str] | None,
        *,
        client_id: str = "",
        host: str = "",
    ) -> tuple[ErrorCode, ShareMember | None]:
        g = self.groups.setdefault(group_id, ShareGroup(group_id))
        member_id = member_id or str(uuid.uuid4())
        now = self.clock()
        if epoch == -1:  # leaving
            g.members.pop(member_id, None)
            return ErrorCode.none, ShareMember(member_id, -1, [], now)
        member = g.members.get(member_id)
        if epoch == 0:
            if member is None:
                g.epoch += 1
                member = ShareMember(member_id, g.epoch, list(topics or []), now, client_id, host)
                g.members[member_id] = member
                log.info("kafka: %s joins share group %s", member_id, group_id)
        elif member is None:
            return ErrorCode.unknown_member_id, None
        elif epoch != member.epoch:
            return ErrorCode.fenced_member_epoch, None
        if topics is not None and topics != member.topics:
            member.topics = list(topics)
            g.epoch += 1
            member.epoch = g.epoch
        member.last_heard = now
        return ErrorCode.none, member

    def sweep(self) -> None:
        now = self.clock()
        for g in self.groups.values():
            for m in [m for m in g.members.values() if now - m.last_heard > SESSION_S]:
                del g.members[m.id]
                log.info("kafka: %s is out of share group %s: not heard from", m.id, g.id)


_Got = tuple[bytes, list[tuple[int, int, int]]]  # a partition's batch, its acquired ranges
_Part = tuple[Any, int]  # (topic id, partition index)


@dataclass(eq=False)
class _Consumer:
    group: str
    topic: str
    handle: ConsumerHandle
    counts: dict[int, int] = field(default_factory=dict)  # offset acquired -> delivery count


@dataclass(eq=False)
class _Waiting:
    request: Request
    slot: Any
    deadline: float
    max_records: int
    max_bytes: int
    asked: list[tuple[Any, int, str]]  # (topic id, partition, topic name | "" unknown)
    errors: dict[_Part, ErrorCode]
    timer: Any = None
    done: bool = False


class ShareRequests:
    """A connection's share-group requests (ShareGroupHeartbeat, ShareFetch,
    ShareAcknowledge)."""

    def __init__(
        self, link: KafkaLink, session: ClientSession, groups: ShareGroups, names: TopicNames
    ) -> None:
        self.link = link
        self.session = session
        self.names = names
        self.groups = groups
        self.consumers: dict[tuple[str, str], _Consumer] = {}
        self.waiting: list[_Waiting] = []
        # each share session's partitions, with their topics' names
        self.sessions: dict[tuple[str, str], dict[_Part, str]] = {}
        self._requests = iter(range(1, 1 << 62))
        self._wake_due = False

    def handlers(self) -> dict[int, Callable[[Request, Any], None]]:
        return {
            codec.SHARE_GROUP_HEARTBEAT: self._heartbeat,
            codec.SHARE_FETCH: self._fetch,
            codec.SHARE_ACKNOWLEDGE: self._acknowledge,
            codec.SHARE_GROUP_DESCRIBE: self._describe,
        }

    def close(self) -> None:
        for w in self.waiting:
            if w.timer is not None:
                w.timer.cancel()
        self.waiting.clear()
        for consumer in self.consumers.values():
            self.session.detach(consumer.handle)
        self.consumers.clear()

    # -- topic ids -----------------------------------------------------------------------------
    def _name_of(self, tid: Any) -> str:
        return self.names.of(tid) or ""

    # -- ShareGroupHeartbeat -------------------------------------------------------------------
    def _heartbeat(self, r: Request, slot: Any) -> None:
        body = r.body
        mod = codec.response_module(r.api_key, r.version)
        topics = list(body.subscribed_topic_names) if body.subscribed_topic_names else None
        member: Any = None
        if self._refused(body.group_id):
            err = ErrorCode.group_authorization_failed
        elif not self.link.nodes.coordinating():
            err = ErrorCode.not_coordinator  # (a cluster member: the client asks who is)
        else:
            err, member = self.groups.heartbeat(
                body.group_id,
                body.member_id,
                body.member_epoch,
                topics,
                client_id=r.client_id or "",
                host=self.link.peer,
            )
        assignment = None
        if member is not None and member.epoch >= 0:
            parts = []
            for name in member.topics:
                try:
                    if self._exists(name):
                        parts.append(
                            build(
                                mod,
                                "TopicPartitions",
                                topic_id=topic_id(name),
                                partitions=self._partitions(name),
                            )
                        )
                except SparkMQError:
                    continue  # (not its to see: not assigned)
            assignment = build(mod, "Assignment", topic_partitions=tuple(parts))
        self.link.answer(
            slot,
            build(
                mod,
                "ShareGroupHeartbeatResponse",
                throttle_time=_ZERO,
                error_code=err,
                error_message=None,
                member_id=member.id if member is not None else body.member_id,
                member_epoch=member.epoch if member is not None else -1,
                heartbeat_interval=timedelta(seconds=HEARTBEAT_S),
                assignment=assignment,
            ),
        )

    def _refused(self, group: str) -> bool:
        return group_refused(self.session, group, "consume")

    def _exists(self, name: str) -> bool:
        """Whether topic ``name`` is there to share (NotAuthorized: not its to see)."""
        if name == KAFKA_OFFSETS:
            return False
        try:
            return self.session.kind(name) is not None
        except NotOwner:
            return True  # (a cluster's, served by another member)

    def _partitions(self, name: str) -> tuple[int, ...]:
        """Topic ``name``'s partition indexes (every member of a share group has them all)."""
        return tuple(range(self.session.partitions(name)))

    def _destination(self, name: str, index: int) -> str:
        """The destination partition ``index`` of topic ``name`` is (UnknownPartition: none)."""
        n = self.session.partitions(name)
        if not 0 <= index < n:
            raise _UnknownPartition(f"{name!r} has no partition {index}")
        return partition_name(name, index) if n > 1 else name

    # -- ShareGroupDescribe (kafka-share-groups.sh --describe, the admin clients) ----------------
    def _describe(self, r: Request, slot: Any) -> None:
        mod = codec.response_module(r.api_key, r.version)
        out = []
        for group_id in r.body.group_ids:
            g = self.groups.groups.get(group_id)
            err, message = ErrorCode.none, None
            if self._refused(group_id):
                err = ErrorCode.group_authorization_failed
            elif not self.link.nodes.coordinating():
                err, message = ErrorCode.not_coordinator, "another member coordinates groups"
            elif g is None:
                err, message = ErrorCode.group_id_not_found, f"no share group {group_id!r}"
            members = ()
            if err is ErrorCode.none and g is not None:
                members = tuple(
                    build(
                        mod,
                        "Member",
                        member_id=m.id,
                        rack_id=None,
                        member_epoch=m.epoch,
                        client_id=m.client_id,
                        client_host=m.host,
                        subscribed_topic_names=tuple(m.topics),
                        assignment=build(
                            mod,
                            "Assignment",
                            topic_partitions=tuple(
                                build(
                                    mod,
                                    "TopicPartitions",
                                    topic_id=topic_id(t),
                                    topic_name=t,
                                    partitions=self._partitions(t),
                                )
                                for t in m.topics
                                if self.session.may_consume(t)
                            ),
                        ),
                    )
                    for m in g.members.values()
                )
            out.append(
                build(
                    mod,
                    "DescribedGroup",
                    error_code=err,
                    error_message=message,
                    group_id=group_id,
                    group_state=("Stable" if g.members else "Empty") if g is not None else "Dead",
                    group_epoch=g.epoch if g is not None else -1,
                    assignment_epoch=g.epoch if g is not None else -1,
                    assignor_name="simple",
                    members=members,
                    authorized_operations=-(2**31),
                )
            )
        self.link.answer(
            slot, build(mod, "ShareGroupDescribeResponse", throttle_time=_ZERO, groups=tuple(out))
        )

    # -- ShareFetch ----------------------------------------------------------------------------
    def _fetch(self, r: Request, slot: Any) -> None:
        body = r.body
        errors: dict[Any, ErrorCode] = {}
        # a share session: the first fetch (epoch 0) names its topics, later ones only what
        # changed (added topics, forgotten ones)
        key = (body.group_id, body.member_id or "")
        if self._refused(body.group_id):
            asked = [
                (t.topic_id, p.partition_index, self._name_of(t.topic_id))
                for t in body.topics
                for p in t.partitions
            ]
            refused = {(tid, i): ErrorCode.group_authorization_failed for tid, i, _ in asked}
            self._answer(_Waiting(r, slot, 0.0, 1, 1, asked, refused), {})
            return
        in_session = {} if body.share_session_epoch == 0 else dict(self.sessions.get(key, {}))
        for t in body.topics:
            name = self._name_of(t.topic_id)
            for p in t.partitions:
                in_session[(t.topic_id, p.partition_index)] = name
                if p.acknowledgement_batches and name:
                    self._settle(body.group_id, name, p.partition_index, p.acknowledgement_batches)
        for t in body.forgotten_topics_data:
            for part in [k for k in in_session if k[0] == t.topic_id]:
                if not t.partitions or part[1] in t.partitions:
                    del in_session[part]
        if body.share_session_epoch == -1:  # the session ends: what it acquired goes back
            self.sessions.pop(key, None)
            in_session = {}
            for k in [k for k in self.consumers if k[0] == body.group_id]:
                self.session.detach(self.consumers.pop(k).handle)
        else:
            self.sessions[key] = in_session
        asked = [(tid, index, name) for (tid, index), name in in_session.items()]
        wait = body.max_wait.total_seconds() if isinstance(body.max_wait, timedelta) else 0.0
        w = _Waiting(
            r,
            slot,
            time.monotonic() + max(wait, 0.0),
            max(body.max_records, 1),
            max(body.max_bytes, 1),
            asked,
            errors,
        )
        self._step(w)

    def _consumer(self, group: str, name: str, index: int, max_records: int) -> _Consumer:
        """The group's consumer of partition ``index`` of topic ``name`` (attached now when
        this connection has none)."""
        destination = self._destination(name, index)
        key = (group, destination)
        consumer = self.consumers.get(key)
        if consumer is not None and consumer.handle.closed:
            # (its partition moved to another member: what it acquired is to come again
            # there; attached anew, the client is told where, or served once it is back)
            self.session.detach(self.consumers.pop(key).handle)
            consumer = None
        if consumer is None:
            kind = self.session.kind(destination)
            subscription = None
            if kind == "topic":
                subscription = f"{SHARE_PREFIX}{group}"
                self.session.subscribe_durable(destination, subscription, None)
            handle = self.session.attach(
                c.Attach(destination, subscription=subscription, prefetch=max(max_records, 100)),
                wakeup=self,
            )
            consumer = self.consumers[key] = _Consumer(group, destination, handle)
        return consumer

    def _step(self, w: _Waiting) -> None:
        if w.done:
            return
        group = w.request.body.group_id
        got: dict[Any, _Got] = {}
        left = w.max_records
        budget = w.max_bytes
        for tid, index, name in w.asked:
            part = (tid, index)
            if not name:
                w.errors[part] = ErrorCode.unknown_topic_id
                continue
            if part in w.errors or left <= 0:
                continue
            try:
                consumer = self._consumer(group, name, index, w.max_records)
                taken = consumer.handle.next_leased()
            except _UnknownPartition:
                w.errors[part] = ErrorCode.unknown_topic_or_partition
                continue
            except SparkMQError as exc:
                if not isinstance(exc, NotOwner):  # (a cluster's other member's: said below)
                    log.info("kafka: share fetch of %s for %s: %s", name, group, message_of(exc))
                w.errors[part] = error_code(exc)
                continue
            if taken is None:
                continue
            messages, states = taken
            rows = messages.table()
            offsets = ints(rows["offset"])
            for o, (count, _) in zip(offsets, states, strict=True):
                consumer.counts[o] = count
            data, n = record_batch(rows, max(budget, 1))
            if n < rows.num_rows:  # (what did not fit goes back at once)
                back = [(o, consumer.counts.pop(o)) for o in offsets[n:]]
                self._settle_entries(consumer, "nack", back)
            ranges = _ranges([(o, states[i][0]) for i, o in enumerate(offsets[:n])])
            got[part] = (data, ranges)
            left -= n
            budget -= len(data)
        if got or w.errors or time.monotonic() >= w.deadline:
            self._answer(w, got)
            return
        if w not in self.waiting:
            self.waiting.append(w)
            w.timer = self.link.loop.call_later(
                max(w.deadline - time.monotonic(), 0.0), self._step, w
            )

    def _answer(self, w: _Waiting, got: dict[_Part, _Got]) -> None:
        w.done = True
        if w in self.waiting:
            self.waiting.remove(w)
        if w.timer is not None:
            w.timer.cancel()
        r = w.request
        mod = codec.response_module(r.api_key, r.version)
        leaders: set[int] = set()
        lease_ms = 30_000
        for consumer in self.consumers.values():
            lease_ms = int(consumer.handle.lease_s * 1000)
            break
        by_topic: dict[Any, list[Any]] = {}
        for tid, index, name in w.asked:
            data, ranges = got.get((tid, index), (b"", []))
            part = build(
                mod,
                "PartitionData",
                partition_index=index,
                error_code=w.errors.get((tid, index), ErrorCode.none),
                error_message=None,
                acknowledge_error_code=0,
                acknowledge_error_message=None,
                current_leader=self._leader(mod, name, index, leaders),
                records=data,
                acquired_records=tuple(
                    build(mod, "AcquiredRecords", first_offset=a, last_offset=b, delivery_count=n)
                    for a, b, n in ranges
                ),
            )
            by_topic.setdefault(tid, []).append(part)
        responses = [
            build(mod, "ShareFetchableTopicResponse", topic_id=tid, partitions=tuple(parts))
            for tid, parts in by_topic.items()
        ]
        self.link.answer(
            w.slot,
            build(
                mod,
                "ShareFetchResponse",
                throttle_time=_ZERO,
                error_code=ErrorCode.none,
                error_message=None,
                acquisition_lock_timeout=timedelta(milliseconds=lease_ms),
                responses=tuple(responses),
                node_endpoints=self._endpoints(mod, leaders),
            ),
        )

    def _leader(self, mod: Any, name: str, index: int, named: set[int]) -> Any:
        """Partition ``index`` of topic ``name``'s leader and its epoch, as an answer names it
        (what a client not led here follows, KIP-951); its node is added to ``named``."""
        led = None
        if name:
            try:
                led = self.link.nodes.leader(self._destination(name, index))
            except (_UnknownPartition, SparkMQError):
                led = None  # (none known: the client asks Metadata)
        return current_leader(mod, led, named)

    def _endpoints(self, mod: Any, named: set[int]) -> tuple[Any, ...]:
        return node_endpoints(mod, self.link.nodes, named, here=True)

    # -- ShareAcknowledge ----------------------------------------------------------------------
    def _acknowledge(self, r: Request, slot: Any) -> None:
        body = r.body
        mod = codec.response_module(r.api_key, r.version)
        leaders: set[int] = set()
        responses = []
        refused = self._refused(body.group_id)
        for t in body.topics:
            name = self._name_of(t.topic_id)
            parts = []
            for p in t.partitions:
                err = ErrorCode.none if name else ErrorCode.unknown_topic_id
                if refused:
                    err = ErrorCode.group_authorization_failed
                elif name:
                    err = self._settle(
                        body.group_id, name, p.partition_index, p.acknowledgement_batches
                    )
                parts.append(
                    build(
                        mod,
                        "PartitionData",
                        partition_index=p.partition_index,
                        error_code=err,
                        error_message=None,
                        current_leader=self._leader(mod, name, p.partition_index, leaders),
                    )
                )
            responses.append(
                build(
                    mod,
                    "ShareAcknowledgeTopicResponse",
                    topic_id=t.topic_id,
                    partitions=tuple(parts),
                )
            )
        if body.share_session_epoch == -1:
            for key in [k for k in self.consumers if k[0] == body.group_id]:
                self.session.detach(self.consumers.pop(key).handle)
        self.link.answer(
            slot,
            build(
                mod,
                "ShareAcknowledgeResponse",
                throttle_time=_ZERO,
                error_code=ErrorCode.none,
                error_message=None,
                responses=tuple(responses),
                node_endpoints=self._endpoints(mod, leaders),
            ),
        )

    # -- settling ------------------------------------------------------------------------------
    def _settle(self, group: str, name: str, index: int, batches: Any) -> ErrorCode:
        try:
            consumer = self.consumers.get((group, self._destination(name, index)))
        except _UnknownPartition:
            return ErrorCode.unknown_topic_or_partition
        if consumer is None or consumer.handle.closed:
            # (its partition served by another member, or moved there since it was fetched:
            # what was acquired here comes again there)
            try:
                here = self.link.nodes.term(self._destination(name, index)) is not None
            except _UnknownPartition:
                here = False
            if here and consumer is None:
                return ErrorCode.invalid_record_state
            return ErrorCode.not_leader_or_follower
        by_verb: dict[str, list[tuple[int, int]]] = {}
        missing = False
        for b in batches:
            types = list(b.acknowledge_types) or [1]
            for i, offset in enumerate(range(b.first_offset, b.last_offset + 1)):
                kind = types[i] if len(types) > 1 else types[0]
                if kind == 0:
                    continue  # (a gap: no record there)
                count = consumer.counts.get(offset)
                if count is None:
                    missing = True
                    continue
                verb = _VERBS.get(kind)
                if verb is None:
                    missing = True
                    continue
                if verb != "extend":
                    consumer.counts.pop(offset, None)
                by_verb.setdefault(verb, []).append((offset, count))
        for verb, entries in by_verb.items():
            self._settle_entries(consumer, verb, entries)
        return ErrorCode.invalid_record_state if missing else ErrorCode.none

    def _settle_entries(
        self, consumer: _Consumer, verb: str, entries: list[tuple[int, int]]
    ) -> None:
        self.session.settle(
            consumer.handle,
            c.Settle(verb, next(self._requests), tuple(entries)),  # type: ignore[arg-type]
        )

    # -- waking (the consumer's wakeup: any thread) ---------------------------------------------
    def set(self) -> None:
        if not self._wake_due:
            self._wake_due = True
            self.link.threadsafe(self._woken)

    def _woken(self) -> None:
        self._wake_due = False
        for consumer in self.consumers.values():
            for reply in consumer.handle.replies():  # (settles answered; refusals logged)
                for refused in reply.refused:
                    log.info(
                        "kafka: share ack of %s@%d refused: %s",
                        consumer.topic,
                        refused.offset,
                        refused.reason,
                    )
        for w in list(self.waiting):
            self._step(w)


class _UnknownPartition(Exception):
    pass


def _ranges(acquired: list[tuple[int, int]]) -> list[tuple[int, int, int]]:
    """(offset, delivery count) pairs as (first, last, count) runs of consecutive offsets."""
    out: list[tuple[int, int, int]] = []
    for offset, count in sorted(acquired):
        if out and out[-1][1] == offset - 1 and out[-1][2] == count:
            out[-1] = (out[-1][0], offset, count)
        else:
            out.append((offset, offset, count))
    return out
