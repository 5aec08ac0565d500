"""A cluster of brokers, asked through any member: ``cluster status`` (the members, the leader,
the ZooKeeper session's health, who owns which destination with which epoch) and ``cluster
pin`` / ``cluster unpin`` (an operator's move). Output: tables, or ``--json``."""

from __future__ import annotations

import click

from spark_mq.cli.output import answering, emit_json, pairs, table
from spark_mq.cli.target import JSON, Target, connection


@click.group()
def cluster() -> None:
    """A cluster of brokers (cluster.zookeeper), through any of its members."""


@cluster.command(name="status")
@connection
@JSON
def cluster_status(target: Target, as_json: bool) -> None:
    """Members, leader, session health, and who owns which destination."""
    with target.admin() as admin, answering():
        doc = admin.cluster()
    if as_json:
        return emit_json(doc)
    mine = {k: doc[k] for k in ("cluster", "member_id", "endpoint", "session", "leader", "moves")}
    mine["placing"] = ", ".join(doc.get("placing", [])) or "-"  # (moves to it in progress)
    mine["awaiting_hand_over"] = ", ".join(doc.get("awaiting_hand_over", [])) or "-"
    mine["hand_overs_timed_out"] = doc.get("hand_overs_timed_out", 0)
    pairs(mine, title="this member")
    owned: dict[str, int] = {}
    for owner in doc["owners"].values():
        owned[owner["member"]] = owned.get(owner["member"], 0) + 1
    table(
        ["MEMBER", "ENDPOINT", "HOST", "PID", "DESTINATIONS"],
        (
            [m, info["endpoint"], info["host"], info["pid"], owned.get(m, 0)]
            for m, info in sorted(doc["members"].items())
        ),
        title="members",
    )
    table(
        ["NAME", "MEMBER", "EPOCH"],
        ([n, o["member"], o["epoch"]] for n, o in sorted(doc["owners"].items())),
        title="owners",
    )


@cluster.command(name="pin")
@click.argument("name")
@click.argument("member")
@connection
@JSON
def pin(name: str, member: str, target: Target, as_json: bool) -> None:
    """Keep destination NAME on MEMBER (moved there now, with a new epoch)."""
    with target.admin() as admin, answering():
        doc = admin.pin(name, member)
    if as_json:
        return emit_json(doc)
    click.echo(f"pinned {name} to {member} (owned by {doc['owner']} now; it moves there)")


@cluster.command(name="unpin")
@click.argument("name")
@connection
@JSON
def unpin(name: str, target: Target, as_json: bool) -> None:
    """Let the placement decide where NAME goes again."""
    with target.admin() as admin, answering():
        doc = admin.pin(name, None)
    if as_json:
        return emit_json(doc)
    click.echo(f"unpinned {name} (owned by {doc['owner']})")


COMMANDS = [cluster]
