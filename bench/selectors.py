"""What a selector costs the core per subscriber copy (issue 20's target: a simple
selector adds at most 1 µs per copy).

``python -m bench.selectors [--subscribers 1,16] [--messages 20000] [--repeat 5]``:
bench.core's feed (exactly-once, every copy answered), the messages carrying two
application properties, with K subscribers that have no selector, all the same
simple selector (``color = 'red' AND n > 0``: evaluated once per message), or each a
different one (``n > -s``: K evaluations per message); every selector selects every
message, so the copies are the same and only the selecting differs. Runs alternate;
the best of ``--repeat`` each. Prints µs per message and what a selector adds per copy.

``--only KIND`` runs one kind once: under ``valgrind --tool=callgrind``, the difference
between two message counts is its instructions per message (docs/benchmarks.md)."""

from __future__ import annotations

import argparse

from proton import Message

from bench.core import best_alternating, run
from router.serving import tune_gc_for_serving

KINDS = {
    "none": None,
    "same": lambda s: "color = 'red' AND n > 0",
    "different": lambda s: f"color = 'red' AND n > -{s}",
}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.selectors", description=__doc__.split("\n\n")[0])
    p.add_argument("--subscribers", default="1,16")
    p.add_argument("--messages", type=int, default=20000)
    p.add_argument("--in-flight", type=int, default=1000)
    p.add_argument("--repeat", type=int, default=5)
    p.add_argument(
        "--only",
        choices=sorted(KINDS),
        help="run this kind once per K and print its µs/msg (for callgrind: instructions do not drift with load)",
    )
    args = p.parse_args(argv)
    tune_gc_for_serving()
    payload = Message(body="x" * 100, properties={"color": "red", "n": 7}).encode()
    if args.only is not None:
        for k in (int(x) for x in args.subscribers.split(",")):
            us = run(k, args.in_flight, args.messages, False, KINDS[args.only], payload)
            print(f"K={k}: {args.only} {us:.1f} µs/msg", flush=True)
        return 0
    for k in (int(x) for x in args.subscribers.split(",")):
        best = best_alternating(
            {
                name: (lambda k=k, selector_for=selector_for: run(k, args.in_flight, args.messages, False, selector_for, payload))
                for name, selector_for in KINDS.items()
            },
            args.repeat,
        )
        base = best["none"]
        print(
            f"K={k}: no selector {base:.1f} µs/msg; the same selector {best['same']:.1f} "
            f"(+{(best['same'] - base) / k:.2f} µs per copy); different selectors {best['different']:.1f} "
            f"(+{(best['different'] - base) / k:.2f} µs per copy)",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
