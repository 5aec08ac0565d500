"""Message-group bookkeeping of one subscription.

A group maps to one of ``buckets`` buckets (``crc32(group) % buckets``: memory stays bounded,
as Artemis' group-buckets); a bucket is owned by one consumer. Per bucket the subscription
counts its unsettled messages (*live*: the consumer's fair share is live buckets / consumers),
its leased ones (*busy*: a bucket whose owner left moves only once nothing of it is leased,
so a group is never processed by two consumers at once) and its scheduled ones (*held*: a
later message of the bucket waits for an earlier one's time, so order holds).

A consumer keeps the buckets it owns while it stays (a group's next message goes to the same
consumer, as Artemis does), but its share counts only those that are live (``owned``): a
bucket all of whose messages were acked no longer takes up its owner's share. Counted as all
it had ever owned, a consumer that had acked one group's messages was refused every new group
(its share of one live bucket was used up), and the group's messages waited for ever.
"""

from __future__ import annotations

import zlib


def bucket_of(group: str, buckets: int) -> int:
    return zlib.crc32(group.encode()) % buckets


def _inc(counts: dict[int, int], key: int) -> None:
    counts[key] = counts.get(key, 0) + 1


def _dec(counts: dict[int, int], key: int) -> None:
    left = counts.get(key, 0) - 1
    if left > 0:
        counts[key] = left
    else:
        counts.pop(key, None)


class Groups:
    """Callers hold the subscription's lock. ``of`` maps an offset of a grouped message that
    is waiting or leased to its bucket (the bucket count is fixed, so buckets keep meaning)."""

    def __init__(self, buckets: int) -> None:
        self.buckets = buckets
        self.of: dict[int, int] = {}
        self.owners: dict[int, int] = {}  # bucket -> consumer
        self.owned: dict[int, int] = {}  # consumer -> live buckets it owns (its share used)
        self.live: dict[int, int] = {}
        self.busy: dict[int, int] = {}
        self.held: dict[int, int] = {}

    def __bool__(self) -> bool:
        return bool(self.of)

    def add(self, offset: int, group: str, known: dict[str, int]) -> None:
        """A grouped message was ingested (``known`` caches buckets of groups seen lately)."""
        b = known.get(group)
        if b is None:
            b = known[group] = bucket_of(group, self.buckets)
        self.of[offset] = b
        if b not in self.live and (owner := self.owners.get(b)) is not None:
            _inc(self.owned, owner)  # its bucket is live again: in its owner's share
        _inc(self.live, b)

    def hold(self, offset: int) -> None:
        if (b := self.of.get(offset)) is not None:
            _inc(self.held, b)

    def unhold(self, offset: int) -> None:
        if (b := self.of.get(offset)) is not None:
            _dec(self.held, b)

    def leased(self, offset: int, consumer_id: int | None = None) -> None:
        """Leased; with ``consumer_id``, it also owns the bucket if nobody does."""
        if (b := self.of.get(offset)) is None:
            return
        _inc(self.busy, b)
        if consumer_id is not None and b not in self.owners:
            self.own(b, consumer_id)

    def own(self, bucket: int, consumer_id: int) -> None:
        """``consumer_id`` becomes the owner of ``bucket`` (which has no owner)."""
        self.owners[bucket] = consumer_id
        if bucket in self.live:
            _inc(self.owned, consumer_id)

    def returned(self, offset: int) -> None:
        if (b := self.of.get(offset)) is not None:
            _dec(self.busy, b)

    def settled(self, offset: int, *, was_leased: bool) -> bool:
        """Gone for good; True when that left its bucket free for a new owner."""
        b = self.of.pop(offset, None)
        if b is None:
            return False
        if was_leased:
            _dec(self.busy, b)
        _dec(self.live, b)
        if b not in self.live and (owner := self.owners.get(b)) is not None:
            _dec(self.owned, owner)  # empty: no longer in its owner's share
            return True  # its owner may take a new group in its place
        return b not in self.busy and b not in self.owners

    def share(self, consumers: int) -> int:
        """How many buckets one consumer may own: live buckets dealt out evenly."""
        return -(-len(self.live) // max(consumers, 1))

    def release(self, consumer_id: int) -> None:
        for b in [b for b, c in self.owners.items() if c == consumer_id]:
            del self.owners[b]
        self.owned.pop(consumer_id, None)
