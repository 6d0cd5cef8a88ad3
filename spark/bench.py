"""The reconciliation at scale: synthetic logs, JSON lines vs Parquet.

``python -m spark bench [--events 10000000] [--workdir DIR] [--write-docs]`` generates
the logs (spark/generate.py, unless DIR already holds them), compacts them to
Parquet, and reconciles each form in its own process, measuring wall-clock seconds
and the peak resident memory of the **whole process tree** (the Python driver and
the JVM it starts; ``/usr/bin/time`` would see only the Python process). With
``--write-docs`` the "Reconciliation at scale" section of docs/benchmarks.md is
replaced (or appended); other sections of that file are left alone.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

HEADING = "## Reconciliation at scale"
DOCS = Path(__file__).resolve().parents[1] / "docs" / "benchmarks.md"


def _children() -> dict[int, list[int]]:
    kids: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                stat = f.read().decode(errors="replace")
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        kids.setdefault(ppid, []).append(int(entry))
    return kids


def _rss(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def tree_rss(root: int) -> int:
    kids = _children()
    total, stack = 0, [root]
    while stack:
        pid = stack.pop()
        total += _rss(pid)
        stack.extend(kids.get(pid, []))
    return total


def measure(cmd: list[str], log: Path) -> dict:
    """Run ``cmd``; return its exit code, seconds and the peak RSS of its process tree."""
    started = time.monotonic()
    with open(log, "wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT)
        peak = 0
        done = threading.Event()

        def sample():
            nonlocal peak
            while not done.is_set():
                peak = max(peak, tree_rss(proc.pid))
                done.wait(0.2)
        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        rc = proc.wait()
        done.set()
        sampler.join()
    return {"cmd": cmd, "rc": rc, "seconds": time.monotonic() - started, "peak_rss": peak}


def _size(path: Path, pattern: str) -> int:
    return sum(p.stat().st_size for p in path.rglob(pattern) if p.is_file())


def run(args) -> dict:
    work = Path(args.workdir or f"/tmp/eorouter-bench-{args.events}")
    logs = work / "logs"
    py = sys.executable
    results: dict = {"events_requested": args.events, "master": args.master, "conf": args.conf}
    if not (logs / "truth.json").exists():
        logs.parent.mkdir(parents=True, exist_ok=True)
        results["generate"] = measure([py, "-m", "spark", "generate", str(logs), "--events", str(args.events),
                                       "--routers", "3", "--publishers", "6", "--subscribers", "6", "--topics", "2",
                                       "--restart", "0.002", "--round", "500"], work / "generate.log")
    truth = json.loads((logs / "truth.json").read_text())
    results["events"] = truth["events"]
    results["deliveries"] = truth["deliveries"]
    routers = [str(logs / r) for r in truth["routers"]]
    conf = sum((["--conf", c] for c in args.conf), [])
    parquet = work / "parquet"
    results["compact"] = measure([py, "-m", "spark", "compact", *routers, "--out", str(parquet), "--overwrite",
                                  "--master", args.master, *conf], work / "compact.log")
    results["json_bytes"] = _size(logs, "events-*.jsonl")
    results["parquet_bytes"] = _size(parquet, "*.parquet")
    for form, inputs in (("json", routers), ("parquet", [str(parquet)])):
        out = work / f"report-{form}"
        r = measure([py, "-m", "spark", "reconcile", *inputs, "--clients", str(logs / "clients"), "--out", str(out),
                     "--master", args.master, *conf], work / f"reconcile-{form}.log")
        report = json.loads((out / "report.json").read_text()) if (out / "report.json").exists() else {}
        r["job_seconds"] = report.get("elapsed_s")
        r["verdict"] = report.get("verdict", {}).get("line")
        r["proven_clean"] = report.get("verdict", {}).get("proven_clean")
        results[form] = r
    (work / "bench.json").write_text(json.dumps(results, indent=2, default=str) + "\n")
    return results


def _gb(n: int) -> str:
    return f"{n / 2**30:.1f} GiB"


def section(r: dict) -> str:
    try:
        import pyspark
        spark_version = pyspark.__version__
    except ImportError:  # pragma: no cover
        spark_version = "?"
    java = subprocess.run(["java", "-version"], capture_output=True, text=True).stderr.splitlines()[:1]
    mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    conf = ", ".join(r["conf"]) or "eorouter's local defaults (spark.driver.memory 2g, 16 shuffle partitions, adaptive execution)"
    lines = [
        HEADING,
        "",
        "<!-- Written by `python -m spark bench --write-docs` (spark/bench.py); regenerate it with that, not by "
        "hand. Other sections of this file are written by bench/. -->",
        "",
        f"{r['events']:,} synthetic events ({r['deliveries']:,} publisher deliveries; `scripts/gen-logs`: 3 routers, "
        f"6 publishers, 6 subscribers, 2 topics, ledgers for every client) reconciled with `eorouter reconcile` "
        f"(every proof, the ledger cross-check and the HTML report) on this machine: {os.cpu_count()} cores, "
        f"{_gb(mem)}, Python {platform.python_version()}, Spark {spark_version} "
        f"({java[0] if java else 'java ?'}), `--master {r['master']}`, {conf}. Seconds are the whole command "
        f"(JVM start included); memory is the peak resident set of the whole process tree (Python driver + "
        f"JVM), sampled every 0.2 s.",
        "",
        "| input | size on disk | command seconds | job seconds | peak memory (process tree) | verdict |",
        "|---|---|---|---|---|---|",
    ]
    for form, size in (("json", r["json_bytes"]), ("parquet", r["parquet_bytes"])):
        x = r[form]
        lines.append(f"| {'JSON lines' if form == 'json' else 'Parquet (zstd)'} | {size / 1e6:,.0f} MB | "
                     f"{x['seconds']:.0f} | {x['job_seconds'] or 0:.0f} | {_gb(x['peak_rss'])} | "
                     f"{'proven clean' if x['proven_clean'] else 'NOT clean'} |")
    c = r["compact"]
    lines += [
        "",
        f"`eorouter logs compact` (JSON → Parquet, once): {c['seconds']:.0f} s, peak {_gb(c['peak_rss'])}. "
        f"Parquet is {r['json_bytes'] / max(1, r['parquet_bytes']):.1f}× smaller; the job over it saves "
        f"{r['json']['seconds'] - r['parquet']['seconds']:.0f} s of JSON parsing per run, so compacting pays "
        f"from the {'first' if c['seconds'] < r['json']['seconds'] - r['parquet']['seconds'] else 'second'} "
        f"reconciliation of the same logs on.",
        "",
        "Reproduce: `python -m spark bench --events 10000000 --write-docs` (generates into "
        "`/tmp/eorouter-bench-10000000/`, about 2 GB, unless it is already there).",
        "",
    ]
    return "\n".join(lines)


def write_docs(text: str, path: Path = DOCS) -> None:
    doc = path.read_text() if path.exists() else "# Benchmarks\n"
    pattern = re.compile(rf"^{re.escape(HEADING)}\n.*?(?=^## |\Z)", re.S | re.M)
    if pattern.search(doc):
        doc = pattern.sub(lambda _: text + "\n", doc)
    else:
        doc = doc.rstrip("\n") + "\n\n" + text + "\n"
    path.write_text(doc)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m spark bench", description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=10_000_000)
    parser.add_argument("--workdir", help="default /tmp/eorouter-bench-<events>")
    parser.add_argument("--master", default="local[2]")
    parser.add_argument("--conf", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--write-docs", action="store_true", help="replace the section in docs/benchmarks.md")
    args = parser.parse_args(argv)
    results = run(args)
    text = section(results)
    print(text)
    if args.write_docs:
        write_docs(text)
        print(f"bench: wrote the section into {DOCS}")
    return 0 if results["json"]["rc"] == 0 and results["parquet"]["rc"] == 0 else 1


if __name__ == "__main__":
    raise SystemExit(main())
