"""The append journal (see ``journal.py``) and its stores."""

from spark_mq.journal.base import AppendResult, DestinationInfo, LogStore, SubscriptionInfo
from spark_mq.journal.delta_store import DeltaStore
from spark_mq.journal.journal import Journal
from spark_mq.journal.memory_store import MemoryStore

__all__ = [
    "AppendResult",
    "DeltaStore",
    "DestinationInfo",
    "Journal",
    "LogStore",
    "MemoryStore",
    "SubscriptionInfo",
]
