"""Attaching and detaching links: publishers, subscribers (durable or not), connections.

A mixin of ``RouterCore`` (router/core/router.py): its methods share the core's state,
documented there, and are split out only to keep one concern per module."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from router.core import tags
from router.core.announcements import seq_ranges
from router.core.commands import (
    Command,
    DetachLink,
    Log,
    OpenLink,
)
from router.core.constants import (
    _TIMER_ANNOUNCE,
    _TIMER_PUBLISHER_GONE,
    _TIMER_SUBSCRIPTION,
    ANNOUNCE_TIMEOUT,
    GONE,
    INCARNATION_PROPERTY,
    MAX_ADDRESS_LENGTH,
    UNSETTLED_PROPERTY,
)
from router.core.errors import ProtocolError
from router.core.events import (
    DURABLE_NONE,
    PUBLISHER,
    RCV_FIRST,
    SND_SETTLED,
    SUBSCRIBER,
    ConnectionLost,
    LinkAttached,
    LinkDetached,
)
from router.core.guarantees import AT_LEAST_ONCE, AT_MOST_ONCE, Guarantee, guarantee_of
from router.core.guarantees import DEFAULT as DEFAULT_GUARANTEE
from router.core.links import PublisherLink, Subscription, Topic
from router.core.moved import _split_key
from router.core.network import (
    announcement_message,
)
from router.core.records import DeliveryRecord
from router.core.resumption import reported_unsettled
from router.core.selector import NOT_A_STRING, Selector, SelectorError, compile_selector
from router.core.topictrie import is_pattern, pattern_problem

if TYPE_CHECKING:
    from router.core.corestate import CoreState
else:
    CoreState = object  # declarations for mypy only: no base class at run time


class AttachMixin(CoreState):
    def _on_attach(self, ev: LinkAttached, now: float, out: list[Command]) -> None:
        address = ev.address
        if not address:
            what = "target" if ev.role == PUBLISHER else "source"
            out.append(DetachLink(ev.link_id, "amqp:invalid-field", f"a {ev.role} link needs a {what} address naming the topic"))
            return
        if len(address) > MAX_ADDRESS_LENGTH:
            out.append(DetachLink(ev.link_id, "amqp:invalid-field", f"topic address longer than {MAX_ADDRESS_LENGTH} characters"))
            return
        if is_pattern(address):
            problem = pattern_problem(address) if ev.role == SUBSCRIBER else f"{address!r} is a topic pattern"
            if problem is not None:
                what = "a subscriber's source" if ev.role == SUBSCRIBER else "a publisher's target names one topic"
                out.append(DetachLink(ev.link_id, "amqp:invalid-field", f"{what}: {problem}"))
                return
        self.links_by_conn.setdefault(ev.conn_id, set()).add(ev.link_id)
        self.link_conn[ev.link_id] = ev.conn_id
        if ev.role == PUBLISHER:
            self._attach_publisher(ev, address, now, out)
        elif ev.role == SUBSCRIBER:
            self._attach_subscriber(ev, address, now, out)
        else:
            raise ProtocolError("amqp:internal-error", f"unknown link role {ev.role!r}")

    def _attach_publisher(self, ev: LinkAttached, address: str, now: float, out: list[Command]) -> None:
        guarantee = self._guarantee_for(ev, address, out)
        if guarantee is None:
            return
        self._steal_publisher_link(ev, now, out)
        claimed = self._claim_stream(ev, now, out)
        if claimed is None:
            return
        stream, incarnation, resumed = claimed
        topic = self._topic(address)
        pub = PublisherLink(
            ev.link_id,
            ev.conn_id,
            ev.container_id,
            ev.name,
            address,
            incarnation,
            stream,
            ev.snd_settle_mode == SND_SETTLED or guarantee.mode == AT_MOST_ONCE,
            # At-least-once: settled with its outcome (no settlement phase to wait for).
            ev.rcv_settle_mode == RCV_FIRST or guarantee.mode == AT_LEAST_ONCE,
        )
        self.publishers[ev.link_id] = pub
        topic.publishers[ev.link_id] = pub
        properties: dict[str, Any] = {INCARNATION_PROPERTY: incarnation}
        self._log_attached(ev, PUBLISHER, address, incarnation, resumed, out)
        if resumed and guarantee.mode == AT_MOST_ONCE:
            properties[UNSETTLED_PROPERTY] = self.resumption.resume_at_most_once(pub, ev.properties, now, out)
        elif resumed:
            properties[UNSETTLED_PROPERTY] = self.resumption.resume_publisher(pub, ev.properties, topic, now, out)
        out.append(OpenLink(ev.link_id, 0, properties, pub.presettled, guarantee.mode == AT_LEAST_ONCE))
        self._refill_credit(topic, out)

    def _steal_publisher_link(self, ev: LinkAttached, now: float, out: list[Command]) -> None:
        """A publisher link of the same container-id and name still attached here is
        detached: the newer attach is the publisher's (a client failing over or
        reconnecting before we noticed it left)."""
        for other in self.publishers.values():
            if other.container_id == ev.container_id and other.name == ev.name:
                out.append(
                    DetachLink(
                        other.link_id,
                        "amqp:link:stolen",
                        "a newer link with the same container-id and name attached",
                        close=False,
                    )
                )
                self._detach_publisher(other, "stolen", now, out)
                break

    def _claim_stream(self, ev: LinkAttached, now: float, out: list[Command]) -> tuple[bytes, str, bool] | None:
        """(stream id, incarnation, resumed?) of a publisher link: the incarnation it
        presents (it resumes its stream) or a fresh one, and the stream id the
        outgoing tags of its deliveries start with. None: that id is another
        stream's (a hash collision), and the attach is refused."""
        presented = (ev.properties or {}).get(INCARNATION_PROPERTY)
        if isinstance(presented, str) and 0 < len(presented) <= 128:
            resumed, incarnation = True, presented
        else:
            resumed, incarnation = False, tags.fresh_incarnation(self.boot_id, next(self._incarnations), now)
        stream = tags.stream_id(ev.container_id, ev.name, incarnation)
        triple = (ev.container_id, ev.name, incarnation)
        known = self.streams.get(stream)
        if known is not None and known != triple:
            out.append(
                Log(
                    "tag-collision",
                    {"link": ev.link_id, "container": ev.container_id, "name": ev.name, "incarnation": incarnation},
                )
            )
            out.append(
                DetachLink(
                    ev.link_id, "amqp:internal-error", "delivery-tag stream id collision; attach again for a fresh incarnation"
                )
            )
            return None
        self.streams[stream] = triple
        return stream, incarnation, resumed

    def _log_attached(
        self, ev: LinkAttached, role: str, address: str, incarnation: str, resumed: bool, out: list[Command]
    ) -> None:
        out.append(
            Log(
                "link-attached",
                {
                    "link": ev.link_id,
                    "conn": ev.conn_id,
                    "container": ev.container_id,
                    "name": ev.name,
                    "role": role,
                    "address": address,
                    "durable": ev.durable,
                    "incarnation": incarnation,
                    "resumed": resumed,
                },
            )
        )

    def _guarantee_for(self, ev: LinkAttached, address: str, out: list[Command]) -> Guarantee | None:
        """The guarantee of the topic a link names (docs/guarantees.md); None: the link
        asked for pre-settled deliveries on a topic a rule makes exactly-once or
        at-least-once, and is refused. (A subscription to a pattern takes each topic's own: it is told none.)"""
        if not self.settings.guarantees or (ev.role == SUBSCRIBER and is_pattern(address)):
            return DEFAULT_GUARANTEE
        guarantee = guarantee_of(self.settings.guarantees, address)
        if guarantee.rule is not None and guarantee.mode != AT_MOST_ONCE and ev.snd_settle_mode == SND_SETTLED:
            what = "a publisher must send" if ev.role == PUBLISHER else "a subscriber must take"
            out.append(
                DetachLink(
                    ev.link_id,
                    "amqp:precondition-failed",
                    f"{guarantee.describe(address)}: {what} unsettled deliveries (snd-settle-mode unsettled or mixed)",
                )
            )
            return None
        return guarantee

    def _attach_subscriber(self, ev: LinkAttached, address: str, now: float, out: list[Command]) -> None:
        guarantee = self._guarantee_for(ev, address, out)
        if guarantee is None:
            return
        selector = _selector_of(ev)  # before anything changes: a bad one refuses the attach
        key = f"{ev.container_id}/{ev.name}"
        sub = self.subscriptions.get(key)
        if sub is not None and sub.link_id is not None:  # attached
            self._steal_subscriber_link(sub, sub.link_id, out)
        if sub is not None and sub.topic != address:
            # The same name re-attached to another topic: the old subscription ends.
            self._end_subscription(sub, now, out, reason="re-attached-elsewhere")
            sub = None
        resumed = sub is not None
        pattern = is_pattern(address)
        # A pattern joins the topics it matches that exist here; the others as they come.
        topics = self._topics_matching(address) if pattern else [self._topic(address)]
        for topic in topics:
            topic.roster = None  # a subscription comes, or changes link or settle mode
        if sub is None:
            sub = Subscription(key, ev.container_id, ev.name, address, pattern)
            self.subscriptions[key] = sub
            if pattern:
                self.pattern_subs.add(address, key)
            for topic in topics:
                topic.subscriptions[key] = sub
        sub.durable = ev.durable != DURABLE_NONE
        if not resumed and sub.durable and not reported_unsettled(ev.properties)[0]:
            sub.before = _deliveries_here(topics)
        sub.timeout = self._terminus_timeout(ev)
        sub.link_id = ev.link_id
        sub.conn_id = ev.conn_id
        # Pre-settled copies, never owed: it asked for them, or its topic is at-most-once.
        sub.best_effort = ev.snd_settle_mode == SND_SETTLED or guarantee.mode == AT_MOST_ONCE
        sub.selector = selector  # a re-attach's selector applies to what comes from now on
        sub.credit = 0
        sub.drain = False
        sub.expires_at = None
        sub.awaiting_evidence.clear()
        self.subscribers[ev.link_id] = sub
        self._announce_subscriber(sub, ev, address, resumed, now, out)
        self._log_attached(ev, SUBSCRIBER, address, "", resumed, out)
        self._owe_again(sub, ev, resumed, now, out)

    def _steal_subscriber_link(self, sub: Subscription, old_link: int, out: list[Command]) -> None:
        """Link stealing: the newer attach takes over the same terminus (this is what a
        failing-over client does), so the subscription carries on; its old link goes."""
        out.append(
            DetachLink(old_link, "amqp:link:stolen", "a newer link with the same container-id and name attached", close=False)
        )
        del self.subscribers[old_link]
        self._forget_link(old_link)
        out.append(
            Log(
                "link-detached",
                {
                    "link": old_link,
                    "container": sub.container_id,
                    "name": sub.name,
                    "role": SUBSCRIBER,
                    "closed": False,
                    "reason": "stolen",
                },
            )
        )

    def _announce_subscriber(
        self, sub: Subscription, ev: LinkAttached, address: str, resumed: bool, now: float, out: list[Command]
    ) -> None:
        """Tell the network, and answer the attach once it knows (the propagation race:
        a publisher anywhere that starts after this subscriber saw its attach cannot
        miss it), or at once when no other router is reachable."""
        announcement = self.net.announcer.attached(
            address, ev.container_id, ev.name, durable=sub.durable, resumed=resumed, timeout=sub.timeout, before=sub.before
        )
        sub.announced = True
        self.net.membership_changed()
        self._flood(announcement_message(announcement), None, out)
        waiting_for = self.net.reachable()
        if waiting_for:
            sub.ready = False
            self._awaiting_acks[sub.key] = (ev.link_id, set(waiting_for), announcement.version)
            self._add_timer(now + ANNOUNCE_TIMEOUT, _TIMER_ANNOUNCE, (sub.key, ev.link_id, True))
        else:
            sub.ready = True
            out.append(OpenLink(ev.link_id, sub.timeout if sub.durable else 0, None, sub.best_effort))

    def _owe_again(self, sub: Subscription, ev: LinkAttached, resumed: bool, now: float, out: list[Command]) -> None:
        """A subscriber back (re-attached, resuming, or durable): what is still owed to
        it goes out again, in publisher order: what it missed while detached and what
        was in flight (a resuming receiver also gets again what it reported, to answer
        and to see settled on)."""
        key = sub.key
        resuming, _, _ = reported_unsettled(ev.properties)
        for record in self._records_for(sub):  # (a copy: answering a publisher may delete a record)
            if key in record.moved and not record.pub_settled:
                if self.resumption.selects(record, key, out):
                    self.resumption.owe_here(record, key)  # it had moved away and came back here
                elif record.outcome is None and record.origin_router is None:
                    self._maybe_answer_publisher(record, now, out)  # that obligation was the last
        if resuming:
            answer = self.resumption.resume_subscriber(sub, ev.properties, self._records_for(sub), now, out)
            self._set_open_properties(ev.link_id, {UNSETTLED_PROPERTY: answer}, out)
        if resumed or resuming or sub.durable:
            sub.queue.clear()
            for record in self._records_for(sub):
                state = record.subscribers.get(key)
                if state is not None and (state.outcome is None or state.resend) and not record.pub_settled:
                    state.sent = 0
                    sub.queue.append(record)
            # Back while a publisher of its topics resends here: what it is owed of that
            # stream waits for the resends listed before it (as at the resume itself).
            for topic in self._topics_of(sub):
                for pub in topic.publishers.values():
                    if pub.resend_seqs:
                        self.resumption.wait_for_earlier_resends(pub, now, out)

    def _set_open_properties(self, link_id: int, properties: dict[str, Any], out: list[Command]) -> None:
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

    def _on_detach(self, ev: LinkDetached, now: float, out: list[Command]) -> None:
        self._forget_link(ev.link_id)
        pub = self.publishers.get(ev.link_id)
        if pub is not None:
            self._detach_publisher(pub, "closed" if ev.closed else "detached", now, out)
            return
        sub = self.subscribers.get(ev.link_id)
        if sub is not None:
            self._unlink_subscriber(sub, now, out, reason="closed" if ev.closed else "detached", closed=ev.closed)

    def _on_connection_lost(self, ev: ConnectionLost, now: float, out: list[Command]) -> None:
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
        if conn_id is None:
            return
        links = self.links_by_conn.get(conn_id)
        if links is not None:
            links.discard(link_id)
            if not links:
                del self.links_by_conn[conn_id]

    def _detach_publisher(self, pub: PublisherLink, reason: str, now: float, out: list[Command]) -> None:
        del self.publishers[pub.link_id]
        topic = self.topics[pub.topic]
        del topic.publishers[pub.link_id]
        topic.outstanding_credit -= pub.credit
        self._promised -= pub.credit * topic.est
        pub.credit = 0
        out.append(
            Log(
                "link-detached",
                {
                    "link": pub.link_id,
                    "container": pub.container_id,
                    "name": pub.name,
                    "role": PUBLISHER,
                    "closed": reason == "closed",
                    "reason": reason,
                },
            )
        )
        # Its unsettled records stay: subscribers still finish them. It may resume
        # (on any router) within publisher_resume_timeout; after that, or at once if
        # it closed its link, a record whose outcome is final is settled for it.
        self.resumption.release_answers(pub.link_id, now, out)
        orphans = [r for r in topic.records.values() if r.pub_link == pub.link_id and not r.pub_settled]
        for record in orphans:
            if record.pub_delivery is not None:
                self.by_delivery.pop(record.pub_delivery, None)
                record.pub_delivery = None
        if reason == "closed":
            self._publisher_gone(orphans, now, out)
        elif orphans:
            self._add_timer(now + self.settings.publisher_resume_timeout, _TIMER_PUBLISHER_GONE, (pub.link_id, orphans))
        if not any(r.stream == pub.stream for r in self.publishers.values()):
            still_used = any(r.pub_link == pub.link_id for r in topic.records.values())
            if not still_used:
                self.streams.pop(pub.stream, None)
                for key in [k for k in self._last_sent if k[0] == pub.stream]:
                    del self._last_sent[key]
                for key in [k for k in self.addressed_last if k[0] == pub.stream]:
                    del self.addressed_last[key]
        self._refill_credit(topic, out)
        self._drop_topic_if_idle(topic)

    def _publisher_gone(self, records: list[DeliveryRecord], now: float, out: list[Command]) -> None:
        for record in records:
            if record.pub_settled or record.pub_delivery is not None or self.records.get(record.tag) is not record:
                continue  # settled, resumed meanwhile, or gone
            if record.origin_router is not None:
                continue  # handed over: its publisher resumed at another router, whose settlement ends it here
            record.pub_link = GONE
            if record.outcome is not None:
                self._settle_record(record, "publisher-gone", now, out)

    def _unlink_subscriber(self, sub: Subscription, now: float, out: list[Command], reason: str, closed: bool) -> None:
        link_id = sub.link_id
        assert link_id is not None  # only an attached subscription is unlinked
        del self.subscribers[link_id]
        sub.link_id = None
        sub.conn_id = None
        sub.credit = 0
        sub.listed.clear()  # listed in that link's answer: settled on that link or not at all
        for topic in self._topics_of(sub):
            topic.roster = None
        out.append(
            Log(
                "link-detached",
                {
                    "link": link_id,
                    "container": sub.container_id,
                    "name": sub.name,
                    "role": SUBSCRIBER,
                    "closed": closed,
                    "reason": reason,
                },
            )
        )
        self._awaiting_acks.pop(sub.key, None)
        self._answered_early.discard(sub.key)
        if sub.announced:
            detached = self.net.announcer.detached(sub.container_id, sub.name, closed=closed)
            sub.announced = detached.retained
            self.net.membership_changed()
            self._flood(announcement_message(detached), None, out)
        if closed or not sub.durable or sub.timeout <= 0:
            self._end_subscription(sub, now, out, reason=reason)
            return
        elsewhere = self.net.membership.where(_split_key(sub.key))
        if elsewhere is not None and elsewhere != self.settings.router_id:
            # It already re-attached at another router (it lost us before we lost
            # it: a cut link, not a death): what it is owed here follows it there.
            self.resumption.local_subscriber_moved(sub.key, elsewhere, now, out)
            return
        sub.expires_at = now + sub.timeout
        self._add_timer(sub.expires_at, _TIMER_SUBSCRIPTION, sub)
        # What was sent and not answered will be resent on re-attach. The settlements
        # it may not have seen stay unknown until it answers again (or linger ends).
        sub.queue.clear()
        sub.awaiting_evidence.clear()

    def _end_subscription(self, sub: Subscription, now: float, out: list[Command], reason: str) -> None:
        """The subscription is gone: it stops counting toward any outcome."""
        if sub.link_id is not None:
            del self.subscribers[sub.link_id]
            sub.link_id = None
        topics = self._topics_of(sub)
        records = self._records_for(sub)
        self.subscriptions.pop(sub.key, None)
        if sub.pattern:
            self.pattern_subs.remove(sub.topic, sub.key)
        for topic in topics:
            topic.subscriptions.pop(sub.key, None)
            topic.roster = None
        sub.queue.clear()
        sub.awaiting_evidence.clear()
        if sub.announced:  # a retained (durable, detached) subscription ends now
            sub.announced = False
            self._flood(announcement_message(self.net.announcer.expired(sub.container_id, sub.name)), None, out)
        if reason == "expired":
            out.append(Log("subscription-expired", {"container": sub.container_id, "name": sub.name, "address": sub.topic}))
        for record in records:
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
        for topic in topics:
            self._drop_topic_if_idle(topic)


def _selector_of(ev: LinkAttached) -> Selector | None:
    """The subscriber's compiled selector (None: it takes every message); a selector
    that does not parse, or is not a string, refuses the attach (invalid-field)."""
    text = ev.selector
    if text is None:
        return None
    if text.startswith(NOT_A_STRING):
        raise ProtocolError("amqp:invalid-field", f"selector filter: expected a string, found {text[1:]}")
    try:
        return compile_selector(text)
    except SelectorError as err:
        raise ProtocolError("amqp:invalid-field", f"selector {text[:200]!r}: {err}") from None


def _deliveries_here(topics: list[Topic]) -> dict[str, list[list[int]]] | None:
    """The deliveries of ``topics`` held here, as a new subscription to them begins:
    publisher stream (hex) -> stream_seq ranges (SubscriberAttached.before)."""
    seqs: dict[bytes, list[int]] = {}
    for topic in topics:
        for record in topic.records.values():
            seqs.setdefault(record.tag[: tags.STREAM_ID_SIZE], []).append(record.stream_seq)
    return {stream.hex(): seq_ranges(found) for stream, found in seqs.items()} or None
