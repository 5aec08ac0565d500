"""The access rules (``security.acl_file``): who may do which verbs on which destinations.
Nothing is allowed that no rule allows (deny by default)::

    [[allow]]
    principals = ["group:admins"]        # users by name, groups as group:<name>, "*": anyone
    verbs = ["*"]                        # connect produce consume browse create admin, or *
    destinations = ["*"]                 # name patterns (*, ?, [..]); omitted: every one

    [[allow]]
    principals = ["alice", "group:billing"]
    verbs = ["connect", "produce", "consume"]
    destinations = ["orders", "billing.*"]

A Kafka client's consumer and share groups are named by ``groups`` (patterns; omitted: every
group): ``consume`` on a group lets a principal join it, commit and read its offsets and describe
it; ``admin`` deletes it or its offsets. A rule without ``groups`` covers every group, so to keep
a principal to some groups, name them in each of its rules::

    [[allow]]
    principals = ["reports"]
    verbs = ["consume"]
    destinations = ["orders"]
    groups = ["reports-*"]

``connect`` takes no destination: a rule naming it lets its principals open sessions at all.
What is done to the broker itself (``promote``, reloading the rules, reading its
configuration) is ``admin`` with no destination, which only a rule over every destination
grants (destinations omitted, or ``"*"``): admin of ``orders.*`` is not admin of the broker.
The rules are read again on SIGHUP or the ``reload_security`` admin action; a file that does
not parse leaves the rules in force, and the error says why.
"""

from __future__ import annotations

import fnmatch
import logging
import threading
from dataclasses import dataclass

import tomllib

from spark_mq.errors import ConfigError, NotAuthorized
from spark_mq.names import PARTITION_MARK, logical_name
from spark_mq.session.guard import VERBS, Verb
from spark_mq.session.principal import Principal

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Rule:
    principals: tuple[str, ...]
    verbs: frozenset[str]
    destinations: tuple[str, ...]
    groups: tuple[str, ...] = ("*",)

    def matches_group(self, principal: Principal, verb: Verb, group: str) -> bool:
        if "*" not in self.verbs and verb not in self.verbs:
            return False
        if not any(_is(principal, p) for p in self.principals):
            return False
        return any(fnmatch.fnmatchcase(group, g) for g in self.groups)

    def matches(self, principal: Principal, verb: Verb, destination: str | None) -> bool:
        if "*" not in self.verbs and verb not in self.verbs:
            return False
        if not any(_is(principal, p) for p in self.principals):
            return False
        if destination is None:
            # a verb on the broker itself (promote, reload the rules, its configuration):
            # only a rule over every destination grants it; admin of some queues is not
            # admin of the broker. (connect takes no destination: any rule naming it grants it)
            return verb == "connect" or "*" in self.destinations
        return any(fnmatch.fnmatchcase(destination, d) for d in self.destinations)


def _is(principal: Principal, who: str) -> bool:
    if who == "*":
        return True
    if who.startswith("group:"):
        return who[len("group:") :] in principal.groups
    return who == principal.name


def parse_rules(text: str, origin: str) -> tuple[Rule, ...]:
    """The rules of an access-control file's text; ``ConfigError`` naming what is wrong."""
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        err = f"{origin} is not valid TOML: {exc}"
        raise ConfigError(err, setting="security.acl_file") from None
    unknown = set(doc) - {"allow"}
    if unknown:
        raise ConfigError(
            f"{origin}: unknown section(s) {sorted(unknown)}; rules are [[allow]] tables",
            setting="security.acl_file",
        )
    rules = []
    for n, entry in enumerate(doc.get("allow", []), 1):
        where = f"{origin}: rule {n}"
        if not isinstance(entry, dict):
            raise ConfigError(f"{where} must be a table", setting="security.acl_file")
        extra = set(entry) - {"principals", "verbs", "destinations", "groups"}
        if extra:
            raise ConfigError(
                f"{where}: unknown key(s) {sorted(extra)}; a rule has principals, verbs, "
                "destinations and groups",
                setting="security.acl_file",
            )
        principals = _strings(entry, "principals", where, required=True)
        verbs = _strings(entry, "verbs", where, required=True)
        bad = [v for v in verbs if v != "*" and v not in VERBS]
        if bad:
            raise ConfigError(
                f"{where}: unknown verb(s) {bad}; the verbs are {', '.join(VERBS)} (or *)",
                setting="security.acl_file",
            )
        destinations = _strings(entry, "destinations", where, required=False) or ["*"]
        groups = _strings(entry, "groups", where, required=False) or ["*"]
        rules.append(Rule(tuple(principals), frozenset(verbs), tuple(destinations), tuple(groups)))
    return tuple(rules)


def _strings(entry: dict, key: str, where: str, *, required: bool) -> list[str]:
    value = entry.get(key)
    if value is None and not required:
        return []
    if not isinstance(value, list) or not value or not all(isinstance(v, str) for v in value):
        raise ConfigError(f"{where}: {key} must be a list of strings", setting="security.acl_file")
    return value


class AccessRules:
    """The session layer's guard with security on: the rules of the access-control file."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._lock = threading.Lock()
        self._rules: tuple[Rule, ...] = self._load()

    def _load(self) -> tuple[Rule, ...]:
        try:
            with open(self.path, encoding="utf-8") as fh:
                text = fh.read()
        except OSError as exc:
            raise ConfigError(
                f"cannot read the access-control file {self.path}: {exc.strerror or exc}",
                setting="security.acl_file",
            ) from None
        return parse_rules(text, self.path)

    @property
    def rules(self) -> tuple[Rule, ...]:
        """The rules in force (what Kafka's DescribeAcls shows)."""
        with self._lock:
            return self._rules

    def reload(self) -> tuple[bool, str]:
        """Read the file again: ``(True, what)`` when its rules are in force now; ``(False,
        why)`` when it could not be used (the rules in force stay)."""
        try:
            rules = self._load()
        except ConfigError as exc:
            log.error("access rules not reloaded, the old ones stay: %s", exc.message)
            return False, exc.message
        with self._lock:
            self._rules = rules
        log.info("access rules reloaded from %s: %d rule(s)", self.path, len(rules))
        return True, f"{len(rules)} rule(s) from {self.path}"

    def allows(self, principal: Principal, verb: Verb, destination: str | None = None) -> bool:
        """(A partition is its destination's: ``orders~2`` is allowed what ``orders`` is.)"""
        with self._lock:
            rules = self._rules
        if destination is not None and PARTITION_MARK in destination:
            destination = logical_name(destination)
        return any(r.matches(principal, verb, destination) for r in rules)

    def allows_group(self, principal: Principal, verb: Verb, group: str) -> bool:
        with self._lock:
            rules = self._rules
        return any(r.matches_group(principal, verb, group) for r in rules)

    def check(self, principal: Principal, verb: Verb, destination: str | None = None) -> None:
        if self.allows(principal, verb, destination):
            return
        where = f" on {destination!r}" if destination is not None else ""
        raise NotAuthorized(
            f"{principal.name!r} may not {verb}{where}: no rule in {self.path} allows it",
            verb=verb,
            destination=destination or "",
            principal=principal.name,
        )
