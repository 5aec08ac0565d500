"""The storage seam under the journal, and the domain shapes the journal hands out.

A ``LogStore`` keeps, per destination, an append-only message log and settlement log, and one
bindings log for the whole broker. It is deliberately dumb: offsets, group commit and recovery
live in :class:`spark_mq.journal.Journal` above it, written once for every store.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

import pyarrow as pa

from spark_mq.journal.settlements import Collapse

Kind = Literal["queue", "topic"]
KINDS: tuple[Kind, ...] = ("queue", "topic")


class LogStore(Protocol):
    """Where journal records live. Implementations: ``DeltaStore``, ``MemoryStore``.

    Thread-safety: the journal calls the write methods of one destination from one thread only
    (its group-commit writer); different destinations may be written concurrently.
    """

    #: whether records survive a restart of the process
    durable: bool
    #: told (from the committing thread) of each commit to a message or settlement log: its
    #: destination and rows
    on_log_commit: Callable[[str, int], None] | None

    def read_bindings(self) -> pa.Table: ...
    def append_bindings(self, rows: pa.Table) -> None: ...
    def read_transactions(self) -> pa.Table: ...
    def append_transactions(self, rows: pa.Table) -> None:
        """Durable once it returns (a local transaction's commit point)."""
        ...

    def create_logs(self, destination: str) -> None: ...
    def drop_logs(self, destination: str) -> None: ...
    def fence_destination(self, destination: str, epoch: int) -> None:
        """A cluster member owns ``destination`` with ``epoch`` from now on (``Deposed`` if a
        greater one fenced it already)."""
        ...

    def release_destination(self, destination: str) -> None:
        """A cluster member no longer owns ``destination``."""
        ...

    def hand_on_producers(self, destination: str, state: str) -> None:
        """A cluster member letting ``destination`` go writes its producer state
        (:mod:`spark_mq.broker.producer_state`) for the next owner, with its epoch."""
        ...

    def handed_producers(self, destination: str) -> str | None:
        """The producer state ``destination``'s last owner handed on, if it is among the
        message log's newest commits (None: none there)."""
        ...

    def committed_end(self, destination: str) -> int:
        """One past the last committed offset (0 for an empty log)."""
        ...

    def commit_messages(
        self, destination: str, rows: pa.Table, end_offset: int, producers: str | None = None
    ) -> None:
        """Append ``rows`` (offsets already assigned, ending at ``end_offset - 1``) atomically;
        with ``producers``, the producer state as it stands at ``end_offset`` with them (as
        :meth:`hand_on_producers` writes it).

        Idempotent: when ``committed_end`` already is ``end_offset`` or more, nothing is written.
        """
        ...

    def settlements_version(self, destination: str) -> int:
        """The ``version`` of the last versioned settlement commit (0 if none)."""
        ...

    def commit_settlements(
        self, destination: str, rows: pa.Table, version: int | None = None
    ) -> None:
        """Append settlement rows; with ``version``, idempotently (skipped when not newer)."""
        ...

    def read_messages(
        self,
        destination: str,
        start: int,
        end: int | None,
        columns: Sequence[str] | None = None,
    ) -> pa.Table:
        """Rows ``start <= offset < end`` in offset order (of ``columns`` only: see
        :func:`spark_mq.schema.message_columns`)."""
        ...

    def read_settlements(self, destination: str) -> pa.Table: ...
    def collapse_settlements(self, destination: str, collapse: Collapse, now_us: int) -> int:
        """Replace each subscription's settlement rows below its mark in ``collapse`` by one
        ``compacted`` row carrying the mark, and the rows in each of its runs by one
        ``settled-run`` row, keeping the rows that release a Spark query's claims (see
        :class:`spark_mq.journal.settlements.Collapse`); the number of rows removed. The new
        rows first, then the removal: a reader in between reads both the same way."""
        ...

    def merge_message_files(self, destination: str, at_least: int) -> int:
        """Merge the small files of ``destination``'s message log when it has ``at_least``
        of them (no rows change); the number of files merged (0: none)."""
        ...

    def close(self) -> None: ...


@dataclass(frozen=True)
class SubscriptionInfo:
    destination: str
    name: str
    start_offset: int
    durable: bool = True
    selector: str | None = None


@dataclass(frozen=True)
class DestinationInfo:
    name: str
    kind: Kind
    subscriptions: dict[str, SubscriptionInfo] = field(default_factory=dict, compare=False)
    # settings given at creation (or by configure); the rest come from the broker's defaults
    settings: dict[str, Any] = field(default_factory=dict, compare=False)


@dataclass(frozen=True)
class AppendResult:
    """A durable append: rows ``first_offset`` .. ``first_offset + count - 1``."""

    destination: str
    first_offset: int
    count: int

    @property
    def offsets(self) -> range:
        return range(self.first_offset, self.first_offset + self.count)
