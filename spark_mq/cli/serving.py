"""``sparkmq broker`` runs a broker; ``sparkmq demo`` shows the flow."""

from __future__ import annotations

import importlib.abc
import sys

import click

from spark_mq.errors import ConfigError, SparkMQError


class _NoPandas(importlib.abc.MetaPathFinder):
    """A broker process never uses pandas, and pyarrow's dataset module imports it when it is
    installed (a broker reads Delta through it): 210 ms of the 790 its imports took (measured
    with and without). Refused, pyarrow does without it, as where pandas is not installed."""

    def find_spec(self, name: str, path: object = None, target: object = None) -> None:
        if name == "pandas" or name.startswith("pandas."):
            raise ModuleNotFoundError(f"a broker process does without {name}", name=name)
        return None


@click.command()
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
@click.option(
    "--stomp-port", type=int, help="Port of STOMP; 0 picks a free one [broker.stomp_port]."
)
@click.option(
    "--kafka-port", type=int, help="Port of Kafka; 0 picks a free one [broker.kafka_port]."
)
@click.option(
    "--http-port",
    type=int,
    help="Port of the HTTP listener (metrics, health, console); 0 picks a free one "
    "[broker.http_port].",
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
    help="Write {url, port, wire_port, stomp_port, kafka_port, http_port, http_url, pid} here "
    "once listening.",
)
def broker(
    config_file: str | None,
    host: str | None,
    port: int | None,
    wire_port: int | None,
    stomp_port: int | None,
    kafka_port: int | None,
    http_port: int | None,
    data_dir: str | None,
    persistence: str | None,
    sets: tuple[str, ...],
    insecure: bool | None,
    ready_file: str | None,
) -> None:
    """Run a broker until SIGTERM/SIGINT (pending commits are flushed before exit); SIGHUP
    reloads the access rules."""
    sys.meta_path.insert(0, _NoPandas())
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
        "broker.stomp_port": stomp_port,
        "broker.kafka_port": kafka_port,
        "broker.http_port": http_port,
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
    except SparkMQError as exc:  # the data root out of reach at start-up
        where = config.broker.data_dir
        hint = (
            " (check [storage] in the config, SPARKMQ_STORAGE__* or the AWS_*/AZURE_*/GOOGLE_* "
            "environment: endpoint, credentials, region)"
            if "://" in where
            else ""
        )
        click.echo(f"sparkmq broker: cannot open the data root {where}: {exc}{hint}", err=True)
        sys.exit(1)


@click.command()
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
    from spark_mq.connectors import require_spark
    from spark_mq.demo import run_demo

    try:
        require_spark()  # (its last part streams a topic with Spark)
    except ConfigError as exc:
        click.echo(f"sparkmq demo: {exc}", err=True)
        sys.exit(2)
    run_demo(data_dir, messages)


COMMANDS = [broker, demo]
