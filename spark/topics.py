"""Topic patterns in the proof: which topics a subscription's address takes.

A subscription's address is a topic or an MQTT-style pattern (docs/selectors.md,
"Wildcard topics": levels separated by ``/``, ``+`` one level, ``#`` the rest,
none included; wildcards at the first level never take a ``$`` topic). The proof
asks it in Spark SQL, so a pattern becomes a regular expression for ``rlike``
(Java's syntax; the constructs used here read the same in Python's ``re``). The
router's own matcher is router/core/topictrie.py; spark/ does not import the
router, and tests check the two agree.
"""

from __future__ import annotations

ONE = "+"
REST = "#"


def _literal(level: str) -> str:
    # Every character that is not a letter or digit escaped: a backslash before
    # one is a literal in Java's and Python's regular expressions alike.
    return "".join(c if c.isalnum() else "\\" + c for c in level)


def is_pattern(address: str) -> bool:
    return any(level in (ONE, REST) for level in address.split("/"))


def pattern_regex(address: str) -> str | None:
    """A regular expression (anchored, dot matching newlines) taking exactly the
    topics ``address`` matches; None when it names one topic (compare by equality)."""
    levels = address.split("/")
    if not is_pattern(address):
        return None
    parts: list[str] = []
    tail = ""
    for i, level in enumerate(levels):
        if level == REST:
            tail = "(/.*)?" if i else ".*"
            break
        parts.append("[^/]*" if level == ONE else _literal(level))
    guard = "(?!\\$)" if levels[0] in (ONE, REST) else ""
    return "(?s)^" + guard + "/".join(parts) + tail + "(?!.)"
