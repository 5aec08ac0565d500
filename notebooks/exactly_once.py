# Databricks notebook source
# MAGIC %md
# MAGIC # An exactly-once pipeline: dedup, per-group totals, an idempotent Delta sink
# MAGIC
# MAGIC Payments arrive on a queue; a producer that lost a connection resent some of them with the
# MAGIC **same dedup id**. The broker drops resends within its 5-minute window; the pipeline drops
# MAGIC the ones that come later (here the broker's detection is off, so all of them reach Spark).
# MAGIC The pipeline
# MAGIC
# MAGIC 1. streams the queue's log with `readStream.format("sparkmq")`,
# MAGIC 2. drops duplicates by `dedup_id` in Spark's state store (`drop_duplicate_ids`),
# MAGIC 3. totals each customer (`group_id`) per micro-batch, and
# MAGIC 4. writes to a Delta table with an **app transaction** (query id, batch id), so a batch that
# MAGIC    Spark replays after a failure is not written twice.
# MAGIC
# MAGIC The first run fails on purpose after writing batch 1, before Spark records it; the restart
# MAGIC replays it. The result is the same as if nothing had gone wrong.
# MAGIC
# MAGIC **Cluster**: Databricks Runtime with Spark 4.2 and the RocksDB state store
# MAGIC (`transformWithState`), `%pip install sparkmq`; widgets `url`, `root` (`/Volumes/...` or
# MAGIC `s3://...` for an embedded broker), `secret_scope`; the Delta sink's directory comes from
# MAGIC `SPARKMQ_NOTEBOOK_DIR` (a `/Volumes/...` path on a cluster).

# COMMAND ----------

import os
import tempfile
import time

import pyarrow as pa
from deltalake import CommitProperties, DeltaTable, Transaction, write_deltalake
from deltalake.exceptions import TableNotFoundError

from spark_mq import Admin, Producer
from spark_mq.connectors import register
from spark_mq.connectors.state import drop_duplicate_ids
from spark_mq.notebook import broker, show

mq = broker("sparkmq-exactly-once-", "--set", "duplicates.cache_size=0", namespace=globals())
URL, DATA_DIR, AUTH = mq.url, mq.data_dir, mq.credentials
register(spark)  # noqa: F821 - the notebook's SparkSession
WORK = os.environ.get("SPARKMQ_NOTEBOOK_DIR") or tempfile.mkdtemp(prefix="sparkmq-eo-")
QUEUE = f"payments_{int(time.time())}"
TOTALS = os.path.join(WORK, "totals")  # the Delta table the pipeline writes
CHECKPOINT = os.path.join(WORK, "checkpoint")
print(f"broker {URL}; queue {QUEUE}; output {TOTALS}")

# COMMAND ----------

# MAGIC %md
# MAGIC ## Produce 600 payments, 60 of them twice

# COMMAND ----------

with Admin(URL, **AUTH) as admin:
    admin.create_queue(QUEUE)
payments = [(f"pay-{i}", f"customer-{i % 8}", (i % 50) + 1) for i in range(600)]
with Producer(URL, **AUTH, destination=QUEUE) as producer:
    for pid, customer, amount in payments:
        producer.send(str(amount), dedup_id=pid, group_id=customer)
    for pid, customer, amount in payments[::10]:  # the resend after a lost connection
        producer.send(str(amount), dedup_id=pid, group_id=customer)
expected = {}
for _, customer, amount in payments:
    expected[customer] = expected.get(customer, 0) + amount
# Spark reads Delta, which trails the broker by about half a second
with Admin(URL, **AUTH) as admin:
    while admin.stats(QUEUE)["delta_lag_messages"]:
        time.sleep(0.1)
    print(f"{admin.stats(QUEUE)['end_offset']} messages in the log, 600 distinct payments")

# COMMAND ----------

# MAGIC %md
# MAGIC ## The pipeline
# MAGIC `write_batch` commits each micro-batch with the app transaction `(APP_ID, batch_id)` and
# MAGIC skips a batch whose id the table has already recorded.

# COMMAND ----------

APP_ID = f"sparkmq-notebook-{QUEUE}"
fail_after_batch = {"id": 1}  # the first run dies here, once


def write_batch(batch, batch_id: int) -> None:
    rows = batch.groupBy("group_id").agg({"amount": "sum", "*": "count"}).collect()
    table = pa.table(
        {
            "customer": [r["group_id"] for r in rows],
            "amount": pa.array([int(r["sum(amount)"]) for r in rows], pa.int64()),
            "payments": pa.array([int(r["count(1)"]) for r in rows], pa.int64()),
            "batch_id": pa.array([batch_id] * len(rows), pa.int64()),
        }
    )
    try:
        target = DeltaTable(TOTALS)
    except TableNotFoundError:  # the first batch creates it
        target = TOTALS
    else:
        written = target.transaction_version(APP_ID)
        if written is not None and written >= batch_id:
            print(f"batch {batch_id}: already written, skipped (a replay)")
            return
    write_deltalake(
        target,
        table,
        mode="append",
        commit_properties=CommitProperties(app_transactions=[Transaction(APP_ID, batch_id)]),
    )
    print(f"batch {batch_id}: {sum(table['payments'].to_pylist())} payment(s) written")
    if batch_id == fail_after_batch["id"]:
        fail_after_batch["id"] = None
        raise RuntimeError("simulated crash after the write, before Spark commits the batch")


def run_pipeline():
    payments_stream = (
        spark.readStream.format("sparkmq")  # noqa: F821
        .option("root", DATA_DIR)
        .option("destination", QUEUE)
        .option("maxMessagesPerTrigger", 200)
        .load()
    )
    deduped = drop_duplicate_ids(payments_stream, "10 minutes").selectExpr(
        "group_id", "CAST(CAST(body AS STRING) AS BIGINT) AS amount"
    )
    return (
        deduped.writeStream.foreachBatch(write_batch)
        .option("checkpointLocation", CHECKPOINT)
        .trigger(availableNow=True)
        .start()
    )


# COMMAND ----------

try:
    run_pipeline().awaitTermination()
except Exception as exc:
    print(f"the first run failed as planned: {str(exc).splitlines()[0][:120]}")
run_pipeline().awaitTermination()  # restart from the checkpoint: batch 1 is replayed

# COMMAND ----------

totals = DeltaTable(TOTALS).to_pandas()
by_customer = totals.groupby("customer")[["amount", "payments"]].sum().sort_index()
show(by_customer, globals())
assert by_customer["payments"].sum() == 600, by_customer  # no duplicate, no gap
assert by_customer["amount"].to_dict() == expected, by_customer
print("every payment counted exactly once, across a failure and a replay")

# COMMAND ----------

mq.stop()  # only an embedded broker stops
