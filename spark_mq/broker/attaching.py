"""Attaching consumers to queues, topics' subscriptions and temporary queues, detaching them,
browsing and purging."""

from __future__ import annotations

import itertools
import logging
import uuid

import pyarrow as pa

from spark_mq.broker import disposal
from spark_mq.broker.consumers import ConsumerSession, Wakeup
from spark_mq.broker.destination import Destination, settled_in_memory
from spark_mq.broker.disposal import Disposer
from spark_mq.broker.registry import Destinations
from spark_mq.broker.selector import compile_selector
from spark_mq.broker.subscription import Subscription
from spark_mq.config import BrokerConfig
from spark_mq.errors import (
    ConsumerRefused,
    DestinationExists,
    DestinationNotFound,
    SubscriptionNotFound,
)
from spark_mq.journal import Journal
from spark_mq.names import TEMPORARY_PREFIX
from spark_mq.schema import MESSAGE_SCHEMA, QUEUE_SUBSCRIPTION

log = logging.getLogger("spark_mq.broker.core")


class Attachments:
    """Every consumer attached to the broker, and what needs one: browse, purge."""

    def __init__(
        self,
        destinations: Destinations,
        journal: Journal,
        config: BrokerConfig,
        disposer: Disposer,
        consumer_ids: itertools.count[int],
    ) -> None:
        self.destinations = destinations
        self.journal = journal
        self.config = config
        self.disposer = disposer
        self._consumer_ids = consumer_ids

    def attach(
        self,
        destination: str,
        subscription: str | None = None,
        prefetch: int | None = None,
        *,
        selector: str | None = None,
        durable: bool = True,
        wakeup: Wakeup | None = None,
    ) -> ConsumerSession:
        """Attach a consumer to a queue, or to a subscription of a topic.

        On a topic, ``durable=False`` attaches to a non-durable subscription that lives while
        consumers use it: private without a name, shared by every consumer giving the same
        name. ``selector`` filters what this consumer receives. ``wakeup`` is set whenever the
        session has something to send (default: a ``threading.Event``).
        """
        compiled = compile_selector(selector)
        dest = self.destinations.for_use(destination)
        with dest.lock:
            consumer_id = next(self._consumer_ids)
            sub = self._consumed_subscription(dest, subscription, durable, consumer_id)
            policy = dest.settings.delivery_policy
            if policy == "single" and sub.consumers:
                raise ConsumerRefused(
                    f"queue {destination!r} has the delivery policy 'single' and already has a "
                    "consumer; it takes another once that one leaves",
                    destination=destination,
                )
            sub_name = sub.name
            if sub.durable:
                settle = lambda offsets, outcome, inline=None: self.journal.settle(  # noqa: E731
                    destination, offsets, subscription=sub_name, outcome=outcome, inline=inline
                )
            else:
                settle = settled_in_memory
            session = ConsumerSession(
                consumer_id,
                sub,
                dest.store,
                prefetch=prefetch or self.config.delivery.default_prefetch,
                max_batch=self.config.delivery.max_delivery_batch,
                settle_durably=settle,
                selector=compiled,
                on_close=self._closed_session,
                persist_delivery_count=sub.durable and self.config.delivery.persist_delivery_count,
                wakeup=wakeup,
            )
            sub.register(consumer_id, session.could_take)
            dest.sessions[consumer_id] = session
        return session

    def attach_temporary(
        self, prefetch: int | None = None, *, wakeup: Wakeup | None = None
    ) -> ConsumerSession:
        """A new temporary queue (memory only) and a consumer on it; the queue goes when that
        consumer does. Its name is ``session.subscription.destination``."""
        name = f"{TEMPORARY_PREFIX}{uuid.uuid4().hex[:16]}"
        self.destinations.create_temporary(name)
        session = self.attach(name, prefetch=prefetch, wakeup=wakeup)
        log.info(
            "temporary queue %s for consumer %d",
            name,
            session.consumer_id,
            extra={"destination": name, "consumer": session.consumer_id},
        )
        return session

    def _consumed_subscription(
        self, dest: Destination, name: str | None, durable: bool, consumer_id: int
    ) -> Subscription:
        """The subscription a new consumer reads (caller holds ``dest.lock``)."""
        if dest.kind == "queue":
            if name not in (None, QUEUE_SUBSCRIPTION):
                raise DestinationExists(
                    f"{dest.name!r} is a queue; subscriptions are for topics",
                    destination=dest.name,
                )
            return dest.subscriptions[QUEUE_SUBSCRIPTION]
        if durable:
            if not name:
                raise SubscriptionNotFound(
                    f"{dest.name!r} is a topic: consume it through a subscription "
                    f"(Admin.create_subscription({dest.name!r}, 'name')), or non-durably "
                    "(durable=False)",
                    destination=dest.name,
                )
            sub = dest.subscriptions.get(name)
            if sub is None or not sub.durable:
                raise SubscriptionNotFound(
                    f"topic {dest.name!r} has no subscription {name!r}",
                    destination=dest.name,
                    subscription=name,
                )
            return sub
        key = f"~{name}" if name else f"~{consumer_id}"  # "~" never starts a durable name
        sub = dest.subscriptions.get(key)
        if sub is None:
            end = self.journal.end_offset(dest.name)
            sub = self.destinations.new_subscription(
                dest, key, end, next_offset=end, settled=set(), durable=False
            )
            dest.subscriptions[key] = sub
        return sub

    def _closed_session(self, session: ConsumerSession) -> None:
        """A non-durable subscription goes with its last consumer, a temporary queue with
        the consumer that made it."""
        sub = session.subscription
        dest = self.destinations.find(sub.destination)
        if dest is None:
            return
        dest.last_used = self.destinations.clock.monotonic()
        if dest.temporary:
            try:
                gone = self.destinations.remove(dest.name, internal=True)
            except DestinationNotFound:
                return  # deleted meanwhile
            if gone is not None:
                for s in list(gone.sessions.values()):
                    s.close()
            return
        if sub.durable:
            return
        with dest.lock:
            if not sub.consumers and dest.subscriptions.get(sub.name) is sub:
                del dest.subscriptions[sub.name]

    # -- browse, purge ----------------------------------------------------------------------
    def browse(
        self,
        destination: str,
        subscription: str | None = None,
        *,
        limit: int = 100,
        selector: str | None = None,
    ) -> pa.Table:
        """Waiting messages in delivery order, without leasing them (a queue browser)."""
        dest = self.destinations.get(destination)
        sub = self.destinations.subscription(dest, subscription)
        offsets = sub.browse(max(limit, 0), compile_selector(selector))
        if not offsets:
            return MESSAGE_SCHEMA.empty_table()
        return disposal.order_like(dest.store.take(offsets), offsets)

    def purge(self, destination: str, subscription: str | None = None) -> int:
        """Remove every waiting message (leased ones stay); returns how many, once durable."""
        dest = self.destinations.administrable(destination)
        sub = self.destinations.subscription(dest, subscription)
        n = len(sub.purge())
        for fut in self.disposer.run(dest, sub):
            fut.result()
        log.info("purged %d message(s) of %s", n, destination, extra={"destination": destination})
        return n

    def detach(self, session: ConsumerSession) -> None:
        dest = self.destinations.find(session.subscription.destination)
        if dest is not None:
            with dest.lock:
                dest.sessions.pop(session.consumer_id, None)
        session.close()
