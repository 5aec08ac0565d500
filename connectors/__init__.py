"""The Spark connector: ``spark.readStream.format("sparkmq")`` and ``spark.read.format("sparkmq")``.

Call :func:`register` once per SparkSession.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from spark_mq.errors import ConfigError

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

SPARK_REQUIREMENT = "pyspark>=4.2,<4.3"  # (pyproject's [spark] extra)


def require_spark(minimum: tuple[int, int] = (4, 2)) -> None:
    """Raise a ``ConfigError`` saying how to get Spark when pyspark is not installed (the SDK
    and the broker install without it), or is older than ``minimum``."""
    try:
        import pyspark
    except ImportError:
        raise ConfigError(
            "this needs Spark, which `pip install sparkmq` leaves out: pip install "
            f"'sparkmq[spark]' ({SPARK_REQUIREMENT}), or run it where a runtime brings Spark "
            "4.2 (Databricks, EMR)",
            setting="pyspark",
        ) from None
    major, minor = (int(p) for p in pyspark.__version__.split(".")[:2])
    if (major, minor) < minimum:
        raise ConfigError(
            f"this needs Spark {minimum[0]}.{minimum[1]} or newer (format('sparkmq'): 4.2, for "
            f"admission control of Python streaming sources); this is pyspark "
            f"{pyspark.__version__}",
            setting="pyspark",
        )


def register(spark: SparkSession) -> None:
    """Make ``format("sparkmq")`` available in ``spark``.

    With the connector's jar on the driver's classpath (:func:`jar_path`; ``local_session``
    puts it there), log streams are read by Spark's own Parquet reader (``connectors/jvm.py``);
    without it, by the Python data source alone."""
    require_spark()
    from spark_mq.connectors import jvm
    from spark_mq.connectors.source import PythonSideSource, SparkMQDataSource

    if jvm.jvm_present(spark):
        spark.dataSource.register(PythonSideSource)
        jvm.install(spark)
    else:
        logging.getLogger(__name__).info(
            "format('sparkmq') reads through Python workers: for Spark's own Parquet reader, "
            "start the session with spark.driver.extraClassPath=jar_path() (spark.jars on a "
            "cluster)"
        )
        spark.dataSource.register(SparkMQDataSource)


def jar_path() -> str | None:
    """The connector's jar (compiled on first use with the JDK's javac), or None without one."""
    from spark_mq.connectors.jvm import jar_path as path

    return path()


def local_session(app_name: str = "sparkmq"):
    """A local[2] SparkSession with ``format("sparkmq")`` registered (demo, tests, notebooks)."""
    import os
    import sys

    require_spark()
    from pyspark.sql import SparkSession

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    builder = SparkSession.builder.master("local[2]")
    jar = jar_path()
    if jar is not None:
        builder = builder.config("spark.driver.extraClassPath", jar)
    session = (
        builder.appName(app_name)
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.sql.session.timeZone", "UTC")
        # streaming state in RocksDB (ships with pyspark; transformWithState needs it)
        .config(
            "spark.sql.streaming.stateStore.providerClass",
            "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider",
        )
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    register(session)
    return session


def read_log(spark: SparkSession, root: str, destination: str, **kwargs):
    """A batch DataFrame of a message log through Spark's native Parquet reader
    (:func:`spark_mq.connectors.native_read.read_log`)."""
    from spark_mq.connectors.native_read import read_log as read

    return read(spark, root, destination, **kwargs)


__all__ = ["jar_path", "local_session", "read_log", "register", "require_spark"]
