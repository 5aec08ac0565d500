"""One broker per data directory: a second one is refused, naming the first; the lock goes with
its holder however it ends."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from spark_mq import Producer
from spark_mq.clock import ManualClock
from spark_mq.errors import ConfigError
from spark_mq.launch import BrokerProcess
from tests.conftest import start_inprocess


@pytest.mark.process
def test_a_second_broker_process_on_the_same_data_dir_is_refused(tmp_path: Path) -> None:
    data = tmp_path / "data"
    first = BrokerProcess(str(data), log_file=str(tmp_path / "first.log")).start()
    try:
        second = subprocess.run(
            [sys.executable, "-m", "spark_mq", "broker", "--port", "0", "--wire-port", "0",
             "--stomp-port", "0", "--kafka-port", "0", "--http-port", "0", "--data-dir", str(data)],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )  # fmt: skip
        assert second.returncode == 2
        assert first.proc is not None
        assert f"is in use by another broker (pid {first.proc.pid} on host " in second.stderr
        assert socket.gethostname() in second.stderr
        with Producer(first.url, destination="q") as producer:  # the first serves on
            assert producer.send_sync("still mine") == 0
        first.kill()  # however it ends, the lock goes with it
        again = BrokerProcess(str(data), log_file=str(tmp_path / "again.log")).start()
        assert again.stop() == 0
    finally:
        first.stop()


def test_in_one_process_too_and_free_again_after_a_stop(tmp_path: Path, clock: ManualClock) -> None:
    data = tmp_path / "data"
    first = start_inprocess(data, clock)
    try:
        with pytest.raises(ConfigError, match=f"in use by another broker \\(pid {os.getpid()}"):
            start_inprocess(data, clock)
    finally:
        first.stop()
    start_inprocess(data, clock).stop()  # let go at the stop
