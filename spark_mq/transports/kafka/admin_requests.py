"""What a Kafka connection's admin requests mean: CreateTopics and DeleteTopics, as the
session's ``CreateDestination`` (``create``) and ``DeleteDestination`` (``admin``);
DescribeConfigs (a topic's kind and settings as ``sparkmq.*`` configs, from ``Stats``) and
IncrementalAlterConfigs (``ConfigureDestination``: ``admin``); DescribeCluster (this broker).

A created topic is a sparkmq **topic**, or a **queue** with the config ``sparkmq.kind=queue``;
any other ``sparkmq.<setting>`` config is that destination setting (``sparkmq.max_delivery_
attempts=5``, ``sparkmq.dead_letter=...``: the settings of ``conf/broker.toml``'s
``[destinations]``). Kafka's own topic configs (``cleanup.policy``, ``retention.ms``, ...) are
accepted and ignored: a sparkmq destination keeps what its semantics say. A topic has one
partition unless created with more (``num_partitions``: its partitions are destinations of their
own, ``<topic>~<i>``, which deleting, describing and altering the topic deal with together).
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from datetime import timedelta
from typing import Any

from spark_mq import commands as c
from spark_mq.commands import Kind
from spark_mq.connection.forwarding import Forwarding
from spark_mq.connection.listener import ListenerCore
from spark_mq.errors import (
    ConfigError,
    DestinationExists,
    ForwardingRefused,
    NotOwner,
    SparkMQError,
)
from spark_mq.names import MAX_PARTITIONS, partition_name
from spark_mq.session import ClientSession
from spark_mq.transports.kafka import codec
from spark_mq.transports.kafka.codec import ErrorCode, Request, build
from spark_mq.transports.kafka.link import KafkaLink, error_code, message_of, topic_id

log = logging.getLogger(__name__)

_ZERO = timedelta(0)
_PREFIX = "sparkmq."
_TOPIC, _BROKER = 2, 4  # Kafka's config resource types


class AdminRequests:
    def __init__(
        self,
        link: KafkaLink,
        listener: ListenerCore,
        session: ClientSession,
        topic_settings: dict[str, Any],
    ) -> None:
        self.link = link
        self.listener = listener
        self.session = session
        self.topic_settings = topic_settings  # (a created topic's, unless its configs say)

    def handlers(self) -> dict[int, Callable[[Request, Any], None]]:
        return {
            codec.CREATE_TOPICS: self._create_topics,
            codec.DELETE_TOPICS: self._delete_topics,
            codec.CREATE_PARTITIONS: self._create_partitions,
            codec.DESCRIBE_CONFIGS: self._describe_configs,
            codec.INCREMENTAL_ALTER_CONFIGS: self._alter_configs,
            codec.DESCRIBE_CLUSTER: self._describe_cluster,
        }

    def _describe_cluster(self, r: Request, slot: Any) -> None:
        mod = codec.response_module(r.api_key, r.version)
        nodes = self.link.nodes
        self.link.answer(
            slot,
            build(
                mod,
                "DescribeClusterResponse",
                throttle_time=_ZERO,
                error_code=ErrorCode.none,
                error_message=None,
                endpoint_type=1,
                cluster_id=nodes.cluster_id,
                controller_id=nodes.controller(),
                brokers=tuple(
                    build(
                        mod,
                        "DescribeClusterBroker",
                        broker_id=n.node_id,
                        host=n.host,
                        port=n.port,
                        rack=None,
                    )
                    for n in nodes.brokers()
                ),
                cluster_authorized_operations=-(2**31),
            ),
        )

    def _each_partition(
        self, command: Callable[..., c.Command], name: str, *args: Any, first: bool = False
    ) -> list[Any]:
        """(A helper thread.) The session's answers to ``command`` for topic ``name``: one,
        or a partitioned topic's for each of its partitions (their count read now), partition
        0's last (the one that says the topic exists). A cluster's partitions another member
        serves are done there through this member's forwarding (Kafka's admin clients send
        these to the controller, whichever broker leads the partitions). ``first``: only
        partition 0's (what describes the topic)."""
        n = 1 if first else self.session.partitions(name, fresh=True)
        names = [name] if n == 1 else [partition_name(name, i) for i in [*range(1, n), 0]]
        if first and self.session.partitions(name) > 1:
            names = [partition_name(name, 0)]
        forwarding = self.listener.gateway.forwarding
        answers = []
        for part in names:
            cmd = command(part, *args)
            elsewhere = None if forwarding is None else functools.partial(_forward, forwarding, cmd)
            answers.append(self.session.execute(cmd, elsewhere))
        return answers

    def _answer_later(self, slot: Any, respond: Callable[[], Any]) -> None:
        """The response ``respond()`` makes (it never raises: each resource's error is in
        it), made on a helper thread (it commits, or asks other members) and answered in its
        slot; the requests behind it go on meanwhile."""
        fut = self.listener.run_blocking(respond)
        fut.add_done_callback(lambda f: self.link.threadsafe(self.link.answer, slot, f.result()))

    def _describe_configs(self, r: Request, slot: Any) -> None:
        self._answer_later(slot, lambda: self._configs_described(r))

    def _configs_described(self, r: Request) -> Any:
        mod = codec.response_module(r.api_key, r.version)
        results = []
        for res in r.body.resources:
            err, message, configs = ErrorCode.none, None, []
            if res.resource_type == _TOPIC:
                try:
                    (stats,) = self._each_partition(c.Stats, res.resource_name, first=True)
                    values = {"sparkmq.kind": str(stats["kind"])}
                    retention = stats["settings"].get("retention_s") or 0
                    values[RETENTION_MS] = str(int(retention * 1000) if retention else -1)
                    for key, value in stats["settings"].items():
                        values[_PREFIX + key] = _text(value)
                    wanted = set(res.configuration_keys or values)
                    configs = [
                        build(
                            mod,
                            "DescribeConfigsResourceResult",
                            name=k,
                            value=v,
                            read_only=k == "sparkmq.kind",
                            config_source=5,
                            is_sensitive=False,
                            synonyms=(),
                            config_type=0,
                            documentation=None,
                        )
                        for k, v in values.items()
                        if k in wanted
                    ]
                except SparkMQError as exc:
                    err, message = error_code(exc), message_of(exc)
                except Exception as exc:  # (answered, not a closed connection: logged here)
                    err, message = _unexpected("DescribeConfigs", res.resource_name, exc)
            elif res.resource_type != _BROKER:
                err, message = ErrorCode.invalid_request, "topics and brokers have configs here"
            results.append(
                build(
                    mod,
                    "DescribeConfigsResult",
                    error_code=err,
                    error_message=message,
                    resource_type=res.resource_type,
                    resource_name=res.resource_name,
                    configs=tuple(configs),
                )
            )
        return build(mod, "DescribeConfigsResponse", throttle_time=_ZERO, results=tuple(results))

    def _alter_configs(self, r: Request, slot: Any) -> None:
        self._answer_later(slot, lambda: self._configs_altered(r))

    def _configs_altered(self, r: Request) -> Any:
        mod = codec.response_module(r.api_key, r.version)
        out = []
        for res in r.body.resources:
            err, message = ErrorCode.none, None
            try:
                if res.resource_type != _TOPIC:
                    raise _BadConfig("only topics' configs change here")
                settings = {}
                for entry in res.configs:
                    if entry.name == RETENTION_MS and entry.config_operation == 0:
                        settings["retention_s"] = retention_s(entry.value)
                        continue
                    if not entry.name.startswith(_PREFIX):
                        continue  # (Kafka's own topic configs: accepted, ignored)
                    key = entry.name[len(_PREFIX) :]
                    if key == "kind" or entry.config_operation != 0:  # (0: SET)
                        raise _BadConfig(
                            f"{entry.name}: only SET of a destination setting is served "
                            "(a destination's kind does not change)"
                        )
                    settings[key] = entry.value
                if settings and not r.body.validate_only:
                    self._each_partition(c.ConfigureDestination, res.resource_name, settings)
            except _BadConfig as exc:
                err, message = ErrorCode.invalid_config, str(exc)
            except SparkMQError as exc:
                err, message = error_code(exc), message_of(exc)
            except Exception as exc:  # (answered, not a closed connection: logged here)
                err, message = _unexpected("IncrementalAlterConfigs", res.resource_name, exc)
            out.append(
                build(
                    mod,
                    "AlterConfigsResourceResponse",
                    error_code=err,
                    error_message=message,
                    resource_type=res.resource_type,
                    resource_name=res.resource_name,
                )
            )
        return build(
            mod, "IncrementalAlterConfigsResponse", throttle_time=_ZERO, responses=tuple(out)
        )

    def _create_topics(self, r: Request, slot: Any) -> None:
        body = r.body
        mod = codec.response_module(r.api_key, r.version)
        results = []
        for t in body.topics:
            err, message = ErrorCode.none, None
            try:
                kind, settings = _kind_and_settings(t.configs)
                if kind == "topic":
                    settings = {**self.topic_settings, **settings}
                if t.num_partitions > 1:
                    settings = {**settings, "partitions": t.num_partitions}
                count = t.num_partitions
                if t.assignments or not (count == -1 or 1 <= count <= MAX_PARTITIONS):
                    err = ErrorCode.invalid_partitions
                    message = (
                        "a sparkmq topic's partitions are placed on cluster members by the "
                        "cluster, not by replica assignments"
                        if t.assignments
                        else f"a sparkmq topic has 1 to {MAX_PARTITIONS} partitions, not "
                        f"{t.num_partitions}"
                    )
                elif getattr(body, "validate_only", False):
                    if self.session.kind(t.name) is not None:
                        err, message = ErrorCode.topic_already_exists, f"{t.name!r} exists"
                elif not self.session.execute(c.CreateDestination(t.name, kind, settings or None)):
                    err, message = ErrorCode.topic_already_exists, f"{t.name!r} exists"
            except _BadConfig as exc:
                err, message = ErrorCode.invalid_config, str(exc)
            except DestinationExists as exc:
                err, message = ErrorCode.topic_already_exists, exc.message
            except SparkMQError as exc:
                err, message = error_code(exc), message_of(exc)
            results.append(
                build(
                    mod,
                    "CreatableTopicResult",
                    name=t.name,
                    topic_id=topic_id(t.name),
                    error_code=err,
                    error_message=message,
                    topic_config_error_code=0,
                    num_partitions=max(t.num_partitions, 1) if err is ErrorCode.none else -1,
                    replication_factor=1 if err is ErrorCode.none else -1,
                    configs=(),
                )
            )
        self.link.answer(
            slot,
            build(mod, "CreateTopicsResponse", throttle_time=_ZERO, topics=tuple(results)),
        )

    def _delete_topics(self, r: Request, slot: Any) -> None:
        self._answer_later(slot, lambda: self._topics_deleted(r))

    def _topics_deleted(self, r: Request) -> Any:
        body = r.body
        mod = codec.response_module(r.api_key, r.version)
        names = [t.name for t in body.topics] if r.version >= 6 else list(body.topic_names)
        results = []
        for name in names:
            err, message = ErrorCode.none, None
            if name is None:  # (a topic id alone: ids are not served)
                err, message = ErrorCode.unknown_topic_id, "name the topic: ids are not served"
            else:
                try:
                    self._each_partition(c.DeleteDestination, name)
                except SparkMQError as exc:
                    err, message = error_code(exc), message_of(exc)
                except Exception as exc:  # (answered, not a closed connection: logged here)
                    err, message = _unexpected("DeleteTopics", name, exc)
            results.append(
                build(
                    mod,
                    "DeletableTopicResult",
                    name=name,
                    topic_id=topic_id(name) if name else None,
                    error_code=err,
                    error_message=message,
                )
            )
        return build(mod, "DeleteTopicsResponse", throttle_time=_ZERO, responses=tuple(results))

    def _create_partitions(self, r: Request, slot: Any) -> None:
        """CreatePartitions: each topic grown to its ``count`` partitions in all (``admin``),
        on a helper thread (new partitions are Delta tables made: not the loop's work)."""
        mod = codec.response_module(r.api_key, r.version)
        topics = [(t.name, t.count, bool(t.assignments)) for t in r.body.topics]
        validate_only = bool(r.body.validate_only)

        def grow() -> Any:
            results = []
            for name, count, assigned in topics:
                err, message = self._grow(name, count, assigned, validate_only)
                results.append(
                    build(
                        mod,
                        "CreatePartitionsTopicResult",
                        name=name,
                        error_code=err,
                        error_message=message,
                    )
                )
            return build(
                mod, "CreatePartitionsResponse", throttle_time=_ZERO, results=tuple(results)
            )

        self._answer_later(slot, grow)

    def _grow(
        self, name: str, count: int, assigned: bool, validate_only: bool
    ) -> tuple[ErrorCode, str | None]:
        """(A helper thread.) One topic of a CreatePartitions: Kafka's error code and message
        (INVALID_PARTITIONS for a count that adds none, as Kafka answers)."""
        if assigned:
            return ErrorCode.invalid_replica_assignment, (
                "a sparkmq topic's partitions are placed on cluster members by the cluster, "
                "not by replica assignments"
            )
        try:
            if validate_only:  # (what a growth would refuse, without growing)
                if not self.session.may_administer(name):
                    return ErrorCode.topic_authorization_failed, f"not allowed to alter {name!r}"
                if self.session.kind(name) is None:
                    return ErrorCode.unknown_topic_or_partition, f"{name!r} does not exist"
                now = self.session.partitions(name)
                return _growth_refused(name, now, count) or (ErrorCode.none, None)
            try:
                grown = self.session.execute(c.AddPartitions(name, count))
                grew = int(grown["before"]) < count
            except NotOwner as owner:  # (partition 0 is served by another member)
                forwarding = self.listener.gateway.forwarding
                if forwarding is None:
                    raise
                grew = forwarding.add_partitions(owner, name, count)
            if not grew:  # (Kafka refuses a count the topic has)
                return ErrorCode.invalid_partitions, _ALREADY.format(name=name, count=count)
            return ErrorCode.none, None
        except ForwardingRefused as exc:
            return error_code(exc), exc.message
        except ConfigError as exc:
            return ErrorCode.invalid_partitions, exc.message
        except SparkMQError as exc:
            return error_code(exc), message_of(exc)
        except Exception as exc:  # (answered, not a closed connection: logged here)
            return _unexpected("CreatePartitions", name, exc)


_ALREADY = "Topic {name!r} already has {count} partition(s)."


def _forward(forwarding: Forwarding, cmd: c.Command, owner: NotOwner) -> Any:
    return forwarding.administer(owner, cmd)


def _unexpected(what: str, name: str, exc: Exception) -> tuple[ErrorCode, str]:
    """A request's failure no sparkmq error names: logged, answered as Kafka's unknown
    server error."""
    log.error("Kafka %s of %s failed", what, name, exc_info=exc)
    return ErrorCode.unknown_server_error, f"{type(exc).__name__}: {exc}"


def _growth_refused(name: str, before: int, count: int) -> tuple[ErrorCode, str] | None:
    """Kafka refuses a CreatePartitions that adds none (INVALID_PARTITIONS)."""
    if count == before:
        return ErrorCode.invalid_partitions, _ALREADY.format(name=name, count=count)
    if count < before:
        return ErrorCode.invalid_partitions, (
            f"Topic {name!r} has {before} partitions: partitions can be added, not taken away"
        )
    return None


def _text(value: object) -> str:
    """A setting's value as a config's text (true/false, as Kafka's configs spell them)."""
    if value is None:
        return ""
    return str(value).lower() if isinstance(value, bool) else str(value)


class _BadConfig(Exception):
    pass


RETENTION_MS = "retention.ms"  # Kafka's topic config: a topic's retention_s
_FOREVER_S = 100 * 365 * 24 * 3600.0  # retention.ms -1 (a century)


def kafka_topic_settings(retention: float) -> dict[str, Any]:
    """A topic made through Kafka: its messages kept ``retention`` seconds for the log's
    readers (``broker.kafka_retention_s``; 0: the broker's defaults)."""
    return {"retention_s": retention} if retention else {}


def retention_s(value: str | None) -> float:
    """``retention.ms`` as ``retention_s`` (-1, Kafka's "forever": a century)."""
    try:
        ms = int(value or "")
    except ValueError:
        raise _BadConfig(f"retention.ms is a number of milliseconds, not {value!r}") from None
    if ms < -1:
        raise _BadConfig(f"retention.ms is -1 (forever) or a number of milliseconds, not {ms}")
    return _FOREVER_S if ms == -1 else ms / 1000


def _kind_and_settings(configs: Any) -> tuple[Kind, dict[str, Any]]:
    kind: Kind = "topic"
    settings: dict[str, Any] = {}
    for entry in configs or ():
        name, value = entry.name, entry.value
        if name == RETENTION_MS:
            settings["retention_s"] = retention_s(value)
            continue
        if not name.startswith(_PREFIX):
            continue  # (Kafka's own topic configs: accepted, ignored)
        key = name[len(_PREFIX) :]
        if key == "kind":
            if value == "queue":
                kind = "queue"
            elif value != "topic":
                raise _BadConfig(f"sparkmq.kind is 'queue' or 'topic', not {value!r}")
        else:
            settings[key] = value
    return kind, settings
