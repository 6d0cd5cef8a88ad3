"""What metrics cost the router: [metrics] on and scraped every second, against
off, same code, in one run.

``python -m bench.metrics [--subscribers 1,4] [--messages 50000] [--rounds 5]``:
the cells of ``scripts/bench`` (C clients, exactly-once, one router, K
subscribers), each round once with a ``[metrics]`` listener that a scraper reads
every second (as Prometheus would) and once without, in alternating order, so
drift in a shared machine's speed falls on both alike. Prints, per K, the median
router CPU per message of each, the ratio of the medians (issue 19's target:
at most 1.05) and the round-by-round ratios.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys

from bench.run import parse_args as bench_args
from bench.run import run_one, snapshot_router
from eorouter_tools.build import BuildError, build_c_clients


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.metrics", description=__doc__.split("\n\n")[0])
    p.add_argument("--subscribers", default="1,4")
    p.add_argument("--messages", type=int, default=50000)
    p.add_argument("--rounds", type=int, default=5)
    args = p.parse_args(argv)
    try:
        bins = build_c_clients()
    except BuildError as e:
        print(f"bench.metrics: {e}", file=sys.stderr)
        return 2
    run_args = bench_args(["--messages", str(args.messages)])
    snapshot_router(run_args)  # every run uses the same router/, even while it is being edited
    try:
        return _rounds(args, run_args, bins)
    finally:
        if getattr(run_args, "snapshot_dir", None):
            shutil.rmtree(run_args.snapshot_dir, ignore_errors=True)


def _rounds(args: argparse.Namespace, run_args: argparse.Namespace, bins: dict) -> int:
    results: dict[tuple[str, int], list[float]] = {}
    scrapes: dict[int, list[int]] = {}
    ks = [int(k) for k in args.subscribers.split(",")]
    for r in range(args.rounds):
        for k in ks:
            for side in ["off", "on"] if r % 2 == 0 else ["on", "off"]:
                run_args.metrics = side == "on"
                res = run_one("eorouter", "c", k, "exactly-once", args.messages, run_args, bins)
                cpu = res.get("cpu_us_per_msg")
                if not res.get("ok") or cpu is None or (side == "on" and not res.get("scrapes")):
                    print(
                        f"round {r + 1} K={k} metrics {side}: failed: {res.get('problems')} "
                        f"(scrapes {res.get('scrapes')}, failed {res.get('scrape_failures')})",
                        file=sys.stderr,
                    )
                    continue
                results.setdefault((side, k), []).append(cpu)
                if side == "on":
                    scrapes.setdefault(k, []).append(res["scrapes"])
                print(
                    f"round {r + 1} K={k} metrics {side}: {cpu:.2f} µs/msg"
                    + (f" ({res['scrapes']} scrapes)" if side == "on" else ""),
                    flush=True,
                )
    print(
        f"\nrouter CPU per message, exactly-once, C clients, {args.messages} messages, {args.rounds} rounds; "
        "metrics on = a [metrics] listener scraped every second"
    )
    for k in ks:
        off, on = results.get(("off", k), []), results.get(("on", k), [])
        if not off or not on:
            print(f"K={k}: not enough runs")
            continue
        pairs = [a / b for a, b in zip(on, off)]
        print(
            f"K={k}: off {statistics.median(off):.2f} µs, on {statistics.median(on):.2f} µs, "
            f"on/off {statistics.median(on) / statistics.median(off):.3f} "
            f"(round by round {', '.join(f'{x:.2f}' for x in pairs)}; scrapes per run "
            f"{min(scrapes[k])}-{max(scrapes[k])})"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
