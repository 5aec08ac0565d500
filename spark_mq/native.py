"""Whether this sparkmq runs its per-message path compiled, and which modules that path is.

``scripts/compile.py`` (``SPARKMQ_COMPILE=1 scripts/setup.sh``) builds :data:`HOT_MODULES` with
mypyc into C extensions beside their sources; Python then imports the extensions. Pure Python
is the default and stays complete: the compiled modules are the same code, only faster (the
README's "How fast" has the figures). This module imports nothing of sparkmq's, so the
build script can read the list before anything is built.
"""

from __future__ import annotations

import importlib.machinery
import warnings
from pathlib import Path

# The broker's work per message, from reading a frame to answering it: the frames and their
# codec, the message and its records, the session's guard, the group commit and the segment
# log, duplicate detection, the registry, dispatch and settling. Chosen by profile (py-spy and
# cProfile of a broker under one-at-a-time sends); each must keep to what mypyc compiles (no
# vars() of its objects, no class attribute read as an instance's default, no interpreted
# subclass, no patching of its functions). Left out: session.session (sessions are tracked by
# weak reference, which mypyc's classes lack) and the STOMP and Kafka listeners' base classes
# (interpreted subclasses).
HOT_MODULES: tuple[str, ...] = (
    "spark_mq.wire",
    "spark_mq.protocol",
    "spark_mq.messages",
    "spark_mq.deliveries",
    "spark_mq.journal.records",
    "spark_mq.journal.segments",
    "spark_mq.journal.group_commit",
    "spark_mq.journal.inline_commit",
    "spark_mq.journal.hot_tier",
    "spark_mq.journal.bindings",
    "spark_mq.journal.settlements",
    "spark_mq.broker.dedup",
    "spark_mq.broker.producing",
    "spark_mq.broker.message_store",
    "spark_mq.broker.registry",
    "spark_mq.broker.subscription",
    "spark_mq.broker.consumers",
    "spark_mq.broker.destination",
    "spark_mq.broker.core",
    "spark_mq.broker.claims",
    "spark_mq.broker.limits",
    "spark_mq.transports.direct_wire",
    "spark_mq.transports.wire_conn",
    "spark_mq.transports.answers",
    "spark_mq.connection.core",
    "spark_mq.connection.listener",
    "spark_mq.session.guard",
)

_PACKAGE = Path(__file__).resolve().parent


def _paths(module: str) -> tuple[Path, list[Path]]:
    base = _PACKAGE.parent.joinpath(*module.split("."))
    builds = [base.with_name(base.name + s) for s in importlib.machinery.EXTENSION_SUFFIXES]
    return base.with_suffix(".py"), [b for b in builds if b.exists()]


def compiled() -> list[str]:
    """The hot modules that have a compiled build here (imported instead of their source)."""
    return [m for m in HOT_MODULES if _paths(m)[1]]


def stale() -> list[str]:
    """Compiled modules whose source was changed after the build: the build runs, not the edit."""
    out = []
    for module in HOT_MODULES:
        source, builds = _paths(module)
        if builds and source.exists() and source.stat().st_mtime > builds[0].stat().st_mtime:
            out.append(module)
    return out


def warn_if_stale() -> None:
    """Say so when an edited source is shadowed by its older build (at this module's import,
    which the package's ``__init__`` does before importing anything compiled)."""
    if old := stale():
        warnings.warn(
            f"sparkmq: {', '.join(old)} changed after they were compiled, and the compiled "
            "build is what runs: build again (python scripts/compile.py) or go back to pure "
            "Python (python scripts/compile.py --clean)",
            RuntimeWarning,
            stacklevel=2,
        )


def describe() -> str:
    """One line for ``sparkmq --version``, benches and logs."""
    done = compiled()
    if not done:
        return "pure Python"
    if len(done) == len(HOT_MODULES):
        return f"compiled with mypyc: {len(done)} hot modules"
    return f"partly compiled with mypyc: {len(done)} of {len(HOT_MODULES)} hot modules"


warn_if_stale()
