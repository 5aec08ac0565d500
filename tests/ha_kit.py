"""What the high-availability tests share."""

from __future__ import annotations

import signal
from pathlib import Path

from spark_mq import Admin
from spark_mq.errors import SparkMQError
from spark_mq.launch import BrokerProcess
from tests.ports import free_port

MEMBERS: list[Member] = []  # every one made, in order (conftest stops a test's own at its end)


def stop_launched(since: int) -> None:
    """Kill the brokers of the members made since the first ``since`` that still run (a test
    that failed half way left its pair running for the rest of the suite)."""
    for member in MEMBERS[since:]:
        proc = member.process.proc if member.process is not None else None
        if proc is not None and proc.poll() is None:
            proc.send_signal(signal.SIGCONT)  # (a paused one dies too)
            proc.kill()
            proc.wait(30)
    del MEMBERS[since:]


class Member:
    """One broker of a replicating pair: its own ports, hot directory and log."""

    def __init__(self, name: str, root: Path, base: Path) -> None:
        MEMBERS.append(self)
        self.name, self.root = name, root
        self.hot = base / f"hot-{name}"
        self.logs = base / "logs"
        self.logs.mkdir(exist_ok=True)
        self.port, self.wire_port, self.repl_port = free_port(), free_port(), free_port()
        self.kafka_port = free_port()
        self.url = f"grpc://127.0.0.1:{self.port}"
        self.peer: Member | None = None
        self.process: BrokerProcess | None = None

    def launch(self, env: dict[str, str] | None = None, **more: object) -> BrokerProcess:
        assert self.peer is not None
        args = [
            "--port", str(self.port), "--wire-port", str(self.wire_port), "--stomp-port", "0",
            "--kafka-port", str(self.kafka_port),
            "--set", "ha.mode=replication",
            "--set", f"ha.broker_id={self.name}",
            "--set", f"ha.peer=127.0.0.1:{self.peer.repl_port}",
            "--set", f"ha.replication_port={self.repl_port}",
            "--set", "ha.failover_timeout_s=1.5",
            "--set", "ha.heartbeat_s=0.2",
            "--set", f"journal.hot_dir={self.hot}",
            "--set", f"logging.file={self.logs / f'{self.name}.log'}",
        ]  # fmt: skip
        for k, v in more.items():
            value = str(v).lower() if isinstance(v, bool) else str(v)
            args += ["--set", f"{k}={value}"]
        self.process = BrokerProcess(
            str(self.root),
            extra_args=args,
            log_file=str(self.logs / f"{self.name}.out"),
            env=env,
        ).launch()
        return self.process

    def log_text(self) -> str:
        path = self.logs / f"{self.name}.log"
        return path.read_text() if path.exists() else ""


def pair(tmp_path: Path) -> tuple[Member, Member]:
    root = tmp_path / "root"
    a, b = Member("a", root, tmp_path), Member("b", root, tmp_path)
    a.peer, b.peer = b, a
    return a, b


def in_sync(url: str, **creds: str) -> bool:
    try:
        with Admin(url, timeout_s=2, **creds) as admin:
            return admin.broker_state().get("replication_state") == "in_sync"
    except SparkMQError:
        return False
