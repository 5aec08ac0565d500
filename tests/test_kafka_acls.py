"""The access rules as Kafka ACL bindings (spark_mq.transports.kafka.acls), without a broker:
what each verb and pattern becomes, what Kafka cannot say, and Kafka's filter semantics. The
answers on the wire, to librdkafka and kafka-python, are in test_kafka.py."""

from __future__ import annotations

from spark_mq.security.acl import parse_rules
from spark_mq.transports.kafka.acls import (
    ALL,
    ALLOW,
    ALTER,
    ALTER_CONFIGS,
    ANY,
    CLUSTER,
    CREATE,
    DELETE,
    DESCRIBE_CONFIGS,
    GROUP,
    LITERAL,
    MATCH,
    PREFIXED,
    READ,
    TOPIC,
    WRITE,
    Binding,
    Filter,
    bindings,
)

RULES = parse_rules(
    """
[[allow]]
principals = ["carol", "group:ops"]
verbs = ["connect", "browse", "admin"]
destinations = ["orders", "odd?", "a*b", "logs.*"]
groups = ["ops-[0-9]", "ops-*"]

[[allow]]
principals = ["*"]
verbs = ["connect"]
""",
    "test",
)


def test_each_verb_and_pattern_becomes_what_kafka_would_check() -> None:
    got = set(bindings(RULES))
    for principal in ("User:carol", "Group:ops"):
        for name, pattern in (("orders", LITERAL), ("logs.", PREFIXED)):
            for op in (READ, DELETE, ALTER, ALTER_CONFIGS, DESCRIBE_CONFIGS):
                assert Binding(TOPIC, name, pattern, principal, op) in got
        assert Binding(GROUP, "ops-", PREFIXED, principal, DELETE) in got
    # ?, [..] and a * before the end have no Kafka pattern: left out; connect is no operation;
    # no rule over every destination: no cluster binding; browse reads, as Fetch does
    assert {b.name for b in got} == {"orders", "logs.", "ops-"}
    assert {b.principal for b in got} == {"User:carol", "Group:ops"}
    assert len(got) == 2 * (2 * 5 + 1)
    assert all(b.operation not in (WRITE, CREATE) for b in got)
    assert not [b for b in got if b.resource_type == CLUSTER]


def test_a_rule_over_everything_is_all_on_every_resource_and_the_cluster() -> None:
    rules = parse_rules('[[allow]]\nprincipals = ["*"]\nverbs = ["*"]\n', "test")
    assert bindings(rules) == [
        Binding(TOPIC, "*", LITERAL, "User:*", ALL),
        Binding(GROUP, "*", LITERAL, "User:*", ALL),
        Binding(CLUSTER, "kafka-cluster", LITERAL, "User:*", ALL),
    ]


def test_filters_match_as_kafka_s_do() -> None:
    every = bindings(RULES)

    def found(**given: object) -> set[tuple[str, int, int]]:
        wanted = Filter(
            **{  # type: ignore[arg-type]
                "resource_type": ANY,
                "name": None,
                "pattern_type": ANY,
                "principal": None,
                "host": None,
                "operation": ANY,
                "permission": ANY,
                **given,
            }
        )
        assert wanted.invalid() is None
        return {(b.name, b.pattern_type, b.operation) for b in every if wanted.matches(b)}

    assert found(
        resource_type=TOPIC,
        name="logs.app",
        pattern_type=MATCH,
        principal="Group:ops",
        operation=READ,
    ) == {("logs.", PREFIXED, READ)}
    # ANY with a name: that name exactly, whatever the pattern type
    assert {n for n, _, _ in found(name="logs.")} == {"logs."}
    assert found(name="logs.", pattern_type=LITERAL) == set()
    assert found(host="10.0.0.1") == set()  # (every binding is from any host, "*")
    assert found(host="*") != set()
    assert found(permission=2) == set()  # (DENY: there are none)
    assert found(permission=ALLOW) == found()
    assert Filter(0, None, ANY, None, None, ANY, ANY).invalid() is not None
    assert Filter(ANY, None, ANY, None, None, 0, ANY).invalid() is not None
