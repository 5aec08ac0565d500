"""Health checks for supervisors and Kubernetes probes.

``/healthz`` (liveness): the process answers. ``/readyz`` (readiness): the broker has recovered
and serves (not starting, not a backup waiting to take over, not stopping), its journal can be
written (the disk is above its minimum free), and the Delta root answers (read at most every
:data:`DELTA_PROBE_S` seconds: a probe every second must not cost a Delta log read each time).
"""

from __future__ import annotations

import threading
import time
from typing import TYPE_CHECKING, Any

from spark_mq.errors import SparkMQError

if TYPE_CHECKING:
    from spark_mq.broker.core import Broker

DELTA_PROBE_S = 5.0
DELTA_WAIT_S = 2.0  # how long the first request waits for the first probe


class Readiness:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._probed_at = float("-inf")
        self._probed: tuple[bool, str] = (False, "the Delta root has not answered yet")
        self._probing = False
        self._first = threading.Event()
        self._waited = False

    def check(self, broker: Broker | None) -> tuple[bool, dict[str, Any]]:
        """Whether ``broker`` is ready, and each check's outcome (what the probe answers)."""
        if broker is None:
            return False, {"phase": "starting", "detail": "the broker is not started yet"}
        phase = broker.phase
        checks: dict[str, Any] = {"phase": phase, "role": broker.ha_state()["role"]}
        serving = phase == "serving"
        checks["serving"] = serving
        if phase == "backup":
            checks["role"] = "backup"
            checks["detail"] = "a backup: it serves once it takes over"
        disk = broker.disk.stats()
        writable = not disk["disk_low"]
        checks["journal_writable"] = writable
        if not writable:
            checks["detail"] = (
                f"the journal's disk has {disk.get('disk_free_bytes')} bytes free, under "
                "limits.min_free_disk_bytes: producers are refused"
            )
        delta_ok, why = self._delta(broker) if serving else (False, "not serving")
        checks["delta_reachable"] = delta_ok
        if not delta_ok and serving:
            checks["detail"] = f"the Delta root does not answer: {why}"
        member = True
        if broker.cluster is not None:  # a cluster member: in the cluster (ZooKeeper away:
            session = broker.cluster.state()["session"]  # still serving what it owns)
            member = session in ("connected", "suspended")
            checks["cluster_session"] = session
            if not member:
                checks["detail"] = (
                    f"its ZooKeeper session is {session}: the others took its destinations "
                    "over; it joins again and gets a share"
                )
        return serving and writable and delta_ok and member, checks

    def _delta(self, broker: Broker) -> tuple[bool, str]:
        """The last probe's outcome; a stale one starts a new probe on a thread of its own, so
        a store that does not answer (delta-rs retries for minutes) never holds a request."""
        with self._lock:
            stale = time.monotonic() - self._probed_at >= DELTA_PROBE_S
            if stale and not self._probing:
                self._probing = True
                threading.Thread(
                    target=self._probe, args=(broker,), name="readiness-probe", daemon=True
                ).start()
            if self._probed_at != float("-inf") or self._waited:
                return self._probed
            self._waited = True
        self._first.wait(DELTA_WAIT_S)  # (the first answer is worth one short wait)
        with self._lock:
            return self._probed

    def _probe(self, broker: Broker) -> None:
        probe = getattr(broker.journal.store, "reachable", None)
        try:
            if probe is not None:
                probe()
            result = (True, "")
        except SparkMQError as exc:
            result = (False, exc.message)
        except Exception as exc:  # an unexpected store error: not ready, and why
            result = (False, f"{type(exc).__name__}: {exc}")
        with self._lock:
            self._probed, self._probed_at, self._probing = result, time.monotonic(), False
        self._first.set()
