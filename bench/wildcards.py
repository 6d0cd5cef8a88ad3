"""What topic patterns cost (issue 20's target: 10,000 installed patterns add at most
2 µs per message): ``python -m bench.wildcards [--patterns 10000] [--messages 20000]``.

1. The index (router/core/topictrie.py): finding the patterns that match a topic,
   for a topic two patterns match and one none does, against trying every pattern in
   turn; best of 5 rounds of 20,000 lookups. A router does this when a topic is made
   (its first publisher or relayed message) and after a subscription change, never
   per message: a topic keeps its subscriptions and its interested routers.
2. The core per message (bench.core's exactly-once feed, K = 1 and 16 subscribers):
   subscribers to the exact topic; the same through a pattern (``#``); and the exact
   ones with ``--patterns`` more subscriptions installed, each to a pattern taking
   other topics. Runs alternate; the best of ``--repeat`` each."""

from __future__ import annotations

import argparse
import timeit

from bench.core import best_alternating, run
from router.core.topictrie import PatternIndex, matches
from router.serving import tune_gc_for_serving


def lookups(count: int) -> None:
    pats = [f"region{i % 100}/+/device{i}/#" for i in range(count)] + ["region7/#"]
    index = PatternIndex()
    for i, pattern in enumerate(pats):
        index.add(pattern, i)
    for topic in ("region7/x/device107/temp", "elsewhere/x/y"):
        n = 20_000
        t = min(timeit.repeat(lambda topic=topic: index.match(topic), number=n, repeat=5)) / n * 1e6
        scan = min(timeit.repeat(lambda topic=topic: [q for q in pats if matches(q, topic)], number=3, repeat=3)) / 3 * 1e6
        print(f"{topic!r}: trie {t:.2f} µs per lookup over {len(pats):,} patterns; one by one {scan:,.0f} µs", flush=True)


def per_message(count: int, subscribers: list[int], messages: int, repeat: int) -> None:
    tune_gc_for_serving()
    kinds = {
        "exact": {},
        "pattern": {"address_for": lambda s: "#"},
        "installed": {"installed_patterns": count},
    }
    for k in subscribers:
        best = best_alternating(
            {name: (lambda k=k, kw=kw: run(k, 1000, messages, False, **kw)) for name, kw in kinds.items()}, repeat
        )
        base = best["exact"]
        print(
            f"K={k}: exact topic {base:.1f} µs/msg; through the pattern '#' {best['pattern']:.1f} "
            f"({best['pattern'] - base:+.2f}); with {count:,} other patterns installed {best['installed']:.1f} "
            f"({best['installed'] - base:+.2f} µs per message)",
            flush=True,
        )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.wildcards", description=__doc__.split("\n\n")[0])
    p.add_argument("--patterns", type=int, default=10_000)
    p.add_argument("--subscribers", default="1,16")
    p.add_argument("--messages", type=int, default=20_000)
    p.add_argument("--repeat", type=int, default=5)
    args = p.parse_args(argv)
    lookups(args.patterns)
    per_message(args.patterns, [int(x) for x in args.subscribers.split(",")], args.messages, args.repeat)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
