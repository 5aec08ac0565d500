"""The audit log: authentication failures, denied verbs and every admin action, one JSON object
a line (time, event, principal, verb, destination, peer, transport, detail), in a rotating file
of its own (``security.audit_file``), apart from the broker's log. Never a password or token."""

from __future__ import annotations

import json
import logging
import logging.handlers
import time
from pathlib import Path

_LOGGER = "spark_mq.audit"


class AuditLog:
    def __init__(self, path: Path | None, *, max_bytes: int = 10 << 20, backups: int = 9) -> None:
        """``path`` None: events go nowhere (security off, or in-process tests that ask not)."""
        self.path = path
        self._log = logging.getLogger(f"{_LOGGER}.{id(self)}")
        self._log.propagate = False
        self._log.setLevel(logging.INFO)
        self._handler: logging.Handler | None = None
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
            self._handler = logging.handlers.RotatingFileHandler(
                path, maxBytes=max_bytes, backupCount=backups, encoding="utf-8"
            )
            self._handler.setFormatter(logging.Formatter("%(message)s"))
            self._log.addHandler(self._handler)

    def event(
        self,
        event: str,
        *,
        principal: str | None = None,
        verb: str | None = None,
        destination: str | None = None,
        peer: str = "",
        transport: str = "",
        detail: str = "",
        outcome: str = "",
    ) -> None:
        if self._handler is None:
            return
        doc = {
            "time": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime())
            + f".{int(time.time() * 1000) % 1000:03d}Z",
            "event": event,
            "principal": principal,
            "verb": verb,
            "destination": destination,
            "peer": peer,
            "transport": transport,
        }
        if outcome:
            doc["outcome"] = outcome
        if detail:
            doc["detail"] = detail
        self._log.info(json.dumps(doc, separators=(",", ":")))

    def close(self) -> None:
        if self._handler is not None:
            self._log.removeHandler(self._handler)
            self._handler.close()
            self._handler = None


NO_AUDIT = AuditLog(None)
