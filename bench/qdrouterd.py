"""qdrouterd (Apache Qpid Dispatch Router 1.19) as a target of `scripts/bench --qdrouterd` (bench/run.py):
how to build it when missing, its configuration file, how to tell it is listening, and the comparison
table eorouter / qdrouterd.

Targets are named ``qdrouterd-<N>``: a fresh qdrouterd per run with ``workerThreads: N`` (1.19's default is 4),
one listener on 127.0.0.1 port 0 (the port it got is in its "Listening on" log line), a multicast address
for the benchmark's topic prefix, no console or HTTP, logging at warning and above (the SERVER module at
notice, for the "Listening on" line). A multicast delivery from an unsettled publisher goes out unsettled
to every subscriber and its outcome goes back once every copy has a terminal one (src/router_core/delivery.c).

This module does not import bench.run (bench.run imports it)."""

from __future__ import annotations

import os
import re
import statistics
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PREFIX = Path("/opt/qdrouterd-1.19")
#: The build script beside the source tarball: ../shared/anchors from the repository.
BUILD_SCRIPT = ROOT.parent / "shared" / "anchors" / "build-qdrouterd.sh"
DEFAULT_THREADS = 4  # qdrouter.json: router.workerThreads default in 1.19

# "2026-11-26 06:07:34.947000 +0000 SERVER (notice) Listening on 127.0.0.1:39441 (listener/127.0.0.1:0)"
LISTEN_RE = re.compile(r"SERVER \(notice\) Listening on 127\.0\.0\.1:(\d+)")
TARGET_RE = re.compile(r"qdrouterd-(\d+)$")


class QdrouterdError(RuntimeError):
    pass


def is_target(target: str) -> bool:
    return TARGET_RE.match(target) is not None


def threads_of(target: str) -> int:
    """``qdrouterd-4`` -> 4."""
    m = TARGET_RE.match(target)
    if not m or int(m.group(1)) < 1:
        raise ValueError(f"not a qdrouterd target: {target!r} (qdrouterd-<worker threads>)")
    return int(m.group(1))


def config_text(threads: int, address_prefix: str) -> str:
    """qdrouterd's configuration: one attribute per line (its parser wants multi-line blocks)."""
    return (
        "router {\n    mode: standalone\n    id: bench\n"
        f"    workerThreads: {threads}\n}}\n"
        "listener {\n    host: 127.0.0.1\n    port: 0\n    role: normal\n"
        "    authenticatePeer: no\n    saslMechanisms: ANONYMOUS\n}\n"
        f"address {{\n    prefix: {address_prefix}\n    distribution: multicast\n}}\n"
        "log {\n    module: DEFAULT\n    enable: warning+\n}\n"
        "log {\n    module: SERVER\n    enable: notice+\n}\n"
    )


def listening_port(log_text: str) -> int | None:
    m = LISTEN_RE.search(log_text)
    return int(m.group(1)) if m else None


def command(prefix: Path, config: Path) -> tuple[list[str], dict[str, str]]:
    """The command line and environment (its Python management agent lives in PREFIX/pylib)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = str(prefix / "pylib")
    env.pop("PYTHONHOME", None)
    return [str(prefix / "sbin" / "qdrouterd"), "-c", str(config)], env


def ensure_built(prefix: Path = PREFIX, script: Path = BUILD_SCRIPT) -> Path:
    """PREFIX/sbin/qdrouterd, built with the anchors' script when missing (needs root: it installs Debian
    build packages). Raises QdrouterdError saying what to do otherwise."""
    binary = prefix / "sbin" / "qdrouterd"
    if binary.exists():
        return binary
    if not script.exists():
        raise QdrouterdError(f"{binary} is missing and so is the build script {script}")
    if os.geteuid() != 0:
        raise QdrouterdError(f"{binary} is missing; building it needs root: sudo bash {script} {prefix}")
    print(f"building qdrouterd 1.19 into {prefix} ({script}, about a minute) ...", flush=True)
    done = subprocess.run(["bash", str(script), str(prefix)], capture_output=True, text=True)
    if done.returncode != 0 or not binary.exists():
        out = (done.stdout + done.stderr).strip().splitlines()[-5:]
        raise QdrouterdError(f"building qdrouterd failed (exit {done.returncode}): " + " / ".join(out))
    return binary


def version(prefix: Path = PREFIX) -> str:
    try:
        cmd, env = command(prefix, Path("/dev/null"))
        out = subprocess.run([cmd[0], "--version"], env=env, capture_output=True, text=True, timeout=30)
        return out.stdout.strip() or out.stderr.strip() or "unknown"
    except (OSError, subprocess.SubprocessError):
        return "not built"


# ---------------------------------------------------------------------------------------------- report


def spread(by_repeat: dict) -> tuple[float, float, float] | None:
    """(min, median, max) of a cell's values, one per round; None without any."""
    vals = [v for v in by_repeat.values() if v is not None]
    return (min(vals), statistics.median(vals), max(vals)) if vals else None


def paired(a: dict, b: dict) -> list[float]:
    """a / b round by round (the repeats with the same index ran in the same interleaved round)."""
    keys = sorted(set(a) & set(b), key=str)
    return [a[i] / b[i] for i in keys if a[i] and b[i]]


def _f(v, spec: str = ".1f") -> str:
    return "—" if v is None else format(v, spec)


def _spread_text(s: tuple[float, float, float] | None, spec: str = ".1f") -> str:
    return "—" if s is None else f"{format(s[1], spec)} ({format(s[0], spec)}–{format(s[2], spec)})"


def comparison_rows(cells: dict[tuple, dict], qd_targets: list[str], clients: str = "c") -> list[dict]:
    """Per mode, K and qdrouterd target: both sides' CPU µs/msg and msgs/s spreads over the rounds and the
    eorouter / qdrouterd ratios: of the medians, of the minimums (each side's fastest round: qdrouterd's fast
    mode when it is bimodal), and the round-by-round range."""
    rows = []
    keys = sorted(
        {(k, m) for (t, c, k, m) in cells if c == clients and t == "eorouter"}, key=lambda x: (x[1] != "exactly-once", x[0])
    )
    for k, mode in keys:
        eo = cells[("eorouter", clients, k, mode)]
        for qt in qd_targets:
            qd = cells.get((qt, clients, k, mode))
            if qd is None:
                continue
            e_cpu, q_cpu = spread(eo.get("cpu_by_repeat") or {}), spread(qd.get("cpu_by_repeat") or {})
            pairs = paired(eo.get("cpu_by_repeat") or {}, qd.get("cpu_by_repeat") or {})
            rows.append(
                {
                    "mode": mode,
                    "k": k,
                    "qdrouterd": qt,
                    "eo_cpu": e_cpu,
                    "qd_cpu": q_cpu,
                    "eo_msgs": spread(eo.get("msgs_by_repeat") or {}),
                    "qd_msgs": spread(qd.get("msgs_by_repeat") or {}),
                    "ratio_median": e_cpu[1] / q_cpu[1] if e_cpu and q_cpu else None,
                    "ratio_min": e_cpu[0] / q_cpu[0] if e_cpu and q_cpu else None,
                    "pairs": (min(pairs), max(pairs)) if pairs else None,
                    "ok": f"{eo['ok_runs']}/{eo['runs']}, {qd['ok_runs']}/{qd['runs']}",
                    "notes": "; ".join(qd.get("problems", []) + qd.get("warnings", []) + eo.get("problems", [])),
                }
            )
    return rows


def comparison_markdown(rows: list[dict]) -> str:
    lines = [
        "| mode | K | qdrouterd threads | eorouter CPU µs/msg | qdrouterd CPU µs/msg | eorouter / qdrouterd, medians "
        "| … minimums | … round by round | eorouter msgs/s | qdrouterd msgs/s | runs ok (eo, qd) | notes |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        pairs = "—" if r["pairs"] is None else f"{r['pairs'][0]:.2f}–{r['pairs'][1]:.2f}"
        notes = " ".join(r["notes"].split()).replace("|", "/")[:160]
        lines.append(
            f"| {r['mode']} | {r['k']} | {threads_of(r['qdrouterd'])} | {_spread_text(r['eo_cpu'])} "
            f"| {_spread_text(r['qd_cpu'])} | **{_f(r['ratio_median'], '.2f')}×** | {_f(r['ratio_min'], '.2f')}× "
            f"| {pairs} | {_spread_text(r['eo_msgs'], ',.0f')} | {_spread_text(r['qd_msgs'], ',.0f')} "
            f"| {r['ok']} | {notes} |"
        )
    lines += [
        "",
        "Each value: median over the rounds (min–max). Ratios are eorouter's CPU per message over qdrouterd's: "
        "of the medians, of each side's fastest round, and the range of the ratios of runs of the same round.",
    ]
    return "\n".join(lines)


def print_comparison(rows: list[dict]) -> None:
    print("eorouter beside qdrouterd (router CPU µs/msg: median (min–max) over rounds; ratio eorouter/qdrouterd)")
    for r in rows:
        pairs = "—" if r["pairs"] is None else f"{r['pairs'][0]:.2f}–{r['pairs'][1]:.2f}"
        print(
            f"{r['mode']:12} K={r['k']:<3} {threads_of(r['qdrouterd'])} thr  eorouter {_spread_text(r['eo_cpu']):24} "
            f"qdrouterd {_spread_text(r['qd_cpu']):24} ratio {_f(r['ratio_median'], '.2f')}x "
            f"(min/min {_f(r['ratio_min'], '.2f')}x, rounds {pairs})  msgs/s {_spread_text(r['eo_msgs'], ',.0f')} vs "
            f"{_spread_text(r['qd_msgs'], ',.0f')}  {r['notes'][:80]}"
        )
