"""Whether a principal may do a verb on a destination: the seam where authorization plugs in.

The verbs (the access-control file's): ``connect`` (open a session at all), ``produce``,
``consume``, ``browse``, ``create`` (a destination, including one produced or consumed into
existence, and a temporary queue), ``admin`` (configure, delete, purge, stats, subscriptions,
claims of others). A refusal is :class:`~spark_mq.errors.NotAuthorized`, naming the verb, the
destination and the principal.

A Kafka client's consumer or share group is a resource of its own (Kafka's ``GROUP``): using one
(joining, committing and reading its offsets, describing it) is ``consume`` on the group, deleting
it or its offsets ``admin``.
"""

from __future__ import annotations

from typing import Literal, Protocol

from spark_mq.session.principal import Principal

Verb = Literal["connect", "produce", "consume", "browse", "create", "admin"]
VERBS: tuple[Verb, ...] = ("connect", "produce", "consume", "browse", "create", "admin")


class Guard(Protocol):
    def check(self, principal: Principal, verb: Verb, destination: str | None = None) -> None:
        """Return if ``principal`` may; else raise ``NotAuthorized``."""
        ...

    def allows(self, principal: Principal, verb: Verb, destination: str | None = None) -> bool:
        """Whether ``principal`` may (no error, no audit: for filtering what it may see)."""
        ...

    def allows_group(self, principal: Principal, verb: Verb, group: str) -> bool:
        """Whether ``principal`` may do ``verb`` on the consumer group ``group``."""
        ...


class _Open:
    """Security off: everything is allowed."""

    def check(self, principal: Principal, verb: Verb, destination: str | None = None) -> None:
        return None

    def allows(self, principal: Principal, verb: Verb, destination: str | None = None) -> bool:
        return True

    def allows_group(self, principal: Principal, verb: Verb, group: str) -> bool:
        return True


OPEN: Guard = _Open()
