"""The router's view of publisher links, subscriptions and topics."""

from __future__ import annotations

from bisect import insort
from collections import deque
from operator import attrgetter
from typing import TYPE_CHECKING

from router.core.guarantees import DEFAULT as DEFAULT_GUARANTEE
from router.core.guarantees import Guarantee
from router.core.tags import STREAM_ID_SIZE

if TYPE_CHECKING:
    from router.core.message import OriginTemplate
    from router.core.records import DeliveryRecord, Roster
    from router.core.selector import Selector
    from router.core.settled import StreamSettled


_STREAM_SEQ = attrgetter("stream_seq")


def hold_in_order(held: list[DeliveryRecord], record: DeliveryRecord) -> None:
    """Add ``record`` to a subscription's held-back records of one stream
    (``Subscription.held``), kept in publisher order (stream_seq); usually it goes
    last, but a fulfilled placeholder's delivery may come after later ones."""
    insort(held, record, key=_STREAM_SEQ)


def queue_in_order(queue: deque[DeliveryRecord], record: DeliveryRecord) -> None:
    """Queue ``record`` for a subscriber ahead of the queued records of its publisher
    stream that come after it: a copy addressed to it late (it moved here) may come
    after later ones of the same stream reached it here directly."""
    stream = record.tag[:STREAM_ID_SIZE]
    seq = record.stream_seq
    for index, queued in enumerate(queue):
        if queued.stream_seq > seq and queued.tag[:STREAM_ID_SIZE] == stream:
            queue.insert(index, record)
            return
    queue.append(record)


def in_publisher_order(records: list[DeliveryRecord]) -> list[DeliveryRecord]:
    """``records`` (in arrival order) with each publisher stream's in publisher order
    (stream_seq), the streams' interleaving kept. Usually the same list: a stream's
    deliveries come in its order, but one that came here from its new origin after
    its publisher resumed may have come after later ones its old origin sent us.
    (Queued in arrival order on a subscriber's return, they went out so: found by the
    generated histories.)"""
    last: dict[bytes, int] = {}
    for record in records:
        stream = record.tag[:STREAM_ID_SIZE]
        seq = record.stream_seq
        if seq < last.get(stream, -1):
            break
        last[stream] = seq
    else:
        return records
    streams: dict[bytes, list[DeliveryRecord]] = {}
    for record in records:
        streams.setdefault(record.tag[:STREAM_ID_SIZE], []).append(record)
    ordered = {stream: iter(sorted(group, key=_STREAM_SEQ)) for stream, group in streams.items()}
    return [next(ordered[record.tag[:STREAM_ID_SIZE]]) for record in records]


def release_in_order(queue: deque[DeliveryRecord], held: list[DeliveryRecord], stream: bytes) -> None:
    """Put a stream's records held back behind placeholders (``held``, in publisher order)
    at the head of a subscriber's queue, merged with what of the same stream waits in the
    queue: a copy passed on to a subscriber that moved here is queued when it comes, and
    when that was before the placeholders were made (the origin's answer naming later
    deliveries came after it) and the subscriber could not be sent it meanwhile, it comes
    before them. (Put behind them, the application got #206 where #16 belonged: found by
    tests/failover/test_moving_subscribers.py under CPU load.)"""
    queued = [record for record in queue if record.tag[:STREAM_ID_SIZE] == stream]
    if queued:
        others = [record for record in queue if record.tag[:STREAM_ID_SIZE] != stream]
        queue.clear()
        queue.extend(others)
        held = sorted([*held, *queued], key=_STREAM_SEQ)
    queue.extendleft(reversed(held))


class PublisherLink:
    __slots__ = (
        "link_id",
        "conn_id",
        "container_id",
        "name",
        "topic",
        "incarnation",
        "stream",
        "presettled",
        "settles_first",
        "credit",
        "next_seq",
        "origin",
        "resending",
        "resend_seqs",
        "resend_holders",
        "resumed_with",
        "awaiting_seq",
        "memory",
    )

    def __init__(
        self,
        link_id: int,
        conn_id: int,
        container_id: str,
        name: str,
        topic: str,
        incarnation: str,
        stream: bytes,
        presettled: bool,
        settles_first: bool = True,
    ):
        self.link_id = link_id
        self.conn_id = conn_id
        self.container_id = container_id
        self.name = name
        self.topic = topic
        self.incarnation = incarnation
        self.stream = stream
        self.presettled = presettled
        # rcv-settle-mode=first (the default of nearly every client): we settle our
        # side with the final outcome, and that settles the delivery; with second the
        # publisher settles after it saw the outcome, and we settle after it.
        self.settles_first = settles_first
        self.credit = 0  # granted and not yet used
        self.next_seq = 0  # publisher order within this stream
        self.origin: OriginTemplate | None = None  # made on its first message
        # Resumed: the publisher tags it reported unsettled and has not resent yet. A
        # transfer with one of them is a resend, never a new use of the tag.
        self.resending: set[bytes] | None = None
        # Resumed: the number (stream_seq) each tag it reported takes when it resends a
        # delivery of it we never saw, in the order it listed them (its send order): the
        # number its first router gave it where any router still holds it, else one that
        # keeps the list's order (docs/resumption.md, "Publisher order across a resume").
        # None for a tag: not known yet (until every router answered).
        self.resend_seqs: dict[bytes, int | None] | None = None
        # Resumed: the routers that said they hold a listed delivery (publisher tag ->
        # router ids). A resend of one we never saw ends theirs too: they are sent its
        # settlement, as routers we do not wait for but that answered us.
        self.resend_holders: dict[bytes, set[str]] | None = None
        # Resumed here with a complete unsettled list: the outgoing tags of that list.
        # While this link stays attached, every later delivery of the stream comes
        # through us, so a tag of it we never saw and the list leaves out was settled
        # before the resume (resumption.settled_before_resume).
        self.resumed_with: frozenset[bytes] | None = None
        # Resumed: the routers yet to say how far they saw its stream numbered (its
        # credit waits for them, so its numbering continues past every seq already
        # used: docs/resumption.md, "Publisher order across a resume").
        self.awaiting_seq: set[str] | None = None
        # Its stream's settled-delivery memory (settled.StreamSettled), once it sent.
        self.memory: StreamSettled | None = None


class Subscription:
    """A subscriber, identified by container-id + link name, with or without an
    attached link. A durable one outlives its link for the terminus timeout."""

    __slots__ = (
        "key",
        "container_id",
        "name",
        "topic",
        "durable",
        "timeout",
        "link_id",
        "conn_id",
        "best_effort",
        "credit",
        "drain",
        "queue",
        "awaiting_evidence",
        "expires_at",
        "in_flight",
        "ready",
        "announced",
        "placeholders",
        "listed",
        "held",
        "selector",
        "pattern",
        "before",
    )

    def __init__(self, key: str, container_id: str, name: str, topic: str, pattern: bool = False):
        self.key = key
        self.container_id = container_id
        self.name = name
        self.topic = topic  # its address: a topic, or a pattern of topics when ``pattern``
        # A subscription to a pattern (topictrie.py) belongs to every topic here that
        # it matches (in each one's ``subscriptions``), joined as the topic is made.
        self.pattern = pattern
        self.durable = False
        self.timeout = 0
        self.link_id: int | None = None
        self.conn_id: int | None = None
        self.best_effort = False  # attached with snd-settle-mode=settled: at-most-once, never owed
        self.selector: Selector | None = None  # its JMS selector (selector.py): owed only what it selects
        self.credit = 0
        self.drain = False
        # Records waiting for credit, in publisher order (lazily skipped when done).
        self.queue: deque[DeliveryRecord] = deque()
        # (the core's send counter at settlement, record): settled deliveries this subscriber
        # is not yet known to have seen settled, oldest first.
        self.awaiting_evidence: deque[tuple[int, DeliveryRecord]] = deque()
        self.expires_at: float | None = None
        self.in_flight = 0  # pre-settled copies queued (best effort bound)
        self.ready = True  # False while its attach waits for the network to know it
        self.announced = False  # our announcer holds it (attached or retained)
        # Resumption (docs/resumption.md): publisher stream -> tags it reported that
        # this router has not seen yet; deliveries of that stream wait in ``held``.
        self.placeholders: dict[bytes, set[bytes]] = {}
        # Of those, the ones it reported holding, which our answer listed: it keeps
        # them unsettled until we settle them on its link.
        self.listed: set[bytes] = set()
        self.held: dict[bytes, list[DeliveryRecord]] = {}
        # A new durable subscription: the deliveries here when it began, never owed to
        # it (SubscriberAttached.before); announced with it every time while it lives.
        self.before: dict[str, list[list[int]]] | None = None

    @property
    def attached(self) -> bool:
        return self.link_id is not None


class Topic:
    __slots__ = (
        "name",
        "subscriptions",
        "publishers",
        "records",
        "unsettled",
        "outstanding_credit",
        "roster",
        "bytes",
        "est",
        "largest_recent",
        "at_budget",
        "published",
        "guarantee",
    )

    def __init__(self, name: str, guarantee: Guarantee = DEFAULT_GUARANTEE):
        self.name = name
        self.guarantee = guarantee  # its mode, and the [[guarantee]] rule that gave it (guarantees.py)
        self.subscriptions: dict[str, Subscription] = {}
        self.publishers: dict[int, PublisherLink] = {}
        # order key -> record: the topic's records in publisher (arrival) order, the
        # index a re-attaching subscriber is replayed from. Keys only ever grow, so a
        # plain dict (insertion-ordered, O(1) delete) is already sorted; a SortedDict
        # cost ~3 µs per message here for nothing.
        self.records: dict[int, DeliveryRecord] = {}
        self.unsettled = 0  # records the publisher has not settled: the in-flight bound
        self.outstanding_credit = 0  # credit granted to this topic's publishers, not yet used
        # The owed subscriptions as a records.Roster, built when needed; None after any
        # change to them (a subscription comes, goes, changes link or settle mode).
        self.roster: Roster | None = None
        # The byte budget (docs/configuration.md, [limits]): message bytes its records
        # hold; the size its outstanding credit is counted at (the largest recent
        # message: it grows at once, and halves per credit grant while messages stay
        # smaller; it starts at the largest allowed, so the first grant is safe);
        # the largest size since the last grant; and whether it sits at its budget.
        self.bytes = 0
        self.est = 0  # set by the core to max_message_size when the topic is made
        self.largest_recent = 0
        self.at_budget = False
        self.published = 0  # messages its publishers here sent (records made, or relayed best effort): metrics

    def idle(self) -> bool:
        """Nothing keeps it: subscriptions to patterns that match it do not (they
        join it again when it is made again)."""
        if self.publishers or self.records:
            return False
        return all(sub.pattern for sub in self.subscriptions.values())
