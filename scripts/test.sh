#!/usr/bin/env bash
# The whole test suite (lint and type check, then pytest) against real Delta tables, brokers and Spark.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
.venv/bin/ruff check .
.venv/bin/mypy  # the packages ([tool.mypy] in pyproject.toml)
exec .venv/bin/python -m pytest "$@"
