package sparkmq.spark;

/** Implemented in Python (spark_mq.connectors.jvm) and set once per driver by register(spark). */
public interface PlannerFactory {
  /** A planner for these options (a JSON object), or an error naming a bad option. */
  Planner create(String options);

  /** A batch read's scans for these options (a JSON object), as {@link Planner#plan} gives them. */
  String planBatch(String options);

  /** Whether these options (a JSON object) read message logs in place, as LogReads does. */
  boolean servesReads(String options);

  /** The schema (DDL) of a read with these options, or null when {@link #servesReads} is false. */
  String schema(String options);

  /** The Python data source's name, which serves everything else (consumers, the sink...). */
  String pythonSourceName();
}
