"""Compiles the broker's per-message path with mypyc (``SPARKMQ_COMPILE=1 scripts/setup.sh``).

The modules listed in :data:`spark_mq.native.HOT_MODULES` are built into C extensions next to
their sources (``spark_mq/wire.cpython-311-x86_64-linux-gnu.so`` beside ``spark_mq/wire.py``);
Python imports an extension before a source of the same name, so the package runs compiled
from then on, and pure Python again after ``--clean``. A source edited after its build is
reported at import (``spark_mq.native.stale``): build again or clean.

    python scripts/compile.py            # build in place
    python scripts/compile.py --clean    # remove the builds: pure Python again
    python scripts/compile.py --root DIR # build the copy of the package under DIR instead

Needs a C compiler and Python's headers (Debian: ``gcc python3-dev``); mypyc comes with mypy.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import shutil
import sys
import sysconfig
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent


def _native(root: Path) -> Any:
    # native.py alone: importing the package would import (and so hold open) its modules
    spec = importlib.util.spec_from_file_location("_native", root / "spark_mq" / "native.py")
    assert spec is not None and spec.loader is not None
    native = importlib.util.module_from_spec(spec)
    with warnings.catch_warnings():  # (its warning at import is for running, not building)
        warnings.simplefilter("ignore")
        spec.loader.exec_module(native)
    return native


def _hot_modules(root: Path) -> list[str]:
    return list(_native(root).HOT_MODULES)


def up_to_date(root: Path) -> bool:
    """Every hot module compiled, none changed since."""
    native = _native(root)
    return len(native.compiled()) == len(native.HOT_MODULES) and not native.stale()


def clean(root: Path) -> list[Path]:
    """Remove every compiled module and mypyc's shared library under ``root/spark_mq``."""
    suffix = sysconfig.get_config_var("EXT_SUFFIX") or ".so"
    gone = []
    for path in sorted((root / "spark_mq").rglob(f"*{suffix}")):
        path.unlink()
        gone.append(path)
    shutil.rmtree(root / "build" / "mypyc", ignore_errors=True)
    return gone


def build(root: Path, *, opt_level: str = "3") -> None:
    """Compile the hot modules of the package under ``root`` in place."""
    missing = [
        what
        for what, ok in (
            ("a C compiler (cc)", shutil.which(os.environ.get("CC", "cc"))),
            ("Python's headers", Path(sysconfig.get_paths()["include"], "Python.h").exists()),
        )
        if not ok
    ]
    if missing:
        sys.exit(
            f"compiling needs {' and '.join(missing)}: on Debian/Ubuntu "
            "`sudo apt-get install -y gcc python3-dev` (pure Python works without them)"
        )
    from mypyc.build import mypycify
    from setuptools import Distribution

    clean(root)
    modules = _hot_modules(root)
    started = time.monotonic()
    here = os.getcwd()
    os.chdir(root)  # mypyc names modules by their paths from the working directory
    try:
        target = Path("build", "mypyc")
        extensions = mypycify(
            [str(Path(*m.split("."))) + ".py" for m in modules],
            opt_level=opt_level,
            group_name="spark_mq.native_lib",  # its shared library inside the package
            multi_file=True,  # one C file per module: compiled in parallel below
            target_dir=str(target),
        )
        for extension in extensions:  # the group's header sits under its package's folder
            extension.include_dirs.append(str(target / "spark_mq"))
        with tempfile.TemporaryDirectory() as scratch:
            # a bare Distribution: setup() would read pyproject.toml's packaging as well
            dist = Distribution({"name": "sparkmq-native", "ext_modules": extensions})
            dist.script_args = [
                "--quiet",
                "build_ext",
                "--inplace",
                "--parallel",
                str(os.cpu_count() or 1),
                "--build-temp",
                scratch,
            ]
            dist.parse_command_line()
            dist.run_commands()
    finally:
        os.chdir(here)
    print(
        f"compiled {len(modules)} modules with mypyc in {time.monotonic() - started:.0f} s "
        f"(pure Python again: python {Path(__file__).name} --clean)"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clean", action="store_true", help="remove the compiled modules")
    parser.add_argument("--root", type=Path, default=REPO, help="the tree holding spark_mq/")
    parser.add_argument("--opt-level", default="3", help="the C compiler's -O level")
    parser.add_argument(
        "--if-needed", action="store_true", help="only if a module is not compiled or changed"
    )
    args = parser.parse_args()
    if args.clean:
        gone = clean(args.root)
        print(f"removed {len(gone)} compiled modules: sparkmq runs as pure Python")
    elif args.if_needed and up_to_date(args.root):
        print("the compiled build is up to date")
    else:
        build(args.root, opt_level=args.opt_level)


if __name__ == "__main__":
    main()
