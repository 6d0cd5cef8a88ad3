"""What 10,000 installed topic patterns cost a topic's lookup (issue 20's target: at
most 2 µs per message): ``python -m bench.wildcards [--patterns 10000]``. The trie
(router/core/topictrie.py) against trying every pattern in turn, for a topic that
two patterns match and one that none does; best of 5 rounds of 20,000 lookups."""

from __future__ import annotations

import argparse
import timeit

from router.core.topictrie import PatternIndex, matches


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.wildcards", description=__doc__.split("\n\n")[0])
    p.add_argument("--patterns", type=int, default=10_000)
    args = p.parse_args(argv)
    pats = [f"region{i % 100}/+/device{i}/#" for i in range(args.patterns)] + ["region7/#"]
    index = PatternIndex()
    for i, pattern in enumerate(pats):
        index.add(pattern, i)
    for topic in ("region7/x/device107/temp", "elsewhere/x/y"):
        n = 20_000
        t = min(timeit.repeat(lambda topic=topic: index.match(topic), number=n, repeat=5)) / n * 1e6
        scan = min(timeit.repeat(lambda topic=topic: [q for q in pats if matches(q, topic)], number=3, repeat=3)) / 3 * 1e6
        print(f"{topic!r}: trie {t:.2f} µs per lookup over {len(pats):,} patterns; one by one {scan:,.0f} µs")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
