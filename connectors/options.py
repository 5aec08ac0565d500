"""Options of ``format("sparkmq")``, parsed once into a typed object.

An unknown or malformed option is a :class:`~spark_mq.errors.ConfigError` naming it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from spark_mq.errors import ConfigError
from spark_mq.journal.layout import normalize_root
from spark_mq.names import validate_name

DEFAULT_MAX_MESSAGES_PER_PARTITION = 100_000

# option name as documented -> (lower-cased key Spark may hand us)
_KNOWN = {
    "path": "path",
    "root": "root",
    "destination": "destination",
    "startingoffsets": "startingOffsets",
    "maxmessagespertrigger": "maxMessagesPerTrigger",
    "maxmessagesperpartition": "maxMessagesPerPartition",
}


@dataclass(frozen=True)
class SourceOptions:
    root: str
    destination: str
    starting: str  # "earliest" | "latest"
    max_messages_per_trigger: int | None
    max_messages_per_partition: int

    @classmethod
    def parse(cls, options: Mapping[str, str]) -> SourceOptions:
        opts = {k.lower(): v for k, v in options.items()}
        unknown = sorted(k for k in opts if k not in _KNOWN)
        if unknown:
            raise ConfigError(
                f"unknown sparkmq option(s) {unknown}; known: {sorted(_KNOWN.values())}",
                setting=unknown[0],
            )
        root = opts.get("root") or opts.get("path")
        if not root:
            raise ConfigError(
                "option 'root' (the broker's data directory or URI) is required, e.g. "
                ".option('root', './data') or .load('./data')",
                setting="root",
            )
        dest = opts.get("destination")
        if not dest:
            raise ConfigError("option 'destination' is required", setting="destination")
        try:
            validate_name(dest)
        except Exception as exc:
            raise ConfigError(f"option 'destination': {exc}", setting="destination") from None
        starting = opts.get("startingoffsets", "earliest").strip().lower()
        if starting not in ("earliest", "latest"):
            raise ConfigError(
                f"option 'startingOffsets' must be 'earliest' or 'latest', got {starting!r}",
                setting="startingOffsets",
            )
        return cls(
            root=normalize_root(root),
            destination=dest,
            starting=starting,
            max_messages_per_trigger=_positive_int(opts, "maxmessagespertrigger"),
            max_messages_per_partition=_positive_int(opts, "maxmessagesperpartition")
            or DEFAULT_MAX_MESSAGES_PER_PARTITION,
        )


def _positive_int(opts: Mapping[str, str], key: str) -> int | None:
    raw = opts.get(key)
    if raw is None:
        return None
    try:
        value = int(raw)
    except ValueError:
        value = 0
    if value <= 0:
        raise ConfigError(
            f"option {_KNOWN[key]!r} must be a positive integer, got {raw!r}", setting=_KNOWN[key]
        )
    return value
