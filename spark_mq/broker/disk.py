"""Free disk space under the broker's journal: producers are refused while it is low, and
taken again by themselves once it is not (RabbitMQ's disk free limit).

Below ``limits.min_free_disk_bytes`` a produce is refused (``DiskFull``, retriable) before
anything is written: what is left serves acks, nacks and the moves to Delta, which need a
little space each, and moving to Delta frees the hot tier's segments. Without this floor the
producers filled the disk to its last byte, and then neither acks nor moves could be written.
The space is measured by the broker's timer (every ``lease_check_interval_ms``), so a produce
pays a flag check, not a system call.
"""

from __future__ import annotations

import logging
import os
from typing import TYPE_CHECKING

from spark_mq.errors import DiskFull

if TYPE_CHECKING:
    from spark_mq.config import BrokerConfig

log = logging.getLogger(__name__)
MiB = 1024 * 1024


class DiskMonitor:
    def __init__(self, directory: str | None, min_free_bytes: int) -> None:
        self.directory = directory  # None: nothing local to watch (memory, a remote root)
        self.min_free_bytes = min_free_bytes
        self.free_bytes: int | None = None
        self.low = False

    def measure(self) -> None:
        if self.directory is None or not self.min_free_bytes:
            return
        # (not made yet, as the hot tier's directory at a first start: the disk it will be on)
        where = self.directory
        while not os.path.exists(where) and os.path.dirname(where) not in ("", where):
            where = os.path.dirname(where)
        try:
            st = os.statvfs(where)
        except OSError:
            return  # nothing to say about it
        self.free_bytes = free = st.f_bavail * st.f_frsize
        low = free < self.min_free_bytes
        if low and not self.low:
            log.warning(
                "the disk holding %s has %.1f MiB free, under limits.min_free_disk_bytes "
                "(%.1f MiB): producers are refused until there is more; acks, reads and moves "
                "to Delta go on",
                self.directory,
                free / MiB,
                self.min_free_bytes / MiB,
            )
        elif self.low and not low:
            log.warning(
                "the disk holding %s has %.1f MiB free again: producers are taken again",
                self.directory,
                free / MiB,
            )
        self.low = low

    def admit(self, destination: str) -> None:
        """Refuse a produce while the disk is low."""
        if self.low:
            raise DiskFull(
                f"the broker's disk is nearly full ({(self.free_bytes or 0) / MiB:.1f} MiB free "
                f"in {self.directory}, under limits.min_free_disk_bytes = "
                f"{self.min_free_bytes / MiB:.1f} MiB): free space or add disk; retry later, "
                "nothing of this was stored",
                destination=destination,
                free_bytes=self.free_bytes or 0,
            )

    def stats(self) -> dict[str, object]:
        return {"disk_free_bytes": self.free_bytes, "disk_low": self.low}


def journal_disk(config: BrokerConfig) -> str | None:
    """The local directory whose disk the journal writes: the hot tier's, else a local data
    directory's; None when there is none (persistence in memory, Delta on a remote root)."""
    if config.broker.persistence != "delta":
        return None
    hot = config.hot_dir()
    if hot is not None:
        return hot
    data = config.broker.data_dir
    return (
        None if "://" in data and not data.startswith("file://") else data.removeprefix("file://")
    )
