"""Where the group-commit writer's flushes go (:class:`CommitSink`): straight to the store
(:class:`DirectSink`, one Delta commit per flush) or to the hot tier
(:class:`spark_mq.journal.hot_tier.HotTier`, which can also be written and synced apart)."""

from __future__ import annotations

from typing import Protocol

from spark_mq.errors import JournalError, SparkMQError
from spark_mq.journal.base import LogStore
from spark_mq.journal.settlements import SettlementRows
from spark_mq.messages import Messages


class CommitSink(Protocol):
    """Where a flush goes: the store directly (:class:`DirectSink`) or the hot tier."""

    def commit(
        self, messages: Messages | None, end_offset: int, settlements: SettlementRows | None
    ) -> tuple[SparkMQError | None, SparkMQError | None]:
        """Make both parts durable (the messages of a commit: rows of ``MESSAGE_SCHEMA``, or
        plain messages with their offsets); returns the error of each part (None when it is
        durable)."""
        ...

    def close(self, *, drain: bool) -> None: ...


class Written(Protocol):
    """A pipelined sink's record of a flush it wrote."""

    @property
    def last_lsn(self) -> int: ...


class PipelinedSink(CommitSink, Protocol):
    """A sink that can write a flush and make it durable apart (the hot tier): the writer
    thread writes the next flush while another thread syncs the last."""

    pipelined: bool  # True

    def write(
        self, messages: Messages | None, end_offset: int, settlements: SettlementRows | None
    ) -> Written | SparkMQError:
        """Write both parts, not yet durable; the error when nothing of them was kept."""
        ...

    def sync(self) -> tuple[int, SparkMQError | None]:
        """Make what was written durable: the last durable record's number (``last_lsn``),
        and the error of a failed sync (then :meth:`drop_unsynced` before the next write)."""
        ...

    def drop_unsynced(self) -> None:
        """Forget whatever was written since the last durable record."""
        ...

    def published(self, written: Written) -> None:
        """``written`` is durable and its commit done."""
        ...


def as_journal_error(exc: Exception, destination: str) -> SparkMQError:
    if isinstance(exc, SparkMQError):
        return exc
    return JournalError(
        f"could not commit to {destination!r}: {type(exc).__name__}: {exc}",
        destination=destination,
    )


class DirectSink:
    """Commit straight to the store: one Delta commit per log per flush (no hot tier)."""

    def __init__(self, store: LogStore, destination: str) -> None:
        self._store = store
        self.destination = destination

    def committed_end(self) -> int:
        return self._store.committed_end(self.destination)

    def commit(
        self, messages: Messages | None, end_offset: int, settlements: SettlementRows | None
    ) -> tuple[SparkMQError | None, SparkMQError | None]:
        msg_error = settle_error = None
        if messages is not None:
            try:
                self._store.commit_messages(self.destination, messages.table(), end_offset)
            except Exception as exc:
                # the commit may have landed even though the call failed: ask the store
                try:
                    landed = self._store.committed_end(self.destination) >= end_offset
                except Exception:
                    landed = False
                if not landed:
                    msg_error = as_journal_error(exc, self.destination)
        if settlements is not None:
            try:
                self._store.commit_settlements(self.destination, settlements.table())
            except Exception as exc:
                settle_error = as_journal_error(exc, self.destination)
        return msg_error, settle_error

    def close(self, *, drain: bool) -> None:
        pass
