"""One exception tree for the broker, the SDK, the journal and the Spark connector.

::

    SparkMQError                      root; every error sparkmq raises on purpose
    ├── ConfigError                   a setting or option is invalid (names it)
    ├── InvalidNameError              a destination or subscription name is not allowed
    ├── DestinationNotFound           no such destination
    ├── DestinationExists             created twice with a different kind
    ├── SubscriptionNotFound          no such subscription on a topic
    ├── MessageRejected               the broker refused a produced batch
    │   ├── MessageTooLarge           a body or batch is over the limit (size, limit)
    │   └── SchemaMismatch            a produced batch has columns of the wrong name or type
    ├── SelectorError                 a message selector is malformed or unsupported
    ├── NotAuthenticated              missing or wrong credentials
    ├── NotAuthorized                 the access rules do not let this principal do this
    ├── NotAllowed                    the operation is not allowed on this destination
    ├── ConsumerRefused               the destination's delivery policy admits no more consumers
    ├── DestinationFull               a destination or the broker is at its limit (policy reject)
    │   └── DiskFull                  the broker's disk is nearly full (limits.min_free_disk_bytes)
    ├── LeaseError                    an ack/nack/extend names a delivery that is not (or no
    │                                 longer) held by this consumer
    ├── ProtocolError                 a malformed frame or command (``fault`` says whose)
    ├── JournalError                  durable storage failed (retriable: nothing was acked)
    ├── BrokerUnavailable             cannot reach the broker (retriable)
    │   ├── Deposed                   another broker took this one's data over (a failover)
    │   └── NotOwner                  a cluster member that does not own the destination:
    │                                 names the one that does (``member``, ``endpoint``,
    │                                 ``epoch``), or none yet (being placed: try again)
    └── OperationTimeout              no answer in time (retriable; the outcome is unknown)

Every error carries structured fields (``destination``, ``offset``...) and a ``retriable`` flag.
Errors cross the wire as a ``code`` plus those fields (:func:`to_wire` / :func:`from_wire`); the
client translates ``pyarrow.flight`` errors at one boundary (``spark_mq.client._transport``).
"""

from __future__ import annotations

import json
from typing import Any, ClassVar


class SparkMQError(Exception):
    code: ClassVar[str] = "internal"
    retriable: ClassVar[bool] = False

    def __init__(self, message: str, **fields: Any) -> None:
        super().__init__(message)
        self.message = message
        self.fields = fields
        for key, value in fields.items():
            setattr(self, key, value)

    def __str__(self) -> str:
        return self.message


class ConfigError(SparkMQError):
    code = "config"


class ForwardingRefused(ConfigError):
    """A cluster member serving a destination refused the forwarding member's own login or
    rights: an operator's to mend (the members' forwarding identity), not the client's."""


class InvalidNameError(SparkMQError):
    code = "invalid_name"


class DestinationNotFound(SparkMQError):
    code = "destination_not_found"


class DestinationExists(SparkMQError):
    code = "destination_exists"


class SubscriptionNotFound(SparkMQError):
    code = "subscription_not_found"


class MessageRejected(SparkMQError):
    code = "message_rejected"


class MessageTooLarge(MessageRejected):
    code = "message_too_large"


class SchemaMismatch(MessageRejected):
    code = "schema_mismatch"


class SelectorError(SparkMQError):
    code = "selector"


class NotAuthorized(SparkMQError):
    """The principal may not do this (authentication worked; the access rules say no)."""

    code = "not_authorized"


class NotAuthenticated(SparkMQError):
    """No credentials, or wrong ones (the message never says which part was wrong)."""

    code = "not_authenticated"


class NotAllowed(SparkMQError):
    code = "not_allowed"


class ConsumerRefused(SparkMQError):
    code = "consumer_refused"


class DestinationFull(SparkMQError):
    """Over a message-count or byte limit; retriable once consumers catch up."""

    code = "destination_full"
    retriable = True


class DiskFull(DestinationFull):
    """The broker's disk is (nearly) full; retriable once there is space again."""

    code = "disk_full"


class LeaseError(SparkMQError):
    code = "lease"


class ProtocolError(SparkMQError):
    """``fault`` is ``"local"`` when this side sent something wrong, ``"remote"`` otherwise."""

    code = "protocol"


class JournalError(SparkMQError):
    code = "journal"
    retriable = True


class DataLoss(SparkMQError):
    """A reader needs offsets that are no longer in the log (compaction removed them)."""

    code = "data_loss"


class BrokerUnavailable(SparkMQError):
    code = "unavailable"
    retriable = True


class Deposed(BrokerUnavailable):
    """This broker no longer owns its destinations: another took over with a greater epoch (a
    failover). It acknowledges and commits nothing more; clients go to the new owner."""

    code = "deposed"


class NotOwner(BrokerUnavailable):
    """A cluster member was asked for a destination another member owns (``member``, its
    ``endpoint`` and the ``epoch`` it owns it with), or one being placed or moved just now
    (``member`` empty: ask again shortly). Clients that can follow go to ``endpoint``."""

    code = "not_owner"


class Partitioned(SparkMQError):
    """``destination`` has ``partitions`` partitions: a client that knows partitions (the SDK)
    sends to and consumes from each (``<destination>~<index>``), and no broker does it for it
    over the one connection (they may be on several cluster members)."""

    code = "partitioned"


class OperationTimeout(SparkMQError):
    code = "timeout"
    retriable = True


def _all_subclasses(cls: type[SparkMQError]) -> list[type[SparkMQError]]:
    out = [cls]
    for sub in cls.__subclasses__():
        out.extend(_all_subclasses(sub))
    return out


ERRORS_BY_CODE: dict[str, type[SparkMQError]] = {c.code: c for c in _all_subclasses(SparkMQError)}


def to_wire(err: SparkMQError) -> bytes:
    """Encode an error for the other side: its code, message and JSON-able fields."""
    fields = {k: v for k, v in err.fields.items() if isinstance(v, str | int | float | bool)}
    return json.dumps({"code": err.code, "message": err.message, "fields": fields}).encode()


def from_wire(payload: bytes | None, fallback: str) -> SparkMQError:
    """Decode :func:`to_wire`; anything unparseable becomes a remote ``ProtocolError``."""
    try:
        doc = json.loads(payload or b"")
        cls = ERRORS_BY_CODE.get(doc["code"], SparkMQError)
        return cls(str(doc["message"]), **dict(doc.get("fields") or {}))
    except (ValueError, KeyError, TypeError):
        return ProtocolError(f"broker error without sparkmq details: {fallback}", fault="remote")
