"""Dispatch internals at the seam we own (``Subscription`` over a ``MessageStore``)."""

from __future__ import annotations

import pyarrow as pa
import pytest

from spark_mq.broker.message_store import MessageStore
from spark_mq.broker.subscription import Subscription
from spark_mq.clock import ManualClock
from spark_mq.config import DestinationSettings
from spark_mq.messages import Messages
from spark_mq.schema import UNOFFSET_SCHEMA, normalize_produce_batch, with_offsets


def rows(first: int, n: int, group: str | None = None) -> pa.Table:
    columns = {"body": [b"m"] * n} | ({"group_id": [group] * n} if group else {})
    table = normalize_produce_batch(
        pa.table(columns),
        enqueue_time_us=0,
        max_message_bytes=1 << 20,
        destination="q",
    )
    assert table.schema == UNOFFSET_SCHEMA
    return with_offsets(table, first)


def subscription(store: MessageStore, clock: ManualClock) -> Subscription:
    return Subscription(
        "q",
        "",
        store,
        start_offset=0,
        lease_s=5.0,
        monotonic=clock.monotonic,
        wall=clock.wall,
        settings=DestinationSettings(),
    )


class RacyStore(MessageStore):
    """A commit lands right after the subscription asked where the store ends."""

    def __init__(self) -> None:
        super().__init__()
        self.pending: list[Messages] = []

    @property
    def end(self) -> int:
        value = super().end
        if self.pending:
            self.add(self.pending.pop())
        return value


@pytest.mark.pure_python
def test_a_commit_racing_ingestion_is_delivered_once(clock: ManualClock) -> None:
    store = RacyStore()
    store.add(Messages.of(rows(0, 3)))
    store.pending.append(Messages.of(rows(3, 2)))
    sub = subscription(store, clock)
    sub.register(1)
    first = [o for o, _, _ in sub.take(1, 100)]
    again = [o for o, _, _ in sub.take(1, 100)]
    assert sorted(first + again) == [0, 1, 2, 3, 4]


def test_new_owner_waits_until_the_old_owners_acks_are_durable(clock: ManualClock) -> None:
    store = MessageStore()
    store.add(Messages.of(rows(0, 3, group="a")))
    sub = subscription(store, clock)
    sub.register(1)
    sub.register(2)
    assert [o for o, _, _ in sub.take(1, 1)] == [0]
    ok, _ = sub.begin_ack(1, [(0, 1)])  # the ack is on its way to disk
    assert ok == [0]
    sub.release_consumer(1)  # the owner leaves meanwhile
    assert sub.take(2, 10) == []  # a0 might still come back: a1 must not overtake it
    sub.end_ack([0], durable=True)
    assert sub.take(2, 10) == [(1, 1, True), (2, 1, False)]


def test_messages_leased_together_keep_their_own_lease_state(clock: ManualClock) -> None:
    """One take's messages share one lease object (leasing cost 0.3-0.5 us a message before):
    extending, acking, nacking or letting lapse one of them leaves the others as they were,
    and a take of messages delivered a different number of times gives each its own count."""
    store = MessageStore()
    store.add(Messages.of(rows(0, 4)))
    sub = subscription(store, clock)
    sub.register(1)
    assert sub.take(1, 10) == [(o, 1, False) for o in range(4)]
    clock.advance(4.0)
    assert sub.extend(1, [(0, 1)]) == ([0], [])  # 0's lease now ends at 9 s, the others' at 5
    ok, refused = sub.begin_ack(1, [(1, 1), (1, 1)])  # the same message twice in one frame
    assert ok == [1] and [r.reason for r in refused] == [
        "an ack for this delivery is already under way"
    ]
    clock.advance(1.5)
    assert sub.expire_leases() == 2  # 2 and 3 lapsed; 0 was extended, 1's ack is under way
    assert sub.delivery_count(0) == 1 and sub.delivery_count(1) == 1
    assert sub.delivery_count(2) == 0
    sub.end_ack([1], durable=False)  # its commit failed: its lease is as it was, lapsed
    assert sub.expire_leases() == 1
    assert sub.nack(1, [(0, 1)]) == ([0], [])
    store.add(Messages.of(rows(4, 2)))
    taken = sub.take(1, 10)
    assert sorted(taken) == [*((o, 2, False) for o in range(4)), (4, 1, False), (5, 1, False)]
    ok, refused = sub.begin_ack(1, [(0, 2), (4, 1), (5, 2)])  # 5 was delivered once
    assert ok == [0, 4] and [r.offset for r in refused] == [5]
    sub.end_ack(ok, durable=True)
    clock.advance(5.1)
    assert sub.expire_leases() == 4  # 1, 2, 3 and 5: their leases lapsed; 0 and 4 are acked
