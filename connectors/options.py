"""Options of ``format("sparkmq")``, parsed once into a typed object.

Named after Spark's Kafka and Delta sources where they mean the same thing. An unknown or
malformed option is a :class:`~spark_mq.errors.ConfigError` naming it.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field

from spark_mq.errors import ConfigError
from spark_mq.journal.layout import normalize_root
from spark_mq.names import validate_name

DEFAULT_MAX_MESSAGES_PER_PARTITION = 100_000
EARLIEST, LATEST = -2, -1  # in JSON offsets, as Kafka's source spells them
GROUPING_KEYS = ("group_id", "dedup_id", "message_id")

# a broker client's options -> Producer / Consumer / Admin keyword arguments
_AUTH_OPTIONS = (
    ("username", "username"),
    ("password", "password"),
    ("token", "token"),
    ("tlsCaFile", "tls_ca_file"),
    ("tlsCertFile", "tls_cert_file"),
    ("tlsKeyFile", "tls_key_file"),
)
# lower-cased key Spark hands us -> the option's documented name
_KNOWN = {
    n.lower(): n
    for n in (
        "path",
        "root",
        "destination",
        "destinationPattern",
        "startingOffsets",
        "startingTimestamp",
        "endingOffsets",
        "maxMessagesPerTrigger",
        "maxBytesPerTrigger",
        "maxMessagesPerPartition",
        "failOnDataLoss",
        "includeHeaders",
        "groupingKey",
        "groupingPartitions",
        "consumer",
        "url",
        "subscription",
        *(option for option, _ in _AUTH_OPTIONS),
    )
}
# options that place a read in the log; a broker consumer's place is its claims
_LOG_ONLY = ("startingoffsets", "startingtimestamp", "endingoffsets", "groupingpartitions")
DEFAULT_URL = "grpc://127.0.0.1:7676"
DEFAULT_MAX_CLAIM = 10_000


@dataclass(frozen=True)
class BrokerAuth:
    """The credentials and TLS files a query presents to the broker (options ``username``,
    ``password`` or ``token``, ``tlsCaFile``, ``tlsCertFile``, ``tlsKeyFile``; absent ones come
    from the executors' ``SPARKMQ_*`` environment as for the SDK). Spark redacts options named
    like ``password`` and ``token`` in plans and the UI (``spark.redaction.regex``); this
    object's ``repr`` leaves the secrets out too, wherever a partition or an error shows it."""

    username: str | None = None
    password: str | None = field(default=None, repr=False)
    token: str | None = field(default=None, repr=False)
    tls_ca_file: str | None = None
    tls_cert_file: str | None = None
    tls_key_file: str | None = None

    @classmethod
    def parse(cls, opts: Mapping[str, str]) -> BrokerAuth:
        """From lower-cased options."""
        return cls(**{field: opts.get(option.lower()) for option, field in _AUTH_OPTIONS})

    def kwargs(self) -> dict[str, str | None]:
        """Keyword arguments of ``Producer``, ``Consumer`` and ``Admin``."""
        return {f: getattr(self, f) for _, f in _AUTH_OPTIONS}


AUTH_OPTION_NAMES = tuple(o.lower() for o, _ in _AUTH_OPTIONS)


@dataclass(frozen=True)
class SourceOptions:
    root: str
    destinations: tuple[str, ...]  # empty when a pattern picks them
    pattern: str | None
    # "earliest" | "latest" | {destination: offset or EARLIEST / LATEST}
    starting: str | dict[str, int]
    starting_timestamp_ms: int | None
    ending: str | dict[str, int]  # batch reads only
    max_messages_per_trigger: int | None
    max_bytes_per_trigger: int | None
    max_messages_per_partition: int
    fail_on_data_loss: bool
    include_headers: bool
    grouping_key: str
    grouping_partitions: int | None
    # consuming through the broker: the query's consumer name (None: read the log in place)
    consumer: str | None = None
    url: str = DEFAULT_URL
    subscription: str | None = None
    auth: BrokerAuth = field(default_factory=BrokerAuth)

    @property
    def through_broker(self) -> bool:
        return self.consumer is not None

    @classmethod
    def parse(cls, options: Mapping[str, str]) -> SourceOptions:
        opts = {k.lower(): v for k, v in options.items()}
        unknown = sorted(k for k in opts if k not in _KNOWN)
        if unknown:
            raise ConfigError(
                f"unknown sparkmq option(s) {unknown}; known: {sorted(_KNOWN.values())}",
                setting=unknown[0],
            )
        if "consumer" in opts:
            return cls._broker_mode(opts)
        for key in ("url", "subscription", *AUTH_OPTION_NAMES):
            if key in opts:
                raise ConfigError(
                    f"option {_KNOWN[key]!r} needs 'consumer' (a name for this query's claims): "
                    "without it the query reads the Delta log in place",
                    setting=_KNOWN[key],
                )
        root = opts.get("root") or opts.get("path")
        if not root:
            raise ConfigError(
                "option 'root' (the broker's data directory or URI) is required, e.g. "
                ".option('root', './data') or .load('./data')",
                setting="root",
            )
        listed, pattern = _destinations(opts)
        grouping_key = opts.get("groupingkey", "group_id")
        if grouping_key not in GROUPING_KEYS:
            raise ConfigError(
                f"option 'groupingKey' must be one of {list(GROUPING_KEYS)}, got {grouping_key!r}",
                setting="groupingKey",
            )
        return cls(
            root=normalize_root(root),
            destinations=listed,
            pattern=pattern,
            starting=_offsets(opts, "startingoffsets", "earliest", ("earliest", "latest")),
            starting_timestamp_ms=_positive_int(opts, "startingtimestamp", zero_ok=True),
            ending=_offsets(opts, "endingoffsets", "latest", ("latest",)),
            max_messages_per_trigger=_positive_int(opts, "maxmessagespertrigger"),
            max_bytes_per_trigger=_positive_int(opts, "maxbytespertrigger"),
            max_messages_per_partition=_positive_int(opts, "maxmessagesperpartition")
            or DEFAULT_MAX_MESSAGES_PER_PARTITION,
            fail_on_data_loss=_bool(opts, "failondataloss", True),
            include_headers=_bool(opts, "includeheaders", True),
            grouping_key=grouping_key,
            grouping_partitions=_positive_int(opts, "groupingpartitions"),
        )

    @classmethod
    def _broker_mode(cls, opts: Mapping[str, str]) -> SourceOptions:
        """``consumer`` set: consume one queue, or a topic's durable subscription, through the
        broker in claims (what the query holds is invisible to others until it commits)."""
        given = [_KNOWN[k] for k in (*_LOG_ONLY, "maxbytespertrigger") if k in opts] + (
            ["destinationPattern"] if "destinationpattern" in opts else []
        )
        if given:
            raise ConfigError(
                f"option(s) {given} do not apply when consuming through the broker ('consumer' "
                "is set): the broker decides what each micro-batch claims",
                setting=given[0],
            )
        listed, _ = _destinations(opts)
        if len(listed) != 1:
            raise ConfigError(
                "consuming through the broker reads one destination", setting="destination"
            )
        consumer = opts["consumer"]
        subscription = opts.get("subscription")
        try:
            validate_name(consumer, "consumer")
            if subscription is not None:
                validate_name(subscription, "subscription")
        except Exception as exc:
            raise ConfigError(f"{exc}", setting="consumer") from None
        url = opts.get("url", DEFAULT_URL)
        if "://" not in url:
            raise ConfigError(
                f"option 'url' must look like grpc://host:port, got {url!r}", setting="url"
            )
        root = opts.get("root") or opts.get("path")
        return cls(
            root=normalize_root(root) if root else "",
            destinations=listed,
            pattern=None,
            starting="earliest",
            starting_timestamp_ms=None,
            ending="latest",
            max_messages_per_trigger=_positive_int(opts, "maxmessagespertrigger")
            or DEFAULT_MAX_CLAIM,
            max_bytes_per_trigger=None,
            max_messages_per_partition=_positive_int(opts, "maxmessagesperpartition")
            or DEFAULT_MAX_MESSAGES_PER_PARTITION,
            fail_on_data_loss=True,
            include_headers=_bool(opts, "includeheaders", True),
            grouping_key="group_id",
            grouping_partitions=None,
            consumer=consumer,
            url=url,
            subscription=subscription,
            auth=BrokerAuth.parse(opts),
        )


def _destinations(opts: Mapping[str, str]) -> tuple[tuple[str, ...], str | None]:
    raw, pattern = opts.get("destination"), opts.get("destinationpattern")
    if raw is None and pattern is None:
        raise ConfigError(
            "option 'destination' is required (a name, or names separated by commas), or "
            "'destinationPattern' (a regular expression over destination names)",
            setting="destination",
        )
    if raw is not None and pattern is not None:
        raise ConfigError(
            "give either 'destination' or 'destinationPattern', not both", setting="destination"
        )
    if pattern is not None:
        try:
            re.compile(pattern)
        except re.error as exc:
            raise ConfigError(
                f"option 'destinationPattern' is not a regular expression: {exc}",
                setting="destinationPattern",
            ) from None
        return (), pattern
    names = tuple(n.strip() for n in raw.split(",") if n.strip())  # type: ignore[union-attr]
    if not names:
        raise ConfigError("option 'destination' names no destination", setting="destination")
    for n in names:
        try:
            validate_name(n)
        except Exception as exc:
            raise ConfigError(f"option 'destination': {exc}", setting="destination") from None
    if len(set(names)) != len(names):
        raise ConfigError("option 'destination' names a destination twice", setting="destination")
    return names, None


def _offsets(
    opts: Mapping[str, str], key: str, default: str, words: tuple[str, ...]
) -> str | dict[str, int]:
    name = _KNOWN[key]
    raw = opts.get(key, default).strip()
    if raw.lower() in words:
        return raw.lower()
    try:
        doc = json.loads(raw)
    except ValueError:
        doc = None
    if not isinstance(doc, dict) or not all(
        isinstance(v, int) and not isinstance(v, bool) and v >= EARLIEST for v in doc.values()
    ):
        raise ConfigError(
            f"option {name!r} must be {' or '.join(repr(w) for w in words)} or JSON like "
            f'{{"orders": 42, "events": -2}} (an offset, -2 earliest, -1 latest), got {raw!r}',
            setting=name,
        )
    return {str(k): int(v) for k, v in doc.items()}


def _bool(opts: Mapping[str, str], key: str, default: bool) -> bool:
    raw = opts.get(key)
    if raw is None:
        return default
    value = raw.strip().lower()
    if value not in ("true", "false"):
        raise ConfigError(
            f"option {_KNOWN[key]!r} must be true or false, got {raw!r}", setting=_KNOWN[key]
        )
    return value == "true"


def _positive_int(opts: Mapping[str, str], key: str, *, zero_ok: bool = False) -> int | None:
    raw = opts.get(key)
    if raw is None:
        return None
    try:
        value = int(raw)
    except ValueError:
        value = -1
    if value < 0 or (value == 0 and not zero_ok):
        raise ConfigError(
            f"option {_KNOWN[key]!r} must be a positive integer, got {raw!r}", setting=_KNOWN[key]
        )
    return value
