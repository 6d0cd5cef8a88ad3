"""Translation between proton's engine and the core, in both directions.

Inbound, ``AMQP_*``: drain a connection's ``pn_collector`` and turn engine events
into core events (``LinkAttached``, ``MessageReceived``, ``OutcomeReceived``...).
Outbound, ``CORE_*``: execute the commands ``core.handle()`` returns as proton
calls (``Forward`` -> ``pn_delivery``/``pn_link_send``/``pn_link_advance``...).
The two halves are kept apart the way qpid-dispatch's ``router_node.c`` keeps its
``AMQP_*`` and ``CORE_*`` functions apart. Nothing here decides anything: every
decision is the core's.

Hot path rules (see docs in /work/shared/notes/performance.md): raw ``cproton_ffi``
calls, ``if``/``elif`` on event type ints, no proton ``Event``/``Wrapper`` objects,
payload bytes passed through untouched, one reusable receive buffer.

Handles: ``link_id`` and the publisher-delivery ``delivery`` handle are ints from
process-wide counters, never reused. Maps: ``_links_by_ptr`` (pn_link -> Link),
``_links`` (link_id -> Link), ``_incoming`` (a pn_delivery's address -> handle) and
``_handles`` (handle -> (that address, Link)) for unsettled publisher deliveries the
core knows (an address: an int, what the compiled path has; pn._cast_delivery gives
the cdata); each subscriber Link's ``out`` (tag -> pn_delivery's address) for our
unsettled copies on it, and ``_seen`` (that address -> (state, settled)) for the few of those
whose subscriber answered without settling (what was last read, so a repeated frame
is not news). A copy costs one dict entry: at K subscribers, exactly-once holds
~K x 1000 of them.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from cproton_ffi import ffi, lib

from router.adapter import endpoints, fastpath, sasl, streaming, tls
from router.adapter.endpoints import Conn, Link, condition_of, cstr, printable, set_condition
from router.adapter.interrouter import InterRouter
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
    _address_of,
    _cast_delivery,
    _collector_peek,
    _collector_pop,
    _delivery_aborted,
    _delivery_link,
    _delivery_new,
    _delivery_partial,
    _delivery_pending,
    _delivery_readable,
    _delivery_remote_state,
    _delivery_settle,
    _delivery_settled,
    _delivery_tag,
    _delivery_update,
    _event_delivery,
    _event_link,
    _event_type,
    _from_buffer,
    _link_advance,
    _link_credit,
    _link_flow,
    _link_get_drain,
    _link_recv,
    _link_send,
    _unpack,
)
from router.adapter.streaming import STREAM_MIN
from router.core import outcomes
from router.core.announcements import SubscriberKey
from router.core.commands import (
    Completed,
    DetachLink,
    Drained,
    Forward,
    GrantCredit,
    Log,
    OpenLink,
    Received,
    SendControl,
    SendData,
    SendOutcome,
    SettleOutgoing,
    ShutdownComplete,
    SubOutcome,
    SubOutcomes,
)
from router.core.errors import ProtocolError
from router.core.events import (
    ConnectionLost,
    CreditChanged,
    ExpireSubscription,
    LinkDetached,
    MessageReceived,
    MessageTooLarge,
    OutcomeReceived,
    PublisherSettled,
)
from router.policy import ANONYMOUS

if TYPE_CHECKING:  # (management.py imports this module's neighbours; typing only)
    from router.adapter.management import Management
    from router.policy import Policy

log = logging.getLogger("eorouter.adapter")

# Engine event types (ints, compared with ==).

#: Log kinds counted for metrics, each with what its count is keyed by (besides the kind).
_COUNTED = {
    "link-attached": lambda f: ("link-attached", f.get("role"), bool(f.get("resumed"))),
    "resume-requested": lambda f: ("resume-requested", f.get("role"), bool(f.get("incomplete"))),
    "peer-restarted": lambda f: ("peer-restarted", f.get("peer")),
    "announce-timeout": lambda f: ("announce-timeout",),
    "origin-taken-over": lambda f: ("origin-taken-over",),
    "subscription-expired": lambda f: ("subscription-expired",),
}
#: the same kinds, as the compiled log writer takes them (frozen: it keeps its answers per set)
_COUNTED_KINDS = frozenset(_COUNTED)

ACCEPTED = outcomes.ACCEPTED
REJECTED = outcomes.REJECTED
RELEASED = outcomes.RELEASED
MODIFIED = outcomes.MODIFIED
NONE = outcomes.NONE
_TERMINAL = outcomes.TERMINAL
_NOTHING_SEEN = (0, False)  # a copy's (remote state, settled) until its subscriber answers

INTERNAL_ERROR = "amqp:internal-error"
UNAUTHORIZED = "amqp:unauthorized-access"
RESOURCE_LIMIT = "amqp:resource-limit-exceeded"
RESERVED_PREFIX = "_eorouter/"  # the inter-router protocol's addresses: never a client's
NULL = ffi.NULL

# Events and commands are NamedTuples; tuple.__new__(Cls, values) builds one without
# the Python-level __new__ a NamedTuple call runs (~0.1 µs less each, and the hot
# path builds a few per message). Every field is given, defaults included.
_new = tuple.__new__


class Engine:
    """Drives proton's engine for every connection of one router process."""

    # What the compiled path reads and writes per message, in plain slots (by offset,
    # router/core/_attrs.h); everything else in the instance's dict.
    __slots__ = ("now", "_last_handle", "_small", "__dict__", "__weakref__")

    def __init__(
        self,
        core,
        eventlog,
        *,
        max_message_size: int,
        router_id: str = "router",
        secret: str | None = None,
        handshake_timeout: float = 10.0,
    ):
        self.core = core
        self.eventlog = eventlog
        self.silent: list[Conn] = []  # idle timeout expired: the server cuts these at once
        self.max_message_size = max_message_size
        settings = getattr(core, "settings", None)  # a test's stand-in core may have none
        self.publisher_settle_mode = "first" if settings is None else settings.publisher_rcv_settle_mode
        self.now = 0.0  # set by the loop once per iteration (one timestamp per iteration)
        self.touched: set[Conn] = set()  # connections that got engine work during this batch
        self.opened: list[Conn] = []  # connections whose peer's open frame just arrived
        self.shutdown_complete = False
        self._links_by_ptr: dict = {}
        self._links: dict[int, Link] = {}
        self._incoming: dict = {}
        self._handles: dict[int, tuple] = {}
        self._seen: dict = {}
        self._last_link_id = 0
        self._last_handle = 0
        self._rbuf_size = 64 * 1024
        self._rbuf = ffi.new("char[]", self._rbuf_size)
        # Inter-router connections (and the refusals on client listeners).
        self.peers = InterRouter(
            self,
            router_id=router_id,
            epoch=eventlog.epoch,
            boot=eventlog.boot_id,
            secret=secret,
            max_message_size=max_message_size,
            handshake_timeout=handshake_timeout,
        )
        # Per topic (a link's address), for metrics (router/adapter/metrics.py): copies
        # sent to subscribers, and the outcomes publishers were told, by outcome code.
        self.copies_sent: dict[str | None, int] = {}
        self.outcomes_told: dict[tuple[str | None, int], int] = {}
        # (after the maps above: the compiled commands hold them)
        self._command_handlers = self._command_table()
        self._event_handlers = self._event_table()
        self._small: bytes | None = None
        # Publishers' messages from take_messages to the core and their commands executed
        # by the compiled path, when built (its twin: _messages_batch's loop). (A test's
        # stand-in core may have only handle(), or not even that.)
        handle_message = getattr(core, "handle_message", None) or getattr(core, "handle", None)
        self._deliver_messages = handle_message and fastpath.message_deliverer(
            (
                self,
                self._links,
                self._incoming,
                self._handles,
                MessageReceived,
                handle_message,
                self._command_handlers,
                self._refused,
                self._message_failed,
                ProtocolError,
            )
        )
        # Subscribers' accepted answers (take_accepted's) to the core and its commands
        # carried out by the compiled path, when built (its twin: _accepted_batch).
        core_accepted_batch = getattr(core, "accepted_batch", None)
        self._deliver_answers = core_accepted_batch and fastpath.answer_deliverer(
            (self, core_accepted_batch, eventlog, SubOutcomes, self._command_handlers, self._answers_failed)
        )
        # Subscribers' flow frames (their credit) to the core and its commands carried
        # out by the compiled path, when built (its twin: AMQP_link_flow and dispatch).
        core_handle = getattr(core, "handle", None)
        self._take_flows = core_handle and fastpath.flow_taker(
            (self, self._links, CreditChanged, core_handle, self._command_handlers, self._refused, ProtocolError, PN_LINK_FLOW)
        )
        self.management: Management | None = None  # the $management node (management.py), set by the Server
        self.policy: Policy | None = None  # the config's [policy] (router/policy.py), set by the Server
        self.connections_of: dict[str, int] = {}  # user -> open client connections (the policy's limit)
        self.links_of: dict[str, int] = {}  # user -> links it holds (the policy's max_links)
        # Events operators follow, by what tells them apart (_COUNTED): attaches
        # (resumed or not), resumptions, peers connecting, restarting, lost, ...
        self.happenings: dict[tuple, int] = {}
        self.realm: str | None = None  # [sasl] realm: users log in as name@realm, the policy sees name

    # ------------------------------------------------------------------ stats / tests
    def counts(self) -> dict:
        """Sizes of the adapter's maps (a leak shows here first)."""
        return {
            "links": len(self._links),
            "incoming": len(self._incoming),
            "outgoing": sum(len(link.out) for link in self._links.values()),
            "outgoing_seen": len(self._seen),
            **self.peers.counts(),
        }

    # ================================================================== inbound: AMQP_*
    def drain(self, conn: Conn) -> None:
        """Process every pending engine event of one connection."""
        if conn.ir is not None:
            self.peers.drain(conn)
            return
        collector = conn.collector
        amqp_delivery = self.AMQP_delivery
        handlers = self._event_handlers
        links_by_ptr = self._links_by_ptr
        seen = self._seen
        # Subscribers' accepted dispositions, gathered here and given to the core
        # together (_accepted_batch) before any other event of this connection and at
        # the end: one tight loop of engine calls, then one of core calls, instead of
        # alternating the two per copy. At K subscribers this is K-1 of every K events,
        # and alternating them evicted each other's code from the CPU's caches
        # (docs/benchmarks.md, "Batching by phase").
        accepted: list = []
        answer = self._deliver_answers or self._accepted_batch  # (the compiled twin when built)
        # The usual one (accepted and settled at once) in one compiled call per run of
        # them, when built (fastpath.py); what it leaves at the head, the loop below.
        take_accepted = fastpath.take_accepted
        take_messages = fastpath.take_messages
        take_flows = self._take_flows
        collector_address = conn.collector_address
        if take_accepted is not None:
            links = self._links
            messages: list = []
        while not conn.dead:
            if take_accepted is not None and take_messages is not None:
                try:
                    take_accepted(collector_address, links, seen, accepted)
                    # Publishers' whole messages next (AMQP_delivery's usual case).
                    took = take_messages(collector_address, links, messages)
                except Exception as exc:  # out of memory, or a broken invariant: this connection ends
                    log.exception("connection %d (%s): error in the compiled fast path", conn.conn_id, conn.peer)
                    self.close_connection(conn, INTERNAL_ERROR, f"{type(exc).__name__}: {exc}"[:200])
                    break  # the dispositions it consumed before failing still go to the core, below
                if took:  # to the core after the dispositions that came before them
                    if accepted:
                        answer(accepted, conn)
                        accepted = []
                    self._messages_batch(messages, conn)
                    continue
            if take_flows is not None:  # subscribers' credit (AMQP_link_flow's usual case), compiled
                try:
                    flows = take_flows(collector_address, conn, bool(accepted))
                    if flows < 0:  # one is next, after the answers read before it
                        answer(accepted, conn)
                        accepted = []
                        if conn.dead:
                            break
                        flows = take_flows(collector_address, conn, False)
                except Exception as exc:  # the core failed on one (it is consumed): as for any event below
                    log.exception("connection %d (%s): error handling engine event PN_LINK_FLOW", conn.conn_id, conn.peer)
                    self.close_connection(conn, INTERNAL_ERROR, f"{type(exc).__name__}: {exc}"[:200])
                    continue
                if flows:
                    continue
            event = _collector_peek(collector)
            if event == NULL:
                break
            # NULL unless a PN_DELIVERY event: the usual event needs no type lookup.
            d = _event_delivery(event)
            link = copy = None
            if d:
                link = links_by_ptr.get(_delivery_link(d))
                if link is not None and not link.is_receiver:  # a copy we sent a subscriber
                    t = _delivery_tag(d)
                    tag = _unpack(t.start, t.size)
                    held = link.out.get(tag)  # its address, while held
                    if held is not None and held == _address_of(d):  # (else: settled and forgotten, stale)
                        state = _delivery_remote_state(d)
                        settled = _delivery_settled(d)
                        last = seen.get(held, _NOTHING_SEEN) if seen else _NOTHING_SEEN
                        if state == last[0] and settled == last[1]:
                            _collector_pop(collector)
                            continue  # nothing new (proton raises one event per frame touching it)
                        if state == ACCEPTED:
                            if settled:  # _subscriber_settled, inlined
                                del link.out[tag]
                                if last is not _NOTHING_SEEN:
                                    del seen[held]
                                _delivery_settle(d)
                            else:
                                seen[held] = (state, settled)
                            accepted += (link.link_id, tag, settled)
                            _collector_pop(collector)
                            continue
                        copy = (tag, state, settled, held)
            if accepted:  # in order: what came before this event first
                answer(accepted, conn)
                accepted = []
                if conn.dead:
                    break
            etype = _event_type(event)
            try:
                if etype == PN_DELIVERY:
                    if copy is not None:
                        self.AMQP_disposition(d, link, *copy)  # type: ignore[arg-type]  # a copy's link is known
                    else:
                        amqp_delivery(d, conn, link)
                else:
                    handler = handlers.get(etype)
                    if handler is not None:
                        handler(event, conn)
            except Exception as exc:  # a bad peer (or a bug) ends this connection, not the router
                log.exception(
                    "connection %d (%s): error handling engine event %s",
                    conn.conn_id,
                    conn.peer,
                    cstr(lib.pn_event_type_name(etype)),
                )
                self.close_connection(conn, INTERNAL_ERROR, f"{type(exc).__name__}: {exc}"[:200])
            _collector_pop(collector)
        if accepted:
            answer(accepted, conn)

    def _event_table(self) -> dict:
        """The engine events other than a delivery's, each to its ``AMQP_*`` method
        (called with the event and its connection); events not listed are ignored."""
        return {
            PN_LINK_FLOW: lambda event, conn: self.AMQP_link_flow(_event_link(event)),
            PN_LINK_REMOTE_OPEN: lambda event, conn: self.AMQP_link_attach(_event_link(event), conn),
            PN_LINK_REMOTE_DETACH: lambda event, conn: self.AMQP_link_detach(_event_link(event), False),
            PN_LINK_REMOTE_CLOSE: lambda event, conn: self.AMQP_link_detach(_event_link(event), True),
            PN_SESSION_REMOTE_OPEN: self.AMQP_session_begin,
            PN_SESSION_REMOTE_CLOSE: lambda event, conn: self.AMQP_session_end(lib.pn_event_session(event), conn),
            PN_CONNECTION_REMOTE_OPEN: self.AMQP_connection_open,
            PN_CONNECTION_REMOTE_CLOSE: lambda event, conn: self.AMQP_connection_close(conn),
            PN_TRANSPORT_ERROR: self.AMQP_transport_error,
            PN_TRANSPORT_CLOSED: lambda event, conn: self.AMQP_connection_lost(conn),
        }

    def AMQP_session_begin(self, event, conn: Conn) -> None:
        session = lib.pn_event_session(event)
        if lib.pn_session_state(session) & endpoints.LOCAL_UNINIT:
            lib.pn_session_open(session)

    def AMQP_connection_open(self, event, conn: Conn) -> None:
        self.opened.append(conn)
        conn.authenticating = False  # the login, if any, is behind it
        if self.peers.refuse_router_open(conn):
            return  # it claimed to be a router: closed with unauthorized-access
        if self.policy is not None and not self._admit(conn):
            return
        if lib.pn_connection_state(conn.connection) & endpoints.LOCAL_UNINIT:
            endpoints.set_failover_list(conn.connection, self.core.failover_list())
            lib.pn_connection_open(conn.connection)

    def _admit(self, conn: Conn) -> bool:
        """Who the client is (the user a password login named, else its certificate's
        common name, else anonymous), and whether the policy lets it hold one more
        connection."""
        policy = self.policy
        assert policy is not None  # asked only when there is one
        user = (
            sasl.password_user(conn.transport, self.realm)
            or (tls.peer_common_name(conn.transport) if conn.tls else None)
            or ANONYMOUS
        )
        conn.user = user
        limit, group = policy.max_connections(user)
        held = self.connections_of.get(user, 0)
        if limit is not None and held >= limit:
            why = (
                f"{policy.describe(user)} may hold {limit} connection(s) (group {group}); it holds {held}"
                if group
                else f"{policy.describe(user)} may not connect: no group of the policy admits it"
            )
            log.info("connection %d (%s) refused: %s", conn.conn_id, conn.peer, why)
            self.happened(("connection-refused", "limit" if group else "unauthorized"))
            conn.user = None  # not counted
            self.close_connection(conn, RESOURCE_LIMIT if group else UNAUTHORIZED, why)
            return False
        self.connections_of[user] = held + 1
        return True

    def _authorized(self, link: Link, address: str | None) -> bool:
        """The policy's verdict on an attach (a publisher's or subscriber's topic, or
        the $management node); a refusal detaches the link, naming the rule."""
        user = link.conn.user or ANONYMOUS
        policy = self.policy
        assert policy is not None  # asked only when there is one
        if link.management is not None or (self.management is not None and self.management.wants(link, address)):
            if policy.is_admin(user):
                return self._within_limits(link, user)
            why = f"{policy.describe(user)} may not use $management (no admin group)"
        elif address is None:
            return True  # the core refuses a link without a topic, with its own reason
        elif link.is_receiver:
            if policy.may_publish(user, address):
                return self._within_limits(link, user)
            why = f"{policy.describe(user)} may not publish to {address!r}: no publish rule of its groups matches"
        else:
            if policy.may_subscribe(user, address):
                return self._within_limits(link, user)
            why = f"{policy.describe(user)} may not subscribe to {address!r}: no subscribe rule of its groups matches"
        self._refuse_attach(link, UNAUTHORIZED, why)
        return False

    def _within_limits(self, link: Link, user: str) -> bool:
        """The user's link limit (the link then counts against it until it ends) and,
        for a publisher, its largest message."""
        policy = self.policy
        assert policy is not None
        limit, group = policy.limit(user, "max_links")
        held = self.links_of.get(user, 0)
        if limit is not None and held >= limit:
            why = f"{policy.describe(user)} may hold {limit} link(s) (group {group}); it holds {held}"
            log.info("link %d %r refused: %s", link.link_id, link.name, why)
            self._refuse_attach(link, RESOURCE_LIMIT, why)
            return False
        self.links_of[user] = held + 1
        link.counted = True
        if link.is_receiver:
            size, _ = policy.limit(user, "max_message_size")
            if size is not None and size < link.max_size:
                link.max_size = size
        return True

    def _own_limit(self, link: Link) -> int:
        """A publisher's message size limit when its user's is lower than the router's (0: the router's)."""
        return link.max_size if link.max_size < self.max_message_size else 0

    def login_failed(self, conn: Conn) -> None:
        """A client's credentials did not check out (the Server holds the answer)."""
        mech = sasl.mechanism(conn.transport) or "none"
        _, desc = condition_of(lib.pn_transport_condition(conn.transport))
        why = f": {printable(desc)}" if desc else ""
        log.warning("connection %d (%s): login failed (%s)%s", conn.conn_id, conn.peer, mech, why)
        self.happened(("login-failed", mech))

    def AMQP_transport_error(self, event, conn: Conn) -> None:
        name, desc = condition_of(lib.pn_transport_condition(conn.transport))
        if sasl.login_failed(conn.transport):
            return  # reported by login_failed, when the server held the answer
        log.info(
            "connection %d (%s): transport error %s: %s", conn.conn_id, conn.peer, name, printable(desc)
        )  # a bounded, escaped prefix of what a non-AMQP peer sent
        if desc and "idle-timeout" in desc:
            # The peer is silent: the close frame proton queued may never
            # leave (on a cut link the socket's send buffer is full), and
            # waiting for it would delay failover by TCP's retry time.
            self.silent.append(conn)

    def _accepted_batch(self, items: list, conn: Conn) -> None:
        """The core's part of accepted dispositions the adapter has already recorded:
        ``items`` is [link_id, tag, settled, link_id, ...], in arrival order, all of
        ``conn``. The commands of the items before a failing one are still carried out;
        the failure ends the connection (the disposition came from its peer)."""
        out: list = []
        try:
            self.core.accepted_batch(items, self.now, out)
        except Exception as exc:
            self._answers_failed(out, exc, conn)
            return
        if len(out) == 1:
            cmd = out[0]
            if cmd.__class__ is SubOutcomes:  # the usual answer at K > 1: its lines only
                self.eventlog.append_sub_outcomes(self.now, cmd.deliveries, cmd.subscriber, cmd.outcome, cmd.settled)
                return
        if out:
            self.execute(out)

    def _answers_failed(self, out: list, exc: Exception, conn: Conn) -> None:
        """The core's accepted_batch raised ``exc`` after adding ``out``: those commands
        are carried out, the error logged, and the connection the answers came from
        closed (a ProtocolError with its condition, anything else as an internal error)."""
        if out:
            self.execute(out)
        condition = exc.condition if isinstance(exc, ProtocolError) else INTERNAL_ERROR
        log.log(
            logging.INFO if isinstance(exc, ProtocolError) else logging.ERROR,
            "connection %d (%s): error handling accepted dispositions",
            conn.conn_id,
            conn.peer,
            exc_info=exc,
        )
        self.close_connection(conn, condition, f"{type(exc).__name__}: {exc}"[:200])

    def AMQP_delivery(self, d, conn: Conn, link: Link | None) -> None:
        """A delivery event that is not news on a copy we hold (drain() handles those):
        a publisher's message or settlement, or a stale event. ``link``: the Link of
        the delivery's link, as drain() looked it up (None: not one we track)."""
        # Known deliveries first (one dict lookup): an address is in this map only
        # while the delivery is unsettled on our side, so it cannot be stale.
        address = _address_of(d)
        handle = self._incoming.get(address)
        if handle is not None:  # a publisher delivery the core has
            link = self._handles[handle][1]
            if link.rx_d is not None and d == link.rx_d:
                self._receive_more(d, link)  # too large, still arriving
            elif _delivery_settled(d):
                self._publisher_settled(handle, d, link)
            return
        if link is None or not link.is_receiver:
            return  # a link we no longer track, or our pre-settled/settled sends
        if link.rx_d is not None and d == link.rx_d:
            self._receive_more(d, link)
            return
        if not _delivery_readable(d):  # already settled and advanced past: stale event
            return
        if not link.core_attached:
            if link.management is not None and self.management is not None:
                self.management.request(d, link)  # a request to $management
                return
            _delivery_settle(d)  # a link the router closed: drop what still arrives
            return
        if _delivery_aborted(d):
            _delivery_settle(d)
            _link_flow(link.ptr, 1)  # the core never saw it: give its credit back
            return
        lp = link.ptr
        n = _delivery_pending(d)
        if _delivery_partial(d):
            link.rx_d = d
            link.rx_buf = bytearray()
            link.rx_handle = None
            t = _delivery_tag(d)
            link.rx_tag = _unpack(t.start, t.size)
            link.rx_settled = False
            link.rx_size = 0
            self._receive_more(d, link)
            return
        # The common case: the whole message is here.
        t = _delivery_tag(d)
        tag = _unpack(t.start, t.size)
        settled = _delivery_settled(d)  # a C _Bool: cffi gives a Python bool
        if n > link.max_size:
            self._last_handle = handle = self._last_handle + 1
            limit = self._own_limit(link)
            if settled:  # pre-settled: nobody waits for an outcome
                self.dispatch(MessageTooLarge(link.link_id, handle, tag, n, True, limit), conn, link)
                _delivery_settle(d)
                return
            self._incoming[address] = handle
            self._handles[handle] = (address, link)
            self.dispatch(MessageTooLarge(link.link_id, handle, tag, n, False, limit), conn, link)
            if handle in self._handles:  # not settled by the core yet: move past its bytes
                _link_advance(lp)
            return
        if n > self._rbuf_size:
            self._grow(n)
        got = _link_recv(lp, self._rbuf, n)
        payload = _unpack(self._rbuf, got) if got > 0 else b""
        _link_advance(lp)
        self._last_handle = handle = self._last_handle + 1
        if settled:
            self.dispatch(_new(MessageReceived, (link.link_id, handle, tag, payload, True)), conn, link)
            _delivery_settle(d)  # pre-settled: settle our side once the core has it
            return
        self._incoming[address] = handle
        self._handles[handle] = (address, link)
        self.dispatch(_new(MessageReceived, (link.link_id, handle, tag, payload, False)), conn, link)

    def _messages_batch(self, items: list, conn: Conn) -> None:
        """Publishers' messages the compiled path read (fastpath.take_messages: ``link_id,
        tag, payload, settled, delivery_address`` each), to the core in order, as
        AMQP_delivery() gives one it read; ``items`` is emptied. One that a message
        before it closed the link (or the connection) of is dropped as AMQP_delivery()
        drops what arrives then."""
        if self._deliver_messages is not None:
            try:
                self._deliver_messages(items, conn)
            finally:
                items.clear()
            return
        links = self._links
        dispatch = self.dispatch
        for i in range(0, len(items), 5):
            link_id, tag, payload, settled, address = items[i : i + 5]
            if conn.dead:
                break  # the connection's end frees the rest, never answered: the publisher sends them again
            link = links.get(link_id)
            if link is None or not link.core_attached:
                _delivery_settle(_cast_delivery(address))  # a link the router closed: drop what still arrives
                continue
            self._last_handle = handle = self._last_handle + 1
            try:
                if settled:
                    dispatch(_new(MessageReceived, (link_id, handle, tag, payload, True)), conn, link)
                    _delivery_settle(_cast_delivery(address))  # pre-settled: settle our side once the core has it
                    continue
                self._incoming[address] = handle
                self._handles[handle] = (address, link)
                dispatch(_new(MessageReceived, (link_id, handle, tag, payload, False)), conn, link)
            except Exception as exc:  # a bad peer (or a bug) ends this connection, not the router
                self._message_failed(conn, exc)
        items.clear()

    def _message_failed(self, conn: Conn, exc: Exception) -> None:
        """A publisher's message raised ``exc`` in the core or in its commands: logged,
        and the connection closed (the rest of its batch still handled as it closes)."""
        log.error("connection %d (%s): error handling a message", conn.conn_id, conn.peer, exc_info=exc)
        self.close_connection(conn, INTERNAL_ERROR, f"{type(exc).__name__}: {exc}"[:200])

    def _grow(self, n: int) -> None:
        self._rbuf_size = max(n, 2 * self._rbuf_size)
        self._rbuf = ffi.new("char[]", self._rbuf_size)

    def _receive_more(self, d, link: Link) -> None:
        """A multi-frame delivery: accumulate its bytes, or discard them once it grew
        past the max message size (the core then has it as MessageTooLarge)."""
        if _delivery_aborted(d):  # the publisher gave up on it
            self._aborted(d, link)
            return
        if _delivery_settled(d):
            link.rx_settled = True
        n = _delivery_pending(d)
        if n:
            self._accumulate(d, link, n)
        if link.rx_d is None or _delivery_partial(d):
            return  # settled meanwhile by the core's outcome, or more frames to come
        self._received_whole(d, link)

    def _aborted(self, d, link: Link) -> None:
        handle = link.rx_handle
        link.rx_d = None
        link.rx_buf = None
        _delivery_settle(d)
        if handle is None:
            _link_flow(link.ptr, 1)  # the core never saw it: give its credit back
        elif self._forget_incoming(handle):
            self.dispatch(PublisherSettled(link.link_id, handle), link.conn, link)

    def _accumulate(self, d, link: Link, n: int) -> None:
        """The ``n`` bytes that arrived: kept, or the delivery is now too large (the
        core hears of it once, as MessageTooLarge, and its bytes are dropped)."""
        if n > self._rbuf_size:
            self._grow(n)
        got = _link_recv(link.ptr, self._rbuf, n)
        if got <= 0:
            return
        link.rx_size += got
        if link.rx_buf is None:
            return
        if link.rx_size <= link.max_size:
            link.rx_buf += ffi.buffer(self._rbuf, got)
            return
        link.rx_buf = None
        self._last_handle = handle = self._last_handle + 1
        link.rx_handle = handle
        if not link.rx_settled:
            address = _address_of(d)
            self._incoming[address] = handle
            self._handles[handle] = (address, link)
        self.dispatch(
            MessageTooLarge(link.link_id, handle, link.rx_tag, link.rx_size, link.rx_settled, self._own_limit(link)),
            link.conn,
            link,
        )

    def _received_whole(self, d, link: Link) -> None:
        """Its last frame came: hand the message to the core (or, if it was too
        large, move past its bytes)."""
        link.rx_d = None
        if link.rx_buf is None:  # too large, and now complete
            handle = link.rx_handle
            if handle in self._handles:  # unsettled, the core has it: move past its bytes
                _link_advance(link.ptr)
                if _delivery_settled(d):
                    self._publisher_settled(handle, d, link)
            else:  # reported pre-settled
                _delivery_settle(d)
            return
        payload = bytes(link.rx_buf)
        link.rx_buf = None
        _link_advance(link.ptr)
        self._last_handle = handle = self._last_handle + 1
        if link.rx_settled or _delivery_settled(d):
            self.dispatch(MessageReceived(link.link_id, handle, link.rx_tag, payload, True), link.conn, link)
            _delivery_settle(d)
            return
        address = _address_of(d)
        self._incoming[address] = handle
        self._handles[handle] = (address, link)
        self.dispatch(MessageReceived(link.link_id, handle, link.rx_tag, payload, False), link.conn, link)

    def _publisher_settled(self, handle: int, d, link: Link) -> None:
        if link.rx_d is not None and d == link.rx_d:
            return  # settled mid-transfer: reported when its last frame arrives
        self.dispatch(_new(PublisherSettled, (link.link_id, handle)), link.conn, link)
        if self._forget_incoming(handle):
            _delivery_settle(d)

    def _forget_incoming(self, handle: int) -> bool:
        entry = self._handles.pop(handle, None)
        if entry is None:
            return False
        del self._incoming[entry[0]]
        return True

    def AMQP_disposition(self, d, link: Link, tag: bytes, state: int, settled: bool, address: int) -> None:
        """A subscriber updated a copy we sent and hold (outcome and/or settlement);
        drain() read ``state`` and ``settled`` and found them new. ``address``: the
        delivery's, as the link holds it."""
        settled = bool(settled)
        if settled:
            self._subscriber_settled(d, link, tag, address)
        else:
            self._seen[address] = (state, settled)
        if state == ACCEPTED:
            event = OutcomeReceived(link.link_id, tag, ACCEPTED, settled)
        elif state == RELEASED:
            event = OutcomeReceived(link.link_id, tag, RELEASED, settled)
        elif state == REJECTED:
            name, desc = condition_of(lib.pn_disposition_condition(lib.pn_delivery_remote(d)))
            event = OutcomeReceived(link.link_id, tag, REJECTED, settled, name, desc)
        elif state == MODIFIED:
            remote = lib.pn_delivery_remote(d)
            event = OutcomeReceived(
                link.link_id,
                tag,
                MODIFIED,
                settled,
                None,
                None,
                bool(lib.pn_disposition_is_failed(remote)),
                bool(lib.pn_disposition_is_undeliverable(remote)),
            )
        else:  # received, a transactional state, or no state: not an outcome
            event = OutcomeReceived(link.link_id, tag, NONE, settled)
        self.dispatch(event, link.conn, link)

    def _subscriber_settled(self, d, link: Link, tag: bytes, address: int) -> None:
        """The subscriber settled a copy we sent: it expects nothing more on it, so
        our side is settled now (proton frees it) and forgotten. The core hears of it
        in the OutcomeReceived (settled) that follows and sends no SettleOutgoing for
        it; one that crosses finds nothing and is skipped."""
        link.out.pop(tag, None)
        self._seen.pop(address, None)
        _delivery_settle(d)

    def AMQP_link_flow(self, lp) -> None:
        link = self._links_by_ptr.get(lp)
        if link is None or link.is_receiver or not link.core_attached:
            return
        self.dispatch(CreditChanged(link.link_id, _link_credit(lp), bool(_link_get_drain(lp))), link.conn, link)

    def AMQP_link_attach(self, lp, conn: Conn) -> None:
        if lp in self._links_by_ptr or conn.refused:
            return  # known already, or on a connection refused at open (its close frees it)
        self._last_link_id = link_id = self._last_link_id + 1
        link = Link(link_id, conn, lp, bool(lib.pn_link_is_receiver(lp)), cstr(lib.pn_link_name(lp)) or "", self.max_message_size)
        self._links_by_ptr[lp] = link
        self._links[link_id] = link
        link.ptr_address = fastpath.address(lp)
        # Its accepted dispositions (a subscriber's) or its messages (a publisher's) may take the compiled path.
        fastpath.mark_link(lp, link_id)
        conn.links[link_id] = link
        container_id = cstr(lib.pn_connection_remote_container(conn.connection)) or ""
        event = endpoints.attach_event(link, container_id, self.publisher_settle_mode)
        link.address = event.address
        if self.policy is not None and not self._authorized(link, event.address):
            return
        if self.management is not None and self.management.wants(link, event.address):
            self.management.attach(link, event.address)  # never the core's: the adapter answers it
            self.touched.add(conn)
            return
        if event.address is not None and event.address.startswith(RESERVED_PREFIX):
            # The inter-router protocol's addresses: never a client's, never the core's.
            self._refuse_attach(
                link, UNAUTHORIZED, f"addresses starting with {RESERVED_PREFIX} are reserved for inter-router connections"
            )
            return
        conn.reported = True
        link.core_attached = True
        try:
            commands = self.core.handle(event, self.now)
        except ProtocolError as err:
            link.core_attached = False
            self._refuse_attach(link, err.condition, err.description)
            return
        except Exception:
            link.core_attached = False
            raise
        self.execute(commands)

    def AMQP_link_detach(self, lp, closed: bool) -> None:
        link = self._links_by_ptr.get(lp)
        if link is None:
            return
        if link.core_attached:
            link.core_attached = False
            self.dispatch(LinkDetached(link.link_id, closed), link.conn, None)
        state = lib.pn_link_state(lp)
        if not state & endpoints.LOCAL_CLOSED:  # answer the peer's detach in kind
            if state & endpoints.LOCAL_UNINIT:
                lib.pn_link_open(lp)
            if not closed:
                lib.pn_link_detach(lp)
            lib.pn_link_close(lp)
        self.touched.add(link.conn)
        self._forget_link(link)
        lib.pn_link_free(lp)

    def AMQP_session_end(self, session, conn: Conn) -> None:
        """Ending a session detaches its links (their termini are not closed)."""
        for link in list(conn.links.values()):
            if lib.pn_link_session(link.ptr) == session:
                if link.core_attached:
                    link.core_attached = False
                    self.dispatch(LinkDetached(link.link_id, False), conn, None)
                self._forget_link(link)
        if not lib.pn_session_state(session) & endpoints.LOCAL_CLOSED:
            lib.pn_session_close(session)
        lib.pn_session_free(session)  # frees its links too
        self.touched.add(conn)

    def AMQP_connection_close(self, conn: Conn) -> None:
        name, desc = condition_of(lib.pn_connection_remote_condition(conn.connection))
        if name:
            log.info("connection %d (%s) closed by peer: %s: %s", conn.conn_id, conn.peer, printable(name), printable(desc))
        if not lib.pn_connection_state(conn.connection) & endpoints.LOCAL_CLOSED:
            lib.pn_connection_close(conn.connection)
        self.touched.add(conn)

    def AMQP_connection_lost(self, conn: Conn) -> None:
        """The transport is closed: tell the core (once), forget the links; the loop
        tears the connection down after this batch."""
        if conn.ir is not None:
            self.peers.lost(conn)
            return
        conn.dead = True
        if conn.lost:
            return
        conn.lost = True
        if conn.user is not None and self.connections_of.get(conn.user):
            self.connections_of[conn.user] -= 1
        for link in list(conn.links.values()):
            link.core_attached = False
            self._forget_link(link)
        if conn.reported:
            self.dispatch(ConnectionLost(conn.conn_id), conn, None)

    def _forget_link(self, link: Link) -> None:
        if link.streams is not None:
            streaming.forget(link)
        if link.management is not None and self.management is not None:
            self.management.forget(link)
        if link.counted:
            link.counted = False
            user = link.conn.user or ANONYMOUS
            self.links_of[user] = self.links_of.get(user, 1) - 1
        self._links_by_ptr.pop(link.ptr, None)
        self._links.pop(link.link_id, None)
        link.conn.links.pop(link.link_id, None)
        if self._seen:
            for d in link.out.values():
                self._seen.pop(d, None)
        link.out.clear()
        if link.is_receiver:
            stale = [h for h, (_, owner) in self._handles.items() if owner is link]
            for handle in stale:
                self._forget_incoming(handle)
            link.rx_d = None
            link.rx_buf = None

    # ================================================================== core calls
    def dispatch(self, event, conn: Conn | None, link: Link | None) -> None:
        """Feed one event to the core and execute what it answers. A ProtocolError is
        answered on the link it concerns (or logged when it concerns no link)."""
        try:
            commands = self.core.handle(event, self.now)
        except ProtocolError as err:
            self._refused(event, link, err)
            return
        if commands:
            self.execute(commands)

    def _refused(self, event, link: Link | None, err: ProtocolError) -> None:
        if link is not None and link.link_id in self._links:
            log.info("link %d %r: protocol error %s", link.link_id, link.name, err)
            endpoints.detach_link(link, err.condition, err.description, True)
            self.touched.add(link.conn)
        else:
            log.warning("protocol error on %s: %s", type(event).__name__, err)

    def timer(self, event) -> None:
        """Events that concern no connection (TimerFired, ShutdownRequested)."""
        try:
            commands = self.core.handle(event, self.now)
        except ProtocolError as err:
            log.warning("core refused %s: %s", type(event).__name__, err)
            return
        if commands:
            self.execute(commands)

    # ================================================================== outbound: CORE_*
    def execute(self, commands) -> None:
        """Execute the core's commands in order, each by its ``CORE_*`` method (the
        table ``_command_handlers``, built once)."""
        handlers = self._command_handlers
        self._small = None  # the last payload known to be small: a message's copies share it
        for cmd in commands:
            try:
                handler = handlers[cmd.__class__]
            except KeyError:
                raise TypeError(f"unknown core command {cmd!r}") from None
            handler(cmd)

    def _command_table(self) -> dict:
        encoder = getattr(self.eventlog, "encoder", None)  # a router's EventLog (tests may use stand-ins)
        # A line by the compiled path (EventLog.append inlined), when built and the log is
        # an EventLog (its twin: CORE_log).
        log_writer = (
            fastpath.log_writer((self, self.eventlog, _COUNTED_KINDS, encoder, self.CORE_log)) if encoder else None
        ) or self.CORE_log
        return {
            Log: log_writer,
            # The usual "received" and "completed" lines, tuples: the same writer (its twin: CORE_log).
            Received: log_writer,
            Completed: log_writer,
            SubOutcomes: self.CORE_sub_outcomes,
            SubOutcome: self.CORE_sub_outcome,
            # A small message's copy by the compiled path, when built (its twin: CORE_forward).
            Forward: fastpath.forwarder((self._links, self.copies_sent, self.touched, self.CORE_forward, STREAM_MIN))
            or self.CORE_forward,
            # A publisher's accepted outcome by the compiled path, when built (its twin: CORE_send_outcome).
            SendOutcome: fastpath.outcome_sender(
                (self._handles, self._incoming, self.outcomes_told, self.touched, self.CORE_send_outcome)
            )
            or self.CORE_send_outcome,
            SettleOutgoing: self.CORE_settle_outgoing,
            SendData: self.peers.CORE_send_data,
            SendControl: self.peers.CORE_send_control,
            GrantCredit: self.CORE_grant_credit,
            OpenLink: self.CORE_open_link,
            DetachLink: self.CORE_detach_link,
            Drained: self.CORE_drained,
            ShutdownComplete: self.CORE_shutdown_complete,
        }

    def CORE_log(self, cmd: Log | Received | Completed) -> None:
        kind = cmd.kind
        if kind in _COUNTED:  # the few kinds operators count (a set lookup per line otherwise)
            self.happened(_COUNTED[kind](cmd.fields))
            if kind == "link-attached":
                self._count_failover(cmd.fields)
        self.eventlog.append(kind, self.now, cmd.fields)

    def _count_failover(self, fields: dict) -> None:
        """A subscriber new here that another router announced (attached there, or
        retained there after it left or the router died) came over from there: a
        failover, counted by the router it came from."""
        if fields.get("resumed") or fields.get("role") != "subscriber":
            return
        net = self.core.net
        key = SubscriberKey(fields.get("container") or "", fields.get("name") or "")
        came_from = next((loc.router for loc in net.membership.locations(key) if loc.router != net.self_id), None)
        if came_from is not None:
            self.happened(("failover-in", "subscriber", came_from))

    def happened(self, key: tuple) -> None:
        """Count one of the events operators follow (router/adapter/metrics.py)."""
        self.happenings[key] = self.happenings.get(key, 0) + 1

    def CORE_sub_outcomes(self, cmd: SubOutcomes) -> None:
        """ "sub-outcome" lines, written as one run."""
        self.eventlog.append_sub_outcomes(self.now, cmd.deliveries, cmd.subscriber, cmd.outcome, cmd.settled)

    def CORE_sub_outcome(self, cmd: SubOutcome) -> None:
        """A "sub-outcome" line, built without a dict."""
        self.eventlog.append_sub_outcome(self.now, cmd.delivery, cmd.subscriber, cmd.outcome, cmd.settled)

    def CORE_forward(self, cmd: Forward) -> None:
        link = self._links.get(cmd.link_id)
        if link is None:
            return  # the link went away in this batch; the core hears of it next
        payload = cmd.payload
        if link.streams or (payload is not self._small and len(payload) >= STREAM_MIN):
            # Large: fed to proton piece by piece (streaming.py); or queued behind one that is.
            self.copies_sent[link.address] = self.copies_sent.get(link.address, 0) + 1
            streaming.send(link, cmd.tag, payload, cmd.settled)
            self.touched.add(link.conn)
            return
        self._small = payload
        address = link.address
        self.copies_sent[address] = self.copies_sent.get(address, 0) + 1
        lp = link.ptr
        tag = cmd.tag
        d = _delivery_new(lp, (len(tag), _from_buffer(tag)))
        _link_send(lp, payload, len(payload))
        _link_advance(lp)
        if cmd.settled:
            _delivery_settle(d)
        else:
            link.out[tag] = _address_of(d)
        self.touched.add(link.conn)

    def CORE_send_outcome(self, cmd: SendOutcome) -> None:
        entry = self._handles.get(cmd.delivery)
        if entry is None:
            return  # the publisher's link is gone, or it was pre-settled
        address, link = entry
        d = _cast_delivery(address)
        code = cmd.outcome
        if code:
            told = (link.address, code)
            self.outcomes_told[told] = self.outcomes_told.get(told, 0) + 1
            if code == REJECTED:
                if cmd.condition:
                    cond = lib.pn_disposition_condition(lib.pn_delivery_local(d))
                    set_condition(cond, cmd.condition, cmd.description)
                    # An empty info map rather than none: some clients (Azure's pyamqp)
                    # index the error's third field unconditionally.
                    lib.pn_data_put_map(lib.pn_condition_info(cond))
            elif code == MODIFIED:
                local = lib.pn_delivery_local(d)
                lib.pn_disposition_set_failed(local, cmd.delivery_failed)
                lib.pn_disposition_set_undeliverable(local, cmd.undeliverable_here)
            _delivery_update(d, code)
        if cmd.settle:
            self._forget_incoming(cmd.delivery)
            if link.rx_d is not None and d == link.rx_d:
                link.rx_d = None  # still arriving: proton drops the rest once we settle
                link.rx_buf = None
            _delivery_settle(d)
        self.touched.add(link.conn)

    def CORE_settle_outgoing(self, cmd: SettleOutgoing) -> None:
        link = self._links.get(cmd.link_id)
        if link is None:
            return
        address = link.out.pop(cmd.tag, None) if not link.streams else streaming.settle(link, cmd.tag)
        if address is None:
            return
        d = _cast_delivery(address)
        last = self._seen.pop(address, None) if self._seen else None
        if last is not None and last[0] in _TERMINAL:
            # A rcv-settle-mode=second subscriber waits for our settlement: it carries
            # the outcome it gave, as the final state (a peer such as Azure's client
            # reads the state from this disposition).
            _delivery_update(d, last[0])
        _delivery_settle(d)
        self.touched.add(link.conn)

    def CORE_grant_credit(self, cmd: GrantCredit) -> None:
        link = self._links.get(cmd.link_id)
        if link is not None:
            _link_flow(link.ptr, cmd.credit)
            self.touched.add(link.conn)

    def CORE_drained(self, cmd: Drained) -> None:
        link = self._links.get(cmd.link_id)
        if link is not None:
            lib.pn_link_drained(link.ptr)
            self.touched.add(link.conn)

    def CORE_shutdown_complete(self, cmd: ShutdownComplete) -> None:
        self.shutdown_complete = True

    def CORE_open_link(self, cmd: OpenLink) -> None:
        link = self._links.get(cmd.link_id)
        if link is None:
            return
        endpoints.open_link(
            link, cmd.timeout, cmd.properties, link.max_size, link.settles_first or cmd.settles_first, cmd.presettled
        )
        self.touched.add(link.conn)

    def CORE_detach_link(self, cmd: DetachLink) -> None:
        link = self._links.get(cmd.link_id)
        if link is None:
            return
        link.core_attached = False
        if lib.pn_link_state(link.ptr) & endpoints.LOCAL_UNINIT:  # never opened: the core refused the attach
            self._refuse_attach(link, cmd.condition, cmd.description, cmd.close)
            return
        endpoints.detach_link(link, cmd.condition, cmd.description, cmd.close)
        self.touched.add(link.conn)

    def detach_by_management(self, link: Link, condition: str, description: str) -> None:
        """An operator detaches a client link (management.py): the core hears of it
        as of a detach (not a close: a durable subscription stays), the client gets
        the detach with ``condition``."""
        if link.core_attached:
            link.core_attached = False
            self.dispatch(LinkDetached(link.link_id, False), link.conn, None)
        endpoints.detach_link(link, condition, description, False)
        self.touched.add(link.conn)

    def expire_subscription(self, key: str) -> None:
        """An operator ends a durable subscription whose subscriber is away (management.py)."""
        self.dispatch(ExpireSubscription(key), None, None)

    def _refuse_attach(self, link: Link, condition: str | None, description: str | None, close: bool = True) -> None:
        """Answer an attach with a detach carrying the error, and log it: one line of
        the same form for every refusal, whoever decided it (this adapter, or the core
        with a ProtocolError or a DetachLink before any OpenLink)."""
        conn = link.conn
        log.info(
            "connection %d (%s): refused %s link %s (address %s): %s: %s",
            conn.conn_id,
            conn.peer,
            "publisher" if link.is_receiver else "subscriber",
            printable(repr(link.name)),
            printable(repr(link.address)),
            condition,
            printable(description),
        )
        endpoints.detach_link(link, condition, description, close)
        self.touched.add(conn)

    # ================================================================== connection-wide
    def close_connection(self, conn: Conn, condition: str | None, description: str | None) -> None:
        """Close the AMQP connection (with an error condition, or cleanly with None)."""
        if conn.dead or conn.closing:
            return
        conn.closing = True
        if condition:
            set_condition(lib.pn_connection_condition(conn.connection), condition, description)
        if lib.pn_connection_state(conn.connection) & endpoints.LOCAL_UNINIT:
            lib.pn_connection_open(conn.connection)
        lib.pn_connection_close(conn.connection)
        self.touched.add(conn)
