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

Selectors run on the broker's delivery path, so none may cost more than its size says: a
selector is at most :data:`MAX_SELECTOR_CHARS` long and nests at most :data:`MAX_DEPTH` deep
(chains of ``AND`` / ``OR`` count once), and ``LIKE`` matches in time linear in the value
(:class:`LikePattern`), never by a backtracking regular expression: ``'%a%a%a...%b'`` against a
long run of ``a`` took seconds that way, and froze every client of the broker.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, cast

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
    try:
        tree = sqlglot.condition(text)
    except SqlglotError as exc:
        raise SelectorError(
            f"malformed selector {text!r}: {_parse_problem(text, exc)}", selector=text
        ) from None
    except RecursionError:  # (bounded above; this is the backstop)
        raise SelectorError(
            f"malformed selector: nested too deeply (the limit is {MAX_DEPTH})", selector=text
        ) from None
    try:
        return Selector(text, _compile(cast(exp.Expression, tree), 0))
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


def _compile(node: exp.Expression, depth: int) -> Fn:
    if depth > MAX_DEPTH:
        raise SelectorError(f"it nests operators more than {MAX_DEPTH} deep")

    def sub(child: exp.Expression) -> Fn:
        return _compile(child, depth + 1)

    match node:
        case exp.Paren():
            return _compile(node.this, depth)
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


_ANY_ONE = object()  # "_": any one character


class LikePattern:
    """A LIKE pattern (``%``: any run of characters, ``_``: any one), matched in linear time.

    A pattern is a sequence of *pieces* split at ``%``: the first must match at the value's
    start, the last at its end, and the others in order, each as early as it can (taking a piece
    at its leftmost place never loses a match that a later place would give). A piece of literal
    characters is found with ``str.find``; a piece with ``_`` in it by a bit-parallel scan
    (one state bit per position in the piece, one pass over the value). Either way the value is
    read a bounded number of times, whatever the pattern: there is no backtracking.
    """

    def __init__(self, pattern: str, escape: str | None = None) -> None:
        pieces: list[list[object]] = [[]]
        i = 0
        while i < len(pattern):
            ch = pattern[i]
            if escape is not None and ch == escape and i + 1 < len(pattern):
                pieces[-1].append(pattern[i + 1])
                i += 2
                continue
            if ch == "%":
                pieces.append([])
            else:
                pieces[-1].append(_ANY_ONE if ch == "_" else ch)
            i += 1
        self._anchored_end = len(pieces) == 1  # no "%": the whole value is one piece
        self._first = pieces[0]
        self._middle = [p for p in pieces[1:-1] if p]
        self._last = pieces[-1] if len(pieces) > 1 else []

    def matches(self, value: str) -> bool:
        first, last = self._first, self._last
        if self._anchored_end:
            return len(value) == len(first) and _piece_at(first, value, 0)
        if len(value) < len(first) + len(last) or not _piece_at(first, value, 0):
            return False
        end = len(value) - len(last)
        if not _piece_at(last, value, end):
            return False
        pos = len(first)
        for piece in self._middle:
            found = _find_piece(piece, value, pos, end)
            if found < 0:
                return False
            pos = found + len(piece)
        return True


def _piece_at(piece: list[object], value: str, at: int) -> bool:
    """Whether ``piece`` matches ``value`` at ``at`` (the caller made sure it fits)."""
    if all(type(c) is str for c in piece):
        return value.startswith("".join(piece), at)  # type: ignore[arg-type]
    return all(c is _ANY_ONE or value[at + k] == c for k, c in enumerate(piece))


def _find_piece(piece: list[object], value: str, start: int, end: int) -> int:
    """The first position ``>= start`` where ``piece`` matches within ``value[:end]``, or -1."""
    if all(type(c) is str for c in piece):
        return value.find("".join(piece), start, end)  # type: ignore[arg-type]
    # shift-and: bit k of the state is set when the piece's first k+1 items match ending here
    masks: dict[str, int] = {}
    anyone = 0
    for k, c in enumerate(piece):
        if c is _ANY_ONE:
            anyone |= 1 << k
        else:
            masks[cast(str, c)] = masks.get(cast(str, c), 0) | 1 << k
    done = 1 << (len(piece) - 1)
    state = 0
    for i in range(start, end):
        state = ((state << 1) | 1) & (masks.get(value[i], 0) | anyone)
        if state & done:
            return i - len(piece) + 1
    return -1


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


def _and(a: Value, b: Value) -> Value:  # (BETWEEN's two comparisons)
    if a is False or b is False:
        return False
    if a is True and b is True:
        return True
    return None


def _not(a: Value) -> Value:
    return None if a is None or not isinstance(a, bool) else not a
