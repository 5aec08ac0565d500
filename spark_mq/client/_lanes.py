"""Which waiting message a pool's free handler takes next: the bookkeeping of message-driven
consumers with a pool of handlers (the sync SDK's ``on_message`` with ``concurrency``, the
asyncio SDK's ``serve``). No threads, no I/O: the pools lock around it.

Seed 001's activation specification: a bounded pool of handlers (``maxPoolDepth``) takes a
consumer's messages concurrently, and a message that finds no free handler within the start
timeout goes back, for another endpoint to take. Message groups keep their order: a group is
handled by one handler at a time, and a message of a group that is being handled waits behind
it, for the same handler (it does not count against the start timeout, which is for finding a
free handler: giving it back while its group's earlier message runs would break the order).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import Generic, TypeVar

M = TypeVar("M")


class Lanes(Generic[M]):
    """Messages waiting for a handler, in arrival order, one lane per message group."""

    def __init__(self, group_of: Callable[[M], str | None]) -> None:
        self._group_of = group_of
        self._ready: deque[tuple[float, M]] = deque()  # (arrived, message): for any handler
        self._behind: dict[str, deque[M]] = {}  # a group taken or waiting: its later messages

    def __len__(self) -> int:
        return len(self._ready) + sum(map(len, self._behind.values()))

    def add(self, message: M, now: float) -> None:
        group = self._group_of(message)
        if group is not None:
            if group in self._behind:  # its group is being handled or waits: behind it
                self._behind[group].append(message)
                return
            self._behind[group] = deque()
        self._ready.append((now, message))

    def take(self) -> M | None:
        """The next message for a free handler (None: nothing waits for one)."""
        return self._ready.popleft()[1] if self._ready else None

    def done(self, message: M) -> M | None:
        """The handler of ``message`` is done with it: the next message of its group, which
        the same handler takes now (None: its group is free again, or it had none)."""
        group = self._group_of(message)
        if group is None:
            return None
        later = self._behind.get(group)
        if later:
            return later.popleft()
        self._behind.pop(group, None)
        return None

    def expired(self, now: float, limit_s: float) -> list[M]:
        """Messages that waited longer than ``limit_s`` for a free handler, taken out (their
        groups' later messages with them, in order: they go back together)."""
        out: list[M] = []
        while self._ready and now - self._ready[0][0] > limit_s:
            message = self._ready.popleft()[1]
            out.append(message)
            group = self._group_of(message)
            if group is not None:
                out.extend(self._behind.pop(group, ()))
        return out

    def drain(self) -> list[M]:
        """Every waiting message, taken out (the pool stops)."""
        out = [m for _, m in self._ready]
        for later in self._behind.values():
            out.extend(later)
        self._ready.clear()
        self._behind.clear()
        return out
