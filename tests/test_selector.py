"""Message selectors: SQL-92 conditions over headers and JMS fields, three-valued."""

from __future__ import annotations

import pytest

from spark_mq import SelectorError
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
