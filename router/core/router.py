"""RouterCore: every decision one router makes, as a pure function of events.

``handle(event, now) -> list[command]``: no proton, sockets, threads, files or
clock in here; ``now`` is an argument and randomness (the boot id) comes in at
construction. The delivery rule (docs/delivery-rule.md):

- An unsettled publisher delivery is owed to every subscription of its topic at
  that moment: attached links, plus durable subscriptions detached within their
  terminus timeout. The record lists them.
- It is forwarded to those attached (in publisher order, as credit allows) and
  queued for the rest.
- The publisher gets its outcome only when every owed subscriber reached a
  terminal outcome (or stopped being owed: a non-durable detach, a durable
  subscription's expiry, the message's expiry before it could be sent):
  accepted only if all accepted, otherwise the most severe (outcomes.aggregate).
- The publisher's settlement is relayed to every subscriber it was sent to.
- The record is deleted once every subscriber must know it was settled, or
  ``record_linger`` seconds after settlement when no later evidence came.
"""

from __future__ import annotations

import heapq
from collections import OrderedDict
from itertools import count

from router.core import outcomes, tags
from router.core.commands import (
    DetachLink, Drained, Forward, GrantCredit, Log, OpenLink, SendControl, SendData, SendOutcome,
    SettleOutgoing, ShutdownComplete, SubOutcome, SubOutcomes,
)
from router.core.errors import ProtocolError
from router.core.events import (
    DURABLE_NONE, PUBLISHER, RCV_FIRST, SND_SETTLED, SUBSCRIBER, ConnectionLost, ControlReceived, CreditChanged,
    DataReceived, LinkAttached, LinkDetached, MessageReceived, MessageTooLarge, OutcomeReceived, PeerConnected,
    ListenersReady, PeerLost, PublisherSettled, ShutdownRequested, TimerFired,
)
from router.core.links import PublisherLink, Subscription, Topic
from router.core.message import MessageError, OriginTemplate, splice_origin
from router.core.outcomes import OUTCOME_ACCEPTED, OUTCOME_NOT_OWED, Outcome
from router.core.network import (
    Network, announcement_from, announcement_message, link_state_from, link_state_message, snapshot_from,
)
from router.core.records import (
    ANSWER_ACCEPTED, ANSWER_DONE, ANSWER_UNSENT, DeliveryRecord, Roster, RouterState, SubscriberState,
)
from router.core.resumption import ResumptionMixin, _split_key, reported_unsettled
from router.core.settings import CoreSettings
from router.core.settled import BEYOND_HORIZON, KNOWN, SettledMemory

# Link property through which a publisher presents (and learns) its incarnation.
INCARNATION_PROPERTY = "eorouter:incarnation"
UNSETTLED_PROPERTY = "eorouter:unsettled"
MAX_ADDRESS_LENGTH = 1024

_TIMER_LINGER = 0
_TIMER_EXPIRY = 1
_TIMER_SUBSCRIPTION = 2
_TIMER_SHUTDOWN = 3
_TIMER_ANNOUNCE = 4
_TIMER_ORDER_GAP = 5
_TIMER_PLACEHOLDER = 6
_TIMER_PUBLISHER_GONE = 7
_TIMER_MEMBERSHIP = 8
_TIMER_STREAM_SEQ = 9
_TIMER_SETTLED_SWEEP = 10
# Messages smaller than this are not counted against the byte budget: the in-flight
# bound already holds a topic's to max_in_flight_per_topic of them (4 MiB at the
# default), and counting each would cost every small message its share of the hot path.
UNCOUNTED_BELOW = 4096
# What a topic may always hold, in largest messages, whatever the router-wide
# byte budget says (the rest of the router keeps flowing when some topics are stuck).
TOPIC_FLOOR_MESSAGES = 4
# The condition a resend is refused with when the network may have finished and
# forgotten it (docs/resumption.md, "What a publisher may rely on").
BEYOND_HORIZON_CONDITION = "eorouter:resend-beyond-horizon"
GONE = -1  # DeliveryRecord.pub_link once its publisher is gone for good
# The length byte of an inline publisher tag in an outgoing tag (tags.outgoing_tag).
_TAG_SIZE = tuple(bytes((size,)) for size in range(tags.MAX_INLINE_TAG + 1))
# Commands are NamedTuples; on the per-message path they are built with
# tuple.__new__(Cls, (every field)), which skips the Python-level __new__ of a
# NamedTuple call (~0.1 µs each; the same object, equal to Cls(...)).
_new = tuple.__new__
ACCEPTED = outcomes.ACCEPTED
_RELEASED = outcomes.RELEASED
_TERMINAL = outcomes.TERMINAL
_NAMES = outcomes.NAMES

# How long a relayed copy may wait for its predecessor from the same publisher
# before it is delivered anyway (the predecessor is then logged as a gap).
ORDER_HOLD_TIMEOUT = 5.0

# How long a new subscriber's attach waits for every reachable router to confirm
# it knows of the subscriber (docs/inter-router.md, "the propagation race").
ANNOUNCE_TIMEOUT = 2.0
# A relayed copy that has crossed this many routers is dropped: routes that
# disagree while link state floods must not loop a message for ever.
MAX_HOPS = 16


class RouterCore(ResumptionMixin):
    _TIMER_PLACEHOLDER = _TIMER_PLACEHOLDER
    _TIMER_MEMBERSHIP = _TIMER_MEMBERSHIP
    _TIMER_STREAM_SEQ = _TIMER_STREAM_SEQ

    def __init__(self, settings: CoreSettings, *, boot_id: str, epoch: int):
        self.settings = settings
        self.boot_id = boot_id
        self.epoch = epoch
        self.topics: dict[str, Topic] = {}
        self.publishers: dict[int, PublisherLink] = {}
        self.subscribers: dict[int, Subscription] = {}  # link id -> attached subscription
        self.subscriptions: dict[str, Subscription] = {}  # key -> subscription (attached or durable)
        self.records: dict[bytes, DeliveryRecord] = {}  # outgoing tag -> record
        self.by_delivery: dict[int, DeliveryRecord] = {}  # adapter delivery handle -> record
        self.streams: dict[bytes, tuple[str, str, str]] = {}  # live stream id -> its triple
        self.links_by_conn: dict[int, set[int]] = {}
        self.link_conn: dict[int, int] = {}
        self._incarnations = count(1)
        self._order = count(1)
        # Counts sends to subscribers (all copies of one distribution share a value).
        # A copy's SubscriberState.sent is its value; the evidence rule compares them.
        self._send_counter = 0
        self._timers: list = []  # heap of (deadline, seq, kind, object)
        self._timer_seq = count()
        self.net = Network(settings.router_id, epoch, boot_id)
        self._open_properties: dict[int, dict] = {}  # held subscriber attaches' answer properties
        self._known_routers: set[str] = set()  # every router we ever reached
        # Tags and outcomes of settled deliveries whose records are gone, per publisher
        # stream (router/core/settled.py): a resumed publisher's resend of one is
        # answered with its outcome, a resuming subscriber that still reports one is
        # told it is settled (docs/resumption.md).
        self._settled_tags = SettledMemory(settings.max_in_flight_per_topic, settings.resume_horizon,
                                           settings.remembered_streams, settings.forgotten_streams)
        self._sweep_at: float | None = None  # the next sweep of that memory, once armed
        # The byte budget: message bytes every record here holds, what the credit
        # outstanding on every topic may still bring (its count times the topic's
        # size estimate), and the topics whose grants wait for router-wide room.
        self.bytes_held = 0
        self._promised = 0
        self._starved: dict[str, None] = {}  # topic names, in the order they began to wait
        self._pending_refills: list = []  # topics to refill once this event is handled
        self._topic_floor = min(settings.max_bytes_in_flight_per_topic, TOPIC_FLOOR_MESSAGES * settings.max_message_size)

        # publisher stream -> the highest stream_seq seen here (from its publisher or
        # relayed): a publisher that resumes here continues its stream's numbering.
        self._stream_seq: dict[bytes, int] = {}
        # publisher stream -> the outgoing tags its publisher still held unsettled when
        # it last resumed with a complete list (here, or announced by "stream-resumed"):
        # any other tag of the stream published before then it had settled, so a
        # resuming subscriber's placeholder for it would wait for nothing. Bounded.
        self._resumed_streams: OrderedDict[bytes, frozenset] = OrderedDict()
        self._lost: set[str] = set()  # of those, the ones unreachable now
        self._flooded: set = set()  # announcements already flooded on: (router, epoch, boot, version)
        self._awaiting_acks: dict[str, tuple] = {}  # subscriber key -> (link id, routers yet to confirm)
        # Publisher order across routers (docs/inter-router.md, "publisher order"):
        self._last_sent: dict[tuple[bytes, str], int] = {}  # (stream, router) -> last stream_seq sent
        self._chain_head: dict[bytes, int] = {}  # stream -> last stream_seq delivered here
        self._held: dict[bytes, dict[int, tuple]] = {}  # stream -> {prev seq: (event, header)}
        self.draining = False
        self._drain_deadline: float | None = None
        self._shutdown_done = False
        self._handlers = {
            MessageReceived: self._on_message,
            OutcomeReceived: self._on_outcome,
            PublisherSettled: self._on_publisher_settled,
            CreditChanged: self._on_credit,
            LinkAttached: self._on_attach,
            LinkDetached: self._on_detach,
            ConnectionLost: self._on_connection_lost,
            MessageTooLarge: self._on_too_large,
            TimerFired: self._on_timer,
            ShutdownRequested: self._on_shutdown,
            PeerConnected: self._on_peer_connected,
            PeerLost: self._on_peer_lost,
            ControlReceived: self._on_control,
            DataReceived: self._on_data,
            ListenersReady: self._on_listeners_ready,
        }

    # ------------------------------------------------------------------ API

    def handle(self, event, now: float) -> list:
        """Apply one event; return the commands it causes, in order."""
        out: list = []
        self._handlers[type(event)](event, now, out)
        if self._pending_refills:
            self._refill_pending(out)
        if self.draining and not self._shutdown_done:
            self._maybe_finish_shutdown(now, out)
        return out

    def _refill_pending(self, out: list) -> None:
        pending = self._pending_refills
        self._pending_refills = []
        for topic in pending:
            if self.topics.get(topic.name) is topic:
                self._refill_credit(topic, out)
            else:
                self._starved.pop(topic.name, None)  # gone meanwhile

    def accepted_batch(self, items: list, now: float, out: list) -> None:
        """``handle(OutcomeReceived(link_id, tag, ACCEPTED, settled), now)`` for each of
        ``items`` ([link_id, tag, settled, link_id, ...], in arrival order), without
        building the events: the adapter's call for the accepted dispositions it read
        in one go (one per subscriber copy, the most frequent event of exactly-once at
        K > 1). The commands are appended to ``out``: the same as those calls would
        give, except that consecutive sub-outcome lines of one subscriber on compact
        records (the usual path) come as one ``SubOutcomes``. On an exception ``out``
        holds the commands of the items before it (the caller still executes them)."""
        subscribers = self.subscribers
        records = self.records
        run = None  # the SubOutcomes at the end of ``out``, while nothing came after it
        last_link = None
        sub = None
        each = iter(items)
        for link_id, tag, settled in zip(each, each, each):
            if link_id != last_link:
                sub = subscribers.get(link_id)
                last_link = link_id
            if sub is None:
                continue
            record = records.get(tag)
            if record is None:
                continue
            key = sub.key
            answers = record.answers
            if answers is None:
                # Expanded (records.py): an unusual record, the general path.
                state = record.subscribers.get(key)
                if state is not None:
                    self._on_accepted(sub, record, state, settled, now, out)
                    run = None  # what it appended comes after the run
                continue
            i = record.roster.index.get(key)
            if i is None:
                continue
            # _on_accepted_compact for its usual case, inlined: the first answer of
            # this subscriber, others still to answer, local subscribers only, its
            # publisher attached, no settlement evidence due. Its only consequence is
            # the sub-outcome line.
            if not answers[i] and record.waiting > 1 and not record.targeted \
                    and record.outcome is None and not record.remote_routers and not record.moved \
                    and record.origin_router is None and record.pub_delivery is not None \
                    and not (sub.awaiting_evidence and sub.awaiting_evidence[0][0] < record.sent_at):
                answers[i] = ANSWER_DONE if settled else ANSWER_ACCEPTED
                record.waiting -= 1
                if run is not None and run.subscriber == key and run.settled is settled:
                    run.deliveries.append(record.delivery_id)
                else:
                    run = _new(SubOutcomes, ([record.delivery_id], key, "accepted", settled))
                    out.append(run)
                continue
            self._on_accepted_compact(sub, record, i, settled, now, out)
            run = None
        if self._pending_refills:
            self._refill_pending(out)
        if self.draining and not self._shutdown_done:
            self._maybe_finish_shutdown(now, out)

    def next_deadline(self) -> float | None:
        return self._timers[0][0] if self._timers else None

    def record_count(self) -> int:
        return len(self.records)

    def failover_list(self) -> list[tuple[str, int]]:
        """The other reachable routers' client addresses (a query, for open frames)."""
        return self.net.failover_list()

    def _on_listeners_ready(self, ev: ListenersReady, now: float, out: list) -> None:
        self.net.addresses[self.settings.router_id] = tuple((h, p) for h, p in ev.addresses)
        self._flood(self.net.address_message(self.settings.router_id), None, out)

    # ------------------------------------------------------------ attaching

    def _on_attach(self, ev: LinkAttached, now: float, out: list) -> None:
        address = ev.address
        if not address:
            what = "target" if ev.role == PUBLISHER else "source"
            out.append(DetachLink(ev.link_id, "amqp:invalid-field",
                                  f"a {ev.role} link needs a {what} address naming the topic"))
            return
        if len(address) > MAX_ADDRESS_LENGTH:
            out.append(DetachLink(ev.link_id, "amqp:invalid-field",
                                  f"topic address longer than {MAX_ADDRESS_LENGTH} characters"))
            return
        self.links_by_conn.setdefault(ev.conn_id, set()).add(ev.link_id)
        self.link_conn[ev.link_id] = ev.conn_id
        if ev.role == PUBLISHER:
            self._attach_publisher(ev, address, now, out)
        elif ev.role == SUBSCRIBER:
            self._attach_subscriber(ev, address, now, out)
        else:
            raise ProtocolError("amqp:internal-error", f"unknown link role {ev.role!r}")

    def _attach_publisher(self, ev: LinkAttached, address: str, now: float, out: list) -> None:
        for other in self.publishers.values():
            if other.container_id == ev.container_id and other.name == ev.name:
                out.append(DetachLink(other.link_id, "amqp:link:stolen",
                                      "a newer link with the same container-id and name attached",
                                      close=False))
                self._detach_publisher(other, "stolen", now, out)
                break
        presented = (ev.properties or {}).get(INCARNATION_PROPERTY)
        resumed = isinstance(presented, str) and 0 < len(presented) <= 128
        incarnation = presented if resumed else tags.fresh_incarnation(self.boot_id, next(self._incarnations),
                                                                       now)
        stream = tags.stream_id(ev.container_id, ev.name, incarnation)
        triple = (ev.container_id, ev.name, incarnation)
        known = self.streams.get(stream)
        if known is not None and known != triple:
            out.append(Log("tag-collision", {"link": ev.link_id, "container": ev.container_id,
                                             "name": ev.name, "incarnation": incarnation}))
            out.append(DetachLink(ev.link_id, "amqp:internal-error",
                                  "delivery-tag stream id collision; attach again for a fresh incarnation"))
            return
        self.streams[stream] = triple
        topic = self._topic(address)
        pub = PublisherLink(ev.link_id, ev.conn_id, ev.container_id, ev.name, address, incarnation,
                            stream, ev.snd_settle_mode == SND_SETTLED, ev.rcv_settle_mode == RCV_FIRST)
        self.publishers[ev.link_id] = pub
        topic.publishers[ev.link_id] = pub
        properties = {INCARNATION_PROPERTY: incarnation}
        out.append(Log("link-attached", {
            "link": ev.link_id, "conn": ev.conn_id, "container": ev.container_id, "name": ev.name,
            "role": PUBLISHER, "address": address, "durable": ev.durable, "incarnation": incarnation,
            "resumed": resumed}))
        if resumed:
            properties[UNSETTLED_PROPERTY] = self._resume_publisher(pub, ev.properties, topic, now, out)
        out.append(OpenLink(ev.link_id, 0, properties))
        self._refill_credit(topic, out)

    def _attach_subscriber(self, ev: LinkAttached, address: str, now: float, out: list) -> None:
        key = f"{ev.container_id}/{ev.name}"
        sub = self.subscriptions.get(key)
        if sub is not None and sub.attached:
            # Link stealing: the newer attach takes over the same terminus (this is
            # what a failing-over client does), so the subscription carries on.
            old_link = sub.link_id
            out.append(DetachLink(old_link, "amqp:link:stolen",
                                  "a newer link with the same container-id and name attached", close=False))
            del self.subscribers[old_link]
            self._forget_link(old_link)
            out.append(Log("link-detached", {"link": old_link, "container": sub.container_id, "name": sub.name,
                                             "role": SUBSCRIBER, "closed": False, "reason": "stolen"}))
        if sub is not None and sub.topic != address:
            # The same name re-attached to another topic: the old subscription ends.
            self._end_subscription(sub, now, out, reason="re-attached-elsewhere")
            sub = None
        resumed = sub is not None
        topic = self._topic(address)
        topic.roster = None  # a subscription comes, or changes link or settle mode
        if sub is None:
            sub = Subscription(key, ev.container_id, ev.name, address)
            self.subscriptions[key] = sub
            topic.subscriptions[key] = sub
        sub.durable = ev.durable != DURABLE_NONE
        sub.timeout = self._terminus_timeout(ev)
        sub.link_id = ev.link_id
        sub.conn_id = ev.conn_id
        sub.best_effort = ev.snd_settle_mode == SND_SETTLED
        sub.credit = 0
        sub.drain = False
        sub.expires_at = None
        sub.awaiting_evidence.clear()
        self.subscribers[ev.link_id] = sub
        announcement = self.net.announcer.attached(address, ev.container_id, ev.name, durable=sub.durable,
                                                   resumed=resumed, timeout=sub.timeout)
        sub.announced = True
        self._flood(announcement_message(announcement), None, out)
        waiting_for = self.net.reachable()
        if waiting_for:
            # The propagation race: answer the attach only once every reachable router
            # confirmed it knows this subscriber, so a publisher anywhere that starts
            # after this subscriber saw its attach cannot miss it.
            sub.ready = False
            self._awaiting_acks[key] = (ev.link_id, set(waiting_for), announcement.version)
            self._add_timer(now + ANNOUNCE_TIMEOUT, _TIMER_ANNOUNCE, (key, ev.link_id))
        else:
            sub.ready = True
            out.append(OpenLink(ev.link_id, sub.timeout if sub.durable else 0, None))
        out.append(Log("link-attached", {
            "link": ev.link_id, "conn": ev.conn_id, "container": ev.container_id, "name": ev.name,
            "role": SUBSCRIBER, "address": address, "durable": ev.durable, "incarnation": "",
            "resumed": resumed}))
        resuming, _, _ = reported_unsettled(ev.properties)
        for record in topic.records.values():
            if key in record.moved and not record.pub_settled:
                self._owe_here(record, key)  # it had moved away and came back here
        if resuming:
            answer = self._resume_subscriber(sub, ev.properties, topic, now, out)
            self._set_open_properties(ev.link_id, {UNSETTLED_PROPERTY: answer}, out)
        if resumed or resuming or sub.durable:
            # Everything still owed to it goes out again, in publisher order: what it
            # missed while detached and what was in flight (a resuming receiver also
            # gets again what it reported, to answer and to see settled on).
            sub.queue.clear()
            for record in topic.records.values():
                state = record.subscribers.get(key)
                if state is not None and (state.outcome is None or state.resend) and not record.pub_settled:
                    state.sent = 0
                    sub.queue.append(record)

    def _set_open_properties(self, link_id: int, properties: dict, out: list) -> None:
        """Add link properties to our (possibly held) answer to an attach."""
        for index, command in enumerate(out):
            if isinstance(command, OpenLink) and command.link_id == link_id:
                out[index] = command._replace(properties={**(command.properties or {}), **properties})
                return
        self._open_properties[link_id] = properties

    def _terminus_timeout(self, ev: LinkAttached) -> int:
        if ev.durable == DURABLE_NONE:
            return 0
        limit = self.settings.max_terminus_timeout
        if ev.expiry_policy == "never":
            return limit
        if ev.expiry_policy == "link-detach":
            # The peer asked for expiry to start at detach: a timeout of 0 ends the
            # subscription with its link. (For session-end and connection-close the
            # router grants the default instead: for a crashed client those moments
            # coincide with the detach, and the router's source terminus is the one
            # that counts.)
            return min(ev.timeout, limit)
        requested = ev.timeout or self.settings.default_terminus_timeout
        return min(requested, limit)

    # ------------------------------------------------------------ detaching

    def _on_detach(self, ev: LinkDetached, now: float, out: list) -> None:
        self._forget_link(ev.link_id)
        pub = self.publishers.get(ev.link_id)
        if pub is not None:
            self._detach_publisher(pub, "closed" if ev.closed else "detached", now, out)
            return
        sub = self.subscribers.get(ev.link_id)
        if sub is not None:
            self._unlink_subscriber(sub, now, out, reason="closed" if ev.closed else "detached",
                                    closed=ev.closed)

    def _on_connection_lost(self, ev: ConnectionLost, now: float, out: list) -> None:
        for link_id in sorted(self.links_by_conn.pop(ev.conn_id, ())):
            self.link_conn.pop(link_id, None)
            pub = self.publishers.get(link_id)
            if pub is not None:
                self._detach_publisher(pub, "connection-lost", now, out)
                continue
            sub = self.subscribers.get(link_id)
            if sub is not None:
                self._unlink_subscriber(sub, now, out, reason="connection-lost", closed=False)

    def _forget_link(self, link_id: int) -> None:
        conn_id = self.link_conn.pop(link_id, None)
        links = self.links_by_conn.get(conn_id)
        if links is not None:
            links.discard(link_id)
            if not links:
                del self.links_by_conn[conn_id]

    def _detach_publisher(self, pub: PublisherLink, reason: str, now: float, out: list) -> None:
        del self.publishers[pub.link_id]
        topic = self.topics[pub.topic]
        del topic.publishers[pub.link_id]
        topic.outstanding_credit -= pub.credit
        self._promised -= pub.credit * topic.est
        pub.credit = 0
        out.append(Log("link-detached", {"link": pub.link_id, "container": pub.container_id,
                                         "name": pub.name, "role": PUBLISHER, "closed": reason == "closed",
                                         "reason": reason}))
        # Its unsettled records stay: subscribers still finish them. It may resume
        # (on any router) within publisher_resume_timeout; after that, or at once if
        # it closed its link, a record whose outcome is final is settled for it.
        orphans = [r for r in topic.records.values() if r.pub_link == pub.link_id and not r.pub_settled]
        for record in orphans:
            if record.pub_delivery is not None:
                self.by_delivery.pop(record.pub_delivery, None)
                record.pub_delivery = None
        if reason == "closed":
            self._publisher_gone(orphans, now, out)
        elif orphans:
            self._add_timer(now + self.settings.publisher_resume_timeout, _TIMER_PUBLISHER_GONE,
                            (pub.link_id, orphans))
        if not any(r.stream == pub.stream for r in self.publishers.values()):
            still_used = any(r.pub_link == pub.link_id for r in topic.records.values())
            if not still_used:
                self.streams.pop(pub.stream, None)
                for key in [k for k in self._last_sent if k[0] == pub.stream]:
                    del self._last_sent[key]
        self._refill_credit(topic, out)
        self._drop_topic_if_idle(topic)

    def _publisher_gone(self, records, now: float, out: list) -> None:
        for record in records:
            if record.pub_settled or record.pub_delivery is not None or self.records.get(record.tag) is not record:
                continue  # settled, resumed meanwhile, or gone
            record.pub_link = GONE
            if record.outcome is not None:
                self._settle_record(record, "publisher-gone", now, out)

    def _unlink_subscriber(self, sub: Subscription, now: float, out: list, reason: str, closed: bool) -> None:
        link_id = sub.link_id
        del self.subscribers[link_id]
        sub.link_id = None
        sub.conn_id = None
        sub.credit = 0
        topic = self.topics.get(sub.topic)
        if topic is not None:
            topic.roster = None
        out.append(Log("link-detached", {"link": link_id, "container": sub.container_id, "name": sub.name,
                                         "role": SUBSCRIBER, "closed": closed, "reason": reason}))
        self._awaiting_acks.pop(sub.key, None)
        if sub.announced:
            detached = self.net.announcer.detached(sub.container_id, sub.name, closed=closed)
            sub.announced = detached.retained
            self._flood(announcement_message(detached), None, out)
        if closed or not sub.durable or sub.timeout <= 0:
            self._end_subscription(sub, now, out, reason=reason)
            return
        elsewhere = self.net.membership.where(_split_key(sub.key))
        if elsewhere is not None and elsewhere != self.settings.router_id:
            # It already re-attached at another router (it lost us before we lost
            # it: a cut link, not a death): what it is owed here follows it there.
            self._local_subscriber_moved(sub.key, elsewhere, now, out)
            return
        sub.expires_at = now + sub.timeout
        self._add_timer(sub.expires_at, _TIMER_SUBSCRIPTION, sub)
        # What was sent and not answered will be resent on re-attach. The settlements
        # it may not have seen stay unknown until it answers again (or linger ends).
        sub.queue.clear()
        sub.awaiting_evidence.clear()

    def _end_subscription(self, sub: Subscription, now: float, out: list, reason: str) -> None:
        """The subscription is gone: it stops counting toward any outcome."""
        if sub.link_id is not None:
            del self.subscribers[sub.link_id]
            sub.link_id = None
        self.subscriptions.pop(sub.key, None)
        topic = self.topics[sub.topic]
        topic.subscriptions.pop(sub.key, None)
        topic.roster = None
        sub.queue.clear()
        sub.awaiting_evidence.clear()
        if sub.announced:  # a retained (durable, detached) subscription ends now
            sub.announced = False
            self._flood(announcement_message(self.net.announcer.expired(sub.container_id, sub.name)), None, out)
        if reason == "expired":
            out.append(Log("subscription-expired", {"container": sub.container_id, "name": sub.name,
                                                    "address": sub.topic}))
        for record in list(topic.records.values()):
            state = record.subscribers.get(sub.key)
            if state is None:
                continue
            if state.outcome is None:
                del record.subscribers[sub.key]
                record.waiting = -1
                if record.outcome is None:
                    self._maybe_answer_publisher(record, now, out)
            else:
                state.known_settled = True
                self._maybe_delete(record, now, out)
        self._drop_topic_if_idle(topic)

    # ------------------------------------------------------------ messages

    def _on_message(self, ev: MessageReceived, now: float, out: list) -> None:
        pub = self.publishers.get(ev.link_id)
        if pub is None:
            raise ProtocolError("amqp:internal-error", f"message on unknown link {ev.link_id}")
        topic = self.topics[pub.topic]
        if pub.credit > 0:
            pub.credit -= 1
            topic.outstanding_credit -= 1
            self._promised -= topic.est
        size = len(ev.payload)
        if size > topic.largest_recent:
            topic.largest_recent = size
            if size > topic.est:  # larger than its credit was counted at: count it so from now
                self._promised += topic.outstanding_credit * (size - topic.est)
                topic.est = size
        seq = pub.next_seq
        pub.next_seq = seq + 1
        self._stream_seq[pub.stream] = seq
        if ev.settled or pub.presettled:
            self._relay_best_effort(pub, topic, ev, now, out)
            return
        if self.draining:
            out.append(SendOutcome(ev.delivery, outcomes.RELEASED, True))
            out.append(Log("pub-outcome", {"delivery": None, "outcome": "released",
                                           "condition": outcomes.SHUTTING_DOWN,
                                           "reason": "router is shutting down"}))
            return
        ptag = ev.tag
        if len(ptag) <= tags.MAX_INLINE_TAG:  # tags.outgoing_tag() inlined for short tags
            tag = pub.stream + _TAG_SIZE[len(ptag)] + ptag
        else:
            try:
                tag = tags.outgoing_tag(pub.stream, ptag)
            except ProtocolError as err:
                self._refuse(ev.delivery, err.condition, err.description, out)
                return
        reuse = 0
        resent = False
        existing = self.records.get(tag)
        resending = pub.resending
        if resending is not None and ptag in resending:
            resending.discard(ptag)
            resent = True  # a resend of a delivery it reported unsettled: never a reuse
            if existing is None:
                settled = self._settled_tags
                verdict = settled.resend_verdict(tag, pub.incarnation)
                if verdict == KNOWN and settled.outcome_of(tag) is not None:
                    self._answer_finished_resend(tag, settled.outcome_of(tag), ev, out)
                    self._refill_credit(topic, out)
                    return
                if verdict == BEYOND_HORIZON:
                    self._refuse_beyond_horizon(tag, ev.delivery, out)
                    self._refill_credit(topic, out)
                    return
        elif existing is None:
            # ``tag in self._settled_tags``, inlined: once per message
            memory = pub.memory
            if memory is None:
                memory = pub.memory = self._settled_tags.memory_of(pub.stream)
            if tag in memory.current or tag in memory.previous:
                # Reused after the old delivery was settled and forgotten here: other
                # routers may still remember the old one, so the copy says which use it is.
                reuse = self._settled_tags.reuse_of(tag) + 1
        if existing is not None:
            if existing.pub_tag != ev.tag:
                out.append(Log("tag-collision", {"delivery": existing.delivery_id, "link": ev.link_id}))
                self._refuse(ev.delivery, "amqp:internal-error", "delivery-tag hash collision; resend it", out)
                return
            # No live publisher delivery (its link went: a resumed publisher resends it),
            # or settled on its behalf while it was away: a resend, never a new delivery.
            if (existing.pub_delivery is None
                    and (resent or not existing.pub_settled or existing.pub_link != ev.link_id)
                    and self._resent_by_publisher(existing, pub, ev, now, out)):
                self._refill_credit(topic, out)
                return
            if not existing.pub_settled:
                self._refuse(ev.delivery, "amqp:invalid-field",
                             "delivery-tag reused while the earlier delivery is unsettled", out)
                return
            # The publisher reused a settled tag: the old record has done its job.
            reuse = existing.reuse + 1
            self._delete(existing, "tag-reused", out)
        template = pub.origin
        if template is None:
            template = pub.origin = OriginTemplate(pub.container_id, pub.name, pub.incarnation,
                                                   self.settings.router_id)
        try:
            prepared = splice_origin(ev.payload, template, ptag)
        except MessageError as err:
            self._refuse(ev.delivery, err.condition, str(err), out)
            return
        if prepared is None:
            # Only routers set the origin annotation: a client's would be a forgery.
            self._refuse(ev.delivery, "amqp:unauthorized-access",
                         "message already carries an x-opt-eorouter-origin annotation", out)
            return
        payload, ttl_ms, absolute_expiry_ms = prepared
        expires_at = None
        if ttl_ms is not None:
            expires_at = now + ttl_ms / 1000.0
        if absolute_expiry_ms:
            absolute = absolute_expiry_ms / 1000.0
            expires_at = absolute if expires_at is None else min(expires_at, absolute)
        if expires_at is not None and expires_at <= now:
            self._refuse(ev.delivery, outcomes.EXPIRED, "message expired before it could be delivered", out)
            return
        record = DeliveryRecord(tag, topic.name, next(self._order), payload, pub.container_id,
                                pub.name, ev.tag, pub.incarnation, seq, pub.link_id, ev.delivery,
                                expires_at, reuse)
        if resent:
            record.resent = True
        memory = pub.memory
        if memory is None:
            memory = pub.memory = self._settled_tags.memory_of(pub.stream)
        record.memory = memory
        owed, sent_to, best_effort = self._distribute(record, topic, out)
        record.waiting = len(owed)  # every owed subscriber is yet to answer
        routers = None
        interested = self.net._interest.get(topic.name)  # Network.interested_routers' cache, read inline
        if interested is None:
            interested = self.net.interested_routers(topic.name)
        if interested:
            routers = sorted(interested)
            remote = record.remote_routers = {}
            for router_id in routers:
                remote[router_id] = RouterState()
        # One record for arrival and the immediate sends keeps the log cheap: later
        # sends (from a queue) get "forwarded" events of their own.
        out.append(_new(Log, ("received", {
            "delivery": record.delivery_id, "topic": topic.name, "publisher": pub.container_id,
            "link_name": pub.name, "pub_tag": ev.tag.hex(), "incarnation": pub.incarnation,
            "stream_seq": seq, "size": size, "settled": False, "owed": owed,
            "forwarded": sent_to, "routers": routers})))
        self.records[tag] = record
        self.by_delivery[ev.delivery] = record
        topic.records[record.order] = record
        topic.unsettled += 1
        held = len(payload)  # with the origin annotation: counted as _release_bytes counts it
        if held >= UNCOUNTED_BELOW:  # self._hold_bytes(topic, payload), inlined
            topic.bytes += held
            self.bytes_held += held
        if routers:
            self._send_towards(record, routers, now, out)
        if self._lost:
            self._owe_lost_subscribers(record, out)
        for sub in topic.subscriptions.values():  # only resumed subscribers hold placeholders
            if sub.placeholders:
                self._after_distribute_to_resumed(record, topic, now, out)
                break
        if not owed and not routers and not record.moved:
            self._answer_publisher(record, Outcome(self.settings.no_subscribers, description="no subscribers"),
                                   now, out)
        elif expires_at is not None:
            self._add_timer(expires_at, _TIMER_EXPIRY, record)
        if best_effort:
            self._best_effort_copies(topic, tag, payload, out)
        if pub.credit * 2 < self.settings.publisher_credit_window:
            self._refill_credit(topic, out, bound_only=True)

    def _refuse_beyond_horizon(self, tag: bytes, delivery: int, out: list) -> None:
        """A resumed publisher resent a delivery of a stream this router finished
        with and forgot (docs/resumption.md): it may have been delivered, so it is
        refused (rejected, a condition of its own), never taken as new."""
        description = ("resent after the router forgot its stream (resume horizon or memory limit): "
                       "it may have been delivered already")
        out.append(SendOutcome(delivery, outcomes.REJECTED, True, BEYOND_HORIZON_CONDITION, description))
        out.append(Log("resend-beyond-horizon", {"delivery": tag.hex(), "stream": tag[:tags.STREAM_ID_SIZE].hex()}))
        out.append(Log("pub-outcome", {"delivery": tag.hex(), "outcome": "rejected",
                                       "condition": BEYOND_HORIZON_CONDITION, "reason": description}))

    def _answer_finished_resend(self, tag: bytes, final: int, ev: MessageReceived, out: list) -> None:
        """A failed-over publisher resent a delivery this router took part in and saw
        finished (settled by its origin, now forgotten): the subscribers have it;
        the publisher gets the outcome it was finished with, and nobody a copy."""
        out.append(SendOutcome(ev.delivery, final, True))
        out.append(Log("pub-outcome", {"delivery": tag.hex(), "outcome": outcomes.NAMES.get(final, str(final)),
                                       "condition": None,
                                       "reason": "resent after it was finished and settled; outcome remembered"}))

    def _distribute(self, record: DeliveryRecord, topic: Topic, out: list) -> tuple[list, list, bool]:
        """Owe ``record`` to the topic's subscriptions and send it to those that can
        take it now; the others get it from their queue, or on re-attach. The record
        is compact (records.py): it shares the topic's roster and holds one answer
        byte per subscriber. Returns (keys owed, keys sent to, whether best-effort
        subscribers exist); the lists are shared: never change them."""
        roster = topic.roster
        if roster is None:
            roster = topic.roster = Roster(sub for sub in topic.subscriptions.values() if not sub.best_effort)
        subs = roster.subs
        if not subs:
            # Owed to nobody here (a router that only relays or originates it, or only
            # best-effort subscribers): an empty map from the start costs less than
            # a compact record that would be expanded at its first look.
            record.owe_no_subscriber()
            return roster.keys, roster.keys, bool(topic.subscriptions)
        answers = bytearray(len(subs))
        record.roster = roster
        record.answers = answers
        record.sent_at = self._send_counter = self._send_counter + 1
        tag = record.tag
        payload = record.payload
        unsent = False
        for i, sub in enumerate(subs):
            link_id = sub.link_id
            if link_id is not None and sub.credit > 0 and sub.ready and not sub.queue and not sub.placeholders:
                sub.credit -= 1
                out.append(_new(Forward, (link_id, tag, payload, False)))
            else:
                answers[i] = ANSWER_UNSENT
                unsent = True
                if link_id is not None:
                    sub.queue.append(record)
                # else: durable, detached: it gets the record on re-attach
        keys = roster.keys
        best_effort = len(subs) != len(topic.subscriptions)
        if not unsent:
            return keys, keys, best_effort
        return keys, [key for key, answer in zip(keys, answers) if not answer], best_effort

    def _best_effort_copies(self, topic: Topic, tag: bytes, payload: bytes, out: list) -> None:
        """Pre-settled copies for at-most-once subscribers that have credit now."""
        for sub in topic.subscriptions.values():
            if sub.best_effort and sub.link_id is not None and sub.credit > 0:
                sub.credit -= 1
                out.append(Forward(sub.link_id, tag, payload, True))

    def _refuse(self, delivery: int, condition: str, description: str, out: list) -> None:
        """Answer a publisher delivery the router will not carry."""
        out.append(SendOutcome(delivery, outcomes.REJECTED, True, condition, description))
        out.append(Log("pub-outcome", {"delivery": None, "outcome": "rejected", "condition": condition,
                                       "reason": description}))

    def _relay_best_effort(self, pub: PublisherLink, topic: Topic, ev: MessageReceived, now: float,
                           out: list) -> None:
        """Pre-settled: forward to whoever has credit now; never wait, never owe."""
        template = pub.origin
        if template is None:
            template = pub.origin = OriginTemplate(pub.container_id, pub.name, pub.incarnation,
                                                   self.settings.router_id)
        try:
            prepared = splice_origin(ev.payload, template, ev.tag)
        except MessageError:
            out.append(Log("dropped", {"delivery": None, "reason": "malformed pre-settled message"}))
            self._refill_credit(topic, out)
            return
        # A message that already carries an origin is relayed as it is (best effort
        # never refused anything).
        payload = ev.payload if prepared is None else prepared[0]
        ptag = ev.tag
        if len(ptag) <= tags.MAX_INLINE_TAG:  # tags.outgoing_tag() inlined for short tags
            tag = pub.stream + _TAG_SIZE[len(ptag)] + ptag
        else:
            tag = tags.outgoing_tag(pub.stream, ptag[:tags.MAX_TAG_SIZE])
        delivery_id = tag.hex()
        out.append(Log("received", {
            "delivery": delivery_id, "topic": topic.name, "publisher": pub.container_id,
            "link_name": pub.name, "pub_tag": ev.tag.hex(), "incarnation": pub.incarnation,
            "stream_seq": pub.next_seq - 1, "size": len(ev.payload), "settled": True, "owed": []}))
        self._best_effort_to_local(topic, tag, payload, out)
        interested = self.net.interested_routers(topic.name)
        if interested:
            # One copy per next hop, as for exactly-once, but nobody answers it.
            base = {"origin": self.settings.router_id, "epoch": self.epoch, "boot": self.boot_id,
                    "topic": topic.name, "pub": pub.container_id, "link": pub.name, "ptag": ptag.hex(),
                    "inc": pub.incarnation, "seq": pub.next_seq - 1, "hops": 0, "be": True}
            for hop, dests in self.net.split(sorted(interested)).by_next_hop.items():
                header = dict(base)
                header["dests"] = sorted(dests)
                out.append(SendData(hop, tag, header, payload))
                out.append(Log("forwarded-to-router", {"delivery": delivery_id, "to_router": hop,
                                                       "dests": header["dests"]}))
        self._refill_credit(topic, out)

    def _best_effort_to_local(self, topic: Topic, tag: bytes, payload: bytes, out: list) -> None:
        """A pre-settled copy to every local subscriber with credit now (at-most-once)."""
        for sub in topic.subscriptions.values():
            if sub.link_id is not None and sub.credit > 0:
                sub.credit -= 1
                out.append(Forward(sub.link_id, tag, payload, True))

    def _best_effort_from_router(self, ev: DataReceived, header: dict, out: list) -> None:
        """A pre-settled delivery relayed from its publisher's router: copies to our
        subscribers with credit now; no record, no answer, no order hold."""
        topic = self.topics.get(header.get("topic"))
        out.append(Log("received", {
            "delivery": ev.tag.hex(), "topic": header.get("topic"), "publisher": header.get("pub"),
            "link_name": header.get("link"), "pub_tag": header.get("ptag"), "incarnation": header.get("inc"),
            "stream_seq": header.get("seq", 0), "size": len(ev.payload), "settled": True, "owed": [],
            "origin_router": header.get("origin")}))
        if topic is not None:
            self._best_effort_to_local(topic, ev.tag, ev.payload, out)

    def _on_too_large(self, ev: MessageTooLarge, now: float, out: list) -> None:
        pub = self.publishers.get(ev.link_id)
        if pub is not None and pub.credit > 0:
            pub.credit -= 1
            self.topics[pub.topic].outstanding_credit -= 1
            self._promised -= self.topics[pub.topic].est
        description = f"message of {ev.size}+ bytes exceeds the router's limit of {self.settings.max_message_size}"
        if ev.settled:
            out.append(Log("dropped", {"delivery": None, "reason": description}))
        else:
            self._refuse(ev.delivery, "amqp:link:message-size-exceeded", description, out)
        if pub is not None:
            self._refill_credit(self.topics[pub.topic], out)

    def _send(self, sub: Subscription, record: DeliveryRecord, state: SubscriberState, out: list) -> None:
        sub.credit -= 1
        state.sent = self._send_counter = self._send_counter + 1
        state.link = sub.link_id
        state.remote_settled = False  # a new copy (a resend after a resume): not settled by it yet
        out.append(Forward(sub.link_id, record.tag, record.payload, False))
        out.append(Log("forwarded", {"delivery": record.delivery_id, "subscriber": sub.key,
                                     "link": sub.link_id, "settled": False}))

    def _pump(self, sub: Subscription, now: float, out: list) -> None:
        """Send queued records while the subscriber has credit."""
        if not sub.ready:
            return
        queue = sub.queue
        key = sub.key
        while queue and sub.credit > 0:
            record = queue.popleft()
            state = record.subscribers.get(key)
            if state is None or state.sent or record.payload is None:
                continue
            if state.outcome is not None and not state.resend:
                continue
            if sub.placeholders and self._placeholder_blocks(sub, record):
                sub.held.setdefault(record.tag[:tags.STREAM_ID_SIZE], []).append(record)
                continue
            self._send(sub, record, state, out)
            if record.pub_settled:  # a resumed subscriber's re-send, settled meanwhile
                out.append(SettleOutgoing(sub.link_id, record.tag))
                state.settle_relayed = True
                sub.awaiting_evidence.append((self._send_counter, record))
        if sub.drain and not queue and sub.credit > 0:
            sub.credit = 0
            sub.drain = False
            out.append(Drained(sub.link_id))

    def _on_credit(self, ev: CreditChanged, now: float, out: list) -> None:
        sub = self.subscribers.get(ev.link_id)
        if sub is None:
            return
        sub.credit = ev.credit
        sub.drain = ev.drain
        self._pump(sub, now, out)

    # ------------------------------------------------------------ outcomes

    def _on_outcome(self, ev: OutcomeReceived, now: float, out: list) -> None:
        sub = self.subscribers.get(ev.link_id)
        if sub is None:
            return
        record = self.records.get(ev.tag)
        if record is None:
            return  # pre-settled copy, or a record already retired
        key = sub.key
        code = ev.outcome
        settled = ev.settled
        if code == ACCEPTED and record.answers is not None:
            i = record.roster.index.get(key)
            if i is not None:
                self._on_accepted_compact(sub, record, i, settled, now, out)
            return
        state = record.subscribers.get(key)
        if state is None:
            return
        if code == ACCEPTED:
            self._on_accepted(sub, record, state, settled, now, out)
            return
        if code not in _TERMINAL:
            if settled:
                # Settled with no terminal state: AMQP leaves the default outcome to
                # the source; ours is released (not delivered, safe to resend).
                code = _RELEASED
        if code in _TERMINAL and state.outcome is None:
            state.outcome = Outcome(code, ev.condition, ev.description, ev.delivery_failed,
                                    ev.undeliverable_here)
            if record.waiting > 0:
                record.waiting -= 1
            out.append(_new(Log, ("sub-outcome", {"delivery": record.delivery_id, "subscriber": key,
                                                  "outcome": _NAMES[code], "settled": settled})))
        # Evidence: it answered a delivery sent at counter ``state.sent``, so it has
        # seen every settlement we relayed before that.
        sent = state.sent
        if sent and sub.awaiting_evidence and sub.awaiting_evidence[0][0] < sent:
            self._evidence(sub, sent, now, out)
        if settled:
            state.remote_settled = True
            if record.pub_settled:
                state.known_settled = True
        self._after_subscriber_outcome(record, key, now, out)

    def _on_accepted_compact(self, sub: Subscription, record: DeliveryRecord, i: int, settled: bool,
                             now: float, out: list) -> None:
        """_on_accepted on a compact record, for the answer at ``i`` of its roster:
        the usual case (the copy's first answer, local subscribers only, its publisher
        attached, no settlement evidence due, the count kept) on its answer byte;
        anything else on its SubscriberStates, which the record becomes for good."""
        answers = record.answers
        waiting = record.waiting
        if answers[i] or waiting < 1 or record.targeted or record.outcome is not None or record.remote_routers \
                or record.moved or record.origin_router is not None or record.pub_delivery is None \
                or (sub.awaiting_evidence and sub.awaiting_evidence[0][0] < record.sent_at):
            self._on_accepted(sub, record, record.subscribers[sub.key], settled, now, out)
            return
        answers[i] = ANSWER_DONE if settled else ANSWER_ACCEPTED
        record.waiting = waiting = waiting - 1
        if waiting:
            out.append(_new(SubOutcome, (record.delivery_id, sub.key, "accepted", settled)))
            return
        # The last answer, and (an outcome is only ever accepted in a compact record)
        # all accepted: one "completed" line (docs/event-log.md), as in _on_accepted.
        record.outcome = OUTCOME_ACCEPTED
        fields = {"delivery": record.delivery_id, "subscriber": sub.key, "outcome": "accepted",
                  "settled": settled, "pub_outcome": "accepted"}
        out.append(_new(Log, ("completed", fields)))
        self._outcome_to_publisher(record, OUTCOME_ACCEPTED, now, out, fields)

    def _on_accepted(self, sub: Subscription, record: DeliveryRecord, state: SubscriberState, settled: bool,
                     now: float, out: list) -> None:
        """_on_outcome for an accepted outcome: the per-copy path of exactly-once."""
        logged = -1  # where this outcome's line goes in ``out`` (-1: none, it said so before)
        if state.outcome is None:
            state.outcome = OUTCOME_ACCEPTED
            waiting = record.waiting
            if waiting > 0:
                record.waiting = waiting - 1
            # Its line's place, filled below: a "sub-outcome" (SubOutcome), or the
            # "completed" line when this outcome completes the delivery.
            logged = len(out)
            out.append(None)
        # Evidence: it answered a delivery sent at counter ``state.sent``, so it has
        # seen every settlement we relayed before that.
        sent = state.sent
        if sent and sub.awaiting_evidence and sub.awaiting_evidence[0][0] < sent:
            self._evidence(sub, sent, now, out)
        if settled:
            state.remote_settled = True
            if record.pub_settled:
                state.known_settled = True
        if not record.targeted and record.outcome is None and not record.remote_routers and not record.moved \
                and record.origin_router is None and record.pub_delivery is not None:
            # _after_subscriber_outcome, _maybe_answer_publisher and _answer_publisher,
            # inlined for the usual case: local subscribers only, its publisher attached.
            waiting = record.waiting
            if waiting > 0:  # still waiting for someone (the count says so: no scan per copy)
                if logged >= 0:
                    out[logged] = _new(SubOutcome, (record.delivery_id, sub.key, "accepted", settled))
                return
            states = record.subscribers.values()
            if waiting < 0:  # not counted (failover, expiry, a detach): look
                for other in states:
                    if other.outcome is None:
                        if logged >= 0:
                            out[logged] = _new(SubOutcome, (record.delivery_id, sub.key, "accepted", settled))
                        return
            for other in states:
                if other.outcome is not OUTCOME_ACCEPTED:
                    break  # not all accepted: the general rule (_maybe_answer_publisher)
            else:
                record.outcome = OUTCOME_ACCEPTED
                if logged < 0:
                    out.append(_new(Log, ("pub-outcome", {"delivery": record.delivery_id, "outcome": "accepted",
                                                          "condition": None, "reason": None})))
                    self._outcome_to_publisher(record, OUTCOME_ACCEPTED, now, out)
                    return
                # This outcome completed the delivery: its line is one "completed" line
                # that also stands for the pub-outcome and (when the router settles now)
                # the settled line (docs/event-log.md, "completed").
                fields = {"delivery": record.delivery_id, "subscriber": sub.key, "outcome": "accepted",
                          "settled": settled, "pub_outcome": "accepted"}
                out[logged] = _new(Log, ("completed", fields))
                self._outcome_to_publisher(record, OUTCOME_ACCEPTED, now, out, fields)
                return
        if logged >= 0:
            out[logged] = _new(SubOutcome, (record.delivery_id, sub.key, "accepted", settled))
        self._after_subscriber_outcome(record, sub.key, now, out)

    def _after_subscriber_outcome(self, record: DeliveryRecord, key: str, now: float, out: list) -> None:
        if record.targeted and key in record.targeted and record.subscribers[key].outcome is not None \
                and not record.pub_settled:
            self._report_targeted(record, key, out)
        if record.outcome is None:
            self._maybe_answer_publisher(record, now, out)
        elif record.pub_settled:
            self._maybe_delete(record, now, out)

    def _evidence(self, sub: Subscription, sent_at: int, now: float, out: list) -> None:
        pending = sub.awaiting_evidence
        key = sub.key
        while pending and pending[0][0] < sent_at:
            _, record = pending.popleft()
            state = record.subscribers.get(key)
            if state is not None and not state.known_settled:
                state.known_settled = True
                self._maybe_delete(record, now, out)

    def _maybe_answer_publisher(self, record: DeliveryRecord, now: float, out: list) -> None:
        """Answer once every owed party answered: local subscribers (but those another
        router addressed a copy to: they answer that router individually), interested
        remote routers, and subscribers that moved away from a dead router."""
        targeted = record.targeted
        states = record.subscribers
        if not targeted and not record.remote_routers and not record.moved:
            # The usual case, the same rule with less to look at: local subscribers only.
            for state in states.values():
                outcome = state.outcome
                if outcome is None:
                    return
                if outcome is not OUTCOME_ACCEPTED:
                    break
            else:
                if states:
                    self._answer_publisher(record, OUTCOME_ACCEPTED, now, out)
                    return
        all_accepted = True
        answered = 0
        for key, state in states.items():
            if targeted and key in targeted:
                continue
            outcome = state.outcome
            if outcome is None:
                return
            answered += 1
            if outcome is not OUTCOME_ACCEPTED:
                all_accepted = False
        for state in record.remote_routers.values():
            outcome = state.outcome
            if outcome is None:
                return
            if outcome is OUTCOME_NOT_OWED:
                continue
            answered += 1
            if outcome is not OUTCOME_ACCEPTED:
                all_accepted = False
        for state in record.moved.values():
            outcome = state.outcome
            if outcome is None:
                return
            answered += 1
            if outcome is not OUTCOME_ACCEPTED:
                all_accepted = False
        if not answered:
            outcome = Outcome(self.settings.no_subscribers, description="no subscribers left")
        elif all_accepted:
            outcome = OUTCOME_ACCEPTED
        else:
            outcome = outcomes.aggregate(
                [s.outcome for k, s in record.subscribers.items() if k not in targeted]
                + [s.outcome for s in record.remote_routers.values() if s.outcome is not OUTCOME_NOT_OWED]
                + [s.outcome for s in record.moved.values()])
        self._answer_publisher(record, outcome, now, out)

    def _answer_publisher(self, record: DeliveryRecord, outcome: Outcome, now: float, out: list) -> None:
        record.outcome = outcome
        if record.origin_router is not None:
            self._answer_origin(record, out)
            return
        out.append(_new(Log, ("pub-outcome", {"delivery": record.delivery_id,
                                              "outcome": _NAMES[outcome.code],
                                              "condition": outcome.condition, "reason": outcome.description})))
        if record.pub_delivery is None:
            if record.pub_link == GONE:
                self._settle_record(record, "publisher-gone", now, out)
            return  # it hears the outcome when it resumes and resends
        self._outcome_to_publisher(record, outcome, now, out)

    def _outcome_to_publisher(self, record: DeliveryRecord, outcome: Outcome, now: float, out: list,
                              fold: dict | None = None) -> None:
        """Send the final ``outcome`` on the publisher's delivery. On a link whose
        rcv-settle-mode is first, AMQP has the receiver (us) settle spontaneously:
        we settle with the outcome, which settles the delivery for both sides (a
        client that waits for a settled disposition, as Azure's does, needs this).
        With second, the publisher settles after it saw the outcome. ``fold``: the
        fields of this step's "completed" line, which then carries the settlement."""
        pub = self.publishers.get(record.pub_link)
        first = pub is not None and pub.settles_first
        if outcome is OUTCOME_ACCEPTED:  # the usual answer, without the detour
            out.append(_new(SendOutcome, (record.pub_delivery, ACCEPTED, first, None, None, False, False)))
        else:
            self._send_publisher_outcome(record, outcome, out, settle=first)
        if first:
            self._settle_record(record, "router", now, out, fold)

    def _send_publisher_outcome(self, record: DeliveryRecord, outcome: Outcome, out: list,
                                settle: bool = False) -> None:
        if outcome.code == outcomes.REJECTED:
            out.append(SendOutcome(record.pub_delivery, outcome.code, settle, outcome.condition,
                                   outcome.description))
        elif outcome.code == outcomes.MODIFIED:
            out.append(SendOutcome(record.pub_delivery, outcome.code, settle, None, None,
                                   outcome.delivery_failed, outcome.undeliverable_here))
        else:
            out.append(_new(SendOutcome, (record.pub_delivery, outcome.code, settle, None, None, False, False)))

    # ------------------------------------------------------------ settlement

    def _on_publisher_settled(self, ev: PublisherSettled, now: float, out: list) -> None:
        record = self.by_delivery.pop(ev.delivery, None)
        if record is None:
            return
        record.pub_delivery = None
        self._settle_record(record, "publisher", now, out)

    def _settle_record(self, record: DeliveryRecord, by: str, now: float, out: list,
                       fold: dict | None = None) -> None:
        """Settle the record (``by`` whom, for the log). ``fold``: the fields of this
        step's "completed" line: the settlement goes into it (by, deleted) instead of
        a "settled" line of its own."""
        if record.pub_settled:
            return
        record.pub_settled = True
        if self._sweep_at is None:  # the first settlement arms the settled memory's sweeps
            self._sweep_at = now + self._settled_tags.sweep_interval()
            self._add_timer(self._sweep_at, _TIMER_SETTLED_SWEEP, None)
        payload = record.payload
        record.payload = None
        if record.pub_delivery is not None:
            self.by_delivery.pop(record.pub_delivery, None)
            record.pub_delivery = None
        topic = self.topics[record.topic]
        if record.origin_router is None:
            topic.unsettled -= 1
        if record.outcome is None:
            # Settled before every subscriber answered (the publisher gave up): stop
            # waiting; receivers that hold it see the settlement.
            record.outcome = Outcome(outcomes.RELEASED, description="settled by publisher before outcome")
        everyone_knows = True
        subscriptions = topic.subscriptions
        answers = record.answers
        if answers is not None and answers == record.roster.all_done and not record.remote_routers \
                and not record.moved:
            # Compact, and every subscriber settled its copy itself: each knows it is
            # settled, nothing to relay, and the record goes now (below).
            states = ()
        else:
            states = record.subscribers.items()
        for key, state in states:
            if state.remote_settled:
                # It settled its copy itself (the adapter settled ours then: nothing
                # to relay), or it got it on a link that is gone.
                state.known_settled = True
                continue
            sub = subscriptions.get(key)
            if state.sent and sub is not None and sub.link_id == state.link:
                out.append(_new(SettleOutgoing, (sub.link_id, record.tag)))
                state.settle_relayed = True
                sub.awaiting_evidence.append((self._send_counter, record))
                everyone_knows = False
            elif state.resend and not state.sent and sub is not None and sub.link_id is not None:
                # It resumed reporting this delivery, which it holds unsettled, and our
                # re-send on its new link has not gone out yet (no credit): the re-send
                # still goes (_pump), then the settlement, or it would hold it for ever.
                record.payload = payload
                everyone_knows = False
            else:
                # It never got it, or got it on a link that is gone: there is no
                # settlement to relay on the current link.
                state.known_settled = True
        if topic.bytes and payload is not None and record.payload is None:
            self._release_bytes(topic, payload)
        if record.remote_routers or record.moved:  # else settle_pending stays the empty set
            targets = set(record.remote_routers)
            for moved in record.moved.values():
                if moved.router is not None and moved.router != self.settings.router_id:
                    targets.add(moved.router)
            for router_id in sorted(targets):
                everyone_knows = False
                self._route_control(router_id, self._settle_message(record.tag, self._final_outcome(record)), out)
                out.append(Log("settlement-relayed", {"delivery": record.delivery_id, "to_router": router_id}))
            record.settle_pending = targets
        if everyone_knows:
            # self._delete(record, None, out), inlined (settled, so no unsettled count to fix)
            tag = record.tag
            records = self.records
            if records.get(tag) is record:
                del records[tag]
                del topic.records[record.order]
                settled = self._settled_tags
                memory = record.memory if record.origin_router is None and not record.reuse else None
                if memory is not None:
                    # settled.add(tag, outcome), inlined for the usual case: we are the
                    # origin, decided the outcome, and remember the stream already
                    memory.sweep = settled.sweeps
                    current = memory.current
                    current[tag] = record.outcome.code
                    if len(current) >= settled.keep:
                        memory.previous = current
                        memory.current = {}
                        memory.partial = False
                else:
                    settled.add(tag, self._final_outcome(record), record.reuse)
                if not topic.records:
                    self._drop_topic_if_idle(topic)
            if fold is None:
                out.append(_new(Log, ("settled", {"delivery": record.delivery_id, "by": by, "deleted": True})))
            else:
                fold["by"] = by
                fold["deleted"] = True
        else:
            if fold is None:
                out.append(_new(Log, ("settled", {"delivery": record.delivery_id, "by": by, "deleted": False})))
            else:
                fold["by"] = by
                fold["deleted"] = False
            self._add_timer(now + self.settings.record_linger, _TIMER_LINGER, record)
        self._refill_credit(topic, out, bound_only=True)

    def _maybe_delete(self, record: DeliveryRecord, now: float, out: list) -> None:
        if record.pub_settled and record.tag in self.records and record.every_receiver_knows_settled():
            self._delete(record, "receivers-know-settled", out)

    @staticmethod
    def _final_outcome(record: DeliveryRecord) -> int | None:
        """The outcome code a settled delivery was finished with, if known here: the
        origin decided it; a relaying router learnt it from the origin's settle."""
        if record.origin_router is None:
            return record.outcome.code if record.pub_settled and record.outcome is not None else None
        return getattr(record, "final", None)

    @staticmethod
    def _settle_message(tag: bytes, outcome: int | None, done: bool = False) -> dict:
        """docs/inter-router.md, ``settle``: "o" the final outcome when known; "done"
        when the delivery was settled and forgotten here (an answer, not a relay)."""
        message = {"t": "settle", "d": tag.hex()}
        if outcome is not None:
            message["o"] = outcome
        if done:
            message["done"] = True
        return message

    def _delete(self, record: DeliveryRecord, reason: str | None, out: list) -> None:
        """Forget a record; ``reason`` None when the caller logs the deletion itself."""
        if self.records.get(record.tag) is not record:
            return
        del self.records[record.tag]
        topic = self.topics[record.topic]
        del topic.records[record.order]
        if record.payload is not None:
            if topic.bytes:
                self._release_bytes(topic, record.payload)
            record.payload = None
        if not record.pub_settled and record.origin_router is None:
            topic.unsettled -= 1
            if record.pub_delivery is not None:
                self.by_delivery.pop(record.pub_delivery, None)
        if record.pub_settled:
            self._settled_tags.add(record.tag, self._final_outcome(record), record.reuse)
        if reason is not None:
            out.append(Log("record-deleted", {"delivery": record.delivery_id, "reason": reason}))
        if not topic.records:
            self._drop_topic_if_idle(topic)

    # ------------------------------------------------------------ credit

    def _refill_credit(self, topic: Topic, out: list, bound_only: bool = False) -> None:
        """Keep each publisher's credit topped up within the topic's in-flight bound.

        Credit granted counts toward the bound (a sender may use it at any time), so
        the window is shared out among the topic's publishers; grants go out once a
        publisher has used half its window, keeping flow frames rare. When the bound
        is what limits a grant (deliveries in flight), it waits until at least an
        eighth of the window fits: otherwise a publisher that keeps the topic at its
        bound would get one credit, and one flow frame, per settled delivery. This
        never withholds credit for good: as the topic's deliveries settle, the room
        grows to what the publisher wants (a window is at most the bound divided
        among the topic's publishers) unless other publishers hold that credit.

        ``bound_only``: the caller changed nothing but the room (a settlement) or one
        unsettled publisher's own credit (its message arrived); only a grant limited
        by the bound can be due, so none is when less than an eighth of a window
        fits (checked first: this runs about twice per message). Pre-settled
        publishers ignore the bound and are topped up at their own messages."""
        publishers = topic.publishers
        if self.draining or not publishers:
            if self._starved:
                self._starved.pop(topic.name, None)  # nobody there to wait
            return
        settings = self.settings
        limit = settings.max_in_flight_per_topic
        # max(1, min(publisher_credit_window, limit // publishers)), without the calls
        window = limit // len(publishers)
        if window > settings.publisher_credit_window:
            window = settings.publisher_credit_window
        if window < 1:
            window = 1
        room = limit - topic.unsettled - topic.outstanding_credit
        if bound_only and room * 8 < window:
            # No grant due by count (the usual case, ~twice per message). Bytes could
            # only make one due by a smaller byte window, i.e. for messages so large
            # that the byte budget keeps the topic far from its in-flight bound: then
            # the count's room is never this small, and the byte arithmetic below runs.
            return
        # The byte budget, in messages of the topic's size estimate. Each publisher's
        # window is its share of the topic's budget, as it is of the in-flight bound;
        # the room is what the topic's and the router's budgets have left beyond what
        # is held and promised.
        est = topic.est
        byte_window = settings.max_bytes_in_flight_per_topic // (est * len(publishers))
        if byte_window < window:
            window = byte_window if byte_window > 1 else 1
        by_bytes = (settings.max_bytes_in_flight_per_topic - topic.bytes) // est - topic.outstanding_credit
        router_room = (settings.max_bytes_in_flight - self.bytes_held - self._promised) // est
        # Every topic may hold a few largest messages whatever the others hold: topics
        # stuck at their budgets must not stop the rest (it bounds memory at the
        # router's budget plus that floor per topic in flight).
        floor = (self._topic_floor - topic.bytes) // est - topic.outstanding_credit
        on_floor = floor > router_room  # (then it never waits behind other topics)
        if on_floor:
            router_room = floor
        router_limited = router_room < by_bytes and router_room < room
        if router_room < by_bytes:
            by_bytes = router_room
        eighth = window
        if by_bytes < room:
            # Bytes are what is left: what fits goes out however little (it may stay
            # under an eighth of a window for good: the floor, or a window another
            # publisher took while the topic's sizes were not known yet). Each grant
            # then lets the size estimate follow the messages down.
            room = by_bytes
            eighth = 0
        if router_limited and not on_floor and self._starved and topic.name not in self._starved:
            # Others wait for the router's room: they get it first, in turn.
            self._starved[topic.name] = None
            return
        if room < 1 and by_bytes == room and not topic.at_budget \
                and not any(p.credit for p in publishers.values() if not p.presettled):
            self._at_budget(topic, router_limited, out)
        if bound_only and room * 8 < eighth:
            return
        granted = False
        for pub in publishers.values():
            want = window - pub.credit
            if want * 2 < window or pub.awaiting_seq:
                continue
            if not pub.presettled:
                if room < want:
                    want = room
                    if want <= 0 or want * 8 < eighth:
                        continue
                room -= want
            pub.credit += want
            topic.outstanding_credit += want
            self._promised += want * est
            granted = True
            out.append(GrantCredit(pub.link_id, want))
        if granted:
            self._starved.pop(topic.name, None)
            largest = topic.largest_recent
            topic.largest_recent = 0
            if 0 < largest < est >> 1 and est > 1024:
                # Messages stayed smaller: count its credit at half the size from now.
                new_est = est >> 1 if (est >> 1) > largest else largest
                if new_est < 1024:
                    new_est = 1024
                self._promised -= topic.outstanding_credit * (est - new_est)
                topic.est = new_est
            if topic.at_budget:
                topic.at_budget = False
                out.append(Log("budget", {"topic": topic.name, "state": "below", "bytes": topic.bytes,
                                          "router_bytes": self.bytes_held}))

    def _at_budget(self, topic: Topic, router_wide: bool, out: list) -> None:
        """The byte budget withholds the topic's credit: say so once, and remember to
        grant again when the router's other topics give bytes back."""
        if router_wide:
            self._starved[topic.name] = None
        if not topic.at_budget:
            topic.at_budget = True
            out.append(Log("budget", {"topic": topic.name, "state": "reached", "bytes": topic.bytes,
                                      "router_bytes": self.bytes_held,
                                      "limit": "router" if router_wide else "topic"}))

    def _hold_bytes(self, topic: Topic, payload: bytes | None) -> None:
        if payload is not None:
            size = len(payload)
            if size >= UNCOUNTED_BELOW:
                topic.bytes += size
                self.bytes_held += size

    def _release_bytes(self, topic: Topic, payload: bytes) -> None:
        size = len(payload)
        if size >= UNCOUNTED_BELOW:
            topic.bytes -= size
            self.bytes_held -= size
            if self._starved:
                self._wake_starved(topic)

    def _wake_starved(self, topic: Topic) -> None:
        """Room router-wide: the topics waiting for it try again, in turn, once this
        event is handled (a topic that did not wait joins the end of the line)."""
        for name in self._starved:
            other = self.topics.get(name)
            if other is not None and other not in self._pending_refills:
                self._pending_refills.append(other)

    # ------------------------------------------------------------ timers

    def _add_timer(self, deadline: float, kind: int, obj) -> None:
        heapq.heappush(self._timers, (deadline, next(self._timer_seq), kind, obj))

    def _on_timer(self, ev: TimerFired, now: float, out: list) -> None:
        timers = self._timers
        while timers and timers[0][0] <= now:
            deadline, _, kind, obj = heapq.heappop(timers)
            if kind == _TIMER_LINGER:
                if self.records.get(obj.tag) is obj:
                    self._delete(obj, "linger-expired", out)
            elif kind == _TIMER_EXPIRY:
                self._expire_message(obj, now, out)
            elif kind == _TIMER_SUBSCRIPTION:
                if obj.expires_at == deadline and obj.link_id is None and \
                        self.subscriptions.get(obj.key) is obj:
                    self._end_subscription(obj, now, out, reason="expired")
            elif kind == _TIMER_SHUTDOWN:
                self._release_all_for_shutdown(now, out)
            elif kind == _TIMER_ORDER_GAP:
                stream, prev = obj
                held = self._held.get(stream)
                if held and prev in held:
                    ev, header = held.pop(prev)
                    if not held:
                        del self._held[stream]
                    out.append(Log("order-gap", {"delivery": ev.tag.hex(), "missing_seq": prev}))
                    self._deliver_chain(stream, ev, header, now, out)
            elif kind == _TIMER_PLACEHOLDER:
                self._placeholder_expired(obj[0], obj[1], now, out)
            elif kind == _TIMER_PUBLISHER_GONE:
                link_id, records = obj
                if link_id not in self.publishers:
                    self._publisher_gone(records, now, out)
            elif kind == _TIMER_MEMBERSHIP:
                self._membership_changed(self.net.membership.expire_lost(now), now, out)
                self._schedule_membership_expiry()
            elif kind == _TIMER_SETTLED_SWEEP:
                self._sweep_settled(now, out)
            elif kind == _TIMER_STREAM_SEQ:
                if self.publishers.get(obj.link_id) is obj and obj.awaiting_seq:
                    out.append(Log("stream-seq-timeout", {"link": obj.link_id, "routers": sorted(obj.awaiting_seq)}))
                    self._stream_seq_known(obj, out)
            elif kind == _TIMER_ANNOUNCE:
                key, link_id = obj
                waiting = self._awaiting_acks.get(key)
                if waiting is not None and waiting[0] == link_id:
                    out.append(Log("announce-timeout", {"subscriber": key, "routers": sorted(waiting[1])}))
                    self._subscriber_ready(key, out)

    def _sweep_settled(self, now: float, out: list) -> None:
        """Forget the settled deliveries of streams a resume horizon quiet (or, over
        the limit, the quietest): their resends are refused from now on. What else
        is kept per stream goes with them."""
        in_use = self._stream_in_use()
        forgotten = self._settled_tags.sweep(now, in_use.__contains__, lambda s: self._stream_seq.get(s, -1))
        for stream in forgotten:
            self._stream_seq.pop(stream, None)
            self._chain_head.pop(stream, None)
        if forgotten:
            out.append(Log("streams-forgotten", {"count": len(forgotten),
                                                 "remembered": len(self._settled_tags.streams)}))
        self._sweep_at = now + self._settled_tags.sweep_interval()
        self._add_timer(self._sweep_at, _TIMER_SETTLED_SWEEP, None)

    def _stream_in_use(self) -> set[bytes]:
        """Streams with a publisher link here or a record here: never forgotten."""
        in_use = set(self.streams)
        for record in self.records.values():
            in_use.add(record.tag[:tags.STREAM_ID_SIZE])
        return in_use

    def _expire_message(self, record: DeliveryRecord, now: float, out: list) -> None:
        """The message's ttl ran out: subscribers it has not reached yet will not
        get it; the publisher hears rejected with eorouter:ttl-expired."""
        if record.outcome is not None or self.records.get(record.tag) is not record:
            return
        expired = Outcome(outcomes.REJECTED, outcomes.EXPIRED, "message expired before it reached every subscriber")
        record.waiting = -1
        for key, state in record.subscribers.items():
            if state.outcome is None and not state.sent:
                state.outcome = expired
                out.append(Log("expired", {"delivery": record.delivery_id, "subscriber": key}))
        self._maybe_answer_publisher(record, now, out)

    # ------------------------------------------------------------ shutdown

    def _on_shutdown(self, ev: ShutdownRequested, now: float, out: list) -> None:
        if self.draining:
            return
        self.draining = True
        self._drain_deadline = now + ev.grace
        out.append(Log("router-stopping", {"reason": "shutdown requested"}))
        self._add_timer(self._drain_deadline, _TIMER_SHUTDOWN, None)

    def _release_all_for_shutdown(self, now: float, out: list) -> None:
        for record in list(self.records.values()):
            if record.outcome is None:
                self._answer_publisher(record, Outcome(outcomes.RELEASED, outcomes.SHUTTING_DOWN,
                                                       "router shut down before every subscriber answered"),
                                       now, out)

    def _maybe_finish_shutdown(self, now: float, out: list) -> None:
        for record in self.records.values():
            if record.outcome is None:
                return
        self._shutdown_done = True
        out.append(ShutdownComplete())

    # ------------------------------------------------------------ network

    def _neighbours_except(self, source: str | None):
        return [peer for peer in self.net.neighbours if peer != source]

    def _flood(self, message: dict, source: str | None, out: list) -> None:
        """Send a link state or announcement to every neighbour but the one it came from."""
        for peer in self._neighbours_except(source):
            out.append(SendControl(peer, message))

    def _saw_seq(self, record: DeliveryRecord) -> None:
        stream = record.tag[:tags.STREAM_ID_SIZE]
        if record.stream_seq > self._stream_seq.get(stream, -1):
            self._stream_seq[stream] = record.stream_seq

    def _flood_once(self, stamp, message: dict, source: str, out: list) -> bool:
        """Flood a message on the first time we see it; False for a repeat."""
        if stamp in self._flooded:
            return False
        self._flooded.add(stamp)
        self._flood(message, source, out)
        return True

    def _route_control(self, to: str, message: dict, out: list) -> bool:
        """Send a control message for router ``to`` one hop along the best path.
        False when there is no path now: the resend on the next topology change
        covers it (docs/inter-router.md, "reliability")."""
        hop = self.net.next_hop(to)
        if hop is None:
            return False
        message["to"] = to
        message["from"] = message.get("from", self.settings.router_id)
        out.append(SendControl(hop, message))
        return True

    def _base_header(self, record: DeliveryRecord) -> dict:
        header = record.header
        if header is None:
            header = record.header = {
                "origin": self.settings.router_id, "epoch": self.epoch, "boot": self.boot_id,
                "topic": record.topic, "pub": record.publisher, "link": record.link_name,
                "ptag": record.pub_tag.hex(), "inc": record.incarnation, "seq": record.stream_seq,
                "exp": record.expires_at, "hops": 0}
            if record.reuse:
                header["reuse"] = record.reuse  # a settled tag used again (docs/tags.md)
            if getattr(record, "resent", False):
                header["rs"] = 1  # a resumed publisher's resend: maybe finished and forgotten
        return header

    def _send_towards(self, record: DeliveryRecord, routers, now: float, out: list) -> None:
        """One copy per next hop, carrying the set of routers it is for."""
        if record.payload is None or record.pub_settled:  # settled: a payload kept only for a local re-send
            return
        split = self.net.split(routers)
        base = self._base_header(record)
        stream = record.tag[:tags.STREAM_ID_SIZE]
        for hop, dests in split.by_next_hop.items():
            header = dict(base)
            header["dests"] = sorted(dests)
            prev = {}
            for router_id in header["dests"]:
                state = record.remote_routers.get(router_id)
                if state is None:
                    continue
                if state.prev is None:
                    key = (stream, router_id)
                    state.prev = self._last_sent.get(key, -1)
                    self._last_sent[key] = record.stream_seq
                prev[router_id] = state.prev
            header["prev"] = prev
            out.append(SendData(hop, record.tag, header, record.payload))
            out.append(Log("forwarded-to-router", {"delivery": record.delivery_id, "to_router": hop,
                                                   "dests": header["dests"]}))
            for router_id in dests:
                state = record.remote_routers.get(router_id)
                if state is not None:
                    state.sent = True

    def _answer_origin(self, record: DeliveryRecord, out: list) -> None:
        outcome = record.outcome
        # With no subscriber left here that was owed it, we are not owed it either. A
        # subscriber that moved away still counts: the router it moved to answered us
        # for it (a targeted copy) and leaves it out of its own answer; and we keep a
        # record that only the origin's settlement ends.
        if record.moved or any(k not in record.targeted for k in record.subscribers):
            code = outcome.code
        else:
            code = outcomes.NONE
        message = {"t": "outcome", "d": record.tag.hex(), "o": code}
        if outcome.condition:
            message["cond"] = outcome.condition
            message["desc"] = outcome.description
        if outcome.code == outcomes.MODIFIED:
            message["failed"] = outcome.delivery_failed
            message["undeliv"] = outcome.undeliverable_here
        self._route_control(record.origin_router, message, out)
        out.append(Log("outcome-to-router", {"delivery": record.delivery_id, "to_router": record.origin_router,
                                             "outcome": outcomes.NAMES[code]}))

    def _subscriber_ready(self, key: str, out: list) -> None:
        link_id, _, _ = self._awaiting_acks.pop(key)
        sub = self.subscriptions.get(key)
        if sub is None or sub.link_id != link_id:
            return
        sub.ready = True
        out.append(OpenLink(link_id, sub.timeout if sub.durable else 0, self._open_properties.pop(link_id, None)))
        self._pump(sub, 0.0, out)

    def _on_peer_connected(self, ev: PeerConnected, now: float, out: list) -> None:
        known = self.net.membership.incarnation_of(ev.router_id)
        own = self.net.peer_connected(ev.router_id, ev.conn_id, ev.epoch, ev.boot)
        for message in self.net.sync_messages():
            out.append(SendControl(ev.router_id, message))
        if own is not None:
            self._flood(link_state_message(own), ev.router_id, out)
        if known is not None and (known.epoch, known.boot) != (ev.epoch, ev.boot):
            out.append(Log("peer-restarted", {"peer": ev.router_id, "peer_epoch": ev.epoch, "peer_boot": ev.boot}))
        self._topology_changed(now, out)

    def _on_peer_lost(self, ev: PeerLost, now: float, out: list) -> None:
        own = self.net.peer_lost(ev.router_id, ev.conn_id)
        if own is not None:
            self._flood(link_state_message(own), None, out)
        self._topology_changed(now, out)

    def _on_control(self, ev: ControlReceived, now: float, out: list) -> None:
        routes_changed = False
        for message in ev.messages:
            kind = message.get("t")
            to = message.get("to")
            if to is not None and to != self.settings.router_id:
                hop = self.net.next_hop(to)
                if hop is not None and hop != ev.router_id:
                    out.append(SendControl(hop, message))
                continue
            if kind == "outcome":
                self._on_router_outcome(message, now, out)
            elif kind == "settle":
                self._on_router_settle(message, now, out)
            elif kind == "settle-ack":
                self._on_settle_ack(message, now, out)
            elif kind == "settled?":
                self._on_settled_query(message, out)
            elif kind == "ls":
                ls = link_state_from(message)
                if self.net.lsdb.apply(ls):
                    self._flood(message, ev.router_id, out)
                    routes_changed = True
            elif kind in ("sub+", "sub-"):
                self._on_announcement(message, ev.router_id, now, out)
            elif kind == "sub-ack":
                waiting = self._awaiting_acks.get(message.get("key"))
                if waiting is not None and waiting[2] == message.get("version"):
                    waiting[1].discard(message.get("from"))
                    if not waiting[1]:
                        self._subscriber_ready(message["key"], out)
            elif kind == "subs":
                changes = self.net.membership.apply(snapshot_from(message))
                self._membership_changed(changes, now, out)
            elif kind == "stream-resumed":
                if self._flood_once(("stream", message.get("stream"), message.get("at"), message.get("n"),
                                     len(message.get("unsettled", ()))), message, ev.router_id, out):
                    self._on_stream_resumed(message, now, out)
            elif kind == "stream-seq":
                self._on_stream_seq(message, now, out)
            elif kind == "addr":
                if self.net.learn_addresses(message):
                    self._flood(message, ev.router_id, out)
            elif kind == "synced":
                pass
            else:
                raise ProtocolError("amqp:not-implemented", f"unknown control message type {kind!r}")
        if routes_changed:
            self._topology_changed(now, out)

    def _on_announcement(self, message: dict, source: str, now: float, out: list) -> None:
        announcement = announcement_from(message)
        stamp = (announcement.router, announcement.epoch, announcement.boot, announcement.version)
        if announcement.router == self.settings.router_id:
            return
        if stamp not in self._flooded:
            self._flooded.add(stamp)
            self._flood(message, source, out)
            self._membership_changed(self.net.membership.apply(announcement), now, out)
        if message["t"] == "sub+":
            # Confirm even a duplicate: the announcing router may be holding an attach.
            key = f"{announcement.container_id}/{announcement.link_name}"
            self._route_control(announcement.router, {"t": "sub-ack", "key": key,
                                                      "version": announcement.version}, out)

    def _membership_changed(self, changes, now: float, out: list) -> None:
        """A router no longer holding any subscription to a topic stops being owed
        that topic's deliveries (as a local non-durable subscriber that left), but
        only those we never sent it. A copy it was sent, it answers itself: with its
        subscribers' outcomes when they answered before leaving, or "none". The news
        that it has nobody left travels on other paths than its answers (flooded
        through every neighbour, while answers go along the best path), so it can
        arrive first: acting on it would discard answers in flight
        and tell the publisher "released" for what was accepted (issue 14). A router
        that becomes unreachable is not waited for (_router_lost)."""
        self.net.membership_changed()
        self._expire_moved(changes, now, out)
        for change in changes:
            kind = type(change).__name__
            if kind == "SubscriberMoved":
                self._moved_subscriber_at(str(change.key), change.to_router, now, out)
            elif kind == "RemoteSubscriberAdded":
                key = str(change.key)
                local = self.subscriptions.get(key)
                if local is not None and not local.attached:
                    self._local_subscriber_moved(key, change.router, now, out)
                else:
                    self._moved_subscriber_at(key, change.router, now, out)
        for change in changes:
            topic_name = getattr(change, "topic", None)
            router_id = getattr(change, "router", None)
            if topic_name is None or router_id is None:
                continue
            if router_id in self.net.interested_routers(topic_name):
                continue
            topic = self.topics.get(topic_name)
            if topic is None:
                continue
            for record in list(topic.records.values()):
                state = record.remote_routers.get(router_id)
                if state is not None and state.outcome is None and not state.sent:
                    del record.remote_routers[router_id]
                    if record.outcome is None:
                        self._maybe_answer_publisher(record, now, out)
                    else:
                        self._maybe_delete(record, now, out)

    def _on_data(self, ev: DataReceived, now: float, out: list) -> None:
        header = ev.header
        me = self.settings.router_id
        dests = header.get("dests") or []
        hops = header.get("hops", 0) + 1
        if hops > MAX_HOPS:
            out.append(Log("dropped", {"delivery": ev.tag.hex(), "reason": f"crossed {MAX_HOPS} routers"}))
            return
        others = [d for d in dests if d != me]
        if others:
            split = self.net.split(others)
            for hop, sub_dests in split.by_next_hop.items():
                if hop == ev.router_id:
                    continue  # routes disagree while link state floods: never bounce back
                relayed = dict(header)
                relayed["dests"] = sorted(sub_dests)
                relayed["hops"] = hops
                out.append(SendData(hop, ev.tag, relayed, ev.payload))
                out.append(Log("forwarded-to-router", {"delivery": ev.tag.hex(), "to_router": hop,
                                                       "dests": relayed["dests"]}))
        if me in dests:
            if header.get("be"):
                self._best_effort_from_router(ev, header, out)
            else:
                self._in_publisher_order(ev, header, now, out)

    def _in_publisher_order(self, ev: DataReceived, header: dict, now: float, out: list) -> None:
        """Deliver a relayed copy only after its predecessor from the same publisher
        stream (named by the origin in ``prev``): a copy that took a newer path after
        a route change must not overtake an earlier one still on its way."""
        stream = ev.tag[:tags.STREAM_ID_SIZE]
        prev = (header.get("prev") or {}).get(self.settings.router_id, -1)
        head = self._chain_head.get(stream)
        if ev.tag in self.records or prev == -1 or (head is not None and prev <= head):
            self._deliver_chain(stream, ev, header, now, out)
            return
        self._held.setdefault(stream, {})[prev] = (ev, header)
        self._add_timer(now + ORDER_HOLD_TIMEOUT, _TIMER_ORDER_GAP, (stream, prev))

    def _deliver_chain(self, stream: bytes, ev: DataReceived, header: dict, now: float, out: list) -> None:
        while True:
            self._deliver_from_router(ev, header, now, out)
            seq = header.get("seq", 0)
            if seq > self._chain_head.get(stream, -1):
                self._chain_head[stream] = seq
            held = self._held.get(stream)
            if not held or seq not in held:
                return
            ev, header = held.pop(seq)
            if not held:
                del self._held[stream]

    def _deliver_from_router(self, ev: DataReceived, header: dict, now: float, out: list) -> None:
        """A delivery another router took from its publisher: owe it to our
        subscribers, and answer the origin router once they all answered."""
        tag = ev.tag
        record = self.records.get(tag)
        origin = header["origin"]
        targets = (header.get("for") or {}).get(self.settings.router_id)
        report_to = header.get("report", origin)
        reuse = header.get("reuse", 0)
        if record is not None and reuse > record.reuse and record.pub_settled:
            # Its publisher reused the tag after settling the old delivery (AMQP
            # allows it): a new delivery, not a resend of the one we still linger on.
            self._delete(record, "tag-reused", out)
            record = None
        if record is not None and record.origin_router is None and origin != self.settings.router_id \
                and not targets:
            # We took it from its publisher, which resumed at ``origin`` and resent it.
            # Or, unsettled here, its copy overtook the "stream-resumed" news, which
            # hands the record over when it comes (a copy alone cannot tell the new
            # origin from a stale one: ours, to the router that took over from us).
            if record.pub_settled:
                # Finished and settled here, its record only lingering: as for a tag
                # remembered settled (below), the resend gets the final outcome, or
                # the new origin would wait for us for ever (issue 16, part 3).
                self._route_control(report_to, self._settle_message(tag, self._final_outcome(record), True), out)
                out.append(Log("dropped", {"delivery": record.delivery_id, "reason": "already settled here"}))
            return
        if record is not None:
            if record.origin_router is not None and record.origin_router != origin and not targets:
                record.origin_router = origin  # its publisher resumed at another router
                record.outcome = None if record.outcome is None else record.outcome
            if targets:
                self._accept_targeted(record, targets, report_to, now, out)
            # A resend (a hop failed, or routes changed): never delivered twice. If
            # we already answered, the answer may have been lost: answer again.
            elif record.origin_router is not None and record.outcome is not None and not record.pub_settled:
                self._answer_origin(record, out)
            return
        if tag in self._settled_tags and reuse <= self._settled_tags.reuse_of(tag):
            # Settled here and forgotten: never deliver it again. The sender still
            # thinks it is the origin (it was cut off while its publisher resumed
            # here and we finished the delivery as origin): tell it it is done.
            self._route_control(report_to, self._settle_message(tag, self._settled_tags.outcome_of(tag), True), out)
            out.append(Log("dropped", {"delivery": tag.hex(), "reason": "already settled here"}))
            return
        topic_name = header["topic"]
        topic = self.topics.get(topic_name)
        owed_here = topic is not None and any(not s.best_effort for s in topic.subscriptions.values())
        if header.get("rs") and not targets and owed_here \
                and self._settled_tags.resend_verdict(tag, header.get("inc")) == BEYOND_HORIZON:
            # A resend of a stream we finished with and forgot: our subscribers may
            # have had it. Refused, never delivered as new (docs/resumption.md).
            description = ("resent after router " + self.settings.router_id + " forgot its stream "
                           "(resume horizon or memory limit): it may have been delivered already")
            self._route_control(report_to, {"t": "outcome", "d": tag.hex(), "o": outcomes.REJECTED,
                                            "cond": BEYOND_HORIZON_CONDITION, "desc": description}, out)
            out.append(Log("resend-beyond-horizon", {"delivery": tag.hex(), "stream": tag[:tags.STREAM_ID_SIZE].hex(),
                                                     "origin_router": origin}))
            return
        if targets and topic is not None:
            record = DeliveryRecord(tag, topic_name, next(self._order), ev.payload, header.get("pub", ""),
                                    header.get("link", ""), bytes.fromhex(header.get("ptag", "")),
                                    header.get("inc", ""), header.get("seq", 0), -1, None, header.get("exp"), reuse)
            record.origin_router = origin
            record.outcome = Outcome(outcomes.RELEASED)  # nothing untargeted here to answer for
            self._saw_seq(record)
            self.records[tag] = record
            topic.records[record.order] = record
            self._hold_bytes(topic, record.payload)
            out.append(Log("received", {
                "delivery": record.delivery_id, "topic": topic_name, "publisher": record.publisher,
                "link_name": record.link_name, "pub_tag": header.get("ptag"), "incarnation": record.incarnation,
                "stream_seq": record.stream_seq, "size": len(ev.payload), "settled": False, "owed": list(targets),
                "forwarded": [], "origin_router": origin}))
            self._accept_targeted(record, targets, report_to, now, out)
            self._fulfil_placeholders(record, now, out)
            return
        if not owed_here:
            # Nobody here (any more): we are not owed this delivery.
            message = {"t": "outcome", "d": tag.hex(), "o": outcomes.NONE}
            self._route_control(origin, message, out)
            if topic is not None:
                self._best_effort_copies(topic, tag, ev.payload, out)
            return
        record = DeliveryRecord(tag, topic_name, next(self._order), ev.payload, header.get("pub", ""),
                                header.get("link", ""), bytes.fromhex(header.get("ptag", "")),
                                header.get("inc", ""), header.get("seq", 0), -1, None, header.get("exp"), reuse)
        record.origin_router = origin
        owed, sent_to, best_effort = self._distribute(record, topic, out)
        out.append(Log("received", {
            "delivery": record.delivery_id, "topic": topic_name, "publisher": record.publisher,
            "link_name": record.link_name, "pub_tag": header.get("ptag"), "incarnation": record.incarnation,
            "stream_seq": record.stream_seq, "size": len(ev.payload), "settled": False,
            "owed": owed, "forwarded": sent_to, "origin_router": origin}))
        self._saw_seq(record)
        self.records[tag] = record
        topic.records[record.order] = record
        self._hold_bytes(topic, record.payload)
        self._after_distribute_to_resumed(record, topic, now, out)
        if record.expires_at is not None:
            if record.expires_at <= now:
                self._expire_message(record, now, out)
            else:
                self._add_timer(record.expires_at, _TIMER_EXPIRY, record)
        if best_effort:
            self._best_effort_copies(topic, tag, ev.payload, out)

    def _on_router_outcome(self, message: dict, now: float, out: list) -> None:
        tag = bytes.fromhex(message["d"])
        record = self.records.get(tag)
        sender = message.get("from")
        if record is None:
            if tag in self._settled_tags and sender:
                # Settled and forgotten here, but the settlement we relayed to it was
                # lost (a cut link): without this it would hold its record for ever.
                self._route_control(sender, self._settle_message(tag, self._settled_tags.outcome_of(tag)), out)
            return
        key = message.get("key")
        if key is not None:
            self._on_moved_outcome(record, key, sender, message, now, out)
            return
        if record.origin_router is not None:
            return
        state = record.remote_routers.get(sender)
        if state is None:
            return
        code = message.get("o", outcomes.NONE)
        out.append(Log("outcome-from-router", {"delivery": record.delivery_id, "from_router": sender,
                                               "outcome": outcomes.NAMES.get(code, str(code))}))
        if state.outcome is not None:
            if record.pub_settled and sender in record.settle_pending:
                self._route_control(sender, self._settle_message(record.tag, self._final_outcome(record)), out)
            return
        if code == outcomes.NONE:
            # Nobody there was owed it. It takes no part in the outcome; but if it
            # holds a record (it lost its subscribers after the copy came), only our
            # settlement ends that record: it stays one of the routers we settle.
            state.outcome = OUTCOME_NOT_OWED
        elif code == outcomes.ACCEPTED:
            state.outcome = OUTCOME_ACCEPTED
        elif code in outcomes.TERMINAL:
            state.outcome = Outcome(code, message.get("cond"), message.get("desc"),
                                    bool(message.get("failed")), bool(message.get("undeliv")))
        else:
            raise ProtocolError("amqp:invalid-field", f"outcome code {code!r} from router {sender}")
        if record.outcome is None:
            self._maybe_answer_publisher(record, now, out)
        else:
            self._maybe_delete(record, now, out)

    def _on_router_settle(self, message: dict, now: float, out: list) -> None:
        tag = bytes.fromhex(message["d"])
        record = self.records.get(tag)
        sender = message.get("from")
        final = message.get("o")
        if final not in outcomes.TERMINAL:
            final = None  # absent (an older router) or not an outcome code
        if record is not None and (record.origin_router == sender or sender in record.targeted.values()):
            if final is not None and record.origin_router is not None:
                record.final = final
            self._settle_record(record, "origin-router", now, out)
        elif record is not None and message.get("done") and final is not None and record.origin_router is None \
                and record.pub_delivery is not None and getattr(record, "resent", False):
            # A resend its publisher made after failing over: that router finished the
            # delivery earlier (as its origin, or taking part) and forgot it. Its
            # subscribers will not take it again; the outcome it was finished with is
            # that router's answer.
            state = record.remote_routers.get(sender)
            if state is not None and state.outcome is None:
                out.append(Log("outcome-from-router", {"delivery": record.delivery_id, "from_router": sender,
                                                       "outcome": outcomes.NAMES.get(final, str(final))}))
                state.outcome = OUTCOME_ACCEPTED if final == outcomes.ACCEPTED else Outcome(final)
                if record.outcome is None:
                    self._maybe_answer_publisher(record, now, out)
        elif record is not None and message.get("done") and record.origin_router is None \
                and record.pub_delivery is None and not record.pub_settled:
            # We still act as its origin, but its publisher is not here: it resumed
            # at another router, which finished and settled the delivery meanwhile.
            # Its outcome is the one that router finished it with (what we remember,
            # and tell a resend), not ours so far.
            if final is not None:
                record.outcome = OUTCOME_ACCEPTED if final == ACCEPTED else Outcome(final)
            self._settle_record(record, "settled-elsewhere", now, out)
        elif record is None and message.get("done"):
            self._placeholder_settled(tag, now, out)  # the answer to our "settled?"

        self._route_control(sender, {"t": "settle-ack", "d": message["d"]}, out)

    def _on_settled_query(self, message: dict, out: list) -> None:
        """Another router holds a placeholder for a delivery it never saw: if we know
        it settled (a record settled, or its tag remembered), say so."""
        tag = bytes.fromhex(message["d"])
        record = self.records.get(tag)
        if (record is not None and record.pub_settled) or (record is None and tag in self._settled_tags):
            code = self._final_outcome(record) if record is not None else self._settled_tags.outcome_of(tag)
            self._route_control(message["from"], self._settle_message(tag, code, True), out)

    def _on_settle_ack(self, message: dict, now: float, out: list) -> None:
        record = self.records.get(bytes.fromhex(message["d"]))
        if record is None or message.get("from") not in record.settle_pending:
            return
        record.settle_pending.discard(message.get("from"))  # a set: the sender is in it
        self._maybe_delete(record, now, out)

    def _topology_changed(self, now: float, out: list) -> None:
        """Routes may have changed: whatever may have been lost with a hop goes again.
        Receivers recognise resent deliveries by their tag."""
        if not self.net.recompute():
            return
        out.append(Log("routes", {"reachable": sorted(self.net.reachable()),
                                  "next_hops": [f"{d}>{h}" for d, h in sorted(self.net.routes.next_hop.items())]}))
        me = self.settings.router_id
        reachable = self.net.reachable()
        for router_id in sorted(self._lost & reachable):
            self._lost.discard(router_id)
            self._membership_changed(self.net.membership.router_regained(router_id), now, out)
        for router_id in sorted(self._known_routers - reachable):
            if router_id not in self._lost:
                self._lost.add(router_id)
                self._router_lost(router_id, now, out)
        self._known_routers |= reachable
        for record in list(self.records.values()):
            if record.origin_router is None:
                if not record.pub_settled:
                    pending = [r for r, st in record.remote_routers.items() if st.outcome is None]
                    if pending:
                        self._send_towards(record, pending, now, out)
                else:
                    message = self._settle_message(record.tag, self._final_outcome(record))
                    for router_id in sorted(record.settle_pending):
                        self._route_control(router_id, dict(message), out)
            elif record.outcome is not None and not record.pub_settled and record.origin_router != me:
                self._answer_origin(record, out)
            if not record.pub_settled:
                self._resend_to_moved(record, out)
        # Subscribers waiting for confirmation from routers we can no longer reach
        # need not wait for them, nor resumed publishers for their stream's numbering.
        reachable = self.net.reachable()
        for pub in list(self.publishers.values()):
            if pub.awaiting_seq:
                pub.awaiting_seq &= reachable
                if not pub.awaiting_seq:
                    self._stream_seq_known(pub, out)
        for key, (link_id, waiting, _) in list(self._awaiting_acks.items()):
            waiting &= reachable
            if not waiting:
                self._subscriber_ready(key, out)

    # ------------------------------------------------------------ helpers

    def _topic(self, name: str) -> Topic:
        topic = self.topics.get(name)
        if topic is None:
            topic = self.topics[name] = Topic(name)
            topic.est = self.settings.max_message_size
        return topic

    def _drop_topic_if_idle(self, topic: Topic) -> None:
        if topic.idle() and self.topics.get(topic.name) is topic:
            del self.topics[topic.name]
