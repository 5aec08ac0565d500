"""Settlement records as Python values (``spark_mq.journal.settlements``): their rows, their
segment encoding, and the way an ack, a nack and a dead-lettering take through a real broker."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest

from spark_mq import Admin, Consumer, Producer
from spark_mq.journal import DeltaStore
from spark_mq.journal.records import (
    KIND_PLAIN_SETTLEMENTS,
    KIND_SETTLEMENTS,
    SETTLEMENT_KINDS,
    scan_segment,
)
from spark_mq.journal.settlements import Settlement, SettlementRows, settlement_table
from spark_mq.schema import SETTLEMENT_SCHEMA
from tests.conftest import receive_n, start_inprocess, wait_for

T0 = 1_700_000_000_000_000


def some_settlements() -> list[Settlement]:
    return [
        Settlement([7], "", "ack", T0),
        Settlement(list(range(100, 10_100)), "audit", "returned", T0 + 1),
        Settlement([3, 1, 2], "sub-1", "dead_lettered", T0 + 2, "delivered 5 time(s) ü"),
        Settlement([], "empty", "ack", T0 + 3),
        Settlement([2**62, 0], "s", "expired", T0 + 4, ""),
    ]


def rows_one_by_one(settlements: list[Settlement]) -> pa.Table:
    """The rows the settlements stand for, built the plain Python way, one per offset."""
    out: dict[str, list] = {f.name: [] for f in SETTLEMENT_SCHEMA}
    for s in settlements:
        for offset in s.offsets:
            out["offset"].append(offset)
            out["subscription"].append(s.subscription)
            out["outcome"].append(s.outcome)
            out["settle_time"].append(s.settle_time_us)
            out["reason"].append(s.reason)
    return pa.Table.from_pydict(
        {**out, "settle_time": pa.array(out["settle_time"], pa.int64())}
    ).cast(SETTLEMENT_SCHEMA)


def test_settlements_are_the_rows_of_each_offset_and_survive_their_encoding() -> None:
    settlements = some_settlements()
    expected = rows_one_by_one(settlements)
    assert expected.num_rows == 10_006
    assert settlement_table(settlements).equals(expected)
    written = SettlementRows(settlements)
    assert written.num_rows == 10_006
    back = SettlementRows.decode(written.encode(), written.num_rows)
    assert back.table().equals(expected)
    assert [(s.subscription, s.outcome, s.settle_time_us, s.reason) for s in back.items] == [
        (s.subscription, s.outcome, s.settle_time_us, s.reason) for s in settlements
    ]
    # the records of several commits build one table, in order
    joined = SettlementRows.joined([SettlementRows(settlements[:2]), SettlementRows([])])
    assert joined.table().equals(rows_one_by_one(settlements[:2]))


def test_a_damaged_settlement_payload_is_refused() -> None:
    written = SettlementRows(some_settlements()[2:3])  # 3 offsets
    payload = written.encode()
    for cut in range(1, len(payload)):
        with pytest.raises(ValueError, match="settlement"):
            SettlementRows.decode(payload[:cut], 3)
    with pytest.raises(ValueError, match="settlement"):
        SettlementRows.decode(payload + b"\0", 3)  # a byte over: a header cut short
    with pytest.raises(ValueError, match="of 4 row"):
        SettlementRows.decode(payload, 4)
    assert SettlementRows.decode(payload, 3).num_rows == 3


def test_acks_nacks_and_dead_letters_are_settlement_records_and_reach_delta(
    tmp_path: Path, clock
) -> None:
    data = tmp_path / "data"
    # nothing is moved on its own: the records are read from the segments first
    running = start_inprocess(data, clock, **{"journal.move_interval_ms": 3_600_000})
    try:
        with Admin(running.url) as admin:
            admin.create_queue("orders", max_delivery_attempts=1)
        with Producer(running.url, destination="orders", linger_ms=0) as p:
            for i in range(4):
                p.send_sync(b"o%d" % i)
        with Consumer(running.url, "orders", transport="wire") as c:
            got = receive_n(c, 4)
            c.ack(got[:2]).result(timeout=10)  # one frame: one settlement of two offsets
            got[3].ack().result(timeout=10)
            got[2].nack().result(timeout=10)  # its only attempt: dead-lettered
        running.broker.run_timers()
        journal = running.broker.journal
        wait_for(
            lambda: "dead_lettered" in journal.read_settlements("orders")["outcome"].to_pylist()
        )

        hot = Path(running.broker.config.hot_dir_location()) / "orders"
        (segment,) = hot.glob("segment-*.log")
        refs, _ = scan_segment(segment.read_bytes(), 0, 1)
        kinds = [r.kind for r in refs if r.kind in SETTLEMENT_KINDS]
        assert kinds and set(kinds) == {KIND_PLAIN_SETTLEMENTS}
        assert KIND_SETTLEMENTS not in kinds

        def settled(table: pa.Table) -> list[tuple]:
            table = table.sort_by([("offset", "ascending"), ("outcome", "ascending")])
            return list(
                zip(
                    table["offset"].to_pylist(),
                    table["subscription"].to_pylist(),
                    table["outcome"].to_pylist(),
                    table["reason"].to_pylist(),
                    strict=True,
                )
            )

        reason = "delivered 1 time(s) without an ack (max_delivery_attempts)"
        expected = [
            (0, "", "ack", None),
            (1, "", "ack", None),
            (2, "", "dead_lettered", reason),
            (2, "", "returned", None),
            (3, "", "ack", None),
        ]
        from_segments = journal.read_settlements("orders")
        assert settled(from_segments) == expected
        times = from_segments["settle_time"].cast(pa.int64()).to_pylist()
        assert all(t == int(clock.wall() * 1_000_000) for t in times)
        assert journal.move("orders", timeout=30)
        assert settled(DeltaStore(str(data)).read_settlements("orders")) == expected
    finally:
        running.stop()
