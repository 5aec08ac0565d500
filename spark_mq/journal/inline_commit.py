"""Committing inline: records a transport submits with an :class:`InlineCommit` are made
durable by the thread that calls its :meth:`~InlineCommit.commit` (a loop serving many clients,
at the end of its turn), not by their writers' threads (:mod:`spark_mq.journal.group_commit`).
"""

from __future__ import annotations

from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Protocol

Resolutions = list[tuple[Future, object]]

# the syncs of one inline commit's writers run at once on these threads (a sync waits for the
# disk with the GIL let go), when it has this many writers or more. Measured here, 4 KiB
# written to each of N files and made durable, one after the other (a write that syncs itself)
# against written, then synced at once: N=16 3.1 ms a round against 1.2; N=8 1.24-1.28 against
# 0.65-0.68; N=4 0.56 against 0.38-0.41; N=3 0.43 against 0.34-0.39; N=2 0.28 against
# 0.27-0.31, and 50-60 us more CPU for the threads' hand-offs.
_SYNCS = ThreadPoolExecutor(max_workers=8, thread_name_prefix="journal-syncs")
TOGETHER_FROM = 4
# a writer holding this much at the end of a turn writes it behind (its syncer thread makes it
# durable and answers) instead of syncing it inline: the loop reads, checks and writes its next
# turn's frames while the disk syncs (a quarter of a saturated loop's time went to syncs, py-spy).
# Smaller commits (a message or an ack at a time) stay inline, where a hand-off to another thread
# costs more than the sync. Measured, one broker, 16 queues, 4 client processes each with 16
# batches of 500 on their way, three interleaved pairs: produce about the same (338-383k msg/s
# against 341-390k), consume + ack 289-349k -> 329-380k (each pair higher); 8 KiB: an ack of
# 2,000 messages is about 16 KiB. One message at a time (broker_cycle) unchanged.
WRITE_BEHIND_FROM = 8 * 1024


class DestinationWriter(Protocol):
    """What an inline commit commits: a destination's writer
    (:class:`spark_mq.journal.group_commit.DestinationWriter`)."""

    def commit_here(
        self, *, coming_back: bool = False, resolving: Resolutions | None = None
    ) -> float | None: ...

    @property
    def pending_bytes(self) -> int: ...

    def write_behind(self) -> bool: ...

    def write_here(self) -> Any | None: ...

    def sync_here(self) -> tuple[int, Any]: ...

    def finish_here(
        self, f: Any, synced: tuple[int, Any], resolving: Resolutions | None = None
    ) -> None: ...


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
        """Commit what was submitted with this object (and what ``later`` says is due). With
        ``TOGETHER_FROM`` writers or more, what each has due is written first and then all
        are synced at once (:meth:`_together`); what is left, each commits on its own."""
        writers, self.writers = self.writers, {}
        later = self.later
        if later:
            writers.update(dict.fromkeys(later))
            later.clear()
        for w in writers:
            if w.pending_bytes >= WRITE_BEHIND_FROM:
                w.write_behind()  # (what is left, commit_here leaves to the writer's thread)
        if len(writers) >= TOGETHER_FROM:
            self._together(writers)
        for w in writers:
            due = w.commit_here(coming_back=later is not None, resolving=self.resolving)
            if due is not None and later is not None:
                later[w] = due

    def _together(self, writers: dict[DestinationWriter, None]) -> None:
        written = [(w, f) for w in writers if (f := w.write_here()) is not None]
        if len(written) > 1:
            synced = list(_SYNCS.map(lambda wf: wf[0].sync_here(), written))
        else:  # (one: no other thread)
            synced = [w.sync_here() for w, _ in written]
        for (w, f), outcome in zip(written, synced, strict=True):
            w.finish_here(f, outcome, self.resolving)


def resolve(resolving: Resolutions) -> None:
    """Resolve the futures an :class:`InlineCommit` left pending, in commit order."""
    pending = resolving[:]
    resolving.clear()
    for future, result in pending:
        if not future.done():  # failed meanwhile (a commit that raised after it): that stands
            future.set_result(result)
