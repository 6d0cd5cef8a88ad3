"""What metrics cost the router: [metrics] on and scraped every second, against
off, same code, in one run.

``python -m bench.metrics [--subscribers 1,4] [--messages 50000] [--rounds 5]``:
each round once with a ``[metrics]`` listener that a scraper reads every second
(as Prometheus would) and once without (bench/sides.py: alternating order; per K
the medians, their ratio -- issue 19's target: at most 1.05 -- and the
round-by-round ratios).
"""

from __future__ import annotations

import argparse
import shutil
import sys

from bench.run import parse_args as bench_args
from bench.run import snapshot_router
from bench.sides import alternate, report
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
    ks = [int(k) for k in args.subscribers.split(",")]

    def side(on: bool):
        def setup(a: argparse.Namespace) -> None:
            a.metrics = on

        return setup

    def scraped(name: str, res: dict) -> str | None:
        if name == "on" and not res.get("scrapes"):
            return f"no scrape during the run ({res.get('scrape_failures')} failed)"
        return None

    results = alternate(run_args, bins, ks, args.rounds, args.messages, (("off", side(False)), ("on", side(True))), scraped)
    print(
        f"\nrouter CPU per message, exactly-once, C clients, {args.messages} messages, {args.rounds} rounds; "
        "metrics on = a [metrics] listener scraped every second"
    )
    report(results, ks, "off", "on")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
