"""Kafka's classic consumer groups: who is in a group, its generation, its leader and the
assignments the leader hands out (JoinGroup, SyncGroup, Heartbeat, LeaveGroup), as Kafka's
group coordinator keeps them. The partitions a member reads are the clients' business (the
leader's assignor); the broker only gathers the members, fences old generations and hands the
leader's assignments out. Committed offsets are the broker's
(:mod:`spark_mq.broker.group_offsets`), checked here against the generation.

Every call runs on the Kafka listener's loop: no locks. Membership is kept in memory: after a
restart or a failover the members join again (their committed offsets are durable). On a
cluster, a group's membership is also kept beside its offsets each time it becomes stable
(:meth:`Coordinator.snapshot`) and read back by the member that coordinates the groups after
the offsets topic moved (:meth:`Coordinator.restore`), so the members carry on with their ids,
generation and assignments, as Kafka's do when a coordinator moves.

A group's life (Kafka's states): ``Empty`` → a member joins → ``PreparingRebalance`` (the
members known must join again, within their rebalance timeout; a new group waits
``initial_delay_s`` for more members) → every member has joined, or the time is up (who did not
join is out) → ``CompletingRebalance``: the generation is the next, the leader gets every
member's subscription → the leader's SyncGroup → ``Stable``: each member gets its assignment.
A member that joins, leaves, or stays silent past its session timeout starts the next
rebalance; a member of an older generation is told ``ILLEGAL_GENERATION``, an unknown one
``UNKNOWN_MEMBER_ID``, and a member's heartbeat while a rebalance is under way
``REBALANCE_IN_PROGRESS`` (each makes the client join again). A member of the current
generation may still commit offsets while the group prepares a rebalance (what it read before
it joins again), as on Kafka; not while the rebalance completes.
"""

from __future__ import annotations

import asyncio
import base64
import logging
import time
import uuid
from collections.abc import Callable, Mapping
from concurrent.futures import Future
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from kio.schema.consumer_protocol_subscription.v0 import ConsumerProtocolSubscription
from kio.schema.errors import ErrorCode
from kio.serial import entity_reader

log = logging.getLogger(__name__)


class State(Enum):
    EMPTY = "Empty"
    PREPARING = "PreparingRebalance"
    COMPLETING = "CompletingRebalance"
    STABLE = "Stable"


@dataclass(frozen=True)
class Joined:
    """A JoinGroup's answer."""

    error: ErrorCode
    member_id: str
    generation: int = -1
    protocol_type: str | None = None
    protocol: str | None = None
    leader: str = ""
    members: tuple[tuple[str, bytes], ...] = ()  # (the leader's) every member's subscription


@dataclass(frozen=True)
class Synced:
    """A SyncGroup's answer."""

    error: ErrorCode
    protocol_type: str | None = None
    protocol: str | None = None
    assignment: bytes = b""


@dataclass(eq=False)
class Member:
    id: str
    client_id: str
    host: str
    session_timeout_s: float
    rebalance_timeout_s: float
    protocols: list[tuple[str, bytes]]
    last_heard: float
    assignment: bytes = b""
    join: Callable[[Joined], None] | None = None  # its JoinGroup waits for the rebalance
    sync: Callable[[Synced], None] | None = None  # its SyncGroup waits for the leader's

    def metadata(self, protocol: str) -> bytes:
        return next((m for name, m in self.protocols if name == protocol), b"")


@dataclass(eq=False)
class Group:
    id: str
    state: State = State.EMPTY
    generation: int = 0
    protocol_type: str | None = None
    protocol: str | None = None
    leader: str | None = None
    members: dict[str, Member] = field(default_factory=dict)  # in the order they joined
    awaited: dict[str, float] = field(default_factory=dict)  # ids handed out: when they lapse
    timer: asyncio.TimerHandle | None = None
    initial_until: float = 0.0  # a new group's first rebalance waits for more members (the
    # loop's clock, as its timers)

    def describe(self) -> dict[str, object]:
        return {
            "group": self.id,
            "state": self.state.value,
            "generation": self.generation,
            "protocol_type": self.protocol_type or "",
            "protocol": self.protocol or "",
            "leader": self.leader or "",
            "members": [
                {"member_id": m.id, "client_id": m.client_id, "host": m.host}
                for m in self.members.values()
            ],
        }


class Coordinator:
    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        *,
        initial_delay_s: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.loop = loop
        self.initial_delay_s = initial_delay_s
        self.clock = clock
        self.groups: dict[str, Group] = {}
        # (a cluster's) the term of the groups' offsets the memberships were read back in, and
        # the requests waiting while they are read
        self.term: int | None = None
        self.loading = False
        self.waiting: list[Callable[[], None]] = []
        self.kept: Future | None = None  # the last membership being kept (in order)
        # how each group's membership is kept (the session of the connection that kept it
        # last): a group the sweep empties is kept so with it
        self.keepers: dict[str, Callable[[str], None]] = {}

    # -- JoinGroup ---------------------------------------------------------------------------
    def join(
        self,
        group_id: str,
        member_id: str,
        *,
        client_id: str,
        host: str,
        session_timeout_s: float,
        rebalance_timeout_s: float,
        protocol_type: str,
        protocols: list[tuple[str, bytes]],
        member_id_required: bool,
        respond: Callable[[Joined], None],
    ) -> None:
        """A member joins (or joins again); ``respond`` gets the answer once the rebalance is
        done (or at once, for an error or a member id to come back with: KIP-394)."""
        now = self.clock()
        g = self.groups.setdefault(group_id, Group(group_id))
        if not protocols or (g.members and protocol_type != g.protocol_type):
            respond(Joined(ErrorCode.inconsistent_group_protocol, member_id))
            return
        if not member_id:
            member_id = f"{client_id or 'member'}-{uuid.uuid4()}"
            if member_id_required:  # (v4+: the client asks again with this id)
                g.awaited[member_id] = now + session_timeout_s
                respond(Joined(ErrorCode.member_id_required, member_id))
                return
        elif member_id not in g.members and member_id not in g.awaited:
            respond(Joined(ErrorCode.unknown_member_id, member_id))
            return
        names = {n for n, _ in protocols}
        others = [m for m in g.members.values() if m.id != member_id]
        if others and not any(all(n in {p for p, _ in m.protocols} for m in others) for n in names):
            respond(Joined(ErrorCode.inconsistent_group_protocol, member_id))
            return
        g.awaited.pop(member_id, None)
        member = g.members.get(member_id)
        if member is None:
            member = Member(
                member_id, client_id, host, session_timeout_s, rebalance_timeout_s, protocols, now
            )
            g.members[member_id] = member
            log.info("kafka: %s joins group %s", member_id, group_id)
        else:
            member.protocols = protocols
            member.session_timeout_s = session_timeout_s
            member.rebalance_timeout_s = rebalance_timeout_s
            member.last_heard = now
        if member.join is not None:  # (a retried join: the newer one is answered)
            member.join(Joined(ErrorCode.rebalance_in_progress, member_id))
        member.join = respond
        g.protocol_type = protocol_type
        self._prepare(g)
        self._maybe_complete(g)

    # -- SyncGroup ---------------------------------------------------------------------------
    def sync(
        self,
        group_id: str,
        generation: int,
        member_id: str,
        assignments: dict[str, bytes],
        respond: Callable[[Synced], None],
    ) -> bool:
        """True when this (the leader's) made the group stable."""
        g = self.groups.get(group_id)
        member = g.members.get(member_id) if g is not None else None
        if g is None or member is None:
            respond(Synced(ErrorCode.unknown_member_id))
            return False
        if generation != g.generation:
            respond(Synced(ErrorCode.illegal_generation))
            return False
        if g.state is State.PREPARING:
            respond(Synced(ErrorCode.rebalance_in_progress))
            return False
        member.last_heard = self.clock()
        if g.state is State.STABLE:
            respond(self._synced(g, member))
            return False
        member.sync = respond  # (COMPLETING: until the leader's assignments)
        if member_id == g.leader:
            for m in g.members.values():
                m.assignment = assignments.get(m.id, b"")
            g.state = State.STABLE
            log.info(
                "kafka: group %s is stable: generation %d, %d member(s)",
                g.id,
                g.generation,
                len(g.members),
            )
            for m in g.members.values():
                waiting, m.sync = m.sync, None
                if waiting is not None:
                    waiting(self._synced(g, m))
            return True
        return False

    def _synced(self, g: Group, m: Member) -> Synced:
        return Synced(ErrorCode.none, g.protocol_type, g.protocol, m.assignment)

    # -- Heartbeat, LeaveGroup, OffsetCommit's check -------------------------------------------
    def heartbeat(self, group_id: str, generation: int, member_id: str) -> ErrorCode:
        error, member = self._member(group_id, generation, member_id)
        if member is not None:
            member.last_heard = self.clock()
        return error

    def check_commit(self, group_id: str, generation: int, member_id: str) -> ErrorCode:
        """Whether an OffsetCommit of ``member_id`` (of ``generation``) may commit: a member
        of the current generation, the group stable or preparing a rebalance (as Kafka's
        coordinator: a member commits what it read before it joins again, in its revocation
        callback, and hears of the rebalance from its heartbeat); or anyone (generation -1, no
        member id) for a group with no members (a consumer that assigns itself partitions).
        Between the rebalance and the leader's assignments (``CompletingRebalance``) no member
        can have read anything of the new generation: ``REBALANCE_IN_PROGRESS``."""
        g = self.groups.get(group_id)
        if generation < 0 and not member_id:
            return ErrorCode.none if g is None or not g.members else ErrorCode.unknown_member_id
        member = g.members.get(member_id) if g is not None else None
        if g is None or member is None:
            return ErrorCode.unknown_member_id
        if generation != g.generation:
            return ErrorCode.illegal_generation
        member.last_heard = self.clock()
        if g.state is State.COMPLETING:
            return ErrorCode.rebalance_in_progress
        return ErrorCode.none

    def _member(
        self, group_id: str, generation: int, member_id: str
    ) -> tuple[ErrorCode, Member | None]:
        g = self.groups.get(group_id)
        member = g.members.get(member_id) if g is not None else None
        if g is None or member is None:
            return ErrorCode.unknown_member_id, None
        if generation != g.generation:
            return ErrorCode.illegal_generation, member
        if g.state is State.PREPARING:
            return ErrorCode.rebalance_in_progress, member
        return ErrorCode.none, member

    def leave(self, group_id: str, member_ids: list[str]) -> list[ErrorCode]:
        g = self.groups.get(group_id)
        out = []
        for member_id in member_ids:
            if g is None or member_id not in g.members:
                out.append(ErrorCode.unknown_member_id)
                continue
            self._remove(g, member_id, "left")
            out.append(ErrorCode.none)
        if g is not None and any(e is ErrorCode.none for e in out):
            self._rebalance_after_loss(g)
        return out

    # -- a cluster's: memberships kept beside the offsets, read back after a move -------------
    def snapshot(self, group_id: str) -> dict[str, object] | None:
        """A stable group's membership, as kept beside its offsets; None when it has no
        members (or is not stable: what was kept before stands until it is again)."""
        g = self.groups.get(group_id)
        if g is None or not g.members or g.state is not State.STABLE:
            return None
        return {
            "generation": g.generation,
            "protocol_type": g.protocol_type,
            "protocol": g.protocol,
            "leader": g.leader,
            "members": [
                {
                    "id": m.id,
                    "client_id": m.client_id,
                    "host": m.host,
                    "session_timeout_s": m.session_timeout_s,
                    "rebalance_timeout_s": m.rebalance_timeout_s,
                    "protocols": [[n, base64.b64encode(b).decode()] for n, b in m.protocols],
                    "assignment": base64.b64encode(m.assignment).decode(),
                }
                for m in g.members.values()
            ],
        }

    def empty(self, group_id: str) -> bool:
        """Whether ``group_id`` has no members (or is not known)."""
        g = self.groups.get(group_id)
        return g is None or not g.members

    def restore(self, memberships: Mapping[str, Mapping[str, Any]], term: int) -> None:
        """(Now coordinating, the offsets' ``term``.) The groups become the memberships kept:
        each stable, its members heard from now. What this listener held from an earlier
        term is dropped (another coordinated meanwhile): requests waiting on it are told
        ``NOT_COORDINATOR`` (they ask again, here)."""
        for g in self.groups.values():
            if g.timer is not None:
                g.timer.cancel()
            for m in g.members.values():
                if m.join is not None:
                    m.join(Joined(ErrorCode.not_coordinator, m.id))
                if m.sync is not None:
                    m.sync(Synced(ErrorCode.not_coordinator))
        self.groups = {}
        now = self.clock()
        for group_id, doc in memberships.items():
            try:
                g = _kept_group(group_id, doc, now)
            except (KeyError, TypeError, ValueError) as exc:  # (unreadable: its members join)
                log.warning("kafka: group %s's kept membership cannot be read: %r", group_id, exc)
                continue
            if g.members:
                self.groups[group_id] = g
        self.term = term
        if self.groups:
            log.info(
                "kafka: coordinating %d group(s) as they were kept (%d member(s))",
                len(self.groups),
                sum(len(g.members) for g in self.groups.values()),
            )

    # -- time ----------------------------------------------------------------------------------
    def sweep(self) -> list[str]:
        """(A few times a second.) Members silent past their session timeout are out; member
        ids handed out and never used lapse. Returns the groups it left without members."""
        now = self.clock()
        emptied = []
        for g in list(self.groups.values()):
            g.awaited = {m: t for m, t in g.awaited.items() if t > now}
            lost = [
                m.id
                for m in g.members.values()
                if m.join is None and now - m.last_heard > m.session_timeout_s
            ]
            for member_id in lost:
                self._remove(g, member_id, "was not heard from within its session timeout")
            if lost:
                self._rebalance_after_loss(g)
                if not g.members:
                    emptied.append(g.id)
        return emptied

    # -- listings ------------------------------------------------------------------------------
    def describe(self, group_id: str) -> dict[str, object] | None:
        g = self.groups.get(group_id)
        return g.describe() if g is not None else None

    def listed(self) -> list[Group]:
        return list(self.groups.values())

    def subscribed_topics(self, group_id: str) -> set[str]:
        """The topics the members of a consumer-protocol group subscribe to (OffsetDelete
        refuses those)."""
        g = self.groups.get(group_id)
        if g is None or g.protocol_type != "consumer":
            return set()
        topics: set[str] = set()
        for m in g.members.values():
            topics.update(subscription_topics(m.metadata(g.protocol or "")))
        return topics

    def forget(self, group_id: str) -> ErrorCode:
        """DeleteGroups: only a group without members."""
        g = self.groups.get(group_id)
        if g is not None and g.members:
            return ErrorCode.non_empty_group
        self.groups.pop(group_id, None)
        return ErrorCode.none

    # -- the rebalance -------------------------------------------------------------------------
    def _prepare(self, g: Group) -> None:
        """Begin a rebalance (unless one is under way): every member must join again."""
        if g.state is State.PREPARING:
            return
        first = g.state is State.EMPTY
        g.state = State.PREPARING
        for m in g.members.values():
            waiting, m.sync = m.sync, None
            if waiting is not None:
                waiting(Synced(ErrorCode.rebalance_in_progress))
        timeout = max((m.rebalance_timeout_s for m in g.members.values()), default=0.0)
        g.initial_until = self.loop.time() + self.initial_delay_s if first else 0.0
        self._timer(g, min(timeout, self.initial_delay_s) if first else timeout)

    def _timer(self, g: Group, delay: float) -> None:
        if g.timer is not None:
            g.timer.cancel()
        g.timer = self.loop.call_later(max(delay, 0.0), self._timed_out, g)

    def _timed_out(self, g: Group) -> None:
        g.timer = None
        if g.state is not State.PREPARING:
            return
        if g.initial_until and self.loop.time() < g.initial_until:
            self._timer(g, g.initial_until - self.loop.time())
            return
        g.initial_until = 0.0
        late = [m.id for m in g.members.values() if m.join is None]
        for member_id in late:
            self._remove(g, member_id, "did not join again within its rebalance timeout")
        self._maybe_complete(g, timed_out=True)

    def _maybe_complete(self, g: Group, *, timed_out: bool = False) -> None:
        if g.state is not State.PREPARING:
            return
        if not g.members:
            self._empty(g)
            return
        if any(m.join is None for m in g.members.values()):
            return  # (the others still have to join)
        if g.initial_until and not timed_out:
            if g.timer is None:
                self._timer(g, g.initial_until - self.loop.time())
            return  # (a new group: more members may come)
        self._complete(g)

    def _complete(self, g: Group) -> None:
        if g.timer is not None:
            g.timer.cancel()
            g.timer = None
        members = list(g.members.values())
        if g.leader not in g.members:
            g.leader = members[0].id
        leader = g.members[g.leader]
        common = [
            n
            for n, _ in leader.protocols
            if all(any(p == n for p, _ in m.protocols) for m in members)
        ]
        g.protocol = common[0] if common else leader.protocols[0][0]
        g.generation += 1
        g.state = State.COMPLETING
        now = self.clock()
        everyone = tuple((m.id, m.metadata(g.protocol)) for m in members)
        log.info(
            "kafka: group %s rebalanced: generation %d, %d member(s), leader %s",
            g.id,
            g.generation,
            len(members),
            g.leader,
        )
        for m in members:
            waiting, m.join = m.join, None
            m.last_heard = now
            if waiting is not None:
                waiting(
                    Joined(
                        ErrorCode.none,
                        m.id,
                        g.generation,
                        g.protocol_type,
                        g.protocol,
                        g.leader,
                        everyone if m.id == g.leader else (),
                    )
                )

    def _remove(self, g: Group, member_id: str, why: str) -> None:
        m = g.members.pop(member_id)
        log.info("kafka: %s is out of group %s: it %s", member_id, g.id, why)
        if m.join is not None:
            m.join(Joined(ErrorCode.unknown_member_id, member_id))
        if m.sync is not None:
            m.sync(Synced(ErrorCode.unknown_member_id))
        if g.leader == member_id:
            g.leader = None

    def _rebalance_after_loss(self, g: Group) -> None:
        if not g.members:
            self._empty(g)
            return
        self._prepare(g)
        self._maybe_complete(g)

    def _empty(self, g: Group) -> None:
        if g.timer is not None:
            g.timer.cancel()
            g.timer = None
        g.state = State.EMPTY
        g.leader = None
        g.protocol = None


_read_subscription = entity_reader(ConsumerProtocolSubscription)


def subscription_topics(metadata: bytes) -> tuple[str, ...]:
    """The topics of a consumer's subscription (its JoinGroup metadata under the ``consumer``
    protocol type: a version, then the topics in every version); none if it cannot be read."""
    if len(metadata) < 2:
        return ()
    try:
        subscription, _ = _read_subscription(memoryview(metadata), 2)
        return tuple(subscription.topics)
    except Exception:  # (a client's own bytes: unreadable means no topics, not a failure)
        return ()


def _kept_group(group_id: str, doc: Mapping[str, Any], now: float) -> Group:
    """A group as :meth:`Coordinator.snapshot` kept it (JSON), stable, its members heard from
    ``now``; ``KeyError``, ``TypeError`` or ``ValueError`` when it cannot be read."""
    g = Group(
        group_id,
        State.STABLE,
        int(doc["generation"]),
        _text_or_none(doc, "protocol_type"),
        _text_or_none(doc, "protocol"),
        _text_or_none(doc, "leader"),
    )
    for m in doc["members"]:
        g.members[m["id"]] = Member(
            str(m["id"]),
            str(m["client_id"]),
            str(m["host"]),
            float(m["session_timeout_s"]),
            float(m["rebalance_timeout_s"]),
            [(str(n), base64.b64decode(b)) for n, b in m["protocols"]],
            now,
            base64.b64decode(m["assignment"]),
        )
    return g


def _text_or_none(doc: Mapping[str, Any], key: str) -> str | None:
    value = doc.get(key)
    if value is not None and not isinstance(value, str):
        raise TypeError(f"{key} is {type(value).__name__}, not text")
    return value
