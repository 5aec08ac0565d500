"""Idempotent Kafka producers' sequence numbers, as one listener has seen them.

An idempotent producer (a producer id and epoch from InitProducerId) numbers its records per
partition. A batch must start where the one before it ended: one past that was sent after a
batch the broker never stored, and is refused ``OUT_OF_ORDER_SEQUENCE_NUMBER`` as Kafka refuses
it. The client then sends the missing batch again, and the refused ones after it, in order
(librdkafka drains what it has in flight and bumps the epoch; the Java client does likewise).
A batch at or before the next expected one is a retry; the dedup ids its records are given
(``kafka-<producer id>-<epoch>-<sequence>``) store it once.

A batch refused because its topic is another cluster member's, or being placed here just now
(``NotOwner``), is not stored either: the next expected stays its first sequence. Before, a
batch already in flight behind it, arriving once this member had taken the topic on, was
stored ahead of it.

What is expected is kept with the **term** it was seen in: the epoch with which this member
serves the topic, or with which it is being placed here (one broker: always 0). When the topic
goes to another member and later comes back, what was expected before is stale (the producer
has sent on, elsewhere); a batch refused while the topic was being placed here counts for the
term that follows, since the same assignment is being taken on.

A producer's first batch of a term is checked against what **the log** holds of it, as a
Kafka broker's new leader checks it against the producer state it rebuilt from the log: the
sequence after the newest one stored (its dedup ids, which the topic's duplicate cache holds,
refilled from the log when the topic was taken on). Before, that first batch was taken
whatever its sequence. The old owner refused a batch while it let the topic go, and the new
owner accepted the next one, which left a gap. librdkafka counts a batch acknowledged after
a missing one as proof that the missing one was stored too (its "implicit ack"), so four
messages were reported delivered and never stored (once in a few hundred moves).

A producer of which the log holds **nothing** is expected to start at sequence 0 when the
topic's producer state can say so (:mod:`spark_mq.broker.producer_state`: -1 from ``stored``),
which the topic's last owner hands on with it. Before, its
first batch of the term was taken whatever its sequence, as Kafka takes a batch from a
producer whose state it no longer has. After a move, the new owner took a producer's batch
2280 as the topic's first (offset 0): batches 0 to 2279 had been refused by the old owner
while it let the topic go, and librdkafka's implicit ack then reported them delivered (2,280
messages lost in one of about fourteen runs of twenty moves). Refused now, librdkafka sends
the missing batches again from the first. Where the state cannot say (a member was lost with
more rows written since its commits last carried the state than the refill reads back, or
some of those rows gone and the state not carried past them; or more producers than it
follows) any sequence is still taken, as Kafka
does for a producer whose state it no longer has.
"""

from __future__ import annotations

from collections.abc import Callable

_SEQUENCES = 2**31  # a producer's sequence numbers wrap at int32's end
_PRODUCERS_KEPT = 100_000  # producer and topic pairs whose next sequence is kept


def _after_stored(stored: Callable[[], int | None] | None) -> int | None:
    """The sequence after the newest the log holds (0: it holds none); None: not known."""
    newest = stored() if stored is not None else None
    return None if newest is None else (newest + 1) % _SEQUENCES


class OutOfOrder(Exception):
    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class Sequences:
    """The next sequence expected of each (producer id, epoch, topic), and the term it holds
    for. The Kafka listener's loop alone uses it (no lock)."""

    def __init__(self, kept: int = _PRODUCERS_KEPT) -> None:
        self._next: dict[tuple[int, int, str], tuple[int, int]] = {}
        self._kept = kept

    def __len__(self) -> int:
        return len(self._next)

    def check(
        self,
        topic: str,
        pid: int,
        epoch: int,
        first: int,
        term: int | None,
        stored: Callable[[], int | None] | None = None,
    ) -> None:
        """Raise ``OutOfOrder`` if a batch starting at ``first`` skips sequences expected in
        ``term`` (None: the topic is not this member's; nothing is expected of it here).
        ``stored``: the newest sequence of the producer's that the topic holds (-1: certainly
        none; None: not known), asked when nothing is expected of it in this term yet."""
        if term is None:
            return
        expected = self._expected(topic, pid, epoch, term)
        if expected is None:
            expected = _after_stored(stored)
            if expected is not None:
                self._set((pid, epoch, topic), expected, term)
        if (
            expected is not None
            and first != expected
            and (first - expected) % _SEQUENCES < (_SEQUENCES // 2)
        ):
            raise OutOfOrder(
                f"producer {pid} (epoch {epoch}) sent sequence {first} to {topic}; the next "
                f"expected is {expected}: a batch before it was not stored"
            )

    def taken(
        self, topic: str, pid: int, epoch: int, first: int, count: int, term: int | None
    ) -> None:
        """A batch was taken to be stored: the next expected is past it (a retry of an older
        one leaves it where it is)."""
        if term is None:
            return
        end = (first + count) % _SEQUENCES
        expected = self._expected(topic, pid, epoch, term)
        if expected is None or (end - expected) % _SEQUENCES < _SEQUENCES // 2:
            self._set((pid, epoch, topic), end, term)

    def refused_for_a_move(
        self,
        topic: str,
        pid: int,
        epoch: int,
        first: int,
        term: int | None,
        stored: Callable[[], int | None] | None = None,
    ) -> None:
        """A batch starting at ``first`` was refused ``NotOwner``: the batches after it must
        wait for it, and for any the log is missing before it (``stored`` as for
        :meth:`check`). Refused because another member has the topic (``term`` None), nothing
        is expected here any more."""
        key = (pid, epoch, topic)
        if term is None:
            self._next.pop(key, None)
            return
        expected = self._expected(topic, pid, epoch, term)
        follows = _after_stored(stored) if expected is None else None
        if follows is not None and (first - follows) % _SEQUENCES < _SEQUENCES // 2:
            first = follows  # (the log lacks the ones from there on)
        if expected is None or (first - expected) % _SEQUENCES < _SEQUENCES // 2:
            self._set(key, first, term)

    def producers(self, topics: set[str]) -> dict[str, list[tuple[int, int, int]]]:
        """The idempotent producers it follows of each of ``topics``: ``(producer id, epoch,
        last sequence)`` (Kafka's DescribeProducers), in one pass."""
        out: dict[str, list[tuple[int, int, int]]] = {}
        if topics:
            for (pid, epoch, name), (expected, _term) in self._next.items():
                if name in topics:
                    out.setdefault(name, []).append((pid, epoch, (expected - 1) % _SEQUENCES))
        return out

    def _expected(self, topic: str, pid: int, epoch: int, term: int) -> int | None:
        kept = self._next.get((pid, epoch, topic))
        if kept is None or kept[1] != term:
            return None  # (none yet, or from an earlier term: the producer sent on elsewhere)
        return kept[0]

    def _set(self, key: tuple[int, int, str], expected: int, term: int) -> None:
        self._next.pop(key, None)  # (kept in the order last used)
        self._next[key] = (expected, term)
        if len(self._next) > self._kept:  # the one unused longest goes
            del self._next[next(iter(self._next))]
