"""What the Kafka requests' handlers share: the connection they answer on
(:class:`KafkaLink`), this broker's node id and topic ids, and the Kafka error code of a
sparkmq error."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any, Protocol

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
from spark_mq.session import ClientSession, Verb
from spark_mq.transports.kafka.codec import ErrorCode
from spark_mq.transports.kafka.nodes import Nodes
from spark_mq.transports.kafka.records import RecordError

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
    return uuid.uuid5(_TOPIC_IDS, name)


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
