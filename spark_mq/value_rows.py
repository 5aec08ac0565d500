"""Records the journal keeps as the Python values they came as, their table built only when asked.

A plain message (:mod:`spark_mq.plain`) and a settlement (:mod:`spark_mq.journal.settlements`)
go through the group commit and the hot tier's segment log as they are: building one-row Arrow
tables for them was most of the broker's cost for a synchronous send or an ack. A commit hands
on its records of one kind as a :class:`ValueRows`; a table is built where one is needed (a Delta
commit, a browse, a Flight consumer), once, for all of them.
"""

from __future__ import annotations

from typing import Generic, Protocol, TypeVar

import pyarrow as pa


class _Sized(Protocol):
    @property
    def nbytes(self) -> int: ...


T = TypeVar("T", bound=_Sized)


class ValueRows(Generic[T]):
    """The records of one commit (or of consecutive ones), in order."""

    __slots__ = ("_table", "items")

    def __init__(self, items: list[T]) -> None:
        self.items = items
        self._table: pa.Table | None = None

    @classmethod
    def joined(cls, parts: list) -> ValueRows[T]:
        """One of ``parts`` (of this class) for all their records, in order."""
        return cls([item for part in parts for item in part.items])

    @property
    def num_rows(self) -> int:
        """How many rows the table has (one per record unless a subclass says otherwise)."""
        return len(self.items)

    def get_total_buffer_size(self) -> int:
        """About what the records take in memory (the name is ``pa.Table``'s)."""
        items = self.items
        if len(items) == 1:  # the usual commit of a plain message or an ack
            return items[0].nbytes
        return sum(item.nbytes for item in items)

    def table(self) -> pa.Table:
        """The records as rows (built once)."""
        if self._table is None:
            self._table = self.build(self.items)
        return self._table

    @staticmethod
    def build(items: list[T]) -> pa.Table:
        raise NotImplementedError
