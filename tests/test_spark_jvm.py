"""The connector's Java provider: log streams read by Spark's own Parquet reader.

``format("sparkmq")`` is the Java provider when its jar is on the driver's classpath (the test
session's is, via ``local_session``). It must give exactly what the Python source gives, and hand
everything it does not serve to the Python source."""

from __future__ import annotations

import tempfile

import pytest
from chispa import assert_df_equality

from spark_mq import Admin, Producer
from spark_mq.connectors import jvm
from spark_mq.service import RunningBroker

pytestmark = pytest.mark.spark

NATIVE = "SparkMQLogSource"


def stream(spark, fmt: str, name: str, **options: object):
    reader = spark.readStream.format(fmt)
    for key, value in options.items():
        reader = reader.option(key, value)
    query = (
        reader.load()
        .writeStream.format("memory")
        .queryName(name)
        .option("checkpointLocation", tempfile.mkdtemp())
        .trigger(availableNow=True)
        .start()
    )
    assert query.awaitTermination(120), "the availableNow query did not finish in 120 s"
    assert query.exception() is None
    return query


def served_by(query) -> set[str]:
    return {s["description"] for p in query.recentProgress for s in p["sources"]}


@pytest.fixture
def two_logs(broker: RunningBroker) -> str:
    with Admin(broker.url) as admin:
        admin.create_topic("orders")
        admin.create_queue("audit")
    with Producer(broker.url) as producer:
        for start in range(0, 240, 60):  # several commits: several Parquet files each
            producer.send_batch(
                [f"order-{i}" for i in range(start, start + 60)], destination="orders"
            )
            producer.send_batch(
                [f"audit-{i}" for i in range(start, start + 20)], destination="audit"
            )
    assert broker.broker.journal.move(timeout=60)
    return broker.broker.config.broker.data_dir


def test_the_jar_is_built_once_and_serves_format_sparkmq(spark) -> None:
    path = jvm.jar_path()
    assert path is not None and path == jvm.jar_path()  # cached by the sources' digest
    assert jvm.jvm_present(spark)


def test_native_stream_equals_the_python_source_across_cut_and_whole_files(
    spark, two_logs: str
) -> None:
    """Batches of 70 cut files mid-way (those rows are filtered by offset) and take other files
    whole; both destinations, headers, JSON starting offsets: row for row what Python gives."""
    options = {
        "root": two_logs,
        "destination": "orders,audit",
        "startingOffsets": '{"orders": 5, "audit": -2}',
        "maxMessagesPerTrigger": 70,
    }
    native = stream(spark, "sparkmq", "native_rows", **options)
    python = stream(spark, jvm.PYTHON_SOURCE_NAME, "python_rows", **options)
    assert served_by(native) == {NATIVE}
    assert NATIVE not in served_by(python)
    sizes = [p["numInputRows"] for p in native.recentProgress if p["numInputRows"]]
    assert sum(sizes) == 235 + 80 and max(sizes) <= 70  # admission control, counted exactly
    assert sizes == [p["numInputRows"] for p in python.recentProgress if p["numInputRows"]]
    got = spark.table("native_rows").orderBy("destination", "offset")
    want = spark.table("python_rows").orderBy("destination", "offset")
    assert_df_equality(got, want)
    assert got.where("destination = 'orders'").first()["offset"] == 5


def test_what_the_native_stream_does_not_serve_goes_to_the_python_source(
    spark, two_logs: str
) -> None:
    grouped = stream(
        spark, "sparkmq", "grouped", root=two_logs, destination="orders", groupingPartitions=2
    )
    assert NATIVE not in served_by(grouped)
    assert spark.table("grouped").count() == 240  # the sink is Python's too (test_spark_sink)


def test_native_batch_read_equals_the_python_source(spark, two_logs: str) -> None:
    def read(fmt: str, **options: object):
        reader = spark.read.format(fmt).option("root", two_logs)
        for key, value in options.items():
            reader = reader.option(key, value)
        return reader.load()

    window = {
        "destination": "orders,audit",
        "startingOffsets": '{"orders": 10, "audit": -2}',
        "endingOffsets": '{"orders": 130, "audit": -1}',
    }
    native, python = read("sparkmq", **window), read(jvm.PYTHON_SOURCE_NAME, **window)
    assert "PlannedRelation" in native._jdf.queryExecution().optimizedPlan().toString()
    assert "sparkmq_python" in python._jdf.queryExecution().optimizedPlan().toString()
    order = ["destination", "offset"]  # chispa cannot sort by the headers map
    assert_df_equality(native.orderBy(order), python.orderBy(order))
    assert native.where("destination = 'orders'").count() == 120  # offsets 10 .. 129
    assert read("sparkmq", destination="audit", includeHeaders="false").count() == 80


def test_a_bad_option_is_still_named_by_the_python_source(spark, two_logs: str) -> None:
    with pytest.raises(Exception, match="maxMessagesPerTrigger"):
        stream(
            spark, "sparkmq", "bad", root=two_logs, destination="orders", maxMessagesPerTrigger=0
        )


def test_the_jar_registers_the_provider_and_a_broken_build_falls_back(
    tmp_path, monkeypatch, caplog
) -> None:
    import zipfile

    with zipfile.ZipFile(jvm.jar_path()) as jar:
        names = jar.namelist()
        service = jar.read("META-INF/services/org.apache.spark.sql.sources.DataSourceRegister")
    assert service.decode().strip() == "sparkmq.spark.SparkmqProvider"
    assert "sparkmq/spark/LogSource.class" in names
    # sources that do not compile (a pyspark whose internals moved) leave the Python source
    broken = tmp_path / "java"
    (broken / "sparkmq").mkdir(parents=True)
    (broken / "sparkmq" / "Broken.java").write_text("class Broken { nope }")
    monkeypatch.setattr(jvm, "SOURCES", broken)
    monkeypatch.setenv("SPARKMQ_CACHE", str(tmp_path / "cache"))
    assert jvm.jar_path() is None
    assert "compiling the Java half" in caplog.text
    monkeypatch.setattr(jvm, "_javac", lambda: None)  # and so does a machine without a JDK
    assert jvm.jar_path() is None
    assert "no javac" in caplog.text
    assert not list((tmp_path / "cache").glob("*.jar"))


def test_a_checkpoint_of_the_python_source_resumes_on_the_native_one(
    spark, broker: RunningBroker
) -> None:
    """Upgrading: both keep the same offsets ({"destination": next offset}), so a query
    checkpointed by the Python source goes on natively without a gap or a repeat."""
    root = broker.broker.config.broker.data_dir
    with Admin(broker.url) as admin:
        admin.create_queue("q")
    checkpoint = tempfile.mkdtemp()

    def run(fmt: str) -> list[int]:
        seen: list[int] = []
        query = (
            spark.readStream.format(fmt)
            .option("root", root)
            .option("destination", "q")
            .load()
            .writeStream.foreachBatch(
                lambda df, _i: seen.extend(r.offset for r in df.select("offset").collect())
            )
            .option("checkpointLocation", checkpoint)
            .trigger(availableNow=True)
            .start()
        )
        assert query.awaitTermination(120), "the availableNow query did not finish in 120 s"
        assert query.exception() is None
        return sorted(seen)

    with Producer(broker.url, destination="q") as producer:
        producer.send_batch([f"a{i}" for i in range(30)])
        assert broker.broker.journal.move(timeout=60)
        assert run(jvm.PYTHON_SOURCE_NAME) == list(range(30))
        producer.send_batch([f"b{i}" for i in range(20)])
    assert broker.broker.journal.move(timeout=60)
    assert run("sparkmq") == list(range(30, 50))
