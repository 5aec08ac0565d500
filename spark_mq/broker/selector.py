"""Message selectors: the SQL-92 conditions of JMS, over a message's headers and JMS fields.

``compile_selector("color = 'red' AND weight > 2.5")`` parses once (with sqlglot, so the
grammar is a real SQL one) and returns a :class:`Selector` whose ``matches`` evaluates a
message in SQL's three-valued logic: a comparison with a missing property is *unknown*, and
a message is selected only when the whole condition is *true*.

Supported: ``= <> < <= > >=``, ``BETWEEN``, ``IN``, ``LIKE`` (with ``ESCAPE``), ``IS [NOT]
NULL``, ``AND OR NOT``, ``+ - * /``, parentheses, string/number/boolean literals.

Identifiers name headers (properties), except these JMS fields::

    JMSMessageID  JMSPriority  JMSTimestamp (enqueue, ms)  JMSExpiration (ms, 0 = never)
    JMSDeliveryTime (ms)  JMSXGroupID  JMSDedupID

Headers are strings on the wire; compared with a number, a header that reads as a number is
that number (``amount > 100`` works on ``{"amount": "250"}``); one that does not is unknown.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import sqlglot
from sqlglot import exp
from sqlglot.errors import SqlglotError

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


@dataclass(frozen=True)
class Selector:
    text: str
    _fn: Fn

    def matches(self, props: Props) -> bool:
        return self._fn(props) is True


def compile_selector(text: str | None) -> Selector | None:
    """Parse ``text``; None or blank selects everything. Raises ``SelectorError`` if malformed."""
    if text is None or not text.strip():
        return None
    if len(text) > MAX_SELECTOR_CHARS:
        raise SelectorError(f"a selector is limited to {MAX_SELECTOR_CHARS} characters")
    try:
        tree = sqlglot.condition(text)
    except SqlglotError as exc:
        first = str(exc).splitlines()[0]
        raise SelectorError(f"malformed selector {text!r}: {first}", selector=text) from None
    try:
        return Selector(text, _compile(tree))
    except SelectorError as exc:
        raise SelectorError(
            f"unsupported selector {text!r}: {exc.message}", selector=text
        ) from None


def _number(v: Value) -> float | int | None:
    if isinstance(v, bool) or v is None:
        return None
    if isinstance(v, int | float):
        return v
    try:
        f = float(v)
    except ValueError:
        return None
    return int(f) if f.is_integer() and "." not in v and "e" not in v.lower() else f


def _compare(a: Value, b: Value) -> tuple[Any, Any] | None:
    """The two sides made comparable, or None (unknown)."""
    if a is None or b is None:
        return None
    if isinstance(a, bool) or isinstance(b, bool):
        return (a, b) if isinstance(a, bool) and isinstance(b, bool) else None
    if isinstance(a, str) and isinstance(b, str):
        return a, b
    na, nb = _number(a), _number(b)
    if na is None or nb is None:
        return None
    return na, nb


_COMPARISONS: dict[type, Callable[[Any, Any], bool]] = {
    exp.EQ: lambda x, y: x == y,
    exp.NEQ: lambda x, y: x != y,
    exp.GT: lambda x, y: x > y,
    exp.GTE: lambda x, y: x >= y,
    exp.LT: lambda x, y: x < y,
    exp.LTE: lambda x, y: x <= y,
}
_ARITHMETIC: dict[type, Callable[[Any, Any], Any]] = {
    exp.Add: lambda x, y: x + y,
    exp.Sub: lambda x, y: x - y,
    exp.Mul: lambda x, y: x * y,
    exp.Div: lambda x, y: x / y if y else None,
}


def _compile(node: exp.Expression) -> Fn:
    match node:
        case exp.Paren():
            return _compile(node.this)
        case exp.Literal():
            value: Value = node.this if node.is_string else _number(node.this)
            return lambda p: value
        case exp.Boolean():
            flag = bool(node.this)
            return lambda p: flag
        case exp.Null():
            return lambda p: None
        case exp.Column() if isinstance(node.this, exp.Identifier) and not node.table:
            name = node.this.this
            return lambda p: p.get(name)
        case exp.Neg():
            inner = _compile(node.this)

            def neg(p: Props) -> Value:
                n = _number(inner(p))
                return None if n is None else -n

            return neg
        case exp.And() | exp.Or():
            left, right = _compile(node.this), _compile(node.expression)
            if isinstance(node, exp.And):
                return lambda p: _and(left(p), right(p))
            return lambda p: _or(left(p), right(p))
        case exp.Not():
            inner = _compile(node.this)
            return lambda p: _not(inner(p))
        case exp.Is():
            if not isinstance(node.expression, exp.Null):
                raise SelectorError("IS only takes NULL or NOT NULL")
            inner = _compile(node.this)
            return lambda p: inner(p) is None
        case exp.Between():
            value_fn, low, high = (
                _compile(node.this),
                _compile(node.args["low"]),
                _compile(node.args["high"]),
            )
            ge, le = _COMPARISONS[exp.GTE], _COMPARISONS[exp.LTE]

            def between(p: Props) -> Value:
                v = value_fn(p)
                a, b = _compare(v, low(p)), _compare(v, high(p))
                return _and(None if a is None else ge(*a), None if b is None else le(*b))

            return between
        case exp.In():
            if node.args.get("query") is not None:
                raise SelectorError("IN takes a list of literals, not a query")
            value_fn = _compile(node.this)
            items = [_compile(e) for e in node.expressions]

            def within(p: Props) -> Value:
                v = value_fn(p)
                if v is None:
                    return None
                for item in items:
                    pair = _compare(v, item(p))
                    if pair is not None and pair[0] == pair[1]:
                        return True
                return False

            return within
        case exp.Like():
            return _like(node, None)
        case exp.Escape() if isinstance(node.this, exp.Like):
            escape = node.expression
            if not (isinstance(escape, exp.Literal) and escape.is_string and len(escape.this) == 1):
                raise SelectorError("ESCAPE takes one character")
            return _like(node.this, escape.this)
        case _ if type(node) in _COMPARISONS:
            left, right, op = (
                _compile(node.this),
                _compile(node.expression),
                _COMPARISONS[type(node)],
            )

            def compare(p: Props) -> Value:
                pair = _compare(left(p), right(p))
                return None if pair is None else op(*pair)

            return compare
        case _ if type(node) in _ARITHMETIC:
            left, right, op = (
                _compile(node.this),
                _compile(node.expression),
                _ARITHMETIC[type(node)],
            )

            def arithmetic(p: Props) -> Value:
                a, b = _number(left(p)), _number(right(p))
                if a is None or b is None:
                    return None
                out = op(a, b)
                return None if out is None or (isinstance(out, float) and math.isnan(out)) else out

            return arithmetic
    raise SelectorError(f"{node.sql()!r} is not part of the selector language")


def _like(node: exp.Like, escape: str | None) -> Fn:
    pattern = node.expression
    if not (isinstance(pattern, exp.Literal) and pattern.is_string):
        raise SelectorError("LIKE takes a string literal pattern")
    regex = re.compile(_like_regex(pattern.this, escape), re.DOTALL)
    value_fn = _compile(node.this)
    negate = bool(node.args.get("negate"))

    def like(p: Props) -> Value:
        v = value_fn(p)
        if not isinstance(v, str):
            return None
        hit = regex.fullmatch(v) is not None
        return not hit if negate else hit

    return like


def _like_regex(pattern: str, escape: str | None) -> str:
    out, i = [], 0
    while i < len(pattern):
        ch = pattern[i]
        if escape is not None and ch == escape and i + 1 < len(pattern):
            out.append(re.escape(pattern[i + 1]))
            i += 2
            continue
        out.append(".*" if ch == "%" else "." if ch == "_" else re.escape(ch))
        i += 1
    return "".join(out)


def _and(a: Value, b: Value) -> Value:
    if a is False or b is False:
        return False
    if a is True and b is True:
        return True
    return None


def _or(a: Value, b: Value) -> Value:
    if a is True or b is True:
        return True
    if a is False and b is False:
        return False
    return None


def _not(a: Value) -> Value:
    return None if a is None or not isinstance(a, bool) else not a
