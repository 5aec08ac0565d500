"""sparkmq: a Spark-native messaging layer.

Producers and consumers talk to a broker over Arrow Flight; destinations are Delta tables that
Spark reads with ``spark.readStream.format("sparkmq")`` (see ``spark_mq.connectors``).
"""

# first: warns when an edited source is shadowed by an older compiled build of it
from spark_mq import native  # noqa: F401
from spark_mq.client import Admin, Consumer, Message, MessageBatch, Producer, Transaction
from spark_mq.errors import (
    BrokerUnavailable,
    ConfigError,
    ConsumerRefused,
    DataLoss,
    DestinationExists,
    DestinationFull,
    DestinationNotFound,
    DiskFull,
    InvalidNameError,
    JournalError,
    LeaseError,
    MessageRejected,
    MessageTooLarge,
    NotAllowed,
    OperationTimeout,
    ProtocolError,
    SchemaMismatch,
    SelectorError,
    SparkMQError,
    SubscriptionNotFound,
)
from spark_mq.version import __version__

__all__ = [
    "Admin",
    "BrokerUnavailable",
    "ConfigError",
    "Consumer",
    "ConsumerRefused",
    "DataLoss",
    "DestinationExists",
    "DestinationFull",
    "DestinationNotFound",
    "DiskFull",
    "InvalidNameError",
    "JournalError",
    "LeaseError",
    "Message",
    "MessageBatch",
    "MessageRejected",
    "MessageTooLarge",
    "NotAllowed",
    "OperationTimeout",
    "Producer",
    "ProtocolError",
    "SchemaMismatch",
    "SelectorError",
    "SparkMQError",
    "SubscriptionNotFound",
    "Transaction",
    "__version__",
]
