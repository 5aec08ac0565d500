"""Moving messages of a running broker: ``move``, ``redrive`` (a dead-letter queue's messages
back where they came from) and ``claims release`` (a gone Spark query's claims)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import click
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from spark_mq.cli import output
from spark_mq.cli.output import answering, emit_json
from spark_mq.cli.target import JSON, Target, connection
from spark_mq.views import in_batches

F = TypeVar("F", bound=Callable[..., Any])


# -- moving messages -----------------------------------------------------------------------------
def _move(
    target: Target,
    source: str,
    to: str | None,
    limit: int | None,
    subscription: str | None,
    selector: str | None,
    as_json: bool,
) -> None:
    with target.admin() as admin, answering():
        doc = admin.stats(source)
        waiting = (
            doc.get("waiting", 0)
            if doc["kind"] == "queue"
            else (doc.get("subscriptions") or {}).get(subscription or "", {}).get("waiting", 0)
        )
        total = min(waiting, limit) if limit is not None else waiting
        with Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            console=output.err,
            disable=as_json,
            transient=False,
        ) as progress:
            task = progress.add_task(f"moving {source}", total=total or None)
            done = in_batches(
                lambda n: admin.move(
                    source, to, subscription=subscription, limit=n, selector=selector
                ),
                limit,
                lambda moved: progress.update(task, completed=moved, total=max(total, moved)),
            )
    moved, targets = done["moved"], done["targets"]
    result = {"source": source, "moved": moved, "targets": targets}
    if as_json:
        return emit_json(result)
    where = ", ".join(f"{n:,} to {k}" for k, n in sorted(targets.items())) or "nothing waiting"
    click.echo(f"moved {moved:,} message(s) of {source}: {where}")


_MOVE_OPTIONS = [
    click.option("--limit", type=click.IntRange(min=1), help="Move at most this many."),
    click.option("--subscription", help="A topic's subscription to take them from."),
    click.option("--selector", help="Only messages this selector matches."),
]


def _move_options(f: F) -> F:
    for option in reversed(_MOVE_OPTIONS):
        f = option(f)
    return f


@click.command()
@click.argument("source")
@click.argument("destination")
@_move_options
@connection
@JSON
def move(
    source: str,
    destination: str,
    limit: int | None,
    subscription: str | None,
    selector: str | None,
    target: Target,
    as_json: bool,
) -> None:
    """Move waiting messages of SOURCE to DESTINATION (each with its ack, in one transaction:
    never lost, never in both)."""
    _move(target, source, destination, limit, subscription, selector, as_json)


@click.command()
@click.argument("dlq")
@click.option("--to", "to", help="Send them here instead of where each came from.")
@_move_options
@connection
@JSON
def redrive(
    dlq: str,
    to: str | None,
    limit: int | None,
    subscription: str | None,
    selector: str | None,
    target: Target,
    as_json: bool,
) -> None:
    """Send dead-lettered (or expired) messages back where each came from, or --to another
    destination (SQS's redrive, Artemis's retry)."""
    _move(target, dlq, to, limit, subscription, selector, as_json)


# -- a gone Spark query's claims --------------------------------------------------------------
@click.group()
def claims() -> None:
    """Claims of Spark queries that consume through the broker."""


@claims.command(name="release")
@click.argument("destination")
@click.argument("consumer")
@click.option("--subscription", help="A topic's subscription the query read.")
@connection
@JSON
def claims_release(
    destination: str, consumer: str, subscription: str | None, target: Target, as_json: bool
) -> None:
    """Give back everything CONSUMER (a gone Spark query's consumer name) holds; the name may
    not claim again."""
    with target.admin() as admin, answering():
        n = admin.release_claims(destination, consumer, subscription=subscription)
    if as_json:
        return emit_json({"destination": destination, "consumer": consumer, "released": n})
    click.echo(f"released {n:,} message(s) claimed by {consumer} on {destination}")


COMMANDS = [move, redrive, claims]
