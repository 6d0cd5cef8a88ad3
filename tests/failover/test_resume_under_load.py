"""A publisher cut off from a router that lives on, under full load (issue 16).

    publisher ──► proxy ──► A ──── B ◄── (subscribers at B, or at A)
                                   ▲
              C load clients on their own topics of A and B, full rate

The proxy in front of A first black-holes everything A sends the publisher (so it
hears no outcomes, while A and the network go on finishing its deliveries), then
cuts the connection. The publisher (router.client) fails over to B and resends
what it never heard settled. Meanwhile the bench's C clients settle hundreds of
thousands of deliveries on other topics of both routers: far more than a
router-wide memory of recent tags held (issue 16 saw 272 duplicates). The
subscribers keep no dedup window of their own (dedup_window=0): the application
must be handed every message exactly once and in publisher order, the publisher
must hear "accepted" for each, and the Spark proof over the routers' logs and the
clients' ledgers must be clean.
"""

from __future__ import annotations

import json
import select
import socket
import subprocess
import threading
import time
from collections import defaultdict
from pathlib import Path

import pytest
from proofkit import prove_clean

from eorouter_tools.topology import RouterNetwork, parse_topology
from router.client import ResumablePublisher, ResumableSubscriber

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1500)]

LINE = '[[router]]\nid = "A"\n[[router]]\nid = "B"\n[[link]]\nbetween = ["A", "B"]\n'
MESSAGES = 600
BLACKHOLE = 12.0  # seconds A's bytes to the publisher are dropped before the cut
IDLE_TIMEOUT = 8.0
RESUME_TIMEOUT = 25.0  # the publisher resumes within it; the killed load senders' records end after it
UNLIMITED = str(10**9)  # messages per load client: more than it can send before it is stopped


class Proxy:
    """A TCP proxy on loopback in front of ``target``: both directions pass until
    ``blackhole()`` (what the router sends is read and dropped) and ``cut()`` (every
    connection closed)."""

    def __init__(self, target: tuple[str, int]):
        self.target = target
        self.server = socket.create_server(("127.0.0.1", 0))
        self.port = self.server.getsockname()[1]
        self.dropping = False
        self.conns: list[tuple[socket.socket, socket.socket]] = []
        self.closed = False
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def url(self) -> str:
        return f"amqp://127.0.0.1:{self.port}"

    def _accept(self) -> None:
        while not self.closed:
            try:
                client, _ = self.server.accept()
            except OSError:
                return
            upstream = socket.create_connection(self.target)
            self.conns.append((client, upstream))
            threading.Thread(target=self._pump, args=(client, upstream), daemon=True).start()

    def _pump(self, client: socket.socket, upstream: socket.socket) -> None:
        try:
            while True:
                readable, _, _ = select.select([client, upstream], [], [], 0.2)
                for sock in readable:
                    data = sock.recv(65536)
                    if not data:
                        if sock is client:
                            self._client_gone(upstream)
                        return
                    if sock is client:
                        upstream.sendall(data)
                    elif not self.dropping:
                        client.sendall(data)
        except OSError:
            return
        finally:
            for sock in (client, upstream):
                try:
                    sock.close()
                except OSError:
                    pass

    def _client_gone(self, upstream: socket.socket) -> None:
        """The client closed its side: the router's side closes with it."""

    def blackhole(self) -> None:
        self.dropping = True

    def cut(self) -> None:
        """Close every connection, and take no new ones: the path to A stays broken."""
        self.closed = True
        self.server.close()
        for client, upstream in self.conns:
            for sock in (client, upstream):
                try:
                    sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def close(self) -> None:
        self.closed = True
        self.cut()
        self.server.close()


class LoadClients:
    """The bench's C send/receive pairs at full rate on a topic of their own, on
    each router, until stopped."""

    def __init__(self, routers: dict, seconds: float):
        from eorouter_tools.build import build_c_clients

        binaries = build_c_clients()
        self.procs = []
        for rid, router in routers.items():
            topic = f"load-{rid}"
            self.procs.append(
                subprocess.Popen(
                    [str(binaries["receive"]), "-t", str(seconds), "127.0.0.1", str(router.port), topic, UNLIMITED],
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                )
            )
            time.sleep(0.3)
            self.procs.append(
                subprocess.Popen(
                    [str(binaries["send"]), "-t", str(seconds), "-w", "1000", "127.0.0.1", str(router.port), topic, UNLIMITED],
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                )
            )

    def stop(self) -> None:
        for proc in self.procs:
            proc.terminate()
        for proc in self.procs:
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()


def settled_count(router) -> int:
    """Settlement lines in a router's log so far (counted in the raw bytes: fast)."""
    total = 0
    for path in Path(router.data_dir, "events").glob("events-*.jsonl"):
        data = path.read_bytes()
        total += data.count(b'"event":"settled"') + data.count(b'"event":"completed"')
    return total


def wait_no_records(net, timeout: float) -> None:
    """Until every router's log shows each record it made ended (the load senders
    were killed mid-stream: theirs end publisher_resume_timeout later)."""
    deadline = time.monotonic() + timeout
    while True:
        left = {}
        for rid, router in net.routers.items():
            received, gone = set(), set()
            for e in router.events():
                kind = e["event"]
                if kind == "received" and not e.get("settled"):
                    received.add(e["delivery"])
                elif kind == "record-deleted" or (kind in ("settled", "completed") and e.get("deleted")):
                    gone.add(e["delivery"])
            if received - gone:
                left[rid] = len(received - gone)
        if not left:
            return
        assert time.monotonic() < deadline, f"records left: {left}"
        time.sleep(2.0)


def start_subscribers(urls: list[str], clients: Path, received: dict[str, list], count: int = 2) -> list:
    """``count`` resumable subscribers to "orders" (no dedup window of their own), each
    appending what its application is handed to ``received[its name]``; attached."""
    subs = []
    for n in range(count):
        name = f"sub-{n}"
        sub = ResumableSubscriber(
            urls,
            "orders",
            container_id=name,
            link_name=f"{name}-link",
            state_path=clients / f"{name}.state",
            ledger_path=clients / f"{name}.ledger.jsonl",
            on_message=lambda msg, name=name: received[name].append(msg.body),
            dedup_window=0,
            heartbeat=1.0,
        )
        sub.start()
        assert sub.wait_attached(20)
        subs.append(sub)
    return subs


def stop_everything(load, clients: list, proxy: Proxy, net) -> None:
    """The load clients (if still running), the clients, the proxy and the routers."""
    if load is not None:
        load.stop()
    for client in clients:
        if client is not None:
            client.close()
    proxy.close()
    net.stop()


def check_every_message_once_in_order(subs: list, received: dict[str, list], messages: int, timeout: float) -> None:
    """Each subscriber's application got m1..m``messages``, each once, in order (waiting
    up to ``timeout`` for the last ones)."""
    deadline = time.monotonic() + timeout
    while any(len(received[s.container_id]) < messages for s in subs) and time.monotonic() < deadline:
        time.sleep(0.1)
    for sub in subs:
        got = received[sub.container_id]
        assert len(got) == len(set(got)), f"{sub.container_id}: {len(got) - len(set(got))} duplicates"
        assert got == [f"m{n + 1}" for n in range(messages)], f"{sub.container_id}: not every message, in order"


@pytest.mark.parametrize("subscribers_at", ["B", "A"])
def test_a_cut_off_publisher_resumes_at_another_router_under_full_load_exactly_once(tmp_path, subscribers_at):
    net = RouterNetwork(
        tmp_path / "routers",
        parse_topology(LINE),
        overrides={
            "router": {"idle_timeout": IDLE_TIMEOUT},
            "limits": {"publisher_credit_window": 1000},
            "delivery": {"record_linger": 1.0},
            "failover": {"publisher_resume_timeout": RESUME_TIMEOUT},
            "eventlog": {"retention": 1000},
        },
    )
    net.start()
    proxy = Proxy(("127.0.0.1", net.routers["A"].port))
    clients = tmp_path / "clients"
    clients.mkdir()
    received: dict[str, list] = defaultdict(list)
    subs, load = [], None
    pub = None
    try:
        subs = start_subscribers([net.routers[subscribers_at].url], clients, received)
        pub = ResumablePublisher(
            [proxy.url, net.routers["B"].url],
            "orders",
            container_id="pub",
            link_name="pub-link",
            state_path=clients / "pub.state",
            ledger_path=clients / "pub.ledger.jsonl",
            heartbeat=IDLE_TIMEOUT / 2,
        )
        pub.start()
        assert pub.wait_attached(20)
        load = LoadClients(net.routers, seconds=30)
        futures = []
        for n in range(MESSAGES // 2):
            futures.append(pub.send_async(f"m{n + 1}"))
            time.sleep(0.005)
        before = {rid: settled_count(r) for rid, r in net.routers.items()}
        proxy.blackhole()
        for n in range(MESSAGES // 2, MESSAGES):  # sent into the black hole, and after the resume
            futures.append(pub.send_async(f"m{n + 1}"))
            time.sleep(0.005)
        time.sleep(max(0.0, BLACKHOLE - MESSAGES // 2 * 0.005))
        during = {rid: settled_count(r) - before[rid] for rid, r in net.routers.items()}
        proxy.cut()
        load.stop()  # the load mattered while the publisher heard nothing; the proof reads less
        load = None
        outcomes = [f.result(120) for f in futures]
        assert pub.wait_settled(60)
        assert [o.state for o in outcomes] == ["accepted"] * MESSAGES
        # Its first resume, after the cut, is at B (a busy machine may make it miss a
        # heartbeat there later and fail over again: then it may end at A itself).
        ledger = [json.loads(line) for line in (clients / "pub.ledger.jsonl").read_text().splitlines()]
        resumed_at = [e["router"] for e in ledger if e["event"] == "resumed"]
        assert resumed_at[:1] == [net.routers["B"].url], f"the publisher resumed at B first: {resumed_at}"
        check_every_message_once_in_order(subs, received, MESSAGES, timeout=30)
        # The killed load senders' records end RESUME_TIMEOUT after they died; reading
        # over a million log lines per look takes seconds on a busy machine (a run under
        # two CPU burners missed the end by under a second with 30 s to spare).
        wait_no_records(net, timeout=RESUME_TIMEOUT + 60)
        resumes = [
            (rid, e.get("reported"), e.get("known"))
            for rid, r in net.routers.items()
            for e in r.events()
            if e["event"] == "resume-requested" and e.get("role") == "publisher"
        ]
        print(
            f"\nsubscribers at {subscribers_at}: settled lines per router while black-holed {during}; "
            f"publisher resumes (router, reported, known): {resumes}"
        )
    finally:
        stop_everything(load, [*subs, pub], proxy, net)
    prove_clean(tmp_path / "routers", clients, tmp_path / "report")
