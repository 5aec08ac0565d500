"""The hot tier's movers and delta-rs's threads run at a lower priority than the loop
(journal.mover_nice; spark_mq.journal.priority)."""

from __future__ import annotations

import os
import threading

from spark_mq import Admin, Producer
from tests.conftest import wait_for


def _nice_of(pattern: str) -> dict[str, int]:
    """The nice value of each of this process's threads whose name starts with ``pattern``."""
    out = {}
    for task in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{task}/comm") as f:
                name = f.read().strip()
            with open(f"/proc/self/task/{task}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if name.startswith(pattern):
            out[f"{name}/{task}"] = int(fields[16])  # (the 19th field: nice)
    return out


def test_movers_and_the_delta_runtime_yield_to_the_loop(broker) -> None:
    with Producer(broker.url, destination="niced", linger_ms=0) as p:
        for i in range(20):
            p.send_sync(f"{i}")
    mover = next(t for t in threading.enumerate() if t.name == "hot-tier-mover-niced")
    assert mover.native_id is not None
    wait_for(
        lambda: os.getpriority(os.PRIO_PROCESS, mover.native_id) == 10,  # type: ignore[arg-type]
        timeout=10,
        what="the mover at nice 10",
    )
    with Admin(broker.url) as admin:  # (a move of what was sent: delta-rs's threads exist then)
        wait_for(lambda: admin.stats("niced")["hot_tier_moves"] >= 1, timeout=30, what="a move")
    runtime = _nice_of("tokio-")
    assert runtime and set(runtime.values()) == {10}
    assert os.getpriority(os.PRIO_PROCESS, 0) == 0  # the rest of the process as it was
