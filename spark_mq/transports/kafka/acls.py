"""The access rules as Kafka's admin tools see them: DescribeAcls (v1-3).

sparkmq's rules live in ``security.acl_file`` (:mod:`spark_mq.security.acl`), edited there and
reloaded on SIGHUP; CreateAcls and DeleteAcls are not served. DescribeAcls shows each rule as
Kafka's ACL bindings, all ``ALLOW`` from any host:

* **principals**: a user ``alice`` is ``User:alice``, a group ``group:billing`` is
  ``Group:billing``, ``*`` is ``User:*`` (Kafka's anyone);
* **topics** (``TOPIC``): a destination pattern ``orders`` is ``LITERAL``, ``billing.*``
  ``PREFIXED`` (``billing.``) and ``*`` the ``LITERAL`` wildcard. A pattern Kafka cannot say
  (``?``, ``[..]``, a ``*`` before the end) is left out, and the broker's log says so once;
* **operations**: ``produce`` is ``WRITE``, ``consume`` and ``browse`` are ``READ`` (what Fetch
  checks), ``create`` is ``CREATE``, ``admin`` is ``DELETE``, ``ALTER``, ``ALTER_CONFIGS`` and
  ``DESCRIBE_CONFIGS``; ``*`` is ``ALL``. Kafka's ``DESCRIBE`` of a topic is implied by any of
  them, as in Kafka. ``connect`` has no Kafka counterpart (a Kafka client may always connect);
* **groups** (``GROUP``, from a rule's ``groups``): ``consume`` is ``READ``, ``admin``
  ``DELETE``;
* **the cluster** (``CLUSTER``, ``kafka-cluster``): a rule granting ``admin`` over every
  destination (the broker's admin) is ``ALL``.

The filter is Kafka's (``AclBindingFilter``): ``ANY`` of a type, a pattern type, an operation or
a permission matches every one, ``MATCH`` the bindings that apply to the name given (literal,
wildcard and prefixes). Asking needs Kafka's ``DESCRIBE`` on the cluster: here, being the
broker's admin (else ``CLUSTER_AUTHORIZATION_FAILED``, audited); with security off the answer is
``SECURITY_DISABLED``, as a Kafka broker without an authorizer gives.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from spark_mq.errors import NotAuthenticated, NotAuthorized
from spark_mq.security.acl import AccessRules, Rule
from spark_mq.session import ClientSession
from spark_mq.transports.kafka import codec
from spark_mq.transports.kafka.codec import ErrorCode, Request, build
from spark_mq.transports.kafka.link import KafkaLink

log = logging.getLogger(__name__)

# Kafka's enumerations (org.apache.kafka.common.resource / acl)
ANY = 1
TOPIC, GROUP, CLUSTER = 2, 3, 4
MATCH, LITERAL, PREFIXED = 2, 3, 4
ALL, READ, WRITE, CREATE, DELETE, ALTER = 2, 3, 4, 5, 6, 7
DESCRIBE_CONFIGS, ALTER_CONFIGS = 10, 11
ALLOW = 3
CLUSTER_NAME = "kafka-cluster"
WILDCARD = "*"
HOST = "*"

_TOPIC_OPERATIONS: dict[str, tuple[int, ...]] = {
    "produce": (WRITE,),
    "consume": (READ,),
    "browse": (READ,),
    "create": (CREATE,),
    "admin": (DELETE, ALTER, ALTER_CONFIGS, DESCRIBE_CONFIGS),
}
_GROUP_OPERATIONS: dict[str, tuple[int, ...]] = {"consume": (READ,), "admin": (DELETE,)}
_GLOB = frozenset("*?[")
_unsaid: set[str] = set()  # patterns Kafka cannot say, logged once each


@dataclass(frozen=True, slots=True, order=True)
class Binding:
    """One Kafka ACL binding (always ``ALLOW``, from any host)."""

    resource_type: int
    name: str
    pattern_type: int
    principal: str
    operation: int


def bindings(rules: Iterable[Rule]) -> list[Binding]:
    """``rules`` as Kafka's ACL bindings (see the module), sorted, each once."""
    found: set[Binding] = set()
    for rule in rules:
        found.update(_of_rule(rule))
    return sorted(found)


def _of_rule(rule: Rule) -> Iterator[Binding]:
    principals = [_principal(p) for p in rule.principals]
    every = "*" in rule.verbs
    topic_ops = {ALL} if every else {op for v in rule.verbs for op in _TOPIC_OPERATIONS.get(v, ())}
    group_ops = {ALL} if every else {op for v in rule.verbs for op in _GROUP_OPERATIONS.get(v, ())}
    for principal in principals:
        for kind, patterns, ops in (
            (TOPIC, rule.destinations, topic_ops),
            (GROUP, rule.groups, group_ops),
        ):
            for pattern in patterns if ops else ():
                resource = _resource(pattern)
                if resource is not None:
                    name, pattern_type = resource
                    yield from (Binding(kind, name, pattern_type, principal, op) for op in ops)
        if (every or "admin" in rule.verbs) and "*" in rule.destinations:
            yield Binding(CLUSTER, CLUSTER_NAME, LITERAL, principal, ALL)


def _principal(who: str) -> str:
    if who.startswith("group:"):
        return "Group:" + who[len("group:") :]
    return "User:" + who


def _resource(pattern: str) -> tuple[str, int] | None:
    """A name pattern as Kafka's (name, pattern type); None when Kafka cannot say it."""
    if pattern == WILDCARD or not _GLOB & set(pattern):
        return pattern, LITERAL
    head = pattern[:-1]
    if pattern.endswith("*") and head and not _GLOB & set(head):
        return head, PREFIXED
    if pattern not in _unsaid:
        _unsaid.add(pattern)
        log.info(
            "DescribeAcls leaves out the pattern %r: Kafka's ACLs have no such pattern "
            "(only names, a prefix followed by *, and *)",
            pattern,
        )
    return None


@dataclass(frozen=True, slots=True)
class Filter:
    """Kafka's ``AclBindingFilter`` (a DescribeAcls request's)."""

    resource_type: int
    name: str | None
    pattern_type: int
    principal: str | None
    host: str | None
    operation: int
    permission: int

    def invalid(self) -> str | None:
        """What makes it unusable (Kafka's ``INVALID_REQUEST``), or None."""
        if self.resource_type < ANY or self.pattern_type < ANY:
            return "the filter's resource type and pattern type may not be UNKNOWN"
        if self.operation < ANY or self.permission < ANY:
            return "the filter's operation and permission type may not be UNKNOWN"
        return None

    def matches(self, b: Binding) -> bool:
        if self.resource_type != ANY and b.resource_type != self.resource_type:
            return False
        if self.principal is not None and b.principal != self.principal:
            return False
        if self.host is not None and self.host != HOST:
            return False
        if self.operation != ANY and b.operation != self.operation:
            return False
        if self.permission not in (ANY, ALLOW):
            return False
        if self.pattern_type == MATCH:
            return self.name is None or _applies(b, self.name)
        if self.pattern_type != ANY and b.pattern_type != self.pattern_type:
            return False
        return self.name is None or b.name == self.name


def _applies(b: Binding, name: str) -> bool:
    """Whether binding ``b`` applies to a resource called ``name`` (Kafka's MATCH)."""
    if b.pattern_type == PREFIXED:
        return name.startswith(b.name)
    return b.name in (name, WILDCARD)


class AclRequests:
    """A connection's DescribeAcls (see the module)."""

    def __init__(self, link: KafkaLink, session: ClientSession) -> None:
        self.link = link
        self.session = session

    def handlers(self) -> dict[int, Any]:
        return {codec.DESCRIBE_ACLS: self._describe_acls}

    def _describe_acls(self, r: Request, slot: Any) -> None:
        self.link.answer(slot, self._described(r))

    def _described(self, r: Request) -> Any:
        mod = codec.response_module(r.api_key, r.version)
        body = r.body
        wanted = Filter(
            int(body.resource_type_filter),
            body.resource_name_filter,
            int(getattr(body, "pattern_type_filter", LITERAL)),
            body.principal_filter,
            body.host_filter,
            int(body.operation),
            int(body.permission_type),
        )

        def answer(code: ErrorCode, message: str | None, found: list[Binding]) -> Any:
            return build(
                mod,
                "DescribeAclsResponse",
                throttle_time=timedelta(0),
                error_code=code,
                error_message=message,
                resources=_resources(mod, found),
            )

        guard = self.session.guard
        if not isinstance(guard, AccessRules):
            return answer(
                ErrorCode.security_disabled,
                "security is off (no security.acl_file): there are no access rules",
                [],
            )
        try:
            self.session.check_broker_admin()
        except (NotAuthorized, NotAuthenticated) as exc:
            return answer(
                ErrorCode.cluster_authorization_failed,
                f"{exc.message} (the access rules are the broker's admin's to see)",
                [],
            )
        problem = wanted.invalid()
        if problem is not None:
            return answer(ErrorCode.invalid_request, problem, [])
        return answer(ErrorCode.none, None, [b for b in bindings(guard.rules) if wanted.matches(b)])


def _resources(mod: Any, found: list[Binding]) -> tuple[Any, ...]:
    by_resource: dict[tuple[int, str, int], list[Binding]] = {}
    for b in found:
        by_resource.setdefault((b.resource_type, b.name, b.pattern_type), []).append(b)
    return tuple(
        build(
            mod,
            "DescribeAclsResource",
            resource_type=kind,
            resource_name=name,
            pattern_type=pattern,
            acls=tuple(
                build(
                    mod,
                    "AclDescription",
                    principal=b.principal,
                    host=HOST,
                    operation=b.operation,
                    permission_type=ALLOW,
                )
                for b in acls
            ),
        )
        for (kind, name, pattern), acls in by_resource.items()
    )
