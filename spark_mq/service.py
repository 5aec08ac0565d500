"""Running the broker as a process: start, announce readiness, stop cleanly on SIGTERM/SIGINT."""

from __future__ import annotations

import contextlib
import gc
import json
import logging
import os
import signal
import threading
import time
from pathlib import Path
from typing import Any

import pyarrow as pa

from spark_mq.broker.core import Broker
from spark_mq.cluster.member import ClusterMember
from spark_mq.config import BrokerConfig
from spark_mq.connection.forwarding import Forwarding
from spark_mq.connection.gateway import Gateway
from spark_mq.connection.listener import Listener
from spark_mq.errors import DestinationNotFound, NotOwner, SparkMQError
from spark_mq.ha import term
from spark_mq.ha.ownership import Ownership
from spark_mq.ha.replication import ChannelSecurity
from spark_mq.journal.delta_store import DeltaStore
from spark_mq.journal.dir_lock import StoppedWaiting
from spark_mq.logs import setup_logging
from spark_mq.names import KAFKA_OFFSETS, partition_name
from spark_mq.ops.http import HttpListener, ServiceState
from spark_mq.security.authenticate import Credentials
from spark_mq.security.context import Security, check_protected, is_loopback
from spark_mq.security.credentials import Auth
from spark_mq.transports.direct_wire import WireServer
from spark_mq.transports.flight import FlightService
from spark_mq.transports.kafka.server import KafkaServer
from spark_mq.transports.stomp import StompServer

log = logging.getLogger("spark_mq.broker")
_LABELS = {"flight": "Flight", "wire": "direct-wire", "stomp": "STOMP", "kafka": "Kafka"}


class RunningBroker:
    """A broker with its Flight service (and the direct wire, when configured) listening.
    Usable in-process (tests, demo)."""

    def __init__(
        self,
        broker: Broker,
        host: str,
        port: int,
        *,
        until: threading.Event | None = None,
        security: Security | None = None,
    ) -> None:
        self.broker = broker
        config = broker.config
        check_protected(config, listening_on=host)
        # (made before anything starts: a bad file stops it; given: the process's, kept)
        self._owns_security = security is None
        self.security = security if security is not None else Security(config)
        self.scheme = "grpc+tls" if self.security.tls is not None else "grpc"
        if config.ha.mode != "none":
            broker.phase = "backup"  # until it owns the data
        try:
            # the term: the data directory, and with high availability the epoch and the
            # replication (a shared store's backup waits here, a replicating one follows)
            self.term = term.begin(
                config,
                broker.journal,
                broker.broker_id,
                until=until,
                on_deposed=broker.deposed_by,
                channel=replication_channel(self.security),
            )
        except BaseException:
            self._close_security()
            raise
        try:
            broker.start(tenure=self.term)
            self.term.start()  # (a replicating primary listens for its backup)
        except BaseException:
            self.term.close()
            self._close_security()
            raise
        settings = config.broker
        self.gateway = gateway = Gateway(broker, self.security)
        # a cluster member: made now (the Kafka listener asks it where things are), joined
        # once every listener listens (its endpoints are known then)
        self.member = ClusterMember(broker, config) if config.clustered else None
        if self.member is not None:  # (STOMP's clients are served at any member)
            gateway.forwarding = Forwarding()
            broker.store_elsewhere = gateway.forwarding.produce  # (dead letters too)
            # (a transaction's sends to destinations other members serve)
            broker.transactions.store_elsewhere = gateway.forwarding.produce
            broker.transactions.member = broker.broker_id
        self.wire: WireServer | None = None
        self.stomp: StompServer | None = None
        self.kafka: KafkaServer | None = None
        self.listeners: list[Listener] = []  # every protocol's; the service knows no more
        try:
            if settings.wire:
                self.wire = WireServer(gateway, host, settings.wire_port, local=settings.wire_local)
                self.listeners.append(self.wire)
            if settings.stomp:
                self.stomp = StompServer(gateway, host, settings.stomp_port)
                self.listeners.append(self.stomp)
            if settings.kafka:
                self.kafka = KafkaServer(gateway, host, settings.kafka_port, self.member)
                self.listeners.append(self.kafka)
            self.service = FlightService(  # (its ping tells clients where the wire is)
                gateway,
                f"{self.scheme}://{host}:{port}",
                wire_port=self.wire.port if self.wire else None,
                wire_local=self.wire.local_name if self.wire else None,
            )
            self.listeners.insert(0, self.service)
        except Exception:
            self._abandon()
            raise
        self.host = host
        self.port = self.service.port
        if gateway.forwarding is not None:
            gateway.forwarding.home = self.url
        self.wire_port = self.wire.port if self.wire else None
        self.stomp_port = self.stomp.port if self.stomp else None
        self.kafka_port = self.kafka.port if self.kafka else None
        # a cluster member joins once it listens, and serves what the placement gives it
        if self.member is not None:
            kafka = self.kafka.advertised if self.kafka else None
            try:
                _join_cluster(broker, self.member, self.url, kafka)
            except BaseException:
                self._abandon()
                raise
        broker.phase = "serving"

    def _abandon(self) -> None:
        """Starting failed half way: what was started stops, in the order it started."""
        for listener in self.listeners:
            listener.stop()
        self.broker.close()
        self.term.close()
        self._close_security()

    def _close_security(self) -> None:
        if self._owns_security:
            self.security.close()

    def kafka_transactions(self) -> dict[str, int]:
        """The Kafka listener's transactional producers and open transactions (metrics)."""
        return self.kafka.transactions_now() if self.kafka is not None else {}

    def kafka_transaction_list(self) -> list[dict[str, object]]:
        """The Kafka listener's transactional ids and open transactions (the console)."""
        return self.kafka.transactions_listed() if self.kafka is not None else []

    def kafka_groups(self) -> list[dict[str, object]]:
        """The Kafka listener's consumer and share groups, with each consumer group's lag by
        topic (end offset minus committed offset), for the metrics and the console. A cluster's
        groups are its coordinator's (the member serving their offsets: the others list none),
        their lag only of the topics it serves."""
        if self.kafka is None:
            return []
        if self.member is not None and not self.broker.has_destination(KAFKA_OFFSETS):
            return []  # (not its groups; nor does it create their offsets topic, as a scrape)
        groups = self.kafka.groups_now()
        committed: dict[str, dict[tuple[str, int], int]] = {}
        for name in self.broker.group_offsets.groups():
            for key, done in self.broker.group_offsets.fetch(name).items():
                committed.setdefault(name, {})[key] = done.offset
        known = {g["group"] for g in groups if g["kind"] == "consumer"}
        for name in committed:
            if name not in known:  # (offsets kept, no members since the start)
                groups.append({"kind": "consumer", "group": name, "state": "Empty",
                               "generation": 0, "members": []})  # fmt: skip
        for g in groups:
            lag: dict[str, int] = {}
            for (topic, partition), offset in committed.get(str(g["group"]), {}).items():
                # (a partitioned topic's: each partition's, added up)
                dest = partition_name(topic, partition) if partition else topic
                if not self.broker.has_destination(dest):
                    dest = partition_name(topic, 0)
                if not self.broker.has_destination(dest):
                    continue
                try:
                    end = self.broker.log.end(dest)
                except (DestinationNotFound, NotOwner):  # (deleted or let go meanwhile)
                    continue
                lag[topic] = lag.get(topic, 0) + max(end - offset, 0)
            g["lag"] = lag
        return groups

    def connections(self) -> dict[str, int]:
        """Open connections by transport (Flight: calls under way), for the metrics."""
        return {listener.name: listener.connection_count() for listener in self.listeners}

    @property
    def url(self) -> str:
        return f"{self.scheme}://{self.host}:{self.port}"

    def stop(self, grace_s: float | None = None) -> bool:
        """Stop serving, then close the broker (every acknowledged message stays durable, and
        the hot tier moves what it holds to Delta).

        Clients get ``grace_s`` (default ``broker.shutdown_grace_s``) to finish: nothing new is
        taken, what was taken is answered, Flight streams are told to end (``Closing``) and end
        once their clients have; the log says every second what is still waited for. Past it,
        connections are closed regardless and the broker closes. Returns False when some were
        still open then (Flight calls): their threads are left to the process's end (``serve``
        exits)."""
        grace = self.broker.config.broker.shutdown_grace_s if grace_s is None else grace_s
        self.broker.phase = "stopping"
        if self.member is not None:  # its destinations handed over first, its clients told
            self.member.stop()
        started = time.monotonic()
        deadline = started + grace
        for listener in self.listeners:
            listener.begin_stop(deadline)
        left: dict[str, list[str]] = {}
        stopping = [
            threading.Thread(
                target=lambda lst=listener: left.__setitem__(lst.name, lst.stop(deadline)),
                name=f"stop-{listener.name}",
                daemon=True,
            )
            for listener in self.listeners
        ]
        for t in stopping:
            t.start()  # (each gives up at the deadline by itself)
        said = started
        while any(t.is_alive() for t in stopping):
            now = time.monotonic()
            if now - said >= 1.0 and now < deadline:
                said = now
                log.info(
                    "shutting down: waiting %.0f s more for %s", deadline - now, self._waiting()
                )
            for t in stopping:
                t.join(0.1)
        for name, open_calls in left.items():
            if open_calls:
                log.warning(
                    "shutting down: %d %s call(s) still open after %.0f s "
                    "(broker.shutdown_grace_s), not waited for: %s",
                    len(open_calls),
                    _LABELS.get(name, name),
                    grace,
                    "; ".join(open_calls),
                )
        if self.gateway.forwarding is not None:  # (what its clients sent elsewhere: answered)
            self.gateway.forwarding.close()
        self.broker.close()
        self.term.close()  # (the replication, then the data directory)
        self._close_security()
        return not any(left.values())

    def _waiting(self) -> str:
        parts = [w for listener in self.listeners if (w := listener.waiting_for())]
        return ", ".join(parts) or "nothing"


def _join_cluster(
    broker: Broker, member: ClusterMember, url: str, kafka: tuple[str, int] | None
) -> None:
    broker.destinations.elsewhere = member
    broker.cluster = member
    store = broker.journal.store
    if isinstance(store, DeltaStore):  # (a commit refused by a newer owner's fence)
        store.on_deposed = member.deposed
    member.start(url, kafka)


def replication_channel(security: Security) -> ChannelSecurity:
    """The replication channel's security, from the broker's: a backup logs in with its
    environment's credentials (as any client: ``SPARKMQ_USERNAME`` / ``SPARKMQ_PASSWORD`` or
    ``SPARKMQ_TOKEN``) as a user allowed ``admin`` on the broker; TLS when the broker has a
    certificate (the backup trusting ``SPARKMQ_TLS_CA_FILE``)."""
    auth = Auth.of()

    def authorize(hello: dict[str, Any], peer: str) -> str | None:
        if not security.enabled:
            return None
        creds = Credentials(hello.get("username"), hello.get("password"), hello.get("token"))
        try:
            principal = security.login(creds, peer=peer, transport="replication")
            security.guard.check(principal, "admin")
        except SparkMQError as exc:
            return exc.message
        return None

    tls = security.tls
    return ChannelSecurity(
        authorize=authorize,
        server_tls=tls.context if tls is not None else None,
        client_tls=auth.ssl_context() if tls is not None else None,
        credentials=auth.hello(),
    )


def settle_garbage_collector() -> None:
    """Keep the cyclic garbage collector's pauses off the delivery path.

    A full collection walks every tracked object, and each one stalls every producer and
    consumer. A started broker already holds ~95,000 of them (the modules it imports: pyarrow,
    sqlglot, pandas through pyarrow.dataset), which took ~60 ms per full collection. They live as
    long as the process, so they are frozen out of every later collection; young collections run
    less often too. (Full collections under load now take 9-23 ms.)
    """
    gc.collect()
    gc.freeze()
    gc.set_threshold(10_000, 20, 20)


def choose_memory_pool() -> str:
    """Give Arrow's buffers jemalloc in the broker's process, unless told otherwise
    (``ARROW_DEFAULT_MEMORY_POOL``) or this pyarrow lacks it; returns the allocator in use.

    Under batched produce every 1 MiB frame is received into a new buffer that the queue then
    holds. pyarrow's default, mimalloc, maps and touches such memory inside the allocation,
    with the wire loop holding the GIL (now and then for milliseconds): the loop spent 2 ms a
    frame allocating, against 0.3 with jemalloc, whose pages are first touched by ``recv_into``
    with the GIL released. Measured in interleaved pairs: batched produce 216-302k msg/s against
    221-279k (three pairs; 251-268k against 225-227k with the loop profiled), and latency at
    1,000 msg/s after a batched run p99 2.2-3.5 ms against 4.9-31 (three pairs).
    """
    if not os.environ.get("ARROW_DEFAULT_MEMORY_POOL"):
        with contextlib.suppress(NotImplementedError):  # a build without jemalloc
            if "jemalloc" in pa.supported_memory_backends():
                pa.set_memory_pool(pa.jemalloc_memory_pool())
    return pa.default_memory_pool().backend_name


def serve(config: BrokerConfig, *, ready_file: str | None = None) -> None:
    """Run until SIGTERM or SIGINT; pending commits are flushed before exit."""
    setup_logging(
        config.logging.level,
        config.log_path(),
        max_bytes=config.logging.max_file_bytes,
        backups=config.logging.backups,
        fmt=config.logging.format,
    )
    # a log line that cannot be written (a full disk) is dropped, not a traceback on stderr
    logging.raiseExceptions = False
    if config.broker.persistence == "delta" and "://" not in config.broker.data_dir:
        Path(config.broker.data_dir).mkdir(parents=True, exist_ok=True)
    stop = threading.Event()

    def on_signal(signum: int, _frame: object) -> None:
        log.info("received %s, shutting down", signal.Signals(signum).name)
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    reload_requested = threading.Event()
    signal.signal(signal.SIGHUP, lambda *_: reload_requested.set())
    allocator = choose_memory_pool()
    check_protected(config, listening_on=config.broker.host)
    security = Security(config)  # the process's: every term and the HTTP listener use it
    state = ServiceState(security)
    try:
        http = HttpListener(config, state) if config.broker.http else None
    except BaseException:
        security.close()
        raise
    if http is not None:
        log.info("HTTP (metrics, health, console) on %s", http.url)
    try:
        while True:
            outcome = _serve_term(
                config, stop, reload_requested, allocator, ready_file, state, http
            )
            if outcome == "stop" or config.ha.mode == "none":
                return
            log.info("stepped down: this broker is the backup now")
    finally:
        if http is not None:
            http.close()
        security.close()


def _serve_term(
    config: BrokerConfig,
    stop: threading.Event,
    reload_requested: threading.Event,
    allocator: str,
    ready_file: str | None,
    state: ServiceState,
    http: HttpListener | None,
) -> str:
    """Serve as the owner of the data until told to stop ("stop"), or until deposed or asked
    to hand over to the backup ("step down"). A shared store's backup waits first."""
    broker = Broker(config)
    step_down = threading.Event()
    broker.on_deposed = lambda _err: step_down.set()
    broker.on_handover = step_down.set
    state.broker = broker  # (its probes say "backup" or "recovering" meanwhile)
    try:
        running = RunningBroker(
            broker, config.broker.host, config.broker.port, until=stop, security=state.security
        )
    except StoppedWaiting:
        log.info("stopped while waiting as the backup")
        broker.close()
        return "stop"
    state.connections = running.connections
    state.kafka_groups = running.kafka_groups
    state.kafka_transactions = running.kafka_transactions
    state.kafka_transaction_list = running.kafka_transaction_list
    settle_garbage_collector()
    wire_at = "no port (broker.wire = false)"
    if running.wire is not None:
        wire_at = f"port {running.wire_port}"
        if running.wire.local_name:
            wire_at += f" and local socket @{running.wire.local_name}"
    sec = config.security
    if not sec.enabled and config.broker.insecure and not is_loopback(config.broker.host):
        log.warning(
            "listening on %s with security off (--insecure): anyone who reaches these ports "
            "may produce, consume, purge and delete everything",
            config.broker.host,
        )
    security = (
        f"on (users {sec.users_file}, rules {sec.acl_file}, audit {config.audit_path()})"
        if sec.enabled
        else "off"
    )
    stomp_at = f"port {running.stomp_port}" if running.stomp_port else "off (broker.stomp)"
    kafka_at = f"port {running.kafka_port}" if running.kafka_port else "off (broker.kafka)"
    log.info(
        "sparkmq broker listening on %s, direct wire on %s, STOMP on %s, Kafka on %s (data: %s, "
        "persistence: %s, "
        "Arrow memory: %s, security: %s, TLS: %s%s)",
        running.url,
        wire_at,
        stomp_at,
        kafka_at,
        config.broker.data_dir,
        config.broker.persistence,
        allocator,
        security,
        "on" if running.security.tls is not None else "off",
        f", high availability: {config.ha.mode}, epoch {broker.epoch}"
        if config.ha.mode != "none"
        else "",
    )
    if ready_file:
        tmp = f"{ready_file}.tmp"
        with open(tmp, "w") as fh:
            json.dump(
                {
                    "url": running.url,
                    "port": running.port,
                    "wire_port": running.wire_port,
                    "stomp_port": running.stomp_port,
                    "kafka_port": running.kafka_port,
                    "pid": os.getpid(),
                    "epoch": broker.epoch,
                    "http_port": http.port if http is not None else None,
                    "http_url": http.url if http is not None else None,
                },
                fh,
            )
        os.replace(tmp, ready_file)
    epoch = broker.epoch
    try:
        while not stop.wait(0.2) and not step_down.is_set():
            if reload_requested.is_set():  # SIGHUP: the access rules again (not in a handler)
                reload_requested.clear()
                log.info("received SIGHUP: reloading the access rules")
                running.security.reload()
    finally:
        clean = running.stop()
        log.info("broker stopped; %s", _what_stays(broker))
        if not clean:  # Flight calls of clients that never ended them: not waited for
            logging.shutdown()
            os._exit(0)
    if stop.is_set():
        return "stop"
    if ready_file:  # not serving any more: ready again once it takes over
        with contextlib.suppress(OSError):
            os.remove(ready_file)
    _let_the_backup_take_over(config, epoch, stop)
    return "step down"


def _what_stays(broker: Broker) -> str:
    """What a stopped broker leaves behind, said truthfully."""
    if broker.deposed is not None:
        return (
            f"it was deposed (epoch {broker.epoch}): what it acknowledged is the new primary's "
            "to serve"
            + (
                f" ({broker.unmoved} record(s) it did not move to Delta stay in its segments; "
                "the new primary moves its own copy)"
                if broker.unmoved
                else ""
            )
        )
    if broker.unmoved:
        return (
            f"every acknowledged message is durable ({broker.unmoved} record(s) in the hot "
            "tier's segments move to Delta at the next start)"
        )
    return "every acknowledged message is durable and in Delta"


def _let_the_backup_take_over(
    config: BrokerConfig, epoch: int | None, stop: threading.Event
) -> None:
    """After stepping down, wait (up to 30 s) until another broker has taken a newer epoch
    before contending for the data directory again: else this one could take it straight
    back."""
    if epoch is None:
        return
    owner = Ownership(config.broker.data_dir, config.storage or None)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and not stop.wait(config.ha.lock_poll_s):
        try:
            if owner.epoch() > epoch:
                return
        except Exception:  # the store out of reach: contend once the wait is over
            log.debug("reading the ownership record failed", exc_info=True)
