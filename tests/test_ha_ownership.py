"""The ownership epoch in the Delta root: it only grows, two brokers cannot take the same one,
and a deposed owner's commits are refused however they race the new owner's."""

from __future__ import annotations

import threading
from pathlib import Path

import pyarrow as pa
import pytest

from spark_mq.broker import Broker
from spark_mq.clock import ManualClock
from spark_mq.config import load_config
from spark_mq.errors import Deposed
from spark_mq.ha import term
from spark_mq.ha.ownership import Ownership
from spark_mq.ha.term import Term
from spark_mq.journal.delta_store import DeltaStore
from spark_mq.journal.dir_lock import StoppedWaiting
from spark_mq.messages import Messages
from spark_mq.schema import MESSAGE_SCHEMA
from tests.conftest import wait_for


def _rows(first: int, n: int) -> pa.Table:
    cols = {f.name: pa.nulls(n, f.type) for f in MESSAGE_SCHEMA}
    cols["offset"] = pa.array(range(first, first + n), pa.int64())
    cols["message_id"] = pa.array([f"m{i}" for i in range(first, first + n)])
    cols["body"] = pa.array([b"x"] * n, pa.binary())
    return pa.table(cols, schema=MESSAGE_SCHEMA)


def test_epochs_only_grow_and_name_their_owner(tmp_path: Path) -> None:
    owner = Ownership(str(tmp_path))
    assert owner.current() is None and owner.epoch() == 0
    first = owner.take("a")
    second = Ownership(str(tmp_path)).take("b")
    assert (first.epoch, second.epoch) == (1, 2)
    now = owner.current()
    assert now is not None and (now.epoch, now.broker_id) == (2, "b")
    assert "broker b" in now.describe() and "epoch 2" in now.describe()


def test_of_two_brokers_taking_at_once_one_wins(tmp_path: Path) -> None:
    """Both read epoch 1 and commit 2: Delta's put-if-absent lets one through."""
    Ownership(str(tmp_path)).take("first")
    barrier = threading.Barrier(2)
    results: dict[str, object] = {}

    def contend(name: str) -> None:
        own = Ownership(str(tmp_path))
        dt = own._table()
        assert dt is not None
        original = own._table
        own._table = lambda: dt  # type: ignore[method-assign]  # both hold the same snapshot
        barrier.wait()
        try:
            results[name] = own.take(name).epoch
        except Deposed as exc:
            results[name] = exc
        finally:
            own._table = original  # type: ignore[method-assign]

    threads = [threading.Thread(target=contend, args=(n,)) for n in ("a", "b")]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    won = [v for v in results.values() if v == 2]
    lost = [v for v in results.values() if isinstance(v, Deposed)]
    assert len(won) == 1 and len(lost) == 1, results
    assert "took ownership of the data root at the same moment" in lost[0].message
    assert Ownership(str(tmp_path)).epoch() == 2


def test_a_deposed_owner_commits_nothing_more(tmp_path: Path) -> None:
    old = DeltaStore(str(tmp_path))
    heard: list[Deposed] = []
    old.on_deposed = heard.append
    old.fence(Ownership(str(tmp_path)).take("old").epoch)
    old.create_logs("q")
    old.commit_messages("q", _rows(0, 3), 3)
    assert old.committed_end("q") == 3
    new = DeltaStore(str(tmp_path))
    new.fence(Ownership(str(tmp_path)).take("new").epoch)
    assert new.committed_end("q") == 3  # stamped with epoch 2 before reading
    with pytest.raises(Deposed, match="epoch 2; this broker's is 1"):
        old.commit_messages("q", _rows(3, 2), 5)
    assert len(heard) == 1
    with pytest.raises(Deposed):
        old.append_bindings(pa.table({}))  # every table: the bindings were stamped at fence()
    new.commit_messages("q", _rows(3, 4), 7)
    assert new.committed_end("q") == 7
    offsets = sorted(new.read_messages("q", 0, None)["offset"].to_pylist())
    assert offsets == list(range(7))  # nothing of the old owner's second commit


def test_a_deposed_owner_loses_the_race_it_was_already_in(tmp_path: Path) -> None:
    """The old owner's commit was prepared from a snapshot taken before the new owner's stamp:
    the two commits carry the same app id, so delta-rs refuses the later one, and the retry
    finds the greater epoch."""
    old = DeltaStore(str(tmp_path))
    old.fence(Ownership(str(tmp_path)).take("old").epoch)
    old.create_logs("q")
    old.committed_end("q")  # its cached table: the snapshot before the new owner's stamp
    new = DeltaStore(str(tmp_path))
    new.fence(Ownership(str(tmp_path)).take("new").epoch)
    new.committed_end("q")
    with pytest.raises(Deposed):
        old.commit_messages("q", _rows(0, 1), 1)
    assert new.committed_end("q") == 0


def _config(data: Path, **more: object):
    return load_config(
        overrides={
            "broker.data_dir": str(data),
            "ha.mode": "shared-store",
            "ha.lock_poll_s": 0.05,
            **more,
        },
        environ={},
    )


def _start(broker: Broker, until: threading.Event | None = None) -> Term:
    """Begin the broker's term (as the service does: a shared store's backup waits in here)
    and start it; the term, to end after the broker closed."""
    tenure = term.begin(
        broker.config, broker.journal, broker.broker_id, until=until, on_deposed=broker.deposed_by
    )
    broker.start(tenure=tenure)
    return tenure


def test_a_shared_store_backup_waits_then_takes_over_with_the_next_epoch(tmp_path: Path) -> None:
    data = tmp_path / "shared"
    primary = Broker(_config(data, **{"ha.broker_id": "a"}), clock=ManualClock())
    primary_term = _start(primary)
    assert primary.epoch == 1 and primary.ha_state()["role"] == "primary"
    primary.create_destination("q", "queue", None)
    kept = Messages.of(pa.record_batch({"body": pa.array([b"kept"], pa.binary())}))
    primary.produce("q", kept).result(10)
    backup = Broker(_config(data, **{"ha.broker_id": "b"}), clock=ManualClock())
    started = threading.Event()
    stop = threading.Event()

    backup_term: list[Term] = []

    def run_backup() -> None:
        try:
            backup_term.append(_start(backup, until=stop))
        except StoppedWaiting:
            return
        started.set()

    t = threading.Thread(target=run_backup)
    t.start()
    assert not started.wait(0.5)  # waiting: the primary holds the data directory
    primary.close()
    primary_term.close()  # (its data directory let go)
    wait_for(started.is_set, timeout=30, what="the backup to take over")
    try:
        assert backup.epoch == 2
        assert backup.stats("q")["end_offset"] == 1  # what the primary acknowledged
        owner = Ownership(str(data)).current()
        assert owner is not None and owner.broker_id == "b"
    finally:
        backup.close()
        for tenure in backup_term:
            tenure.close()
        t.join()


def test_a_waiting_backup_stops_when_told(tmp_path: Path) -> None:
    data = tmp_path / "shared"
    primary = Broker(_config(data), clock=ManualClock())
    primary_term = _start(primary)
    try:
        backup = Broker(_config(data), clock=ManualClock())
        stop = threading.Event()
        threading.Timer(0.3, stop.set).start()
        with pytest.raises(StoppedWaiting):
            _start(backup, until=stop)
    finally:
        primary.close()
        primary_term.close()


def test_a_replicating_broker_is_configured_or_told_what_is_missing(tmp_path: Path) -> None:
    from spark_mq.errors import ConfigError

    with pytest.raises(ConfigError, match=r"ha\.peer"):
        load_config(overrides={"ha.peer": "mq2"}, environ={})  # no port
    config = load_config(
        overrides={"broker.data_dir": str(tmp_path), "ha.mode": "replication"}, environ={}
    )
    broker = Broker(config, clock=ManualClock())
    with pytest.raises(ConfigError, match=r"needs journal\.hot_dir"):
        _start(broker)
    with pytest.raises(ConfigError, match=r"needs journal\.hot_dir"):
        broker.start()  # (without a term: the same reason first)
