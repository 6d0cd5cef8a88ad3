"""Standard AMQP 1.0 clients for integration tests, built on python-qpid-proton.

One ``Harness`` drives one proton ``Container`` from the test's own thread, the way
``proton.utils.BlockingConnection`` does (``container.process()`` in a loop), but for
any number of connections and with raw engine handlers so a test controls every
step: when credit is granted, which outcome a subscriber gives and when, whether it
settles, when a publisher settles, detach vs close, an abrupt TCP reset. No threads,
so no races in the test code itself; every wait is ``harness.wait(condition, what=...)``
under a deadline, and a router that dies while we wait fails the test at once with
its stderr.

    h = Harness()
    c = h.connect(router.url, container_id="sub-1")
    sub = c.subscriber("topic", credit=10)           # waits for the router's attach
    pub = h.connect(router.url).publisher("topic")
    sent = pub.send("hello")
    h.wait(lambda: len(sub.received) == 1, what="sub receives")
    sub.accept(sub.received[0])
    h.wait(lambda: sent.outcome, what="publisher outcome")
    assert sent.outcome == "accepted"
"""

from __future__ import annotations

import socket
import struct
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field

from cproton import ffi, lib
from proton import Condition, Delivery, Endpoint, Handler, Link, Message, Terminus, symbol

from router.client.iohandler import new_container

OUTCOME_NAMES = {
    int(Delivery.RECEIVED): "received",
    int(Delivery.ACCEPTED): "accepted",
    int(Delivery.REJECTED): "rejected",
    int(Delivery.RELEASED): "released",
    int(Delivery.MODIFIED): "modified",
}
TERMINAL = {"accepted", "rejected", "released", "modified"}


class WaitTimeout(AssertionError):
    """A condition a test waited for did not become true within its deadline."""


def wait_until(condition: Callable[[], object], timeout: float = 20.0, what: str = "condition", every: float = 0.02):
    """Poll ``condition()`` until it is truthy (returned); fail after ``timeout`` seconds.
    For waits on things outside a Harness (router processes, HTTP, files)."""
    deadline = time.monotonic() + timeout
    while True:
        result = condition()
        if result:
            return result
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(every)


def unique(prefix: str = "t") -> str:
    """A name no other test on a shared router uses (topics, container ids, link names)."""
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


def raw_tag(dlv: Delivery) -> bytes:
    """A delivery's tag as bytes. proton-python 0.40's ``Delivery.tag`` decodes the tag as
    UTF-8 (a str, and UnicodeDecodeError for binary tags such as the router's
    disambiguated ones), so read it from the C engine directly."""
    tag = lib.pn_delivery_tag(dlv._impl)
    return bytes(ffi.unpack(tag.start, tag.size))


def _dkey(dlv: Delivery) -> int:
    """Identity of a delivery (its engine address; our wrapper keeps it alive, so the
    address is not reused while we hold it): two deliveries may share a tag."""
    return int(ffi.cast("uintptr_t", dlv._impl))


def _condition(cond) -> Cond | None:
    if cond is None or cond.name is None:
        return None
    return Cond(str(cond.name), cond.description)


@dataclass(frozen=True)
class Cond:
    """An AMQP error condition as received (name, description)."""

    name: str
    description: str | None = None


# --------------------------------------------------------------------------- publisher side


@dataclass
class Sent:
    """One publisher delivery and what the router said about it (a snapshot: proton
    may free the delivery once both sides settled)."""

    tag: bytes
    payload: bytes
    presettled: bool
    delivery: Delivery | None = None
    outcome: str | None = None  # accepted / rejected / released / modified (None: none yet)
    condition: Cond | None = None
    delivery_failed: bool = False
    undeliverable_here: bool = False
    remote_settled: bool = False
    locally_settled: bool = False
    outcome_at: float | None = None

    def __repr__(self) -> str:
        extra = f" {self.condition.name}" if self.condition else ""
        return f"<Sent {self.tag!r} {self.outcome or 'no outcome'}{extra}>"


class _LinkEnd(Handler):
    """Shared state for one link: attach/detach as the router answered it."""

    def __init__(self, conn: Conn, link: Link):
        super().__init__()
        self.conn = conn
        self.harness = conn.harness
        self.link = link
        self.name = link.name
        self.remote_opened = False
        self.remote_closed = False  # detach with closed=true
        self.remote_detached = False  # detach with closed=false
        self.remote_condition: Cond | None = None
        link.handler = self

    # events

    def on_link_remote_open(self, event) -> None:
        self.remote_opened = True

    def on_link_remote_close(self, event) -> None:
        self.remote_closed = True
        self.remote_condition = _condition(self.link.remote_condition)
        if self.link.state & Endpoint.LOCAL_ACTIVE:
            self.link.close()

    def on_link_remote_detach(self, event) -> None:
        self.remote_detached = True
        self.remote_condition = _condition(self.link.remote_condition)
        if self.link.state & Endpoint.LOCAL_ACTIVE:
            self.link.detach()

    # state

    @property
    def gone(self) -> bool:
        """The router detached or closed this link (or its connection went away)."""
        return self.remote_closed or self.remote_detached or self.conn.gone

    @property
    def attached(self) -> bool:
        return self.remote_opened and not self.gone

    def wait_attached(self, timeout: float | None = None) -> None:
        self.harness.wait(lambda: self.remote_opened or self.gone, timeout, what=f"router's attach for link {self.name!r}")
        if self.gone:
            raise AssertionError(f"router refused link {self.name!r}: {self.remote_condition}")

    def wait_gone(self, timeout: float | None = None) -> None:
        self.harness.wait(lambda: self.gone, timeout, what=f"router detaching link {self.name!r}")

    def detach(self, wait: bool = True) -> None:
        """Detach without closing the terminus (a durable subscription survives this)."""
        self.link.detach()
        if wait:
            self.harness.wait(lambda: self.gone, what=f"router's detach reply for {self.name!r}")

    def close(self, wait: bool = True) -> None:
        """Detach with closed=true (the terminus, and any durable subscription, ends)."""
        self.link.close()
        if wait:
            self.harness.wait(lambda: self.gone, what=f"router's close reply for {self.name!r}")


class Publisher(_LinkEnd):
    """A sender link to a topic. ``auto_settle`` settles each delivery as soon as its
    outcome arrives (what ordinary clients do); turn it off to settle by hand."""

    def __init__(self, conn: Conn, link: Link, auto_settle: bool = True):
        super().__init__(conn, link)
        self.auto_settle = auto_settle
        self.sent: list[Sent] = []
        self._live: dict[int, Sent] = {}  # engine delivery -> Sent, until we settle it
        self._next_tag = 0

    @property
    def presettled(self) -> bool:
        return self.link.snd_settle_mode == Link.SND_SETTLED

    @property
    def credit(self) -> int:
        return self.link.credit

    def _tag(self) -> bytes:
        self._next_tag += 1
        return str(self._next_tag).encode()

    def wait_credit(self, timeout: float | None = None) -> None:
        self.harness.wait(lambda: self.link.credit > 0 or self.gone, timeout, what=f"credit on publisher {self.name!r}")
        if self.gone:
            raise AssertionError(f"publisher {self.name!r} detached by router: {self.remote_condition}")

    def send(
        self,
        body=None,
        *,
        message: Message | None = None,
        raw: bytes | None = None,
        tag: bytes | None = None,
        complete: bool = True,
        wait_credit: bool = True,
    ) -> Sent:
        """Send one delivery: ``body`` (wrapped in a Message), a ready ``message``, or
        ``raw`` bytes exactly as given (for malformed input). ``complete=False`` leaves
        the delivery partial (more bytes promised, never sent)."""
        if wait_credit:
            self.wait_credit()
        if raw is None:
            if message is None:
                message = Message(body=body)
            raw = message.encode()
        tag = tag or self._tag()
        dlv = self.link.delivery(tag)
        if raw:
            self.link.stream(raw)
        sent = Sent(tag=tag, payload=raw, presettled=self.presettled, delivery=dlv)
        self.sent.append(sent)
        self._live[_dkey(dlv)] = sent
        if complete:
            self.link.advance()
            if self.presettled:
                self._settle(sent)
        self.harness.flush()
        return sent

    def _settle(self, sent: Sent) -> None:
        self._live.pop(_dkey(sent.delivery), None)
        sent.delivery.settle()
        sent.locally_settled = True

    def abort(self, sent: Sent) -> None:
        """Abort a (partial) delivery: an AMQP transfer with aborted=true."""
        self._live.pop(_dkey(sent.delivery), None)
        sent.delivery.abort()
        sent.locally_settled = True
        self.harness.flush()

    def settle(self, sent: Sent) -> None:
        if not sent.locally_settled:
            self._settle(sent)
            self.harness.flush()

    def on_delivery(self, event) -> None:
        dlv = event.delivery
        sent = self._live.get(_dkey(dlv))
        if sent is None or sent.locally_settled:
            return
        state = int(dlv.remote_state or 0)
        name = OUTCOME_NAMES.get(state)
        if name in TERMINAL and sent.outcome is None:
            remote = dlv.remote
            sent.outcome = name
            sent.condition = _condition(remote.condition)
            sent.delivery_failed = bool(remote.failed)
            sent.undeliverable_here = bool(remote.undeliverable)
            sent.outcome_at = time.monotonic()
        if dlv.settled:
            sent.remote_settled = True
        if self.auto_settle and (sent.outcome is not None or sent.remote_settled):
            self._settle(sent)

    def outcomes(self) -> list[str | None]:
        return [s.outcome for s in self.sent]


# --------------------------------------------------------------------------- subscriber side


@dataclass
class Received:
    """One delivery the router forwarded to a subscriber."""

    tag: bytes
    payload: bytes
    delivery: Delivery
    message: Message | None
    decode_error: str | None = None
    arrived_settled: bool = False  # the router sent it pre-settled
    remote_settled: bool = False  # the router has settled it (now or on arrival)
    settled_state: str | None = None  # the state in the router's settling disposition
    outcome: str | None = None  # what we answered
    locally_settled: bool = False
    at: float = field(default_factory=time.monotonic)

    @property
    def body(self):
        return None if self.message is None else self.message.body

    def __repr__(self) -> str:
        return f"<Received {self.tag!r} body={self.body!r} out={self.outcome}>"


class Subscriber(_LinkEnd):
    """A receiver link from a topic. Gives no outcome on its own unless ``auto_accept``.

    ``rcv_second``: rcv-settle-mode=second; outcomes are then sent unsettled and the
    subscriber settles only after the router settled (as AMQP asks)."""

    def __init__(self, conn: Conn, link: Link, auto_accept: bool = False):
        super().__init__(conn, link)
        self.auto_accept = auto_accept
        self.received: list[Received] = []
        self._by_tag: dict[bytes, Received] = {}
        self.aborted: list[bytes] = []

    @property
    def rcv_second(self) -> bool:
        return self.link.rcv_settle_mode == Link.RCV_SECOND

    def flow(self, credit: int) -> None:
        self.link.flow(credit)
        self.harness.flush()

    def bodies(self) -> list:
        return [r.body for r in self.received]

    def on_delivery(self, event) -> None:
        dlv = event.delivery
        tag = raw_tag(dlv)
        if dlv.aborted:
            self.aborted.append(tag)
            dlv.settle()
            return
        if not dlv.readable:
            # Not the current incoming delivery: an update (the router settled) for one
            # we already read. A *new* delivery reusing a tag is readable and is recorded
            # below as another Received, so duplicates stay visible to the tests.
            known = self._by_tag.get(tag)
            if known is not None and dlv.settled:
                known.remote_settled = True
                known.settled_state = OUTCOME_NAMES.get(int(dlv.remote_state or 0))
                if known.outcome is not None and not known.locally_settled:
                    dlv.settle()  # rcv-settle-mode=second: we settle after the router did
                    known.locally_settled = True
            return
        if dlv.partial:
            return
        payload = self.link.recv(dlv.pending) or b""
        self.link.advance()
        message, error = Message(), None
        try:
            message.decode(payload)
        except Exception as exc:  # the router forwarded bytes we cannot read: record it
            message, error = None, repr(exc)
        rec = Received(
            tag=tag,
            payload=payload,
            delivery=dlv,
            message=message,
            decode_error=error,
            arrived_settled=bool(dlv.settled),
            remote_settled=bool(dlv.settled),
        )
        self.received.append(rec)
        self._by_tag[tag] = rec
        if rec.arrived_settled:
            dlv.settle()
            rec.locally_settled = True
        elif self.auto_accept:
            self.accept(rec)

    # outcomes

    def _answer(self, rec: Received, state, settle: bool | None) -> None:
        if rec.locally_settled:
            raise AssertionError(f"{rec!r} already settled")
        if settle is None:
            settle = not self.rcv_second or rec.remote_settled
        rec.delivery.update(state)
        rec.outcome = OUTCOME_NAMES[int(state)]
        if settle:
            rec.delivery.settle()
            rec.locally_settled = True
        self.harness.flush()

    def accept(self, rec: Received, settle: bool | None = None) -> None:
        self._answer(rec, Delivery.ACCEPTED, settle)

    def release(self, rec: Received, settle: bool | None = None) -> None:
        self._answer(rec, Delivery.RELEASED, settle)

    def reject(
        self, rec: Received, condition: str | None = None, description: str | None = None, settle: bool | None = None
    ) -> None:
        if condition:
            rec.delivery.local.condition = Condition(condition, description)
        self._answer(rec, Delivery.REJECTED, settle)

    def modify(self, rec: Received, failed: bool = False, undeliverable: bool = False, settle: bool | None = None) -> None:
        rec.delivery.local.failed = failed
        rec.delivery.local.undeliverable = undeliverable
        self._answer(rec, Delivery.MODIFIED, settle)

    def settle_only(self, rec: Received) -> None:
        """Settle without any outcome (AMQP allows it; the router counts it as released)."""
        if rec.locally_settled:
            raise AssertionError(f"{rec!r} already settled")
        rec.delivery.settle()
        rec.outcome = "settled-without-outcome"
        rec.locally_settled = True
        self.harness.flush()

    def answer(self, rec: Received, outcome: str, **kw) -> None:
        """Give ``outcome`` by name: accepted / rejected / released / modified, or
        ``settle-only`` (settled with no outcome)."""
        {
            "accepted": self.accept,
            "rejected": self.reject,
            "released": self.release,
            "modified": self.modify,
            "settle-only": self.settle_only,
        }[outcome](rec, **kw)


# --------------------------------------------------------------------------- connection


class _ConnHandler(Handler):
    def __init__(self, conn: Conn):
        super().__init__()
        self.conn = conn

    def on_connection_remote_open(self, event) -> None:
        self.conn.remote_opened = True

    def on_connection_remote_close(self, event) -> None:
        self.conn.remote_closed = True
        self.conn.remote_condition = _condition(event.connection.remote_condition)
        if event.connection.state & Endpoint.LOCAL_ACTIVE:
            event.connection.close()

    def on_transport_error(self, event) -> None:
        self.conn.transport_condition = _condition(event.transport.condition)

    def on_transport_closed(self, event) -> None:
        self.conn.transport_closed = True


class Conn:
    """One AMQP connection (one session) to a router."""

    def __init__(self, harness: Harness, url: str, container_id: str, heartbeat: float | None, sasl: bool = True):
        self.harness = harness
        self.url = url
        self.container_id = container_id
        self.remote_opened = False
        self.remote_closed = False
        self.remote_condition: Cond | None = None
        self.transport_condition: Cond | None = None
        self.transport_closed = False
        self.aborted = False
        self.links: list[_LinkEnd] = []
        kwargs = {"heartbeat": heartbeat} if heartbeat else {}
        if not sasl:
            kwargs["sasl_enabled"] = False
        self.connection = harness.container.connect(
            url=url, handler=_ConnHandler(self), reconnect=False, container_id=container_id, **kwargs
        )
        self._session = None

    @property
    def gone(self) -> bool:
        return self.remote_closed or self.transport_closed or self.aborted

    def wait_open(self, timeout: float | None = None) -> None:
        self.harness.wait(lambda: self.remote_opened or self.gone, timeout, what=f"open from router at {self.url}")
        if not self.remote_opened:
            raise AssertionError(f"connection to {self.url} failed: {self.transport_condition}")

    def session(self):
        if self._session is None:
            self._session = self.connection.session()
            self._session.open()
        return self._session

    def publisher(
        self,
        topic: str | None,
        name: str | None = None,
        *,
        presettled: bool = False,
        auto_settle: bool = True,
        rcv_second: bool = False,
        properties: dict | None = None,
        wait: bool = True,
    ) -> Publisher:
        """A sender link with target address ``topic`` (None: no address at all).
        ``rcv_second`` asks for rcv-settle-mode=second (the router decides);
        ``properties``: the attach's link properties (string keys, sent as symbols)."""
        link = self.session().sender(name or unique(f"pub-{topic}"))
        link.target.address = topic
        link.source.address = None
        link.snd_settle_mode = Link.SND_SETTLED if presettled else Link.SND_UNSETTLED
        link.rcv_settle_mode = Link.RCV_SECOND if rcv_second else Link.RCV_FIRST
        if properties:
            link.properties = {symbol(k): v for k, v in properties.items()}
        pub = Publisher(self, link, auto_settle=auto_settle)
        self.links.append(pub)
        link.open()
        self.harness.flush()
        if wait:
            pub.wait_attached()
        return pub

    def subscriber(
        self,
        topic: str | None,
        name: str | None = None,
        *,
        credit: int = 100,
        durable: int = 0,
        expiry_policy: str | None = None,
        timeout: int | None = None,
        rcv_second: bool = False,
        at_most_once: bool = False,
        auto_accept: bool = False,
        wait: bool = True,
    ) -> Subscriber:
        """A receiver link with source address ``topic`` (None: no address at all).

        ``durable``: 0 none, 1 configuration, 2 unsettled-state. With durable > 0 the
        expiry policy defaults to ``never`` (proton's DurableSubscription does the same).
        ``expiry_policy``: link-detach / session-end / connection-close / never.
        ``at_most_once``: ask for snd-settle-mode=settled (pre-settled deliveries only)."""
        link = self.session().receiver(name or unique(f"sub-{topic}"))
        link.source.address = topic
        link.target.address = None
        link.source.durability = {0: Terminus.NONDURABLE, 1: Terminus.CONFIGURATION, 2: Terminus.DELIVERIES}[durable]
        policy = expiry_policy or ("never" if durable else None)
        if policy:
            link.source.expiry_policy = {
                "link-detach": Terminus.EXPIRE_WITH_LINK,
                "session-end": Terminus.EXPIRE_WITH_SESSION,
                "connection-close": Terminus.EXPIRE_WITH_CONNECTION,
                "never": Terminus.EXPIRE_NEVER,
            }[policy]
        if timeout is not None:
            link.source.timeout = timeout
        link.snd_settle_mode = Link.SND_SETTLED if at_most_once else Link.SND_UNSETTLED
        link.rcv_settle_mode = Link.RCV_SECOND if rcv_second else Link.RCV_FIRST
        sub = Subscriber(self, link, auto_accept=auto_accept)
        self.links.append(sub)
        link.open()
        if credit:
            link.flow(credit)
        self.harness.flush()
        if wait:
            sub.wait_attached()
        return sub

    def close(self, timeout: float | None = None) -> None:
        """A clean AMQP close (close frame, wait for the router's)."""
        if self.gone:
            return
        self.connection.close()
        self.harness.wait(lambda: self.gone, timeout, what=f"close of connection to {self.url}")

    def abort(self) -> None:
        """Drop the TCP connection abruptly (RST, no AMQP close, no detach frames)."""
        transport = self.connection.transport
        selectable = getattr(transport, "_selectable", None) if transport else None
        sock = getattr(selectable, "_delegate", None) if selectable else None
        if sock is not None:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        self.aborted = True
        if transport is not None:
            transport.close_head()
            transport.close_tail()
        self.harness.flush()


# --------------------------------------------------------------------------- harness


class Harness:
    """One proton Container driven from the test thread, with deadlines everywhere."""

    def __init__(self, timeout: float = 10.0, routers: Callable[[], list] | None = None):
        self.timeout = timeout
        # Routers to watch while waiting: one that dies fails the wait at once, with its stderr.
        self.routers = routers or (lambda: [])
        self.container = new_container()
        self.container.timeout = 0.05
        self.container.start()
        # The pure-Python reactor stops for good (REACTOR_FINAL) as soon as it has no
        # connection and no timer left, e.g. between closing one connection and opening
        # the next. A timer far in the future keeps it alive until close().
        self._keepalive = self.container.schedule(10 * 365 * 86400, Handler())
        self.conns: list[Conn] = []
        self.closed = False
        self._busy = False

    def connect(
        self, url: str, container_id: str | None = None, *, heartbeat: float | None = None, sasl: bool = True, wait: bool = True
    ) -> Conn:
        """Open a connection (SASL ANONYMOUS by default, as standard clients do)."""
        conn = Conn(self, url, container_id or unique("client"), heartbeat, sasl)
        self.conns.append(conn)
        if wait:
            conn.wait_open()
        return conn

    def _process(self) -> None:
        self._busy = True
        try:
            self.container.process()
        finally:
            self._busy = False

    def flush(self) -> None:
        """Run the event loop briefly so frames we just produced reach the socket.
        A no-op when called from inside an event handler (the loop is already running)."""
        if self._busy:
            return
        old = self.container.timeout
        self.container.timeout = 0
        try:
            for _ in range(10):
                self._process()
        finally:
            self.container.timeout = old

    def _check_routers(self) -> None:
        for router in self.routers():
            if router.died_unexpectedly():
                router.check_alive("while a client was waiting")

    def wait(self, condition: Callable[[], object], timeout: float | None = None, what: str = "condition"):
        """Process events until ``condition()`` is truthy; fail after ``timeout`` seconds."""
        timeout = self.timeout if timeout is None else timeout
        deadline = time.monotonic() + timeout
        next_check = 0.0
        while True:
            result = condition()
            if result:
                return result
            now = time.monotonic()
            if now > deadline:
                raise WaitTimeout(f"timed out after {timeout}s waiting for {what}")
            if now > next_check:
                self._check_routers()
                next_check = now + 0.25
            self._process()

    def pump(self, seconds: float) -> None:
        """Keep processing events for ``seconds``. Only for *negative* checks ("still no
        outcome after X"): each caller says why the pause is long enough."""
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            self._process()
        self._check_routers()

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        for conn in self.conns:
            try:
                if not conn.gone:
                    conn.connection.close()
            except Exception:
                pass
        try:
            self.wait(lambda: all(c.gone for c in self.conns), timeout=3.0, what="connections to close")
        except Exception:
            pass
        for conn in self.conns:
            transport = conn.connection.transport
            if transport is not None:
                transport.close_head()
                transport.close_tail()
        try:
            self._keepalive.cancel()
            self.container.stop()
            for _ in range(50):
                if not self.container.process():
                    break
        except Exception:
            pass


# --------------------------------------------------------------------------- common checks


def assert_round_trip(harness: Harness, router, what: str = "fresh round trip") -> None:
    """A new publisher and a new subscriber on a new topic, over new connections: the
    message arrives once and the publisher hears accepted. Proves the router still works."""
    topic = unique("alive")
    sub = harness.connect(router.url).subscriber(topic, credit=10, auto_accept=True)
    pub = harness.connect(router.url).publisher(topic)
    sent = pub.send(f"ping {topic}")
    harness.wait(lambda: sent.outcome, what=f"{what}: publisher outcome")
    assert sent.outcome == "accepted", f"{what}: {sent!r}"
    assert sub.bodies() == [f"ping {topic}"], f"{what}: subscriber got {sub.received!r}"
    sub.conn.close()
    pub.conn.close()
