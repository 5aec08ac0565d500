"""The tables, offline: ``compact``, ``schedule``, ``export``, ``import``."""

from __future__ import annotations

import logging
import sys
from typing import TYPE_CHECKING

import click

from spark_mq.errors import ConfigError, SparkMQError

if TYPE_CHECKING:
    from spark_mq.jobs.schedule import JobsConfig


_STORAGE = click.option(
    "--storage-option",
    "storage",
    multiple=True,
    metavar="NAME=VALUE",
    help="A delta-rs storage option for an object-store root (repeatable), as the broker's "
    "[storage]; also SPARKMQ_STORAGE__<NAME> and delta-rs's own AWS_*/AZURE_*/GOOGLE_* "
    "variables.",
)


def _root(data_dir: str, storage: tuple[str, ...]) -> str:
    """``data_dir`` carrying its storage options (the environment's, then the command line's)."""
    from spark_mq.config import load_config
    from spark_mq.journal.layout import with_options

    try:  # (SPARKMQ_STORAGE__<NAME>, read as the broker reads it)
        options = dict(load_config().storage)
    except ConfigError as exc:
        raise click.BadParameter(str(exc), param_hint="SPARKMQ_* environment") from None
    for item in storage:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise click.BadParameter(
                f"expected NAME=VALUE, got {item!r}", param_hint="--storage-option"
            )
        options[key.strip().lower()] = value
    return with_options(data_dir, options or None)


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


@click.command()
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
@_STORAGE
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
    storage: tuple[str, ...],
) -> None:
    """Remove settled and expired messages from the Delta logs, merge files, vacuum."""
    data_dir = _root(data_dir, storage)
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
        from spark_mq.connectors import require_spark

        try:
            require_spark(minimum=(3, 3))  # (mapInArrow: any Spark since 3.3, Connect too)
        except ConfigError as exc:
            click.echo(f"sparkmq compact --spark: {exc}", err=True)
            sys.exit(2)
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


@click.command()
@click.option("--data-dir", required=True, help="The data root the scheduled jobs work on.")
@_JOBS_CONFIG
@click.option(
    "--format",
    "fmt",
    type=click.Choice(["crontab", "databricks", "both"]),
    default="both",
    show_default=True,
)
@click.option(
    "--compute",
    type=click.Choice(["serverless", "classic"]),
    default="serverless",
    show_default=True,
    help="Databricks: serverless compute, or a classic job cluster.",
)
@click.option("--spark-version", help="Classic: the Databricks Runtime of the job cluster.")
@click.option("--node-type", help="Classic: the job cluster's node type.")
@click.option("--workers", type=click.IntRange(min=0), default=2, show_default=True)
def schedule(
    data_dir: str,
    config_file: str | None,
    fmt: str,
    compute: str,
    spark_version: str | None,
    node_type: str | None,
    workers: int,
) -> None:
    """Print the schedules of the jobs config as crontab lines and Databricks Jobs API 2.1 JSON
    (the compaction policy on each job's command line: no config file on the cluster)."""
    from spark_mq.jobs.schedule import crontab, databricks_json

    cfg = _jobs_config(config_file)
    if not cfg.schedule:
        click.echo("sparkmq schedule: the config declares no [[schedule]]", err=True)
        sys.exit(2)
    try:
        if fmt in ("crontab", "both"):
            click.echo(crontab(cfg, data_dir, config_file))
        if fmt in ("databricks", "both"):
            how: dict[str, object] = {"compute": compute, "workers": workers}
            if spark_version:
                how["spark_version"] = spark_version
            if node_type:
                how["node_type"] = node_type
            click.echo(databricks_json(cfg, data_dir, **how))
    except ConfigError as exc:
        click.echo(f"sparkmq schedule: {exc}", err=True)
        sys.exit(2)


@click.command(name="export")
@click.option("--data-dir", required=True, help="The broker's data root (directory or URI).")
@click.option("--destination", required=True, help="The destination to export.")
@click.argument("file", type=click.Path(dir_okay=False))
@_STORAGE
def export_cmd(data_dir: str, destination: str, file: str, storage: tuple[str, ...]) -> None:
    """Dump a destination's messages and settlements to FILE (*.jsonl or *.parquet)."""
    from spark_mq.jobs.transfer import export_destination

    data_dir = _root(data_dir, storage)
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


@click.command(name="import")
@click.option("--data-dir", required=True, help="The data root to import into (broker stopped).")
@click.option("--as", "name", help="Create the destination under this name instead.")
@click.argument("file", type=click.Path(exists=True, dir_okay=False))
@_STORAGE
def import_cmd(data_dir: str, name: str | None, file: str, storage: tuple[str, ...]) -> None:
    """Create a destination from an exported FILE, offsets unchanged."""
    from spark_mq.jobs.transfer import import_destination

    data_dir = _root(data_dir, storage)
    try:
        header = import_destination(data_dir, file, name)
    except (SparkMQError, ValueError) as exc:
        click.echo(f"sparkmq import: {exc}", err=True)
        sys.exit(2)
    click.echo(
        f"imported {header['name']} ({header['kind']}): {header['messages']:,} message(s), "
        f"{header['settlements']:,} settlement(s), end offset {header['end_offset']:,}"
    )


COMMANDS = [compact, schedule, export_cmd, import_cmd]
