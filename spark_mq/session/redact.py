"""What of the configuration may be shown (the console, ``sparkmq status --config``): every value
whose key names a secret is replaced, however deep it sits."""

from __future__ import annotations

import re
from typing import Any

REDACTED = "***"
_SECRET = re.compile(
    r"pass(word|phrase)?|secret|token|credential|private|access_key|sas|(^|_)auth$", re.I
)


def redacted(value: Any, key: str = "") -> Any:
    if isinstance(value, dict):
        return {k: redacted(v, str(k)) for k, v in value.items()}
    if isinstance(value, list):
        return [redacted(v, key) for v in value]
    if key and _SECRET.search(key) and value not in (None, "", False):
        return REDACTED
    return value
