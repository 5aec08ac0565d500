"""Who a session acts for."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class Principal:
    """An authenticated identity: a user's name, the groups it belongs to, and how it proved
    who it is (``password``, ``token``, ``certificate``; ``none`` with security off)."""

    name: str
    groups: frozenset[str] = field(default_factory=frozenset)
    via: str = "none"

    def __str__(self) -> str:
        return self.name


# every client, when security is off
ANONYMOUS = Principal("anonymous")
