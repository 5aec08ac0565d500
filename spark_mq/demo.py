"""``sparkmq demo``: the whole flow on local embedded defaults, narrated.

Starts a broker process, produces to a queue and a topic with the SDK, consumes part of the
queue with acks, then runs a Spark Structured Streaming query over the topic's Delta log.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from pathlib import Path

import click

from spark_mq import Admin, Consumer, Producer
from spark_mq.launch import BrokerProcess


def step(text: str) -> None:
    click.secho(f"\n==> {text}", fg="cyan", bold=True)


def run_demo(data_dir: str, messages: int) -> None:
    data = Path(data_dir).resolve()
    if data.exists():
        shutil.rmtree(data)
    data.mkdir(parents=True)
    log_file = data / "broker-console.log"

    step(f"Starting a broker (data under {data}, log in {log_file})")
    broker = BrokerProcess(str(data), log_file=str(log_file)).start()
    click.echo(f"    broker listening on {broker.url}; metrics and console on {broker.http_url}")
    try:
        _messaging(broker.url, messages)
        step("Stopping the broker with SIGTERM (it first moves what its hot tier holds into Delta)")
        code = broker.stop()
        click.echo(f"    broker exited with code {code}")
        _spark(str(data), messages)
    finally:
        broker.stop()
    step("Done")
    click.echo(
        f"    The Delta tables are in {data}/destinations/<name>/messages — any Delta reader"
    )
    click.echo("    (delta-rs, Spark with delta-spark, Databricks) can open them.")


def _messaging(url: str, n: int) -> None:
    step("Creating queue 'orders', topic 'events' and its durable subscription 'audit'")
    with Admin(url) as admin:
        admin.create_queue("orders")
        admin.create_topic("events")
        admin.create_subscription("events", "audit")

    step(f"Producing {n} messages to each with the Producer SDK (batched, acked once durable)")
    with Producer(url) as producer:
        started = time.perf_counter()
        futures = [
            producer.send(
                f'{{"order": {i}, "amount": {i % 97}}}',
                destination="orders",
                group_id=f"customer-{i % 10}",
                headers={"source": "demo"},
            )
            for i in range(n)
        ]
        futures += [
            producer.send(
                f"event {i}",
                destination="events",
                headers={"kind": ("click", "view", "buy")[i % 3]},
            )
            for i in range(n)
        ]
        producer.flush()
        offsets = [f.result() for f in futures]
        took = time.perf_counter() - started
    click.echo(
        f"    {len(offsets)} messages durable in {took:.2f}s ({len(offsets) / took:,.0f} msg/s); "
        f"last offsets: orders={offsets[n - 1]}, events={offsets[-1]}"
    )

    part = n * 2 // 5
    step(f"Consuming {part} of the queue's messages and acking each")
    with Consumer(url, "orders", prefetch=500) as consumer:
        got = 0
        acks = []
        while got < part:
            batch = consumer.receive_many(min(500, part - got), timeout=10)
            if not batch:
                raise click.ClickException("the queue stopped delivering")
            acks.append(consumer.ack(batch))
            got += len(batch)
        for a in acks:
            a.result()
        click.echo(
            f"    received and acked {got}; first: {batch[0].text!r} (offset {batch[0].offset})"
        )
    with Admin(url) as admin:
        s = admin.stats("orders")
    click.echo(
        f"    queue 'orders': {s['acked']} acked, depth {s['depth']} still waiting "
        f"(the {s['redelivered']} messages prefetched but not acked were released for redelivery)"
    )
    click.echo(
        f"    Delta (what Spark reads) has 'orders' up to offset {s.get('delta_end_offset')} of "
        f"{s['end_offset']}: the hot tier moves new messages there within about half a second"
    )

    step("Reading 10 messages from the topic through subscription 'audit', acking them")
    with Consumer(url, "events", subscription="audit") as sub:
        msgs = sub.receive_many(10, timeout=10)
        sub.ack(msgs).result()
        click.echo(f"    {[m.text for m in msgs[:3]]} ...")


def _spark(data: str, n: int) -> None:
    step("Starting Spark (local[2]) and streaming topic 'events' with readStream.format('sparkmq')")
    if shutil.which("java") is None and not os.environ.get("JAVA_HOME"):
        raise click.ClickException(
            "Spark needs Java 17: install it (e.g. apt-get install openjdk-17-jre-headless)"
        )
    from pyspark.sql import functions as F

    from spark_mq.connectors import local_session

    spark = local_session("sparkmq-demo")
    try:
        stream = (
            spark.readStream.format("sparkmq")
            .option("root", data)
            .option("destination", "events")
            .option("maxMessagesPerTrigger", max(n // 4, 1))
            .load()
        )
        seen: list[int] = []

        def show(batch_df, batch_id: int) -> None:
            count = batch_df.count()
            seen.append(count)
            click.echo(f"    micro-batch {batch_id}: {count} messages")

        checkpoint = tempfile.mkdtemp(prefix="sparkmq-demo-ckpt-")
        query = (
            stream.writeStream.foreachBatch(show)
            .option("checkpointLocation", checkpoint)
            .trigger(availableNow=True)
            .start()
        )
        query.awaitTermination()
        click.echo(
            f"    the stream read {sum(seen)} messages in {len(seen)} micro-batches "
            "(admission control: maxMessagesPerTrigger)"
        )
        step("What Spark sees: messages per 'kind' header (a batch read of the same log)")
        (
            spark.read.format("sparkmq")
            .option("root", data)
            .option("destination", "events")
            .load()
            .groupBy(F.col("headers")["kind"].alias("kind"))
            .count()
            .orderBy("kind")
            .show()
        )
    finally:
        spark.stop()
