# Databricks notebook source
# MAGIC %md
# MAGIC # sparkmq operations
# MAGIC
# MAGIC What an operator looks at: how deep each destination is, how far consumers and Delta
# MAGIC trail, how much is redelivered, what sits in dead-letter queues, and what compaction did.
# MAGIC Connects to the broker in the `url` widget (`SPARKMQ_URL` locally), or starts an embedded
# MAGIC broker and gives it some traffic so there is something to see.
# MAGIC
# MAGIC **Cluster**: Databricks Runtime with Spark 4.2, `%pip install sparkmq matplotlib`; widgets
# MAGIC `url`, `root` (the broker's `data_dir` as this cluster sees it: `/Volumes/...` or
# MAGIC `s3://...` for an embedded broker), `secret_scope` (credentials, with security on).

# COMMAND ----------

import time

import matplotlib

matplotlib.use("Agg")  # no screen needed; Databricks renders the figures with display()
import matplotlib.pyplot as plt
import pandas as pd
from deltalake import DeltaTable

from spark_mq import Admin, Consumer, Producer
from spark_mq.connectors import register
from spark_mq.jobs.compaction import CompactionPolicy, compact_all
from spark_mq.jobs.report import summary_table
from spark_mq.journal import layout
from spark_mq.notebook import broker, show

mq = broker("sparkmq-operations-", namespace=globals())
URL, DATA_DIR, AUTH = mq.url, mq.data_dir, mq.credentials
register(spark)  # noqa: F821 - the notebook's SparkSession
print(f"broker: {URL}\ndata:   {DATA_DIR}")

# COMMAND ----------

# MAGIC %md
# MAGIC ## Sample traffic (embedded broker only)
# MAGIC A queue where a consumer acks most messages and gives some back (they are redelivered),
# MAGIC and a topic whose `reports` subscription has fallen behind.

# COMMAND ----------

if mq.embedded is not None:
    with Admin(URL, **AUTH) as admin:
        admin.create_queue("orders")
        admin.create_topic("events")
        admin.create_subscription("events", "billing")
        admin.create_subscription("events", "reports")
    with Producer(URL, **AUTH) as producer:
        producer.send_batch([f"order {i}" for i in range(3000)], destination="orders")
        producer.send_batch([f"event {i}" for i in range(500)], destination="events")
    with Consumer(URL, "orders", prefetch=500, **AUTH) as consumer:
        acked: set[int] = set()  # ack the first 2,500 except every tenth, which goes back
        while len(acked) < 2250:
            batch = consumer.receive_many(250, timeout=10)
            good = [m for m in batch if m.offset < 2500 and m.offset % 10]
            consumer.ack(good).result(timeout=30)
            consumer.nack([m for m in batch if m not in good]).result(timeout=30)
            acked.update(m.offset for m in good)
    with Consumer(URL, "events", subscription="billing", prefetch=500, **AUTH) as consumer:
        got = []
        while len(got) < 500:
            got += consumer.receive_many(500 - len(got), timeout=10)
        consumer.ack(got).result(timeout=30)
    # compaction reads Delta: let the hot tier move the acks there
    with Admin(URL, **AUTH) as admin:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and any(
            d.get("hot_tier_bytes") for d in admin.list_destinations()
        ):
            time.sleep(0.1)

# COMMAND ----------

# MAGIC %md
# MAGIC ## Depth, lag and redeliveries
# MAGIC `depth`: messages not yet settled; `consumer_lag`: not yet delivered; `delta_lag_ms`:
# MAGIC how far Delta (what Spark and the jobs read) trails the broker; `redelivered`: deliveries
# MAGIC after a nack or a lapsed lease.

# COMMAND ----------

rows = []
with Admin(URL, **AUTH) as admin:
    for d in admin.list_destinations():
        subs = d.get("subscriptions") or {"": d}
        for sub, s in subs.items():
            rows.append(
                {
                    "destination": d["name"],
                    "kind": d["kind"],
                    "subscription": sub or "(queue)",
                    "end_offset": d["end_offset"],
                    "depth": s["depth"],
                    "consumer_lag": s["waiting"],
                    "in_flight": s["in_flight"],
                    "acked": s["acked"],
                    "redelivered": s["redelivered"],
                    "delta_lag_ms": d.get("delta_lag_ms", 0),
                }
            )
status = pd.DataFrame(rows)
show(spark.createDataFrame(status), globals())  # noqa: F821

fig, (left, right) = plt.subplots(1, 2, figsize=(11, 3.5))
labels = status["destination"] + "/" + status["subscription"]
left.barh(labels, status["depth"], color="tab:blue")
left.set_title("depth (unsettled messages)")
right.barh(labels, status["redelivered"], color="tab:orange")
right.set_title("redelivered")
fig.tight_layout()
show(fig, globals())

# COMMAND ----------

# MAGIC %md
# MAGIC ## Dead-letter queues
# MAGIC Dead-letter queues are named `DLQ.<queue>`; Spark reads their Delta logs like any other
# MAGIC destination (with the reason each message was dead-lettered in its headers).

# COMMAND ----------

dlqs = [n for n in status["destination"].unique() if n.startswith("DLQ.")]
if not dlqs:
    print("no dead-letter queues")
for name in dlqs:
    dead = spark.read.format("sparkmq").load(DATA_DIR, destination=name)  # noqa: F821
    show(dead.selectExpr("offset", "CAST(body AS STRING) AS body", "headers"), globals())

# COMMAND ----------

# MAGIC %md
# MAGIC ## Compaction: what it would do now, and what it did
# MAGIC A dry run shows the plan per destination; each log's Delta history shows past runs.

# COMMAND ----------

plan = compact_all(DATA_DIR, CompactionPolicy(force=True), dry_run=True)
print(summary_table(plan))
if mq.embedded is not None:  # show a real run on the sample data
    # keep_recent_s=0: the sample traffic is seconds old, and compaction leaves rows younger
    # than 5 minutes alone by default (the broker's duplicate cache is rebuilt from them)
    sample = CompactionPolicy(force=True, keep_recent_s=0)
    print(summary_table(compact_all(DATA_DIR, sample)))

history = []
for name in status["destination"].unique():
    for h in DeltaTable(layout.messages_uri(DATA_DIR, name)).history():
        if h.get("operation") in ("DELETE", "OPTIMIZE"):
            metrics = h.get("operationMetrics") or {}
            history.append(
                {
                    "destination": name,
                    "version": h["version"],
                    "time": pd.to_datetime(h["timestamp"], unit="ms", utc=True),
                    "operation": h["operation"],
                    "rows_removed": int(metrics.get("num_deleted_rows", 0) or 0),
                }
            )
compactions = pd.DataFrame(
    history, columns=["destination", "version", "time", "operation", "rows_removed"]
)
show(compactions, globals())
if len(compactions):
    fig, ax = plt.subplots(figsize=(7, 3))
    removed = compactions.groupby("destination")["rows_removed"].sum()
    ax.bar(removed.index, removed.values, color="tab:green")
    ax.set_title("rows removed by compaction")
    show(fig, globals())

# COMMAND ----------

if mq.embedded is not None:  # the sample traffic must show up as described above
    orders = status.set_index("subscription").loc["(queue)"]
    assert orders["depth"] == 750 and orders["redelivered"] > 0, orders
    reports = status[status["subscription"] == "reports"].iloc[0]
    assert reports["depth"] == reports["consumer_lag"] == 500, reports
    # the queue's acked rows go; the topic's stay, since 'reports' has settled none of them
    assert compactions["rows_removed"].sum() == 2250, compactions
    assert not dlqs

# COMMAND ----------

mq.stop()  # only an embedded broker stops
