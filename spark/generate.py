"""Synthetic event logs of a router network, with known truth.

``scripts/gen-logs OUT --events 10000000`` (or ``python -m spark generate``) writes
what a network of routers would log (same files, same fields, same event order
rules as router/eventlog.py and router/core) for publishers and subscribers spread
over it, plus the applications' ledgers (docs/ledger.md), and ``truth.json``: the
violations the reconciliation must find. Faults can be injected (``--fault``),
each with its exact expected violations.

The model, per delivery (docs/delivery-rule.md, docs/inter-router.md): the origin
router logs ``received`` (owed local subscribers, interested remote routers) and a
``forwarded-to-router`` per remote router; each remote router logs ``received``
(``origin_router``), sends to its subscribers (at once, or later as ``forwarded``),
their ``sub-outcome``s and one ``outcome-to-router``; the origin logs
``outcome-from-router``, the ``pub-outcome`` (the delivery rule's aggregate),
``settled``, ``settlement-relayed`` and ``record-deleted``; the remote routers
``settled`` (by origin-router). Variations: rejections, ttl expiry, non-durable
subscribers detaching with deliveries in flight (they stop being owed), remote
routers whose subscribers all left ("none"), pre-settled publishers, refused
deliveries, router restarts (new epoch, new boot, fresh incarnations).

Deliveries are generated in rounds of ``--round`` deliveries; within a round every
router's events are ordered by simulated time (so deliveries interleave), and a
round ends before the next starts, so memory stays flat at any size.
"""

from __future__ import annotations

import argparse
import hashlib
import heapq
import json
import os
import random
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

import orjson

from router.eventschema import Kind, fold

#: docs/ledger.md: every line has every one of these, in this order.
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
FAULTS = (
    "drop-accept",
    "dup-tag",
    "reorder",
    "invented",
    "leftover",
    # the holes issue 15's audit found, and issue 14's race (docs/reconcile.md has the table)
    "accept-unowed",
    "accept-unsent",
    "forward-dropped",
    "answer-dropped",
    "restart-answer",
    "outcome-released",
    "outcome-refused",
    "seq-gap",
    "seq-repeated",
    "malformed",
    "garbage",
    "torn-tail",
)
LEDGER_FAULTS = ("ledger-missing", "ledger-twice", "ledger-pub-outcome")
#: Faults that need a network (a remote router) or peers to act on.
NETWORK_FAULTS = ("forward-dropped", "answer-dropped", "restart-answer", "seq-gap", "seq-repeated", "malformed")

_DUMPS = orjson.dumps
_NL = orjson.OPT_APPEND_NEWLINE


class CannotInject(Exception):
    """The history has no place for a requested fault (e.g. no late sends to reorder)."""


@dataclass
class Spec:
    """What to generate. ``seed`` fixes every random choice."""

    routers: int = 3
    publishers: int = 2
    subscribers: int = 3
    topics: int = 1
    deliveries: int = 50
    events: int = 0  # when set: generate until about this many events (overrides deliveries)
    round_size: int = 200
    seed: int = 1
    prefix: str = ""  # namespaces routers, clients and delivery ids (several histories in one dataset)
    p_reject: float = 0.02
    p_expire: float = 0.01
    p_detach: float = 0.3  # per round: a non-durable subscriber drops its link mid-round
    p_presettled: float = 0.05
    p_refused: float = 0.01
    p_late: float = 0.3  # a send that waits for credit (a separate `forwarded` event)
    p_restart: float = 0.0  # per round and router: it stops and starts again (new epoch)
    p_fold: float = 0.0  # a sub-outcome directly followed by its accepted pub-outcome: one "completed" line
    p_batch: float = 0.0  # consecutive sub-outcomes of one subscriber, outcome and settled: one "sub-outcomes" line
    alo_topics: int = 0  # the first this many topics are at-least-once (docs/guarantees.md)
    p_repeat: float = 0.2  # an at-least-once copy a subscriber accepted is sent and accepted again (half of them handed again)
    faults: tuple[str, ...] = ()
    ledgers: bool = True
    ts0: float = 1_763_785_200.0


@dataclass
class Sub:
    container: str
    name: str
    router: str
    topic: str
    durable: int
    attached: bool = True
    detach_at: float | None = None
    link: int = 0

    @property
    def key(self) -> str:
        return f"{self.container}/{self.name}"


@dataclass
class Pub:
    container: str
    name: str
    router: str
    topic: str
    presettled: bool
    incarnation: str = ""
    next_seq: int = 0
    next_tag: int = 1
    link: int = 0


@dataclass
class RouterLog:
    rid: str
    directory: Path
    epoch: int = 0
    boot: str = ""
    seq: int = 0
    fh: BinaryIO | None = None
    lines: int = 0
    pending: list = field(default_factory=list)  # heap of (t, order, kind, fields)
    links: int = 0
    file_lines: int = 0  # lines written to the current file (the line number of a malformed line)
    missing_run_end: int = 0  # the last seq of this epoch known missing (a run of them is one seq-gap)


class Generator:
    def __init__(self, spec: Spec, out: Path):
        self.spec = spec
        self.out = Path(out)
        self.rng = random.Random(spec.seed)
        self.order = 0
        self.now = spec.ts0
        self.truth: dict[str, set] = {}
        self.events = 0
        self.folded = 0  # "completed" lines written (each stands for 2-3 events)
        self.batched = 0  # "sub-outcomes" lines written (each stands for 2 or more events)
        self.deliveries = 0
        p = spec.prefix
        self.router_ids = [f"{p}{chr(ord('A') + i)}" for i in range(spec.routers)]
        self.routers = {r: RouterLog(r, self.out / r / "events") for r in self.router_ids}
        topics = [f"{p}topic-{i}" for i in range(spec.topics)]
        self.alo_topics = set(topics[: spec.alo_topics])
        # What the proof must count for them (summary.at_least_once): never violations.
        self.alo = {"deliveries": 0, "duplicates": 0, "app_duplicates": 0}
        rng = self.rng
        self.subs = [
            Sub(
                f"{p}sub-{i}",
                f"{p}sub-{i}-in",
                rng.choice(self.router_ids),
                topics[i % len(topics)],
                2 if rng.random() < 0.3 else 0,
            )
            for i in range(spec.subscribers)
        ]
        self.pubs = [
            Pub(
                f"{p}pub-{i}",
                f"{p}pub-{i}-out",
                rng.choice(self.router_ids),
                topics[i % len(topics)],
                rng.random() < spec.p_presettled,
            )
            for i in range(spec.publishers)
        ]
        self.ledger: dict[str, list] = {}
        # What the job must find (fault injection) and what we need to inject them.
        self.accepted_sub: list = []  # (router, epoch, delivery, sub) accepted, for drop-accept / dup-tag
        self.late_sends: dict = {}  # (router, epoch, sub) -> [(seq-less event ref)], for reorder
        self.closers: list = []  # (router, epoch, delivery) with a closing event, for leftover
        self.fault_plan = list(spec.faults)
        self.used: set = set()  # deliveries a fault touched: faults never share one (their truths stay exact)
        self.round: list = []  # this round's deliveries, as injection needs them (only with faults planned)
        self._recv_here: dict = {}  # router -> deliveries it received (this delivery's, cleared after it)
        self.fully_accepted: set = set()  # deliveries every owed subscriber accepted (only with faults planned)
        self.torn_tail: str | None = None  # the router whose last write a crash cut (fault torn-tail)
        self.last_remote: dict = {}  # router -> (delivery, origin, epoch) it last received as a remote router
        self.busy: dict = {}  # (router, subscriber) -> time of its last scheduled send
        self.hops: dict = {}  # (from, to) -> one-way delay (constant: copies keep publisher order)

    # ------------------------------------------------------------ writing

    def _emit(self, log: RouterLog, t: float, kind: str, fields: dict) -> dict:
        self.order += 1
        ev = {"kind": kind, "fields": fields}
        heapq.heappush(log.pending, (t, self.order, ev))
        return ev

    def _flush(self, log: RouterLog) -> None:
        buf = bytearray()
        ready = []
        while log.pending:
            t, _, ev = heapq.heappop(log.pending)
            if not ev.get("drop"):
                ready.append((t, ev))
        i = 0
        while i < len(ready):
            t, ev = ready[i]
            log.seq += 1
            ev["seq"] = log.seq
            fields = ev["fields"]
            kind = ev["kind"]
            if ev.get("garbage_before"):  # binary garbage in the middle of the file: a line of its own
                buf += b"\x00\x01\xfe garbage \xff\x00\n"
                log.file_lines += 1
                self._expect("malformed-line", f"{self._uri(log)}:{log.file_lines}")
            if ev.get("skip"):  # the line is lost: its seq is missing
                self._expect_missing_seq(log)
                i += 1
                continue
            n = self._foldable(ready, i)
            if n:  # the router's "completed" line: this sub-outcome, the pub-outcome (and settled) after it
                parts = [ready[i + k][1] for k in range(n)]
                for part in parts[1:]:
                    part["seq"] = log.seq
                kind = Kind.COMPLETED
                fields = fold(kind, [part["fields"] for part in parts])
                self.folded += 1
            else:
                n = self._batchable(ready, i)
                if n:  # the router's "sub-outcomes" line: this sub-outcome and the n - 1 after it
                    run = [ready[i + k][1] for k in range(n)]
                    for sub_outcome in run:
                        sub_outcome["seq"] = log.seq
                    # Answered within one loop iteration, which ran once the last of them had
                    # arrived: the line has that one's time (ts stays in seq order).
                    t = ready[i + n - 1][0]
                    kind = Kind.SUB_OUTCOMES
                    fields = fold(kind, [e["fields"] for e in run])
                    self.batched += 1
            line = _DUMPS(
                {
                    "seq": log.seq,
                    "ts": round(t, 6),
                    "router": log.rid,
                    "epoch": log.epoch,
                    "boot": log.boot,
                    "event": kind,
                    **fields,
                },
                option=_NL,
            )
            if ev.get("mistype"):  # valid JSON, its seq a string: unreadable, so that seq is missing too
                line = line.replace(b'{"seq":%d,' % log.seq, b'{"seq":"%d",' % log.seq, 1)
                self._expect("malformed-line", f"{self._uri(log)}:{log.file_lines + 1}")
                self._expect_missing_seq(log)
            buf += line
            log.file_lines += 1
            if ev.get("copied"):  # the same line twice: its seq is repeated
                buf += line
                log.file_lines += 1
                self._expect("seq-repeated", f"{log.rid}|{log.epoch}|{log.seq}")
            log.lines += 1
            i += n or 1
        if buf:
            assert log.fh is not None  # _start() opened it
            log.fh.write(buf)
        self.events += 0  # counted at emit time

    @staticmethod
    def _uri(log: RouterLog) -> str:
        """The current file as Spark names it (the malformed-line violations' item)."""
        return "file:" + str((log.directory / f"events-{log.epoch:06d}-000001.jsonl").resolve())

    def _foldable(self, ready: list, i: int) -> int:
        """How many events from ``ready[i]`` a router would write as one "completed" line
        (router.eventschema.FOLDED): a sub-outcome directly followed by the accepted
        pub-outcome of the same delivery (and its settled, when that comes next);
        0 when they are not, or when this history does not fold (``p_fold``). Asked again
        for the same event, it gives the same answer (a run of sub-outcomes looks ahead)."""
        ev = ready[i][1]
        if "folds" not in ev:
            ev["folds"] = self._decide_fold(ready, i)
        return ev["folds"]

    def _decide_fold(self, ready: list, i: int) -> int:
        ev = ready[i][1]
        if ev["kind"] != Kind.SUB_OUTCOME or i + 1 >= len(ready) or not self.spec.p_fold:
            return 0
        d = ev["fields"].get("delivery")
        pub = ready[i + 1][1]
        pf = pub["fields"]
        if (
            pub["kind"] != Kind.PUB_OUTCOME
            or pf.get("delivery") != d
            or pf.get("outcome") != "accepted"
            or pf.get("condition") is not None
            or pf.get("reason") is not None
        ):
            return 0
        if self.rng.random() >= self.spec.p_fold:
            return 0
        if i + 2 < len(ready) and ready[i + 2][1]["kind"] == Kind.SETTLED and ready[i + 2][1]["fields"].get("delivery") == d:
            return 3
        return 2

    def _batchable(self, ready: list, i: int) -> int:
        """How many sub-outcomes from ``ready[i]`` a router would write as one
        "sub-outcomes" line (router.eventschema.FOLDED, EventLog.append_sub_outcome):
        consecutive sub-outcomes of one subscriber with the same outcome and settled
        flag, taken as answered in one loop iteration. The run ends before any other
        event, and before a sub-outcome that a "completed" line takes (the router
        appends that one as its own line, which ends the run). 0 when fewer than two,
        or when this history does not batch (``p_batch``)."""
        if not self.spec.p_batch or ready[i][1]["kind"] != Kind.SUB_OUTCOME:
            return 0
        first = ready[i][1]["fields"]
        answer = (first["subscriber"], first["outcome"], first["settled"])
        j = i + 1
        while j < len(ready):
            ev = ready[j][1]
            if (
                ev["kind"] != Kind.SUB_OUTCOME
                or self._foldable(ready, j)
                or (ev["fields"]["subscriber"], ev["fields"]["outcome"], ev["fields"]["settled"]) != answer
            ):
                break
            j += 1
        if j - i < 2 or self.rng.random() >= self.spec.p_batch:
            return 0
        return j - i

    def _start(self, log: RouterLog, t: float) -> None:
        if log.fh is not None:
            log.fh.close()
        log.epoch += 1
        log.boot = self.rng.randbytes(8).hex()
        log.seq = 0
        log.missing_run_end = 0
        log.links = 0
        log.file_lines = 0
        log.directory.mkdir(parents=True, exist_ok=True)
        log.fh = open(log.directory / f"events-{log.epoch:06d}-000001.jsonl", "wb")
        (log.directory.parent / "epoch").write_text(f"{log.epoch}\n")
        self._count(self._emit(log, t, Kind.ROUTER_STARTED, {"pid": 1000 + log.epoch, "version": "0.1.0"}))

    def _count(self, ev) -> dict:
        self.events += 1
        return ev

    # ------------------------------------------------------------ ledgers

    def _ledger(self, client: str, entry: dict) -> dict:
        """One ledger line (docs/ledger.md: every field, null where it does not apply)."""
        line = {f: entry.get(f) for f in LEDGER_FIELDS}
        if "condition" in entry:
            line["condition"] = entry["condition"]
        if self.spec.ledgers:
            self.ledger.setdefault(client, []).append(line)
        return line

    # ------------------------------------------------------------ the network

    def _attach_all(self, t: float, routers: list[str]) -> None:
        for rid in routers:
            log = self.routers[rid]
            others = [r for r in self.router_ids if r != rid]
            for i, other in enumerate(others):
                self._count(
                    self._emit(
                        log,
                        t,
                        Kind.PEER_CONNECTED,
                        {
                            "peer": other,
                            "conn": 100 + i,
                            "peer_epoch": self.routers[other].epoch or 1,
                            "peer_boot": self.routers[other].boot or "0" * 16,
                            "role": "connector",
                        },
                    )
                )
            if others:
                self._count(
                    self._emit(
                        log, t, Kind.ROUTES, {"reachable": sorted(others), "next_hops": [f"{o}>{o}" for o in sorted(others)]}
                    )
                )
            for sub in self.subs:
                if sub.router == rid:
                    self._attach_sub(sub, t)
            for pub in self.pubs:
                if pub.router == rid:
                    log.links += 1
                    pub.link = log.links
                    pub.incarnation = f"{log.boot}.{pub.link}"
                    pub.next_seq = 0
                    pub.next_tag = 1
                    self._count(
                        self._emit(
                            log,
                            t,
                            Kind.LINK_ATTACHED,
                            {
                                "link": pub.link,
                                "conn": pub.link,
                                "container": pub.container,
                                "name": pub.name,
                                "role": "publisher",
                                "address": pub.topic,
                                "durable": 0,
                                "incarnation": pub.incarnation,
                                "resumed": False,
                            },
                        )
                    )

    def _attach_sub(self, sub: Sub, t: float) -> None:
        log = self.routers[sub.router]
        log.links += 1
        sub.link = log.links
        sub.attached = True
        sub.detach_at = None
        self._count(
            self._emit(
                log,
                t,
                Kind.LINK_ATTACHED,
                {
                    "link": sub.link,
                    "conn": sub.link,
                    "container": sub.container,
                    "name": sub.name,
                    "role": "subscriber",
                    "address": sub.topic,
                    "durable": sub.durable,
                    "incarnation": "",
                    "resumed": False,
                },
            )
        )

    def _detach_all(self, t: float, rid: str) -> None:
        log = self.routers[rid]
        self._count(self._emit(log, t, Kind.ROUTER_STOPPING, {"reason": "shutdown requested"}))
        for sub in self.subs:
            if sub.router == rid and sub.attached:
                self._count(
                    self._emit(
                        log,
                        t + 1e-4,
                        Kind.LINK_DETACHED,
                        {
                            "link": sub.link,
                            "container": sub.container,
                            "name": sub.name,
                            "role": "subscriber",
                            "closed": False,
                            "reason": "connection-lost",
                        },
                    )
                )
        for pub in self.pubs:
            if pub.router == rid:
                self._count(
                    self._emit(
                        log,
                        t + 1e-4,
                        Kind.LINK_DETACHED,
                        {
                            "link": pub.link,
                            "container": pub.container,
                            "name": pub.name,
                            "role": "publisher",
                            "closed": False,
                            "reason": "connection-lost",
                        },
                    )
                )

    def _hop(self, a: str, b: str) -> float:
        key = (a, b)
        if key not in self.hops:
            self.hops[key] = self.rng.uniform(0.0005, 0.002)
        return self.hops[key]

    def _delivery_id(self, pub: Pub, tag: bytes) -> str:
        stream = hashlib.blake2b(f"{pub.container}|{pub.name}|{pub.incarnation}".encode(), digest_size=16).digest()
        return self.spec.prefix + (stream + bytes([len(tag)]) + tag).hex()

    def _received_at(self, d: str, rid: str) -> bool:
        return d in self._recv_here.get(rid, ())

    def _one_delivery(self, pub: Pub, t: float) -> float:
        """Generate every event of one publisher delivery arriving at ``t``; return
        the time of the publisher's outcome."""
        rng, spec = self.rng, self.spec
        origin = self.routers[pub.router]
        tag = str(pub.next_tag).encode()
        pub.next_tag += 1
        seq = pub.next_seq
        pub.next_seq += 1
        if rng.random() < spec.p_refused and not pub.presettled:
            self._count(
                self._emit(
                    origin,
                    t,
                    Kind.PUB_OUTCOME,
                    {"delivery": None, "outcome": "rejected", "condition": "amqp:decode-error", "reason": "synthetic refusal"},
                )
            )
            return t
        d = self._delivery_id(pub, tag)
        base = {
            "topic": pub.topic,
            "publisher": pub.container,
            "link_name": pub.name,
            "pub_tag": tag.hex(),
            "incarnation": pub.incarnation,
            "stream_seq": seq,
        }
        digest = hashlib.blake2b(d.encode(), digest_size=16).hexdigest()
        self._ledger(
            pub.container,
            {
                "ts": t,
                "client": pub.container,
                "link": pub.name,
                "role": "publisher",
                "event": "sent",
                "topic": pub.topic,
                "pub_tag": tag.hex(),
                "seq": seq + 1,
                "router": origin.rid,
                "incarnation": pub.incarnation,
                "digest": digest,
                "message_id": f"{pub.container}:{seq}",
            },
        )
        if pub.presettled:
            self._count(self._emit(origin, t, Kind.RECEIVED, {"delivery": d, **base, "size": 100, "settled": True, "owed": []}))
            return t
        self.deliveries += 1
        # An at-least-once topic's delivery: some copies are repeated (as a resend after a
        # failover repeats them); faults never touch it (their truths stay exact).
        alo = pub.topic in self.alo_topics
        if alo:
            self.alo["deliveries"] += 1
            if self.fault_plan:
                self.used.add(self._delivery_id(pub, tag))  # (faults skip the deliveries in ``used``)
        # The origin owes it to the routers where a subscriber of the topic is
        # attached now; each router owes it to its subscribers still attached when
        # it arrives there (one that left in between makes that router answer "none").
        interested = sorted(
            {s.router for s in self.subs if s.topic == pub.topic and s.attached and (s.detach_at is None or s.detach_at > t)}
        )
        remote = [r for r in interested if r != origin.rid]
        answers: list[tuple[float, str | None]] = []
        recv_ev = None
        # What fault injection needs to know of this delivery (kept only when faults are planned).
        rec: dict[str, Any] | None
        rec = (
            {
                "d": d,
                "origin": origin.rid,
                "epoch": origin.epoch,
                "owed": set(),
                "accepted": set(),
                "remote": {},
                "ftr": {},
                "late": {},
                "calm": set(),
                "rejected": [],
                "pub_ev": None,
                "pub_ledger": None,
                "recv": {},
            }
            if self.fault_plan and not alo
            else None
        )
        for rid in [origin.rid] + remote:
            log = self.routers[rid]
            arrive = t if rid == origin.rid else t + self._hop(origin.rid, rid)
            subs = [
                s
                for s in self.subs
                if s.router == rid and s.topic == pub.topic and s.attached and (s.detach_at is None or s.detach_at > arrive)
            ]
            if rid != origin.rid and not subs:
                back = arrive + self._hop(rid, origin.rid)
                self._count(
                    self._emit(origin, back, Kind.OUTCOME_FROM_ROUTER, {"delivery": d, "from_router": rid, "outcome": "none"})
                )
                answers.append((back, None))
                continue
            immediate, sends = [], []
            for sub in subs:
                # A subscriber's sends keep arrival order (the router's queue is FIFO):
                # a delivery goes at once only when nothing waits before it.
                busy = self.busy.get((rid, sub.key), 0.0)
                if busy > arrive or rng.random() < spec.p_late:
                    at = max(arrive, busy) + rng.uniform(0.0001, 0.005)
                    sends.append((sub, at))
                else:
                    at = arrive
                    immediate.append(sub.key)
                    sends.append((sub, at))
                self.busy[(rid, sub.key)] = at
            fields = {
                "delivery": d,
                **base,
                "size": 100 if rid == origin.rid else 160,
                "settled": False,
                "owed": [s.key for s in subs],
                "forwarded": immediate,
            }
            if rid == origin.rid:
                fields["routers"] = remote or None
            else:
                fields["origin_router"] = origin.rid
            if alo:
                fields["guarantee"] = "at-least-once"
            ev = self._count(self._emit(log, arrive, Kind.RECEIVED, fields))
            self._recv_here.setdefault(rid, set()).add(d)
            if rec is not None:
                rec["owed"].update(fields["owed"])
                rec["recv"][rid] = (log.epoch, arrive)
                if not any(s.detach_at is not None for s in self.subs if s.router == rid):
                    rec["calm"].add(rid)  # no subscriber of this router leaves this round
                if rid != origin.rid:
                    rec["remote"][rid] = {"epoch": log.epoch, "owed": fields["owed"], "otr": None, "ofr": None, "answer": None}
            if rid != origin.rid and subs:
                self.last_remote[rid] = (d, origin.rid, log.epoch)
            if rid == origin.rid:
                recv_ev = ev
                for r in remote:
                    ftr = self._count(
                        self._emit(log, arrive, Kind.FORWARDED_TO_ROUTER, {"delivery": d, "to_router": r, "dests": [r]})
                    )
                    if rec is not None:
                        rec["ftr"][r] = ftr
            outcomes, last = [], arrive
            for sub, sent_at in sends:
                late = sub.key not in immediate
                if sub.detach_at is not None and sent_at >= sub.detach_at:
                    last = max(last, sub.detach_at + 1e-5)  # its link went first: no longer owed
                    continue
                # ttl: a late send may find the message expired (then no send).
                if late and rng.random() < spec.p_expire:
                    self._count(self._emit(log, sent_at, Kind.EXPIRED, {"delivery": d, "subscriber": sub.key}))
                    outcomes.append("rejected")
                    last = max(last, sent_at)
                    continue
                if late:
                    fwd = self._count(
                        self._emit(
                            log,
                            sent_at,
                            Kind.FORWARDED,
                            {"delivery": d, "subscriber": sub.key, "link": sub.link, "settled": False},
                        )
                    )
                    late_send = {"t": sent_at, "seq": seq, "ev": fwd, "arrive": arrive, "answer": float("inf")}
                    if not alo:
                        self.late_sends.setdefault((rid, log.epoch, sub.key, pub.container), []).append(late_send)
                    if rec is not None:
                        rec["late"][sub.key] = (rid, fwd)
                handed = self._ledger(
                    sub.container,
                    {
                        "ts": sent_at + 0.0002,
                        "client": sub.container,
                        "link": sub.name,
                        "role": "subscriber",
                        "event": "delivered",
                        "topic": pub.topic,
                        "delivery": d,
                        "pub_tag": tag.hex(),
                        "seq": seq + 1,
                        "router": rid,
                        "digest": digest,
                        "message_id": f"{pub.container}:{seq}",
                    },
                )
                answer_at = sent_at + rng.uniform(0.0002, 0.02)
                if sub.detach_at is not None and answer_at > sub.detach_at:
                    last = max(last, sub.detach_at + 1e-5)  # it left first: no longer owed
                    continue
                if late:
                    late_send["answer"] = answer_at
                outcome = "rejected" if rng.random() < spec.p_reject else "accepted"
                self._count(
                    self._emit(
                        log,
                        answer_at,
                        Kind.SUB_OUTCOME,
                        {"delivery": d, "subscriber": sub.key, "outcome": outcome, "settled": True},
                    )
                )
                handed["outcome"] = outcome
                if rec is not None:
                    (rec["accepted"].add(sub.key) if outcome == "accepted" else rec["rejected"].append(rid))
                if outcome == "accepted" and not alo:
                    self.accepted_sub.append(
                        (rid, log.epoch, d, sub.key, sub, pub, base, arrive, answer_at, sub.detach_at is not None)
                    )
                if outcome == "accepted" and alo and sub.detach_at is None and rng.random() < spec.p_repeat:
                    answer_at = self._repeat(log, d, sub, handed, answer_at)
                outcomes.append(outcome)
                last = max(last, answer_at)
            answer = ("rejected" if "rejected" in outcomes else "accepted") if outcomes else "none"
            if rid == origin.rid:
                answers.append((last, answer if outcomes else None))
            else:
                otr = self._count(
                    self._emit(
                        log, last + 1e-5, Kind.OUTCOME_TO_ROUTER, {"delivery": d, "to_router": origin.rid, "outcome": answer}
                    )
                )
                back = last + rng.uniform(0.0005, 0.002)
                ofr = self._count(
                    self._emit(origin, back, Kind.OUTCOME_FROM_ROUTER, {"delivery": d, "from_router": rid, "outcome": answer})
                )
                if rec is not None:
                    rec["remote"][rid].update(otr=otr, ofr=ofr, answer=answer)
                answers.append((back, None if answer == "none" else answer))
        done = max(a for a, _ in answers) + 1e-5
        said = [o for _, o in answers if o is not None]
        outcome = ("rejected" if "rejected" in said else "accepted") if said else "released"
        pub_ev = self._count(
            self._emit(
                origin,
                done,
                Kind.PUB_OUTCOME,
                {
                    "delivery": d,
                    "outcome": outcome,
                    "condition": None if outcome == "accepted" else ("eorouter:ttl-expired" if outcome == "rejected" else None),
                    "reason": None if said else "no subscribers",
                },
            )
        )
        told = self._ledger(
            pub.container,
            {
                "ts": done + 0.0003,
                "client": pub.container,
                "link": pub.name,
                "role": "publisher",
                "event": "outcome",
                "topic": pub.topic,
                "pub_tag": tag.hex(),
                "seq": seq + 1,
                "router": origin.rid,
                "incarnation": pub.incarnation,
                "outcome": outcome,
                "condition": None if outcome == "accepted" else "eorouter:ttl-expired",
            },
        )
        settle = done + rng.uniform(0.0003, 0.003)
        # The origin relays the settlement to the routers it waited for: not to one that
        # answered "none" (nobody there was owed it: it holds no record).
        reached = [r for r in remote if self._received_at(d, r)]
        for r in reached:
            self._count(self._emit(origin, settle, Kind.SETTLEMENT_RELAYED, {"delivery": d, "to_router": r}))
            remote_log = self.routers[r]
            closer = self._count(
                self._emit(
                    remote_log,
                    settle + rng.uniform(0.0005, 0.002),
                    Kind.SETTLED,
                    {"delivery": d, "by": "origin-router", "deleted": True},
                )
            )
            if not alo:
                self.closers.append((r, remote_log.epoch, d, [closer]))
        if reached or rng.random() < 0.5:
            a = self._count(self._emit(origin, settle, Kind.SETTLED, {"delivery": d, "by": "publisher", "deleted": False}))
            b = self._count(
                self._emit(
                    origin,
                    settle + rng.uniform(0.001, 0.004),
                    Kind.RECORD_DELETED,
                    {"delivery": d, "reason": "receivers-know-settled"},
                )
            )
            if not alo:
                self.closers.append((origin.rid, origin.epoch, d, [b]))
            del a
        else:
            closer = self._count(self._emit(origin, settle, Kind.SETTLED, {"delivery": d, "by": "publisher", "deleted": True}))
            if not alo:
                self.closers.append((origin.rid, origin.epoch, d, [closer]))
        del recv_ev
        self._recv_here.clear()
        if rec is not None:
            rec.update(outcome=outcome, pub_ev=pub_ev, pub_ledger=told)
            self.round.append(rec)
            if rec["owed"] and rec["owed"] == rec["accepted"]:
                self.fully_accepted.add(d)
        return done

    def _repeat(self, log: RouterLog, d: str, sub: Sub, handed: dict, accepted_at: float) -> float:
        """An at-least-once copy sent to ``sub`` again after it accepted it, and accepted
        again; half the time its application is handed it again (a client that does
        not remember tags). Returns when the repeat was accepted."""
        rng = self.rng
        again = accepted_at + rng.uniform(0.00005, 0.0005)
        sent = {"delivery": d, "subscriber": sub.key, "link": sub.link, "settled": False}
        self._count(self._emit(log, again, Kind.FORWARDED, sent))
        if self.spec.ledgers and rng.random() < 0.5:
            self._ledger(sub.container, {**handed, "ts": again + 0.0001})
            self.alo["app_duplicates"] += 1
        answered = again + rng.uniform(0.0002, 0.002)
        accept = {"delivery": d, "subscriber": sub.key, "outcome": "accepted", "settled": True}
        self._count(self._emit(log, answered, Kind.SUB_OUTCOME, accept))
        self.alo["duplicates"] += 1
        return answered

    # ------------------------------------------------------------ rounds

    def run(self) -> dict:
        spec, rng = self.spec, self.rng
        self.out.mkdir(parents=True, exist_ok=True)
        t = spec.ts0
        for log in self.routers.values():
            self._start(log, t)
        self._attach_all(t + 0.01, self.router_ids)
        t += 0.1
        made = 0
        target_events = spec.events
        rounds = 0
        while (made < spec.deliveries) if not target_events else (self.events < target_events):
            rounds += 1
            n = spec.round_size if target_events else min(spec.round_size, spec.deliveries - made)
            # Maybe a non-durable subscriber drops its link mid-round (reattaches next round).
            candidates = [s for s in self.subs if s.durable == 0 and s.attached]
            if candidates and rng.random() < spec.p_detach:
                sub = rng.choice(candidates)
                sub.detach_at = t + rng.uniform(0.001, 0.002 * n)
            live = [p for p in self.pubs]
            end = t
            gap = 0.002
            for i in range(n):
                pub = live[i % len(live)]
                arrive = t + i * gap + rng.uniform(0, gap / 2)
                end = max(end, self._one_delivery(pub, arrive))
                made += 1
            for sub in self.subs:
                if sub.detach_at is not None:
                    log = self.routers[sub.router]
                    self._count(
                        self._emit(
                            log,
                            sub.detach_at,
                            Kind.LINK_DETACHED,
                            {
                                "link": sub.link,
                                "container": sub.container,
                                "name": sub.name,
                                "role": "subscriber",
                                "closed": False,
                                "reason": "connection-lost",
                            },
                        )
                    )
                    sub.attached = False
                    sub.detach_at = None
            end += 0.05
            restart = [r for r in self.router_ids if rng.random() < spec.p_restart]
            for rid in restart:
                self._detach_all(end, rid)
            self._flush_round()
            for rid in restart:
                self._start(self.routers[rid], end + 0.5)
                self._answer_after_restart(rid, end + 0.5)
            for sub in self.subs:
                if not sub.attached and sub.router not in restart:
                    self._attach_sub(sub, end + 0.01)
            if restart:
                self._attach_all(end + 0.51, restart)
            t = end + (0.6 if restart else 0.02)
        for rid in self.router_ids:
            self._detach_all(t + 0.1, rid)
        self._flush_round(final=True)
        for log in self.routers.values():
            assert log.fh is not None  # _start() opened it
            if log.rid == self.torn_tail:
                log.fh.write(b'{"seq":%d,"ts":17637' % (log.seq + 1))  # no newline: cut mid-write
            log.fh.close()
        self._write_ledgers()
        truth = {k: sorted(v) for k, v in self.truth.items()}
        # events: as the readers count them (folded lines unfolded); lines: as written.
        info = {
            "events": self.events,
            "lines": sum(log.lines for log in self.routers.values()),
            "folded_lines": self.folded,
            "batched_lines": self.batched,
            "deliveries": self.deliveries,
            "routers": self.router_ids,
            "faults": list(spec.faults),
            "truth": truth,
            "at_least_once": self.alo,
            "seed": spec.seed,
        }
        (self.out / "truth.json").write_text(json.dumps(info, indent=2) + "\n")
        return info

    def _flush_round(self, final: bool = False) -> None:
        """Inject this round's faults (their events are still pending), then write."""
        if self.fault_plan and (final or self.accepted_sub):
            self._inject(final)
        for log in self.routers.values():
            self._flush(log)
        self.accepted_sub.clear()
        self.late_sends.clear()
        self.closers.clear()
        self.round.clear()
        if not self.fault_plan:  # nothing left to inject: ledgers go to disk round by round
            self._write_ledgers()

    # ------------------------------------------------------------ faults

    def _expect_missing_seq(self, log: RouterLog) -> None:
        """The current seq is missing from the file. The proof names a run of
        missing numbers by its first (docs/reconcile.md, `seq-gap`), so a seq right
        after another missing one extends that run rather than starting one."""
        if log.missing_run_end != log.seq - 1 or log.seq == 1:
            self._expect("seq-gap", f"{log.rid}|{log.epoch}|{log.seq}")
        log.missing_run_end = log.seq

    def _expect(self, check: str, item: str) -> None:
        self.truth.setdefault(check, set()).add(item)

    def _inject(self, final: bool) -> None:
        rng = self.rng
        remaining = []
        for fault in self.fault_plan:
            if not self._inject_one(fault, rng):
                remaining.append(fault)
        self.fault_plan = remaining
        if final and remaining:
            raise CannotInject(f"could not inject {remaining}: the history has no place for them")

    def _find_pending(self, log: RouterLog, pred):
        return [item for item in log.pending if pred(item[2])]

    def _inject_one(self, fault: str, rng: random.Random) -> bool:
        p = self.spec.prefix
        if fault in ("drop-accept", "dup-tag", "ledger-missing", "ledger-twice"):
            # A delivery the publisher was told accepted, and one subscriber's accept of it.
            choices = []
            for entry in self.accepted_sub:
                rid, epoch, d, key = entry[:4]
                log = self.routers[rid]
                if log.epoch != epoch:
                    continue
                choices.append(entry)
            rng.shuffle(choices)
            for rid, epoch, d, key, sub, pub, base, arrive, answer_at, detaching in choices:
                # A subscriber that leaves before its router answers stops being owed: a
                # dropped accept of its would be (rightly) excused, not lost.
                if d in self.used or (fault == "drop-accept" and detaching):
                    continue
                self.used.add(d)
                origin = self.routers[pub.router]
                accepted = self._find_pending(
                    origin,
                    lambda ev, d=d: (
                        ev["kind"] == Kind.PUB_OUTCOME
                        and ev["fields"].get("delivery") == d
                        and ev["fields"]["outcome"] == "accepted"
                    ),
                )
                if not accepted:
                    self.used.discard(d)
                    continue
                log = self.routers[rid]
                if fault == "drop-accept":
                    lines = self._find_pending(
                        log,
                        lambda ev, d=d, key=key: (
                            ev["kind"] == Kind.SUB_OUTCOME and ev["fields"]["delivery"] == d and ev["fields"]["subscriber"] == key
                        ),
                    )
                    lines[0][2]["drop"] = True
                    self._expect("lost", d)
                    if self.spec.ledgers:
                        # The application did get and accept it: the router lost the accept.
                        pass
                    return True
                if fault == "dup-tag":
                    # The same publisher delivery handed to the same subscriber again under
                    # another delivery id (a router that derived a different tag for it).
                    d2 = p + hashlib.blake2b(d.encode(), digest_size=17).hexdigest()
                    at = answer_at + 0.001
                    fields = {"delivery": d2, **base, "size": 160, "settled": False, "owed": [key], "forwarded": [key]}
                    if rid != pub.router:
                        fields["origin_router"] = pub.router
                    self._count(self._emit(log, at, Kind.RECEIVED, fields))
                    self._count(
                        self._emit(
                            log,
                            at + 0.001,
                            Kind.SUB_OUTCOME,
                            {"delivery": d2, "subscriber": key, "outcome": "accepted", "settled": True},
                        )
                    )
                    self._count(self._emit(log, at + 0.002, Kind.SETTLED, {"delivery": d2, "by": "publisher", "deleted": True}))
                    self._ledger(
                        sub.container,
                        {
                            "ts": at,
                            "client": sub.container,
                            "link": sub.name,
                            "role": "subscriber",
                            "event": "delivered",
                            "topic": base["topic"],
                            "delivery": d2,
                            "pub_tag": base["pub_tag"],
                            "outcome": "accepted",
                            "message_id": f"{base['publisher']}:{base['stream_seq']}",
                        },
                    )
                    pub_id = "|".join([base["publisher"], base["link_name"], base["incarnation"], base["pub_tag"], ""])
                    self._expect("duplicated", f"{key}|{pub_id}")
                    if rid != pub.router:  # its origin forwarded it under its own id: nobody forwarded this one
                        self._expect("arrival-unforwarded", f"{rid}|{d2}")
                    if self.spec.ledgers:
                        self._expect("ledger", f"dup|{key}|{pub_id}")
                    return True
                if fault == "ledger-missing" and self.spec.ledgers:
                    entries = self.ledger.get(sub.container, [])
                    for i, e in enumerate(entries):
                        if e.get("event") == "delivered" and e.get("delivery") == d and e["link"] == sub.name:
                            del entries[i]
                            self._expect("ledger", f"missing|{key}|{d}")
                            return True
                if fault == "ledger-twice" and self.spec.ledgers:
                    entries = self.ledger.get(sub.container, [])
                    for i, e in enumerate(entries):
                        if e.get("event") == "delivered" and e.get("delivery") == d and e["link"] == sub.name:
                            entries.insert(i + 1, dict(e))
                            self._expect("ledger", f"twice|{key}|{d}")
                            return True
            return False
        if fault == "ledger-pub-outcome" and self.spec.ledgers:
            for client, entries in self.ledger.items():
                for e in entries:
                    if (
                        e["role"] == "publisher"
                        and e["event"] == "outcome"
                        and e["outcome"] == "accepted"
                        and not e.get("_touched")
                    ):
                        d = self._delivery_id_of(e)
                        if d in self.used:
                            continue
                        self.used.add(d)
                        # The application believes it was rejected: router and app disagree.
                        e["outcome"] = "rejected"
                        e["_touched"] = True
                        self._expect("ledger", f"pub|{e['client']}|{e['link']}|{e['pub_tag']}|{d}")
                        if d in self.fully_accepted:  # and its outcome contradicts what the subscribers did
                            self._expect("outcome-disagrees", d)
                        return True
            return False
        if fault in (
            "accept-unowed",
            "accept-unsent",
            "forward-dropped",
            "answer-dropped",
            "outcome-released",
            "outcome-refused",
        ):
            return self._inject_chain(fault, rng)
        if fault in ("seq-gap", "seq-repeated", "malformed", "garbage"):
            return self._inject_line(fault, rng)
        if fault == "torn-tail":
            return self.torn_tail is None and self._plan_torn_tail(rng)
        if fault == "restart-answer":
            return False  # injected at a restart (_answer_after_restart), if this history has one
        if fault == "reorder":
            # Two consecutive late sends of one stream to one subscriber: swap their
            # places in the log (the later one overtakes the earlier one).
            for (rid, epoch, key, _pub), sends in self.late_sends.items():
                log = self.routers[rid]
                if log.epoch != epoch or len(sends) < 2:
                    continue
                sends = sorted(sends, key=lambda s: s["t"])
                for a, b in zip(sends, sends[1:]):
                    e1, e2 = a["ev"], b["ev"]
                    if (
                        b["seq"] != a["seq"] + 1
                        or e1.get("drop")
                        or e2.get("drop")
                        or e1["fields"]["delivery"] in self.used
                        or e2["fields"]["delivery"] in self.used
                    ):
                        continue
                    # Only the order of the two sends changes: the second delivery had arrived
                    # before the first send, and the subscriber answered the first after the second.
                    if not (b["arrive"] < a["t"] and a["answer"] > b["t"]):
                        continue
                    self.used.update((e1["fields"]["delivery"], e2["fields"]["delivery"]))
                    # Swap the two events' positions in the heap by swapping their contents.
                    e1["kind"], e2["kind"] = e2["kind"], e1["kind"]
                    e1["fields"], e2["fields"] = e2["fields"], e1["fields"]
                    d_first = e2["fields"]["delivery"]  # now sent second: stream_seq below the one before it
                    self._expect("out-of-order", f"{rid}|{key}|{d_first}")
                    if self.spec.ledgers:
                        self._swap_ledger(key, e1["fields"]["delivery"], e2["fields"]["delivery"], d_first)
                    return True
            return False
        if fault == "invented":
            rid = rng.choice(self.router_ids)
            log = self.routers[rid]
            sub = rng.choice(self.subs)
            d = p + rng.randbytes(18).hex()
            t = log.pending[0][0] if log.pending else self.now
            self._count(
                self._emit(
                    log, t, Kind.SUB_OUTCOME, {"delivery": d, "subscriber": sub.key, "outcome": "accepted", "settled": True}
                )
            )
            self._expect("invented", d)
            return True
        if fault == "leftover":
            rng.shuffle(self.closers)
            for rid, epoch, d, lines in self.closers:
                log = self.routers[rid]
                if log.epoch != epoch or d in self.used:
                    continue
                self.used.add(d)
                for line in lines:
                    line["drop"] = True
                self._expect("left-unsettled", f"{rid}|{d}")
                return True
            return False
        return False

    def _inject_chain(self, fault: str, rng: random.Random) -> bool:
        """The breaks of a delivery's causal chain the audit found (issue 15) and the
        outcome that contradicts what the subscribers did (issue 14): each on one
        delivery of this round, with the exact violations it must cause."""
        p = self.spec.prefix
        deliveries = [r for r in self.round if r["d"] not in self.used]
        rng.shuffle(deliveries)
        for rec in deliveries:
            d, origin = rec["d"], rec["origin"]
            if fault == "accept-unowed":
                # A subscriber that never attached anywhere accepts it (on the origin router).
                log = self.routers[origin]
                if log.epoch != rec["epoch"]:
                    continue
                stranger = f"{p}stranger/never-attached"
                self._count(
                    self._emit(
                        log,
                        rec["recv"][origin][1] + 1e-6,
                        Kind.SUB_OUTCOME,
                        {"delivery": d, "subscriber": stranger, "outcome": "accepted", "settled": True},
                    )
                )
                self._expect("accept-unowed", f"{stranger}|{d}")
            elif fault == "accept-unsent":
                # The late send to a subscriber that then accepted it is not in the log.
                sent = [(key, v) for key, v in rec["late"].items() if key in rec["accepted"] and not v[1].get("drop")]
                if not sent:
                    continue
                key, (rid, fwd) = sent[0]
                fwd["drop"] = True
                self._expect("accept-unsent", f"{key}|{rid}|{d}")
                if self.spec.ledgers:  # its application was handed it: no router logged sending it
                    self._expect("ledger", f"unsent|{key}|{d}")
            elif fault == "forward-dropped":
                # The origin's forward to a router that logged the copy's arrival is gone.
                targets = [r for r in rec["ftr"] if r in rec["recv"]]
                if not targets:
                    continue
                rec["ftr"][targets[0]]["drop"] = True
                self._expect("arrival-unforwarded", f"{targets[0]}|{d}")
            elif fault == "answer-dropped":
                # A router's answer is gone from both sides; the publisher was told accepted.
                remote = [
                    (r, v) for r, v in rec["remote"].items() if v["answer"] == "accepted" and v["owed"] and r in rec["calm"]
                ]
                if rec["outcome"] != "accepted" or not remote:
                    continue
                rid, v = remote[0]
                v["otr"]["drop"] = v["ofr"]["drop"] = True
                self._expect("answer-missing", f"{origin}|{rid}|{d}")
            elif fault == "outcome-released":
                # Issue 14's race: every owed subscriber accepted, the publisher was told released.
                if rec["outcome"] != "accepted" or d not in self.fully_accepted:
                    continue
                rec["pub_ev"]["fields"].update(outcome="released", condition=None, reason="no subscribers left")
                if rec["pub_ledger"] is not None:
                    rec["pub_ledger"]["outcome"] = "released"
                self._expect("outcome-disagrees", d)
            elif fault == "outcome-refused":
                # The publisher was told accepted though an owed subscriber rejected it (and
                # nothing excused that subscriber): outcome-disagrees, and it is lost.
                if rec["outcome"] != "rejected" or not rec["rejected"] or not set(rec["rejected"]) <= rec["calm"]:
                    continue
                rec["pub_ev"]["fields"].update(outcome="accepted", condition=None, reason=None)
                if rec["pub_ledger"] is not None:
                    rec["pub_ledger"]["outcome"] = "accepted"
                    rec["pub_ledger"]["condition"] = None
                self._expect("outcome-disagrees", d)
                self._expect("lost", d)
            else:
                return False
            self.used.add(d)
            return True
        return False

    def _inject_line(self, fault: str, rng: random.Random) -> bool:
        """Faults of the file itself, on `peer-connected` lines (which no delivery's
        proof reads): a line lost (seq-gap), a line lost and another copied in its
        place (seq-gap and seq-repeated), a line whose seq is a string (malformed,
        and its seq missing), binary garbage between two lines (malformed)."""
        for log in self.routers.values():
            peers = [
                item[2]
                for item in self._find_pending(log, lambda ev: ev["kind"] == Kind.PEER_CONNECTED)
                if not any(item[2].get(k) for k in ("skip", "copied", "mistype", "garbage_before"))
            ]
            need = 2 if fault == "seq-repeated" else 1
            if len(peers) < need:
                continue
            if fault == "seq-gap":
                peers[0]["skip"] = True
            elif fault == "seq-repeated":
                peers[0]["skip"] = True
                peers[1]["copied"] = True
            elif fault == "malformed":
                peers[0]["mistype"] = True
            else:
                peers[0]["garbage_before"] = True
            return True
        return False

    def _plan_torn_tail(self, rng: random.Random) -> bool:
        """A crash cut the last write of one router: a torn last line, a note only."""
        self.torn_tail = rng.choice(self.router_ids)
        return True

    def _answer_after_restart(self, rid: str, t: float) -> None:
        """A restarted router answers for a delivery only its previous life received."""
        if "restart-answer" not in self.fault_plan or rid not in self.last_remote:
            return
        d, origin, epoch = self.last_remote[rid]
        log = self.routers[rid]
        if d in self.used or epoch == log.epoch:
            return
        self.used.add(d)
        self._count(
            self._emit(log, t + 1e-4, Kind.OUTCOME_TO_ROUTER, {"delivery": d, "to_router": origin, "outcome": "accepted"})
        )
        self._expect("record-missing", f"{rid}|{log.epoch}|{d}")
        self.fault_plan.remove("restart-answer")

    def _delivery_id_of(self, entry: dict) -> str:
        for pub in self.pubs:
            if pub.container == entry["client"] and pub.name == entry["link"]:
                saved = pub.incarnation
                pub.incarnation = entry["incarnation"]
                d = self._delivery_id(pub, bytes.fromhex(entry["pub_tag"]))
                pub.incarnation = saved
                return d
        return ""

    def _swap_ledger(self, key: str, d_a: str, d_b: str, d_expected: str) -> None:
        container, _, name = key.partition("/")
        entries = self.ledger.get(container, [])
        idx = [
            i
            for i, e in enumerate(entries)
            if e.get("event") == "delivered" and e["link"] == name and e.get("delivery") in (d_a, d_b)
        ]
        if len(idx) == 2:
            i, j = idx
            entries[i], entries[j] = entries[j], entries[i]
            self._expect("ledger", f"order|{key}|{d_expected}")

    def _write_ledgers(self) -> None:
        """Append the ledger lines held so far (one file per client: each has one link
        here) and forget them."""
        if not self.spec.ledgers:
            return
        directory = self.out / "clients"
        directory.mkdir(parents=True, exist_ok=True)
        for client, entries in self.ledger.items():
            with open(directory / f"{client}.jsonl", "ab") as fh:
                fh.write(b"".join(_DUMPS({k: v for k, v in e.items() if k != "_touched"}, option=_NL) for e in entries))
            entries.clear()


def generate(out: str | os.PathLike, spec: Spec) -> dict:
    """Write one synthetic history under ``out``; return its info (with ``truth``)."""
    return Generator(spec, Path(out)).run()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="gen-logs", description=__doc__.splitlines()[0])
    parser.add_argument("out", help="directory to write (router data dirs, clients/, truth.json)")
    parser.add_argument("--events", type=int, default=0, help="about this many events (overrides --deliveries)")
    parser.add_argument("--deliveries", type=int, default=1000)
    parser.add_argument("--routers", type=int, default=3)
    parser.add_argument("--publishers", type=int, default=4)
    parser.add_argument("--subscribers", type=int, default=6)
    parser.add_argument("--topics", type=int, default=2)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--round", type=int, default=200, dest="round_size")
    parser.add_argument("--restart", type=float, default=0.0, help="per round and router: chance of a restart")
    parser.add_argument(
        "--fold",
        type=float,
        default=0.0,
        help="chance that a sub-outcome directly followed by its accepted pub-outcome is written "
        'as one "completed" line, as the router\'s hot path does (default 0)',
    )
    parser.add_argument(
        "--batch",
        type=float,
        default=0.0,
        help="chance that consecutive sub-outcomes of one subscriber with the same outcome are "
        'written as one "sub-outcomes" line, as the router does for those of one loop '
        "iteration (default 0)",
    )
    parser.add_argument(
        "--fault",
        action="append",
        default=[],
        choices=FAULTS + LEDGER_FAULTS,
        help="inject a fault (repeatable); truth.json lists what the job must find",
    )
    parser.add_argument("--no-ledgers", action="store_true", help="skip the applications' ledgers")
    parser.add_argument(
        "--alo-topics",
        type=int,
        default=0,
        help="the first N topics are at-least-once: some copies repeated (truth.json counts them: at_least_once)",
    )
    args = parser.parse_args(argv)
    spec = Spec(
        routers=args.routers,
        publishers=args.publishers,
        subscribers=args.subscribers,
        topics=args.topics,
        deliveries=args.deliveries,
        events=args.events,
        round_size=args.round_size,
        seed=args.seed,
        p_restart=args.restart,
        p_fold=args.fold,
        p_batch=args.batch,
        faults=tuple(args.fault),
        ledgers=not args.no_ledgers,
        alo_topics=args.alo_topics,
    )
    if Path(args.out).exists() and any(Path(args.out).iterdir()):
        print(f"gen-logs: {args.out} is not empty", file=sys.stderr)
        return 2
    started = time.monotonic()
    info = generate(args.out, spec)
    size = sum(p.stat().st_size for p in Path(args.out).rglob("*.jsonl") if "clients" not in p.parts)
    print(
        f"gen-logs: {info['events']:,} events in {info['lines']:,} lines, {info['deliveries']:,} deliveries, "
        f"routers {', '.join(info['routers'])}, {size / 1e6:.0f} MB in {time.monotonic() - started:.0f} s "
        f"-> {args.out}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
