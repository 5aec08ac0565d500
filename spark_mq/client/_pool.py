"""A consumer's pool of ``on_message`` handler threads (``Consumer(on_message=...,
concurrency=N)``): seed 001's activation specification, a bounded pool of handlers taking one
consumer's messages at once.

The consumer's reader thread hands each delivery to the pool (:meth:`HandlerPool.put`, which
never blocks: the broker's prefetch bounds what can wait). A free handler thread takes the next
message (:class:`~spark_mq.client._lanes.Lanes`: one group at a time per handler, in order).
The handler settles its message as a single ``on_message`` does; one that raises has it nacked.
A keeper thread extends the lease of a message whose handler runs longer than a third of the
lease, and gives back (nacks) a message that waited longer than ``start_timeout_s`` for a free
handler, so another consumer can take it.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from spark_mq.client._lanes import Lanes
from spark_mq.client.message import Message

log = logging.getLogger(__name__)


@dataclass(slots=True)
class _Running:
    message: Message
    extended_at: float  # when its lease was last renewed (or its handler started)


class HandlerPool:
    def __init__(
        self,
        handler: Callable[[Message], object],
        nack: Callable[[list[Message]], object],
        give_back: Callable[[list[Message]], object],
        extend: Callable[[list[Message]], object],
        concurrency: int,
        start_timeout_s: float | None,
        lease_s: float,
        name: str,
    ) -> None:
        if concurrency < 1:
            raise ValueError(f"concurrency must be 1 or more, got {concurrency}")
        self._handler, self._nack, self._extend = handler, nack, extend
        self._give_back = give_back  # (a nack for another consumer: the start timeout's)
        self._start_timeout_s = start_timeout_s
        self._renew_s = max(lease_s / 3, 0.05)
        self._lanes: Lanes[Message] = Lanes(lambda m: m.group_id)
        self._cond = threading.Condition()
        self._running: dict[int, _Running] = {}  # by id(message)
        self._stopping = False
        self._workers = [
            threading.Thread(target=self._work, name=f"{name}-handler-{i}", daemon=True)
            for i in range(concurrency)
        ]
        self._keeper = threading.Thread(target=self._keep, name=f"{name}-keeper", daemon=True)
        for t in (*self._workers, self._keeper):
            t.start()

    def put(self, messages: list[Message]) -> None:
        """Messages for the handlers (from the reader thread: never blocks)."""
        now = time.monotonic()
        with self._cond:
            if self._stopping:
                return  # (they go back to the broker when the consumer detaches)
            for m in messages:
                self._lanes.add(m, now)
            self._cond.notify(len(messages))

    def drop_waiting(self) -> None:
        """Forget the messages waiting for a handler (their connection is gone: a failover)."""
        with self._cond:
            self._lanes.drain()

    def _work(self) -> None:
        while True:
            with self._cond:
                while (message := self._lanes.take()) is None and not self._stopping:
                    self._cond.wait()
            while message is not None:
                self._run(message)
                with self._cond:
                    message = None if self._stopping else self._lanes.done(message)
            if self._stopping:
                return

    def _run(self, message: Message) -> None:
        key = id(message)
        with self._cond:
            self._running[key] = _Running(message, time.monotonic())
        try:
            self._handler(message)
        except Exception:
            log.exception(
                "on_message raised for %s offset %d: it is nacked",
                message.destination,
                message.offset,
            )
            self._nack([message])
        finally:
            with self._cond:
                self._running.pop(key, None)

    def _keep(self) -> None:
        tick = self._renew_s / 2
        if self._start_timeout_s:
            tick = min(tick, self._start_timeout_s / 4)
        while True:
            with self._cond:
                if self._stopping:
                    return
                self._cond.wait(max(tick, 0.01))
                now = time.monotonic()
                due = [r for r in self._running.values() if now - r.extended_at >= self._renew_s]
                for r in due:
                    r.extended_at = now
                late = (
                    self._lanes.expired(now, self._start_timeout_s) if self._start_timeout_s else []
                )
            if due:
                self._extend([r.message for r in due])
            if late:
                log.info(
                    "%d message(s) found no free handler in %g s: given back",
                    len(late),
                    self._start_timeout_s,
                )
                self._give_back(late)

    def stop(self, timeout_s: float) -> None:
        """Stop taking messages; wait up to ``timeout_s`` for the running handlers (not for
        the calling thread's own, when a handler closes its consumer)."""
        with self._cond:
            self._stopping = True
            self._lanes.drain()
            self._cond.notify_all()
        deadline = time.monotonic() + timeout_s
        me = threading.current_thread()
        for t in (*self._workers, self._keeper):
            if t is not me:
                t.join(max(deadline - time.monotonic(), 0))
