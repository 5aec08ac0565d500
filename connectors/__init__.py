"""The Spark connector: ``spark.readStream.format("sparkmq")`` and ``spark.read.format("sparkmq")``.

Call :func:`register` once per SparkSession.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


def register(spark: SparkSession) -> None:
    """Make ``format("sparkmq")`` available in ``spark``."""
    from spark_mq.connectors.source import SparkMQDataSource

    spark.dataSource.register(SparkMQDataSource)


def local_session(app_name: str = "sparkmq"):
    """A local[2] SparkSession with ``format("sparkmq")`` registered (demo, tests, notebooks)."""
    import os
    import sys

    from pyspark.sql import SparkSession

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    session = (
        SparkSession.builder.master("local[2]")
        .appName(app_name)
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


__all__ = ["local_session", "read_log", "register"]
