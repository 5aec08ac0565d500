"""Where each producer numbering its dedup ids got to in one destination's log: its producer
state, as a Kafka broker keeps one per partition.

A producer that numbers its ids (``<prefix>-<n>``: the SDK's, and a Kafka idempotent
producer's ``kafka-<producer id>-<epoch>-<sequence>``) is followed by the newest number the log
holds of its prefix. Unlike the duplicate cache's ids, which go after 20,000 messages or five
minutes, a producer's number stays: one entry a producer, not one a message. A Kafka
producer's first batch to a topic a member has just taken on is checked against it
(:mod:`spark_mq.transports.kafka.sequences`).

The state is **complete** when every prefix the log holds is followed (or was forgotten, which
is noted): then a prefix it does not follow is one the log holds nothing of. It is complete when
it began from the whole log (an empty one, or a refill that read every row), or from the state
the destination's last owner **handed on** with the rows after it. A cluster member letting a
destination go writes its state and the log's end offset into the message log (the commit info
of a commit of no rows, :meth:`ProducerState.handed`), and its commits to Delta carry it too
(its hot tier's moves, or without one each commit), at most every second when it changed (for
a member lost), as does compaction's commit removing rows; the member taking it on
begins from the newest and the rows committed after it, as a Kafka broker loads its last
producer-state snapshot and replays the log after it (up to ``registry.REPLAY_ROWS`` rows, more
than the duplicate cache holds). Before this, a log longer than the duplicate cache, or
compacted, was never complete again once moved: a new Kafka producer whose first batches the
old owner refused while it let the topic go could then have a later batch taken first by the
new owner, leaving a gap that librdkafka reports delivered.

At most ``_FOLLOWED`` prefixes are followed, those stored to longest ago go first; the forgotten
ones are noted (at most ``_FORGOTTEN`` of them, about 1 MB with the followed): past that, the
state is no longer complete.
"""

from __future__ import annotations

import json
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

_FOLLOWED = 10_000  # prefixes whose newest number is kept (each about 100 bytes)
_FORGOTTEN = 10_000  # prefixes no longer followed that are still known to be in the log


def numbered(dedup_id: str) -> tuple[str, int] | None:
    """``("prefix", n)`` for a numbered id (``prefix-n``: n in ASCII digits, no leading
    zero), else None."""
    prefix, sep, number = dedup_id.rpartition("-")
    if (
        not sep
        or not (number.isascii() and number.isdigit())
        or (len(number) > 1 and number[0] == "0")
    ):
        return None
    return prefix, int(number)


def newest_numbers(ids: Sequence[str | None]) -> dict[str, int]:
    """Each numbered prefix's newest number among ``ids``, read in log order: the prefix
    stored to longest ago first. Only each prefix's last id is parsed."""
    last: dict[str, int] = {}  # the newest prefix first
    for dedup_id in reversed(ids):
        if dedup_id is None:
            continue
        prefix, sep, _ = dedup_id.rpartition("-")
        if prefix in last or not sep:
            continue
        parsed = numbered(dedup_id)
        if parsed is not None:
            last[prefix] = parsed[1]
    return {prefix: last[prefix] for prefix in reversed(last)}


class ProducerState:
    """The newest number stored of each prefix. Not thread-safe: its owner locks."""

    def __init__(self) -> None:
        self._newest: OrderedDict[str, int] = OrderedDict()  # stored to longest ago first
        self._forgotten: set[str] = set()
        self.complete = True  # (a new destination's log is empty)
        self.changes = 0  # how many times it changed (a state handed on says when)

    def __len__(self) -> int:
        return len(self._newest)

    def stored(self, prefix: str, number: int) -> None:
        """``<prefix>-<number>`` is in the log, the newest of its prefix (stores come in log
        order; a Kafka producer's sequences wrap, so the last stored is the newest, not the
        greatest)."""
        self.changes += 1
        newest = self._newest
        if prefix in newest:
            newest.move_to_end(prefix)
        newest[prefix] = number
        if len(newest) > _FOLLOWED:
            self._forget(newest.popitem(last=False)[0])

    def replayed(self, newest: dict[str, int]) -> None:
        """Rows read back from the log were stored: ``newest`` (:func:`newest_numbers`)."""
        for prefix, number in newest.items():
            self.stored(prefix, number)

    def _forget(self, prefix: str) -> None:
        if not self.complete:
            return
        self._forgotten.add(prefix)
        if len(self._forgotten) > _FORGOTTEN:  # (too many producers to tell one by one)
            self.complete = False
            self._forgotten.clear()

    def newest(self, prefix: str) -> int | None:
        """The newest number the log holds of ``prefix``; -1 when it certainly holds none;
        None when that is not known."""
        number = self._newest.get(prefix)
        if number is not None:
            return number
        return -1 if self.complete and prefix not in self._forgotten else None

    def began_partway(self) -> None:
        """What the log holds before the rows read is not known."""
        self.changes += 1
        self.complete = False
        self._forgotten.clear()

    # -- handed on from one owner to the next ----------------------------------------------
    def handed(self, end: int, claimed: dict[str, int] | None = None) -> str:
        """This state as it stands with the log ending at ``end``, written down for the next
        owner (JSON); ``claimed``: newer numbers of rows stored whose store it was not told of
        yet."""
        return json.dumps(
            {
                "end": end,
                "complete": self.complete,
                "newest": {**self._newest, **(claimed or {})},
                "forgotten": sorted(self._forgotten),
            },
            separators=(",", ":"),
        )

    def begin_from(self, handed: str, start: int, end: int) -> int | None:
        """Begin from a state handed on (:meth:`handed`) when the rows that follow it are
        read, from ``start`` to the log's ``end``: what is followed now is forgotten. Returns
        the offset the rows to replay begin at (the log's end when it was handed), None when
        the state cannot be used (it ended before ``start`` or after ``end``, or it does not
        read)."""
        try:
            got: Any = json.loads(handed)
            handed_end, complete = int(got["end"]), bool(got["complete"])
            newest = {str(p): int(n) for p, n in got["newest"].items()}
            forgotten = {str(p) for p in got["forgotten"]}
        except (ValueError, KeyError, TypeError, AttributeError):
            return None
        if not start <= handed_end <= end:
            return None
        self._newest = OrderedDict(newest)
        self._forgotten = forgotten
        self.complete = complete
        self.changes += 1
        return handed_end
