"""A selector's SQL text made into its predicate: parsed by sqlglot (so the grammar is a real
SQL one), then compiled node by node into closures over a message's properties, in the
three-valued logic of :mod:`spark_mq.broker.selector`. Loaded by the first selector compiled,
not at the broker's start: importing sqlglot takes about 90 ms."""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping
from typing import Any, cast

import sqlglot
from sqlglot import exp
from sqlglot.errors import SqlglotError

from spark_mq.broker.like_pattern import LikePattern
from spark_mq.errors import SelectorError

Value = str | float | int | bool | None  # (a property's, or unknown: None)
Props = Mapping[str, Any]
Fn = Callable[[Props], Value]


def predicate(text: str, max_depth: int) -> Fn:
    """``text`` (checked for its size and nesting) as a function of a message's properties,
    its operators nested at most ``max_depth`` deep. Raises ``SelectorError`` saying what is
    wrong, and where."""
    try:
        tree = sqlglot.condition(text)
    except SqlglotError as exc:
        raise SelectorError(
            f"malformed selector {text!r}: {_parse_problem(text, exc)}", selector=text
        ) from None
    except RecursionError:  # (bounded above; this is the backstop)
        raise SelectorError(
            f"malformed selector: nested too deeply (the limit is {max_depth})", selector=text
        ) from None
    try:
        return _compile(cast(exp.Expression, tree), 0, max_depth)
    except SelectorError as exc:
        raise SelectorError(
            f"unsupported selector {text!r}: {exc.message}", selector=text
        ) from None


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


def _compile(node: exp.Expression, depth: int, max_depth: int) -> Fn:
    if depth > max_depth:
        raise SelectorError(f"it nests operators more than {max_depth} deep")

    def sub(child: exp.Expression) -> Fn:
        return _compile(child, depth + 1, max_depth)

    match node:
        case exp.Paren():
            return _compile(node.this, depth, max_depth)
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
            inner = sub(node.this)

            def neg(p: Props) -> Value:
                n = _number(inner(p))
                return None if n is None else -n

            return neg
        case exp.And() | exp.Or():
            # a chain of one operator is one n-ary node: sqlglot nests "a AND b AND c ..." one
            # level per operand, which evaluated recursively could exceed Python's stack
            terms = [sub(t) for t in _chain(node, type(node))]
            return _junction(terms, decisive=isinstance(node, exp.Or))
        case exp.Not():
            inner = sub(node.this)
            return lambda p: _not(inner(p))
        case exp.Is():
            if not isinstance(node.expression, exp.Null):
                raise SelectorError("IS only takes NULL or NOT NULL")
            inner = sub(node.this)
            return lambda p: inner(p) is None
        case exp.Between():
            value_fn, low, high = (
                sub(node.this),
                sub(node.args["low"]),
                sub(node.args["high"]),
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
            value_fn = sub(node.this)
            items = [sub(e) for e in node.expressions]

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
            return _like(node, None, sub)
        case exp.Escape() if isinstance(node.this, exp.Like):
            escape = node.expression
            if not (isinstance(escape, exp.Literal) and escape.is_string and len(escape.this) == 1):
                raise SelectorError("ESCAPE takes one character")
            return _like(node.this, escape.this, sub)
        case _ if type(node) in _COMPARISONS:
            left, right, op = (
                sub(node.this),
                sub(node.expression),
                _COMPARISONS[type(node)],
            )

            def compare(p: Props) -> Value:
                pair = _compare(left(p), right(p))
                return None if pair is None else op(*pair)

            return compare
        case _ if type(node) in _ARITHMETIC:
            left, right, op = (
                sub(node.this),
                sub(node.expression),
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


def _like(node: exp.Like, escape: str | None, sub: Callable[[exp.Expression], Fn]) -> Fn:
    pattern = node.expression
    if not (isinstance(pattern, exp.Literal) and pattern.is_string):
        raise SelectorError("LIKE takes a string literal pattern")
    matcher = LikePattern(pattern.this, escape)
    value_fn = sub(node.this)
    negate = bool(node.args.get("negate"))

    def like(p: Props) -> Value:
        v = value_fn(p)
        if not isinstance(v, str):
            return None
        hit = matcher.matches(v)
        return not hit if negate else hit

    return like


def _chain(node: exp.Expression, kind: type) -> list[exp.Expression]:
    """The operands of a chain of ``kind`` (AND or OR), in order, without recursion."""
    out: list[exp.Expression] = []
    stack: list[exp.Expression] = [node]
    while stack:
        n = stack.pop()
        if isinstance(n, kind):
            stack += (n.expression, n.this)  # this first: popped before expression
        elif isinstance(n, exp.Paren) and isinstance(n.this, kind):
            stack.append(cast(exp.Expression, n.this))
        else:
            out.append(n)
    return out


def _junction(terms: list[Fn], decisive: bool) -> Fn:
    """AND (``decisive`` False: one false term makes it false) or OR (True: one true term makes
    it true) of ``terms``, in SQL's three-valued logic: else unknown if any term is."""
    neutral = not decisive

    def junction(p: Props) -> Value:
        out: Value = neutral
        for t in terms:
            v = t(p)
            if v is decisive:
                return decisive
            if v is not neutral:
                out = None
        return out

    return junction


_OPERATORS = {
    "EQ": "=", "NEQ": "<>", "GT": ">", "GTE": ">=", "LT": "<", "LTE": "<=", "And": "AND",
    "Or": "OR", "Not": "NOT", "Like": "LIKE", "In": "IN", "Between": "BETWEEN", "Is": "IS",
    "Add": "+", "Sub": "-", "Mul": "*", "Div": "/", "Escape": "ESCAPE", "Neg": "-",
}  # fmt: skip
_MISSING_FOR = re.compile(r"Required keyword: '(\w+)' missing for <class '[\w.]*?(\w+)'>")


def _parse_problem(text: str, exc: SqlglotError) -> str:
    """What is wrong with a selector, and where, in the selector language's own terms (not the
    parser's class names)."""
    errors = getattr(exc, "errors", None) or []
    if not errors:  # the tokenizer's errors carry no position
        if text.count("'") % 2:
            return "a string literal is not closed (quote it as 'text', and '' for a quote)"
        return "it cannot be read as a condition"
    err = errors[0]
    description, col = str(err.get("description", "")), err.get("col")
    highlight = err.get("highlight") or ""
    if (m := _MISSING_FOR.search(description)) is not None:
        op = _OPERATORS.get(m.group(2), m.group(2))
        what = f"{op!r} is missing an operand"
    elif description.startswith("Expecting )"):
        what = "a ')' is missing"
    elif "Invalid expression / Unexpected token" in description:
        what = f"unexpected {highlight!r}" if highlight else "unexpected end"
    else:
        what = description.split(". Line")[0]
    if isinstance(col, int) and col > 0 and "\n" not in text:
        at = max(col - len(highlight), 0)  # sqlglot's column is the token's last character
        return f"{what}, at character {at + 1}:\n  {text}\n  {' ' * at}^"
    return what


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


def _and(a: Value, b: Value) -> Value:  # (BETWEEN's two comparisons)
    if a is False or b is False:
        return False
    if a is True and b is True:
        return True
    return None


def _not(a: Value) -> Value:
    return None if a is None or not isinstance(a, bool) else not a
