"""Inter-router connections: the handshake, the four links, and moving control and
data transfers between the wire and the core (docs/inter-router.md).

Like ``engine.py`` this decides nothing about routing: it proves identities,
attaches links, batches and encodes what the core says (``SendControl``,
``SendData``) and decodes what peers send (``ControlReceived``, ``DataReceived``).
Wire formats are pure functions in ``router/interrouter_codec.py``.

A connection's life (``Peer.state``)::

    HELLO --peer's open checked--> AUTH (acceptor: waiting for the connector's proof)
      |                              | proof verified: attach our two senders
      | connector: acceptor's proof  v
      +---verified, senders + auth-> LINKS --all four links up--> UP (PeerConnected)
                                                                  | closed / error / idle
                                                                  v
                                                             (PeerLost)
A connection must reach UP within the handshake timeout (the idle timeout, 10 s
when that is off) or it is closed with ``amqp:unauthorized-access``.

Flow control: a peer's control link gets a generous window topped up after every
transfer; its data link gets ``DATA_WINDOW`` credit from UP on, topped up as the
core takes each transfer. Outgoing data waits in a per-connection queue when the
peer gave no credit; while any queue is longer than ``QUEUE_BOUND`` the data links
of every *other* peer stop getting credit (reads pause) until the queue is back
under half of it. Not pausing the congested peer's own link breaks the two-router
credit loop; a cycle of three or more congested routers could still stall (see
docs/inter-router.md, "Flow control"); publisher credit in the core bounds what
can be in flight anyway.

Refusals on NORMAL (client) listeners are here too: an open carrying
``eorouter:router-id`` closes the connection, and an attach whose address starts
with ``_eorouter/`` is refused, both with ``amqp:unauthorized-access``, before
the core hears of them.
"""

from __future__ import annotations

import logging
import time
from collections import deque

from cproton_ffi import ffi, lib
from proton._data import Data, PropertyDict, int32, symbol

from router import interrouter_codec as codec
from router.adapter import endpoints, tls
from router.adapter.endpoints import Conn, condition_of, cstr, decode_properties, printable, set_condition
from router.adapter.pn import (
    PN_CONNECTION_REMOTE_CLOSE,
    PN_CONNECTION_REMOTE_OPEN,
    PN_DELIVERY,
    PN_LINK_FLOW,
    PN_LINK_REMOTE_CLOSE,
    PN_LINK_REMOTE_DETACH,
    PN_LINK_REMOTE_OPEN,
    PN_SESSION_REMOTE_CLOSE,
    PN_SESSION_REMOTE_OPEN,
    PN_TRANSPORT_CLOSED,
    PN_TRANSPORT_ERROR,
    _buffer,
    _collector_peek,
    _collector_pop,
    _delivery_aborted,
    _delivery_link,
    _delivery_new,
    _delivery_partial,
    _delivery_pending,
    _delivery_readable,
    _delivery_settle,
    _delivery_tag,
    _event_delivery,
    _event_link,
    _event_type,
    _from_buffer,
    _link_advance,
    _link_credit,
    _link_flow,
    _link_recv,
    _link_send,
    _unpack,
)
from router.core.errors import ProtocolError
from router.core.events import ControlReceived, DataReceived, PeerConnected, PeerLost
from router.interrouter_codec import CodecError

log = logging.getLogger("eorouter.interrouter")

NULL = ffi.NULL

# Credit and queue sizes (transfers).
DATA_WINDOW = 500  # credit a peer's data link holds
QUEUE_BOUND = 2 * DATA_WINDOW  # outgoing data queued for one peer before reads pause
CONTROL_WINDOW = 1000  # credit a peer's control link holds (topped up always)
PRE_AUTH_LIMIT = 8 * 1024  # largest control transfer before the peer proved itself
CONTROL_LIMIT = 64 * 1024 * 1024  # largest control transfer afterwards
DATA_SLACK = 64 * 1024  # routing header room on top of the max message size

# Peer states.
HELLO, AUTH, LINKS, UP, CLOSED = "hello", "auth", "links", "up", "closed"
# Link kinds.
CTL_OUT, DATA_OUT, CTL_IN, DATA_IN = 0, 1, 2, 3

NOT_ALLOWED = "amqp:not-allowed"
SIZE_EXCEEDED = "amqp:link:message-size-exceeded"
INTERNAL_ERROR = "amqp:internal-error"
UNAUTHORIZED = codec.UNAUTHORIZED
DECODE_ERROR = codec.DECODE_ERROR


_encode_data_head = codec.encode_data_head
_decode_data = codec.decode_data


class Peer:
    """One inter-router connection (accepted or dialled) as the adapter sees it."""

    __slots__ = (
        "conn",
        "acceptor",
        "dialer",
        "state",
        "nonce",
        "hello",
        "links",
        "ctl_out",
        "data_out",
        "ctl_in",
        "data_in",
        "ctl_out_up",
        "data_out_up",
        "ctl_seq",
        "queue",
        "early",
        "partial",
        "deadline",
        "refused",
    )

    def __init__(self, conn: Conn, acceptor: bool, dialer=None):
        self.conn = conn
        self.acceptor = acceptor
        self.dialer = dialer  # the server's Dialer for connections we dialled
        self.state = HELLO
        self.nonce = codec.new_nonce()  # fresh per connection
        self.hello: codec.Hello | None = None  # the peer's open properties, once checked
        self.links: list = []  # every pn_link of ours in the InterRouter's map
        self.ctl_out = self.data_out = self.ctl_in = self.data_in = None  # pn_link pointers
        self.ctl_out_up = self.data_out_up = False  # the peer answered our attach
        self.ctl_seq = 0  # control delivery tags
        self.queue: deque = deque()  # (tag, payload) waiting for data credit
        self.early: list = []  # control messages that came after the proof, before UP
        self.partial: dict[int, bytearray] = {}  # link kind -> bytes of a multi-frame delivery
        self.deadline = 0.0  # monotonic: UP by then or closed
        self.refused = False  # a peer-refused event is written for this connection

    @property
    def router_id(self) -> str | None:
        return self.hello.router_id if self.hello is not None else None

    @property
    def known(self) -> codec.Hello:
        """The peer's checked hello, on the paths that come after it (open, proof, up)."""
        hello = self.hello
        assert hello is not None
        return hello

    def __repr__(self) -> str:
        return f"<Peer {self.router_id or '?'} conn {self.conn.conn_id} {self.state}>"


class InterRouter:
    """Every inter-router connection of the process; owned by the Engine."""

    def __init__(
        self,
        engine,
        *,
        router_id: str,
        epoch: int,
        boot: str,
        secret: str | None,
        max_message_size: int,
        handshake_timeout: float,
    ):
        self.engine = engine
        self.core = engine.core
        self.eventlog = engine.eventlog
        self.touched = engine.touched
        self.router_id = router_id
        self.epoch = epoch
        self.boot = boot
        self.secret = secret
        self.data_limit = max_message_size + DATA_SLACK
        self.handshake_timeout = handshake_timeout
        self._links: dict = {}  # pn_link -> (Peer, kind)
        self.current: dict[str, Peer] = {}  # router id -> the most recent UP connection
        self.by_router: dict[str, list[Peer]] = {}  # router id -> UP connections, oldest first
        self.batches: dict[str, list] = {}  # router id -> control messages of this iteration
        self.congested: set[Peer] = set()  # peers whose outgoing data queue is over QUEUE_BOUND
        self.handshakes: set[Peer] = set()  # peers not UP yet (each with a deadline)
        self.dropped_data = 0  # SendData for a router with no connection
        self.dropped_control = 0
        self._rbuf_size = 64 * 1024
        self._rbuf = ffi.new("char[]", self._rbuf_size)
        self._event_handlers = self._event_table()

    # ================================================================== set-up
    def start_acceptor(self, conn: Conn) -> None:
        """A connection accepted on an inter-router listener: wait for its open."""
        conn.ir = peer = Peer(conn, acceptor=True)
        self._deadline(peer)

    def start_connector(self, conn: Conn, dialer) -> None:
        """A connection we dialled: introduce ourselves (no proof yet) and open."""
        conn.ir = peer = Peer(conn, acceptor=False, dialer=dialer)
        self._set_hello(conn, peer, None)
        lib.pn_connection_open(conn.connection)
        self.touched.add(conn)
        self._deadline(peer)

    def _deadline(self, peer: Peer) -> None:
        peer.deadline = time.monotonic() + self.handshake_timeout
        self.handshakes.add(peer)

    def _set_hello(self, conn: Conn, peer: Peer, auth: str | None) -> None:
        props = codec.hello_properties(self.router_id, self.epoch, self.boot, peer.nonce, auth)
        props[codec.KEY_PROTO] = int32(props[codec.KEY_PROTO])  # an AMQP int, as documented
        data = Data(lib.pn_connection_properties(conn.connection))
        data.clear()
        data.put_object(PropertyDict({symbol(k): v for k, v in props.items()}))

    # ================================================================== timers
    def next_deadline(self) -> float | None:
        """Earliest handshake deadline (monotonic seconds), None when none runs."""
        if not self.handshakes:
            return None
        return min(p.deadline for p in self.handshakes)

    def expire(self, now_mono: float) -> None:
        for peer in [p for p in self.handshakes if p.deadline <= now_mono]:
            self.handshakes.discard(peer)
            if peer.state != UP and not peer.conn.dead and not peer.conn.closing:
                what = {HELLO: "no open", AUTH: "no proof", LINKS: "links not attached"}.get(peer.state, "")
                self._refuse(peer, UNAUTHORIZED, f"handshake not finished within {self.handshake_timeout:g}s ({what})")

    # ================================================================== inbound
    def drain(self, conn: Conn) -> None:
        """Process every pending engine event of one inter-router connection."""
        collector = conn.collector
        peer = conn.ir
        handlers = self._event_handlers
        while not conn.dead:
            event = _collector_peek(collector)
            if event == NULL:
                return
            etype = _event_type(event)
            try:
                if conn.closing and etype != PN_TRANSPORT_CLOSED and etype != PN_CONNECTION_REMOTE_CLOSE:
                    pass  # we closed it: nothing more it says matters
                elif etype == PN_DELIVERY:  # the usual event (a copy, a control message): no table lookup
                    self._on_delivery(_event_delivery(event), peer)
                else:
                    handler = handlers.get(etype)
                    if handler is not None:
                        handler(event, conn, peer)
            except Exception as exc:  # a bug (or a peer we did not foresee): this connection only
                log.exception(
                    "inter-router connection %d (%s): error handling engine event %s",
                    conn.conn_id,
                    conn.peer,
                    cstr(lib.pn_event_type_name(etype)),
                )
                self._close(peer, INTERNAL_ERROR, f"{type(exc).__name__}: {exc}"[:200])
            _collector_pop(collector)

    def _event_table(self) -> dict:
        """The engine events of an inter-router connection other than a delivery's, each
        to its handler (called with the event, the connection and its peer); events not
        listed are ignored. The same shape as ``Engine._event_table``."""
        return {
            PN_LINK_FLOW: lambda event, conn, peer: self._on_link_flow(_event_link(event)),
            PN_LINK_REMOTE_OPEN: lambda event, conn, peer: self._on_link_open(_event_link(event), peer),
            PN_LINK_REMOTE_DETACH: lambda event, conn, peer: self._on_link_detach(_event_link(event), peer),
            PN_LINK_REMOTE_CLOSE: lambda event, conn, peer: self._on_link_detach(_event_link(event), peer),
            PN_SESSION_REMOTE_OPEN: lambda event, conn, peer: self._on_session_open(lib.pn_event_session(event)),
            PN_SESSION_REMOTE_CLOSE: lambda event, conn, peer: self._close(peer, None, None, "the peer ended the session"),
            PN_CONNECTION_REMOTE_OPEN: lambda event, conn, peer: self._on_connection_open(conn, peer),
            PN_CONNECTION_REMOTE_CLOSE: lambda event, conn, peer: self._on_remote_close(peer),
            PN_TRANSPORT_ERROR: lambda event, conn, peer: self._on_transport_error(conn),
            PN_TRANSPORT_CLOSED: lambda event, conn, peer: self.lost(conn),
        }

    def _on_link_flow(self, lp) -> None:
        entry = self._links.get(lp)
        if entry is not None and entry[1] == DATA_OUT:
            self._pump(entry[0])

    def _on_session_open(self, session) -> None:
        if lib.pn_session_state(session) & endpoints.LOCAL_UNINIT:
            lib.pn_session_open(session)

    def _on_connection_open(self, conn: Conn, peer: Peer) -> None:
        self.engine.opened.append(conn)
        self._on_open(peer)

    def _on_transport_error(self, conn: Conn) -> None:
        name, desc = condition_of(lib.pn_transport_condition(conn.transport))
        log.info("inter-router connection %d (%s): transport error %s: %s", conn.conn_id, conn.peer, name, printable(desc))
        if desc and "idle-timeout" in desc:
            self.engine.silent.append(conn)  # see Engine.silent: cut now, not after TCP gives up

    @property
    def proof_secret(self) -> str:
        """The network's secret. Without one (the config allows that only where every
        inter-router connection is mutual TLS) the proofs are still exchanged, under an
        empty key: the certificates alone vouch for the routers, and a router that has
        a secret refuses one that has none."""
        return self.secret or ""

    # ---------------------------------------------------------------- open / proof
    def _on_open(self, peer: Peer) -> None:
        conn = peer.conn
        props = decode_properties(lib.pn_connection_remote_properties(conn.connection))
        try:
            hello = codec.parse_hello(props, expect_auth=not peer.acceptor)
        except CodecError as err:
            claimed = props.get(codec.KEY_ID) if props else None
            self._refuse(peer, err.condition, str(err), claimed if isinstance(claimed, str) else None)
            return
        peer.hello = hello
        if hello.router_id == self.router_id:
            self._refuse(peer, UNAUTHORIZED, f"the peer claims our own router id {hello.router_id!r}")
            return
        if self.secret is None and not conn.tls:  # (the config rules it out; never let it through)
            self._refuse(peer, UNAUTHORIZED, "no network secret here, and this connection has no TLS certificate", None)
            return
        if conn.tls:  # mutual TLS: the certificate must name the router it claims to be
            named = tls.peer_common_name(conn.transport)
            if named != hello.router_id:
                self._refuse(
                    peer,
                    UNAUTHORIZED,
                    f"its certificate names {named!r}, not the router id {hello.router_id!r} it announces",
                    hello.router_id,
                )
                return
        if peer.acceptor:
            proof = codec.acceptor_proof(self.proof_secret, self.router_id, self.epoch, self.boot, hello.nonce, peer.nonce)
            self._set_hello(conn, peer, proof)
            lib.pn_connection_open(conn.connection)
            peer.state = AUTH
        else:
            expected = codec.acceptor_proof(self.proof_secret, hello.router_id, hello.epoch, hello.boot, peer.nonce, hello.nonce)
            if not codec.proof_matches(expected, hello.auth):
                self._refuse(
                    peer,
                    UNAUTHORIZED,
                    "wrong proof (eorouter:auth) in the acceptor's open: the routers' secrets differ (or only one has one)",
                )
                return
            session = lib.pn_session(conn.connection)
            lib.pn_session_open(session)
            peer.state = LINKS
            self._attach_senders(peer, session)
            mac = codec.connector_proof(self.proof_secret, self.router_id, self.epoch, self.boot, hello.nonce, peer.nonce)
            self._send_control(peer, [{"t": codec.AUTH, "mac": mac}])
        self.touched.add(conn)

    def _attach_senders(self, peer: Peer, session) -> None:
        for kind, address, name in (
            (CTL_OUT, codec.CONTROL_ADDRESS, codec.control_link_name(self.router_id)),
            (DATA_OUT, codec.DATA_ADDRESS, codec.data_link_name(self.router_id)),
        ):
            lp = lib.pn_sender(session, name.encode("utf-8"))
            lib.pn_terminus_set_address(lib.pn_link_target(lp), address.encode("ascii"))
            lib.pn_terminus_set_address(lib.pn_link_source(lp), address.encode("ascii"))
            lib.pn_link_set_snd_settle_mode(lp, lib.PN_SND_SETTLED)
            lib.pn_link_open(lp)
            self._register(peer, lp, kind)
        self.touched.add(peer.conn)

    def _register(self, peer: Peer, lp, kind: int) -> None:
        self._links[lp] = (peer, kind)
        peer.links.append(lp)
        if kind == CTL_OUT:
            peer.ctl_out = lp
        elif kind == DATA_OUT:
            peer.data_out = lp
        elif kind == CTL_IN:
            peer.ctl_in = lp
        else:
            peer.data_in = lp

    # ---------------------------------------------------------------- links
    def _on_link_open(self, lp, peer: Peer) -> None:
        entry = self._links.get(lp)
        if entry is not None:  # the peer answered one of our attaches
            kind = entry[1]
            if lib.pn_terminus_get_type(lib.pn_link_remote_target(lp)) == lib.PN_UNSPECIFIED:
                return  # refused: its detach follows and closes the connection
            if kind == CTL_OUT:
                peer.ctl_out_up = True
            elif kind == DATA_OUT:
                peer.data_out_up = True
            self._check_up(peer)
            return
        # A link the peer attached: only its two sender links are welcome, after its open.
        target = lib.pn_link_remote_target(lp)
        address = cstr(lib.pn_terminus_get_address(target)) if lib.pn_terminus_get_type(target) != lib.PN_UNSPECIFIED else None
        kind = None
        if peer.state in (AUTH, LINKS, UP) and lib.pn_link_is_receiver(lp):
            if address == codec.CONTROL_ADDRESS and peer.ctl_in is None:
                kind = CTL_IN
            elif address == codec.DATA_ADDRESS and peer.data_in is None:
                kind = DATA_IN
        if kind is None:
            name = cstr(lib.pn_link_name(lp))
            log.info(
                "inter-router connection %d (%s): refused link %s (address %s)",
                peer.conn.conn_id,
                peer.router_id,
                printable(repr(name)),
                printable(repr(address)),
            )
            set_condition(
                lib.pn_link_condition(lp),
                NOT_ALLOWED,
                f"an inter-router connection carries only one {codec.CONTROL_ADDRESS} and one "
                f"{codec.DATA_ADDRESS} sender link from each side",
            )
            lib.pn_link_open(lp)
            lib.pn_link_close(lp)
            self.touched.add(peer.conn)
            return
        lib.pn_terminus_copy(lib.pn_link_source(lp), lib.pn_link_remote_source(lp))
        lib.pn_terminus_copy(lib.pn_link_target(lp), target)
        lib.pn_link_set_snd_settle_mode(lp, lib.pn_link_remote_snd_settle_mode(lp))
        lib.pn_link_set_rcv_settle_mode(lp, lib.PN_RCV_FIRST)
        lib.pn_link_open(lp)
        self._register(peer, lp, kind)
        if kind == CTL_IN:
            _link_flow(lp, CONTROL_WINDOW)  # the proof comes this way
        self.touched.add(peer.conn)
        self._check_up(peer)

    def _on_link_detach(self, lp, peer: Peer) -> None:
        entry = self._links.get(lp)
        if entry is None:  # a link we refused: free our side
            if not lib.pn_link_state(lp) & endpoints.LOCAL_CLOSED:
                lib.pn_link_close(lp)
            self.touched.add(peer.conn)
            return
        name, desc = condition_of(lib.pn_link_remote_condition(lp))
        why = f"the peer detached {cstr(lib.pn_link_name(lp))!r}" + (f" ({name}: {desc})" if name else "")
        if peer.state != UP and name:
            self._refuse(peer, None, why, peer.router_id, close_condition=False)
        else:
            self._close(peer, None, None, why)

    def _check_up(self, peer: Peer) -> None:
        if peer.state == LINKS and peer.ctl_out_up and peer.data_out_up and peer.ctl_in is not None and peer.data_in is not None:
            self._report(peer)

    def _report(self, peer: Peer) -> None:
        conn = peer.conn
        hello = peer.known
        rid = hello.router_id
        peer.state = UP
        self.handshakes.discard(peer)
        self.by_router.setdefault(rid, []).append(peer)
        self.current[rid] = peer
        if peer.dialer is not None:
            peer.dialer.connected()
        others = [p.conn.conn_id for p in self.by_router[rid] if p is not peer]
        log.info(
            "inter-router connection %d (%s) up: router %s epoch %d boot %s (%s)%s",
            conn.conn_id,
            conn.peer,
            rid,
            hello.epoch,
            hello.boot,
            "accepted" if peer.acceptor else "dialled",
            f"; also connected on {others}" if others else "",
        )
        self.engine.happened(("peer-connected", rid))
        self.eventlog.append(
            "peer-connected",
            self.engine.now,
            {
                "peer": rid,
                "conn": conn.conn_id,
                "peer_epoch": hello.epoch,
                "peer_boot": hello.boot,
                "role": "acceptor" if peer.acceptor else "connector",
            },
        )
        try:
            commands = self.core.handle(PeerConnected(conn.conn_id, rid, hello.epoch, hello.boot), self.engine.now)
        except ProtocolError as err:
            log.warning("inter-router connection %d: the core refused router %s: %s", conn.conn_id, rid, err)
            self._forget_up(peer)
            peer.state = LINKS
            self._refuse(peer, err.condition, f"refused by the core: {err.description or err}", rid)
            return
        if commands:
            self.engine.execute(commands)
        if self._may_grant(peer):
            _link_flow(peer.data_in, DATA_WINDOW)
        self.touched.add(conn)
        if peer.early:
            early, peer.early = peer.early, []
            self._dispatch(ControlReceived(conn.conn_id, rid, early), peer)

    # ---------------------------------------------------------------- transfers in
    def _on_delivery(self, d, peer: Peer) -> None:
        lp = _delivery_link(d)
        entry = self._links.get(lp)
        if entry is None or entry[1] < CTL_IN:
            return  # our own pre-settled sends, or a refused link
        kind = entry[1]
        if not _delivery_readable(d):
            return  # already consumed: a stale event
        buf = peer.partial.get(kind)
        if _delivery_aborted(d):
            peer.partial.pop(kind, None)
            _delivery_settle(d)
            return
        if kind == CTL_IN:
            limit = CONTROL_LIMIT if peer.state in (LINKS, UP) else PRE_AUTH_LIMIT
        else:
            limit = self.data_limit
        n = _delivery_pending(d)
        if buf is None and not _delivery_partial(d):  # the common case: all of it is here
            if n > limit:
                self._too_large(peer, kind, n, limit)
                return
            if n > self._rbuf_size:
                self._grow(n)
            got = _link_recv(lp, self._rbuf, n)
            payload = _buffer(self._rbuf, got if got > 0 else 0)
        else:
            if buf is None:
                buf = peer.partial[kind] = bytearray()
            if n:
                if n > self._rbuf_size:
                    self._grow(n)
                got = _link_recv(lp, self._rbuf, n)
                if got > 0:
                    buf += _buffer(self._rbuf, got)
            if len(buf) > limit:
                self._too_large(peer, kind, len(buf), limit)
                return
            if _delivery_partial(d):
                return
            del peer.partial[kind]
            payload = buf
        t = _delivery_tag(d)
        tag = _unpack(t.start, t.size)
        _link_advance(lp)
        _delivery_settle(d)
        if kind == DATA_IN:
            self._on_data(peer, tag, payload)
        else:
            self._on_control(peer, payload)

    def _grow(self, n: int) -> None:
        self._rbuf_size = max(n, 2 * self._rbuf_size)
        self._rbuf = ffi.new("char[]", self._rbuf_size)

    def _too_large(self, peer: Peer, kind: int, size: int, limit: int) -> None:
        what = "data" if kind == DATA_IN else "control"
        self._close(peer, SIZE_EXCEEDED, f"{what} transfer of {size} bytes (limit {limit})")

    def _on_control(self, peer: Peer, payload) -> None:
        try:
            ctl = codec.decode_control(payload)
        except CodecError as err:
            log.warning("inter-router connection %d (%s): bad control transfer: %s", peer.conn.conn_id, peer.router_id, err)
            self._close(peer, err.condition, str(err)[:300])
            return
        hello = peer.known
        if ctl.sender != hello.router_id or ctl.epoch != hello.epoch or ctl.boot != hello.boot:
            log.warning(
                "inter-router connection %d: control transfer from %s epoch %d boot %s on a connection "
                "authenticated as %s epoch %d boot %s",
                peer.conn.conn_id,
                ctl.sender,
                ctl.epoch,
                ctl.boot,
                hello.router_id,
                hello.epoch,
                hello.boot,
            )
            self._close(
                peer,
                UNAUTHORIZED,
                f"control transfer from {ctl.sender!r} (epoch {ctl.epoch}) on a "
                f"connection authenticated as {hello.router_id!r} (epoch {hello.epoch})",
            )
            return
        msgs = ctl.msgs
        if peer.state == AUTH:
            first = msgs[0] if msgs else None
            if first is None or first["t"] != codec.AUTH:
                self._refuse(peer, UNAUTHORIZED, "the first control message is not the connector's auth")
                return
            expected = codec.connector_proof(self.proof_secret, hello.router_id, hello.epoch, hello.boot, peer.nonce, hello.nonce)
            if not codec.proof_matches(expected, first.get("mac")):
                self._refuse(
                    peer, UNAUTHORIZED, "wrong proof (auth mac) from the connector: the routers' secrets differ (or one has none)"
                )
                return
            peer.state = LINKS
            session = lib.pn_link_session(peer.ctl_in)
            self._attach_senders(peer, session)
            msgs = msgs[1:]
        for msg in msgs:
            if msg["t"] == codec.AUTH:
                self._close(peer, NOT_ALLOWED, "auth is only the connector's first control message")
                return
        if peer.ctl_in is not None and _link_credit(peer.ctl_in) < CONTROL_WINDOW // 2:
            _link_flow(peer.ctl_in, CONTROL_WINDOW - _link_credit(peer.ctl_in))
            self.touched.add(peer.conn)
        if not msgs:
            return
        if peer.state == UP:
            self._dispatch(ControlReceived(peer.conn.conn_id, hello.router_id, msgs), peer)
        else:
            peer.early.extend(msgs)

    def _on_data(self, peer: Peer, tag: bytes, payload) -> None:
        if peer.state != UP:
            self._close(peer, NOT_ALLOWED, "a data transfer before the connection was up")
            return
        try:
            header, message = _decode_data(payload)
        except CodecError as err:
            log.warning("inter-router connection %d (%s): bad data transfer: %s", peer.conn.conn_id, peer.router_id, err)
            self._close(peer, err.condition, str(err)[:300])
            return
        self._dispatch(DataReceived(peer.conn.conn_id, peer.known.router_id, tag, header, message), peer)
        lp = peer.data_in
        if peer.state == UP and lp is not None:
            credit = _link_credit(lp)
            if credit < DATA_WINDOW // 2 and self._may_grant(peer):
                _link_flow(lp, DATA_WINDOW - credit)
                self.touched.add(peer.conn)

    def _dispatch(self, event, peer: Peer) -> None:
        """Feed the core; a ProtocolError (the peer said something illegal) closes
        this connection with the error's condition."""
        try:
            commands = self.core.handle(event, self.engine.now)
        except ProtocolError as err:
            log.warning(
                "inter-router connection %d (%s): %s refused by the core: %s",
                peer.conn.conn_id,
                peer.router_id,
                type(event).__name__,
                err,
            )
            self._close(peer, err.condition, err.description)
            return
        if commands:
            self.engine.execute(commands)

    # ================================================================== outbound: CORE_*
    def CORE_send_control(self, cmd) -> None:
        batch = self.batches.get(cmd.router_id)
        if batch is None:
            self.batches[cmd.router_id] = [cmd.message]
        else:
            batch.append(cmd.message)

    def flush(self) -> None:
        """End of a loop iteration: one control transfer per neighbour with messages."""
        batches, self.batches = self.batches, {}
        for rid, msgs in batches.items():
            peer = self.current.get(rid)
            if peer is None:
                self.dropped_control += len(msgs)
                log.info("no connection to router %s: %d control message(s) dropped", rid, len(msgs))
                continue
            self._send_control(peer, msgs)

    def _send_control(self, peer: Peer, msgs: list) -> None:
        payload = codec.encode_control(self.router_id, self.epoch, self.boot, msgs)
        peer.ctl_seq += 1
        # Sent whatever the credit: proton holds it until the peer grants some (the
        # peer tops control credit up after every transfer).
        self._send(peer.ctl_out, peer.ctl_seq.to_bytes(8, "big"), payload)
        self.touched.add(peer.conn)

    def CORE_send_data(self, cmd) -> None:
        peer = self.current.get(cmd.router_id)
        if peer is None:
            self.dropped_data += 1
            log.debug("no connection to router %s: data transfer dropped", cmd.router_id)
            return
        head = _encode_data_head(cmd.header)  # the message follows it, not copied to join it
        queue = peer.queue
        if not queue and _link_credit(peer.data_out) > 0:
            self._send_data(peer.data_out, cmd.tag, head, cmd.payload)
            self.touched.add(peer.conn)
            return
        queue.append((cmd.tag, head, cmd.payload))
        if len(queue) > QUEUE_BOUND and peer not in self.congested:
            self.congested.add(peer)
            log.warning(
                "router %s (connection %d) is slow: %d data transfers queued; pausing credit on the "
                "data links of the other routers",
                cmd.router_id,
                peer.conn.conn_id,
                len(queue),
            )

    @staticmethod
    def _send_data(lp, tag: bytes, head: bytes, message: bytes) -> None:
        d = _delivery_new(lp, (len(tag), _from_buffer(tag)))
        _link_send(lp, head, len(head))
        _link_send(lp, message, len(message))
        _link_advance(lp)
        _delivery_settle(d)  # pre-settled

    @staticmethod
    def _send(lp, tag: bytes, payload: bytes) -> None:
        d = _delivery_new(lp, (len(tag), _from_buffer(tag)))
        _link_send(lp, payload, len(payload))
        _link_advance(lp)
        _delivery_settle(d)  # pre-settled

    def _pump(self, peer: Peer) -> None:
        """The peer granted data credit: send what waited for it."""
        queue = peer.queue
        if not queue or peer.state != UP:
            return
        lp = peer.data_out
        send = self._send_data
        while queue and _link_credit(lp) > 0:
            tag, head, message = queue.popleft()
            send(lp, tag, head, message)
        self.touched.add(peer.conn)
        if peer in self.congested and len(queue) <= QUEUE_BOUND // 2:
            self._uncongest(peer)

    def _may_grant(self, peer: Peer) -> bool:
        """Data credit for ``peer``'s data link, unless another peer's queue is over its bound."""
        congested = self.congested
        return not congested or (len(congested) == 1 and peer in congested)

    def _uncongest(self, peer: Peer) -> None:
        self.congested.discard(peer)
        if peer.state == UP:
            log.info(
                "router %s (connection %d) caught up: %d data transfers queued",
                peer.router_id,
                peer.conn.conn_id,
                len(peer.queue),
            )
        for peers in self.by_router.values():
            for other in peers:
                lp = other.data_in
                if lp is not None and self._may_grant(other):
                    credit = _link_credit(lp)
                    if credit < DATA_WINDOW:
                        _link_flow(lp, DATA_WINDOW - credit)
                        self.touched.add(other.conn)

    # ================================================================== closing
    def _close(self, peer: Peer, condition: str | None, description: str | None, why: str | None = None) -> None:
        conn = peer.conn
        if conn.dead or conn.closing:
            return
        if condition:
            log.info(
                "inter-router connection %d (%s): closing: %s: %s",
                conn.conn_id,
                peer.router_id or conn.peer,
                condition,
                description,
            )
        elif why:
            log.info("inter-router connection %d (%s): closing: %s", conn.conn_id, peer.router_id or conn.peer, why)
        self.engine.close_connection(conn, condition, description)

    def _refuse(
        self, peer: Peer, condition: str | None, reason: str, claimed: str | None = None, close_condition: bool = True
    ) -> None:
        """Close a connection that did not (or could not) prove itself, and say so in
        the event log (``peer-refused``)."""
        conn = peer.conn
        if not peer.refused:
            peer.refused = True
            log.warning(
                "inter-router connection %d (%s) refused%s: %s",
                conn.conn_id,
                conn.peer,
                f" (router {claimed or peer.router_id})" if (claimed or peer.router_id) else "",
                reason,
            )
            self.eventlog.append(
                "peer-refused", self.engine.now, {"peer": claimed or peer.router_id, "conn": conn.conn_id, "reason": reason}
            )
        self._close(peer, condition if close_condition else None, reason if close_condition else None)

    def _on_remote_close(self, peer: Peer) -> None:
        conn = peer.conn
        name, desc = condition_of(lib.pn_connection_remote_condition(conn.connection))
        if peer.state != UP and name and not peer.refused:
            peer.refused = True
            reason = (
                f"refused by the peer: {printable(name)}: {printable(desc)}"
                if desc
                else f"refused by the peer: {printable(name)}"
            )
            log.warning("inter-router connection %d (%s): %s", conn.conn_id, peer.router_id or conn.peer, reason)
            self.eventlog.append(
                "peer-refused", self.engine.now, {"peer": peer.router_id, "conn": conn.conn_id, "reason": reason}
            )
        elif name:
            log.info(
                "inter-router connection %d (%s) closed by the peer: %s: %s",
                conn.conn_id,
                peer.router_id or conn.peer,
                printable(name),
                printable(desc),
            )
        if not lib.pn_connection_state(conn.connection) & endpoints.LOCAL_CLOSED:
            lib.pn_connection_close(conn.connection)
        self.touched.add(conn)

    def lost(self, conn: Conn) -> None:
        """The transport is closed (or the socket failed): PeerLost if the core knew
        the connection, forget its links; the loop tears it down after this batch."""
        conn.dead = True
        if conn.lost:
            return
        conn.lost = True
        peer = conn.ir
        for lp in peer.links:
            self._links.pop(lp, None)
        peer.links.clear()
        self.handshakes.discard(peer)
        peer.queue.clear()
        peer.partial.clear()
        if peer in self.congested:
            self._uncongest(peer)
        was_up = peer.state == UP
        peer.state = CLOSED
        if not was_up:
            return
        rid = peer.known.router_id
        self._forget_up(peer)
        reason = _loss_reason(conn)
        log.info("inter-router connection %d to router %s lost: %s", conn.conn_id, rid, reason)
        self.engine.happened(("peer-lost", rid))
        self.eventlog.append("peer-lost", self.engine.now, {"peer": rid, "conn": conn.conn_id, "reason": reason})
        try:
            commands = self.core.handle(PeerLost(conn.conn_id, rid), self.engine.now)
        except ProtocolError as err:
            log.warning("the core refused PeerLost for connection %d (%s): %s", conn.conn_id, rid, err)
            return
        except Exception:  # a core bug must not stop the loop from tearing the connection down
            log.exception("the core failed on PeerLost for connection %d (%s)", conn.conn_id, rid)
            return
        if commands:
            self.engine.execute(commands)

    def _forget_up(self, peer: Peer) -> None:
        rid = peer.known.router_id
        peers = self.by_router.get(rid)
        if peers and peer in peers:
            peers.remove(peer)
            if peers:
                self.current[rid] = peers[-1]
            else:
                del self.by_router[rid]
                self.current.pop(rid, None)

    # ================================================================== client listeners
    def refuse_router_open(self, conn: Conn) -> bool:
        """A NORMAL listener's connection opened: True (and the connection closed
        with amqp:unauthorized-access) when its open claims to be a router."""
        props = decode_properties(lib.pn_connection_remote_properties(conn.connection))
        if not props or codec.KEY_ID not in props:
            return False
        claimed = props.get(codec.KEY_ID)
        claimed = claimed if isinstance(claimed, str) else None
        reason = "an inter-router open on a client listener (routers connect to an inter-router listener)"
        log.warning("connection %d (%s) refused: %s (router id %s)", conn.conn_id, conn.peer, reason, printable(repr(claimed)))
        self.eventlog.append("peer-refused", self.engine.now, {"peer": claimed, "conn": conn.conn_id, "reason": reason})
        conn.refused = True
        self.engine.close_connection(conn, UNAUTHORIZED, reason)
        return True

    # ================================================================== stats
    def counts(self) -> dict:
        return {
            "peer_links": len(self._links),
            "peers_up": sum(len(p) for p in self.by_router.values()),
            "handshakes": len(self.handshakes),
            "queued_data": sum(len(p.queue) for ps in self.by_router.values() for p in ps),
        }


def _loss_reason(conn: Conn) -> str:
    """Why a connection ended, for peer-lost: the peer's close condition, else the
    transport's, else ours, else a plain close."""
    for cond in (
        lib.pn_connection_remote_condition(conn.connection),
        lib.pn_transport_condition(conn.transport),
        lib.pn_connection_condition(conn.connection),
    ):
        name, desc = condition_of(cond)
        if name:
            return f"{name}: {desc}" if desc else name
    return "connection closed"


__all__ = ["InterRouter", "Peer", "DATA_WINDOW", "QUEUE_BOUND", "CONTROL_WINDOW"]
