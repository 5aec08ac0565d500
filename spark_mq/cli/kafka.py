"""``sparkmq kafka groups``: the broker's Kafka consumer groups, their members and lag, asked
over the Kafka protocol itself (kafka-python's admin client, a dependency of the broker), as
Kafka's own ``kafka-consumer-groups.sh --describe`` does."""

from __future__ import annotations

import os
from typing import Any

import click

from spark_mq.cli.output import emit_json, fail, table


@click.group()
def kafka() -> None:
    """Kafka clients' view of the broker."""


@kafka.command("groups")
@click.option(
    "--bootstrap",
    envvar="SPARKMQ_KAFKA",
    default="127.0.0.1:9092",
    show_default=True,
    help="The broker's Kafka listener, host:port [env SPARKMQ_KAFKA].",
)
@click.option("--username", envvar="SPARKMQ_USERNAME", help="SASL/PLAIN user.")
@click.option("--tls-ca-file", envvar="SPARKMQ_TLS_CA_FILE", help="CA to verify the broker.")
@click.option("--json", "as_json", is_flag=True, help="One JSON document, for scripts.")
def groups(bootstrap: str, username: str | None, tls_ca_file: str | None, as_json: bool) -> None:
    """Consumer groups: state, members, and each topic's lag (end offset minus committed)."""
    from kafka import KafkaAdminClient, TopicPartition
    from kafka.admin import OffsetSpec
    from kafka.errors import KafkaError

    settings: dict[str, Any] = {
        "bootstrap_servers": bootstrap,
        "request_timeout_ms": 10_000,
        "bootstrap_timeout_ms": 5_000,
    }
    if username:
        password = os.environ.get("SPARKMQ_PASSWORD") or click.prompt(
            f"Password for {username}", hide_input=True, err=True
        )
        settings.update(
            security_protocol="SASL_SSL" if tls_ca_file else "SASL_PLAINTEXT",
            sasl_mechanism="PLAIN",
            sasl_plain_username=username,
            sasl_plain_password=password,
        )
    elif tls_ca_file:
        settings["security_protocol"] = "SSL"
    if tls_ca_file:
        settings["ssl_cafile"] = tls_ca_file
    try:
        admin = KafkaAdminClient(**settings)
    except KafkaError as exc:
        fail(f"cannot reach the Kafka listener at {bootstrap}: {exc}", 3)
    try:
        listed = admin.list_groups()
        names = [g["group_id"] for g in listed]
        described = admin.describe_groups(names) if names else {}
        committed = admin.list_group_offsets(dict.fromkeys(names)) if names else {}
        parts = {tp for offsets in committed.values() for tp in offsets}
        ends = (
            admin.list_partition_offsets(dict.fromkeys(parts, OffsetSpec.LATEST)) if parts else {}
        )
    except KafkaError as exc:
        fail(f"the Kafka listener refused: {exc}", 1)
    finally:
        admin.close()
    rows = []
    for g in listed:
        name = g["group_id"]
        lag: dict[str, int] = {}  # (a topic's partitions' added up)
        for tp, om in committed.get(name, {}).items():
            end = ends.get(TopicPartition(tp.topic, tp.partition))
            if end is not None:
                lag[tp.topic] = lag.get(tp.topic, 0) + max(end.offset - om.offset, 0)
        rows.append(
            {
                "group": name,
                "state": g["group_state"],
                "members": len(described.get(name, {}).get("members", [])),
                "lag": lag,
            }
        )
    if as_json:
        emit_json(rows)
        return
    table(
        ["group", "state", "members", "lag"],
        [
            (
                r["group"],
                r["state"],
                r["members"],
                ", ".join(f"{t}: {n}" for t, n in r["lag"].items()) or "-",
            )
            for r in rows
        ],
        title="Kafka consumer groups",
    )


COMMANDS = [kafka]
