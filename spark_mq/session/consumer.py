"""A consumer, as a transport sees it: a handle the session gives when it attaches one (the
broker's consumer is behind it; a transport never reaches the subscription or the store)."""

from __future__ import annotations

from concurrent.futures import Future
from typing import Any, Protocol

import pyarrow as pa

from spark_mq.commands import Attach, Settle, SettleReply
from spark_mq.deliveries import DeliveryState
from spark_mq.errors import NotOwner, SparkMQError
from spark_mq.messages import Messages


class ConsumerHandle(Protocol):
    consumer_id: int
    closed: bool  # detached (its session closed, its destination deleted)
    # why the broker detached it, when the consumer is to hear it (its destination moved to
    # another cluster member: NotOwner, naming where)
    ended_by: SparkMQError | None

    @property
    def destination(self) -> str:
        """What it consumes (a temporary queue's name is the broker's)."""
        ...

    @property
    def subscription_name(self) -> str:
        """Its subscription's name ("" for a queue's): what a transaction's ack names."""
        ...

    @property
    def durable(self) -> bool:
        """Whether its acks are recorded (a queue's, a durable subscription's)."""
        ...

    @property
    def lease_s(self) -> float:
        """How long a delivery stays its own without an answer or an extension."""
        ...

    @property
    def unanswered(self) -> int:
        """Settles taken whose reply is still to come (an ack waits to be durable)."""
        ...

    def next_leased(self) -> tuple[Messages, list[DeliveryState]] | None:
        """What fits in its prefetch window, leased: the messages and their delivery state;
        None when there is nothing (for now)."""
        ...

    def next_delivery(self) -> pa.Table | None:
        """:meth:`next_leased` as one ``DELIVERY_SCHEMA`` batch."""
        ...

    def forget(self, offsets: list[int]) -> None:
        """Offsets settled elsewhere (a transaction): they no longer use its prefetch window."""
        ...

    def replies(self) -> list[SettleReply]:
        """The answers to its settles that are ready (each once)."""
        ...


class ForwardedConsumer(ConsumerHandle, Protocol):
    """A consumer on the cluster member that serves its destination, for a client of this one
    (:class:`Forwarder`)."""

    # done once it is attached there (True), or could not be (False): a protocol that answers
    # a subscription (a STOMP receipt) answers then, as the subscription then exists
    attached: Future

    def settle(self, cmd: Settle, inline: object = None) -> None: ...
    def close(self) -> None: ...


class Forwarder(Protocol):
    """A cluster member's forwarding (:mod:`spark_mq.connection.forwarding`), for a session
    whose clients cannot follow a destination to the member that serves it (STOMP): what they
    do to it is done there. The session checks its principal first."""

    def produce(self, owner: NotOwner, destination: str, messages: Messages) -> Future: ...
    def attach(self, owner: NotOwner, cmd: Attach, wakeup: Any) -> ForwardedConsumer: ...
    def has_subscription(self, owner: NotOwner, destination: str, name: str) -> bool: ...
    def create_subscription(
        self, owner: NotOwner, destination: str, name: str, selector: str | None
    ) -> bool: ...
    def delete_subscription(self, owner: NotOwner, destination: str, name: str) -> None: ...
