"""The one place where delta-rs, Arrow and OS errors become sparkmq errors."""

from __future__ import annotations

import contextlib
import errno
from collections.abc import Iterator

import pyarrow as pa
from deltalake.exceptions import DeltaError

from spark_mq.errors import JournalError

UPSTREAM_ERRORS: tuple[type[BaseException], ...] = (DeltaError, OSError, pa.ArrowException)


@contextlib.contextmanager
def translate(what: str, destination: str | None = None) -> Iterator[None]:
    """Re-raise upstream errors met while doing ``what`` as :class:`JournalError`."""
    try:
        yield
    except UPSTREAM_ERRORS as exc:
        raise translated(exc, what, destination) from exc  # type: ignore[arg-type]


def translated(exc: Exception, what: str, destination: str | None = None) -> Exception:
    """An upstream error met while doing ``what`` as :class:`JournalError` (others as they
    are): what :func:`translate` raises, for a hot path that catches errors itself (entering
    a generator's context manager costs a few microseconds)."""
    if not isinstance(exc, UPSTREAM_ERRORS):
        return exc
    hint = ""
    if (isinstance(exc, OSError) and exc.errno == errno.ENOSPC) or "No space left" in str(exc):
        hint = " (the disk is full: free space, then retry; nothing unacknowledged was kept)"
    err = JournalError(
        f"{what} failed: {type(exc).__name__}: {exc}{hint}", destination=destination or ""
    )
    err.__cause__ = exc
    return err
