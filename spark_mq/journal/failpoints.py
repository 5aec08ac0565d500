"""Named crash points for recovery tests: ``SPARKMQ_FAILPOINTS=name[,name...]``.

When the environment names a point, reaching it kills the process with SIGKILL on the spot, as a
power cut would: no ``finally`` blocks, no flush. Unset (always, outside tests) it costs one set
lookup. Points: ``hot-tier-messages-moved`` (messages committed to Delta, settlements not yet,
segments not retired), ``hot-tier-moved`` (both committed, segments not yet retired),
``transaction-recorded`` (a transaction's commit row is durable, nothing of it applied),
``transaction-applying`` (its messages stored, its acks not yet) and
``transaction-applied-here`` (a cluster member's part of it applied, the other members' not
yet).
"""

from __future__ import annotations

import os
import signal

ENV = "SPARKMQ_FAILPOINTS"
_armed = frozenset(p.strip() for p in os.environ.get(ENV, "").split(",") if p.strip())


def hit(name: str) -> None:
    if name in _armed:
        os.kill(os.getpid(), signal.SIGKILL)
