"""Moving waiting messages from one destination to another: Artemis's ``move`` and ``retry``,
SQS's dead-letter redrive.

A move takes a batch of a source's waiting messages as a consumer would (leased, in delivery
order, through a selector when given) and, in one broker transaction, sends copies to their
target and acks the originals: a message is in exactly one of the two places at every moment,
crash or not (the transaction's record finishes the job at recovery). With no target named, each
message goes back to where it was dead-lettered or expired from (the ``sparkmq.original_*``
headers its side queue's copy carries), and those headers are dropped on the way.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from typing import Any

import pyarrow as pa

from spark_mq.broker.attaching import Attachments
from spark_mq.broker.registry import Destinations
from spark_mq.broker.transactions import Transactions
from spark_mq.errors import NotAllowed
from spark_mq.schema import HEADERS, Column, ints
from spark_mq.views import MAX_MOVE_BATCH

ORIGIN = "sparkmq.original_destination"
# what a side queue adds to a copy, dropped when it goes back (a redrive)
SIDE_HEADERS = frozenset(
    {
        ORIGIN,
        "sparkmq.original_offset",
        "sparkmq.original_subscription",
        "sparkmq.reason",
        "sparkmq.delivery_count",
    }
)


class Moves:
    """Moves and redrives, each batch one broker transaction (see the module)."""

    def __init__(
        self, destinations: Destinations, attachments: Attachments, transactions: Transactions
    ) -> None:
        self.destinations = destinations
        self.attachments = attachments
        self.transactions = transactions

    def move(
        self,
        source: str,
        target: str | None,
        *,
        subscription: str | None = None,
        limit: int = MAX_MOVE_BATCH,
        selector: str | None = None,
        may_send: Callable[[str], None] | None = None,
    ) -> dict[str, Any]:
        """Move up to ``limit`` (at most :data:`MAX_MOVE_BATCH`) waiting messages of ``source``
        to ``target`` (None: each back to its original destination). Returns ``{"moved": n,
        "targets": {name: n}, "left": waiting}``; call again while ``moved`` equals ``limit``.
        ``may_send``: checks the caller may send to each target (it raises if not)."""
        self.destinations.administrable(source)
        if target is not None:
            self.destinations.get(target)  # (named: it must exist; a redrive's targets must too)
            if target == source:
                raise NotAllowed(f"cannot move {source!r} onto itself", destination=source)
        limit = max(0, min(limit, MAX_MOVE_BATCH))
        consumer = self.attachments.attach(
            source, subscription, prefetch=max(limit, 1), selector=selector
        )
        sub = consumer.subscription
        try:
            table = consumer.next_delivery() if limit else None
            if table is None or table.num_rows == 0:
                return {"moved": 0, "targets": {}, "left": self._waiting(source, sub.name)}
            targets = self._targets(source, table, target)
            if may_send is not None:
                for name in sorted(set(targets)):
                    may_send(name)
            messages = _copies(table, targets, redrive=target is None)
            acks = [
                (source, sub.name, consumer.consumer_id, o, n)
                for o, n in zip(ints(table["offset"]), ints(table["delivery_count"]), strict=True)
            ]
            self.transactions.commit(acks, messages)
        finally:
            self.attachments.detach(consumer)  # (whatever a failed commit left goes back)
        return {
            "moved": table.num_rows,
            "targets": dict(Counter(targets)),
            "left": self._waiting(source, sub.name),
        }

    def _waiting(self, source: str, subscription: str) -> int:
        dest = self.destinations.get(source)
        end = self.destinations.journal.end_offset(source)
        return int(dest.subscriptions[subscription].stats(end)["waiting"])

    def _targets(self, source: str, table: pa.Table, target: str | None) -> list[str]:
        if target is not None:
            return [target] * table.num_rows
        out = []
        for offset, headers in zip(
            table["offset"].to_pylist(), table["headers"].to_pylist(), strict=True
        ):
            h = dict(headers or ())
            origin = h.get(ORIGIN)
            if not origin:
                raise NotAllowed(
                    f"{source!r} offset {offset} has no {ORIGIN} header (it was not "
                    "dead-lettered or expired here): name where to move it (a target "
                    "destination)",
                    destination=source,
                )
            if not self.destinations.has(origin):
                raise NotAllowed(
                    f"{source!r} offset {offset} came from {origin!r}, which no longer exists: "
                    "create it again, or name a target destination",
                    destination=source,
                )
            original_sub = h.get("sparkmq.original_subscription")
            if original_sub and self.destinations.kind(origin) == "topic":
                raise NotAllowed(
                    f"{source!r} offset {offset} came from subscription {original_sub!r} of "
                    f"topic {origin!r}: sent back to the topic it would reach every "
                    "subscription; name a target destination instead",
                    destination=source,
                )
            out.append(origin)
        return out


def _copies(table: pa.Table, targets: list[str], *, redrive: bool) -> pa.Table:
    headers: Column = table["headers"]
    if redrive:
        headers = pa.array(
            [[(k, v) for k, v in (h or ()) if k not in SIDE_HEADERS] for h in headers.to_pylist()],
            HEADERS,
        )
    return pa.table(
        {
            "destination": pa.array(targets, pa.string()),
            "body": table["body"],
            "message_id": table["message_id"],
            "group_id": table["group_id"],
            "priority": table["priority"],
            "headers": headers,
            "expiry_time": table["expiry_time"],
        }
    )
