"""router.core.topictrie: MQTT-style topic patterns, the trie index against a brute
force written independently (each pattern as a regular expression, tried one by
one), over hypothesis-made patterns and topics."""

from __future__ import annotations

import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from router.core.topictrie import PatternIndex, is_pattern, matches, pattern_problem

LEVELS = st.sampled_from(["a", "b", "c", "$sys", ""])
topics = st.lists(LEVELS, min_size=1, max_size=4).map("/".join)
patterns = (
    st.tuples(st.lists(st.sampled_from(["a", "b", "c", "+", "$sys", ""]), min_size=0, max_size=4), st.booleans())
    .map(lambda t: "/".join([*t[0], "#"] if t[1] or not t[0] else t[0]))
    .filter(bool)
)


def brute(pattern: str, topic: str) -> bool:
    levels = pattern.split("/")
    if topic.startswith("$") and levels[0] in ("+", "#"):
        return False
    parts = []
    for i, level in enumerate(levels):
        if level == "#":
            tail = "(/.*)?" if i else ".*"
            return re.fullmatch("/".join(parts) + tail, topic) is not None
        parts.append("[^/]*" if level == "+" else re.escape(level))
    return re.fullmatch("/".join(parts), topic) is not None


@given(st.lists(patterns, max_size=12), topics)
def test_the_index_finds_what_the_brute_force_finds(pats, topic):
    index = PatternIndex()
    for i, p in enumerate(pats):
        index.add(p, i)
    assert index.match(topic) == {i for i, p in enumerate(pats) if brute(p, topic)}


@given(st.lists(patterns, max_size=12), st.data())
def test_removing_leaves_the_others_and_prunes(pats, data):
    index = PatternIndex()
    for i, p in enumerate(pats):
        index.add(p, i)
    gone = set(data.draw(st.sets(st.sampled_from(range(len(pats)))) if pats else st.just(set())))
    for i in gone:
        assert index.remove(pats[i], i)
        assert not index.remove(pats[i], i)
    assert len(index) == len(pats) - len(gone)
    assert sorted(v for _, v in index.patterns()) == sorted(set(range(len(pats))) - gone)
    for i in set(range(len(pats))) - gone:
        assert index.remove(pats[i], i)
    assert len(index) == 0 and not index._root.children and not index._root.rest  # everything pruned


@pytest.mark.parametrize(
    "pattern, topic, expected",
    [
        ("sport/#", "sport", True),  # '#' includes the parent level
        ("sport/#", "sport/tennis/player1", True),
        ("sport/+", "sport", False),
        ("sport/+", "sport/", True),  # an empty level is a level
        ("+/+", "/finance", True),
        ("#", "$SYS/monitor", False),  # wildcards do not match $-topics at the first level
        ("$SYS/#", "$SYS/monitor", True),
        ("a/b", "a/b", True),
        ("a/b", "a/b/c", False),
    ],
)
def test_mqtt_examples(pattern, topic, expected):
    assert matches(pattern, topic) is expected
    assert brute(pattern, topic) is expected


@pytest.mark.parametrize("bad", ["", "a/#/b", "a#", "a/b+", "+a"])
def test_bad_patterns(bad):
    assert pattern_problem(bad)
    with pytest.raises(ValueError):
        PatternIndex().add(bad, 1)
    assert is_pattern("a/+/b") and is_pattern("#") and not is_pattern("a/b")


def test_ten_thousand_patterns():
    """10,000 patterns (issue 20): the right ones match; how long a match takes is
    bench/wildcards.py's to say."""
    index = PatternIndex()
    for i in range(10_000):
        index.add(f"region{i % 100}/+/device{i}/#", i)
    index.add("region7/#", "all of region7")
    assert index.match("region7/x/device107/temp") == {107, "all of region7"}
    assert index.match("region7/x/device108") == {"all of region7"}
    assert index.match("region70/x/device170") == {170}


# --- covers: what a policy rule must do for a subscription to a pattern ---------------------

SMALL_PATTERNS = (
    st.tuples(st.lists(st.sampled_from(["a", "b", "+", "$sys", ""]), min_size=0, max_size=3), st.booleans())
    .map(lambda t: "/".join([*t[0], "#"] if t[1] or not t[0] else t[0]))
    .filter(bool)
)
# Every topic of up to 4 levels over the patterns' levels and one no pattern names:
# enough for a topic that one pattern matches and the other does not, when there is one.
UNIVERSE = [
    "/".join(levels)
    for depth in range(1, 5)
    for levels in __import__("itertools").product(["a", "b", "$sys", "", "z"], repeat=depth)
]


@given(SMALL_PATTERNS, SMALL_PATTERNS)
def test_a_rule_covers_a_pattern_exactly_when_it_matches_all_the_pattern_matches(rule, pattern):
    from router.core.topictrie import covers

    taken = [t for t in UNIVERSE if brute(pattern, t)]
    assert covers(rule, pattern) == all(brute(rule, t) for t in taken), (rule, pattern)


@pytest.mark.parametrize(
    ("rule", "pattern", "covered"),
    [
        ("a/+", "a/b", True),
        ("a/+", "a/+", True),
        ("a/+", "a/#", False),  # a/# also takes "a" and "a/b/c"
        ("a/#", "a/+/c", True),
        ("a/#", "a", True),
        ("#", "$sys/+", False),  # wildcards never take a $-topic's first level
        ("$sys/#", "$sys/+", True),
        ("a/+/#", "a/#", False),  # a/# takes "a", which a/+/# does not
    ],
)
def test_covers_examples(rule, pattern, covered):
    from router.core.topictrie import covers

    assert covers(rule, pattern) is covered
