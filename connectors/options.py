"""Options of ``format("sparkmq")``, parsed once into a typed object.

Named after Spark's Kafka and Delta sources where they mean the same thing, and Kafka's own
names are taken too (:data:`KAFKA_ALIASES`; ``startingOffsets`` and ``endingOffsets`` in
Kafka's per-partition JSON, ``startingTimestamp`` as an ISO-8601 time,
``startingOffsetsByTimestamp``, ``minOffsetsPerTrigger`` with ``maxTriggerDelay``), so a query
written for Spark's Kafka source runs with only its format and connection options changed. An
unknown or malformed option is a :class:`~spark_mq.errors.ConfigError` naming it as it was
written (Spark's Python path hands options over lower-cased; the connector's JVM path keeps
their case), with the closest known option suggested.
"""

from __future__ import annotations

import difflib
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timezone

from spark_mq.errors import ConfigError
from spark_mq.journal.layout import normalize_root, with_options
from spark_mq.names import MAX_PARTITIONS, partition_name, validate_name, validate_stored_name

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
        "startingOffsetsByTimestamp",
        "minMessagesPerTrigger",
        "maxTriggerDelay",
        "kafkaColumns",
        *(option for option, _ in _AUTH_OPTIONS),
    )
}
# Kafka's names -> sparkmq's (the same meaning; a destination is a topic of one partition)
KAFKA_ALIASES = {
    "subscribe": "destination",
    "subscribePattern": "destinationPattern",
    "maxOffsetsPerTrigger": "maxMessagesPerTrigger",
    "minOffsetsPerTrigger": "minMessagesPerTrigger",
}
_ALIAS = {k.lower(): v.lower() for k, v in KAFKA_ALIASES.items()}
DEFAULT_MAX_TRIGGER_DELAY_S = 15 * 60.0  # Kafka's maxTriggerDelay default
# "storage.<name>": a delta-rs storage option for an object-store root (as the broker's
# [storage] section), e.g. .option("storage.aws_endpoint_url", "http://minio:9000")
STORAGE_PREFIX = "storage."
# options that place a read in the log; a broker consumer's place is its claims
_LOG_ONLY = (
    "kafkacolumns",
    "startingoffsets",
    "startingtimestamp",
    "startingoffsetsbytimestamp",
    "endingoffsets",
    "groupingpartitions",
    "minmessagespertrigger",
    "maxtriggerdelay",
)
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
    # per destination: start at the first message enqueued at or after this time (ms)
    starting_timestamps: dict[str, int] | None = None
    # wait for this many new messages before a micro-batch, at most max_trigger_delay_s
    min_messages_per_trigger: int | None = None
    max_trigger_delay_s: float = DEFAULT_MAX_TRIGGER_DELAY_S
    # Kafka's columns too: key, value, topic, timestamp, headers as array<struct<key,value>>
    kafka_columns: bool = False

    @property
    def through_broker(self) -> bool:
        return self.consumer is not None

    @classmethod
    def parse(cls, options: Mapping[str, str]) -> SourceOptions:
        opts = canonical(options, _KNOWN)
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
            root=with_options(root, storage_of(options)),
            destinations=listed,
            pattern=pattern,
            starting=_offsets(opts, "startingoffsets", "earliest", ("earliest", "latest")),
            starting_timestamp_ms=_timestamp(opts, "startingtimestamp"),
            starting_timestamps=_timestamps(opts, "startingoffsetsbytimestamp"),
            ending=_offsets(opts, "endingoffsets", "latest", ("latest",)),
            min_messages_per_trigger=_positive_int(opts, "minmessagespertrigger"),
            max_trigger_delay_s=_duration(opts, "maxtriggerdelay", DEFAULT_MAX_TRIGGER_DELAY_S),
            kafka_columns=_bool(opts, "kafkacolumns", False),
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


def storage_of(options: Mapping[str, str]) -> dict[str, str] | None:
    """The ``storage.<name>`` options, by delta-rs's names (lower-cased: Spark's Python path
    lower-cases option names, and delta-rs's are lower-case)."""
    found = {
        k[len(STORAGE_PREFIX) :].lower(): v
        for k, v in options.items()
        if k.lower().startswith(STORAGE_PREFIX)
    }
    return found or None


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
            validate_stored_name(n)
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
    why = ""
    try:
        doc = _per_destination(json.loads(raw))
    except PartitionError as exc:
        doc, why = None, f" ({exc})"
    except ValueError:
        doc = None
    if not isinstance(doc, dict) or not all(
        isinstance(v, int) and not isinstance(v, bool) and v >= EARLIEST for v in doc.values()
    ):
        raise ConfigError(
            f"option {name!r} must be {' or '.join(repr(w) for w in words)} or JSON like "
            f'{{"orders": 42, "events": -2}} (an offset, -2 earliest, -1 latest; Kafka\'s '
            f'{{"orders": {{"0": 42}}}} too), got {raw!r}{why}',
            setting=name,
        )
    return {str(k): int(v) for k, v in doc.items()}


class PartitionError(ValueError):
    """Kafka's per-partition JSON naming a partition that cannot be one."""


def _per_destination(doc: object) -> object:
    """Kafka's ``{"topic": {"0": value, "1": value}}`` as ``{"topic": value, "topic~1":
    value}`` (partition 0 is the topic's own name: a destination without partitions is one
    partition, 0; a partitioned one's partitions are ``<topic>~<i>``, and the reader takes
    ``<topic>`` for ``<topic>~0``); sparkmq's flat form as it is."""
    if not isinstance(doc, dict):
        return doc
    out = {}
    for k, v in doc.items():
        if not isinstance(v, dict):
            out[k] = v
            continue
        for index, value in v.items():
            if not (isinstance(index, str) and index.isdigit() and int(index) < MAX_PARTITIONS):
                raise PartitionError(f"{k}: {index!r} is not a partition (0 to "
                                     f"{MAX_PARTITIONS - 1})")  # fmt: skip
            out[k if int(index) == 0 else partition_name(k, int(index))] = value
    return out


def canonical(options: Mapping[str, str], known: Mapping[str, str]) -> dict[str, str]:
    """The options lower-cased, Kafka's names turned into sparkmq's; an unknown one is a
    ``ConfigError`` naming it as given and suggesting the closest known name."""
    opts: dict[str, str] = {}
    written: dict[str, str] = {}
    for key, value in options.items():
        low = key.lower()
        name = _ALIAS.get(low, low) if known is _KNOWN else low
        if name in opts:
            raise ConfigError(
                f"options {written[name]!r} and {key!r} say the same thing; give one",
                setting=key,
            )
        opts[name], written[name] = value, key
    unknown = [k for k in opts if k not in known and not k.startswith(STORAGE_PREFIX)]
    if unknown:
        given = written[unknown[0]]
        names = sorted({*known.values(), *(KAFKA_ALIASES if known is _KNOWN else ())})
        close = difflib.get_close_matches(given.lower(), [n.lower() for n in names], n=1)
        hint = ""
        if close:
            hint = f" (did you mean {next(n for n in names if n.lower() == close[0])!r}?)"
        raise ConfigError(
            f"unknown sparkmq option {given!r}{hint}; the options are {', '.join(names)}",
            setting=given,
        )
    return opts


def _timestamp(opts: Mapping[str, str], key: str) -> int | None:
    """Epoch milliseconds, or an ISO-8601 time (UTC unless it says otherwise)."""
    raw = opts.get(key)
    if raw is None:
        return None
    return _millis(raw.strip(), _KNOWN[key])


def _millis(raw: str | int, name: str) -> int:
    if isinstance(raw, int) and not isinstance(raw, bool):
        value = raw
    elif isinstance(raw, str) and re.fullmatch(r"\d+", raw):
        value = int(raw)
    elif isinstance(raw, str):
        try:
            when = datetime.fromisoformat(raw.replace("Z", "+00:00").replace("z", "+00:00"))
        except ValueError:
            raise ConfigError(
                f"option {name!r} must be epoch milliseconds or an ISO-8601 time like "
                f"2026-11-26T09:30:00Z, got {raw!r}",
                setting=name,
            ) from None
        if when.tzinfo is None:
            when = when.replace(tzinfo=timezone.utc)
        value = int(when.timestamp() * 1000)
    else:
        value = -1
    if value < 0:
        raise ConfigError(f"option {name!r}: a time cannot be {raw!r}", setting=name)
    return value


def _timestamps(opts: Mapping[str, str], key: str) -> dict[str, int] | None:
    """``startingOffsetsByTimestamp``: ``{"orders": 1764150000000}`` or Kafka's
    ``{"orders": {"0": 1764150000000}}``; a value may be an ISO-8601 time too."""
    raw = opts.get(key)
    if raw is None:
        return None
    name = _KNOWN[key]
    try:
        doc = _per_destination(json.loads(raw))
    except ValueError as exc:
        raise ConfigError(
            f'option {name!r} must be JSON like {{"orders": 1764150000000}} (epoch ms or '
            f"ISO-8601 per destination): {exc}",
            setting=name,
        ) from None
    if not isinstance(doc, dict) or not doc:
        raise ConfigError(f"option {name!r} must name destinations, got {raw!r}", setting=name)
    return {str(k): _millis(v, name) for k, v in doc.items()}


_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "min": 60.0, "h": 3600.0, "d": 86400.0}


def _duration(opts: Mapping[str, str], key: str, default: float) -> float:
    """Seconds from Kafka's duration strings (``15m``, ``30s``, ``500ms``; a bare number is
    milliseconds, as Kafka reads it)."""
    raw = opts.get(key)
    if raw is None:
        return default
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*(ms|s|m|min|h|d)?\s*", raw.lower())
    if m is None:
        raise ConfigError(
            f"option {_KNOWN[key]!r} must be a duration like 30s, 15m or 500ms, got {raw!r}",
            setting=_KNOWN[key],
        )
    return float(m.group(1)) * _UNITS[m.group(2) or "ms"]


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
