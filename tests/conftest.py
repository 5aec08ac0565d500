from __future__ import annotations

import compileall
import os
import shutil
import socket
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import pytest

from spark_mq import native, wire
from spark_mq.broker import Broker
from spark_mq.clock import ManualClock
from spark_mq.config import BrokerConfig, load_config
from spark_mq.service import RunningBroker
from tests.native_build import REPO, Build
from tests.zk_kit import ZooKeeper

NATIVE_BUILD = pytest.StashKey[Build]()


# The files that take longest, longest first (seconds in a run in two processes, 2026-12-03,
# its tests' setup, call and teardown): they run first, so that in two processes (xdist hands
# out whole files in this order, with --no-loadscope-reorder) neither is left with a long file
# alone at the end; the rest follow in their own order. In that run the two processes' tests
# took 1,779 s in 906 s, against 1,107-1,188 s in the two runs before it in xdist's order.
# A file that grows slow belongs here.
LONGEST_FIRST = (
    "test_cluster.py",  # 219
    "test_kafka.py",  # 120
    "test_ha_switchovers.py",  # 96
    "test_spark_connect.py",  # 80
    "test_spark_jvm.py",  # 74
    "test_kafka_matrix.py",  # 59
    "test_ha_replication.py",  # 59
    "test_spark_options.py",  # 51
    "test_hot_tier.py",  # 49
    "test_security.py",  # 47
    "test_ha_shared_store.py",  # 42
    "test_crash.py",  # 40
    "test_packaging.py",  # 40
    "test_notebooks.py",  # 36
)


@pytest.hookimpl(trylast=True)  # after -m and -k have deselected
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The longest files first (``LONGEST_FIRST``), each file's tests in their order. On a
    compiled checkout (scripts/compile.py), the tests that patch the compiled path cannot
    work: say so once, instead of letting them fail one by one."""
    if native.compiled() and any(item.get_closest_marker("pure_python") for item in items):
        raise pytest.UsageError(
            f"this checkout runs {native.describe()}; tests marked pure_python replace parts of "
            "it: deselect them (-m 'not pure_python') or run on pure Python "
            "(python scripts/compile.py --clean)"
        )
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # (stable)


# where the compiled build of tests/test_native.py is made, chosen by the run's first process
# (pytest-xdist's controller, or the only one) before any worker starts, so that all inherit it
NATIVE_BUILD_DIR = "SPARKMQ_TESTS_NATIVE_BUILD"


def pytest_configure(config: pytest.Config) -> None:
    if hasattr(config, "workerinput"):
        return  # (a pytest-xdist worker: the controller did this)
    os.environ[NATIVE_BUILD_DIR] = tempfile.mkdtemp(prefix="sparkmq-compiled-")
    # the brokers and CLIs the tests start each import the package afresh and, where
    # PYTHONDONTWRITEBYTECODE is set (as on this project's machines), compiled it again every
    # time without keeping the bytecode: about 0.2 s of CPU a start. Compiled once here instead.
    for package in ("spark_mq", "connectors", "jobs"):
        if (REPO / package).is_dir():
            compileall.compile_dir(REPO / package, quiet=1)


def _start_native_build(config: pytest.Config, nodeids: Iterable[str]) -> None:
    """tests/test_native.py's build starts once the tests are known, on the CPU's idle time
    (see native_build), if they include it."""
    if NATIVE_BUILD not in config.stash and any(
        nodeid.startswith("tests/test_native.py") for nodeid in nodeids
    ):
        config.stash[NATIVE_BUILD] = Build(Path(os.environ[NATIVE_BUILD_DIR]), idle=True)


def pytest_collection_finish(session: pytest.Session) -> None:
    if not hasattr(session.config, "workerinput"):
        _start_native_build(session.config, (item.nodeid for item in session.items))


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_node_collection_finished(node: Any, ids: list[str]) -> None:
    """(pytest-xdist's controller, once a worker has collected: before any test runs)"""
    _start_native_build(node.config, ids)


def pytest_unconfigure(config: pytest.Config) -> None:
    build = config.stash.get(NATIVE_BUILD, None)
    if build is not None:
        build.stop()
    if not hasattr(config, "workerinput") and (root := os.environ.pop(NATIVE_BUILD_DIR, "")):
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="session")
def zookeeper(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ZooKeeper]:
    """A real ZooKeeper for the cluster's tests (each test's cluster has a name of its own);
    a test that stops it starts it again on the same port."""
    zk = ZooKeeper(tmp_path_factory.mktemp("zookeeper"))
    zk.start()
    yield zk
    zk.stop()


@pytest.fixture(scope="session")
def spark():
    """One local SparkSession for the whole suite (start-up costs ~10 s)."""
    from spark_mq.connectors import local_session

    session = local_session("sparkmq-tests")
    try:
        yield session
    finally:
        session.stop()


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


# every listener a broker of the tests opens, on a free port unless a test says otherwise: a
# fixed one (STOMP's 61613, HTTP's 8161) fails whenever anything else on the machine holds it
FREE_PORTS = {
    "broker.port": 0,
    "broker.wire_port": 0,
    "broker.stomp_port": 0,
    "broker.kafka_port": 0,
    "broker.http_port": 0,
}


def test_config(data_dir: Path, **settings: object) -> BrokerConfig:
    """A broker's configuration for ``data_dir``: every listener on a free port, no
    environment read, ``settings`` on top."""
    overrides = {"broker.data_dir": str(data_dir), **FREE_PORTS, **settings}
    return load_config(overrides=overrides, environ={})


test_config.__test__ = False  # type: ignore[attr-defined]  # (not a test, whatever its name)


def start_inprocess(data_dir: Path, clock: ManualClock, **settings: object) -> RunningBroker:
    config = test_config(data_dir, **settings)
    return RunningBroker(Broker(config, clock=clock), "127.0.0.1", config.broker.port)


def _serving(data_dir: Path, clock: ManualClock, **settings: object) -> Iterator[RunningBroker]:
    """The body of a broker fixture: started before the test, stopped after it."""
    running = start_inprocess(data_dir, clock, **settings)
    try:
        yield running
    finally:
        running.stop()


@pytest.fixture
def broker(tmp_path: Path, clock: ManualClock) -> Iterator[RunningBroker]:
    """A real broker with a real Flight server on port 0, in this process, on a manual clock."""
    yield from _serving(tmp_path / "data", clock)


class Restartable:
    """An in-process broker on one data directory that a test restarts in place."""

    def __init__(self, data_dir: Path, clock: ManualClock) -> None:
        self.data_dir, self.clock = data_dir, clock
        self.running = start_inprocess(data_dir, clock)

    @property
    def url(self) -> str:
        return self.running.url

    @property
    def broker(self) -> Broker:
        return self.running.broker

    def restart(self) -> None:
        """Stop the broker (gracefully) and start a new one on the same data."""
        self.running.stop()
        self.running = start_inprocess(self.data_dir, self.clock)


@pytest.fixture
def restartable(tmp_path: Path, clock: ManualClock) -> Iterator[Restartable]:
    holder = Restartable(tmp_path / "data", clock)
    try:
        yield holder
    finally:
        holder.running.stop()


@pytest.fixture
def strict_broker(tmp_path: Path, clock: ManualClock) -> Iterator[RunningBroker]:
    """A broker that does not auto-create queues: unknown destinations are errors."""
    yield from _serving(tmp_path / "strict", clock, **{"broker.auto_create_queues": False})


@pytest.fixture
def untimed(tmp_path: Path, clock: ManualClock) -> Iterator[RunningBroker]:
    """A broker whose own timer never fires (once an hour): only the test moves things on."""
    yield from _serving(tmp_path / "data", clock, **{"delivery.lease_check_interval_ms": 3_600_000})


def receive_n(consumer, n: int, timeout: float = 10.0) -> list:
    """Exactly ``n`` messages (deliveries may arrive in several batches), else fail."""
    got: list = []
    while len(got) < n:
        batch = consumer.receive_many(n - len(got), timeout=timeout)
        assert batch, f"only {len(got)} of {n} messages arrived within {timeout}s"
        got += batch
    return got


def wait_for(check: Callable[[], object], timeout: float = 30.0, what: str = "it") -> None:
    """Poll ``check`` until it is true; fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.01)


def raw_wire(broker: RunningBroker) -> socket.socket:
    """A bare TCP connection to a broker's direct wire (to send what the SDK never would)."""
    assert broker.wire_port
    return socket.create_connection(("127.0.0.1", broker.wire_port), timeout=10)


def frames_until_closed(sock: socket.socket) -> list[tuple[int, bytes]]:
    """Every frame the broker sends until it closes the connection."""
    reader, frames = wire.FrameReader(), []
    while data := sock.recv(65536):
        frames += reader.feed(data)
    return frames


@pytest.fixture(autouse=True)
def _pairs_stopped() -> Iterator[None]:
    """A replicating pair a test made (tests/ha_kit.py) is stopped when the test ends, however
    it ended: a failed assertion left two brokers running for the rest of the suite."""
    kit = sys.modules.get("tests.ha_kit")
    before = len(kit.MEMBERS) if kit is not None else 0
    yield
    kit = sys.modules.get("tests.ha_kit")
    if kit is not None:
        kit.stop_launched(before)
