#!/usr/bin/env bash
# The whole test suite (lint, then pytest) against real Delta tables, brokers and Spark.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
.venv/bin/ruff check .
exec .venv/bin/python -m pytest "$@"
