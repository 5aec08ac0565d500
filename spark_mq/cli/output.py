"""How the live-broker commands answer: human tables (rich) by default, one JSON document with
``--json``; errors as one line on stderr and an exit code scripts can rely on.

Exit codes: 0 done; 1 failed (anything else); 2 bad input (usage, names, settings, selectors);
3 no such destination or subscription; 4 not authenticated or not permitted; 5 broker
unreachable or not answering in time.
"""

from __future__ import annotations

import base64
import json
import sys
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any, NoReturn, TypeVar

import click
from rich.console import Console
from rich.table import Table

from spark_mq import errors

F = TypeVar("F", bound=Callable[..., Any])
EXIT_FAILED, EXIT_USAGE, EXIT_NOT_FOUND, EXIT_DENIED, EXIT_UNREACHABLE = 1, 2, 3, 4, 5
_EXIT = (
    ((errors.DestinationNotFound, errors.SubscriptionNotFound), EXIT_NOT_FOUND),
    ((errors.NotAuthenticated, errors.NotAuthorized), EXIT_DENIED),
    ((errors.BrokerUnavailable, errors.OperationTimeout), EXIT_UNREACHABLE),
    (
        (
            errors.ConfigError,
            errors.ProtocolError,
            errors.InvalidNameError,
            errors.SelectorError,
            errors.DestinationExists,
        ),
        EXIT_USAGE,
    ),
)

# (a pipe gets wide tables, not rich's 80 columns; a terminal gets its own width)
out = Console(soft_wrap=True, width=None if sys.stdout.isatty() else 200)
err = Console(stderr=True, soft_wrap=True)
TEXT_COLUMNS = frozenset(
    {"NAME", "KIND", "SUBSCRIPTION", "SELECTOR", "GROUP", "HEADERS", "BODY", "setting", "value"}
)


def exit_code(exc: errors.SparkMQError) -> int:
    for kinds, code in _EXIT:
        if isinstance(exc, kinds):
            return code
    return EXIT_FAILED


def fail(message: str, code: int = EXIT_FAILED) -> NoReturn:
    click.echo(f"sparkmq: {message}", err=True)
    sys.exit(code)


@contextmanager
def answering() -> Iterator[None]:
    """Turn the SDK's errors into one line on stderr and their exit code."""
    try:
        yield
    except errors.SparkMQError as exc:
        fail(exc.message, exit_code(exc))


def emit_json(doc: Any) -> None:
    click.echo(json.dumps(doc, default=str, indent=None))


def table(
    columns: Sequence[str], rows: Iterable[Sequence[Any]], *, title: str | None = None
) -> None:
    t = Table(title=title, title_justify="left", header_style="bold")
    for c in columns:
        t.add_column(c, justify="left" if c in TEXT_COLUMNS else "right")
    for r in rows:
        t.add_row(*(_cell(v) for v in r))
    out.print(t)


def pairs(doc: dict[str, Any], *, title: str | None = None) -> None:
    """A two-column table of ``doc``'s keys and values."""
    table(["setting", "value"], ((k, v) for k, v in doc.items()), title=title)


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:,.1f}"
    if isinstance(value, int) and not isinstance(value, bool):
        return f"{value:,}"
    if isinstance(value, dict | list):
        return json.dumps(value)
    return str(value)


def body_option(default: str) -> Callable[[F], F]:
    """``--body auto|text|hex|base64``: how a command shows bodies (see :func:`show_body`)."""
    return click.option(
        "--body",
        "body_as",
        type=click.Choice(["auto", "text", "hex", "base64"]),
        default=default,
        show_default=True,
        help="How bodies are shown (auto: text if printable UTF-8, else base64; text: with "
        "\\xNN for what is not).",
    )


def show_body(body: bytes, how: str) -> str:
    """A body for a terminal: ``text`` (bytes that are not UTF-8 and control characters shown
    as ``\\xNN``: one message stays one line), ``hex``, ``base64``, or ``auto`` (text when it
    is printable UTF-8, else ``base64:...``)."""
    if how == "hex":
        return body.hex()
    if how == "base64":
        return base64.b64encode(body).decode()
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError:
        if how == "auto":
            return "base64:" + base64.b64encode(body).decode()
        text = body.decode("utf-8", "backslashreplace")
    if how == "auto" and text != text.translate(_CONTROL):
        return "base64:" + base64.b64encode(body).decode()
    return text.translate(_CONTROL)


_CONTROL = {c: f"\\x{c:02x}" for c in (*range(32), 127) if chr(c) != "\t"}
