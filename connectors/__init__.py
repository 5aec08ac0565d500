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


__all__ = ["register"]
