"""What each guarantee costs the core per message (issue 20, part 3; docs/guarantees.md):
``python -m bench.guarantees [--subscribers 1,16] [--messages 20000] [--repeat 5]``.

bench.core's feed, K subscribers: an exactly-once topic (every copy answered), a
pre-settled publisher (best effort, as the client asked), and an at-most-once topic
whose publisher sends unsettled (accepted on arrival, copies pre-settled, no record).
Runs alternate; the best of ``--repeat`` each; µs per message, and at-most-once over
best effort (the target: at most best effort's cost)."""

from __future__ import annotations

import argparse

from bench.core import best_alternating, run
from router.serving import tune_gc_for_serving


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.guarantees", description=__doc__.split("\n\n")[0])
    p.add_argument("--subscribers", default="1,16")
    p.add_argument("--messages", type=int, default=20_000)
    p.add_argument("--repeat", type=int, default=5)
    args = p.parse_args(argv)
    tune_gc_for_serving()
    kinds = {
        "exactly-once": {"best_effort": False},
        "best-effort": {"best_effort": True},
        "at-most-once": {"best_effort": False, "at_most_once": True},
    }
    for k in (int(x) for x in args.subscribers.split(",")):
        best = best_alternating(
            {name: (lambda k=k, kw=kw: run(k, 1000, args.messages, **kw)) for name, kw in kinds.items()}, args.repeat
        )
        print(
            f"K={k}: exactly-once {best['exactly-once']:.1f} µs/msg; best effort {best['best-effort']:.1f}; "
            f"at-most-once {best['at-most-once']:.1f} ({best['at-most-once'] / best['best-effort']:.2f}x best effort, "
            f"{best['at-most-once'] / best['exactly-once']:.2f}x exactly-once)",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
