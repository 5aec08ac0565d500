"""The bindings log: destinations and durable subscriptions as an append-only event list.

Current state is the replay of the events in ``seq`` order (the seeds' bindings journal).
"""

from __future__ import annotations

import json
from typing import Any

import pyarrow as pa

from spark_mq.journal.base import DestinationInfo, Kind, SubscriptionInfo
from spark_mq.schema import BINDING_SCHEMA, QUEUE_SUBSCRIPTION

CREATE_DESTINATION = "create_destination"
DELETE_DESTINATION = "delete_destination"
CREATE_SUBSCRIPTION = "create_subscription"
DELETE_SUBSCRIPTION = "delete_subscription"
CONFIGURE_DESTINATION = "configure_destination"  # settings replaced by the event's


def replay(rows: pa.Table) -> tuple[dict[str, DestinationInfo], int]:
    """Rebuild destinations from binding events; returns them and the next ``seq``."""
    dests: dict[str, DestinationInfo] = {}
    next_seq = 0
    for ev in sorted(rows.to_pylist(), key=lambda r: r["seq"]):
        next_seq = max(next_seq, ev["seq"] + 1)
        name = ev["destination"]
        match ev["event"]:
            case "create_destination":
                dests[name] = new_destination(name, ev["kind"], _settings(ev))
            case "delete_destination":
                dests.pop(name, None)
            case "configure_destination" if name in dests:
                dests[name].settings.clear()
                dests[name].settings.update(_settings(ev))
            case "create_subscription" if name in dests:
                selector = _settings(ev).get("selector")
                sub = SubscriptionInfo(
                    name, ev["subscription"], ev["start_offset"], selector=selector
                )
                dests[name].subscriptions[sub.name] = sub
            case "delete_subscription" if name in dests:
                dests[name].subscriptions.pop(ev["subscription"], None)
    return dests, next_seq


def _settings(ev: dict[str, Any]) -> dict[str, Any]:
    return json.loads(ev["settings"]) if ev.get("settings") else {}


def new_destination(
    name: str, kind: Kind, settings: dict[str, Any] | None = None
) -> DestinationInfo:
    info = DestinationInfo(name, kind, settings=dict(settings or {}))
    if kind == "queue":
        info.subscriptions[QUEUE_SUBSCRIPTION] = SubscriptionInfo(name, QUEUE_SUBSCRIPTION, 0)
    return info


def event(
    seq: int,
    kind_of_event: str,
    destination: str,
    *,
    time_us: int,
    kind: str | None = None,
    subscription: str | None = None,
    start_offset: int | None = None,
    settings: dict[str, Any] | None = None,
) -> pa.Table:
    return pa.Table.from_pylist(
        [
            {
                "seq": seq,
                "event": kind_of_event,
                "destination": destination,
                "kind": kind,
                "subscription": subscription,
                "start_offset": start_offset,
                "time": time_us,
                "settings": json.dumps(settings, sort_keys=True) if settings else None,
            }
        ],
        schema=BINDING_SCHEMA,
    )
