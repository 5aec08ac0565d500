"""Where messages go when a subscription is done with them without an ack.

* dead-lettered (past ``max_delivery_attempts``): a copy goes to ``DLQ.<destination>``
  (created on first use) with the reason, unless ``dead_letter = false``;
* expired: a copy goes to ``EXP.<destination>`` when ``expiry = "queue"``, else dropped;
* purged or dropped (``overflow = "drop_oldest"``): settled, no copy.

The copy is durable before the original is settled, and carries the dedup id
``<prefix>:<destination>:<subscription>:<offset>``: a crash between the two repeats the copy,
which duplicate detection then catches, so a message lands in the DLQ exactly once.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from concurrent.futures import Future
from concurrent.futures import wait as futures_wait
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc

from spark_mq.broker.destination import Destination
from spark_mq.broker.recovery import RETURNED
from spark_mq.broker.registry import Destinations
from spark_mq.broker.subscription import Subscription
from spark_mq.errors import NotOwner, SparkMQError
from spark_mq.journal import Journal
from spark_mq.names import DLQ_PREFIX, EXPIRY_PREFIX, logical_name
from spark_mq.schema import HEADERS, ints

log = logging.getLogger(__name__)
FILTERED = "filtered"  # settlement outcome: not selected by the subscription's selector

# settlement outcome per doom reason
OUTCOMES = {
    "dead": "dead_lettered",
    "expired": "expired",
    "purged": "purged",
    "dropped": "dropped",
}
REASONS = {
    "dead": "delivered {n} time(s) without an ack (max_delivery_attempts)",
    "expired": "expired",
    "purged": "purged",
    "dropped": "dropped to make room (overflow = drop_oldest)",
}
# a dead-letter or expiry queue never dead-letters again (Artemis: a DLA has no DLA)
SIDE_QUEUE_SETTINGS = {"max_delivery_attempts": 0, "expiry": "drop", "default_ttl_ms": 0}


@dataclass(frozen=True)
class Copy:
    target: str
    rows: pa.Table  # produce columns


def side_queue(destination: str, why: str, *, dead_letter: bool, expiry: str) -> str | None:
    """The queue a doomed message is copied to, or None when it is only dropped. A partition's
    is its destination's (``DLQ.orders`` for ``orders~2``: one dead-letter queue, as one
    destination; the copy's headers name the partition it came from)."""
    if why == "dead" and dead_letter:
        return DLQ_PREFIX + logical_name(destination)
    if why == "expired" and expiry == "queue":
        return EXPIRY_PREFIX + logical_name(destination)
    return None


def side_copy(
    rows: pa.Table,
    *,
    destination: str,
    subscription: str,
    why: str,
    counts: dict[int, int],
    target: str,
) -> Copy:
    """Produce-ready copies of ``rows`` for ``target``, with where they came from in headers."""
    offsets = ints(rows["offset"])
    headers = []
    for original, offset in zip(rows["headers"].to_pylist(), offsets, strict=True):
        h = dict(original or ())
        h["sparkmq.original_destination"] = destination
        h["sparkmq.original_offset"] = str(offset)
        if subscription:
            h["sparkmq.original_subscription"] = subscription
        h["sparkmq.reason"] = REASONS[why].format(n=counts.get(offset, 0))
        if why == "dead":
            h["sparkmq.delivery_count"] = str(counts.get(offset, 0))
        headers.append(list(h.items()))
    prefix = "dlq" if why == "dead" else "exp"
    ids = [f"{prefix}:{destination}:{subscription}:{o}" for o in offsets]
    table = pa.table(
        {
            "body": rows["body"],
            "message_id": rows["message_id"],
            "dedup_id": pa.array(ids, pa.string()),
            "group_id": rows["group_id"],
            "priority": rows["priority"],
            "headers": pa.array(headers, HEADERS),
        }
    )
    return Copy(target, table)


def order_like(rows: pa.Table, offsets: list[int]) -> pa.Table:
    """``rows`` (sorted by offset) reordered to follow ``offsets``."""
    if not offsets:
        return rows
    index = pc.index_in(pa.array(offsets, pa.int64()), value_set=rows["offset"])
    return rows.take(index)


class _LettingGo(Exception):
    """The destination is being let go (a cluster member's hand-over): nothing more is moved."""


class Disposer:
    """Carries out what subscriptions leave for the broker (on the timer thread, or at purge):
    records returned and selector-filtered deliveries, and moves doomed messages to their side
    queue (or drops them), settling each original once its copy is durable."""

    def __init__(
        self,
        destinations: Destinations,
        journal: Journal,
        store: Callable[[str, pa.Table], Future],
    ) -> None:
        self.destinations = destinations
        self.journal = journal
        # stores a copy as the broker itself, past every limit: a move frees as much as it
        # takes (the producing part's store_checked)
        self._store = store
        self._lock = threading.Lock()
        # moves whose original is not settled yet, and the destination each is from
        self._under_way: dict[Future, str] = {}

    def wait_under_way(self, timeout: float, destination: str | None = None) -> bool:
        """Wait for the moves started so far (of ``destination``'s messages, or of all) to
        settle their originals: a clean shutdown must not close the journal between a copy and
        its settlement, nor a cluster member let a destination go then (its new owner would
        deliver again what was copied to its dead-letter queue). False if ``timeout``
        passed."""
        with self._lock:
            pending = [f for f, d in self._under_way.items() if destination in (None, d)]
        return not futures_wait(pending, timeout).not_done

    def run(self, dest: Destination, sub: Subscription) -> list[Future]:
        """Everything ``sub`` left to do; the futures of the writes it started."""
        futures = self.record_returns(dest, sub)
        doomed = sub.claim_doomed()
        by_reason: dict[str, list[int]] = {}
        for offset, (why, _) in doomed.items():
            by_reason.setdefault(why, []).append(offset)
        counts = {o: n for o, (_, n) in doomed.items()}
        for why, offsets in by_reason.items():
            try:
                futures.append(self._dispose(dest, sub, why, sorted(offsets), counts))
            except _LettingGo:  # (its new owner disposes of them)
                sub.unclaim(offsets)
            except NotOwner as exc:  # (its side queue is being placed: the next round)
                sub.unclaim(offsets)
                log.info(
                    "%d %s message(s) of %s wait to be moved: %s",
                    len(offsets),
                    why,
                    dest.name,
                    exc.message,
                    extra={"destination": dest.name},
                )
            except Exception:
                sub.unclaim(offsets)
                log.exception(
                    "could not dispose of %d %s message(s) of %s", len(offsets), why, dest.name
                )
        return futures

    def record_returns(self, dest: Destination, sub: Subscription) -> list[Future]:
        returned, filtered = sub.drain_log()
        if not sub.durable:
            return []
        journal = self.journal
        return [
            journal.settle(dest.name, offsets, subscription=sub.name, outcome=outcome)
            for offsets, outcome in ((returned, RETURNED), (filtered, FILTERED))
            if offsets
        ]

    def _dispose(
        self,
        dest: Destination,
        sub: Subscription,
        why: str,
        offsets: list[int],
        counts: dict[int, int],
    ) -> Future:
        target = side_queue(
            dest.name, why, dead_letter=dest.settings.dead_letter, expiry=dest.settings.expiry
        )
        outcome = OUTCOMES[why]
        reason = REASONS[why].format(n=max(counts.values(), default=0))
        done: Future = Future()

        def failed(exc: BaseException) -> None:
            sub.unclaim(offsets)
            done.set_exception(exc)

        def finished(f: Future | None = None) -> None:
            if f is not None and f.exception() is not None:
                failed(f.exception())  # type: ignore[arg-type]
                return
            sub.finish(offsets, outcome)
            done.set_result(len(offsets))

        def settle(copied: Future | None = None) -> None:
            if copied is not None and copied.exception() is not None:
                failed(copied.exception())  # type: ignore[arg-type]
            elif not sub.durable:
                finished()
            else:
                try:
                    self.journal.settle(
                        dest.name, offsets, subscription=sub.name, outcome=outcome, reason=reason
                    ).add_done_callback(finished)
                except SparkMQError as exc:  # the destination went, or the broker is closing
                    failed(exc)

        with self._lock:  # (checked and added at once: see core.Broker.release)
            if self.destinations.letting_go(dest.name):
                raise _LettingGo
            self._under_way[done] = dest.name
        done.add_done_callback(self._forget)
        try:
            if target is None:
                settle()
                return done
            if not self.destinations.has(target):
                self.destinations.create(target, "queue", dict(SIDE_QUEUE_SETTINGS))
            copy = side_copy(
                dest.store.take(offsets),
                destination=dest.name,
                subscription=sub.name,
                why=why,
                counts=counts,
                target=target,
            )
            # not through produce(): a move frees as much as it takes, so limits and memory
            # states must not block it (it runs on the timer thread)
            self._store(copy.target, copy.rows).add_done_callback(settle)
        except BaseException as exc:
            if not done.done():
                done.set_exception(exc)  # nothing under way (the caller unclaims the offsets)
            raise
        if why == "dead":
            log.info(
                "dead-lettering %d message(s) of %s into %s",
                len(offsets),
                dest.name,
                target,
                extra={"destination": dest.name},
            )
        return done

    def _forget(self, done: Future) -> None:
        with self._lock:
            self._under_way.pop(done, None)
