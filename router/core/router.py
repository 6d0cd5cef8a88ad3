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
from collections.abc import Callable
from itertools import count
from typing import Any

from router.core import compiled, outcomes, tags
from router.core.admission import AdmissionMixin
from router.core.attach import AttachMixin
from router.core.commands import (
    Command,
    Log,
    ShutdownComplete,
    SubOutcomes,
)

# Re-exported: the link properties and limits clients and tests name through the core.
from router.core.constants import (  # noqa: F401
    _TIMER_ANNOUNCE,
    _TIMER_EXPIRY,
    _TIMER_LINGER,
    _TIMER_MEMBERSHIP,
    _TIMER_ORDER_GAP,
    _TIMER_PLACEHOLDER,
    _TIMER_PUBLISHER_GONE,
    _TIMER_SETTLED_SWEEP,
    _TIMER_SHUTDOWN,
    _TIMER_STREAM_SEQ,
    _TIMER_SUBSCRIPTION,
    INCARNATION_PROPERTY,
    MAX_ADDRESS_LENGTH,
    TOPIC_FLOOR_MESSAGES,
    UNSETTLED_PROPERTY,
    _new,
)
from router.core.control import ControlMixin
from router.core.credit import CreditMixin
from router.core.events import (
    ConnectionLost,
    ControlReceived,
    CreditChanged,
    DataReceived,
    Event,
    ExpireSubscription,
    LinkAttached,
    LinkDetached,
    ListenersReady,
    MessageReceived,
    MessageTooLarge,
    OutcomeReceived,
    PeerConnected,
    PeerLost,
    PublisherSettled,
    ShutdownRequested,
    TimerFired,
)
from router.core.guarantees import DEFAULT as DEFAULT_GUARANTEE
from router.core.guarantees import guarantee_of
from router.core.links import PublisherLink, Subscription, Topic, in_publisher_order
from router.core.moved import MovedAway
from router.core.network import (
    Network,
)
from router.core.outcomes import Outcome
from router.core.presettled import PresettledMixin
from router.core.records import (
    ANSWER_ACCEPTED,
    ANSWER_DONE,
    DeliveryRecord,
)
from router.core.relay import RelayMixin
from router.core.remote_outcomes import RemoteOutcomesMixin
from router.core.resumption import Resumption
from router.core.settings import CoreSettings
from router.core.settled import SettledMemory
from router.core.settlement import SettlementMixin
from router.core.topictrie import PatternIndex, is_pattern, matches


class RouterCore(
    AttachMixin,
    AdmissionMixin,
    PresettledMixin,
    SettlementMixin,
    CreditMixin,
    RelayMixin,
    ControlMixin,
    RemoteOutcomesMixin,
):
    # The state the compiled twins (router/core/compiled.py) read or write per message,
    # in plain slots: reached by offset (router/core/_attrs.h), not through the
    # instance's dict (the mixins give it one, for everything else).
    __slots__ = (
        "publishers",
        "topics",
        "subscribers",
        "records",
        "by_delivery",
        "stream_seq",
        "net",
        "lost",
        "settings",
        "settled",
        "draining",
        "bytes_held",
        "_order",
        "_send_counter",
        "_promised",
        "_starved",
        "_pending_refills",
        "_shutdown_done",
        "_sweep_at",
    )

    # The core's services to its components (router/core/resumption.py): what they
    # may call, under public names. Everything else of the core is its own.
    SERVICES = (
        "pump",
        "route_control",
        "maybe_answer_publisher",
        "add_timer",
        "settle_record",
        "final_outcome",
        "settle_message",
        "send_towards",
        "send_publisher_outcome",
        "refill_credit",
        "outcome_to_publisher",
        "flood",
        "end_subscription",
        "detach_publisher",
        "delete",
        "base_header",
        "after_subscriber_outcome",
        "records_for",
        "topics_taken_by",
        "answer_origin",
        "arm_sweep",
    )
    pump = AdmissionMixin._pump
    route_control = ControlMixin._route_control
    maybe_answer_publisher = SettlementMixin._maybe_answer_publisher
    settle_record = SettlementMixin._settle_record
    final_outcome = SettlementMixin.__dict__["_final_outcome"]  # a staticmethod
    settle_message = SettlementMixin.__dict__["_settle_message"]  # a staticmethod
    send_towards = RelayMixin._send_towards
    send_publisher_outcome = SettlementMixin._send_publisher_outcome
    refill_credit = CreditMixin._refill_credit
    outcome_to_publisher = SettlementMixin._outcome_to_publisher
    flood = ControlMixin._flood
    end_subscription = AttachMixin._end_subscription
    detach_publisher = AttachMixin._detach_publisher
    delete = SettlementMixin._delete
    base_header = RelayMixin._base_header
    after_subscriber_outcome = SettlementMixin._after_subscriber_outcome
    answer_origin = RemoteOutcomesMixin._answer_origin

    def add_timer(self, deadline: float, kind: int, obj: Any) -> None:
        self._add_timer(deadline, kind, obj)

    def __init__(self, settings: CoreSettings, *, boot_id: str, epoch: int):
        self.settings = settings
        self.boot_id = boot_id
        self.epoch = epoch
        self.topics: dict[str, Topic] = {}
        self.publishers: dict[int, PublisherLink] = {}
        self.subscribers: dict[int, Subscription] = {}  # link id -> attached subscription
        self.subscriptions: dict[str, Subscription] = {}  # key -> subscription (attached or durable)
        self.pattern_subs = PatternIndex()  # pattern -> keys of the subscriptions to it (attached or durable)
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
        self._timers: list[tuple[float, int, int, Any]] = []  # heap of (deadline, seq, kind, object)
        self._timer_seq = count()
        self.net = Network(settings.router_id, epoch, boot_id)
        self.resumption = Resumption(self)  # failover: a component (router/core/resumption.py)
        self._open_properties: dict[int, dict[str, Any]] = {}  # held subscriber attaches' answer properties
        self._known_routers: set[str] = set()  # every router we ever reached
        # Tags and outcomes of settled deliveries whose records are gone, per publisher
        # stream (router/core/settled.py): a resumed publisher's resend of one is
        # answered with its outcome, a resuming subscriber that still reports one is
        # told it is settled (docs/resumption.md).
        self.settled = SettledMemory(
            settings.max_in_flight_per_topic, settings.resume_horizon, settings.remembered_streams, settings.forgotten_streams
        )
        self._sweep_at: float | None = None  # the next sweep of that memory, once armed
        # The byte budget: message bytes every record here holds, what the credit
        # outstanding on every topic may still bring (its count times the topic's
        # size estimate), and the topics whose grants wait for router-wide room.
        self.bytes_held = 0
        self._promised = 0
        self._starved: dict[str, None] = {}  # topic names, in the order they began to wait
        self._pending_refills: list[Topic] = []  # topics to refill once this event is handled
        self._topic_floor = min(settings.max_bytes_in_flight_per_topic, TOPIC_FLOOR_MESSAGES * settings.max_message_size)

        # publisher stream -> the highest stream_seq seen here (from its publisher or
        # relayed): a publisher that resumes here continues its stream's numbering.
        self.stream_seq: dict[bytes, int] = {}
        self.lost: set[str] = set()  # of those, the ones unreachable now
        # Durable subscribers that moved from here to another router lately: what
        # origins sent here for them before they heard of the move is passed on
        # (docs/inter-router.md, "The moving race").
        self.moved_away: dict[str, MovedAway] = {}
        # (announcing router, attached | detached) -> announcements learnt (each once, however
        # many neighbours flood it): an operator's count (router/adapter/metrics.py)
        self.announcements_learnt: dict[tuple[str, str], int] = {}
        # "stream-resumed" floods already passed on -> when (oldest first): forgotten a
        # resume horizon later. (Announcements: the membership table knows repeats.)
        self._flooded: dict[tuple[Any, ...], float] = {}
        # stream -> (the router its publisher last resumed at, as heard here; when),
        # oldest first, for a resume horizon: a copy of one of its deliveries from
        # another router is a stale one, not a new origin's (relay._known_copy).
        self.resumed_at: dict[bytes, tuple[str, float]] = {}
        # Resumed publishers' links whose outcomes wait until every router said how far
        # it saw the stream and which of its deliveries it holds (resumption.on_stream_seq):
        # a router holding one may hold a subscriber's answer nobody else will give.
        self.answers_held: set[int] = set()
        # subscriber key -> (link id, routers yet to confirm, the announcement's version)
        self._awaiting_acks: dict[str, tuple[int, set[str], int]] = {}
        # Of those, the ones whose attach was answered already (the announce timeout of a
        # subscriber that moved here): only their deliveries wait.
        self._answered_early: set[str] = set()
        # tag -> subscribers that moved from a router we sent the delivery to, before we
        # heard: our sub-ack named it to their new router (control.py); should their old
        # router say it left them out ("left"), we owe it to them (moved.py, on_left).
        self.moved_via: dict[bytes, set[str]] = {}
        # Publisher order across routers (docs/inter-router.md, "publisher order"):
        self._last_sent: dict[tuple[bytes, str], int] = {}  # (stream, router) -> last stream_seq sent
        # (stream, router) -> the last stream_seq of a copy addressed to subscribers there
        # (router/core/moved.py, their own chain of predecessors)
        self.addressed_last: dict[tuple[bytes, str], int] = {}
        self._chain_head: dict[bytes, int] = {}  # stream -> last stream_seq delivered here
        # stream -> (stream_seq, origin) of the first delivery its origin sent here (its
        # "prev" for us -1): that origin never sent us anything of the stream before it
        self._chain_start: dict[bytes, tuple[int, str]] = {}
        # stream -> {prev seq: [(event, header), ...]}
        self._held: dict[bytes, dict[int, list[tuple[DataReceived, dict[str, Any]]]]] = {}
        self.draining = False
        self._drain_deadline: float | None = None
        self._shutdown_done = False
        self._handlers: dict[type, Callable[[Any, float, list[Command]], None]] = {
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
            ExpireSubscription: self._on_expire_subscription,
        }
        # A publisher's message and subscribers' accepted answers by their compiled twins,
        # when built (router/core/compiled.py): the same commands and state.
        compiled.install(self)

    # ------------------------------------------------------------------ API

    def handle(self, event: Event, now: float) -> list[Command]:
        """Apply one event; return the commands it causes, in order."""
        out: list[Command] = []
        self._handlers[type(event)](event, now, out)
        if self._pending_refills:
            self._refill_pending(out)
        if self.draining and not self._shutdown_done:
            self._maybe_finish_shutdown(now, out)
        return out

    def handle_message(self, event: MessageReceived, now: float) -> list[Command]:
        """``handle(event, now)`` for a publisher's message: the adapter's call for each
        one, which compiled.py replaces with its compiled twin when built."""
        return self.handle(event, now)

    def accepted_batch(self, items: list[Any], now: float, out: list[Command]) -> None:
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
            # Compact (answers set): so is its roster. Not checked: per copy.
            i = record.roster.index.get(key)  # type: ignore[union-attr]
            if i is None:
                continue
            # _on_accepted_compact for its usual case, inlined: the first answer of
            # this subscriber, others still to answer, local subscribers only, its
            # publisher attached, no settlement evidence due. Its only consequence is
            # the sub-outcome line.
            if (
                not answers[i]
                and record.waiting > 1
                and not record.targeted
                and record.outcome is None
                and not record.remote_routers
                and not record.moved
                and record.origin_router is None
                and record.pub_delivery is not None
                and not (sub.awaiting_evidence and sub.awaiting_evidence[0][0] < record.sent_at)
            ):
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

    def failover_list(self) -> list[tuple[str, int, str]]:
        """The other reachable routers' client addresses (a query, for open frames)."""
        return self.net.failover_list()

    def _on_expire_subscription(self, ev: ExpireSubscription, now: float, out: list[Command]) -> None:
        sub = self.subscriptions.get(ev.key)
        if sub is not None and sub.link_id is None:
            self._end_subscription(sub, now, out, reason="expired")

    def _on_listeners_ready(self, ev: ListenersReady, now: float, out: list[Command]) -> None:
        self.net.addresses[self.settings.router_id] = tuple((h, p, s) for h, p, s in ev.addresses)
        self._flood(self.net.address_message(self.settings.router_id), None, out)

    # ------------------------------------------------------------ attaching

    # ------------------------------------------------------------ detaching

    # ------------------------------------------------------------ messages

    # ------------------------------------------------------------ outcomes

    # ------------------------------------------------------------ settlement

    # ------------------------------------------------------------ credit

    # ------------------------------------------------------------ timers

    def _add_timer(self, deadline: float, kind: int, obj: Any) -> None:
        heapq.heappush(self._timers, (deadline, next(self._timer_seq), kind, obj))

    def _on_timer(self, ev: TimerFired, now: float, out: list[Command]) -> None:
        timers = self._timers
        while timers and timers[0][0] <= now:
            deadline, _, kind, obj = heapq.heappop(timers)
            if kind == _TIMER_LINGER:
                record: DeliveryRecord = obj
                if self.records.get(record.tag) is record:
                    self._delete(record, "linger-expired", out)
            elif kind == _TIMER_EXPIRY:
                self._expire_message(obj, now, out)
            elif kind == _TIMER_SUBSCRIPTION:
                sub: Subscription = obj
                if sub.expires_at == deadline and sub.link_id is None and self.subscriptions.get(sub.key) is sub:
                    self._end_subscription(sub, now, out, reason="expired")
            elif kind == _TIMER_SHUTDOWN:
                self._release_all_for_shutdown(now, out)
            elif kind == _TIMER_ORDER_GAP:
                stream, prev = obj
                held = self._held.get(stream)
                if held and prev in held:
                    gap = held.pop(prev)
                    if not held:
                        del self._held[stream]
                    for data, header in sorted(gap, key=lambda item: item[1].get("seq", 0)):
                        out.append(Log("order-gap", {"delivery": data.tag.hex(), "missing_seq": prev}))
                        self._deliver_chain(stream, data, header, now, out)
            elif kind == _TIMER_PLACEHOLDER:
                self.resumption.placeholder_expired(obj[0], obj[1], now, out)
            elif kind == _TIMER_PUBLISHER_GONE:
                link_id, records = obj
                if link_id not in self.publishers:
                    self._publisher_gone(records, now, out)
            elif kind == _TIMER_MEMBERSHIP:
                self._membership_changed(self.net.membership.expire_lost(now), now, out)
                self.resumption.schedule_membership_expiry()
            elif kind == _TIMER_SETTLED_SWEEP:
                self._sweep_settled(now, out)
            elif kind == _TIMER_STREAM_SEQ:
                pub: PublisherLink = obj
                if self.publishers.get(pub.link_id) is pub and pub.awaiting_seq:
                    out.append(Log("stream-seq-timeout", {"link": pub.link_id, "routers": sorted(pub.awaiting_seq)}))
                    self.resumption.stream_seq_known(pub, now, out)
            elif kind == _TIMER_ANNOUNCE:
                key, link_id, first = obj
                waiting = self._awaiting_acks.get(key)
                if waiting is not None and waiting[0] == link_id:
                    held_sub = self.subscriptions.get(key)
                    if first and held_sub is not None and held_sub.link_id == link_id and self._moved_here(key):
                        # It moved here from another router: what may still come to it by
                        # way of there, the unconfirmed routers have not named yet (their
                        # sub-ack). Its attach is answered (its client waits for that), what
                        # it is owed held until they do (or they become unreachable), or
                        # the placeholder timeout.
                        out.append(Log("announce-timeout", {"subscriber": key, "routers": sorted(waiting[1]), "held": True}))
                        self._answered_early.add(key)
                        self._answer_attach(held_sub, link_id, out)
                        self._add_timer(now + self.settings.placeholder_timeout, _TIMER_ANNOUNCE, (key, link_id, False))
                    else:
                        out.append(Log("announce-timeout", {"subscriber": key, "routers": sorted(waiting[1])}))
                        self._subscriber_ready(key, out)

    def _sweep_settled(self, now: float, out: list[Command]) -> None:
        """Forget the settled deliveries of streams a resume horizon quiet (or, over
        the limit, the quietest): their resends are refused from now on. What else
        is kept per stream goes with them."""
        in_use = self._stream_in_use()
        forgotten = self.settled.sweep(now, in_use.__contains__, lambda s: self.stream_seq.get(s, -1))
        for stream in forgotten:
            self.stream_seq.pop(stream, None)
            self._chain_head.pop(stream, None)
            self._chain_start.pop(stream, None)
        if forgotten and self.addressed_last:  # (a router passing a moved subscriber's copies on)
            gone = set(forgotten)
            for key in [k for k in self.addressed_last if k[0] in gone]:
                del self.addressed_last[key]
        if forgotten:
            out.append(Log("streams-forgotten", {"count": len(forgotten), "remembered": len(self.settled.streams)}))
        horizon = now - self.settled.horizon
        while self._flooded:
            stamp, when = next(iter(self._flooded.items()))
            if when > horizon:
                break
            del self._flooded[stamp]
        while self.resumed_at:
            stream, (_, when) = next(iter(self.resumed_at.items()))
            if when > horizon:
                break
            del self.resumed_at[stream]
        self._sweep_at = None
        self._arm_sweep(now)

    def _arm_sweep(self, now: float) -> None:
        """Arm the next sweep of what is remembered for a horizon, unless one is armed."""
        if self._sweep_at is None:
            self._sweep_at = now + self.settled.sweep_interval()
            self._add_timer(self._sweep_at, _TIMER_SETTLED_SWEEP, None)

    def _stream_in_use(self) -> set[bytes]:
        """Streams with a publisher link here or a record here: never forgotten."""
        in_use = set(self.streams)
        for record in self.records.values():
            in_use.add(record.tag[: tags.STREAM_ID_SIZE])
        return in_use

    # ------------------------------------------------------------ shutdown

    def _on_shutdown(self, ev: ShutdownRequested, now: float, out: list[Command]) -> None:
        if self.draining:
            return
        self.draining = True
        self._drain_deadline = now + ev.grace
        out.append(Log("router-stopping", {"reason": "shutdown requested"}))
        self._add_timer(self._drain_deadline, _TIMER_SHUTDOWN, None)

    def _release_all_for_shutdown(self, now: float, out: list[Command]) -> None:
        for record in list(self.records.values()):
            if record.outcome is None:
                self._answer_publisher(
                    record,
                    Outcome(outcomes.RELEASED, outcomes.SHUTTING_DOWN, "router shut down before every subscriber answered"),
                    now,
                    out,
                )

    def _maybe_finish_shutdown(self, now: float, out: list[Command]) -> None:
        for record in self.records.values():
            if record.outcome is None:
                return
        self._shutdown_done = True
        out.append(ShutdownComplete())

    # ------------------------------------------------------------ network

    # ------------------------------------------------------------ helpers

    def _topic(self, name: str) -> Topic:
        topic = self.topics.get(name)
        if topic is None:
            guarantee = guarantee_of(self.settings.guarantees, name) if self.settings.guarantees else DEFAULT_GUARANTEE
            topic = self.topics[name] = Topic(name, guarantee)
            topic.est = self.settings.max_message_size
            if len(self.pattern_subs):
                for key in self.pattern_subs.match(name):
                    topic.subscriptions[key] = self.subscriptions[key]  # type: ignore[index]
        return topic

    def _topic_if_wanted(self, name: str) -> Topic | None:
        """The topic, if it exists here or a subscription to a pattern here matches
        it (then it is made: a message relayed to us on it is owed to them)."""
        topic = self.topics.get(name)
        if topic is None and len(self.pattern_subs) and isinstance(name, str) and self.pattern_subs.match(name):
            topic = self._topic(name)
        return topic

    def _topics_matching(self, address: str) -> list[Topic]:
        """The topics here that a subscription to ``address`` belongs to."""
        if not is_pattern(address):
            topic = self.topics.get(address)
            return [] if topic is None else [topic]
        return [topic for name, topic in self.topics.items() if matches(address, name)]

    def _topics_of(self, sub: Subscription) -> list[Topic]:
        """The topics ``sub`` belongs to (one, unless it subscribed to a pattern)."""
        if not sub.pattern:
            topic = self.topics.get(sub.topic)
            return [] if topic is None else [topic]
        return [topic for topic in self.topics.values() if topic.subscriptions.get(sub.key) is sub]

    def _records_for(self, sub: Subscription) -> list[DeliveryRecord]:
        """The records of the topics ``sub`` belongs to, in arrival order, each
        publisher stream's in publisher order."""
        topics = self._topics_of(sub)
        if len(topics) == 1:
            return in_publisher_order(list(topics[0].records.values()))
        return in_publisher_order(sorted((r for t in topics for r in t.records.values()), key=lambda r: r.order))

    records_for = _records_for  # a service of the resumption component (SERVICES)
    topics_taken_by = _topics_matching  # likewise
    arm_sweep = _arm_sweep  # likewise

    def _drop_topic_if_idle(self, topic: Topic) -> None:
        if topic.idle() and self.topics.get(topic.name) is topic:
            del self.topics[topic.name]
