"""Following subscribers that moved: a lost router's durable subscribers, and ours that
attached at another router, are owed what they were owed here wherever they attach
again (docs/resumption.md). Copies addressed to them there (targeted copies) and their
answers, one per subscriber; a copy another router addresses to ours here.

The base of the ``Resumption`` component (router/core/resumption.py): its public methods
are part of that component's interface, called by the core as ``self.resumption.*``, and
it keeps the same rules: the core's public state and ``RouterCore.SERVICES`` only.
Pure like the rest of the core.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, NamedTuple

from router.core import outcomes, tags
from router.core.announcements import RemoteSubscriberRemoved, SubscriberKey
from router.core.commands import Command, Log, SendData
from router.core.constants import _TIMER_MEMBERSHIP
from router.core.links import queue_in_order
from router.core.msgfields import selector_env
from router.core.outcomes import OUTCOME_ACCEPTED, Outcome
from router.core.records import DeliveryRecord, MovedState, SubscriberState
from router.core.topictrie import matches

#: How long a router passes on what origins still send it for a durable subscriber that
#: moved on: they stop once they hear of the move, a flood away; this covers a busy
#: network's delay. A copy later than that is still the known gap.
MOVED_AWAY_GRACE = 10.0
#: How long after a move a router still names the subscriber to the origin of a copy
#: that came for it ("left"), at most (the subscription's terminus timeout if shorter):
#: a copy in flight longer than that on a live route is the remaining loss window. Not
#: longer, because it costs one control message per copy of the topic there meanwhile.
LEFT_BEHIND_HORIZON = 60.0


class MovedAway(NamedTuple):
    """A durable subscriber that moved from here to another router lately."""

    address: str  # a topic, or a pattern of topics when ``pattern``
    pattern: bool
    selector: Any  # its Selector, or None
    until: float  # passed on until then
    # Until then, what comes for it later is named to its origin as left behind ("left"):
    # the origin owes it itself, if it sent it here before it heard of the move.
    forget_at: float


if TYPE_CHECKING:
    from collections.abc import Iterable

    from router.core.announcements import Change
    from router.core.router import RouterCore


class MovedSubscribers:
    """What the ``Resumption`` component does for subscribers that moved. No state of
    its own: what each record owes a moved subscriber is in the record (``moved``,
    ``targeted``)."""

    def __init__(self, core: RouterCore) -> None:
        self.core = core

    def selects(self, record: DeliveryRecord, key: str, out: list[Command]) -> bool:
        """Whether local subscriber ``key``'s selector (if any) selects ``record``; a
        subscriber that does not is never owed it, on any path that owes it late (it
        came back, moved here, resumed, was addressed a copy), and is named among the
        record's filtered. A record whose message is gone (settled) is not judged."""
        sub = self.core.subscriptions.get(key)
        if sub is None or sub.selector is None or record.payload is None:
            return True
        if sub.selector.selects(selector_env(record.payload)):
            return True
        if record.moved and key in record.moved:
            del record.moved[key]
        if key not in (record.filtered or ()):
            record.filtered = [*(record.filtered or ()), key]
            # What it was owed elsewhere ends here: the proof reads it as settled for it.
            out.append(Log("owed-state-discarded", {"delivery": record.delivery_id, "subscriber": key, "reason": "filtered"}))
        return False

    def owe_here(self, record: DeliveryRecord, key: str) -> SubscriberState:
        """Make ``record`` owed to local subscriber ``key`` (late: after the record's
        answer to its origin went out, the subscriber answers individually)."""
        record.waiting = -1  # its states change outside the count
        state = record.subscribers.get(key)
        if state is None:
            state = record.subscribers[key] = SubscriberState()
            if record.origin_router is not None and record.outcome is not None:
                record.own_targeted()[key] = record.origin_router
        moved = record.moved.get(key)
        if moved is not None:
            del record.moved[key]
        if moved is not None and moved.outcome is not None and state.outcome is None:
            state.outcome = moved.outcome
        return state

    def router_lost(self, router_id: str, now: float, out: list[Command]) -> None:
        """A router became unreachable: stop waiting for *it*; wait for its durable
        subscribers wherever they re-attach (within their terminus timeout)."""
        self.core.net.membership.router_lost(router_id, now)
        self.core.net.membership_changed()
        for record in list(self.core.records.values()):
            if record.targeted and record.origin_router is not None:
                # A subscriber here it addressed answers nobody now (found by the
                # generated histories, a subscriber moving twice and A dying).
                self.untarget(record, {router_id}, now, out)
            state = record.remote_routers.get(router_id)
            if state is None or state.outcome is not None or record.pub_settled:
                continue
            del record.remote_routers[router_id]
            keys = self.durable_owed_at(router_id, record)
            owed = [key for key in keys if self._owe_moved_or_local(record, key, now, out)]
            out.append(Log("owed-moved", {"delivery": record.delivery_id, "from_router": router_id, "subscribers": owed}))
            self.resend_to_moved(record, out)
            if record.outcome is None:
                self.core.maybe_answer_publisher(record, now, out)
        self.schedule_membership_expiry()

    def durable_owed_at(self, router_id: str, record: DeliveryRecord) -> list[str]:
        """The durable subscribers of ``record``'s topic at ``router_id`` (lost) that it
        was owed to there: every one we know of there, but those whose subscription
        began after the delivery had arrived (their announcement says what was there
        before them): they were never owed it, and handed it now they would get it
        after later messages they already had, out of publisher order."""
        stream = record.tag[: tags.STREAM_ID_SIZE]
        return [
            str(s.key)
            for s in self.core.net.membership.subscribers_at(router_id, record.topic)
            if s.durable and not s.was_here_before(stream, record.stream_seq)
        ]

    def owe_lost_subscribers(self, record: DeliveryRecord, out: list[Command]) -> None:
        """Durable subscribers of routers we lost are owed new deliveries too (they
        are detached within their terminus timeout), wherever they re-attach."""
        membership = self.core.net.membership
        for router_id in self.core.lost:
            for remote in membership.subscribers_at(router_id, record.topic):
                if remote.durable and membership.where(remote.key) is None:
                    self._owe_moved_or_local(record, str(remote.key), None, out)
        if record.moved:
            self.resend_to_moved(record, out)

    def _owe_moved_or_local(self, record: DeliveryRecord, key: str, now: float | None, out: list[Command]) -> bool:
        """Owe ``record`` to a subscriber of a lost router: here if it already
        re-attached here, else wherever it shows up. False: it is not owed it (it is
        back here, and its selector does not select it), so no log may say it is."""
        sub = self.core.subscriptions.get(key)
        if sub is None:
            record.own_moved().setdefault(key, MovedState())
            return True
        if key not in record.subscribers:
            if not self.selects(record, key, out):
                return False
            self.owe_here(record, key)
            if sub.link_id is not None:
                sub.queue.append(record)
                if now is not None:
                    self.core.pump(sub, now, out)
        return True

    def local_subscriber_moved(self, key: str, to_router: str, now: float, out: list[Command]) -> None:
        """A durable subscriber we held (detached, retained) attached at another router:
        what it is owed here follows it there."""
        sub = self.core.subscriptions.get(key)
        if sub is None or sub.attached:
            return
        for record in self.core.records_for(sub):
            state = record.subscribers.get(key)
            if state is None or state.outcome is not None or record.pub_settled:
                continue
            del record.subscribers[key]
            record.waiting = -1
            record.own_moved()[key] = MovedState()
            out.append(
                Log(
                    "owed-moved",
                    {"delivery": record.delivery_id, "from_router": self.core.settings.router_id, "subscribers": [key]},
                )
            )
        sub.announced = False  # its new router announces it now
        # An origin that has not heard of the move yet still sends here what it owes
        # the subscriber: passed on for a while, as what it was owed here is now.
        moved_away = self.core.moved_away
        for old_key in [k for k, entry in moved_away.items() if entry.forget_at <= now]:
            del moved_away[old_key]
        until = now + MOVED_AWAY_GRACE
        forget_at = max(until, now + min(sub.timeout, LEFT_BEHIND_HORIZON))
        moved_away[key] = MovedAway(sub.topic, sub.pattern, sub.selector, until, forget_at)
        self.core.end_subscription(sub, now, out, reason="moved")
        self.moved_subscriber_at(key, to_router, now, out)

    def moved_away_for(self, topic: str, now: float) -> list[str]:
        """The durable subscribers that moved from here lately whose address takes
        ``topic`` (and that are not back here)."""
        return sorted(
            key
            for key, away in self.core.moved_away.items()
            if away.until > now
            and (matches(away.address, topic) if away.pattern else away.address == topic)
            and key not in self.core.subscriptions
        )

    def left_behind_for(self, topic: str, payload: bytes, now: float) -> list[str]:
        """The durable subscribers that moved from here, past the grace in which we pass
        on what comes for them, whose address takes ``topic`` and whose selector selects
        ``payload`` (and that are not back here): an origin that sent it here before it
        heard of the move owes it to them itself once told (``left``)."""
        return sorted(
            key
            for key, away in self.core.moved_away.items()
            if away.until <= now < away.forget_at
            and (matches(away.address, topic) if away.pattern else away.address == topic)
            and key not in self.core.subscriptions
            and (away.selector is None or away.selector.selects(selector_env(payload)))
        )

    def on_left(self, message: dict[str, Any], now: float, out: list[Command]) -> None:
        """A router that a subscriber moved from says a delivery of ours came there
        after it stopped passing on what comes for it (``left``). Owed to it by us,
        wherever it is now, if we sent it there before we heard of the move (our
        ``sub-ack`` named it to the subscriber's new router, which waits for it)."""
        d, keys, sender = message.get("d"), message.get("keys"), message.get("from")
        if not isinstance(d, str) or not isinstance(keys, list):
            return
        try:
            tag = bytes.fromhex(d)
        except ValueError:
            return
        named = self.core.moved_via.get(tag)
        record = self.core.records.get(tag)
        if not named or record is None or record.pub_settled or record.origin_router is not None:
            return
        owed = sorted(key for key in keys if key in named and key not in record.moved and key not in record.subscribers)
        named.difference_update(keys)
        if not owed:
            return
        record.waiting = -1  # its states change outside the count
        for key in owed:
            record.own_moved()[key] = MovedState()
        out.append(Log("owed-moved", {"delivery": record.delivery_id, "from_router": sender, "subscribers": owed}))
        self.resend_to_moved(record, out)

    def unanswered_at(self, router_id: str, address: str) -> list[str]:
        """The deliveries we are the origin of, for ``address`` (a topic or a pattern),
        that went to ``router_id`` and it has not answered (tags, hex): a durable
        subscriber that left it may still be passed them from there (owe_moved_away)."""
        return [
            record.tag.hex()
            for topic in self.core.topics_taken_by(address)
            for record in topic.records.values()
            if record.origin_router is None
            and not record.pub_settled
            and (state := record.remote_routers.get(router_id)) is not None
            and state.outcome is None
        ]

    def owe_moved_away(self, record: DeliveryRecord, keys: list[str], out: list[Command]) -> None:
        """``record`` came from an origin that sent it here for subscribers that have moved
        on (it had not heard yet): owed to each wherever it is now, as a copy addressed
        to it there, which it answers us for (unless its selector does not select it)."""
        owed = []
        for key in keys:
            selector = self.core.moved_away[key].selector
            if record.payload is None:
                continue
            if selector is not None and not selector.selects(selector_env(record.payload)):
                # Not owed to it: done as far as it is concerned (with nobody else here,
                # our answer to the origin is "accepted", as for a subscriber here).
                record.filtered = [*(record.filtered or ()), key]
                continue
            record.waiting = -1  # its states change outside the count
            record.own_moved()[key] = MovedState()
            owed.append(key)
        if owed:
            out.append(
                Log(
                    "owed-moved",
                    {"delivery": record.delivery_id, "from_router": self.core.settings.router_id, "subscribers": owed},
                )
            )
            self.resend_to_moved(record, out)

    def moved_subscriber_at(self, key: str, router_id: str, now: float, out: list[Command]) -> None:
        for record in list(self.core.records.values()):
            moved = record.moved.get(key)
            if moved is not None and moved.outcome is None and moved.router != router_id:
                _readdress(record, moved, router_id)
                self._send_targeted(record, router_id, [key], out)

    def resend_to_moved(self, record: DeliveryRecord, out: list[Command]) -> None:
        by_router: dict[str, list[str]] = {}
        for key, moved in record.moved.items():
            if moved.outcome is not None:
                continue
            where = self.core.net.membership.where(_split_key(key))
            if where is not None:
                _readdress(record, moved, where)
            if moved.router is not None:
                by_router.setdefault(moved.router, []).append(key)
        for router_id, keys in sorted(by_router.items()):
            self._send_targeted(record, router_id, sorted(keys), out)

    def _send_targeted(self, record: DeliveryRecord, router_id: str, keys: list[str], out: list[Command]) -> None:
        """A copy addressed to particular subscribers at ``router_id``; they answer us
        individually."""
        if record.payload is None or record.pub_settled:  # settled: a payload kept only for a local re-send
            return
        hop = self.core.net.next_hop(router_id)
        if hop is None:
            return
        header = dict(self.core.base_header(record))
        header["origin"] = record.origin_router or self.core.settings.router_id
        header["dests"] = [router_id]
        header["for"] = {router_id: keys}
        header["report"] = self.core.settings.router_id
        prev = self._addressed_prev(record, router_id, keys)
        header["prev"] = {router_id: prev} if prev >= 0 else {}
        out.append(SendData(hop, record.tag, header, record.payload))
        out.append(Log("forwarded-to-router", {"delivery": record.delivery_id, "to_router": hop, "dests": [router_id]}))

    def _addressed_prev(self, record: DeliveryRecord, router_id: str, keys: list[str]) -> int:
        """The predecessor a copy addressed to ``keys`` at ``router_id`` names there: the
        ``stream_seq`` of the delivery of its stream this router addressed to that router
        before it (fixed at the first copy, as for the copies to interested routers, so a
        resend names the same). The router there delivers it only after that one (or
        ``ORDER_HOLD_TIMEOUT``). Without it, addressed copies kept publisher order only by
        travelling in order: a relay that had no route for #1 and had one again for #2
        let #2 through first, and #1 came later with its resend (found by the generated
        network histories, a link cut twice with a subscriber there owed both)."""
        stream = record.tag[: tags.STREAM_ID_SIZE]
        chain = self.core.addressed_last
        last = chain.get((stream, router_id), -1)
        prev = -1
        for key in keys:
            moved = record.moved.get(key)
            if moved is None:
                continue
            if moved.prev is None:
                # (Addressed out of its stream's order, after a later one: nothing to name.)
                moved.prev = last if last < record.stream_seq else -1
            prev = max(prev, moved.prev)
        if record.stream_seq > last:
            chain[(stream, router_id)] = record.stream_seq
        return prev

    def on_moved_outcome(
        self, record: DeliveryRecord, key: str, sender: str, message: dict[str, Any], now: float, out: list[Command]
    ) -> None:
        moved = record.moved.get(key)
        code = message.get("o", outcomes.NONE)
        out.append(
            Log(
                "outcome-from-router",
                {"delivery": record.delivery_id, "from_router": sender, "outcome": outcomes.NAMES.get(code, str(code))},
            )
        )
        if moved is None or moved.outcome is not None:
            if record.pub_settled and sender in record.settle_pending:
                self.core.route_control(sender, self.core.settle_message(record.tag, self.core.final_outcome(record)), out)
            return
        if code == outcomes.NONE:
            # Not there (any more): we wait where it shows up next, which may be that
            # same router again (answered "none" between two of its links there, it was
            # never sent the copy again: found by the generated histories, a subscriber
            # moving twice), or where it is already known to be.
            _readdress(record, moved, self.core.net.membership.where(_split_key(key)))
            if moved.router is not None:
                self._send_targeted(record, moved.router, [key], out)
            return
        moved.router = sender
        moved.outcome = (
            OUTCOME_ACCEPTED
            if code == outcomes.ACCEPTED
            else Outcome(
                code, message.get("cond"), message.get("desc"), bool(message.get("failed")), bool(message.get("undeliv"))
            )
        )
        if record.outcome is None:
            self.core.maybe_answer_publisher(record, now, out)

    def accept_targeted(
        self, record: DeliveryRecord, keys: Iterable[str], report_to: str, now: float, out: list[Command]
    ) -> None:
        """Another router addressed ``record`` to these subscribers here."""
        topic = self.core.topics.get(record.topic)
        for key in keys:
            sub = topic.subscriptions.get(key) if topic is not None else None
            if sub is None:
                self.core.route_control(report_to, {"t": "outcome", "d": record.tag.hex(), "o": outcomes.NONE, "key": key}, out)
                continue
            known = key in record.subscribers
            if not known and not self.selects(record, key, out):
                # Its selector does not select it: done, as far as it is concerned.
                message = {"t": "outcome", "d": record.tag.hex(), "o": outcomes.ACCEPTED, "key": key}
                self.core.route_control(report_to, message, out)
                continue
            state = self.owe_here(record, key)
            first = record.targeted.get(key)
            if first is None:
                record.own_targeted()[key] = report_to
            elif first != report_to:
                # A second router addressed it to the same subscriber (it moved twice,
                # and each old router passes on what comes for it): both wait for its
                # answer, so both get it.
                also = getattr(record, "also_targeted", None)
                if also is None:
                    also = record.also_targeted = {}
                also.setdefault(key, set()).add(report_to)
            if state.outcome is not None:
                self.report_targeted(record, key, out)
            elif not known and sub.link_id is not None:
                if record.tag in sub.placeholders.get(record.tag[: tags.STREAM_ID_SIZE], ()):
                    continue  # awaited: fulfil_placeholders sends it, after what comes before it
                queue_in_order(sub.queue, record)
                self.core.pump(sub, now, out)

    def origin_moved(self, record: DeliveryRecord, new_origin: str, now: float, out: list[Command]) -> bool:
        """A relayed record's publisher resumed at ``new_origin``, which we answer now.
        The old origin handed the delivery over and forgot it, and with it what it owed
        our subscribers that moved here (the copies it addressed to them): their answers
        to it reach nobody. Each is reported to another router that addressed it a copy,
        if one did (it still waits); else it counts in our own answer to the new origin,
        as any subscriber here does. True when that changed our answer (given, or waiting
        for them). (Answering for the others only, we said "none" where a moved subscriber
        had accepted, and its publisher heard "released": found by the generated
        histories, with the publisher resuming at the router the subscriber had left.)"""
        old_origin = record.origin_router
        record.origin_router = new_origin
        if not record.pub_settled and old_origin is not None and old_origin != new_origin:
            self.readdress_from(record, old_origin, out)
        if not record.targeted or record.pub_settled or old_origin == new_origin:
            return False
        reachable = self.core.net.reachable()
        return self.untarget(record, {r for r in record.targeted.values() if r == old_origin or r not in reachable}, now, out)

    def readdress_from(self, record: DeliveryRecord, old_origin: str, out: list[Command]) -> None:
        """The record's origin changed. Copies we addressed to our moved subscribers that
        had moved to the old origin went to a router that handed the delivery over and
        forgot whom they were for: their answers would never come (found by the generated
        histories, a subscriber moving twice). Addressed again, where each is now."""
        if record.moved and any(m.outcome is None and m.router == old_origin for m in record.moved.values()):
            self.resend_to_moved(record, out)

    def untarget(self, record: DeliveryRecord, gone: set[str], now: float, out: list[Command]) -> bool:
        """Routers in ``gone`` will never hear our subscribers' answers (an old origin
        that forgot the delivery, a router that died): each subscriber addressed by one
        is reported to another router that addressed it a copy, if one did (it still
        waits), or else counts in our own answer. True when that changed our answer
        (given again, or waiting for them)."""
        theirs = [key for key, router in record.targeted.items() if router in gone] if record.targeted else []
        if not theirs or record.pub_settled:
            return False
        targeted = record.own_targeted()
        also = getattr(record, "also_targeted", None) or {}
        counted = False
        for key in theirs:
            others = sorted(also.pop(key, set()) - gone)
            if others:
                targeted[key] = others[0]  # (they had its answer, if any, already)
                if others[1:]:
                    also[key] = set(others[1:])
            else:
                del targeted[key]
                counted = True
        if not counted:
            return False
        record.waiting = -1
        if record.origin_router is not None:
            record.outcome = None
            self.core.maybe_answer_publisher(record, now, out)
        return True

    def report_targeted(self, record: DeliveryRecord, key: str, out: list[Command]) -> None:
        outcome = record.subscribers[key].outcome
        assert outcome is not None  # reported once it answered
        message = {"t": "outcome", "d": record.tag.hex(), "o": outcome.code, "key": key}
        if outcome.condition:
            message["cond"] = outcome.condition
            message["desc"] = outcome.description
        self.core.route_control(record.targeted[key], message, out)
        also = getattr(record, "also_targeted", None)
        for router_id in sorted(also.get(key, ())) if also else ():
            self.core.route_control(router_id, dict(message), out)

    def expire_moved(self, changes: Iterable[Change], now: float, out: list[Command]) -> None:
        """Subscribers of a lost router that did not re-attach within their terminus
        timeout stop being owed."""
        for change in changes:
            if not isinstance(change, RemoteSubscriberRemoved) or change.reason != "expired":
                continue
            key = str(change.key)
            for record in list(self.core.records.values()):
                moved = record.moved.get(key)
                if moved is not None and moved.outcome is None:
                    del record.moved[key]
                    out.append(Log("owed-state-discarded", {"delivery": record.delivery_id, "subscriber": key}))
                    if record.outcome is None:
                        self.core.maybe_answer_publisher(record, now, out)

    def schedule_membership_expiry(self) -> None:
        deadline = self.core.net.membership.next_expiry()
        if deadline is not None:
            self.core.add_timer(deadline, _TIMER_MEMBERSHIP, None)


def _split_key(key: str) -> SubscriberKey:
    container_id, _, link_name = key.partition("/")
    return SubscriberKey(container_id, link_name)


def _readdress(record: DeliveryRecord, moved: MovedState, router_id: str | None) -> None:
    """A moved subscriber's copy goes to ``router_id`` from now on. The router it went to
    before may hold a record for it (passing it on, should the subscriber have moved on
    from there): it hears the settlement, or it held that record for ever (found by the
    generated histories, a subscriber moving twice)."""
    if moved.router is not None and moved.router != router_id:
        if record.watchers is None:
            record.watchers = set()
        record.watchers.add(moved.router)
    if moved.router != router_id:
        moved.prev = None  # its predecessor is named anew for the router it goes to now
    moved.router = router_id
