"""The data root's small logs (bindings, transactions: spark_mq.journal.delta_store): compacted
with no history kept, and written by two stores at once, as a cluster's members write a shared
root's."""

from __future__ import annotations

import os
import time
from pathlib import Path

from deltalake import DeltaTable

from spark_mq.broker.transactions import COMMIT, DONE, Record
from spark_mq.journal import layout
from spark_mq.journal.delta_store import COMPACT_SMALL_LOGS_EVERY, DeltaStore


def _row(txid: str, event: str) -> object:
    return Record(txid).row(event, 0)


def test_a_store_writes_on_after_another_cleaned_the_log_it_last_read(tmp_path: Path) -> None:
    """A store whose copy of the transaction log is older than the commit files another store
    removed at its compaction reloads it from the checkpoint and commits (delta-rs says
    "Invalid table version" to the old copy)."""
    root = str(tmp_path / "root")
    one, two = DeltaStore(root), DeltaStore(root)
    one.append_transactions(_row("a0", COMMIT))  # (one's copy: version 1)
    for i in range(COMPACT_SMALL_LOGS_EVERY):
        two.append_transactions(_row(f"b{i}", COMMIT))
    log_dir = Path(layout.transactions_uri(root)) / "_delta_log"
    old = time.time() - 60  # (the commit files made older than the log's retention)
    for f in log_dir.glob("*.json"):
        os.utime(f, (old, old))
    for i in range(COMPACT_SMALL_LOGS_EVERY):  # (the next compaction removes them)
        two.append_transactions(_row(f"c{i}", COMMIT))
    assert not (log_dir / f"{2:020}.json").exists()  # (gone: one's next version's file)
    one.append_transactions(_row("a1", COMMIT))
    txids = set(DeltaTable(layout.transactions_uri(root)).to_pyarrow_table()["txid"].to_pylist())
    assert {"a0", "a1", "b0", f"c{COMPACT_SMALL_LOGS_EVERY - 1}"} <= txids


def test_compaction_deletes_the_rows_of_transactions_that_are_done(tmp_path: Path) -> None:
    root = str(tmp_path / "root")
    store = DeltaStore(root)
    store.append_transactions(_row("open", COMMIT))
    done = set()
    for i in range(20):
        store.append_transactions(_row(f"t{i}", COMMIT))
        if i % 2:
            store.append_transactions(_row(f"t{i}", DONE))
            done.add(f"t{i}")
    assert len(store.read_transactions()) == 31  # (no compaction yet)
    for _ in range(COMPACT_SMALL_LOGS_EVERY):  # (one passes a multiple of the interval)
        store.append_transactions(_row("late", COMMIT))
    txids = store.read_transactions()["txid"].to_pylist()
    assert not done & set(txids)  # (applied: gone)
    assert {"open", "t0", "t18", "late"} <= set(txids)


def test_transactions_committing_at_once_share_a_commit_of_the_log(tmp_path: Path) -> None:
    """Sixteen threads recording a transaction each at once: every row is in the log, in
    fewer Delta commits than rows (one writes what the others queued while it wrote); a
    failed write fails every transaction it held, and the next ones are written."""
    from concurrent.futures import ThreadPoolExecutor
    from unittest import mock

    root = str(tmp_path / "root")
    store = DeltaStore(root)
    store.append_transactions(_row("first", COMMIT))  # (the log exists)
    before = DeltaTable(layout.transactions_uri(root)).version()
    with ThreadPoolExecutor(16) as pool:
        list(pool.map(lambda i: store.append_transactions(_row(f"t{i}", COMMIT)), range(16)))
    after = DeltaTable(layout.transactions_uri(root)).version()
    txids = set(store.read_transactions()["txid"].to_pylist())
    assert {f"t{i}" for i in range(16)} <= txids
    assert after - before < 16, after - before

    real = store._write_transactions
    written: list[int] = []

    def failing(rows: object) -> None:
        written.append(1)
        time.sleep(0.05)  # (long enough for the others to queue behind it)
        raise OSError("disk gone")

    with mock.patch.object(store, "_write_transactions", failing), ThreadPoolExecutor(8) as pool:
        outcomes = list(pool.map(lambda i: _outcome(store, f"f{i}"), range(8)))
    assert all(isinstance(o, OSError) for o in outcomes), outcomes
    assert len(written) < 8  # (batched: one failure told to each it held)
    assert not {f"f{i}" for i in range(8)} & set(store.read_transactions()["txid"].to_pylist())
    assert store._write_transactions == real
    store.append_transactions(_row("after", COMMIT))
    assert "after" in set(store.read_transactions()["txid"].to_pylist())


def _outcome(store: DeltaStore, txid: str) -> BaseException | None:
    try:
        store.append_transactions(_row(txid, COMMIT))
    except BaseException as exc:  # (what the caller is told)
        return exc
    return None
