"""The Kafka listener: Kafka clients of every language against sparkmq's destinations.

* :mod:`~spark_mq.transports.kafka.codec`: frames, requests and responses (kio's types);
* :mod:`~spark_mq.transports.kafka.records`: record batches to sparkmq's messages and back;
* :mod:`~spark_mq.transports.kafka.connection`: one connection's I/O, ApiVersions and SASL;
* :mod:`~spark_mq.transports.kafka.requests`: what the requests mean, as session calls;
* :mod:`~spark_mq.transports.kafka.server`: the listener (its loop thread, its connections).
"""

from __future__ import annotations

import sys

# kio registers a Hypothesis strategy for each of its types when Hypothesis can be imported:
# half a second of a broker's start-up (measured: 0.54-0.62 s against 0.02-0.03 s without), for
# nothing sparkmq uses, wherever Hypothesis happens to be installed (a test or notebook
# environment). Unless it is loaded already (a process that uses it), kio is loaded without it.
if "hypothesis" not in sys.modules:
    sys.modules["hypothesis"] = None  # type: ignore[assignment]  # (its import fails: kio skips)
    try:
        import kio.schema.errors  # noqa: F401  (the first kio import sets kio's choice)
    finally:
        del sys.modules["hypothesis"]
