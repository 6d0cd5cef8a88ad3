"""A stub AMQP 1.0 server (proton, on its own thread) that records what clients
put in their attaches and transfers: for tests of the resumable client's wire
behaviour that must not depend on the router (attach properties, the
failover-server-list, cut resume lists, resend order).

    stub = StubServer(max_frame=4096, failover=[("127.0.0.1", 5999)]).start()
    ...client connects to stub.url...
    stub.wait(lambda: stub.attaches, what="an attach")
    stub.drop_connections()        # abrupt TCP close: the client fails over
    stub.stop()

``answer(attach) -> dict`` (optional) gives the link properties of the stub's
attach; by default a publisher link gets ``eorouter:incarnation`` (its own if it
presented one, else "stub-inc-1") and nothing else. Publisher links get
``credit``; their deliveries are recorded and answered with ``outcome``
(None: never answered, the window stays in flight).
"""

from __future__ import annotations

import socket
import threading
import time
from dataclasses import dataclass, field

from cproton import ffi, lib
from proton import Delivery, Endpoint, Handler, Link, symbol
from proton.reactor import ApplicationEvent, Container, EventInjector

_STATES = {
    "accepted": Delivery.ACCEPTED,
    "rejected": Delivery.REJECTED,
    "released": Delivery.RELEASED,
    "modified": Delivery.MODIFIED,
}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _plain(value):
    if isinstance(value, dict):
        return {str(k) if isinstance(k, str) else _plain(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, memoryview):
        return bytes(value)
    if isinstance(value, str):
        return str(value)
    return value


def raw_tag(dlv) -> bytes:
    tag = lib.pn_delivery_tag(dlv._impl)
    return bytes(ffi.unpack(tag.start, tag.size))


@dataclass
class Attach:
    """One attach as the stub received it."""

    conn: int
    container_id: str
    name: str
    role: str  # publisher (the client sends) / subscriber
    address: str | None
    properties: dict | None  # symbol keys turned into str; binary values into bytes
    raw_keys: list  # the keys as proton decoded them (to check they are symbols)
    durable: int
    expiry_policy: int
    timeout: int
    rcv_settle_mode: int
    snd_settle_mode: int


@dataclass
class Transfer:
    conn: int
    link: str
    tag: bytes
    payload: bytes


@dataclass
class StubServer:
    max_frame: int | None = None
    failover: list = field(default_factory=list)  # [(host, port)] advertised in the open frame
    credit: int = 1000
    outcome: str | None = "accepted"
    answer: object = None  # callable(Attach) -> dict of link properties
    subscriber_messages: list = field(default_factory=list)  # payloads to send to each subscriber link

    def __post_init__(self):
        self.port = free_port()
        self.url = f"127.0.0.1:{self.port}"
        self.attaches: list[Attach] = []
        self.transfers: list[Transfer] = []
        self.dispositions: list[tuple[bytes, int, bool]] = []  # (tag, state, settled) from subscribers
        self.connections = 0
        self._conns: list = []
        self._commands: list = []
        self._lock = threading.Lock()
        self._injector = EventInjector()
        self._container = Container(_StubHandler(self))
        self._container.container_id = "stub"
        self._thread = threading.Thread(target=self._container.run, daemon=True, name="stub-server")

    def start(self) -> StubServer:
        self._container.selectable(self._injector)
        self._acceptor = self._container.listen(f"127.0.0.1:{self.port}")
        self._thread.start()
        return self

    def _call(self, fn) -> None:
        with self._lock:
            self._commands.append(fn)
        self._injector.trigger(ApplicationEvent("stub_command"))

    def drop_connections(self) -> None:
        """Close every client connection's socket abruptly (no close frame)."""

        def drop():
            for conn in self._conns:
                transport = conn.transport
                if transport is not None:
                    transport.close_head()
                    transport.close_tail()
            self._conns.clear()

        self._call(drop)

    def stop(self) -> None:
        def stop():
            for conn in self._conns:
                if conn.transport is not None:
                    conn.transport.close_head()
                    conn.transport.close_tail()
            self._acceptor.close()
            self._injector.close()
            self._container.stop()

        self._call(stop)
        self._thread.join(5)

    def wait(self, condition, timeout: float = 10.0, what: str = "condition"):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            result = condition()
            if result:
                return result
            time.sleep(0.01)
        raise AssertionError(f"stub: timed out after {timeout}s waiting for {what}")


class _StubHandler(Handler):
    def __init__(self, stub: StubServer):
        super().__init__()
        self.stub = stub

    def on_stub_command(self, event) -> None:
        with self.stub._lock:
            commands, self.stub._commands = self.stub._commands, []
        for fn in commands:
            fn()

    def on_connection_init(self, event) -> None:
        conn = event.connection
        conn.container = "stub"
        if self.stub.failover:
            conn.properties = {
                symbol("failover-server-list"): [
                    {"hostname": host, "network-host": host, "port": str(port), "scheme": "amqp"}
                    for host, port in self.stub.failover
                ]
            }

    def on_connection_bound(self, event) -> None:
        if self.stub.max_frame:
            event.transport.max_frame_size = self.stub.max_frame

    def on_connection_remote_open(self, event) -> None:
        self.stub.connections += 1
        event.connection.context_id = self.stub.connections
        self.stub._conns.append(event.connection)
        if event.connection.state & Endpoint.LOCAL_UNINIT:
            event.connection.open()

    def on_session_remote_open(self, event) -> None:
        if event.session.state & Endpoint.LOCAL_UNINIT:
            event.session.open()

    def on_link_remote_open(self, event) -> None:
        link = event.link
        publisher = link.is_receiver
        terminus = link.remote_target if publisher else link.remote_source
        raw = link.remote_properties
        attach = Attach(
            conn=getattr(link.connection, "context_id", 0),
            container_id=link.connection.remote_container,
            name=link.name,
            role="publisher" if publisher else "subscriber",
            address=terminus.address,
            properties=_plain(dict(raw)) if raw is not None else None,
            raw_keys=list(raw.keys()) if raw is not None else [],
            durable=terminus.durability,
            expiry_policy=terminus.expiry_policy,
            timeout=terminus.timeout,
            rcv_settle_mode=link.remote_rcv_settle_mode,
            snd_settle_mode=link.remote_snd_settle_mode,
        )
        self.stub.attaches.append(attach)
        link.source.copy(link.remote_source)
        link.target.copy(link.remote_target)
        link.rcv_settle_mode = link.remote_rcv_settle_mode
        link.snd_settle_mode = link.remote_snd_settle_mode
        if self.stub.answer is not None:
            props = self.stub.answer(attach)
        elif publisher:
            props = {"eorouter:incarnation": (attach.properties or {}).get("eorouter:incarnation", "stub-inc-1")}
        else:
            props = None
        if props:
            link.properties = {symbol(k): v for k, v in props.items()}
        link.open()
        if publisher:
            link.flow(self.stub.credit)
        else:
            self._send_to_subscriber(link)

    def _send_to_subscriber(self, link) -> None:
        for tag, payload in self.stub.subscriber_messages:
            dlv = link.delivery(tag)
            link.stream(payload)
            link.advance()
            del dlv

    def on_link_flow(self, event) -> None:
        pass

    def on_delivery(self, event) -> None:
        dlv = event.delivery
        link = event.link
        conn = getattr(link.connection, "context_id", 0)
        if link.is_receiver:
            if not dlv.readable or dlv.partial:
                return
            payload = link.recv(dlv.pending) or b""
            link.advance()
            self.stub.transfers.append(Transfer(conn, link.name, raw_tag(dlv), payload))
            if self.stub.outcome is not None:
                dlv.update(_STATES[self.stub.outcome])
                dlv.settle()
        else:
            self.stub.dispositions.append((raw_tag(dlv), int(dlv.remote_state or 0), bool(dlv.settled)))
            if dlv.remote_state and link.rcv_settle_mode == Link.RCV_SECOND and not dlv.settled:
                pass  # like the router: settle only when told (tests call settle_all)
