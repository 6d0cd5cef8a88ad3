"""Two settings of one router, measured side by side in one run (bench.metrics,
bench.tls): the cells of ``scripts/bench`` (C clients, exactly-once, one router, K
subscribers), each round once per side in alternating order, so drift in a shared
machine's speed falls on both alike; router CPU per message, the median per side,
the ratio of the medians and the round-by-round ratios."""

from __future__ import annotations

import argparse
import statistics
import sys
from collections.abc import Callable

from bench.run import run_one

#: A side: its name, and how it sets up bench.run's arguments before each run.
Side = tuple[str, Callable[[argparse.Namespace], None]]


def alternate(
    run_args: argparse.Namespace,
    bins: dict,
    ks: list[int],
    rounds: int,
    messages: int,
    sides: tuple[Side, Side],
    accept: Callable[[str, dict], str | None] = lambda side, res: None,
) -> dict[tuple[str, int], list[float]]:
    """{(side name, K): CPU µs per message, one per round}. ``accept`` says why a
    run that finished does not count (None: it counts)."""
    results: dict[tuple[str, int], list[float]] = {}
    for r in range(rounds):
        for k in ks:
            for name, setup in sides if r % 2 == 0 else tuple(reversed(sides)):
                setup(run_args)
                res = run_one("eorouter", "c", k, "exactly-once", messages, run_args, bins)
                cpu = res.get("cpu_us_per_msg")
                why = None if res.get("ok") and cpu is not None else f"failed: {res.get('problems')}"
                why = why or accept(name, res)
                if why:
                    print(f"round {r + 1} K={k} {name}: {why}", file=sys.stderr)
                    continue
                results.setdefault((name, k), []).append(cpu)
                print(f"round {r + 1} K={k} {name}: {cpu:.2f} µs/msg", flush=True)
    return results


def report(results: dict[tuple[str, int], list[float]], ks: list[int], base: str, other: str) -> list[dict]:
    """Print and return, per K: each side's median, other/base of the medians, the round-by-round ratios."""
    rows = []
    for k in ks:
        a, b = results.get((base, k), []), results.get((other, k), [])
        if not a or not b:
            print(f"K={k}: not enough runs")
            continue
        pairs = [y / x for x, y in zip(a, b)]
        ratio = statistics.median(b) / statistics.median(a)
        rows.append({"k": k, base: statistics.median(a), other: statistics.median(b), "ratio": ratio, "rounds": pairs})
        print(
            f"K={k}: {base} {statistics.median(a):.2f} µs, {other} {statistics.median(b):.2f} µs, "
            f"{other}/{base} {ratio:.3f} (round by round {', '.join(f'{x:.2f}' for x in pairs)})"
        )
    return rows
