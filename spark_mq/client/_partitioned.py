"""A consumer of a partitioned destination: one consumer for each partition (each attached to
the member that serves that partition, and following it when it moves), their deliveries
merged into one stream for ``receive``, or each handed to ``on_message`` on its partition's
reader thread.

Order holds within a partition, as in Kafka: messages of one group go to one partition (the
producer places them by group id), so a group's order holds; messages of different partitions
come in whatever order they arrive. A message is settled through its partition's consumer (the
one that delivered it), so ``ack``, ``nack`` and ``extend_lease`` of the merged consumer hand
each message to its own.
"""

from __future__ import annotations

import contextlib
import queue
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable
from concurrent.futures import Future
from typing import Generic, Protocol, TypeVar, cast

from spark_mq.client.message import Message
from spark_mq.errors import SparkMQError
from spark_mq.names import partition_name


class Part(Protocol):
    """What a partition's consumer is to the merged one (a ``Consumer``)."""

    error: SparkMQError | None

    @property
    def serving(self) -> bool: ...

    def wait(self, timeout: float | None = None) -> bool: ...
    def ack(self, messages: Message | Iterable[Message]) -> Future: ...
    def nack(self, messages: Message | Iterable[Message]) -> Future: ...
    def extend_lease(self, messages: Message | Iterable[Message]) -> Future: ...
    def close(self) -> None: ...


class Batches:
    """An ``on_message`` that takes each delivery batch whole (``fn(messages)``): how a
    partition's consumer hands its messages to the merged stream, one queue operation a batch
    rather than two a message (those doubled a merged consumer's CPU per message)."""

    __slots__ = ("fn",)

    def __init__(self, fn: Callable[[list[Message]], object]) -> None:
        self.fn = fn

    def __call__(self, message: Message) -> object:
        return self.fn([message])


Consumer = TypeVar("Consumer", bound=Part)
_CLOSED = object()
_SLICE_S = 0.25  # how often a blocked receive looks whether a partition's consumer broke


class PartitionConsumers(Generic[Consumer]):
    """The consumers of ``name``'s ``partitions`` partitions (``make(partition, on_message)``
    attaches one)."""

    def __init__(
        self,
        make: Callable[[str, Callable[[Message], object]], Consumer],
        name: str,
        partitions: int,
        on_message: Callable[[Message], object] | None,
    ) -> None:
        self._ready: queue.Queue[object] = queue.Queue()  # delivery batches, then _CLOSED
        self._held: deque[Message] = deque()  # taken from a batch, not yet received
        self._receiving = on_message is None
        self._lock = threading.Lock()  # receivers in several threads take turns
        self.parts: list[Consumer] = []
        handler = on_message or Batches(self._ready.put)
        try:
            for index in range(partitions):
                self.parts.append(make(partition_name(name, index), handler))
        except BaseException:
            self.close()
            raise

    def receive_many(self, max_messages: int, timeout: float | None) -> list[Message]:
        if not self._receiving:
            raise RuntimeError(
                "this consumer hands its messages to its on_message callback; receive() is for "
                "consumers made without one"
            )
        deadline = None if timeout is None else time.monotonic() + timeout
        held = self._held
        with self._lock:
            while not held:
                left = _SLICE_S if deadline is None else min(deadline - time.monotonic(), _SLICE_S)
                try:
                    first = self._ready.get(timeout=max(left, 0.0))
                except queue.Empty:
                    self._raise_broken()
                    if deadline is not None and time.monotonic() >= deadline:
                        return []
                    continue
                if first is _CLOSED:
                    self._ready.put(_CLOSED)
                    return []
                held.extend(cast("list[Message]", first))
            while len(held) < max_messages:
                try:
                    more = self._ready.get_nowait()
                except queue.Empty:
                    break
                if more is _CLOSED:
                    self._ready.put(_CLOSED)
                    break
                held.extend(cast("list[Message]", more))
            return [held.popleft() for _ in range(min(max_messages, len(held)))]

    def _raise_broken(self) -> None:
        """A partition's consumer that broke for good (it could not attach again): its error."""
        for part in self.parts:
            if part.error is not None and not part.serving:
                raise part.error

    def wait(self, timeout: float | None) -> bool:
        deadline = None if timeout is None else time.monotonic() + timeout
        for part in self.parts:
            left = None if deadline is None else max(deadline - time.monotonic(), 0.0)
            if not part.wait(left):
                return False
        return True

    def settle(self, verb: str, messages: Message | Iterable[Message]) -> Future:
        """Each message settled by the consumer that delivered it; one future for them all."""
        msgs = [messages] if isinstance(messages, Message) else list(messages)
        by_part: dict[int, tuple[Consumer, list[Message]]] = {}
        for m in msgs:
            owner = cast("Consumer", m._owner())  # (the partition's that delivered it)
            entry = by_part.setdefault(id(owner), (owner, []))
            entry[1].append(m)
        futures = [getattr(part, _VERBS[verb])(ms) for part, ms in by_part.values()]
        return _all(futures)

    def close(self) -> None:
        for part in self.parts:
            with contextlib.suppress(SparkMQError):
                part.close()
        self._ready.put(_CLOSED)


# (a release, a nack for another consumer, is a nack here: each partition's consumer decides)
_VERBS = {"ack": "ack", "nack": "nack", "extend": "extend_lease", "release": "nack"}


def _all(futures: list[Future]) -> Future:
    """One future: done when all are, failed with the first failure."""
    joined: Future = Future()
    if not futures:
        joined.set_result(None)
        return joined
    left = [len(futures)]
    lock = threading.Lock()

    def done(f: Future) -> None:
        with lock:
            left[0] -= 1
            last = left[0] == 0
        if joined.done():
            return
        if f.exception() is not None:
            with contextlib.suppress(Exception):
                joined.set_exception(f.exception())
        elif last:
            with contextlib.suppress(Exception):
                joined.set_result(None)

    for f in futures:
        f.add_done_callback(done)
    return joined
