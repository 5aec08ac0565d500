package sparkmq.spark;

/** Where the driver's Python process leaves its planner factory. */
public final class Bridge {
  private static volatile PlannerFactory factory;

  private Bridge() {}

  public static void set(PlannerFactory f) {
    factory = f;
  }

  public static PlannerFactory get() {
    PlannerFactory f = factory;
    if (f == null) {
      throw new IllegalStateException(
          "format(\"sparkmq\") is not registered in this SparkSession's Python process: call "
              + "spark_mq.connectors.register(spark) first");
    }
    return f;
  }

  public static boolean isSet() {
    return factory != null;
  }
}
