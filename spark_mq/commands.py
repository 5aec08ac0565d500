"""What can be asked of the broker, as plain values: the commands every transport turns its
frames into, and the results it turns back into frames (the session layer,
:mod:`spark_mq.session`, authorizes each one before the broker sees it).

These are the broker's own types; no wire format reaches below the transports. A closed union:
:data:`Command` lists every command but the hot path's (produce a batch, settle, attach),
which have methods of their own on the session.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import pyarrow as pa

# reject: dead-lettered at once; release: a nack whose message goes to another consumer when
# there is one (a pool's start timeout gave it back)
SettleVerb = Literal["ack", "nack", "extend", "reject", "release"]
Kind = Literal["queue", "topic"]
# an ack inside a transaction: destination, subscription, consumer, offset, delivery count
TransactionAck = tuple[str, str, int, int, int]


@dataclass(frozen=True, slots=True)
class Settle:
    """Settle deliveries of one consumer: ``entries`` are ``(offset, delivery_count)`` pairs
    (the count fences the lease: a stale delivery's answer is refused)."""

    verb: SettleVerb
    request_id: int
    entries: tuple[tuple[int, int], ...]


@dataclass(frozen=True, slots=True)
class Refused:
    offset: int
    reason: str
    # not settled, and the message is delivered again: its destination moved to another
    # cluster member meanwhile, or the member serving it could not be reached (a client that
    # cannot follow a destination is not told it erred)
    comes_again: bool = False


@dataclass(frozen=True, slots=True)
class SettleReply:
    """The answer to one :class:`Settle`, once its effect is durable: what it did not settle
    (what it did is the rest of the settle's offsets)."""

    request_id: int
    refused: tuple[Refused, ...] = ()


@dataclass(frozen=True, slots=True)
class Attach:
    """Attach a consumer to a queue, a topic's subscription, or a new temporary queue."""

    destination: str
    subscription: str | None = None
    prefetch: int | None = None
    selector: str | None = None
    durable: bool = True
    temporary: bool = False  # a new temporary queue (``destination`` is ignored)


# -- the other commands ------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Ping:
    pass


@dataclass(frozen=True, slots=True)
class ReloadSecurity:
    """Read the access rules again (as SIGHUP does)."""


@dataclass(frozen=True, slots=True)
class HandOver:
    """A planned switchover (the ``promote`` action): the primary hands over to its backup."""


@dataclass(frozen=True, slots=True)
class PinDestination:
    """A cluster's operator keeps ``name`` on ``member`` (``None``: placement decides again)."""

    name: str
    member: str | None


@dataclass(frozen=True, slots=True)
class BrokerStatus:
    """The broker's state: version, role, phase, uptime, memory and disk."""


@dataclass(frozen=True, slots=True)
class ShowConfig:
    """The configuration in effect (secrets redacted)."""


@dataclass(frozen=True, slots=True)
class Move:
    """Move up to ``limit`` waiting messages of ``source`` to ``target`` (None: each back to
    where it was dead-lettered or expired from: a redrive)."""

    source: str
    target: str | None = None
    subscription: str | None = None
    limit: int = 1000
    selector: str | None = None


@dataclass(frozen=True, slots=True)
class CreateDestination:
    name: str
    kind: Kind
    settings: dict[str, Any] | None = None


@dataclass(frozen=True, slots=True)
class ConfigureDestination:
    name: str
    settings: dict[str, Any]


@dataclass(frozen=True, slots=True)
class AddPartitions:
    """Grow a partitioned destination to ``partitions`` partitions in all."""

    name: str
    partitions: int


@dataclass(frozen=True, slots=True)
class DeleteDestination:
    name: str


@dataclass(frozen=True, slots=True)
class ListDestinations:
    pass


@dataclass(frozen=True, slots=True)
class CreateSubscription:
    destination: str
    name: str
    selector: str | None = None


@dataclass(frozen=True, slots=True)
class DeleteSubscription:
    destination: str
    name: str


@dataclass(frozen=True, slots=True)
class Purge:
    name: str
    subscription: str | None = None


@dataclass(frozen=True, slots=True)
class Stats:
    name: str


@dataclass(frozen=True, slots=True)
class Partitions:
    """How many partitions ``name`` has (1: it is not partitioned), and its kind (None: there
    is no such destination): what a producer asks before it places messages, and a consumer
    reading every partition. ``use`` is what the caller means to do (``produce``,
    ``consume``, ...): one who may do nothing with ``name`` is refused in its terms."""

    name: str
    use: str = "produce"


@dataclass(frozen=True, slots=True)
class Browse:
    """Waiting messages in delivery order, not leased."""

    destination: str
    subscription: str | None = None
    limit: int = 100
    selector: str | None = None


@dataclass(frozen=True, slots=True)
class Claim:
    """Make (or find again) claim ``number`` of a Spark query's ``consumer`` name."""

    destination: str
    subscription: str | None
    consumer: str
    number: int
    limit: int
    below: int | None = None


@dataclass(frozen=True, slots=True)
class ClaimedRows:
    """The messages of one claim."""

    destination: str
    subscription: str | None
    consumer: str
    number: int


@dataclass(frozen=True, slots=True)
class AckClaims:
    destination: str
    subscription: str | None
    consumer: str
    upto: int


@dataclass(frozen=True, slots=True)
class ReleaseClaims:
    destination: str
    subscription: str | None
    consumer: str


@dataclass(frozen=True, slots=True)
class CommitTransaction:
    """Send ``messages`` (a ``destination`` column plus produce columns) and settle ``acks``,
    all or nothing. ``here``: committed by the member asked, whatever members serve its
    destinations (a client that cannot follow to another: STOMP's); else one whose
    destinations another member serves all is told to commit there."""

    acks: tuple[TransactionAck, ...]
    messages: pa.Table | None
    here: bool = False


Command = (
    Ping
    | ReloadSecurity
    | HandOver
    | PinDestination
    | BrokerStatus
    | ShowConfig
    | Move
    | CreateDestination
    | ConfigureDestination
    | AddPartitions
    | DeleteDestination
    | ListDestinations
    | CreateSubscription
    | DeleteSubscription
    | Purge
    | Stats
    | Partitions
    | Browse
    | Claim
    | ClaimedRows
    | AckClaims
    | ReleaseClaims
    | CommitTransaction
)


@dataclass(frozen=True)
class ProduceResult:
    """What a produced batch became when some of its rows were duplicates: an offset per row
    (a duplicate's is its original's). (Otherwise a produce's future resolves to the journal's
    ``AppendResult``: a first offset and a count.)"""

    offsets: list[int]
    duplicates: int
