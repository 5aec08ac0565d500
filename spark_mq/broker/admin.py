"""Administering the broker's destinations and subscriptions: create, configure, delete, and
their statistics."""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable
from typing import Any

from spark_mq.broker.disk import DiskMonitor
from spark_mq.broker.memory import MemoryMonitor
from spark_mq.broker.registry import Destinations
from spark_mq.broker.selector import compile_selector
from spark_mq.config import BrokerConfig
from spark_mq.errors import (
    ConfigError,
    DestinationExists,
    DestinationNotFound,
    NotOwner,
    SubscriptionNotFound,
)
from spark_mq.journal import Journal
from spark_mq.journal.base import Kind
from spark_mq.names import MAX_PARTITIONS, partition_name, validate_name
from spark_mq.schema import QUEUE_SUBSCRIPTION

log = logging.getLogger("spark_mq.broker.core")


class DestinationAdmin:
    def __init__(
        self,
        destinations: Destinations,
        journal: Journal,
        config: BrokerConfig,
        memory: MemoryMonitor,
        disk: DiskMonitor,
        ha_state: Callable[[], dict[str, Any]],
    ) -> None:
        self.destinations = destinations
        self.journal = journal
        self.config = config
        self.memory = memory
        self.disk = disk
        self.ha_state = ha_state
        self._growing = threading.Lock()  # (one growth of a partitioned destination at a time)

    def create_destination(
        self, name: str, kind: Kind, settings: dict[str, Any] | None = None
    ) -> bool:
        """Create a queue or topic (``settings``: overrides of ``[destinations]``); with
        ``partitions`` N above 1, its N partitions (``<name>~0`` to ``<name>~<N-1>``), each a
        destination of its own with the same settings. False when it existed as asked."""
        validate_name(name)
        checked = self._checked_settings(settings)
        retention = self.config.destinations.retention_s
        if retention and "retention_s" not in checked:
            # kept with the destination: the compaction job, which reads no broker config,
            # keeps its rows that long
            checked["retention_s"] = retention
        partitions = int(checked.get("partitions", 1))
        existing = self.destinations.partitioned(name)
        if existing is None and partitions == 1:
            return self.destinations.create(name, kind, checked)
        if existing is not None and ("partitions" not in checked or partitions == existing[1]):
            partitions = existing[1]  # (a create cut short is completed)
        elif existing is not None:
            raise DestinationExists(
                f"{name!r} exists with {existing[1]} partitions, not {partitions} (add "
                f"partitions with Admin.add_partitions, or sparkmq {kind} add-partitions)",
                destination=name,
            )
        elif self.journal.recorded(name) is not None:
            raise DestinationExists(
                f"{name!r} exists without partitions: delete it first to make it partitioned",
                destination=name,
            )
        checked["partitions"] = partitions
        created = False
        # partition 0 last: it says the destination exists, and with how many partitions
        for index in [*range(1, partitions), 0]:
            made = self.destinations.create(partition_name(name, index), kind, checked)
            created = made or created
        return created

    def add_partitions(self, name: str, count: int) -> dict[str, Any]:
        """Grow the partitioned destination ``name`` to ``count`` partitions (Kafka's
        CreatePartitions; they are never taken away). The new ones get partition 0's settings
        and, a topic's, its durable subscriptions, recorded with each in one commit (so each
        subscription has every message sent there). Partition 0's count is raised last: a
        client finds the new partitions only once they all exist, and a growth cut short is
        completed by asking again. A cluster member does it where partition 0 is served
        (``NotOwner`` elsewhere). Returns the count before and now."""
        validate_name(name)
        if (
            isinstance(count, bool)
            or not isinstance(count, int)
            or not 1 <= count <= MAX_PARTITIONS
        ):
            raise ConfigError(
                f"partitions must be a whole number from 1 to {MAX_PARTITIONS}, got {count!r}",
                setting="partitions",
            )
        first = partition_name(name, 0)
        if self.destinations.partitioned(name) is None:
            if not self.destinations.has(name) and self.journal.recorded(name) is None:
                raise DestinationNotFound(
                    f"{name!r} does not exist (create it with partitions = {count})",
                    destination=name,
                )
            raise ConfigError(
                f"{name!r} has no partitions, and a destination's partitions are set when "
                f"it is created: create a new one with partitions = {count} and move its "
                "messages there (sparkmq move), or delete it and create it again",
                setting="partitions",
                destination=name,
            )
        dest = self.destinations.administrable(first)  # (NotOwner: partition 0 is elsewhere)
        with self._growing:
            before = dest.settings.partitions
            if count < before:
                raise ConfigError(
                    f"{name!r} has {before} partitions: partitions can be added, not taken "
                    f"away (a message's partition is its place in the order)",
                    setting="partitions",
                    destination=name,
                    partitions=before,
                )
            if count == before:
                return {"before": before, "partitions": count}
            recorded = self.journal.recorded(first)
            subscriptions = (
                {s.name: s.selector for s in recorded.subscriptions.values()}
                if recorded is not None and dest.kind == "topic"
                else {}
            )
            settings = {**dest.overrides, "partitions": count}
            for index in range(before, count):
                part = partition_name(name, index)
                if not self.destinations.create(part, dest.kind, settings, subscriptions):
                    self._check_left_over(part, subscriptions)
            with dest.lock:  # partition 0's count last: now clients find the new ones
                overrides = {**dest.overrides, "partitions": count}
                effective = self.config.destinations.with_overrides(overrides)
                self.journal.configure_destination(first, overrides)
                dest.overrides, dest.settings = overrides, effective
                for sub in dest.subscriptions.values():
                    sub.settings = effective
            self._catch_up(name, range(before, count), settings, subscriptions)
        log.info(
            "%s %s grew from %d to %d partitions",
            dest.kind,
            name,
            before,
            count,
            extra={"destination": name},
        )
        return {"before": before, "partitions": count}

    def _catch_up(
        self,
        name: str,
        added: range,
        settings: dict[str, Any],
        subscriptions: dict[str, str | None],
    ) -> None:
        """What changed at partition 0 while partitions ``added`` were made from its
        ``settings`` and ``subscriptions`` (an admin client making or removing a subscription,
        or changing a setting, partition 0 last), done to them too. Such a client reads the
        count once it is done with partition 0, and this reads partition 0 once the count is
        raised: one of the two always sees the other, so no new partition misses the change."""
        first = partition_name(name, 0)
        dest = self.destinations.administrable(first)
        recorded = self.journal.recorded(first)
        now = (
            {s.name: s.selector for s in recorded.subscriptions.values()}
            if recorded is not None and dest.kind == "topic"
            else {}
        )
        with dest.lock:
            overrides = {k: v for k, v in dest.overrides.items() if k != "partitions"}
        changed = {k: v for k, v in overrides.items() if settings.get(k) != v}
        gone = [s for s, selector in subscriptions.items() if now.get(s, selector) != selector]
        gone += [s for s in subscriptions if s not in now]
        made = {
            s: selector
            for s, selector in now.items()
            if s not in subscriptions or subscriptions[s] != selector
        }
        if not (changed or gone or made):
            return
        log.info(
            "%s changed while it grew (settings %s, subscriptions made %s, removed %s): done to "
            "its new partitions too",
            name,
            sorted(changed),
            sorted(made),
            sorted(gone),
            extra={"destination": name},
        )
        for index in added:
            part = partition_name(name, index)
            if changed:
                self.configure_destination(part, changed)
            for sub in gone:
                with contextlib.suppress(SubscriptionNotFound):  # (the client removed it)
                    self.delete_subscription(part, sub)
            for sub, selector in made.items():
                self.create_subscription(part, sub, selector)

    def _check_left_over(self, part: str, subscriptions: dict[str, str | None]) -> None:
        """A partition made by a growth cut short (its partition 0's count not yet raised):
        used as it is if it has the topic's subscriptions, else refused, saying which."""
        found = self.journal.recorded(part)
        have = {} if found is None else {s.name: s.selector for s in found.subscriptions.values()}
        missing = sorted(s for s in subscriptions if s not in have)
        if missing:
            raise ConfigError(
                f"{part!r} was made by an earlier growth cut short and lacks the subscription(s) "
                f"{', '.join(missing)}: create them there (Admin.create_subscription({part!r}, "
                "...)), then add the partitions again",
                setting="partitions",
                destination=part,
            )

    def _checked_settings(self, settings: dict[str, Any] | None) -> dict[str, Any]:
        """Validated overrides, as given (so later changes of the defaults still apply)."""
        if not settings:
            return {}
        if not isinstance(settings, dict):
            raise ConfigError("destination settings must be an object", setting="settings")
        checked = self.config.destinations.with_overrides(settings)
        return {k: getattr(checked, k) for k in settings}

    def configure_destination(self, name: str, settings: dict[str, Any]) -> dict[str, Any]:
        """Change some settings of a destination; returns all of them (effective)."""
        dest = self.destinations.administrable(name)
        with dest.lock:
            changes = self._checked_settings(settings)
            if changes.get("partitions", dest.settings.partitions) != dest.settings.partitions:
                raise ConfigError(
                    f"{name!r} has {dest.settings.partitions} partition(s): partitions are "
                    "added to a partitioned destination with Admin.add_partitions (sparkmq "
                    f"{dest.kind} add-partitions), and set for any other when it is created",
                    setting="partitions",
                )
            overrides = {**dest.overrides, **changes}
            effective = self.config.destinations.with_overrides(overrides)
            self.journal.configure_destination(name, overrides)
            dest.overrides, dest.settings = overrides, effective
            for sub in dest.subscriptions.values():
                sub.settings = effective
        for sub in list(dest.subscriptions.values()):
            sub.wake()
        return effective.model_dump()

    def delete_destination(
        self, name: str, *, internal: bool = False, only_if_end: int | None = None
    ) -> bool:
        """Delete a destination; ``only_if_end``: only if its log still ends there with no
        append under way (auto-deletion); returns whether it was deleted."""
        dest = self.destinations.remove(name, internal=internal, only_if_end=only_if_end)
        if dest is None:
            return False
        for s in list(dest.sessions.values()):
            s.close()
        log.info("deleted %s %s", dest.kind, name, extra={"destination": name})
        return True

    def create_subscription(self, destination: str, name: str, selector: str | None = None) -> bool:
        """A durable subscription; with a selector it keeps only the messages that match."""
        compiled = compile_selector(selector)
        dest = self.destinations.get(destination, kind="topic")
        with dest.lock:
            info, created = self.journal.create_subscription(
                destination, name, compiled.text if compiled else None
            )
            if created:
                dest.subscriptions[name] = self.destinations.new_subscription(
                    dest,
                    name,
                    info.start_offset,
                    next_offset=info.start_offset,
                    settled=set(),
                    selector=compiled,
                )
        return created

    def delete_subscription(self, destination: str, name: str) -> None:
        dest = self.destinations.get(destination, kind="topic")
        with dest.lock:
            self.journal.delete_subscription(destination, name)
            dest.subscriptions.pop(name, None)
            doomed = [s for s in dest.sessions.values() if s.subscription.name == name]
        for s in doomed:
            s.close()

    def list_destinations(self) -> list[dict[str, Any]]:
        """Every destination's :meth:`stats`; one deleted (or, a cluster's, let go) while they
        are listed is left out, not an error of the listing (a scrape of ``/metrics``)."""
        out = []
        for name in self.destinations.names():
            try:
                out.append(self.stats(name))
            except (DestinationNotFound, NotOwner):
                continue
        return out

    def stats(self, name: str) -> dict[str, Any]:
        dest = self.destinations.get(name)
        end = self.journal.end_offset(name)
        writer = self.journal.stats(name)
        with dest.lock:
            subs = {s.name: s.stats(end) for s in dest.subscriptions.values()}
            consumers = len(dest.sessions)
            consumer_list = [s.describe() for s in dest.sessions.values()]
        out: dict[str, Any] = {
            "name": name,
            "kind": dest.kind,
            "end_offset": end,
            "consumers": consumers,
            "consumer_list": consumer_list,
            "produced": end,  # (offsets are dense: every message appended took one)
            "rows_in_memory": dest.store.rows,
            "journal_commits": writer.commits,
            "journal_failed_commits": writer.failed_commits,
            "last_commit_ms": round(writer.last_commit_ms, 3),
            "bytes_in_memory": dest.store.nbytes,
            "bodies_evicted": dest.store.evicted_rows,
            **self.memory.stats(),
            **self.disk.stats(),
            "settings": dest.settings.model_dump(),
            "temporary": dest.temporary,
            "duplicates": dest.dedup.duplicates_total if dest.dedup else 0,
            **self.ha_state(),
            "dedup_cache_ids": len(dest.dedup) if dest.dedup else 0,
        }
        tier = self.journal.tier_stats(name)
        if tier is not None:
            # freshness: how far the Delta tables (what Spark reads) trail the broker
            out["delta_end_offset"] = tier.delta_end_offset
            out["delta_lag_messages"] = end - tier.delta_end_offset
            out["delta_lag_ms"] = round(tier.delta_lag_ms, 1)
            out["hot_tier_bytes"] = tier.pending_bytes
            out["hot_tier_segments"] = tier.segments
            out["hot_tier_segments_zeroed"] = tier.spares_zeroed
            out["hot_tier_segments_reused"] = tier.spares_reused
            out["hot_tier_moves"] = tier.moves
            out["hot_tier_move_failures"] = tier.move_failures
            out["hot_tier_quarantined"] = tier.quarantined
            out["disk_full"] = tier.disk_full
        else:
            out["delta_end_offset"] = end if self.journal.store.durable else None
            out["delta_lag_messages"] = 0
        if dest.kind == "queue":
            out.update({k: v for k, v in subs[QUEUE_SUBSCRIPTION].items() if k != "start_offset"})
        else:
            out["subscriptions"] = subs
        return out

    def has_subscription(self, destination: str, name: str) -> bool:
        """Whether topic ``destination`` has a durable subscription ``name``."""
        dest = self.destinations.find(destination)
        if dest is None:
            return False
        with dest.lock:
            sub = dest.subscriptions.get(name)
        return sub is not None and sub.durable
