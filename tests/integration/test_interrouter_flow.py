"""The inter-router adapter in one process: real ``Engine`` objects (proton's C
engine), their transports wired back to back in memory, fake cores that record
events and answer with scripted commands. No sockets carry data, no router
processes: what a real network cannot show on demand — batching per loop
iteration, the data window, a slow peer's queue and the read pause — is driven
here step by step.

    A (acceptor) <-- B (connector) --> C (acceptor)      pipes are in-memory byte moves
"""

from __future__ import annotations

import socket

import pytest
from cproton_ffi import ffi, lib

from router.adapter.endpoints import Conn
from router.adapter.engine import Engine
from router.adapter.interrouter import CONTROL_WINDOW, DATA_WINDOW, QUEUE_BOUND, UP
from router.core.commands import SendControl, SendData
from router.core.events import ControlReceived, DataReceived, PeerConnected, PeerLost

pytestmark = pytest.mark.timeout(60)


class FakeCore:
    def __init__(self):
        self.events: list = []
        self.script = None  # event -> list of commands

    def handle(self, event, now):
        self.events.append(event)
        return list(self.script(event)) if self.script else []

    def next_deadline(self):
        return None

    def of(self, cls) -> list:
        return [e for e in self.events if isinstance(e, cls)]


class FakeLog:
    def __init__(self, epoch: int, boot: str):
        self.epoch = epoch
        self.boot_id = boot
        self.records: list = []

    def append(self, kind, ts, fields):
        self.records.append((kind, fields))

    def kinds(self) -> list[str]:
        return [k for k, _ in self.records]


class FakeDialer:
    def __init__(self):
        self.ups = 0

    def connected(self):
        self.ups += 1


class Node:
    def __init__(self, router_id: str, secret: str = "s3cret", epoch: int = 1):
        self.id = router_id
        self.core = FakeCore()
        self.log = FakeLog(epoch, f"boot-{router_id}")
        self.engine = Engine(
            self.core, self.log, max_message_size=1 << 20, router_id=router_id, secret=secret, handshake_timeout=30.0
        )
        self.peers = self.engine.peers
        self.conns: list[Conn] = []

    def step(self) -> None:
        """One loop iteration of the router: drain every connection, flush control."""
        engine = self.engine
        pending = set(self.conns) | engine.touched
        engine.touched.clear()
        while pending:
            conn = pending.pop()
            if not conn.dead:
                engine.drain(conn)
            pending |= engine.touched
            engine.touched.clear()
        if self.peers.batches:
            self.peers.flush()
        engine.touched.clear()


_socks: list = []
_ids = iter(range(1, 10_000))


def _conn(server: bool, router_id: str) -> Conn:
    a, b = socket.socketpair()  # only for Conn's fd bookkeeping; no byte goes through it
    _socks.extend((a, b))
    transport = lib.pn_transport()
    if server:
        lib.pn_transport_set_server(transport)
    connection = lib.pn_connection()
    lib.pn_connection_set_container(connection, router_id.encode())
    collector = lib.pn_collector()
    lib.pn_connection_collect(connection, collector)
    lib.pn_transport_bind(transport, connection)
    return Conn(next(_ids), a, "memory", transport, connection, collector)


class Pipe:
    """Acceptor ``a`` and connector ``b`` joined by moving bytes between transports."""

    def __init__(self, a: Node, b: Node):
        self.a, self.b = a, b
        self.ca = _conn(True, a.id)
        self.cb = _conn(False, b.id)
        a.conns.append(self.ca)
        b.conns.append(self.cb)
        a.peers.start_acceptor(self.ca)
        self.dialer = FakeDialer()
        b.peers.start_connector(self.cb, self.dialer)
        self.a_reads = True  # False: a's socket is not read (a is slow)

    def move(self) -> int:
        moved = 0
        for src, dst, reading in ((self.ca, self.cb, True), (self.cb, self.ca, self.a_reads)):
            if not reading or src.dead or dst.dead:
                continue
            n = min(lib.pn_transport_pending(src.transport), lib.pn_transport_capacity(dst.transport))
            if n > 0:
                buf = ffi.new("char[]", n)
                lib.pn_transport_peek(src.transport, buf, n)
                pushed = lib.pn_transport_push(dst.transport, buf, n)
                assert pushed == n, (pushed, n)
                lib.pn_transport_pop(src.transport, n)
                moved += n
        return moved


def run(nodes, pipes, rounds: int = 200) -> None:
    """Step every node and move bytes until nothing moves."""
    for _ in range(rounds):
        for node in nodes:
            node.step()
        if not sum(p.move() for p in pipes):
            for node in nodes:
                node.step()
            if not sum(p.move() for p in pipes):
                return
    raise AssertionError("the network never went quiet")


@pytest.fixture(autouse=True)
def _close_socks():
    yield
    while _socks:
        _socks.pop().close()


def test_handshake_in_memory_reports_both_sides():
    a, b = Node("A"), Node("B", epoch=4)
    pipe = Pipe(a, b)
    run([a, b], [pipe])
    assert a.core.of(PeerConnected) == [PeerConnected(pipe.ca.conn_id, "B", 4, "boot-B")]
    assert b.core.of(PeerConnected) == [PeerConnected(pipe.cb.conn_id, "A", 1, "boot-A")]
    assert pipe.dialer.ups == 1
    assert a.log.kinds() == ["peer-connected"] and b.log.kinds() == ["peer-connected"]
    assert a.peers.current["B"].state == UP
    # The data window and the control credit, as granted.
    assert lib.pn_link_credit(b.peers.current["A"].data_out) == DATA_WINDOW
    assert lib.pn_link_credit(b.peers.current["A"].ctl_out) == CONTROL_WINDOW - 1  # the auth message


def test_wrong_secret_in_memory():
    a, b = Node("A"), Node("B", secret="other")
    pipe = Pipe(a, b)
    run([a, b], [pipe])
    assert not a.core.events and not b.core.events
    assert b.log.kinds() == ["peer-refused"] and a.log.kinds() == ["peer-refused"]
    assert pipe.cb.dead and pipe.ca.dead


def test_control_messages_of_one_iteration_go_in_one_transfer_in_order():
    a, b = Node("A"), Node("B")
    pipe = Pipe(a, b)
    run([a, b], [pipe])
    sent_before = b.peers.current["A"].ctl_seq
    b.engine.execute([SendControl("A", {"t": "x", "n": i}) for i in range(5)])
    b.engine.execute([SendControl("A", {"t": "y"})])
    run([a, b], [pipe])
    assert b.peers.current["A"].ctl_seq == sent_before + 1, "one transfer for the iteration"
    [got] = a.core.of(ControlReceived)
    assert got == ControlReceived(pipe.ca.conn_id, "B", [{"t": "x", "n": i} for i in range(5)] + [{"t": "y"}])


def test_data_relayed_with_tag_header_and_bytes():
    a, b = Node("A"), Node("B")
    pipe = Pipe(a, b)
    run([a, b], [pipe])
    big = bytes(range(256)) * 2048  # 512 KiB: several frames
    b.engine.execute(
        [
            SendData("A", b"\x01" * 32, {"origin": "B", "dests": ["A"]}, b"small"),
            SendData("A", b"tag-2", {"origin": "B", "dests": ["A"], "seq": 2}, big),
        ]
    )
    run([a, b], [pipe])
    got = a.core.of(DataReceived)
    assert got == [
        DataReceived(pipe.ca.conn_id, "B", b"\x01" * 32, {"origin": "B", "dests": ["A"]}, b"small"),
        DataReceived(pipe.ca.conn_id, "B", b"tag-2", {"origin": "B", "dests": ["A"], "seq": 2}, big),
    ]
    assert lib.pn_link_credit(b.peers.current["A"].data_out) == DATA_WINDOW - 2  # topped up at half the window


def test_a_slow_peer_queues_data_and_pauses_reads_from_the_others():
    """B sends to A, which stops reading; B's queue for A grows past its bound and B
    stops granting data credit to C; when A reads again everything flows."""
    a, b, c = Node("A"), Node("B"), Node("C")
    ab, cb = Pipe(a, b), Pipe(c, b)  # B dials both
    run([a, b, c], [ab, cb])
    to_a = b.peers.current["A"]
    from_c = b.peers.current["C"]
    ab.a_reads = False
    n = DATA_WINDOW + QUEUE_BOUND + 10
    b.engine.execute([SendData("A", i.to_bytes(4, "big"), {"i": i}, b"m") for i in range(n)])
    run([a, b, c], [ab, cb])
    assert len(to_a.queue) > QUEUE_BOUND and to_a in b.peers.congested

    # C sends B data (B receives and hands it to its core) but B grants no new credit.
    c.engine.execute([SendData("B", i.to_bytes(4, "big"), {"i": i}, b"c") for i in range(DATA_WINDOW)])
    run([a, b, c], [ab, cb])
    assert len(b.core.of(DataReceived)) == DATA_WINDOW
    assert lib.pn_link_credit(from_c.data_in) == 0, "reads from C are paused while A's queue is over its bound"

    ab.a_reads = True  # A catches up
    run([a, b, c], [ab, cb])
    assert not to_a.queue and not b.peers.congested
    assert [e.header["i"] for e in a.core.of(DataReceived)] == list(range(n)), "all of it, in order"
    assert lib.pn_link_credit(from_c.data_in) == DATA_WINDOW, "credit back once the queue drained"


def test_loss_is_reported_once_and_the_newest_connection_is_used():
    a, b = Node("A"), Node("B")
    first = Pipe(a, b)
    run([a, b], [first])
    second = Pipe(a, b)  # a second connection between the same routers
    run([a, b], [first, second])
    assert [e.conn_id for e in a.core.of(PeerConnected)] == [first.ca.conn_id, second.ca.conn_id]
    b.engine.execute([SendControl("A", {"t": "hello"})])
    run([a, b], [first, second])
    assert a.core.of(ControlReceived)[-1].conn_id == second.ca.conn_id, "sent on the most recent"

    lib.pn_transport_close_tail(second.ca.transport)  # A's socket to B dies
    lib.pn_transport_close_head(second.ca.transport)
    run([a, b], [first, second])
    assert a.core.of(PeerLost) == [PeerLost(second.ca.conn_id, "B")]
    assert a.peers.current["B"].conn is first.ca, "back to the older live connection"
    a.engine.execute([SendControl("B", {"t": "still"})])
    run([a, b], [first, second])
    assert b.core.of(ControlReceived)[-1] == ControlReceived(first.cb.conn_id, "A", [{"t": "still"}])
    a.engine.AMQP_connection_lost(second.ca)  # the server may report it again: still once
    assert len(a.core.of(PeerLost)) == 1


def test_a_router_connecting_to_itself_is_refused():
    a, also_a = Node("A"), Node("A")
    pipe = Pipe(a, also_a)
    run([a, also_a], [pipe])
    assert not a.core.events and not also_a.core.events
    assert a.log.records[0] == (
        "peer-refused",
        {"peer": "A", "conn": pipe.ca.conn_id, "reason": "the peer claims our own router id 'A'"},
    )
