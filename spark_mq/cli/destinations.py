"""Queues, topics and subscriptions of a running broker, in the shape RabbitMQ's, Artemis's and
Kafka's tools have: ``status``, ``queue ...``, ``topic ...``, ``subscription ...``. Output: a
table, or ``--json``; exit codes as :mod:`.output` lists them.
"""

from __future__ import annotations

import time
from typing import Any

import click

from spark_mq.cli import output
from spark_mq.cli.output import answering, body_option, emit_json, fail, pairs, show_body, table
from spark_mq.cli.target import JSON, SETTINGS, YES, Target, connection, settings_of
from spark_mq.names import MAX_PARTITIONS


# -- the broker ------------------------------------------------------------------------------------
@click.command()
@connection
@JSON
@click.option("--config", "show_config", is_flag=True, help="The configuration in effect instead.")
def status(target: Target, as_json: bool, show_config: bool) -> None:
    """The broker: version, phase, role, uptime, memory and disk (or its configuration)."""
    with target.admin() as admin, answering():
        doc = admin.config() if show_config else admin.status()
    if as_json:
        return emit_json(doc)
    if show_config:
        for section, values in doc.items():
            pairs(values, title=f"[{section}]")
    else:  # (a cluster member's view of its cluster: sparkmq cluster status)
        pairs({k: v for k, v in doc.items() if k != "cluster"}, title="broker")


# -- queues and topics ---------------------------------------------------------------------------
def _kind_group(kind: str) -> click.Group:
    @click.group(name=kind, help=f"{kind.capitalize()}s of a running broker.")
    def group() -> None:
        pass

    @group.command(name="list", help=f"List the {kind}s with their depth, consumers and counts.")
    @connection
    @JSON
    def list_cmd(target: Target, as_json: bool) -> None:
        from spark_mq.views import summary

        with target.admin() as admin, answering():
            rows = [
                summary(d)
                for d in admin.list_destinations()
                if d["kind"] == kind and not d["temporary"]
            ]
        if as_json:
            return emit_json(rows)
        columns = ["NAME", "DEPTH", "IN-FLIGHT", "CONSUMERS", "PRODUCED", "ACKED", "DEAD-LETTERED"]
        if kind == "topic":
            columns.insert(1, "SUBSCRIPTIONS")
        clustered = any("member" in r for r in rows)  # (a cluster's: who serves each)
        table(
            [*columns, "DELTA-LAG", *(["MEMBER"] if clustered else [])],
            (
                [r["name"]]
                + ([r["subscriptions"]] if kind == "topic" else [])
                + [r["depth"], r["in_flight"], r["consumers"], r["produced"], r["acked"]]
                + [r["dead_lettered"], r["delta_lag_messages"]]
                + ([r.get("member", "")] if clustered else [])
                for r in rows
            ),
        )

    @group.command(name="create")
    @click.argument("name")
    @SETTINGS
    @connection
    @JSON
    def create(name: str, sets: tuple[str, ...], target: Target, as_json: bool) -> None:
        """Create it (settings override the broker's [destinations] defaults)."""
        settings = settings_of(sets)
        with target.admin() as admin, answering():
            maker = admin.create_queue if kind == "queue" else admin.create_topic
            created = maker(name, **settings)
        if as_json:
            return emit_json({"name": name, "created": created})
        click.echo(f"created {kind} {name}" if created else f"{kind} {name} exists already")

    @group.command(name="describe")
    @click.argument("name")
    @connection
    @JSON
    def describe(name: str, target: Target, as_json: bool) -> None:
        """Everything about it: settings, figures, consumers, subscriptions."""
        with target.admin() as admin, answering():
            doc = _of_kind(admin.stats(name), kind)
        if as_json:
            return emit_json(doc)
        skip = {"settings", "subscriptions", "consumer_list"}
        pairs({k: v for k, v in doc.items() if k not in skip}, title=f"{kind} {name}")
        pairs(doc["settings"], title="settings")
        consumers = doc.get("consumer_list") or []
        table(
            ["ID", "SUBSCRIPTION", "PREFETCH", "IN-FLIGHT", "SELECTOR"],
            ([c["id"], c["subscription"], c["prefetch"], c["in_flight"], c["selector"]]
             for c in consumers),
            title="consumers",
        )  # fmt: skip
        if kind == "topic":
            _subscription_table(doc)

    @group.command(name="stat")
    @click.argument("names", nargs=-1)
    @click.option(
        "--interval",
        default=1.0,
        show_default=True,
        help="Seconds between the two samples rates are measured over (0: no rates).",
    )
    @connection
    @JSON
    def stat(names: tuple[str, ...], interval: float, target: Target, as_json: bool) -> None:
        """Depth, in flight, rates, consumers, redeliveries, DLQ depth and Delta lag (all of
        this kind when no name is given), as Artemis's `queue stat`."""
        with target.admin() as admin, answering():
            rows = _stat_rows(admin, kind, names, interval)
        if as_json:
            return emit_json(rows)
        table(
            ["NAME", "DEPTH", "IN-FLIGHT", "IN/S", "ACKED/S", "CONSUMERS", "REDELIVERED",
             "DLQ-DEPTH", "DELTA-LAG", "DELTA-LAG-MS"],
            ([r["name"], r["depth"], r["in_flight"], r["produced_per_s"], r["acked_per_s"],
              r["consumers"], r["redelivered"], r["dlq_depth"], r["delta_lag_messages"],
              r["delta_lag_ms"]] for r in rows),
        )  # fmt: skip

    @group.command(name="configure")
    @click.argument("name")
    @SETTINGS
    @connection
    @JSON
    def configure(name: str, sets: tuple[str, ...], target: Target, as_json: bool) -> None:
        """Change some of its settings; shows all of them now in effect."""
        settings = settings_of(sets)
        if not settings:
            fail("nothing to change: give --set KEY=VALUE", output.EXIT_USAGE)
        with target.admin() as admin, answering():
            _of_kind(admin.stats(name), kind)
            doc = admin.configure(name, **settings)
        if as_json:
            return emit_json(doc)
        pairs(doc, title=f"{kind} {name}: settings")

    @group.command(name="add-partitions")
    @click.argument("name")
    @click.argument("partitions", type=click.IntRange(1, MAX_PARTITIONS))
    @connection
    @JSON
    def add_partitions(name: str, partitions: int, target: Target, as_json: bool) -> None:
        """Grow a partitioned one to PARTITIONS partitions in all (Kafka's
        `kafka-topics --alter --partitions`): the new ones get its settings and subscriptions;
        producers and consumers take them on within their partitions_recheck_s."""
        with target.admin() as admin, answering():
            _of_kind(admin.stats(name), kind)
            grew = admin.add_partitions(name, partitions)
        doc = {"name": name, "partitions": partitions, "added": grew}
        if as_json:
            return emit_json(doc)
        said = "now has" if grew else "already had"
        click.echo(f"{kind} {name} {said} {partitions} partitions")

    @group.command(name="browse")
    @click.argument("name")
    @click.option("--subscription", help="A topic's subscription (topics).")
    @click.option("--limit", default=20, show_default=True, type=click.IntRange(1, 10_000))
    @click.option("--selector", help="Only messages this selector matches.")
    @body_option("auto")
    @connection
    @JSON
    def browse(
        name: str,
        subscription: str | None,
        limit: int,
        selector: str | None,
        body_as: str,
        target: Target,
        as_json: bool,
    ) -> None:
        """Show waiting messages in delivery order without consuming them."""
        from spark_mq.views import message_rows

        with target.admin() as admin, answering():
            _of_kind(admin.stats(name), kind)
            rows = admin.browse(name, subscription, limit=limit, selector=selector)
        if as_json:
            return emit_json(message_rows(rows))
        table(
            ["OFFSET", "PRIORITY", "GROUP", "HEADERS", "BODY"],
            (
                [r["offset"], r["priority"], r["group_id"], dict(r["headers"] or ()),
                 show_body(r["body"] or b"", body_as)]
                for r in rows.to_pylist()
            ),
        )  # fmt: skip

    @group.command(name="purge")
    @click.argument("name")
    @click.option("--subscription", help="A topic's subscription (topics).")
    @YES
    @connection
    @JSON
    def purge(
        name: str, subscription: str | None, yes: bool, target: Target, as_json: bool
    ) -> None:
        """Remove every waiting message (leased ones stay)."""
        with target.admin() as admin, answering():
            _of_kind(admin.stats(name), kind)
            if not yes and not as_json:
                click.confirm(f"purge every waiting message of {kind} {name}?", abort=True)
            with output.err.status(f"purging {name}..."):
                n = admin.purge(name, subscription)
        if as_json:
            return emit_json({"name": name, "purged": n})
        click.echo(f"purged {n:,} message(s) of {name}")

    @group.command(name="delete")
    @click.argument("name")
    @YES
    @connection
    @JSON
    def delete(name: str, yes: bool, target: Target, as_json: bool) -> None:
        """Delete it with every message it holds."""
        with target.admin() as admin, answering():
            _of_kind(admin.stats(name), kind)
            if not yes and not as_json:
                click.confirm(f"delete {kind} {name} and every message it holds?", abort=True)
            admin.delete_destination(name)
        if as_json:
            return emit_json({"name": name, "deleted": True})
        click.echo(f"deleted {kind} {name}")

    return group


def _of_kind(doc: dict[str, Any], kind: str) -> dict[str, Any]:
    if doc["kind"] != kind:
        fail(
            f"{doc['name']!r} is a {doc['kind']}, not a {kind}: use `sparkmq {doc['kind']} ...`",
            output.EXIT_USAGE,
        )
    return doc


def _subscription_table(doc: dict[str, Any]) -> None:
    subs = doc.get("subscriptions") or {}
    table(
        ["SUBSCRIPTION", "DEPTH", "IN-FLIGHT", "CONSUMERS", "GROUPS", "ACKED", "DEAD-LETTERED"],
        ([n, s["depth"], s["in_flight"], s["consumers"], s["groups_owned"], s["acked"],
          s["dead_lettered"]] for n, s in subs.items()),
        title="subscriptions",
    )  # fmt: skip


def _stat_rows(admin: Any, kind: str, names: tuple[str, ...], interval: float) -> list[dict]:
    from spark_mq.views import summary

    def sample() -> dict[str, dict[str, Any]]:
        if names:
            docs = [_of_kind(admin.stats(n), kind) for n in names]
        else:
            docs = [
                d for d in admin.list_destinations() if d["kind"] == kind and not d["temporary"]
            ]
        return {d["name"]: summary(d) for d in docs}

    first = sample()
    started = time.monotonic()
    if interval > 0:
        time.sleep(interval)
        second = sample()
    else:
        second = first
    took = max(time.monotonic() - started, 1e-9)
    known = {d["name"]: d for d in admin.list_destinations()}
    rows = []
    for name, s in second.items():
        before = first.get(name, s)
        dlq = known.get(f"DLQ.{name}")
        rows.append(
            {
                **s,
                "produced_per_s": round((s["produced"] - before["produced"]) / took, 1)
                if interval > 0
                else None,
                "acked_per_s": round((s["acked"] - before["acked"]) / took, 1)
                if interval > 0
                else None,
                "dlq_depth": summary(dlq)["depth"] if dlq else 0,
            }
        )
    return rows


queue = _kind_group("queue")
topic = _kind_group("topic")


# -- subscriptions ---------------------------------------------------------------------------
@click.group()
def subscription() -> None:
    """Durable subscriptions of a topic."""


@subscription.command(name="list")
@click.argument("topic_name", metavar="TOPIC")
@connection
@JSON
def subscription_list(topic_name: str, target: Target, as_json: bool) -> None:
    """A topic's subscriptions with their depth and consumers."""
    with target.admin() as admin, answering():
        doc = _of_kind(admin.stats(topic_name), "topic")
    if as_json:
        return emit_json(doc.get("subscriptions") or {})
    _subscription_table(doc)


@subscription.command(name="create")
@click.argument("topic_name", metavar="TOPIC")
@click.argument("name")
@click.option("--selector", help="Keep only the messages this selector matches.")
@connection
@JSON
def subscription_create(
    topic_name: str, name: str, selector: str | None, target: Target, as_json: bool
) -> None:
    """A durable subscription: it keeps every message published from now on until acked."""
    with target.admin() as admin, answering():
        created = admin.create_subscription(topic_name, name, selector=selector)
    if as_json:
        return emit_json({"topic": topic_name, "name": name, "created": created})
    click.echo(
        f"created subscription {name} of {topic_name}"
        if created
        else f"subscription {name} of {topic_name} exists already"
    )


@subscription.command(name="delete")
@click.argument("topic_name", metavar="TOPIC")
@click.argument("name")
@YES
@connection
@JSON
def subscription_delete(
    topic_name: str, name: str, yes: bool, target: Target, as_json: bool
) -> None:
    """Delete a subscription and what it kept."""
    with target.admin() as admin, answering():
        subs = _of_kind(admin.stats(topic_name), "topic").get("subscriptions") or {}
        if name not in subs:
            fail(f"topic {topic_name!r} has no subscription {name!r}", output.EXIT_NOT_FOUND)
        if not yes and not as_json:
            click.confirm(f"delete subscription {name} of {topic_name}?", abort=True)
        admin.delete_subscription(topic_name, name)
    if as_json:
        return emit_json({"topic": topic_name, "name": name, "deleted": True})
    click.echo(f"deleted subscription {name} of {topic_name}")


COMMANDS = [status, queue, topic, subscription]
