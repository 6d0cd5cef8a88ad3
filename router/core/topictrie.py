"""Topic patterns over hierarchical names, MQTT style (docs/selectors.md, "Wildcard
topics"): levels separated by ``/``, ``+`` matches exactly one level, ``#`` (the
last level only) matches the rest, none included (``a/#`` matches ``a``). A
pattern without wildcards matches only itself.

``PatternIndex`` answers "which patterns match this topic" with a trie over
levels: the work per topic is bounded by the topic's depth times the wildcard
branches actually present, never by the number of patterns (issue 20 measures it
with 10,000). Pure: no proton, no sockets.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterator

ONE = "+"
REST = "#"
SEP = "/"


def pattern_problem(pattern: str) -> str | None:
    """Why ``pattern`` is not a topic pattern, or None."""
    if not pattern:
        return "an empty topic pattern"
    levels = pattern.split(SEP)
    for i, level in enumerate(levels):
        if REST in level and (level != REST or i != len(levels) - 1):
            return f"{pattern!r}: '#' must be a whole level, and the last"
        if ONE in level and level != ONE:
            return f"{pattern!r}: '+' must be a whole level"
    return None


def is_pattern(name: str) -> bool:
    """Whether ``name`` has a wildcard level (else it names one topic)."""
    return any(level in (ONE, REST) for level in name.split(SEP))


class _Node:
    __slots__ = ("children", "here", "rest")

    def __init__(self) -> None:
        self.children: dict[str, _Node] = {}  # a level (or "+") -> the node below it
        self.here: set[Hashable] = set()  # values of patterns that end at this node
        self.rest: set[Hashable] = set()  # values of patterns that end with "#" below this node


class PatternIndex:
    """Patterns (each with the values registered under it) indexed for matching."""

    def __init__(self) -> None:
        self._root = _Node()
        self._count = 0

    def __len__(self) -> int:
        return self._count

    def add(self, pattern: str, value: Hashable) -> None:
        problem = pattern_problem(pattern)
        if problem:
            raise ValueError(problem)
        node = self._root
        levels = pattern.split(SEP)
        for level in levels[:-1]:
            node = node.children.setdefault(level, _Node())
        last = levels[-1]
        bucket = node.rest if last == REST else node.children.setdefault(last, _Node()).here
        if value not in bucket:
            bucket.add(value)
            self._count += 1

    def remove(self, pattern: str, value: Hashable) -> bool:
        """Forget ``value`` under ``pattern``; empty branches are pruned. False if absent."""
        path: list[tuple[_Node, str]] = []
        node = self._root
        levels = pattern.split(SEP)
        for level in levels[:-1]:
            child = node.children.get(level)
            if child is None:
                return False
            path.append((node, level))
            node = child
        last = levels[-1]
        if last == REST:
            bucket = node.rest
        else:
            leaf = node.children.get(last)
            if leaf is None:
                return False
            path.append((node, last))
            bucket = leaf.here
        if value not in bucket:
            return False
        bucket.discard(value)
        self._count -= 1
        for parent, level in reversed(path):  # prune what no pattern needs any more
            child = parent.children[level]
            if child.children or child.here or child.rest:
                break
            del parent.children[level]
        return True

    def match(self, topic: str) -> set[Hashable]:
        """Every value registered under a pattern that matches ``topic``."""
        found: set[Hashable] = set()
        levels = topic.split(SEP)
        skip_wild = topic.startswith("$")  # MQTT: wildcards do not match $-topics at the first level
        stack = [(self._root, 0)]
        while stack:
            node, i = stack.pop()
            if node.rest and not (skip_wild and i == 0):
                found |= node.rest
            if i == len(levels):
                found |= node.here
                continue
            child = node.children.get(levels[i])
            if child is not None:
                stack.append((child, i + 1))
            if not (skip_wild and i == 0):
                any_one = node.children.get(ONE)
                if any_one is not None:
                    stack.append((any_one, i + 1))
        return found

    def patterns(self) -> Iterator[tuple[str, Hashable]]:
        """(pattern, value) for everything indexed."""
        stack: list[tuple[_Node, list[str]]] = [(self._root, [])]
        while stack:
            node, prefix = stack.pop()
            for value in node.rest:
                yield SEP.join([*prefix, REST]), value
            for level, child in node.children.items():
                for value in child.here:
                    yield SEP.join([*prefix, level]), value
                stack.append((child, [*prefix, level]))


def matches(pattern: str, topic: str) -> bool:
    """Whether ``pattern`` matches ``topic`` (one pattern: no index needed)."""
    index = PatternIndex()
    index.add(pattern, 0)
    return bool(index.match(topic))


def covers(rule: str, pattern: str) -> bool:
    """Whether every topic ``pattern`` matches is matched by ``rule`` too: what a
    policy asks of a subscription to a pattern (a rule ``a/+`` covers ``a/b`` and
    ``a/+``, never ``a/#``, which also matches ``a`` and ``a/b/c``)."""
    rules, levels = rule.split(SEP), pattern.split(SEP)
    dollar = pattern.startswith("$")  # wildcards at the first level never match a $-topic
    for i, level in enumerate(levels):
        if i >= len(rules):
            return False
        wanted = rules[i]
        if wanted == REST:
            return not (dollar and i == 0)
        if level == REST:
            # Zero or more levels from here (at least one at the first: a topic has one):
            # only "#" takes them all, or "+/#" at the first level.
            return rules[i:] == [ONE, REST] if i == 0 else False
        if level == ONE:
            if wanted != ONE:
                return False
        elif wanted == ONE:
            if dollar and i == 0:
                return False
        elif wanted != level:
            return False
    # ``a/#`` also matches ``a`` itself: a rule one "#" longer covers the pattern.
    return len(rules) == len(levels) or (len(rules) == len(levels) + 1 and rules[-1] == REST)
