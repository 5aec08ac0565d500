"""Journal export and import: a destination round-trips exactly, in both formats."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest
from click.testing import CliRunner

from spark_mq import Admin, Consumer, Producer
from spark_mq.cli import main as cli
from spark_mq.clock import ManualClock
from spark_mq.errors import DestinationExists, DestinationNotFound, SchemaMismatch
from spark_mq.jobs.transfer import export_destination, import_destination, read_export
from spark_mq.journal import DeltaStore
from tests.conftest import receive_n, start_inprocess


@pytest.fixture
def source(tmp_path: Path, clock: ManualClock) -> Path:
    """A stopped broker's data: a queue with varied messages, some acked, and a topic."""
    data = tmp_path / "src"
    running = start_inprocess(data, clock)
    try:
        with Admin(running.url) as admin:
            admin.create_queue("orders")
            admin.create_topic("events")
            admin.create_subscription("events", "audit")
        with Producer(running.url, linger_ms=0) as p:
            for i in range(30):
                p.send(
                    bytes([i, 0, 255]) + b"body",
                    destination="orders",
                    headers={"i": str(i), "k": "v"} if i % 2 else None,
                    group_id=f"g{i % 3}" if i % 5 else None,
                    priority=i % 10,
                    ttl_s=3600 if i % 7 == 0 else None,
                )
            p.flush()
            p.send_sync(b"e0", destination="events")
        with Consumer(running.url, "orders", prefetch=50) as c:
            got = receive_n(c, 30)
            c.ack([m for m in got if m.offset % 4 == 0]).result(timeout=10)
    finally:
        running.stop()
    return data


def logs(root: Path, name: str) -> tuple[pa.Table, pa.Table]:
    store = DeltaStore(str(root))
    return store.read_messages(name, 0, None), store.read_settlements(name).sort_by("offset")


@pytest.mark.parametrize("suffix", [".jsonl", ".parquet"])
def test_export_then_import_round_trips_exactly(
    source: Path, tmp_path: Path, clock: ManualClock, suffix: str
) -> None:
    file = tmp_path / f"orders{suffix}"
    header = export_destination(str(source), "orders", file)
    # 8 acks, and 22 returns: the consumer left without acking the others
    assert (header["messages"], header["settlements"], header["end_offset"]) == (30, 30, 30)
    target = tmp_path / "dst"
    import_destination(str(target), file)
    export_destination(str(source), "events", tmp_path / f"events{suffix}")
    import_destination(str(target), tmp_path / f"events{suffix}")
    for name in ("orders", "events"):
        before, after = logs(source, name), logs(target, name)
        assert after[0].equals(before[0]), name  # every column of every row, offsets unchanged
        assert after[1].equals(before[1]), name
    # a broker on the imported data owes exactly what the original owed
    running = start_inprocess(target, clock)
    try:
        with Admin(running.url) as admin:
            assert admin.stats("orders")["depth"] == 22
            assert admin.stats("orders")["end_offset"] == 30
            assert admin.stats("events")["subscriptions"]["audit"]["start_offset"] == 0
        with Consumer(running.url, "orders", prefetch=50) as c:
            got = receive_n(c, 22)
            assert sorted(m.offset for m in got) == [o for o in range(30) if o % 4]
            one = next(m for m in got if m.offset == 1)  # (delivered by priority, not offset)
            assert one.headers == {"i": "1", "k": "v"} and one.body == bytes([1, 0, 255]) + b"body"
        with Producer(running.url, destination="orders") as p:
            assert p.send_sync(b"next") == 30
    finally:
        running.stop()


def test_import_refuses_what_would_merge_or_is_not_an_export(source: Path, tmp_path: Path) -> None:
    file = tmp_path / "orders.jsonl"
    export_destination(str(source), "orders", file)
    with pytest.raises(DestinationExists, match="already exists"):
        import_destination(str(source), file)
    assert import_destination(str(source), file, "orders_copy")["name"] == "orders_copy"
    assert logs(source, "orders_copy")[0].equals(logs(source, "orders")[0])
    with pytest.raises(DestinationNotFound):
        export_destination(str(source), "nope", tmp_path / "x.jsonl")
    with pytest.raises(ValueError, match=r"\*.jsonl or \*.parquet"):
        export_destination(str(source), "orders", tmp_path / "x.csv")
    junk = tmp_path / "junk.jsonl"
    junk.write_text('{"type": "message", "offset": 0, "body": ""}\n')
    with pytest.raises(SchemaMismatch, match="no destination line"):
        read_export(junk)
    junk.write_text('{"type": "message"}\n')
    with pytest.raises(SchemaMismatch, match="KeyError"):
        read_export(junk)
    junk.write_text("not json\n")
    with pytest.raises(SchemaMismatch, match=r"junk\.jsonl:1"):
        read_export(junk)


def test_cli_export_and_import(source: Path, tmp_path: Path) -> None:
    file = tmp_path / "dump.parquet"
    out = CliRunner().invoke(
        cli, ["export", "--data-dir", str(source), "--destination", "orders", str(file)]
    )
    assert out.exit_code == 0, out.output
    assert "30 message(s), 30 settlement(s), end offset 30" in out.output
    out = CliRunner().invoke(cli, ["import", "--data-dir", str(source), str(file)])
    assert out.exit_code == 2 and "already exists" in out.output
    out = CliRunner().invoke(cli, ["import", "--data-dir", str(source), "--as", "o2", str(file)])
    assert out.exit_code == 0 and "imported o2 (queue)" in out.output
    bad = CliRunner().invoke(cli, ["import", "--data-dir", str(source), "--as", "../x", str(file)])
    assert bad.exit_code == 2 and "sparkmq import:" in bad.output
