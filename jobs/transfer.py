"""Journal export and import (seed 004): a destination's logs as one portable file, and back.

Two formats, chosen by the file name:

* ``.jsonl`` — text for inspection: a ``destination`` line (kind, subscriptions with their start
  offsets, end offset), then one ``message`` line per row (bodies in base64, times in ISO 8601)
  and one ``settlement`` line per row;
* ``.parquet`` — one Parquet file: a ``record`` column says ``message`` or ``settlement``, the
  other columns are the two logs' columns side by side, and the destination line is kept in the
  file's key-value metadata under ``sparkmq.destination``.

Export reads what Delta holds; a running broker's newest records may still be in its hot tier
(stop it with SIGTERM first for a complete copy). Import writes the logs of a destination that
does not exist yet, offsets unchanged, so stop the broker that owns the data root while it runs.
"""

from __future__ import annotations

import base64
import json
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from spark_mq.errors import DestinationExists, DestinationNotFound, SchemaMismatch
from spark_mq.journal import DeltaStore, bindings, layout
from spark_mq.journal.base import DestinationInfo, SubscriptionInfo
from spark_mq.journal.sealing import has_segments
from spark_mq.names import validate_name
from spark_mq.schema import MESSAGE_SCHEMA, SETTLEMENT_SCHEMA, Column, conform, equal_to

META_KEY = b"sparkmq.destination"
FORMAT_VERSION = 1
_SETTLE_COLS = {f"settlement_{f.name}": f for f in SETTLEMENT_SCHEMA}
WIDE_SCHEMA = pa.schema(
    [
        pa.field("record", pa.string()),
        *MESSAGE_SCHEMA,
        *(pa.field(n, f.type) for n, f in _SETTLE_COLS.items()),
    ]
)


def _format(path: Path) -> str:
    if path.suffix == ".jsonl":
        return "jsonl"
    if path.suffix == ".parquet":
        return "parquet"
    raise ValueError(f"{path}: name the file *.jsonl or *.parquet to choose the format")


def _info(store: DeltaStore, name: str) -> DestinationInfo:
    infos, _ = bindings.replay(store.read_bindings())
    if name not in infos:
        raise DestinationNotFound(f"no destination {name!r} under {store.root}", destination=name)
    return infos[name]


def export_destination(root: str, name: str, path: str | Path) -> dict[str, Any]:
    """Write ``name``'s messages and settlements to ``path``; returns the header it wrote."""
    path = Path(path)
    fmt = _format(path)
    store = DeltaStore(root)
    info = _info(store, name)
    messages = store.read_messages(name, 0, None)
    settles = store.read_settlements(name).sort_by([("offset", "ascending")])
    header = {
        "type": "destination",
        "format_version": FORMAT_VERSION,
        "name": name,
        "kind": info.kind,
        "end_offset": store.committed_end(name),
        "subscriptions": [
            {"name": s.name, "start_offset": s.start_offset} for s in info.subscriptions.values()
        ],
        "messages": messages.num_rows,
        "settlements": settles.num_rows,
        "hot_tier_in_use": name in has_segments(layout.join(store.root, layout.HOT_DIR))
        if layout.is_local(store.root)
        else None,
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    if fmt == "jsonl":
        with path.open("w") as fh:
            fh.write(json.dumps(header) + "\n")
            for row in messages.to_pylist():
                fh.write(json.dumps({"type": "message", **_jsonable(row)}) + "\n")
            for row in settles.to_pylist():
                fh.write(json.dumps({"type": "settlement", **_jsonable(row)}) + "\n")
    else:
        wide = pa.concat_tables([_widen(messages, "message"), _widen(settles, "settlement")])
        meta = {META_KEY: json.dumps(header).encode()}
        pq.write_table(wide.replace_schema_metadata(meta), path)
    return header


def _jsonable(row: dict[str, Any]) -> dict[str, Any]:
    out = {}
    for k, v in row.items():
        if isinstance(v, bytes):
            v = base64.b64encode(v).decode()
        elif isinstance(v, datetime):
            v = v.isoformat()
        elif k == "headers" and v is not None:
            v = dict(v)
        out[k] = v
    return out


def _widen(table: pa.Table, record: str) -> pa.Table:
    n = table.num_rows
    cols: list[Column] = []
    for f in WIDE_SCHEMA:
        if f.name == "record":
            cols.append(pa.array([record] * n, pa.string()))
        elif record == "message" and f.name in MESSAGE_SCHEMA.names:
            cols.append(table[f.name])
        elif record == "settlement" and f.name in _SETTLE_COLS:
            cols.append(table[_SETTLE_COLS[f.name].name])
        else:
            cols.append(pa.nulls(n, f.type))
    return pa.table(cols, schema=WIDE_SCHEMA)


def read_export(path: str | Path) -> tuple[dict[str, Any], pa.Table, pa.Table]:
    """The header, messages and settlements of an exported file."""
    path = Path(path)
    if _format(path) == "parquet":
        table = pq.read_table(path)
        raw = (table.schema.metadata or {}).get(META_KEY)
        if raw is None:
            raise SchemaMismatch(
                f"{path} is not a sparkmq export (no {META_KEY.decode()} metadata)"
            )
        kinds = table["record"]
        msgs = table.filter(equal_to(kinds, "message")).select(MESSAGE_SCHEMA.names)
        sets = table.filter(equal_to(kinds, "settlement")).select(list(_SETTLE_COLS))
        sets = sets.rename_columns([f.name for f in _SETTLE_COLS.values()])
        return json.loads(raw), conform(msgs, MESSAGE_SCHEMA), conform(sets, SETTLEMENT_SCHEMA)
    header: dict[str, Any] | None = None
    messages: list[dict[str, Any]] = []
    settles: list[dict[str, Any]] = []
    with path.open() as fh:
        for number, line in enumerate(fh, 1):
            try:
                doc = json.loads(line)
                kind = doc.pop("type")
                if kind == "destination":
                    header = doc
                elif kind == "message":
                    doc["body"] = base64.b64decode(doc["body"])
                    doc["headers"] = list((doc.get("headers") or {}).items()) or None
                    messages.append(doc)
                elif kind == "settlement":
                    settles.append(doc)
                else:
                    raise ValueError(f"unknown record type {kind!r}")
            except (ValueError, KeyError, AttributeError, TypeError) as exc:
                raise SchemaMismatch(f"{path}:{number}: not an export line ({exc!r})") from None
    if header is None:
        raise SchemaMismatch(f"{path} has no destination line: not a sparkmq export")
    for rows in (messages, settles):
        for r in rows:
            for k in ("enqueue_time", "expiry_time", "settle_time"):
                if r.get(k):
                    r[k] = datetime.fromisoformat(r[k])
    return (
        header,
        pa.Table.from_pylist(messages, schema=MESSAGE_SCHEMA),
        pa.Table.from_pylist(settles, schema=SETTLEMENT_SCHEMA),
    )


def import_destination(root: str, path: str | Path, name: str | None = None) -> dict[str, Any]:
    """Create a destination from an export (named as exported, or ``name``); offsets unchanged.

    Refuses a destination that already exists: import is for restoring, not merging.
    """
    header, messages, settles = read_export(path)
    name = validate_name(name or header["name"])
    store = DeltaStore(root)
    infos, seq = bindings.replay(store.read_bindings())
    if name in infos:
        raise DestinationExists(
            f"destination {name!r} already exists under {store.root}: import into a new name "
            "(--as) or delete it first",
            destination=name,
        )
    end = int(header["end_offset"])
    if messages.num_rows and messages["offset"][-1].as_py() >= end:
        raise SchemaMismatch(f"{path}: a message offset is at or past end_offset {end}")
    now_us = int(time.time() * 1_000_000)
    events = [
        bindings.event(seq, bindings.CREATE_DESTINATION, name, time_us=now_us, kind=header["kind"])
    ]
    subs = [
        SubscriptionInfo(name, s["name"], int(s["start_offset"])) for s in header["subscriptions"]
    ]
    for i, sub in enumerate(s for s in subs if header["kind"] == "topic"):
        events.append(
            bindings.event(
                seq + 1 + i,
                bindings.CREATE_SUBSCRIPTION,
                name,
                time_us=now_us,
                subscription=sub.name,
                start_offset=sub.start_offset,
            )
        )
    # logs without a binding are what a crashed import or delete left: nobody owns them
    store.drop_logs(name)
    store.create_logs(name)
    if end:
        # an empty commit still records the end offset when compaction left no rows
        store.commit_messages(name, messages.sort_by("offset"), end)
    if settles.num_rows:
        store.commit_settlements(name, settles)
    # the binding last: until it lands the destination does not exist for any broker
    store.append_bindings(pa.concat_tables(events))
    return {**header, "name": name}
