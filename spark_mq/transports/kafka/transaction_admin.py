"""What Kafka's admin tools see of transactions, and their abort (KIP-664):
``kafka-transactions.sh list | describe | describe-producers | abort``, the Java ``Admin``'s
``listTransactions``/``describeTransactions``/``describeProducers``/``abortTransaction`` and
kafka-python's ``KafkaAdminClient`` of the same names.

- **ListTransactions** (v0-2): the transactional ids this broker coordinates, with their producer
  id and state, filtered by state, producer id, how long the transaction has run (v1) and a
  pattern of the id (v2, a regular expression the whole id must match, matched by RE2 in
  linear time as Kafka's RE2/J: no pattern can stall the listener).
- **DescribeTransactions** (v0): an id's state, producer id and epoch, timeout, when its open
  transaction began and the partitions it took in.
- **DescribeProducers** (v0): a partition's producers as this broker follows them: the
  idempotent ones (their last sequence) and the transactional ones with a transaction open on
  it. The records of an open transaction are not in the log (:mod:`.transactions`), so no
  transaction starts at an offset of it: ``CurrentTxnStartOffset`` is always -1.
- **WriteTxnMarkers** (v1-2) with an abort, as an admin tool sends it: the producer's open
  transaction, if it took in that partition, is aborted whole and its producer fenced. Kafka's
  brokers send each other commit markers; here only the coordinator commits, so a commit marker
  is refused (INVALID_REQUEST).

States are Kafka's names: ``Empty`` (no transaction open; never one yet), ``Ongoing``,
``PrepareCommit`` (being committed), ``CompleteCommit`` and ``CompleteAbort`` (how the last one
ended). A transaction here cannot hang: every open one is kept by its coordinator and ends at
its timeout.

**Security**: a transactional id is its principal's own. A principal lists and describes its
own ids; the broker's admin (``admin`` over every destination) sees every principal's, and
describes another's id when it has none of that name. DescribeProducers needs ``consume`` on
the topic (Kafka's Read); an abort needs the broker's admin (Kafka's ClusterAction):
CLUSTER_AUTHORIZATION_FAILED otherwise, audited.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import re2

from spark_mq.errors import SparkMQError
from spark_mq.session import ClientSession
from spark_mq.transports.kafka import codec
from spark_mq.transports.kafka.codec import ErrorCode, Request, build
from spark_mq.transports.kafka.link import KafkaLink, error_code
from spark_mq.transports.kafka.sequences import Sequences
from spark_mq.transports.kafka.transactions import (
    EMPTY,
    ENDING,
    ONGOING,
    ProducerTransactions,
    Txn,
    TxnRefused,
)

log = logging.getLogger(__name__)

_ZERO = timedelta(0)
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_NO_TIME = _EPOCH - timedelta(milliseconds=1)  # (-1 on the wire: no transaction open)
_RE2 = re2.Options()
_RE2.log_errors = False  # (a client's bad pattern is answered, not logged by RE2 itself)
STATES = ("Empty", "Ongoing", "PrepareCommit", "PrepareAbort", "CompleteCommit",
          "CompleteAbort", "Dead", "PrepareEpochFence")  # fmt: skip


def state_of(txn: Txn) -> str:
    """Kafka's name of ``txn``'s state."""
    if txn.state == ONGOING:
        return "Ongoing"
    if txn.state == ENDING:
        return "PrepareCommit"
    if txn.ended is None:
        return "Empty"
    return "CompleteCommit" if txn.ended else "CompleteAbort"


class TransactionAdminRequests:
    """A connection's admin views of transactions (the listener's registries)."""

    def __init__(
        self,
        link: KafkaLink,
        session: ClientSession,
        transactions: ProducerTransactions,
        sequences: Sequences,
        target: Callable[[str, int], str],
    ) -> None:
        self.link = link
        self.session = session
        self.txns = transactions
        self.sequences = sequences
        self._target = target  # (topic, partition) -> its destination

    def handlers(self) -> dict[int, Callable[[Request, Any], None]]:
        return {
            codec.LIST_TRANSACTIONS: self._list,
            codec.DESCRIBE_TRANSACTIONS: self._describe,
            codec.DESCRIBE_PRODUCERS: self._describe_producers,
            codec.WRITE_TXN_MARKERS: self._write_markers,
        }

    def _running_ms(self, txn: Txn) -> int:
        return int((self.txns.clock() - txn.began) * 1000)

    def _began(self, txn: Txn) -> datetime:
        """When ``txn``'s open transaction began (wall clock), or -1: none open."""
        if txn.state == EMPTY:
            return _NO_TIME
        return datetime.now(UTC) - timedelta(milliseconds=self._running_ms(txn))

    # -- ListTransactions ----------------------------------------------------------------------
    def _list(self, r: Request, slot: Any) -> None:
        body, mod = r.body, codec.response_module(r.api_key, r.version)

        def answer(err: ErrorCode, unknown: tuple[str, ...] = (), txns: tuple = ()) -> None:
            self.link.answer(
                slot,
                build(mod, "ListTransactionsResponse", throttle_time=_ZERO, error_code=err,
                      unknown_state_filters=unknown, transaction_states=txns),
            )  # fmt: skip

        states = set(body.state_filters)
        pids = set(body.producer_id_filters)
        longer_than = getattr(body, "duration_filter", -1)
        pattern = getattr(body, "transactional_id_pattern", None)
        try:
            matches = re2.compile(pattern, options=_RE2).fullmatch if pattern else None
        except re2.error as exc:
            log.info("kafka: %s: ListTransactions' pattern %r: %s", self.link.peer, pattern, exc)
            answer(ErrorCode.invalid_regular_expression)
            return
        owner = None if self.session.may_administer_broker() else self.session.principal.name
        listed = []
        for txn in self.txns.listed(owner):
            state = state_of(txn)
            if states and state not in states:
                continue
            if pids and txn.producer_id not in pids:
                continue
            if longer_than >= 0 and (txn.state == EMPTY or self._running_ms(txn) <= longer_than):
                continue
            if matches is not None and matches(txn.tid) is None:
                continue
            listed.append(
                build(mod, "TransactionState", transactional_id=txn.tid,
                      producer_id=txn.producer_id, transaction_state=state)
            )  # fmt: skip
        answer(ErrorCode.none, tuple(sorted(states - set(STATES))), tuple(listed))

    # -- DescribeTransactions ------------------------------------------------------------------
    def _describe(self, r: Request, slot: Any) -> None:
        body, mod = r.body, codec.response_module(r.api_key, r.version)
        coordinating = self.link.nodes.coordinating()
        admin = self.session.may_administer_broker()
        described = []
        for tid in body.transactional_ids:
            txn = None
            if not coordinating:
                err = ErrorCode.not_coordinator
            else:
                txn = self.txns.find(self.session.principal.name, tid, admin)
                err = ErrorCode.none if txn is not None else ErrorCode.transactional_id_not_found
            described.append(self._described(mod, tid, err, txn))
        self.link.answer(
            slot,
            build(mod, "DescribeTransactionsResponse", throttle_time=_ZERO,
                  transaction_states=tuple(described)),
        )  # fmt: skip

    def _described(self, mod: Any, tid: str, err: ErrorCode, txn: Txn | None) -> Any:
        topics: dict[str, list[int]] = {}
        if txn is not None:
            for topic, index in sorted(txn.partitions):
                topics.setdefault(topic, []).append(index)
        return build(
            mod,
            "TransactionState",
            error_code=err,
            transactional_id=tid,
            transaction_state=state_of(txn) if txn is not None else "",
            transaction_timeout=timedelta(seconds=txn.timeout_s) if txn is not None else _ZERO,
            transaction_start_time=self._began(txn) if txn is not None else _NO_TIME,
            producer_id=txn.producer_id if txn is not None else -1,
            producer_epoch=txn.epoch if txn is not None else -1,
            topics=tuple(
                build(mod, "TopicData", topic=t, partitions=tuple(p)) for t, p in topics.items()
            ),
        )

    # -- DescribeProducers ---------------------------------------------------------------------
    def _describe_producers(self, r: Request, slot: Any) -> None:
        body, mod = r.body, codec.response_module(r.api_key, r.version)
        asked = [(t.name, index) for t in body.topics for index in t.partition_indexes]
        where = {key: self._destination(*key) for key in asked}
        # (one pass over the idempotent producers followed, up to 100,000, for every partition
        # asked: not one a partition, which a request naming many would make a stall)
        idempotent = self.sequences.producers({d for d in where.values() if isinstance(d, str)})
        topics = []
        for t in body.topics:
            partitions = []
            for index in t.partition_indexes:
                dest = where[(t.name, index)]
                if isinstance(dest, str):
                    err, why = ErrorCode.none, None
                    producers = self._producers(mod, t.name, index, dest, idempotent)
                else:
                    (err, why), producers = dest, ()
                partitions.append(
                    build(mod, "PartitionResponse", partition_index=index, error_code=err,
                          error_message=why, active_producers=producers)
                )  # fmt: skip
            topics.append(build(mod, "TopicResponse", name=t.name, partitions=tuple(partitions)))
        self.link.answer(
            slot,
            build(mod, "DescribeProducersResponse", throttle_time=_ZERO, topics=tuple(topics)),
        )

    def _destination(self, topic: str, index: int) -> str | tuple[ErrorCode, str]:
        """The destination partition ``index`` of ``topic`` is, or why it is not described."""
        if not self.session.may_consume(topic):
            return ErrorCode.topic_authorization_failed, f"may not consume {topic}"
        try:
            return self._target(topic, index)
        except SparkMQError as exc:
            return error_code(exc), exc.message

    def _producers(
        self,
        mod: Any,
        topic: str,
        index: int,
        destination: str,
        idempotent: dict[str, list[tuple[int, int, int]]],
    ) -> tuple[Any, ...]:
        found: dict[int, tuple[int, int]] = {}  # producer id -> (epoch, last sequence)
        for pid, epoch, last in idempotent.get(destination, ()):
            found[pid] = (epoch, last)
        for txn in self.txns.on_partition(topic, index):
            following = txn.next_sequence.get(destination)
            last = (following - 1) % 2**31 if following is not None else -1
            found[txn.producer_id] = (txn.epoch, last)
        return tuple(
            build(mod, "ProducerState", producer_id=pid, producer_epoch=epoch,
                  last_sequence=last, last_timestamp=-1, coordinator_epoch=-1,
                  current_txn_start_offset=-1)
            for pid, (epoch, last) in sorted(found.items())
        )  # fmt: skip

    # -- WriteTxnMarkers (an admin tool's abort) -----------------------------------------------
    def _write_markers(self, r: Request, slot: Any) -> None:
        body, mod = r.body, codec.response_module(r.api_key, r.version)
        try:
            self.session.check_broker_admin()
            admin_err = None
        except SparkMQError as exc:
            log.info("kafka: %s: WriteTxnMarkers refused: %s", self.link.peer, exc)
            admin_err = ErrorCode.cluster_authorization_failed
        results = []
        for marker in body.markers:
            topics = []
            for t in marker.topics:
                errors = [
                    self._marker(marker, t.name, index) if admin_err is None else admin_err
                    for index in t.partition_indexes
                ]
                topics.append(
                    build(
                        mod,
                        "WritableTxnMarkerTopicResult",
                        name=t.name,
                        partitions=tuple(
                            build(
                                mod,
                                "WritableTxnMarkerPartitionResult",
                                partition_index=i,
                                error_code=e,
                            )
                            for i, e in zip(t.partition_indexes, errors, strict=True)
                        ),
                    )
                )
            results.append(
                build(mod, "WritableTxnMarkerResult", producer_id=marker.producer_id,
                      topics=tuple(topics))
            )  # fmt: skip
        self.link.answer(slot, build(mod, "WriteTxnMarkersResponse", markers=tuple(results)))

    def _marker(self, marker: Any, topic: str, index: int) -> ErrorCode:
        if marker.transaction_result:
            log.info(
                "kafka: %s: a commit marker for producer %d refused: only a transaction's "
                "coordinator commits it here (an admin tool may only abort)",
                self.link.peer,
                marker.producer_id,
            )
            return ErrorCode.invalid_request
        try:
            aborted = self.txns.abort_by_admin(
                marker.producer_id, marker.producer_epoch, topic, index
            )
        except TxnRefused as exc:
            log.info("kafka: %s: abort marker refused (%s): %s", self.link.peer,
                     exc.code.name, exc.message)  # fmt: skip
            return exc.code
        if aborted:
            self.session.audit_admin(
                "AbortKafkaTransaction",
                f"{topic}[{index}]",
                f"producer {marker.producer_id} epoch {marker.producer_epoch}",
            )
        return ErrorCode.none
