#!/usr/bin/env bash
# The whole test suite (lint, type check, import contracts, then pytest) against real Delta
# tables, brokers and Spark; the slowest tests are listed at the end of every run.
#
#   scripts/test.sh                 everything (what CI runs), in two processes (pytest-xdist),
#                                   each file whole in one, the longest files first
#                                   (tests/conftest.py): about 15 minutes here, against 20-25
#                                   in one process
#   scripts/test.sh --fast          the fast lane for an edit-test loop: in-process tests only
#                                   (no broker processes, no Spark), about a minute
#   scripts/test.sh [pytest args]   e.g. tests/test_wire.py -k lease
#   scripts/test.sh -n 0            in one process
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
lane=()
if [ "${1:-}" = "--fast" ]; then
  shift
  lane=(-m "not process and not spark")
fi
.venv/bin/ruff check .
.venv/bin/mypy  # the packages ([tool.mypy] in pyproject.toml)
.venv/bin/lint-imports  # the layers of docs/architecture.md ([tool.importlinter] in pyproject.toml)
exec .venv/bin/python -m pytest -n 2 --dist loadfile --no-loadscope-reorder "${lane[@]}" "$@"
