"""The clock seam: lease, TTL and redelivery-delay logic reads time only through a ``Clock``.

``SystemClock`` is what the broker runs on; ``ManualClock`` lets tests move time forward
without sleeping.
"""

from __future__ import annotations

import threading
import time
from typing import Protocol


class Clock(Protocol):
    def monotonic(self) -> float:
        """Seconds on a clock that never goes backwards (for leases and timers)."""
        ...

    def wall(self) -> float:
        """Seconds since the epoch (for timestamps stored with messages)."""
        ...


class SystemClock:
    def monotonic(self) -> float:
        return time.monotonic()

    def wall(self) -> float:
        return time.time()


class ManualClock:
    """A clock that moves only when told to. Thread-safe."""

    def __init__(self, start_monotonic: float = 1000.0, start_wall: float | None = None) -> None:
        self._lock = threading.Lock()
        self._mono = start_monotonic
        self._wall = time.time() if start_wall is None else start_wall

    def monotonic(self) -> float:
        with self._lock:
            return self._mono

    def wall(self) -> float:
        with self._lock:
            return self._wall

    def advance(self, seconds: float) -> None:
        if seconds < 0:
            raise ValueError("a clock cannot go backwards")
        with self._lock:
            self._mono += seconds
            self._wall += seconds
