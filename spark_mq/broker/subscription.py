"""Delivery state of one subscription (a queue's implicit one, or a topic's).

Every offset the subscription has *ingested* from the message store (those below
``next_offset``) is exactly one of:

* **ready**: waiting, in one sorted list per priority (higher priority first, FIFO within one);
* **scheduled**: waiting for a time (a deliver-after time, or a redelivery delay);
* **leased** to one consumer until its deadline (the seeds' browse-with-mark);
* **doomed**: to be dead-lettered or expired; the broker moves it, then settles it;
* **settled**: acked, dead-lettered, expired, purged, or not selected by the subscription's
  selector.

A message whose lease lapsed goes to another consumer when one could take it now (it has
room in its prefetch, its selector takes the message, and groups and the delivery policy let
it): the consumer that let it lapse has stopped answering, and the seeds' browse-with-mark
exists so that *another* endpoint takes over (it got the message back again and again until
it was dead-lettered, while an idle consumer got nothing). With no other taker it may have it
back.

A lease is fenced by the consumer and the delivery count: an ack or nack must name the
delivery it answers, so a consumer whose lease lapsed and whose message went elsewhere cannot
settle it. A message that comes back (nack, lapsed lease, consumer gone) is *returned*: the
broker records that, so delivery counts survive a restart, and past ``max_delivery_attempts``
it is dead-lettered.

Message groups: a group's bucket (``crc32(group) % group_buckets``, bounded memory as in
Artemis) is owned by one consumer; another consumer gets the bucket only once its owner left
and none of the bucket's messages is leased (so a group is never processed by two consumers
at once, and never out of order). Within a group, priority still orders messages.

Besides delivery, the broker's timers and admin calls work on a subscription: releasing
scheduled messages, reaping expired ones, handing doomed ones over for disposal, purging,
dropping the oldest, browsing, reporting (the methods after delivery's).
"""

from __future__ import annotations

import heapq
import itertools
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from typing import Protocol

import numpy as np
from sortedcontainers import SortedList

from spark_mq.broker.groups import Groups
from spark_mq.broker.message_store import NEVER, MessageStore
from spark_mq.broker.selector import Selector
from spark_mq.broker.settled import SettledOffsets
from spark_mq.broker.sorted_offsets import drop_first, extend_past_end
from spark_mq.commands import Refused
from spark_mq.config import DestinationSettings


class Wakeup(Protocol):
    """What is told when a subscription has something new (a consumer's event, or the direct
    wire's connection, which marks itself for its loop)."""

    def set(self) -> None: ...


Delivery = tuple[int, int, bool]  # offset, delivery count, first of its group for this consumer
_DUE_SLACK_S = 1e-6  # see _promote_due


@dataclass(frozen=True, slots=True)
class Lease:
    """A leased message's lease. One object is shared by the messages one ``take`` leased
    alike (same count and priority): a lease a message cost 0.3-0.5 us to make, more than the
    rest of leasing it. So it is never changed in place: an extension puts a new one; whether
    its ack is under way is ``Subscription._settling``."""

    consumer_id: int
    delivery_count: int
    deadline: float
    priority: int


# one ready list's part of a take: its offsets, their delivery counts and whether each is the
# first of its group for the consumer (parallel lists), and the list's priority
_Picked = tuple[list[int], list[int], list[bool], int]


class Subscription:
    def __init__(
        self,
        destination: str,
        name: str,
        store: MessageStore,
        *,
        start_offset: int,
        settled: Iterable[int] = (),
        returned: dict[int, int] | None = None,
        lease_s: float,
        monotonic: Callable[[], float],
        wall: Callable[[], float],
        settings: DestinationSettings,
        selector: Selector | None = None,
        durable: bool = True,
        max_scan: int = 20_000,
    ) -> None:
        self.destination = destination
        self.name = name
        self.start_offset = start_offset
        self.lease_s = lease_s
        self.settings = settings
        self.selector = selector
        self.durable = durable
        self.max_scan = max_scan
        self._store = store
        self._now = monotonic
        self._wall = wall
        self._lock = threading.Lock()
        self.next_offset = start_offset
        self._settled = settled if isinstance(settled, SettledOffsets) else SettledOffsets(settled)
        # only recovery hands over settled offsets not yet ingested; acks settle ingested ones
        self._settled_horizon = self._settled.highest()
        self._settled_below = 0  # every offset below it is settled (its record pruned)
        self._ready: dict[int, SortedList] = {}
        self._ready_n = 0
        self._scheduled: list[tuple[float, int]] = []  # (due wall time, offset), a heap
        self._due: dict[int, float] = {}  # offset -> due time of scheduled offsets
        self._priority: dict[int, int] = {}  # priority of scheduled / doomed offsets
        self._counts: dict[int, int] = dict(returned or {})  # deliveries that came back
        self._count_horizon = max(self._counts, default=-1)  # recovered counts up to here
        self._leases: dict[int, Lease] = {}
        self._settling: set[int] = set()  # leased offsets whose ack is being made durable
        self._groups = Groups(settings.group_buckets)
        self._expiry: dict[int, int] = {}  # offset -> expiry (us), for waiting ones with one
        self._doomed: dict[int, str] = {}  # offset -> "dead" | "expired" | "purged" | "dropped"
        self._disposing: set[int] = set()  # doomed offsets the broker is moving / settling
        self._consumers: list[int] = []  # in registration order (failover picks the first)
        # per consumer, whether it could take a given offset now (its session says: room in its
        # prefetch, its selector); a Spark query's claims register none
        self._takers: dict[int, Callable[[int], bool]] = {}
        self._lapsed_from: dict[int, int] = {}  # offset -> the consumer whose lease lapsed
        self._waiters: set[Wakeup] = set()
        # for the broker to make durable: returned offsets, and selector misses
        self._returned_log: list[int] = []
        self._filtered_log: list[int] = []
        self.acked_total = 0
        self.delivered_total = 0  # leases handed out (first deliveries and redeliveries)
        self.nacked_total = 0
        self.redelivered_total = 0
        self.dead_lettered_total = 0
        self.expired_total = 0
        self.removed_total = 0  # purged, or dropped to make room

    # -- consumers ---------------------------------------------------------------------------
    def add_waiter(self, event: Wakeup) -> None:
        with self._lock:
            self._waiters.add(event)

    def remove_waiter(self, event: Wakeup) -> None:
        with self._lock:
            self._waiters.discard(event)

    def wake(self) -> None:
        with self._lock:
            waiters = list(self._waiters)
        for w in waiters:
            w.set()

    def register(self, consumer_id: int, could_take: Callable[[int], bool] | None = None) -> None:
        """A consumer attached; ``could_take(offset)``: whether it could take that message now
        (asked only for a message another consumer let lapse)."""
        with self._lock:
            self._consumers.append(consumer_id)
            if could_take is not None:
                self._takers[consumer_id] = could_take

    @property
    def consumers(self) -> list[int]:
        with self._lock:
            return list(self._consumers)

    # -- ingesting new messages --------------------------------------------------------------
    def _ingest(self) -> None:
        """Take in what the store holds from ``next_offset`` on (caller holds the lock)."""
        if self.next_offset >= self._store.end:
            return
        now_us = 0  # (read from the clock once a message has a delivery time)
        attempts = self.settings.max_delivery_attempts
        end = self.next_offset
        for part in self._store.entries(self.next_offset):  # a snapshot of the chunks
            offsets, prio = part.offsets, part.priority
            end = int(offsets[-1]) + 1  # a chunk added meanwhile is ingested once, next time
            groups, expiry, deliver = part.groups, part.expiry_us, part.deliver_us
            plain = (
                groups is None
                and expiry is None
                and deliver is None
                and self.selector is None
                and offsets[0] > self._count_horizon
            )
            if plain and len(offsets) == 1:
                # one plain message (a synchronous send): with numpy's calls on one-element
                # arrays this took 35 us in the running broker, without them 15 (measured)
                if end - 1 > self._settled_horizon or end - 1 not in self._settled:
                    self._ready_list(int(prio[0])).add(end - 1)
                    self._ready_n += 1
                continue
            keep = np.ones(len(offsets), dtype=bool)
            if offsets[0] <= self._settled_horizon:
                keep &= ~self._settled.mask(offsets)
            if plain and keep.all() and (prio == prio[0]).all():
                extend_past_end(self._ready_list(int(prio[0])), offsets.tolist())
                self._ready_n += len(offsets)
                continue
            ready: dict[int, list[int]] = {}  # priority -> offsets, added in one go
            known: dict[str, int] = {}  # group -> bucket, computed once per chunk
            offs, prios = offsets.tolist(), prio.tolist()
            for i in np.nonzero(keep)[0].tolist():
                o = offs[i]
                if self.selector is not None and not self.selector.matches(
                    part.chunk.props(part.start + i)
                ):
                    self._settled.add(o)
                    self._filtered_log.append(o)
                    continue
                p = prios[i]
                if groups is not None and (group := groups[i]) is not None:
                    self._groups.add(o, group, known)
                if expiry is not None and expiry[i] != NEVER:
                    self._expiry[o] = int(expiry[i])
                if attempts and self._counts.get(o, 0) >= attempts:
                    self._doom(o, p, "dead")
                elif deliver is not None and deliver[i] > (
                    now_us := now_us or int(self._wall() * 1_000_000)
                ):
                    self._schedule(o, p, deliver[i] / 1_000_000)
                else:
                    ready.setdefault(p, []).append(o)
            for p, added in ready.items():
                extend_past_end(self._ready_list(p), added)
                self._ready_n += len(added)
        self.next_offset = end

    def _ready_list(self, priority: int) -> SortedList:
        sl = self._ready.get(priority)
        if sl is None:
            sl = self._ready[priority] = SortedList()
        return sl

    def _schedule(self, offset: int, priority: int, due: float) -> None:
        self._due[offset] = due
        self._priority[offset] = priority
        heapq.heappush(self._scheduled, (due, offset))
        self._groups.hold(offset)

    def _doom(self, offset: int, priority: int, why: str) -> None:
        self._doomed[offset] = why
        self._priority[offset] = priority

    def _promote_due(self, now: float) -> int:
        # within a microsecond counts as due: times are kept in microseconds, and the float
        # seconds a due time and the clock are turned into round apart by an ulp (a message
        # due at enqueue + 30 s stayed scheduled when the clock had moved on by exactly 30 s
        # for about 1 start time in 175, measured)
        now += _DUE_SLACK_S
        n = 0
        while self._scheduled and self._scheduled[0][0] <= now:
            due, offset = heapq.heappop(self._scheduled)
            if self._due.get(offset) != due:
                continue  # purged, or rescheduled
            del self._due[offset]
            p = self._priority.pop(offset)
            self._groups.unhold(offset)
            self._ready_list(p).add(offset)
            self._ready_n += 1
            n += 1
        return n

    # -- delivery ----------------------------------------------------------------------------
    def take(
        self,
        consumer_id: int,
        limit: int,
        selector: Selector | None = None,
        *,
        lease_s: float | None = None,
        below: int | None = None,
    ) -> list[Delivery]:
        """Lease up to ``limit`` messages to ``consumer_id``: ``(offset, count, group_first)``.

        ``lease_s`` overrides the mark interval (a Spark claim holds until committed);
        ``below``: only offsets under it.
        """
        if limit <= 0:
            return []
        with self._lock:
            if self.settings.delivery_policy == "failover" and self._consumers[:1] != [consumer_id]:
                return []
            self._ingest()
            promoted = self._promote_due(self._wall()) if self._scheduled else 0
            if not self._ready_n:
                return []
            picked = self._pick(consumer_id, limit, selector, below)
            deadline = self._now() + (self.lease_s if lease_s is None else lease_s)
            grouped = bool(self._groups)
            leases = self._leases
            out: list[Delivery] = []
            for offsets, counts, firsts, p in picked:
                alike = set(counts)
                if len(alike) == 1:  # (the usual: every one delivered for the same time)
                    lease = Lease(consumer_id, counts[0], deadline, p)
                    leases.update(dict.fromkeys(offsets, lease))
                else:
                    shared = {c: Lease(consumer_id, c, deadline, p) for c in alike}
                    leases.update(zip(offsets, map(shared.__getitem__, counts), strict=True))
                if grouped:
                    for offset in offsets:
                        self._groups.leased(offset)
                out.extend(zip(offsets, counts, firsts, strict=True))
            self.delivered_total += len(out)
            left = promoted and self._ready_n
        if left:  # the timer will not promote what this consumer left: the others must hear
            self.wake()
        return out

    def _pick(
        self, consumer_id: int, limit: int, selector: Selector | None, below: int | None = None
    ) -> list[_Picked]:
        out: list[_Picked] = []
        taken = 0
        simple = (
            selector is None and not self._groups and not self._expiry and not self._lapsed_from
        )
        now_us = 0 if simple else int(self._wall() * 1_000_000)
        budget = self.max_scan
        ready = self._ready
        for p in sorted(ready, reverse=True) if len(ready) > 1 else ready:
            sl = ready[p]
            if not sl:
                continue
            want = limit - taken
            if simple:
                if below is None and len(sl) <= want:  # all of them (a consumer keeping up)
                    chosen = list(sl)
                    sl.clear()
                else:
                    if below is None:
                        chosen = list(sl.islice(0, want))
                    else:
                        chosen = list(itertools.islice(sl.irange(maximum=below - 1), want))
                    drop_first(sl, len(chosen))
                self._ready_n -= len(chosen)
                firsts = [False] * len(chosen)
            else:
                picked, gone = self._scan(sl, consumer_id, want, selector, now_us, budget, p, below)
                budget -= len(picked) + len(gone)
                chosen = [o for o, _ in picked]
                for o in (*chosen, *gone):
                    sl.remove(o)
                self._ready_n -= len(picked) + len(gone)
                firsts = [first for _, first in picked]
            if chosen:
                came_back = self._counts  # (the delivery counts of messages that came back)
                counts = (
                    [came_back.pop(o, 0) + 1 for o in chosen] if came_back else [1] * len(chosen)
                )
                out.append((chosen, counts, firsts, p))
                taken += len(chosen)
            if taken >= limit or budget <= 0:
                break
        return out

    def _scan(
        self,
        sl: SortedList,
        consumer_id: int,
        want: int,
        selector: Selector | None,
        now_us: int,
        budget: int,
        priority: int,
        below: int | None = None,
    ) -> tuple[list[tuple[int, bool]], list[int]]:
        """What of one ready list this consumer may have; and expired ones found on the way."""
        picked: list[tuple[int, bool]] = []
        gone: list[int] = []
        # groups are dealt out, not grabbed: a consumer takes new groups only up to its share
        # of the buckets that hold unsettled messages
        g = self._groups
        share = g.share(len(self._consumers))
        mine = g.owned.get(consumer_id, 0)
        expiries, buckets, held, owners, busy = self._expiry, g.of, g.held, g.owners, g.busy
        lapsed = self._lapsed_from
        for scanned, o in enumerate(sl):
            if scanned >= budget or len(picked) >= want or (below is not None and o >= below):
                break
            if expiries:
                expiry = expiries.get(o)
                if expiry is not None and expiry <= now_us:
                    gone.append(o)
                    self._doom(o, priority, "expired")
                    continue
            b = buckets.get(o)
            owner = None
            if b is not None:
                owner = owners.get(b)
                if owner is None:
                    if b in held or b in busy or mine >= share:
                        continue  # an earlier message waits for its time, or is being settled
                elif owner != consumer_id or b in held:
                    continue
            if selector is not None and not selector.matches(self._store.props(o)):
                continue
            if lapsed and o in lapsed:
                if lapsed[o] == consumer_id and self._another_takes(o, consumer_id, owner):
                    continue  # it let this one lapse: another consumer takes it
                del lapsed[o]
            first = b is not None and owner is None
            if first:
                g.own(b, consumer_id)  # type: ignore[arg-type]
                mine += 1
            picked.append((o, first))
        return picked, gone

    def _another_takes(self, offset: int, consumer_id: int, owner: int | None) -> bool:
        """Whether a consumer other than ``consumer_id`` could take ``offset`` now (caller holds
        the lock): the delivery policy and the group's owner permitting, with room and a
        selector that takes it."""
        if self.settings.delivery_policy != "round_robin" or owner is not None:
            return False  # failover and single deliver to one; an owned group stays
        return any(
            could_take(offset) for other, could_take in self._takers.items() if other != consumer_id
        )

    def _return(self, offset: int, lease: Lease, *, log: bool = True) -> None:
        """A delivery came back unsettled: ready again, scheduled after a delay, or doomed.

        ``log``: leave it for the broker to record (a nack's caller records it itself).
        """
        count = lease.delivery_count
        self._counts[offset] = count
        if log:
            self._returned_log.append(offset)
        self.redelivered_total += 1
        self._groups.returned(offset)
        attempts = self.settings.max_delivery_attempts
        if attempts and count >= attempts:
            self._doom(offset, lease.priority, "dead")
            return
        delay = self.settings.redelivery_delay_s(count)
        if delay > 0:
            self._schedule(offset, lease.priority, self._wall() + delay)
        else:
            self._ready_list(lease.priority).add(offset)
            self._ready_n += 1

    def _check(self, consumer_id: int, offset: int, count: int) -> Lease | Refused:
        lease = self._leases.get(offset)
        if lease is not None and lease.consumer_id == consumer_id and lease.delivery_count == count:
            return lease
        if offset in self._settled or offset < self._settled_below:
            return Refused(offset, "already settled")
        if lease is not None:
            return Refused(
                offset, "the lease lapsed and the message was delivered again (stale delivery)"
            )
        if self._counts.get(offset) == count and self._unready(offset):
            # the lease lapsed but nobody else has it yet: let the late answer through
            self._groups.leased(offset)
            priority = self._priority.pop(offset, None)
            lease = Lease(consumer_id, count, self._now() + self.lease_s, priority or 0)
            del self._counts[offset]
            self._leases[offset] = lease
            return lease
        return Refused(offset, "not delivered to this consumer, or the lease lapsed")

    def _unready(self, offset: int) -> bool:
        """Take a waiting (ready or scheduled) offset out of waiting; False if it is not."""
        for p, sl in self._ready.items():
            if offset in sl:
                sl.remove(offset)
                self._ready_n -= 1
                self._priority[offset] = p
                return True
        due = self._due.pop(offset, None)
        if due is None:
            return False
        self._groups.unhold(offset)
        return True

    def begin_ack(
        self, consumer_id: int, entries: Iterable[tuple[int, int]]
    ) -> tuple[list[int], list[Refused]]:
        """Mark leases as being settled; the caller makes that durable, then ``end_ack``."""
        ok: list[int] = []
        refused: list[Refused] = []
        leases, settling = self._leases, self._settling
        with self._lock:
            for offset, count in entries:
                lease = leases.get(offset)
                if (  # (the common case, as _check has it)
                    lease is None
                    or lease.consumer_id != consumer_id
                    or lease.delivery_count != count
                ):
                    got = self._check(consumer_id, offset, count)
                    if isinstance(got, Refused):
                        refused.append(got)
                        continue
                if offset in settling:
                    refused.append(Refused(offset, "an ack for this delivery is already under way"))
                else:
                    settling.add(offset)
                    ok.append(offset)
        return ok, refused

    def end_ack(self, offsets: Iterable[int], *, durable: bool) -> None:
        """After the settlement commit: forget the leases, or (on failure) keep them."""
        freed = False
        leases = self._leases
        with self._lock:
            if not durable:
                self._settling.difference_update(offsets)
                return
            pop = leases.pop
            gone = [o for o in offsets if pop(o, None) is not None]
            self._settling.difference_update(gone)
            self._settled.update(gone)
            self.acked_total += len(gone)
            if self._expiry:
                for offset in gone:
                    self._expiry.pop(offset, None)
            if self._groups:
                for offset in gone:
                    freed |= self._groups.settled(offset, was_leased=True)
        if freed:
            self.wake()  # a group whose owner left can move to another consumer now

    def nack(
        self, consumer_id: int, entries: Iterable[tuple[int, int]], *, elsewhere: bool = False
    ) -> tuple[list[int], list[Refused]]:
        """Give messages back for redelivery (with a higher delivery count); ``elsewhere``: to
        another consumer when there is one (as a lapsed lease's message goes).

        The caller records the returned offsets durably (so the count survives a crash).
        """
        ok, refused = [], []
        with self._lock:
            others = elsewhere and len(self._takers) > 1
            for offset, count in entries:
                got = self._check(consumer_id, offset, count)
                if isinstance(got, Refused) or offset in self._settling:
                    refused.append(got if isinstance(got, Refused) else Refused(offset, "settling"))
                    continue
                del self._leases[offset]
                self._return(offset, got, log=False)
                if others:
                    self._lapsed_from[offset] = consumer_id
                ok.append(offset)
            self.nacked_total += len(ok)
        if ok:
            self.wake()
        return ok, refused

    def reject(
        self, consumer_id: int, entries: Iterable[tuple[int, int]]
    ) -> tuple[list[int], list[Refused]]:
        """Dead-letter messages at once, whatever their delivery count (Kafka's REJECT): they
        go the way of a message past ``max_delivery_attempts``. The caller records them as
        returned (a crash before the move to the dead-letter queue redelivers them)."""
        ok, refused = [], []
        with self._lock:
            for offset, count in entries:
                got = self._check(consumer_id, offset, count)
                if isinstance(got, Refused) or offset in self._settling:
                    refused.append(got if isinstance(got, Refused) else Refused(offset, "settling"))
                    continue
                del self._leases[offset]
                self._counts[offset] = got.delivery_count
                self._groups.returned(offset)
                self._doom(offset, got.priority, "dead")
                ok.append(offset)
        return ok, refused

    def extend(
        self, consumer_id: int, entries: Iterable[tuple[int, int]]
    ) -> tuple[list[int], list[Refused]]:
        """Push lease deadlines one mark interval from now."""
        ok, refused = [], []
        deadline = self._now() + self.lease_s
        extended: dict[Lease, Lease] = {}  # (leases are shared: a new one for each old one)
        with self._lock:
            for offset, count in entries:
                got = self._check(consumer_id, offset, count)
                if isinstance(got, Refused):
                    refused.append(got)
                    continue
                new = extended.get(got)
                if new is None:
                    new = extended[got] = replace(got, deadline=deadline)
                self._leases[offset] = new
                ok.append(offset)
        return ok, refused

    def expire_leases(self) -> int:
        """Take back messages whose lease lapsed; returns how many."""
        now = self._now()
        with self._lock:
            lapsed = [
                o
                for o, lease in self._leases.items()
                if lease.deadline <= now and o not in self._settling
            ]
            for offset in lapsed:
                lease = self._leases.pop(offset)
                self._return(offset, lease)
                if len(self._takers) > 1:
                    self._lapsed_from[offset] = lease.consumer_id
        if lapsed:
            self.wake()
        return len(lapsed)

    def release_consumer(self, consumer_id: int, *, log: bool = True) -> int:
        """A consumer left: its unsettled messages come back; its groups may move.

        ``log=False``: the caller has recorded the returns itself."""
        with self._lock:
            if consumer_id in self._consumers:
                self._consumers.remove(consumer_id)
            self._takers.pop(consumer_id, None)
            if self._lapsed_from:  # what it let lapse is anyone's now
                for o in [o for o, c in self._lapsed_from.items() if c == consumer_id]:
                    del self._lapsed_from[o]
            mine = [
                o
                for o, lease in self._leases.items()
                if lease.consumer_id == consumer_id and o not in self._settling
            ]
            for offset in mine:
                self._return(offset, self._leases.pop(offset), log=log)
            self._groups.release(consumer_id)
        self.wake()
        return len(mine)

    def lease_to(self, consumer_id: int, offsets: Iterable[int], lease_s: float) -> list[int]:
        """Lease these waiting offsets to ``consumer_id`` (a claim rebuilt after a restart);
        returns those that were waiting."""
        deadline = self._now() + lease_s
        out = []
        with self._lock:
            self._ingest()
            for o in offsets:
                p = self._priority.get(o)
                if o in self._leases or not self._unready(o):
                    continue
                p = self._priority.pop(o, p or 0)
                self._leases[o] = Lease(consumer_id, self._counts.pop(o, 0) + 1, deadline, p)
                self._groups.leased(o, consumer_id)
                out.append(o)
        return out

    def delivery_count(self, offset: int) -> int:
        """The delivery count of a leased offset (0 if it is not leased)."""
        with self._lock:
            lease = self._leases.get(offset)
            return lease.delivery_count if lease is not None else 0

    def is_leased_to(self, offset: int, consumer_id: int) -> bool:
        with self._lock:
            lease = self._leases.get(offset)
            return lease is not None and lease.consumer_id == consumer_id

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
    def begin_at(self, offset: int) -> None:
        """(Made, before use.) It reads from ``offset``: every offset below it is settled, or
        never its own (a topic subscription made at the log's end), so its low-water mark is
        there from the start, not from the timers' first tick."""
        self.next_offset = offset
        self._settled_below = offset

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
            self._settled.forget_below(low)
            self._settled_below = max(self._settled_below, low)
            return low

    def settled_upto(self) -> int:
        """No offset above this is settled here: past its mark, the highest it settled."""
        with self._lock:
            top = self._settled.highest()
            return top if top >= 0 else self._settled_below - 1

    def settled_mask(self, offsets: np.ndarray) -> np.ndarray:
        """Which of ``offsets`` are ingested and settled here."""
        with self._lock:
            return (offsets < self.next_offset) & self._settled.settled(
                offsets, self._settled_below
            )

    def stats(self, end_offset: int) -> dict[str, int | float]:
        with self._lock:
            unseen = max(end_offset - self.next_offset, 0)
            unseen -= self._settled.count_from(self.next_offset)
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
                # (as the timers last found them) every offset below the mark is settled; past
                # it, this many are too: a message held unacknowledged at the mark keeps them
                "low_water_mark": self._settled_below,
                "settled_past_mark": len(self._settled),
                # how long the message at the mark (the oldest not settled: waiting, leased or
                # scheduled) has been in the log; 0 with none (SQS's age of the oldest message)
                "oldest_unsettled_age_s": self._oldest_age_s(),
            }

    def _oldest_age_s(self) -> float:
        """(Caller holds the lock.)"""
        mark = self._settled_below
        if mark >= self._store.end:
            return 0.0
        since = self._store.enqueue_time_us(mark)
        return 0.0 if since is None else round(max(0.0, self._wall() - since / 1e6), 3)
