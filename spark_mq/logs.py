"""Logging for the broker: console plus a rotating file named as the seeds' broker names it
(``log.txt`` is the newest; ``log_1.txt`` … ``log_N.txt`` are older archives)."""

from __future__ import annotations

import logging
import logging.handlers
import os
from pathlib import Path

FORMAT = "%(asctime)s %(levelname)-7s %(name)s: %(message)s"


class _SeedNamedRotatingHandler(logging.handlers.RotatingFileHandler):
    """Rotates ``log.txt`` to ``log_1.txt``, ``log_2.txt`` … instead of ``log.txt.1``."""

    def rotation_filename(self, default_name: str) -> str:
        base, _, index = default_name.rpartition(".")
        stem, ext = os.path.splitext(base)
        return f"{stem}_{index}{ext}" if index.isdigit() else default_name


def formatter(fmt: str = "text") -> logging.Formatter:
    """``text``: a line a record; ``json``: a JSON object a line (python-json-logger), with
    ``time``, ``level``, ``logger``, ``message``, the fields a call passes in ``extra``
    (``destination``, ``consumer``, ``principal``) and ``exc_info`` when there is one."""
    if fmt == "json":
        from pythonjsonlogger.json import JsonFormatter

        return JsonFormatter(
            "%(levelname)s %(name)s %(message)s",
            rename_fields={"levelname": "level", "name": "logger"},
            timestamp="time",  # ISO 8601, UTC
        )
    return logging.Formatter(FORMAT)


def setup_logging(
    level: str, file: Path | None, *, max_bytes: int, backups: int, fmt: str = "text"
) -> None:
    root = logging.getLogger()
    root.setLevel(level)
    for h in list(root.handlers):
        root.removeHandler(h)
    console = logging.StreamHandler()
    console.setFormatter(formatter(fmt))
    root.addHandler(console)
    if file is not None:
        file.parent.mkdir(parents=True, exist_ok=True)
        handler = _SeedNamedRotatingHandler(file, maxBytes=max_bytes, backupCount=backups)
        handler.setFormatter(formatter(fmt))
        root.addHandler(handler)
