"""The broker's metrics in Prometheus's exposition format (``GET /metrics``).

Nothing here runs on the delivery path: a scrape reads the counters the broker keeps anyway
(each subscription's delivered / acked / nacked / redelivered / dead-lettered / expired counts,
each log's end offset, the hot tier's and the monitors' state) and the journal's histograms
(:mod:`spark_mq.journal.timing`), and turns them into metric families with ``prometheus_client``
(its exposition and naming rules: ``_total`` counters, base units in the names). A scrape by a
principal sees the destinations it may use, as a listing does.

:data:`METRICS` names every family, for the Grafana dashboard's test and the README.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    InfoMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from spark_mq.broker.memory import STATES as MEMORY_STATES

if TYPE_CHECKING:
    from spark_mq.broker.core import Broker
    from spark_mq.journal.timing import Buckets

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
PHASES = ("starting", "backup", "recovering", "serving", "stopping", "stopped")

# per subscription (a queue's one subscription has the label subscription="")
_SUB_GAUGES = {
    "depth": ("sparkmq_destination_depth_messages", "Messages not settled: waiting or leased."),
    "waiting": ("sparkmq_destination_waiting_messages", "Messages not delivered yet."),
    "in_flight": ("sparkmq_destination_in_flight_messages", "Messages leased to consumers."),
    "scheduled": ("sparkmq_destination_scheduled_messages", "Messages due later."),
    "consumers": ("sparkmq_destination_consumers", "Consumers attached."),
    "groups_owned": ("sparkmq_destination_groups_owned", "Message groups with an owner."),
    "oldest_unsettled_age_s": (
        "sparkmq_destination_oldest_unsettled_age_seconds",
        "How long the oldest message not settled (waiting, leased or scheduled) has been in the "
        "log; 0 with none.",
    ),
    "settled_past_mark": (
        "sparkmq_destination_settled_past_mark_messages",
        "Messages settled past the first unsettled one (the low-water mark): a message held "
        "unacknowledged there (scheduled, in a long lease, kept by a consumer) keeps them known.",
    ),
}
_SUB_COUNTERS = {
    "delivered": ("sparkmq_destination_delivered_messages", "Deliveries (leases handed out)."),
    "acked": ("sparkmq_destination_acked_messages", "Messages acknowledged."),
    "nacked": ("sparkmq_destination_nacked_messages", "Messages given back by a nack."),
    "redelivered": ("sparkmq_destination_redelivered_messages", "Deliveries that came back."),
    "dead_lettered": ("sparkmq_destination_dead_lettered_messages", "Messages dead-lettered."),
    "expired": ("sparkmq_destination_expired_messages", "Messages expired."),
}
# per destination
_DEST_GAUGES = {
    "delta_lag_messages": (
        "sparkmq_destination_delta_lag_messages",
        "Messages acknowledged but not in the Delta table yet.",
    ),
    "hot_tier_bytes": (
        "sparkmq_destination_hot_tier_bytes",
        "Bytes in the hot tier not moved to Delta yet.",
    ),
    "bytes_in_memory": ("sparkmq_destination_memory_bytes", "Message bytes the broker holds."),
}


@dataclass
class Scrape:
    """What one scrape may see and where the service-level figures come from."""

    broker: Broker
    visible: Callable[[str], bool] = lambda _name: True
    connections: Callable[[], dict[str, int]] = dict
    auth_failures: Callable[[], int] = lambda: 0
    kafka_groups: Callable[[], list[dict[str, Any]]] = list
    kafka_transactions: Callable[[], dict[str, int]] = dict


class BrokerCollector(Collector):
    def __init__(self, scrape: Scrape) -> None:
        self.scrape = scrape

    def collect(self) -> Iterator[Metric]:
        s = self.scrape
        b = s.broker
        yield from _broker_families(b, s)
        if b.phase == "serving":
            yield from _destination_families(
                [d for d in b.list_destinations() if s.visible(d["name"]) and not d["temporary"]]
            )
        if b.timing is not None:
            t = b.timing
            yield _histogram(
                "sparkmq_journal_commit_seconds",
                "Journal commits: from taking the records to durable.",
                t.commit_seconds,
            )
            yield _histogram(
                "sparkmq_journal_commit_records",
                "Records (produce requests and settlements) per journal commit.",
                t.commit_records,
            )
            yield _histogram(
                "sparkmq_produce_ack_seconds",
                "A produce request's wait from arrival at the journal to durable (acknowledged).",
                t.produce_ack_seconds,
            )


def _kafka_families(s: Scrape) -> Iterator[Metric]:
    members = GaugeMetricFamily(
        "sparkmq_kafka_group_members",
        "Members of a Kafka consumer or share group.",
        labels=["group", "kind"],
    )
    generation = GaugeMetricFamily(
        "sparkmq_kafka_group_generation",
        "A Kafka group's generation (consumer groups) or epoch (share groups).",
        labels=["group", "kind"],
    )
    lag = GaugeMetricFamily(
        "sparkmq_kafka_group_lag_messages",
        "Messages of a topic after a Kafka consumer group's committed offset.",
        labels=["group", "topic"],
    )
    for g in s.kafka_groups():
        name, kind = str(g["group"]), str(g["kind"])
        members.add_metric([name, kind], len(g["members"]))
        generation.add_metric([name, kind], float(g["generation"]))
        for topic, n in sorted(g.get("lag", {}).items()):
            if s.visible(topic):
                lag.add_metric([name, topic], float(n))
    yield members
    yield generation
    yield lag
    txns = s.kafka_transactions()
    if txns:
        yield GaugeMetricFamily(
            "sparkmq_kafka_transactional_producers",
            "Kafka transactional ids with a producer here (this member coordinates them).",
            value=txns["producers"],
        )
        yield GaugeMetricFamily(
            "sparkmq_kafka_transactions_open",
            "Kafka transactions begun and not yet committed or aborted.",
            value=txns["open"],
        )
        yield GaugeMetricFamily(
            "sparkmq_kafka_transactions_kept_bytes",
            "Record bytes open Kafka transactions keep until they end.",
            value=txns["kept_bytes"],
        )
        yield CounterMetricFamily(
            "sparkmq_kafka_transactions_timed_out",
            "Kafka transactions aborted because they were open past their timeout.",
            value=txns["aborted_on_timeout"],
        )


def render(scrape: Scrape) -> bytes:
    """The exposition text of one scrape."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(BrokerCollector(scrape))
    return generate_latest(registry)


def _broker_families(b: Broker, s: Scrape) -> Iterator[Metric]:
    state = b.status()
    info = InfoMetricFamily("sparkmq_broker", "The broker: version, id and high-availability mode.")
    info.add_metric(
        [],
        {
            "version": str(state["version"]),
            "broker_id": str(state["broker_id"]),
            "ha_mode": str(state["ha_mode"]),
        },
    )
    yield info
    yield _one_of(
        "sparkmq_broker_phase", "1 for the phase the broker is in.", "phase", PHASES,
        state["phase"],
    )  # fmt: skip
    yield GaugeMetricFamily(
        "sparkmq_broker_uptime_seconds", "Seconds since the broker started.", state["uptime_s"]
    )
    conns = GaugeMetricFamily(
        "sparkmq_broker_connections",
        "Open connections (Flight: calls under way), by transport.",
        labels=["transport"],
    )
    for transport, n in sorted(s.connections().items()):
        conns.add_metric([transport], n)
    yield conns
    yield from _kafka_families(s)
    yield CounterMetricFamily(
        "sparkmq_authentication_failures",
        "Failed logins (wrong password, bad token or certificate).",
        s.auth_failures(),
    )
    yield _one_of(
        "sparkmq_memory_state", "1 for the memory state (green, yellow, orange, red).", "state",
        MEMORY_STATES, state["memory_state"],
    )  # fmt: skip
    yield GaugeMetricFamily(
        "sparkmq_memory_used_bytes", "Message bytes held in memory.", state["memory_used_bytes"]
    )
    yield GaugeMetricFamily(
        "sparkmq_memory_budget_bytes",
        "The memory budget (limits.memory_budget_bytes).",
        state["memory_budget_bytes"],
    )
    free = state.get("disk_free_bytes")
    if free is not None:
        yield GaugeMetricFamily(
            "sparkmq_disk_free_bytes", "Free bytes on the journal's disk.", free
        )
    yield GaugeMetricFamily(
        "sparkmq_disk_low",
        "1 while the journal's disk is below its minimum free.",
        state["disk_low"],
    )
    if "cluster" in state:
        yield from _cluster_families(state["cluster"])
    if "replication_lag_records" in state:
        yield GaugeMetricFamily(
            "sparkmq_replication_lag_records",
            "Records shipped to the backup and not acknowledged by it yet.",
            state["replication_lag_records"],
        )
        yield GaugeMetricFamily(
            "sparkmq_replication_lag_bytes",
            "Bytes shipped to the backup and not acknowledged by it yet.",
            state["replication_lag_bytes"],
        )
        yield GaugeMetricFamily(
            "sparkmq_replication_in_sync",
            "1 while the backup is in sync (may take over).",
            1.0 if state["replication_state"] == "in_sync" else 0.0,
        )


SESSION_STATES = ("connected", "suspended", "lost", "stopped")


def _one_of(
    name: str, documentation: str, label: str, states: Iterable[str], current: str
) -> GaugeMetricFamily:
    """A state as a gauge per possible value: 1 for the one it is in, 0 for the others."""
    family = GaugeMetricFamily(name, documentation, labels=[label])
    for st in states:
        family.add_metric([st], 1.0 if current == st else 0.0)
    return family


def _cluster_families(c: dict[str, Any]) -> Iterator[Metric]:
    """A cluster member's: its ZooKeeper session, the members, what it serves, its moves."""
    yield _one_of(
        "sparkmq_cluster_session", "1 for the state of the member's ZooKeeper session.",
        "state", SESSION_STATES, c["session"],
    )  # fmt: skip
    yield GaugeMetricFamily(
        "sparkmq_cluster_leader", "1 while this member places destinations.",
        1.0 if c["leader"] == c["member_id"] else 0.0,
    )  # fmt: skip
    yield GaugeMetricFamily("sparkmq_cluster_members", "Members in the cluster.", len(c["members"]))
    yield GaugeMetricFamily(
        "sparkmq_cluster_destinations_served", "Destinations this member serves.",
        len(c["serving"]),
    )  # fmt: skip
    yield GaugeMetricFamily(
        "sparkmq_cluster_destinations", "Destinations placed in the cluster.", len(c["owners"])
    )
    yield CounterMetricFamily(
        "sparkmq_cluster_moves",
        "Destinations this member took on or let go (hand-overs).",
        c["moves"],
    )
    yield GaugeMetricFamily(
        "sparkmq_cluster_destinations_placing",
        "Destinations placed on this member and not served yet (being taken on, or waiting "
        "for the member they move from to let them go).",
        len(c.get("placing", ())),
    )
    yield CounterMetricFamily(
        "sparkmq_cluster_hand_over_timeouts",
        "Destinations this member fenced because the member they moved from had not let them "
        "go within cluster.hand_over_wait_s.",
        c.get("hand_overs_timed_out", 0),
    )
    yield CounterMetricFamily(
        "sparkmq_cluster_transaction_parts_finished",
        "Parts of transactions another member committed that this member stored for it (that "
        "member was lost, or had not stored them within its wait).",
        c.get("transaction_parts_finished", 0),
    )


def _destination_families(dests: list[dict[str, Any]]) -> Iterator[Metric]:
    labels = ["destination", "kind"]
    sub_labels = [*labels, "subscription"]
    gauges = {k: GaugeMetricFamily(n, h, labels=sub_labels) for k, (n, h) in _SUB_GAUGES.items()}
    counters = {
        k: CounterMetricFamily(n, h, labels=sub_labels) for k, (n, h) in _SUB_COUNTERS.items()
    }
    dest_gauges = {k: GaugeMetricFamily(n, h, labels=labels) for k, (n, h) in _DEST_GAUGES.items()}
    produced = CounterMetricFamily(
        "sparkmq_destination_produced_messages", "Messages appended to the log.", labels=labels
    )
    duplicates = CounterMetricFamily(
        "sparkmq_destination_duplicates",
        "Messages refused as duplicates (duplicate detection).",
        labels=labels,
    )
    subscriptions = GaugeMetricFamily(
        "sparkmq_destination_subscriptions", "Subscriptions of a topic.", labels=labels
    )
    lag_s = GaugeMetricFamily(
        "sparkmq_destination_delta_lag_seconds",
        "How far the Delta table (what Spark reads) trails the broker, in seconds.",
        labels=labels,
    )
    failed = CounterMetricFamily(
        "sparkmq_journal_failed_commits", "Journal commits that failed.", labels=labels
    )
    for d in dests:
        key = [d["name"], d["kind"]]
        subs = {"": d} if d["kind"] == "queue" else d.get("subscriptions", {})
        for sub_name, sub in subs.items():
            for k, fam in gauges.items():
                fam.add_metric([*key, sub_name], sub.get(k, 0))
            for k, cfam in counters.items():
                cfam.add_metric([*key, sub_name], sub.get(k, 0))
        for k, fam in dest_gauges.items():
            if d.get(k) is not None:
                fam.add_metric(key, d[k])
        produced.add_metric(key, d["produced"])
        duplicates.add_metric(key, d["duplicates"])
        failed.add_metric(key, d["journal_failed_commits"])
        if d["kind"] == "topic":
            subscriptions.add_metric(key, len(subs))
        lag_s.add_metric(key, d.get("delta_lag_ms", 0.0) / 1000)
    yield from gauges.values()
    yield from counters.values()
    yield from dest_gauges.values()
    yield from (produced, duplicates, subscriptions, lag_s, failed)


def _histogram(name: str, documentation: str, h: Buckets) -> HistogramMetricFamily:
    return HistogramMetricFamily(name, documentation, buckets=h.cumulative(), sum_value=h.total)


# every family /metrics may show (the Grafana dashboard may query only these)
# a cluster member's only
CLUSTER_METRICS = frozenset(
    {
        "sparkmq_cluster_session",
        "sparkmq_cluster_leader",
        "sparkmq_cluster_members",
        "sparkmq_cluster_destinations_served",
        "sparkmq_cluster_destinations",
        "sparkmq_cluster_moves_total",
    }
)
METRICS = frozenset(
    {
        "sparkmq_broker_info",
        "sparkmq_broker_phase",
        "sparkmq_broker_uptime_seconds",
        "sparkmq_broker_connections",
        "sparkmq_authentication_failures_total",
        "sparkmq_memory_state",
        "sparkmq_memory_used_bytes",
        "sparkmq_memory_budget_bytes",
        "sparkmq_disk_free_bytes",
        "sparkmq_disk_low",
        "sparkmq_replication_lag_records",
        "sparkmq_replication_lag_bytes",
        "sparkmq_replication_in_sync",
        *CLUSTER_METRICS,
        *(n for n, _ in _SUB_GAUGES.values()),
        *(f"{n}_total" for n, _ in _SUB_COUNTERS.values()),
        *(n for n, _ in _DEST_GAUGES.values()),
        "sparkmq_destination_produced_messages_total",
        "sparkmq_destination_duplicates_total",
        "sparkmq_destination_subscriptions",
        "sparkmq_destination_delta_lag_seconds",
        "sparkmq_journal_failed_commits_total",
        *(
            f"{n}_{suffix}"
            for n in (
                "sparkmq_journal_commit_seconds",
                "sparkmq_journal_commit_records",
                "sparkmq_produce_ack_seconds",
            )
            for suffix in ("bucket", "sum", "count")
        ),
    }
)
