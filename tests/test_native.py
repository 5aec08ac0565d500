"""The compiled build (scripts/compile.py, ``SPARKMQ_COMPILE=1 scripts/setup.sh``): built from a
copy of the package with mypyc, it is what runs, it passes the broker's own tests, it says when
an edited source is shadowed by its build, and ``--clean`` gives pure Python back."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from spark_mq.native import HOT_MODULES
from tests.conftest import NATIVE_BUILD, NATIVE_BUILD_DIR
from tests.native_build import COMPILE, Build, env_for

pytestmark = pytest.mark.process

SUFFIX = sysconfig.get_config_var("EXT_SUFFIX")
# the broker's tests run against the compiled copy: the direct wire end to end, and the wire's
# verbs for every kind of caller, where a compiled turn once failed (mypyc trusted a narrowing
# mypy allows and Python does not check) and test_wire.py alone did not catch it: about 12 s.
# The in-process suite passes compiled too (-m "not pure_python"), but takes minutes.
SUITE = ["test_wire.py", "test_security.py"]
SUITE_FILTER = "not test_security or wire or what_a_user"


def _python(root: Path, *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, *args],
        cwd=root,
        env=env_for(root),
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


@pytest.fixture(scope="module")
def compiled(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    # started with the session by conftest.py (or here, when it was not)
    build = request.config.stash.get(NATIVE_BUILD, None) or Build.of(
        Path(os.environ[NATIVE_BUILD_DIR])  # (by pytest-xdist's controller)
    )
    if build is None:
        build = Build(tmp_path_factory.mktemp("compiled"), idle=False)
    status, out = build.wait()
    assert status == 0, out
    assert f"compiled {len(HOT_MODULES)} modules" in out
    return build.root


def test_the_compiled_modules_are_what_runs_and_the_cli_says_so(compiled: Path) -> None:
    probe = _python(
        compiled,
        "-c",
        "import importlib\n"
        "from spark_mq.native import HOT_MODULES\n"
        "for m in HOT_MODULES: print(importlib.import_module(m).__file__)",
    )
    assert probe.returncode == 0, probe.stderr
    files = probe.stdout.split()
    assert len(files) == len(HOT_MODULES)
    assert all(f.startswith(str(compiled)) and f.endswith(SUFFIX) for f in files), files
    version = _python(compiled, "-m", "spark_mq", "--version")
    assert version.returncode == 0, version.stderr
    assert f"compiled with mypyc: {len(HOT_MODULES)} hot modules" in version.stdout


def test_the_broker_s_tests_pass_on_the_compiled_build(compiled: Path) -> None:
    lane = ["-m", "pytest", "-q", "-p", "no:randomly", "-p", "no:cacheprovider"]
    tests = [f"tests/{name}" for name in SUITE]
    marks = "not pure_python and not spark"
    suite = _python(compiled, *lane, "-m", marks, "-k", SUITE_FILTER, *tests, timeout=600)
    summary = suite.stdout.strip().splitlines()[-1] if suite.stdout.strip() else ""
    assert suite.returncode == 0, suite.stdout[-4000:] + suite.stderr[-2000:]
    assert " passed" in summary and "failed" not in summary, summary
    # ... and the tests that patch the compiled path are refused up front, not left to fail
    patched = _python(compiled, *lane, "tests/test_dispatch.py")
    assert patched.returncode != 0
    assert "deselect them (-m 'not pure_python')" in patched.stdout + patched.stderr


def test_an_edited_source_is_reported_and_clean_gives_pure_python_back(
    compiled: Path, tmp_path: Path
) -> None:
    # on a copy of the build: the other tests keep theirs whatever the order
    root = tmp_path / "tree"
    shutil.copytree(compiled / "spark_mq", root / "spark_mq")
    wire = root / "spark_mq" / "wire.py"
    later = wire.with_name(f"wire{SUFFIX}").stat().st_mtime + 60
    os.utime(wire, (later, later))  # edited after its build
    edited = _python(root, "-W", "error::RuntimeWarning", "-c", "import spark_mq")
    assert edited.returncode != 0
    assert "spark_mq.wire changed after they were compiled" in edited.stderr
    assert "python scripts/compile.py" in edited.stderr

    cleaned = _python(root, COMPILE, "--root", str(root), "--clean")
    assert cleaned.returncode == 0, cleaned.stderr
    assert not list((root / "spark_mq").rglob(f"*{SUFFIX}"))
    pure = _python(
        root,
        "-W",
        "error::RuntimeWarning",
        "-c",
        "import spark_mq.wire, spark_mq.native as n; print(spark_mq.wire.__file__, n.describe())",
    )
    assert pure.returncode == 0, pure.stderr
    assert pure.stdout.split()[0] == str(wire) and pure.stdout.endswith("pure Python\n")
