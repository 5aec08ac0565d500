"""The Python SDK: ``Producer``, ``Consumer``, ``Admin``."""

from spark_mq.client.admin import Admin
from spark_mq.client.consumer import Consumer
from spark_mq.client.message import Message
from spark_mq.client.producer import Producer

__all__ = ["Admin", "Consumer", "Message", "Producer"]
