"""Message selectors: the SQL-92 conditions of JMS, over a message's headers and JMS fields.

``compile_selector("color = 'red' AND weight > 2.5")`` parses once (with sqlglot, so the
grammar is a real SQL one: :mod:`spark_mq.broker.selector_sql`, loaded by the first selector)
and returns a :class:`Selector` whose ``matches`` evaluates a message in SQL's three-valued
logic: a comparison with a missing property is *unknown*, and a message is selected only
when the whole condition is *true*.

Supported: ``= <> < <= > >=``, ``BETWEEN``, ``IN``, ``LIKE`` (with ``ESCAPE``), ``IS [NOT]
NULL``, ``AND OR NOT``, ``+ - * /``, parentheses, string/number/boolean literals.

Identifiers name headers (properties), except these JMS fields::

    JMSMessageID  JMSPriority  JMSTimestamp (enqueue, ms)  JMSExpiration (ms, 0 = never)
    JMSDeliveryTime (ms)  JMSXGroupID  JMSDedupID

Headers are strings on the wire; compared with a number, a header that reads as a number is
that number (``amount > 100`` works on ``{"amount": "250"}``); one that does not is unknown.

Selectors run on the broker's delivery path, so none may cost more than its size says: a
selector is at most :data:`MAX_SELECTOR_CHARS` long and nests at most :data:`MAX_DEPTH` deep
(chains of ``AND`` / ``OR`` count once), and ``LIKE`` matches in time linear in the value
(:mod:`spark_mq.broker.like_pattern`), never by a backtracking regular expression.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from spark_mq.errors import SelectorError

Value = str | float | int | bool | None
Props = Mapping[str, Any]
Fn = Callable[[Props], Value]

JMS_FIELDS = (
    "JMSMessageID",
    "JMSPriority",
    "JMSTimestamp",
    "JMSExpiration",
    "JMSDeliveryTime",
    "JMSXGroupID",
    "JMSDedupID",
)
MAX_SELECTOR_CHARS = 4096
MAX_DEPTH = 32  # operators nested in operators (a chain of AND or OR counts once)


@dataclass(frozen=True)
class Selector:
    text: str
    _fn: Fn

    def matches(self, props: Props) -> bool:
        return self._fn(props) is True


def compile_selector(text: str | None) -> Selector | None:
    """Parse ``text``; None or blank selects everything. Raises ``SelectorError`` if malformed."""
    if text is not None and not isinstance(text, str):
        raise SelectorError(f"a selector must be a string, got {type(text).__name__}")
    if text is None or not text.strip():
        return None
    if len(text) > MAX_SELECTOR_CHARS:
        raise SelectorError(
            f"a selector is limited to {MAX_SELECTOR_CHARS} characters; this one has {len(text)}",
            selector=text[:100] + "...",
        )
    depth = _paren_depth(text)
    if depth > MAX_DEPTH:
        raise SelectorError(
            f"malformed selector: parentheses nest {depth} deep; the limit is {MAX_DEPTH}",
            selector=text,
        )
    from spark_mq.broker import selector_sql  # (sqlglot: loaded by the first selector)

    return Selector(text, selector_sql.predicate(text, MAX_DEPTH))


def _paren_depth(text: str) -> int:
    """How deep parentheses nest in ``text``, outside string literals."""
    depth = deepest = 0
    quoted = False
    for ch in text:
        if ch == "'":
            quoted = not quoted  # '' inside a literal toggles twice
        elif not quoted:
            if ch == "(":
                depth += 1
                deepest = max(deepest, depth)
            elif ch == ")":
                depth -= 1
    return deepest
