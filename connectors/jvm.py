"""The JVM half of ``format("sparkmq")``: reads of message logs at Parquet speed.

A Python data source hands every row from a Python worker to the JVM, which caps it near a
fifth of what Spark reads Parquet at (``bench/spark_bench.py``). So the connector also ships
a small Java provider (``connectors/java/``, compiled here with the JDK's ``javac`` against
pyspark's own jars, once per source version, into ``~/.cache/sparkmq``). With its jar on the
driver's classpath, ``format("sparkmq")`` is that Java provider:

* a streaming or batch read of message logs in place becomes Spark's own Parquet reader over
  the files Delta's offset statistics select; what each read holds (offsets, admission
  control, data loss) is still decided here, in Python, by :class:`LogPlanner` and
  :meth:`PlannerFactory.planBatch` through py4j;
* everything else (consuming through the broker, ``groupingPartitions``, remote roots, the
  sink) is the Python data source, registered as ``sparkmq_python``.

Without a JDK the connector is the Python data source alone, as before (same results, slower).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import subprocess
import tempfile
import zipfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadLimit, ReadMaxBytes, ReadMaxRows

from spark_mq.connectors import delta_read as dr
from spark_mq.connectors.options import SourceOptions
from spark_mq.connectors.source import BatchReader, ReadPlanner, StreamReader
from spark_mq.errors import ConfigError
from spark_mq.journal import layout

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

log = logging.getLogger(__name__)

SOURCES = Path(__file__).parent / "java"
PYTHON_SOURCE_NAME = "sparkmq_python"
_BRIDGE = "sparkmq.spark.Bridge"
# --release 17: classes Spark 4's oldest JVM loads, whichever JDK compiles them
_JAVAC_FLAGS = ("--release", "17", "-nowarn")


def _spark_jars() -> Path:
    from pyspark.find_spark_home import _find_spark_home

    return Path(_find_spark_home()) / "jars"


def _javac() -> str | None:
    home = os.environ.get("JAVA_HOME")
    if home and os.access(os.path.join(home, "bin", "javac"), os.X_OK):
        return os.path.join(home, "bin", "javac")
    return shutil.which("javac")


def _cache_dir() -> Path:
    base = os.environ.get("SPARKMQ_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "sparkmq"
    )
    return Path(base)


def jar_path() -> str | None:
    """The connector's jar, compiled on first use; None when there is no ``javac``.

    Put it on the driver's classpath (``spark.driver.extraClassPath``, or ``spark.jars`` on a
    cluster) before the SparkSession starts, as :func:`spark_mq.connectors.local_session` does."""
    import pyspark

    files = sorted(p for p in SOURCES.rglob("*") if p.is_file())
    digest = hashlib.sha256(f"{pyspark.__version__} {' '.join(_JAVAC_FLAGS)}".encode())
    for path in files:
        digest.update(str(path.relative_to(SOURCES)).encode())
        digest.update(path.read_bytes())
    jar = _cache_dir() / f"sparkmq-spark-{digest.hexdigest()[:16]}.jar"
    if jar.exists():
        return str(jar)
    javac = _javac()
    if javac is None:
        log.warning(
            "no javac (a JDK) found: format('sparkmq') reads through Python workers, about "
            "three times slower than its native path; install a JDK 17 (e.g. apt-get install "
            "openjdk-17-jdk-headless) for it"
        )
        return None
    jar.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=jar.parent) as tmp:
        classes = Path(tmp) / "classes"
        java = [str(p) for p in files if p.suffix == ".java"]
        cmd = [javac, *_JAVAC_FLAGS, "-d", str(classes)]
        cmd += ["-cp", str(_spark_jars() / "*"), *java]
        done = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if done.returncode != 0:  # e.g. a pyspark whose internals moved: still usable
            log.warning(
                "compiling the Java half of format('sparkmq') failed, so it reads through "
                "Python workers (slower); please report this with pyspark %s:\n%s",
                pyspark.__version__,
                done.stderr,
            )
            return None
        partial = Path(tmp) / jar.name
        with zipfile.ZipFile(partial, "w", zipfile.ZIP_DEFLATED) as out:
            for path in sorted(classes.rglob("*.class")):
                out.write(path, str(path.relative_to(classes)))
            for path in files:
                if "META-INF" in path.parts:
                    out.write(path, str(path.relative_to(SOURCES)))
        os.replace(partial, jar)  # atomic: a concurrent build writes the same bytes
    return str(jar)


def jvm_present(spark: SparkSession) -> bool:
    """Whether this session's driver has the connector's classes (never with Spark Connect,
    whose client has no JVM to call back from)."""
    try:
        jvm = spark.sparkContext._jvm
        assert jvm is not None
        jvm.java.lang.Class.forName(
            _BRIDGE, False, jvm.Thread.currentThread().getContextClassLoader()
        )
    except Exception:
        return False
    return True


def install(spark: SparkSession) -> None:
    """Give the driver's Java provider this process's planners (py4j calls back into it)."""
    from pyspark.java_gateway import ensure_callback_server_started

    gateway = spark.sparkContext._gateway
    ensure_callback_server_started(gateway)
    jvm = spark.sparkContext._jvm
    assert jvm is not None  # (the classic driver's; jvm_present said so)
    jvm.sparkmq.spark.Bridge.set(PlannerFactory())


class PlannerFactory:
    """``sparkmq.spark.PlannerFactory``, called from the driver's JVM."""

    def servesReads(self, options: str) -> bool:  # the Java interface names the methods
        return _served(options) is not None

    def schema(self, options: str) -> str | None:
        opts = _served(options)
        return None if opts is None else dr.source_ddl(opts.include_headers, opts.kafka_columns)

    def create(self, options: str) -> LogPlanner:
        return LogPlanner(json.loads(options))

    def planBatch(self, options: str) -> str:
        opts = json.loads(options)
        reader = BatchReader(SourceOptions.parse(opts))
        split = any(k.lower() == "maxmessagesperpartition" for k in opts)
        return json.dumps(scans(reader.plan, reader.ranges, split=split))

    def pythonSourceName(self) -> str:
        return PYTHON_SOURCE_NAME

    class Java:
        implements = ["sparkmq.spark.PlannerFactory"]


class LogPlanner:
    """``sparkmq.spark.Planner``: the Python stream reader's decisions, as JSON for the JVM."""

    def __init__(self, options: dict[str, Any]) -> None:
        self.reader = StreamReader(SourceOptions.parse(options))
        self._split = any(k.lower() == "maxmessagesperpartition" for k in options)
        self._initial: dict[str, int] | None = None

    def _start(self, start: str | None) -> dict[str, int]:
        if start is not None:
            return json.loads(start)
        if self._initial is None:  # fixed once: "latest" must not move between calls
            self._initial = self.reader.initialOffset()
        return self._initial

    def initialOffset(self) -> str:
        return json.dumps(self._start(None))

    def latestOffset(self, start: str | None, limit: str) -> str:
        return json.dumps(self.reader.latestOffset(self._start(start), _limit(limit)))

    def defaultReadLimit(self) -> str:
        limit = self.reader.getDefaultReadLimit()
        if isinstance(limit, ReadMaxRows):
            return f"rows:{limit.max_rows}"
        if isinstance(limit, ReadMaxBytes):
            return f"bytes:{limit.max_bytes}"
        return "all"

    def reportLatestOffset(self) -> str:
        return json.dumps(self.reader.reportLatestOffset())

    def prepareForTriggerAvailableNow(self) -> None:
        self.reader.prepareForTriggerAvailableNow()

    def plan(self, start: str | None, end: str) -> str:
        """The batch ``(start, end]`` as Parquet scans (:func:`scans`)."""
        ranges = self.reader.ranges(self._start(start), json.loads(end))
        return json.dumps(scans(self.reader.plan, ranges, split=self._split))

    class Java:
        implements = ["sparkmq.spark.Planner"]


def scans(plan: ReadPlanner, ranges: dict[str, tuple[int, int]], *, split: bool) -> list[dict]:
    """``ranges`` as Parquet scans: ``whole`` ones read every row of their files, the others
    only ``start <= offset < end``. Checks for data loss first.

    One scan per destination, split into tasks by Spark as for any Parquet read
    (``spark.sql.files.maxPartitionBytes``); with ``split`` (``maxMessagesPerPartition`` given),
    one scan per task the Python source would run (small files together, a big file split by
    offsets)."""
    root = plan.opts.root
    files = plan.files_of(ranges)  # one listing: a compaction meanwhile cannot split the two
    spans = {
        dest: {uri: (low, high) for uri, low, high, _ in found or ()}
        for dest, found in files.items()
    }
    if split:
        pieces = [r for piece in plan.slices(ranges, files) for r in piece.ranges]
    else:
        plan.check_missing(ranges)
        pieces = [
            (d, *ranges[d], None if f is None else [u for u, *_ in f]) for d, f in files.items()
        ]
    out = []
    for dest, lo, hi, uris in pieces:
        if uris is None:
            raise ConfigError(
                f"the data files of {dest!r} under {root} carry no offset statistics, "
                "which the native reader needs; read it with the Python source: "
                f"format({PYTHON_SOURCE_NAME!r})",
                setting="root",
            )
        inside = [f for f in uris if lo <= spans[dest][f][0] and spans[dest][f][1] < hi]
        cut = [f for f in uris if f not in inside]
        for chosen, whole in ((inside, True), (cut, False)):
            if chosen:
                scan = {"destination": dest, "start": lo, "end": hi, "files": chosen}
                out.append({**scan, "whole": whole})
    return out


def _served(options: str) -> SourceOptions | None:
    """The options of a read of message logs in place the native reader serves, else None."""
    try:
        opts = SourceOptions.parse(json.loads(options))
    except Exception:
        return None  # the Python source reports what is wrong, as it always did
    if opts.through_broker or opts.grouping_partitions is not None:
        return None
    return opts if layout.is_local(opts.root) else None


def _limit(text: str) -> ReadLimit:
    kind, _, value = text.partition(":")
    if kind == "rows":
        return ReadMaxRows(int(value))
    if kind == "bytes":
        return ReadMaxBytes(int(value))
    return ReadAllAvailable()
