"""A full disk: producers are refused with a clear, retriable error before the disk is full to
its last byte, reads and acks go on, the broker starts again on a nearly full disk (it reserved
a 64 MiB segment per destination when opening, so on a small disk it could never start again),
and producers are taken again by themselves once space comes back. On a real 24 MiB file
system (tmpfs, in a mount namespace of the scenario's own)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.process
SCENARIO = Path(__file__).parent / "scenarios" / "disk_full.py"


def namespace() -> list[str]:
    """A private mount namespace (root maps to itself; anyone else to root in a user
    namespace, where mounting a tmpfs is allowed)."""
    unshare = shutil.which("unshare")
    assert unshare, "the disk-full test needs unshare (util-linux) to mount a small tmpfs"
    return [unshare, "--mount"] if os.geteuid() == 0 else [unshare, "--mount", "--map-root-user"]


def test_a_full_disk_refuses_producers_keeps_everything_and_recovers(tmp_path: Path) -> None:
    root, log = tmp_path / "small-disk", tmp_path / "broker.log"
    root.mkdir()
    done = subprocess.run(
        [*namespace(), sys.executable, str(SCENARIO), str(root), str(log)],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
        cwd=Path(__file__).parent.parent,
    )
    broker_log = log.read_text() if log.exists() else ""
    assert done.returncode == 0, done.stdout + done.stderr + broker_log
    assert done.stdout.strip().endswith("ok")
    text = log.read_text()
    assert "under limits.min_free_disk_bytes" in text and "free again" in text
    assert "Traceback" not in text


def test_a_directory_not_made_yet_is_measured_on_the_disk_it_will_be_on(tmp_path: Path) -> None:
    """At a first start the hot tier's directory is made after the broker opens: its disk is
    measured from the start all the same (``sparkmq_disk_free_bytes`` was missing from the
    first scrapes), the free bytes of the directory it will be made in."""
    from spark_mq.broker.disk import DiskMonitor

    monitor = DiskMonitor(str(tmp_path / "not" / "made" / "yet"), 1)
    monitor.measure()
    st = os.statvfs(tmp_path)
    assert monitor.free_bytes is not None
    assert abs(monitor.free_bytes - st.f_bavail * st.f_frsize) < 64 * 1024 * 1024
    assert not monitor.low
