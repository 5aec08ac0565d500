"""The compiled build tests/test_native.py runs against: a copy of the package and the tests,
built with scripts/compile.py. The build takes most of a minute of CPU, so ``conftest.py``
starts it when the session starts (with the CPU's idle time only: the tests before it keep
their speed) and the test's fixture waits for it (at normal priority from then on)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
COMPILE = str(REPO / "scripts" / "compile.py")


def copy_tree(root: Path) -> None:
    skip = shutil.ignore_patterns("__pycache__", "*.so", "node_modules", ".hypothesis")
    shutil.copytree(REPO / "spark_mq", root / "spark_mq", ignore=skip)
    shutil.copytree(REPO / "tests", root / "tests", ignore=skip)
    shutil.copy(REPO / "pyproject.toml", root)  # the suite's markers and settings


def env_for(root: Path) -> dict[str, str]:
    # the copy first on the path: it, not the checkout's editable install, is imported (by the
    # brokers the tests start too, which inherit the environment)
    return {**os.environ, "PYTHONPATH": str(root)}


class Build:
    """A build of ``root`` under way in a process group of its own. It leaves its output and
    exit status in files under ``root``, so that another process of the run (the pytest-xdist
    worker that runs tests/test_native.py) can wait for it: :meth:`of`."""

    def __init__(self, root: Path, *, idle: bool) -> None:
        self.root = root
        copy_tree(root)
        # -O0: the C compiler's optimisations change how fast it runs, not what it does
        compile_ = [sys.executable, COMPILE, "--root", str(root), "--opt-level", "0"]
        with open(root / "build.log", "wb") as log:
            proc = subprocess.Popen(
                ["sh", "-c", '"$@"; echo $? > build.status.tmp; mv build.status.tmp build.status',
                 "build", *compile_],
                cwd=root,
                env=env_for(root),
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                preexec_fn=_idle if idle else None,
            )  # fmt: skip
        self._proc: subprocess.Popen[bytes] | None = proc
        self.group = proc.pid
        (root / "build.group").write_text(str(proc.pid))

    @classmethod
    def of(cls, root: Path) -> Build | None:
        """The build another process of this run started in ``root``, if it did."""
        if not (root / "build.group").exists():
            return None
        build = cls.__new__(cls)
        build.root, build._proc = root, None
        build.group = int((root / "build.group").read_text())
        return build

    def wait(self, timeout: float = 600) -> tuple[int, str]:
        """Its exit status and output, once done (the rest of it at normal priority)."""
        _normal_priority(self.group)
        status, deadline = self.root / "build.status", time.monotonic() + timeout
        while not status.exists():
            if time.monotonic() > deadline:
                raise TimeoutError(f"the compiled build did not end within {timeout}s")
            time.sleep(0.2)
        if self._proc is not None:
            self._proc.wait()
        out = (self.root / "build.log").read_text()
        return int(status.read_text()), out

    def stop(self) -> None:
        if self._proc is not None and self._proc.poll() is None:
            os.killpg(self.group, 9)
            self._proc.wait()


def _idle() -> None:  # (in the child, before exec: inherited by the compilers it starts)
    os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))


def _normal_priority(group: int) -> None:
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            if os.getpgid(int(entry)) == group:
                os.sched_setscheduler(int(entry), os.SCHED_OTHER, os.sched_param(0))
        except (ProcessLookupError, PermissionError):
            continue  # (ended meanwhile)
