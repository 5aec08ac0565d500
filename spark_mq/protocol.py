"""The sparkmq protocol on Arrow Flight: pure encode/parse functions, no I/O.

* ``DoPut`` produces: the descriptor is a :class:`Produce` command; each record batch is
  answered, in order, by a :class:`PutAck` (or :class:`PutFailed`) once it is durable.
* ``DoExchange`` consumes: the descriptor is a :class:`Consume` command. The broker first sends
  :class:`Welcome`, then delivery batches (``DELIVERY_SCHEMA``). The client sends
  :class:`Settle` frames (ack / nack / extend / release: a nack for another consumer, from wire
  version 4) as app-metadata-only messages; each is answered
  by a :class:`Reply` once its effect is durable. To leave, the client sends :class:`Bye`; the
  broker answers what came before it, then ends the stream.
* ``DoGet`` browses: the ticket is a :class:`Browse` command; the answer is a table of
  waiting messages (``MESSAGE_SCHEMA``) in delivery order.
* ``DoAction`` administers: the action type names the operation, the body is a JSON object.

Every frame is JSON in app metadata. A malformed frame raises :class:`ProtocolError` whose
``fault`` is ``"remote"`` (the peer sent it).
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from itertools import repeat
from typing import Any, Literal, overload

import numpy as np
import pyarrow as pa

from spark_mq.arrow_checks import checked
from spark_mq.errors import ProtocolError

PROTOCOL_VERSION = 1
MAX_PREFETCH = 1_000_000  # messages a consumer may hold unsettled at once
SettleVerb = Literal["ack", "nack", "extend", "release"]  # release: nack, for another consumer
ADMIN_ACTIONS = (
    "create_destination",
    "delete_destination",
    "list_destinations",
    "create_subscription",
    "delete_subscription",
    "configure_destination",
    "add_partitions",
    "purge",
    "commit_transaction",
    "claim",
    "ack_claims",
    "release_claims",
    "stats",
    "partitions",
    "ping",
    "reload_security",
    "promote",
    "pin_destination",
    "broker_status",
    "show_config",
    "move",
)


@dataclass(frozen=True)
class Login:
    """A direct-wire connection's credentials, before its produce or consume frame: a user and
    password, or a bearer token. ``repr`` never shows the secret."""

    username: str | None = None
    password: str | None = field(default=None, repr=False)
    token: str | None = field(default=None, repr=False)


@dataclass(frozen=True)
class Produce:
    destination: str
    # ask for heartbeats: while batches wait for their answers the broker writes something at
    # least this often (0: none; brokers before wire version 3 ignore it)
    heartbeat_ms: int = 0


@dataclass(frozen=True)
class Consume:
    destination: str
    subscription: str | None = None
    prefetch: int | None = None
    selector: str | None = None
    durable: bool = True
    temporary: bool = False  # consume a new temporary queue (destination is ignored)
    # the direct wire may deliver plain messages as ONE frames (brokers before wire version 2
    # ignore it and send batches)
    compact: bool = False
    # ask for heartbeats: the broker writes something at least this often (0: none; brokers
    # before wire version 3 ignore it)
    heartbeat_ms: int = 0


@dataclass(frozen=True)
class Browse:
    """``DoGet`` ticket: waiting messages of a queue or subscription, without leasing them."""

    destination: str
    subscription: str | None = None
    limit: int = 100
    selector: str | None = None


@dataclass(frozen=True)
class Claimed:
    """``DoGet`` ticket: the messages of one claim of a Spark query (``spark_mq.broker.claims``)."""

    destination: str
    subscription: str | None
    consumer: str
    number: int


@dataclass(frozen=True)
class Welcome:
    consumer_id: int
    lease_s: float
    destination: str | None = None  # what is consumed (the name of a temporary queue)


@dataclass(frozen=True)
class Settle:
    """``entries`` are ``(offset, delivery_count)`` pairs: the delivery count fences the lease
    (a tuple; a client settling a delivery batch whole passes :class:`SettlePairs`)."""

    verb: SettleVerb
    request_id: int
    entries: Sequence[tuple[int, int]]


class SettlePairs(Sequence[tuple[int, int]]):
    """``(offset, delivery_count)`` pairs held as two int64 arrays: a delivery batch's, settled
    whole, read from its columns. Written as runs (:func:`encode_settle_runs`) without a Python
    step per message: a client acking batches of 2,000 spent a fifth of its CPU making a tuple
    of each pair and walking them for runs."""

    __slots__ = ("counts", "offsets")

    def __init__(self, offsets: np.ndarray, counts: np.ndarray) -> None:
        self.offsets = offsets.astype(np.int64, copy=False)
        self.counts = counts.astype(np.int64, copy=False)

    def __len__(self) -> int:
        return len(self.offsets)

    @overload
    def __getitem__(self, i: int) -> tuple[int, int]: ...
    @overload
    def __getitem__(self, i: slice) -> SettlePairs: ...
    def __getitem__(self, i: int | slice) -> tuple[int, int] | SettlePairs:
        if isinstance(i, slice):
            return SettlePairs(self.offsets[i], self.counts[i])
        return int(self.offsets[i]), int(self.counts[i])

    def __iter__(self) -> Iterator[tuple[int, int]]:
        return zip(self.offsets.tolist(), self.counts.tolist(), strict=True)

    def runs(self) -> list[tuple[int, int, int]]:
        """``(first offset, count, delivery count)`` of each run of consecutive offsets
        delivered as often."""
        o, c = self.offsets, self.counts
        if not len(o):
            return []
        starts = np.flatnonzero(np.concatenate(([True], (np.diff(o) != 1) | (np.diff(c) != 0))))
        sizes = np.diff(np.append(starts, len(o)))
        return list(zip(o[starts].tolist(), sizes.tolist(), c[starts].tolist(), strict=True))


def joined_entries(parts: Sequence[Sequence[tuple[int, int]]]) -> Sequence[tuple[int, int]]:
    """Several settles' entries as one frame's (arrays joined when each is :class:`SettlePairs`)."""
    if len(parts) == 1:
        return parts[0]
    if all(isinstance(p, SettlePairs) for p in parts):
        pairs = [p for p in parts if isinstance(p, SettlePairs)]
        return SettlePairs(
            np.concatenate([p.offsets for p in pairs]), np.concatenate([p.counts for p in pairs])
        )
    return tuple(e for p in parts for e in p)


@dataclass(frozen=True)
class Bye:
    """A consumer is leaving: the broker answers the settles before it, then ends the stream.

    The consumer never half-closes (``done_writing``) while its reader thread may be finishing
    the call on a broken stream: Arrow Flight aborts the process when both close it at once."""


CLOSING_REASON = "the broker is shutting down"


@dataclass(frozen=True)
class Closing:
    """The broker is shutting down: on a produce stream after every batch sent was answered, on
    a consumer stream once its session stopped delivering. The client ends its side (a producer
    half-closes, a consumer says :class:`Bye`), so the broker need not wait for it."""

    reason: str = CLOSING_REASON


@dataclass(frozen=True)
class Heartbeat:
    """The broker is alive: sent to a client that asked for heartbeats (``heartbeat_ms``)
    when nothing else went to it for that long, while it waits for something. A client that
    hears nothing for several intervals takes the broker for dead (paused, hung, cut off) and
    moves on, to the pair's other broker when it has one."""


@dataclass(frozen=True)
class Reply:
    """The answer to a :class:`Settle` once its effect is durable: the offsets it refused, and
    why (``errors``); every other offset it named is settled. (It also listed each settled
    offset, ``ok``, which no client read: for an ack of 500 messages a reply of 3.5 KB, and
    100 us of the broker's CPU to write it, 160 of the client's to read it. A reply with
    ``ok``, from an older broker, is read as before, its ``ok`` left aside.)"""

    request_id: int
    errors: tuple[dict[str, Any], ...] = field(default=())


@dataclass(frozen=True)
class PutAck:
    """``offsets`` is set when some rows were duplicates: each row's offset (a duplicate's is
    its original's); otherwise the rows have ``first_offset`` onwards."""

    seq: int
    first_offset: int
    count: int
    offsets: tuple[int, ...] | None = None
    duplicates: int = 0


@dataclass(frozen=True)
class PutFailed:
    seq: int
    error: dict[str, Any]


Frame = (
    Login
    | Produce
    | Consume
    | Browse
    | Claimed
    | Welcome
    | Settle
    | Bye
    | Closing
    | Heartbeat
    | Reply
    | PutAck
    | PutFailed
)
_TYPES: dict[str, type] = {
    "login": Login,
    "produce": Produce,
    "consume": Consume,
    "browse": Browse,
    "claimed": Claimed,
    "welcome": Welcome,
    "settle": Settle,
    "bye": Bye,
    "closing": Closing,
    "heartbeat": Heartbeat,
    "reply": Reply,
    "put_ack": PutAck,
    "put_failed": PutFailed,
}
_NAMES = {cls: name for name, cls in _TYPES.items()}
# each frame type's fields, in order (compiled with mypyc, a frame has no __dict__ for vars())
_FIELDS = {cls: tuple(f.name for f in dataclasses.fields(cls)) for cls in _TYPES.values()}


def encode(frame: Frame) -> bytes:
    kind = type(frame)
    if kind is PutAck and frame.offsets is None and not frame.duplicates:  # type: ignore[union-attr]
        # the answer to every produce: formatted directly, at a tenth of json.dumps' cost
        return b'{"seq":%d,"first_offset":%d,"count":%d,"type":"put_ack"}' % (
            frame.seq,  # type: ignore[union-attr]
            frame.first_offset,  # type: ignore[union-attr]
            frame.count,  # type: ignore[union-attr]
        )
    # an ack and its reply, formatted likewise: the bytes json.dumps writes for them
    if kind is Settle:
        pairs = b",".join([b"[%d,%d]" % pair for pair in frame.entries])  # type: ignore[union-attr]
        return b'{"verb":"%s","request_id":%d,"entries":[%s],"type":"settle"}' % (
            frame.verb.encode(),  # type: ignore[union-attr]
            frame.request_id,  # type: ignore[union-attr]
            pairs,
        )
    if kind is Reply and not frame.errors:  # type: ignore[union-attr]
        return b'{"request_id":%d,"errors":[],"type":"reply"}' % frame.request_id  # type: ignore[union-attr]
    # shallow: frames hold only JSON values, and asdict's deep copy of a settle frame's
    # thousand entries cost a consumer more than the rest of its acking
    doc = {name: getattr(frame, name) for name in _FIELDS[kind]}
    doc["type"] = _NAMES[kind]
    return json.dumps(doc, separators=(",", ":")).encode()


# the most messages one settle frame written as runs may name (a run of a few bytes names many:
# the broker makes an entry of each). A frame of more is written entry by entry, as before runs
MAX_RUN_ENTRIES = 100_000


def encode_settle_runs(frame: Settle) -> bytes:
    """``frame`` with its entries as runs (wire version 5): ``[first offset, count, delivery
    count]`` for consecutive offsets delivered as often, a few bytes for a delivery batch's
    thousands of messages (the broker read each entry of the other form with a regular
    expression: a tenth of its CPU consuming with batch acks). More than
    :data:`MAX_RUN_ENTRIES` entries, or fewer than two, are written the other way (one entry,
    the usual ack of a message, is read quickest so)."""
    entries = frame.entries
    if not 1 < len(entries) <= MAX_RUN_ENTRIES:
        return encode(frame)
    if isinstance(entries, SettlePairs):
        return b'{"verb":"%s","request_id":%d,"runs":[%s],"type":"settle"}' % (
            frame.verb.encode(),
            frame.request_id,
            b",".join([b"[%d,%d,%d]" % run for run in entries.runs()]),
        )
    runs = []
    first, count = entries[0]
    n = 1
    for offset, delivered in entries[1:]:
        if offset == first + n and delivered == count:
            n += 1
        else:
            runs.append(b"[%d,%d,%d]" % (first, n, count))
            first, count, n = offset, delivered, 1
    runs.append(b"[%d,%d,%d]" % (first, n, count))
    return b'{"verb":"%s","request_id":%d,"runs":[%s],"type":"settle"}' % (
        frame.verb.encode(),
        frame.request_id,
        b",".join(runs),
    )


def _int(doc: dict[str, Any], key: str, *, optional: bool = False) -> int | None:
    value = doc.get(key)
    if value is None and optional:
        return None
    if not isinstance(value, int) or isinstance(value, bool):
        raise ProtocolError(f"field {key!r} must be an integer, got {value!r}", fault="remote")
    return value


def _str(
    doc: dict[str, Any], key: str, *, optional: bool = False, secret: bool = False
) -> str | None:
    value = doc.get(key)
    if value is None and optional:
        return None
    if not isinstance(value, str):
        shown = type(value).__name__ if secret else repr(value)  # (never echo a secret)
        raise ProtocolError(f"field {key!r} must be a string, got {shown}", fault="remote")
    return value


# what encode() writes for the answer to every produce, read back without json.loads: 3 us
# against 9 (measured)
_PUT_ACK = re.compile(
    rb'\{"seq":(\d{1,18}),"first_offset":(\d{1,18}),"count":(\d{1,18}),"type":"put_ack"\}'
)
# likewise an ack (settle frame) and its reply, as encode() writes them; anything else (an error
# in a reply, another field order, spaces) takes json.loads
_N = rb"(?:0|[1-9]\d{0,17})"
_PAIR = re.compile(rb"\[(" + _N + rb"),(" + _N + rb")\]")
_SETTLE = re.compile(
    rb'\{"verb":"(ack|nack|extend)","request_id":('
    + _N
    + rb'),"entries":\[(?:\[('
    + _N
    + rb"),("
    + _N
    + rb")\]|((?:\["
    + _N
    + rb","
    + _N
    + rb"\](?:,\["
    + _N
    + rb","
    + _N
    + rb'\])*)?))\],"type":"settle"\}'
)
_VERBS: dict[bytes, SettleVerb] = {b"ack": "ack", b"nack": "nack", b"extend": "extend"}
_RUN = re.compile(rb"\[(" + _N + rb"),(" + _N + rb"),(" + _N + rb")\]")
_SETTLE_RUNS = re.compile(
    rb'\{"verb":"(ack|nack|extend)","request_id":('
    + _N
    + rb'),"runs":\[((?:\['
    + _N
    + rb","
    + _N
    + rb","
    + _N
    + rb"\](?:,\["
    + _N
    + rb","
    + _N
    + rb","
    + _N
    + rb'\])*)?)\],"type":"settle"\}'
)
_REPLY = re.compile(rb'\{"request_id":(' + _N + rb'),"errors":\[\],"type":"reply"\}')


def parse(data: bytes | memoryview | None) -> Frame:
    """Parse one frame; anything else is a ``ProtocolError`` (never another exception)."""
    if not data:
        raise ProtocolError("empty frame", fault="remote")
    if (ack := _PUT_ACK.fullmatch(data)) is not None:
        seq, first, count = ack.groups()
        return PutAck(int(seq), int(first), int(count))
    if (settle := _SETTLE.fullmatch(data)) is not None:
        verb, request_id, offset, count, pairs = settle.groups()
        if pairs is None:  # one entry: the usual ack
            entries: tuple[tuple[int, int], ...] = ((int(offset), int(count)),)
        else:
            entries = tuple((int(o), int(c)) for o, c in _PAIR.findall(pairs))
        if any(c >= 2**31 for _, c in entries):  # (18 digits: offsets are below 2**63)
            return _parse_json(data)  # which says what is wrong
        return Settle(_VERBS[verb], int(request_id), entries)
    if (settle := _SETTLE_RUNS.fullmatch(data)) is not None:
        verb, request_id, runs = settle.groups()
        if runs is not None:
            triples = [(int(o), int(n), int(c)) for o, n, c in _RUN.findall(runs)]
            if all(c < 2**31 and n >= 1 and o + n <= 2**63 for o, n, c in triples):
                return Settle(_VERBS[verb], int(request_id), _expand(triples))
        return _parse_json(data)  # (which says what is wrong)
    if (reply := _REPLY.fullmatch(data)) is not None:
        return Reply(int(reply.group(1)))
    return _parse_json(data)


def _parse_json(data: bytes | memoryview) -> Frame:
    doc = _json_object(data, "frame")
    kind = doc.get("type")
    match kind:
        case "login":
            return Login(
                _str(doc, "username", optional=True),
                _str(doc, "password", optional=True, secret=True),
                _str(doc, "token", optional=True, secret=True),
            )
        case "produce":
            return Produce(_str(doc, "destination"), _heartbeat_ms(doc))  # type: ignore[arg-type]
        case "consume":
            prefetch = _int(doc, "prefetch", optional=True)
            if prefetch is not None and not 1 <= prefetch <= MAX_PREFETCH:
                raise ProtocolError(
                    f"prefetch must be 1 to {MAX_PREFETCH:,}, got {prefetch}", fault="remote"
                )
            durable, temporary = doc.get("durable", True), doc.get("temporary", False)
            compact = doc.get("compact", False)
            if not all(isinstance(flag, bool) for flag in (durable, temporary, compact)):
                raise ProtocolError(
                    "durable, temporary and compact must be true or false", fault="remote"
                )
            return Consume(
                _str(doc, "destination"),  # type: ignore[arg-type]
                _str(doc, "subscription", optional=True),
                prefetch,
                _str(doc, "selector", optional=True),
                durable,
                temporary,
                compact,
                _heartbeat_ms(doc),
            )
        case "browse":
            limit = _int(doc, "limit")
            if limit < 0:  # type: ignore[operator]
                raise ProtocolError("limit must not be negative", fault="remote")
            return Browse(
                _str(doc, "destination"),  # type: ignore[arg-type]
                _str(doc, "subscription", optional=True),
                limit,  # type: ignore[arg-type]
                _str(doc, "selector", optional=True),
            )
        case "claimed":
            return Claimed(
                _str(doc, "destination"),  # type: ignore[arg-type]
                _str(doc, "subscription", optional=True),
                _str(doc, "consumer"),  # type: ignore[arg-type]
                _int(doc, "number"),  # type: ignore[arg-type]
            )
        case "welcome":
            lease = doc.get("lease_s")
            if not isinstance(lease, int | float):
                raise ProtocolError("lease_s must be a number", fault="remote")
            return Welcome(
                _int(doc, "consumer_id"),  # type: ignore[arg-type]
                float(lease),
                _str(doc, "destination", optional=True),
            )
        case "settle":
            verb = doc.get("verb")
            if verb not in ("ack", "nack", "extend", "release"):
                raise ProtocolError(f"unknown settle verb {verb!r}", fault="remote")
            runs = doc.get("runs")
            entries = _entries(doc.get("entries")) if runs is None else _expand(_runs(runs))
            return Settle(verb, _int(doc, "request_id"), entries)  # type: ignore[arg-type]
        case "bye":
            return Bye()
        case "closing":
            return Closing(_str(doc, "reason", optional=True) or CLOSING_REASON)
        case "heartbeat":
            return Heartbeat()
        case "reply":
            ok = doc.get("ok", [])  # (an older broker's list of the settled: left aside)
            errors = doc.get("errors", [])
            if not isinstance(ok, list) or not all(isinstance(o, int) for o in ok):
                raise ProtocolError("reply.ok must be a list of offsets", fault="remote")
            if not isinstance(errors, list) or not all(isinstance(e, dict) for e in errors):
                raise ProtocolError("reply.errors must be a list of objects", fault="remote")
            return Reply(_int(doc, "request_id"), tuple(errors))  # type: ignore[arg-type]
        case "put_ack":
            offsets = doc.get("offsets")
            if offsets is not None and (
                not isinstance(offsets, list)
                or not all(isinstance(o, int) and not isinstance(o, bool) for o in offsets)
            ):
                raise ProtocolError("put_ack.offsets must be a list of offsets", fault="remote")
            return PutAck(
                _int(doc, "seq"),  # type: ignore[arg-type]
                _int(doc, "first_offset"),  # type: ignore[arg-type]
                _int(doc, "count"),  # type: ignore[arg-type]
                None if offsets is None else tuple(offsets),
                _int(doc, "duplicates", optional=True) or 0,
            )
        case "put_failed":
            error = doc.get("error")
            if not isinstance(error, dict):
                raise ProtocolError("put_failed.error must be an object", fault="remote")
            return PutFailed(_int(doc, "seq"), error)  # type: ignore[arg-type]
        case _:
            raise ProtocolError(f"unknown frame type {kind!r}", fault="remote")


MAX_HEARTBEAT_MS = 3_600_000


def _heartbeat_ms(doc: dict[str, Any]) -> int:
    value = _int(doc, "heartbeat_ms", optional=True) or 0
    if not 0 <= value <= MAX_HEARTBEAT_MS:
        raise ProtocolError(
            f"heartbeat_ms must be 0 to {MAX_HEARTBEAT_MS:,}, got {value}", fault="remote"
        )
    return value


HEARTBEAT = b'{"type":"heartbeat"}'  # what encode(Heartbeat()) writes


def _entries(value: object) -> tuple[tuple[int, int], ...]:
    if not isinstance(value, list):
        raise ProtocolError("settle.entries must be a list", fault="remote")
    out = []
    for item in value:
        if (
            not isinstance(item, list)
            or len(item) != 2
            or not all(isinstance(x, int) and not isinstance(x, bool) for x in item)
        ):
            raise ProtocolError(
                f"each settle entry must be [offset, delivery_count], got {item!r}", fault="remote"
            )
        if not (0 <= item[0] < 2**63 and 0 <= item[1] < 2**31):
            raise ProtocolError(
                f"a settle entry's offset must be 0 to 2**63-1 and its delivery count 0 to "
                f"2**31-1, got {item!r}",
                fault="remote",
            )
        out.append((item[0], item[1]))
    return tuple(out)


def _runs(value: object) -> list[tuple[int, int, int]]:
    if not isinstance(value, list) or not value:
        raise ProtocolError("settle.runs must be a list of one run or more", fault="remote")
    out = []
    for item in value:
        if (
            not isinstance(item, list)
            or len(item) != 3
            or not all(isinstance(x, int) and not isinstance(x, bool) for x in item)
        ):
            raise ProtocolError(
                f"each settle run must be [first offset, count, delivery_count], got {item!r}",
                fault="remote",
            )
        first, n, count = item
        if not (first >= 0 and n >= 1 and first + n <= 2**63 and 0 <= count < 2**31):
            raise ProtocolError(
                f"a settle run's offsets must be 0 to 2**63-1, its count 1 or more and its "
                f"delivery count 0 to 2**31-1, got {item!r}",
                fault="remote",
            )
        out.append((first, n, count))
    return out


def _expand(runs: list[tuple[int, int, int]]) -> tuple[tuple[int, int], ...]:
    """Runs as the entries they stand for; :data:`MAX_RUN_ENTRIES` at most."""
    if not runs:
        raise ProtocolError("settle.runs must be a list of one run or more", fault="remote")
    if sum(n for _, n, _ in runs) > MAX_RUN_ENTRIES:
        raise ProtocolError(
            f"a settle frame's runs may name {MAX_RUN_ENTRIES:,} messages at most",
            fault="remote",
        )
    if len(runs) == 1:
        first, n, count = runs[0]
        return tuple(zip(range(first, first + n), repeat(count, n), strict=True))
    out: list[tuple[int, int]] = []
    for first, n, count in runs:
        out.extend(zip(range(first, first + n), repeat(count, n), strict=True))
    return tuple(out)


def encode_action_body(**fields: Any) -> bytes:
    return json.dumps(fields, separators=(",", ":")).encode()


MAX_JSON_BYTES = 1024 * 1024  # a control frame or action body (settles of 10,000 entries fit)


def _json_object(data: bytes | memoryview, what: str) -> dict[str, Any]:
    """``data`` as a JSON object; else a ``ProtocolError`` saying what is wrong with it (too
    big, nested too deeply, not UTF-8, not JSON, not an object), never another exception."""
    if len(data) > MAX_JSON_BYTES:
        raise ProtocolError(
            f"{what} of {len(data)} bytes is over the limit of {MAX_JSON_BYTES}", fault="remote"
        )
    try:
        doc = json.loads(bytes(data))
    except UnicodeDecodeError as exc:
        raise ProtocolError(f"{what} is not UTF-8: {exc}", fault="remote") from None
    except ValueError as exc:
        raise ProtocolError(f"{what} is not JSON: {exc}", fault="remote") from None
    except RecursionError:  # the decoder recurses once a level: 100,000 '[' overflowed
        raise ProtocolError(
            f"{what} nests JSON arrays or objects too deeply (no frame needs more than 3 levels)",
            fault="remote",
        ) from None
    if not isinstance(doc, dict):
        raise ProtocolError(f"{what} must be a JSON object", fault="remote")
    return doc


def parse_action_body(data: bytes | None) -> dict[str, Any]:
    if not data:
        return {}
    return _json_object(data, "action body")


class ActionArgs:
    """An admin action's arguments, read by type: a missing or mistyped one is a
    ``ProtocolError`` naming the action and the argument."""

    def __init__(self, action: str, doc: dict[str, Any]) -> None:
        self.action, self.doc = action, doc

    def _bad(self, key: str, wanted: str) -> ProtocolError:
        value = self.doc.get(key)
        shown = repr(value) if len(repr(value)) <= 80 else repr(value)[:77] + "..."
        return ProtocolError(
            f"action {self.action!r}: argument {key!r} must be {wanted}, got {shown}",
            fault="remote",
        )

    def text(self, key: str) -> str:
        value = self.doc.get(key)
        if not isinstance(value, str):
            raise self._bad(key, "a string")
        return value

    def optional_text(self, key: str) -> str | None:
        return None if self.doc.get(key) is None else self.text(key)

    def integer(self, key: str) -> int:
        value = self.doc.get(key)
        if not isinstance(value, int) or isinstance(value, bool) or not -(2**63) <= value < 2**63:
            raise self._bad(key, "an integer")
        return value

    def optional_integer(self, key: str) -> int | None:
        return None if self.doc.get(key) is None else self.integer(key)

    def mapping(self, key: str) -> dict[str, Any]:
        value = self.doc.get(key)
        if not isinstance(value, dict):
            raise self._bad(key, "an object")
        return value

    def optional_mapping(self, key: str) -> dict[str, Any] | None:
        return None if self.doc.get(key) is None else self.mapping(key)


# -- local transactions: DoAction "commit_transaction" ---------------------------------------
Ack = tuple[str, str, int, int, int]  # destination, subscription, consumer, offset, count


def ipc_bytes(table: pa.Table) -> bytes:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return sink.getvalue().to_pybytes()


def encode_commit(acks: list[Ack], messages: pa.Table | None) -> bytes:
    """A JSON line of acks, then (if any) an Arrow IPC stream of the messages to send."""
    head = json.dumps({"acks": acks}).encode()
    return head + b"\n" + (ipc_bytes(messages) if messages is not None else b"")


def decode_commit(body: bytes) -> tuple[list[Ack], pa.Table | None]:
    head, _, rest = body.partition(b"\n")
    doc = _json_object(head, "a transaction's acks")
    try:
        acks = [
            (str(d), str(s or ""), int(c), int(o), int(n)) for d, s, c, o, n in doc.get("acks", [])
        ]
    except (ValueError, TypeError, AttributeError) as exc:
        raise ProtocolError(f"malformed transaction commit: {exc}", fault="remote") from None
    if not rest:
        return acks, None
    try:
        table = pa.ipc.open_stream(pa.py_buffer(rest)).read_all()
    except (pa.ArrowInvalid, OSError, ValueError) as exc:
        raise ProtocolError(
            f"transaction messages are not an Arrow stream: {exc}", fault="remote"
        ) from None
    checked(table, "the transaction's messages")
    if "destination" not in table.column_names:
        raise ProtocolError("transaction messages need a 'destination' column", fault="remote")
    return acks, table
