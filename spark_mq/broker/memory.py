"""The broker's memory resource states (the seeds' green / yellow / orange / red).

What counts is the Arrow rows held for unsettled messages, against ``limits.memory_budget_bytes``.
As the state worsens the broker, in order of the seeds:

* **yellow** (60 %): evicts message bodies, oldest first (they are re-read from the journal
  when delivered), until it is back under 60 % if it can;
* **orange** (75 %): also throttles producers (each batch waits ``THROTTLE_S``);
* **red** (90 %): also blocks producers until the state improves (at most
  ``limits.block_timeout_s``, then ``DestinationFull``).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterable

from spark_mq.broker.message_store import MessageStore

STATES = ("green", "yellow", "orange", "red")
THRESHOLDS = (0.0, 0.60, 0.75, 0.90)
THROTTLE_S = 0.005


def physical_memory() -> int:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return 8 << 30


def default_budget() -> int:
    """A quarter of the machine's memory."""
    return physical_memory() // 4


def state_of(used: int, budget: int) -> str:
    share = used / budget if budget else 0.0
    if share < THRESHOLDS[1]:  # the usual answer, asked at every produce
        return STATES[0]
    state = STATES[0]
    for name, threshold in zip(STATES, THRESHOLDS, strict=True):
        if share >= threshold:
            state = name
    return state


class MemoryMonitor:
    def __init__(self, budget: int) -> None:
        self.budget = budget or default_budget()
        self._lock = threading.Lock()
        self._improved = threading.Condition(self._lock)
        self.used = 0
        self.state = "green"
        self.evicted_bytes = 0

    def note_added(self, nbytes: int) -> str:
        """Producers' estimate between two measurements; returns the state now."""
        with self._lock:
            self.used += nbytes
            self.state = state_of(self.used, self.budget)
            return self.state

    def measure(self, stores: Iterable[MessageStore]) -> str:
        """Recount what the stores hold; at yellow or worse evict bodies; returns the state."""
        stores = list(stores)
        used = sum(s.nbytes for s in stores)
        if state_of(used, self.budget) != "green":
            target = int(self.budget * THRESHOLDS[1])
            for store in sorted(stores, key=lambda s: s.nbytes, reverse=True):
                if used <= target:
                    break
                freed = store.evict_bodies(store.nbytes - (used - target))
                self.evicted_bytes += freed
                used -= freed
        with self._lock:
            self.used = used
            self.state = state_of(used, self.budget)
            self._improved.notify_all()
            return self.state

    def wait_below_red(self, timeout: float) -> bool:
        with self._lock:
            return self._improved.wait_for(lambda: self.state != "red", timeout)

    def stats(self) -> dict[str, object]:
        with self._lock:
            return {
                "memory_state": self.state,
                "memory_used_bytes": self.used,
                "memory_budget_bytes": self.budget,
                "memory_evicted_bytes": self.evicted_bytes,
            }
