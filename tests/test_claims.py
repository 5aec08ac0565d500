"""Claims (what a Spark query consuming through the broker holds) survive a broker restart."""

from __future__ import annotations

from pathlib import Path

import pytest

from spark_mq import Admin, Consumer, LeaseError, Producer
from spark_mq.clock import ManualClock
from tests.conftest import Restartable, receive_n, start_inprocess


def fill_queue(url: str, admin: Admin, n: int) -> None:
    """Queue ``q`` holding the messages "0" .. "n-1"."""
    admin.create_queue("q")
    with Producer(url, destination="q") as producer:
        producer.send_batch([b"%d" % i for i in range(n)])


def test_a_claim_is_the_same_after_a_restart_and_held_until_acked(
    restartable: Restartable, clock: ManualClock
) -> None:
    broker = restartable
    with Admin(broker.url) as admin:
        fill_queue(broker.url, admin, 8)
        assert admin.claim("q", "etl", 1, 3) == 3
        assert admin.claim("q", "etl", 2, 3) == 3  # claim 1 is now acked
        clock.advance(3600)  # a claim's lease never lapses
        broker.broker.run_timers()
    broker.restart()
    with Admin(broker.url) as admin:
        stats = admin.stats("q")  # claim 1 acked; claim 2 held again; 6 and 7 waiting
        assert stats["depth"] == 5 and stats["in_flight"] == 3
        assert admin.claim("q", "etl", 2, 3) == 3  # the same claim again
        assert admin.claimed("q", "etl", 2)["body"].to_pylist() == [b"3", b"4", b"5"]
        with Consumer(broker.url, "q") as other:  # only what nobody claimed
            assert sorted(m.text for m in receive_n(other, 2)) == ["6", "7"]
        assert admin.ack_claims("q", "etl", 2) == 3
        assert admin.stats("q")["depth"] == 2  # 6 and 7: the other consumer did not ack
        with pytest.raises(LeaseError, match="no claim 2"):
            admin.claimed("q", "etl", 2)


def test_released_claims_go_back_to_other_consumers_and_the_name_is_retired(
    restartable: Restartable,
) -> None:
    from spark_mq.errors import NotAllowed

    broker = restartable
    with Admin(broker.url) as admin:
        fill_queue(broker.url, admin, 6)
        assert admin.claim("q", "gone", 1, 2) == 2
        assert admin.claim("q", "gone", 2, 2) == 2  # claim 1 acked: 0, 1
        assert admin.release_claims("q", "gone") == 2  # claim 2: 2, 3
        assert admin.release_claims("q", "never-claimed") == 0
        with pytest.raises(NotAllowed, match="released"):
            admin.claim("q", "gone", 3, 2)
        stats = admin.stats("q")
        assert stats["depth"] == 4 and stats["in_flight"] == 0
    broker.restart()  # the release is durable
    with Admin(broker.url) as admin:
        assert admin.stats("q")["in_flight"] == 0
        with pytest.raises(NotAllowed, match="released"):
            admin.claim("q", "gone", 3, 2)
        with Consumer(broker.url, "q") as other:
            got = {m.text: m for m in receive_n(other, 4)}
        assert sorted(got) == ["2", "3", "4", "5"]
        # the released ones were delivered once already (to the query that is gone)
        assert [got[t].delivery_count for t in ("2", "3", "4", "5")] == [2, 2, 1, 1]


def test_a_claim_that_could_not_be_recorded_leaves_nothing_invisible(
    tmp_path: Path, clock: ManualClock
) -> None:
    """A claim is recorded before the query sees it; if the record fails (a full disk, say), the
    error reaches the query and the messages are not held by a claim that never lapses."""
    from concurrent.futures import Future

    from spark_mq.errors import JournalError

    broker = start_inprocess(tmp_path / "data", clock)
    journal = broker.broker.journal
    real_settle = journal.settle

    def settle(destination: str, offsets: list[int], **kw: object) -> Future:
        if kw.get("outcome") != "claimed":
            return real_settle(destination, offsets, **kw)
        failed: Future = Future()
        failed.set_exception(JournalError("disk full", destination=destination))
        return failed

    try:
        with Admin(broker.url) as admin:
            fill_queue(broker.url, admin, 3)
            journal.settle = settle  # our own seam: the journal refuses the claim's record
            with pytest.raises(JournalError, match="disk full"):
                admin.claim("q", "etl", 1, 3)
            journal.settle = real_settle
            assert admin.stats("q")["in_flight"] == 0
            with Consumer(broker.url, "q") as other:
                assert sorted(m.text for m in receive_n(other, 3)) == ["0", "1", "2"]
    finally:
        broker.stop()
