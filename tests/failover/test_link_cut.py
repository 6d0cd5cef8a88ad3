"""A link cut, not a death: routers in network namespaces, a link cut and restored
mid-stream; the same verdict as test_kill.py.

Each router runs in its own network namespace, joined to the others by a bridge in a
"switch" namespace (tests/failover/netns.py); the clients run in a namespace of their
own on the same switch. The routers and the clients stay alive throughout: only
packets stop. After the link is restored, and every publisher has all its outcomes:
every message a publisher got "accepted" for was handed to every durable
subscriber's application exactly once, in publisher order, per the clients' own
ledgers, and no router (the cut one included) keeps a record.

Needs root and ``ip netns`` (skipped with the reason otherwise); the silent
partitions also need ``nft`` (Debian nftables).
"""

from __future__ import annotations

import threading
import time
from collections import defaultdict

import pytest
from netns import CLIENTS, NetnsLab, nft_missing_reason, unusable_reason
from test_kill import MESSAGES, TRIANGLE, Scenario

from eorouter_tools.launcher import RouterProcess
from eorouter_tools.topology import RouterNetwork, parse_topology
from router.client import ResumablePublisher, ResumableSubscriber

pytestmark = pytest.mark.timeout(180)

IDLE_TIMEOUT = 2.0  # the routers' documented default, set explicitly (the launcher's test default is 4 s)
NOTICE_WITHIN = 2 * IDLE_TIMEOUT + 1.0  # detection: the idle timeout, plus slack for a loaded 2-core machine
OUTCOME_WAIT = 10.0  # seconds after the restore for every publisher outcome (a stuck one fails fast)
BLIP = 0.3  # seconds: below every heartbeat and idle timeout in play
HOLD = 7.0  # seconds a fault stays at most (restored earlier once every peer noticed it)
_UNUSABLE = unusable_reason()
_NO_NFT = nft_missing_reason()
if _UNUSABLE:
    print(f"\ntest_link_cut: skipped: {_UNUSABLE}")
needs_netns = pytest.mark.skipif(_UNUSABLE is not None, reason=_UNUSABLE or "")
needs_nft = pytest.mark.skipif(_NO_NFT is not None, reason=_NO_NFT or "")


class NetnsRouterNetwork(RouterNetwork):
    """RouterNetwork with every router in its namespace, listening on its own address
    (5672 for clients, 5673 for routers: each namespace has its own ports)."""

    def __init__(self, workdir, topology, lab: NetnsLab, overrides=None):
        super().__init__(workdir, topology, overrides or {})
        self.lab = lab

    def _config_for(self, router_id: str) -> dict:
        config = super()._config_for(router_id)
        host = self.lab.address(router_id)
        config["listener"] = [
            {"host": host, "port": 5672, "role": "normal"},
            {"host": host, "port": 5673, "role": "inter-router"},
        ]
        # As RouterNetwork does: for each link, the router started later dials the earlier one.
        order = self.topology.routers
        peers = [b if a == router_id else a for a, b in self.topology.links if router_id in (a, b)]
        dials = [
            {"host": self.lab.address(p), "port": 5673, "role": "inter-router"}
            for p in peers
            if order.index(p) < order.index(router_id)
        ]
        config.pop("connector", None)
        if dials:
            config["connector"] = dials
        return config

    def start(self, timeout: float = 30.0) -> NetnsRouterNetwork:
        for router_id in self.topology.routers:
            router = RouterProcess(self.workdir, router_id, self._config_for(router_id), prelude=self.lab.prelude(router_id))
            self.routers[router_id] = router
            router.start()
        self.wait_converged(timeout)
        return self


class NetnsScenario(Scenario):
    """test_kill's Scenario (traffic, ledgers, verdict) on namespaced routers, with the
    clients' threads in the clients' namespace."""

    def __init__(self, tmp_path, lab: NetnsLab, publishers=("A", "B"), subscribers=("A", "B", "C")):
        self.dir = tmp_path
        self.lab = lab
        self.net = NetnsRouterNetwork(
            tmp_path / "routers",
            parse_topology(TRIANGLE),
            lab,
            overrides={
                "router": {"idle_timeout": IDLE_TIMEOUT},
                "delivery": {"record_linger": 1.0, "drain_grace": 1.0},
                "failover": {"publisher_resume_timeout": 20},
            },
        )
        self.pubs, self.subs = {}, {}
        try:
            self._start(tmp_path, lab, publishers, subscribers)
        except BaseException:
            self.close()  # a half-built scenario: its routers and clients go before the namespaces
            raise

    def _start(self, tmp_path, lab, publishers, subscribers):
        self.net.start()
        self.topic = "orders"
        self.received: dict[str, list] = defaultdict(list)
        self.outcomes: dict[str, list] = {}
        with lab.entered(CLIENTS):  # the client threads (and every socket they open) live there
            for where in subscribers:
                name = f"sub-{where}"
                self.subs[name] = ResumableSubscriber(
                    self.urls(first=where),
                    self.topic,
                    container_id=name,
                    link_name=f"{name}-link",
                    state_path=tmp_path / f"{name}.state",
                    ledger_path=tmp_path / f"{name}.ledger.jsonl",
                    on_message=lambda msg, name=name: self.received[name].append(msg.body),
                    heartbeat=1.0,
                )
                self.subs[name].start()
            for where in publishers:
                name = f"pub-{where}"
                self.pubs[name] = ResumablePublisher(
                    self.urls(first=where),
                    self.topic,
                    container_id=name,
                    link_name=f"{name}-link",
                    state_path=tmp_path / f"{name}.state",
                    ledger_path=tmp_path / f"{name}.ledger.jsonl",
                    heartbeat=1.0,
                )
                self.pubs[name].start()
        for client in [*self.subs.values(), *self.pubs.values()]:
            assert client.wait_attached(20), f"{client.container_id} never attached"

    def publish_in_background(self):
        """test_kill's steady traffic; the futures are kept so that ``finish`` can fail
        fast, naming what is missing, instead of blocking for minutes."""
        self.futures: dict[str, list] = {}

        def run(name, pub):
            self.futures[name] = futures = []
            for n in range(MESSAGES):
                futures.append(pub.send_async(f"{name}:{n + 1}"))
                time.sleep(0.004)  # steady traffic, not one burst

        threads = [threading.Thread(target=run, args=item, daemon=True) for item in self.pubs.items()]
        for t in threads:
            t.start()
        return threads

    def finish(self, threads, timeout: float = OUTCOME_WAIT):
        deadline = time.monotonic() + timeout
        for t in threads:
            t.join(max(0.1, deadline - time.monotonic()))
            assert not t.is_alive(), "a publisher could not even send its messages"
        while any(not f.done() for fs in self.futures.values() for f in fs) and time.monotonic() < deadline:
            time.sleep(0.05)
        missing = {name: [n + 1 for n, f in enumerate(fs) if not f.done()] for name, fs in self.futures.items()}
        missing = {k: v for k, v in missing.items() if v}
        assert not missing, f"no outcome within {timeout:g} s for (publisher: seqs) {missing}"
        self.outcomes = {name: [f.result(0) for f in fs] for name, fs in self.futures.items()}
        for pub in self.pubs.values():
            assert pub.wait_settled(max(1.0, deadline - time.monotonic()))

    def wait_no_records(self, dead, timeout=5):
        # records linger 1 s here: 5 s is ample, and a leftover fails fast
        super().wait_no_records(dead, timeout)

    def wait(self, predicate, what: str, timeout: float = 20.0) -> float:
        """Poll ``predicate`` until true; returns the time.time() it became true."""
        deadline = time.monotonic() + timeout
        while not predicate():
            assert time.monotonic() < deadline, f"not within {timeout} s: {what}"
            time.sleep(0.02)
        return time.time()

    def lost_at(self, router_id: str, peer: str, since: float) -> float | None:
        """When ``router_id`` logged ``peer-lost`` for ``peer`` after ``since`` (None: not yet)."""
        return next(
            (
                e["ts"]
                for e in self.net.routers[router_id].events()
                if e["event"] == "peer-lost" and e.get("peer") == peer and e["ts"] >= since
            ),
            None,
        )

    def wait_a_clients_moved(self) -> float:
        return self.wait(
            lambda: all(c.attached and c.router != self.net.routers["A"].url for c in (self.pubs["pub-A"], self.subs["sub-A"])),
            "A's publisher and subscriber failed over",
        )

    def cut_a_off_and_back(self, what: str, cut, restore) -> None:
        """Steady traffic; ``cut()`` takes A (which hosts a publisher and a subscriber)
        off the network; its clients fail over and B and C notice; ``restore()``
        brings it back and A, alive all along with its records, rejoins. Then the
        verdict, and the timings printed."""
        threads = self.publish_in_background()
        self.wait_progress(40)
        cut_at = time.time()
        cut()
        moved = self.wait_a_clients_moved()
        noticed = self.hold_cut(cut_at, lost="A", by=("B", "C"))
        restore()
        restored_at = time.time()
        self.net.wait_converged(60)
        healed = time.time()
        self.finish(threads)
        self.verify()
        print(
            f"\n{what}: clients moved {moved - cut_at:.2f} s after the cut; "
            f"{self.describe_noticed(noticed, cut_at)}; "
            f"A back in everyone's routes {healed - restored_at:.2f} s after the restore; "
            f"longest outcome stall per publisher: " + ", ".join(f"{k} {v:.2f} s" for k, v in self.stalls(cut_at).items())
        )
        self.expect_noticed(noticed, cut_at, "A")

    def hold_cut(self, cut_at: float, lost: str, by) -> dict[str, float | None]:
        """Keep the fault in place until every router in ``by`` has noticed it lost
        ``lost`` (plus a second), or HOLD seconds at most; returns when each noticed.
        Also snapshots the TCP send queues in the namespaces of those that did not."""
        deadline = cut_at + HOLD
        noticed = {r: None for r in by}
        while time.time() < deadline:
            for r in by:
                noticed[r] = noticed[r] or self.lost_at(r, lost, cut_at)
            if all(noticed.values()):
                deadline = min(deadline, max(noticed.values()) + 1.0)
            time.sleep(0.05)
        self.sockets_when_held = {r: self.lab.sockets(r) for r in by if noticed[r] is None}
        for r, text in self.sockets_when_held.items():  # evidence for the report, shown on failure
            print(
                f"\n{r} had not noticed the loss of {lost} {time.time() - cut_at:.1f} s after the cut; "
                f"its TCP sockets (ss -tno):\n{text}"
            )
        return noticed

    @staticmethod
    def describe_noticed(noticed: dict, cut_at: float) -> str:
        return "peers noticed after " + ", ".join(
            f"{r} {t - cut_at:.2f} s" if t else f"{r} never (within {HOLD:g} s)" for r, t in noticed.items()
        )

    def expect_noticed(self, noticed: dict, cut_at: float, lost: str) -> None:
        """Failure detection: every peer notices a cut link within its idle timeout
        (plus scheduling slack). Checked after the message verdict, which comes first."""
        late = {r: t for r, t in noticed.items() if t is None or t - cut_at > NOTICE_WITHIN}
        detail = "; ".join(
            f"{r}: " + (f"no peer-lost for {lost} within {HOLD:g} s" if t is None else f"peer-lost after {t - cut_at:.2f} s")
            for r, t in late.items()
        )
        sockets = "".join(f"\n{r}'s sockets while cut:\n{text}" for r, text in self.sockets_when_held.items())
        assert not late, f"a peer did not notice the cut within {NOTICE_WITHIN:g} s: {detail}{sockets}"

    def stalls(self, since: float) -> dict[str, float]:
        """Per publisher: the longest wait for an outcome after ``since`` (from the
        previous outcome, or from ``since``), i.e. how long its traffic stood still."""
        out = {}
        for name in self.pubs:
            times = [since] + sorted(e["ts"] for e in self.ledger(name) if e["event"] == "outcome" and e["ts"] > since)
            out[name] = max((b - a for a, b in zip(times, times[1:])), default=0.0)
        return out


@pytest.fixture
def lab():
    lab = NetnsLab(["A", "B", "C"])
    try:
        lab.setup()
        yield lab
    finally:
        lab.teardown()
        assert not lab.exists(), f"namespaces left behind: {lab.exists()}"


@pytest.fixture
def netscenario(tmp_path, lab):
    made = []

    def make(**kw):
        made.append(NetnsScenario(tmp_path, lab, **kw))
        return made[-1]

    yield make
    for s in made:  # before the lab's finalizer deletes the namespaces
        s.close()


@needs_netns
def test_cut_shorter_than_the_idle_timeout_changes_nothing(netscenario):
    """A blip: A's link goes down for 0.3 s, less than the clients' heartbeat (1 s)
    and the routers' idle timeout (2 s), and comes back. Nobody may notice (no
    peer-lost, no failover): TCP retransmits what was lost, and the verdict holds
    with every client still where it was."""
    s = netscenario()
    threads = s.publish_in_background()
    s.wait_progress(40)
    cut_at = time.time()
    s.lab.link_down("A")
    time.sleep(BLIP)  # the blip itself (the injected fault)
    s.lab.link_up("A")
    s.finish(threads)
    s.verify()
    lost = {
        r: [e["peer"] for e in s.net.routers[r].events() if e["event"] == "peer-lost" and e["ts"] >= cut_at]
        for r in s.net.routers
    }
    assert not any(lost.values()), f"a blip shorter than the idle timeout dropped peers: {lost}"
    moved = [c.container_id for c in [*s.pubs.values(), *s.subs.values()] if c.attaches != 1]
    assert not moved, f"clients failed over on a blip: {moved}"
    print(
        f"\nblip of {BLIP:g} s on A's link: longest outcome stall per publisher: "
        + ", ".join(f"{k} {v:.2f} s" for k, v in s.stalls(cut_at).items())
    )


@needs_netns
def test_clean_cut_isolates_a_router(netscenario):
    """A's only link goes down (``ip link set eth0 down`` in A's namespace) while A
    hosts a publisher and a subscriber. A's clients fail over to B and C; B and C
    drop A after their idle timeout; then the link comes back and A, alive all along
    with its records, rejoins."""
    s = netscenario()
    s.cut_a_off_and_back("clean cut of A", lambda: s.lab.link_down("A"), lambda: s.lab.link_up("A"))


@needs_netns
@needs_nft
def test_silent_partition_between_two_routers(netscenario):
    """Everything between A and B is silently dropped (nftables, both ends); A and B
    only learn it from the idle timeout and route through C meanwhile. Then the
    partition heals and the A - B link comes back."""
    s = netscenario()
    threads = s.publish_in_background()
    s.wait_progress(40)
    cut_at = time.time()
    s.lab.partition("A", "B")
    detected = s.wait(
        lambda: any(e["event"] == "peer-lost" and e.get("ts", 0) >= cut_at for e in s.net.routers["A"].events()),
        "A noticed B is gone",
        15,
    )
    time.sleep(1.0)  # the partition itself (the injected fault)
    s.lab.heal("A", "B")
    restored_at = time.time()
    s.wait(
        lambda: any(e["event"] == "peer-connected" and e.get("ts", 0) >= restored_at for e in s.net.routers["A"].events()),
        "A and B linked again",
        20,
    )
    s.finish(threads)
    s.verify()
    print(
        f"\nsilent partition A | B: detected {detected - cut_at:.2f} s after the cut; "
        f"longest outcome stall per publisher: " + ", ".join(f"{k} {v:.2f} s" for k, v in s.stalls(cut_at).items())
    )


@needs_netns
@needs_nft
@pytest.mark.slow
def test_silent_isolation_of_a_router(netscenario):
    """A goes silent to everyone (nftables input and output drop, loopback kept): its
    clients and its peers only notice through their heartbeats / idle timeouts. A's
    clients fail over; then A comes back."""
    s = netscenario()
    s.cut_a_off_and_back("silent isolation of A", lambda: s.lab.isolate("A"), lambda: s.lab.heal("A"))


@needs_netns
@needs_nft
@pytest.mark.slow
def test_clients_cut_off_from_a_live_router_resume_elsewhere(netscenario):
    """Only the clients' link to A is cut, silently (nftables in A's namespace drops the
    clients' address): A keeps its peers and its records, its clients fail over to B
    and C through their heartbeat. The simplest form of a publisher moving to another
    router while its first router lives on. Then the cut heals."""
    s = netscenario()
    threads = s.publish_in_background()
    s.wait_progress(40)
    cut_at = time.time()
    s.lab.partition("A", CLIENTS)
    moved = s.wait_a_clients_moved()
    s.lab.heal("A", CLIENTS)
    s.finish(threads)
    s.verify()
    lost = {
        r: [e["peer"] for e in s.net.routers[r].events() if e["event"] == "peer-lost" and e["ts"] >= cut_at]
        for r in s.net.routers
    }
    assert not any(lost.values()), f"routers lost peers although only the clients' link was cut: {lost}"
    print(
        f"\nclients cut off from A: they moved {moved - cut_at:.2f} s after the cut; "
        f"longest outcome stall per publisher: " + ", ".join(f"{k} {v:.2f} s" for k, v in s.stalls(cut_at).items())
    )
