"""Events: what the adapter tells the core has happened (past tense, immutable).

The adapter translates proton engine events into these and feeds them to
``RouterCore.handle(event, now)``. Identifiers are plain ints chosen by the
adapter: ``conn_id`` per connection, ``link_id`` per link (never reused within a
process), ``delivery`` per incoming publisher delivery (valid until the adapter
reports ``PublisherSettled`` or the link goes away).

NamedTuples rather than dataclasses: these are built once per message on the
hot path and NamedTuple construction is the cheapest immutable record Python has.
"""

from __future__ import annotations

from typing import Any, NamedTuple

# Link roles, from the router's point of view of what the peer does.
PUBLISHER = "publisher"  # the peer sends: a sender link whose target is a topic
SUBSCRIBER = "subscriber"  # the peer receives: a receiver link whose source is a topic

# Terminus durability (AMQP terminus-durability).
DURABLE_NONE = 0
DURABLE_CONFIGURATION = 1
DURABLE_UNSETTLED_STATE = 2

# Settle modes (AMQP sender-settle-mode / receiver-settle-mode codes).
SND_UNSETTLED = 0
SND_SETTLED = 1
SND_MIXED = 2
RCV_FIRST = 0
RCV_SECOND = 1


class LinkAttached(NamedTuple):
    """A peer attached a link. ``address`` is the target address for a publisher and
    the source address for a subscriber (None when the peer gave none)."""

    link_id: int
    conn_id: int
    container_id: str
    name: str
    role: str  # PUBLISHER or SUBSCRIBER
    address: str | None
    durable: int = DURABLE_NONE  # the peer's terminus durability (source for a subscriber)
    expiry_policy: str = "session-end"  # link-detach / session-end / connection-close / never
    timeout: int = 0  # the peer's requested terminus timeout, seconds
    snd_settle_mode: int = SND_MIXED
    rcv_settle_mode: int = RCV_FIRST
    properties: dict[str, Any] | None = None  # the attach frame's link properties, decoded
    # A subscriber's JMS selector (its source's apache.org:selector-filter:string), as
    # given; None: every message of the topic. A filter that is not a string is
    # passed as its repr prefixed by "\x00" so that the core refuses it by name.
    selector: str | None = None


class LinkDetached(NamedTuple):
    """The peer detached a link. ``closed`` is the detach frame's closed flag: True
    destroys the terminus (a durable subscription ends), False keeps it resumable."""

    link_id: int
    closed: bool


class ConnectionLost(NamedTuple):
    """A connection ended (closed by the peer, transport error, idle timeout). Every
    link still attached on it is detached without closing its terminus."""

    conn_id: int


class CreditChanged(NamedTuple):
    """A subscriber link's credit as the engine now sees it (after a flow frame)."""

    link_id: int
    credit: int
    drain: bool = False


class MessageReceived(NamedTuple):
    """A complete delivery arrived from a publisher. ``payload`` is the encoded AMQP
    message exactly as sent. ``settled`` is True for a pre-settled (best-effort) send."""

    link_id: int
    delivery: int
    tag: bytes
    payload: bytes
    settled: bool


class MessageTooLarge(NamedTuple):
    """A publisher delivery grew past the router's max message size (or the lower
    ``limit`` its publisher's user has); the adapter discards its bytes and waits
    for the core's outcome for it."""

    link_id: int
    delivery: int
    tag: bytes
    size: int
    settled: bool
    limit: int = 0  # the publisher's own limit, when lower than the router's (0: the router's)


class OutcomeReceived(NamedTuple):
    """A subscriber's disposition for a delivery the router forwarded under ``tag``.

    ``outcome`` is one of the codes in ``router.core.outcomes`` (NONE when the peer
    only settled or sent a non-terminal state)."""

    link_id: int
    tag: bytes
    outcome: int
    settled: bool
    condition: str | None = None
    description: str | None = None
    delivery_failed: bool = False
    undeliverable_here: bool = False


class PublisherSettled(NamedTuple):
    """A publisher settled a delivery (normally after receiving its outcome). The
    adapter settles its own side right after reporting this."""

    link_id: int
    delivery: int


class TimerFired(NamedTuple):
    """Time passed; the core acts on whatever deadline is due. Sent when
    ``RouterCore.next_deadline()`` is reached (and harmless at any other time)."""


class ShutdownRequested(NamedTuple):
    """SIGTERM/SIGINT: stop taking new deliveries and finish or answer the rest
    within ``grace`` seconds."""

    grace: float = 5.0


# ---------------------------------------------------------------- router network


class PeerConnected(NamedTuple):
    """An inter-router connection is up and authenticated, with its control and data
    links attached both ways. ``router_id``/``epoch``/``boot`` are the peer's proven
    identity (docs/inter-router.md)."""

    conn_id: int
    router_id: str
    epoch: int
    boot: str


class PeerLost(NamedTuple):
    """An inter-router connection ended (closed, transport error, idle timeout)."""

    conn_id: int
    router_id: str


class ControlReceived(NamedTuple):
    """Control messages from a neighbour, decoded from one control transfer (a batch).
    Each message is a dict with a type field "t" (docs/inter-router.md)."""

    conn_id: int
    router_id: str
    messages: list[dict[str, Any]]


class DataReceived(NamedTuple):
    """A topic delivery relayed by a neighbour: the routing ``header`` (a dict) and the
    origin-annotated message bytes, exactly as the ingress router forwarded them."""

    conn_id: int
    router_id: str
    tag: bytes
    header: dict[str, Any]
    payload: bytes


class ListenersReady(NamedTuple):
    """The router's client listeners are bound: where clients can reach it. Other
    routers learn these and every router offers them to its clients as the
    ``failover-server-list`` of its open frame."""

    addresses: tuple[tuple[str, int, str], ...]  # ((host, port, scheme), ...): scheme "amqps" where TLS is needed


class ExpireSubscription(NamedTuple):
    """An operator ends a durable subscription whose subscriber is away, now, as
    if its terminus timeout had passed (management: ``eorouter manage
    expire-subscription``). Nothing happens when ``key`` names no subscription or
    one that is attached (the adapter refuses those before asking)."""

    key: str


# Every event the core handles (``RouterCore.handle``).
Event = (
    LinkAttached
    | LinkDetached
    | ConnectionLost
    | CreditChanged
    | MessageReceived
    | MessageTooLarge
    | OutcomeReceived
    | PublisherSettled
    | TimerFired
    | ShutdownRequested
    | PeerConnected
    | PeerLost
    | ControlReceived
    | DataReceived
    | ListenersReady
    | ExpireSubscription
)
