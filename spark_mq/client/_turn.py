"""Who reads a consumer's wire link: its reader thread, or a receiver waiting for a message.

A message handed from a reader thread to ``receive``'s caller costs two thread wake-ups: the
reader thread's when the message arrives, then the receiver's. So a receiver that finds nothing
delivered reads the link itself, and the message wakes the thread that wants it.

The consumer's reader thread reads the link only when someone must and no receiver does: while
settle replies are awaited (a receiver waiting for messages reads those too), and once it is
summoned for good (the consumer closes, or ``wait`` is called, or a receiver found the stream
ended or broken: the reader thread then reports it as it always did). A receiver that wants the
turn while the reader thread waits in :meth:`WireConsumeLink.wait
<spark_mq.client._wire.WireConsumeLink.wait>` wakes it, and it lets go.

Whatever the reader thread queues, it queues while it holds the turn, so a receiver that takes
the turn and finds the queue empty knows that nothing read before is still on its way: messages
keep their order. Deliveries nobody reads wait in the socket; the broker never blocks on a
consumer (it buffers what a socket will not take, within the consumer's prefetch).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from spark_mq.client._wire import WireConsumeLink


class ReadTurn:
    """``awaited``: whether replies are awaited (settles in flight); call :meth:`poke` once one
    more is."""

    def __init__(self, link: WireConsumeLink, awaited: Callable[[], bool]) -> None:
        self._link = link
        self._awaited = awaited
        self._summoned = False  # the reader thread reads whenever no receiver does
        self._cond = threading.Condition()
        self._thread_reading = False  # the reader thread has the turn
        self._receiver_reading = False  # a receiver has it
        self._wanted = False  # a receiver waits for it
        self._woken = False  # the reader thread's wait was cut short and not yet drained
        self._failed: BaseException | None = None  # a read broke the link

    @contextlib.contextmanager
    def thread_reading(self) -> Iterator[bool]:
        """For the reader thread: wait for the turn, then for something to read. Yields True
        when the link has something (a frame, at least its start, or the end), False when a
        receiver wants the turn (the reader thread then lets go and calls again). Queue what is
        read inside the block; an error raised there marks the link broken."""
        with self._cond:
            self._cond.wait_for(self._thread_may_read)
            failed = self._failed
            self._thread_reading = True
        try:
            if failed is not None:
                raise failed
            yield self._link.wait()
        except Exception as exc:  # no receiver reads a broken link while the consumer ends
            with self._cond:
                self._failed = self._failed or exc
            raise
        finally:
            with self._cond:
                self._thread_reading = False
                if self._woken:
                    self._link.drain_wake()
                    self._woken = False
                self._cond.notify_all()

    def take(self, timeout: float | None) -> bool:
        """For a receiver that found nothing queued: take the turn from the reader thread, within
        ``timeout`` seconds (it lets go at once unless it is in the middle of a frame); whether
        it was taken. Give it back with :meth:`give`."""
        with self._cond:
            self._wanted = True
            if self._thread_reading and not self._woken:
                self._link.wake()
                self._woken = True
            held = self._cond.wait_for(lambda: not self._thread_reading, timeout)
            self._wanted = False
            self._receiver_reading = held
            if not held:
                self._cond.notify_all()
            return held

    def give(self) -> None:
        """A receiver lets go of the turn it took."""
        with self._cond:
            self._receiver_reading = False
            if self._thread_may_read():
                self._cond.notify_all()

    def poke(self) -> None:
        """A reply is awaited now: the reader thread reads it unless a receiver does."""
        with self._cond:
            if self._thread_may_read():
                self._cond.notify_all()

    def summon(self) -> None:
        """From now on the reader thread reads whenever no receiver does (closing, waiting for
        the stream's end, or a receiver saw it end)."""
        with self._cond:
            self._summoned = True
            self._cond.notify_all()

    @property
    def broken(self) -> bool:
        """Whether a read broke the link (the consumer is ending: read nothing more)."""
        return self._failed is not None

    def fail(self, exc: BaseException) -> None:
        """A receiver's read broke the link: the reader thread raises ``exc`` at its next turn,
        so the consumer ends as it does when the reader thread's own read breaks."""
        with self._cond:
            self._failed = self._failed or exc
            self._summoned = True
            self._cond.notify_all()

    def _thread_may_read(self) -> bool:
        """(Caller holds the condition's lock.)"""
        if self._wanted or self._receiver_reading:
            return False
        return self._summoned or self._failed is not None or self._awaited()
