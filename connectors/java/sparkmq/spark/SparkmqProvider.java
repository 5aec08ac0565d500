package sparkmq.spark;

import com.fasterxml.jackson.core.JsonProcessingException;
import com.fasterxml.jackson.databind.ObjectMapper;
import java.util.Map;
import org.apache.spark.sql.SQLContext;
import org.apache.spark.sql.connector.catalog.Table;
import org.apache.spark.sql.connector.catalog.TableProvider;
import org.apache.spark.sql.connector.expressions.Transform;
import org.apache.spark.sql.execution.datasources.v2.python.PythonDataSourceV2;
import org.apache.spark.sql.execution.streaming.Source;
import org.apache.spark.sql.sources.BaseRelation;
import org.apache.spark.sql.sources.DataSourceRegister;
import org.apache.spark.sql.sources.RelationProvider;
import org.apache.spark.sql.sources.StreamSourceProvider;
import org.apache.spark.sql.types.StructType;
import org.apache.spark.sql.util.CaseInsensitiveStringMap;
import scala.Option;
import scala.Tuple2;
import scala.jdk.javaapi.CollectionConverters;

/**
 * {@code format("sparkmq")} when the connector's jar is on Spark's classpath.
 *
 * <p>Everything is served by the Python data source (registered under another name by {@code
 * spark_mq.connectors.register}), except reads of message logs in place: Spark plans those,
 * micro-batch after micro-batch or as one batch read, as Parquet reads of the very files the
 * Delta log names, with its own vectorized reader, so no row passes through a Python worker.
 * The Python side still decides what each read holds (offsets, admission control, data loss),
 * through {@link Planner} and {@link PlannerFactory#planBatch}.
 */
public final class SparkmqProvider
    implements DataSourceRegister, TableProvider, StreamSourceProvider, RelationProvider {
  static final ObjectMapper JSON = new ObjectMapper();
  private PythonDataSourceV2 python;

  @Override
  public String shortName() {
    return "sparkmq";
  }

  private PythonDataSourceV2 python() {
    if (python == null) {
      python = new PythonDataSourceV2();
      python.setShortName(Bridge.get().pythonSourceName());
    }
    return python;
  }

  // -- TableProvider: the Python source, but a log read's stream comes from createSource --------
  @Override
  public StructType inferSchema(CaseInsensitiveStringMap options) {
    // asked of the driver's Python directly: the Python source would start a Python worker
    // for it, which costs a log read a fifth of a second, several times per query
    String ddl = Bridge.get().schema(json(options.asCaseSensitiveMap()));
    if (ddl != null) {
      return StructType.fromDDL(ddl);
    }
    return python().inferSchema(options); // and names whatever is wrong with the options
  }

  @Override
  public Transform[] inferPartitioning(CaseInsensitiveStringMap options) {
    return python().inferPartitioning(options);
  }

  @Override
  public boolean supportsExternalMetadata() {
    return python().supportsExternalMetadata();
  }

  @Override
  public Table getTable(StructType schema, Transform[] partitioning, Map<String, String> properties) {
    Table table = python().getTable(schema, partitioning, properties);
    if (Bridge.get().servesReads(json(properties))) {
      return new WriteOnlyTable(table); // Spark then reads through createSource / createRelation
    }
    return table;
  }

  // -- StreamSourceProvider ---------------------------------------------------------------------
  @Override
  public Tuple2<String, StructType> sourceSchema(
      SQLContext sqlContext,
      Option<StructType> schema,
      String providerName,
      scala.collection.immutable.Map<String, String> parameters) {
    return new Tuple2<>(shortName(), schemaOf(schema, parameters));
  }

  @Override
  public Source createSource(
      SQLContext sqlContext,
      String metadataPath,
      Option<StructType> schema,
      String providerName,
      scala.collection.immutable.Map<String, String> parameters) {
    Planner planner = Bridge.get().create(json(CollectionConverters.asJava(parameters)));
    return new LogSource(sqlContext.sparkSession(), schemaOf(schema, parameters), planner);
  }

  // -- RelationProvider: batch reads of message logs --------------------------------------------
  @Override
  public BaseRelation createRelation(
      SQLContext sqlContext, scala.collection.immutable.Map<String, String> parameters) {
    String options = json(CollectionConverters.asJava(parameters));
    LogReads reads = new LogReads(sqlContext.sparkSession(), schemaOf(Option.empty(), parameters));
    return new PlannedRelation(sqlContext, reads, Bridge.get().planBatch(options));
  }

  private StructType schemaOf(
      Option<StructType> schema, scala.collection.immutable.Map<String, String> parameters) {
    if (schema.isDefined()) {
      return schema.get();
    }
    return inferSchema(new CaseInsensitiveStringMap(CollectionConverters.asJava(parameters)));
  }

  static String json(Object value) {
    try {
      return JSON.writeValueAsString(value);
    } catch (JsonProcessingException e) {
      throw new IllegalArgumentException("cannot encode " + value, e);
    }
  }
}
