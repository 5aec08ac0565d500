package sparkmq.spark;

/** The Python source's offset JSON ({"destination": next offset, ...}), unchanged. */
final class JsonOffset extends org.apache.spark.sql.execution.streaming.Offset {
  private final String json;

  JsonOffset(String json) {
    this.json = json;
  }

  @Override
  public String json() {
    return json;
  }
}
