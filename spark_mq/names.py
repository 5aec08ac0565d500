"""Destination and subscription names: what is allowed, checked in one place.

A name becomes a directory under the data root, so it must not be able to escape it: no path
separators, no ``..``, no leading dot, printable ASCII only.
"""

from __future__ import annotations

import re
import zlib

from spark_mq.errors import InvalidNameError

MAX_NAME_LENGTH = 200
# the internal topic holding Kafka consumer groups' committed offsets (the broker's own)
KAFKA_OFFSETS = "sparkmq.kafka-offsets"
# what an idempotent Kafka producer's records' dedup ids begin with:
# kafka-<producer id>-<epoch>-<sequence>
KAFKA_DEDUP_PREFIX = "kafka-"
TEMPORARY_PREFIX = "tmp."  # a temporary queue's name: this and 16 hex digits
# fullmatch, not match with "$": "$" also matches before a final newline ("x\n" passed)
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")


def validate_name(name: object, what: str = "destination") -> str:
    """Return ``name`` if it is a valid destination/subscription name, else raise."""
    if not isinstance(name, str) or not name:
        raise InvalidNameError(
            f"{what} name must be a non-empty string, got {name!r}", name=str(name)
        )
    if len(name) > MAX_NAME_LENGTH:
        raise InvalidNameError(
            f"{what} name is {len(name)} characters long; the limit is {MAX_NAME_LENGTH}", name=name
        )
    if not _NAME.fullmatch(name) or ".." in name:
        raise InvalidNameError(
            f"invalid {what} name {name!r}: use letters, digits, '.', '_' and '-', starting with a "
            "letter or digit, and no '..'",
            name=name,
        )
    return name


# -- partitions ----------------------------------------------------------------------------------
# A destination created with ``partitions = N`` (N > 1) is N destinations, ``<name>~0`` to
# ``<name>~<N-1>``, each with its own logs, epoch and owner; "~" is outside what a name may use, so
# no destination a user names can be taken for a partition. ``<name>`` itself has no logs.
PARTITION_MARK = "~"
MAX_PARTITIONS = 1024


def partition_name(name: str, index: int) -> str:
    """Partition ``index`` of the partitioned destination ``name``."""
    return f"{name}{PARTITION_MARK}{index}"


def partition_of(name: str) -> tuple[str, int] | None:
    """``(destination, index)`` when ``name`` is a partition's; else None."""
    base, mark, index = name.rpartition(PARTITION_MARK)
    if not mark or not base or not index.isdigit() or (index != "0" and index[0] == "0"):
        return None
    return base, int(index)


def logical_name(name: str) -> str:
    """The destination a partition belongs to (any other name: itself)."""
    parts = partition_of(name)
    return name if parts is None else parts[0]


# a destination's side queues: where its dead-lettered and (expiry = "queue") expired messages
# go, one for all of a partitioned destination's partitions
DLQ_PREFIX = "DLQ."
EXPIRY_PREFIX = "EXP."


def side_queue_of(name: str) -> str | None:
    """The destination whose dead-letter or expiry queue ``name`` is (by its name: whether
    that destination exists is the caller's to know); None for any other name."""
    for prefix in (DLQ_PREFIX, EXPIRY_PREFIX):
        if name.startswith(prefix) and len(name) > len(prefix):
            return name[len(prefix) :]
    return None


def validate_stored_name(name: object, what: str = "destination") -> str:
    """:func:`validate_name`, partitions' names allowed (``<name>~<index>``): what names a
    destination's logs, or what a client may read or write (an existing partition)."""
    parts = partition_of(name) if isinstance(name, str) else None
    if parts is None:
        return validate_name(name, what)
    validate_name(parts[0], what)
    if parts[1] >= MAX_PARTITIONS:
        raise InvalidNameError(
            f"{name!r}: a destination has at most {MAX_PARTITIONS} partitions", name=name
        )
    return name  # type: ignore[return-value]


def choose_partition(key: str | None, partitions: int, turn: int) -> int:
    """The partition a message goes to: by ``key`` (its group id, else its dedup id), so that
    every message of a group lands in one partition and keeps its order; without one, ``turn``
    (round robin)."""
    if key is None:
        return turn % partitions
    return zlib.crc32(key.encode()) % partitions
