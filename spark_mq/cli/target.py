"""Where the broker is and who asks, for every command against a running broker: ``--url`` (or
``SPARKMQ_URL``; several, comma-separated, for a pair), ``--username`` with the password from
``SPARKMQ_PASSWORD`` or a hidden prompt (never the command line), or a token (``SPARKMQ_TOKEN``,
``--token-file``), and the TLS files; and the options those commands share.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from functools import update_wrapper
from typing import Any, TypeVar

import click

from spark_mq.cli import output
from spark_mq.cli.output import answering, fail
from spark_mq.client._transport import DEFAULT_URL

F = TypeVar("F", bound=Callable[..., Any])


@dataclass
class Target:
    """Where the broker is and the credentials to reach it with (``--url`` and friends)."""

    urls: list[str]
    username: str | None
    password: str | None
    token: str | None
    tls_ca_file: str | None
    tls_cert_file: str | None
    tls_key_file: str | None
    timeout_s: float

    def kwargs(self) -> dict[str, Any]:
        return {
            "username": self.username,
            "password": self.password,
            "token": self.token,
            "tls_ca_file": self.tls_ca_file,
            "tls_cert_file": self.tls_cert_file,
            "tls_key_file": self.tls_key_file,
        }

    def admin(self) -> Any:
        from spark_mq.client.admin import Admin

        with answering():
            return Admin(self.urls, timeout_s=self.timeout_s, **self.kwargs())


def connection(f: F) -> F:
    """The options every live command takes; the command gets ``target: Target``."""
    options = [
        click.option(
            "--url",
            envvar="SPARKMQ_URL",
            default=DEFAULT_URL,
            show_default=True,
            help="The broker (or a pair: comma-separated) [env SPARKMQ_URL].",
        ),
        click.option(
            "--username",
            envvar="SPARKMQ_USERNAME",
            help="Log in as this user; the password comes from SPARKMQ_PASSWORD or a prompt.",
        ),
        click.option(
            "--token-file",
            type=click.Path(exists=True, dir_okay=False),
            help="Read a bearer token from this file [or env SPARKMQ_TOKEN].",
        ),
        click.option(
            "--tls-ca-file", envvar="SPARKMQ_TLS_CA_FILE", help="CA to verify the broker."
        ),
        click.option("--tls-cert-file", envvar="SPARKMQ_TLS_CERT_FILE", help="Client certificate."),
        click.option("--tls-key-file", envvar="SPARKMQ_TLS_KEY_FILE", help="Its private key."),
        click.option(
            "--timeout", "timeout_s", default=30.0, show_default=True, help="Seconds per call."
        ),
    ]

    def wrapper(**kw: Any) -> Any:
        username = kw.pop("username")
        password = os.environ.get("SPARKMQ_PASSWORD")
        if username and not password:
            password = click.prompt(f"Password for {username}", hide_input=True, err=True)
        token_file = kw.pop("token_file")
        token = None
        if token_file:
            with open(token_file) as fh:
                token = fh.read().strip()
        kw["target"] = Target(
            [u.strip() for u in kw.pop("url").split(",") if u.strip()],
            username,
            password,
            token,
            kw.pop("tls_ca_file"),
            kw.pop("tls_cert_file"),
            kw.pop("tls_key_file"),
            kw.pop("timeout_s"),
        )
        return f(**kw)

    update_wrapper(wrapper, f)
    for option in reversed(options):
        wrapper = option(wrapper)
    return wrapper  # type: ignore[return-value]


JSON = click.option("--json", "as_json", is_flag=True, help="One JSON document, for scripts.")
YES = click.option("--yes", "-y", is_flag=True, help="Do not ask for confirmation.")
SETTINGS = click.option(
    "--set",
    "sets",
    multiple=True,
    metavar="KEY=VALUE",
    help="A destination setting (repeatable), e.g. max_delivery_attempts=3.",
)


def settings_of(sets: tuple[str, ...]) -> dict[str, Any]:
    import json

    out: dict[str, Any] = {}
    for item in sets:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            fail(f"--set expects KEY=VALUE, got {item!r}", output.EXIT_USAGE)
        try:
            out[key.strip()] = json.loads(value)
        except ValueError:
            out[key.strip()] = value  # a bare string: round_robin, reject...
    return out
