"""format("sparkmq") and the compaction job over Spark Connect (what Databricks serverless and
shared clusters give a notebook: no ``sparkContext``), against a local Spark Connect server
that pyspark starts (``remote("local[2]")``) in a process of its own, so it does not meet the
suite's classic session: a batch read, a streaming query from one destination into another
through the sink, and compaction fanned out as Spark tasks."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from spark_mq import Admin, Producer
from spark_mq.launch import BrokerProcess

pytestmark = pytest.mark.process

SCRIPT = textwrap.dedent(
    """
    import json, os, sys
    from pyspark.sql import SparkSession
    from spark_mq.connectors.source import SparkMQDataSource
    from spark_mq.jobs.compaction import CompactionPolicy, compact_all

    root, url, checkpoint = sys.argv[1:4]
    spark = SparkSession.builder.remote("local[2]").getOrCreate()
    assert type(spark).__module__.startswith("pyspark.sql.connect"), type(spark)
    spark.dataSource.register(SparkMQDataSource)
    out = {}
    read = spark.read.format("sparkmq").option("root", root).option("subscribe", "in").load()
    out["batch"] = sorted(bytes(r.body).decode() for r in read.collect())
    query = (
        spark.readStream.format("sparkmq").option("root", root).option("destination", "in")
        .option("maxOffsetsPerTrigger", 4).load()
        .selectExpr("body AS value", "group_id AS key")
        .writeStream.format("sparkmq").option("url", url).option("topic", "out")
        .option("checkpointLocation", checkpoint).trigger(availableNow=True).start()
    )
    query.awaitTermination(180)
    out["stream_error"] = str(query.exception()) if query.exception() else None
    out["stream_batches"] = len(query.recentProgress)
    print("RESULT " + json.dumps(out), flush=True)
    input()  # the test stops the broker, for the compaction to run on a quiet root
    results = compact_all(root, CompactionPolicy(force=True, keep_recent_s=0), spark=spark)
    print("COMPACTED " + json.dumps([(r.destination, r.action) for r in results]), flush=True)
    spark.stop()
    """
)


def test_source_sink_and_compaction_over_spark_connect(tmp_path: Path) -> None:
    data = tmp_path / "data"
    with BrokerProcess(str(data)) as broker:
        with Admin(broker.url) as admin:
            admin.create_queue("in")
            admin.create_queue("out")
        with Producer(broker.url, destination="in") as p:
            for i in range(10):
                p.send(f"m{i}", group_id=f"g{i % 2}")
            p.flush()
    broker = BrokerProcess(str(data)).start()  # (the stop moved the hot tier into Delta)
    script = tmp_path / "connect_job.py"
    script.write_text(SCRIPT)
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable}
    job = subprocess.Popen(
        [sys.executable, str(script), str(data), broker.url, str(tmp_path / "checkpoint")],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
        env=env, cwd=tmp_path,
    )  # fmt: skip
    try:
        assert job.stdout is not None and job.stdin is not None
        lines = iter(job.stdout.readline, "")
        result = next(json.loads(line[7:]) for line in lines if line.startswith("RESULT "))
        assert result["batch"] == [f"m{i}" for i in range(10)]
        assert result["stream_error"] is None
        assert result["stream_batches"] >= 3  # ten messages, four a trigger
        with Admin(broker.url) as admin:
            rows = admin.browse("out", limit=20).to_pylist()
        assert sorted(r["body"] for r in rows) == sorted(f"m{i}".encode() for i in range(10))
        assert {r["group_id"] for r in rows} == {"g0", "g1"}
        assert broker.stop() == 0
        job.stdin.write("\n")
        job.stdin.flush()
        done = next(json.loads(line[10:]) for line in lines if line.startswith("COMPACTED "))
        assert dict(map(tuple, done)) == {"in": "compacted", "out": "compacted"}
        assert job.wait(120) == 0
    finally:
        broker.stop()
        if job.poll() is None:
            job.kill()
