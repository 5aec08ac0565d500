"""Where the group-commit writer's flushes go (:class:`CommitSink`): straight to the store
(:class:`DirectSink`, one Delta commit per flush) or to the hot tier
(:class:`spark_mq.journal.hot_tier.HotTier`, which can also be written and synced apart)."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Protocol

from spark_mq.errors import JournalError, SparkMQError
from spark_mq.journal.base import LogStore
from spark_mq.journal.settlements import SettlementRows
from spark_mq.messages import Messages

log = logging.getLogger(__name__)


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


# the destination's producer state with its log ending at an offset; None: unchanged
ProducerStateAt = Callable[[str, int], str | None]
# a sink's commits carry the producer state at most this often (when it changed)
PRODUCERS_EVERY_S = 1.0


class ProducerStateCarrier:
    """What a sink's commits to the message log carry of its destination's producer state
    (a cluster member's: :mod:`spark_mq.broker.producer_state`): the state as it stands with
    the log ending at the commit's end, at most every ``PRODUCERS_EVERY_S`` and only when it
    changed, so a member taking the destination over after this one is lost begins from it
    (a state is also handed on when a member lets a destination go)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.state_at: ProducerStateAt | None = None  # (None: nothing carried)
        self._clock = clock
        self._due = 0.0

    def due(self, destination: str, end: int) -> str | None:
        """The state for a commit ending the log at ``end`` to carry, if it is time to."""
        if self.state_at is None or self._clock() < self._due:
            return None
        try:
            state = self.state_at(destination, end)
        except Exception:  # (carrying it is a help to the next owner: never fails a commit)
            log.exception("%s: the producer state was not carried", destination)
            self._due = self._clock() + PRODUCERS_EVERY_S  # (logged once a second at most)
            return None
        if state is not None:
            self._due = self._clock() + PRODUCERS_EVERY_S
        return state


class DirectSink:
    """Commit straight to the store: one Delta commit per log per flush (no hot tier)."""

    def __init__(self, store: LogStore, destination: str) -> None:
        self._store = store
        self.destination = destination
        self.producers = ProducerStateCarrier()  # (a cluster member's)

    def committed_end(self) -> int:
        return self._store.committed_end(self.destination)

    def commit(
        self, messages: Messages | None, end_offset: int, settlements: SettlementRows | None
    ) -> tuple[SparkMQError | None, SparkMQError | None]:
        msg_error = settle_error = None
        if messages is not None:
            try:
                producers = self.producers.due(self.destination, end_offset)
                self._store.commit_messages(
                    self.destination, messages.table(), end_offset, producers
                )
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
