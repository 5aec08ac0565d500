"""Message selectors: SQL-92 conditions over headers and JMS fields, three-valued."""

from __future__ import annotations

import re
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from spark_mq import SelectorError
from spark_mq.broker.like_pattern import LikePattern
from spark_mq.broker.selector import compile_selector

MSG = {
    "color": "red",
    "weight": "2.75",
    "count": "12",
    "name": "ab_cd%",
    "JMSPriority": 7,
    "JMSXGroupID": None,
    "flag": "true",
}


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("color = 'red'", True),
        ("color <> 'red'", False),
        ("color = 'blue' OR weight > 2.5", True),
        ("color = 'red' AND weight > 3", False),
        ("count = 12", True),  # a header that reads as a number compares as one
        ("count > 9", True),  # numerically, not as strings ("12" < "9")
        ("count BETWEEN 10 AND 12", True),
        ("count NOT BETWEEN 10 AND 12", False),
        ("color IN ('green', 'red')", True),
        ("color NOT IN ('green', 'red')", False),
        ("name LIKE 'ab%'", True),
        ("name LIKE 'a_\\_cd\\%' ESCAPE '\\'", True),
        ("name LIKE 'ab\\_x%' ESCAPE '\\'", False),
        ("name NOT LIKE 'x%'", True),
        ("missing IS NULL", True),
        ("color IS NOT NULL", True),
        ("JMSXGroupID IS NULL", True),
        ("JMSPriority >= 5 AND JMSPriority < 9", True),
        ("count * 2 + 1 = 25", True),
        ("-count < 0", True),
        ("(color = 'red' OR color = 'blue') AND NOT weight < 1", True),
        # unknown (a missing property) is not true, and NOT unknown is still not true
        ("missing = 'x'", False),
        ("NOT missing = 'x'", False),
        ("missing = 'x' OR color = 'red'", True),
        ("color > 5", False),  # a string that is not a number never compares with one
        ("TRUE", True),
        ("FALSE", False),
    ],
)
def test_selector_evaluates_like_sql(text: str, expected: bool) -> None:
    selector = compile_selector(text)
    assert selector is not None and selector.matches(MSG) is expected


@pytest.mark.parametrize(
    "text",
    ["color = 'red' AND", "color = ", "foo(", "count IN (SELECT 1)", "upper(color) = 'RED'"],
)
def test_malformed_or_unsupported_selector_is_a_clear_error(text: str) -> None:
    with pytest.raises(SelectorError, match="selector"):
        compile_selector(text)


def test_blank_selector_selects_everything() -> None:
    assert compile_selector(None) is None
    assert compile_selector("   ") is None


def _like_reference(pattern: str, value: str) -> bool:
    """LIKE by a regular expression (exponential on some patterns; fine on small ones)."""
    regex = "".join(".*" if c == "%" else "." if c == "_" else re.escape(c) for c in pattern)
    return re.fullmatch(regex, value, re.DOTALL) is not None


@settings(max_examples=400, deadline=None)
@given(
    pattern=st.text(alphabet="ab%_", max_size=10),
    value=st.text(alphabet="abc", max_size=12),
)
def test_like_matches_as_sql_defines_it(pattern: str, value: str) -> None:
    assert LikePattern(pattern).matches(value) is _like_reference(pattern, value)


@pytest.mark.parametrize(
    ("pattern", "value", "expected"),
    [
        ("%a%a%a%a%a%a%a%a%a%a%a%a%a%a%a%b", "a" * 64, False),  # the pattern that froze it
        ("%a_a_c%", "a" * 200_000, False),
        ("%" + "a%" * 30 + "c", "a" * 10_000 + "c", True),
    ],
)
def test_like_takes_linear_time_on_backtracking_patterns(
    pattern: str, value: str, expected: bool
) -> None:
    selector = compile_selector(f"h LIKE '{pattern}'")
    assert selector is not None
    started = time.perf_counter()
    assert selector.matches({"h": value}) is expected
    assert time.perf_counter() - started < 0.5


def test_like_with_escape_takes_escaped_wildcards_literally() -> None:
    assert LikePattern("50!%%", "!").matches("50% off")
    assert not LikePattern("50!%%", "!").matches("500 off")
    assert LikePattern("a!_b", "!").matches("a_b")
    assert not LikePattern("a!_b", "!").matches("axb")


def test_long_chains_of_and_or_evaluate_without_deep_recursion() -> None:
    terms = 280  # sqlglot nests such a chain one level a term: 280 would overflow evaluated so
    text = " AND ".join(f"x{i} = 1" for i in range(terms))
    assert len(text) <= 4096
    selector = compile_selector(text)
    assert selector is not None
    assert selector.matches({f"x{i}": "1" for i in range(terms)})
    assert not selector.matches({f"x{i}": "1" for i in range(terms - 1)})
    either = compile_selector(" OR ".join(f"x{i} = 1" for i in range(terms)))
    assert either is not None and either.matches({f"x{terms - 1}": "1"})


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("(" * 40 + "a = 1" + ")" * 40, "nest 40 deep; the limit is 32"),
        ("NOT " * 40 + "a = 1", "more than 32 deep"),
        ("a = " + " + ".join(["1"] * 40), "more than 32 deep"),
        ("a = '" + "x" * 5000 + "'", "limited to 4096 characters"),
    ],
)
def test_selectors_past_the_bounds_are_refused(text: str, says: str) -> None:
    with pytest.raises(SelectorError, match=re.escape(says)):
        compile_selector(text)


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("color = ", "'=' is missing an operand, at character 7"),
        ("color = 'red' AND", "'AND' is missing an operand, at character 15"),
        ("(color = 'red'", "a ')' is missing"),
        ("color = 'red", "a string literal is not closed"),
        ("a = 1 b = 2", "unexpected 'b', at character 7"),
    ],
)
def test_a_malformed_selector_says_what_is_wrong_and_where(text: str, says: str) -> None:
    with pytest.raises(SelectorError) as caught:
        compile_selector(text)
    message = caught.value.message
    assert says in message
    assert "sqlglot" not in message and "<class" not in message
