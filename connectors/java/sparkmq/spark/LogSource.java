package sparkmq.spark;

import static org.apache.spark.sql.functions.col;
import static org.apache.spark.sql.functions.lit;

import com.fasterxml.jackson.core.JsonProcessingException;
import com.fasterxml.jackson.databind.JsonNode;
import java.util.ArrayList;
import java.util.List;
import org.apache.spark.rdd.RDD;
import org.apache.spark.sql.Column;
import org.apache.spark.sql.Dataset;
import org.apache.spark.sql.Row;
import org.apache.spark.sql.SparkSession;
import org.apache.spark.sql.catalyst.InternalRow;
import org.apache.spark.sql.catalyst.plans.logical.LogicalPlan;
import org.apache.spark.sql.connector.read.streaming.ReadLimit;
import org.apache.spark.sql.connector.read.streaming.ReadMaxBytes;
import org.apache.spark.sql.connector.read.streaming.ReadMaxRows;
import org.apache.spark.sql.connector.read.streaming.SupportsAdmissionControl;
import org.apache.spark.sql.connector.read.streaming.SupportsTriggerAvailableNow;
import org.apache.spark.sql.execution.datasources.LogicalRelation;
import org.apache.spark.sql.execution.datasources.LogicalRelation$;
import org.apache.spark.sql.execution.streaming.Offset;
import org.apache.spark.sql.execution.streaming.Source;
import org.apache.spark.sql.types.StructField;
import org.apache.spark.sql.types.StructType;
import scala.Option;
import scala.reflect.ClassTag$;

/**
 * A message-log stream whose batches are plain Parquet reads: the Planner (Python) names the
 * files and the offset range of each destination, and each batch is those files through Spark's
 * own reader, filtered to the range, with the destination as a column.
 */
final class LogSource implements Source, SupportsAdmissionControl, SupportsTriggerAvailableNow {
  private final org.apache.spark.sql.classic.SparkSession spark;
  private final StructType schema;
  private final StructType logSchema; // the columns the Parquet files hold
  private final Planner planner;

  LogSource(SparkSession spark, StructType schema, Planner planner) {
    this.spark = (org.apache.spark.sql.classic.SparkSession) spark;
    this.schema = schema;
    List<StructField> kept = new ArrayList<>();
    for (StructField f : schema.fields()) {
      if (!f.name().equals("destination")) {
        kept.add(f);
      }
    }
    this.logSchema = new StructType(kept.toArray(new StructField[0]));
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
    String plan = planner.plan(start.isDefined() ? start.get().json() : null, end.json());
    JsonNode ranges;
    try {
      ranges = SparkmqProvider.JSON.readTree(plan);
    } catch (JsonProcessingException e) {
      throw new IllegalStateException("the sparkmq planner answered " + plan, e);
    }
    // Whole files are streaming relations Spark reads and counts like its file stream source
    // does; files a batch boundary cuts are read, filtered to the range, behind one more leaf
    // (Spark counts a batch's rows at its leaves: at the Parquet scan they would include the
    // rows the offset filter drops).
    Dataset<Row> out = null;
    Dataset<Row> cut = null;
    for (JsonNode range : ranges) {
      JsonNode files = range.get("files");
      String[] paths = new String[files.size()];
      for (int i = 0; i < paths.length; i++) {
        paths[i] = files.get(i).asText();
      }
      Column[] columns = columns(range.get("destination").asText());
      if (range.get("whole").asBoolean()) {
        Dataset<Row> part = streaming(paths).select(columns);
        out = out == null ? part : out.unionAll(part);
        continue;
      }
      Dataset<Row> part =
          spark
              .read()
              .schema(logSchema)
              .parquet(paths)
              .where(
                  col("offset")
                      .geq(range.get("start").asLong())
                      .and(col("offset").lt(range.get("end").asLong())))
              .select(columns);
      cut = cut == null ? part : cut.unionAll(part);
    }
    if (cut != null || out == null) {
      RDD<InternalRow> rows =
          cut == null
              ? spark.sparkContext().emptyRDD(ClassTag$.MODULE$.apply(InternalRow.class))
              : ((org.apache.spark.sql.classic.Dataset<Row>) cut).queryExecution().toRdd();
      Dataset<Row> leaf = spark.internalCreateDataFrame(rows, schema, true);
      out = out == null ? leaf : out.unionAll(leaf);
    }
    return out;
  }

  /** The files as a streaming relation (what Spark's own file stream source hands back). */
  private Dataset<Row> streaming(String[] paths) {
    Dataset<Row> files = spark.read().schema(logSchema).parquet(paths);
    LogicalPlan plan = ((org.apache.spark.sql.classic.Dataset<Row>) files).logicalPlan();
    return org.apache.spark.sql.classic.Dataset.ofRows(
        spark, LogicalRelation$.MODULE$.apply(((LogicalRelation) plan).relation(), true));
  }

  private Column[] columns(String destination) {
    Column[] out = new Column[schema.fields().length];
    int i = 0;
    for (StructField f : schema.fields()) {
      out[i++] = f.name().equals("destination") ? lit(destination).as("destination") : col(f.name());
    }
    return out;
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
