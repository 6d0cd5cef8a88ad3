"""Inter-router connections, the adapter's side (docs/inter-router.md): real router
processes, real sockets.

- two routers with a shared secret connect (inter-router listener on one, connector on
  the other), report each other (``peer-connected``), and relay a message end to end;
- a wrong secret is refused on both sides (``peer-refused``) and retried, never reported;
- a lost peer is reported (``peer-lost``) and the connector comes back after restarts;
- two routers dialling each other get two connections, both reported;
- client listeners refuse the protocol: an attach to ``_eorouter/...`` and an open
  carrying ``eorouter:router-id`` get ``amqp:unauthorized-access`` and never reach the core;
- an inter-router listener refuses a plain client, a wrong proof, a silent connector, and
  (after the handshake) a forged or undecodable control or data transfer.

``FakeRouter`` plays the connector's half of the handshake with proton-python and the
formulas written out in the document (not ``router.interrouter_codec``), so the router's
side is checked against the document independently.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import struct
import time

import pytest
from amqpclients import Cond, _condition, unique
from proton import Endpoint, Handler, Link, symbol
from proton._data import int32

pytestmark = pytest.mark.timeout(120)

SECRET = "correct horse battery staple"

IR_LISTENERS = [{"host": "127.0.0.1", "port": 0}, {"host": "127.0.0.1", "port": 0, "role": "inter-router"}]


def acceptor_router(routers, router_id="A", secret=SECRET, **overrides):
    return routers(router_id, listener=IR_LISTENERS, network={"secret": secret}, **overrides)


def connector_router(routers, router_id, to, secret=SECRET, **overrides):
    return routers(
        router_id,
        connector=[{"host": "127.0.0.1", "port": to.inter_router_port, "role": "inter-router", "name": f"to-{to.id}"}],
        network={"secret": secret, "reconnect_delay": 0.1, "reconnect_max": 0.4},
        **overrides,
    )


def peer_events(router, kind=None) -> list[dict]:
    return [e for e in router.events() if e["event"].startswith("peer-") and (kind is None or e["event"] == kind)]


def wait_for(condition, what: str, timeout: float = 15.0, routers=(), harness=None):
    """Poll a router-side condition (its event log) under a deadline. With ``harness``,
    its clients keep running meanwhile (a fake router must answer frames)."""
    if harness is not None:
        return harness.wait(condition, timeout, what=what)
    deadline = time.monotonic() + timeout
    delay = 0.02
    while True:
        result = condition()
        if result:
            return result
        for router in routers:
            router.check_alive(f"while waiting for {what}")
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(delay)  # polling files written by another process, under the deadline above
        delay = min(2 * delay, 0.2)


def boot_of(router) -> str:
    return [e for e in router.events() if e["event"] == "router-started"][-1]["boot"]


# --------------------------------------------------------------------------- two real routers


def test_two_routers_connect_prove_and_relay(router_factory, amqp):
    a = acceptor_router(router_factory, "A")
    assert set(a.ports_by_role) == {"normal", "inter-router"}
    assert a.port == a.ports_by_role["normal"][0] and a.port != a.inter_router_port
    b = connector_router(router_factory, "B", a)
    up_a = wait_for(lambda: peer_events(a, "peer-connected"), "A reporting B", routers=(a, b))
    up_b = wait_for(lambda: peer_events(b, "peer-connected"), "B reporting A", routers=(a, b))
    assert (up_a[0]["peer"], up_a[0]["peer_epoch"], up_a[0]["peer_boot"], up_a[0]["role"]) == (
        "B",
        b.epoch,
        boot_of(b),
        "acceptor",
    )
    assert (up_b[0]["peer"], up_b[0]["peer_epoch"], up_b[0]["peer_boot"], up_b[0]["role"]) == (
        "A",
        a.epoch,
        boot_of(a),
        "connector",
    )
    assert not peer_events(a, "peer-refused") and not peer_events(b, "peer-refused")

    # End to end through both adapters (control: subscription announcements and
    # outcomes; data: the message).
    topic = unique("ir")
    sub = amqp.connect(b.url).subscriber(topic, credit=10, auto_accept=True)
    pub = amqp.connect(a.url).publisher(topic)
    sent = pub.send("across")
    amqp.wait(lambda: sent.outcome, what="the publisher's outcome from across the network")
    assert sent.outcome == "accepted", sent
    assert sub.bodies() == ["across"]


def test_wrong_secret_is_refused_on_both_sides_and_retried(router_factory):
    a = acceptor_router(router_factory, "A")
    b = connector_router(router_factory, "B", a, secret="not the secret")
    refused_b = wait_for(
        lambda: len(peer_events(b, "peer-refused")) >= 3 and peer_events(b, "peer-refused"),
        "B refusing A three times (it keeps re-dialling)",
        routers=(a, b),
    )
    refused_a = wait_for(lambda: peer_events(a, "peer-refused"), "A recording the refusal", routers=(a, b))
    # The connector checks the acceptor's proof first, so it is the one that says no.
    assert refused_b[0]["peer"] == "A" and "wrong proof" in refused_b[0]["reason"], refused_b[0]
    assert refused_a[0]["peer"] == "B" and "amqp:unauthorized-access" in refused_a[0]["reason"], refused_a[0]
    assert len({e["conn"] for e in refused_b}) == len(refused_b), "every attempt is a new connection"
    assert not peer_events(a, "peer-connected") and not peer_events(b, "peer-connected")


def test_lost_peer_is_reported_and_the_connector_comes_back(router_factory):
    a = acceptor_router(router_factory, "A")
    b = connector_router(router_factory, "B", a)
    wait_for(lambda: peer_events(a, "peer-connected"), "A reporting B", routers=(a, b))

    b.kill()  # no AMQP close: A sees the socket end
    lost = wait_for(lambda: peer_events(a, "peer-lost"), "A reporting B lost", routers=(a,))
    first_up = peer_events(a, "peer-connected")[0]
    assert lost[0]["peer"] == "B" and lost[0]["conn"] == first_up["conn"], lost

    b.restart()  # a new epoch: the connector dials again and proves its new identity
    again = wait_for(
        lambda: len(peer_events(a, "peer-connected")) == 2 and peer_events(a, "peer-connected"),
        "A reporting B's new incarnation",
        routers=(a, b),
    )
    assert again[1]["peer_epoch"] == b.epoch == first_up["peer_epoch"] + 1

    # The acceptor goes away and comes back on the same port: the connector retries until then.
    port = a.inter_router_port
    a.terminate()
    wait_for(lambda: peer_events(b, "peer-lost"), "B reporting A lost", routers=(b,))
    a.config["listener"][1]["port"] = port
    a.restart()
    wait_for(
        lambda: any(e["peer_epoch"] == a.epoch for e in peer_events(b, "peer-connected")),
        "B reconnecting to A's new incarnation",
        routers=(a, b),
    )


def test_routers_dialling_each_other_get_two_connections(router_factory, amqp):
    a = acceptor_router(router_factory, "A")
    b = acceptor_router(
        router_factory, "B", connector=[{"host": "127.0.0.1", "port": a.inter_router_port, "role": "inter-router"}]
    )
    a.config["connector"] = [{"host": "127.0.0.1", "port": b.inter_router_port, "role": "inter-router"}]
    a.terminate()
    a.config["listener"][1]["port"] = a.inter_router_port
    a.restart()

    # Only the new epoch counts: B may dial A while A is still shutting down, so
    # the first incarnation may or may not have reported B before it exited.
    def after_restart():
        return [e for e in peer_events(a, "peer-connected") if e["epoch"] == a.epoch]

    both = wait_for(
        lambda: len(after_restart()) >= 2 and after_restart(),
        "A reporting B on both connections after its restart",
        routers=(a, b),
    )
    assert {e["role"] for e in both} == {"acceptor", "connector"}
    topic = unique("twice")
    sub = amqp.connect(b.url).subscriber(topic, credit=10, auto_accept=True)
    pub = amqp.connect(a.url).publisher(topic)
    sent = pub.send("once")
    amqp.wait(lambda: sent.outcome, what="outcome with two connections between the routers")
    assert sent.outcome == "accepted"
    amqp.pump(0.3)  # a duplicate would arrive within this time on loopback
    assert sub.bodies() == ["once"]


# --------------------------------------------------------------------------- client listeners


def test_client_cannot_attach_to_reserved_addresses(router_factory, amqp):
    a = acceptor_router(router_factory, "A")
    conn = amqp.connect(a.url)
    pub = conn.publisher("_eorouter/control", name="sneaky-pub", wait=False)
    sub = conn.subscriber("_eorouter/data", name="sneaky-sub", wait=False)
    for link in (pub, sub):
        amqp.wait(lambda link=link: link.gone, what=f"refusal of {link.name}")
        assert link.remote_condition is not None and link.remote_condition.name == "amqp:unauthorized-access", (
            link.remote_condition
        )
    assert not conn.gone, "only the links are refused"
    names = {e.get("name") for e in a.events() if e["event"] == "link-attached"}
    assert not names & {"sneaky-pub", "sneaky-sub"}, "the core never heard of them"


def test_client_listener_refuses_an_open_claiming_a_router_id(router_factory, amqp):
    a = acceptor_router(router_factory, "A")
    fake = FakeRouter(amqp, a.url, "X", "whatever")
    amqp.wait(lambda: fake.gone, what="the router closing a router-claiming open on a client listener")
    assert fake.condition() == "amqp:unauthorized-access", fake.remote_condition
    refused = wait_for(lambda: peer_events(a, "peer-refused"), "peer-refused", harness=amqp)
    assert refused[0]["peer"] == "X" and "client listener" in refused[0]["reason"]
    assert not [e for e in a.events() if e["event"] == "link-attached"]


# --------------------------------------------------------------------------- inter-router listeners


def _ir_url(router) -> str:
    return f"127.0.0.1:{router.inter_router_port}"


def test_inter_router_listener_refuses_a_plain_client(router_factory, amqp):
    a = acceptor_router(router_factory, "A")
    conn = amqp.connect(_ir_url(a), wait=False)
    amqp.wait(lambda: conn.gone, what="refusal of a client on the inter-router listener")
    assert conn.remote_condition is not None and conn.remote_condition.name == "amqp:unauthorized-access", conn.remote_condition
    assert wait_for(lambda: peer_events(a, "peer-refused"), "peer-refused", routers=(a,))


def test_fake_connector_with_the_right_secret_is_reported(router_factory, amqp):
    """The document's formulas, computed here, are what the router checks and sends."""
    a = acceptor_router(router_factory, "A")
    fake = FakeRouter(amqp, _ir_url(a), "F", SECRET)
    fake.wait_open()
    assert fake.acceptor_proof_ok(), "the acceptor's eorouter:auth is the documented HMAC"
    assert fake.remote["eorouter:router-id"] == "A" and fake.remote["eorouter:epoch"] == a.epoch
    assert fake.remote["eorouter:proto"] == 1 and isinstance(fake.remote["eorouter:proto"], int32)
    fake.attach_and_prove()
    amqp.wait(
        lambda: {"_eorouter/control", "_eorouter/data"} <= set(fake.incoming),
        what="the router attaching its control and data links once the proof is in",
    )
    assert fake.incoming["_eorouter/control"].name == "eorouter-control-A"
    assert fake.incoming["_eorouter/data"].name == "eorouter-data-A"
    assert fake.incoming["_eorouter/control"].remote_snd_settle_mode == Link.SND_SETTLED
    up = wait_for(lambda: peer_events(a, "peer-connected"), "A reporting F", harness=amqp)
    assert up[0]["peer"] == "F" and up[0]["peer_boot"] == fake.boot
    # The core's first control messages arrive as one documented control transfer.
    amqp.wait(lambda: fake.control, what="a control transfer from A")
    batch = fake.control[0]
    assert (batch["v"], batch["from"], batch["epoch"], batch["boot"]) == (1, "A", a.epoch, boot_of(a))
    assert batch["msgs"] and all(isinstance(m.get("t"), str) for m in batch["msgs"])
    amqp.wait(lambda: fake.outgoing["_eorouter/data"].credit == 500, what="the data window, granted once up")
    assert fake.outgoing["_eorouter/control"].credit >= 500, "control credit is generous"


def test_fake_connector_with_a_wrong_proof_is_refused(router_factory, amqp):
    a = acceptor_router(router_factory, "A")
    fake = FakeRouter(amqp, _ir_url(a), "F", "another secret")
    fake.wait_open()
    assert not fake.acceptor_proof_ok()
    fake.attach_and_prove()  # proves with the wrong secret
    amqp.wait(lambda: fake.gone, what="the router refusing a wrong proof")
    assert fake.condition() == "amqp:unauthorized-access", fake.remote_condition
    assert not fake.incoming, "no router link before the proof"
    refused = wait_for(lambda: peer_events(a, "peer-refused"), "peer-refused", harness=amqp)
    assert refused[0]["peer"] == "F" and "wrong proof" in refused[0]["reason"]
    assert not peer_events(a, "peer-connected")


def test_connector_that_never_proves_itself_is_cut(router_factory, amqp):
    a = acceptor_router(router_factory, "A", router={"idle_timeout": 1.0})
    fake = FakeRouter(amqp, _ir_url(a), "F", SECRET)
    fake.wait_open()
    start = time.monotonic()
    amqp.wait(lambda: fake.gone, timeout=10, what="the handshake timeout")
    assert time.monotonic() - start < 5.0
    assert fake.condition() == "amqp:unauthorized-access", fake.remote_condition
    refused = wait_for(lambda: peer_events(a, "peer-refused"), "peer-refused", harness=amqp)
    assert "handshake not finished" in refused[0]["reason"]


@pytest.mark.parametrize(
    "what,condition",
    [
        ("forged-from", "amqp:unauthorized-access"),
        ("bad-control", "amqp:decode-error"),
        ("bad-data", "amqp:decode-error"),
    ],
)
def test_bad_transfers_after_the_handshake_close_the_connection(router_factory, amqp, what, condition):
    a = acceptor_router(router_factory, "A")
    fake = FakeRouter(amqp, _ir_url(a), "F", SECRET)
    fake.wait_open()
    fake.attach_and_prove()
    wait_for(lambda: peer_events(a, "peer-connected"), "A reporting F", harness=amqp)
    amqp.wait(lambda: fake.outgoing["_eorouter/data"].credit > 0, what="data credit")
    if what == "forged-from":
        fake.send_control([{"t": "synced"}], sender="G")
    elif what == "bad-control":
        fake.send_raw("_eorouter/control", b"\x00\x53\x75\xa0\x05{nope")
    else:
        fake.send_raw("_eorouter/data", b"EOR1\x00\x00\x00\x09not json!amqp")
    amqp.wait(lambda: fake.gone, what=f"the router closing after {what}")
    assert fake.condition() == condition, fake.remote_condition
    lost = wait_for(lambda: peer_events(a, "peer-lost"), "peer-lost", harness=amqp)
    assert lost[0]["peer"] == "F"
    a.check_alive()


# --------------------------------------------------------------------------- the fake connector


def _mac(secret: str, text: str) -> str:
    return hmac.new(secret.encode(), text.encode(), hashlib.sha256).hexdigest()


def _data_section(body: bytes) -> bytes:
    if len(body) < 256:
        return b"\x00\x53\x75\xa0" + bytes([len(body)]) + body
    return b"\x00\x53\x75\xb0" + struct.pack(">I", len(body)) + body


class FakeRouter(Handler):
    """The connector's half of docs/inter-router.md, written from the document."""

    def __init__(self, harness, url: str, router_id: str, secret: str, epoch: int = 1):
        super().__init__()
        self.harness = harness
        self.url = url
        self.router_id = router_id
        self.secret = secret
        self.epoch = epoch
        self.boot = os.urandom(8).hex()
        self.nonce = os.urandom(16).hex()
        self.remote: dict = {}
        self.remote_opened = False
        self.remote_closed = False
        self.remote_condition: Cond | None = None
        self.transport_condition: Cond | None = None
        self.transport_closed = False
        self.incoming: dict[str, Link] = {}  # the router's sender links, by target address
        self.outgoing: dict[str, Link] = {}  # ours
        self.control: list[dict] = []  # decoded control transfers received
        self._tag = 0
        props = {
            symbol("eorouter:router-id"): router_id,
            symbol("eorouter:epoch"): epoch,
            symbol("eorouter:boot"): self.boot,
            symbol("eorouter:nonce"): self.nonce,
            symbol("eorouter:proto"): int32(1),
        }
        self.connection = harness.container.connect(
            url=url, handler=self, reconnect=False, properties=props, container_id=f"fake-{router_id}", sasl_enabled=False
        )
        harness.conns.append(self)  # closed with the harness

    # -- state
    @property
    def gone(self) -> bool:
        return self.remote_closed or self.transport_closed

    def condition(self) -> str | None:
        cond = self.remote_condition or self.transport_condition
        return cond.name if cond else None

    def wait_open(self) -> None:
        self.harness.wait(lambda: self.remote_opened or self.gone, what=f"open from {self.url}")
        assert self.remote_opened, (self.remote_condition, self.transport_condition)

    def acceptor_proof_ok(self) -> bool:
        r = self.remote
        expected = _mac(
            self.secret,
            f"eorouter-v1|acceptor|{r['eorouter:router-id']}|{r['eorouter:epoch']}|"
            f"{r['eorouter:boot']}|{self.nonce}|{r['eorouter:nonce']}",
        )
        return hmac.compare_digest(expected, str(r.get("eorouter:auth")))

    # -- actions
    def attach_and_prove(self) -> None:
        session = self.connection.session()
        session.open()
        for address, kind in (("_eorouter/control", "control"), ("_eorouter/data", "data")):
            link = session.sender(f"eorouter-{kind}-{self.router_id}")
            link.target.address = address
            link.source.address = address
            link.snd_settle_mode = Link.SND_SETTLED
            link.open()
            self.outgoing[address] = link
        mac = _mac(
            self.secret,
            f"eorouter-v1|connector|{self.router_id}|{self.epoch}|{self.boot}|{self.remote['eorouter:nonce']}|{self.nonce}",
        )
        self.send_control([{"t": "auth", "mac": mac}])

    def send_control(self, msgs: list, sender: str | None = None) -> None:
        body = json.dumps(
            {"v": 1, "from": sender or self.router_id, "epoch": self.epoch, "boot": self.boot, "msgs": msgs}
        ).encode()
        self.send_raw("_eorouter/control", _data_section(body))

    def send_raw(self, address: str, payload: bytes) -> None:
        link = self.outgoing[address]
        self._tag += 1
        dlv = link.delivery(str(self._tag))
        link.send(payload)
        link.advance()
        dlv.settle()
        self.harness.flush()

    # -- events
    def on_connection_remote_open(self, event) -> None:
        self.remote_opened = True
        self.remote = {str(k): v for k, v in (event.connection.remote_properties or {}).items()}

    def on_connection_remote_close(self, event) -> None:
        self.remote_closed = True
        self.remote_condition = _condition(event.connection.remote_condition)
        if event.connection.state & Endpoint.LOCAL_ACTIVE:
            event.connection.close()

    def on_transport_error(self, event) -> None:
        self.transport_condition = _condition(event.transport.condition)

    def on_transport_closed(self, event) -> None:
        self.transport_closed = True

    def on_link_remote_open(self, event) -> None:
        link = event.link
        if link.state & Endpoint.LOCAL_UNINIT:  # the router's sender: answer it
            link.source.copy(link.remote_source)
            link.target.copy(link.remote_target)
            link.open()
            link.flow(100)
            self.incoming[link.remote_target.address] = link

    def on_delivery(self, event) -> None:
        dlv = event.delivery
        link = event.link
        if not link.is_receiver or dlv.partial:
            return
        payload = link.recv(dlv.pending)
        link.advance()
        dlv.settle()
        if link.remote_target.address == "_eorouter/control":
            assert payload[:3] == b"\x00\x53\x75", payload[:8]
            if payload[3] == 0xA0:
                body = payload[5 : 5 + payload[4]]
            else:
                body = payload[8 : 8 + struct.unpack(">I", payload[4:8])[0]]
            self.control.append(json.loads(body))
        link.flow(1)
