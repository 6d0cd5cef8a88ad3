"""The router network as real processes: relaying, per-router acceptance, routing.

Topologies (one network per module-scoped fixture, shared by its tests):

    line:      A - B - C
    triangle:  A - B - C - A
    ring:      A - B - C - D - A   (its own, since one test stops B)
"""

from __future__ import annotations

import pytest
from amqpclients import unique

from eorouter_tools.topology import RouterNetwork, parse_topology

pytestmark = pytest.mark.timeout(120)

HOLD = 0.5  # on loopback routers answer in milliseconds: HOLD s of silence means "waiting"


def topology(routers: str, links: list[str]) -> str:
    text = "".join(f'[[router]]\nid = "{r}"\n' for r in routers)
    return text + "".join(f'[[link]]\nbetween = ["{a}", "{b}"]\n' for a, b in links)


def start_network(tmp_path_factory, name, routers, links):
    net = RouterNetwork(
        tmp_path_factory.mktemp(name), parse_topology(topology(routers, links)), overrides={"delivery": {"record_linger": 1.0}}
    )
    try:
        net.start()
    except BaseException:
        net.stop()
        raise
    return net


@pytest.fixture(scope="module")
def line(tmp_path_factory):
    net = start_network(tmp_path_factory, "line", "ABC", ["AB", "BC"])
    yield net
    net.stop()


@pytest.fixture(scope="module")
def triangle(tmp_path_factory):
    net = start_network(tmp_path_factory, "triangle", "ABC", ["AB", "BC", "CA"])
    yield net
    net.stop()


def subscribe(amqp, net, where, topic, **kw):
    subs = {}
    for r in where:
        sub = amqp.connect(net.routers[r].url).subscriber(topic, name=f"sub-{r}", **kw)
        sub.wait_attached()
        subs[r] = sub
    return subs


def test_every_subscriber_everywhere_gets_every_message_once(line, amqp):
    topic = unique("fanout")
    subs = subscribe(amqp, line, "ABC", topic, auto_accept=True)
    pub = amqp.connect(line.routers["A"].url).publisher(topic)
    sent = [pub.send(f"m{n}") for n in range(30)]
    amqp.wait(lambda: all(s.outcome for s in sent), what="publisher outcomes", timeout=20)
    assert [s.outcome for s in sent] == ["accepted"] * 30
    for r, sub in subs.items():
        assert sub.bodies() == [f"m{n}" for n in range(30)], f"subscriber on {r}"
        tags = [rec.tag for rec in sub.received]
        assert len(set(tags)) == 30
    assert [rec.tag for rec in subs["A"].received] == [rec.tag for rec in subs["C"].received], (
        "every router uses the same disambiguated tag"
    )


def test_the_publisher_waits_for_the_farthest_subscriber(line, amqp):
    topic = unique("farthest")
    near = subscribe(amqp, line, "AB", topic, auto_accept=True)
    far = subscribe(amqp, line, "C", topic)["C"]
    pub = amqp.connect(line.routers["A"].url).publisher(topic)
    sent = pub.send("x")
    amqp.wait(lambda: far.received, what="the message at C")
    amqp.wait(lambda: all(s.received for s in near.values()), what="the message at A and B")
    amqp.pump(HOLD)  # A and B accepted, C holds its outcome: the publisher must still wait
    assert sent.outcome is None
    far.accept(far.received[0])
    amqp.wait(lambda: sent.outcome, what="publisher outcome")
    assert sent.outcome == "accepted"


def test_a_rejection_at_the_far_end_reaches_the_publisher(line, amqp):
    topic = unique("reject")
    subscribe(amqp, line, "A", topic, auto_accept=True)
    far = subscribe(amqp, line, "C", topic)["C"]
    pub = amqp.connect(line.routers["A"].url).publisher(topic)
    sent = pub.send("bad")
    amqp.wait(lambda: far.received, what="the message at C")
    far.reject(far.received[0], condition="app:invalid", description="no thanks")
    amqp.wait(lambda: sent.outcome, what="publisher outcome")
    assert sent.outcome == "rejected"


def test_publishers_on_every_router_reach_subscribers_on_every_router(triangle, amqp):
    topic = unique("any2any")
    subs = subscribe(amqp, triangle, "ABC", topic, auto_accept=True)
    sent = {}
    for r in "ABC":
        pub = amqp.connect(triangle.routers[r].url).publisher(topic, name=f"pub-{r}")
        sent[r] = [pub.send(f"{r}{n}") for n in range(10)]
    amqp.wait(lambda: all(s.outcome for ss in sent.values() for s in ss), what="outcomes", timeout=20)
    assert {s.outcome for ss in sent.values() for s in ss} == {"accepted"}
    for r, sub in subs.items():
        bodies = sub.bodies()
        assert sorted(bodies) == sorted(f"{p}{n}" for p in "ABC" for n in range(10)), f"at {r}"
        for p in "ABC":  # publisher order per subscriber
            assert [b for b in bodies if b.startswith(p)] == [f"{p}{n}" for n in range(10)]


def test_subscription_churn_during_traffic(triangle, amqp):
    topic = unique("churn")
    steady = subscribe(amqp, triangle, "C", topic, auto_accept=True)["C"]
    pub = amqp.connect(triangle.routers["A"].url).publisher(topic)
    sent = []
    for round_ in range(5):
        sub = amqp.connect(triangle.routers["B"].url).subscriber(topic, name=f"churn-{round_}", auto_accept=True)
        sub.wait_attached()
        sent += [pub.send(f"r{round_}m{n}") for n in range(5)]
        sub.close()
    sent += [pub.send(f"last{n}") for n in range(5)]
    amqp.wait(lambda: all(s.outcome for s in sent), what="outcomes", timeout=20)
    assert {s.outcome for s in sent} == {"accepted"}
    assert steady.bodies() == [f"r{r}m{n}" for r in range(5) for n in range(5)] + [f"last{n}" for n in range(5)]


def test_a_subscriber_is_known_network_wide_once_its_attach_completes(triangle, amqp):
    """The propagation race: publish the moment the subscriber's attach completes."""
    for attempt in range(5):
        topic = unique("race")
        sub = amqp.connect(triangle.routers["C"].url).subscriber(topic, auto_accept=True)
        pub = amqp.connect(triangle.routers["A"].url).publisher(topic)
        sub.wait_attached()
        sent = pub.send("first")
        amqp.wait(lambda sent=sent: sent.outcome, what="publisher outcome")
        assert sent.outcome == "accepted", f"attempt {attempt}: A did not know the subscriber at C yet"
        assert sub.bodies() == ["first"]


def test_records_return_to_zero_on_every_router(line, amqp):
    topic = unique("records")
    subscribe(amqp, line, "AC", topic, auto_accept=True)
    pub = amqp.connect(line.routers["A"].url).publisher(topic)
    sent = [pub.send(f"m{n}") for n in range(50)]
    amqp.wait(lambda: all(s.outcome for s in sent), what="outcomes", timeout=20)

    def leftovers():
        left = {}
        for r, router in line.routers.items():
            events = [e for e in router.events() if e.get("topic") == topic or e.get("delivery")]
            received = {e["delivery"] for e in events if e["event"] == "received" and e.get("topic") == topic}
            gone = {
                e["delivery"] for e in events if e["event"] == "record-deleted" or (e["event"] == "settled" and e.get("deleted"))
            }
            if received - gone:
                left[r] = len(received - gone)
        return left

    amqp.wait(lambda: not leftovers(), timeout=15, what="every router's records deleted")


def test_removing_the_middle_router_of_a_ring_reroutes(tmp_path_factory, amqp):
    ring = start_network(tmp_path_factory, "ring", "ABCD", ["AB", "BC", "CD", "DA"])
    try:
        topic = unique("reroute")
        sub = subscribe(amqp, ring, "C", topic, auto_accept=True)["C"]
        pub = amqp.connect(ring.routers["A"].url).publisher(topic)
        first = pub.send("before")
        amqp.wait(lambda: first.outcome, what="outcome before")
        assert first.outcome == "accepted"
        ring.routers["B"].terminate()
        ring.wait_converged(routers="ACD")
        assert ring.routes_of("A") >= {"C", "D"}
        after = [pub.send(f"after{n}") for n in range(10)]
        amqp.wait(lambda: all(s.outcome for s in after), what="outcomes after", timeout=20)
        assert {s.outcome for s in after} == {"accepted"}
        assert sub.bodies() == ["before"] + [f"after{n}" for n in range(10)]
    finally:
        ring.stop()


def test_open_frame_offers_the_other_routers_as_failover_servers(triangle):
    from proton.utils import BlockingConnection

    conn = BlockingConnection(triangle.routers["A"].url, timeout=10)
    try:
        servers = conn.conn.remote_properties["failover-server-list"]
    finally:
        conn.close()
    offered = sorted((s["network-host"], int(s["port"])) for s in servers)
    assert offered == sorted(("127.0.0.1", triangle.routers[r].port) for r in "BC")
