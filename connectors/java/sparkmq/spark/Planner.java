package sparkmq.spark;

/**
 * The Python side of a log-reading stream, reached through py4j: it knows the options, the
 * destinations and the Delta logs; the JVM only reads the Parquet files it names.
 * Offsets travel as the Python source's JSON ({"destination": next offset, ...}).
 */
public interface Planner {
  /** Where a new query starts. */
  String initialOffset();

  /** The end of the next batch from {@code start}, within {@code limit} ("all", "rows:N", "bytes:N"). */
  String latestOffset(String start, String limit);

  /** The read limit the options ask for, in the form {@code latestOffset} takes. */
  String defaultReadLimit();

  /** How far the logs go now. */
  String reportLatestOffset();

  /** Trigger.AvailableNow: stop at the ends seen now. */
  void prepareForTriggerAvailableNow();

  /**
   * What {@code (start, end]} reads, as a JSON list of {"destination", "start", "end", "files"}:
   * rows with start <= offset < end in those Parquet files (after checking none are missing).
   */
  String plan(String start, String end);
}
