"""Committing inline: records a transport submits with an :class:`InlineCommit` are made
durable by the thread that calls its :meth:`~InlineCommit.commit` (a loop serving many clients,
at the end of its turn), not by their writers' threads (:mod:`spark_mq.journal.group_commit`).
"""

from __future__ import annotations

from concurrent.futures import Future
from typing import Protocol

Resolutions = list[tuple[Future, object]]


class DestinationWriter(Protocol):
    """What an inline commit commits: a destination's writer
    (:class:`spark_mq.journal.group_commit.DestinationWriter`)."""

    def commit_here(
        self, *, coming_back: bool = False, resolving: Resolutions | None = None
    ) -> float | None: ...


class InlineCommit:
    """Records submitted with it are committed by the thread that calls :meth:`commit` (the
    wire loop, at the end of each turn), not by their writer threads: one sync per writer it
    touched, no thread hand-off. It is an object the caller holds and passes along, so what a
    submit does never depends on which thread calls it from where.

    Settlements alone may be left to wait for a commit to share (``settle_timeout_s``). With
    ``later``, the caller takes care of them itself: ``later`` maps each writer holding such
    records to when they are due, and the caller comes back by then (a later commit with the
    same ``later`` commits every writer in it whose records are due). Without, the writer
    thread is woken to commit them when due. Measured at 1,000 msg/s, where nearly every ack
    waits for the next message: the writer thread then woke about once a message (5,000 times
    in 5 s), each time taking the GIL for a moment from the loop.

    With ``resolving``, the commits leave their futures pending and append each with its result
    to ``resolving``, for the caller to :func:`resolve` once it has done what should come first.
    The wire loop writes the deliveries a commit made possible, then answers the producers and
    acks: their callbacks no longer stand between a sync and the consumer. Everything is
    durable and visible (``on_commit`` has run) when :meth:`commit` returns either way.
    """

    __slots__ = ("later", "resolving", "writers")

    def __init__(
        self,
        later: dict[DestinationWriter, float] | None = None,
        resolving: Resolutions | None = None,
    ) -> None:
        self.later = later
        self.resolving = resolving
        self.writers: dict[DestinationWriter, None] = {}  # touched, in order

    def commit(self) -> None:
        """Commit what was submitted with this object (and what ``later`` says is due)."""
        writers, self.writers = self.writers, {}
        later = self.later
        if later:
            writers.update(dict.fromkeys(later))
            later.clear()
        for w in writers:
            due = w.commit_here(coming_back=later is not None, resolving=self.resolving)
            if due is not None and later is not None:
                later[w] = due


def resolve(resolving: Resolutions) -> None:
    """Resolve the futures an :class:`InlineCommit` left pending, in commit order."""
    pending = resolving[:]
    resolving.clear()
    for future, result in pending:
        if not future.done():  # failed meanwhile (a commit that raised after it): that stands
            future.set_result(result)
