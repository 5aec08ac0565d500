package sparkmq.spark;

import static org.apache.spark.sql.functions.col;
import static org.apache.spark.sql.functions.expr;
import static org.apache.spark.sql.functions.lit;

import com.fasterxml.jackson.core.JsonProcessingException;
import com.fasterxml.jackson.databind.JsonNode;
import java.util.ArrayList;
import java.util.List;
import org.apache.spark.rdd.RDD;
import org.apache.spark.sql.Column;
import org.apache.spark.sql.Dataset;
import org.apache.spark.sql.Row;
import org.apache.spark.sql.catalyst.InternalRow;
import org.apache.spark.sql.catalyst.plans.logical.LogicalPlan;
import org.apache.spark.sql.classic.SparkSession;
import org.apache.spark.sql.execution.datasources.LogicalRelation;
import org.apache.spark.sql.execution.datasources.LogicalRelation$;
import org.apache.spark.sql.types.ArrayType;
import org.apache.spark.sql.types.DataTypes;
import org.apache.spark.sql.types.MapType;
import org.apache.spark.sql.types.StructField;
import org.apache.spark.sql.types.StructType;
import scala.reflect.ClassTag$;

/**
 * A planned read of message logs as Spark Parquet reads. The plan (from the Python planner) is
 * a JSON list of scans {"destination", "start", "end", "files", "whole"}: a whole scan reads
 * every row of its files, the others only start <= offset < end.
 */
final class LogReads {
  private final SparkSession spark;
  private final StructType schema;
  private final StructType logSchema; // the columns the Parquet files hold

  LogReads(org.apache.spark.sql.SparkSession spark, StructType schema) {
    this.spark = (SparkSession) spark;
    this.schema = schema;
    List<StructField> kept = new ArrayList<>();
    for (StructField f : schema.fields()) {
      if (KAFKA.contains(f.name())) {
        continue; // computed from the log's own columns (option kafkaColumns)
      }
      if (f.name().equals("headers") && f.dataType() instanceof ArrayType) {
        kept.add(new StructField("headers", HEADERS_MAP, true, f.metadata()));
      } else {
        kept.add(f);
      }
    }
    this.logSchema = new StructType(kept.toArray(new StructField[0]));
  }

  // the columns a read computes rather than finds in the files
  private static final java.util.Set<String> KAFKA =
      java.util.Set.of("destination", "key", "value", "topic", "partition", "timestamp");
  private static final MapType HEADERS_MAP =
      new MapType(DataTypes.StringType, DataTypes.StringType, true);

  /**
   * A micro-batch: whole files are streaming relations Spark reads and counts like its file
   * stream source does; files a batch boundary cuts are read, filtered to the range, behind one
   * more leaf (Spark counts a batch's rows at its leaves: at the Parquet scan they would include
   * the rows the offset filter drops).
   */
  Dataset<Row> microBatch(String plan) {
    Dataset<Row> whole = null;
    Dataset<Row> cut = null;
    for (JsonNode scan : parse(plan)) {
      if (scan.get("whole").asBoolean()) {
        Dataset<Row> part = streaming(paths(scan)).select(columns(scan));
        whole = whole == null ? part : whole.unionAll(part);
      } else {
        Dataset<Row> part = filtered(scan);
        cut = cut == null ? part : cut.unionAll(part);
      }
    }
    if (cut == null && whole != null) {
      return whole;
    }
    Dataset<Row> leaf = spark.internalCreateDataFrame(rows(cut), schema, true);
    return whole == null ? leaf : whole.unionAll(leaf);
  }

  /**
   * A batch read's rows, only the {@code required} columns in that order (Spark's Parquet
   * reads, run when the relation is scanned).
   */
  RDD<InternalRow> batch(String plan, String[] required) {
    Column[] wanted = new Column[required.length];
    for (int i = 0; i < required.length; i++) {
      wanted[i] = col(required[i]);
    }
    Dataset<Row> out = null;
    for (JsonNode scan : parse(plan)) {
      Dataset<Row> part =
          scan.get("whole").asBoolean()
              ? spark.read().schema(logSchema).parquet(paths(scan)).select(columns(scan))
              : filtered(scan);
      part = part.select(wanted);
      out = out == null ? part : out.unionAll(part);
    }
    return rows(out);
  }

  StructType schema() {
    return schema;
  }

  private RDD<InternalRow> rows(Dataset<Row> df) {
    if (df == null) {
      return spark.sparkContext().emptyRDD(ClassTag$.MODULE$.apply(InternalRow.class));
    }
    return ((org.apache.spark.sql.classic.Dataset<Row>) df).queryExecution().toRdd();
  }

  private Dataset<Row> filtered(JsonNode scan) {
    long start = scan.get("start").asLong();
    long end = scan.get("end").asLong();
    return spark
        .read()
        .schema(logSchema)
        .parquet(paths(scan))
        .where(col("offset").geq(start).and(col("offset").lt(end)))
        .select(columns(scan));
  }

  /** The files as a streaming relation (what Spark's own file stream source hands back). */
  private Dataset<Row> streaming(String[] paths) {
    Dataset<Row> files = spark.read().schema(logSchema).parquet(paths);
    LogicalPlan plan = ((org.apache.spark.sql.classic.Dataset<Row>) files).logicalPlan();
    return org.apache.spark.sql.classic.Dataset.ofRows(
        spark, LogicalRelation$.MODULE$.apply(((LogicalRelation) plan).relation(), true));
  }

  private Column[] columns(JsonNode scan) {
    String destination = scan.get("destination").asText();
    Column[] out = new Column[schema.fields().length];
    int i = 0;
    for (StructField f : schema.fields()) {
      out[i++] = column(f, destination);
    }
    return out;
  }

  /** A column of the read as the log's columns give it (Kafka's shapes with kafkaColumns). */
  private static Column column(StructField f, String destination) {
    switch (f.name()) {
      case "destination":
        return lit(destination).as(f.name());
      case "topic": // a partition's (<topic>~<index>) is its topic's
        return lit(topicOf(destination)).as(f.name());
      case "partition":
        return lit(partitionOf(destination)).as(f.name());
      case "key":
        return col("group_id").cast(DataTypes.BinaryType).as("key");
      case "value":
        return col("body").as("value");
      case "timestamp":
        return col("enqueue_time").as("timestamp");
      case "headers":
        if (f.dataType() instanceof ArrayType) {
          return expr("transform(map_entries(headers), e -> named_struct('key', e.key, "
                  + "'value', cast(e.value as binary)))")
              .as("headers");
        }
        return col("headers");
      default:
        return col(f.name());
    }
  }

  /** The topic of a partition's destination name (any other name: itself). */
  static String topicOf(String destination) {
    int mark = destination.lastIndexOf('~');
    return mark > 0 && partitionOf(destination) >= 0 && mark < destination.length() - 1
        ? destination.substring(0, mark)
        : destination;
  }

  /** A partition's index (0: a destination without partitions). */
  static int partitionOf(String destination) {
    int mark = destination.lastIndexOf('~');
    if (mark <= 0 || mark == destination.length() - 1) {
      return 0;
    }
    String index = destination.substring(mark + 1);
    for (int i = 0; i < index.length(); i++) {
      if (!Character.isDigit(index.charAt(i))) {
        return 0;
      }
    }
    return Integer.parseInt(index);
  }

  private static String[] paths(JsonNode scan) {
    JsonNode files = scan.get("files");
    String[] out = new String[files.size()];
    for (int i = 0; i < out.length; i++) {
      out[i] = files.get(i).asText();
    }
    return out;
  }

  private static JsonNode parse(String plan) {
    try {
      return SparkmqProvider.JSON.readTree(plan);
    } catch (JsonProcessingException e) {
      throw new IllegalStateException("the sparkmq planner answered " + plan, e);
    }
  }
}
