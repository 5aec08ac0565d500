"""The layers of docs/architecture.md are checked (import-linter, from scripts/test.sh): the
contracts hold for the code as it is, and a violation fails the check, naming it."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
LINT = Path(sys.executable).parent / "lint-imports"


def _lint(root: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(LINT), "--config", str(root / "pyproject.toml"), "--no-cache"],
        cwd=root,
        env={"PYTHONPATH": str(root), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def test_the_code_keeps_its_layers() -> None:
    done = _lint(REPO)
    assert done.returncode == 0, done.stdout[-3000:]
    assert "0 broken" in done.stdout


def test_a_domain_module_importing_a_transport_breaks_the_layers(tmp_path: Path) -> None:
    shutil.copytree(
        REPO / "spark_mq", tmp_path / "spark_mq", ignore=shutil.ignore_patterns("__pycache__")
    )
    shutil.copy(REPO / "pyproject.toml", tmp_path / "pyproject.toml")
    core = tmp_path / "spark_mq" / "broker" / "core.py"
    core.write_text(
        core.read_text() + "\nfrom spark_mq.transports import flight  # the wrong way\n"
    )
    sdk = tmp_path / "spark_mq" / "client" / "admin.py"
    sdk.write_text(sdk.read_text() + "\nfrom spark_mq.broker import core  # the SDK reaching in\n")
    done = _lint(tmp_path)
    assert done.returncode == 1
    assert "the server's layers BROKEN" in done.stdout
    assert "spark_mq.broker is not allowed to import spark_mq.transports" in done.stdout
    assert "the SDK speaks the protocol, and knows nothing of the server BROKEN" in done.stdout


def test_a_listener_reaching_past_the_session_or_a_cycle_breaks_the_contracts(
    tmp_path: Path,
) -> None:
    shutil.copytree(
        REPO / "spark_mq", tmp_path / "spark_mq", ignore=shutil.ignore_patterns("__pycache__")
    )
    shutil.copy(REPO / "pyproject.toml", tmp_path / "pyproject.toml")
    stomp = tmp_path / "spark_mq" / "transports" / "stomp_session.py"
    stomp.write_text(stomp.read_text() + "\nfrom spark_mq.broker import subscription  # past\n")
    codec = tmp_path / "spark_mq" / "transports" / "stomp_codec.py"
    codec.write_text(codec.read_text() + "\nfrom spark_mq.transports import stomp_session\n")
    done = _lint(tmp_path)
    assert done.returncode == 1
    assert (
        "a listener reaches the broker only through the connection core and the session BROKEN"
        in done.stdout
    )
    assert "spark_mq.transports.stomp_session -> spark_mq.broker.subscription" in done.stdout
    assert "no import cycles, between packages or between the modules of one BROKEN" in done.stdout
