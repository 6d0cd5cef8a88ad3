"""A scale model of the router network: the pure cores of 50-100 routers in one process,
100,000 durable subscribers spread over them (issue 21 part 4).

``python -m bench.scale`` (``scripts/bench --scale``): N routers (default 60) on a seeded
random connected graph where every router has 3 or 4 neighbours, subscribers spread
over the routers uniformly and over the topics by a Zipf law (s = 1), then

1. an **attach storm**: every subscriber attaches, in waves of ``--wave`` at once; the control
   messages and bytes that cross links until the network is quiet, per kind, per router and
   per subscriber;
2. **memory** each router holds for subscriber identities: a ``sys.getsizeof`` walk (over
   ``gc.get_referents``) from the membership table, the local announcer, the flood
   memory and the announcement acks, on a sample of routers (``--walk``);
3. a **detach storm**: 10 % of the subscribers close their links at once (``--detach``);
4. **a router dies** with exactly-once deliveries in flight: publishers on other routers
   publish across the network, subscribers answer half of their copies, the busiest
   transit router is killed (PeerLost at each neighbour) while the answers are on their
   way; the rounds and messages until every survivor's routes and membership views
   agree again (``agreement`` below says what that means), then the dead router's
   subscribers resume at a neighbour and everyone answers what it has: every
   publisher must get its outcome, every subscriber each delivery of its topic, once.

Why a driver of its own rather than tests/unit/meshkit.py's ``Mesh``: the same fake
network (a core's SendControl / SendData become its neighbour's ControlReceived /
DataReceived after the wire's round trip), but synchronous **rounds** rather than one
message at a time: in a round every router handles what its neighbours sent it in the
previous round, and every control message one router has for one neighbour in a round
travels as one transfer, encoded and decoded by router/interrouter_codec.py as the
adapter does (which batches per loop iteration). Rounds are what convergence is
counted in, the byte counts are the real wire's, and batching keeps 100 cores x 100,000
subscribers (tens of millions of control messages) to minutes where ``Mesh`` settles
after each attach and keeps every command for the test to read. Only the client
commands the run needs are kept (Forward, SendOutcome), and the attach storm goes in
waves: an announcement's traffic does not depend on the others in flight, and a wave
bounds the messages on the wire at once.

Agreement (router/core/routing.py, network.py, membership.py): every surviving router
R (1) holds the same stamp (epoch, boot, version) for every survivor's link state as
that survivor's own, (2) routes as ``compute_routes`` does over the true surviving
graph (same reachable set, same next hop for every destination), (3) marks exactly the
dead routers lost in its membership table, and (4) holds, for every other survivor S,
S's incarnation, ``through`` equal to S's announcer's version, and exactly S's live
announcements (``snapshot_for(S)`` equals ``S.announcer.snapshot()``); for a dead
router D, the same announcements as D had (they wait to re-attach). (1)-(3) are checked
after every round; (4) at the end of each phase (it reads every entry).
"""

from __future__ import annotations

import argparse
import gc
import random
import resource
import sys
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from router.core import outcomes
from router.core.commands import Forward, SendControl, SendData, SendOutcome
from router.core.events import (
    DURABLE_UNSETTLED_STATE,
    PUBLISHER,
    SND_MIXED,
    SUBSCRIBER,
    ControlReceived,
    CreditChanged,
    DataReceived,
    LinkAttached,
    LinkDetached,
    MessageReceived,
    OutcomeReceived,
    PeerConnected,
    PeerLost,
)
from router.core.router import RouterCore
from router.core.routing import compute_routes
from router.core.settings import CoreSettings
from router.interrouter_codec import decode_control, decode_data, encode_control, encode_data_head
from router.serving import tune_gc_for_serving

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "unit"))
from corekit import encode  # noqa: E402  (the tests' message encoder, not a package)

EPOCH = 1
TERMINUS_TIMEOUT = 600  # seconds a durable subscriber may stay away (granted up to max_terminus_timeout)


# --------------------------------------------------------------------------- topology


def random_topology(n: int, seed: int) -> list[tuple[str, str]]:
    """A connected graph of ``n`` routers where each has 3 or 4 neighbours: a ring
    (connected whatever follows) plus random chords up to each router's drawn degree."""
    rng = random.Random(seed)
    names = router_names(n)
    edges = {frozenset((names[i], names[(i + 1) % n])) for i in range(n)}
    degree = Counter(name for edge in edges for name in edge)
    want = {name: rng.choice((3, 4)) for name in names}
    for _ in range(50 * n):
        short = [name for name in names if degree[name] < want[name]]
        if len(short) < 2:
            break
        a, b = rng.sample(short, 2)
        edge = frozenset((a, b))
        if edge in edges:
            continue
        edges.add(edge)
        degree[a] += 1
        degree[b] += 1
    return sorted(tuple(sorted(edge)) for edge in edges)  # type: ignore[misc]


def router_names(n: int) -> list[str]:
    return [f"r{i:03d}" for i in range(n)]


def zipf_weights(topics: int) -> list[float]:
    return [1.0 / (rank + 1) for rank in range(topics)]


# --------------------------------------------------------------------------- the network


@dataclass
class Traffic:
    """What crossed links: control messages by kind and their JSON bytes, control
    transfers and their payload bytes, data transfers and theirs, per sending router."""

    messages: Counter = field(default_factory=Counter)  # kind -> count
    message_bytes: Counter = field(default_factory=Counter)  # kind -> JSON bytes of the messages alone
    transfers: int = 0
    transfer_bytes: int = 0  # control transfers as encoded on the wire (batch envelope included)
    data_transfers: int = 0
    data_bytes: int = 0
    sent_by: Counter = field(default_factory=Counter)  # router -> control messages sent
    bytes_by: Counter = field(default_factory=Counter)  # router -> control transfer bytes sent
    received_by: Counter = field(default_factory=Counter)  # router -> control messages received
    rounds: int = 0

    def total_messages(self) -> int:
        return sum(self.messages.values())


@dataclass
class Subscriber:
    router: str
    container: str
    name: str
    topic: str
    link: int
    unanswered: list[bytes] = field(default_factory=list)  # copies it holds, not yet answered
    answered: set[bytes] = field(default_factory=set)  # tags it accepted and settled


class ScaleNet:
    """The cores of a router network joined by a fake network that moves in rounds."""

    def __init__(self, names: list[str], edges: list[tuple[str, str]], **settings: Any):
        self.now = 1000.0
        self.cores = {n: RouterCore(CoreSettings(router_id=n, **settings), boot_id=f"boot-{n}", epoch=EPOCH) for n in names}
        self.alive = set(names)
        self.links: dict[frozenset, int] = {}
        self._next_conn = 1_000_000
        self._next_link = 1
        self._next_delivery = 1
        # what is on its way, delivered next round: (source, target) -> control messages; data transfers
        self.control_out: dict[tuple[str, str], list[dict[str, Any]]] = defaultdict(list)
        self.data_out: list[tuple[str, str, int, bytes, bytes]] = []  # source, target, conn, tag, wire bytes
        self.subscriber_at: dict[int, Subscriber] = {}  # link -> subscriber
        self.outcomes: dict[int, SendOutcome] = {}  # publisher delivery -> its outcome
        self.forwards = 0
        self.duplicates = 0
        self.traffic = Traffic()
        for a, b in edges:
            self.connect(a, b)
        self.settle()

    # ---------------------------------------------------------------- plumbing

    def feed(self, name: str, event: Any) -> None:
        for c in self.cores[name].handle(event, self.now):
            kind = type(c)
            if kind is SendControl:
                self.control_out[(name, c.router_id)].append(c.message)
            elif kind is SendData:
                conn = self.links.get(frozenset((name, c.router_id)))
                assert conn is not None, f"{name} sent data to {c.router_id}, not its neighbour"
                self.data_out.append((name, c.router_id, conn, c.tag, encode_data_head(c.header) + c.payload))
            elif kind is Forward:
                sub = self.subscriber_at.get(c.link_id)
                if sub is not None:
                    self.forwards += 1
                    if c.tag in sub.answered:
                        self.duplicates += 1  # given again what it accepted and settled: not exactly once
                    elif c.tag not in sub.unanswered:  # (a resend to a resumed link of what it holds is no new copy)
                        sub.unanswered.append(c.tag)
            elif kind is SendOutcome:
                self.outcomes[c.delivery] = c

    def round(self) -> int:
        """Deliver everything sent in the previous round; the number of control
        messages and data transfers delivered."""
        control, self.control_out = self.control_out, defaultdict(list)
        data, self.data_out = self.data_out, []
        t = self.traffic
        delivered = 0
        for (source, target), messages in sorted(control.items()):
            conn = self.links.get(frozenset((source, target)))
            if conn is None:
                continue  # the link went down with these on it
            core = self.cores[source]
            wire = encode_control(source, EPOCH, core.boot_id, messages)
            t.transfers += 1
            t.transfer_bytes += len(wire)
            t.bytes_by[source] += len(wire)
            t.sent_by[source] += len(messages)
            t.received_by[target] += len(messages)
            for message in messages:
                kind = message["t"]
                t.messages[kind] += 1
                t.message_bytes[kind] += len(orjson.dumps(message))
            delivered += len(messages)
            self.feed(target, ControlReceived(conn, source, decode_control(wire).msgs))
        for source, target, conn, tag, wire in data:
            if self.links.get(frozenset((source, target))) != conn:
                continue
            t.data_transfers += 1
            t.data_bytes += len(wire)
            header, payload = decode_data(wire)
            delivered += 1
            self.feed(target, DataReceived(conn, source, tag, header, payload))
        if delivered:
            t.rounds += 1
        self.now += 0.001  # a round is about a millisecond of a real network
        return delivered

    def settle(self, on_round=None, limit: int = 10_000) -> int:
        """Run rounds until nothing is in flight; ``on_round(n)`` after each. The rounds run."""
        rounds = 0
        while self.control_out or self.data_out:
            self.round()
            rounds += 1
            if on_round is not None:
                on_round(rounds)
            assert rounds < limit, "the network does not quiesce"
        return rounds

    def connect(self, a: str, b: str) -> None:
        self._next_conn += 1
        self.links[frozenset((a, b))] = self._next_conn
        self.feed(a, PeerConnected(self._next_conn, b, EPOCH, f"boot-{b}"))
        self.feed(b, PeerConnected(self._next_conn, a, EPOCH, f"boot-{a}"))

    def kill(self, router: str) -> None:
        """``router`` dies: every link to it drops, each neighbour sees PeerLost; what
        was in flight to or from it is lost."""
        self.alive.discard(router)
        for pair in sorted((p for p in self.links if router in p), key=sorted):
            conn = self.links.pop(pair)
            (other,) = pair - {router}
            self.feed(other, PeerLost(conn, router))
        for key in [k for k in self.control_out if router in k]:
            del self.control_out[key]
        self.data_out = [d for d in self.data_out if router not in d[:2]]

    # ---------------------------------------------------------------- clients

    def attach(self, router: str, container: str, name: str, topic: str, properties=None) -> Subscriber:
        """A durable subscriber attaches (credit granted at once); its announcement is
        on its way at the next round."""
        link = self._next_link
        self._next_link += 1
        sub = Subscriber(router, container, name, topic, link)
        self.subscriber_at[link] = sub
        self.feed(
            router,
            LinkAttached(
                link,
                link,
                container,
                name,
                SUBSCRIBER,
                topic,
                durable=DURABLE_UNSETTLED_STATE,
                timeout=TERMINUS_TIMEOUT,
                rcv_settle_mode=1,
                properties=properties,
            ),
        )
        self.feed(router, CreditChanged(link, 1000))
        return sub

    def detach(self, sub: Subscriber, closed: bool = True) -> None:
        self.feed(sub.router, LinkDetached(sub.link, closed))
        del self.subscriber_at[sub.link]

    def publisher(self, router: str, topic: str) -> int:
        link = self._next_link
        self._next_link += 1
        self.feed(
            router,
            LinkAttached(link, link, f"P-{link}", f"pub-{link}", PUBLISHER, topic, snd_settle_mode=SND_MIXED, rcv_settle_mode=0),
        )
        return link

    def publish(self, router: str, link: int, tag: bytes, body: str) -> int:
        delivery = self._next_delivery
        self._next_delivery += 1
        self.feed(router, MessageReceived(link, delivery, tag, encode(body), False))
        return delivery

    def answer(self, sub: Subscriber, count: int | None = None) -> int:
        """``sub`` accepts (and settles) the oldest ``count`` copies it holds (all by default)."""
        tags = sub.unanswered[: len(sub.unanswered) if count is None else count]
        del sub.unanswered[: len(tags)]
        for tag in tags:
            sub.answered.add(tag)
            self.feed(sub.router, OutcomeReceived(sub.link, tag, outcomes.ACCEPTED, True))
        return len(tags)

    # ---------------------------------------------------------------- agreement

    def true_graph(self):
        """The link states the survivors would hold if every update had arrived."""
        return [self.cores[name].net.lsdb.own for name in sorted(self.alive)]

    def routes_agree(self) -> list[str]:
        """What (1)-(3) of the module's agreement find wrong; empty when they hold."""
        problems = []
        own = {name: self.cores[name].net.lsdb.own.stamp for name in self.alive}
        truth = self.true_graph()
        dead = set(self.cores) - self.alive
        for name in sorted(self.alive):
            net = self.cores[name].net
            digest = net.lsdb.digest()
            stale = [other for other, stamp in own.items() if digest.get(other) != stamp]
            if stale:
                problems.append(f"{name}: stale link state of {len(stale)} routers")
            expected = compute_routes(name, truth)
            if net.routes.reachable != expected.reachable or dict(net.routes.next_hop) != dict(expected.next_hop):
                problems.append(f"{name}: routes differ")
            if net.membership.lost_routers() != frozenset(dead):
                problems.append(f"{name}: lost {sorted(net.membership.lost_routers())}, dead {sorted(dead)}")
        return problems

    def membership_agrees(self) -> list[str]:
        """(4) of the module's agreement: every survivor holds every other router's live
        announcements exactly as that router's announcer has them."""
        problems = []
        truth = {name: core.net.announcer.snapshot() for name, core in self.cores.items()}
        for name in sorted(self.alive):
            table = self.cores[name].net.membership
            for other, snapshot in truth.items():
                if other == name:
                    continue
                held = table.snapshot_for(other)
                if held is None:
                    if snapshot.announcements:
                        problems.append(f"{name}: nothing of {other}")
                    continue
                if (held.epoch, held.boot, held.through) != (snapshot.epoch, snapshot.boot, snapshot.through):
                    problems.append(f"{name}: {other} through {held.through}, it is at {snapshot.through}")
                elif held.announcements != snapshot.announcements:
                    problems.append(f"{name}: {other}'s subscribers differ")
        return problems


# --------------------------------------------------------------------------- memory


def deep_size(roots: list[Any], seen: set[int] | None = None) -> int:
    """Bytes of every object reachable from ``roots`` (``sys.getsizeof`` over
    ``gc.get_referents``) and not in ``seen``, each counted once (and added to ``seen``);
    classes, functions and modules are not followed (shared code, not data)."""
    seen = set() if seen is None else seen
    stack = list(roots)
    total = 0
    skip = (type, type(deep_size), type(sys))
    while stack:
        obj = stack.pop()
        if id(obj) in seen or isinstance(obj, skip):
            continue
        seen.add(id(obj))
        total += sys.getsizeof(obj)
        stack.extend(gc.get_referents(obj))
    return total


def identity_memory(core: RouterCore) -> dict[str, int]:
    """What one router holds about subscriber identities, in bytes, by structure. One
    walk: what two structures share (a key's strings) counts in the first that reaches it."""
    net, table, seen = core.net, core.net.membership, set()
    parts = {
        # every other router's announcements as received, with the versions and tombstones
        "views": deep_size([table._views], seen),
        "by_topic": deep_size([table._by_topic, table._patterns], seen),  # topic -> router -> keys
        "locations": deep_size([table._locations], seen),  # key -> routers where it is known
        # stamps of "stream-resumed" floods passed on (announcements: the table knows repeats)
        "flooded": deep_size([core._flooded], seen),
        "announcer": deep_size([net.announcer], seen),  # our own live announcements
        "acks": deep_size([core._awaiting_acks], seen),  # our attaches waiting for every router's ack
    }
    parts["table"] = parts["views"] + parts["by_topic"] + parts["locations"] + deep_size([table], seen)
    return parts


# --------------------------------------------------------------------------- the run


@dataclass
class Phase:
    name: str
    seconds: float
    rounds: int
    traffic: Traffic
    agreed_after: int | None = None  # rounds until routes agreed (after a router died)
    messages_to_agree: int = 0
    quiet_after: int = 0  # rounds after ``action`` until nothing was in flight
    waves: list[int] = field(default_factory=list)  # rounds of each wave of an attach storm


def measured(net: ScaleNet, name: str, action, until_agreed: bool = False) -> Phase:
    """Run ``action`` then rounds until quiet, counting what crossed links; with
    ``until_agreed``, also the round after which (1)-(3) of the agreement first held
    (checked after every round) and the control messages sent until then."""
    net.traffic = Traffic()
    start = time.perf_counter()
    action()
    phase = Phase(name, 0.0, 0, net.traffic)

    def check(rounds: int) -> None:
        if phase.agreed_after is None and not net.routes_agree():
            phase.agreed_after = rounds
            phase.messages_to_agree = net.traffic.total_messages()

    phase.quiet_after = net.settle(on_round=check if until_agreed else None)
    phase.rounds = net.traffic.rounds  # rounds in which something crossed a link, ``action``'s own included
    phase.seconds = time.perf_counter() - start
    return phase


def run(
    routers: int = 60,
    subscribers: int = 100_000,
    topics: int = 1000,
    detach_fraction: float = 0.1,
    seed: int = 21,
    walk: int = 6,
    messages: int = 40,
    wave: int = 5000,
    log=print,
) -> dict[str, Any]:
    """The whole scale model; returns the measures (and ``log`` narrates)."""
    rng = random.Random(seed)
    names = router_names(routers)
    edges = random_topology(routers, seed)
    started = time.perf_counter()
    net = ScaleNet(names, edges)
    degree = Counter(name for edge in edges for name in edge)
    diameter = max(max(compute_routes(n, net.true_graph()).cost.values()) for n in names)
    log(f"{routers} routers, {len(edges)} links (degree {min(degree.values())}-{max(degree.values())}, diameter {diameter})")
    assert not net.routes_agree(), "routes disagree at the start"
    topic_names = [f"tenant{i % 37:02d}/orders/region-{i:04d}" for i in range(topics)]
    weights = zipf_weights(topics)
    placed = [(rng.choice(names), rng.choices(topic_names, weights)[0]) for _ in range(subscribers)]
    result: dict[str, Any] = {
        "wave": min(wave, subscribers),
        "routers": routers,
        "links": len(edges),
        "diameter": diameter,
        "subscribers": subscribers,
    }
    result["topics_used"] = len({t for _, t in placed})
    result["top_topic"] = Counter(t for _, t in placed).most_common(1)[0][1]
    # What an aggregated announcement (per router and topic, not per subscriber) would carry
    result["interest_pairs"] = len(set(placed))
    # Confirmations if only an announcement's first receipt at each router were confirmed
    # (today every receipt is: "confirm even a duplicate", control.py): each router's
    # distance back to the origin, per subscriber
    distance_sum = {n: sum(compute_routes(n, net.true_graph()).cost.values()) for n in names}
    result["first_receipt_acks"] = sum(distance_sum[router] for router, _ in placed)

    # 1. attach storm, in waves of ``wave`` subscribers attaching at once: the traffic of an
    # announcement does not depend on the others in flight, and a wave bounds what is on the
    # wire at once (10,000 at once hold ~2 GB of messages in flight at 60 routers)
    subs: list[Subscriber] = []
    wave_rounds: list[int] = []

    def attach_all() -> None:
        for first in range(0, subscribers, wave):
            for i in range(first, min(first + wave, subscribers)):
                router, topic = placed[i]
                container = f"{rng.getrandbits(128):032x}"  # a client's container-id: 32 hex digits, as a UUID
                subs.append(net.attach(router, container, f"{topic}-sub-{i}", topic))
            before = net.traffic.rounds
            net.settle()
            wave_rounds.append(net.traffic.rounds - before)
            if len(wave_rounds) % 4 == 0:
                sent = net.traffic.total_messages()
                log(f"  {len(subs):,} attached, {sent:,} control messages, {time.perf_counter() - started:.0f} s")
            gc.freeze()  # what the wave left is long-lived: keep the collector from walking it again

    attach = measured(net, "attach storm", attach_all)
    attach.waves = wave_rounds
    log(
        f"attach storm: {len(wave_rounds)} waves of {min(wave, subscribers):,}, {max(wave_rounds)} rounds each at most, "
        f"{attach.traffic.total_messages():,} control messages, {attach.seconds:.0f} s"
    )
    problems = net.membership_agrees()
    assert not problems, problems[:5]
    result["attach"] = attach

    # 2. memory, on a sample of routers spread by degree (the walk is slow; every router holds the others)
    by_degree = sorted(names, key=lambda n: (degree[n], n))
    sample = sorted({by_degree[int(i * (len(by_degree) - 1) / max(1, walk - 1))] for i in range(walk)})
    local = Counter(sub.router for sub in subs)
    memory = {}
    for name in sample:
        memory[name] = identity_memory(net.cores[name])
        memory[name]["local"] = local[name]
    result["memory"] = memory
    result["rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    log(f"memory walked on {len(sample)} routers; peak RSS {result['rss_mb']:.0f} MB")

    # 3. detach storm
    leaving = rng.sample(subs, int(len(subs) * detach_fraction))
    detach = measured(net, "detach storm", lambda: [net.detach(sub) for sub in leaving])
    gone = {id(s) for s in leaving}
    subs = [s for s in subs if id(s) not in gone]
    problems = net.membership_agrees()
    assert not problems, problems[:5]
    result["detach"] = detach
    result["detached"] = len(leaving)
    log(f"detach storm: {detach.rounds} rounds, {detach.traffic.total_messages():,} control messages")

    # 4. a router dies with exactly-once deliveries in flight
    victim = busiest_transit(net, names)
    around = {a if b == victim else b for a, b in edges if victim in (a, b)}
    publishing = [n for n in names if n != victim and n not in around]
    count_by_topic = Counter(s.topic for s in subs)
    on_victim = Counter(s.topic for s in subs if s.router == victim)
    chosen = [t for t in topic_names if on_victim[t] and 20 <= count_by_topic[t] <= 400][:4] or topic_names[:1]
    deliveries: list[int] = []

    def publish_all() -> None:
        for i in range(messages):
            topic = chosen[i % len(chosen)]
            router = publishing[(i * 7) % len(publishing)]
            link = net.publisher(router, topic)
            deliveries.append(net.publish(router, link, f"m{i}".encode(), f"message {i} on {topic}"))

    publish = measured(net, "publish", publish_all)
    holding = [s for s in subs if s.unanswered]
    copies = sum(len(s.unanswered) for s in holding)
    answered = 0

    def answer_half_then_die() -> None:
        nonlocal answered
        answered = sum(net.answer(s, (len(s.unanswered) + 1) // 2) for s in holding if s.router != victim)
        net.round()  # the first answers leave; the rest are on the wire when the router dies
        net.kill(victim)

    kill = measured(net, "router dies", answer_half_then_die, until_agreed=True)
    problems = net.routes_agree() + net.membership_agrees()
    assert not problems, problems[:5]
    log(f"{victim} died: routes agree after {kill.agreed_after} rounds, quiet after {kill.quiet_after}")

    # its subscribers resume at a neighbour, reporting what they hold; everyone answers everything
    neighbour = min(around)
    moving = [s for s in subs if s.router == victim]

    def fail_over() -> None:
        for sub in moving:
            del net.subscriber_at[sub.link]
            unsettled = [[tag, "none"] for tag in sub.unanswered]
            properties = {"eorouter:resume": True, "eorouter:unsettled": unsettled} if unsettled else None
            net.attach(neighbour, sub.container, sub.name, sub.topic, properties).answered = sub.answered
        for _ in range(20):
            net.settle()
            pending = [s for s in net.subscriber_at.values() if s.unanswered]
            if not pending:
                break
            for s in pending:
                net.answer(s)

    failover = measured(net, "failover", fail_over)
    # every subscriber of a topic at publish time (the dead router's where they resumed)
    # accepted each of its deliveries once
    on_topic = Counter(chosen[i % len(chosen)] for i in range(messages))
    missing = sum(on_topic[s.topic] - len(s.answered) for s in net.subscriber_at.values())
    finished = [d for d in deliveries if d in net.outcomes]
    accepted = [d for d in finished if net.outcomes[d].outcome == outcomes.ACCEPTED]
    result.update(
        publish=publish,
        kill=kill,
        failover=failover,
        victim=victim,
        victim_degree=degree[victim],
        in_flight={"deliveries": len(deliveries), "copies": copies, "answered_before": answered, "resumed": len(moving)},
        finished=len(finished),
        duplicates=net.duplicates,
        missing=missing,
        accepted=len(accepted),
        seconds=time.perf_counter() - started,
        rss_mb=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    )
    return result


def busiest_transit(net: ScaleNet, names: list[str]) -> str:
    """The router most shortest paths go through (as a next hop) whose death leaves the
    rest connected: its death moves the most routes without partitioning the network."""
    through: Counter = Counter()
    truth = net.true_graph()
    for name in names:
        through.update(compute_routes(name, truth).next_hop.values())
    for candidate in sorted(names, key=lambda n: (-through[n], n)):
        rest = [ls for ls in truth if ls.origin != candidate]
        start = rest[0].origin
        if len(compute_routes(start, rest).reachable) == len(rest) - 1:
            return candidate
    raise ValueError("no router's death leaves the network connected")


# --------------------------------------------------------------------------- report


def report(r: dict[str, Any]) -> str:
    lines = []
    n, subs = r["routers"], r["subscribers"]
    lines.append(
        f"{n} routers, {r['links']} links, diameter {r['diameter']}; {subs:,} durable subscribers on "
        f"{r['topics_used']} topics (Zipf, the largest has {r['top_topic']:,}); {r['interest_pairs']:,} (router, topic) "
        f"pairs with a subscriber"
    )
    lines.append("")
    lines.append(
        "| router | other routers' subscribers held | local | table MB | bytes per remote subscriber: "
        "announcements / topic index / key index | flood stamps MB | announcer MB |"
    )
    lines.append("|---|---:|---:|---:|---:|---:|---:|")
    for name, m in r["memory"].items():
        remote = subs - m["local"]
        split = " / ".join(f"{m[part] / max(1, remote):.0f}" for part in ("views", "by_topic", "locations"))
        lines.append(
            f"| {name} | {remote:,} | {m['local']:,} | {m['table'] / 1e6:.1f} | {m['table'] / max(1, remote):.0f}: {split} | "
            f"{m['flooded'] / 1e6:.1f} | {m['announcer'] / 1e6:.2f} |"
        )
    lines.append("")
    lines.append(
        "| phase | rounds | control msgs | per subscriber | sent per router (mean / max) | control MB | "
        "bytes per subscriber | data transfers | by kind |"
    )
    lines.append("|---|---:|---:|---:|---:|---:|---:|---:|---|")
    for key, per in (("attach", subs), ("detach", r["detached"]), ("publish", None), ("kill", None), ("failover", None)):
        p = r[key]
        t = p.traffic
        total = t.total_messages()
        kinds = ", ".join(f"{k} {v:,}" for k, v in t.messages.most_common())
        rounds = f"{max(p.waves)} per wave of {r['wave']:,}" if p.waves else str(p.rounds)
        senders = list(t.sent_by.values())
        per_router = f"{sum(senders) / n:,.0f} / {max(senders):,}" if senders else "0"
        per_sub = f"{total / per:,.0f}" if per else "-"
        bytes_per_sub = f"{t.transfer_bytes / per:,.0f}" if per else "-"
        lines.append(
            f"| {p.name} | {rounds} | {total:,} | {per_sub} | {per_router} | "
            f"{t.transfer_bytes / 1e6:,.1f} | {bytes_per_sub} | {t.data_transfers:,} | {kinds} |"
        )
    acks = r["attach"].traffic.messages["sub-ack"]
    lines.append("")
    lines.append(
        f"attach confirmations: {acks:,} sub-ack messages ({acks / subs:,.0f} per subscriber); confirming only the first "
        f"receipt would take {r['first_receipt_acks']:,} ({r['first_receipt_acks'] / subs:,.0f}), confirming along the flood "
        f"tree (each router once, to the neighbour it first heard from) {(n - 1) * subs:,} ({n - 1})"
    )
    f = r["in_flight"]
    lines.append("")
    lines.append(
        f"{r['victim']} (degree {r['victim_degree']}, the busiest transit router) died with {f['deliveries']} exactly-once "
        f"deliveries in flight ({f['copies']:,} copies at subscribers, {f['answered_before']:,} answered just before); "
        f"routes and lost marks agree after {r['kill'].agreed_after} rounds ({r['kill'].messages_to_agree:,} control "
        f"messages), all quiet after {r['kill'].quiet_after}; {f['resumed']:,} of its subscribers resumed at a "
        f"neighbour; {r['finished']}/{f['deliveries']} publishers got their outcome, {r['accepted']} accepted; "
        f"{r['missing']} copies missing at subscribers, {r['duplicates']} given twice"
    )
    lines.append(f"run {r['seconds']:.0f} s, peak RSS {r['rss_mb']:,.0f} MB")
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.scale", description=__doc__.split("\n\n")[0])
    p.add_argument("--routers", type=int, default=60, help="routers in the network (50-100 for the model)")
    p.add_argument("--subscribers", type=int, default=100_000)
    p.add_argument("--topics", type=int, default=1000)
    p.add_argument("--detach", type=float, default=0.1, help="the share of subscribers in the detach storm")
    p.add_argument("--messages", type=int, default=40, help="exactly-once deliveries in flight when the router dies")
    p.add_argument("--walk", type=int, default=6, help="routers whose memory is walked")
    p.add_argument("--wave", type=int, default=5000, help="subscribers attaching at once in the attach storm")
    p.add_argument("--seed", type=int, default=21)
    a = p.parse_args(argv)
    tune_gc_for_serving()
    result = run(a.routers, a.subscribers, a.topics, a.detach, a.seed, a.walk, a.messages, a.wave)
    print()
    print(report(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
