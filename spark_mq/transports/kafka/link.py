"""What the Kafka requests' handlers share: the connection they answer on
(:class:`KafkaLink`), this broker's node id and topic ids, and the Kafka error code of a
sparkmq error."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from concurrent.futures import Future
from functools import cache
from typing import Any, Protocol

from spark_mq import commands as c
from spark_mq.errors import (
    BrokerUnavailable,
    DestinationExists,
    DestinationFull,
    DestinationNotFound,
    DiskFull,
    ForwardingRefused,
    InvalidNameError,
    MessageTooLarge,
    NotAuthorized,
)
from spark_mq.names import logical_name
from spark_mq.session import ClientSession, Verb
from spark_mq.transports.kafka.codec import ErrorCode, build
from spark_mq.transports.kafka.nodes import Nodes
from spark_mq.transports.kafka.records import RecordError

_RELIST_S = 1.0  # an id not known makes the destinations listed again at most this often
_TOPIC_IDS = uuid.UUID("5b7a6f0e-2d1c-4c55-9a37-7d2f3b1e6a90")  # topic id = uuid5(this, name)


class KafkaLink(Protocol):
    """What the requests ask of their connection
    (:class:`~spark_mq.transports.kafka.connection.KafkaConnection`)."""

    peer: str
    loop: Any  # asyncio.AbstractEventLoop

    @property
    def advertised(self) -> tuple[str, int]: ...

    @property
    def nodes(self) -> Nodes: ...

    def answer(self, slot: Any, response: Any) -> None: ...
    def answer_encoded(self, slot: Any, frame: bytes) -> None: ...
    def threadsafe(self, fn: Callable[..., Any], *args: Any) -> None: ...
    def now_or_soon(self, fn: Callable[..., Any], *args: Any) -> None: ...
    def awaiting(
        self,
        work: Future[Any],
        then: Callable[[Any], None],
        *,
        on_error: Callable[[BaseException], None],
    ) -> None: ...


def topic_id(name: str) -> uuid.UUID:
    """Topic ``name``'s id (KIP-516), derived from the name: the same on every member and
    across restarts (a topic deleted and made again under its name has its old id)."""
    return uuid.uuid5(_TOPIC_IDS, name)


class TopicNames:
    """A connection's topic ids back to their names, for the requests that name topics by id
    (Fetch 13+, Produce 13, the share requests). An id is derived from its name, so a name
    once found stays right; an id not known yet is looked for among the destinations the
    session lists, and a cluster's (served anywhere)."""

    def __init__(self, session: ClientSession, nodes: Nodes) -> None:
        self.session = session
        self.nodes = nodes
        self._names: dict[uuid.UUID, str] = {}
        self._listed_at = -_RELIST_S  # (time.monotonic())

    def know(self, name: str) -> None:
        """A topic Metadata named to the client (whose id it may then use)."""
        self._names[topic_id(name)] = name

    def of(self, tid: uuid.UUID | None) -> str | None:
        """The topic ``tid`` stands for; None when there is none. The destinations are
        listed again for an id not known at most every :data:`_RELIST_S` (a client asking by
        an id that stands for nothing, over and over, costs a look-up, not a listing): a
        topic made meanwhile is known as soon as Metadata names it."""
        if tid is None:
            return None
        name = self._names.get(tid)
        if name is None and time.monotonic() - self._listed_at >= _RELIST_S:
            self._listed_at = time.monotonic()
            listed = [str(d["name"]) for d in self.session.execute(c.ListDestinations())]
            for n in [*listed, *self.nodes.topics()]:
                self.know(logical_name(n))  # (a partition's: its topic's)
            name = self._names.get(tid)
        return name


def current_leader(module: Any, led: tuple[int, int] | None, named: set[int]) -> Any:
    """A partition's leader and its epoch as a Produce, Fetch or ShareFetch answer names them
    for a client to follow at once (KIP-951); (-1, -1) when none is known (being placed: the
    client asks Metadata). The node is added to ``named``, for :func:`node_endpoints`. None
    for a version without the field (Produce before 10, Fetch before 12)."""
    if not hasattr(module, "LeaderIdAndEpoch"):
        return None
    if led is None or led[0] < 0:
        return _no_leader(module)
    named.add(led[0])
    return build(module, "LeaderIdAndEpoch", leader_id=led[0], leader_epoch=led[1])


@cache
def _no_leader(module: Any) -> Any:
    """(-1, -1): what nearly every partition of an answer says (kio's entities are frozen)."""
    return build(module, "LeaderIdAndEpoch", leader_id=-1, leader_epoch=-1)


def node_endpoints(
    module: Any, nodes: Nodes, named: set[int], *, here: bool = False
) -> tuple[Any, ...]:
    """Where the nodes an answer names as leaders are (KIP-951), and this one when ``here``;
    none for a version without them (Produce before 10, Fetch before 16)."""
    if not hasattr(module, "NodeEndpoint") or not (named or here):
        return ()
    if here:
        named = named | {nodes.here().node_id}
    return tuple(
        build(module, "NodeEndpoint", node_id=n.node_id, host=n.host, port=n.port, rack=None)
        for n in nodes.brokers()
        if n.node_id in named
    )


def error_code(exc: BaseException) -> ErrorCode:
    """The Kafka error code a client acts on for a sparkmq error."""
    match exc:
        case ForwardingRefused():  # (the forwarding member's identity, not the client's)
            return ErrorCode.cluster_authorization_failed
        case NotAuthorized():
            return ErrorCode.topic_authorization_failed
        case DestinationNotFound():
            return ErrorCode.unknown_topic_or_partition
        case InvalidNameError() | DestinationExists():
            return ErrorCode.invalid_topic_exception
        case MessageTooLarge():
            return ErrorCode.message_too_large
        case DiskFull():
            return ErrorCode.kafka_storage_error  # (retriable: the client tries again)
        case DestinationFull():
            return ErrorCode.throttling_quota_exceeded  # (retriable)
        case BrokerUnavailable():
            return ErrorCode.not_leader_or_follower  # (retriable: it asks Metadata again)
        case RecordError(corrupt=True):
            return ErrorCode.corrupt_message
        case RecordError():
            return ErrorCode.invalid_record
    return ErrorCode.unknown_server_error


def message_of(exc: BaseException) -> str:
    return getattr(exc, "message", None) or str(exc) or type(exc).__name__


def group_refused(session: ClientSession, group: str, verb: Verb) -> bool:
    """Whether the principal may not do ``verb`` on the Kafka group ``group`` (the refusal
    audited by the session): a handler answers GROUP_AUTHORIZATION_FAILED."""
    try:
        session.check_group(verb, group)
    except NotAuthorized:
        return True
    return False
