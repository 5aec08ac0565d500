#!/usr/bin/env bash
# Creates .venv with sparkmq and its test tools. Idempotent: reinstalls only when pyproject.toml changed.
set -euo pipefail
cd "$(dirname "$0")/.."

PY=${PYTHON:-python3}
if ! command -v "$PY" >/dev/null 2>&1; then
  echo "sparkmq needs Python 3.11+ ('$PY' not found). Install python3, or set PYTHON=/path/to/python." >&2
  exit 1
fi
if ! "$PY" -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else 1)'; then
  echo "sparkmq needs Python 3.11 or newer; $PY is $("$PY" --version 2>&1)." >&2
  exit 1
fi
if ! command -v java >/dev/null 2>&1 && [ -z "${JAVA_HOME:-}" ]; then
  echo "Spark needs Java 17, and no 'java' is on PATH." >&2
  echo "Install it, e.g.:  sudo apt-get install -y openjdk-17-jre-headless   (Debian/Ubuntu)" >&2
  echo "                   brew install openjdk@17                          (macOS)" >&2
  exit 1
fi
if ! command -v javac >/dev/null 2>&1 && [ ! -x "${JAVA_HOME:-/nonexistent}/bin/javac" ]; then
  echo "sparkmq compiles its Spark connector's Java half with javac (a JDK), and none was found." >&2
  echo "Install it, e.g.:  sudo apt-get install -y openjdk-17-jdk-headless   (Debian/Ubuntu)" >&2
  echo "(Without it format('sparkmq') still works, through Python workers, about 3x slower.)" >&2
  exit 1
fi
JAVA_BIN=${JAVA_HOME:+$JAVA_HOME/bin/}java
JAVA_MAJOR=$("$JAVA_BIN" -version 2>&1 | sed -nE 's/.*version "([0-9]+).*/\1/p' | head -1)
if [ -n "$JAVA_MAJOR" ] && [ "$JAVA_MAJOR" -lt 17 ]; then
  echo "Spark 4 needs Java 17 or newer; found Java $JAVA_MAJOR. Install openjdk-17." >&2
  exit 1
fi

# apt_install WHY PACKAGE...: Debian packages the tests need, installed when apt-get is there
apt_install() {
  local why=$1
  shift
  if command -v apt-get >/dev/null 2>&1; then
    echo "==> installing $* ($why)"
    local sudo=""
    if [ "$(id -u)" -ne 0 ]; then sudo="sudo"; fi
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "$@" >/dev/null
  else
    echo "The $why need $*. Install them, e.g.:  sudo apt-get install -y $*   (Debian/Ubuntu)" >&2
    exit 1
  fi
}

# the web console's tests drive a real headless browser: Debian's Chromium and its driver
if ! command -v chromium >/dev/null 2>&1 || ! command -v chromedriver >/dev/null 2>&1; then
  apt_install "web console's browser tests" chromium chromium-driver
fi
# the STOMP and Kafka tests run clients from npm (stompit, kafkajs) under Node
if ! command -v node >/dev/null 2>&1 || ! command -v npm >/dev/null 2>&1; then
  apt_install "STOMP and Kafka tests' Node clients" nodejs npm
fi
# the Kafka tests run kcat (librdkafka's command-line client) too
if ! command -v kcat >/dev/null 2>&1; then
  apt_install "Kafka tests' command-line client" kcat
fi
# and a Go client (sarama), built offline from Debian's packaged sources
if ! command -v go >/dev/null 2>&1 || [ ! -d /usr/share/gocode/src/github.com/Shopify/sarama ]; then
  apt_install "Kafka tests' Go client" golang-go golang-github-shopify-sarama-dev
fi
if [ ! -d tests/node/node_modules/stompit ] || [ ! -d tests/node/node_modules/kafkajs ] || [ tests/node/package-lock.json -nt tests/node/node_modules ]; then
  echo "==> installing the tests' Node clients (npm ci in tests/node)"
  npm ci --prefix tests/node --no-audit --no-fund --silent
  touch tests/node/node_modules
fi

# the cluster's tests start a real ZooKeeper (Debian's, run from its jars)
if [ ! -f /usr/share/java/zookeeper.jar ]; then
  apt_install "cluster tests' ZooKeeper" zookeeper
fi
# the compiled build's test (tests/test_native.py) and SPARKMQ_COMPILE=1 below need a C compiler
# and Python's headers
if ! command -v cc >/dev/null 2>&1 || ! "$PY" -c 'import os, sys, sysconfig; sys.exit(not os.path.exists(os.path.join(sysconfig.get_paths()["include"], "Python.h")))'; then
  apt_install "compiled build (mypyc)" gcc python3-dev
fi

if [ ! -x .venv/bin/python ]; then
  echo "==> creating .venv"
  "$PY" -m venv .venv
fi
STAMP=.venv/.sparkmq-installed
if [ ! -f "$STAMP" ] || [ pyproject.toml -nt "$STAMP" ]; then
  echo "==> installing sparkmq and its dependencies into .venv (first time: a few minutes, pyspark is large)"
  .venv/bin/python -m pip install --quiet --upgrade pip
  .venv/bin/python -m pip install --quiet -e '.[test,spark]'
  touch "$STAMP"
fi

# opt-in: the broker's per-message path compiled with mypyc (README, "Speed"); pure Python is
# the default and undoes it: .venv/bin/python scripts/compile.py --clean
if [ "${SPARKMQ_COMPILE:-0}" = 1 ]; then
  .venv/bin/python scripts/compile.py --if-needed
fi
