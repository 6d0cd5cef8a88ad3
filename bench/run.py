"""eorouter benchmark (`scripts/bench`, i.e. `python -m bench.run`).

For each of K = 1, 4, 16 subscribers x {exactly-once (unsettled publisher), best-effort (pre-settled)} x
{C clients, Python clients}, through a fresh eorouter process and through the baseline (the Qpid Proton C
example broker adapted to fan-out, bench/cclients/broker.c), it measures:
  - msgs/s at the subscribers: messages published / (last receive at any subscriber - first send);
  - p50 / p99 latency (receive time - send time embedded in the body; median of the subscribers' p50,
    highest of their p99); under saturation, with a 1000-message window, this is mostly queueing;
  - the server's CPU per message published: utime+stime from /proc/<pid>/stat over the active window
    (subscribers attached -> every client done), divided by the messages published;
  - the server's RSS (VmRSS) before and after.
Runs are interleaved (every cell once, then again for --repeat) and medians are reported.

Network paths (`--hops`, default 0,1,2): a line of hops+1 routers started with eorouter_tools.topology's
RouterNetwork (one router for 0 hops), the publisher on the first router, one subscriber (K=1) on the
last, exactly-once, C clients: msgs/s, p50/p99 latency and each router's CPU per message, run in the
same interleaved repeats as the matrix.

`--qdrouterd` (bench/qdrouterd.py): eorouter beside qdrouterd 1.19 (targets qdrouterd-N, N worker threads; a
multicast address, the same C clients and message counts), K = 1, 4, 16, 64, 5 rounds, with each cell's spread over
the rounds and the ratios eorouter / qdrouterd.

`--memory-run N` instead pushes N messages through K=1 exactly-once with C clients and samples the
router's RSS every second, reporting growth.

Results: a table on stdout, JSON in bench-out/, and with --write-docs the generated blocks of
docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import platform
import re
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from bench import qdrouterd as qdr
from eorouter_tools.build import BuildError, build_c_clients

ROOT = Path(__file__).resolve().parent.parent
OUT_DIR = ROOT / "bench-out"
DOCS = ROOT / "docs" / "benchmarks.md"
CLK_TCK = os.sysconf("SC_CLK_TCK")
PAGE = os.sysconf("SC_PAGE_SIZE")

# "eorouter: router <id> ready on [<role>=]<host>:<port>[,[<role>=]<host>:<port>...] epoch <n>"
READY_RE = re.compile(r"eorouter: router (\S+) ready on (\S+) epoch (\d+)")


def normal_listener_port(listeners: str) -> int:
    """The port of the first client ("normal", or unlabelled) listener in a ready line's list."""
    for item in listeners.split(","):
        role, _, addr = item.rpartition("=")
        if role in ("", "normal"):
            return int(addr.rsplit(":", 1)[1])
    raise StartError(f"no client listener in the ready line: {listeners}")


LISTEN_RE = re.compile(r"listening on (\d+)")

MODES = {"exactly-once": "unsettled", "best-effort": "presettled"}

# Targets (issue 2, item 13)
TARGET_CPU_K1_EO_US = 25.0
TARGET_EO_OVER_BE = 2.0
TARGET_RSS_GROWTH_MIB = 5.0


# ---------------------------------------------------------------------------------------------- /proc


def proc_cpu_ticks(pid: int) -> int:
    """utime + stime of the whole process (all threads), in clock ticks."""
    with open(f"/proc/{pid}/stat") as f:
        s = f.read()
    fields = s[s.rindex(")") + 2 :].split()
    return int(fields[11]) + int(fields[12])  # fields 14, 15 of proc(5)


def proc_rss_kib(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


# ---------------------------------------------------------------------------------------------- processes


def wait_all(procs: list[subprocess.Popen], timeout: float) -> None:
    """Wait for every process, killing those still running after ``timeout`` seconds in all."""
    deadline = time.monotonic() + timeout
    for p in procs:
        try:
            p.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def wait_for(path: Path, pattern: re.Pattern, proc: subprocess.Popen, timeout: float, what: str) -> re.Match:
    deadline = time.monotonic() + timeout
    while True:
        try:
            text = path.read_text(errors="replace")
        except FileNotFoundError:
            text = ""
        m = pattern.search(text)
        if m:
            return m
        if proc.poll() is not None:
            raise StartError(f"{what} exited with code {proc.returncode} before it was ready: {tail(path, 1)}")
        if time.monotonic() > deadline:
            raise StartError(f"{what} not ready after {timeout:.0f} s: {tail(path, 1)}")
        time.sleep(0.02)


class StartError(RuntimeError):
    pass


def tail(path: Path, n: int = 25) -> str:
    try:
        lines = path.read_text(errors="replace").splitlines()
    except FileNotFoundError:
        return "(no output)"
    return "\n".join(lines[-n:])


def stop_process(p: subprocess.Popen, grace: float) -> tuple[int | None, float]:
    """SIGTERM, wait up to `grace` s, then SIGKILL. Returns (exit code, seconds to exit)."""
    if p.poll() is not None:
        return p.returncode, 0.0
    t0 = time.monotonic()
    p.send_signal(signal.SIGTERM)
    try:
        p.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        p.kill()
        p.wait()
        return None, time.monotonic() - t0
    return p.returncode, time.monotonic() - t0


@dataclass
class Server:
    kind: str  # "eorouter" | "baseline" | "qdrouterd-<threads>" (bench/qdrouterd.py)
    proc: subprocess.Popen
    port: int
    log: Path
    info: dict = field(default_factory=dict)


# A [policy] the benchmark's anonymous clients pass (bench.tls: what authorization costs).
_BENCH_POLICY = (
    '\n[policy]\ndefault_group = "bench"\n[policy.groups.bench]\npublish = ["bench/#"]\nsubscribe = ["bench/#"]\n'
    "max_connections = 100\nmax_links = 100\nmax_message_size = 1048576\n"
)


def router_config(tmp: Path, args: argparse.Namespace) -> Path:
    cfg = tmp / "router.toml"
    cfg.write_text(
        "[router]\n"
        'id = "bench"\n'
        f'data_dir = "{tmp / "data"}"\n'
        "\n[[listener]]\n"
        'host = "127.0.0.1"\n'
        "port = 0\n"
        + (f'tls_cert_file = "{args.tls["cert"]}"\ntls_key_file = "{args.tls["key"]}"\n' if getattr(args, "tls", None) else "")
        + "\n[limits]\n"
        f"max_in_flight_per_topic = {args.max_in_flight}\n"
        f"publisher_credit_window = {args.credit_window}\n"
        "\n[eventlog]\n"
        f"fsync = {'true' if args.fsync else 'false'}\n"
        + ("\n[metrics]\nport = 0\n" if getattr(args, "metrics", False) else "")
        + (_BENCH_POLICY if getattr(args, "policy", False) else "")
    )
    return cfg


def metrics_port(listeners: str) -> int | None:
    """The port of the metrics listener in a ready line's list (None: no [metrics])."""
    for item in listeners.split(","):
        role, _, addr = item.rpartition("=")
        if role == "metrics":
            return int(addr.rsplit(":", 1)[1])
    return None


class Scraper:
    """GET /metrics every ``every`` seconds while a run lasts, as a Prometheus
    server would (bench.metrics: what metrics cost the router)."""

    def __init__(self, port: int, every: float = 1.0):
        import threading

        self.url = f"http://127.0.0.1:{port}/metrics"
        self.every = every
        self.scrapes = 0
        self.failures = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Scraper:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(5)

    def _run(self) -> None:
        import urllib.request

        while True:  # at once, then every ``every`` seconds
            try:
                with urllib.request.urlopen(self.url, timeout=5) as r:
                    r.read()
                self.scrapes += 1
            except OSError:
                self.failures += 1
            if self._stop.wait(self.every):
                return


def start_qdrouterd(kind: str, tmp: Path, args: argparse.Namespace) -> Server:
    """A fresh qdrouterd with ``kind``'s worker threads, a multicast address for the benchmark's topics."""
    log = tmp / f"{kind}.log"
    cfg = tmp / "qdrouterd.conf"
    cfg.write_text(qdr.config_text(qdr.threads_of(kind), "bench"))
    cmd, env = qdr.command(args.qdrouterd_prefix, cfg)
    with open(log, "wb") as out:
        p = subprocess.Popen(cmd, cwd=tmp, env=env, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    try:
        m = wait_for(log, qdr.LISTEN_RE, p, args.server_timeout, kind)
    except Exception:
        stop_process(p, 2)
        raise
    return Server(kind, p, int(m.group(1)), log, {"command": shlex.join(cmd), "config": cfg.read_text()})


def start_server(kind: str, tmp: Path, args: argparse.Namespace, bins: dict[str, Path]) -> Server:
    if qdr.is_target(kind):
        return start_qdrouterd(kind, tmp, args)
    log = tmp / f"{kind}.log"
    with open(log, "wb") as out:
        if kind == "eorouter":
            cfg = router_config(tmp, args)
            cmd = [sys.executable, "-m", "router", "run", "--config", str(cfg)]
            p = subprocess.Popen(cmd, cwd=args.router_root, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
            try:
                m = wait_for(log, READY_RE, p, args.server_timeout, "eorouter")
            except Exception:
                stop_process(p, 2)
                raise
            return Server(
                kind,
                p,
                normal_listener_port(m.group(2)),
                log,
                {
                    "router_id": m.group(1),
                    "epoch": int(m.group(3)),
                    "command": shlex.join(cmd),
                    "config": cfg.read_text(),
                    "metrics_port": metrics_port(m.group(2)),
                },
            )
        cmd = [str(bins["broker"]), "127.0.0.1", "0", str(args.broker_threads)]
        p = subprocess.Popen(cmd, cwd=tmp, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        try:
            m = wait_for(log, LISTEN_RE, p, args.server_timeout, "baseline broker")
        except Exception:
            stop_process(p, 2)
            raise
        return Server(kind, p, int(m.group(1)), log, {"command": shlex.join(cmd)})


def client_cmd(
    role: str,
    clients: str,
    bins: dict[str, Path],
    port: int,
    address: str,
    count: int,
    opts: list[str],
    tls_ca: str | None = None,
) -> list[str]:
    if clients == "c":
        if tls_ca:  # TLS checks the server's name: the certificate's, not an IP address
            return [str(bins[role]), *opts, "-T", tls_ca, "localhost", str(port), address, str(count)]
        return [str(bins[role]), *opts, "127.0.0.1", str(port), address, str(count)]
    return [sys.executable, "-m", "bench.pyclients", role, *opts, "127.0.0.1", str(port), address, str(count)]


def read_json_line(path: Path) -> dict | None:
    try:
        for line in reversed(path.read_text(errors="replace").splitlines()):
            line = line.strip()
            if line.startswith("{"):
                return json.loads(line)
    except (FileNotFoundError, json.JSONDecodeError):
        pass
    return None


# ---------------------------------------------------------------------------------------------- one run


def run_one(kind: str, clients: str, k: int, mode: str, n: int, args: argparse.Namespace, bins: dict[str, Path]) -> dict:
    tmp = Path(tempfile.mkdtemp(prefix=f"eobench-{kind}-"))
    result: dict = {"target": kind, "clients": clients, "k": k, "mode": mode, "messages": n}
    procs: list[subprocess.Popen] = []
    server: Server | None = None
    try:
        if kind in args.broken_targets:
            raise StartError(f"skipped: {kind} did not start earlier ({args.broken_targets[kind]})")
        try:
            server = start_server(kind, tmp, args, bins)
        except StartError as e:
            args.broken_targets.setdefault(kind, str(e)[:200])
            raise
        result["server"] = {k2: v for k2, v in server.info.items() if k2 != "config"}
        address = "bench/topic"
        tls_ca = args.tls["ca"] if getattr(args, "tls", None) else None
        receivers = []
        for i in range(k):
            out, err = tmp / f"recv{i}.out", tmp / f"recv{i}.err"
            cmd = client_cmd(
                "receive",
                clients,
                bins,
                server.port,
                address,
                n,
                [
                    "-w",
                    str(args.window),
                    "-t",
                    str(args.client_timeout if mode == "exactly-once" else args.be_idle),
                    "-c",
                    f"bench-sub-{i}",
                    "-l",
                    f"bench-sub-{i}",
                ],
                tls_ca=tls_ca,
            )
            with open(out, "wb") as fo, open(err, "wb") as fe:
                p = subprocess.Popen(cmd, cwd=ROOT, stdout=fo, stderr=fe, stdin=subprocess.DEVNULL)
            procs.append(p)
            receivers.append((p, out, err))
        for i, (p, _out, err) in enumerate(receivers):
            wait_for(err, re.compile(r"^ready$", re.M), p, args.server_timeout, f"subscriber {i}")
        time.sleep(0.1)  # let the attach settle in the server before the window opens

        pid = server.proc.pid
        rss0 = proc_rss_kib(pid)
        cpu0 = proc_cpu_ticks(pid)
        t0 = time.monotonic()
        s_out, s_err = tmp / "send.out", tmp / "send.err"
        cmd = client_cmd(
            "send",
            clients,
            bins,
            server.port,
            address,
            n,
            [
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
            ],
            tls_ca=tls_ca,
        )
        with open(s_out, "wb") as fo, open(s_err, "wb") as fe:
            sender = subprocess.Popen(cmd, cwd=ROOT, stdout=fo, stderr=fe, stdin=subprocess.DEVNULL)
        procs.append(sender)
        scraper = Scraper(server.info["metrics_port"]) if server.info.get("metrics_port") else None
        if scraper is not None:
            with scraper:
                wait_all(procs, args.run_timeout)
            result["scrapes"], result["scrape_failures"] = scraper.scrapes, scraper.failures
        else:
            wait_all(procs, args.run_timeout)
        t1 = time.monotonic()
        server_alive = server.proc.poll() is None
        cpu1 = proc_cpu_ticks(pid) if server_alive else None
        rss1 = proc_rss_kib(pid) if server_alive else None

        send = read_json_line(s_out) or {}
        recvs = [read_json_line(out) or {} for _p, out, _e in receivers]
        result.update(collect(n, k, mode, send, recvs, cpu0, cpu1, rss0, rss1, t1 - t0))
        result["client_exit_codes"] = [p.returncode for p in procs]
        if not server_alive:
            result["problems"].append(f"server died (exit {server.proc.returncode})")
        errs = [tail(e, 3) for _p, _o, e in receivers if e.stat().st_size > len("ready\n")]
        if s_err.stat().st_size:
            errs.append(tail(s_err, 3))
        if errs:
            result["client_stderr"] = errs[:4]
        code, secs = stop_process(server.proc, args.stop_grace)
        result["server_exit"] = code
        result["server_stop_s"] = round(secs, 2)
        if kind == "eorouter" and code != 0:
            result["problems"].append(
                f"router exit {code} on SIGTERM"
                if code is not None
                else f"router did not exit {args.stop_grace:.0f} s after SIGTERM (killed)"
            )
        if result["problems"] or (kind == "eorouter" and code != 0):
            result["server_log_tail"] = tail(server.log, 30)
    except Exception as e:  # a failed run is a result, not the end of the benchmark
        result.setdefault("problems", []).append(f"error: {' '.join(str(e).split())[:300]}")
        if server is not None:
            result["server_log_tail"] = tail(server.log, 30)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
        if server is not None and server.proc.poll() is None:
            stop_process(server.proc, 2)
        if not args.keep:
            shutil.rmtree(tmp, ignore_errors=True)
        else:
            result["tmp"] = str(tmp)
    result["ok"] = not result.get("problems")
    return result


def collect(
    n: int,
    k: int,
    mode: str,
    send: dict,
    recvs: list[dict],
    cpu0: int,
    cpu1: int | None,
    rss0: int,
    rss1: int | None,
    wall: float,
) -> dict:
    problems: list[str] = []
    sent = send.get("sent", 0)
    counts = [r.get("count", 0) for r in recvs]
    got = [r for r in recvs if r.get("count")]
    start = send.get("start_ns") or 0
    last = max((r.get("last_ns", 0) for r in got), default=0)
    secs = (last - start) / 1e9 if start and last > start else None
    mean_count = sum(counts) / len(counts) if counts else 0
    r: dict = {
        "sent": sent,
        "received": counts,
        "outcomes": {x: send.get(x, 0) for x in ("accepted", "rejected", "released", "modified", "other")},
        "wall_s": round(wall, 3),
        "active_s": round(secs, 4) if secs else None,
        "msgs_per_s": round(mean_count / secs, 1) if secs else None,
        "deliveries_per_s": round(sum(counts) / secs, 1) if secs else None,
        "p50_us": statistics.median(r2.get("p50_us", 0) for r2 in got) if got else None,
        "p99_us": max(r2.get("p99_us", 0) for r2 in got) if got else None,
        "max_us": max(r2.get("max_us", 0) for r2 in got) if got else None,
        "rss_before_kib": rss0,
        "rss_after_kib": rss1,
        "dups": sum(r2.get("dups", 0) for r2 in recvs),
        "out_of_order": sum(r2.get("out_of_order", 0) for r2 in recvs),
    }
    if cpu1 is not None and sent:
        cpu_us = (cpu1 - cpu0) * 1e6 / CLK_TCK
        r["server_cpu_s"] = round(cpu_us / 1e6, 3)
        r["cpu_us_per_msg"] = round(cpu_us / sent, 2)
        r["cpu_us_per_delivery"] = round(cpu_us / (sent * k), 2)
        r["cpu_ticks"] = cpu1 - cpu0
        if cpu1 - cpu0 < 20:
            r.setdefault("warnings", []).append(f"CPU ±{100 / max(1, cpu1 - cpu0):.0f}% ({cpu1 - cpu0} ticks)")
    if not send:
        problems.append("publisher printed no summary")
    elif send.get("timed_out"):
        problems.append(f"publisher stalled (sent {sent}, outcomes {sum(r['outcomes'].values())})")
    elif send.get("error"):
        problems.append(f"publisher error: {send['error']}")
    if sent != n:
        problems.append(f"published {sent}/{n}")
    if mode == "exactly-once" and send:
        acc = send.get("accepted", 0)
        if acc != n:
            problems.append("outcomes " + ", ".join(f"{x} {v}" for x, v in r["outcomes"].items() if v))
    lost = [n - c for c in counts if c != n]
    r["lost"] = sum(lost)
    r["loss_pct"] = round(100.0 * sum(lost) / (n * k), 2) if n and k else 0.0
    if mode == "best-effort" and lost and send and not send.get("timed_out") and sent == n:
        # best-effort may drop (the router forwards a pre-settled message only to subscribers with credit)
        r.setdefault("warnings", []).append(f"lost {r['loss_pct']:.1f}% of copies")
    else:
        if lost:
            problems.append(f"{len(lost)}/{k} subscribers short by {min(lost)}..{max(lost)}")
        if any(r2.get("timed_out") for r2 in recvs):
            problems.append("subscriber stalled")
    if len(got) < len(recvs) and not lost:
        problems.append("subscriber printed no summary")
    if r["dups"]:
        problems.append(f"{r['dups']} duplicates")
    if r["out_of_order"]:
        problems.append(f"{r['out_of_order']} out of order")
    for r2 in recvs:
        if r2.get("error"):
            problems.append(f"subscriber error: {r2['error']}")
            break
    r["problems"] = problems
    return r


# ---------------------------------------------------------------------------------------------- matrix


def median_cell(runs: list[dict]) -> dict:
    keys = (
        "msgs_per_s",
        "deliveries_per_s",
        "p50_us",
        "p99_us",
        "cpu_us_per_msg",
        "cpu_us_per_delivery",
        "rss_before_kib",
        "rss_after_kib",
        "loss_pct",
    )
    cell = {k: runs[0][k] for k in ("target", "clients", "k", "mode", "messages")}
    for key in keys:
        vals = [r[key] for r in runs if r.get(key) is not None]
        cell[key] = statistics.median(vals) if vals else None
    cell["runs"] = len(runs)
    # Each repeat's CPU: the repeats of two cells with the same index ran in the same
    # round of the interleaving, seconds apart, so their ratio shares the VM's state.
    cell["cpu_by_repeat"] = {
        r["repeat"]: r["cpu_us_per_msg"] for r in runs if r.get("cpu_us_per_msg") and r.get("repeat") is not None
    }
    cell["msgs_by_repeat"] = {r["repeat"]: r["msgs_per_s"] for r in runs if r.get("msgs_per_s") and r.get("repeat") is not None}
    cell["ok_runs"] = sum(1 for r in runs if r["ok"])
    cell["problems"] = sorted({p for r in runs for p in r.get("problems", [])})
    cpu_warn = sorted({w for r in runs for w in r.get("warnings", []) if w.startswith("CPU")})
    cell["warnings"] = cpu_warn[:1]
    if cell.get("loss_pct"):
        cell["warnings"].insert(0, f"best-effort lost {cell['loss_pct']:.1f}% of copies (median)")
    return cell


def paired_ratios(a: dict, b: dict) -> list[float]:
    """Cell ``a``'s CPU over cell ``b``'s, repeat by repeat (the same interleaving round)."""
    ra, rb = a.get("cpu_by_repeat") or {}, b.get("cpu_by_repeat") or {}
    return [round(ra[i] / rb[i], 2) for i in sorted(set(ra) & set(rb))]


def pairs_text(pairs: list[float] | None) -> str:
    """'1.52–1.98' (median 1.61) for several pairs; '' for fewer than two."""
    if not pairs or len(pairs) < 2:
        return ""
    return f"{min(pairs):.2f}–{max(pairs):.2f} (median {statistics.median(pairs):.2f})"


def compute_ratios(cells: dict[tuple, dict]) -> list[dict]:
    out = []
    for (target, clients, k, mode), c in sorted(cells.items()):
        if mode != "exactly-once":
            continue
        be = cells.get((target, clients, k, "best-effort"))
        row = {"target": target, "clients": clients, "k": k}
        low = lambda cell: bool(cell and any(w.startswith("CPU") for w in cell.get("warnings", [])))  # noqa: E731
        if be and c.get("cpu_us_per_msg") and be.get("cpu_us_per_msg"):
            row["eo_over_be_cpu"] = round(c["cpu_us_per_msg"] / be["cpu_us_per_msg"], 2)
            row["eo_over_be_low_res"] = low(c) or low(be)
            pairs = paired_ratios(c, be)
            if pairs:
                row["eo_over_be_pairs"] = pairs
        if target == "eorouter":
            for m in MODES:
                a = cells.get(("eorouter", clients, k, m))
                b = cells.get(("baseline", clients, k, m))
                if a and b and a.get("cpu_us_per_msg") and b.get("cpu_us_per_msg"):
                    row[f"eorouter_over_baseline_cpu_{m}"] = round(a["cpu_us_per_msg"] / b["cpu_us_per_msg"], 2)
                    row[f"eorouter_over_baseline_low_res_{m}"] = low(a) or low(b)
            k1 = cells.get((target, clients, 1, mode))
            if k > 1 and k1 and k1.get("cpu_us_per_msg") and c.get("cpu_us_per_msg"):
                row["eo_us_per_extra_copy"] = round((c["cpu_us_per_msg"] - k1["cpu_us_per_msg"]) / (k - 1), 2)
        out.append(row)
    return out


def evaluate_targets(cells: dict[tuple, dict], memory: dict | None) -> list[dict]:
    t: list[dict] = []
    c = cells.get(("eorouter", "c", 1, "exactly-once"))
    v = c.get("cpu_us_per_msg") if c else None
    t.append(
        {
            "target": f"router CPU per message, K=1 exactly-once, C clients <= {TARGET_CPU_K1_EO_US:g} µs",
            "value": f"{v:.1f} µs" if v is not None else "not measured",
            "pass": None if v is None else (v <= TARGET_CPU_K1_EO_US and c["ok_runs"] == c["runs"]),
        }
    )
    for k in sorted({key[2] for key in cells if key[0] == "eorouter" and key[1] == "c"}):
        eo = cells.get(("eorouter", "c", k, "exactly-once"))
        be = cells.get(("eorouter", "c", k, "best-effort"))
        if eo and be and eo.get("cpu_us_per_msg") and be.get("cpu_us_per_msg"):
            ratio = eo["cpu_us_per_msg"] / be["cpu_us_per_msg"]
            pairs = pairs_text(paired_ratios(eo, be))
            t.append(
                {
                    "target": f"exactly-once <= {TARGET_EO_OVER_BE:g}x best-effort CPU, K={k}, C clients",
                    "value": f"{ratio:.2f}x ({eo['cpu_us_per_msg']:.1f} / {be['cpu_us_per_msg']:.1f} µs)"
                    + (f"; round by round {pairs}" if pairs else ""),
                    "pass": ratio <= TARGET_EO_OVER_BE,
                }
            )
    if memory is not None:
        t.append(memory_target(memory))
    return t


def memory_target(m: dict) -> dict:
    g = m.get("growth_mib")
    return {
        "target": f"no RSS growth over a {m['messages']:,}-message K=1 exactly-once run "
        f"(<= {TARGET_RSS_GROWTH_MIB:g} MiB after warm-up)",
        "value": (f"{g:+.1f} MiB ({m['rss_warm_mib']:.1f} -> {m['rss_end_mib']:.1f} MiB, peak {m['rss_peak_mib']:.1f})")
        if g is not None
        else "not measured",
        "pass": None if g is None else (g <= TARGET_RSS_GROWTH_MIB and m.get("ok", False)),
    }


# ---------------------------------------------------------------------------------------------- memory run


def memory_run(n: int, args: argparse.Namespace, bins: dict[str, Path]) -> dict:
    kind = args.memory_target
    tmp = Path(tempfile.mkdtemp(prefix=f"eobench-mem-{kind}-"))
    procs: list[subprocess.Popen] = []
    server = None
    res: dict = {"target": kind, "messages": n, "k": 1, "mode": "exactly-once", "clients": "c", "samples": [], "problems": []}
    try:
        server = start_server(kind, tmp, args, bins)
        pid = server.proc.pid
        address = "bench/memory"
        r_out, r_err = tmp / "recv.out", tmp / "recv.err"
        with open(r_out, "wb") as fo, open(r_err, "wb") as fe:
            rp = subprocess.Popen(
                client_cmd(
                    "receive",
                    "c",
                    bins,
                    server.port,
                    address,
                    n,
                    ["-w", str(args.window), "-t", str(args.client_timeout), "-c", "bench-sub-0", "-l", "bench-sub-0"],
                ),
                stdout=fo,
                stderr=fe,
                stdin=subprocess.DEVNULL,
            )
        procs.append(rp)
        wait_for(r_err, re.compile(r"^ready$", re.M), rp, args.server_timeout, "subscriber")
        time.sleep(0.1)
        rss0, cpu0, t0 = proc_rss_kib(pid), proc_cpu_ticks(pid), time.monotonic()
        res["rss_idle_kib"] = rss0
        s_out = tmp / "send.out"
        with open(s_out, "wb") as fo, open(tmp / "send.err", "wb") as fe:
            sp = subprocess.Popen(
                client_cmd(
                    "send",
                    "c",
                    bins,
                    server.port,
                    address,
                    n,
                    [
                        "-m",
                        "unsettled",
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
                    ],
                ),
                stdout=fo,
                stderr=fe,
                stdin=subprocess.DEVNULL,
            )
        procs.append(sp)
        next_t = t0 + 1.0
        print(f"memory run: {n:,} messages through {kind}, K=1 exactly-once; RSS every second", file=sys.stderr)
        while sp.poll() is None or rp.poll() is None:
            if server.proc.poll() is not None:
                res["problems"].append(f"server died (exit {server.proc.returncode})")
                break
            now = time.monotonic()
            if now >= next_t:
                rss = proc_rss_kib(pid)
                cpu = proc_cpu_ticks(pid)
                res["samples"].append([round(now - t0, 2), rss, round((cpu - cpu0) / CLK_TCK, 2)])
                if len(res["samples"]) % 10 == 0:
                    print(
                        f"  t={now - t0:5.0f} s  RSS {rss / 1024:7.1f} MiB  router CPU {(cpu - cpu0) / CLK_TCK:6.1f} s",
                        file=sys.stderr,
                    )
                next_t += 1.0
            if now - t0 > args.memory_timeout:
                res["problems"].append(f"not finished after {args.memory_timeout:.0f} s")
                break
            time.sleep(0.05)
        for p in procs:
            try:
                p.wait(timeout=5)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        t1 = time.monotonic()
        if server.proc.poll() is None:
            res["rss_after_kib"] = proc_rss_kib(pid)
            cpu1 = proc_cpu_ticks(pid)
        else:
            cpu1 = None
        send = read_json_line(s_out) or {}
        recv = read_json_line(r_out) or {}
        part = collect(n, 1, "exactly-once", send, [recv], cpu0, cpu1, rss0, res.get("rss_after_kib"), t1 - t0)
        res["problems"] += part.pop("problems")
        res.update(
            {
                k: part[k]
                for k in ("sent", "received", "outcomes", "msgs_per_s", "p50_us", "p99_us", "cpu_us_per_msg", "active_s")
                if k in part
            }
        )
        # growth: RSS at the end of the warm-up (the first half of the samples) vs the last samples.
        # The router's bounded memories fill by message count, not time: the settled-tag
        # memory (per stream, max_in_flight_per_topic to twice that many tags) and the allocator's reuse of
        # its discarded generations settle within ~300 k messages, so a cut at 10 % of
        # 1 M counted that filling as growth. A leak still shows: 10 B per message is
        # +4.8 MiB over the second half of 1 M, and the slope is reported beside it.
        s = res["samples"]
        if len(s) >= 4:
            warm_i = len(s) // 2
            warm = s[warm_i][1]
            end = statistics.median(x[1] for x in s[-3:])
            res["rss_warm_mib"] = round(warm / 1024, 2)
            res["rss_end_mib"] = round(end / 1024, 2)
            res["rss_peak_mib"] = round(max(x[1] for x in s) / 1024, 2)
            res["growth_mib"] = round((end - warm) / 1024, 2)
            sent_after_warm = n * (1 - s[warm_i][0] / max(s[-1][0], 1e-9))
            res["growth_bytes_per_msg"] = round((end - warm) * 1024 / max(sent_after_warm, 1), 2)
            xs = [x[0] for x in s[warm_i:]]
            ys = [x[1] / 1024 for x in s[warm_i:]]
            if len(xs) >= 2 and max(xs) > min(xs):
                mx, my = statistics.fmean(xs), statistics.fmean(ys)
                slope = sum((a - mx) * (b - my) for a, b in zip(xs, ys)) / sum((a - mx) ** 2 for a in xs)
                res["slope_mib_per_min"] = round(slope * 60, 3)
        else:
            res["problems"].append("too few RSS samples (run shorter than 4 s): use more messages")
        code, secs = stop_process(server.proc, args.stop_grace)
        res["server_exit"] = code
        if kind == "eorouter" and code != 0:
            res["problems"].append(f"router exit {code} on SIGTERM")
    except Exception as e:
        res["problems"].append(f"error: {' '.join(str(e).split())[:300]}")
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
        if res["problems"] and server is not None:
            res["server_log_tail"] = tail(server.log, 30)
        if server is not None and server.proc.poll() is None:
            stop_process(server.proc, 2)
        if not args.keep:
            shutil.rmtree(tmp, ignore_errors=True)
    res["ok"] = not res["problems"]
    return res


# ---------------------------------------------------------------------------------------------- network paths


def line_topology(routers: int) -> str:
    """A line of ``routers`` routers, A - B - C ..., as a eorouter_tools.topology file."""
    ids = [chr(ord("A") + i) for i in range(routers)]
    text = "".join(f'[[router]]\nid = "{r}"\n' for r in ids)
    return text + "".join(f'[[link]]\nbetween = ["{a}", "{b}"]\n' for a, b in zip(ids, ids[1:]))


def topology_module(args: argparse.Namespace):
    """eorouter_tools.topology from the code under test (the snapshot): its RouterNetwork starts the routers
    with that copy of the package on their PYTHONPATH."""
    root = str(args.router_root)
    if root not in sys.path:
        sys.path.insert(0, root)
    from eorouter_tools import topology

    return topology


def network_overrides(args: argparse.Namespace) -> dict:
    """The matrix's router settings, over eorouter_tools.launcher's defaults (RouterNetwork's configs)."""
    return {
        "limits": {"max_in_flight_per_topic": args.max_in_flight, "publisher_credit_window": args.credit_window},
        "eventlog": {"fsync": args.fsync},
    }


def run_network(hops: int, n: int, args: argparse.Namespace, bins: dict[str, Path]) -> dict:
    """One run over a line of hops+1 routers: publisher on the first, K=1 subscriber on the last,
    exactly-once, C clients. CPU is measured per router over the same window as run_one's."""
    topology = topology_module(args)
    tmp = Path(tempfile.mkdtemp(prefix=f"eobench-net{hops}-"))
    result: dict = {
        "target": "eorouter",
        "clients": "c",
        "k": 1,
        "mode": "exactly-once",
        "hops": hops,
        "routers": hops + 1,
        "messages": n,
    }
    procs: list[subprocess.Popen] = []
    net = None
    try:
        net = topology.RouterNetwork(
            tmp / "routers", topology.parse_topology(line_topology(hops + 1)), overrides=network_overrides(args)
        )
        net.start(timeout=args.server_timeout)
        ids = list(net.topology.routers)
        first, last = net.routers[ids[0]], net.routers[ids[-1]]
        result["path"] = " - ".join(ids)
        address = "bench/network"
        r_out, r_err = tmp / "recv0.out", tmp / "recv0.err"
        with open(r_out, "wb") as fo, open(r_err, "wb") as fe:
            receiver = subprocess.Popen(
                client_cmd(
                    "receive",
                    "c",
                    bins,
                    last.port,
                    address,
                    n,
                    ["-w", str(args.window), "-t", str(args.client_timeout), "-c", "bench-sub-0", "-l", "bench-sub-0"],
                ),
                cwd=ROOT,
                stdout=fo,
                stderr=fe,
                stdin=subprocess.DEVNULL,
            )
        procs.append(receiver)
        # "ready": the last router answered the attach, i.e. every router knows the subscriber.
        wait_for(r_err, re.compile(r"^ready$", re.M), receiver, args.server_timeout, "subscriber")
        time.sleep(0.1)
        pids = {r: net.routers[r].proc.pid for r in ids}
        rss0 = {r: proc_rss_kib(pid) for r, pid in pids.items()}
        cpu0 = {r: proc_cpu_ticks(pid) for r, pid in pids.items()}
        t0 = time.monotonic()
        s_out, s_err = tmp / "send.out", tmp / "send.err"
        with open(s_out, "wb") as fo, open(s_err, "wb") as fe:
            sender = subprocess.Popen(
                client_cmd(
                    "send",
                    "c",
                    bins,
                    first.port,
                    address,
                    n,
                    [
                        "-m",
                        MODES["exactly-once"],
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
                    ],
                ),
                cwd=ROOT,
                stdout=fo,
                stderr=fe,
                stdin=subprocess.DEVNULL,
            )
        procs.append(sender)
        wait_all(procs, args.run_timeout)
        t1 = time.monotonic()
        alive = {r: net.routers[r].is_running() for r in ids}
        cpu1 = {r: proc_cpu_ticks(pid) for r, pid in pids.items() if alive[r]}
        rss1 = {r: proc_rss_kib(pid) for r, pid in pids.items() if alive[r]}
        send = read_json_line(s_out) or {}
        recv = read_json_line(r_out) or {}
        total0 = sum(cpu0.values())
        total1 = sum(cpu1.values()) if len(cpu1) == len(ids) else None
        result.update(collect(n, 1, "exactly-once", send, [recv], total0, total1, rss0[ids[0]], rss1.get(ids[0]), t1 - t0))
        sent = send.get("sent", 0)
        if sent and len(cpu1) == len(ids):
            result["router_cpu_us_per_msg"] = {r: round((cpu1[r] - cpu0[r]) * 1e6 / CLK_TCK / sent, 2) for r in ids}
            result["router_cpu_ticks"] = {r: cpu1[r] - cpu0[r] for r in ids}
        result["router_rss_kib"] = {r: [rss0[r], rss1.get(r)] for r in ids}
        result["client_exit_codes"] = [p.returncode for p in procs]
        for r in ids:
            if not alive[r]:
                result["problems"].append(f"router {r} died (exit {net.routers[r].returncode})")
        errs = [tail(e, 3) for e in (r_err, s_err) if e.stat().st_size > (len("ready\n") if e == r_err else 0)]
        if errs:
            result["client_stderr"] = errs
    except Exception as e:  # a failed run is a result, not the end of the benchmark
        result.setdefault("problems", []).append(f"error: {' '.join(str(e).split())[:300]}")
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
        if net is not None:
            for router_id, router in reversed(list(net.routers.items())):
                if router.is_running():
                    try:
                        router.terminate(timeout=args.stop_grace)
                    except Exception as e:  # RouterError: a non-zero exit, or no exit in time (killed)
                        result.setdefault("problems", []).append(f"router {router_id} stop: {' '.join(str(e).split())[:200]}")
        if not args.keep:
            shutil.rmtree(tmp, ignore_errors=True)
        else:
            result["tmp"] = str(tmp)
    result["ok"] = not result.get("problems")
    return result


def median_network_cell(runs: list[dict]) -> dict:
    cell = median_cell(runs)
    cell["hops"] = runs[0]["hops"]
    cell["routers"] = runs[0]["routers"]
    cell["path"] = next((r["path"] for r in runs if r.get("path")), "")
    ids = sorted({rid for r in runs for rid in r.get("router_cpu_us_per_msg", {})})
    per = {}
    for rid in ids:
        vals = [r["router_cpu_us_per_msg"][rid] for r in runs if rid in r.get("router_cpu_us_per_msg", {})]
        per[rid] = statistics.median(vals)
    cell["router_cpu_us_per_msg"] = per
    ticks = [t for r in runs for t in r.get("router_cpu_ticks", {}).values()]
    if ticks and min(ticks) < 20 and not cell["warnings"]:
        cell["warnings"] = [f"CPU ±{100 / max(1, min(ticks)):.0f}% ({min(ticks)} ticks on one router)"]
    return cell


def network_markdown(cells: list[dict]) -> str:
    lines = [
        "| path | hops | msgs/s | p50 ms | p99 ms | CPU µs/msg, each router (publisher's first) "
        "| CPU µs/msg, all routers | runs ok | notes |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for c in sorted(cells, key=lambda x: x["hops"]):
        per = ", ".join(f"{rid} {v:.1f}" for rid, v in c["router_cpu_us_per_msg"].items()) or "—"
        notes = " ".join("; ".join(c["problems"] + c["warnings"]).split()).replace("|", "/")[:160]
        lines.append(
            f"| {c['path'] or '—'} | {c['hops']} | {fmt(c['msgs_per_s'], ',.0f')} | {fmt_ms(c['p50_us'])} "
            f"| {fmt_ms(c['p99_us'])} | {per} | **{fmt(c['cpu_us_per_msg'])}** "
            f"| {c['ok_runs']}/{c['runs']} | {notes} |"
        )
    return "\n".join(lines)


def print_network(cells: list[dict]) -> None:
    print("network paths: publisher on the first router of a line, K=1 subscriber on the last, exactly-once, C clients")
    hdr = (
        f"{'path':11} {'hops':>4} {'msgs/s':>9} {'p50 ms':>8} {'p99 ms':>8} {'CPU µs/msg all':>14}  "
        f"{'CPU µs/msg per router':28} {'ok':>4}  notes"
    )
    print(hdr)
    print("-" * len(hdr))
    for c in sorted(cells, key=lambda x: x["hops"]):
        per = ", ".join(f"{rid} {v:.1f}" for rid, v in c["router_cpu_us_per_msg"].items()) or "—"
        print(
            f"{c['path'] or '—':11} {c['hops']:>4} {fmt(c['msgs_per_s'], ',.0f'):>9} {fmt_ms(c['p50_us']):>8} "
            f"{fmt_ms(c['p99_us']):>8} {fmt(c['cpu_us_per_msg']):>14}  {per:28} {c['ok_runs']}/{c['runs']}  "
            f"{'; '.join(c['problems'] + c['warnings'])[:120]}"
        )


# ---------------------------------------------------------------------------------------------- output


def router_source_hash(root: Path) -> str:
    import hashlib

    h = hashlib.sha256()
    for f in sorted([*(root / "router").rglob("*.py"), *(root / "router").rglob("*.c")]):
        h.update(str(f.relative_to(root)).encode() + b"\0" + f.read_bytes())
    return h.hexdigest()[:12]


def snapshot_router(args: argparse.Namespace) -> None:
    """Copy router/ once, so every run of this invocation uses the same code even while it is being edited."""
    args.router_root = ROOT
    if args.no_snapshot:
        return
    snap = Path(tempfile.mkdtemp(prefix="eobench-router-"))
    shutil.copytree(ROOT / "router", snap / "router", ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    args.router_root = snap
    args.snapshot_dir = snap


def machine_facts(router_root: Path = ROOT) -> dict:
    facts: dict = {"nproc": os.cpu_count(), "kernel": platform.release(), "python": platform.python_version()}
    try:
        facts["nproc"] = int(subprocess.run(["nproc"], capture_output=True, text=True).stdout.strip())
    except Exception:
        pass
    try:
        lscpu = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
        for line in lscpu.splitlines():
            key, _, val = line.partition(":")
            key, val = key.strip(), val.strip()
            if key in ("Model name", "Architecture", "Hypervisor vendor", "CPU(s)", "Thread(s) per core", "L2 cache", "L3 cache"):
                facts[key] = val
    except Exception:
        pass
    try:
        with open("/proc/meminfo") as f:
            facts["MemTotal"] = f.readline().split(":")[1].strip()
    except Exception:
        pass
    try:
        import proton

        facts["python-qpid-proton"] = ".".join(map(str, proton.VERSION))
    except Exception:
        pass
    try:
        facts["proton-c (clients, baseline)"] = subprocess.run(
            ["pkg-config", "--modversion", "libqpid-proton"], capture_output=True, text=True
        ).stdout.strip()
    except Exception:
        pass
    try:
        facts["router source sha256"] = router_source_hash(router_root)
    except Exception:
        pass
    try:  # compiled or Python, as the routers under test will run it (router/adapter/fastpath.py)
        facts["adapter fast path"] = (
            subprocess.run(
                [sys.executable, "-c", "from router.adapter import fastpath; print(fastpath.status)"],
                cwd=router_root,
                capture_output=True,
                text=True,
                timeout=60,
            ).stdout.strip()
            or "unknown"
        )
    except Exception:
        pass
    try:
        rev = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--", "router"], cwd=ROOT, capture_output=True, text=True
        ).stdout.strip()
        facts["git"] = rev + (" + uncommitted router changes" if dirty else "")
    except Exception:
        pass
    return facts


def fmt(v, spec: str = ".1f", none: str = "—") -> str:
    return none if v is None else format(v, spec)


def fmt_ms(us) -> str:
    return "—" if us is None else f"{us / 1000:.2f}"


def fmt_mib(kib) -> str:
    return "—" if kib is None else f"{kib / 1024:.1f}"


def passfail(p) -> str:
    return "not run" if p is None else ("PASS" if p else "FAIL")


def cell_order(key: tuple) -> tuple:
    """C clients first; eorouter, baseline, then the others by name; exactly-once first; K ascending."""
    order = {"eorouter": 0, "baseline": 1}
    return (key[1] != "c", order.get(key[0], 9), key[0], key[3] != "exactly-once", key[2])


def cells_markdown(cells: dict[tuple, dict]) -> str:
    lines = [
        "| server | clients | mode | K | msgs/s | deliveries/s | p50 ms | p99 ms | server CPU µs/msg "
        "| µs/delivery | RSS before → after MiB | runs ok | notes |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for key in sorted(cells, key=cell_order):
        c = cells[key]
        notes = " ".join("; ".join(c["problems"] + c["warnings"]).split()).replace("|", "/")[:160]
        lines.append(
            f"| {c['target']} | {'C' if c['clients'] == 'c' else 'Python'} | {c['mode']} | {c['k']} "
            f"| {fmt(c['msgs_per_s'], ',.0f')} | {fmt(c['deliveries_per_s'], ',.0f')} | {fmt_ms(c['p50_us'])} "
            f"| {fmt_ms(c['p99_us'])} | **{fmt(c['cpu_us_per_msg'])}** | {fmt(c['cpu_us_per_delivery'])} "
            f"| {fmt_mib(c['rss_before_kib'])} → {fmt_mib(c['rss_after_kib'])} | {c['ok_runs']}/{c['runs']} "
            f"| {notes} |"
        )
    return "\n".join(lines)


def matrix_markdown(cells: dict[tuple, dict], ratios: list[dict], targets: list[dict]) -> str:
    order = {"eorouter": 0, "baseline": 1}
    lines = [
        cells_markdown(cells),
        "",
        "Ratios (server CPU per message, same run):",
        "",
        "| server | clients | K | exactly-once / best-effort | the same, round by round "
        "| eorouter / baseline, exactly-once | eorouter / baseline, best-effort "
        "| exactly-once µs per extra subscriber |",
        "|---|---|---|---|---|---|---|---|",
    ]
    star = lambda r, key: "*" if r.get(key) else ""  # noqa: E731
    for r in sorted(ratios, key=lambda x: (x["clients"] != "c", order.get(x["target"], 9), x["k"])):
        lines.append(
            f"| {r['target']} | {'C' if r['clients'] == 'c' else 'Python'} | {r['k']} "
            f"| {fmt(r.get('eo_over_be_cpu'), '.2f')}×{star(r, 'eo_over_be_low_res')} "
            f"| {pairs_text(r.get('eo_over_be_pairs'))} "
            f"| {fmt(r.get('eorouter_over_baseline_cpu_exactly-once'), '.1f')}×"
            f"{star(r, 'eorouter_over_baseline_low_res_exactly-once')} "
            f"| {fmt(r.get('eorouter_over_baseline_cpu_best-effort'), '.1f')}×"
            f"{star(r, 'eorouter_over_baseline_low_res_best-effort')} "
            f"| {fmt(r.get('eo_us_per_extra_copy'), '.1f')} |"
            if r["target"] == "eorouter"
            else f"| {r['target']} | {'C' if r['clients'] == 'c' else 'Python'} | {r['k']} "
            f"| {fmt(r.get('eo_over_be_cpu'), '.2f')}×{star(r, 'eo_over_be_low_res')} "
            f"| {pairs_text(r.get('eo_over_be_pairs'))} | | | |"
        )
    lines += [
        "",
        "\\* from a cell measured with fewer than 20 CPU clock ticks (±5 % or worse, see its notes): indicative only.",
        "",
        "Targets:",
        "",
        "| target | measured | result |",
        "|---|---|---|",
    ]
    for t in targets:
        lines.append(f"| {t['target']} | {t['value']} | **{passfail(t['pass'])}** |")
    return "\n".join(lines)


def memory_markdown(m: dict) -> str:
    t = memory_target(m)
    lines = [
        "| server | messages | msgs/s | router CPU µs/msg | RSS idle | RSS after warm-up | RSS peak | RSS end "
        "| growth | slope after warm-up | result |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
        f"| {m['target']} | {m['messages']:,} | {fmt(m.get('msgs_per_s'), ',.0f')} | {fmt(m.get('cpu_us_per_msg'))} "
        f"| {fmt_mib(m.get('rss_idle_kib'))} MiB | {fmt(m.get('rss_warm_mib'))} MiB | {fmt(m.get('rss_peak_mib'))} MiB "
        f"| {fmt(m.get('rss_end_mib'))} MiB | {fmt(m.get('growth_mib'), '+.1f')} MiB "
        f"({fmt(m.get('growth_bytes_per_msg'), '+.1f')} B/msg) "
        f"| {fmt(m.get('slope_mib_per_min'), '+.2f')} MiB/min | **{passfail(t['pass'])}** |",
    ]
    s = m.get("samples") or []
    if s:
        step = max(1, len(s) // 20)
        trace = ", ".join(f"{x[0]:.0f} s {x[1] / 1024:.1f}" for x in s[::step])
        lines += ["", f"RSS (MiB) through the run: {trace}."]
    if m.get("problems"):
        lines += ["", "Problems: " + "; ".join(m["problems"])]
    return "\n".join(lines)


def print_matrix(cells, ratios, targets) -> None:
    hdr = (
        f"{'server':11} {'cl':2} {'mode':12} {'K':>2} {'msgs/s':>9} {'deliv/s':>9} {'p50 ms':>8} {'p99 ms':>8} "
        f"{'CPU µs/msg':>10} {'µs/deliv':>8} {'RSS MiB':>13} {'ok':>4}  notes"
    )
    print(hdr)
    print("-" * len(hdr))
    order = {"eorouter": 0, "baseline": 1}
    for key in sorted(cells, key=cell_order):
        c = cells[key]
        rss = f"{fmt_mib(c['rss_before_kib'])}→{fmt_mib(c['rss_after_kib'])}"
        print(
            f"{c['target']:11} {'C' if c['clients'] == 'c' else 'Py':2} {c['mode']:12} {c['k']:>2} "
            f"{fmt(c['msgs_per_s'], ',.0f'):>9} {fmt(c['deliveries_per_s'], ',.0f'):>9} {fmt_ms(c['p50_us']):>8} "
            f"{fmt_ms(c['p99_us']):>8} {fmt(c['cpu_us_per_msg']):>10} {fmt(c['cpu_us_per_delivery']):>8} "
            f"{rss:>13} {c['ok_runs']}/{c['runs']}  {'; '.join(c['problems'] + c['warnings'])[:120]}"
        )
    print()
    for r in sorted(ratios, key=lambda x: (x["clients"] != "c", order.get(x["target"], 9), x["k"])):
        parts = [f"eo/be {fmt(r.get('eo_over_be_cpu'), '.2f')}x"]
        if pairs_text(r.get("eo_over_be_pairs")):
            parts.append(f"round by round {pairs_text(r.get('eo_over_be_pairs'))}")
        if r["target"] == "eorouter" and any(key[0] == "baseline" for key in cells):
            parts.append(f"eorouter/baseline eo {fmt(r.get('eorouter_over_baseline_cpu_exactly-once'), '.1f')}x")
            parts.append(f"be {fmt(r.get('eorouter_over_baseline_cpu_best-effort'), '.1f')}x")
            if r.get("eo_us_per_extra_copy") is not None:
                parts.append(f"+{r['eo_us_per_extra_copy']:.1f} µs per extra subscriber")
        print(f"ratios {r['target']:9} {'C' if r['clients'] == 'c' else 'Py':2} K={r['k']:<2}  " + ", ".join(parts))
    print()
    for t in targets:
        print(f"target: {t['target']}: {t['value']}  -> {passfail(t['pass'])}")


def replace_block(text: str, name: str, body: str) -> str:
    begin, end = f"<!-- bench:{name}:begin -->", f"<!-- bench:{name}:end -->"
    block = f"{begin}\n{body}\n{end}"
    if begin in text and end in text:
        pre = text[: text.index(begin)]
        post = text[text.index(end) + len(end) :]
        return pre + block + post
    return text.rstrip("\n") + "\n\n" + block + "\n"


MACHINE_KEYS = (
    "nproc",
    "Model name",
    "Architecture",
    "Hypervisor vendor",
    "Thread(s) per core",
    "L2 cache",
    "L3 cache",
    "MemTotal",
    "kernel",
)


def run_header(doc: dict) -> str:
    """Command, date, machine and software facts of a result document (matrix or memory)."""
    when = _dt.datetime.fromisoformat(doc["date"]).strftime("%Y-%m-%d %H:%M %Z")
    facts = doc["machine"]
    machine = ", ".join(f"{k}: {facts[k]}" for k in MACHINE_KEYS if k in facts)
    software = ", ".join(f"{k}: {v}" for k, v in facts.items() if k not in MACHINE_KEYS and k != "CPU(s)")
    return (
        f"Command: `{doc['command']}` — {when}.\n\nMachine (`nproc`, `lscpu`, /proc/meminfo): {machine}.\n\n"
        f"Software: {software}.\n"
    )


def settings_text(st: dict) -> str:
    return (
        f"Settings: {st['messages_c']:,} messages per run with C clients, {st['messages_python']:,} with Python "
        f"clients, body {st['size']} bytes, client window {st['window']}, router "
        f"publisher_credit_window {st['credit_window']}, max_in_flight_per_topic {st['max_in_flight']}, "
        f"event log fsync {'on' if st['fsync'] else 'off'}; medians of {st['repeat']} interleaved "
        f"run(s) per cell; baseline broker with {st['broker_threads']} thread(s), relaying "
        f"{st['baseline_factor']}× the messages with C clients (its CPU per message is too small to "
        f"measure in clock ticks otherwise).\n"
    )


def report_matrix(doc: dict, write: bool) -> None:
    cells = {(c["target"], c["clients"], c["k"], c["mode"]): c for c in doc["cells"]}
    for key, c in cells.items():  # a result file written before cells kept their repeats
        if "cpu_by_repeat" not in c:
            c["cpu_by_repeat"] = {
                r["repeat"]: r["cpu_us_per_msg"]
                for r in doc.get("runs", [])
                if (r["target"], r["clients"], r["k"], r["mode"]) == key
                and r.get("cpu_us_per_msg")
                and r.get("repeat") is not None
            }
    ratios = compute_ratios(cells)
    targets = evaluate_targets(cells, None)
    network = doc.get("network_cells") or []
    if cells:
        print()
        print_matrix(cells, ratios, targets)
    if network:
        print()
        print_network(network)
    qd_targets = [t for t in doc["settings"].get("targets", []) if qdr.is_target(t)]
    rows = qdr.comparison_rows(cells, qd_targets) if qd_targets else []
    if rows:
        print()
        qdr.print_comparison(rows)
    if write and doc["settings"].get("qdrouterd"):  # a comparison run: its own block, the matrix's stays
        write_docs(
            "qdrouterd",
            run_header(doc)
            + "\n"
            + qdrouterd_settings_text(doc["settings"])
            + "\n"
            + qdr.comparison_markdown(rows)
            + "\n\nEvery cell (medians over the rounds):\n\n"
            + cells_markdown(cells),
        )
        return
    if write:
        if cells:
            write_docs(
                "matrix", run_header(doc) + "\n" + settings_text(doc["settings"]) + "\n" + matrix_markdown(cells, ratios, targets)
            )
        if network:
            write_docs(
                "network", run_header(doc) + "\n" + network_settings_text(doc["settings"]) + "\n" + network_markdown(network)
            )


def qdrouterd_settings_text(st: dict) -> str:
    return (
        f"Settings: {st['messages_c']:,} messages per run for every server, C clients, body {st['size']} bytes, "
        f"client window {st['window']}; eorouter: publisher_credit_window {st['credit_window']}, "
        f"max_in_flight_per_topic {st['max_in_flight']}, event log fsync {'on' if st['fsync'] else 'off'}; "
        f"qdrouterd: a multicast address for the topic, its defaults otherwise (link capacity 250); "
        f"{st['repeat']} interleaved rounds (every cell once per round, the servers of a cell one after another).\n"
    )


def network_settings_text(st: dict) -> str:
    return (
        f"Settings: {st.get('messages_network', st['messages_c']):,} messages per run, body {st['size']} bytes, "
        f"client window {st['window']}, exactly-once, K=1, C clients; every router: "
        f"publisher_credit_window {st['credit_window']}, max_in_flight_per_topic {st['max_in_flight']}, "
        f"event log fsync {'on' if st['fsync'] else 'off'}, otherwise eorouter_tools.launcher's defaults; medians of "
        f"{st['repeat']} run(s) per path (interleaved with the matrix's runs when both ran).\n"
    )


def report_memory(doc: dict, write: bool) -> None:
    m = doc["result"]
    print(memory_markdown(m))
    t = memory_target(m)
    print(f"\ntarget: {t['target']}: {t['value']}  -> {passfail(t['pass'])}")
    if write:
        write_docs("memory", run_header(doc) + "\n" + memory_markdown(m))


def write_docs(section: str, body: str) -> None:
    text = DOCS.read_text() if DOCS.exists() else DOCS_SKELETON
    DOCS.parent.mkdir(parents=True, exist_ok=True)
    DOCS.write_text(replace_block(text, section, body))
    print(f"updated {DOCS.relative_to(ROOT)} ({section})", file=sys.stderr)


DOCS_SKELETON = """# Benchmarks

Generated blocks below are rewritten by `scripts/bench --write-docs` (matrix) and
`scripts/bench --memory-run N --write-docs` (memory); the rest is prose.

## Matrix

<!-- bench:matrix:begin -->
(not run yet)
<!-- bench:matrix:end -->

## The network

<!-- bench:network:begin -->
(not run yet)
<!-- bench:network:end -->

## Memory over a long run

<!-- bench:memory:begin -->
(not run yet)
<!-- bench:memory:end -->
"""


# ---------------------------------------------------------------------------------------------- main


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="scripts/bench",
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=__doc__.split("\n\n", 1)[1],
    )
    p.add_argument("--messages", type=int, default=None, help="messages per run with C clients (default 50000)")
    p.add_argument(
        "--py-messages", type=int, default=None, help="messages per run with Python clients (default: --messages, at most 20000)"
    )
    p.add_argument("--quick", action="store_true", help="5000 C / 2000 Python messages, one repeat")
    p.add_argument(
        "--baseline-factor",
        type=int,
        default=10,
        help="the baseline relays this many times --messages with C clients (default 10): it costs so "
        "little CPU that 50k messages is only a few clock ticks",
    )
    p.add_argument(
        "--repeat", type=int, default=None, help="interleaved repeats per cell; medians (default 3; 5 with --qdrouterd)"
    )
    p.add_argument("--subscribers", default=None, help="comma-separated K values (default 1,4,16; 1,4,16,64 with --qdrouterd)")
    p.add_argument("--modes", default="exactly-once,best-effort")
    p.add_argument("--clients", default=None, help="c, python or both (default c,python; c with --qdrouterd)")
    p.add_argument(
        "--targets",
        default=None,
        help="eorouter, baseline, qdrouterd-N (N worker threads), comma-separated (default eorouter,baseline; "
        "with --qdrouterd eorouter and qdrouterd-N for each of --qdrouterd-threads)",
    )
    p.add_argument(
        "--hops",
        default=None,
        help="network paths to measure: a line of hops+1 routers, publisher on the first, K=1 "
        "subscriber on the last, exactly-once, C clients (default 0,1,2, none with --qdrouterd; '' for none)",
    )
    p.add_argument(
        "--qdrouterd",
        action="store_true",
        help="eorouter beside qdrouterd 1.19 (multicast address, unsettled publisher) in one interleaved run; "
        "builds it with ../shared/anchors/build-qdrouterd.sh when missing (root); with --write-docs it rewrites "
        "the qdrouterd block of docs/benchmarks.md, not the matrix's",
    )
    p.add_argument(
        "--qdrouterd-threads",
        default=f"1,{qdr.DEFAULT_THREADS}",
        help=f"qdrouterd workerThreads settings with --qdrouterd (default 1,{qdr.DEFAULT_THREADS}: 1.19's default)",
    )
    p.add_argument("--qdrouterd-prefix", type=Path, default=qdr.PREFIX, help=f"qdrouterd's install prefix ({qdr.PREFIX})")
    p.add_argument("--network-only", action="store_true", help="only the network paths (no matrix)")
    p.add_argument(
        "--memory-run",
        type=int,
        default=None,
        metavar="N",
        help="only the memory run: N messages, K=1 exactly-once, RSS sampled every second",
    )
    p.add_argument("--memory-target", default="eorouter", choices=["eorouter", "baseline"])
    p.add_argument("--write-docs", action="store_true", help="regenerate the tables in docs/benchmarks.md")
    p.add_argument("--window", type=int, default=1000, help="client credit / unsettled window (default 1000)")
    p.add_argument("--credit-window", type=int, default=1000, help="router publisher_credit_window (default 1000)")
    p.add_argument("--max-in-flight", type=int, default=1000, help="router max_in_flight_per_topic (default 1000)")
    p.add_argument("--fsync", action="store_true", help="router [eventlog] fsync = true")
    p.add_argument("--size", type=int, default=100, help="message body bytes (default 100)")
    p.add_argument("--broker-threads", type=int, default=1, help="baseline broker threads (default 1)")
    p.add_argument("--client-timeout", type=int, default=20, help="a client gives up after this many idle s")
    p.add_argument(
        "--be-idle",
        type=int,
        default=3,
        help="best-effort runs: a subscriber stops after this many idle s (it may never get all)",
    )
    p.add_argument("--run-timeout", type=float, default=600, help="one run's wall-clock limit, s")
    p.add_argument("--memory-timeout", type=float, default=3600, help="the memory run's wall-clock limit, s")
    p.add_argument("--server-timeout", type=float, default=30, help="seconds to wait for ready lines")
    p.add_argument("--stop-grace", type=float, default=15, help="seconds between SIGTERM and SIGKILL")
    p.add_argument("--out", type=Path, default=OUT_DIR, help="JSON results directory (default bench-out/)")
    p.add_argument("--keep", action="store_true", help="keep each run's temporary directory (logs, data)")
    p.add_argument(
        "--from-json",
        type=Path,
        default=None,
        metavar="PATH",
        help="run nothing: print (and with --write-docs, write) the tables of a saved result file",
    )
    p.add_argument(
        "--no-snapshot",
        action="store_true",
        help="run the live router/ code (default: a copy taken at start, so edits during a long run do not mix versions)",
    )
    a = p.parse_args(argv)
    a.argv = argv
    a.broken_targets = {}
    if a.quick:
        a.messages = a.messages or 5000
        a.py_messages = a.py_messages or 2000
        a.repeat = a.repeat or 1
    a.messages = a.messages or 50000
    a.py_messages = a.py_messages or min(a.messages, 20000)
    apply_mode_defaults(a)
    a.k_values = [int(x) for x in a.subscribers.split(",") if x.strip()]
    a.mode_list = [m.strip() for m in a.modes.split(",") if m.strip()]
    a.client_list = [{"py": "python"}.get(c.strip(), c.strip()) for c in a.clients.split(",") if c.strip()]
    a.target_list = [t.strip() for t in a.targets.split(",") if t.strip()]
    try:
        a.hop_list = sorted({int(x) for x in a.hops.split(",") if x.strip()})
    except ValueError:
        p.error(f"--hops: expected comma-separated integers, found {a.hops!r}")
    if any(h < 0 or h > 25 for h in a.hop_list):
        p.error("--hops: each must be between 0 and 25")
    if a.network_only and not a.hop_list:
        p.error("--network-only needs --hops")
    for m in a.mode_list:
        if m not in MODES:
            p.error(f"--modes: {m!r} is not one of {', '.join(MODES)}")
    for c in a.client_list:
        if c not in ("c", "python"):
            p.error(f"--clients: {c!r} is not c or python")
    for t in a.target_list:
        if t not in ("eorouter", "baseline") and not qdr.TARGET_RE.match(t):
            p.error(f"--targets: {t!r} is not eorouter, baseline or qdrouterd-N")
    if a.qdrouterd and "eorouter" not in a.target_list:
        p.error("--qdrouterd compares with eorouter: --targets must include it")
    return a


def apply_mode_defaults(a: argparse.Namespace) -> None:
    """Defaults of the options a mode changes: --qdrouterd is eorouter beside qdrouterd, C clients, K up to 64,
    no network paths, 5 rounds."""
    if a.qdrouterd:
        threads = [int(x) for x in a.qdrouterd_threads.split(",") if x.strip()]
        qd = ",".join(f"qdrouterd-{n}" for n in threads)
        defaults = {"subscribers": "1,4,16,64", "clients": "c", "targets": f"eorouter,{qd}", "hops": "", "repeat": 5}
    else:
        defaults = {"subscribers": "1,4,16", "clients": "c,python", "targets": "eorouter,baseline", "hops": "0,1,2"}
        defaults["repeat"] = 3
    for key, value in defaults.items():
        if getattr(a, key) is None:
            setattr(a, key, value)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    try:
        bins = build_c_clients()
    except BuildError as e:
        print(f"bench: {e}", file=sys.stderr)
        return 2
    if args.from_json:
        doc = json.loads(args.from_json.read_text())
        (report_memory if doc.get("kind") == "memory" else report_matrix)(doc, args.write_docs)
        return 0
    qd_targets = [t for t in args.target_list if qdr.is_target(t)]
    if qd_targets and not (args.from_json or args.memory_run or args.network_only):
        try:
            qdr.ensure_built(args.qdrouterd_prefix)
        except qdr.QdrouterdError as e:
            print(f"bench: {e}", file=sys.stderr)
            return 2
    snapshot_router(args)
    try:
        return _main(args, argv, bins)
    finally:
        if getattr(args, "snapshot_dir", None):
            shutil.rmtree(args.snapshot_dir, ignore_errors=True)


def _main(args: argparse.Namespace, argv: list[str], bins: dict[str, Path]) -> int:
    facts = machine_facts(args.router_root)
    if any(qdr.is_target(t) for t in args.target_list):
        facts["qdrouterd"] = f"{qdr.version(args.qdrouterd_prefix)} ({args.qdrouterd_prefix})"
    now = _dt.datetime.now().astimezone()
    stamp = now.strftime("%Y%m%d-%H%M%S")
    args.out.mkdir(parents=True, exist_ok=True)

    if args.memory_run:
        m = memory_run(args.memory_run, args, bins)
        doc = {
            "kind": "memory",
            "command": "scripts/bench " + shlex.join(argv),
            "date": now.isoformat(),
            "machine": facts,
            "result": m,
        }
        path = args.out / f"memory-{stamp}.json"
        path.write_text(json.dumps(doc, indent=1))
        report_memory(doc, args.write_docs)
        print(f"results: {path.relative_to(ROOT) if path.is_relative_to(ROOT) else path}")
        return 0 if m["ok"] else 1

    plan = []
    if not args.network_only:
        for clients in args.client_list:
            n = args.messages if clients == "c" else args.py_messages
            for k in args.k_values:
                for mode in args.mode_list:
                    for target in args.target_list:
                        nt = n * args.baseline_factor if (target == "baseline" and clients == "c") else n
                        plan.append((target, clients, k, mode, nt))
    for hops in args.hop_list:
        plan.append(("network", "c", 1, "exactly-once", args.messages, hops))
    runs: list[dict] = []
    network_runs: list[dict] = []
    total = len(plan) * args.repeat
    i = 0
    t_start = time.monotonic()
    for rep in range(args.repeat):
        for target, clients, k, mode, n, *hops in plan:
            i += 1
            if target == "network":
                print(
                    f"[{i}/{total}] network {hops[0]} hop(s), {hops[0] + 1} router(s), K=1 {mode} {n} msgs ... ",
                    end="",
                    file=sys.stderr,
                    flush=True,
                )
                r = run_network(hops[0], n, args, bins)
                network_runs.append(r)
                per = ", ".join(f"{rid} {v:.1f}" for rid, v in (r.get("router_cpu_us_per_msg") or {}).items())
                print(
                    f"{fmt(r.get('msgs_per_s'), ',.0f')} msgs/s, {fmt(r.get('cpu_us_per_msg'))} µs/msg ({per})"
                    + ("" if r["ok"] else "  PROBLEM: " + "; ".join(r["problems"])),
                    file=sys.stderr,
                )
            else:
                print(f"[{i}/{total}] {target} {clients} K={k} {mode} {n} msgs ... ", end="", file=sys.stderr, flush=True)
                r = run_one(target, clients, k, mode, n, args, bins)
                runs.append(r)
                print(
                    f"{fmt(r.get('msgs_per_s'), ',.0f')} msgs/s, {fmt(r.get('cpu_us_per_msg'))} µs/msg"
                    + ("" if r["ok"] else "  PROBLEM: " + "; ".join(r["problems"])),
                    file=sys.stderr,
                )
            r["repeat"] = rep
    groups: dict[tuple, list[dict]] = {}
    for r in runs:
        groups.setdefault((r["target"], r["clients"], r["k"], r["mode"]), []).append(r)
    cells = {key: median_cell(rs) for key, rs in groups.items()}
    network_groups: dict[int, list[dict]] = {}
    for r in network_runs:
        network_groups.setdefault(r["hops"], []).append(r)
    network_cells = [median_network_cell(rs) for _, rs in sorted(network_groups.items())]
    doc = {
        "kind": "matrix",
        "command": "scripts/bench " + shlex.join(argv),
        "date": now.isoformat(),
        "duration_s": round(time.monotonic() - t_start, 1),
        "machine": facts,
        "settings": {
            "messages_c": args.messages,
            "messages_python": args.py_messages,
            "repeat": args.repeat,
            "window": args.window,
            "credit_window": args.credit_window,
            "max_in_flight": args.max_in_flight,
            "size": args.size,
            "fsync": args.fsync,
            "broker_threads": args.broker_threads,
            "baseline_factor": args.baseline_factor,
            "messages_network": args.messages,
            "hops": args.hop_list,
            "qdrouterd": args.qdrouterd,
            "targets": args.target_list,
        },
        "cells": list(cells.values()),
        "ratios": compute_ratios(cells),
        "targets": evaluate_targets(cells, None),
        "runs": runs,
        "network_cells": network_cells,
        "network_runs": network_runs,
    }
    path = args.out / f"bench-{stamp}.json"
    path.write_text(json.dumps(doc, indent=1))
    report_matrix(doc, args.write_docs)
    print(f"\nresults: {path.relative_to(ROOT) if path.is_relative_to(ROOT) else path}")
    return 0 if all(r["ok"] for r in runs + network_runs) else 1


if __name__ == "__main__":
    sys.exit(main())
