"""What the adapter keeps per connection and per link, and the proton calls of the
rare path (attach, terminus mirroring, link properties, error conditions).

The hot path (deliveries, flow, dispositions) lives in ``engine.py``; everything
here runs a few times per link or connection, so it may use proton-python's
``Data`` codec and ``PropertyDict`` where that is simpler than raw ``pn_data``.
"""

from __future__ import annotations

import sys
from typing import Any

from cproton_ffi import ffi, lib
from proton._data import Data, Described, PropertyDict, symbol

from router.core.events import PUBLISHER, SUBSCRIBER, LinkAttached
from router.core.resumption import publisher_settles_first
from router.core.selector import NOT_A_STRING, SELECTOR_CODE, SELECTOR_FILTER

_EXPIRY_NAMES = {
    lib.PN_EXPIRE_WITH_LINK: "link-detach",
    lib.PN_EXPIRE_WITH_SESSION: "session-end",
    lib.PN_EXPIRE_WITH_CONNECTION: "connection-close",
    lib.PN_EXPIRE_NEVER: "never",
}

# Endpoint state bits (pn_state_t).
LOCAL_UNINIT = lib.PN_LOCAL_UNINIT
LOCAL_ACTIVE = lib.PN_LOCAL_ACTIVE
LOCAL_CLOSED = lib.PN_LOCAL_CLOSED


class Conn:
    """One accepted socket with its proton transport, connection and collector."""

    __slots__ = (
        "conn_id",
        "sock",
        "fd",
        "peer",
        "transport",
        "transport_address",
        "connection",
        "collector",
        "collector_address",
        "links",
        "reported",
        "closing",
        "dead",
        "lost",
        "want_write",
        "tail_closed",
        "head_closed",
        "tick_at",
        "handshake_at",
        "ir",
        "refused",
        "streaming",
        "tls",
        "user",
        "held",
        "authenticating",
    )

    def __init__(self, conn_id: int, sock, peer: str, transport, connection, collector):
        self.conn_id = conn_id
        self.sock = sock
        self.fd = sock.fileno()
        self.peer = peer
        self.transport = transport
        self.transport_address = int(ffi.cast("uintptr_t", transport))  # for the compiled socket I/O
        self.connection = connection
        self.collector = collector
        self.collector_address = int(ffi.cast("uintptr_t", collector))  # for the compiled fast path
        self.links: dict[int, Link] = {}  # link_id -> Link, links of this connection we track
        self.reported = False  # the core has heard of this connection (a LinkAttached named it)
        self.closing = False  # we closed the AMQP connection (error, shutdown)
        self.dead = False  # the transport is closed: tear down after the current batch
        self.lost = False  # ConnectionLost already told
        self.want_write = False  # output is waiting for the socket to drain
        self.tail_closed = False
        self.head_closed = False
        self.tick_at = 0  # next pn_transport_tick deadline, monotonic ms (0: none)
        self.handshake_at = 0  # until proton runs its own idle timer: cut the peer at this time
        self.ir: Any = None  # inter-router connections: their interrouter.Peer (None: a client connection)
        self.refused = False  # a client connection closed at open (it claimed to be a router)
        self.streaming: set = set()  # its links with large messages going out (streaming.py)
        self.tls = False  # the transport speaks TLS (tls.py)
        self.user: str | None = None  # who the client is, for the policy (set at open when there is one)
        self.held = False  # a failed login: its answer waits (Server._hold_answer)
        self.authenticating = False  # a password login may still fail (until the AMQP open)

    def __repr__(self) -> str:
        return f"<Conn {self.conn_id} {self.peer}>"


class Link:
    """A link the adapter has reported to the core (or refused)."""

    __slots__ = (
        "link_id",
        "conn",
        "ptr",
        "ptr_address",
        "is_receiver",
        "name",
        "address",
        "core_attached",
        "out",
        "rx_d",
        "rx_buf",
        "rx_handle",
        "rx_tag",
        "rx_settled",
        "rx_size",
        "streams",
        "management",
        "max_size",
        "counted",
        "selector",
        "settles_first",
    )

    def __init__(self, link_id: int, conn: Conn, ptr, is_receiver: bool, name: str, max_size: int = 0):
        self.link_id = link_id
        self.conn = conn
        self.ptr = ptr
        self.ptr_address = 0  # ptr as an integer, for the compiled fast path (0: not noted)
        self.is_receiver = is_receiver  # our end receives: the peer is a publisher
        self.name = name
        self.address: str | None = None  # the topic its attach named (for the logs)
        # The core believes this link is attached: it accepted the LinkAttached and has
        # not seen a LinkDetached nor issued a DetachLink for it.
        self.core_attached = False
        # Sender links: our unsettled outgoing deliveries, tag -> the pn_delivery's
        # address (an int: what the compiled path has; pn._cast_delivery gives the cdata).
        self.out: dict[bytes, int] = {}
        # Receiver links: the delivery being received over several transfers.
        self.rx_d = None  # its pn_delivery (None: no multi-frame delivery in progress)
        self.rx_buf: bytearray | None = None  # its bytes so far (None once it is too large)
        self.rx_handle: int | None = None  # set once reported as MessageTooLarge
        self.rx_tag = b""
        self.rx_settled = False
        self.rx_size = 0
        # Sender links: messages going out piece by piece, and what queued behind them
        # (streaming.py); None until the first large one.
        self.streams = None
        # "requests" or "replies" for a link of the $management node (management.py),
        # which the adapter answers itself; None for every other link.
        self.management: str | None = None
        # Receiver links: the largest message its publisher may send (the router's
        # limit, or its user's lower one: [policy]).
        self.max_size = max_size
        self.counted = False  # held against its user's max_links ([policy])
        self.selector: tuple[Any, str] | None = None  # sender links: (filter key, JMS selector) its source asked for
        # Receiver links: the router settles its deliveries with their outcome
        # (rcv-settle-mode first), decided at attach (resumption.publisher_settles_first).
        self.settles_first = False

    def __repr__(self) -> str:
        return f"<Link {self.link_id} {self.name!r} on conn {self.conn.conn_id}>"


def cstr(ptr) -> str | None:
    """A C string from proton as str (None for NULL)."""
    if ptr == ffi.NULL:
        return None
    return ffi.string(ptr).decode("utf-8", "replace")


def _plain(value):
    """proton-decoded AMQP values as plain Python: symbol -> str, memoryview -> bytes."""
    if isinstance(value, dict):
        return {_plain(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, memoryview):
        return bytes(value)
    if isinstance(value, str) and type(value) is not str:
        return str(value)
    return value


def decode_properties(data_ptr) -> dict | None:
    """Decode a link-properties ``pn_data_t`` into a dict; None when absent or when
    proton-python cannot decode it (maps with binary keys)."""
    if data_ptr == ffi.NULL:
        return None
    try:
        data = Data(data_ptr)
        data.rewind()
        if not data.next():
            return None
        obj = data.get_object()
        data.rewind()
    except Exception:  # proton-python's decoder fails on e.g. binary map keys
        return None
    if not isinstance(obj, dict):
        return None
    return _plain(obj)


def encode_properties(props: dict, data_ptr) -> None:
    """Write a dict as link properties (AMQP wants symbol keys)."""
    fixed = PropertyDict({symbol(k) if isinstance(k, str) else k: v for k, v in props.items()}, raise_on_error=False)
    data = Data(data_ptr)
    data.clear()
    data.put_object(fixed)


def set_failover_list(connection_ptr, addresses) -> None:
    """Offer other routers to a client in our open frame, as qpid-dispatch and
    Artemis do: ``failover-server-list`` = [{network-host, port, scheme, hostname}];
    scheme ``amqps`` for a listener that needs TLS."""
    servers = [
        {symbol("network-host"): host, symbol("port"): str(port), symbol("scheme"): scheme, symbol("hostname"): host}
        for host, port, scheme in addresses
    ]
    data = Data(lib.pn_connection_properties(connection_ptr))
    data.clear()
    data.put_object({symbol("failover-server-list"): servers})


def set_condition(cond_ptr, name: str | None, description: str | None) -> None:
    if name:
        lib.pn_condition_set_name(cond_ptr, name.encode("utf-8"))
        if description:
            lib.pn_condition_set_description(cond_ptr, description.encode("utf-8"))


LOG_TEXT_LIMIT = 160  # characters of a peer's text in one log line (before "... (N more characters)")


def printable(text, limit: int = LOG_TEXT_LIMIT) -> str:
    """A peer's text (a condition's description, a link name, an address) fit for one
    log line: non-printable characters escaped (\\xNN, \\uNNNN) and at most ``limit``
    characters kept, then how many more there were. proton's "Unknown protocol detected"
    quotes every byte a non-AMQP client sent: one such line was 1,149 characters."""
    if text is None:
        return "-"
    text = str(text)
    out: list[str] = []
    size = 0
    for index, char in enumerate(text):
        unit = (
            char
            if char.isprintable()
            else (
                f"\\x{ord(char):02x}"
                if ord(char) < 0x100
                else f"\\u{ord(char):04x}"
                if ord(char) < 0x10000
                else f"\\U{ord(char):08x}"
            )
        )
        if size + len(unit) > limit:
            kept = "".join(out)
            more = len(text) - index
            tail = kept[-3:]
            if "\\" in tail:  # do not end inside an escape the peer's text already had (proton's \\x0d)
                cut = len(tail) - tail.index("\\")  # printable characters of the text, one each
                kept, more = kept[:-cut], more + cut
            return f"{kept}... ({more:,} more characters)"
        out.append(unit)
        size += len(unit)
    return "".join(out)


def condition_of(cond_ptr) -> tuple[str | None, str | None]:
    if cond_ptr == ffi.NULL or not lib.pn_condition_is_set(cond_ptr):
        return None, None
    return cstr(lib.pn_condition_get_name(cond_ptr)), cstr(lib.pn_condition_get_description(cond_ptr))


def read_selector(terminus) -> tuple[Any, str] | None:
    """(its key, its text) of the selector in a source's filter set, else None."""
    data = Data(lib.pn_terminus_filter(terminus))
    try:
        data.rewind()
        if not data.next():
            return None
        filters = data.get_object()
    except Exception:  # a filter set proton-python cannot decode: no selector we could apply
        return None
    finally:
        data.rewind()
    if not isinstance(filters, dict):
        return None
    for key, value in filters.items():
        if isinstance(value, Described) and value.descriptor in (SELECTOR_FILTER, SELECTOR_CODE):
            text = value.value
            return key, str(text) if isinstance(text, str) else NOT_A_STRING + repr(text)[:80]
    return None


def echo_filter(terminus, selector: tuple[Any, str] | None) -> None:
    """Our source's filter set: the selector we apply, and nothing else (AMQP: the
    attach answering a receiver lists the filters the sender applies)."""
    data = Data(lib.pn_terminus_filter(terminus))
    data.clear()
    if selector is not None:
        key, text = selector
        data.put_object({key: Described(symbol(SELECTOR_FILTER), text)})


def attach_event(link: Link, container_id: str, publisher_settle_mode: str = "as-requested") -> LinkAttached:
    """The LinkAttached for a link the peer just attached (AMQP_link_attach);
    ``publisher_settle_mode``: the config's ``publisher_rcv_settle_mode``."""
    ptr = link.ptr
    properties = decode_properties(lib.pn_link_remote_properties(ptr))
    requested = int(lib.pn_link_remote_rcv_settle_mode(ptr))
    link.settles_first = link.is_receiver and publisher_settles_first(
        publisher_settle_mode, requested == lib.PN_RCV_SECOND, properties
    )
    if link.is_receiver:  # the peer sends: a publisher; the address is its target's
        role = PUBLISHER
        terminus = lib.pn_link_remote_target(ptr)
    else:
        role = SUBSCRIBER
        terminus = lib.pn_link_remote_source(ptr)
    if lib.pn_terminus_get_type(terminus) == lib.PN_UNSPECIFIED:
        address = None
    else:
        # Interned: every link of a topic then holds the one str of it, which the core's
        # maps and the adapter's per-topic counts (fastpath.c count_one) compare by identity.
        address = cstr(lib.pn_terminus_get_address(terminus))
        if address is not None:
            address = sys.intern(address)
    if not link.is_receiver:
        link.selector = read_selector(terminus)
    return LinkAttached(
        link_id=link.link_id,
        conn_id=link.conn.conn_id,
        container_id=container_id,
        name=link.name,
        role=role,
        address=address,
        durable=int(lib.pn_terminus_get_durability(terminus)),
        expiry_policy=_EXPIRY_NAMES.get(lib.pn_terminus_get_expiry_policy(terminus), "session-end"),
        timeout=int(lib.pn_terminus_get_timeout(terminus)),
        snd_settle_mode=int(lib.pn_link_remote_snd_settle_mode(ptr)),
        # The mode in use: the receiver chooses it, so for a publisher (our receiving
        # link) it is ours when the router settles with the outcome.
        rcv_settle_mode=lib.PN_RCV_FIRST if link.settles_first else requested,
        properties=properties,
        selector=link.selector[1] if link.selector is not None else None,
    )


def open_link(
    link: Link,
    timeout: int,
    properties: dict | None,
    max_message_size: int,
    settles_first: bool = False,
    presettled: bool = False,
) -> None:
    """CORE_open_link: mirror the peer's termini and settle modes (``presettled``: say
    snd-settle-mode settled, the topic's mode), set our terminus timeout and link
    properties, then send our attach."""
    ptr = link.ptr
    lib.pn_terminus_copy(lib.pn_link_source(ptr), lib.pn_link_remote_source(ptr))
    lib.pn_terminus_copy(lib.pn_link_target(ptr), lib.pn_link_remote_target(ptr))
    # The terminus that lives at the router: the target of a publisher's link, the
    # source of a subscriber's.
    ours = lib.pn_link_target(ptr) if link.is_receiver else lib.pn_link_source(ptr)
    if not link.is_receiver:
        echo_filter(ours, link.selector)
    lib.pn_terminus_set_timeout(ours, timeout)
    lib.pn_link_set_snd_settle_mode(ptr, lib.PN_SND_SETTLED if presettled else lib.pn_link_remote_snd_settle_mode(ptr))
    if link.is_receiver and settles_first:
        lib.pn_link_set_rcv_settle_mode(ptr, lib.PN_RCV_FIRST)
    else:
        lib.pn_link_set_rcv_settle_mode(ptr, lib.pn_link_remote_rcv_settle_mode(ptr))
    if properties:
        encode_properties(properties, lib.pn_link_properties(ptr))
    if link.is_receiver and max_message_size:
        lib.pn_link_set_max_message_size(ptr, max_message_size)
    lib.pn_link_open(ptr)


def detach_link(link: Link, condition: str | None, description: str | None, close: bool) -> None:
    """CORE_detach_link: detach or close with a condition; a link never opened is
    opened first (with no terminus: AMQP's way to refuse an attach)."""
    ptr = link.ptr
    state = lib.pn_link_state(ptr)
    if state & LOCAL_CLOSED:
        return
    set_condition(lib.pn_link_condition(ptr), condition, description)
    if state & LOCAL_UNINIT:
        # Proton gives a link the peer opened empty termini of its kind, which go out
        # as a source and a target with no address: mark them unspecified so that the
        # attach carries null ones, which clients read as "refused".
        lib.pn_terminus_set_type(lib.pn_link_source(ptr), lib.PN_UNSPECIFIED)
        lib.pn_terminus_set_type(lib.pn_link_target(ptr), lib.PN_UNSPECIFIED)
        lib.pn_link_open(ptr)
    if close:
        lib.pn_link_close(ptr)
    else:
        lib.pn_link_detach(ptr)
        lib.pn_link_close(ptr)
