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

from spark_mq.client.message import Message, MessageBatch
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
    """An ``on_message`` that takes each delivery whole, as a :class:`MessageBatch`
    (``fn(batch)``): how a partition's consumer hands its messages to the merged stream, one
    queue operation a batch rather than two a message (those doubled a merged consumer's CPU
    per message), and no Python object a message unless the receiver asks for messages."""

    __slots__ = ("fn",)

    def __init__(self, fn: Callable[[MessageBatch], object]) -> None:
        self.fn = fn

    def __call__(self, message: Message) -> object:
        return self.fn(MessageBatch(message.destination, None, message._consumer, [message]))


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
        self._held: deque[MessageBatch] = deque()  # taken from _ready, not yet received
        self._receiving = on_message is None
        self._lock = threading.Lock()  # receivers in several threads take turns
        self._closing = False  # the queue's end was read
        self.parts: list[Consumer] = []
        self._make, self._name = make, name
        self._handler = on_message or Batches(self._ready.put)
        self._growing = threading.Lock()  # (partitions added, or all closed: one at a time)
        self._closed = False
        try:
            self.grow(partitions)
        except BaseException:
            self.close()
            raise

    def grow(self, partitions: int) -> None:
        """A consumer of each partition up to ``partitions`` (partitions were added); one that
        cannot attach now raises, those attached before it kept."""
        with self._growing:
            for index in range(len(self.parts), partitions):
                if self._closed:
                    return
                self.parts.append(self._make(partition_name(self._name, index), self._handler))

    def receive_many(self, max_messages: int, timeout: float | None) -> list[Message]:
        held: deque[MessageBatch] = self._held
        got: list[Message] = []
        with self._lock:
            if not self._wait_held(timeout):
                return []
            while True:
                batch = held[0]
                want = max_messages - len(got)
                if len(batch) > want:
                    head, held[0] = batch._split(want)
                    got.extend(head)
                    return got
                got.extend(batch)
                held.popleft()
                if len(got) == max_messages or not (held or self._take(None, block=False)):
                    return got

    def receive_batch(self, max_messages: int, timeout: float | None) -> MessageBatch | None:
        """The next delivery (one partition's), up to ``max_messages`` of it."""
        held = self._held
        with self._lock:
            if not self._wait_held(timeout):
                return None
            batch = held.popleft()
            if len(batch) > max_messages:
                batch, rest = batch._split(max_messages)
                held.appendleft(rest)
            return batch

    def _wait_held(self, timeout: float | None) -> bool:
        """Whether a delivery is held, waiting up to ``timeout`` for one (the lock held)."""
        if not self._receiving:
            raise RuntimeError(
                "this consumer hands its messages to its on_message callback; receive() is for "
                "consumers made without one"
            )
        deadline = None if timeout is None else time.monotonic() + timeout
        while not self._held:
            left = _SLICE_S if deadline is None else min(deadline - time.monotonic(), _SLICE_S)
            if self._take(max(left, 0.0)):
                return True
            if self._closing:
                return False
            self._raise_broken()
            if deadline is not None and time.monotonic() >= deadline:
                return False
        return True

    def _take(self, timeout: float | None, *, block: bool = True) -> bool:
        """Move the next delivery from the partitions' queue to ``_held``."""
        try:
            item = self._ready.get(block, timeout)
        except queue.Empty:
            return False
        if item is _CLOSED:
            self._ready.put(_CLOSED)
            self._closing = True
            return False
        self._held.append(cast("MessageBatch", item))
        return True

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
        if type(messages) is MessageBatch:  # (all of one partition's)
            return cast("Future", getattr(messages._owner(), _VERBS[verb])(messages))
        msgs = [messages] if isinstance(messages, Message) else list(messages)
        by_part: dict[int, tuple[Consumer, list[Message]]] = {}
        for m in msgs:
            owner = cast("Consumer", m._owner())  # (the partition's that delivered it)
            entry = by_part.setdefault(id(owner), (owner, []))
            entry[1].append(m)
        futures = [getattr(part, _VERBS[verb])(ms) for part, ms in by_part.values()]
        return _all(futures)

    def close(self) -> None:
        with self._growing:
            self._closed = True
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
