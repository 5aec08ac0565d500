package sparkmq.spark;

import org.apache.spark.sql.Dataset;
import org.apache.spark.sql.Row;
import org.apache.spark.sql.SparkSession;
import org.apache.spark.sql.connector.read.streaming.ReadLimit;
import org.apache.spark.sql.connector.read.streaming.ReadMaxBytes;
import org.apache.spark.sql.connector.read.streaming.ReadMaxRows;
import org.apache.spark.sql.connector.read.streaming.SupportsAdmissionControl;
import org.apache.spark.sql.connector.read.streaming.SupportsTriggerAvailableNow;
import org.apache.spark.sql.execution.streaming.Offset;
import org.apache.spark.sql.execution.streaming.Source;
import org.apache.spark.sql.types.StructType;
import scala.Option;

/**
 * A message-log stream whose batches are plain Parquet reads: the Planner (Python) decides the
 * offsets and names the files of each batch, {@link LogReads} turns them into Spark reads.
 */
final class LogSource implements Source, SupportsAdmissionControl, SupportsTriggerAvailableNow {
  private final StructType schema;
  private final LogReads reads;
  private final Planner planner;

  LogSource(SparkSession spark, StructType schema, Planner planner) {
    this.schema = schema;
    this.reads = new LogReads(spark, schema);
    this.planner = planner;
  }

  @Override
  public StructType schema() {
    return schema;
  }

  @Override
  public Option<Offset> getOffset() {
    throw new UnsupportedOperationException("sparkmq streams are planned with latestOffset");
  }

  @Override
  public org.apache.spark.sql.connector.read.streaming.Offset initialOffset() {
    return new JsonOffset(planner.initialOffset());
  }

  @Override
  public org.apache.spark.sql.connector.read.streaming.Offset deserializeOffset(String json) {
    return new JsonOffset(json);
  }

  @Override
  public ReadLimit getDefaultReadLimit() {
    String limit = planner.defaultReadLimit();
    if (limit.startsWith("rows:")) {
      return ReadLimit.maxRows(Long.parseLong(limit.substring(5)));
    }
    if (limit.startsWith("bytes:")) {
      return ReadLimit.maxBytes(Long.parseLong(limit.substring(6)));
    }
    return ReadLimit.allAvailable();
  }

  @Override
  public org.apache.spark.sql.connector.read.streaming.Offset latestOffset(
      org.apache.spark.sql.connector.read.streaming.Offset start, ReadLimit limit) {
    String wanted = "all";
    if (limit instanceof ReadMaxRows rows) {
      wanted = "rows:" + rows.maxRows();
    } else if (limit instanceof ReadMaxBytes bytes) {
      wanted = "bytes:" + bytes.maxBytes();
    }
    return new JsonOffset(planner.latestOffset(start == null ? null : start.json(), wanted));
  }

  @Override
  public org.apache.spark.sql.connector.read.streaming.Offset reportLatestOffset() {
    return new JsonOffset(planner.reportLatestOffset());
  }

  @Override
  public void prepareForTriggerAvailableNow() {
    planner.prepareForTriggerAvailableNow();
  }

  @Override
  public Dataset<Row> getBatch(Option<Offset> start, Offset end) {
    return reads.microBatch(
        planner.plan(start.isDefined() ? start.get().json() : null, end.json()));
  }

  @Override
  public void commit(org.apache.spark.sql.connector.read.streaming.Offset end) {
    // the log is read in place; compaction decides what may go
  }

  @Override
  public void stop() {}

  @Override
  public String toString() {
    return "SparkMQLogSource";
  }
}
