"""Kafka transactions: a transactional producer's records, and the consumer offsets it sends,
all or nothing (exactly-once consume-transform-produce).

A producer with a ``transactional.id`` finds its coordinator (FindCoordinator of type 1: this
broker, or the cluster member coordinating the groups) and gets a producer id and epoch there
(InitProducerId). Each transaction then adds its partitions (AddPartitionsToTxn), produces
transactional record batches to them, may add a group's offsets (AddOffsetsToTxn,
TxnOffsetCommit) and ends with EndTxn, commit or abort.

**An open transaction's records are kept beside the log, never in it.** Produce answers once
they are kept (base offset -1: they have none yet), in the order of each partition's sequence
numbers (a batch sent again is kept once). EndTxn's commit stores every record and the offsets
as one broker transaction (:mod:`spark_mq.broker.transactions`: recorded in the transaction log
first, so a crash after that finishes it at recovery, and a crash before it leaves nothing).
Nothing of an open or aborted transaction is ever in a log: a ``read_committed`` consumer (and
a ``read_uncommitted`` one, an SDK, STOMP or Spark reader) sees each committed transaction's
records at once, and an abort only drops what was kept. There are no control records; a
topic's last stable offset is its end.

What Kafka's coordinator keeps in ``__transaction_state`` is kept in memory here, on the
listener's loop: **a broker's restart or failover aborts the transactions open on it** (their
producers are told their producer id is unknown, abort and begin again). A transaction open
past its ``transaction.timeout.ms`` is aborted the same way, and its producer fenced.

**Fencing**: InitProducerId for a transactional id already in use bumps its epoch, and aborts
its open transaction; the older producer's requests then get PRODUCER_FENCED (a Produce,
INVALID_PRODUCER_EPOCH), as Kafka fences a zombie.

**Security**: a transactional id is its principal's own (another user's producer with the same
id is another producer, and cannot fence this one). Its records need ``produce`` on their
topics, its offsets ``consume`` on the group and on their topics, checked as each request comes
and again at the commit.

**A cluster**: the coordinating member keeps the transactions. When the groups' offsets move
to another member, a transaction open then is aborted: its producer, sent there, is told its
producer id is unknown, aborts and begins again (what the old member kept is dropped at the
transaction's timeout, or used if the offsets come back before it). Every partition a
transaction adds must be served by that member (as a sparkmq transaction's destinations must
be by one member); a partition served by another is refused (POLICY_VIOLATION: the client
aborts), and the member's log says to pin the topic to the coordinating member.
"""

from __future__ import annotations

import logging
import secrets
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import pyarrow as pa

from spark_mq.connection.listener import ListenerCore
from spark_mq.errors import BrokerUnavailable, NotOwner, SparkMQError
from spark_mq.messages import Messages, plain_batch
from spark_mq.session import ClientSession
from spark_mq.transports.kafka import codec
from spark_mq.transports.kafka.codec import ErrorCode, Request, build
from spark_mq.transports.kafka.groups import Coordinator
from spark_mq.transports.kafka.link import KafkaLink, error_code, group_refused, message_of
from spark_mq.transports.kafka.records import Produced

log = logging.getLogger(__name__)

_ZERO = timedelta(0)
MAX_TIMEOUT_MS = 900_000  # the longest transaction.timeout.ms taken (Kafka's default maximum)
_EPOCHS = 32767  # a producer id's epochs (int16); past the last one, a new producer id
_SEQUENCES = 2**31
# a transactional id unused this long (no transaction open) is forgotten, as Kafka's
# transactional.id.expiration.ms (7 days): its producer, back later, is told to initialise again
ID_EXPIRY_S = 7 * 24 * 3600.0

EMPTY, ONGOING, ENDING = "Empty", "Ongoing", "Ending"


class TxnRefused(Exception):
    """A transactional request refused with Kafka's ``code``, saying why."""

    def __init__(self, code: ErrorCode, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


@dataclass(frozen=True, slots=True)
class Kept:
    """A transactional Produce's answer: kept, not yet in the log (no offset)."""

    first_offset: int = -1


@dataclass(eq=False)
class Txn:
    """One transactional id's producer and its open transaction."""

    owner: str  # the principal's name
    tid: str
    producer_id: int
    epoch: int
    timeout_s: float
    state: str = EMPTY
    began: float = 0.0  # (monotonic) when the open transaction began
    partitions: set[tuple[str, int]] = field(default_factory=set)
    groups: set[str] = field(default_factory=set)
    records: list[tuple[str, Messages]] = field(default_factory=list)  # (destination, kept)
    offsets: dict[str, dict[tuple[str, int], tuple[int, str | None]]] = field(default_factory=dict)
    next_sequence: dict[str, int] = field(default_factory=dict)  # this transaction's
    nbytes: int = 0
    ended: bool | None = None  # how the last transaction ended (True: committed)
    used: float = 0.0  # (monotonic) when a request last named it

    def drop(self) -> None:
        """The open transaction's records and offsets forgotten (aborted, or committed)."""
        self.state = EMPTY
        self.partitions.clear()
        self.groups.clear()
        self.records = []
        self.offsets = {}
        self.next_sequence = {}
        self.nbytes = 0

    def begin(self, now: float) -> None:
        if self.state == EMPTY:
            self.state = ONGOING
            self.began = now


class ProducerTransactions:
    """A listener's transactional producers and their open transactions (its loop's: no
    locks). ``max_bytes``: what one open transaction may keep (``limits.max_batch_bytes``)."""

    def __init__(self, max_bytes: int, clock: Callable[[], float] = time.monotonic) -> None:
        self.max_bytes = max_bytes
        self.clock = clock
        self._by_id: dict[tuple[str, str], Txn] = {}
        self._by_pid: dict[int, Txn] = {}
        self.aborted_on_timeout = 0

    def init(self, owner: str, tid: str, timeout_ms: int, pid: int, epoch: int) -> Txn:
        """InitProducerId: a new producer id for a new transactional id; else its epoch bumped
        (the producer before it fenced), its open transaction aborted. ``pid``/``epoch``: the
        asker's own (KIP-360, v3+; -1: none)."""
        if not 0 < timeout_ms <= MAX_TIMEOUT_MS:
            raise TxnRefused(
                ErrorCode.invalid_transaction_timeout,
                f"transaction.timeout.ms {timeout_ms} is not between 1 and {MAX_TIMEOUT_MS}",
            )
        txn = self._by_id.get((owner, tid))
        if txn is None:
            txn = Txn(owner, tid, self._new_pid(), 0, timeout_ms / 1000, used=self.clock())
            self._by_id[(owner, tid)] = txn
            self._by_pid[txn.producer_id] = txn
            return txn
        txn.used = self.clock()
        if txn.state == ENDING:
            raise TxnRefused(
                ErrorCode.concurrent_transactions, f"{tid}'s transaction is being committed"
            )
        if pid >= 0 and (pid, epoch) != (txn.producer_id, txn.epoch):
            raise TxnRefused(
                ErrorCode.producer_fenced,
                f"{tid} has producer {txn.producer_id} epoch {txn.epoch} now, not {pid} "
                f"epoch {epoch}: this producer was fenced by a newer one",
            )
        if txn.state == ONGOING:
            log.info(
                "kafka: transactional id %s initialised again: its open transaction is "
                "aborted (%d record batch(es) dropped)",
                tid,
                len(txn.records),
            )
        txn.drop()
        self._bump(txn)
        txn.timeout_s = timeout_ms / 1000
        txn.ended = None
        return txn

    def get(self, owner: str, tid: str, pid: int, epoch: int) -> Txn:
        """The producer a transactional request names, if it is the current one."""
        txn = self._by_id.get((owner, tid))
        if txn is None or txn.producer_id != pid:
            raise TxnRefused(
                ErrorCode.invalid_producer_id_mapping,
                f"producer id {pid} is not {tid}'s here (its open transaction was aborted "
                "by a restart or failover, or it was never initialised): initialise it again",
            )
        if epoch != txn.epoch:
            raise TxnRefused(
                ErrorCode.producer_fenced,
                f"{tid}'s producer epoch is {txn.epoch}, not {epoch}: this producer was "
                "fenced (a newer one initialised the same transactional id, or its "
                "transaction timed out)",
            )
        txn.used = self.clock()
        return txn

    def of_producer(self, owner: str, pid: int, epoch: int) -> Txn:
        """The producer a transactional record batch comes from."""
        txn = self._by_pid.get(pid)
        if txn is None or txn.owner != owner:
            raise TxnRefused(
                ErrorCode.invalid_producer_id_mapping,
                f"producer id {pid} has no transaction here (aborted by a restart or "
                "failover, or its coordinator is another cluster member)",
            )
        if epoch != txn.epoch:
            raise TxnRefused(
                ErrorCode.invalid_producer_epoch,
                f"{txn.tid}'s producer epoch is {txn.epoch}, not {epoch}: fenced",
            )
        txn.used = self.clock()
        return txn

    def keep(self, txn: Txn, destination: str, topic: str, index: int, rows: Produced) -> None:
        """A transactional batch kept until its transaction ends; one sent again (its
        sequence before the next expected) is kept once."""
        if txn.state == ENDING:
            raise TxnRefused(
                ErrorCode.invalid_txn_state,
                f"{txn.tid}'s transaction is being committed: no more records",
            )
        first, n = rows.base_sequence, rows.messages.num_rows
        expected = txn.next_sequence.get(destination)
        if expected is not None:
            behind = (expected - first) % _SEQUENCES
            if 0 < behind < _SEQUENCES // 2 and behind >= n:
                return  # (sent again: kept already)
            if first != expected:
                raise TxnRefused(
                    ErrorCode.out_of_order_sequence_number,
                    f"{topic}[{index}]: sequence {first} where {expected} was expected",
                )
        if txn.nbytes + rows.nbytes > self.max_bytes:
            raise TxnRefused(
                ErrorCode.message_too_large,
                f"{txn.tid}'s transaction would keep more than {self.max_bytes} bytes "
                "(limits.max_batch_bytes): commit smaller transactions",
            )
        txn.begin(self.clock())
        txn.partitions.add((topic, index))
        txn.next_sequence[destination] = (first + n) % _SEQUENCES
        txn.records.append((destination, rows.messages))
        txn.nbytes += rows.nbytes

    def pending_offsets(self, group: str) -> set[tuple[str, int]]:
        """The partitions of ``group`` an open transaction commits offsets of."""
        out: set[tuple[str, int]] = set()
        for txn in self._by_id.values():
            out.update(txn.offsets.get(group, {}))
        return out

    def sweep(self) -> None:
        """Open transactions past their timeout aborted, their producers fenced; ids unused
        past :data:`ID_EXPIRY_S` forgotten."""
        now = self.clock()
        for txn in list(self._by_id.values()):
            if txn.state == EMPTY and now - txn.used > ID_EXPIRY_S:
                del self._by_id[(txn.owner, txn.tid)]
                self._by_pid.pop(txn.producer_id, None)
                continue
            if txn.state == ONGOING and now - txn.began > txn.timeout_s:
                log.warning(
                    "kafka: transaction of %s (producer %d epoch %d) open for longer than its "
                    "timeout (%.0f s): aborted, %d record batch(es) dropped; its producer is "
                    "fenced",
                    txn.tid,
                    txn.producer_id,
                    txn.epoch,
                    txn.timeout_s,
                    len(txn.records),
                )
                txn.drop()
                self._bump(txn)
                txn.ended = False
                self.aborted_on_timeout += 1

    # -- what admin tools are shown (KIP-664's views: transaction_admin.py) ------------------
    def listed(self, owner: str | None) -> list[Txn]:
        """The transactional ids ``owner`` has here (None: every principal's)."""
        return [t for t in self._by_id.values() if owner is None or t.owner == owner]

    def find(self, owner: str, tid: str, any_owner: bool) -> Txn | None:
        """``owner``'s transactional id ``tid``; ``any_owner`` (a broker admin): another
        principal's when ``owner`` has none of that name (the one used last)."""
        txn = self._by_id.get((owner, tid))
        if txn is not None or not any_owner:
            return txn
        others = [t for t in self._by_id.values() if t.tid == tid]
        return max(others, key=lambda t: t.used) if others else None

    def on_partition(self, topic: str, index: int) -> list[Txn]:
        """The open transactions that took in partition ``index`` of ``topic``."""
        return [
            t for t in self._by_id.values() if t.state != EMPTY and (topic, index) in t.partitions
        ]

    def abort_by_admin(self, pid: int, epoch: int, topic: str, index: int) -> bool:
        """An admin tool's abort marker for producer ``pid`` on a partition (Kafka's
        ``kafka-transactions.sh abort``): the producer's open transaction, if it took in that
        partition, aborted whole (nothing of it is in any log: no part of it can be kept) and
        its producer fenced, as at its timeout. False when there was nothing to abort."""
        txn = self._by_pid.get(pid)
        if txn is None or txn.state == EMPTY or (topic, index) not in txn.partitions:
            return False
        if epoch != txn.epoch:
            raise TxnRefused(
                ErrorCode.invalid_producer_epoch,
                f"producer {pid}'s epoch is {txn.epoch}, not {epoch}",
            )
        if txn.state == ENDING:
            raise TxnRefused(
                ErrorCode.concurrent_transactions,
                f"{txn.tid}'s transaction is being committed",
            )
        log.warning(
            "kafka: transaction of %s (producer %d epoch %d) aborted by an admin's marker on "
            "%s[%d]: %d record batch(es) dropped; its producer is fenced",
            txn.tid,
            pid,
            epoch,
            topic,
            index,
            len(txn.records),
        )
        txn.drop()
        self._bump(txn)
        txn.ended = False
        return True

    def open_count(self) -> int:
        return sum(1 for t in self._by_id.values() if t.state != EMPTY)

    def figures(self) -> dict[str, int]:
        """For the metrics: producers, open transactions, the bytes they keep, and the
        transactions aborted for their timeout since the start."""
        return {
            "producers": len(self._by_id),
            "open": self.open_count(),
            "kept_bytes": sum(t.nbytes for t in self._by_id.values()),
            "aborted_on_timeout": self.aborted_on_timeout,
        }

    def _bump(self, txn: Txn) -> None:
        if txn.epoch + 1 < _EPOCHS:
            txn.epoch += 1
            return
        self._by_pid.pop(txn.producer_id, None)
        txn.producer_id, txn.epoch = self._new_pid(), 0
        self._by_pid[txn.producer_id] = txn

    def _new_pid(self) -> int:
        # (random, as idempotent producers': unique across restarts and members)
        while True:
            pid = secrets.randbits(62)
            if pid not in self._by_pid:
                return pid


class TransactionRequests:
    """A connection's transactional requests (the listener's :class:`ProducerTransactions`)."""

    def __init__(
        self,
        link: KafkaLink,
        listener: ListenerCore,
        session: ClientSession,
        transactions: ProducerTransactions,
        coordinator: Coordinator,
        target: Callable[[str, int], str],
        create_topic: Callable[[str], None],
    ) -> None:
        self.link = link
        self.listener = listener
        self.session = session
        self.txns = transactions
        self.groups = coordinator
        self._target = target  # (topic, partition) -> its destination
        self._create_topic = create_topic  # a topic not there yet, created as a Produce would

    def handlers(self) -> dict[int, Callable[[Request, Any], None]]:
        return {
            codec.ADD_PARTITIONS_TO_TXN: self._add_partitions,
            codec.ADD_OFFSETS_TO_TXN: self._add_offsets,
            codec.TXN_OFFSET_COMMIT: self._txn_offset_commit,
            codec.END_TXN: self._end_txn,
        }

    @property
    def _owner(self) -> str:
        return self.session.principal.name

    def _coordinating(self) -> None:
        if not self.link.nodes.coordinating():
            raise TxnRefused(ErrorCode.not_coordinator, "another member coordinates")

    # -- InitProducerId (a transactional id's; requests.py serves the others) ---------------
    def init_producer_id(self, r: Request) -> tuple[ErrorCode, int, int]:
        body = r.body
        try:
            self._coordinating()
            timeout = body.transaction_timeout
            ms = int(timeout.total_seconds() * 1000) if isinstance(timeout, timedelta) else 0
            txn = self.txns.init(
                self._owner,
                body.transactional_id,
                ms,
                getattr(body, "producer_id", -1),
                getattr(body, "producer_epoch", -1),
            )
        except TxnRefused as exc:
            self._refused("InitProducerId", body.transactional_id, exc)
            return exc.code, -1, -1
        log.debug(
            "kafka: %s: transactional id %s is producer %d epoch %d",
            self.link.peer,
            txn.tid,
            txn.producer_id,
            txn.epoch,
        )
        return ErrorCode.none, txn.producer_id, txn.epoch

    # -- Produce of a transactional batch -----------------------------------------------------
    def produce(self, destination: str, topic: str, index: int, rows: Produced) -> Future:
        """Keep a transactional batch with its transaction (answered at once)."""
        txn = self.txns.of_producer(self._owner, rows.producer_id, rows.producer_epoch)
        self.session.open_producer(destination)  # (``produce`` on it; served here)
        self.txns.keep(txn, destination, topic, index, rows)
        done: Future = Future()
        done.set_result(Kept())
        return done

    # -- AddPartitionsToTxn --------------------------------------------------------------------
    def _add_partitions(self, r: Request, slot: Any) -> None:
        body, mod = r.body, codec.response_module(r.api_key, r.version)
        tid = body.v3_and_below_transactional_id
        asked = [(t.name, list(t.partitions)) for t in body.v3_and_below_topics]
        errors: dict[tuple[str, int], ErrorCode] = {}
        try:
            self._coordinating()
            txn = self.txns.get(
                self._owner,
                tid,
                body.v3_and_below_producer_id,
                body.v3_and_below_producer_epoch,
            )
            if txn.state == ENDING:
                raise TxnRefused(ErrorCode.concurrent_transactions, "being committed")
            for name, indexes in asked:
                for index in indexes:
                    errors[(name, index)] = self._partition_error(name, index)
            if any(e is not ErrorCode.none for e in errors.values()):
                errors = {
                    k: ErrorCode.operation_not_attempted if e is ErrorCode.none else e
                    for k, e in errors.items()
                }
            else:
                txn.begin(self.txns.clock())
                txn.partitions.update(errors)
        except TxnRefused as exc:
            self._refused("AddPartitionsToTxn", tid, exc)
            errors = {(n, i): exc.code for n, indexes in asked for i in indexes}
        results = tuple(
            build(
                mod,
                "AddPartitionsToTxnTopicResult",
                name=name,
                results_by_partition=tuple(
                    build(
                        mod,
                        "AddPartitionsToTxnPartitionResult",
                        partition_index=i,
                        partition_error_code=errors[(name, i)],
                    )
                    for i in indexes
                ),
            )
            for name, indexes in asked
        )
        self.link.answer(
            slot,
            build(
                mod,
                "AddPartitionsToTxnResponse",
                throttle_time=_ZERO,
                results_by_topic_v3_and_below=results,
            ),
        )

    def _partition_error(self, name: str, index: int) -> ErrorCode:
        """Whether partition ``index`` of topic ``name`` may be in a transaction here: it is
        (created, as a Produce would), the principal may produce to it, and (a cluster) this
        member serves it."""
        try:
            if self.session.kind(name) is None:
                self._create_topic(name)
            self.session.open_producer(self._target(name, index))
        except NotOwner as exc:
            if not exc.fields.get("member"):  # (being placed just now: asked again)
                return ErrorCode.unknown_topic_or_partition
            log.warning(
                "kafka: %s: %s[%d] cannot be in a transaction here: it is served by cluster "
                "member %s, and a transaction's partitions must all be served by the member "
                "coordinating transactions (pin the topic to it: sparkmq cluster pin)",
                self.link.peer,
                name,
                index,
                exc.fields["member"],
            )
            return ErrorCode.policy_violation
        except SparkMQError as exc:
            return error_code(exc)
        return ErrorCode.none

    # -- AddOffsetsToTxn, TxnOffsetCommit ------------------------------------------------------
    def _add_offsets(self, r: Request, slot: Any) -> None:
        body, mod = r.body, codec.response_module(r.api_key, r.version)
        err = ErrorCode.none
        try:
            self._coordinating()
            txn = self.txns.get(self._owner, body.transactional_id, body.producer_id,
                                body.producer_epoch)  # fmt: skip
            if txn.state == ENDING:
                raise TxnRefused(ErrorCode.concurrent_transactions, "being committed")
            if group_refused(self.session, body.group_id, "consume"):
                raise TxnRefused(
                    ErrorCode.group_authorization_failed,
                    f"may not consume as group {body.group_id}",
                )
            txn.begin(self.txns.clock())
            txn.groups.add(body.group_id)
        except TxnRefused as exc:
            self._refused("AddOffsetsToTxn", body.transactional_id, exc)
            err = exc.code
        self.link.answer(
            slot, build(mod, "AddOffsetsToTxnResponse", throttle_time=_ZERO, error_code=err)
        )

    def _txn_offset_commit(self, r: Request, slot: Any) -> None:
        body, mod = r.body, codec.response_module(r.api_key, r.version)
        group = body.group_id
        asked = [(t.name, list(t.partitions)) for t in body.topics]
        errors: dict[str, ErrorCode] = {}
        try:
            self._coordinating()
            txn = self.txns.get(self._owner, body.transactional_id, body.producer_id,
                                body.producer_epoch)  # fmt: skip
            if txn.state == ENDING:
                raise TxnRefused(ErrorCode.concurrent_transactions, "being committed")
            if group_refused(self.session, group, "consume"):
                raise TxnRefused(
                    ErrorCode.group_authorization_failed, f"may not consume as group {group}"
                )
            generation = getattr(body, "generation_id", -1)
            member = getattr(body, "member_id", "")
            if generation >= 0 or member:  # (KIP-447: fenced by the group's generation)
                checked = self.groups.check_commit(group, generation, member)
                if checked is not ErrorCode.none:
                    raise TxnRefused(checked, f"group {group}: {checked.name}")
            mine = txn.offsets.setdefault(group, {})
            for topic, parts in asked:
                if not self.session.may_consume(topic):
                    errors[topic] = ErrorCode.topic_authorization_failed
                    continue
                for p in parts:
                    mine[(topic, p.partition_index)] = (p.committed_offset,
                                                        p.committed_metadata)  # fmt: skip
                errors[topic] = ErrorCode.none
            txn.begin(self.txns.clock())
            txn.groups.add(group)
        except TxnRefused as exc:
            self._refused("TxnOffsetCommit", body.transactional_id, exc)
            errors = {topic: exc.code for topic, _ in asked}
        topics = tuple(
            build(
                mod,
                "TxnOffsetCommitResponseTopic",
                name=topic,
                partitions=tuple(
                    build(
                        mod,
                        "TxnOffsetCommitResponsePartition",
                        partition_index=p.partition_index,
                        error_code=errors[topic],
                    )
                    for p in parts
                ),
            )
            for topic, parts in asked
        )
        self.link.answer(
            slot, build(mod, "TxnOffsetCommitResponse", throttle_time=_ZERO, topics=topics)
        )

    # -- EndTxn --------------------------------------------------------------------------------
    def _end_txn(self, r: Request, slot: Any) -> None:
        body, mod = r.body, codec.response_module(r.api_key, r.version)

        def answer(err: ErrorCode) -> None:
            self.link.answer(slot, build(mod, "EndTxnResponse", throttle_time=_ZERO,
                                         error_code=err))  # fmt: skip

        commit = bool(body.committed)
        tid = body.transactional_id
        try:
            self._coordinating()
            txn = self.txns.get(self._owner, tid, body.producer_id, body.producer_epoch)
            if txn.state == ENDING:
                raise TxnRefused(ErrorCode.concurrent_transactions, "being committed")
            if txn.state == EMPTY:  # (nothing kept: sent again, or nothing was taken in)
                if commit and txn.ended is False:
                    raise TxnRefused(
                        ErrorCode.invalid_txn_state,
                        f"{tid}'s last transaction was aborted: it cannot be committed",
                    )
                txn.ended = commit
                answer(ErrorCode.none)
                return
        except TxnRefused as exc:
            self._refused("EndTxn", tid, exc)
            answer(exc.code)
            return
        if not commit:
            log.debug("kafka: %s: transaction of %s aborted", self.link.peer, tid)
            txn.drop()
            txn.ended = False
            answer(ErrorCode.none)
            return
        txn.state = ENDING
        records = txn.records
        offsets = {
            g: [(t, p, o, m) for (t, p), (o, m) in entries.items()]
            for g, entries in txn.offsets.items()
        }
        session = self.session

        def work() -> None:
            session.commit_kafka_transaction(_records_table(records), offsets)

        fut = self.listener.run_blocking(work)

        def ended() -> None:
            exc = fut.exception()
            if exc is None or (isinstance(exc, BrokerUnavailable) and exc.fields.get("committed")):
                txn.drop()
                txn.ended = True
                answer(ErrorCode.none)
                return
            txn.state = ONGOING  # (kept: the producer aborts, or commits again)
            err = _commit_error(exc)
            log.warning(
                "kafka: %s: the transaction of %s was not committed (%s): %s",
                self.link.peer,
                tid,
                err.name,
                message_of(exc),
            )
            answer(err)

        fut.add_done_callback(lambda _: self.link.threadsafe(ended))

    def _refused(self, what: str, tid: str | None, exc: TxnRefused) -> None:
        level = logging.DEBUG if exc.code is ErrorCode.not_coordinator else logging.INFO
        log.log(level, "kafka: %s: %s of %s refused (%s): %s", self.link.peer, what, tid,
                exc.code.name, exc.message)  # fmt: skip


def _records_table(records: list[tuple[str, Messages]]) -> pa.Table | None:
    """A transaction's kept records as one produce table with a ``destination`` column."""
    parts = []
    for destination, messages in records:
        if messages.plain is not None:
            table = pa.Table.from_batches([plain_batch(messages.plain)])
        else:
            table = messages.table()
        parts.append(table.append_column("destination", pa.array([destination] * table.num_rows)))
    if not parts:
        return None
    return pa.concat_tables(parts, promote_options="default")


def _commit_error(exc: BaseException) -> ErrorCode:
    """EndTxn's error when its commit failed: one a client asks again with, when it may work
    shortly (a destination being placed, the disk or broker busy); else the error's own, which
    the client takes as "abort this transaction"."""
    if isinstance(exc, NotOwner) and not exc.fields.get("member"):
        return ErrorCode.concurrent_transactions
    if isinstance(exc, SparkMQError) and exc.retriable:
        return ErrorCode.concurrent_transactions
    return error_code(exc)
