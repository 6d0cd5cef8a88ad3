"""A delivery's copies in the router network: sent towards the routers interested in its
topic (one per next hop), and received here: relayed on, kept in publisher order, and owed
to the subscribers here.

A mixin of ``RouterCore`` (router/core/router.py): its methods share the core's state,
documented there, and are split out only to keep one concern per module."""

from __future__ import annotations

import heapq
from typing import TYPE_CHECKING, Any

from router.core import outcomes, tags
from router.core.commands import (
    Command,
    Log,
    SendData,
)
from router.core.constants import (
    _TIMER_EXPIRY,
    _TIMER_ORDER_GAP,
    BEYOND_HORIZON_CONDITION,
    MAX_HOPS,
    ORDER_HOLD_TIMEOUT,
)
from router.core.events import (
    DataReceived,
)
from router.core.guarantees import AT_LEAST_ONCE
from router.core.links import Subscription, Topic, queue_in_order
from router.core.outcomes import OUTCOME_ACCEPTED, Outcome
from router.core.records import (
    DeliveryRecord,
    Roster,
)
from router.core.settled import BEYOND_HORIZON

if TYPE_CHECKING:
    from collections.abc import Iterable

    from router.core.corestate import CoreState
else:
    CoreState = object  # declarations for mypy only: no base class at run time


class RelayMixin(CoreState):
    def _saw_seq(self, record: DeliveryRecord) -> None:
        stream = record.tag[: tags.STREAM_ID_SIZE]
        if record.stream_seq > self.stream_seq.get(stream, -1):
            self.stream_seq[stream] = record.stream_seq

    def _base_header(self, record: DeliveryRecord) -> dict[str, Any]:
        header = record.header
        if header is None:
            header = record.header = {
                "origin": self.settings.router_id,
                "epoch": self.epoch,
                "boot": self.boot_id,
                "topic": record.topic,
                "pub": record.publisher,
                "link": record.link_name,
                "ptag": record.pub_tag.hex(),
                "inc": record.incarnation,
                "seq": record.stream_seq,
                "exp": record.expires_at,
                "hops": 0,
            }
            if record.reuse:
                header["reuse"] = record.reuse  # a settled tag used again (docs/tags.md)
            if getattr(record, "resent", False):
                header["rs"] = 1  # a resumed publisher's resend: maybe finished and forgotten
            if record.alo:
                header["g"] = AT_LEAST_ONCE  # the origin decides how its deliveries travel
        return header

    def _send_towards(self, record: DeliveryRecord, routers: Iterable[str], now: float, out: list[Command]) -> None:
        """One copy per next hop, carrying the set of routers it is for."""
        if record.payload is None or record.pub_settled:  # settled: a payload kept only for a local re-send
            return
        split = self.net.split(routers)
        base = self._base_header(record)
        stream = record.tag[: tags.STREAM_ID_SIZE]
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
            out.append(Log("forwarded-to-router", {"delivery": record.delivery_id, "to_router": hop, "dests": header["dests"]}))
            for router_id in dests:
                state = record.remote_routers.get(router_id)
                if state is not None:
                    state.sent = True

    def _on_data(self, ev: DataReceived, now: float, out: list[Command]) -> None:
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
                out.append(Log("forwarded-to-router", {"delivery": ev.tag.hex(), "to_router": hop, "dests": relayed["dests"]}))
        if me in dests:
            if header.get("be"):
                self._best_effort_from_router(ev, header, out)
            else:
                self._in_publisher_order(ev, header, now, out)

    def _in_publisher_order(self, ev: DataReceived, header: dict[str, Any], now: float, out: list[Command]) -> None:
        """Deliver a relayed copy only after its predecessor from the same publisher
        stream (named by the origin in ``prev``): a copy that took a newer path after
        a route change must not overtake an earlier one still on its way."""
        stream = ev.tag[: tags.STREAM_ID_SIZE]
        prev = (header.get("prev") or {}).get(self.settings.router_id, -1)
        head = self._chain_head.get(stream)
        if prev == -1 and stream not in self._chain_start and ev.tag not in self.records and not header.get("for"):
            # (Not a copy addressed to particular subscribers: it says nothing of what
            # its origin sent us for the others.)
            self._chain_start[stream] = (header.get("seq", 0), header["origin"])
        if ev.tag in self.records or prev == -1 or (head is not None and prev <= head):
            self._deliver_chain(stream, ev, header, now, out)
            return
        # (A list: two chains may name the same predecessor, the interested routers' and
        # the addressed copies', and a copy dropped from here is never answered.)
        self._held.setdefault(stream, {}).setdefault(prev, []).append((ev, header))
        self._add_timer(now + ORDER_HOLD_TIMEOUT, _TIMER_ORDER_GAP, (stream, prev))

    def _deliver_chain(self, stream: bytes, ev: DataReceived, header: dict[str, Any], now: float, out: list[Command]) -> None:
        """Deliver a copy, then the held copies waiting for it and for those: always the
        lowest stream_seq ready first."""
        ready = [(header.get("seq", 0), 0, ev, header)]
        n = 0
        while ready:
            seq, _, ev, header = heapq.heappop(ready)
            self._deliver_from_router(ev, header, now, out)
            if seq > self._chain_head.get(stream, -1):
                self._chain_head[stream] = seq
            held = self._held.get(stream)
            if held and seq in held:
                for ev, header in held.pop(seq):
                    n += 1
                    heapq.heappush(ready, (header.get("seq", 0), n, ev, header))
                if not held:
                    del self._held[stream]

    def _deliver_from_router(self, ev: DataReceived, header: dict[str, Any], now: float, out: list[Command]) -> None:
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
        if record is not None:
            self._known_copy(record, origin, targets, report_to, now, out)
            return
        if tag in self.settled and reuse <= self.settled.reuse_of(tag):
            # Settled here and forgotten: never deliver it again. The sender still
            # thinks it is the origin (it was cut off while its publisher resumed
            # here and we finished the delivery as origin): tell it it is done.
            self._route_control(report_to, self._settle_message(tag, self.settled.outcome_of(tag), True), out)
            out.append(Log("dropped", {"delivery": tag.hex(), "reason": "already settled here"}))
            return
        topic = self._topic_if_wanted(header["topic"])
        owed_here = topic is not None and any(not s.best_effort for s in topic.subscriptions.values())
        if (
            header.get("rs")
            and header.get("g") != AT_LEAST_ONCE  # (at-least-once: delivered again, as the mode allows)
            and not targets
            and owed_here
            and self.settled.resend_verdict(tag, header.get("inc")) == BEYOND_HORIZON
        ):
            self._refuse_forgotten_resend(tag, origin, report_to, out)
            return
        if targets and topic is not None:
            self._new_targeted_record(ev, header, topic, targets, report_to, now, out)
            return
        for key in targets or ():
            # Addressed to subscribers of a topic nobody here takes any more: each is not
            # here, which only a keyed answer says (the router that addressed it then
            # waits where it shows up next; answered only "none", it waited here for
            # ever: found by the generated histories, a subscriber moving twice).
            self._route_control(report_to, {"t": "outcome", "d": tag.hex(), "o": outcomes.NONE, "key": key}, out)
        if self._before_its_chain_here(tag, header, origin):
            waiting = self._waiting_for(tag, topic) if topic is not None else []
            if waiting and topic is not None:
                # But a subscriber here waits for it (it reported holding it when it moved
                # here; the router that held it for it died, and only its publisher's
                # resend brings it now): owed to those only. (Dropped, it was never
                # answered for them and the publisher heard "released"; owed to every
                # subscriber, one that began here got it after later ones: both found
                # by the generated histories, a subscriber moving twice.)
                self._new_relayed_record(ev, header, topic, now, out, only=Roster(waiting))
                return
            # Older than the first delivery its stream's first origin sent us, and from
            # another origin (its publisher resumed there, which sends what it took over
            # to every router interested now): that origin never sent it here, so nobody
            # here was owed it then (it was published before they were known), and our
            # subscribers had later ones of its stream already. Delivered now, it came
            # after them (found by the generated histories: a subscriber that joined
            # while its publisher moved got #3, then #1 and #2 from the new origin).
            self._route_control(origin, {"t": "outcome", "d": tag.hex(), "o": outcomes.NONE}, out)
            out.append(Log("dropped", {"delivery": tag.hex(), "reason": "older than its stream's first delivery here"}))
            return
        # Sent here for a subscriber that has moved on (its origin had not heard yet)
        away = self.resumption.moved_away_for(header["topic"], now) if self.moved_away and not targets else []
        if away:
            self._new_relayed_record(ev, header, topic or self._topic(header["topic"]), now, out, away)
            return
        # Past the grace, for subscribers that moved on: the origin owes it to them itself,
        # if it sent it here before it heard of the move.
        left = self.resumption.left_behind_for(header["topic"], ev.payload, now) if self.moved_away and not targets else []
        if topic is None or not owed_here:
            # Nobody here (any more): we are not owed this delivery.
            message = {"t": "outcome", "d": tag.hex(), "o": outcomes.NONE}
            if left:
                message["left"] = left  # in the answer itself: nothing can come between
            self._route_control(origin, message, out)
            if topic is not None:
                self._best_effort_copies(topic, tag, ev.payload, out)
            return
        if left:
            # Before our answer, which waits for our subscribers (same route: in order).
            self._route_control(origin, {"t": "left", "d": tag.hex(), "keys": left}, out)
        self._new_relayed_record(ev, header, topic, now, out)

    def _before_its_chain_here(self, tag: bytes, header: dict[str, Any], origin: str) -> bool:
        start = self._chain_start.get(tag[: tags.STREAM_ID_SIZE]) if self._chain_start else None
        return start is not None and header.get("seq", 0) < start[0] and origin != start[1]

    def _waiting_for(self, tag: bytes, topic: Topic) -> list[Subscription]:
        """The subscriptions of ``topic`` here that wait for ``tag`` (a placeholder)."""
        stream = tag[: tags.STREAM_ID_SIZE]
        return [sub for sub in topic.subscriptions.values() if sub.placeholders and tag in sub.placeholders.get(stream, ())]

    def _known_copy(
        self, record: DeliveryRecord, origin: str, targets: list[str] | None, report_to: str, now: float, out: list[Command]
    ) -> None:
        """A copy of a delivery we hold: a resend (a hop failed, routes changed, its
        publisher resumed elsewhere), never delivered twice."""
        if record.pub_settled and origin not in (self.settings.router_id, record.origin_router) and not targets:
            # Finished and settled here, its record only lingering, and resent by a new
            # origin (its publisher resumed there): as for a tag remembered settled, the
            # resend gets the final outcome, or the new origin would wait for us for
            # ever (issue 16, part 3; and a relayed record, settled by the old origin
            # and lingering for its subscriber's evidence when the resend came).
            self._route_control(report_to, self._settle_message(record.tag, self._final_outcome(record), True), out)
            out.append(Log("dropped", {"delivery": record.delivery_id, "reason": "already settled here"}))
            return
        if record.origin_router is None and origin != self.settings.router_id and not targets:
            # We took it from its publisher, which resumed at ``origin`` and resent it.
            # Or, unsettled here, its copy overtook the "stream-resumed" news, which
            # hands the record over when it comes (a copy alone cannot tell the new
            # origin from a stale one: ours, to the router that took over from us).
            return
        if record.origin_router is not None and record.origin_router != origin and not targets:
            if not self.resumption.may_be_new_origin(record.tag[: tags.STREAM_ID_SIZE], origin):
                # Sent before its sender handed the delivery over: the origin is where
                # its publisher resumed, and that router has our answer (or will).
                out.append(Log("dropped", {"delivery": record.delivery_id, "reason": "stale copy from an old origin"}))
                return
            if self.resumption.origin_moved(record, origin, now, out):  # its publisher resumed there
                return
        if targets:
            self.resumption.accept_targeted(record, targets, report_to, now, out)
            self.resumption.fulfil_placeholders(record, now, out, only=targets)
        # If we already answered, the answer may have been lost: answer again.
        elif record.origin_router is not None and record.outcome is not None and not record.pub_settled:
            self._answer_origin(record, record.outcome, record.origin_router, out)

    def _refuse_forgotten_resend(self, tag: bytes, origin: str, report_to: str, out: list[Command]) -> None:
        """A resend of a stream we finished with and forgot: our subscribers may have
        had it. Refused, never delivered as new (docs/resumption.md)."""
        description = (
            "resent after router " + self.settings.router_id + " forgot its stream "
            "(resume horizon or memory limit): it may have been delivered already"
        )
        self._route_control(
            report_to,
            {"t": "outcome", "d": tag.hex(), "o": outcomes.REJECTED, "cond": BEYOND_HORIZON_CONDITION, "desc": description},
            out,
        )
        out.append(
            Log(
                "resend-beyond-horizon",
                {"delivery": tag.hex(), "stream": tag[: tags.STREAM_ID_SIZE].hex(), "origin_router": origin},
            )
        )

    def _relayed_record(self, ev: DataReceived, header: dict[str, Any], topic_name: str, now: float) -> DeliveryRecord:
        record = DeliveryRecord(
            ev.tag,
            topic_name,
            next(self._order),
            ev.payload,
            header.get("pub", ""),
            header.get("link", ""),
            bytes.fromhex(header.get("ptag", "")),
            header.get("inc", ""),
            header.get("seq", 0),
            -1,
            None,
            header.get("exp"),
            header.get("reuse", 0),
        )
        record.origin_router = header["origin"]
        record.arrived = now
        if header.get("g") == AT_LEAST_ONCE:
            record.alo = True
        return record

    def _new_targeted_record(
        self,
        ev: DataReceived,
        header: dict[str, Any],
        topic: Topic,
        targets: list[str],
        report_to: str,
        now: float,
        out: list[Command],
    ) -> None:
        """A copy addressed to particular subscribers here (they moved here from a
        router that died, or resumed here): they answer ``report_to`` individually."""
        record = self._relayed_record(ev, header, topic.name, now)
        record.outcome = Outcome(outcomes.RELEASED)  # nothing untargeted here to answer for
        self._saw_seq(record)
        self.records[ev.tag] = record
        topic.records[record.order] = record
        self._hold_bytes(topic, record.payload)
        out.append(
            Log(
                "received",
                {
                    "delivery": record.delivery_id,
                    "topic": topic.name,
                    "publisher": record.publisher,
                    "link_name": record.link_name,
                    "pub_tag": header.get("ptag"),
                    "incarnation": record.incarnation,
                    "stream_seq": record.stream_seq,
                    "size": len(ev.payload),
                    "settled": False,
                    "owed": list(targets),
                    "forwarded": [],
                    "origin_router": record.origin_router,
                },
            )
        )
        if record.alo:
            out[-1].fields["guarantee"] = AT_LEAST_ONCE  # type: ignore[union-attr]
        self.resumption.accept_targeted(record, targets, report_to, now, out)
        self.resumption.fulfil_placeholders(record, now, out)
        if not record.targeted and not record.subscribers:
            # None of them is here (any more): each was answered "none", and nobody else
            # sent us this delivery, so no origin will ever settle it with us. Kept, it
            # stayed for ever once its publisher resumed elsewhere (found by the
            # generated histories, a subscriber moving twice).
            self._delete(record, "owed-to-nobody-here", out)

    def _new_relayed_record(
        self,
        ev: DataReceived,
        header: dict[str, Any],
        topic: Topic,
        now: float,
        out: list[Command],
        away: list[str] | None = None,
        only: Roster | None = None,
    ) -> None:
        """A delivery new here: owed to our subscribers (``only``'s, when given), sent to
        those who can take it; and to those of ``away`` (moved on lately) wherever they
        are now."""
        record = self._relayed_record(ev, header, topic.name, now)
        owed, sent_to, best_effort = self._distribute(record, topic, out, only)
        if record.stream_seq < self.stream_seq.get(record.tag[: tags.STREAM_ID_SIZE], -1):
            # Older than one of its stream we hold (it comes from the new origin, after
            # its publisher resumed, and an old origin sent us a later one): queued at
            # the end, it went out after that one (found by the generated histories, a
            # subscriber moving twice while its publisher moved twice).
            for sub in topic.subscriptions.values():
                if sub.queue and sub.queue[-1] is record:
                    sub.queue.pop()
                    queue_in_order(sub.queue, record)
        out.append(
            Log(
                "received",
                {
                    "delivery": record.delivery_id,
                    "topic": topic.name,
                    "publisher": record.publisher,
                    "link_name": record.link_name,
                    "pub_tag": header.get("ptag"),
                    "incarnation": record.incarnation,
                    "stream_seq": record.stream_seq,
                    "size": len(ev.payload),
                    "settled": False,
                    "owed": owed,
                    "forwarded": sent_to,
                    "origin_router": record.origin_router,
                },
            )
        )
        if record.alo:
            out[-1].fields["guarantee"] = AT_LEAST_ONCE  # type: ignore[union-attr]
        if record.filtered:  # (only where selectors filter: no key, no bytes otherwise)
            out[-1].fields["filtered"] = record.filtered  # type: ignore[union-attr]
        self._saw_seq(record)
        self.records[ev.tag] = record
        topic.records[record.order] = record
        self._hold_bytes(topic, record.payload)
        self.resumption.after_distribute_to_resumed(record, topic, now, out)
        if away:
            self.resumption.owe_moved_away(record, away, out)
        if record.filtered and not owed and not record.moved and record.origin_router is not None:
            # Every subscriber here filters it out: done here, which the origin hears
            # as our answer (accepted: each subscriber that wanted it has it).
            record.outcome = OUTCOME_ACCEPTED
            self._answer_origin(record, OUTCOME_ACCEPTED, record.origin_router, out)
            if record.alo:
                self._finish_at_least_once(record, now, out)
        if record.expires_at is not None:
            if record.expires_at <= now:
                self._expire_message(record, now, out)
            else:
                self._add_timer(record.expires_at, _TIMER_EXPIRY, record)
        if best_effort:
            self._best_effort_copies(topic, ev.tag, ev.payload, out)
