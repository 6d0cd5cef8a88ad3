"""A real adapter ``Engine`` and a subscriber or publisher client in one process: raw
proton connections whose transports are wired back to back in memory (no socket), so a
test decides exactly which bytes each side has read when the router runs. Used by
test_engine_batching.py and test_fastpath.py."""

from __future__ import annotations

from cproton_ffi import ffi, lib

from router.adapter.engine import Engine


def _open_client(client):
    """The client's connection (``transport``, ``connection``, ``collector`` set on it),
    opened, with one session opened on it, which is returned."""
    client.transport = lib.pn_transport()
    client.connection = lib.pn_connection()
    lib.pn_connection_set_container(client.connection, b"client")
    client.collector = lib.pn_collector()
    lib.pn_connection_collect(client.connection, client.collector)
    lib.pn_transport_bind(client.transport, client.connection)
    lib.pn_connection_open(client.connection)
    session = lib.pn_session(client.connection)
    lib.pn_session_open(session)
    return session


class Subscriber:
    """A client connection with ``links`` receiver links named sub-0, sub-1, ... on one
    session. ``received``: its deliveries in arrival order; ``deliveries``: the same
    by tag, until the test settles one (proton may free it then); ``bodies``: their bytes."""

    def __init__(self, links: int = 1, credit: int = 100):
        session = _open_client(self)
        self.links = []
        for i in range(links):
            link = lib.pn_receiver(session, f"sub-{i}".encode())
            lib.pn_terminus_set_address(lib.pn_link_source(link), b"topic")
            lib.pn_link_open(link)
            lib.pn_link_flow(link, credit)
            self.links.append(link)
        self.link = self.links[0]
        self.received: list = []
        self.deliveries: dict[bytes, object] = {}
        self.bodies: dict[bytes, bytes] = {}  # tag -> the message's bytes
        self.closed: set[int] = set()  # indexes of links the test closed
        self._tags: set[bytes] = set()  # every tag taken (the tests' tags are unique per connection)

    def take_deliveries(self) -> None:
        while (event := lib.pn_collector_peek(self.collector)) != ffi.NULL:
            if lib.pn_event_type(event) == lib.PN_DELIVERY:
                d = lib.pn_event_delivery(event)
                if lib.pn_delivery_readable(d) and not lib.pn_delivery_partial(d):
                    t = lib.pn_delivery_tag(d)
                    tag = ffi.unpack(t.start, t.size)
                    if tag not in self._tags:  # proton raises an event per frame touching it
                        self._tags.add(tag)
                        n = lib.pn_delivery_pending(d)
                        buf = ffi.new("char[]", max(n, 1))
                        self.bodies[tag] = ffi.unpack(buf, max(lib.pn_link_recv(lib.pn_delivery_link(d), buf, n), 0))
                        lib.pn_link_advance(lib.pn_delivery_link(d))
                        self.deliveries[tag] = d
                        self.received.append(d)
            lib.pn_collector_pop(self.collector)


class Publisher:
    """A client connection with ``links`` sender links named pub-0, pub-1, ... on one
    session, to "topic". ``sent``: tag -> its pn_delivery until the test settles it."""

    def __init__(self, links: int = 1):
        session = _open_client(self)
        self.links = []
        for i in range(links):
            link = lib.pn_sender(session, f"pub-{i}".encode())
            lib.pn_terminus_set_address(lib.pn_link_target(link), b"topic")
            lib.pn_link_open(link)
            self.links.append(link)
        self.sent: dict[bytes, object] = {}
        self.closed: set[int] = set()  # indexes of links the test closed

    def send(self, index: int, tag: bytes, payload: bytes, settled: bool = False, whole: bool = True):
        """A delivery on link ``index``: all of ``payload`` (``whole``), or its first half,
        the rest to come with finish()."""
        link = self.links[index]
        d = lib.pn_delivery(link, (len(tag), ffi.from_buffer(tag)))
        part = payload if whole else payload[: len(payload) // 2]
        lib.pn_link_send(link, part, len(part))
        if whole:
            lib.pn_link_advance(link)
            if settled:
                lib.pn_delivery_settle(d)
                return d
        self.sent[tag] = d
        return d

    def finish(self, index: int, payload: bytes) -> None:
        """The rest of the delivery send(whole=False) began on link ``index``."""
        link = self.links[index]
        rest = payload[len(payload) // 2 :]
        lib.pn_link_send(link, rest, len(rest))
        lib.pn_link_advance(link)

    def outcomes(self) -> dict[bytes, tuple[int, bool]]:
        """What the router answered so far: tag -> (outcome, settled by the router)."""
        return {tag: (lib.pn_delivery_remote_state(d), bool(lib.pn_delivery_settled(d))) for tag, d in self.sent.items()}

    def take_events(self) -> None:
        while lib.pn_collector_peek(self.collector) != ffi.NULL:
            lib.pn_collector_pop(self.collector)


def move(src, dst) -> int:
    """Bytes from one transport's output to the other's input; how many moved."""
    n = min(lib.pn_transport_pending(src), lib.pn_transport_capacity(dst))
    if n > 0:
        buf = ffi.new("char[]", n)
        lib.pn_transport_peek(src, buf, n)
        assert lib.pn_transport_push(dst, buf, n) == n
        lib.pn_transport_pop(src, n)
    return max(n, 0)


def serve(engine: Engine, conn, client: Subscriber | Publisher, rounds: int = 50) -> None:
    """Router and client loop iterations until no byte moves."""
    for _ in range(rounds):
        moved = move(client.transport, conn.transport)
        if not conn.dead:
            engine.drain(conn)
        moved += move(conn.transport, client.transport)
        if isinstance(client, Subscriber):
            client.take_deliveries()
        else:
            client.take_events()
        if not moved:
            return
