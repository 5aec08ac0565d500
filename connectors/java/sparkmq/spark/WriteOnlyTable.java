package sparkmq.spark;

import java.util.EnumSet;
import java.util.Map;
import java.util.Set;
import org.apache.spark.sql.connector.catalog.Column;
import org.apache.spark.sql.connector.catalog.SupportsRead;
import org.apache.spark.sql.connector.catalog.SupportsWrite;
import org.apache.spark.sql.connector.catalog.Table;
import org.apache.spark.sql.connector.catalog.TableCapability;
import org.apache.spark.sql.connector.expressions.Transform;
import org.apache.spark.sql.connector.read.ScanBuilder;
import org.apache.spark.sql.connector.write.LogicalWriteInfo;
import org.apache.spark.sql.connector.write.WriteBuilder;
import org.apache.spark.sql.types.StructType;
import org.apache.spark.sql.util.CaseInsensitiveStringMap;

/** The Python source's table for writes only: Spark reads through LogSource and PlannedRelation. */
final class WriteOnlyTable implements SupportsRead, SupportsWrite {
  private final Table inner;

  WriteOnlyTable(Table inner) {
    this.inner = inner;
  }

  @Override
  public String name() {
    return inner.name();
  }

  @Override
  @SuppressWarnings("deprecation")
  public StructType schema() {
    return inner.schema();
  }

  @Override
  public Column[] columns() {
    return inner.columns();
  }

  @Override
  public Transform[] partitioning() {
    return inner.partitioning();
  }

  @Override
  public Map<String, String> properties() {
    return inner.properties();
  }

  @Override
  public Set<TableCapability> capabilities() {
    Set<TableCapability> caps = EnumSet.noneOf(TableCapability.class);
    caps.addAll(inner.capabilities());
    caps.remove(TableCapability.BATCH_READ);
    caps.remove(TableCapability.MICRO_BATCH_READ);
    caps.remove(TableCapability.CONTINUOUS_READ);
    return caps;
  }

  @Override
  public ScanBuilder newScanBuilder(CaseInsensitiveStringMap options) {
    return ((SupportsRead) inner).newScanBuilder(options);
  }

  @Override
  public WriteBuilder newWriteBuilder(LogicalWriteInfo info) {
    return ((SupportsWrite) inner).newWriteBuilder(info);
  }
}
