"""A guarantee per topic (docs/guarantees.md): the ``[[guarantee]]`` rules of the
config, each a list of topics (names or patterns, topictrie.py) and a mode; the
first rule that takes a topic gives its mode, and a topic no rule takes is
``exactly-once`` for unsettled publishers (a pre-settled one is relayed best
effort, as it asked). Pure."""

from __future__ import annotations

from typing import NamedTuple

from router.core.topictrie import matches

EXACTLY_ONCE = "exactly-once"
AT_LEAST_ONCE = "at-least-once"
AT_MOST_ONCE = "at-most-once"
MODES = (EXACTLY_ONCE, AT_LEAST_ONCE, AT_MOST_ONCE)


class GuaranteeRule(NamedTuple):
    topics: tuple[str, ...]
    mode: str


class Guarantee(NamedTuple):
    mode: str
    rule: int | None  # the rule's index in the config (None: no rule took the topic: the default)

    def describe(self, topic: str) -> str:
        where = f"[[guarantee]] rule {self.rule + 1}" if self.rule is not None else "the default"
        return f"topic {topic!r} is {self.mode} ({where})"


DEFAULT = Guarantee(EXACTLY_ONCE, None)


def guarantee_of(rules: tuple[GuaranteeRule, ...], topic: str) -> Guarantee:
    for index, rule in enumerate(rules):
        if any(matches(pattern, topic) for pattern in rule.topics):
            return Guarantee(rule.mode, index)
    return DEFAULT
