"""A broker as a cluster member: it serves the destinations the placement gives it, and tells
clients where the others are.

The member joins the cluster (:class:`~spark_mq.cluster.coordination.Coordinator`), and its
own thread follows each new placement: a destination taken from it is let go (its consumers
told where it went, what was taken committed, its hot tier moved to Delta: ``Broker.release``)
and it says so (``handed/<name>``); a destination given to it is taken on once the member it
moves from said so, or is gone, or ``cluster.hand_over_wait_s`` passed (its tables fenced with
the assignment's epoch, its state recovered from the shared root: ``Broker.acquire``). So a
move drains before it fences: nothing the old owner took is refused by the new owner's fence.
One at a time, in the order the placements came; a member waiting for a hand-over lets go
meanwhile of what was asked of it (two members swapping destinations do not wait for each
other).

The broker asks the member about destinations it does not serve (:meth:`ClusterMember.route`):
the answer is ``NotOwner`` naming the owner's endpoint and epoch (clients that can follow go
there), or, for a destination just created or whose owner just left, a short wait for its
placement. Creating a destination registers it for placement; deleting it (by its owner)
removes it.

A member whose ZooKeeper session expired (``lost``) has been given up: it lets go of
everything at once (the others may own it already; their fences refuse its commits anyway),
and takes its share again once it rejoined. While the session is only ``suspended``
(ZooKeeper away), it keeps serving what it owns and nothing moves.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any, Protocol, cast

from kazoo.exceptions import KazooException
from kazoo.handlers.threading import KazooTimeoutError

from spark_mq import serving_threads
from spark_mq.cluster.coordination import Assignment, Coordinator, Health, Tls
from spark_mq.config import BrokerConfig
from spark_mq.errors import Deposed, DestinationNotFound, NotAllowed, NotOwner, SparkMQError
from spark_mq.journal.base import Kind
from spark_mq.names import TEMPORARY_PREFIX

log = logging.getLogger(__name__)


class Served(Protocol):
    """What the member needs of its broker (:class:`spark_mq.broker.core.Broker`)."""

    broker_id: str

    def acquire(self, name: str, epoch: int) -> bool: ...
    def release(self, name: str, owner: NotOwner) -> bool: ...
    def serving(self) -> list[str]: ...
    def recorded_kinds(self) -> dict[str, Kind]: ...
    def forget_epoch(self, name: str) -> None: ...
    def finish_transactions(self, alive: set[str]) -> int: ...


_STOP = object()
FINISH_EVERY_S = 10.0  # how often a member looks for transactions' parts left to it


class ClusterMember:
    """Made before the broker's listeners (the Kafka listener asks it where things are),
    started once they listen (:meth:`start`: its endpoints are known then)."""

    def __init__(self, broker: Served, config: BrokerConfig) -> None:
        settings = config.cluster
        self.broker = broker
        self.member_id = broker.broker_id
        self.name = settings.name
        self.advertised_url = settings.advertised_url
        self.endpoint = ""  # (start's)
        self.placement_wait_s = settings.placement_wait_s
        self.hand_over_wait_s = settings.hand_over_wait_s
        self.coordinator = Coordinator(
            settings.zookeeper,
            self.member_id,
            self.endpoint,
            cluster=settings.name,
            session_timeout_s=settings.session_timeout_s,
            on_change=self._placed,
            on_health=self._health_changed,
            auth=settings.zookeeper_auth or None,
            tls=Tls(
                settings.zookeeper_tls_ca_file,
                settings.zookeeper_tls_cert_file,
                settings.zookeeper_tls_key_file,
            )
            if settings.zookeeper_tls
            else None,
        )
        self._work: queue.Queue[Any] = queue.Queue()
        self._changed = threading.Condition()  # notified when what is served here changes
        self._epochs: dict[str, int] = {}  # what this member serves, with its epoch
        self._awaiting: set[str] = set()  # given to it, its last owner not done letting go
        self._handed: dict[str, int] = {}  # let go here, for its owner of that epoch
        self._moves = 0  # destinations taken on or let go so far
        self._fenced_unhanded = 0  # hand-overs its old owner did not make in time (fenced so)
        self._parts_finished = 0  # other members' transactions' parts it stored for them
        self._members_seen: set[str] = set()  # the members at the last placement
        self._worker: threading.Thread | None = None
        self.on_health: Callable[[Health], None] | None = None  # (the service's, for status)

    # -- life ----------------------------------------------------------------------------------
    def start(self, endpoint: str, kafka: tuple[str, int] | None = None) -> None:
        """Join the cluster (``ConfigError`` when ZooKeeper cannot be reached or the member's
        id is taken) and register the root's recorded destinations for placement (a root that
        one broker served before, or a create cut short before it was registered).
        ``endpoint``: where SDK clients reach it (``cluster.advertised_url`` first); ``kafka``:
        where Kafka clients do, when it has a Kafka listener."""
        self.endpoint = self.advertised_url or endpoint
        self.coordinator.endpoint = self.endpoint
        self.coordinator.kafka = f"{kafka[0]}:{kafka[1]}" if kafka else ""
        self._worker = threading.Thread(target=self._run, name="cluster-member", daemon=True)
        self._worker.start()
        self.coordinator.start()
        self.coordinator.register(self.broker.recorded_kinds())
        log.info(
            "cluster member %s joined %s (leader: %s)",
            self.member_id,
            self.coordinator.root,
            self.coordinator.leader or "being chosen",
        )

    def stop(self, hand_over_s: float = 30.0) -> None:
        """Leave, handing over first: the leader places this member's destinations on the
        others while it still serves them (each let go here as it is placed there, its clients
        told where), for up to ``hand_over_s``; what is left is let go, then the member's node
        goes."""
        started = time.monotonic()
        if self._epochs and self.coordinator.health == "connected":
            handed = self.coordinator.leave(hand_over_s)
            log.info(
                "cluster member %s: %s in %.2fs",
                self.member_id,
                "handed its destinations over"
                if handed
                else "leaving without handing over "
                "everything (no other member, or it took too long)",
                time.monotonic() - started,
            )
        self._work.put(("leave", None))
        self._work.put(_STOP)
        if self._worker is not None:
            self._worker.join(timeout=60)
        self.coordinator.stop()

    # -- the coordinator's news (its threads: only queued here) -------------------------------
    def _placed(self, assignments: dict[str, Assignment]) -> None:
        self._work.put(("placed", assignments))

    def _health_changed(self, health: Health) -> None:
        if health == "lost":
            self._work.put(("leave", None))
        if self.on_health is not None:
            self.on_health(health)

    def deposed(self, err: Deposed) -> None:
        """(A committing thread.) A commit to a destination was refused: a newer owner fenced
        it. It is let go (on the member's thread: the committing one is the destination's)."""
        name = err.fields.get("destination")
        if isinstance(name, str):
            self._work.put(("lost", name))

    # -- the member's thread --------------------------------------------------------------------
    def _run(self) -> None:
        while True:
            try:
                item = self._work.get(timeout=FINISH_EVERY_S)
            except queue.Empty:
                self._finish_transactions()
                continue
            if item is _STOP:
                return
            what, arg = item
            try:
                if what == "placed":
                    self._follow(arg)
                    alive = set(self.coordinator.members())
                    lost, self._members_seen = self._members_seen - alive, alive
                    if lost:  # (their transactions' parts left to the others)
                        self._finish_transactions()
                elif what == "leave":
                    for name in list(self._epochs):
                        self._let_go(name, "this member left the cluster")
                elif what == "lost":
                    self._let_go(arg, "a newer owner fenced it")
            except Exception:
                log.exception("cluster member %s: following the placement failed", self.member_id)

    def _finish_transactions(self) -> None:
        """Parts of other members' transactions left for this one to store (their member was
        lost, or gave up waiting): the broker's log says which."""
        if self.coordinator.health != "connected":
            return  # (whether a member is gone is not known now)
        try:
            self._parts_finished += self.broker.finish_transactions(set(self.coordinator.members()))
        except Exception as exc:  # (looked at again shortly)
            log.warning("cluster member %s: finishing transactions failed: %s", self.member_id, exc)

    def _follow(self, assignments: dict[str, Assignment]) -> None:
        if self.coordinator.health == "lost":
            return
        self._let_go_moved(assignments)
        mine = {n: a for n, a in assignments.items() if a.member == self.member_id}
        for name, assignment in sorted(mine.items()):
            if self._epochs.get(name) == assignment.epoch:
                continue
            if name in self._epochs:  # (taken from it and given back meanwhile: a new epoch)
                self._let_go(name, "placed again")
            if self._handed_over(name, assignment):
                self._take(name, assignment.epoch)

    def _let_go_moved(self, assignments: dict[str, Assignment]) -> None:
        """Let go of what is placed elsewhere now, and say so to its new owners (the first
        phase of their hand-overs), what this member never served too (it was given, then
        placed elsewhere before it had taken it on)."""
        for name in sorted(self._epochs):
            assignment = assignments.get(name)
            if assignment is None or assignment.member != self.member_id:
                self._let_go(name, "placed on another member")
                # said at once: letting the next one go may wait for a dead-letter copy to
                # this one at its new owner, which waits for this word (or 5 s)
                if assignment is not None:
                    self._say_handed(name, assignment)
        for name, assignment in sorted(assignments.items()):
            self._say_handed(name, assignment)

    def _say_handed(self, name: str, assignment: Assignment) -> None:
        """Tell ``name``'s new owner it was let go here, once (when it moved from here)."""
        if (
            assignment.previous != self.member_id
            or assignment.member == self.member_id
            or self._handed.get(name) == assignment.epoch
        ):
            return
        try:
            self.coordinator.handed(name, assignment.epoch)
        except (KazooException, KazooTimeoutError) as exc:
            log.warning(
                "cluster: cannot say %s was let go (%s): its new owner takes it on after "
                "cluster.hand_over_wait_s",
                name,
                exc,
            )
            return
        self._handed[name] = assignment.epoch
        log.info(
            "cluster: handed %s over to %s (epoch %d)",
            name,
            assignment.member,
            assignment.epoch,
            extra={"destination": name},
        )

    def _handed_over(self, name: str, assignment: Assignment) -> bool:
        """(Before taking ``name`` on.) Wait for the member it moves from to let it go; True
        once it has, or is gone, or ``hand_over_wait_s`` passed (its fence then refuses what
        that member still commits); False when ``name`` was placed again meanwhile (the newer
        placement is followed instead)."""
        previous = assignment.previous
        if not previous or previous == self.member_id:
            return True
        started = time.monotonic()
        with self._changed:
            self._awaiting.add(name)
        try:
            while True:
                if self.coordinator.owner_of(name) != assignment:
                    return False
                if self.coordinator.handed_over(name, assignment.epoch):
                    log.info(
                        "cluster: taking %s on (epoch %d) after its owner handed it over (%.0f ms)",
                        name,
                        assignment.epoch,
                        (time.monotonic() - started) * 1000,
                        extra={"destination": name},
                    )
                    return True
                if previous not in self.coordinator.members():
                    log.info("cluster: taking %s on: %s, its owner, is gone", name, previous)
                    return True
                if time.monotonic() - started >= self.hand_over_wait_s:
                    self._fenced_unhanded += 1
                    log.warning(
                        "cluster: %s has not handed %s over within %g s "
                        "(cluster.hand_over_wait_s): taking it on (its fence refuses what %s "
                        "still commits)",
                        previous,
                        name,
                        self.hand_over_wait_s,
                        previous,
                    )
                    return True
                self._let_go_moved(self.coordinator.assignments())
                time.sleep(0.02)
        finally:
            with self._changed:
                self._awaiting.discard(name)

    def _take(self, name: str, epoch: int) -> None:
        try:
            served = self.broker.acquire(name, epoch)
        except Deposed as exc:  # a newer placement gave it to another since: it will say so
            log.info("cluster: not taking %s on: %s", name, exc.message)
            return
        except SparkMQError as exc:
            log.error("cluster: cannot take %s on (epoch %d): %s", name, epoch, exc.message)
            return
        with self._changed:
            if served:
                self._epochs[name] = epoch
                self._moves += 1
            self._changed.notify_all()

    def _let_go(self, name: str, why: str) -> None:
        owner = self.not_owner(name, why)
        self.broker.release(name, owner)
        with self._changed:
            if self._epochs.pop(name, None) is not None:
                self._moves += 1
            self._changed.notify_all()

    # -- what the broker asks (any thread) ----------------------------------------------------
    def route(self, name: str) -> None:
        """``name`` is not served here: raise ``NotOwner`` naming its owner, or saying it is
        being placed; return when the cluster has no such destination (the broker says so), or
        once it is served here (the broker looks again). Waits up to ``placement_wait_s`` only
        for a destination just created and not placed yet, or being taken on here (moments),
        and never on a loop serving many clients (:mod:`spark_mq.serving_threads`); one whose
        owner is gone is said to be being placed at once."""
        if name.startswith(TEMPORARY_PREFIX):  # (its consumer's member serves it)
            self._route_temporary(name)
            return
        deadline = time.monotonic() + self.placement_wait_s
        while True:
            assignment = self.coordinator.owner_of(name)
            if assignment is None and not self.coordinator.registered(name):
                return  # (no such destination)
            if assignment is not None and assignment.member != self.member_id:
                # its owner, or (gone) none yet: said at once, not waited for on the caller's
                # thread (a loop serving many clients): placing it elsewhere may take a
                # session's time, and clients ask again
                raise self.not_owner(name, "")
            # just created and not placed yet, or placed here and being taken on: moments,
            # not waited for on a loop (it serves many)
            with self._changed:
                if name in self._epochs:
                    return
                if name in self._awaiting or not serving_threads.may_wait():
                    raise self.not_owner(name, "")
                left = deadline - time.monotonic()
                if left <= 0:
                    raise self.not_owner(name, "")
                self._changed.wait(min(left, 0.05))

    def _route_temporary(self, name: str) -> None:
        member_id = self.coordinator.temporary_owner(name)
        member = self.coordinator.members().get(member_id or "")
        if member is None or member_id == self.member_id:
            raise DestinationNotFound(
                f"temporary queue {name!r} does not exist: its consumer has gone (a temporary "
                "queue lives as long as the consumer that made it)",
                destination=name,
            )
        raise NotOwner(
            f"temporary queue {name!r} is served by cluster member {member.id} at "
            f"{member.endpoint} (its consumer's)",
            destination=name,
            member=member.id,
            endpoint=member.endpoint,
            epoch=0,
        )

    def not_owner(self, name: str, why: str) -> NotOwner:
        """Where ``name`` is served, as an error a client can follow."""
        assignment = self.coordinator.owner_of(name)
        member = self.coordinator.members().get(assignment.member) if assignment else None
        if assignment is None or member is None or assignment.member == self.member_id:
            return NotOwner(
                f"{name!r} is being placed on a cluster member just now"
                + (f" ({why})" if why else "")
                + ": try again shortly",
                destination=name,
                member="",
                endpoint="",
                epoch=0,
            )
        return NotOwner(
            f"{name!r} is served by cluster member {member.id} at {member.endpoint} "
            f"(epoch {assignment.epoch})" + (f": {why}" if why else ""),
            destination=name,
            member=member.id,
            endpoint=member.endpoint,
            epoch=assignment.epoch,
        )

    def has(self, name: str) -> bool:
        return self.coordinator.registered(name)

    def creating(self, name: str) -> AbstractContextManager[None]:
        return self.coordinator.creating(name)

    def created(self, name: str, kind: Kind) -> None:
        self.coordinator.add_destination(name, kind=kind)

    def kind_of(self, name: str) -> Kind | None:
        return cast("Kind | None", self.coordinator.kind_of(name))

    def created_temporary(self, name: str) -> None:
        self.coordinator.add_temporary(name)

    def deleted_temporary(self, name: str) -> None:
        self.coordinator.remove_temporary(name)

    def deleted(self, name: str) -> None:
        with self._changed:
            self._epochs.pop(name, None)
        self.broker.forget_epoch(name)
        self.coordinator.remove_destination(name)

    # -- what the Kafka listener asks (any thread: what was last seen) ------------------------
    def owner(self, name: str) -> tuple[str, int] | None:
        """The member owning ``name`` and its epoch; None while it is not placed."""
        assignment = self.coordinator.owner_of(name)
        return None if assignment is None else (assignment.member, assignment.epoch)

    def held(self, name: str) -> int | None:
        """The epoch this member serves ``name`` with (None: it does not serve it, or not
        yet): until it has let it go, whatever the placement says now."""
        return self._epochs.get(name)

    def kafka_endpoints(self) -> dict[str, str]:
        """The live members' Kafka listeners (``host:port``), by member id."""
        return {m.id: m.kafka for m in self.coordinator.members().values() if m.kafka}

    def destinations(self) -> list[str]:
        """Every destination of the cluster (as last seen)."""
        return self.coordinator.destinations()

    @property
    def leader(self) -> str | None:
        return self.coordinator.leader

    # -- what operators see and do ------------------------------------------------------------
    def pin(self, name: str, member: str | None) -> dict[str, Any]:
        """Keep ``name`` on ``member`` (the leader moves it there: a hand-over with a new
        epoch), or let placement decide again (``None``)."""
        if not self.coordinator.registered(name):
            raise DestinationNotFound(f"the cluster has no destination {name!r}", destination=name)
        if member is not None and member not in self.coordinator.members():
            known = ", ".join(sorted(self.coordinator.members())) or "none"
            raise NotAllowed(
                f"no member {member!r} in the cluster now (its members: {known})",
                destination=name,
            )
        self.coordinator.pin(name, member)
        owner = self.coordinator.owner_of(name)
        return {
            "destination": name,
            "pinned_to": member,
            "owner": owner.member if owner else None,
            "epoch": owner.epoch if owner else None,
        }

    # -- what operators see -------------------------------------------------------------------
    def state(self) -> dict[str, Any]:
        """The member, its session's health, the leader, the members and who owns what."""
        assignments = self.coordinator.assignments()
        with self._changed:
            serving = dict(self._epochs)
            moves = self._moves
            awaiting = sorted(self._awaiting)
        return {
            "cluster": self.coordinator.root.rsplit("/", 1)[-1],
            "member_id": self.member_id,
            "endpoint": self.endpoint,
            "session": self.coordinator.health,
            "leader": self.coordinator.leader,
            "members": {
                m.id: {"endpoint": m.endpoint, "kafka": m.kafka, "host": m.host, "pid": m.pid}
                for m in self.coordinator.members().values()
            },
            "serving": serving,
            "moves": moves,
            "owners": {n: {"member": a.member, "epoch": a.epoch} for n, a in assignments.items()},
            "pinned": self.coordinator.pinned(),
            "placing": sorted(
                n for n, a in assignments.items() if a.member == self.member_id and n not in serving
            ),
            # (of those placing) waiting for the member they move from to let them go
            "awaiting_hand_over": awaiting,
            "hand_overs_timed_out": self._fenced_unhanded,
            "transaction_parts_finished": self._parts_finished,
        }
