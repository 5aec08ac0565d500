"""The Spark sink and the broker-consuming source against a broker with security on: they
present their options' credentials; a refusal fails the query saying what and why, with the
password nowhere in the error or the plan, and changes nothing; a permitted user's query works.
"""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from spark_mq import Admin, Producer
from spark_mq.clock import ManualClock
from spark_mq.service import RunningBroker
from tests.conftest import start_inprocess, wait_for
from tests.security_kit import PASSWORDS, security_settings

pytestmark = pytest.mark.spark

ALICE = {"username": "alice", "password": PASSWORDS["alice"]}
BOB = {"username": "bob", "password": PASSWORDS["bob"]}
WRONG = {"username": "alice", "password": "Wrong-Horse-Battery"}


@pytest.fixture(scope="module")
def secure(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningBroker]:
    d = tmp_path_factory.mktemp("spark-secure")
    running = start_inprocess(d / "data", ManualClock(), **security_settings(d))
    with Admin(running.url, **ALICE) as admin:
        admin.create_queue("orders")
    with Producer(running.url, destination="orders", **ALICE) as producer:
        producer.send_batch([b"order %d" % n for n in range(20)])
    try:
        yield running
    finally:
        running.stop()


def _depth(broker: RunningBroker) -> tuple[int, int]:
    with Admin(broker.url, **ALICE) as admin:
        st = admin.stats("orders")
        return st["end_offset"], st["acked"]


def _write(spark, broker: RunningBroker, creds: dict[str, str], rows: int = 3) -> None:
    df = spark.createDataFrame([(f"spark {n}",) for n in range(rows)], "body string")
    w = df.write.format("sparkmq").mode("append").option("url", broker.url)
    for k, v in {"destination": "orders", **creds}.items():
        w = w.option(k, v)
    w.save()


def _secrets_absent(text: str) -> None:
    for secret in (*PASSWORDS.values(), WRONG["password"]):
        assert secret not in text


@pytest.mark.parametrize(
    ("creds", "refusal"),
    [
        ({}, "requires credentials"),
        (WRONG, "wrong user name or password"),
        (BOB, "'bob' may not produce on 'orders'"),
    ],
)
def test_the_sink_is_refused_without_the_right_credentials(
    spark, secure: RunningBroker, creds: dict[str, str], refusal: str
) -> None:
    before = _depth(secure)
    with pytest.raises(Exception) as caught:
        _write(spark, secure, creds)
    assert refusal in str(caught.value)
    _secrets_absent(str(caught.value))
    assert _depth(secure) == before


def test_the_sink_writes_for_a_permitted_user(spark, secure: RunningBroker) -> None:
    before, _ = _depth(secure)
    _write(spark, secure, ALICE, rows=4)
    assert _depth(secure)[0] == before + 4


def _consume(spark, broker: RunningBroker, creds: dict[str, str], on_batch, checkpoint: str):
    reader = (
        spark.readStream.format("sparkmq")
        .option("url", broker.url)
        .option("consumer", "etl")
        .option("destination", "orders")
        .option("maxMessagesPerTrigger", 5)
    )
    for k, v in creds.items():
        reader = reader.option(k, v)
    df = reader.load()
    return df, (
        df.writeStream.foreachBatch(on_batch)
        .option("checkpointLocation", checkpoint)
        .trigger(processingTime="0 seconds")
        .start()
    )


@pytest.mark.parametrize(
    ("creds", "refusal"),
    [
        (WRONG, "wrong user name or password"),
        (BOB, "'bob' may not consume on 'orders'"),
    ],
)
def test_the_broker_source_is_refused_without_the_right_credentials(
    spark, secure: RunningBroker, creds: dict[str, str], refusal: str
) -> None:
    before = _depth(secure)
    _, query = _consume(spark, secure, creds, lambda df, n: df.count(), tempfile.mkdtemp())
    with pytest.raises(Exception) as caught:
        query.awaitTermination(120)
    assert refusal in str(caught.value)
    _secrets_absent(str(caught.value))
    assert _depth(secure) == before


def test_the_broker_source_reads_for_a_permitted_user_and_keeps_the_password_out_of_plans(
    spark, secure: RunningBroker
) -> None:
    seen: list[str] = []
    plans: list[str] = []

    def on_batch(df, batch_id: int) -> None:
        plans.append(df._jdf.queryExecution().toString())
        seen.extend(r.body.decode() for r in df.select("body").collect())

    df, query = _consume(spark, secure, ALICE, on_batch, tempfile.mkdtemp())
    try:
        wait_for(lambda: len(seen) >= 5, timeout=120, what="a micro-batch")
    finally:
        query.stop()
    assert seen[0].startswith("order") or seen[0].startswith("spark")
    plan = df._jdf.queryExecution().toString()
    progress = str(query.recentProgress)
    assert plans and "password=*********(redacted)" in plan  # named, its value hidden
    for text in (plan, progress, *plans):
        _secrets_absent(text)


def test_sink_plans_keep_the_password_out(spark, secure: RunningBroker, tmp_path: Path) -> None:
    """A streaming write's description and progress name the sink, not its password."""
    source = tmp_path / "in"
    source.mkdir()
    (source / "a.txt").write_text("one\ntwo\n")
    stream = spark.readStream.format("text").load(str(source))
    w = stream.withColumnRenamed("value", "body").writeStream.format("sparkmq")
    for k, v in {"url": secure.url, "destination": "orders", **ALICE}.items():
        w = w.option(k, v)
    before, _ = _depth(secure)
    query = w.option("checkpointLocation", str(tmp_path / "cp")).start()
    try:
        query.processAllAvailable()
        text = str(query.recentProgress) + query._jsq.toString()
        explained = query._jsq.explainInternal(True)
    finally:
        query.stop()
    assert _depth(secure)[0] == before + 2
    assert "sparkmq" in (text + explained).lower()
    _secrets_absent(text + explained)
