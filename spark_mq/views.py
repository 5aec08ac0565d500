"""How destinations, messages and moves look to the people who run sparkmq: the console's API
(server side, through sessions) and the CLI (through the SDK) show the same lines, bodies and
move totals, from the same functions. Foundation: it imports no layer."""

from __future__ import annotations

import base64
from collections import Counter
from collections.abc import Callable
from typing import Any

import pyarrow as pa

BODY_PREVIEW = 64 * 1024  # bytes of a body shown by a browse
MAX_MOVE_BATCH = 1000  # messages one move (one broker transaction) takes at most


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
        **({"member": d["member"]} if "member" in d else {}),  # (a cluster's: who serves it)
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


def in_batches(
    step: Callable[[int], dict[str, Any]],
    limit: int | None,
    progress: Callable[[int], None] | None = None,
) -> dict[str, Any]:
    """Move up to ``limit`` (None: every waiting) message by calling ``step(n)`` (one
    :func:`move` of at most ``n``, however the caller reaches the broker) until a batch comes
    back short; ``progress`` hears the running total. Returns ``{"moved", "targets", "left"}``."""
    moved, left, targets = 0, 0, Counter[str]()
    while limit is None or moved < limit:
        n = MAX_MOVE_BATCH if limit is None else min(MAX_MOVE_BATCH, limit - moved)
        got = step(n)
        moved += got["moved"]
        left = got["left"]
        targets.update(got["targets"])
        if progress is not None:
            progress(moved)
        if got["moved"] < n:
            break
    return {"moved": moved, "targets": dict(targets), "left": left}
