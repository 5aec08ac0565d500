"""Limits and flow control on produce: per-destination and broker-wide message / byte limits
(reject, block or drop the oldest), and the memory states' throttling and blocking."""

from __future__ import annotations

import threading
import time

from spark_mq.broker.destination import Destination
from spark_mq.broker.disposal import Disposer
from spark_mq.broker.memory import THROTTLE_S, MemoryMonitor
from spark_mq.broker.registry import Destinations
from spark_mq.clock import Clock
from spark_mq.config import BrokerConfig
from spark_mq.errors import DestinationFull
from spark_mq.journal import Journal


class Limits:
    def __init__(
        self,
        destinations: Destinations,
        journal: Journal,
        config: BrokerConfig,
        clock: Clock,
        memory: MemoryMonitor,
        disposer: Disposer,
        stopping: threading.Event,
    ) -> None:
        self.destinations = destinations
        self.journal = journal
        self.config = config
        self.clock = clock
        self.memory = memory
        self.disposer = disposer
        self._stopping = stopping  # the broker closes: a blocked producer gives up

    def usage(self, dest: Destination) -> tuple[int, int]:
        """Unsettled messages (of the slowest subscription) and bytes held for ``dest``."""
        end = self.journal.end_offset(dest.name)
        with dest.lock:
            subs = list(dest.subscriptions.values())
        depth = max((s.depth_estimate(end) for s in subs), default=0)
        return depth, dest.store.nbytes if subs else 0

    def may_wait(self, destination: str) -> bool:
        """Whether a produce to ``destination`` could wait now: a ``block`` overflow policy
        with a limit set, or the memory in state orange or red (a cheap over-estimate)."""
        if self.memory.state in ("orange", "red"):
            return True
        lim = self.config.limits
        if lim.overflow == "block" and (lim.max_messages or lim.max_bytes):
            return True
        dest = self.destinations.find(destination)
        st = dest.settings if dest is not None else self.config.destinations
        return st.overflow == "block" and bool(st.max_messages or st.max_bytes)

    def make_room(self, dest: Destination, n: int, size: int) -> None:
        """Apply the destination's and the broker's limits to ``n`` messages of ``size`` bytes
        of bodies about to be stored."""
        st, lim = dest.settings, self.config.limits
        if not (st.max_messages or st.max_bytes or lim.max_messages or lim.max_bytes):
            return
        deadline = self.clock.monotonic() + lim.block_timeout_s

        def over() -> tuple[str, bool, int] | None:
            """What is over a limit: why, whether broker-wide, and how many messages too many."""
            depth, held = self.usage(dest)
            if st.max_messages and depth + n > st.max_messages:
                why = f"{dest.name!r} holds {depth} of at most {st.max_messages} messages"
                return why, False, depth + n - st.max_messages
            if st.max_bytes and held + size > st.max_bytes:
                return f"{dest.name!r} holds {held} of at most {st.max_bytes} bytes", False, n
            if lim.max_messages or lim.max_bytes:
                usage = [self.usage(d) for d in self.destinations.all()]
                total_n, total_b = sum(u[0] for u in usage), sum(u[1] for u in usage)
                if lim.max_messages and total_n + n > lim.max_messages:
                    why = f"the broker holds {total_n} of at most {lim.max_messages} messages"
                    return why, True, total_n + n - lim.max_messages
                if lim.max_bytes and total_b + size > lim.max_bytes:
                    why = f"the broker holds {total_b} of at most {lim.max_bytes} bytes"
                    return why, True, n
            return None

        while (problem := over()) is not None:
            why, system, excess = problem
            policy = lim.overflow if system else st.overflow
            if policy == "drop_oldest":  # from the destination being produced to
                with dest.lock:
                    subs = list(dest.subscriptions.values())
                if not sum(sub.drop_oldest(max(excess, 1)) for sub in subs):
                    policy = "reject"  # nothing waiting to drop (all leased)
                else:
                    for sub in subs:
                        self.disposer.run(dest, sub)
                    return
            if (
                policy == "block"
                and self.clock.monotonic() < deadline
                and not self._stopping.is_set()
            ):
                time.sleep(0.01)
                continue
            setting = "limits" if system else f"destination {dest.name!r}"
            raise DestinationFull(
                f"{why}: batch of {n} refused ({setting} overflow = {policy}); consume, or "
                "raise the limit",
                destination=dest.name,
            )

    def admit_memory(self, dest: Destination, size: int) -> None:
        """Throttle producers at orange, block them at red (the seeds' memory states); ``size``:
        the bytes about to be held."""
        memory = self.memory
        state = memory.note_added(size)
        if state == "orange":
            time.sleep(THROTTLE_S)
        elif state == "red":
            timeout = self.config.limits.block_timeout_s
            if not memory.wait_below_red(timeout):
                raise DestinationFull(
                    f"the broker's memory is in state red ({memory.used} of "
                    f"{memory.budget} bytes): producers blocked {timeout}s and it did not "
                    "improve; consume, or raise limits.memory_budget_bytes",
                    destination=dest.name,
                )
