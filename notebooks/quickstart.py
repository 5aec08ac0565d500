# Databricks notebook source
# MAGIC %md
# MAGIC # sparkmq quickstart
# MAGIC
# MAGIC Connect to a broker (or start one here), produce messages with the Python SDK, and read
# MAGIC the topic back with `spark.readStream.format("sparkmq")`.
# MAGIC
# MAGIC **Cluster**: Databricks Runtime with Spark 4.2 (classic, single user or shared), the
# MAGIC `sparkmq` wheel installed (`%pip install sparkmq`). Widgets: `url` (a running broker;
# MAGIC empty: an embedded one on the driver), `root` (its `data_dir` as this cluster sees it; for
# MAGIC an embedded broker a path every node reaches: `/Volumes/...` or `s3://...`),
# MAGIC `secret_scope` (a scope holding `username` and `password`, or `token`, when the broker's
# MAGIC security is on).
# MAGIC
# MAGIC **Locally** the widgets are `SPARKMQ_URL`, `SPARKMQ_DATA_DIR` and `SPARKMQ_USERNAME` /
# MAGIC `SPARKMQ_PASSWORD` in the environment, an embedded broker in a temporary directory when
# MAGIC they are unset; `scripts/test.sh` runs this notebook end to end.

# COMMAND ----------

import time

from spark_mq import Admin, Producer
from spark_mq.connectors import register
from spark_mq.notebook import broker, show

# the url / root widgets (SPARKMQ_URL / SPARKMQ_DATA_DIR here), or an embedded broker
mq = broker("sparkmq-quickstart-", namespace=globals())
URL, DATA_DIR, AUTH = mq.url, mq.data_dir, mq.credentials
print(f"broker: {URL}\ndata:   {DATA_DIR}")

# COMMAND ----------

# MAGIC %md
# MAGIC ## Produce
# MAGIC A topic keeps every message for every subscription; Spark reads its log directly.

# COMMAND ----------

TOPIC = f"clicks_{int(time.time())}"
with Admin(URL, **AUTH) as admin:
    admin.create_topic(TOPIC)
with Producer(URL, **AUTH, destination=TOPIC) as producer:
    offsets = producer.send_batch(
        [f'{{"user": {i % 7}, "page": "/p/{i % 13}"}}' for i in range(1000)]
    )
print(f"produced offsets {offsets[0]}..{offsets[-1]} to {TOPIC}")

# COMMAND ----------

# MAGIC %md
# MAGIC ## Wait for Delta
# MAGIC The broker acknowledges from its hot tier and moves to Delta about every half second;
# MAGIC `delta_lag_messages` says how far Delta (what Spark reads) is behind.

# COMMAND ----------

with Admin(URL, **AUTH) as admin:
    deadline = time.monotonic() + 60
    while admin.stats(TOPIC)["delta_lag_messages"] and time.monotonic() < deadline:
        time.sleep(0.1)
    print({k: v for k, v in admin.stats(TOPIC).items() if k.startswith("delta")})

# COMMAND ----------

# MAGIC %md
# MAGIC ## Read it as a stream

# COMMAND ----------

register(spark)  # noqa: F821 - the notebook's SparkSession
stream = (
    spark.readStream.format("sparkmq")  # noqa: F821
    .option("root", DATA_DIR)
    .option("destination", TOPIC)
    .option("startingOffsets", "earliest")
    .option("maxMessagesPerTrigger", 400)
    .load()
)
query = (
    stream.selectExpr("offset", "CAST(body AS STRING) AS json")
    .writeStream.format("memory")
    .queryName(f"{TOPIC}_seen")
    .trigger(availableNow=True)
    .start()
)
query.awaitTermination()
pages = spark.sql(  # noqa: F821
    f"SELECT get_json_object(json, '$.page') AS page, count(*) AS views "
    f"FROM {TOPIC}_seen GROUP BY page ORDER BY views DESC, page"
)
show(pages, globals())

# COMMAND ----------

seen = spark.table(f"{TOPIC}_seen")  # noqa: F821
assert seen.count() == 1000, seen.count()
assert sorted(r.offset for r in seen.select("offset").collect()) == offsets
print("all 1,000 messages read, in three micro-batches of at most 400")

# COMMAND ----------

mq.stop()  # only an embedded broker stops
