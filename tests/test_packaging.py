"""The wheel as a user gets it: built from this checkout, installed with its dependencies into a
fresh virtual environment (no pyspark), and used there: the SDK, the broker with its console's
files, the CLI, and a clear word where Spark is needed."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
import urllib.request
import zipfile
from pathlib import Path

import pytest

pytestmark = pytest.mark.process

REPO = Path(__file__).resolve().parent.parent


def _run(*args: str | Path, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    """Run away from the checkout (``python -c`` would import its ``spark_mq/`` first)."""
    return subprocess.run(
        [str(a) for a in args], capture_output=True, text=True, timeout=timeout, check=False,
        cwd=Path(args[0]).anchor,
    )  # fmt: skip


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    source = out / "source"  # (a copy: building writes build/ and egg-info next to the code)
    shutil.copytree(REPO, source, ignore=shutil.ignore_patterns(
        ".venv", ".git", "build", "*.egg-info", "__pycache__", "data", "demo-data",
        ".pytest_cache", ".ruff_cache", ".mypy_cache", "spark-warehouse",
    ))  # fmt: skip
    built = _run(sys.executable, "-m", "pip", "wheel", "--no-deps", "--quiet", "-w", out, source)
    assert built.returncode == 0, built.stderr
    (found,) = out.glob("sparkmq-*.whl")
    return found


def test_the_wheel_carries_every_package_its_data_and_license(wheel: Path) -> None:
    names = set(zipfile.ZipFile(wheel).namelist())
    for module in ("spark_mq/session/session.py", "spark_mq/security/acl.py",
                   "spark_mq/transports/direct_wire.py", "spark_mq/ha/replication.py",
                   "spark_mq/ops/http.py", "spark_mq/cli/destinations.py",
                   "spark_mq/journal/journal.py", "spark_mq/connectors/source.py",
                   "spark_mq/jobs/compaction.py"):  # fmt: skip
        assert module in names, module
    for data in ("spark_mq/py.typed", "spark_mq/ops/console/index.html",
                 "spark_mq/ops/console/app.js", "spark_mq/ops/console/style.css",
                 "spark_mq/connectors/java/sparkmq/spark/LogSource.java"):  # fmt: skip
        assert data in names, data
    assert any(n.endswith(".dist-info/licenses/LICENSE") for n in names)
    assert not any(n.startswith(("tests/", "bench/")) for n in names)
    meta = next(n for n in names if n.endswith(".dist-info/METADATA"))
    text = zipfile.ZipFile(wheel).read(meta).decode()
    requires = [line for line in text.splitlines() if line.startswith("Requires-Dist:")]
    core = [r for r in requires if "extra ==" not in r]
    assert not any("pyspark" in r for r in core), core  # the SDK installs without Spark
    assert any("pyspark" in r and 'extra == "spark"' in r for r in requires)


def test_installed_in_a_fresh_venv_the_sdk_and_broker_work_without_spark(
    wheel: Path, tmp_path: Path
) -> None:
    venv = tmp_path / "venv"
    assert _run(sys.executable, "-m", "venv", venv).returncode == 0
    py, sparkmq = venv / "bin" / "python", venv / "bin" / "sparkmq"
    # (--no-compile: byte-compiling pyarrow and the rest took 10 s of this test's 36)
    installed = _run(py, "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
                     "--no-compile", wheel)  # fmt: skip
    assert installed.returncode == 0, installed.stderr
    no_spark = _run(py, "-c", "import importlib.util as u; print(u.find_spec('pyspark'))")
    assert no_spark.stdout.strip() == "None"
    typed = _run(py, "-c", "import spark_mq, pathlib; print((pathlib.Path("
                 "spark_mq.__file__).parent / 'py.typed').exists())")  # fmt: skip
    assert typed.stdout.strip() == "True"

    ready = tmp_path / "ready.json"
    broker = subprocess.Popen(
        [str(sparkmq), "broker", "--port", "0", "--wire-port", "0", "--stomp-port", "0",
         "--kafka-port", "0",
         "--http-port", "0", "--data-dir", str(tmp_path / "data"), "--ready-file", str(ready)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while not ready.exists():
            assert broker.poll() is None, "the installed broker exited"
            assert time.monotonic() < deadline, "the installed broker did not start"
            time.sleep(0.1)
        info = json.loads(ready.read_text())
        roundtrip = _run(py, "-c", (
            "import sys; from spark_mq import Producer, Consumer\n"
            "url = sys.argv[1]\n"
            "with Producer(url, destination='wheel.q') as p: p.send_sync('from the wheel')\n"
            "with Consumer(url, 'wheel.q') as c:\n"
            "    m = c.receive(10); m.ack().result(10); print(m.text)\n"
        ), info["url"])  # fmt: skip
        assert roundtrip.returncode == 0, roundtrip.stderr
        assert roundtrip.stdout.strip() == "from the wheel"
        with urllib.request.urlopen(info["http_url"] + "/", timeout=10) as r:
            assert b"sparkmq console" in r.read()  # (the console's files are in the wheel)
        listed = _run(sparkmq, "queue", "list", "--json", "--url", info["url"])
        assert listed.returncode == 0, listed.stderr
        assert [q["name"] for q in json.loads(listed.stdout)] == ["wheel.q"]
    finally:
        broker.terminate()
        broker.wait(30)

    demo = _run(sparkmq, "demo", "--data-dir", tmp_path / "demo")
    assert demo.returncode == 2
    assert "pip install 'sparkmq[spark]'" in demo.stderr
    connector = _run(py, "-c", "from spark_mq.connectors import local_session; local_session()")
    assert connector.returncode == 1 and "sparkmq[spark]" in connector.stderr
