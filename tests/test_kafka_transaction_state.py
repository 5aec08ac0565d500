"""The transaction coordinator's state (spark_mq.transports.kafka.transactions.
ProducerTransactions): fencing, sequences, limits and timeouts, without a broker."""

from __future__ import annotations

import pytest

from spark_mq.messages import Messages, PlainMessage
from spark_mq.transports.kafka.codec import ErrorCode
from spark_mq.transports.kafka.records import Produced
from spark_mq.transports.kafka.sequences import Sequences
from spark_mq.transports.kafka.transaction_admin import state_of
from spark_mq.transports.kafka.transactions import (
    EMPTY,
    ONGOING,
    ProducerTransactions,
    Txn,
    TxnRefused,
)


class _Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _batch(txn: Txn, first: int, n: int, size: int = 10) -> Produced:
    messages = Messages.of_plain([PlainMessage(None, b"x") for _ in range(n)])
    return Produced(messages, txn.producer_id, txn.epoch, first, True, size)


def _refused(code: ErrorCode) -> pytest.RaisesExc[TxnRefused]:
    return pytest.raises(TxnRefused, check=lambda e: e.code is code)


def test_a_batch_sent_again_is_kept_once_and_one_past_the_next_is_refused() -> None:
    txns = ProducerTransactions(max_bytes=1000)
    txn = txns.init("alice", "t", 60_000, -1, -1)
    txns.keep(txn, "orders", "orders", 0, _batch(txn, 0, 3))
    txns.keep(txn, "orders", "orders", 0, _batch(txn, 0, 3))  # (sent again)
    with _refused(ErrorCode.out_of_order_sequence_number):
        txns.keep(txn, "orders", "orders", 0, _batch(txn, 5, 1))
    txns.keep(txn, "orders", "orders", 0, _batch(txn, 3, 2))
    txns.keep(txn, "other", "other", 0, _batch(txn, 7, 1))  # (each partition its own)
    assert [m.num_rows for _, m in txn.records] == [3, 2, 1]
    assert txn.state == ONGOING and txn.partitions == {("orders", 0), ("other", 0)}


def test_a_transaction_keeps_at_most_its_bytes() -> None:
    txns = ProducerTransactions(max_bytes=25)
    txn = txns.init("alice", "t", 60_000, -1, -1)
    txns.keep(txn, "d", "d", 0, _batch(txn, 0, 1, size=20))
    with _refused(ErrorCode.message_too_large):
        txns.keep(txn, "d", "d", 0, _batch(txn, 1, 1, size=10))
    assert txn.nbytes == 20


def test_initialising_again_fences_the_producer_before_and_aborts_its_transaction() -> None:
    txns = ProducerTransactions(max_bytes=1000)
    first = txns.init("alice", "t", 60_000, -1, -1)
    pid = first.producer_id
    txns.keep(first, "d", "d", 0, _batch(first, 0, 2))
    again = txns.init("alice", "t", 60_000, -1, -1)
    assert again is first and (again.producer_id, again.epoch) == (pid, 1)
    assert again.state == EMPTY and again.records == []
    with _refused(ErrorCode.producer_fenced):
        txns.get("alice", "t", pid, 0)
    with _refused(ErrorCode.invalid_producer_epoch):
        txns.of_producer("alice", pid, 0)
    with _refused(ErrorCode.producer_fenced):  # (KIP-360: an old epoch may not bump it)
        txns.init("alice", "t", 60_000, pid, 0)
    assert txns.get("alice", "t", pid, 1) is again
    # another principal's id of the same name is another producer
    bobs = txns.init("bob", "t", 60_000, -1, -1)
    assert bobs.producer_id != pid and txns.get("alice", "t", pid, 1) is again
    with _refused(ErrorCode.invalid_producer_id_mapping):
        txns.of_producer("bob", pid, 1)


def test_past_the_last_epoch_a_producer_gets_a_new_id() -> None:
    txns = ProducerTransactions(max_bytes=1000)
    txn = txns.init("alice", "t", 60_000, -1, -1)
    old = txn.producer_id
    txn.epoch = 32766
    txns.init("alice", "t", 60_000, -1, -1)
    assert txn.producer_id != old and txn.epoch == 0
    assert txns.of_producer("alice", txn.producer_id, 0) is txn
    with _refused(ErrorCode.invalid_producer_id_mapping):
        txns.of_producer("alice", old, 32766)


def test_a_transaction_open_past_its_timeout_is_aborted_and_fenced() -> None:
    clock = _Clock()
    txns = ProducerTransactions(max_bytes=1000, clock=clock)
    txn = txns.init("alice", "t", 2_000, -1, -1)
    txns.keep(txn, "d", "d", 0, _batch(txn, 0, 1))
    clock.now += 1.5
    txns.sweep()
    assert txn.state == ONGOING and txns.open_count() == 1
    clock.now += 1.0
    txns.sweep()
    assert txn.state == EMPTY and txn.records == [] and txn.epoch == 1
    assert txns.aborted_on_timeout == 1 and txns.open_count() == 0


@pytest.mark.parametrize("timeout_ms", [0, 900_001])
def test_a_timeout_out_of_range_is_refused(timeout_ms: int) -> None:
    with _refused(ErrorCode.invalid_transaction_timeout):
        ProducerTransactions(max_bytes=1000).init("alice", "t", timeout_ms, -1, -1)


def test_the_offsets_of_open_transactions_are_pending() -> None:
    txns = ProducerTransactions(max_bytes=1000)
    txn = txns.init("alice", "t", 60_000, -1, -1)
    txn.offsets["g"] = {("orders", 0): (5, None)}
    assert txns.pending_offsets("g") == {("orders", 0)}
    assert txns.pending_offsets("other") == set()
    txn.drop()
    assert txns.pending_offsets("g") == set()


def test_a_transactional_id_unused_for_a_week_is_forgotten() -> None:
    clock = _Clock()
    txns = ProducerTransactions(max_bytes=1000, clock=clock)
    idle = txns.init("alice", "idle", 60_000, -1, -1)
    busy = txns.init("alice", "busy", 60_000, -1, -1)
    clock.now += 6 * 24 * 3600
    txns.get("alice", "busy", busy.producer_id, 0)
    clock.now += 2 * 24 * 3600
    txns.sweep()
    assert txns.figures()["producers"] == 1
    with _refused(ErrorCode.invalid_producer_id_mapping):
        txns.get("alice", "idle", idle.producer_id, 0)
    assert txns.get("alice", "busy", busy.producer_id, 0) is busy


def test_what_admin_tools_see_is_each_principal_s_own_and_an_admin_sees_all() -> None:
    txns = ProducerTransactions(max_bytes=1000)
    hers = txns.init("alice", "t", 60_000, -1, -1)
    his = txns.init("bob", "t", 60_000, -1, -1)
    txns.keep(his, "d", "d", 0, _batch(his, 0, 2))
    assert txns.listed("bob") == [his] and set(map(id, txns.listed(None))) == {id(hers), id(his)}
    assert txns.find("alice", "t", any_owner=True) is hers  # (her own first)
    assert txns.find("carol", "t", any_owner=False) is None
    assert txns.find("carol", "t", any_owner=True) is his  # (the one used last)
    assert txns.on_partition("d", 0) == [his] and txns.on_partition("d", 1) == []
    assert state_of(hers) == "Empty" and state_of(his) == "Ongoing"


def test_an_admin_s_abort_aborts_the_whole_transaction_and_fences_its_producer() -> None:
    txns = ProducerTransactions(max_bytes=1000)
    txn = txns.init("alice", "t", 60_000, -1, -1)
    txns.keep(txn, "d", "d", 0, _batch(txn, 0, 2))
    txns.keep(txn, "e", "e", 0, _batch(txn, 0, 1))
    assert not txns.abort_by_admin(txn.producer_id, txn.epoch, "f", 0)  # (not in it)
    with _refused(ErrorCode.invalid_producer_epoch):
        txns.abort_by_admin(txn.producer_id, txn.epoch + 1, "d", 0)
    assert txn.state == ONGOING
    assert txns.abort_by_admin(txn.producer_id, 0, "d", 0)
    assert txn.state == EMPTY and txn.records == [] and txn.epoch == 1
    assert state_of(txn) == "CompleteAbort"
    with _refused(ErrorCode.producer_fenced):
        txns.get("alice", "t", txn.producer_id, 0)
    assert not txns.abort_by_admin(txn.producer_id, 1, "d", 0)  # (nothing open: nothing to do)


def test_the_idempotent_producers_of_a_topic_are_listed_with_their_last_sequence() -> None:
    seqs = Sequences()
    seqs.taken("d", 7, 0, 0, 5, 0)
    seqs.taken("e", 8, 1, 0, 1, 0)
    assert seqs.producers({"d", "f"}) == {"d": [(7, 0, 4)]}
