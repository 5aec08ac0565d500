"""The Python SDK: ``Producer``, ``Consumer``, ``Transaction``, ``Admin``."""

from spark_mq.client.admin import Admin
from spark_mq.client.consumer import Consumer
from spark_mq.client.message import Message, MessageBatch
from spark_mq.client.producer import Producer
from spark_mq.client.transaction import Transaction

__all__ = ["Admin", "Consumer", "Message", "MessageBatch", "Producer", "Transaction"]
