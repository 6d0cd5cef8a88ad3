"""The interop matrix: publisher stack x subscriber stack x scenario, through routers someone else runs.

This module starts the peer programs (interop/<stack>/publisher|subscriber), waits for them, reads
their ledgers and checks what the delivery rule (docs/delivery-rule.md) promises. It imports nothing
from ``router``: the caller passes the routers' addresses (tests/interop/ starts them).

    topo = Topology("one router", pub=("127.0.0.1", 5672), sub=("127.0.0.1", 5672))
    result = run_scenario("accept", "rhea", "azure", topo, workdir)
    result.status        # "pass" | "fail" | "skip"
    result.problems      # what failed, one line each

In every pair scenario the stack under test as subscriber (S) attaches to ``topo.sub`` (the far
router on a 2-router path) and a python-qpid-proton reference subscriber (the bystander) attaches to
``topo.pub``, next to the publisher (P). The checks, per scenario:

- every subscriber gets every message exactly once (by ``seq``, and every router tag once), intact
  (the body digest, length and publisher tag on ``delivered`` match the publisher's ``sent``);
- the publisher gets one outcome per message, the documented one, and never before every owed
  subscriber gave its own (``outcome.ts >= delivered.ts`` of every answering subscriber);
- whatever one peer does (reject, release, hold, disconnect, odd settle modes, huge or oversized
  messages), the other subscriber and a later bystander publisher lose nothing;
- every ledger line has docs/ledger.md's fields in order; peers exit 0.

Routers are expected to run with ``IN_FLIGHT_LIMIT`` as ``limits.max_in_flight_per_topic`` and the
default ``limits.max_message_size`` (``MAX_MESSAGE_SIZE``); see ``ROUTER_OVERRIDES``.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path

from interop import peers

STACKS = peers.STACKS
REFERENCE = "python"
IN_FLIGHT_LIMIT = 50
MAX_MESSAGE_SIZE = 1048576
ROUTER_OVERRIDES = {
    "limits": {"max_in_flight_per_topic": IN_FLIGHT_LIMIT, "publisher_credit_window": 25, "max_message_size": MAX_MESSAGE_SIZE}
}

N = 10  # messages per publisher in most scenarios
BYSTANDER_FIRST = 1001  # the bystander publisher's seqs: 1001, 1002, ...
BYSTANDER_N = 5
PUB_TIMEOUT = 4.0  # a publisher gives up after this long without progress
SUB_TIMEOUT = 10.0
HOLD_LINGER = 1.0
TS_SLACK = 0.0015  # clock-read slack between processes (node's ledger clock has millisecond resolution)

# scenario -> one line for the README / the matrix legend
SCENARIOS: dict[str, str] = {
    "accept": "S and the bystander accept: P gets accepted, after both answered",
    "reject": "S rejects, the bystander accepts: P gets rejected (S's condition)",
    "release": "S releases, the bystander accepts: P gets released",
    "two-step": "S attaches rcv-settle-mode=second and settles only after the router did (Azure: await_outcome)",
    "hold": "S holds every delivery unsettled, then detaches: P hears nothing until then, then accepted",
    "sub-disconnect": "S drops its connection mid-stream: P still gets accepted for all, the bystander all",
    "pub-disconnect": "P drops its connection mid-stream: both subscribers get the same messages, then a "
    "bystander publisher loses nothing",
    "presettled": "P sends pre-settled (snd-settle-mode=settled): both subscribers get every message",
    "at-most-once": "S attaches snd-settle-mode=settled: it gets pre-settled copies; P accepted",
    "large": f"messages just under the {MAX_MESSAGE_SIZE}-byte limit arrive intact",
    "oversize": "messages over the limit: P gets rejected amqp:link:message-size-exceeded; a bystander publisher loses nothing",
}
# publisher-only scenarios (the subscriber is the reference)
PUBLISHER_SCENARIOS: dict[str, str] = {
    "default-settlement": f"P settles the way its stack does by default, {IN_FLIGHT_LIMIT + 10} messages on a "
    f"topic limited to {IN_FLIGHT_LIMIT} in flight: P gets every outcome",
}
FAST_SCENARIOS = ("accept",)

# (stack, role, scenario) -> why it cannot be run (a limitation of the client, not of the router)
NOT_APPLICABLE = {
    (
        "azure",
        "publisher",
        "presettled",
    ): "pyamqp cannot publish pre-settled: send_message never returns (PendingDelivery is created settled, "
    "so its on_send_complete never fires)",
    (
        "azure",
        "publisher",
        "release",
    ): "pyamqp cannot take a released outcome: its _on_send_complete looks the state up as 'rejected' once it "
    "is not 'accepted', raises KeyError('rejected') inside the callback, and send_message never returns",
    (
        "azure",
        "publisher",
        "hold",
    ): "pyamqp's send_message is synchronous (the next message leaves only after the previous one's outcome), "
    "while this scenario's subscriber answers nothing until it holds every message",
}
# Failures whose cause is known: key -> (cause, a text every such failure's problems contain). A
# failure matching the text is shown (and xfailed by the tests) with the cause; it stays a failure.
KNOWN_CAUSES: dict[str, tuple[str, str]] = {
    # Fixed on 2026-11-22 and removed from here: the router answering a publisher's outcome unsettled
    # (azure publisher; stacks that settle only after the receiver did), its settling disposition to a
    # rcv-settle-mode=second subscriber carrying no outcome (azure two-step), a rejection without an
    # error info field (pyamqp indexes it), pre-settled deliveries not relayed to other routers, and
    # placeholders that nothing fulfils after a subscriber resumed (rhea resume-kill).
}


@dataclass(frozen=True)
class Topology:
    name: str
    pub: tuple[str, int]  # where publishers (and the bystander subscriber) attach
    sub: tuple[str, int]  # where the subscriber under test attaches


@dataclass
class Result:
    scenario: str
    topology: str
    pub: str
    sub: str
    status: str = "pass"  # pass / fail / skip
    problems: list[str] = field(default_factory=list)
    seconds: float = 0.0
    diagnostics: str = ""  # peers' stderr/stdout tails on failure
    notes: list[str] = field(default_factory=list)  # measurements worth printing (recovery time, ...)

    @property
    def reason(self) -> str:
        return "; ".join(self.problems)


# --------------------------------------------------------------------------- peers


class Peer:
    """One peer program run: its process, ledger, stdout and stderr."""

    def __init__(
        self, workdir: Path, label: str, stack: str, role: str, where: tuple[str, int], topic: str, count: int, options: dict
    ):
        self.label, self.stack, self.role = label, stack, role
        self.ledger = workdir / f"{label}.jsonl"
        self.stdout_path = workdir / f"{label}.stdout"
        self.stderr_path = workdir / f"{label}.stderr"
        self.container_id = f"{label}-{uuid.uuid4().hex[:6]}"
        argv = peers.command(stack, role) + [
            where[0],
            str(where[1]),
            topic,
            str(count),
            "--ledger",
            str(self.ledger),
            "--container-id",
            self.container_id,
        ]
        for key, value in options.items():
            argv += [f"--{key.replace('_', '-')}", str(value)]
        self.argv = argv
        self.started = time.time()
        with open(self.stdout_path, "wb") as out, open(self.stderr_path, "wb") as err:
            self.proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=err, start_new_session=True)
        self.ended: float | None = None
        self.killed = False  # by the harness, while still running

    def stdout(self) -> str:
        try:
            return self.stdout_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def stderr_tail(self, lines: int = 8) -> str:
        try:
            return "\n".join(self.stderr_path.read_text(errors="replace").splitlines()[-lines:])
        except FileNotFoundError:
            return ""

    def is_ready(self) -> bool:
        return "ready" in self.stdout().splitlines()

    def summary(self) -> dict:
        for line in reversed(self.stdout().splitlines()):
            if line.startswith("{"):
                try:
                    return json.loads(line)
                except ValueError:
                    return {}
        return {}

    def events(self) -> list[dict]:
        out = []
        try:
            lines = self.ledger.read_text(errors="replace").splitlines()
        except FileNotFoundError:
            return out
        for line in lines:
            try:
                out.append(json.loads(line))
            except ValueError:
                pass  # a torn last line (the peer was killed mid-write)
        return out

    def poll(self) -> int | None:
        code = self.proc.poll()
        if code is not None and self.ended is None:
            self.ended = time.time()
        return code

    def wait(self, timeout: float) -> int | None:
        try:
            self.proc.wait(timeout=max(0.0, timeout))
        except subprocess.TimeoutExpired:
            return None
        return self.poll()

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.killed = True
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.proc.wait(timeout=10)
        self.poll()

    def describe(self) -> str:
        s = self.summary()
        err = s.get("error") if s else None
        code = self.proc.poll()
        return f"{self.label} ({self.stack}) exit {code}" + (f": {err}" if err else "")


class Run:
    """One scenario run: peers under one directory, all killed at the end."""

    def __init__(self, workdir: Path, topo: Topology, scenario: str, pub: str, sub: str):
        self.dir = Path(workdir)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.topo = topo
        self.topic = f"interop/{scenario}/{pub}-{sub}/{uuid.uuid4().hex[:8]}"
        self.peers: list[Peer] = []
        self.problems: list[str] = []

    def start(self, label: str, stack: str, role: str, where: str, count: int, **options) -> Peer:
        address = self.topo.pub if where == "pub" else self.topo.sub
        if role == "publisher":
            options.setdefault("timeout", PUB_TIMEOUT)
        else:
            options.setdefault("timeout", SUB_TIMEOUT)
        peer = Peer(self.dir, label, stack, role, address, self.topic, count, options)
        self.peers.append(peer)
        return peer

    def subscribers(self, *specs: tuple) -> list[Peer]:
        """Start subscribers ``(label, stack, where, count, options)`` together; wait until all are ready."""
        subs = [self.start(label, stack, "subscriber", where, count, **opts) for label, stack, where, count, opts in specs]
        deadline = time.monotonic() + 20
        while not all(s.is_ready() for s in subs):
            for s in subs:
                if s.poll() is not None and not s.is_ready():
                    raise ScenarioError(
                        f"subscriber {s.describe()} exited before its link was attached; stderr: {s.stderr_tail(3)}"
                    )
            if time.monotonic() > deadline:
                late = [s.label for s in subs if not s.is_ready()]
                raise ScenarioError(f"subscribers {late} not attached within 20 s")
            time.sleep(0.01)
        return subs

    def finish_publisher(self, pub: Peer, cap: float = 60.0) -> int | None:
        code = pub.wait(cap)
        if code is None:
            self.problems.append(f"{pub.label} ({pub.stack}) still running after {cap} s: killed")
            pub.kill()
        return code

    def wait_quiet(self, subs: list[Peer], cap: float) -> None:
        """Until the subscribers' ledgers stopped growing for half a second (at most ``cap`` s)."""
        deadline = time.monotonic() + cap
        sizes, quiet_since = None, time.monotonic()
        while time.monotonic() < deadline:
            now_sizes = [s.ledger.stat().st_size if s.ledger.exists() else 0 for s in subs]
            if now_sizes != sizes:
                sizes, quiet_since = now_sizes, time.monotonic()
            elif time.monotonic() - quiet_since > 0.5:
                return
            time.sleep(0.05)

    def finish_subscribers(self, subs: list[Peer], expect_exit: bool, cap: float) -> None:
        """Wait for subscribers that end by themselves (``expect_exit``), else until their ledgers
        stay quiet for a moment; then kill what is left."""
        if expect_exit:
            deadline = time.monotonic() + cap
            for s in subs:
                s.wait(deadline - time.monotonic())
        else:
            self.wait_quiet(subs, cap)
        for s in subs:
            s.kill()

    def kill_all(self) -> None:
        for p in self.peers:
            p.kill()

    def diagnostics(self) -> str:
        parts = []
        for p in self.peers:
            parts.append(
                f"--- {p.label} ({p.stack} {p.role}) exit {p.proc.poll()}: {' '.join(p.argv)}\n"
                f"stdout: {p.stdout().strip()[-600:]}\nstderr: {p.stderr_tail(6)}"
            )
        return "\n".join(parts)


class ScenarioError(Exception):
    """The scenario could not be carried out (a peer did not start): a failure."""


# --------------------------------------------------------------------------- ledger checks


def _seq_ranges(seqs) -> str:
    seqs = sorted(set(seqs))
    if not seqs:
        return "none"
    out, start, prev = [], seqs[0], seqs[0]
    for s in seqs[1:] + [None]:
        if s is not None and s == prev + 1:
            prev = s
            continue
        out.append(str(start) if start == prev else f"{start}-{prev}")
        if s is not None:
            start = prev = s
    return ",".join(out)


def delivered(peer: Peer, lo: int = 1, hi: int = 10**9) -> list[dict]:
    return [e for e in peer.events() if e.get("event") == "delivered" and e.get("seq") is not None and lo <= e["seq"] <= hi]


def outcomes(peer: Peer) -> dict[int, list[dict]]:
    got: dict[int, list[dict]] = defaultdict(list)
    for e in peer.events():
        if e.get("event") == "outcome":
            got[e.get("seq")].append(e)
    return got


def sent(peer: Peer) -> set[int]:
    return {e["seq"] for e in peer.events() if e.get("event") == "sent"}


def check_once(run: Run, sub: Peer, expected: set[int], lo: int = 1, hi: int = 10**9, exact: bool = True) -> None:
    """``sub`` got each seq of ``expected`` exactly once (``exact``: and nothing else in [lo, hi])."""
    evs = delivered(sub, lo, hi)
    counts = Counter(e["seq"] for e in evs)
    missing = expected - set(counts)
    dups = {s for s, n in counts.items() if n > 1}
    extra = set(counts) - expected if exact else set()
    tags = Counter(e.get("delivery") for e in evs)
    dup_tags = [t for t, n in tags.items() if n > 1]
    what = f"sub {sub.label} ({sub.stack})"
    if missing:
        run.problems.append(f"{what}: missing seq {_seq_ranges(missing)} of {_seq_ranges(expected)}")
    if dups:
        run.problems.append(f"{what}: duplicate seq {_seq_ranges(dups)}")
    if extra:
        run.problems.append(f"{what}: unexpected seq {_seq_ranges(extra)}")
    if dup_tags and not dups:
        run.problems.append(f"{what}: a router tag delivered twice")


def check_outcomes(run: Run, pub: Peer, expected: str, seqs: set[int], condition: str | None = None) -> None:
    got = outcomes(pub)
    what = f"pub {pub.label} ({pub.stack})"
    missing = {s for s in seqs if not got.get(s)}
    if missing:
        err = pub.summary().get("error")
        run.problems.append(f"{what}: no outcome for seq {_seq_ranges(missing)}" + (f" ({err})" if err else ""))
    twice = {s for s, evs in got.items() if len(evs) > 1}
    if twice:
        run.problems.append(f"{what}: more than one outcome for seq {_seq_ranges(twice)}")
    wrong = Counter(evs[0]["outcome"] for s, evs in got.items() if s in seqs and evs[0]["outcome"] != expected)
    if wrong:
        run.problems.append(f"{what}: expected {expected}, got " + ", ".join(f"{o} x{n}" for o, n in wrong.items()))
    if condition is not None:
        bad = Counter(
            evs[0].get("condition")
            for s, evs in got.items()
            if s in seqs and evs[0]["outcome"] == expected and evs[0].get("condition") != condition
        )
        if bad:
            run.problems.append(f"{what}: expected condition {condition}, got " + ", ".join(f"{c} x{n}" for c, n in bad.items()))


def check_no_outcomes(run: Run, pub: Peer) -> None:
    got = outcomes(pub)
    if got:
        run.problems.append(f"pub {pub.label} ({pub.stack}): {len(got)} outcomes for pre-settled deliveries")


def check_after(run: Run, pub: Peer, subs: list[Peer]) -> None:
    """The publisher's outcome for a seq never comes before any subscriber's answer to it."""
    got = outcomes(pub)
    early = []
    for sub in subs:
        for e in delivered(sub):
            if e.get("outcome") not in ("accepted", "rejected", "released", "modified"):
                continue
            out = got.get(e["seq"])
            if out and out[0]["ts"] + TS_SLACK < e["ts"]:
                early.append((e["seq"], sub.label, e["ts"] - out[0]["ts"]))
    if early:
        seq, label, dt = early[0]
        run.problems.append(
            f"pub {pub.label}: outcome before every subscriber answered ({len(early)} times; "
            f"seq {seq}: {dt * 1000:.1f} ms before {label}'s answer)"
        )


LEDGER_FIELDS = (
    "ts",
    "client",
    "link",
    "role",
    "event",
    "topic",
    "delivery",
    "pub_tag",
    "seq",
    "outcome",
    "router",
    "incarnation",
    "digest",
    "message_id",
)


def check_format(run: Run) -> None:
    """Every ledger line starts with docs/ledger.md's fields, in order."""
    for peer in run.peers:
        for e in peer.events():
            if tuple(e)[: len(LEDGER_FIELDS)] != LEDGER_FIELDS:
                run.problems.append(
                    f"{peer.label} ({peer.stack}): ledger line not in docs/ledger.md's format: {list(e)[: len(LEDGER_FIELDS)]}"
                )
                break


def check_integrity(run: Run, pub: Peer, subs: list[Peer]) -> None:
    """What arrived is what was sent: the body digest, and the publisher's own tag (recovered from the
    router's tag) match the publisher's ``sent`` line for that seq."""
    sent_by_seq = {e["seq"]: e for e in pub.events() if e.get("event") == "sent"}
    for sub in subs:
        bad_digest, bad_tag, bad_size = [], [], []
        for e in delivered(sub):
            s = sent_by_seq.get(e["seq"])
            if s is None:
                continue
            if not e.get("digest") or e["digest"] != s.get("digest"):
                bad_digest.append(e["seq"])
            if e.get("pub_tag") != s.get("pub_tag"):
                bad_tag.append(e["seq"])
            if e.get("size") != s.get("size"):
                bad_size.append(e["seq"])
        if bad_digest:
            run.problems.append(
                f"sub {sub.label} ({sub.stack}): body digest differs from the publisher's for seq {_seq_ranges(bad_digest)}"
            )
        if bad_tag:
            run.problems.append(f"sub {sub.label} ({sub.stack}): publisher tag differs for seq {_seq_ranges(bad_tag)}")
        if bad_size:
            run.problems.append(f"sub {sub.label} ({sub.stack}): body length differs for seq {_seq_ranges(bad_size)}")


def check_exit(run: Run, peer: Peer, codes=(0,)) -> None:
    code = peer.proc.poll()
    if peer.killed and run.problems:
        return  # still waiting when something else had already failed: no news
    if code not in codes:
        run.problems.append(f"{peer.describe()}")


# --------------------------------------------------------------------------- scenarios


def _pair(
    run: Run,
    P: str,
    S: str,
    *,
    s_opts: dict | None = None,
    s_count: int = N,
    p_opts: dict | None = None,
    p_count: int = N,
    ref_count: int = N,
    subs_exit: bool = True,
):
    subs = run.subscribers(("sub", S, "sub", s_count, s_opts or {}), ("ref", REFERENCE, "pub", ref_count, {}))
    pub = run.start("pub", P, "publisher", "pub", p_count, **(p_opts or {}))
    code = run.finish_publisher(pub)
    run.finish_subscribers(subs, expect_exit=subs_exit and code == 0, cap=SUB_TIMEOUT if code == 0 else 1.0)
    return pub, subs[0], subs[1]


def _bystander(run: Run, subs: list[Peer]) -> None:
    """A reference publisher on the same topic afterwards: every subscriber gets all of it."""
    by = run.start("bystander", REFERENCE, "publisher", "pub", BYSTANDER_N, first_seq=BYSTANDER_FIRST)
    run.finish_publisher(by)
    expected = set(range(BYSTANDER_FIRST, BYSTANDER_FIRST + BYSTANDER_N))
    check_outcomes(run, by, "accepted", expected)
    run.finish_subscribers(subs, expect_exit=False, cap=5.0)
    for s in subs:
        check_once(run, s, expected, lo=BYSTANDER_FIRST)


def sc_accept(run, P, S):
    pub, sub, ref = _pair(run, P, S)
    seqs = set(range(1, N + 1))
    check_outcomes(run, pub, "accepted", seqs)
    check_once(run, sub, seqs)
    check_once(run, ref, seqs)
    check_after(run, pub, [sub, ref])
    check_integrity(run, pub, [sub, ref])
    for p in (pub, sub, ref):
        check_exit(run, p)


def sc_reject(run, P, S):
    pub, sub, ref = _pair(run, P, S, s_opts={"outcome": "reject"})
    seqs = set(range(1, N + 1))
    check_outcomes(run, pub, "rejected", seqs, condition="interop:rejected")
    check_once(run, sub, seqs)
    check_once(run, ref, seqs)
    check_after(run, pub, [sub, ref])
    check_integrity(run, pub, [sub, ref])
    for p in (pub, sub, ref):
        check_exit(run, p)


def sc_release(run, P, S):
    pub, sub, ref = _pair(run, P, S, s_opts={"outcome": "release"})
    seqs = set(range(1, N + 1))
    check_outcomes(run, pub, "released", seqs)
    check_once(run, sub, seqs)
    check_once(run, ref, seqs)
    check_after(run, pub, [sub, ref])
    check_integrity(run, pub, [sub, ref])
    for p in (pub, sub, ref):
        check_exit(run, p)


def sc_two_step(run, P, S):
    pub, sub, ref = _pair(run, P, S, s_opts={"rcv_settle_mode": "second"})
    seqs = set(range(1, N + 1))
    check_outcomes(run, pub, "accepted", seqs)
    check_once(run, sub, seqs)
    check_once(run, ref, seqs)
    check_after(run, pub, [sub, ref])
    settled = {e["seq"]: e for e in sub.events() if e.get("event") == "settled"}
    missing = seqs - set(settled)
    if missing:
        run.problems.append(f"sub {sub.label} ({S}): the router's settlement never reached it for seq {_seq_ranges(missing)}")
    errors = [e for e in settled.values() if e.get("error")]
    if errors:
        run.problems.append(
            f"sub {sub.label} ({S}): settlement not confirmed to the application ({len(errors)}x): {errors[0]['error']}"
        )
    # The router settles the publisher's delivery with its final outcome, and relays that
    # settlement in the same write: the subscriber's settlement and the publisher's outcome
    # race between processes. What must hold (causally, so without a race): it is never
    # settled before every owed subscriber (it and the bystander) answered.
    answered: dict[int, float] = {}
    for peer in (sub, ref):
        for e in delivered(peer):
            if e.get("outcome") in ("accepted", "rejected", "released", "modified"):
                answered[e["seq"]] = max(answered.get(e["seq"], 0.0), e["ts"])
    early = [s for s, e in settled.items() if s in answered and e["ts"] + TS_SLACK < answered[s]]
    if early:
        run.problems.append(f"sub {sub.label}: settled before every subscriber had answered (seq {_seq_ranges(early)})")
    check_integrity(run, pub, [sub, ref])
    for p in (pub, sub, ref):
        check_exit(run, p)


def sc_hold(run, P, S):
    pub, sub, ref = _pair(run, P, S, s_opts={"outcome": "hold", "linger": HOLD_LINGER})
    seqs = set(range(1, N + 1))
    check_outcomes(run, pub, "accepted", seqs)
    check_once(run, sub, seqs)
    check_once(run, ref, seqs)
    held_until = max((e["ts"] for e in delivered(sub)), default=0) + HOLD_LINGER * 0.9
    early = [s for s, evs in outcomes(pub).items() if evs[0]["ts"] < held_until]
    if early:
        run.problems.append(f"pub {pub.label}: outcome while {S} still held the delivery (seq {_seq_ranges(early)})")
    check_integrity(run, pub, [sub, ref])
    for p in (pub, sub, ref):
        check_exit(run, p)


def sc_sub_disconnect(run, P, S):
    k = 4
    pub, sub, ref = _pair(run, P, S, s_opts={"disconnect_after": k})
    seqs = set(range(1, N + 1))
    check_outcomes(run, pub, "accepted", seqs)
    check_once(run, ref, seqs)
    check_once(run, sub, set(range(1, k + 1)))
    check_after(run, pub, [sub, ref])
    check_integrity(run, pub, [sub, ref])
    for p in (pub, sub, ref):
        check_exit(run, p)


def sc_pub_disconnect(run, P, S):
    k = 3
    subs = run.subscribers(("sub", S, "sub", 10**6, {"timeout": 60}), ("ref", REFERENCE, "pub", 10**6, {"timeout": 60}))
    pub = run.start("pub", P, "publisher", "pub", N, disconnect_after=k)
    run.finish_publisher(pub)
    check_exit(run, pub)
    run.wait_quiet(subs, cap=5.0)
    got = outcomes(pub)
    accepted = {s for s, evs in got.items() if evs[0]["outcome"] == "accepted"}
    if len(got) < k or accepted != set(got):
        run.problems.append(
            f"pub {pub.label} ({P}): expected {k} accepted outcomes before it dropped, got "
            f"{dict(Counter(evs[0]['outcome'] for evs in got.values()))}"
        )
    have = {s.label: {e["seq"] for e in delivered(s, 1, N)} for s in subs}
    for s in subs:
        check_once(run, s, have[s.label], hi=N)  # duplicates only
        if not accepted <= have[s.label]:
            run.problems.append(f"sub {s.label}: missing accepted seq {_seq_ranges(accepted - have[s.label])}")
        if not have[s.label] <= sent(pub):
            run.problems.append(f"sub {s.label}: got seq never sent {_seq_ranges(have[s.label] - sent(pub))}")
    if have["sub"] != have["ref"]:
        run.problems.append(
            f"subscribers disagree on P's in-flight messages: sub {_seq_ranges(have['sub'])}, ref {_seq_ranges(have['ref'])}"
        )
    check_integrity(run, pub, subs)
    _bystander(run, subs)


def sc_presettled(run, P, S):
    pub, sub, ref = _pair(run, P, S, p_opts={"settle": "presettled"})
    seqs = set(range(1, N + 1))
    check_no_outcomes(run, pub)
    for s in (sub, ref):
        check_once(run, s, seqs)
        not_pre = [e["seq"] for e in delivered(s) if not e.get("presettled")]
        if not_pre:
            run.problems.append(f"sub {s.label}: seq {_seq_ranges(not_pre)} arrived unsettled")
    check_integrity(run, pub, [sub, ref])
    for p in (pub, sub, ref):
        check_exit(run, p)


def sc_at_most_once(run, P, S):
    pub, sub, ref = _pair(run, P, S, s_opts={"snd_settle_mode": "settled"})
    seqs = set(range(1, N + 1))
    check_outcomes(run, pub, "accepted", seqs)
    check_once(run, sub, seqs)
    check_once(run, ref, seqs)
    not_pre = [e["seq"] for e in delivered(sub) if not e.get("presettled")]
    if not_pre:
        run.problems.append(f"sub {sub.label} ({S}): seq {_seq_ranges(not_pre)} arrived unsettled on an at-most-once link")
    check_after(run, pub, [ref])
    check_integrity(run, pub, [sub, ref])
    for p in (pub, sub, ref):
        check_exit(run, p)


def sc_large(run, P, S):
    size = MAX_MESSAGE_SIZE - 1024  # the encoded message (header, properties, body) stays under the limit
    n = 3
    pub, sub, ref = _pair(run, P, S, p_opts={"size": size, "timeout": 15}, p_count=n, s_count=n, ref_count=n)
    seqs = set(range(1, n + 1))
    check_outcomes(run, pub, "accepted", seqs)
    for s in (sub, ref):
        check_once(run, s, seqs)
        bad = [e["seq"] for e in delivered(s) if e.get("size") != size]
        if bad:
            run.problems.append(f"sub {s.label}: seq {_seq_ranges(bad)} arrived with another body size")
    check_after(run, pub, [sub, ref])
    check_integrity(run, pub, [sub, ref])
    for p in (pub, sub, ref):
        check_exit(run, p)


def sc_oversize(run, P, S):
    n = 2
    subs = run.subscribers(("sub", S, "sub", 10**6, {"timeout": 60}), ("ref", REFERENCE, "pub", 10**6, {"timeout": 60}))
    pub = run.start("pub", P, "publisher", "pub", n, size=MAX_MESSAGE_SIZE + 1024, timeout=15)
    run.finish_publisher(pub)
    check_outcomes(run, pub, "rejected", set(range(1, n + 1)), condition="amqp:link:message-size-exceeded")
    check_exit(run, pub)
    _bystander(run, subs)
    for s in subs:
        got = delivered(s, 1, n)
        if got:
            run.problems.append(f"sub {s.label}: got oversize seq {_seq_ranges(e['seq'] for e in got)}")


def sc_default_settlement(run, P, S):
    n = IN_FLIGHT_LIMIT + 10
    pub, sub, ref = _pair(run, P, S, p_opts={"settle": "default"}, p_count=n, s_count=n, ref_count=n)
    seqs = set(range(1, n + 1))
    check_outcomes(run, pub, "accepted", seqs)
    check_once(run, sub, seqs, exact=False)
    check_exit(run, pub)


RUNNERS = {
    "accept": sc_accept,
    "reject": sc_reject,
    "release": sc_release,
    "two-step": sc_two_step,
    "hold": sc_hold,
    "sub-disconnect": sc_sub_disconnect,
    "pub-disconnect": sc_pub_disconnect,
    "presettled": sc_presettled,
    "at-most-once": sc_at_most_once,
    "large": sc_large,
    "oversize": sc_oversize,
    "default-settlement": sc_default_settlement,
}


def known_cause(result: Result) -> str | None:
    """The known cause of a failed cell, when its problems show that cause's signature."""
    if result.status != "fail":
        return None
    keys = [result.scenario] if result.scenario in KNOWN_CAUSES else []
    for key in keys:
        cause, signature = KNOWN_CAUSES[key]
        if signature in result.reason:
            return cause
    return None


def run_scenario(scenario: str, pub: str, sub: str, topo: Topology, workdir: Path) -> Result:
    """Run one cell. Stacks that cannot be set up, or a scenario a client cannot do, give ``skip``."""
    result = Result(scenario, topo.name, pub, sub)
    for stack in {pub, sub, REFERENCE}:
        reason = peers.setup(stack)
        if reason is not None:
            result.status, result.problems = "skip", [f"cannot install {reason}"]
            return result
    na = NOT_APPLICABLE.get((pub, "publisher", scenario)) or NOT_APPLICABLE.get((sub, "subscriber", scenario))
    if na:
        result.status, result.problems = "skip", [na]
        return result
    run = Run(Path(workdir), topo, scenario, pub, sub)
    t0 = time.monotonic()
    try:
        RUNNERS[scenario](run, pub, sub)
    except ScenarioError as err:
        run.problems.append(str(err))
    finally:
        run.kill_all()
    check_format(run)
    result.seconds = time.monotonic() - t0
    if run.problems:
        result.status, result.problems = "fail", run.problems
        result.diagnostics = run.diagnostics()
    return result


# --------------------------------------------------------------------------- failover (resumable peers)

# Resumable peers keep their link identity, incarnation and unsettled state in a state file and resume their
# links on another router when theirs dies (docs/resumption.md, docs/client.md "Other stacks"). They are
# given only their own router: the others they learn from its failover-server-list. stack -> role -> argv.
RESUMABLE = {
    "rhea": {role: ["node", str(peers.INTEROP / "rhea" / f"resumable-{role}.js")] for role in ("publisher", "subscriber")},
    # the reference: router.client (python -m router.client publish|subscribe; its own command line)
    "python": {
        "publisher": [sys.executable, "-m", "router.client", "publish"],
        "subscriber": [sys.executable, "-m", "router.client", "subscribe"],
    },
}
FAILOVER_SCENARIOS: dict[str, str] = {
    "resume-kill": "P and S on router A of three (A, B, C), a router.client subscriber (the bystander) on C; A is "
    "SIGKILLed mid-stream; P and S resume on another router: every message P got accepted is handed "
    "to each application exactly once, in P's order, nothing else; no router keeps a record",
    "resume-kill-sub": "S on A, P on B; A is SIGKILLed mid-stream; S resumes elsewhere; the same verdict",
    "resume-kill-pub": "P on A, S on B; A is SIGKILLed mid-stream; P resumes elsewhere and resends; the same verdict",
}
# scenario -> (P's router, S's router, the bystander's router or None); "A" is the one killed
FAILOVER_PLACEMENT = {"resume-kill": ("A", "A", "C"), "resume-kill-sub": ("B", "A", None), "resume-kill-pub": ("A", "B", None)}
FAILOVER_KILLED = "A"
FAILOVER_N = 600  # messages
FAILOVER_WINDOW = 40  # P's unanswered messages at most: that many are in flight when A dies
FAILOVER_SUB_DELAY_MS = 3  # S's application time per message: steady traffic, deliveries in flight at S
FAILOVER_KILL_AFTER = 100  # A dies once S handed this many messages to its application


@dataclass
class FailoverTopology:
    """Routers someone else runs (at least A, B and C), and how to kill one: ``kill("A")`` SIGKILLs it;
    ``leftovers(dead)`` -> {router: records it still holds} for the live routers (optional);
    ``events(dead)`` -> {router: its event log (docs/event-log.md) as dicts} for the live routers (optional:
    the placeholder events behind a failure are then named in the result)."""

    name: str
    routers: dict[str, tuple[str, int]]
    kill: object
    leftovers: object = None
    events: object = None


class ResumablePeer(Peer):
    """A resumable peer (RESUMABLE): interop/rhea's, or router.client's (stack "python")."""

    def __init__(
        self, workdir: Path, label: str, stack: str, role: str, urls: list[tuple[str, int]], topic: str, count: int, options: dict
    ):
        self.label, self.stack, self.role = label, stack, role
        self.ledger = workdir / f"{label}.jsonl"
        self.state = workdir / f"{label}.state"
        self.stdout_path = workdir / f"{label}.stdout"
        self.stderr_path = workdir / f"{label}.stderr"
        self.container_id = f"{label}-{uuid.uuid4().hex[:6]}"
        if stack == "python":
            argv = RESUMABLE[stack][role] + [
                "--topic",
                topic,
                "--container-id",
                self.container_id,
                "--link",
                f"{self.container_id}-link",
                "--state",
                str(self.state),
                "--ledger",
                str(self.ledger),
                "--count" if role == "publisher" else "--expect",
                str(count),
            ]
            for host, port in urls:
                argv += ["--url", f"{host}:{port}"]
            options = dict(options)
            if "delay_ms" in options:
                options["delay"] = options.pop("delay_ms") / 1000.0
        else:
            host, port = urls[0]
            argv = RESUMABLE[stack][role] + [
                host,
                str(port),
                topic,
                str(count),
                "--ledger",
                str(self.ledger),
                "--state",
                str(self.state),
                "--container-id",
                self.container_id,
            ]
            for host, port in urls[1:]:
                argv += ["--url", f"{host}:{port}"]
        for key, value in options.items():
            argv += [f"--{key.replace('_', '-')}", str(value)]
        self.argv = argv
        self.started = time.time()
        with open(self.stdout_path, "wb") as out, open(self.stderr_path, "wb") as err:
            self.proc = subprocess.Popen(
                argv, stdin=subprocess.DEVNULL, stdout=out, stderr=err, cwd=str(peers.ROOT), start_new_session=True
            )
        self.ended = None
        self.killed = False

    def is_ready(self) -> bool:
        return any(line.startswith("ready") for line in self.stdout().splitlines())

    def terminate(self) -> None:
        """SIGTERM: a resumable peer detaches its link (the subscription stays) and exits."""
        if self.proc.poll() is None:
            try:
                self.proc.send_signal(signal.SIGTERM)
            except ProcessLookupError:
                pass


def _last_outcomes(pub: Peer) -> dict[int, str]:
    last = {}
    for e in pub.events():
        if e.get("event") == "outcome":
            last[e.get("seq")] = e.get("outcome")
    return last


def _after(events: list[dict], event: str, ts: float) -> list[dict]:
    return [e for e in events if e.get("event") == event and e.get("ts", 0) > ts]


def check_resumed_stream(run: Run, pub: Peer, subs: list[Peer], n: int) -> list[int]:
    """Every seq P got accepted (the last outcome per seq) is handed to each subscriber's application exactly once,
    in P's order, intact (digest, publisher tag), and nothing else is. Returns the accepted seqs."""
    last = _last_outcomes(pub)
    accepted = sorted(s for s, o in last.items() if o == "accepted")
    what = f"pub {pub.label} ({pub.stack})"
    missing = set(range(1, n + 1)) - set(last)
    if missing:
        run.problems.append(f"{what}: no outcome for seq {_seq_ranges(missing)}")
    other = Counter(o for o in last.values() if o != "accepted")
    if other:
        run.problems.append(f"{what}: outcomes other than accepted: {dict(other)}")
    sent_by_seq: dict[int, dict] = {}
    for e in pub.events():
        if e.get("event") == "sent":
            sent_by_seq.setdefault(e["seq"], e)
    for sub in subs:
        evs = [e for e in sub.events() if e.get("event") == "delivered"]
        tags = Counter(e.get("delivery") for e in evs)
        twice = [t for t, k in tags.items() if k > 1]
        swhat = f"sub {sub.label} ({sub.stack})"
        if twice:
            run.problems.append(f"{swhat}: {len(twice)} deliveries handed to the application more than once")
        seqs = [e.get("seq") for e in evs]
        if seqs != accepted:
            counts = Counter(seqs)
            lost = set(accepted) - set(counts)
            dups = {s for s, k in counts.items() if k > 1}
            extra = set(counts) - set(accepted)
            parts = []
            if lost:
                parts.append(f"lost seq {_seq_ranges(lost)}")
            if dups:
                parts.append(f"duplicated seq {_seq_ranges(dups)}")
            if extra:
                parts.append(f"seq P never got accepted {_seq_ranges(s for s in extra if s is not None)}")
            if not parts:
                first = next(i for i, (a, b) in enumerate(zip(seqs, sorted(seqs))) if a != b)
                parts.append(f"out of P's order at position {first} (seq {seqs[max(0, first - 2) : first + 3]})")
            run.problems.append(f"{swhat}: " + "; ".join(parts))
        bad = [
            e.get("seq")
            for e in evs
            if e.get("seq") in sent_by_seq
            and (
                e.get("digest") != sent_by_seq[e["seq"]].get("digest") or e.get("pub_tag") != sent_by_seq[e["seq"]].get("pub_tag")
            )
        ]
        if bad:
            run.problems.append(f"{swhat}: body digest or publisher tag differs from P's for seq {_seq_ranges(bad)}")
    return accepted


def _pub_tag_text(delivery) -> str:
    """The publisher's own tag inside a router's delivery id (docs/tags.md), as text when printable."""
    try:
        tag = bytes.fromhex(str(delivery).split(".")[0])
    except ValueError:
        return str(delivery)
    if len(tag) > 17 and tag[16] == len(tag) - 17:
        inline = tag[17:]
        return inline.decode() if inline.isascii() and inline.decode().isprintable() else inline.hex()
    return tag.hex()


def run_failover_scenario(
    scenario: str,
    pub_stack: str,
    sub_stack: str,
    topo: FailoverTopology,
    workdir: Path,
    sub_pattern: bool = False,
) -> Result:
    """Resumable P and S (and, in resume-kill, a router.client bystander subscriber) on the routers
    FAILOVER_PLACEMENT says; router A is killed mid-stream; the ledgers decide (check_resumed_stream), and
    ``topo.leftovers`` must empty. The recovery time (kill -> traffic flowing again) goes into ``notes``.
    ``sub_pattern``: S subscribes to a pattern taking the topic (``<parent>/+``) rather than to the topic."""
    result = Result(scenario, topo.name, pub_stack, sub_stack)
    for stack in dict.fromkeys((pub_stack, sub_stack, REFERENCE)):
        if stack not in RESUMABLE:
            result.status, result.problems = "skip", [f"{stack}: no resumable client (only {', '.join(RESUMABLE)})"]
            return result
        reason = peers.setup(stack)
        if reason is not None:
            result.status, result.problems = "skip", [f"cannot install {reason}"]
            return result
    p_at, s_at, b_at = FAILOVER_PLACEMENT[scenario]
    killed = FAILOVER_KILLED
    killed_url = "{}:{}".format(*topo.routers[killed])
    run = Run(Path(workdir), topo, scenario, pub_stack, sub_stack)
    t0 = time.monotonic()
    killed_at = None
    try:
        common = {"heartbeat": 1, "timeout": 90}
        # Subscribers stay until P is done and their ledgers are quiet (count 0), then are told to go (SIGTERM:
        # detach): like applications that outlive one publisher, they are there when a router owes them a resend.
        subs = [
            ResumablePeer(
                run.dir,
                "sub",
                sub_stack,
                "subscriber",
                [topo.routers[s_at]],
                run.topic.rsplit("/", 1)[0] + "/+" if sub_pattern else run.topic,
                0,
                dict(common, delay_ms=FAILOVER_SUB_DELAY_MS),
            )
        ]
        if b_at is not None:
            order = [b_at] + sorted(r for r in topo.routers if r != b_at)
            subs.append(
                ResumablePeer(
                    run.dir, "bystander", REFERENCE, "subscriber", [topo.routers[r] for r in order], run.topic, 0, dict(common)
                )
            )
        run.peers.extend(subs)
        deadline = time.monotonic() + 30
        while not all(s.is_ready() for s in subs):
            for s in subs:
                if s.poll() is not None and not s.is_ready():
                    raise ScenarioError(f"subscriber {s.describe()} exited before attaching; stderr: {s.stderr_tail(3)}")
            if time.monotonic() > deadline:
                raise ScenarioError(f"subscribers {[s.label for s in subs if not s.is_ready()]} not attached in 30 s")
            time.sleep(0.02)
        pub = ResumablePeer(
            run.dir,
            "pub",
            pub_stack,
            "publisher",
            [topo.routers[p_at]],
            run.topic,
            FAILOVER_N,
            dict(common, window=FAILOVER_WINDOW),
        )
        run.peers.append(pub)
        deadline = time.monotonic() + 30
        while len(delivered(subs[0])) < FAILOVER_KILL_AFTER:
            if pub.poll() is not None or subs[0].poll() is not None:
                raise ScenarioError(
                    f"a peer exited before the kill: {pub.describe()}, {subs[0].describe()}; "
                    f"stderr: {pub.stderr_tail(3)} {subs[0].stderr_tail(3)}"
                )
            if time.monotonic() > deadline:
                raise ScenarioError(f"traffic did not reach {FAILOVER_KILL_AFTER} messages at S within 30 s")
            time.sleep(0.01)
        killed_at = time.time()
        topo.kill(killed)
        run.finish_publisher(pub, cap=90.0)
        run.wait_quiet(subs, cap=10.0)
        for s in subs:
            s.terminate()
        deadline = time.monotonic() + 10
        for s in subs:
            if s.wait(deadline - time.monotonic()) is None:
                run.problems.append(f"{s.label} ({s.stack}) still running 10 s after SIGTERM: killed")
                s.kill()
        check_resumed_stream(run, pub, subs, FAILOVER_N)
        for p in [pub] + subs:
            check_exit(run, p)
        # each resumable peer whose router died resumed after the kill, and the resume carried state
        for p in [pub, subs[0]]:
            home = p_at if p is pub else s_at
            resumed = _after(p.events(), "resumed", killed_at)
            if home == killed and not resumed:
                run.problems.append(f"{p.label} ({p.stack}): no resumed line after its router was killed")
            for e in resumed[:1]:
                keys = ("reported", "known", "resend") if p is pub else ("reported", "known", "settled")
                result.notes.append(f"{p.label} resumed on {e.get('router')}: " + ", ".join(f"{k} {e.get(k)}" for k in keys))
            if p is pub and home == killed and resumed and not resumed[0].get("reported"):
                run.problems.append(
                    f"{p.label}: resumed with nothing unsettled: the kill did not catch a delivery "
                    f"in flight (the scenario tests less than it should)"
                )
        out_after = [e["ts"] for e in _after(pub.events(), "outcome", killed_at) if e.get("router") != killed_url]
        if out_after:
            result.notes.append(f"P's last outcome {max(out_after) - killed_at:.2f} s after the kill")
        got_after = [e["ts"] for e in _after(subs[0].events(), "delivered", killed_at) if e.get("router") != killed_url]
        if out_after:
            result.notes.append(f"recovery: P's outcomes flowing again {min(out_after) - killed_at:.2f} s after the kill")
        if got_after:
            result.notes.append(f"recovery: S handed messages again {min(got_after) - killed_at:.2f} s after the kill")
        summary = subs[0].summary()
        if summary.get("duplicates_suppressed"):
            result.notes.append(f"S recognised {summary['duplicates_suppressed']} redelivered tags (not handed over again)")
        if summary.get("unsettled"):
            result.notes.append(f"S ended with {summary['unsettled']} deliveries the router never settled on its resumed link")
        if topo.events is not None:
            for rid, events in topo.events({killed}).items():
                expired = [
                    e
                    for e in events
                    if e.get("event") == "placeholder-expired"
                    and str(e.get("subscriber", "")).startswith(subs[0].container_id + "/")
                ]
                if expired:
                    result.notes.append(
                        f"router {rid}: {len(expired)} placeholder-expired for S (publisher tags "
                        f"{', '.join(_pub_tag_text(e.get('delivery')) for e in expired[:8])}"
                        f"{', ...' if len(expired) > 8 else ''}): S reported them unsettled on resuming, the router "
                        f"did not know them and held S's stream for them"
                    )
        if topo.leftovers is not None and not run.problems:
            deadline = time.monotonic() + 20
            while True:
                left = topo.leftovers({killed})
                if not left:
                    break
                if time.monotonic() > deadline:
                    run.problems.append(f"records left on live routers 20 s after the end: {left}")
                    break
                time.sleep(0.1)
    except ScenarioError as err:
        run.problems.append(str(err))
    finally:
        run.kill_all()
    check_format(run)
    result.seconds = time.monotonic() - t0
    if run.problems:
        result.status, result.problems = "fail", run.problems
        result.diagnostics = run.diagnostics()
    return result


# --------------------------------------------------------------------------- rendering


def render(results: list[Result], header: str = "") -> str:
    """The matrix as text: per topology, publisher rows x subscriber columns, each cell
    "passed/run" (+ skips) with note numbers; then the notes: every failure and skip, grouped by cause."""
    lines = [header] if header else []
    notes: dict[str, list[Result]] = {}
    latest = {}
    for r in results:  # a cell run twice (the fast and the full suite): the last run counts
        latest[(r.topology, r.scenario, r.pub, r.sub)] = r
    results = list(latest.values())

    def note(r: Result) -> int:
        text = _note_text(r)
        notes.setdefault(text, []).append(r)
        return list(notes).index(text) + 1

    topologies = list(dict.fromkeys(r.topology for r in results))
    pair_scenarios = [s for s in SCENARIOS if any(r.scenario == s for r in results)]
    pub_scenarios = [s for s in PUBLISHER_SCENARIOS if any(r.scenario == s for r in results)]
    failover_scenarios = [s for s in FAILOVER_SCENARIOS if any(r.scenario == s for r in results)]
    width = 16
    for topo in topologies:
        rs = [r for r in results if r.topology == topo and r.scenario in SCENARIOS]
        if rs:
            lines.append(f"{topo}: publisher (rows) x subscriber (columns), scenarios passed/run")
            lines.append("  " + "pub \\ sub".ljust(10) + "".join(s.ljust(width) for s in STACKS).rstrip())
            for p in STACKS:
                row = "  " + p.ljust(10)
                for s in STACKS:
                    cell = [r for r in rs if r.pub == p and r.sub == s]
                    if not cell:
                        row += "-".ljust(width)
                        continue
                    ran = [r for r in cell if r.status != "skip"]
                    ok = [r for r in ran if r.status == "pass"]
                    text = f"{len(ok)}/{len(ran)}" + (f"+{len(cell) - len(ran)}s" if len(cell) > len(ran) else "")
                    marks = sorted({note(r) for r in cell if r.status != "pass"})
                    if marks:
                        text += " [" + ",".join(map(str, marks)) + "]"
                    row += (text + " ").ljust(width)
                lines.append(row.rstrip())
        ps = [r for r in results if r.topology == topo and r.scenario in PUBLISHER_SCENARIOS]
        for sc in pub_scenarios:
            cells = []
            for p in STACKS:
                r = next((r for r in ps if r.scenario == sc and r.pub == p), None)
                if r is not None:
                    text = {"pass": "pass", "fail": "FAIL", "skip": "skip"}[r.status]
                    cells.append(f"{p} {text}" + (f" [{note(r)}]" if r.status != "pass" else ""))
            if cells:
                lines.append(f"  {sc} (publisher only): " + ", ".join(cells))
        for i, sc in enumerate([s for s in FAILOVER_SCENARIOS if any(r.scenario == s and r.topology == topo for r in results)]):
            if i == 0 and not rs and not ps:
                lines.append(f"{topo}:")
            cells = []
            for r in [r for r in results if r.topology == topo and r.scenario == sc]:
                text = {"pass": "pass", "fail": "FAIL", "skip": "skip"}[r.status]
                cells.append(
                    f"{r.pub}->{r.sub} {text}"
                    + (f" [{note(r)}]" if r.status != "pass" else "")
                    + (
                        f" ({'; '.join(n for n in r.notes if n.startswith('recovery'))})"
                        if r.status == "pass" and r.notes
                        else ""
                    )
                )
            lines.append(f"  {sc} (resumable clients): " + ", ".join(cells))
    lines.append("scenarios (P publisher, S subscriber under test, bystander: a python-qpid-proton subscriber on P's router):")
    lines.extend(
        f"  {s}: {SCENARIOS.get(s) or PUBLISHER_SCENARIOS.get(s) or FAILOVER_SCENARIOS.get(s)}"
        for s in pair_scenarios + pub_scenarios + failover_scenarios
    )
    if notes:
        lines.append("notes (s = skipped):")
        for n, (text, rs) in enumerate(notes.items(), 1):
            lines.append(f"  [{n}] {text} ({_cells(rs)})")
    return "\n".join(lines)


def _cells(rs: list[Result]) -> str:
    """Which cells a note covers, compactly."""
    scen = list(dict.fromkeys(r.scenario for r in rs))
    pairs = {(r.pub, r.sub) for r in rs}
    topos = list(dict.fromkeys(r.topology for r in rs))
    pubs = sorted({p for p, _ in pairs}, key=STACKS.index)
    subs = sorted({s for _, s in pairs}, key=STACKS.index)

    def stacks(names: list[str], role: str) -> str:
        return f"any {role}" if len(names) == len(STACKS) else f"{role} {', '.join(names)}"

    if scen[0] in PUBLISHER_SCENARIOS:
        who = stacks(pubs, "publisher")
    elif len(pairs) == len(pubs) * len(subs) and len(pairs) > 1:
        who = f"{stacks(pubs, 'publisher')} x {stacks(subs, 'subscriber')}"
    else:
        who = ", ".join(f"{p}->{s}" for p, s in sorted(pairs, key=lambda ps: (STACKS.index(ps[0]), STACKS.index(ps[1]))))
    return f"{', '.join(scen)}; {who}; {' and '.join(topos)}"


def _note_text(r: Result) -> str:
    if r.status == "skip":
        return f"skipped: {r.reason}"
    cause = known_cause(r)
    return f"FAIL: {cause}" if cause else f"FAIL: {r.reason}"


def save(results: list[Result], path: Path) -> None:
    """The cells as JSON (``render`` them again with ``python -m interop.matrix PATH``)."""
    Path(path).write_text(
        json.dumps([{k: v for k, v in vars(r).items() if k != "diagnostics"} for r in results], indent=1) + "\n"
    )


def load(path: Path) -> list[Result]:
    return [Result(**item) for item in json.loads(Path(path).read_text())]


def main(argv: list[str] | None = None) -> int:
    import sys

    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print(
            "usage: python -m interop.matrix RESULTS.json   (prints the matrix; scripts/interop writes the file)", file=sys.stderr
        )
        return 2
    print(render(load(Path(args[0]))))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
