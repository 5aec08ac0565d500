"""Records the hot tier cannot read: checked before they move (:func:`readable`), and set aside
with what is known of them (:func:`quarantine`) under ``<hot>/.quarantine/<destination>/``."""

from __future__ import annotations

import json
import logging
import os
import time

import numpy as np
import pyarrow as pa

from spark_mq.journal.records import MESSAGE_KINDS, RecordRef
from spark_mq.journal.segments import SegmentLog
from spark_mq.schema import MESSAGE_SCHEMA, SETTLEMENT_SCHEMA, conform

log = logging.getLogger("spark_mq.journal.hot_tier")


def quarantine_dir(hot_root: str, destination: str) -> str:
    """Where a destination's unreadable records are set aside (a name no destination has)."""
    return os.path.join(hot_root, ".quarantine", destination)


def readable(table: pa.Table, ref: RecordRef) -> pa.Table:
    """``table``, the rows of record ``ref``, once they are known to be safe to read: valid
    Arrow data of the log's schema, and for messages exactly the record's offsets."""
    table.validate(full=True)
    if ref.kind in MESSAGE_KINDS:
        conform(table, MESSAGE_SCHEMA)
        offsets = table["offset"].to_numpy()
        if table.num_rows != ref.rows or not np.array_equal(
            offsets, np.arange(ref.first_offset, ref.end_offset, dtype=np.int64)
        ):
            raise ValueError(
                f"the record says offsets {ref.first_offset}-{ref.end_offset - 1}, its rows "
                f"hold {table.num_rows} other(s)"
            )
    else:
        conform(table, SETTLEMENT_SCHEMA)
    return table


def quarantine(
    log_: SegmentLog,
    destination: str,
    directory: str,
    directory_aside: str,
    ref: RecordRef,
    problem: Exception,
) -> pa.Table:
    """Set record ``ref`` of ``destination``'s segment log (in ``directory``) aside: its payload
    and what is known of it go to ``directory_aside``; returns what moves in its place: no rows."""
    name = f"record-{ref.lsn:012d}"
    where = os.path.join(directory_aside, name)
    about = {
        "destination": destination,
        "segment": os.path.join(directory, f"segment-{ref.segment:012d}.log"),
        "position": ref.position,
        "lsn": ref.lsn,
        "kind": ref.kind,
        "first_offset": ref.first_offset if ref.kind in MESSAGE_KINDS else None,
        "rows": ref.rows,
        "payload_bytes": ref.length,
        "problem": f"{type(problem).__name__}: {problem}",
        "quarantined_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    try:
        os.makedirs(directory_aside, exist_ok=True)
        with open(where + ".payload", "wb") as fh:
            fh.write(log_.read_payload(ref))
            os.fsync(fh.fileno())
        with open(where + ".json", "w") as fh:
            json.dump(about, fh, indent=2)
            fh.write("\n")
            os.fsync(fh.fileno())
        kept = f"kept in {where}.payload / .json"
    except OSError as exc:
        kept = f"and could not be kept ({exc}); its segment keeps it until it is retired"
    what = (
        f"{ref.rows} message(s) at offsets {ref.first_offset}-{ref.end_offset - 1}"
        if ref.kind in MESSAGE_KINDS
        else f"{ref.rows} settlement(s)"
    )
    log.error(
        "hot tier %s: record %d (%s) cannot be read and is quarantined, %s: %s",
        destination,
        ref.lsn,
        what,
        kept,
        about["problem"],
    )
    return (MESSAGE_SCHEMA if ref.kind in MESSAGE_KINDS else SETTLEMENT_SCHEMA).empty_table()
