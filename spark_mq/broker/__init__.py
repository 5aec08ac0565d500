"""The broker process: delivery semantics above the journal, served over Arrow Flight."""

from spark_mq.broker.core import Broker
from spark_mq.broker.process import RunningBroker, serve

__all__ = ["Broker", "RunningBroker", "serve"]
