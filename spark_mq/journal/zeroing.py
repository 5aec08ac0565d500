"""Writing zeros over a segment file's space before records go there (see
:mod:`spark_mq.journal.segments`: a sync over written space costs less than over reserved space),
paced so that an append's sync never waits long behind them.

Zeroing pays for small appends, whose syncs it makes cheaper, and costs big ones: the zeros are
a second write of every segment, and a sync of a 1-8 MiB append over reserved space costs little
more than over written space (6.5 MiB appends: 428-431 MiB/s against 564-578). Batched produce
fell from 225-271k msg/s to 159-230k when every spare was zeroed (three interleaved pairs).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import Literal

SyncMode = Literal["fsync", "fdatasync", "none"]

ZEROS = bytes(1024 * 1024)
# A spare is zeroed this much at a time, each part synced, resting as long as that took. An
# append's sync waits for the part being written: measured on this machine, appends at 1,000/s
# while 64 MiB were zeroed had p99 0.58 ms in parts of 128 KiB (0.34 ms with nothing zeroed),
# 0.89 in 256 KiB, 2.4 in 1 MiB and 6-7 in 4 MiB; zeroing took 0.5 s instead of 0.25.
PACE_BYTES = 128 * 1024


def zero(
    fd: int, size: int, sync: SyncMode, *, paced: bool = False, stop: Callable[[], bool] = bool
) -> None:
    """Write ``size`` zero bytes from the start of ``fd`` and sync them (unless told to stop).

    ``paced``: synced every :data:`PACE_BYTES`, resting as long as that took, so an append's
    sync never waits long behind the zeros.
    """
    pos = 0
    while pos < size and not stop():
        started = time.perf_counter()
        end = min(size, pos + PACE_BYTES) if paced else size
        while pos < end:
            pos += os.pwrite(fd, memoryview(ZEROS)[: min(len(ZEROS), end - pos)], pos)
        if sync != "none" and (paced or pos >= size):
            os.fdatasync(fd)
        if paced:
            time.sleep(time.perf_counter() - started)
    if sync != "none" and pos >= size:
        os.fsync(fd)
