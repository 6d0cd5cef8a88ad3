"""Router CPU per message, this code against an earlier commit, in one run.

``python -m bench.ab --before REV [--subscribers 1,4] [--messages 50000] [--rounds 5]``:
the router/ of REV (``git archive``, its compiled fast path built beside it) and a
copy of the working tree's router/ take turns, round after round, on the same
cells as ``scripts/bench`` (C clients, exactly-once, one router, K subscribers):
each round runs both, in alternating order, so drift in a shared machine's speed
falls on both alike. Prints, per K, each side's median router CPU per message, the
ratio of the medians and the round-by-round ratios. The runs are bench.run's own
(``run_one``), with its defaults for everything not named here.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import sys
import tarfile
import tempfile
from io import BytesIO
from pathlib import Path

from bench.run import ROOT, run_one
from bench.run import parse_args as bench_args
from eorouter_tools.build import BuildError, build_c_clients


def snapshot_at(rev: str | None, into: Path) -> Path:
    """router/ (and setup.py) at ``rev`` (None: the working tree), with the fast path built."""
    into.mkdir(parents=True)
    if rev is None:
        shutil.copytree(ROOT / "router", into / "router", ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        return into
    archive = subprocess.run(["git", "archive", rev, "router", "setup.py"], cwd=ROOT, check=True, capture_output=True).stdout
    with tarfile.open(fileobj=BytesIO(archive)) as tar:
        tar.extractall(into, filter="data")
    subprocess.run([sys.executable, "setup.py", "-q", "build_ext", "--inplace"], cwd=into, check=True, capture_output=True)
    return into


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.ab", description=__doc__.split("\n\n")[0])
    p.add_argument("--before", required=True, help="the earlier commit (any git revision)")
    p.add_argument("--subscribers", default="1,4")
    p.add_argument("--messages", type=int, default=50000)
    p.add_argument("--rounds", type=int, default=5)
    args = p.parse_args(argv)
    try:
        bins = build_c_clients()
    except BuildError as e:
        print(f"bench.ab: {e}", file=sys.stderr)
        return 2
    run_args = bench_args(["--messages", str(args.messages)])
    work = Path(tempfile.mkdtemp(prefix="eobench-ab-"))
    try:
        roots = {"before": snapshot_at(args.before, work / "before"), "after": snapshot_at(None, work / "after")}
        results: dict[tuple[str, int], list[float]] = {}
        ks = [int(k) for k in args.subscribers.split(",")]
        for r in range(args.rounds):
            for k in ks:
                order = ["before", "after"] if r % 2 == 0 else ["after", "before"]
                for side in order:
                    run_args.router_root = roots[side]
                    res = run_one("eorouter", "c", k, "exactly-once", args.messages, run_args, bins)
                    cpu = res.get("cpu_us_per_msg")
                    if not res.get("ok") or cpu is None:
                        print(f"round {r + 1} K={k} {side}: failed: {res.get('problems')}", file=sys.stderr)
                        continue
                    results.setdefault((side, k), []).append(cpu)
                    print(f"round {r + 1} K={k} {side}: {cpu:.2f} µs/msg", flush=True)
        print(
            f"\nrouter CPU per message, exactly-once, C clients, {args.messages} messages, "
            f"{args.rounds} rounds; before = {args.before}"
        )
        for k in ks:
            before, after = results.get(("before", k), []), results.get(("after", k), [])
            if not before or not after:
                print(f"K={k}: not enough runs")
                continue
            pairs = [a / b for a, b in zip(after, before)]
            print(
                f"K={k}: before {statistics.median(before):.2f} µs, after {statistics.median(after):.2f} µs, "
                f"after/before {statistics.median(after) / statistics.median(before):.3f} "
                f"(round by round {', '.join(f'{x:.2f}' for x in pairs)})"
            )
        return 0
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    raise SystemExit(main())
