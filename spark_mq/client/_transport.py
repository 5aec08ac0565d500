"""Connecting to the broker, and the one boundary where Flight errors become sparkmq errors."""

from __future__ import annotations

import contextlib
import json
import queue
import ssl
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlparse

import pyarrow.flight as fl

from spark_mq import protocol
from spark_mq.errors import (
    BrokerUnavailable,
    ConfigError,
    MessageTooLarge,
    NotAuthenticated,
    OperationTimeout,
    ProtocolError,
    SparkMQError,
    from_wire,
)
from spark_mq.security.credentials import Auth

DEFAULT_URL = "grpc://127.0.0.1:7676"


def translate_flight_error(exc: BaseException) -> SparkMQError:
    """Map any ``pyarrow.flight`` error (or a broken connection) to the sparkmq tree."""
    if isinstance(exc, SparkMQError):
        return exc
    extra = getattr(exc, "extra_info", None)
    if extra:
        return from_wire(extra, str(exc))
    if isinstance(exc, fl.FlightWriteSizeExceededError):
        return MessageTooLarge(
            f"a batch is over the transport's message size limit ({exc.limit} bytes, this one "
            f"{exc.actual}): send smaller batches",
            size=exc.actual,
            limit=exc.limit,
        )
    if isinstance(exc, fl.FlightTimedOutError):
        return OperationTimeout(f"the broker did not answer in time: {exc}")
    if isinstance(exc, fl.FlightUnavailableError | fl.FlightCancelledError | ConnectionError):
        return BrokerUnavailable(f"cannot reach the broker: {exc}")
    if isinstance(exc, fl.FlightUnauthenticatedError | fl.FlightUnauthorizedError):
        return NotAuthenticated(f"the broker refused the credentials: {exc}")
    if isinstance(exc, fl.FlightError | OSError):
        # gRPC reports a dead peer in several ways; the message is the only tell
        text = str(exc)
        if any(
            s in text
            for s in (
                "Connection refused",
                "failed to connect",
                "Socket closed",
                "Connection reset",
                "UNAVAILABLE",
                "Broken pipe",
            )
        ):
            return BrokerUnavailable(f"cannot reach the broker: {text}")
        return ProtocolError(f"unexpected error from the broker: {text}", fault="remote")
    return SparkMQError(f"{type(exc).__name__}: {exc}")


@contextlib.contextmanager
def translated() -> Iterator[None]:
    try:
        yield
    except SparkMQError:
        raise
    except (fl.FlightError, fl.FlightWriteSizeExceededError, OSError) as exc:
        raise translate_flight_error(exc) from exc


@dataclass
class Connection:
    """A Flight client with the options of its calls, and what the direct wire needs to reach
    the same broker as the same principal.

    Unary calls (admin actions) use ``options`` (with the timeout); streams (produce, consume)
    must not: a gRPC deadline bounds the whole call, and would cut a long-lived stream off."""

    client: fl.FlightClient
    options: fl.FlightCallOptions
    stream_options: fl.FlightCallOptions
    auth: Auth
    tls: bool  # grpc+tls: the wire's TCP connections use TLS too
    host: str
    url: str  # the one it reached (of several: the broker that serves)

    def wire_tls(self) -> ssl.SSLContext | None:
        return self.auth.ssl_context() if self.tls else None


def broker_urls(url: str | Sequence[str]) -> list[str]:
    """``url`` as a list: one URL, a comma-separated list (as Kafka's bootstrap servers), or a
    sequence (a primary and its backup)."""
    urls = [u.strip() for u in url.split(",")] if isinstance(url, str) else [*url]
    urls = [u for u in urls if u]
    if not urls:
        raise ConfigError("no broker URL given", setting="url")
    return urls


def connect(url: str | Sequence[str], timeout_s: float, auth: Auth | None = None) -> Connection:
    """A connection to the broker at ``url`` (``grpc://`` or ``grpc+tls://``). Given several
    (a primary and its backup: only the one that owns the data serves), the first that
    answers, tried in turn with backoff for up to ``timeout_s``; the error names every URL
    tried and what each said."""
    auth = auth or Auth.of()
    urls = broker_urls(url)
    if len(urls) == 1:
        return _connection(urls[0], timeout_s, auth)  # (lazy: no round trip until used)
    deadline = time.monotonic() + timeout_s
    delay = 0.05
    said: dict[str, str] = {}
    while True:
        conn = _first_to_answer(urls, timeout_s, auth, deadline, said)
        if conn is not None:
            return conn
        if time.monotonic() + delay > deadline:
            tried = "; ".join(f"{u}: {m}" for u, m in said.items())
            raise BrokerUnavailable(
                f"no broker answered within {timeout_s:g} s at any of {', '.join(urls)} ({tried})"
            )
        time.sleep(delay)
        delay = min(delay * 2, 0.25)  # a failover takes about a second: look often


_PROBE_S = 5.0  # the longest one round of probes waits for a broker's answer


def _first_to_answer(
    urls: list[str], timeout_s: float, auth: Auth, deadline: float, said: dict[str, str]
) -> Connection | None:
    """Ping every URL at once; the connection of the first to answer (the others closed), or
    None when none did (why each did not, in ``said``). All at once, not in turn: a silent
    broker (paused, its machine hung) takes the whole probe's time to fail, and the broker that
    serves would wait behind it. An answer that is a refusal (wrong credentials, say) is
    raised: it is not a reason to go elsewhere."""
    left = max(min(deadline - time.monotonic(), _PROBE_S), 0.1)
    conns = [_connection(u, timeout_s, auth) for u in urls]
    outcomes: queue.Queue[tuple[Connection, SparkMQError | None]] = queue.Queue()
    probed = {id(conn): threading.Event() for conn in conns}  # (its probe's call returned)

    def probe(conn: Connection) -> None:
        headers = conn.options.headers  # type: ignore[attr-defined]  # (the stubs lack it)
        options = fl.FlightCallOptions(timeout=left, headers=headers)
        try:
            call_action(conn.client, options, "ping")
        except SparkMQError as exc:
            outcomes.put((conn, exc))
        except Exception as exc:
            outcomes.put((conn, BrokerUnavailable(f"probe ended: {exc}")))
        else:
            outcomes.put((conn, None))
        finally:
            probed[id(conn)].set()

    for conn in conns:
        threading.Thread(target=probe, args=(conn,), name="sparkmq-probe", daemon=True).start()
    chosen: Connection | None = None
    refusal: SparkMQError | None = None
    pending = len(conns)
    give_up = time.monotonic() + left + 1.0
    while pending and chosen is None and refusal is None:
        try:
            conn, err = outcomes.get(timeout=max(give_up - time.monotonic(), 0.01))
        except queue.Empty:
            break
        pending -= 1
        if err is None:
            chosen = conn
        elif isinstance(err, BrokerUnavailable):  # down, or a backup (it does not listen)
            said[conn.url] = err.message
        else:
            refusal = err
    for conn in conns:
        if conn is not chosen:
            _close_later(conn.client, probed[id(conn)])
    if refusal is not None:
        raise refusal
    for u in urls:
        said.setdefault(u, f"no answer within {left:.1f} s")
    return chosen


def _close_later(client: fl.FlightClient, probed: threading.Event) -> None:
    """Close a client once its probe's call has returned (it ends by its own timeout):
    closing a Flight client under a live call on another thread crashed the process
    (a segmentation fault in pyarrow's Flight client, seen in the HA suite)."""

    def close() -> None:
        probed.wait()
        with contextlib.suppress(Exception):
            client.close()

    threading.Thread(target=close, name="sparkmq-probe-close", daemon=True).start()


def _connection(url: str, timeout_s: float, auth: Auth) -> Connection:
    parsed = urlparse(url)
    tls = parsed.scheme == "grpc+tls"
    headers = auth.headers()
    with translated():
        client = fl.FlightClient(url, **(auth.flight_kwargs() if tls else {}))
    return Connection(
        client,
        # (headers as bytes: the stubs know str only)
        fl.FlightCallOptions(timeout=timeout_s, headers=headers),  # type: ignore[arg-type]
        fl.FlightCallOptions(headers=headers),  # type: ignore[arg-type]
        auth,
        tls,
        parsed.hostname or "127.0.0.1",
        url,
    )


def call_action(
    client: fl.FlightClient, options: fl.FlightCallOptions, action: str, /, **body: Any
) -> Any:
    with translated():
        results = list(
            client.do_action(fl.Action(action, protocol.encode_action_body(**body)), options)
        )
    return json.loads(results[0].body.to_pybytes()) if results else None
