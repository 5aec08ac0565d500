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
        hint = ""
        if (isinstance(exc, OSError) and exc.errno == errno.ENOSPC) or "No space left" in str(exc):
            hint = " (the disk is full: free space, then retry; nothing unacknowledged was kept)"
        raise JournalError(
            f"{what} failed: {type(exc).__name__}: {exc}{hint}", destination=destination or ""
        ) from exc
