"""What the broker's timers and admin calls do to a subscription, next to delivery: release
scheduled messages, reap expired ones, hand doomed ones over for disposal, purge, drop the
oldest, browse, and report (a part of :class:`spark_mq.broker.subscription.Subscription`)."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

from sortedcontainers import SortedList

from spark_mq.broker.groups import Groups
from spark_mq.broker.selector import Selector

if TYPE_CHECKING:
    from spark_mq.broker.message_store import MessageStore
    from spark_mq.broker.subscription import Lease


class Housekeeping:
    """Mixed into ``Subscription``, whose state (under ``_lock``) it reads and changes."""

    _lock: threading.Lock
    _store: MessageStore
    _wall: Callable[[], float]
    _ready: dict[int, SortedList]
    _ready_n: int
    _scheduled: list[tuple[float, int]]
    _due: dict[int, float]
    _priority: dict[int, int]
    _counts: dict[int, int]
    _leases: dict[int, Lease]
    _groups: Groups
    _expiry: dict[int, int]
    _doomed: dict[int, str]
    _disposing: set[int]
    _settled: set[int]
    _consumers: list[int]
    _returned_log: list[int]
    _filtered_log: list[int]
    start_offset: int
    next_offset: int
    acked_total: int
    delivered_total: int
    nacked_total: int
    redelivered_total: int
    dead_lettered_total: int
    expired_total: int
    removed_total: int

    if TYPE_CHECKING:  # the subscription's own methods this part calls

        def _promote_due(self, now: float) -> int: ...
        def _ingest(self) -> None: ...
        def _unready(self, offset: int) -> bool: ...
        def _doom(self, offset: int, priority: int, why: str) -> None: ...
        def wake(self) -> None: ...

    # -- timers and the broker's follow-up work ----------------------------------------------
    def tick(self) -> int:
        """Scheduled messages whose time came become ready; returns how many."""
        with self._lock:
            n = self._promote_due(self._wall())
        if n:
            self.wake()
        return n

    def reap_expired(self) -> int:
        """Doom waiting messages whose expiry passed (the expiry reaper); returns how many."""
        now_us = int(self._wall() * 1_000_000)
        with self._lock:
            self._ingest()
            late = [o for o, e in self._expiry.items() if e <= now_us]
            n = 0
            for o in late:
                if o in self._leases or o in self._doomed:
                    continue
                p = self._priority.get(o)
                if self._unready(o):
                    self._doom(o, self._priority.pop(o, p or 0), "expired")
                    n += 1
            return n

    def claim_doomed(self) -> dict[int, tuple[str, int]]:
        """Doomed offsets nobody is disposing of yet: ``offset -> (reason, delivery count)``.

        Reasons: ``"dead"``, ``"expired"``, ``"purged"``, ``"dropped"``. The caller disposes of
        them and calls :meth:`finish`, or :meth:`unclaim` if that failed.
        """
        with self._lock:
            out = {
                o: (why, self._counts.get(o, 0))
                for o, why in self._doomed.items()
                if o not in self._disposing
            }
            self._disposing.update(out)
        return out

    def unclaim(self, offsets: Iterable[int]) -> None:
        with self._lock:
            self._disposing.difference_update(offsets)

    def finish(self, offsets: Iterable[int], outcome: str) -> None:
        """The broker settled doomed (or purged) offsets durably."""
        with self._lock:
            for o in offsets:
                self._disposing.discard(o)
                if self._doomed.pop(o, None) is None:
                    continue
                self._priority.pop(o, None)
                self._settled.add(o)
                self._groups.settled(o, was_leased=False)
                self._expiry.pop(o, None)
                self._counts.pop(o, None)
                if outcome == "expired":
                    self.expired_total += 1
                elif outcome == "dead_lettered":
                    self.dead_lettered_total += 1
                elif outcome in ("purged", "dropped"):
                    self.removed_total += 1

    def purge(self) -> list[int]:
        """Doom every waiting (not leased) message as purged; the broker settles them."""
        with self._lock:
            self._ingest()
            waiting = []
            for p, sl in self._ready.items():
                for o in sl:
                    self._doom(o, p, "purged")
                    waiting.append(o)
            for o in self._due:
                self._doomed[o] = "purged"
                waiting.append(o)
            self._ready.clear()
            self._ready_n = 0
            self._due.clear()
            self._scheduled.clear()
            self._groups.held.clear()
            return waiting

    def drop_oldest(self, n: int) -> int:
        """Doom up to ``n`` of the oldest waiting messages as dropped; returns how many."""
        with self._lock:
            self._ingest()
            victims: list[tuple[int, int]] = []
            for p, sl in self._ready.items():
                victims.extend((o, p) for o in sl.islice(0, n))
            victims.sort()
            for o, p in victims[:n]:
                self._ready[p].remove(o)
                self._ready_n -= 1
                self._doom(o, p, "dropped")
            return min(n, len(victims))

    def depth_estimate(self, end_offset: int) -> int:
        """Unsettled messages, cheaply (settled offsets not yet ingested count as unsettled)."""
        with self._lock:
            unseen = max(end_offset - self.next_offset, 0)
            return unseen + self._ready_n + len(self._due) + len(self._leases) + len(self._doomed)

    def drain_log(self) -> tuple[list[int], list[int]]:
        """Returned and selector-filtered offsets the broker should record, since last time."""
        with self._lock:
            returned, self._returned_log = self._returned_log, []
            filtered, self._filtered_log = self._filtered_log, []
        return returned, filtered

    def browse(self, limit: int, selector: Selector | None = None) -> list[int]:
        """Waiting offsets in delivery order (scheduled ones last), without leasing them."""
        out: list[int] = []
        with self._lock:
            self._ingest()
            promoted = self._promote_due(self._wall())
            waiting = [o for p in sorted(self._ready, reverse=True) for o in self._ready[p]]
            waiting += [o for _, o in sorted(self._scheduled) if o in self._due]
        if promoted:  # the timer will not promote these again: the consumers must hear of it
            self.wake()
        for o in waiting:
            if len(out) >= limit:
                break
            if selector is None or selector.matches(self._store.props(o)):
                out.append(o)
        return out

    # -- bookkeeping -------------------------------------------------------------------------
    def low_water(self) -> int:
        """Every offset below this is settled for this subscription."""
        with self._lock:
            candidates = [self.next_offset]
            candidates += [sl[0] for sl in self._ready.values() if sl]
            if self._leases:
                candidates.append(min(self._leases))
            if self._due:
                candidates.append(min(self._due))
            if self._doomed:
                candidates.append(min(self._doomed))
            low = min(candidates)
            self._settled = {o for o in self._settled if o >= low}
            return low

    def stats(self, end_offset: int) -> dict[str, int]:
        with self._lock:
            unseen = max(end_offset - self.next_offset, 0)
            unseen -= sum(1 for o in self._settled if o >= self.next_offset)
            waiting = self._ready_n + len(self._due)
            return {
                "start_offset": self.start_offset,
                "next_offset": self.next_offset,  # ingested up to here (not: delivered)
                # not delivered yet (the consumer lag): new, ready again, or scheduled
                "waiting": unseen + waiting,
                "in_flight": len(self._leases),
                "scheduled": len(self._due),
                "available_again": sum(1 for o in self._counts if o not in self._leases),
                "depth": unseen + waiting + len(self._leases) + len(self._doomed),
                "delivered": self.delivered_total,
                "acked": self.acked_total,
                "nacked": self.nacked_total,
                "redelivered": self.redelivered_total,
                "dead_lettered": self.dead_lettered_total,
                "expired": self.expired_total,
                "removed": self.removed_total,
                "consumers": len(self._consumers),
                "groups_owned": len(self._groups.owners),
            }
