"""Connecting to the broker, and the one boundary where Flight errors become sparkmq errors."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from typing import Any

import pyarrow.flight as fl

from spark_mq import protocol
from spark_mq.errors import (
    BrokerUnavailable,
    MessageTooLarge,
    OperationTimeout,
    ProtocolError,
    SparkMQError,
    from_wire,
)

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
        return SparkMQError(f"the broker refused the credentials: {exc}")
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


def connect(url: str, timeout_s: float) -> tuple[fl.FlightClient, fl.FlightCallOptions]:
    """A client, and call options for unary calls (admin actions) with ``timeout_s``.

    Streams (produce, consume) must not use those options: a gRPC deadline bounds the whole
    call, so a long-lived stream would be cut off after ``timeout_s``.
    """
    with translated():
        client = fl.FlightClient(url)
    return client, fl.FlightCallOptions(timeout=timeout_s)


STREAM_OPTIONS = fl.FlightCallOptions()


def call_action(
    client: fl.FlightClient, options: fl.FlightCallOptions, action: str, /, **body: Any
) -> Any:
    with translated():
        results = list(
            client.do_action(fl.Action(action, protocol.encode_action_body(**body)), options)
        )
    return json.loads(results[0].body.to_pybytes()) if results else None
