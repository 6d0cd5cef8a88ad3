"""The reconciliation at scale: synthetic logs, JSON lines vs Parquet.

``python -m spark bench [--events 10000000] [--workdir DIR] [--write-docs]`` generates
the logs (spark/generate.py, unless DIR already holds them), compacts them to
Parquet, and reconciles each form in its own process, measuring wall-clock seconds
and the peak resident memory of the **whole process tree** (the Python driver and
the JVM it starts; ``/usr/bin/time`` would see only the Python process). With
``--write-docs`` the "Reconciliation at scale" section of docs/benchmarks.md is
replaced (or appended); other sections of that file are left alone.

``--lock FILE`` takes an exclusive flock(2) on FILE around each measured step
(the same lock ``flock FILE cmd`` takes), so that other benchmarks sharing the
machine wait rather than compete; the time spent waiting is not measured.

The synthetic logs come with their truth (``truth.json``: the violations injected,
none by default); the bench checks that each run's counts match it exactly.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
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


def _cpu(pid: int) -> float:
    """CPU seconds (user + system) a process has used so far."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().decode(errors="replace").rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return 0.0


def tree_pids(root: int) -> list[int]:
    kids = _children()
    out, stack = [], [root]
    while stack:
        pid = stack.pop()
        out.append(pid)
        stack.extend(kids.get(pid, []))
    return out


def tree_rss(root: int) -> int:
    return sum(_rss(pid) for pid in tree_pids(root))


@contextlib.contextmanager
def _locked(path: str | None):
    if not path:
        yield
        return
    with open(path, "a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def measure(cmd: list[str], log: Path, lock: str | None = None) -> dict:
    """Run ``cmd``; return its exit code, seconds and the peak RSS of its process tree."""
    with _locked(lock):
        return _measure(cmd, log)


def _measure(cmd: list[str], log: Path) -> dict:
    """Wall seconds, the peak resident memory of the process tree (sampled every
    0.2 s), and its CPU seconds (each process's last sample: a process that ends
    between two samples loses at most 0.2 s of its CPU time from the count)."""
    started = time.monotonic()
    with open(log, "wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT)
        peak = 0
        cpu: dict[int, float] = {}
        done = threading.Event()

        def sample():
            nonlocal peak
            while not done.is_set():
                pids = tree_pids(proc.pid)
                peak = max(peak, sum(_rss(pid) for pid in pids))
                for pid in pids:
                    cpu[pid] = max(cpu.get(pid, 0.0), _cpu(pid))
                done.wait(0.2)

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        rc = proc.wait()
        done.set()
        sampler.join()
    return {
        "cmd": cmd,
        "rc": rc,
        "seconds": time.monotonic() - started,
        "peak_rss": peak,
        "cpu_seconds": round(sum(cpu.values()), 1),
        "load_before": os.getloadavg()[0],
    }


def _size(path: Path, pattern: str) -> int:
    return sum(p.stat().st_size for p in path.rglob(pattern) if p.is_file())


def _matches_truth(counts: dict, truth: dict) -> bool:
    """The job's per-check counts are exactly what was injected (nothing, by default)."""
    checks = set(counts) | set(truth)
    return all(int(counts.get(c, 0)) == len(truth.get(c, ())) for c in checks)


def run(args) -> dict:
    work = Path(args.workdir or f"/tmp/eorouter-bench-{args.events}")
    logs = work / "logs"
    py = sys.executable
    results: dict = {
        "events_requested": args.events,
        "master": args.master,
        "conf": args.conf,
        "command": "python -m spark bench " + " ".join(args.argv),
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
    }
    if not (logs / "truth.json").exists():
        logs.parent.mkdir(parents=True, exist_ok=True)
        results["generate"] = measure(
            [
                py,
                "-m",
                "spark",
                "generate",
                str(logs),
                "--events",
                str(args.events),
                "--routers",
                "3",
                "--publishers",
                "6",
                "--subscribers",
                "6",
                "--topics",
                "2",
                "--restart",
                "0.002",
                "--round",
                "500",
            ],
            work / "generate.log",
            args.lock,
        )
        if results["generate"]["rc"] != 0:
            raise SystemExit(f"bench: generating the logs failed, see {work / 'generate.log'}")
        (work / "generate.json").write_text(json.dumps(results["generate"], indent=2) + "\n")
    elif (work / "generate.json").exists():  # generated by an earlier bench run in this workdir
        results["generate"] = dict(json.loads((work / "generate.json").read_text()), earlier=True)
    truth = json.loads((logs / "truth.json").read_text())
    results["events"] = truth["events"]
    results["deliveries"] = truth["deliveries"]
    results["faults"] = truth.get("faults", [])
    results["truth"] = {check: len(items) for check, items in truth.get("truth", {}).items()}
    routers = [str(logs / r) for r in truth["routers"]]
    conf = sum((["--conf", c] for c in args.conf), [])
    parquet = work / "parquet"
    results["compact"] = measure(
        [py, "-m", "spark", "compact", *routers, "--out", str(parquet), "--overwrite", "--master", args.master, *conf],
        work / "compact.log",
        args.lock,
    )
    results["json_bytes"] = _size(logs, "events-*.jsonl")
    results["json_files"] = sum(1 for _ in logs.rglob("events-*.jsonl"))
    results["ledger_bytes"] = _size(logs / "clients", "*.jsonl")
    results["parquet_bytes"] = _size(parquet, "*.parquet")
    results["parquet_files"] = sum(1 for _ in parquet.rglob("*.parquet"))
    for form, inputs in (("json", routers), ("parquet", [str(parquet)])):
        out = work / f"report-{form}"
        (out / "report.json").unlink(missing_ok=True)  # a failed run must not leave the last run's verdict
        r = measure(
            [
                py,
                "-m",
                "spark",
                "reconcile",
                *inputs,
                "--clients",
                str(logs / "clients"),
                "--out",
                str(out),
                "--master",
                args.master,
                *conf,
            ],
            work / f"reconcile-{form}.log",
            args.lock,
        )
        report = json.loads((out / "report.json").read_text()) if (out / "report.json").exists() else {}
        r["job_seconds"] = report.get("elapsed_s")
        r["phases_s"] = report.get("phases_s")
        r["first_read"] = report.get("first_read")
        r["rules"] = report.get("rules")
        r["verdict"] = report.get("verdict", {}).get("line")
        r["proven_clean"] = report.get("verdict", {}).get("proven_clean")
        r["counts"] = report.get("counts")
        r["matches_truth"] = bool(report) and _matches_truth(report.get("counts") or {}, truth.get("truth", {}))
        results[form] = r
    results["small"] = _small_run(work, args, conf)
    (work / "bench.json").write_text(json.dumps(results, indent=2, default=str) + "\n")
    return results


def _class_archive() -> bool:
    from spark import jvm

    path = jvm.archive_path()
    return path is not None and path.is_file()


def _small_run(work: Path, args, conf: list[str]) -> dict:
    """The other end of the scale: ~40 k events, as a 3-router, 2,000-message run
    leaves them; the command's time is mostly Spark's start and its fixed costs."""
    py = sys.executable
    logs = work / "small"
    if not (logs / "truth.json").exists():
        r = measure(
            [
                py,
                "-m",
                "spark",
                "generate",
                str(logs),
                "--events",
                "40000",
                "--routers",
                "3",
                "--publishers",
                "2",
                "--subscribers",
                "4",
                "--topics",
                "1",
            ],
            work / "generate-small.log",
        )
        if r["rc"] != 0:
            raise SystemExit(f"bench: generating the small logs failed, see {work / 'generate-small.log'}")
    truth = json.loads((logs / "truth.json").read_text())
    out = work / "report-small"
    (out / "report.json").unlink(missing_ok=True)
    r = measure(
        [
            py,
            "-m",
            "spark",
            "reconcile",
            *[str(logs / x) for x in truth["routers"]],
            "--clients",
            str(logs / "clients"),
            "--out",
            str(out),
            "--master",
            args.master,
            *conf,
        ],
        work / "reconcile-small.log",
        args.lock,
    )
    report = json.loads((out / "report.json").read_text()) if (out / "report.json").exists() else {}
    r.update(
        events=truth["events"],
        deliveries=truth["deliveries"],
        job_seconds=report.get("elapsed_s"),
        phases_s=report.get("phases_s"),
        proven_clean=report.get("verdict", {}).get("proven_clean"),
    )
    return r


def _reads(first_read: str | None, rules: str | None = None) -> str:
    """Which reads of the logs and which per-delivery rules ran (report.json ``first_read``
    and ``rules``: spark/linescan.py, spark/deliveryrules.py)."""
    if first_read is None:
        return "?"
    reads = "Java scans" if first_read == "java" else "Spark SQL" + first_read.removeprefix("spark-sql")
    if rules is None:
        return reads
    return reads + (", Java rules" if rules == "java" else ", SQL rules")  # (why: report.json ``rules``)


def _gb(n: int) -> str:
    return f"{n / 2**30:.1f} GiB" if n >= 2**30 else f"{n / 2**20:.0f} MiB"


def _mb(n: int) -> str:
    return f"{n / 1e6:,.0f} MB"


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _phases(x: dict) -> str:
    """The job's own phases (spark/job.py), in the order it ran them."""
    ph = {k: v for k, v in (x.get("phases_s") or {}).items() if k != "partitions"}
    return " / ".join(f"{v:.0f}" for v in ph.values()) if ph else "—"


def _phase_names(r: dict) -> str:
    for form in ("json", "parquet"):
        ph = [k for k in (r.get(form, {}).get("phases_s") or {}) if k != "partitions"]
        if ph:
            return " / ".join(ph)
    return "phases"


#: Issue 15's targets: 10 M events, every check + ledgers + HTML report, in this
#: much command time and peak memory; a ~40 k-event run in this much.
TARGET_SECONDS, TARGET_BYTES, SMALL_TARGET_SECONDS = 60, 2 * 2**30, 15


def section(r: dict) -> str:
    try:
        import pyspark

        spark_version = pyspark.__version__
    except ImportError:  # pragma: no cover
        spark_version = "?"
    java = subprocess.run(["java", "-version"], capture_output=True, text=True).stderr.splitlines()[:1]
    mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    conf = ", ".join(f"`--conf {c}`" for c in r["conf"]) or (
        "eorouter's local defaults (spark/load.py): `spark.driver.memory=1200m` (768m below 300,000 events; in "
        "local mode the driver's JVM is the executor), 16 shuffle partitions (4 for a small input), ~500,000 "
        "events per delivery-id partition, above 2 M events the per-delivery facts kept on local disk; below "
        "300,000 events the C1 compiler only; the JVM maps spark/jvm.py's class archive "
        f"({'built' if _class_archive() else 'not built: every start is ~3 s slower'}); the summary's queries "
        "run beside the proofs', so its phase is what they did not overlap"
    )
    expected = (
        "clean (no fault injected)" if not r.get("faults") else f"faults injected: {', '.join(r['faults'])} ({r.get('truth')})"
    )
    g, c = r.get("generate"), r["compact"]
    lines = [
        HEADING,
        "",
        "<!-- Written by `python -m spark bench --write-docs` (spark/bench.py); regenerate it with that, not by "
        "hand. Other sections of this file are written by bench/. -->",
        "",
        f"Command: `{r['command']}` — {r['date']}.",
        "",
        f"Machine: {os.cpu_count()} cores ({_cpu_model()}), {_gb(mem)} RAM, {platform.system()} "
        f"{platform.release()}; Python {platform.python_version()}, PySpark {spark_version} "
        f"({java[0] if java else 'java ?'}). Spark: `--master {r['master']}`, {conf}.",
        "",
        f"Input: {r['events']:,} synthetic events ({r['deliveries']:,} publisher deliveries) from `scripts/gen-logs` "
        f"(spark/generate.py: 3 routers restarting now and then, 6 publishers, 6 subscribers, 2 topics, a ledger "
        f"for every client; expected verdict: {expected}), reconciled by `eorouter reconcile` with every proof, "
        f'the `--clients` ledger cross-check and the HTML report. "reads": the two reads of the routers\' logs by '
        f"the Java scans (spark/linescan.py, JSON lines in the writer's shape) or by Spark SQL (their twin), and "
        f"the per-delivery rules in Java (spark/deliveryrules.py) or in Spark SQL (their twin). "
        f"Seconds are the whole command (JVM start "
        f"included); the job's own seconds are split into its phases ({_phase_names(r)}). Memory is the peak "
        f"resident set of the whole process tree (Python driver + JVM), "
        f"sampled every 0.2 s. One run each; `--lock` keeps other benchmarks off the machine, not everything "
        f"else, so on a shared machine seconds vary by 10–15 % from run to run (memory does not).",
        "",
        "| input | files | size on disk | reads | command seconds | job seconds (phases) "
        "| peak memory (process tree) | verdict | matches the truth |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for form, size, files in (
        ("json", r["json_bytes"], r.get("json_files")),
        ("parquet", r["parquet_bytes"], r.get("parquet_files")),
    ):
        x = r[form]
        verdict = (
            "proven clean"
            if x["proven_clean"]
            else f"NOT clean: {x['verdict']}"
            if x.get("verdict")
            else f"failed (exit {x['rc']})"
        )
        lines.append(
            f"| {'JSON lines' if form == 'json' else 'Parquet (zstd)'} | {files or '?'} | {_mb(size)} | "
            f"{_reads(x.get('first_read'), x.get('rules'))} | {x['seconds']:.0f} | {x['job_seconds'] or 0:.0f} ({_phases(x)}) | "
            f"{_gb(x['peak_rss'])} | "
            f"{verdict} | {'yes' if x.get('matches_truth') else '**no**'} |"
        )
    saved = r["json"]["seconds"] - r["parquet"]["seconds"]
    gen = (
        f"Generating the logs {'(by an earlier run of this command) ' if g.get('earlier') else ''}took "
        f"{g['seconds']:.0f} s (peak {_gb(g['peak_rss'])}): {_mb(r['json_bytes'])} "
        f"of router logs plus {_mb(r.get('ledger_bytes', 0))} of client ledgers."
        if g
        else f"The logs were already there (not regenerated); the ledgers are {_mb(r.get('ledger_bytes', 0))}."
    )
    x, small = r["json"], r.get("small")
    met = x["seconds"] <= TARGET_SECONDS and x["peak_rss"] <= TARGET_BYTES
    lines += [
        "",
        f"Target (issue 15): {TARGET_SECONDS} s and {_gb(TARGET_BYTES)} for 10 M events from JSON lines: "
        f"{x['seconds']:.0f} s and {_gb(x['peak_rss'])}, **{'met' if met else 'not met'}**.",
    ]
    if small:
        lines += [
            "",
            f"A small input, what a demo or a test leaves (target {SMALL_TARGET_SECONDS} s): "
            f"{small['events']:,} events (3 routers, {small['deliveries']:,} publisher deliveries, "
            f"ledgers) reconcile in {small['seconds']:.1f} s of command time, JVM start included "
            f"(job {small['job_seconds'] or 0:.1f} s: {_phases(small)}), peak {_gb(small['peak_rss'])}, "
            f"{'proven clean' if small['proven_clean'] else 'NOT clean'}; "
            f"**{'met' if small['seconds'] <= SMALL_TARGET_SECONDS else 'not met'}**.",
        ]
    lines += [
        "",
        gen + f" `eorouter logs compact` (JSON → Parquet, once) took {c['seconds']:.0f} s (peak "
        f"{_gb(c['peak_rss'])}). Parquet is {r['json_bytes'] / max(1, r['parquet_bytes']):.0f}× smaller on disk"
        + (
            f"; a reconciliation over it is {saved:.0f} s faster, so compacting pays for itself from the "
            f"{'first' if c['seconds'] < saved else 'second' if c['seconds'] < 2 * saved else 'third or later'} "
            f"reconciliation of the same logs on."
            if saved > 0
            else "; at this size it does not make the reconciliation faster."
        ),
        "",
        "Reproduce: `python -m spark bench --events 10000000 --write-docs` (generates into "
        "`/tmp/eorouter-bench-10000000/`, about 3.5 GB with the ledgers, unless it is already there; add "
        "`--lock FILE` to wait for other benchmarks). On a machine with less memory add "
        '`--conf spark.driver.memory=768m` (docs/reconcile.md, "Memory").',
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


def measure_main(argv: list[str]) -> int:
    """``python -m spark bench --measure -- CMD...``: run one command as the bench
    measures it (wall seconds, peak memory and CPU seconds of its process tree)."""
    import tempfile

    with tempfile.NamedTemporaryFile(suffix=".log", delete=False) as log:
        result = _measure(argv, Path(log.name))
    sys.stdout.write(Path(log.name).read_text(errors="replace"))
    print(
        f"bench: {result['seconds']:.1f} s wall, {result['cpu_seconds']:.1f} CPU s, peak "
        f"{_gb(result['peak_rss'])} (load average before: {result['load_before']:.1f})",
        file=sys.stderr,
    )
    return result["rc"]


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["--measure"]:
        return measure_main(argv[2:] if argv[1:2] == ["--"] else argv[1:])
    parser = argparse.ArgumentParser(prog="python -m spark bench", description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=10_000_000)
    parser.add_argument("--workdir", help="default /tmp/eorouter-bench-<events>")
    parser.add_argument("--master", default="local[2]")
    parser.add_argument("--conf", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--lock", metavar="FILE", help="hold an exclusive flock on FILE around each measured step")
    parser.add_argument("--write-docs", action="store_true", help="replace the section in docs/benchmarks.md")
    args = parser.parse_args(argv)
    args.argv = argv
    results = run(args)
    text = section(results)
    print(text)
    if args.write_docs:
        write_docs(text)
        print(f"bench: wrote the section into {DOCS}")
    ok = all(results[f]["rc"] in (0, 1) and results[f]["matches_truth"] for f in ("json", "parquet"))
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
