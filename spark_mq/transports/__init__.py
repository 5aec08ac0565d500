"""The broker's transports: codecs and byte movers that turn frames into the session layer's
commands and its results back into frames (:mod:`spark_mq.transports.flight`: Arrow Flight;
:mod:`spark_mq.transports.direct_wire`: the direct wire's event loop)."""
