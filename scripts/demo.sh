#!/usr/bin/env bash
# The demo: a broker, a producer, a consumer with acks and a Spark streaming query.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
exec .venv/bin/sparkmq demo "$@"
