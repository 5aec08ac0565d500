"""Where messages go when a subscription is done with them without an ack.

* dead-lettered (past ``max_delivery_attempts``): a copy goes to ``DLQ.<destination>``
  (created on first use) with the reason, unless ``dead_letter = false``;
* expired: a copy goes to ``EXP.<destination>`` when ``expiry = "queue"``, else dropped;
* purged or dropped (``overflow = "drop_oldest"``): settled, no copy.

The copy is durable before the original is settled, and carries the dedup id
``<prefix>:<destination>:<subscription>:<offset>``: a crash between the two repeats the copy,
which duplicate detection then catches, so a message lands in the DLQ exactly once.
"""

from __future__ import annotations

from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc

from spark_mq.schema import HEADERS

DLQ_PREFIX = "DLQ."
EXPIRY_PREFIX = "EXP."
# settlement outcome per doom reason
OUTCOMES = {
    "dead": "dead_lettered",
    "expired": "expired",
    "purged": "purged",
    "dropped": "dropped",
}
REASONS = {
    "dead": "delivered {n} time(s) without an ack (max_delivery_attempts)",
    "expired": "expired",
    "purged": "purged",
    "dropped": "dropped to make room (overflow = drop_oldest)",
}
# a dead-letter or expiry queue never dead-letters again (Artemis: a DLA has no DLA)
SIDE_QUEUE_SETTINGS = {"max_delivery_attempts": 0, "expiry": "drop", "default_ttl_ms": 0}


@dataclass(frozen=True)
class Copy:
    target: str
    rows: pa.Table  # produce columns


def side_queue(destination: str, why: str, *, dead_letter: bool, expiry: str) -> str | None:
    """The queue a doomed message is copied to, or None when it is only dropped."""
    if why == "dead" and dead_letter:
        return DLQ_PREFIX + destination
    if why == "expired" and expiry == "queue":
        return EXPIRY_PREFIX + destination
    return None


def side_copy(
    rows: pa.Table,
    *,
    destination: str,
    subscription: str,
    why: str,
    counts: dict[int, int],
    target: str,
) -> Copy:
    """Produce-ready copies of ``rows`` for ``target``, with where they came from in headers."""
    offsets = rows["offset"].to_pylist()
    headers = []
    for original, offset in zip(rows["headers"].to_pylist(), offsets, strict=True):
        h = dict(original or ())
        h["sparkmq.original_destination"] = destination
        h["sparkmq.original_offset"] = str(offset)
        if subscription:
            h["sparkmq.original_subscription"] = subscription
        h["sparkmq.reason"] = REASONS[why].format(n=counts.get(offset, 0))
        if why == "dead":
            h["sparkmq.delivery_count"] = str(counts.get(offset, 0))
        headers.append(list(h.items()))
    prefix = "dlq" if why == "dead" else "exp"
    ids = [f"{prefix}:{destination}:{subscription}:{o}" for o in offsets]
    table = pa.table(
        {
            "body": rows["body"],
            "message_id": rows["message_id"],
            "dedup_id": pa.array(ids, pa.string()),
            "group_id": rows["group_id"],
            "priority": rows["priority"],
            "headers": pa.array(headers, HEADERS),
        }
    )
    return Copy(target, table)


def order_like(rows: pa.Table, offsets: list[int]) -> pa.Table:
    """``rows`` (sorted by offset) reordered to follow ``offsets``."""
    if not offsets:
        return rows
    index = pc.index_in(pa.array(offsets, pa.int64()), value_set=rows["offset"])
    return rows.take(index)
