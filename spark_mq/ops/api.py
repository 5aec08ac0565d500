"""The console's JSON API (``/api/...`` of the HTTP listener): each view is the answer of
session commands, so it shows and does only what the caller may."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from spark_mq import commands as c
from spark_mq.errors import ProtocolError
from spark_mq.session import ClientSession
from spark_mq.views import in_batches, message_rows, summary

MAX_MOVE = 1_000_000  # messages one console move may ask for


class NoSuchCall(LookupError):
    """An API path or method that does not exist (404)."""


def handle(
    session: ClientSession,
    method: str,
    parts: list[str],
    query: dict[str, list[str]],
    body: dict[str, Any],
    kafka_groups: Callable[[], list[dict[str, Any]]] = list,
    kafka_transactions: Callable[[], list[dict[str, Any]]] = list,
) -> Any:
    match method, parts:
        case "GET", ["kafka", "groups"]:
            return kafka_listing(session, kafka_groups())
        case "GET", ["kafka", "transactions"]:  # (a user's own ids; the broker's admin: all)
            admin = session.may_administer_broker()
            mine = session.principal.name
            return [t for t in kafka_transactions() if admin or t["owner"] == mine]
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
        case "GET", ["cluster"]:  # (a cluster member's view; "cluster": None for one broker)
            return session.execute(c.BrokerStatus()).get("cluster") or {"cluster": None}
        case "POST", ["cluster", "pin"]:
            pinned = _text_or_none(body.get("name"), "name")
            if pinned is None:
                raise ProtocolError("name the destination to pin (name)")
            member = _text_or_none(body.get("member"), "member")
            return session.execute(c.PinDestination(pinned, member))
    raise NoSuchCall(f"no such API call: {method} /api/{'/'.join(parts)}")


def kafka_listing(session: ClientSession, groups: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The Kafka listener's groups, each consumer group's lag only for the topics the caller
    may see (and a group with none of them left out, unless it has no committed offsets)."""
    out = []
    for g in groups:
        lag = {t: n for t, n in g.get("lag", {}).items() if session.may_see(t)}
        if g.get("lag") and not lag:
            continue
        out.append({**g, "lag": lag, "member_count": len(g.get("members", []))})
    return out


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
    return in_batches(
        lambda n: session.execute(c.Move(source, target, subscription, n, selector)), limit
    )


def _listing(session: ClientSession) -> list[dict[str, Any]]:
    return [d for d in session.execute(c.ListDestinations()) if not d["temporary"]]


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
