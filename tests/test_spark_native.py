"""``read_log``: batch reads through Spark's native Parquet reader, same rows as
``spark.read.format("sparkmq")``."""

from __future__ import annotations

import pytest
from chispa import assert_df_equality

from spark_mq import Admin, ConfigError, Producer
from spark_mq.connectors import read_log
from spark_mq.service import RunningBroker

pytestmark = pytest.mark.spark


def test_read_log_equals_the_data_source(spark, broker: RunningBroker) -> None:
    root = broker.broker.config.broker.data_dir
    with Admin(broker.url) as admin:
        admin.create_queue("q")
    with Producer(broker.url, destination="q") as producer:
        for i in range(40):
            producer.send(
                b"m%d" % i,
                headers={"i": str(i)},
                group_id=f"g{i % 3}" if i % 2 else None,
                priority=i % 10,
                ttl_s=600 if i % 5 == 0 else None,
                delay_s=1 if i == 7 else None,
            )
    assert broker.broker.journal.move(timeout=60)
    ours = spark.read.format("sparkmq").option("root", root).option("destination", "q").load()
    native = read_log(spark, root, "q")
    assert native.count() == 40
    assert_df_equality(
        native.drop("headers"), ours.drop("headers"), ignore_row_order=True, ignore_nullable=True
    )
    assert native.where("offset = 3").first().headers == {"i": "3"}
    window = read_log(spark, root, "q", start=10, end=15, include_headers=False)
    assert sorted(r.offset for r in window.collect()) == list(range(10, 15))
    assert "headers" not in window.columns


def test_read_log_refuses_what_it_cannot_read(spark, tmp_path) -> None:
    with pytest.raises(ConfigError, match="format\\('sparkmq'\\)"):
        read_log(spark, "s3://bucket/data", "q")
