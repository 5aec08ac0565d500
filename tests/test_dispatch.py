"""Dispatch internals at the seam we own (``Subscription`` over a ``MessageStore``)."""

from __future__ import annotations

import pyarrow as pa

from spark_mq.broker.message_store import MessageStore
from spark_mq.broker.subscription import Subscription
from spark_mq.clock import ManualClock
from spark_mq.config import DestinationSettings
from spark_mq.schema import normalize_produce_batch, with_offsets


def rows(first: int, n: int) -> pa.Table:
    table = normalize_produce_batch(
        pa.table({"body": [b"m"] * n}),
        enqueue_time_us=0,
        max_message_bytes=1 << 20,
        destination="q",
    )
    return with_offsets(table, first)


class RacyStore(MessageStore):
    """A commit lands right after the subscription asked where the store ends."""

    def __init__(self) -> None:
        super().__init__()
        self.pending: list[pa.Table] = []

    @property
    def end(self) -> int:
        value = super().end
        if self.pending:
            self.add(self.pending.pop())
        return value


def test_a_commit_racing_ingestion_is_delivered_once(clock: ManualClock) -> None:
    store = RacyStore()
    store.add(rows(0, 3))
    store.pending.append(rows(3, 2))
    sub = Subscription(
        "q",
        "",
        store,
        start_offset=0,
        lease_s=5.0,
        monotonic=clock.monotonic,
        wall=clock.wall,
        settings=DestinationSettings(),
    )
    sub.register(1)
    first = [o for o, _, _ in sub.take(1, 100)]
    again = [o for o, _, _ in sub.take(1, 100)]
    assert sorted(first + again) == [0, 1, 2, 3, 4]
