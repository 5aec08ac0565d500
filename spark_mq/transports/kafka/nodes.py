"""Where Kafka clients are told things are: the brokers Metadata lists, each topic's leader,
and the consumer groups' coordinator.

One broker is node 0 for everything. A cluster member (:class:`Placement`, the broker's
:class:`~spark_mq.cluster.member.ClusterMember`) lists every member that has a Kafka listener,
each with a node id derived from its member id (the same on every member, and kept while
members come and go); names the member owning a topic as its partition's leader, with the
placement's epoch as the leader epoch (greater at each move, as Kafka's is); and names the
member owning the offsets topic (``sparkmq.kafka-offsets``) as every group's coordinator. That
member keeps the groups' membership and their committed offsets. A member asked for what it
does not own answers as a Kafka broker does after a move (``NOT_LEADER_OR_FOLLOWER``,
``NOT_COORDINATOR``), and the client asks Metadata or FindCoordinator again.
"""

from __future__ import annotations

import time
import zlib
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any, Protocol

from spark_mq.names import KAFKA_OFFSETS

SINGLE_NODE = 0  # one broker's node id
TAKE_ON_RECHECK_S = 0.01  # how often a request held while its partition is taken on looks


@dataclass(frozen=True, slots=True)
class Node:
    node_id: int
    host: str
    port: int


class Placement(Protocol):
    """What a cluster member knows of the cluster (as last seen: quick, any thread)."""

    member_id: str
    name: str
    placement_wait_s: float  # (how long a destination being placed is waited for, at most)

    @property
    def leader(self) -> str | None: ...

    def owner(self, name: str) -> tuple[str, int] | None: ...
    def held(self, name: str) -> int | None: ...
    def kafka_endpoints(self) -> dict[str, str]: ...
    def destinations(self) -> list[str]: ...


def node_id(member_id: str) -> int:
    """A member's Kafka node id: the same wherever it is asked, whoever else is there."""
    return zlib.crc32(member_id.encode()) & 0x7FFFFFFF


class Nodes:
    """Kafka's view of where things are, for one listener (``advertised``: where its own
    clients reach it)."""

    def __init__(
        self, advertised: Callable[[], tuple[str, int]], broker_id: str, placement: Placement | None
    ) -> None:
        self._advertised = advertised
        self.placement = placement
        self.clustered = placement is not None
        self.cluster_id = f"sparkmq-{placement.name if placement else broker_id or 'broker'}"

    @property
    def placement_wait_s(self) -> float:
        """How long a request may wait for something being placed (one broker: nothing is)."""
        return 0.0 if self.placement is None else self.placement.placement_wait_s

    def here(self) -> Node:
        host, port = self._advertised()
        if self.placement is None:
            return Node(SINGLE_NODE, host, port)
        return Node(node_id(self.placement.member_id), host, port)

    def brokers(self) -> list[Node]:
        """Every node with a Kafka listener (this one always)."""
        here = self.here()
        if self.placement is None:
            return [here]
        nodes = {here.node_id: here}
        for member, endpoint in self.placement.kafka_endpoints().items():
            host, _, port = endpoint.rpartition(":")
            nodes.setdefault(node_id(member), Node(node_id(member), host, int(port)))
        return sorted(nodes.values(), key=lambda n: n.node_id)

    def controller(self) -> int:
        if self.placement is None:
            return SINGLE_NODE
        leader = self.placement.leader
        return node_id(leader) if leader else self.here().node_id

    def leader(self, topic: str) -> tuple[int, int] | None:
        """The node leading ``topic``'s partition and its epoch; None while it is being placed
        (or its owner has no Kafka listener)."""
        if self.placement is None:
            return SINGLE_NODE, 0
        owner = self.placement.owner(topic)
        if owner is None:
            return None
        member, epoch = owner
        if member != self.placement.member_id and member not in self.placement.kafka_endpoints():
            return None
        return node_id(member), epoch

    def coordinator(self) -> Node | None:
        """The consumer groups' coordinator (None: its offsets topic is being placed)."""
        led = self.leader(KAFKA_OFFSETS)
        if led is None:
            return None
        return next((n for n in self.brokers() if n.node_id == led[0]), None)

    def coordinating(self) -> bool:
        """Whether this listener is the groups' coordinator (one broker always is)."""
        if self.placement is None:
            return True
        owner = self.placement.owner(KAFKA_OFFSETS)
        return owner is not None and owner[0] == self.placement.member_id

    def term(self, topic: str) -> int | None:
        """The epoch this member holds ``topic`` with (served here, or placed here and being
        taken on); None when it is another member's or not placed. One broker: 0. While
        placed elsewhere but not let go yet, the epoch it is still served with here: what it
        stores meanwhile follows on from that term's."""
        if self.placement is None:
            return 0
        held = self.placement.held(topic)
        if held is not None:
            return held
        owner = self.placement.owner(topic)
        if owner is None or owner[0] != self.placement.member_id:
            return None
        return owner[1]

    def taking_on(self, topic: str) -> bool:
        """Whether ``topic``'s partition is placed here and being taken on (moments: its
        requests are held until it is served, not refused)."""
        if self.placement is None:
            return False
        owner = self.placement.owner(topic)
        return (
            owner is not None
            and owner[0] == self.placement.member_id
            and self.placement.held(topic) is None
        )

    def taken_on(self, topics: list[str], loop: Any) -> Future[None] | None:
        """A future done once none of ``topics`` is being taken on here any more (served
        here, or placed elsewhere meanwhile), or after ``cluster.placement_wait_s``; None when
        none is now. It looks every :data:`TAKE_ON_RECHECK_S` on ``loop`` (an asyncio loop:
        the listener's, which must not wait)."""
        waiting = [t for t in topics if self.taking_on(t)]
        if not waiting:
            return None
        done: Future[None] = Future()
        deadline = time.monotonic() + self.placement_wait_s

        def check() -> None:
            if time.monotonic() >= deadline or not any(self.taking_on(t) for t in waiting):
                done.set_result(None)
            else:
                loop.call_later(TAKE_ON_RECHECK_S, check)

        loop.call_later(TAKE_ON_RECHECK_S, check)
        return done

    def registered(self, topic: str) -> bool:
        """Whether a cluster has ``topic`` (one broker: asks its session instead)."""
        return self.placement is not None and self.placement.owner(topic) is not None

    def topics(self) -> list[str]:
        """A cluster's destinations (one broker: none; its session lists them)."""
        return [] if self.placement is None else self.placement.destinations()
