"""One broker per data directory: an exclusive lock held for the broker's life.

A second broker started on the same ``--data-dir`` recovered the same destinations and served
them beside the first, each appending to the same logs. The lock is ``flock`` on
``<dir>/.lock`` (the data directory when it is local, else the hot tier's directory, the local
state a remote root still has), which the kernel lets go when the process ends however it ends,
so a crashed broker never leaves a stale lock. The file says who holds it (pid, host, since
when) for the error the next one gets.

This is the single-broker case of fencing. A primary and a backup sharing a store (``ha.mode =
"shared-store"``) both start on the directory: the backup waits for the lock
(:meth:`DataDirLock.wait`), and whoever takes it takes the next ownership epoch as well
(:mod:`spark_mq.ha.ownership`), which fences the Delta tables.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import logging
import os
import socket
import threading
import time
from typing import TYPE_CHECKING

from spark_mq.errors import ConfigError

if TYPE_CHECKING:
    from spark_mq.config import BrokerConfig

LOCK_FILE = ".lock"
log = logging.getLogger(__name__)


class StoppedWaiting(Exception):
    """A backup was told to stop while it waited for the data directory."""


class DataDirLock:
    def __init__(self, directory: str) -> None:
        self.directory = directory
        self.path = os.path.join(directory, LOCK_FILE)
        self._fd = -1

    def acquire(self) -> DataDirLock:
        """Take the lock, or raise ``ConfigError`` naming the broker that holds it."""
        os.makedirs(self.directory, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            os.close(fd)
            if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                raise
            raise ConfigError(
                f"{self.directory} is in use by another broker ({self._holder()}): stop it "
                "first, or give this one its own --data-dir",
                setting="broker.data_dir",
            ) from None
        me = {"pid": os.getpid(), "host": socket.gethostname(), "since": time.time()}
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps(me).encode(), 0)
        self._fd = fd
        return self

    def wait(self, until: threading.Event | None, poll_s: float) -> DataDirLock:
        """Take the lock as soon as its holder lets go (a backup of a shared store): tried every
        ``poll_s``; ``StoppedWaiting`` if ``until`` is set first."""
        said = False
        while True:
            try:
                return self.acquire()
            except ConfigError:
                if not said:
                    log.info(
                        "backup: %s is held by the primary (%s); waiting to take over",
                        self.directory,
                        self._holder(),
                    )
                    said = True
            if until is not None and until.wait(poll_s):
                raise StoppedWaiting(f"stopped while waiting for {self.directory}")
            if until is None:
                time.sleep(poll_s)

    def _holder(self) -> str:
        try:
            with open(self.path) as fh:
                doc = json.load(fh)
            since = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(float(doc["since"])))
            return f"pid {doc['pid']} on host {doc['host']}, since {since}"
        except (OSError, ValueError, KeyError, TypeError):
            return "a process that has not said which"

    def release(self) -> None:
        if self._fd >= 0:
            with contextlib.suppress(OSError):
                os.ftruncate(self._fd, 0)
            os.close(self._fd)  # (closing lets go of the lock)
            self._fd = -1


def lock_dir(config: BrokerConfig) -> str | None:
    """The directory whose lock makes this broker its data's only one: a local data directory,
    else the hot tier's (a remote root's local state); None when there is neither."""
    if config.broker.persistence != "delta" or config.clustered:
        return None  # (a cluster's members share the root: each destination is fenced alone)
    if config.ha.mode == "replication":  # the data root is shared; the hot directory is its own
        if not config.journal.hot_dir:
            raise ConfigError(
                'ha.mode = "replication" needs journal.hot_dir: each broker\'s own local '
                "directory (data_dir is the Delta root both share)",
                setting="journal.hot_dir",
            )
        return config.hot_dir_location()
    data = config.broker.data_dir
    if "://" not in data or data.startswith("file://"):
        return os.path.abspath(data.removeprefix("file://"))
    try:
        return config.hot_dir_location()
    except ConfigError:
        return None
