"""Subscribers leaving a router that lives on, with their publisher at a third router,
under full load (the moving race, docs/inter-router.md).

    publisher ──► C ──── A ◄── proxy ◄── subscribers (then at B)
                   \\    /
                     B
              C load clients on their own topics of A, B and C, full rate

The proxy in front of A first black-holes everything A sends the subscribers: they
hear nothing (their heartbeats lapse) and resume at B, while A, its side of their
connections left open, goes on sending them C's deliveries until its idle timeout or
the news that they attached at B, whichever comes first; then the proxy cuts. C keeps
publishing throughout, to A until it hears where the subscribers went and to B after:
what A held for them, what reaches A for them after they left, and what C sends B
directly must reach each subscriber's application once and in publisher order (no
dedup window of their own), the publisher must hear "accepted" for each, and the Spark
proof over the routers' logs and the clients' ledgers must be clean. A second test moves
the publisher too (its connection to C goes dark at the same moment, behind a proxy of its
own): it resumes at B or at A while C lives on.
"""

from __future__ import annotations

import json
import select
import socket
import time
from collections import defaultdict

import pytest
from proofkit import prove_clean
from test_resume_under_load import (
    LoadClients,
    Proxy,
    check_every_message_once_in_order,
    start_subscribers,
    stop_everything,
    wait_no_records,
)

from eorouter_tools.topology import RouterNetwork, parse_topology
from router.client import ResumablePublisher

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1500)]

TRIANGLE = (
    '[[router]]\nid = "A"\n[[router]]\nid = "B"\n[[router]]\nid = "C"\n'
    '[[link]]\nbetween = ["A", "B"]\n[[link]]\nbetween = ["B", "C"]\n[[link]]\nbetween = ["C", "A"]\n'
)
MESSAGES = 800
GAP = 0.005  # seconds between the publisher's messages
BLACKHOLE_AT = 200  # the message after which A's bytes to the subscribers are dropped ...
CUT_AFTER = 8.0  # ... and the connections cut this long after
IDLE_TIMEOUT = 8.0


class HalfOpenProxy(Proxy):
    """As ``Proxy``, but once black-holing, a client that gives up leaves its router's
    side open (read and dropped) until ``cut()``: a half-open connection, which the
    router notices only by its own idle timeout."""

    def _client_gone(self, upstream: socket.socket) -> None:
        while self.dropping and not self.closed:
            readable, _, _ = select.select([upstream], [], [], 0.2)
            if readable and not upstream.recv(65536):
                return


def test_subscribers_leaving_a_live_router_get_a_third_routers_stream_once_and_in_order(tmp_path):
    _moving_race(tmp_path)


@pytest.mark.parametrize("publisher_to", ["B", "A"], ids=["to-where-they-went", "to-where-they-left"])
def test_subscribers_and_their_publisher_leaving_live_routers_finish_once_and_in_order(tmp_path, publisher_to):
    """The same, and the publisher's connection to C goes dark at the same moment: it
    resumes at the next router of its list, B, which holds later deliveries of its
    stream C sent it for the subscribers and never saw the earlier ones C sent A (the
    resends keep C's numbers, docs/resumption.md), or A, which the subscribers left
    (what C had passed on for them it hands over to A). C, alive, notices only by its
    idle timeout or the news. (Its list also holds every router the routers advertise:
    on a busy machine it sometimes resumes at another; the test prints where.)"""
    _moving_race(tmp_path, publisher_to=publisher_to)


def _moving_race(tmp_path, publisher_to: str | None = None) -> None:
    """The subscribers leave A for B at message BLACKHOLE_AT; with ``publisher_to``, the
    publisher leaves C for that router at the same message."""
    net = RouterNetwork(
        tmp_path / "routers",
        parse_topology(TRIANGLE),
        overrides={
            "router": {"idle_timeout": IDLE_TIMEOUT},
            "limits": {"publisher_credit_window": 1000},
            "delivery": {"record_linger": 1.0},
            "eventlog": {"retention": 1000},
        },
    )
    net.start()
    proxy = HalfOpenProxy(("127.0.0.1", net.routers["A"].port))
    pub_proxy = HalfOpenProxy(("127.0.0.1", net.routers["C"].port)) if publisher_to else None
    clients = tmp_path / "clients"
    clients.mkdir()
    received: dict[str, list] = defaultdict(list)
    subs, load, pub = [], None, None
    try:
        subs = start_subscribers([proxy.url, net.routers["B"].url], clients, received)
        pub = ResumablePublisher(
            [pub_proxy.url, net.routers[publisher_to].url] if pub_proxy and publisher_to else [net.routers["C"].url],
            "orders",
            container_id="pub",
            link_name="pub-link",
            state_path=clients / "pub.state",
            ledger_path=clients / "pub.ledger.jsonl",
        )
        pub.start()
        assert pub.wait_attached(20)
        load = LoadClients(net.routers, seconds=60)
        futures = []
        cut_at = None
        for n in range(MESSAGES):
            if n == BLACKHOLE_AT:
                proxy.blackhole()
                if pub_proxy is not None:
                    pub_proxy.blackhole()
                cut_at = time.monotonic() + CUT_AFTER
            if cut_at is not None and time.monotonic() >= cut_at:
                proxy.cut()
                if pub_proxy is not None:
                    pub_proxy.cut()
                cut_at = None
            futures.append(pub.send_async(f"m{n + 1}"))
            time.sleep(GAP)
        if cut_at is not None:
            time.sleep(max(0.0, cut_at - time.monotonic()))
            proxy.cut()
            if pub_proxy is not None:
                pub_proxy.cut()
        load.stop()
        load = None
        outcomes = [f.result(120) for f in futures]
        assert pub.wait_settled(60)
        assert [o.state for o in outcomes] == ["accepted"] * MESSAGES
        check_every_message_once_in_order(subs, received, MESSAGES, timeout=60)
        for sub in subs:
            resumed_at = _resumed_at(clients / f"{sub.container_id}.ledger.jsonl")
            if publisher_to is None:
                assert net.routers["B"].url in resumed_at, "it resumed at B"
            else:
                # (Its failover list has every router the routers advertise, A's own
                # address too: on a busy machine it may take another before B. Where
                # it went is not the point here; that it left A's dark connection is.)
                assert set(resumed_at) - {_host_port(proxy.url)}, f"it left A's dark connection: {resumed_at}"
        if pub_proxy is not None:
            resumed_at = _resumed_at(clients / "pub.ledger.jsonl")
            assert set(resumed_at) - {_host_port(pub_proxy.url)}, f"the publisher left C's dark connection: {resumed_at}"
            print(f"\nthe publisher resumed at {resumed_at} (wanted {net.routers[str(publisher_to)].url})")
        wait_no_records(net, timeout=60)
        kinds = defaultdict(int)
        for rid, router in net.routers.items():
            for e in router.events():
                if e["event"] in ("owed-moved", "placeholder-created", "announce-timeout", "link-detached", "origin-taken-over"):
                    kinds[(rid, e["event"], e.get("reason"))] += 1
        print(f"\nthe move, as the routers logged it: {dict(kinds)}")
    finally:
        stop_everything(load, [*subs, pub], proxy, net)
        if pub_proxy is not None:
            pub_proxy.close()
    prove_clean(tmp_path / "routers", clients, tmp_path / "report")


def _resumed_at(ledger_path) -> list[str]:
    """The routers (host:port) a client's ledger says it resumed at, in order."""
    entries = [json.loads(line) for line in ledger_path.read_text().splitlines()]
    return [e["router"] for e in entries if e["event"] == "resumed"]


def _host_port(url: str) -> str:
    return url.split("://", 1)[-1]
