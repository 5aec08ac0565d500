"""The console's JSON API (``/api/...`` of the HTTP listener): each view is the answer of
session commands, so it shows and does only what the caller may."""

from __future__ import annotations

import base64
from typing import Any

import pyarrow as pa

from spark_mq.broker import commands as c
from spark_mq.broker import moving
from spark_mq.errors import ProtocolError
from spark_mq.session import ClientSession

BODY_PREVIEW = 64 * 1024  # bytes of a body shown by a browse
MAX_MOVE = 1_000_000  # messages one console move may ask for


class NoSuchCall(LookupError):
    """An API path or method that does not exist (404)."""


def handle(
    session: ClientSession,
    method: str,
    parts: list[str],
    query: dict[str, list[str]],
    body: dict[str, Any],
) -> Any:
    match method, parts:
        case "GET", ["overview"]:
            return {
                "status": session.execute(c.BrokerStatus()),
                "destinations": [summary(d) for d in _listing(session)],
            }
        case "GET", ["destinations"]:
            return [summary(d) for d in _listing(session)]
        case "GET", ["destinations", name]:
            return session.execute(c.Stats(name))
        case "GET", ["destinations", name, "messages"]:
            limit = _int(_one(query, "limit") or "50", "limit", 1, 1000)
            table = session.execute(
                c.Browse(name, _one(query, "subscription"), limit, _one(query, "selector"))
            )
            return message_rows(table)
        case "POST", ["destinations", name, "purge"]:
            sub = body.get("subscription")
            return {"purged": session.execute(c.Purge(name, _text_or_none(sub, "subscription")))}
        case "POST", ["destinations", name, "move"]:
            return move_all(
                session,
                name,
                _text_or_none(body.get("target"), "target"),
                subscription=_text_or_none(body.get("subscription"), "subscription"),
                limit=_int(body.get("limit", MAX_MOVE), "limit", 1, MAX_MOVE),
            )
        case "GET", ["config"]:
            return session.execute(c.ShowConfig())
    raise NoSuchCall(f"no such API call: {method} /api/{'/'.join(parts)}")


def move_all(
    session: ClientSession,
    source: str,
    target: str | None,
    *,
    subscription: str | None = None,
    limit: int = MAX_MOVE,
    selector: str | None = None,
) -> dict[str, Any]:
    """Move (or, with no target, redrive) up to ``limit`` messages, a batch at a time."""
    return moving.in_batches(
        lambda n: session.execute(c.Move(source, target, subscription, n, selector)), limit
    )


def _listing(session: ClientSession) -> list[dict[str, Any]]:
    return [d for d in session.execute(c.ListDestinations()) if not d["temporary"]]


def summary(d: dict[str, Any]) -> dict[str, Any]:
    """A destination's line in a listing (a topic's figures summed over its subscriptions)."""
    subs = d.get("subscriptions")
    if subs is None:
        figures = d
    else:
        keys = ("depth", "in_flight", "acked", "delivered", "redelivered", "dead_lettered")
        figures = {k: sum(s.get(k, 0) for s in subs.values()) for k in keys}
    return {
        "name": d["name"],
        "kind": d["kind"],
        "depth": figures.get("depth", 0),
        "in_flight": figures.get("in_flight", 0),
        "consumers": d.get("consumers", 0),
        "subscriptions": len(subs) if subs is not None else None,
        "produced": d.get("produced", 0),
        "delivered": figures.get("delivered", 0),
        "acked": figures.get("acked", 0),
        "redelivered": figures.get("redelivered", 0),
        "dead_lettered": figures.get("dead_lettered", 0),
        "delta_lag_messages": d.get("delta_lag_messages", 0),
        "delta_lag_ms": d.get("delta_lag_ms", 0.0),
    }


def message_rows(table: pa.Table) -> list[dict[str, Any]]:
    """Browsed messages as JSON-safe rows; a body as text when it is UTF-8 text, else base64."""
    out = []
    for row in table.to_pylist():
        body = row.pop("body") or b""
        row["body_bytes"] = len(body)
        row.update(render_body(body[:BODY_PREVIEW]))
        row["body_truncated"] = len(body) > BODY_PREVIEW
        row["headers"] = dict(row.get("headers") or ())
        out.append(row)
    return out


def render_body(body: bytes) -> dict[str, str]:
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError:
        return {"body": base64.b64encode(body).decode(), "encoding": "base64"}
    if any(ch < " " and ch not in "\t\n\r" for ch in text):
        return {"body": base64.b64encode(body).decode(), "encoding": "base64"}
    return {"body": text, "encoding": "text"}


def _one(query: dict[str, list[str]], key: str) -> str | None:
    values = query.get(key)
    return values[-1] if values else None


def _int(value: Any, what: str, low: int, high: int) -> int:
    try:
        n = int(value)
    except (TypeError, ValueError):
        raise ProtocolError(f"{what} must be a whole number, got {value!r}") from None
    if not low <= n <= high:
        raise ProtocolError(f"{what} must be between {low} and {high}, got {n}")
    return n


def _text_or_none(value: Any, what: str) -> str | None:
    if value is None or value == "":
        return None
    if not isinstance(value, str):
        raise ProtocolError(f"{what} must be a string, got {type(value).__name__}")
    return value
