"""``sparkmq kafka``: what Kafka clients see of the broker, asked over the Kafka protocol itself
(kafka-python's admin client, a dependency of the broker), as Kafka's own tools do:

- ``groups``: the consumer groups, their members and lag (``kafka-consumer-groups.sh
  --describe``);
- ``transactions``: the transactional producers and their open transactions, and
  ``abort-transaction``: one aborted by an operator (``kafka-transactions.sh list | describe |
  abort``)."""

from __future__ import annotations

import os
import time
from typing import Any

import click

from spark_mq.cli.output import emit_json, fail, table


@click.group()
def kafka() -> None:
    """Kafka clients' view of the broker."""


_CONNECTION = [
    click.option(
        "--bootstrap",
        envvar="SPARKMQ_KAFKA",
        default="127.0.0.1:9092",
        show_default=True,
        help="The broker's Kafka listener, host:port [env SPARKMQ_KAFKA].",
    ),
    click.option("--username", envvar="SPARKMQ_USERNAME", help="SASL/PLAIN user."),
    click.option("--tls-ca-file", envvar="SPARKMQ_TLS_CA_FILE", help="CA to verify the broker."),
]


def _connection(command: Any) -> Any:
    for option in reversed(_CONNECTION):
        command = option(command)
    return command


def _admin(bootstrap: str, username: str | None, tls_ca_file: str | None) -> Any:
    """kafka-python's admin client of the listener (the password from ``SPARKMQ_PASSWORD``,
    or asked); exit 3 when it cannot be reached."""
    from kafka import KafkaAdminClient
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
        return KafkaAdminClient(**settings)
    except KafkaError as exc:
        fail(f"cannot reach the Kafka listener at {bootstrap}: {exc}", 3)


@kafka.command("groups")
@_connection
@click.option("--json", "as_json", is_flag=True, help="One JSON document, for scripts.")
def groups(bootstrap: str, username: str | None, tls_ca_file: str | None, as_json: bool) -> None:
    """Consumer groups: state, members, and each topic's lag (end offset minus committed)."""
    from kafka import TopicPartition
    from kafka.admin import OffsetSpec
    from kafka.errors import KafkaError

    admin = _admin(bootstrap, username, tls_ca_file)
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


@kafka.command("transactions")
@_connection
@click.option("--json", "as_json", is_flag=True, help="One JSON document, for scripts.")
def transactions(
    bootstrap: str, username: str | None, tls_ca_file: str | None, as_json: bool
) -> None:
    """Transactional producers: each id's state, producer, how long its open transaction has
    run and the partitions it took in (a user sees its own ids; the broker's admin all)."""
    from kafka.errors import KafkaError

    admin = _admin(bootstrap, username, tls_ca_file)
    try:
        listed = admin.list_transactions()
        ids = sorted({t.transactional_id for node in listed.values() for t in node})
        described = admin.describe_transactions(ids) if ids else {}
    except KafkaError as exc:
        fail(f"the Kafka listener refused: {exc}", 1)
    finally:
        admin.close()
    now_ms = time.time() * 1000
    rows = [
        {
            "transactional_id": tid,
            "state": d.state.value,
            "producer_id": d.producer_id,
            "producer_epoch": d.producer_epoch,
            "timeout_ms": d.transaction_timeout_ms,
            "open_for_ms": (
                int(now_ms - d.transaction_start_time_ms)
                if d.transaction_start_time_ms >= 0
                else None
            ),
            "partitions": sorted(f"{tp.topic}[{tp.partition}]" for tp in d.topic_partitions),
        }
        for tid, d in sorted(described.items())
    ]
    if as_json:
        emit_json(rows)
        return
    table(
        ["transactional id", "state", "producer", "epoch", "open for", "partitions"],
        [
            (
                r["transactional_id"],
                r["state"],
                r["producer_id"],
                r["producer_epoch"],
                f"{r['open_for_ms'] / 1000:.1f} s" if r["open_for_ms"] is not None else "-",
                ", ".join(r["partitions"]) or "-",
            )
            for r in rows
        ],
        title="Kafka transactions",
    )


@kafka.command("abort-transaction")
@click.argument("transactional_id")
@_connection
def abort_transaction(
    transactional_id: str, bootstrap: str, username: str | None, tls_ca_file: str | None
) -> None:
    """Abort TRANSACTIONAL_ID's open transaction (the broker's admin only). Nothing of it was
    in any log; its producer is fenced: the application must start a new producer."""
    from kafka.admin._transactions import AbortTransactionSpec
    from kafka.errors import KafkaError

    admin = _admin(bootstrap, username, tls_ca_file)
    try:
        d = admin.describe_transactions([transactional_id])[transactional_id]
        if not d.topic_partitions:
            fail(f"{transactional_id} has no open transaction ({d.state.value})", 1)
        first = min(d.topic_partitions)
        admin.abort_transaction(AbortTransactionSpec(first, d.producer_id, d.producer_epoch))
    except KafkaError as exc:
        fail(f"the Kafka listener refused: {exc}", 1)
    finally:
        admin.close()
    click.echo(
        f"aborted the open transaction of {transactional_id} (producer {d.producer_id}, "
        f"epoch {d.producer_epoch}, {len(d.topic_partitions)} partition(s)); its producer is "
        "fenced"
    )


COMMANDS = [kafka]
