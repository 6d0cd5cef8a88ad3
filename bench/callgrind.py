"""Router instructions per message under callgrind (`scripts/bench --callgrind`, or
`python -m bench.callgrind`).

CPU time on this shared 2-core VM drifts with other load; instruction counts do not. For each
mode (exactly-once, best-effort) and each K (subscribers), this runs the router under
`valgrind --tool=callgrind` twice, with N1 and N2 messages from the benchmark's C clients (the
same clients, options and router config as `scripts/bench`), and reports

    instructions per message = (I(N2) - I(N1)) / (N2 - N1)

where I is the router process's total instruction count ("totals:" of the callgrind output):
startup, attach and shutdown cancel out. Then exactly-once / best-effort per K.

The router is ~50x slower under valgrind, so the C clients outrun it and every loop iteration
carries a large batch (up to the credit window): per-iteration costs are spread thinner than in a
timed run. Compare counts from this tool with each other, not with the timed matrix.

    python -m bench.callgrind                            # K=1,4,16, N1=1000, N2=4000
    python -m bench.callgrind --subscribers 1 --n1 2000 --n2 8000
    python -m bench.callgrind --keep                     # keep the callgrind.out files (callgrind_annotate)
    python -m bench.callgrind --profile --subscribers 1  # no valgrind: Python calls per message (cProfile)

Runs are independent; `--jobs 2` runs two at once (valgrind is single-threaded; counts do not
depend on it). PYTHONHASHSEED is fixed (0) for the router so dict/set layouts repeat.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from bench.run import router_config, wait_all
from eorouter_tools.build import BuildError, build_c_clients

ROOT = Path(__file__).resolve().parent.parent
READY_RE = re.compile(r"eorouter: router (\S+) ready on (\S+) epoch (\d+)")
MODES = {"exactly-once": "unsettled", "best-effort": "presettled"}
TOTALS_RE = re.compile(rb"^(?:totals|summary):\s+(\d+)", re.M)


def _wait_for(path: Path, pattern: re.Pattern, proc: subprocess.Popen, timeout: float, what: str) -> re.Match:
    deadline = time.monotonic() + timeout
    while True:
        try:
            m = pattern.search(path.read_text(errors="replace"))
        except FileNotFoundError:
            m = None
        if m:
            return m
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited ({proc.returncode}) before it was ready: {_tail(path)}")
        if time.monotonic() > deadline:
            raise RuntimeError(f"{what} not ready after {timeout:.0f} s: {_tail(path)}")
        time.sleep(0.05)


def _tail(path: Path, n: int = 5) -> str:
    try:
        return " | ".join(path.read_text(errors="replace").splitlines()[-n:])
    except FileNotFoundError:
        return ""


def _port(listeners: str) -> int:
    for item in listeners.split(","):
        role, _, hostport = item.rpartition("=")
        if role in ("", "normal"):
            return int(hostport.rsplit(":", 1)[1])
    raise RuntimeError(f"no client listener in {listeners!r}")


def one_run(mode: str, k: int, n: int, bins: dict, args: argparse.Namespace) -> dict:
    """One router process under callgrind relaying n messages to k subscribers; its total Ir."""
    tmp = Path(tempfile.mkdtemp(prefix=f"eocg-{mode}-k{k}-n{n}-"))
    procs: list[subprocess.Popen] = []
    router = None
    try:
        cfg = router_config(tmp, args)  # the matrix's router config, so counts match its runs
        out_file = tmp / "callgrind.out"
        env = dict(os.environ)
        env["PYTHONPATH"] = str(args.router_root) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
        env["PYTHONHASHSEED"] = "0"
        if args.lines:
            cmd = [sys.executable, args.lines, str(out_file), "-m", "router", "run", "--config", str(cfg)]
        elif args.profile:
            cmd = [sys.executable, "-m", "cProfile", "-o", str(out_file), "-m", "router", "run", "--config", str(cfg)]
        else:
            cmd = [
                "valgrind",
                "--tool=callgrind",
                f"--callgrind-out-file={out_file}",
                "--dump-instr=no",
                "--compress-strings=no",
                *args.valgrind_opt,
                sys.executable,
                "-m",
                "router",
                "run",
                "--config",
                str(cfg),
            ]
        log = tmp / "router.log"
        with open(log, "wb") as fo:
            router = subprocess.Popen(cmd, cwd=tmp, env=env, stdout=fo, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        m = _wait_for(log, READY_RE, router, args.start_timeout, "router")
        port = _port(m.group(2))
        address = "bench/topic"
        recv_outs = []
        for i in range(k):
            out, err = tmp / f"recv{i}.out", tmp / f"recv{i}.err"
            with open(out, "wb") as fo, open(err, "wb") as fe:
                p = subprocess.Popen(
                    [
                        str(bins["receive"]),
                        "-w",
                        str(args.window),
                        "-t",
                        str(args.client_timeout),
                        "-c",
                        f"bench-sub-{i}",
                        "-l",
                        f"bench-sub-{i}",
                        "127.0.0.1",
                        str(port),
                        address,
                        str(n),
                    ],
                    cwd=tmp,
                    stdout=fo,
                    stderr=fe,
                    stdin=subprocess.DEVNULL,
                )
            procs.append(p)
            recv_outs.append(out)
            _wait_for(err, re.compile(r"^ready$", re.M), p, args.start_timeout, f"subscriber {i}")
        time.sleep(0.2)
        s_out = tmp / "send.out"
        with open(s_out, "wb") as fo, open(tmp / "send.err", "wb") as fe:
            sender = subprocess.Popen(
                [
                    str(bins["send"]),
                    "-m",
                    MODES[mode],
                    "-w",
                    str(args.window),
                    "-s",
                    str(args.size),
                    "-t",
                    str(args.client_timeout),
                    "-c",
                    "bench-pub",
                    "-l",
                    "bench-pub",
                    "127.0.0.1",
                    str(port),
                    address,
                    str(n),
                ],
                cwd=tmp,
                stdout=fo,
                stderr=fe,
                stdin=subprocess.DEVNULL,
            )
        procs.append(sender)
        wait_all(procs, args.run_timeout)
        problems = []
        counts = []
        for out in recv_outs:
            try:
                doc = json.loads([ln for ln in out.read_text().splitlines() if ln.startswith("{")][-1])
            except (IndexError, json.JSONDecodeError):
                doc = {}
            counts.append(doc.get("count"))
            if doc.get("count") != n or doc.get("dups") or doc.get("timed_out"):
                problems.append(f"subscriber: {doc or _tail(out)}")
        try:
            send = json.loads([ln for ln in s_out.read_text().splitlines() if ln.startswith("{")][-1])
        except (IndexError, json.JSONDecodeError):
            send = {}
        if mode == "exactly-once" and send.get("accepted") != n:
            problems.append(f"publisher: {send or _tail(s_out)}")
        router.send_signal(signal.SIGTERM)
        try:
            code = router.wait(timeout=args.stop_timeout)
        except subprocess.TimeoutExpired:
            router.kill()
            router.wait()
            raise RuntimeError("router did not exit after SIGTERM")
        if code != 0:
            problems.append(f"router exit {code}: {_tail(log)}")
        if args.lines:
            import pickle

            counts = pickle.loads(out_file.read_bytes())
            calls = {f"{Path(f).parent.name}/{Path(f).name}:{fn}:{line}": c for (f, fn, line), c in counts.items()}
            return {"mode": mode, "k": k, "n": n, "ir": sum(calls.values()), "calls": calls, "problems": problems}
        if args.profile:
            import pstats

            stats = pstats.Stats(str(out_file)).stats
            calls = {f"{Path(f).name}:{line}:{name}": nc for (f, line, name), (cc, nc, tt, ct, callers) in stats.items()}
            result = {"mode": mode, "k": k, "n": n, "ir": sum(calls.values()), "calls": calls, "problems": problems}
            return result
        data = out_file.read_bytes()
        totals = TOTALS_RE.findall(data)
        if not totals:
            raise RuntimeError(f"no totals line in {out_file}")
        result = {"mode": mode, "k": k, "n": n, "ir": int(totals[-1]), "problems": problems}
        if args.keep:
            keep = args.out / f"callgrind.{mode}.k{k}.n{n}.out"
            shutil.copy(out_file, keep)
            result["file"] = str(keep)
        return result
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
        if router is not None and router.poll() is None:
            router.kill()
            router.wait()
        shutil.rmtree(tmp, ignore_errors=True)


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="scripts/bench --callgrind", description=__doc__.split("\n\n")[0])
    p.set_defaults(fsync=False)  # router_config() reads it; the log is never fsynced here
    p.add_argument("--subscribers", default="1,4,16", help="comma-separated K values (default 1,4,16)")
    p.add_argument("--modes", default="exactly-once,best-effort")
    p.add_argument("--n1", type=int, default=1000, help="messages in the short run (default 1000)")
    p.add_argument("--n2", type=int, default=4000, help="messages in the long run (default 4000)")
    p.add_argument("--jobs", type=int, default=1, help="runs at once (default 1)")
    p.add_argument("--window", type=int, default=1000)
    p.add_argument("--credit-window", type=int, default=1000)
    p.add_argument("--max-in-flight", type=int, default=1000)
    p.add_argument("--size", type=int, default=100)
    p.add_argument("--client-timeout", type=int, default=60)
    p.add_argument("--start-timeout", type=float, default=180)
    p.add_argument("--run-timeout", type=float, default=1800)
    p.add_argument("--stop-timeout", type=float, default=120)
    p.add_argument("--valgrind-opt", action="append", default=[], help="extra valgrind option (repeatable)")
    p.add_argument("--keep", action="store_true", help="keep the callgrind.out files in --out")
    p.add_argument("--out", type=Path, default=ROOT / "bench-out")
    p.add_argument(
        "--profile",
        action="store_true",
        help="instead of callgrind: the router under cProfile; function calls per message "
        "(the difference of the two runs), the most called first",
    )
    p.add_argument("--lines", default=None, help=argparse.SUPPRESS)  # a line-tracer script (experiments)
    p.add_argument("--top", type=int, default=40, help="--profile: how many functions to list")
    p.add_argument("--json", action="store_true", help="print the results as one JSON document too")
    p.add_argument(
        "--root",
        type=Path,
        default=None,
        help="run the router/ found in this directory (e.g. an earlier commit's, from git archive, "
        "its fast path built with setup.py build_ext --inplace) instead of a copy of this tree's",
    )
    a = p.parse_args(argv)
    a.k_values = [int(x) for x in a.subscribers.split(",") if x.strip()]
    a.mode_list = [m.strip() for m in a.modes.split(",") if m.strip()]
    for m in a.mode_list:
        if m not in MODES:
            p.error(f"--modes: {m!r} is not one of {', '.join(MODES)}")
    if a.n2 <= a.n1:
        p.error("--n2 must be larger than --n1")
    a.router_root = ROOT
    return a


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    if shutil.which("valgrind") is None:
        print("bench.callgrind: valgrind not found (apt-get install valgrind)", file=sys.stderr)
        return 2
    try:
        bins = build_c_clients()
    except BuildError as e:
        print(f"bench.callgrind: {e}", file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    # Every run uses the same code even while router/ is being edited: a copy of it.
    if args.root is not None:
        args.router_root = args.root.resolve()
        return _measure(args, bins)
    snapshot = Path(tempfile.mkdtemp(prefix="eocg-router-"))
    shutil.copytree(ROOT / "router", snapshot / "router", ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    args.router_root = snapshot
    try:
        return _measure(args, bins)
    finally:
        shutil.rmtree(snapshot, ignore_errors=True)


def _measure(args: argparse.Namespace, bins: dict) -> int:
    plan = [(mode, k, n) for k in args.k_values for mode in args.mode_list for n in (args.n1, args.n2)]
    results: dict[tuple, dict] = {}
    t0 = time.monotonic()

    def run(item):
        mode, k, n = item
        try:
            r = one_run(mode, k, n, bins, args)
        except Exception as e:  # report and go on
            r = {"mode": mode, "k": k, "n": n, "ir": None, "problems": [f"error: {e}"]}
        print(
            f"  {mode} K={k} N={n}: {r['ir'] if r['ir'] is not None else '—'} {'calls' if args.profile else 'Ir'}"
            + ("" if not r["problems"] else "  PROBLEM: " + "; ".join(r["problems"])[:400]),
            file=sys.stderr,
            flush=True,
        )
        return r

    with ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        for r in pool.map(run, plan):
            results[(r["mode"], r["k"], r["n"])] = r
    per: dict[tuple, float | None] = {}
    for k in args.k_values:
        for mode in args.mode_list:
            a, b = results.get((mode, k, args.n1)), results.get((mode, k, args.n2))
            if a and b and a["ir"] is not None and b["ir"] is not None:
                per[(mode, k)] = (b["ir"] - a["ir"]) / (args.n2 - args.n1)
            else:
                per[(mode, k)] = None
    sys.stderr.flush()
    if args.profile or args.lines:
        for k in args.k_values:
            for mode in args.mode_list:
                a, b = results.get((mode, k, args.n1)), results.get((mode, k, args.n2))
                if not (a and b and "calls" in a and "calls" in b):
                    continue
                per_fn = {
                    f: (b["calls"].get(f, 0) - a["calls"].get(f, 0)) / (args.n2 - args.n1)
                    for f in set(a["calls"]) | set(b["calls"])
                }
                print(f"\n{mode} K={k}: {per[(mode, k)]:.1f} Python-level calls per message (cProfile)")
                for f, c in sorted(per_fn.items(), key=lambda kv: -kv[1])[: args.top]:
                    print(f"  {c:7.2f}  {f}")
        return 0
    print(
        f"\nrouter instructions per message (callgrind, (I(N2)-I(N1))/(N2-N1), N1={args.n1}, N2={args.n2}, "
        f"C clients; {time.monotonic() - t0:.0f} s)"
    )
    print("| K | exactly-once Ir/msg | best-effort Ir/msg | exactly-once / best-effort |")
    print("|---|---|---|---|")
    for k in args.k_values:
        eo, be = per.get(("exactly-once", k)), per.get(("best-effort", k))
        ratio = f"{eo / be:.2f}x" if eo and be else "—"
        print(f"| {k} | {eo / 1000 if eo else 0:,.1f} k | {be / 1000 if be else 0:,.1f} k | {ratio} |")
    if args.json:
        print(
            json.dumps(
                {
                    "n1": args.n1,
                    "n2": args.n2,
                    "runs": list(results.values()),
                    "per_message": {f"{m}/K={k}": v for (m, k), v in per.items()},
                }
            )
        )
    ok = all(not r["problems"] and r["ir"] is not None for r in results.values())
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
