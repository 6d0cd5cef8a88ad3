"""The $management node and `eorouter stat` against real router processes
(issue 19, parts 3 and 4; docs/operations.md, "Management")."""

from __future__ import annotations

import json
import socket
import subprocess
import sys

import pytest
from amqpclients import unique
from proton import Message
from proton.utils import BlockingConnection, SyncRequestResponse

SECRET = {"network": {"secret": "management-test-secret"}}


def stat(router_or_bus, *args: str, timeout: float = 30.0) -> subprocess.CompletedProcess:
    bus = router_or_bus if isinstance(router_or_bus, str) else f"{router_or_bus.host}:{router_or_bus.port}"
    return subprocess.run(
        [sys.executable, "-m", "router", "stat", "-b", bus, *args], capture_output=True, text=True, timeout=timeout
    )


def rows(router, view: str, *extra: str) -> list[dict]:
    done = stat(router, f"--{view}", "--json", *extra)
    assert done.returncode == 0, done.stderr
    return [json.loads(line) for line in done.stdout.splitlines()]


def test_the_stuck_subscriber_is_the_one_every_record_waits_on(router_factory, amqp):
    """Two subscribers, one answering and one not: every in-flight record of the
    topic waits on the silent one only, oldest first; the tables name both."""
    router = router_factory("A")
    topic = unique("stuck")
    quick = amqp.connect(router.url, container_id="quick-app").subscriber(topic, name="quick", auto_accept=True)
    stuck = amqp.connect(router.url, container_id="stuck-app").subscriber(topic, name="stuck")
    quick.wait_attached()
    stuck.wait_attached()
    pub = amqp.connect(router.url, container_id="pub-app").publisher(topic, name="pub")
    sent = [pub.send(f"m{n}") for n in range(3)]
    amqp.wait(lambda: len(stuck.received) == 3 and len(quick.received) == 3, what="3 deliveries each")
    amqp.wait(
        lambda: (
            all(s.get("waiting_on") == ["stuck-app/stuck"] for s in rows(router, "inflight"))
            and len(rows(router, "inflight")) == 3
        ),
        what="records waiting on the stuck subscriber only",
    )
    inflight = rows(router, "inflight", "--topic", topic)
    assert [r["pub_tag"] for r in inflight] == [s.tag.hex() for s in sent]  # oldest first
    assert all(r["subscribers"] == {"quick-app/quick": "accepted", "stuck-app/stuck": "sent"} for r in inflight)
    assert all(r["publisher"] == "pub-app/pub" and r["told"] is None for r in inflight)
    assert inflight[0]["age"] >= inflight[-1]["age"] > 0

    text = stat(router, "--inflight").stdout
    assert "In-flight deliveries" in text and text.count("stuck-app/stuck") == 3
    connections = rows(router, "connections")  # besides these three, stat's own connection
    assert {"quick-app", "stuck-app", "pub-app"} <= {c["container"] for c in connections}
    assert all(c["role"] == "client" for c in connections)
    links = rows(router, "links")
    assert {(lk["container"], lk["role"], lk["address"]) for lk in links} >= {
        ("quick-app", "subscriber", topic),
        ("stuck-app", "subscriber", topic),
        ("pub-app", "publisher", topic),
    }
    topics = rows(router, "topics", "--topic", topic)
    assert len(topics) == 1 and topics[0]["records"] == 3 and topics[0]["published"] == 3

    for rec in list(stuck.received):
        stuck.accept(rec)
    amqp.wait(lambda: all(s.outcome == "accepted" for s in sent), what="outcomes")
    amqp.wait(lambda: not any(r["waiting_on"] for r in rows(router, "inflight")), what="nothing waited on")


def test_management_refuses_what_it_does_not_know(router_factory):
    router = router_factory("A")
    conn = BlockingConnection(router.url, timeout=10)
    try:
        client = SyncRequestResponse(conn, "$management")

        def call(**props):
            reply = client.call(Message(properties=props, body={}))
            return reply.properties["statusCode"], reply.properties["statusDescription"], reply.body

        assert call(operation="UPDATE", type="org.eorouter.link")[0] == 501
        assert call(operation="DELETE", type="org.eorouter.topic", identity="t")[0] == 501
        assert call(operation="DELETE", type="org.eorouter.link")[0] == 400  # which one?
        code, why, _ = call(operation="QUERY", type="org.example.nothing")
        assert code == 404 and "org.eorouter.topic" in why
        code, _, body = call(operation="READ", type="org.eorouter.router", name="A")
        assert code == 200 and body["name"] == "A" and body["epoch"] == router.epoch
        assert call(operation="READ", type="org.eorouter.router", name="Z")[0] == 404
        code, _, body = call(operation="GET-TYPES")
        assert code == 200 and "org.eorouter.inflight" in body
        code, _, body = call(operation="QUERY", type="org.eorouter.topic")
        assert code == 200 and body["results"] == [] and "oldest_age" in body["attributeNames"]
    finally:
        conn.close()
    # the router is unharmed, and still answers
    assert rows(router, "router")[0]["name"] == "A"


def test_stat_says_clearly_when_no_router_answers():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    done = stat(f"127.0.0.1:{port}", "--links", "--timeout", "2")
    assert done.returncode == 1
    assert done.stderr.startswith("eorouter stat: cannot reach a router at 127.0.0.1:") and "Traceback" not in done.stderr


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_the_network_view_before_and_after_a_router_dies(router_factory, amqp):
    """B sees A up, one hop away, with A's subscriber known; after A is killed, B
    shows it down (and its subscriber still known, retained for failover)."""
    port = _free_port()
    a = router_factory(
        "A", **SECRET, listener=[{"host": "127.0.0.1", "port": 0}, {"host": "127.0.0.1", "port": port, "role": "inter-router"}]
    )
    b = router_factory("B", **SECRET, connector=[{"host": "127.0.0.1", "port": port, "role": "inter-router"}])
    topic = unique("net")
    sub = amqp.connect(a.url, container_id="far-app").subscriber(topic, name="far", auto_accept=True)
    sub.wait_attached()
    amqp.wait(
        lambda: any(p["name"] == "A" and p["up"] and "far-app/far" in (p["subscribers"] or []) for p in rows(b, "network")),
        what="B to know A and its subscriber",
        timeout=30,
    )
    peer = next(p for p in rows(b, "network") if p["name"] == "A")
    assert peer["next_hop"] == "A" and peer["cost"] == 1
    text = stat(b, "--network").stdout
    assert "Network" in text and "far-app/far" in text

    a.kill()
    amqp.wait(lambda: not next(p for p in rows(b, "network") if p["name"] == "A")["up"], what="A down at B", timeout=30)


@pytest.mark.parametrize("flag", ["--router", "--connections", "--links", "--topics", "--network", "--inflight"])
def test_every_view_prints_a_table(router, flag):
    done = stat(router, flag)
    assert done.returncode == 0, done.stderr
    assert f"of {router.host}:{router.port}" in done.stdout.splitlines()[0]


def manage(router, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "router", "manage", "-b", f"{router.host}:{router.port}", *args],
        capture_output=True,
        text=True,
        timeout=30,
    )


def test_an_operator_detaches_a_link_and_expires_an_away_subscription(router_factory, amqp):
    """detach-link: the client's link is detached with amqp:link:detach-forced and,
    being durable, its subscription stays (away); the publisher's delivery then
    waits for it, until expire-subscription ends it and the delivery is answered
    by the subscriber that remains."""
    router = router_factory("A")
    topic = unique("writes")
    durable = amqp.connect(router.url, container_id="away-app").subscriber(topic, name="away", durable=1, timeout=3600)
    live = amqp.connect(router.url, container_id="live-app").subscriber(topic, name="live", auto_accept=True)
    durable.wait_attached()
    live.wait_attached()
    link_id = next(lk["identity"] for lk in rows(router, "links") if lk["container"] == "away-app")
    done = manage(router, "detach-link", str(link_id))
    assert done.returncode == 0, done.stderr
    amqp.wait(lambda: durable.gone, what="the detach to reach the client")
    assert durable.remote_condition.name == "amqp:link:detach-forced"
    subs = {s["name"]: s for s in rows(router, "subscriptions")}
    assert subs["away-app/away"]["attached"] is False and subs["away-app/away"]["expires_in"] > 3000

    pub = amqp.connect(router.url).publisher(topic)
    sent = pub.send("waits")
    amqp.wait(
        lambda: rows(router, "inflight") and rows(router, "inflight")[0]["waiting_on"] == ["away-app/away"],
        what="the delivery to wait on the away subscriber",
    )
    assert sent.outcome is None
    done = manage(router, "expire-subscription", "away-app/away")
    assert done.returncode == 0, done.stderr
    amqp.wait(lambda: sent.outcome == "accepted", what="the outcome once the subscription is gone")
    assert "away-app/away" not in {s["name"] for s in rows(router, "subscriptions")}

    refused = manage(router, "expire-subscription", "live-app/live")  # attached: refused, untouched
    assert refused.returncode == 1 and "is attached" in refused.stderr
    assert manage(router, "detach-link", "99999").returncode == 1


def test_an_operator_closes_a_connection(router_factory, amqp):
    router = router_factory("A")
    conn = amqp.connect(router.url, container_id="noisy-app")
    sub = conn.subscriber(unique("close"), name="n")
    sub.wait_attached()
    ident = next(c["identity"] for c in rows(router, "connections") if c["container"] == "noisy-app")
    done = manage(router, "close-connection", str(ident))
    assert done.returncode == 0 and "done" in done.stdout, done.stderr
    amqp.wait(lambda: "noisy-app" not in {c["container"] for c in rows(router, "connections")}, what="the connection to go")
    assert manage(router, "close-connection", str(ident)).returncode == 1  # gone now: 404


def test_a_three_router_network_before_and_after_a_router_dies(tmp_path_factory, tmp_path):
    """A triangle: stat on B shows A and C up; a resumable subscriber on C fails
    over to B when C is killed: B's stat then shows C down (A still up), and B
    counts the subscriber's failover from C (eorouter_failovers_in_total)."""
    from test_metrics import scrape, value

    from eorouter_tools.topology import RouterNetwork, parse_topology
    from router.client import ResumableSubscriber

    text = "".join(f'[[router]]\nid = "{r}"\n' for r in "ABC") + "".join(
        f'[[link]]\nbetween = ["{a}", "{b}"]\n' for a, b in ("AB", "BC", "CA")
    )
    net = RouterNetwork(tmp_path_factory.mktemp("failover-stat"), parse_topology(text), overrides={"metrics": {"port": 0}})
    net.start()
    sub = None
    try:
        b, c = net.routers["B"], net.routers["C"]
        got: list = []
        sub = ResumableSubscriber(
            [c.url, b.url],
            unique("failover"),
            container_id="mover",
            link_name="mover-link",
            state_path=tmp_path / "mover.state",
            on_message=got.append,
        ).start()
        assert sub.wait_attached(10)
        network = {p["name"]: p for p in rows(b, "network")}
        assert network["A"]["up"] and network["C"]["up"]
        before = scrape(b)
        assert value(before, "eorouter_link_attaches_total", role="subscriber", resumed="true") is None

        c.kill()
        assert sub.wait_attached(30, attaches=2)
        assert not {p["name"]: p for p in rows(b, "network")}["C"]["up"]
        assert {p["name"]: p for p in rows(b, "network")}["A"]["up"]
        assert value(before, "eorouter_peer_announcements_total", router="C", kind="attached") >= 1
        after = scrape(b)
        assert value(after, "eorouter_failovers_in_total", role="subscriber", from_router="C") == 1
        assert value(after, "eorouter_peer_up", router="C") == 0
        assert "mover" in {c["container"] for c in rows(b, "connections")}
    finally:
        if sub is not None:
            sub.close()
        net.stop()
