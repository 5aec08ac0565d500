"""The Kafka listener: Kafka clients of every language against sparkmq's destinations.

* :mod:`~spark_mq.transports.kafka.codec`: frames, requests and responses (kio's types);
* :mod:`~spark_mq.transports.kafka.records`: record batches to sparkmq's messages and back;
* :mod:`~spark_mq.transports.kafka.connection`: one connection's I/O, ApiVersions and SASL;
* :mod:`~spark_mq.transports.kafka.requests`: what the requests mean, as session calls;
* :mod:`~spark_mq.transports.kafka.server`: the listener (its loop thread, its connections).
"""
