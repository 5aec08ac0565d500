"""What the operations tests share: a real broker process (security on or off) and its HTTP
listener, the CLI run in this process against it, and HTTP calls."""

from __future__ import annotations

import base64
import json
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from click.testing import CliRunner, Result

from spark_mq import Admin
from spark_mq.cli import main as sparkmq
from spark_mq.errors import DestinationNotFound
from spark_mq.launch import BrokerProcess
from tests.security_kit import PASSWORDS, security_settings


def depth(admin: Admin, name: str) -> int:
    """A destination's depth, 0 while it does not exist (a dead-letter queue is made by its
    first message)."""
    try:
        return int(admin.stats(name)["depth"])
    except DestinationNotFound:
        return 0


def launch(
    base: Path, *, secure: bool = False, name: str = "broker", **settings: object
) -> BrokerProcess:
    """A broker process on free ports, its log in ``base/<name>.log``."""
    base.mkdir(parents=True, exist_ok=True)
    merged: dict[str, object] = {"logging.file": str(base / f"{name}.log")}
    if secure:
        merged.update(security_settings(base))
    merged.update(settings)
    args = [a for k, v in merged.items() for a in ("--set", f"{k}={_toml(v)}")]
    return BrokerProcess(
        str(base / name), extra_args=args, log_file=str(base / f"{name}.out")
    ).start()


def _toml(v: object) -> str:
    return str(v).lower() if isinstance(v, bool) else str(v)


def cli(
    broker: BrokerProcess, *args: str, user: str | None = "alice", stdin: str | None = None
) -> Result:
    """``sparkmq ARGS`` against ``broker`` as ``user`` (its password from the environment, as an
    operator's script passes it); ``user=None``: no credentials."""
    env = {"SPARKMQ_URL": broker.url, "SPARKMQ_USERNAME": None, "SPARKMQ_PASSWORD": None}
    if user is not None:
        env.update(SPARKMQ_USERNAME=user, SPARKMQ_PASSWORD=PASSWORDS[user])
    return CliRunner().invoke(sparkmq, list(args), input=stdin, env=env, catch_exceptions=False)


def cli_json(broker: BrokerProcess, *args: str, user: str | None = "alice") -> Any:
    result = cli(broker, *args, "--json", user=user)
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def http(
    url: str,
    *,
    method: str = "GET",
    body: object | None = None,
    user: str | None = None,
    headers: dict[str, str] | None = None,
    console: bool = True,
) -> tuple[int, dict[str, str], bytes]:
    """One HTTP request: ``(status, headers, body)`` whatever the status."""
    hdrs = dict(headers or {})
    if user is not None:
        token = base64.b64encode(f"{user}:{PASSWORDS[user]}".encode()).decode()
        hdrs["Authorization"] = f"Basic {token}"
    if console and method == "POST":
        hdrs["X-SparkMQ-Console"] = "1"
    data = None if body is None else json.dumps(body).encode()
    if data is not None:
        hdrs["Content-Type"] = "application/json"
    req = urllib.request.Request(url, data=data, method=method, headers=hdrs)
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, dict(r.headers), r.read()
    except urllib.error.HTTPError as e:
        return e.code, dict(e.headers), e.read()
