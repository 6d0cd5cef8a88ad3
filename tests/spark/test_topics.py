"""spark/topics.py: the proof's regular expression for a pattern takes exactly the
topics the router's matcher (router/core/topictrie.py) does, in Python's re and in
Spark's own rlike (Java's regular expressions)."""

from __future__ import annotations

import re

from hypothesis import given
from hypothesis import strategies as st

from router.core.topictrie import matches
from spark.topics import pattern_regex

LEVELS = st.sampled_from(["a", "b", "$sys", "", "x.y", "a b", "(", "\\", "é", "\n"])
topics = st.lists(LEVELS, min_size=1, max_size=4).map("/".join)
patterns = (
    st.tuples(st.lists(st.one_of(LEVELS, st.just("+")), min_size=0, max_size=3), st.booleans())
    .map(lambda t: "/".join([*t[0], "#"] if t[1] or not t[0] else t[0]))
    .filter(bool)
)


@given(patterns, topics)
def test_the_regex_takes_what_the_router_matches(pattern, topic):
    regex = pattern_regex(pattern)
    if regex is None:
        assert matches(pattern, topic) == (pattern == topic)
    else:
        assert (re.search(regex, topic) is not None) == matches(pattern, topic), (pattern, topic, regex)


CASES = [
    ("sport/+", "sport/tennis"),
    ("sport/+", "sport/tennis/open"),
    ("sport/#", "sport"),
    ("sport/#", "sport/a/b"),
    ("#", "$sys/x"),
    ("+/x", "$sys/x"),
    ("$sys/#", "$sys/x"),
    ("a.b/+", "axb/c"),
    ("a(b/#", "a(b/c"),
    ("+", "line\nbreak"),
]


def test_spark_rlike_agrees(spark):
    rows = [(p, t, pattern_regex(p)) for p, t in CASES]
    got = {
        (r["p"], r["t"]): r["hit"]
        for r in spark.createDataFrame(rows, "p string, t string, re string").selectExpr("p", "t", "t rlike re AS hit").collect()
    }
    assert got == {(p, t): matches(p, t) for p, t in CASES}
