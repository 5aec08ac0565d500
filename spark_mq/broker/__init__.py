"""The broker: delivery semantics above the journal (the service that serves it over its
transports is :mod:`spark_mq.service`)."""

from spark_mq.broker.core import Broker

__all__ = ["Broker"]
