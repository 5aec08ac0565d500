"""What a Kafka connection's requests mean: each one as calls of its ``ClientSession``
(:mod:`spark_mq.session`), answered with Kafka's own error codes. Nothing here decides delivery.

* **Metadata**: every destination the principal may see is a topic, of one partition (0), or,
  created with ``partitions = N``, of N: partition ``i`` is the destination ``<topic>~<i>``,
  each led by the member that owns it (one broker: node 0 leads all). A topic a client names
  that does not exist is created (a sparkmq topic) when ``broker.auto_create_queues`` is on
  and the client allows it, as Kafka's ``auto.create.topics.enable`` does.
* **Produce**: a partition's record batch (:mod:`~spark_mq.transports.kafka.records`) is one
  produce of the session; ``acks=1`` and ``acks=all`` are answered once it is durable (every
  sparkmq acknowledgement is), ``acks=0`` never. A produce that must wait for room holds the
  connection's later requests, so they stay in order.
* **Fetch**: a topic read as a log from the offset asked, on a helper thread (older messages
  come from Delta); with nothing there yet, the answer waits up to ``max.wait.ms`` for
  ``min.bytes``, woken by the destination's commits. A **queue** is not read this way: its
  messages go to one consumer each, with leases and acknowledgements, which Kafka's classic
  consumers cannot give; a fetch of a queue is refused (``INVALID_TOPIC_EXCEPTION``) and the
  broker's log says to use a share consumer, the SDK or STOMP.
* **ListOffsets**: earliest (0: sparkmq keeps a topic's log from its first message), latest
  (the end offset), and by timestamp (the first message enqueued at or after it).
"""

from __future__ import annotations

import logging
import secrets
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from datetime import timedelta
from functools import partial
from typing import Any

import pyarrow as pa

from spark_mq import commands as c
from spark_mq.connection.listener import ListenerCore
from spark_mq.errors import (
    DestinationNotFound,
    NotOwner,
    SparkMQError,
)
from spark_mq.names import KAFKA_OFFSETS, logical_name, partition_name
from spark_mq.session import ClientSession
from spark_mq.transports.kafka import codec
from spark_mq.transports.kafka.acls import AclRequests
from spark_mq.transports.kafka.admin_requests import AdminRequests, kafka_topic_settings
from spark_mq.transports.kafka.codec import ErrorCode, Request, build
from spark_mq.transports.kafka.group_requests import GroupRequests
from spark_mq.transports.kafka.groups import Coordinator
from spark_mq.transports.kafka.link import (
    KafkaLink,
    TopicNames,
    current_leader,
    error_code,
    message_of,
    node_endpoints,
    topic_id,
)
from spark_mq.transports.kafka.records import RecordError, dedup_prefix, produced, record_batch
from spark_mq.transports.kafka.sequences import OutOfOrder, Sequences
from spark_mq.transports.kafka.share import ShareGroups, ShareRequests
from spark_mq.transports.kafka.transaction_admin import TransactionAdminRequests
from spark_mq.transports.kafka.transactions import (
    ProducerTransactions,
    TransactionRequests,
    TxnRefused,
)

log = logging.getLogger(__name__)

_ZERO = timedelta(0)
_NO_OPERATIONS = -(2**31)  # "authorized operations were not asked for"
_READ_AHEAD = 8_192  # rows read at once for a consumer going through a backlog (kept per topic)
_BATCH_ROWS, _BATCH_BYTES = 512, 256 * 1024  # a record batch of a fetch holds at most these
_INLINE_ROWS = 512  # a woken fetch's tail of at most this many rows is read on the loop,
_INLINE_BYTES = 1024 * 1024  # and of at most this many bytes of bodies
_FETCH_RECHECK_S = 0.005  # a waiting fetch looks again at most this often when woken
# requests held while a partition they name is being taken on here, and how often they look
_HELD_WHILE_TAKEN_ON = frozenset(
    {codec.PRODUCE, codec.FETCH, codec.LIST_OFFSETS, codec.OFFSET_FOR_LEADER_EPOCH}
)


class _ReadAhead:
    """The connection's last read of each topic, ahead of what a fetch asked, kept as encoded
    record batches: a consumer going through a backlog reads the log (older messages from
    Delta, a scan each time) once per ``_READ_AHEAD`` messages and encodes each record once, not
    once a fetch. A fetch gets the batches from the one holding its offset (a client skips the
    records before it, as Kafka's brokers return whole batches). Only durable rows are kept,
    and a log never changes below its end: nothing here goes stale."""

    def __init__(self, session: ClientSession) -> None:
        self.session = session
        self._lock = threading.Lock()  # (fetches run on the helper threads)
        self._kept: dict[str, list[tuple[int, int, bytes]]] = {}  # topic -> (first, n, batch)

    def records(
        self, topic: str, offset: int, max_bytes: int, end: int, *, recent: bool = False
    ) -> bytes | None:
        """Batches holding ``offset`` and after (before ``end``), at most ``max_bytes`` of them
        but the first. ``recent``: only from memory (the hot tier's), None when that is not
        where they are."""
        with self._lock:
            kept = self._kept.get(topic, [])
        at = next((i for i, (f, n, _) in enumerate(kept) if f <= offset < f + n), None)
        if at is None:
            stop = min(end, offset + _READ_AHEAD)
            if recent:
                rows = self.session.read_log_recent(topic, offset, stop)
                if rows is None or rows["body"].nbytes > _INLINE_BYTES:
                    return None  # (not all in memory, or too much to encode on a loop)
            else:
                rows = self.session.read_log(topic, offset, stop)
            kept = self._encode(rows)
            with self._lock:
                self._kept[topic] = kept
            at = 0
        out: list[bytes] = []
        size = 0
        for _, _, batch in kept[at:]:
            if out and size + len(batch) > max_bytes:
                break
            out.append(batch)
            size += len(batch)
        return b"".join(out)

    @staticmethod
    def _encode(rows: pa.Table) -> list[tuple[int, int, bytes]]:
        batches = []
        at = 0
        while at < rows.num_rows:
            part = rows.slice(at, _BATCH_ROWS)
            data, taken = record_batch(part, _BATCH_BYTES)
            batches.append((int(part["offset"][0].as_py()), taken, data))
            at += taken
        return batches


class UnknownTopicId(Exception):
    """A request named a topic by an id that stands for none (KIP-516: UNKNOWN_TOPIC_ID)."""


@dataclass
class _Part:
    """One partition of a fetch."""

    asked: Any  # the topic as the request named it: its name, or its id (Fetch 13+)
    topic: str  # its name ("": an id that stands for none)
    partition: int
    offset: int
    max_bytes: int
    source: str = ""  # the destination it reads: the topic, or its partition's
    error: ErrorCode = ErrorCode.none
    end: int = -1
    records: bytes = b""


@dataclass(eq=False)
class _Fetch:
    request: Request
    slot: Any
    parts: list[_Part]
    min_bytes: int
    max_bytes: int
    deadline: float  # time.monotonic()
    unwatch: list[Callable[[], None]] = field(default_factory=list)
    timer: Any = None
    reading: bool = False
    done: bool = False
    woken: bool = False


# a Produce partition's outcome: (the topic as asked, its name, the partition, the outcome)
_Produced = tuple[Any, str, int, Future | BaseException]


class KafkaRequests:
    def __init__(
        self,
        link: KafkaLink,
        listener: ListenerCore,
        session: ClientSession,
        coordinator: Coordinator,
        share_groups: ShareGroups,
        sequences: Sequences,
        transactions: ProducerTransactions,
    ) -> None:
        self.link = link
        self.listener = listener
        self.session = session
        self.max_body = listener.gateway.config.limits.max_message_bytes
        self.auto_create = listener.settings.auto_create_queues
        # a topic a Kafka client creates is a log: kept for its readers (Kafka's retention)
        self.topic_settings = kafka_topic_settings(listener.settings.kafka_retention_s)
        self.fetches: set[_Fetch] = set()  # waiting for data
        self._told_queue: set[str] = set()  # queues it fetched as a log (logged once)
        self._read_ahead = _ReadAhead(session)
        self.topic_names = TopicNames(session, link.nodes)
        self.share = ShareRequests(link, session, share_groups, self.topic_names)
        self.sequences = sequences  # idempotent producers' (the listener's)
        self.txn = TransactionRequests(
            link, listener, session, transactions, coordinator, self._target, self._create_topic
        )
        self._handlers: dict[int, Callable[[Request, Any], None]] = {
            codec.METADATA: self._metadata,
            codec.PRODUCE: self._produce,
            codec.FETCH: self._fetch,
            codec.LIST_OFFSETS: self._list_offsets,
            codec.OFFSET_FOR_LEADER_EPOCH: self._offset_for_leader_epoch,
            codec.INIT_PRODUCER_ID: self._init_producer_id,
            **GroupRequests(
                link, listener, session, coordinator, share_groups, transactions
            ).handlers(),
            **AdminRequests(link, listener, session, self.topic_settings).handlers(),
            **AclRequests(link, session).handlers(),
            **self.share.handlers(),
            **self.txn.handlers(),
            **TransactionAdminRequests(
                link, session, transactions, sequences, self._target
            ).handlers(),
        }

    def handle(self, request: Request, slot: Any) -> None:
        handler = self._handlers.get(request.api_key)
        if handler is None:  # (served() let it through: a handler is missing)
            raise codec.KafkaProtocolError(f"{codec.api_name(request.api_key)} is not served")
        if self.link.nodes.clustered and request.api_key in _HELD_WHILE_TAKEN_ON:
            taken_on = self._while_taken_on(request)
            if taken_on is not None:
                again = partial(handler, request, slot)
                self.link.awaiting(taken_on, lambda _: again(), on_error=lambda _: again())
                return
        handler(request, slot)

    def _while_taken_on(self, r: Request) -> Future | None:
        """Done once every partition ``r`` names that this member is taking on just now is
        served here (:meth:`Nodes.taken_on`); None when it names none. A client sent here by
        the old owner's answer (KIP-951) is answered once the partition is served, not
        refused while it is taken on: refused, librdkafka's producer backs off, its consumer
        waits 500 ms (``fetch.error.backoff.ms``), and its check of its position
        (OffsetForLeaderEpoch) asks again at once, over and over, while the member is busy
        taking the partition on (it made moves a third slower)."""
        return self.link.nodes.taken_on(self._partitions_named(r), self.link.loop)

    def _partitions_named(self, r: Request) -> list[str]:
        """The destinations of the partitions a Produce, Fetch, ListOffsets or
        OffsetForLeaderEpoch names (those that cannot be said left out)."""
        body = r.body
        by_id = r.version >= 13  # (Produce's and Fetch's topics named by their ids)
        if r.api_key == codec.PRODUCE:
            asked = [(t.topic_id if by_id else t.name, p.index) for t in body.topic_data
                     for p in t.partition_data]  # fmt: skip
        elif r.api_key == codec.FETCH:
            asked = [(t.topic_id if by_id else t.topic, p.partition) for t in body.topics
                     for p in t.partitions]  # fmt: skip
        elif r.api_key == codec.LIST_OFFSETS:
            asked = [(t.name, p.partition_index) for t in body.topics for p in t.partitions]
        else:
            asked = [(t.topic, p.partition) for t in body.topics for p in t.partitions]
        out = []
        for topic, index in asked:
            name = self.topic_names.of(topic) if by_id and not isinstance(topic, str) else topic
            if name:
                try:
                    out.append(self._target(name, index))
                except SparkMQError:
                    continue
        return out

    def close(self) -> None:
        for fetch in list(self.fetches):
            self._end_wait(fetch)
        self.share.close()

    # -- Metadata ----------------------------------------------------------------------------
    def _metadata(self, r: Request, slot: Any) -> None:
        body = r.body
        mod = codec.response_module(r.api_key, r.version)
        nodes = self.link.nodes
        asked = body.topics
        if asked is None or (r.version == 0 and not asked):
            listed = self.session.execute(c.ListDestinations())
            names = {d["name"] for d in listed if not d.get("temporary")}
            names.update(n for n in nodes.topics() if self.session.may_see(n))  # (a cluster's)
            names = {logical_name(n) for n in names}  # (a partition's: its topic)
            names.discard(KAFKA_OFFSETS)
            errors = dict.fromkeys(sorted(names), ErrorCode.none)
        else:
            allow = getattr(body, "allow_auto_topic_creation", True)
            errors = {}
            for t in asked:
                name = t.name or self.topic_names.of(getattr(t, "topic_id", None))
                if name:
                    errors[name] = self._topic_error(name, allow)

        def partition(name: str, index: int, count: int) -> Any:
            led = nodes.leader(partition_name(name, index) if count > 1 else name)
            leader, epoch = led if led is not None else (-1, -1)  # (None: being placed)
            return build(
                mod,
                "MetadataResponsePartition",
                error_code=ErrorCode.none if led is not None else ErrorCode.leader_not_available,
                partition_index=index,
                leader_id=leader,
                leader_epoch=epoch,
                replica_nodes=(leader,) if led is not None else (),
                isr_nodes=(leader,) if led is not None else (),
                offline_replicas=(),
            )

        topics = tuple(
            build(
                mod,
                "MetadataResponseTopic",
                error_code=err,
                name=name,
                topic_id=topic_id(name),
                is_internal=False,
                partitions=tuple(partition(name, i, n) for i in range(n)),
                topic_authorized_operations=_NO_OPERATIONS,
            )
            for name, err in errors.items()
            for n in [self._count(name) if err is ErrorCode.none else 0]
        )
        for name, err in errors.items():
            if err is ErrorCode.none:
                self.topic_names.know(name)
        brokers = tuple(
            build(
                mod,
                "MetadataResponseBroker",
                node_id=n.node_id,
                host=n.host,
                port=n.port,
                rack=None,
            )
            for n in nodes.brokers()
        )
        response = build(
            mod,
            "MetadataResponse",
            throttle_time=_ZERO,
            brokers=brokers,
            cluster_id=nodes.cluster_id,
            controller_id=nodes.controller(),
            topics=topics,
            cluster_authorized_operations=_NO_OPERATIONS,
        )
        self.link.answer(slot, response)

    def _count(self, name: str) -> int:
        """How many partitions topic ``name`` has (1 when it cannot be said: a cluster's being
        placed)."""
        try:
            return self.session.partitions(name)
        except SparkMQError:
            return 1

    def _target(self, topic: str, index: int) -> str:
        """The destination partition ``index`` of ``topic`` is: the topic itself (partition 0
        of a destination without partitions), or its partition's."""
        n = self.session.partitions(topic)
        if 0 <= index < n and n > 1:
            return partition_name(topic, index)
        if index == 0 and n == 1:
            return topic
        raise DestinationNotFound(
            f"{topic} has {n} partition(s), 0 to {n - 1}; not {index}", destination=topic
        )

    def _leader(self, topic: str, index: int) -> tuple[int, int] | None:
        """The node leading partition ``index`` of ``topic``, and its epoch."""
        try:
            return self.link.nodes.leader(self._target(topic, index))
        except SparkMQError:
            return None

    def _topic_error(self, name: str, allow_create: bool) -> ErrorCode:
        try:
            if self.link.nodes.registered(name) and self.session.may_see(name):
                return ErrorCode.none  # (a cluster's: its leader may be another member)
            if self.session.kind(name) is not None:
                return ErrorCode.none
            if not (allow_create and self.auto_create):
                return ErrorCode.unknown_topic_or_partition
            self.session.open_named(name, "topic", self.topic_settings)
            return ErrorCode.none
        except NotOwner:  # (a cluster's, served by another member)
            return ErrorCode.none
        except SparkMQError as exc:
            return error_code(exc)

    # -- Produce -----------------------------------------------------------------------------
    def _produce(self, r: Request, slot: Any) -> None:
        body = r.body
        acks = body.acks
        by_id = r.version >= 13  # (topics named by their ids, KIP-516)
        results: list[_Produced] = []
        holding: list[Future] = []
        for topic in body.topic_data:
            name = self.topic_names.of(topic.topic_id) if by_id else topic.name
            asked = topic.topic_id if by_id else topic.name
            for part in topic.partition_data:
                outcome: Future | BaseException = (
                    UnknownTopicId(f"no topic has id {asked}")
                    if name is None
                    else self._produce_one(body, name, part, holding)
                )
                results.append((asked, name or "", part.index, outcome))
        if acks == 0:
            self.link.answer(slot, None)
            for _, name, _, outcome in results:
                _log_unacked(self.link.peer, name, outcome)
            return
        futures = [o for *_, o in results if isinstance(o, Future)]

        def answer(_: object = None) -> None:
            if len(results) == 1:  # (the usual answer, of one partition: a template, quicker)
                (_, name, index, outcome) = results[0]
                if index == 0 and isinstance(outcome, Future) and outcome.exception() is None:
                    first = _first_offset(outcome.result())
                    tid = topic_id(name) if r.version >= 13 else None
                    frame = codec.produce_answer(r.version, r.correlation_id, name, tid, first)
                    self.link.answer_encoded(slot, frame)
                    return
            self.link.answer(slot, self._produce_response(r, results))

        if holding:  # (a produce waiting for room: the requests behind wait too)
            self.link.awaiting(_all(holding), answer, on_error=answer)
        elif futures:
            done = futures[0] if len(futures) == 1 else _all(futures)
            done.add_done_callback(lambda _: self.link.now_or_soon(answer))
        else:
            answer()

    def _produce_one(
        self, body: Any, name: str, part: Any, holding: list[Future]
    ) -> Future | BaseException:
        try:
            if part.records is None:
                raise RecordError("a Produce partition without records", corrupt=True)
            if self.session.kind(name) is None:
                self._create_topic(name)
            dest = self._target(name, part.index)
            rows = produced(bytes(part.records), self.max_body)
            if rows.transactional:  # (kept with its transaction until it ends)
                return self.txn.produce(dest, name, part.index, rows)
            if rows.producer_id >= 0 and rows.base_sequence >= 0:
                return self._produce_sequenced(dest, rows, holding)
            fut, waits = self.listener.produce(self.session, dest, rows.messages, rows.nbytes)
            if waits:
                holding.append(fut)
            return fut
        except (SparkMQError, RecordError, OutOfOrder, TxnRefused) as exc:
            return exc

    def _create_topic(self, name: str) -> None:
        """A topic a producer names that is not there: created (a Kafka client's topic is a
        log), when auto-creation is on."""
        self.session.open_named(name, "topic", self.topic_settings)

    def _produce_sequenced(self, dest: str, rows: Any, holding: list[Future]) -> Future:
        """An idempotent producer's batch: in sequence, or refused (:mod:`.sequences`)."""
        pid, epoch, first = rows.producer_id, rows.producer_epoch, rows.base_sequence
        term = self.link.nodes.term(dest)

        def stored() -> int | None:  # (the log's, for a producer new to this term)
            return self.session.newest_dedup_number(dest, dedup_prefix(pid, epoch))

        self.sequences.check(dest, pid, epoch, first, term, stored)
        try:
            fut, waits = self.listener.produce(self.session, dest, rows.messages, rows.nbytes)
        except NotOwner:  # (sent again once it is served: the batches behind it wait)
            self.sequences.refused_for_a_move(dest, pid, epoch, first, term, stored)
            raise
        except SparkMQError:  # (refused for what it holds: not expected again)
            self.sequences.taken(dest, pid, epoch, first, rows.messages.num_rows, term)
            raise
        self.sequences.taken(dest, pid, epoch, first, rows.messages.num_rows, term)
        if waits:
            holding.append(fut)
        return fut

    def _produce_response(self, r: Request, results: list[_Produced]) -> Any:
        mod = codec.response_module(r.api_key, r.version)
        by_topic: dict[Any, list[Any]] = {}
        leaders: set[int] = set()
        for asked, name, index, outcome in results:
            err, message, base = ErrorCode.none, None, -1
            if isinstance(outcome, Future):
                exc = outcome.exception()
                if exc is None:
                    base = _first_offset(outcome.result())
                else:
                    outcome = exc
            if isinstance(outcome, BaseException):
                err, message = _code_of(outcome), message_of(outcome)
            by_topic.setdefault(asked, []).append(
                build(
                    mod,
                    "PartitionProduceResponse",
                    index=index,
                    error_code=err,
                    base_offset=base,
                    log_append_time=None,
                    log_start_offset=0,
                    record_errors=(),
                    error_message=message,
                    current_leader=self._moved_to(mod, err, name, index, leaders),
                )
            )
        by_id = r.version >= 13
        return build(
            mod,
            "ProduceResponse",
            responses=tuple(
                build(
                    mod,
                    "TopicProduceResponse",
                    **{"topic_id" if by_id else "name": t},
                    partition_responses=tuple(ps),
                )
                for t, ps in by_topic.items()
            ),
            throttle_time=_ZERO,
            node_endpoints=node_endpoints(mod, self.link.nodes, leaders),
        )

    def _moved_to(self, mod: Any, err: ErrorCode, name: str, index: int, named: set[int]) -> Any:
        """Where a partition not led here is led (KIP-951: Produce 10+, Fetch 16+): a client
        sends its next request there at once, without asking Metadata first. (-1, -1) for
        any other error, as Kafka's brokers answer."""
        led = self._leader(name, index) if err is ErrorCode.not_leader_or_follower else None
        return current_leader(mod, led, named)

    # -- InitProducerId ----------------------------------------------------------------------
    def _init_producer_id(self, r: Request, slot: Any) -> None:
        """A producer id for an idempotent producer (random: unique across restarts and the
        brokers of a pair without any coordination); one asking again with its id (after an
        error, v3+) gets the next epoch. A transactional one's is its coordinator's
        (:mod:`.transactions`)."""
        body = r.body
        mod = codec.response_module(r.api_key, r.version)
        err, pid, epoch = ErrorCode.none, -1, -1
        if body.transactional_id is not None:
            err, pid, epoch = self.txn.init_producer_id(r)
        elif getattr(body, "producer_id", -1) >= 0:
            pid, epoch = body.producer_id, (body.producer_epoch + 1) % 32767
        else:
            pid, epoch = secrets.randbits(62), 0
        self.link.answer(
            slot,
            build(
                mod,
                "InitProducerIdResponse",
                throttle_time=_ZERO,
                error_code=err,
                producer_id=pid,
                producer_epoch=epoch,
            ),
        )

    # -- ListOffsets -------------------------------------------------------------------------
    def _list_offsets(self, r: Request, slot: Any) -> None:
        asked = [
            (t.name, p.partition_index, p.timestamp) for t in r.body.topics for p in t.partitions
        ]
        session = self.session

        def look() -> list[tuple[str, int, ErrorCode, int, int]]:
            out: list[tuple[str, int, ErrorCode, int, int]] = []
            for name, index, ts in asked:
                try:
                    dest = self._target(name, index)
                    end = session.log_end(dest)
                    if ts == -1:  # latest
                        out.append((name, index, ErrorCode.none, -1, end))
                    elif ts == -2:  # earliest
                        out.append((name, index, ErrorCode.none, -1, 0))
                    elif ts == -3:  # the largest timestamp's
                        out.append((name, index, ErrorCode.none, -1, max(end - 1, 0)))
                    else:
                        at = session.offset_at(dest, ts * 1000)
                        if at is None:  # (nothing enqueued since: -1, as Kafka answers)
                            out.append((name, index, ErrorCode.none, -1, -1))
                        else:
                            out.append((name, index, ErrorCode.none, ts, at))
                except SparkMQError as exc:
                    out.append((name, index, error_code(exc), -1, -1))
            return out

        def answer(found: list[tuple[str, int, ErrorCode, int, int]]) -> None:
            mod = codec.response_module(r.api_key, r.version)
            by_topic: dict[str, list[Any]] = {}
            for name, index, err, ts, offset in found:
                by_topic.setdefault(name, []).append(
                    build(
                        mod,
                        "ListOffsetsPartitionResponse",
                        partition_index=index,
                        error_code=err,
                        timestamp=ts,
                        offset=offset,
                        leader_epoch=_epoch_of(self._leader(name, index)),
                        old_style_offsets=(offset,),
                    )
                )
            self.link.answer(
                slot,
                build(
                    mod,
                    "ListOffsetsResponse",
                    throttle_time=_ZERO,
                    topics=tuple(
                        build(mod, "ListOffsetsTopicResponse", name=n, partitions=tuple(ps))
                        for n, ps in by_topic.items()
                    ),
                ),
            )

        if all(ts in (-1, -2, -3) for _, _, ts in asked):
            answer(look())  # (end offsets: quick)
            return
        fut = self.listener.run_blocking(look)  # (by time: a read of the log)
        fut.add_done_callback(lambda f: self.link.threadsafe(_then, f, answer))

    # -- OffsetForLeaderEpoch ----------------------------------------------------------------
    def _offset_for_leader_epoch(self, r: Request, slot: Any) -> None:
        """Where a leader epoch's part of a partition's log ends, which a consumer asks after
        the partition's leader changed, to check that its position is not past it (KIP-320:
        the log was truncated). A sparkmq log is never truncated below what a fetch returned
        (fetches return durable messages only, and a move or a lost member keeps every one),
        so every epoch up to the leader's ends, for this check, at the log's end; an epoch
        after it is not known (-1, -1), as Kafka answers. A client's current epoch that is
        older than the leader's is fenced (FENCED_LEADER_EPOCH), a newer one not known yet
        here (UNKNOWN_LEADER_EPOCH): it asks Metadata again. Needs what a fetch needs."""
        mod = codec.response_module(r.api_key, r.version)
        topics = []
        for t in r.body.topics:
            parts = []
            for p in t.partitions:
                err, epoch, end = ErrorCode.none, -1, -1
                try:
                    dest = self._target(t.topic, p.partition)
                    log_end = self.session.log_end(dest)
                    term = self.link.nodes.term(dest)
                    if term is None:  # (placed elsewhere, and let go)
                        err = ErrorCode.not_leader_or_follower
                    elif 0 <= p.current_leader_epoch < term:
                        err = ErrorCode.fenced_leader_epoch
                    elif p.current_leader_epoch > term:
                        err = ErrorCode.unknown_leader_epoch
                    elif p.leader_epoch <= term:
                        epoch, end = p.leader_epoch, log_end
                except SparkMQError as exc:
                    err = error_code(exc)
                parts.append(
                    build(
                        mod,
                        "EpochEndOffset",
                        error_code=err,
                        partition=p.partition,
                        leader_epoch=epoch,
                        end_offset=end,
                    )
                )
            topics.append(
                build(mod, "OffsetForLeaderTopicResult", topic=t.topic, partitions=tuple(parts))
            )
        self.link.answer(
            slot,
            build(mod, "OffsetForLeaderEpochResponse", throttle_time=_ZERO, topics=tuple(topics)),
        )

    # -- Fetch -------------------------------------------------------------------------------
    def _fetch(self, r: Request, slot: Any) -> None:
        body = r.body
        by_id = r.version >= 13  # (topics named by their ids, KIP-516)
        parts = []
        for t in body.topics:
            asked = t.topic_id if by_id else t.topic
            name = self.topic_names.of(asked) if by_id else asked
            for p in t.partitions:
                parts.append(
                    _Part(asked, name or "", p.partition, p.fetch_offset, p.partition_max_bytes)
                )
        for part in parts:
            part.error = self._fetch_check(part) if part.topic else ErrorCode.unknown_topic_id
        wait = body.max_wait.total_seconds() if isinstance(body.max_wait, timedelta) else 0.0
        fetch = _Fetch(
            r,
            slot,
            parts,
            max(body.min_bytes, 1),
            max(body.max_bytes, 1),
            time.monotonic() + max(wait, 0.0),
        )
        self._fetch_step(fetch)

    def _fetch_check(self, part: _Part) -> ErrorCode:
        try:
            kind = self.session.kind(part.topic)
            if kind is None:
                raise DestinationNotFound(f"there is no topic {part.topic!r}")
            if kind == "queue":
                if part.topic in self._told_queue:
                    return ErrorCode.invalid_topic_exception
                self._told_queue.add(part.topic)  # (once a connection: clients retry often)
                log.info(
                    "kafka: %s fetched queue %s as a log: a queue's messages go to one consumer "
                    "each; use a share consumer (share groups), the SDK or STOMP",
                    self.link.peer,
                    part.topic,
                )
                return ErrorCode.invalid_topic_exception
            part.source = self._target(part.topic, part.partition)
            part.end = self.session.log_end(part.source)
        except SparkMQError as exc:
            return error_code(exc)
        if part.offset < 0 or part.offset > part.end:
            return ErrorCode.offset_out_of_range
        return ErrorCode.none

    def _fetch_step(self, fetch: _Fetch) -> None:
        """Read what is there, or wait for it (or answer, when the wait is over)."""
        if fetch.done or fetch.reading:
            return
        now = time.monotonic()
        for p in fetch.parts:
            if p.error is ErrorCode.none:
                try:
                    p.end = self.session.log_end(p.source)
                except SparkMQError as exc:  # (a cluster's topic moved away meanwhile)
                    p.error = error_code(exc)
        readable = [p for p in fetch.parts if p.error is ErrorCode.none]
        have = [p for p in readable if p.offset < p.end]
        errors = any(p.error is not ErrorCode.none for p in fetch.parts)
        if have and (errors or now >= fetch.deadline or self._enough(fetch, have)):
            # the tail a waiting fetch was woken for is in memory: read here, answer now
            # (through a helper thread, the answer came a loop turn and two thread hops later)
            if sum(p.end - p.offset for p in have) <= _INLINE_ROWS and self._read_here(fetch, have):
                self._fetch_answer(fetch)
                return
            fetch.reading = True
            fut = self.listener.run_blocking(self._read, fetch, have)
            fut.add_done_callback(lambda f: self.link.threadsafe(self._fetched, fetch, f))
            return
        if errors or now >= fetch.deadline:
            self._fetch_answer(fetch)
            return
        self._wait(fetch, readable)

    def _read_here(self, fetch: _Fetch, have: list[_Part]) -> bool:
        """Read a small tail from memory on the loop; False: it is not all there (or the read
        failed: the helper thread's read says why)."""
        try:
            return self._read(fetch, have, recent=True)
        except SparkMQError:
            for p in have:
                p.records = b""
            return False

    def _enough(self, fetch: _Fetch, have: list[_Part]) -> bool:
        """Whether what waits is likely ``min.bytes`` (a message counted at 1 KiB until read)."""
        if fetch.min_bytes <= 1:
            return True
        return sum(p.end - p.offset for p in have) * 1024 >= fetch.min_bytes

    def _read(self, fetch: _Fetch, have: list[_Part], *, recent: bool = False) -> bool:
        """(A helper thread; the loop when ``recent``.) Each partition's records from its
        offset; ``recent``: from memory only (False, nothing kept, when some are not there)."""
        budget = fetch.max_bytes
        for p in have:
            if budget <= 0:
                break
            records = self._read_ahead.records(
                p.source, p.offset, min(p.max_bytes, budget), p.end, recent=recent
            )
            if records is None:
                for q in have:
                    q.records = b""
                return False
            p.records = records
            budget -= len(records)
        return True

    def _fetched(self, fetch: _Fetch, fut: Future) -> None:
        fetch.reading = False
        exc = fut.exception()
        if exc is not None:
            log.warning("kafka: a fetch for %s failed: %s", self.link.peer, message_of(exc))
            for p in fetch.parts:
                if p.error is ErrorCode.none and not p.records:
                    p.error = error_code(exc)
        self._fetch_answer(fetch)

    def _wait(self, fetch: _Fetch, readable: list[_Part]) -> None:
        if not fetch.unwatch:
            self.fetches.add(fetch)
            for source in {p.source for p in readable}:
                fetch.unwatch.append(self.session.watch_log(source, partial(self._woken, fetch)))
            fetch.timer = self.link.loop.call_at(
                _loop_time(self.link.loop, fetch.deadline), self._fetch_step, fetch
            )

    def _woken(self, fetch: _Fetch) -> None:
        """(The committing thread.) A destination it waits on has new messages."""
        if not fetch.woken:
            fetch.woken = True
            self.link.threadsafe(self._recheck, fetch)

    def _recheck(self, fetch: _Fetch) -> None:
        fetch.woken = False
        self._fetch_step(fetch)

    def _end_wait(self, fetch: _Fetch) -> None:
        fetch.done = True
        self.fetches.discard(fetch)
        for unwatch in fetch.unwatch:
            unwatch()
        fetch.unwatch.clear()
        if fetch.timer is not None:
            fetch.timer.cancel()

    def _fetch_answer(self, fetch: _Fetch) -> None:
        self._end_wait(fetch)
        r = fetch.request
        mod = codec.response_module(r.api_key, r.version)
        by_topic: dict[Any, list[Any]] = {}
        leaders: set[int] = set()
        for p in fetch.parts:
            by_topic.setdefault(p.asked, []).append(
                build(
                    mod,
                    "PartitionData",
                    partition_index=p.partition,
                    error_code=p.error,
                    high_watermark=max(p.end, 0),
                    last_stable_offset=max(p.end, 0),
                    log_start_offset=0,
                    aborted_transactions=(),
                    preferred_read_replica=-1,
                    records=p.records,  # (empty, never null: librdkafka reads a null as a bad size)
                    current_leader=self._moved_to(mod, p.error, p.topic, p.partition, leaders),
                )
            )
        by_id = r.version >= 13
        response = build(
            mod,
            "FetchResponse",
            throttle_time=_ZERO,
            error_code=ErrorCode.none,
            session_id=0,
            responses=tuple(
                build(
                    mod,
                    "FetchableTopicResponse",
                    **{"topic_id" if by_id else "topic": t},
                    partitions=tuple(ps),
                )
                for t, ps in by_topic.items()
            ),
            node_endpoints=node_endpoints(mod, self.link.nodes, leaders),
        )
        self.link.answer(fetch.slot, response)


def _code_of(exc: BaseException) -> ErrorCode:
    if isinstance(exc, TxnRefused):
        return exc.code
    if isinstance(exc, UnknownTopicId):
        return ErrorCode.unknown_topic_id
    if isinstance(exc, OutOfOrder):
        return ErrorCode.out_of_order_sequence_number
    return error_code(exc)


def _epoch_of(led: tuple[int, int] | None) -> int:
    return -1 if led is None else led[1]


def _first_offset(result: Any) -> int:
    if isinstance(result, c.ProduceResult):
        return result.offsets[0] if result.offsets else -1
    return int(result.first_offset)


def _all(futures: list[Future]) -> Future:
    """A future done once every one of ``futures`` is."""
    out: Future = Future()
    left = [len(futures)]

    def one(_: Future) -> None:
        left[0] -= 1
        if left[0] == 0:
            out.set_result(None)

    for f in futures:
        f.add_done_callback(one)
    return out


def _log_unacked(peer: str, name: str, outcome: Future | BaseException) -> None:
    """acks=0: nobody hears how it went; the log does."""

    def report(exc: BaseException | None) -> None:
        if exc is not None:
            log.warning(
                "kafka: a produce to %s from %s (acks=0) was not stored: %s",
                name,
                peer,
                message_of(exc),
            )

    if isinstance(outcome, Future):
        outcome.add_done_callback(lambda f: report(f.exception()))
    else:
        report(outcome)


def _then(fut: Future, then: Callable[[Any], None]) -> None:
    exc = fut.exception()
    if exc is not None:
        raise exc
    then(fut.result())


def _loop_time(loop: Any, deadline: float) -> float:
    """``deadline`` (``time.monotonic()``) on ``loop``'s clock."""
    return float(loop.time() + (deadline - time.monotonic()))
