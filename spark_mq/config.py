"""Broker configuration: typed, defaulted, validated at start-up.

Sources, later ones winning: the built-in defaults, a TOML file (``conf/broker.toml`` documents
every setting), environment variables ``SPARKMQ_<SECTION>__<KEY>`` (for example
``SPARKMQ_BROKER__PORT=7777``), and ``section.key=value`` overrides from the command line.
An invalid or unknown setting raises :class:`~spark_mq.errors.ConfigError` naming it.
"""

from __future__ import annotations

import difflib
import os
import socket
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

import tomllib
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from spark_mq.errors import ConfigError
from spark_mq.names import MAX_PARTITIONS

ENV_PREFIX = "SPARKMQ_"
MiB = 1024 * 1024


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class BrokerSection(_Section):
    # the interface every listener binds: 127.0.0.1 (this machine only), 0.0.0.0 (all; with
    # security off only with --insecure), or one address. Empty is refused: it would mean all.
    host: str = Field("127.0.0.1", min_length=1, pattern=r"^\S+$")
    port: int = Field(7676, ge=0, le=65535)
    # the direct wire (spark_mq.wire): producers' and consumers' low-latency transport
    wire: bool = True
    wire_port: int = Field(7677, ge=0, le=65535)
    # the wire also on a local socket (Linux), which clients on this machine use
    wire_local: bool = True
    data_dir: str = "./data"
    persistence: Literal["delta", "memory"] = "delta"
    # a producer or consumer naming an unknown destination creates it as a queue
    auto_create_queues: bool = True
    # an auto-created queue with no consumer and no message left goes after this long idle
    auto_delete_delay_s: float = Field(5.0, ge=0)
    # direct-wire connections: the first frame must arrive within handshake_timeout_s; a frame
    # once begun within frame_timeout_s plus a second per MiB of it; a producer connection
    # with nothing in flight is closed after idle_timeout_s (0: never); at most
    # max_connections at once; a connection is not read while more than
    # max_unsent_bytes wait to be written to it (or are still to come: answers to its frames)
    handshake_timeout_s: float = Field(10.0, gt=0)
    frame_timeout_s: float = Field(30.0, gt=0)
    idle_timeout_s: float = Field(600.0, ge=0)
    max_connections: int = Field(1000, ge=1)
    max_unsent_bytes: int = Field(16 * MiB, ge=64 * 1024)
    # SIGTERM: connections get this long to finish (settles answered, produces acknowledged)
    # before they are closed and the broker stops
    shutdown_grace_s: float = Field(10.0, ge=0)
    # listen on an interface other than loopback with security off (refused otherwise)
    insecure: bool = False
    # the HTTP listener (spark_mq.ops): /metrics, /healthz, /readyz and the console at /;
    # 8161 is the port Artemis's console uses; 0 picks a free one
    http: bool = True
    http_port: int = Field(8161, ge=0, le=65535)
    # an HTTP request (TLS handshake, line, headers, body) must have come within this, and a
    # kept-alive connection is closed after waiting as long for the next one; at most 64
    # connections, 32 from one host (a new one takes the place of the one waiting longest)
    http_request_timeout_s: float = Field(10.0, gt=0, le=600)
    # keep the journal's histograms (commit sizes and latency, produce-to-ack latency);
    # everything else /metrics shows is read when it is scraped
    metrics: bool = True
    # an idle console login lasts this long
    console_session_s: float = Field(1800.0, gt=0)
    # STOMP 1.0-1.2 (spark_mq.transports.stomp): clients in every language; 61613 is the
    # port STOMP brokers use, 0 picks a free one. The broker offers to send a heart-beat this
    # often and asks one of the client as often (0: none); a client silent for twice the
    # agreed interval is dropped
    stomp: bool = True
    stomp_port: int = Field(61613, ge=0, le=65535)
    stomp_heartbeat_ms: int = Field(10_000, ge=0)
    # how often a STOMP subscription to a partitioned destination looks for partitions added
    stomp_partitions_recheck_s: float = Field(10.0, gt=0)
    # a STOMP frame's headers (the body's limit is limits.max_message_bytes)
    stomp_max_headers: int = Field(64, ge=1, le=10_000)
    stomp_max_header_bytes: int = Field(16 * 1024, ge=256)
    # Kafka (spark_mq.transports.kafka): Kafka clients of every language; 9092 is Kafka's port,
    # 0 picks a free one. Metadata tells clients to reach this broker at the advertised host and
    # port (empty / 0: broker.host and the port it listens on): set them when clients reach it
    # through another name (a load balancer, a container's published port)
    kafka: bool = True
    kafka_port: int = Field(9092, ge=0, le=65535)
    kafka_advertised_host: str = Field("", pattern=r"^\S*$")
    kafka_advertised_port: int = Field(0, ge=0, le=65535)
    # a Kafka request's size (Kafka's socket.request.max.bytes; a produce's records are also
    # bounded per message by limits.max_message_bytes)
    kafka_max_request_bytes: int = Field(16 * MiB, ge=64 * 1024)
    # a new consumer group's first rebalance waits this long for more members to join (Kafka's
    # group.initial.rebalance.delay.ms, 3000 there)
    kafka_group_initial_delay_ms: int = Field(500, ge=0, le=300_000)
    # a topic created through Kafka (CreateTopics, or a Kafka client naming one) keeps its
    # messages this long for the log's readers (the destination setting retention_s; Kafka's
    # retention.ms, a week by default); so do the consumer groups' committed offsets
    kafka_retention_s: float = Field(7 * 24 * 3600.0, ge=0)


class JournalSection(_Section):
    buffer_timeout_ms: float = Field(0.0, ge=0, le=10_000)
    # while messages flow, a flush of settlements alone (acks) waits this long to share their sync
    settle_timeout_ms: float = Field(1.0, ge=0, le=10_000)
    buffer_size_bytes: int = Field(490 * 1024, ge=1)
    max_pending_bytes: int = Field(256 * MiB, ge=1)
    checkpoint_interval: int = Field(100, ge=1)
    hot_tier: bool = True
    hot_dir: str = ""
    segment_bytes: int = Field(64 * MiB, ge=64 * 1024)
    sync: Literal["fsync", "fdatasync", "none"] = "fdatasync"
    move_interval_ms: float = Field(500.0, gt=0)
    move_max_bytes: int = Field(128 * MiB, ge=1)
    hot_max_bytes: int = Field(1024 * MiB, ge=1)
    # the movers' (and delta-rs's threads') scheduling priority: they yield the CPU to the loop
    # (Linux's nice, 0-19; 0: the same as the loop's)
    mover_nice: int = Field(10, ge=0, le=19)


class DeliverySection(_Section):
    mark_interval_s: float = Field(5.0, gt=0)
    default_prefetch: int = Field(100, ge=1, le=100_000)
    lease_check_interval_ms: float = Field(100.0, gt=0)
    max_delivery_batch: int = Field(1000, ge=1)
    # the expiry reaper (the seeds' message.expiration.interval)
    expiry_scan_interval_s: float = Field(60.0, gt=0)
    # a consumer with a selector, or held back by message groups, skips at most this many
    # waiting messages per delivery (bounds the cost of a delivery on a deep queue)
    max_scan: int = Field(20_000, ge=100)
    # record each delivery before it is made (Artemis persist-delivery-count-before-delivery)
    persist_delivery_count: bool = False


class LimitsSection(_Section):
    max_message_bytes: int = Field(70 * MiB, ge=1)
    max_batch_bytes: int = Field(256 * MiB, ge=1)
    # system-wide: unsettled messages / bytes held across every destination (0 = unlimited)
    max_messages: int = Field(0, ge=0)
    max_bytes: int = Field(0, ge=0)
    overflow: Literal["reject", "block", "drop_oldest"] = "reject"
    block_timeout_s: float = Field(30.0, gt=0)
    # memory held for unsettled messages; 0 = a quarter of the machine's memory
    memory_budget_bytes: int = Field(0, ge=0)
    # producers are refused while the journal's disk has less free than this (0: never)
    min_free_disk_bytes: int = Field(50 * MiB, ge=0)


Overflow = Literal["reject", "block", "drop_oldest"]


class DestinationSettings(_Section):
    """Per-destination behaviour (Artemis address-settings). ``[destinations]`` holds the
    defaults; a destination created with overrides keeps them in the bindings log."""

    delivery_policy: Literal["round_robin", "failover", "single"] = "round_robin"
    max_delivery_attempts: int = Field(10, ge=0)  # then dead-letter; 0 = never
    redelivery_delay_ms: float = Field(0.0, ge=0)
    redelivery_multiplier: float = Field(1.0, ge=1.0)
    max_redelivery_delay_ms: float | None = Field(None, ge=0)  # None: 10 x redelivery_delay_ms
    dead_letter: bool = True  # dead-letter into DLQ.<name>; false drops the message
    default_ttl_ms: int = Field(0, ge=0)  # 0: messages without a TTL never expire
    expiry: Literal["drop", "queue"] = "drop"  # "queue": expired messages go to EXP.<name>
    group_buckets: int = Field(1024, ge=1, le=1_048_576)
    max_messages: int = Field(0, ge=0)  # unsettled messages held (0 = unlimited)
    max_bytes: int = Field(0, ge=0)  # unsettled body bytes held (0 = unlimited)
    overflow: Overflow = "reject"
    auto_delete: bool = False  # deleted once unused and empty (auto-created queues)
    # a topic's messages are kept at least this long after they came, owed to a subscription
    # or not: what a log's readers (Kafka consumers, format("sparkmq")) may read again
    # (Kafka's retention.ms). 0: kept while a subscription owes them (JMS topics)
    retention_s: float = Field(0.0, ge=0)
    # set at creation only: the destination is this many destinations (its partitions), each
    # placed on its own; producers spread messages over them by group id (Kafka's partitions)
    partitions: int = Field(1, ge=1, le=MAX_PARTITIONS)

    def redelivery_delay_s(self, delivery_count: int) -> float:
        """The wait before redelivering a message that was delivered ``delivery_count`` times."""
        if self.redelivery_delay_ms <= 0:
            return 0.0
        cap = self.max_redelivery_delay_ms
        if cap is None:
            cap = 10 * self.redelivery_delay_ms
        delay = self.redelivery_delay_ms * self.redelivery_multiplier ** max(delivery_count - 1, 0)
        return min(delay, cap) / 1000

    def with_overrides(self, overrides: Mapping[str, Any]) -> DestinationSettings:
        try:
            return DestinationSettings.model_validate({**self.model_dump(), **overrides})
        except ValidationError as exc:
            first = exc.errors()[0]
            raise ConfigError(
                _format_validation(exc, DestinationSettings),
                setting=".".join(str(p) for p in first["loc"]),
            ) from None


class DuplicatesSection(_Section):
    cache_size: int = Field(20_000, ge=0)
    window_s: float = Field(300.0, gt=0)


class LoggingSection(_Section):
    level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = "INFO"
    file: str = "logs/log.txt"
    max_file_bytes: int = Field(10 * MiB, ge=1024)
    backups: int = Field(9, ge=0, le=99)
    # "text" (a line a record) or "json" (a JSON object a line, with destination, consumer
    # and principal fields where they apply: for log shippers)
    format: Literal["text", "json"] = "text"


class SecuritySection(_Section):
    """Who may connect and do what, and TLS (see conf/broker.toml's [security])."""

    # off: every client is anonymous and may do everything, and the broker listens on loopback
    # only (unless broker.insecure); on: every connection authenticates, access is denied
    # unless the access-control file allows it
    enabled: bool = False
    users_file: str = "conf/users.toml"
    acl_file: str = "conf/acl.toml"
    # bearer tokens (JWT): verified with a PEM public key or a JWKS file; "" = none accepted
    jwt_public_key_file: str = ""
    jwks_file: str = ""
    jwt_algorithms: list[str] = Field(default_factory=lambda: ["RS256", "ES256"])
    jwt_audience: str = ""  # "" = not checked
    jwt_issuer: str = ""  # "" = not checked
    jwt_user_claim: str = "sub"
    jwt_groups_claim: str = "groups"
    # TLS on the Flight service and the direct wire's TCP port (not its local socket)
    tls_cert_file: str = ""
    tls_key_file: str = ""
    # a CA that client certificates must chain to (mutual TLS); a verified certificate's
    # common name is the client's identity on the direct wire
    tls_client_ca_file: str = ""
    # after a failed login the next attempt from that host waits this long, doubling up to
    # failed_login_max_delay_s (reset by a success)
    failed_login_delay_s: float = Field(0.2, ge=0)
    failed_login_max_delay_s: float = Field(5.0, ge=0)
    # authentication failures, denied verbs and admin actions, one JSON object a line
    audit_file: str = "logs/audit.log"
    audit_max_file_bytes: int = Field(10 * MiB, ge=1024)
    audit_backups: int = Field(9, ge=0, le=99)


class HASection(_Section):
    """High availability (see conf/broker.toml's [ha])."""

    # "none": one broker; "shared-store": a primary and a backup on the same data directory (a
    # shared volume): whoever holds its lock serves, the other waits to take over
    # "replication": each broker has its own hot directory (journal.hot_dir), the primary
    # ships every record to the backup's
    mode: Literal["none", "shared-store", "replication"] = "none"
    # how this broker names itself in the ownership record and the log, and the directory
    # of its own log files under a shared data_dir ("" = this machine's name; its process id
    # is added in the ownership record)
    broker_id: str = Field("", pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$|^$")
    # a waiting backup tries the data directory's lock this often (s): the failover time after
    # the primary's process ends is at most this plus recovery
    lock_poll_s: float = Field(0.2, gt=0, le=60)
    # replication: the other broker's replication address (host:port), and this one's port
    peer: str = Field("", pattern=r"^$|^[^:\s]*:\d{1,5}$")  # host:port
    replication_port: int = Field(7678, ge=0, le=65535)
    # "replicated": a produce or an ack is acknowledged once the backup has it durable too;
    # "local": once this broker has (the backup may lag behind, and may not take over then)
    ack: Literal["replicated", "local"] = "replicated"
    # the backup takes over when it has heard nothing from the primary this long (s); the
    # primary goes on alone when its backup has not answered this long
    failover_timeout_s: float = Field(3.0, gt=0, le=600)
    # the primary's heartbeat to its backup when there is nothing to ship (s)
    heartbeat_s: float = Field(0.5, gt=0, le=60)


class ClusterSection(_Section):
    """A cluster of brokers on one shared data root (see conf/broker.toml's [cluster])."""

    # ZooKeeper's ensemble, as its clients write it: "host:port[,host:port...][/chroot]"
    # ("" = no cluster: this broker serves every destination of its data_dir alone)
    zookeeper: str = Field("", pattern=r"^\S*$")
    # the cluster's name: its znodes live under /sparkmq/<name>; several clusters may share an
    # ensemble
    name: str = Field("sparkmq", pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$")
    # a member silent this long (s) is given up by the others, and its destinations move
    session_timeout_s: float = Field(10.0, ge=2, le=600)
    # the address clients are sent to for this member's destinations ("" = the Flight URL it
    # listens on: broker.host and broker.port)
    advertised_url: str = Field("", pattern=r"^$|^grpc(\+tls)?://\S+:\d{1,5}$")
    # how long a request for a destination being placed (just created, or whose owner just
    # left) waits for its owner before answering "not owned yet, try again" (s); a listener's
    # loop, which serves many clients, never waits: it answers at once
    placement_wait_s: float = Field(5.0, ge=0, le=60)
    # a member given a destination waits this long (s) at most for the member it moves from to
    # let it go (commit what it took, tell its clients) before fencing it anyway
    hand_over_wait_s: float = Field(5.0, ge=0, le=60)
    # ZooKeeper's digest authentication ("user:password"; "" = none). With it, the cluster's
    # znodes are readable and writable by that identity only
    zookeeper_auth: str = ""
    # TLS to ZooKeeper (its secureClientPort): the server's certificate is checked against
    # zookeeper_tls_ca_file ("" = the system's CAs) and must name the host in
    # cluster.zookeeper; a certificate and key of the member's own when the ensemble asks for
    # one (ssl.clientAuth)
    zookeeper_tls: bool = False
    zookeeper_tls_ca_file: str = ""
    zookeeper_tls_cert_file: str = ""
    zookeeper_tls_key_file: str = ""


class BrokerConfig(_Section):
    broker: BrokerSection = BrokerSection()
    journal: JournalSection = JournalSection()
    delivery: DeliverySection = DeliverySection()
    limits: LimitsSection = LimitsSection()
    duplicates: DuplicatesSection = DuplicatesSection()
    destinations: DestinationSettings = DestinationSettings()
    logging: LoggingSection = LoggingSection()
    security: SecuritySection = SecuritySection()
    ha: HASection = HASection()
    cluster: ClusterSection = ClusterSection()
    # what delta-rs needs to reach an object-store data_dir: credentials, endpoint, region,
    # aws_allow_http... (delta-rs's storage option names); passed to every Delta call, never
    # logged. Also SPARKMQ_STORAGE__<NAME> in the environment (and delta-rs reads AWS_*,
    # AZURE_*, GOOGLE_* variables itself).
    storage: dict[str, str] = {}

    def log_path(self) -> Path | None:
        """Where the rotating log goes; relative paths sit under a local data_dir (see
        :meth:`_own_file`)."""
        if not self.logging.file:
            return None
        return self._own_file(self.logging.file)

    def audit_path(self) -> Path:
        """Where the audit log goes; relative paths sit under a local data_dir, as the log's."""
        return self._own_file(self.security.audit_file)

    def _own_file(self, name: str) -> Path:
        """A file of this broker's own: an absolute path as it is; a relative one under a local
        data_dir (the working directory for a remote one). The two brokers of a
        high-availability pair share the data_dir, so each gets a directory of its own there,
        named after ``ha.broker_id`` (this machine's name without one): ``logs/log.txt``
        becomes ``logs/<broker_id>/log.txt``, and the two never write one file."""
        path = Path(name)
        if path.is_absolute():
            return path
        data = self.broker.data_dir
        base = Path(data) if "://" not in data else Path.cwd()
        if self.ha.mode != "none" or self.clustered:
            member = self.ha.broker_id or socket.gethostname()
            path = path.parent / member / path.name
        return base / path

    @property
    def clustered(self) -> bool:
        """Whether this broker is a member of a cluster (``cluster.zookeeper``)."""
        return bool(self.cluster.zookeeper)

    def hot_dir(self) -> str | None:
        """The root of the hot tier, or None when there is none (memory, or disabled).

        A cluster member's is shared by every member (spark_mq.journal.sealing): under the
        data root when it is a file system, else ``journal.hot_dir`` (which must then be on a
        file system every member mounts). A member whose data root is an object store and
        that has no ``journal.hot_dir`` has no hot tier: it acknowledges once a message is
        committed to Delta."""
        if not self.journal.hot_tier:
            return None
        if self.clustered and not self.journal.hot_dir and self._remote_data():
            return None
        return self.hot_dir_location()

    def _remote_data(self) -> bool:
        data = self.broker.data_dir
        return "://" in data and not data.startswith("file://")

    def hot_dir_location(self) -> str | None:
        """Where the hot tier lives (or would), whether or not it is enabled."""
        if self.broker.persistence != "delta":
            return None
        if self.journal.hot_dir:
            return os.path.abspath(self.journal.hot_dir)
        data = self.broker.data_dir
        if "://" in data and not data.startswith("file://"):
            raise ConfigError(
                f"journal.hot_dir must name a local directory when broker.data_dir is remote "
                f"({data}); or set journal.hot_tier = false",
                setting="journal.hot_dir",
            )
        return os.path.join(os.path.abspath(data.removeprefix("file://")), "_hot")


def _deep_set(doc: dict[str, Any], dotted: str, value: Any, origin: str) -> None:
    parts = dotted.split(".")
    if len(parts) != 2 or not all(parts):
        raise ConfigError(f"{origin}: expected section.key, got {dotted!r}", setting=dotted)
    section = doc.setdefault(parts[0], {})
    if not isinstance(section, dict):
        raise ConfigError(f"{origin}: {parts[0]!r} is not a section", setting=dotted)
    section[parts[1]] = value


def _env_overrides(environ: Mapping[str, str]) -> dict[str, Any]:
    doc: dict[str, Any] = {}
    for key, value in environ.items():
        if key.startswith(ENV_PREFIX) and "__" in key:
            dotted = key[len(ENV_PREFIX) :].lower().replace("__", ".")
            _deep_set(doc, dotted, value, f"environment variable {key}")
    return doc


def _merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in over.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _merge(out[key], value)
        else:
            out[key] = value
    return out


def _valid_names(model: type[BaseModel], loc: tuple[Any, ...]) -> list[str]:
    """The settings a section named by ``loc`` (its path, then the unknown key) has."""
    for part in loc[:-1]:
        field = model.model_fields.get(str(part))
        inner = field.annotation if field is not None else None
        if not (isinstance(inner, type) and issubclass(inner, BaseModel)):
            return []
        model = inner
    return sorted(model.model_fields)


def _format_validation(exc: ValidationError, model: type[BaseModel]) -> str:
    lines = []
    for err in exc.errors():
        setting = ".".join(str(p) for p in err["loc"])
        if err["type"] == "extra_forbidden":
            names = _valid_names(model, err["loc"])
            close = difflib.get_close_matches(str(err["loc"][-1]), names, n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            if len(err["loc"]) == 1 and model is BrokerConfig:
                valid = f"the sections are {', '.join(names)}"
            else:
                valid = f"valid settings here: {', '.join(names)}"
            lines.append(f"unknown setting {setting!r}{hint} ({valid})")
        else:
            lines.append(f"invalid setting {setting} = {err.get('input')!r}: {err['msg']}")
    return "; ".join(lines)


def load_config(
    path: str | os.PathLike[str] | None = None,
    *,
    overrides: Mapping[str, Any] | None = None,
    environ: Mapping[str, str] | None = None,
) -> BrokerConfig:
    """Build the broker config from a TOML file, the environment and explicit overrides.

    ``overrides`` maps ``section.key`` to a value (the CLI's flags and ``--set`` pairs).
    """
    doc: dict[str, Any] = {}
    if path is not None:
        try:
            with open(path, "rb") as fh:
                doc = tomllib.load(fh)
        except FileNotFoundError as exc:
            raise ConfigError(f"config file not found: {path}", setting="--config") from exc
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(
                f"config file {path} is not valid TOML: {exc}", setting="--config"
            ) from exc
    doc = _merge(doc, _env_overrides(os.environ if environ is None else environ))
    cli: dict[str, Any] = {}
    for dotted, value in (overrides or {}).items():
        _deep_set(cli, dotted, value, "command line")
    doc = _merge(doc, cli)
    try:
        config = BrokerConfig.model_validate(doc)
    except ValidationError as exc:
        first = exc.errors()[0]
        raise ConfigError(
            _format_validation(exc, BrokerConfig), setting=".".join(str(p) for p in first["loc"])
        ) from None
    config.hot_dir()  # settings that only make sense together
    _check_cluster(config)
    if config.destinations.partitions != 1:
        raise ConfigError(
            "destinations.partitions: a destination's partitions are set when it is created "
            "(Admin.create_queue(name, partitions=N), sparkmq queue create NAME --set "
            "partitions=N), not as a default for all",
            setting="destinations.partitions",
        )
    return config


def _check_cluster(config: BrokerConfig) -> None:
    if not config.clustered:
        return
    if config.broker.persistence != "delta":
        raise ConfigError(
            'a cluster needs broker.persistence = "delta": its members share the data root',
            setting="cluster.zookeeper",
        )
    if config.ha.mode != "none":
        raise ConfigError(
            f"ha.mode = {config.ha.mode!r} and cluster.zookeeper together are not supported: "
            'a cluster\'s members replace each other (leave ha.mode = "none")',
            setting="ha.mode",
        )
    if not config.ha.broker_id:
        raise ConfigError(
            "a cluster member needs a name of its own that stays the same across restarts: "
            "set ha.broker_id (e.g. --set ha.broker_id=member-1)",
            setting="ha.broker_id",
        )
    c = config.cluster
    files = {
        "cluster.zookeeper_tls_ca_file": c.zookeeper_tls_ca_file,
        "cluster.zookeeper_tls_cert_file": c.zookeeper_tls_cert_file,
        "cluster.zookeeper_tls_key_file": c.zookeeper_tls_key_file,
    }
    given = {k: v for k, v in files.items() if v}
    if given and not c.zookeeper_tls:
        raise ConfigError(
            f"{', '.join(given)} given with cluster.zookeeper_tls = false: set it to true "
            "(ZooKeeper's secureClientPort)",
            setting="cluster.zookeeper_tls",
        )
    if bool(c.zookeeper_tls_cert_file) != bool(c.zookeeper_tls_key_file):
        raise ConfigError(
            "cluster.zookeeper_tls_cert_file and cluster.zookeeper_tls_key_file go together",
            setting="cluster.zookeeper_tls_cert_file",
        )
    for setting, path in given.items():
        if not Path(path).is_file():
            raise ConfigError(f"{setting}: no file {path}", setting=setting)
