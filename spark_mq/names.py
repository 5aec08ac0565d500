"""Destination and subscription names: what is allowed, checked in one place.

A name becomes a directory under the data root, so it must not be able to escape it: no path
separators, no ``..``, no leading dot, printable ASCII only.
"""

from __future__ import annotations

import re

from spark_mq.errors import InvalidNameError

MAX_NAME_LENGTH = 200
# fullmatch, not match with "$": "$" also matches before a final newline ("x\n" passed)
# the internal topic holding Kafka consumer groups' committed offsets (the broker's own)
KAFKA_OFFSETS = "sparkmq.kafka-offsets"
TEMPORARY_PREFIX = "tmp."  # a temporary queue's name: this and 16 hex digits
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
