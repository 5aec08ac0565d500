package sparkmq.spark;

import org.apache.spark.rdd.RDD;
import org.apache.spark.sql.Row;
import org.apache.spark.sql.SQLContext;
import org.apache.spark.sql.sources.BaseRelation;
import org.apache.spark.sql.sources.PrunedScan;
import org.apache.spark.sql.types.StructType;

/** A batch read of message logs: the rows of Spark's Parquet reads the planner chose. */
final class PlannedRelation extends BaseRelation implements PrunedScan {
  private final SQLContext sqlContext;
  private final LogReads reads;
  private final String plan;

  PlannedRelation(SQLContext sqlContext, LogReads reads, String plan) {
    this.sqlContext = sqlContext;
    this.reads = reads;
    this.plan = plan;
  }

  @Override
  public SQLContext sqlContext() {
    return sqlContext;
  }

  @Override
  public StructType schema() {
    return reads.schema();
  }

  @Override
  public boolean needConversion() {
    return false; // buildScan hands Spark its own internal rows
  }

  @Override
  @SuppressWarnings("unchecked")
  public RDD<Row> buildScan(String[] requiredColumns) {
    return (RDD<Row>) (RDD<?>) reads.batch(plan, requiredColumns);
  }
}
