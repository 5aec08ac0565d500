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


def test_a_producer_s_first_batch_of_a_term_follows_on_from_what_the_log_holds() -> None:
    """The topic came to this member, whose log holds the producer's sequences up to 11076 (a
    batch from 11077 was refused by the old owner as it let the topic go): the batch from
    11081 is refused out of order, not taken ahead of it, and the resent 11077 is taken. A
    producer the log knows nothing of (None) starts where it says; the log is asked once a
    term, only while nothing is expected yet."""
    seqs = Sequences()
    asked: list[int] = []

    def stored() -> int | None:
        asked.append(1)
        return 11076

    with pytest.raises(OutOfOrder, match="the next expected is 11077"):
        seqs.check("t", 7, 0, 11081, term=12, stored=stored)
    seqs.check("t", 7, 0, 11077, term=12, stored=stored)
    seqs.taken("t", 7, 0, 11077, 4, term=12)
    seqs.check("t", 7, 0, 11081, term=12, stored=stored)
    assert len(asked) == 1
    seqs.check("t", 8, 0, 500, term=12, stored=lambda: None)  # (a producer new to the log)
    seqs.check("t", 9, 0, 0, term=12, stored=lambda: 2**31 - 1)  # (the newest was the last)
    seqs.check("t", 7, 0, 11077, term=None, stored=stored)  # (not this member's: not asked)
    assert len(asked) == 1


def test_a_producer_the_log_certainly_holds_nothing_of_starts_at_sequence_0() -> None:
    """The topic just came here and its log holds nothing of the producer (-1: the cache holds
    all the log has of it): a first batch from 2280 is refused (batches 0..2279 were refused by
    the old owner as it let the topic go), not stored as the topic's first, which librdkafka
    would take as proof that 0..2279 were stored too. Batch 0 is then taken."""
    seqs = Sequences()
    with pytest.raises(OutOfOrder, match=r"sent sequence 2280 .* the next expected is 0"):
        seqs.check("t", 7, 0, 2280, term=5, stored=lambda: -1)
    seqs.check("t", 7, 0, 0, term=5, stored=lambda: -1)
    seqs.taken("t", 7, 0, 0, 500, term=5)
    with pytest.raises(OutOfOrder, match="the next expected is 500"):
        seqs.check("t", 7, 0, 2280, term=5, stored=lambda: -1)


def test_a_batch_refused_for_a_move_waits_for_the_ones_the_log_lacks_before_it() -> None:
    """Refused while the topic was being placed here, the batch from 2280 is not what is next
    expected when the log holds the producer's sequences only to 99 (or nothing): 100 (or 0)
    is; a log that holds more than the batch leaves it expected as before."""
    seqs = Sequences()
    seqs.refused_for_a_move("t", 7, 0, 2280, term=5, stored=lambda: 99)
    with pytest.raises(OutOfOrder, match="the next expected is 100"):
        seqs.check("t", 7, 0, 2280, term=5)
    seqs.refused_for_a_move("t", 8, 0, 2280, term=5, stored=lambda: -1)
    with pytest.raises(OutOfOrder, match="the next expected is 0"):
        seqs.check("t", 8, 0, 2280, term=5)
    seqs.refused_for_a_move("t", 9, 0, 2280, term=5, stored=lambda: 4000)
    with pytest.raises(OutOfOrder, match="the next expected is 2280"):
        seqs.check("t", 9, 0, 2300, term=5)
    seqs.refused_for_a_move("t", 10, 0, 2280, term=5, stored=lambda: None)  # (not known)
    with pytest.raises(OutOfOrder, match="the next expected is 2280"):
        seqs.check("t", 10, 0, 2300, term=5)


def test_a_topic_placed_elsewhere_but_not_let_go_yet_keeps_its_term_here() -> None:
    """Between a new placement and the member letting the topic go, what it still stores
    follows on from the term it serves the topic with (checked as before); once let go, the
    term is the placement's: this member's when placed here, else none."""
    from spark_mq.transports.kafka.nodes import Nodes

    class Placement:
        member_id, name, placement_wait_s, leader = "a", "c", 1.0, "a"
        serving: dict[str, int] = {"t": 11}

        def owner(self, name: str) -> tuple[str, int] | None:
            return {"t": ("b", 12), "u": ("a", 5)}.get(name)

        def held(self, name: str) -> int | None:
            return self.serving.get(name)

        def kafka_endpoints(self) -> dict[str, str]:
            return {}

        def destinations(self) -> list[str]:
            return ["t", "u"]

    placement = Placement()
    nodes = Nodes(lambda: ("127.0.0.1", 9092), "a", placement)
    assert nodes.term("t") == 11  # (placed on b, still served here)
    assert nodes.term("u") == 5  # (placed here, being taken on)
    placement.serving.clear()
    assert nodes.term("t") is None
    assert Nodes(lambda: ("127.0.0.1", 9092), "a", None).term("t") == 0


def test_requests_for_a_topic_being_taken_on_here_wait_until_it_is_served() -> None:
    """A member taking a topic on (placed here, not served yet) holds the Produce, Fetch and
    OffsetForLeaderEpoch naming it until it is served, or it is placed elsewhere meanwhile,
    or ``cluster.placement_wait_s`` passes; a topic served here, another's, or one broker's
    is not waited for."""
    import asyncio

    from spark_mq.transports.kafka.nodes import Nodes

    class Placement:
        member_id, name, placement_wait_s, leader = "a", "c", 0.3, "a"
        owners: dict[str, tuple[str, int]] = {"new": ("a", 3), "moved": ("a", 4), "t": ("a", 1)}
        serving: dict[str, int] = {"t": 1}

        def owner(self, name: str) -> tuple[str, int] | None:
            return self.owners.get(name)

        def held(self, name: str) -> int | None:
            return self.serving.get(name)

        def kafka_endpoints(self) -> dict[str, str]:
            return {}

        def destinations(self) -> list[str]:
            return list(self.owners)

    placement = Placement()
    nodes = Nodes(lambda: ("127.0.0.1", 9092), "a", placement)
    single = Nodes(lambda: ("127.0.0.1", 9092), "a", None)

    async def run() -> None:
        loop = asyncio.get_running_loop()
        assert nodes.taken_on(["t", "elsewhere"], loop) is None  # (served here; not placed here)
        assert single.taken_on(["new"], loop) is None
        served = nodes.taken_on(["t", "new"], loop)
        assert served is not None
        await asyncio.sleep(0.05)
        assert not served.done()
        placement.serving["new"] = 3
        started = loop.time()
        await asyncio.wrap_future(served)
        assert loop.time() - started < 0.1
        moved = nodes.taken_on(["moved"], loop)
        assert moved is not None
        placement.owners["moved"] = ("b", 5)  # (placed elsewhere meanwhile: asked there)
        await asyncio.wait_for(asyncio.wrap_future(moved), 0.1)
        placement.owners["stuck"] = ("a", 6)
        stuck = nodes.taken_on(["stuck"], loop)
        assert stuck is not None
        started = loop.time()
        await asyncio.wrap_future(stuck)  # (never served: answered after placement_wait_s)
        assert 0.25 <= loop.time() - started < 0.6

    asyncio.run(run())
