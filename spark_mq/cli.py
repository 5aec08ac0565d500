"""The ``sparkmq`` command: ``sparkmq broker`` runs a broker, ``sparkmq demo`` shows the flow."""

from __future__ import annotations

import logging
import sys
from typing import TYPE_CHECKING

import click

from spark_mq.errors import ConfigError, SparkMQError

if TYPE_CHECKING:
    from spark_mq.jobs.schedule import JobsConfig
    from spark_mq.security.users import UsersFile


@click.group()
@click.version_option(package_name="sparkmq")
def main() -> None:
    """sparkmq: JMS-grade messaging on Delta tables, streamed by Spark."""


@main.command()
@click.option(
    "--config",
    "config_file",
    type=click.Path(dir_okay=False),
    help="TOML config file (see conf/broker.toml).",
)
@click.option("--host", help="Interface to listen on [broker.host].")
@click.option("--port", type=int, help="Port; 0 picks a free one [broker.port].")
@click.option(
    "--wire-port", type=int, help="Port of the direct wire; 0 picks a free one [broker.wire_port]."
)
@click.option("--data-dir", help="Directory or URI of the Delta tables [broker.data_dir].")
@click.option("--persistence", type=click.Choice(["delta", "memory"]), help="[broker.persistence]")
@click.option(
    "--set", "sets", multiple=True, metavar="SECTION.KEY=VALUE", help="Override any setting."
)
@click.option(
    "--insecure",
    is_flag=True,
    default=None,
    help="Listen on a non-loopback interface with security off [broker.insecure].",
)
@click.option(
    "--ready-file",
    type=click.Path(dir_okay=False),
    help="Write {url, port, wire_port, pid} here once listening.",
)
def broker(
    config_file: str | None,
    host: str | None,
    port: int | None,
    wire_port: int | None,
    data_dir: str | None,
    persistence: str | None,
    sets: tuple[str, ...],
    insecure: bool | None,
    ready_file: str | None,
) -> None:
    """Run a broker until SIGTERM/SIGINT (pending commits are flushed before exit); SIGHUP
    reloads the access rules."""
    from spark_mq.config import load_config
    from spark_mq.service import serve

    overrides: dict[str, object] = {}
    for item in sets:
        key, sep, value = item.partition("=")
        if not sep:
            raise click.BadParameter(
                f"expected SECTION.KEY=VALUE, got {item!r}", param_hint="--set"
            )
        overrides[key.strip()] = value.strip()
    flags: dict[str, object] = {
        "broker.host": host,
        "broker.port": port,
        "broker.wire_port": wire_port,
        "broker.data_dir": data_dir,
        "broker.persistence": persistence,
        "broker.insecure": insecure,
    }
    for key, flag in flags.items():
        if flag is not None:
            overrides[key] = flag
    try:
        config = load_config(config_file, overrides=overrides)
    except ConfigError as exc:
        click.echo(f"sparkmq broker: {exc}", err=True)
        sys.exit(2)
    try:
        serve(config, ready_file=ready_file)
    except ConfigError as exc:  # found on start-up: a port taken, segments left behind
        click.echo(f"sparkmq broker: {exc}", err=True)
        sys.exit(2)


@main.command()
@click.option(
    "--data-dir", default="./demo-data", show_default=True, help="Where the demo keeps its tables."
)
@click.option(
    "--messages",
    default=5000,
    show_default=True,
    help="How many messages to produce to each destination.",
)
def demo(data_dir: str, messages: int) -> None:
    """Start a broker, produce, consume with acks, and stream a topic with Spark."""
    from spark_mq.demo import run_demo

    run_demo(data_dir, messages)


_JOBS_CONFIG = click.option(
    "--config",
    "config_file",
    type=click.Path(dir_okay=False),
    help="Jobs config (see conf/jobs.toml): compaction defaults and schedules.",
)


def _jobs_config(config_file: str | None) -> JobsConfig:
    from spark_mq.jobs.schedule import load_jobs_config

    try:
        return load_jobs_config(config_file)
    except ConfigError as exc:
        click.echo(f"sparkmq: {exc}", err=True)
        sys.exit(2)


@main.command()
@click.option("--data-dir", required=True, help="The broker's data root (directory or URI).")
@_JOBS_CONFIG
@click.option(
    "--destination", "only", multiple=True, help="Compact only this destination (repeatable)."
)
@click.option("--dry-run", is_flag=True, help="Report what would be removed; change nothing.")
@click.option("--force", is_flag=True, help="Compact even below the file and live thresholds.")
@click.option("--min-files", type=click.IntRange(min=1), help="[compaction.min_files] (10)")
@click.option(
    "--max-live", type=click.FloatRange(0, 1, min_open=True), help="[compaction.max_live_ratio]"
)
@click.option(
    "--retention-hours", type=click.IntRange(min=1), help="[compaction.retention_hours] (168)"
)
@click.option(
    "--keep-recent-s",
    type=click.FloatRange(min=0),
    help="[compaction.keep_recent_s] rows younger than this stay (300)",
)
@click.option("--keep-expired", is_flag=True, help="Leave expired messages in place.")
@click.option(
    "--spark", "use_spark", is_flag=True, help="Fan out over destinations as Spark tasks."
)
def compact(
    data_dir: str,
    config_file: str | None,
    only: tuple[str, ...],
    dry_run: bool,
    force: bool,
    min_files: int | None,
    max_live: float | None,
    retention_hours: int | None,
    keep_recent_s: float | None,
    keep_expired: bool,
    use_spark: bool,
) -> None:
    """Remove settled and expired messages from the Delta logs, merge files, vacuum."""
    from spark_mq.jobs.compaction import compact_all
    from spark_mq.jobs.report import summary_table
    from spark_mq.logs import setup_logging

    setup_logging("WARNING", None, max_bytes=0, backups=0)
    logging.getLogger("spark_mq.jobs").setLevel("INFO")  # each step of a long compaction
    overrides = {
        k: v
        for k, v in {
            "min_files": min_files,
            "max_live_ratio": max_live,
            "retention_hours": retention_hours,
            "drop_expired": False if keep_expired else None,
            "keep_recent_s": keep_recent_s,
        }.items()
        if v is not None
    }
    policy = _jobs_config(config_file).compaction.policy(force=force, **overrides)
    spark = None
    if use_spark:
        from pyspark.sql import SparkSession

        spark = SparkSession.builder.appName("sparkmq-compaction").getOrCreate()
    done = [0]

    def progress(result: object) -> None:
        done[0] += 1
        r = result  # a CompactionResult
        click.echo(f"[{done[0]}] {r.destination}: {r.action} ({r.seconds:.1f}s)", err=True)  # type: ignore[attr-defined]

    try:
        results = compact_all(
            data_dir, policy, only=only or None, dry_run=dry_run, spark=spark, progress=progress
        )
    except (KeyError, FileNotFoundError) as exc:
        click.echo(f"sparkmq compact: {exc.args[0]}", err=True)
        sys.exit(2)
    click.echo(summary_table(results))
    if any(r.action == "failed" for r in results):
        sys.exit(1)


@main.command()
@click.option("--data-dir", required=True, help="The data root the scheduled jobs work on.")
@_JOBS_CONFIG
@click.option(
    "--format",
    "fmt",
    type=click.Choice(["crontab", "databricks", "both"]),
    default="both",
    show_default=True,
)
def schedule(data_dir: str, config_file: str | None, fmt: str) -> None:
    """Print the schedules of the jobs config as crontab lines and Databricks Jobs JSON."""
    from spark_mq.jobs.schedule import crontab, databricks_json

    cfg = _jobs_config(config_file)
    if not cfg.schedule:
        click.echo("sparkmq schedule: the config declares no [[schedule]]", err=True)
        sys.exit(2)
    try:
        if fmt in ("crontab", "both"):
            click.echo(crontab(cfg, data_dir, config_file))
        if fmt in ("databricks", "both"):
            click.echo(databricks_json(cfg, data_dir, config_file))
    except ConfigError as exc:
        click.echo(f"sparkmq schedule: {exc}", err=True)
        sys.exit(2)


@main.command(name="export")
@click.option("--data-dir", required=True, help="The broker's data root (directory or URI).")
@click.option("--destination", required=True, help="The destination to export.")
@click.argument("file", type=click.Path(dir_okay=False))
def export_cmd(data_dir: str, destination: str, file: str) -> None:
    """Dump a destination's messages and settlements to FILE (*.jsonl or *.parquet)."""
    from spark_mq.errors import SparkMQError
    from spark_mq.jobs.transfer import export_destination

    try:
        header = export_destination(data_dir, destination, file)
    except (SparkMQError, ValueError) as exc:
        click.echo(f"sparkmq export: {exc}", err=True)
        sys.exit(2)
    if header["hot_tier_in_use"]:
        click.echo(
            "warning: a broker is running on this data (or crashed): records it has not moved "
            "to Delta yet are not in the export; stop it with SIGTERM for a complete copy",
            err=True,
        )
    click.echo(
        f"exported {destination} ({header['kind']}): {header['messages']:,} message(s), "
        f"{header['settlements']:,} settlement(s), end offset {header['end_offset']:,} -> {file}"
    )


@main.command(name="import")
@click.option("--data-dir", required=True, help="The data root to import into (broker stopped).")
@click.option("--as", "name", help="Create the destination under this name instead.")
@click.argument("file", type=click.Path(exists=True, dir_okay=False))
def import_cmd(data_dir: str, name: str | None, file: str) -> None:
    """Create a destination from an exported FILE, offsets unchanged."""
    from spark_mq.errors import SparkMQError
    from spark_mq.jobs.transfer import import_destination

    try:
        header = import_destination(data_dir, file, name)
    except (SparkMQError, ValueError) as exc:
        click.echo(f"sparkmq import: {exc}", err=True)
        sys.exit(2)
    click.echo(
        f"imported {header['name']} ({header['kind']}): {header['messages']:,} message(s), "
        f"{header['settlements']:,} settlement(s), end offset {header['end_offset']:,}"
    )


if __name__ == "__main__":
    main()


# -- users (security) ---------------------------------------------------------------------------
_USERS_FILE = click.option(
    "--users-file",
    type=click.Path(dir_okay=False),
    help="The users file [security.users_file, conf/users.toml]; or --config's.",
)
_CONFIG_FOR_USERS = click.option(
    "--config",
    "config_file",
    type=click.Path(dir_okay=False),
    help="Broker config whose security.users_file to use.",
)
_PASSWORD_STDIN = click.option(
    "--password-stdin",
    is_flag=True,
    help="Read the password from standard input (one line) instead of asking for it.",
)


def _users(users_file: str | None, config_file: str | None) -> UsersFile:
    from spark_mq.config import load_config
    from spark_mq.security.users import UsersFile

    if users_file is None:
        try:
            users_file = load_config(config_file).security.users_file
        except ConfigError as exc:
            click.echo(f"sparkmq user: {exc}", err=True)
            sys.exit(2)
    return UsersFile(users_file)


def _new_password(from_stdin: bool) -> str:
    """A password from a prompt (asked twice, never echoed) or stdin; never from argv."""
    if from_stdin:
        password = sys.stdin.readline().rstrip("\n")
    else:
        password = click.prompt("Password", hide_input=True, confirmation_prompt=True)
    if len(password) < 8:
        click.echo("sparkmq user: a password needs at least 8 characters", err=True)
        sys.exit(2)
    return password


@main.group()
def user() -> None:
    """Manage the users file (security): users, groups and password hashes."""


@user.command(name="add")
@click.argument("name")
@click.option("--group", "groups", multiple=True, help="A group it belongs to (repeatable).")
@_PASSWORD_STDIN
@_USERS_FILE
@_CONFIG_FOR_USERS
def user_add(
    name: str,
    groups: tuple[str, ...],
    password_stdin: bool,
    users_file: str | None,
    config_file: str | None,
) -> None:
    """Add a user, asking for its password (stored as an argon2 hash)."""
    users = _users(users_file, config_file)
    try:
        if name in users.users():
            click.echo(
                f"sparkmq user: {name!r} exists; use `sparkmq user passwd` or `user groups`",
                err=True,
            )
            sys.exit(1)
        users.put(name, _new_password(password_stdin), list(groups))
    except ConfigError as exc:
        click.echo(f"sparkmq user: {exc}", err=True)
        sys.exit(2)
    except SparkMQError as exc:
        click.echo(f"sparkmq user: {exc}", err=True)
        sys.exit(2)
    click.echo(f"added {name}" + (f" (groups: {', '.join(groups)})" if groups else ""))


@user.command(name="passwd")
@click.argument("name")
@_PASSWORD_STDIN
@_USERS_FILE
@_CONFIG_FOR_USERS
def user_passwd(
    name: str, password_stdin: bool, users_file: str | None, config_file: str | None
) -> None:
    """Set a user's password."""
    users = _users(users_file, config_file)
    if name not in users.users():
        click.echo(f"sparkmq user: no user {name!r} in {users.path}", err=True)
        sys.exit(1)
    users.put(name, _new_password(password_stdin))
    click.echo(f"password of {name} changed")


@user.command(name="groups")
@click.argument("name")
@click.argument("groups", nargs=-1)
@_USERS_FILE
@_CONFIG_FOR_USERS
def user_groups(
    name: str, groups: tuple[str, ...], users_file: str | None, config_file: str | None
) -> None:
    """Set the groups a user belongs to (none given: none)."""
    users = _users(users_file, config_file)
    if name not in users.users():
        click.echo(f"sparkmq user: no user {name!r} in {users.path}", err=True)
        sys.exit(1)
    users.put(name, groups=list(groups))
    click.echo(f"{name}: groups {', '.join(groups) or '(none)'}")


@user.command(name="remove")
@click.argument("name")
@_USERS_FILE
@_CONFIG_FOR_USERS
def user_remove(name: str, users_file: str | None, config_file: str | None) -> None:
    """Remove a user."""
    users = _users(users_file, config_file)
    if not users.remove(name):
        click.echo(f"sparkmq user: no user {name!r} in {users.path}", err=True)
        sys.exit(1)
    click.echo(f"removed {name}")


@user.command(name="list")
@click.option("--json", "as_json", is_flag=True, help="One JSON document, for scripts.")
@_USERS_FILE
@_CONFIG_FOR_USERS
def user_list(as_json: bool, users_file: str | None, config_file: str | None) -> None:
    """List the users and their groups (never a password or hash)."""
    import json

    users = _users(users_file, config_file).users()
    listed = sorted(users.values(), key=lambda u: u.name)
    if as_json:
        rows = [
            {"name": u.name, "groups": sorted(u.groups), "password": bool(u.password_hash)}
            for u in listed
        ]
        click.echo(json.dumps(rows))
        return
    width = max([len("USER"), *(len(u.name) for u in listed)])
    click.echo(f"{'USER':<{width}}  PASSWORD  GROUPS")
    for u in listed:
        click.echo(
            f"{u.name:<{width}}  {'yes' if u.password_hash else 'no':<8}  "
            f"{', '.join(sorted(u.groups)) or '-'}"
        )
