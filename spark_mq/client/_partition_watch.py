"""Partitions added to a destination reach the producers and consumers already using it: a
thread of theirs asks the broker, every ``partitions_recheck_s`` seconds, how many partitions
each partitioned destination they use has now, and hands on a count that grew (as Kafka
clients find new partitions in the metadata they read every ``metadata.max.age.ms``).

A count only grows (partitions are never taken away). One the owner could not take on now (a
consumer that could not attach to a new partition yet) is asked about again next time.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from spark_mq.errors import SparkMQError

log = logging.getLogger(__name__)

DEFAULT_RECHECK_S = 30.0


def checked_recheck_s(every_s: float) -> float:
    """``partitions_recheck_s`` as given, refused when negative (said before connecting)."""
    if every_s < 0:
        raise ValueError(f"partitions_recheck_s must be 0 (never) or more, got {every_s}")
    return every_s


class PartitionWatch:
    """``ask(name)``: the count now; ``grown(name, count)``: one that grew (raising, it is
    not taken: asked about again). ``every_s`` 0: never asked again."""

    def __init__(
        self,
        every_s: float,
        ask: Callable[[str], int],
        grown: Callable[[str, int], None],
        label: str,
    ) -> None:
        self.every_s = checked_recheck_s(every_s)
        self._ask, self._grown, self._label = ask, grown, label
        self._counts: dict[str, int] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def watch(self, name: str, count: int) -> None:
        """Ask about ``name`` (``count`` partitions now) from now on."""
        if not self.every_s:
            return
        with self._lock:
            if self._stop.is_set() or name in self._counts:
                return
            self._counts[name] = count
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name=f"{self._label}-partitions", daemon=True
                )
                self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.every_s):
            self.check()

    def check(self) -> None:
        """Ask about every destination watched now (what the thread does each time)."""
        with self._lock:
            counts = dict(self._counts)
        for name, count in counts.items():
            if self._stop.is_set():
                return
            try:
                now = self._ask(name)
                if now > count:
                    self._grown(name, now)
                    log.info("%s: %s now has %d partitions (had %d)", self._label, name, now, count)
                    with self._lock:
                        self._counts[name] = now
            except SparkMQError as exc:  # (asked again next time)
                log.warning(
                    "%s: could not take on %s's new partitions yet: %s",
                    self._label,
                    name,
                    exc.message,
                )
            except Exception:
                log.exception("%s: looking for %s's new partitions failed", self._label, name)

    def close(self) -> None:
        self._stop.set()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join()
