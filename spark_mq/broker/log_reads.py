"""Reading a destination as a log, by offset: what a Kafka consumer does (a fetch from an
offset, the end offset, the first offset at a time), beside the subscriptions, leases and acks
through which every other consumer takes messages. Nothing read here is leased or settled.

Older messages come from Delta, the newest from the hot tier's records not moved yet
(:meth:`Journal.read_messages <spark_mq.journal.Journal.read_messages>`): a read may take tens of
milliseconds, so callers make it off the listeners' loops, except :meth:`LogReads.read_recent`,
which reads only what the hot tier still holds in memory (the tail a waiting reader was woken
for) and says None otherwise. A reader waiting for the next
messages is woken on the committing thread (:meth:`LogReads.watch`).
"""

from __future__ import annotations

from collections.abc import Callable

import pyarrow as pa
import pyarrow.compute as pc

from spark_mq.broker.registry import Destinations
from spark_mq.journal import Journal
from spark_mq.schema import TS


class LogReads:
    def __init__(self, destinations: Destinations, journal: Journal) -> None:
        self.destinations = destinations
        self.journal = journal

    def end(self, destination: str) -> int:
        """One past the last durable offset."""
        self.destinations.get(destination)
        return self.journal.end_offset(destination)

    def read(self, destination: str, start: int, end: int) -> pa.Table:
        """The durable messages ``start <= offset < end`` (rows of ``MESSAGE_SCHEMA``)."""
        self.destinations.get(destination)
        return self.journal.read_messages(destination, start, end)

    def read_recent(self, destination: str, start: int, end: int) -> pa.Table | None:
        """As :meth:`read`, when the rows are all still in the hot tier's memory (quick: a
        loop may read them); else None."""
        self.destinations.get(destination)
        return self.journal.read_recent(destination, start, end)

    def offset_at(self, destination: str, time_us: int) -> int | None:
        """The first offset enqueued at or after ``time_us`` (None: none was)."""
        self.destinations.get(destination)
        rows = self.journal.read_messages(destination, 0, None)
        later = rows.filter(pc.greater_equal(rows["enqueue_time"], pa.scalar(time_us, TS)))
        if later.num_rows == 0:
            return None
        return int(pc.min(later["offset"]).as_py())

    def watch(self, destination: str, wake: Callable[[], None]) -> Callable[[], None]:
        """Call ``wake`` (on the committing thread: quick, no locks) after each commit of
        messages to ``destination``, until the returned function is called."""
        dest = self.destinations.get(destination)
        with dest.lock:
            dest.log_watchers.add(wake)

        def unwatch() -> None:
            with dest.lock:
                dest.log_watchers.discard(wake)

        return unwatch
