"""Soak: many messages through one router; every record the router made is deleted again.

One router (``delivery.record_linger = 1``), one topic, two publishers sending N messages
each (settling on their outcome, as ordinary clients do) and three subscribers:

- ``plain``:   auto-accept, rcv-settle-mode=first;
- ``second``:  rcv-settle-mode=second: accepts unsettled and settles only after the
               router relayed the publisher's settlement;
- ``durable``: durable (unsettled-state) subscription that detaches halfway (link
               detach, not close) and re-attaches with the same container-id + link
               name; while away it is still owed every message, so the topic's
               in-flight bound holds the publishers back until it returns.

Checked: every publisher delivery is ``accepted``; each subscriber got every message
exactly once. The durable one may get a delivery again after the re-attach, with the
same tag: the router resends what it had sent and got no answer for (here: what reached
the client after it had detached). Such a repeat must be one the router had no answer
for, and every delivery is *accepted* exactly once per subscriber in the router's log.
Finally every ``received`` delivery in the event log is deleted again (``settled`` with
``deleted: true``, or ``record-deleted``) within the linger time.

The ``slow`` variant (scripts/test --slow) runs 50,000 messages per publisher and also
checks that the router's resident memory grows by less than 20 MiB.
"""

from __future__ import annotations

import gc
import json
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import pytest
from amqpclients import unique

from router.eventschema import unfold

LINGER = 1.0
SUB_WINDOW = 400  # subscriber credit, topped up when half is used
FREEZE_EVERY = 5000  # messages between gc.freeze() calls (see run_soak)
MIB = 1024 * 1024


def rss_bytes(pid: int) -> int:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise AssertionError(f"no VmRSS in /proc/{pid}/status")


class Prefix:
    """How many leading items of a growing list satisfy ``test`` (each checked once
    it passed): O(1) amortized per poll, where ``all(...)`` would rescan 100k items."""

    def __init__(self, items: list, test):
        self.items, self.test, self.count = items, test, 0

    def __call__(self) -> int:
        while self.count < len(self.items) and self.test(self.items[self.count]):
            self.count += 1
        return self.count


class LogSummary:
    """Reads the router's event log incrementally (new complete lines only, so polling it
    while waiting stays cheap at a million lines) and keeps just what the checks need."""

    def __init__(self, data_dir: Path, durable_key: str):
        self.events_dir = Path(data_dir, "events")
        self.durable_key = durable_key
        self.offsets: dict[Path, int] = {}
        self.lines = 0
        self.received: dict[str, frozenset] = {}  # delivery -> owed keys
        self.deleted: set[str] = set()
        self.accepted: Counter = Counter()  # (delivery, subscriber) -> accepts
        self.pub_outcomes: Counter = Counter()  # (delivery, outcome)
        self.durable_detached = False
        self.presettled_forwards = 0
        self.durable_answered_before_detach: set[str] = set()

    def poll(self) -> LogSummary:
        for path in sorted(self.events_dir.glob("events-*.jsonl")):  # one epoch: name order
            offset = self.offsets.get(path, 0)
            with open(path, "rb") as f:
                f.seek(offset)
                data = f.read()
            end = data.rfind(b"\n") + 1  # leave a line still being written for later
            for line in data[:end].splitlines():
                if line.strip():
                    for event in unfold(json.loads(line)):  # a "completed" line: its three events
                        self._add(event)
            self.offsets[path] = offset + end
        return self

    def _add(self, e: dict) -> None:
        self.lines += 1
        kind, delivery = e["event"], e.get("delivery")
        if kind == "received":
            self.received[delivery] = frozenset(e["owed"])
        elif kind == "record-deleted" or (kind == "settled" and e.get("deleted")):
            self.deleted.add(delivery)
        elif kind == "sub-outcome":
            if e["outcome"] == "accepted":
                self.accepted[delivery, e["subscriber"]] += 1
            if e["subscriber"] == self.durable_key and not self.durable_detached:
                self.durable_answered_before_detach.add(delivery)
        elif kind == "forwarded" and e.get("settled"):
            self.presettled_forwards += 1
        elif kind == "pub-outcome":
            self.pub_outcomes[delivery, e["outcome"]] += 1
        elif kind == "link-detached" and f"{e.get('container')}/{e.get('name')}" == self.durable_key:
            self.durable_detached = True

    def undeleted(self) -> set[str]:
        return self.received.keys() - self.deleted


@dataclass
class SoakResult:
    seconds: float
    messages: int
    log_lines: int
    rss_before: int
    rss_after: int
    durable_redelivered: int


def run_soak(router_factory, amqp, per_publisher: int, *, timeout: float) -> SoakResult:
    # The clients keep a record of every delivery for the checks at the end: millions of
    # Python objects in the slow run, which every full cyclic-GC pass walks again. Those
    # pauses (seconds, growing with the run) stall the single-threaded clients until the
    # router's idle timeout cuts them. gc.freeze() parks what exists in a generation the
    # collector skips; unfreeze() at the end hands it back.
    try:
        return _run_soak(router_factory, amqp, per_publisher, timeout)
    finally:
        gc.unfreeze()


def _run_soak(router_factory, amqp, per_publisher: int, timeout: float) -> SoakResult:
    router = router_factory("S", delivery={"record_linger": LINGER})
    pid = router.proc.pid
    topic = unique("soak")
    total = 2 * per_publisher

    plain = amqp.connect(router.url, container_id=unique("plain")).subscriber(topic, credit=SUB_WINDOW, auto_accept=True)
    second = amqp.connect(router.url, container_id=unique("second")).subscriber(
        topic, credit=SUB_WINDOW, rcv_second=True, auto_accept=True
    )
    durable_cid, durable_name = unique("durable"), unique("durable-link")
    durable_conn = amqp.connect(router.url, container_id=durable_cid)
    durable = durable_conn.subscriber(topic, name=durable_name, durable=2, credit=SUB_WINDOW, auto_accept=True)
    durable_key = f"{durable_cid}/{durable_name}"
    current_durable = [durable]  # the link before, then after, the re-attach
    pubs = [amqp.connect(router.url, container_id=unique(f"pub{i}")).publisher(topic) for i in range(2)]
    log = LogSummary(router.data_dir, durable_key)
    rss_before = rss_bytes(pid)
    start = time.monotonic()
    frozen_at = [0]

    def sent_count() -> int:
        return sum(len(p.sent) for p in pubs)

    def feed() -> None:
        """Send what publisher credit allows; keep subscriber credit topped up."""
        for index, pub in enumerate(pubs):
            while pub.credit > 0 and len(pub.sent) < per_publisher:
                pub.send(f"p{index}-{len(pub.sent)}", wait_credit=False)
        for sub in (plain, second, current_durable[-1]):
            if sub.attached and sub.link.credit < SUB_WINDOW // 2:
                sub.flow(SUB_WINDOW - sub.link.credit)
        if len(plain.received) - frozen_at[0] >= FREEZE_EVERY:
            frozen_at[0] = len(plain.received)
            gc.freeze()

    def step(until, what: str):
        feed()
        lost = [link for link in (plain, second, current_durable[-1], *pubs) if link.gone and link is not durable]
        if lost:  # fail now, not at the deadline
            raise AssertionError(
                f"{what}: link(s) lost: "
                + ", ".join(
                    f"{link.name} ({link.remote_condition or link.conn.remote_condition or link.conn.transport_condition})"
                    for link in lost
                )
            )
        return until()

    def drive(until, what: str) -> None:
        remaining = max(1.0, timeout - (time.monotonic() - start))
        amqp.wait(lambda: step(until, what), timeout=remaining, what=what)

    # Phase 1: everyone attached, until the durable subscriber has half the messages.
    drive(lambda: len(durable.received) >= total // 2, "the durable subscriber receiving half")
    detached_at = time.monotonic()
    durable.detach()  # what arrives while we wait for the router's detach is in doubt
    # Phase 2: the durable subscription is away but still owed; go on until the in-flight
    # bound holds the publishers back (or enough was sent while it was away).
    sent_at_detach = sent_count()
    drive(
        lambda: (
            sent_count() >= min(total, sent_at_detach + 500) or not any(p.credit and len(p.sent) < per_publisher for p in pubs)
        ),
        "publishing while the durable subscriber is away",
    )
    assert sent_count() < total, "the durable subscriber must re-attach before the end"
    # Phase 3: re-attach (same container-id, same link name) and finish.
    again = durable_conn.subscriber(topic, name=durable_name, durable=2, credit=SUB_WINDOW, auto_accept=True)
    current_durable.append(again)
    settled = [Prefix(p.sent, lambda s: s.outcome and s.locally_settled) for p in pubs]
    drive(
        lambda: sent_count() == total and sum(done() for done in settled) == total,
        "every publisher delivery answered and settled",
    )
    second_settled = Prefix(second.received, lambda r: r.locally_settled)
    drive(lambda: second_settled() == len(second.received), "the rcv-settle-mode=second subscriber settling after the router did")
    seconds = time.monotonic() - start

    # --- publishers: every delivery accepted
    outcomes = Counter(s.outcome for p in pubs for s in p.sent)
    assert outcomes == {"accepted": total}, outcomes

    # --- plain and rcv-second subscribers: every message once, in each publisher's order
    for sub in (plain, second):
        bodies = sub.bodies()
        for i in range(2):
            mine = [b for b in bodies if b.startswith(f"p{i}-")]
            assert mine == [f"p{i}-{j}" for j in range(per_publisher)], (
                f"{sub.name}: publisher {i}'s messages: {len(mine)} received, not each once in order"
            )
        assert len(bodies) == total
        assert len({r.tag for r in sub.received}) == total, f"{sub.name}: tags must be distinct"
        assert not any(r.arrived_settled for r in sub.received)
    assert all(r.remote_settled and r.outcome == "accepted" for r in second.received)
    all_tags = {r.tag for r in plain.received}
    assert {r.tag for r in second.received} == all_tags, "one outgoing tag per delivery"

    # --- durable subscriber: every tag arrived; repeats only across the re-attach
    first_tags = [r.tag for r in durable.received]
    again_tags = [r.tag for r in again.received]
    assert len(set(first_tags)) == len(first_tags), "no tag twice before the detach"
    assert len(set(again_tags)) == len(again_tags), "no tag twice after the re-attach"
    missing = all_tags - set(first_tags) - set(again_tags)
    assert not missing, f"durable: {len(missing)} deliveries never arrived"
    body_of = {r.tag: r.body for r in plain.received}
    assert all(r.body == body_of[r.tag] for r in durable.received + again.received)
    redelivered = set(first_tags) & set(again_tags)
    answered_while_attached = [r.tag for r in durable.received if r.at < detached_at and r.outcome] + [
        r.tag for r in again.received if r.outcome
    ]
    assert len(answered_while_attached) == len(set(answered_while_attached)), (
        "a delivery the durable subscriber accepted while attached was delivered again"
    )

    # End the durable subscription (nothing is left behind on the router) and close every
    # connection before reading the event log: reading half a million lines keeps this
    # single-threaded process from answering heartbeats for longer than the router's
    # idle timeout on a busy machine, and the router would cut the clients off.
    again.close()
    for conn in {link.conn for link in (plain, second, again, *pubs)}:
        conn.close()

    # --- the event log: every delivery owed to all three, accepted once by each, one
    # publisher outcome, and every record deleted again (linger deletions included)
    keys = frozenset({f"{plain.conn.container_id}/{plain.name}", f"{second.conn.container_id}/{second.name}", durable_key})
    all_ids = {t.hex() for t in all_tags}
    deadline = time.monotonic() + LINGER + 10
    while log.poll().undeleted() and time.monotonic() < deadline:
        time.sleep(0.2)
    left = log.undeleted()
    assert not left, f"{len(left)} received deliveries never deleted, e.g. {sorted(left)[:5]}"
    assert log.received.keys() == all_ids
    assert all(owed == keys for owed in log.received.values()), "every delivery is owed to all three"
    assert log.presettled_forwards == 0, "an unsettled publisher delivery is never forwarded pre-settled"
    assert set(log.accepted) == {(d, k) for d in all_ids for k in keys}, "an accept from every subscriber"
    twice = {key: n for key, n in log.accepted.items() if n > 1}
    assert not twice, f"{len(twice)} deliveries accepted more than once by one subscriber: {list(twice.items())[:5]}"
    assert log.pub_outcomes == Counter({(d, "accepted"): 1 for d in all_ids})
    assert log.durable_detached
    resent_answered = {t.hex() for t in redelivered} & log.durable_answered_before_detach
    assert not resent_answered, f"resent after re-attach though answered: {sorted(resent_answered)[:5]}"

    rss_after = rss_bytes(pid)
    return SoakResult(
        seconds=round(seconds, 2),
        messages=total,
        log_lines=log.lines,
        rss_before=rss_before,
        rss_after=rss_after,
        durable_redelivered=len(redelivered),
    )


@pytest.mark.timeout(120)
def test_soak_records_return_to_zero(router_factory, amqp):
    result = run_soak(router_factory, amqp, per_publisher=1500, timeout=60)
    print(f"soak: {result}")


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_soak_long_records_and_memory_return(router_factory, amqp):
    result = run_soak(router_factory, amqp, per_publisher=50_000, timeout=1500)
    print(f"soak: {result}")
    growth = result.rss_after - result.rss_before
    assert growth < 20 * MIB, (
        f"router RSS grew by {growth / MIB:.1f} MiB ({result.rss_before / MIB:.1f} -> {result.rss_after / MIB:.1f} MiB)"
    )
