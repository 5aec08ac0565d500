"""Ports for what a test must know before it starts: a replicating pair's members name each
other's, a broker restarted where its clients retry, ZooKeeper's client port.

They are chosen outside the kernel's ephemeral range (``ip_local_port_range``), from a block
of 1,000 of this process's own (pytest-xdist's worker *n* has the *n*-th). A port bound to 0 and
let go, as these were chosen before, comes from the ephemeral range: until the broker meant to
listen there started, any other process could be given it (a broker on port 0, a client's
outgoing connection). Run in two processes, the other process's brokers and clients made that
likely enough to fail the HA tests: a pair never in sync, a takeover that never came. Here only
this process hands out its block, one port after another, each checked free when handed out.
"""

from __future__ import annotations

import itertools
import os
import random
import socket
from pathlib import Path

_FIRST, _BLOCK = 16000, 1000  # blocks 16000-19999: below Linux's usual 32768, clear of the
# servers the tests start (RabbitMQ's 25672, Spark Connect's 15002, ZooKeeper's 2181)


def _ephemeral() -> range:
    try:
        low, high = map(int, Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split())
    except (OSError, ValueError):
        return range(32768, 61000)  # (Linux's default)
    return range(low, high + 1)


def _block() -> range | None:
    """This process's block; None when it falls within the ephemeral range here."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0")
    n = int(worker[2:]) if worker[2:].isdigit() else 0
    block = range(_FIRST + _BLOCK * (n % 4), _FIRST + _BLOCK * (n % 4 + 1))
    ephemeral = _ephemeral()
    overlaps = block.start < ephemeral.stop and ephemeral.start < block.stop
    return None if overlaps else block


_MINE = _block()
_TURN = itertools.cycle(random.sample(list(_MINE), len(_MINE))) if _MINE is not None else None


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing uses now and no one else is handed."""
    if _TURN is None:  # (an ephemeral range reaching down here: as before)
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            return int(s.getsockname()[1])
    for _ in range(_BLOCK):
        port = next(_TURN)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue  # in use (or its last connections not yet gone)
            return port
    raise RuntimeError(f"no free port in {_MINE}")
