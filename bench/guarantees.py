"""What each guarantee costs the core per message (issue 20, part 3; docs/guarantees.md):
``python -m bench.guarantees [--subscribers 1,16] [--messages 20000] [--repeat 5]
[--line-messages 3000]``.

One router: bench.core's feed, K subscribers: an exactly-once topic (every copy
answered), an at-least-once topic (the same answers, nothing remembered after), a
pre-settled publisher (best effort, as the client asked), and an at-most-once topic
whose publisher sends unsettled (accepted on arrival, copies pre-settled, no record).
A line of routers: bench.mesh's A - B - C (publisher on A, subscriber on C), exactly-once
against at-least-once, where the settlement phase between routers is what the latter
drops. Runs alternate; the best of ``--repeat`` each; µs per message."""

from __future__ import annotations

import argparse

from bench import mesh
from bench.core import best_alternating, run
from router.core.guarantees import AT_LEAST_ONCE, EXACTLY_ONCE
from router.serving import tune_gc_for_serving


def line(messages: int, repeat: int) -> dict[str, dict[str, float]]:
    """Per mode, each router's best µs per message along A - B - C, runs alternating."""
    best: dict[str, dict[str, float]] = {EXACTLY_ONCE: {}, AT_LEAST_ONCE: {}}
    for _ in range(repeat):
        for mode, kept in best.items():
            for router, us in mesh.run(messages, mode).items():
                kept[router] = min(us, kept.get(router, us))
    return best


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.guarantees", description=__doc__.split("\n\n")[0])
    p.add_argument("--subscribers", default="1,16")
    p.add_argument("--messages", type=int, default=20_000)
    p.add_argument("--repeat", type=int, default=5)
    p.add_argument("--line-messages", type=int, default=3000, help="messages along the A - B - C line (0: skip it)")
    args = p.parse_args(argv)
    tune_gc_for_serving()
    kinds = {
        "exactly-once": {"best_effort": False},
        "at-least-once": {"best_effort": False, "at_least_once": True},
        "best-effort": {"best_effort": True},
        "at-most-once": {"best_effort": False, "at_most_once": True},
    }
    for k in (int(x) for x in args.subscribers.split(",")):
        best = best_alternating(
            {name: (lambda k=k, kw=kw: run(k, 1000, args.messages, **kw)) for name, kw in kinds.items()}, args.repeat
        )
        eo = best["exactly-once"]
        print(
            f"K={k}: exactly-once {eo:.1f} µs/msg; at-least-once {best['at-least-once']:.1f} "
            f"({best['at-least-once'] / eo:.2f}x exactly-once); best effort {best['best-effort']:.1f}; "
            f"at-most-once {best['at-most-once']:.1f} ({best['at-most-once'] / best['best-effort']:.2f}x best effort, "
            f"{best['at-most-once'] / eo:.2f}x exactly-once)",
            flush=True,
        )
    if args.line_messages:
        modes = line(args.line_messages, args.repeat)
        for mode, routers in modes.items():
            total = sum(routers.values())
            print(
                f"A - B - C {mode}: "
                + ", ".join(f"{r} {us:.1f}" for r, us in routers.items())
                + f" µs/msg in RouterCore.handle (sum {total:.1f})",
                flush=True,
            )
        eo, alo = (sum(modes[m].values()) for m in (EXACTLY_ONCE, AT_LEAST_ONCE))
        print(f"A - B - C at-least-once / exactly-once: {alo / eo:.2f}x", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
