"""Starting a broker as a separate process and waiting until it listens (demo, tests, bench)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from spark_mq.errors import BrokerUnavailable


class BrokerProcess:
    """``sparkmq broker`` in a child process; ``url`` is valid once :meth:`start` returns."""

    def __init__(
        self,
        data_dir: str,
        *,
        extra_args: list[str] | None = None,
        log_file: str | None = None,
        env: dict[str, str] | None = None,
    ) -> None:
        self.data_dir = data_dir
        self.env = env or {}
        self.extra_args = extra_args or []
        self.log_file = log_file
        self.proc: subprocess.Popen[bytes] | None = None
        self.url = ""
        self.http_url = ""  # the HTTP listener's (metrics, health, console), once serving
        self.stomp_port: int | None = None  # STOMP's, once serving
        self.kafka_port: int | None = None  # Kafka's, once serving
        self.wire_port: int | None = None  # the direct wire's TCP port, once serving

    def start(self, timeout_s: float = 60.0) -> BrokerProcess:
        return self.launch().wait_ready(timeout_s)

    def launch(self) -> BrokerProcess:
        """Start the process without waiting for it to serve (a shared store's backup serves
        only once it takes over): :meth:`wait_ready` waits."""
        self._ready = ready = Path(tempfile.mkdtemp(prefix="sparkmq-ready-")) / "ready.json"
        out = open(self.log_file, "ab") if self.log_file else subprocess.DEVNULL  # noqa: SIM115
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "spark_mq",
                "broker",
                "--port",
                "0",
                "--wire-port",
                "0",
                "--http-port",
                "0",
                "--stomp-port",
                "0",
                "--kafka-port",
                "0",
                "--data-dir",
                self.data_dir,
                "--ready-file",
                str(ready),
                *self.extra_args,
            ],
            stdout=out,
            stderr=subprocess.STDOUT if self.log_file else subprocess.DEVNULL,
            env={**os.environ, "PYTHONUNBUFFERED": "1", **self.env},
        )
        return self

    @property
    def serving(self) -> bool:
        """Whether it listens (its ready file is written: it owns the data)."""
        return self._ready.exists()

    def wait_ready(self, timeout_s: float = 60.0) -> BrokerProcess:
        ready = self._ready
        assert self.proc is not None, "launch() first"
        deadline = time.monotonic() + timeout_s
        while not ready.exists():
            if self.proc.poll() is not None:
                raise BrokerUnavailable(
                    f"the broker exited with code {self.proc.returncode} before listening"
                    + (f"; see {self.log_file}" if self.log_file else "")
                )
            if time.monotonic() > deadline:
                self.kill()
                raise BrokerUnavailable(f"the broker did not start within {timeout_s}s")
            time.sleep(0.05)
        info = json.loads(ready.read_text())
        self.url = info["url"]
        self.http_url = info.get("http_url") or ""
        self.stomp_port = info.get("stomp_port")
        self.kafka_port = info.get("kafka_port")
        self.wire_port = info.get("wire_port")
        return self

    def kill(self) -> None:
        """SIGKILL: no flush, no goodbye (crash tests)."""
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait()

    def stop(self, timeout_s: float = 30.0) -> int:
        """SIGTERM and wait: the broker flushes pending commits first."""
        if self.proc is None:
            return 0
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.kill()
        return self.proc.returncode

    def __enter__(self) -> BrokerProcess:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
