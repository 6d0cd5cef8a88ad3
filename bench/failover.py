"""How long traffic stops when a router dies, over many kills (`scripts/bench --failover`,
or `python -m bench.failover`).

Issue 21's target: traffic flowing again at most 1 s after a SIGKILL, as a distribution over
20 kills. The failover tests (tests/failover/) each measure one kill; this kills again and again
in one long run and reports the spread.

Three real router processes, each linked to the other two (A, B, C). A resumable publisher
(router.client) sends at a steady rate; a resumable durable subscriber starts on the
publisher's router and two more on the others, all with the three routers as their failover
list. Each round kills (SIGKILL) the router the publisher is on, measures from the kill, and
restarts the dead router (a new epoch, same ports) before the next round, so every kill finds
three routers. Times come from the clients' own ledgers (docs/ledger.md: every line carries
its wall-clock `ts` and the `router` the client was on), against the wall clock read just
before the signal:

- **publisher's outcomes flowing again**: the first outcome the publisher gets from a live
  router after the kill. On an exactly-once topic *accepted* means every owed subscriber
  accepted, so this is the network's traffic flowing end to end again, not only a reconnect.
- **a new message through**: the first message the publisher transferred after the kill (not a
  resend of one in flight at the kill), from the kill to its outcome (so it includes the
  publisher's reconnect and resume as well as that message's way to every subscriber and back).
- **subscriber moved**: the first message a subscriber that was on the dead router is handed
  at a live one.

At the end the publisher stops, every outcome is awaited and the ledgers must show every
message accepted and handed to every subscriber exactly once, in publisher order. Unless
``--no-proof``, the routers' logs (every epoch of every router) and the ledgers then go
through `eorouter reconcile`, which must prove them clean.

    python -m bench.failover                      # 20 kills, 200 msgs/s, then the proof
    python -m bench.failover --kills 5 --no-proof
    python -m bench.failover --write-docs         # rewrite docs/benchmarks.md's failover block
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import random
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from bench.run import OUT_DIR, machine_facts, run_header, write_docs
from eorouter_tools.topology import RouterNetwork, parse_topology
from router.client import ResumablePublisher, ResumableSubscriber

TRIANGLE = (
    '[[router]]\nid = "A"\n[[router]]\nid = "B"\n[[router]]\nid = "C"\n'
    '[[link]]\nbetween = ["A", "B"]\n[[link]]\nbetween = ["B", "C"]\n[[link]]\nbetween = ["C", "A"]\n'
)
TOPIC = "bench/failover"
TARGET_S = 1.0  # issue 21: traffic flowing again at most 1 s after a SIGKILL
MEASURES = (
    ("publisher", "publisher's outcomes flowing again"),
    ("new_message", "a new message through"),
    ("subscriber", "subscriber moved"),
)


class LedgerTail:
    """The lines a client appended to its ledger since the last read (parsed once each:
    polled many times a second, the files grow for the whole run). A torn last line is
    read again, whole, next time."""

    def __init__(self, path: Path):
        self.path = path
        self.offset = 0
        self.lines: list[dict] = []

    def read(self) -> list[dict]:
        try:
            with open(self.path, "rb") as f:
                f.seek(self.offset)
                data = f.read()
        except FileNotFoundError:
            return []
        end = data.rfind(b"\n") + 1
        new = [json.loads(line) for line in data[:end].splitlines() if line.strip()]
        self.offset += end
        self.lines += new
        return new


def percentile(values: list[float], q: float) -> float:
    """The q-th percentile (0-100) of ``values``, nearest rank (a value that was measured)."""
    ordered = sorted(values)
    rank = max(1, min(len(ordered), round(q / 100 * len(ordered) + 0.5)))
    return ordered[rank - 1]


def distribution(values: list[float]) -> dict:
    if not values:
        return {"n": 0}
    return {
        "n": len(values),
        "min": min(values),
        "p50": statistics.median(values),
        "p90": percentile(values, 90),
        "max": max(values),
        "mean": statistics.fmean(values),
        "within_target": sum(1 for v in values if v <= TARGET_S),
    }


class FailoverRun:
    """The network, the clients and the ledgers of one run."""

    def __init__(self, work: Path, rate: float, heartbeat: float):
        self.work = work
        self.rate = rate
        self.ledgers = work / "clients"
        self.ledgers.mkdir(parents=True)
        self.net = RouterNetwork(
            work / "routers",
            parse_topology(TRIANGLE),
            overrides={
                "delivery": {"record_linger": 1.0},
                "failover": {"publisher_resume_timeout": 20},
                # Every restart opens a new file: with the default retention (10 files) a
                # router restarted more often loses its first epochs' logs, and the proof
                # rightly reports them missing (found with --victims any). Keep them all.
                "eventlog": {"retention": 1000},
            },
        )
        self.net.start()
        self.subs: dict[str, ResumableSubscriber] = {}
        self.received: dict[str, int] = {}
        for first in ("A", "B", "C"):
            name = f"sub-{first}"
            self.received[name] = 0
            self.subs[name] = ResumableSubscriber(
                self.urls(first),
                TOPIC,
                container_id=name,
                link_name=f"{name}-link",
                state_path=work / f"{name}.state",
                ledger_path=self.ledgers / f"{name}.ledger.jsonl",
                on_message=lambda msg, name=name: self._count(name),
                heartbeat=heartbeat,
            )
            self.subs[name].start()
            if not self.subs[name].wait_attached(20):
                raise RuntimeError(f"{name} did not attach")
        self.pub = ResumablePublisher(
            self.urls("A"),
            TOPIC,
            container_id="pub",
            link_name="pub-link",
            state_path=work / "pub.state",
            ledger_path=self.ledgers / "pub.ledger.jsonl",
            heartbeat=heartbeat,
        )
        self.pub.start()
        if not self.pub.wait_attached(20):
            raise RuntimeError("the publisher did not attach")
        self.tails = {name: LedgerTail(self.ledgers / f"{name}.ledger.jsonl") for name in ["pub", *self.subs]}
        self.futures: list = []
        self.sent = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._publish, name="bench-failover-publisher", daemon=True)

    def _count(self, name: str) -> None:
        self.received[name] += 1

    def urls(self, first: str) -> list[str]:
        order = [first] + [r for r in self.net.routers if r != first]
        return [self.net.routers[r].url for r in order]

    def router_of(self, url: str | None) -> str | None:
        return next((r for r, p in self.net.routers.items() if p.port is not None and p.url == url), None)

    def _publish(self) -> None:
        period = 1.0 / self.rate
        next_at = time.monotonic()
        while not self._stop.is_set():
            self.sent += 1
            self.futures.append(self.pub.send_async(f"m{self.sent}", properties={"n": self.sent}))
            next_at += period
            pause = next_at - time.monotonic()
            if pause > 0:
                time.sleep(pause)
            else:
                next_at = time.monotonic()  # behind (the publisher blocked): no burst to catch up

    def start_publishing(self) -> None:
        self._thread.start()

    def stop_publishing(self) -> None:
        self._stop.set()
        self._thread.join(30)

    def where(self, name: str) -> str | None:
        """The router ``name`` was last on, by its ledger (outcomes for the publisher,
        deliveries for a subscriber)."""
        wanted = "outcome" if name == "pub" else "delivered"
        self.tails[name].read()
        for line in reversed(self.tails[name].lines):
            if line.get("event") == wanted:
                return self.router_of(line.get("router"))
        return None

    def wait_steady(self, seconds: float, timeout: float = 60) -> None:
        """Until the publisher has had outcomes for ``seconds`` from routers that are up."""
        deadline = time.monotonic() + timeout
        since = None
        while time.monotonic() < deadline:
            self.tails["pub"].read()
            now = time.time()
            recent = [
                e
                for e in self.tails["pub"].lines[-200:]
                if e.get("event") == "outcome" and e["ts"] > now - 0.5 and self.router_of(e.get("router")) is not None
            ]
            since = since or (time.monotonic() if recent else None)
            if not recent:
                since = None
            elif time.monotonic() - since >= seconds:
                return
            time.sleep(0.05)
        raise TimeoutError(f"no steady outcomes for {seconds} s within {timeout} s")

    def kill_round(self, timeout: float, victim: str | None = None, stall: float = 0.0) -> dict:
        """Kill ``victim`` (None: the router the publisher is on), after stopping it
        (SIGSTOP) for ``stall`` seconds if given (a router that hangs, then dies:
        the clients notice the stall by their heartbeat), and measure from the fault."""
        if victim is None:
            victim = self.where("pub")
        if victim is None:
            raise RuntimeError("cannot tell which router the publisher is on")
        moving = [name for name in self.subs if self.where(name) == victim]
        dead = self.net.routers[victim].url
        marks = {name: len(self.tails[name].lines) for name in self.tails}
        killed_at = time.time()
        if stall > 0:
            os.kill(self.net.routers[victim].proc.pid, signal.SIGSTOP)
            time.sleep(stall)
        self.net.routers[victim].kill()
        got: dict = {"victim": victim, "subscribers_on_victim": moving, "stall": stall}
        first_new_tag = None
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for name, tail in self.tails.items():
                tail.read()
            pub_lines = self.tails["pub"].lines[marks["pub"] :]
            if "publisher" not in got:
                t = next(
                    (e["ts"] for e in pub_lines if e["event"] == "outcome" and e.get("router") != dead and e["ts"] > killed_at),
                    None,
                )
                if t is not None:
                    got["publisher"] = t - killed_at
            if first_new_tag is None:
                first_new_tag = next(
                    (e["pub_tag"] for e in pub_lines if e["event"] == "sent" and not e.get("resend") and e["ts"] > killed_at),
                    None,
                )
            if first_new_tag is not None and "new_message" not in got:
                t = next((e["ts"] for e in pub_lines if e["event"] == "outcome" and e.get("pub_tag") == first_new_tag), None)
                if t is not None:
                    got["new_message"] = t - killed_at
            for name in moving:
                key = f"subscriber:{name}"
                if key not in got:
                    t = next(
                        (
                            e["ts"]
                            for e in self.tails[name].lines[marks[name] :]
                            if e["event"] == "delivered" and e.get("router") != dead and e["ts"] > killed_at
                        ),
                        None,
                    )
                    if t is not None:
                        got[key] = t - killed_at
            if "publisher" in got and "new_message" in got and all(f"subscriber:{n}" in got for n in moving):
                break
            time.sleep(0.005)
        got["subscriber"] = max((got[f"subscriber:{n}"] for n in moving if f"subscriber:{n}" in got), default=None)
        got["timed_out"] = [k for k in ("publisher", "new_message") if k not in got] + [
            n for n in moving if f"subscriber:{n}" not in got
        ]
        started = time.monotonic()
        self.net.restart(victim)
        got["restart_s"] = time.monotonic() - started
        return got

    def finish(self, timeout: float = 120) -> dict:
        """Stop publishing, await every outcome, and check the ledgers: every message
        accepted, handed to every subscriber once, in order."""
        self.stop_publishing()
        outcomes = [f.result(timeout) for f in self.futures]
        if not self.pub.wait_settled(60):
            raise RuntimeError("the publisher's deliveries did not all settle")
        states: dict[str, int] = {}
        for o in outcomes:
            states[o.state] = states.get(o.state, 0) + 1
        accepted = [n + 1 for n, o in enumerate(outcomes) if o.state == "accepted"]
        deadline = time.monotonic() + 60
        while min(self.received.values()) < len(accepted) and time.monotonic() < deadline:
            time.sleep(0.05)
        problems = []
        if states.get("accepted", 0) != len(outcomes):
            problems.append(f"outcomes {states}")
        for name, tail in self.tails.items():
            if name == "pub":
                continue
            tail.read()
            handed = [e["seq"] for e in tail.lines if e["event"] == "delivered"]
            if len(handed) != len(set(handed)):
                problems.append(f"{name} was handed {len(handed) - len(set(handed))} message(s) twice")
            if handed != sorted(handed):
                problems.append(f"{name} was handed messages out of publisher order")
            if set(handed) != set(accepted):
                problems.append(
                    f"{name}: {len(set(accepted) - set(handed))} accepted message(s) never handed, "
                    f"{len(set(handed) - set(accepted))} handed but not accepted"
                )
        left = self.wait_no_records()
        if left:
            problems.append(f"records still held 30 s after the last outcome: {left}")
        return {"messages": len(outcomes), "outcomes": states, "problems": problems}

    def wait_no_records(self, timeout: float = 30) -> dict:
        """Until no live router holds a delivery record (a record outlives its outcome by
        `record_linger` and until its receivers know it settled: stopping the routers
        sooner would leave records the proof rightly reports as a clean end missed).
        Returns what is still held at the deadline, per router."""
        deadline = time.monotonic() + timeout
        while True:
            left = {}
            for rid, router in self.net.routers.items():
                if not router.is_running():
                    continue
                events = [e for e in router.events() if e.get("epoch") == router.epoch]
                held = {e["delivery"] for e in events if e["event"] == "received" and not e.get("settled")}
                held -= {
                    e["delivery"]
                    for e in events
                    if e["event"] == "record-deleted" or (e["event"] == "settled" and e.get("deleted"))
                }
                if held:
                    left[rid] = len(held)
            if not left or time.monotonic() > deadline:
                return left
            time.sleep(0.2)

    def close(self) -> None:
        for client in [self.pub, *self.subs.values()]:
            try:
                client.close()
            except Exception:
                pass
        self.net.stop()


def prove(work: Path) -> dict:
    """`eorouter reconcile` over every router's log and the clients' ledgers."""
    started = time.monotonic()
    out = work / "report"
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "router",
            "reconcile",
            str(work / "routers"),
            "--clients",
            str(work / "clients"),
            "--out",
            str(out),
            "--no-html",
        ],
        capture_output=True,
        text=True,
        timeout=1800,
    )
    proof = {"exit": result.returncode, "seconds": round(time.monotonic() - started, 1)}
    try:
        report = json.loads((out / "report.json").read_text())
        proof["verdict"] = report["verdict"]["line"]
        proof["proven_clean"] = report["verdict"]["proven_clean"]
    except (OSError, ValueError, KeyError):
        proof["proven_clean"] = False
        proof["verdict"] = (result.stdout[-2000:] + result.stderr[-2000:]).strip()
    return proof


def run(args: argparse.Namespace) -> dict:
    work = Path(tempfile.mkdtemp(prefix="eobench-failover-"))
    doc: dict = {
        "command": "python -m bench.failover " + " ".join(args.argv),
        "date": _dt.datetime.now(_dt.UTC).isoformat(),
        "machine": machine_facts(),
        "settings": {
            "kills": args.kills,
            "rate": args.rate,
            "heartbeat": args.heartbeat,
            "settle": args.settle,
            "victims": args.victims,
            "stall": args.stall,
            "load": args.load,
            "seed": args.seed,
        },
        "rounds": [],
    }
    failover = FailoverRun(work, args.rate, args.heartbeat)
    rng = random.Random(args.seed)
    # Races show on a busy machine: --load N keeps N more processes spinning on the CPU.
    load = [subprocess.Popen([sys.executable, "-c", "while True: pass"], stdin=subprocess.DEVNULL) for _ in range(args.load)]
    try:
        failover.start_publishing()
        for n in range(args.kills):
            failover.wait_steady(args.settle)
            victim = rng.choice(sorted(failover.net.routers)) if args.victims == "any" else None
            stall = rng.uniform(0.5, 2.5) if rng.random() < args.stall else 0.0
            r = failover.kill_round(args.timeout, victim, stall)
            doc["rounds"].append(r)
            print(
                f"kill {n + 1:2d}/{args.kills} {r['victim']}: publisher {fmt_s(r.get('publisher'))}, new message "
                f"{fmt_s(r.get('new_message'))}, subscriber moved {fmt_s(r.get('subscriber'))} "
                f"({', '.join(r['subscribers_on_victim']) or 'none on it'}); restarted in {r['restart_s']:.1f} s"
                + (f"; after a {stall:.2f} s SIGSTOP, timed from the stop" if stall else "")
                + (f"; TIMED OUT: {r['timed_out']}" if r["timed_out"] else ""),
                file=sys.stderr,
                flush=True,
            )
        failover.wait_steady(args.settle)
        doc["end"] = failover.finish()
    finally:
        for p in load:
            p.kill()
            p.wait()
        failover.close()
    for key, _ in MEASURES:
        doc[key] = distribution([r[key] for r in doc["rounds"] if r.get(key) is not None])
    if not args.no_proof:
        print("the proof: eorouter reconcile over every epoch's log and the ledgers ...", file=sys.stderr, flush=True)
        doc["proof"] = prove(work)
    if args.keep:
        doc["workdir"] = str(work)
    else:
        shutil.rmtree(work, ignore_errors=True)
    return doc


def _after_kill(r: dict) -> float | None:
    """A round's slowest measure from its SIGKILL: from the fault, less the stall before
    it (0 when the clients had moved during the stall)."""
    measured = [r[k] for k, _ in MEASURES if r.get(k) is not None]
    return max(0.0, max(measured) - r.get("stall", 0.0)) if measured else None


def fmt_s(v) -> str:
    return "—" if v is None else f"{v:.3f} s"


def markdown(doc: dict) -> str:
    st = doc["settings"]
    rows = []
    for key, title in MEASURES:
        d = doc[key]
        if not d["n"]:
            rows.append(f"| {title} | 0 | — | — | — | — | — |")
            continue
        rows.append(
            f"| {title} | {d['n']} | {d['min']:.3f} | {d['p50']:.3f} | {d['p90']:.3f} | {d['max']:.3f} | "
            f"{d['within_target']}/{d['n']} |"
        )
    victims = ", ".join(r["victim"] for r in doc["rounds"])
    timed_out = sum(1 for r in doc["rounds"] if r["timed_out"])
    end = doc["end"]
    ok = not end["problems"]
    proof = doc.get("proof")
    proof_line = (
        "not run (`--no-proof`)"
        if proof is None
        else f"{'**proven clean**' if proof['proven_clean'] else '**NOT proven clean**'} "
        f"(`eorouter reconcile` over every epoch's log and the ledgers, exit {proof['exit']}, "
        f"{proof['seconds']:.0f} s): {proof['verdict']}"
    )
    worst = max((doc[k]["max"] for k, _ in MEASURES if doc[k]["n"]), default=None)
    # A stalled round is timed from its SIGSTOP (what the clients live through); the target
    # is about the SIGKILL, which came the stall's seconds later.
    after_kill = max((w for w in map(_after_kill, doc["rounds"]) if w is not None), default=None)
    stalled = [r for r in doc["rounds"] if r.get("stall")]
    verdict = (
        f"**met**: every kill's traffic flowed again within {TARGET_S:.0f} s of the SIGKILL (worst {after_kill:.3f} s)"
        if after_kill is not None and after_kill <= TARGET_S and not timed_out
        else f"**not met** (worst {fmt_s(after_kill)} after the SIGKILL, {timed_out} round(s) timed out)"
    )
    if stalled:
        verdict += (
            f"; {len(stalled)} kill(s) came after a SIGSTOP of {min(r['stall'] for r in stalled):.2f}–"
            f"{max(r['stall'] for r in stalled):.2f} s: timed from the stop, as in the table, the worst is {fmt_s(worst)}"
        )
    return (
        run_header(doc)
        + f"\nSettings: 3 routers (A, B, C, each linked to the other two), {st['kills']} SIGKILLs, each of "
        + ("a router chosen at random" if st.get("victims") == "any" else "the router the publisher was on")
        + (f" ({st['stall']:.0%} of them after a 0.5-2.5 s SIGSTOP, timed from the stop)" if st.get("stall") else "")
        + (f", beside {st['load']} processes spinning on the CPU" if st.get("load") else "")
        + f", restarted before the next kill; one resumable publisher (router.client) at {st['rate']:.0f} msgs/s "
        f"on an exactly-once topic, three resumable durable subscribers (one starts on the publisher's router); client "
        f"heartbeat {st['heartbeat']:g} s; {st['settle']:g} s of steady outcomes before each kill.\n\n"
        f"| seconds from the {'fault (the SIGSTOP of a stalled kill, else the SIGKILL)' if stalled else 'SIGKILL'} to … "
        "| kills | min | p50 | p90 | max | within 1 s |\n"
        "|---|---|---|---|---|---|---|\n" + "\n".join(rows) + "\n\n"
        f"Routers killed, in order: {victims}. Target (issue 21, at most {TARGET_S:.0f} s after a SIGKILL): {verdict}.\n\n"
        f"End of the run: {end['messages']:,} messages, outcomes {end['outcomes']}; ledgers "
        + (
            "agree: every message handed to every subscriber exactly once, in publisher order"
            if ok
            else f"**disagree**: {'; '.join(end['problems'])}"
        )
        + f". Proof: {proof_line}.\n"
    )


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    p = argparse.ArgumentParser(prog="python -m bench.failover", description=__doc__.split("\n\n")[0])
    p.add_argument("--kills", type=int, default=20, help="how many SIGKILLs (default 20)")
    p.add_argument("--rate", type=float, default=200, help="the publisher's messages per second (default 200)")
    p.add_argument("--heartbeat", type=float, default=1.0, help="the clients' heartbeat, s (default 1)")
    p.add_argument("--settle", type=float, default=1.0, help="steady outcomes before each kill, s (default 1)")
    p.add_argument("--timeout", type=float, default=30, help="give up on a round's measures after this long, s")
    p.add_argument(
        "--victims",
        choices=["publisher", "any"],
        default="publisher",
        help="kill the publisher's router each round (default), or any router, chosen at random",
    )
    p.add_argument("--stall", type=float, default=0.0, help="the share of kills preceded by a 0.5-2.5 s SIGSTOP (default 0)")
    p.add_argument("--load", type=int, default=0, help="processes spinning on the CPU beside the run (default 0)")
    p.add_argument("--seed", type=int, default=1, help="for --victims any and --stall (default 1)")
    p.add_argument("--no-proof", action="store_true", help="skip eorouter reconcile at the end")
    p.add_argument("--keep", action="store_true", help="keep the routers' logs and the ledgers")
    p.add_argument("--write-docs", action="store_true", help="rewrite docs/benchmarks.md's failover block")
    p.add_argument("--out", type=Path, default=OUT_DIR)
    args = p.parse_args(argv)
    args.argv = argv
    if args.kills < 1 or args.rate <= 0:
        p.error("--kills must be at least 1 and --rate positive")
    doc = run(args)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "failover.json").write_text(json.dumps(doc, indent=1, default=str))
    body = markdown(doc)
    print("\n" + body)
    if args.write_docs:
        write_docs("failover", body)
    bad = doc["end"]["problems"] or (doc.get("proof") and not doc["proof"]["proven_clean"])
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
