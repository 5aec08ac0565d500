"""What the high-availability tests share."""

from __future__ import annotations

import socket


def free_port() -> int:
    """A TCP port nothing listens on now (a pair's members must know each other's)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
