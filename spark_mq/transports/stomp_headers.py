"""Between STOMP frames' headers and sparkmq's messages, both ways; pure functions, no I/O.

=============================  ===========================================================
STOMP header (SEND)            sparkmq message
=============================  ===========================================================
``destination``                ``/queue/<name>``: queue ``<name>``; ``/topic/<name>``: topic
                               ``<name>``; ``/temp-queue/<name>``: the connection's
                               temporary queue of that name
``priority``                   ``priority`` (0-9; default 4)
``expires``                    ``expiry_time`` (ms since the epoch; 0: never)
``JMSXGroupID``                ``group_id`` (``sparkmq-group-id`` too)
``sparkmq-dedup-id``           ``dedup_id`` (Artemis's ``_AMQ_DUPL_ID`` too)
``AMQ_SCHEDULED_DELAY``        delivered this many ms later (``sparkmq-delay-ms`` too)
``persistent``                 taken and ignored: every message is durable
``content-type``, ``reply-to`` kept as message headers (a ``/temp-queue/`` reply-to becomes
and every other header          the ``/queue/`` the temporary queue can be reached at)
``transaction``, ``receipt``,  the frame's, not the message's
``content-length``
=============================  ===========================================================

A MESSAGE frame carries ``destination``, ``message-id``, ``subscription``, ``ack`` (client
acknowledgement modes), ``redelivered``, ``JMSXDeliveryCount``, ``priority``, ``expires``,
``timestamp`` (enqueued, ms since the epoch), ``persistent``, ``JMSXGroupID`` when the message
has a group, then the message's own headers.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import Any, Literal

import pyarrow as pa

from spark_mq.errors import InvalidNameError
from spark_mq.messages import Messages, PlainMessage
from spark_mq.names import validate_name, validate_stored_name
from spark_mq.schema import DEFAULT_PRIORITY, PRODUCE_SCHEMA
from spark_mq.transports.stomp_codec import Frame, StompError

Kind = Literal["queue", "topic", "temp-queue"]
PREFIXES: dict[str, Kind] = {"/queue/": "queue", "/topic/": "topic", "/temp-queue/": "temp-queue"}
TX_SCHEMA = pa.schema([pa.field("destination", pa.string()), *PRODUCE_SCHEMA])

GROUP = ("JMSXGroupID", "sparkmq-group-id")
DEDUP = ("sparkmq-dedup-id", "_AMQ_DUPL_ID")
DELAY = ("AMQ_SCHEDULED_DELAY", "sparkmq-delay-ms")
# the frame's own headers, never stored with the message
_FRAME_ONLY = frozenset(
    {"destination", "transaction", "receipt", "content-length", "priority", "expires",
     "persistent", *GROUP, *DEDUP, *DELAY}
)  # fmt: skip
# what a MESSAGE frame says itself: a stored header of the same name is not repeated
_MESSAGE_OWN = frozenset(
    {"destination", "message-id", "subscription", "ack", "redelivered", "JMSXDeliveryCount",
     "priority", "expires", "timestamp", "persistent", "JMSXGroupID", "content-length"}
)  # fmt: skip
_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.timezone.utc)


@dataclass(frozen=True)
class Target:
    kind: Kind
    name: str

    def __str__(self) -> str:
        return f"/{self.kind}/{self.name}"


def target_of(text: str | None, what: str = "destination") -> Target:
    """``/queue/x``, ``/topic/x`` or ``/temp-queue/x`` as a target; anything else an error
    saying what is accepted."""
    if not text:
        raise StompError(f"the frame needs a {what} header (/queue/<name> or /topic/<name>)")
    for prefix, kind in PREFIXES.items():
        if text.startswith(prefix):
            name = text[len(prefix) :]
            try:
                if kind == "temp-queue":
                    validate_name(name, "temporary queue")
                else:  # (a partition may be named: /queue/orders~2)
                    validate_stored_name(name, kind)
            except InvalidNameError as exc:  # (its message says what is allowed)
                raise StompError(f"{what} {text!r}: {exc}") from None
            return Target(kind, name)
    raise StompError(
        f"{what} {text[:80]!r} is not one sparkmq knows: use /queue/<name>, /topic/<name> or "
        "/temp-queue/<name>"
    )


def integer(frame: Frame, names: tuple[str, ...], low: int, high: int) -> int | None:
    for name in names:
        value = frame.header(name)
        if value is None or value == "":
            continue
        try:
            number = int(value)
        except ValueError:
            raise StompError(
                f"header {name!r} must be a whole number, got {value[:40]!r}"
            ) from None
        if not low <= number <= high:
            raise StompError(f"header {name!r} must be between {low} and {high}, got {number}")
        return number
    return None


def first(frame: Frame, names: tuple[str, ...]) -> str | None:
    for name in names:
        value = frame.header(name)
        if value:
            return value
    return None


def send_row(frame: Frame, reply_to: str | None = None) -> dict[str, Any] | PlainMessage:
    """A SEND frame's message: a plain message when it has nothing but a body and a dedup id
    (the broker's cheapest path), else a row of ``PRODUCE_SCHEMA``. ``reply_to`` replaces the
    frame's ``reply-to`` header (a temporary queue's reachable name)."""
    priority = integer(frame, ("priority",), 0, 9)
    expires = integer(frame, ("expires",), 0, 2**62)
    delay = integer(frame, DELAY, 0, 2**40)
    group = first(frame, GROUP)
    dedup = first(frame, DEDUP)
    headers: dict[str, str] = {}
    for k, v in frame.headers:
        if k not in _FRAME_ONLY and k not in headers:
            headers[k] = v
    if reply_to is not None:
        headers["reply-to"] = reply_to
    if not headers and priority is None and not expires and not delay and group is None:
        return PlainMessage(dedup, frame.body)
    return {
        "body": frame.body,
        "dedup_id": dedup,
        "group_id": group,
        "priority": priority,
        "headers": list(headers.items()) or None,
        "expiry_time": _EPOCH + dt.timedelta(milliseconds=expires) if expires else None,
        "delay_ms": delay or None,
    }


def produced(message: dict[str, Any] | PlainMessage) -> Messages:
    """A SEND's message (:func:`send_row`) as the session produces it."""
    if isinstance(message, PlainMessage):
        return Messages(None, [message])
    return Messages.of(pa.Table.from_pylist([message], schema=PRODUCE_SCHEMA))


def transaction_table(rows: list[dict[str, Any]]) -> pa.Table | None:
    """A transaction's messages: ``destination`` plus produce columns."""
    return pa.Table.from_pylist(rows, schema=TX_SCHEMA) if rows else None


def as_row(message: dict[str, Any] | PlainMessage) -> dict[str, Any]:
    if isinstance(message, PlainMessage):
        return {"body": message.body, "dedup_id": message.dedup_id}
    return message


@dataclass(frozen=True)
class Delivered:
    """One leased message, as the MESSAGE frame needs it."""

    offset: int
    message_id: str | None
    group_id: str | None
    priority: int
    enqueue_ms: int
    expiry_ms: int
    headers: list[tuple[str, str]]
    body: bytes
    delivery_count: int


def delivered(messages: Messages, counts: list[int]) -> list[Delivered]:
    """Leased messages with their delivery counts, in delivery order."""
    if (plain := messages.plain) is not None:
        return [
            Delivered(
                m.offset, None, None, DEFAULT_PRIORITY, m.enqueue_time_us // 1000, 0, [], m.body, n
            )
            for m, n in zip(plain, counts, strict=True)
        ]
    rows = messages.table()
    cols: dict[str, list[Any]] = {  # (offset, priority, enqueue_time, body: never null)
        name: rows[name].to_pylist()
        for name in (
            "offset",
            "message_id",
            "group_id",
            "priority",
            "enqueue_time",
            "expiry_time",
            "headers",
            "body",
        )
    }
    out = []
    for i, n in enumerate(counts):
        out.append(
            Delivered(
                cols["offset"][i],
                cols["message_id"][i],
                cols["group_id"][i],
                DEFAULT_PRIORITY if cols["priority"][i] is None else cols["priority"][i],
                _ms(cols["enqueue_time"][i]),
                _ms(cols["expiry_time"][i]),
                cols["headers"][i] or [],
                cols["body"][i] or b"",
                n,
            )
        )
    return out


def _ms(t: dt.datetime | None) -> int:
    return 0 if t is None else (t - _EPOCH) // dt.timedelta(milliseconds=1)


def message_id_of(m: Delivered, stored_as: str) -> str:
    return m.message_id or f"ID:{stored_as}:{m.offset}"


def message_frame(
    m: Delivered, *, destination: str, stored_as: str, subscription: str, ack: str | None
) -> Frame:
    """The MESSAGE frame of a delivery (``stored_as``: the destination's sparkmq name, for a
    message id the message was sent without)."""
    headers = [
        ("destination", destination),
        ("message-id", message_id_of(m, stored_as)),
        ("subscription", subscription),
    ]
    if ack is not None:
        headers.append(("ack", ack))
    headers += [
        ("redelivered", "true" if m.delivery_count > 1 else "false"),
        ("JMSXDeliveryCount", str(m.delivery_count)),
        ("priority", str(m.priority)),
        ("expires", str(m.expiry_ms)),
        ("timestamp", str(m.enqueue_ms)),
        ("persistent", "true"),
    ]
    if m.group_id is not None:
        headers.append(("JMSXGroupID", m.group_id))
    headers += [(k, v) for k, v in m.headers if k not in _MESSAGE_OWN]
    return Frame("MESSAGE", tuple(headers), m.body)
