"""A console producer and consumer, as Kafka's: ``sparkmq produce DEST`` sends each line of
standard input as a message; ``sparkmq consume DEST`` prints each message's body on a line (acked
once printed), or with ``--from-beginning`` shows what waits without consuming (a browse)."""

from __future__ import annotations

import json
import sys
import time
from typing import Any

import click

from spark_mq.cli import output
from spark_mq.cli.output import answering, body_option, fail, show_body
from spark_mq.cli.target import Target, connection


def _headers(items: tuple[str, ...]) -> dict[str, str]:
    out = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            fail(f"--header expects KEY=VALUE, got {item!r}", output.EXIT_USAGE)
        out[key] = value
    return out


@click.command()
@click.argument("destination")
@click.option("--header", "headers", multiple=True, metavar="KEY=VALUE", help="On every message.")
@click.option("--group-id", help="Message group of every message.")
@click.option("--priority", type=click.IntRange(0, 9), help="0 (lowest) to 9.")
@click.option("--ttl", "ttl_s", type=click.FloatRange(min=0, min_open=True), help="Seconds.")
@click.option(
    "--key-separator",
    help="Each line is KEY<sep>BODY; the key becomes the message's group id (Kafka's "
    "parse.key / key.separator).",
)
@click.option(
    "--sync", is_flag=True, help="Wait for each message to be durable before the next line."
)
@connection
def produce(
    destination: str,
    headers: tuple[str, ...],
    group_id: str | None,
    priority: int | None,
    ttl_s: float | None,
    key_separator: str | None,
    sync: bool,
    target: Target,
) -> None:
    """Send each line of standard input to DESTINATION as one message (UTF-8, without its line
    end); says how many on stderr once every one is durable."""
    from spark_mq.client.producer import Producer

    fixed = _headers(headers)
    n = 0
    with answering():
        producer = Producer(
            target.urls, destination=destination, timeout_s=target.timeout_s, **target.kwargs()
        )
        try:
            for line in sys.stdin.buffer:
                body = line.rstrip(b"\r\n")
                group = group_id
                if key_separator is not None:
                    key, sep, rest = body.partition(key_separator.encode())
                    if sep:
                        group, body = key.decode("utf-8", "replace"), rest
                kwargs: dict[str, Any] = {"headers": fixed or None, "group_id": group}
                if priority is not None:
                    kwargs["priority"] = priority
                if ttl_s is not None:
                    kwargs["ttl_s"] = ttl_s
                if sync:
                    producer.send_sync(body, **kwargs)
                else:
                    producer.send(body, **kwargs)
                n += 1
            producer.flush()
        finally:
            producer.close()
    click.echo(f"sent {n:,} message(s) to {destination}", err=True)


@click.command()
@click.argument("destination")
@click.option("--subscription", help="A topic's subscription to consume from.")
@click.option("--selector", help="Only messages this selector matches.")
@click.option(
    "--max-messages", type=click.IntRange(min=1), help="Stop after this many (default: none)."
)
@click.option(
    "--timeout-idle",
    "idle_s",
    type=float,
    default=None,
    help="Stop once nothing arrived for this many seconds (default: wait forever).",
)
@click.option(
    "--from-beginning",
    is_flag=True,
    help="Show what waits, from the oldest, without consuming it (a browse).",
)
@click.option("--print-headers", is_flag=True, help="Headers before each body.")
@body_option("text")
@click.option("--json", "as_json", is_flag=True, help="A JSON object a message instead.")
@connection
def consume(
    destination: str,
    subscription: str | None,
    selector: str | None,
    max_messages: int | None,
    idle_s: float | None,
    from_beginning: bool,
    print_headers: bool,
    body_as: str,
    as_json: bool,
    target: Target,
) -> None:
    """Print DESTINATION's messages as they come, one a line, acking each once printed."""

    def emit(offset: int, headers: dict[str, str], body: bytes, count: int) -> None:
        if as_json:
            from spark_mq.views import render_body

            doc = {"offset": offset, "delivery_count": count, "headers": headers}
            click.echo(json.dumps({**doc, **render_body(body)}))
            return
        prefix = ""
        if print_headers:
            prefix = ",".join(f"{k}:{v}" for k, v in headers.items()) or "NO_HEADERS"
            prefix += "\t"
        click.echo(prefix + show_body(body, body_as))

    if from_beginning:
        with target.admin() as admin, answering():
            rows = admin.browse(
                destination, subscription, limit=max_messages or 10_000, selector=selector
            )
        for r in rows.to_pylist():
            emit(r["offset"], dict(r["headers"] or ()), r["body"] or b"", 0)
        return
    from spark_mq.client.consumer import Consumer

    got = 0
    with answering():
        consumer = Consumer(
            target.urls,
            destination,
            subscription=subscription,
            selector=selector,
            # (no more leased than it will print: the rest stays for other consumers)
            prefetch=min(100, max_messages or 100),
            timeout_s=target.timeout_s,
            **target.kwargs(),
        )
        try:
            last = time.monotonic()
            while max_messages is None or got < max_messages:
                want = 100 if max_messages is None else min(100, max_messages - got)
                batch = consumer.receive_many(want, 0.5)
                if not batch:
                    if idle_s is not None and time.monotonic() - last >= idle_s:
                        break
                    continue
                last = time.monotonic()
                for m in batch:
                    emit(m.offset, m.headers, m.body, m.delivery_count)
                sys.stdout.flush()
                consumer.ack(batch).result(target.timeout_s)
                got += len(batch)
        except KeyboardInterrupt:
            pass
        finally:
            consumer.close()
    click.echo(f"consumed {got:,} message(s) of {destination}", err=True)


COMMANDS = [produce, consume]
