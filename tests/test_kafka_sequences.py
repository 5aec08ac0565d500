"""Kafka's idempotent producers, their sequence numbers as one listener sees them
(spark_mq.transports.kafka.sequences): a batch behind one refused for a move (being placed here
just now) is refused out of order, and the client sends both again in order; what a member
expected of a producer before its topic went away does not count when the topic comes back.
librdkafka across real moves is in tests/test_cluster.py; the single broker's rules, over the
wire, in tests/test_kafka.py."""

from __future__ import annotations

import pytest

from spark_mq.transports.kafka.sequences import OutOfOrder, Sequences


def test_a_kafka_batch_refused_for_a_move_makes_the_ones_behind_it_wait() -> None:
    seqs = Sequences()
    seqs.taken("t", 7, 0, 0, 10, term=3)  # (sequences 0..9 stored while the topic was here)
    seqs.check("t", 7, 0, 10, term=3)
    seqs.refused_for_a_move("t", 7, 0, 10, term=3)  # being placed here just now
    with pytest.raises(OutOfOrder, match="the next expected is 10"):
        seqs.check("t", 7, 0, 15, term=3)  # the one behind it, arriving once it is served
    seqs.check("t", 7, 0, 10, term=3)  # the refused one, sent again
    seqs.taken("t", 7, 0, 10, 5, term=3)
    seqs.check("t", 7, 0, 15, term=3)


def test_what_a_member_expected_before_its_topic_went_away_does_not_count_when_it_is_back() -> None:
    seqs = Sequences()
    seqs.taken("t", 7, 0, 0, 10, term=3)
    with pytest.raises(OutOfOrder):
        seqs.check("t", 7, 0, 500, term=3)  # (a gap, in the same term)
    seqs.check("t", 7, 0, 500, term=5)  # back, in a later term: the producer sent on elsewhere
    seqs.taken("t", 7, 0, 500, 10, term=5)
    with pytest.raises(OutOfOrder, match="the next expected is 510"):
        seqs.check("t", 7, 0, 520, term=5)


def test_a_batch_refused_because_another_member_has_the_topic_leaves_nothing_expected() -> None:
    seqs = Sequences()
    seqs.taken("t", 7, 0, 0, 10, term=3)
    seqs.refused_for_a_move("t", 7, 0, 10, term=None)
    assert len(seqs) == 0
    seqs.check("t", 7, 0, 900, term=None)  # (not this member's: nothing checked)
    seqs.taken("t", 7, 0, 900, 10, term=None)
    assert len(seqs) == 0


def test_kafka_sequences_keep_their_single_broker_rules() -> None:
    """A retry (at or before the next expected) is let through, its dedup ids store it once;
    a gap is refused; producers, epochs and topics apart; the oldest forgotten past the cap;
    sequences wrap at int32's end."""
    seqs = Sequences(kept=2)
    seqs.taken("t", 1, 0, 0, 3, term=0)
    seqs.check("t", 1, 0, 0, term=0)  # (a retry)
    seqs.taken("t", 1, 0, 0, 3, term=0)  # (it leaves the next expected where it was)
    with pytest.raises(OutOfOrder):
        seqs.check("t", 1, 0, 4, term=0)
    seqs.check("t", 1, 1, 4, term=0)  # (another epoch: its own sequences)
    seqs.check("u", 1, 0, 4, term=0)
    seqs.taken("u", 1, 0, 0, 1, term=0)
    seqs.taken("v", 1, 0, 0, 1, term=0)  # the third: the oldest ("t") is forgotten
    seqs.check("t", 1, 0, 4, term=0)
    seqs.taken("w", 2, 0, 2**31 - 2, 4, term=0)  # wraps to 2
    seqs.check("w", 2, 0, 2, term=0)
    with pytest.raises(OutOfOrder):
        seqs.check("w", 2, 0, 3, term=0)
