"""The router network: routed and flooded control messages, relayed copies in publisher order, remote interest.

A mixin of ``RouterCore`` (router/core/router.py): its methods share the core's state,
documented there, and are split out only to keep one concern per module."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from router.core import outcomes, tags
from router.core.announcements import RemoteSubscriberAdded, SubscriberMoved
from router.core.commands import (
    Command,
    Log,
    OpenLink,
    SendControl,
    SendData,
)
from router.core.constants import (
    _TIMER_EXPIRY,
    _TIMER_ORDER_GAP,
    ACCEPTED,
    BEYOND_HORIZON_CONDITION,
    MAX_HOPS,
    ORDER_HOLD_TIMEOUT,
)
from router.core.errors import ProtocolError
from router.core.events import (
    ControlReceived,
    DataReceived,
    PeerConnected,
    PeerLost,
)
from router.core.links import Topic
from router.core.network import (
    announcement_from,
    link_state_from,
    link_state_message,
    snapshot_from,
)
from router.core.outcomes import OUTCOME_ACCEPTED, OUTCOME_NOT_OWED, Outcome
from router.core.records import (
    DeliveryRecord,
)
from router.core.settled import BEYOND_HORIZON

if TYPE_CHECKING:
    from collections.abc import Iterable

    from router.core.announcements import Change
    from router.core.corestate import CoreState
else:
    CoreState = object  # declarations for mypy only: no base class at run time


class RelayMixin(CoreState):
    def _neighbours_except(self, source: str | None) -> list[str]:
        return [peer for peer in self.net.neighbours if peer != source]

    def _flood(self, message: dict[str, Any], source: str | None, out: list[Command]) -> None:
        """Send a link state or announcement to every neighbour but the one it came from."""
        for peer in self._neighbours_except(source):
            out.append(SendControl(peer, message))

    def _saw_seq(self, record: DeliveryRecord) -> None:
        stream = record.tag[: tags.STREAM_ID_SIZE]
        if record.stream_seq > self.stream_seq.get(stream, -1):
            self.stream_seq[stream] = record.stream_seq

    def _flood_once(self, stamp: tuple[Any, ...], message: dict[str, Any], source: str, out: list[Command]) -> bool:
        """Flood a message on the first time we see it; False for a repeat."""
        if stamp in self._flooded:
            return False
        self._flooded.add(stamp)
        self._flood(message, source, out)
        return True

    def _route_control(self, to: str, message: dict[str, Any], out: list[Command]) -> bool:
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

    def _answer_origin(self, record: DeliveryRecord, outcome: Outcome, origin: str, out: list[Command]) -> None:
        """Tell ``origin`` (the record's origin router) its ``outcome`` here."""
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
        self._route_control(origin, message, out)
        out.append(
            Log("outcome-to-router", {"delivery": record.delivery_id, "to_router": origin, "outcome": outcomes.NAMES[code]})
        )

    def _subscriber_ready(self, key: str, out: list[Command]) -> None:
        link_id, _, _ = self._awaiting_acks.pop(key)
        sub = self.subscriptions.get(key)
        if sub is None or sub.link_id != link_id:
            return
        sub.ready = True
        out.append(OpenLink(link_id, sub.timeout if sub.durable else 0, self._open_properties.pop(link_id, None)))
        self._pump(sub, 0.0, out)

    def _on_peer_connected(self, ev: PeerConnected, now: float, out: list[Command]) -> None:
        known = self.net.membership.incarnation_of(ev.router_id)
        own = self.net.peer_connected(ev.router_id, ev.conn_id, ev.epoch, ev.boot)
        for message in self.net.sync_messages():
            out.append(SendControl(ev.router_id, message))
        if own is not None:
            self._flood(link_state_message(own), ev.router_id, out)
        if known is not None and (known.epoch, known.boot) != (ev.epoch, ev.boot):
            out.append(Log("peer-restarted", {"peer": ev.router_id, "peer_epoch": ev.epoch, "peer_boot": ev.boot}))
        self._topology_changed(now, out)

    def _on_peer_lost(self, ev: PeerLost, now: float, out: list[Command]) -> None:
        own = self.net.peer_lost(ev.router_id, ev.conn_id)
        if own is not None:
            self._flood(link_state_message(own), None, out)
        self._topology_changed(now, out)

    def _on_control(self, ev: ControlReceived, now: float, out: list[Command]) -> None:
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
                waiting = self._awaiting_acks.get(message.get("key"))  # type: ignore[arg-type]  # None: not found
                if waiting is not None and waiting[2] == message.get("version"):
                    waiting[1].discard(message.get("from"))
                    if not waiting[1]:
                        self._subscriber_ready(message["key"], out)
            elif kind == "subs":
                changes = self.net.membership.apply(snapshot_from(message))
                self._membership_changed(changes, now, out)
            elif kind == "stream-resumed":
                if self._flood_once(
                    ("stream", message.get("stream"), message.get("at"), message.get("n"), len(message.get("unsettled", ()))),
                    message,
                    ev.router_id,
                    out,
                ):
                    self.resumption.on_stream_resumed(message, now, out)
            elif kind == "stream-seq":
                self.resumption.on_stream_seq(message, now, out)
            elif kind == "addr":
                if self.net.learn_addresses(message):
                    self._flood(message, ev.router_id, out)
            elif kind == "synced":
                pass
            else:
                raise ProtocolError("amqp:not-implemented", f"unknown control message type {kind!r}")
        if routes_changed:
            self._topology_changed(now, out)

    def _on_announcement(self, message: dict[str, Any], source: str, now: float, out: list[Command]) -> None:
        announcement = announcement_from(message)
        stamp = (announcement.router, announcement.epoch, announcement.boot, announcement.version)
        if announcement.router == self.settings.router_id:
            return
        if stamp not in self._flooded:
            self._flooded.add(stamp)
            learnt = (announcement.router, "attached" if message["t"] == "sub+" else "detached")
            self.announcements_learnt[learnt] = self.announcements_learnt.get(learnt, 0) + 1
            self._flood(message, source, out)
            self._membership_changed(self.net.membership.apply(announcement), now, out)
        if message["t"] == "sub+":
            # Confirm even a duplicate: the announcing router may be holding an attach.
            key = f"{announcement.container_id}/{announcement.link_name}"
            self._route_control(announcement.router, {"t": "sub-ack", "key": key, "version": announcement.version}, out)

    def _membership_changed(self, changes: list[Change], now: float, out: list[Command]) -> None:
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
        self.resumption.expire_moved(changes, now, out)
        for change in changes:
            if isinstance(change, SubscriberMoved):
                self.resumption.moved_subscriber_at(str(change.key), change.to_router, now, out)
            elif isinstance(change, RemoteSubscriberAdded):
                key = str(change.key)
                local = self.subscriptions.get(key)
                if local is not None and not local.attached:
                    self.resumption.local_subscriber_moved(key, change.router, now, out)
                else:
                    self.resumption.moved_subscriber_at(key, change.router, now, out)
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
        if ev.tag in self.records or prev == -1 or (head is not None and prev <= head):
            self._deliver_chain(stream, ev, header, now, out)
            return
        self._held.setdefault(stream, {})[prev] = (ev, header)
        self._add_timer(now + ORDER_HOLD_TIMEOUT, _TIMER_ORDER_GAP, (stream, prev))

    def _deliver_chain(self, stream: bytes, ev: DataReceived, header: dict[str, Any], now: float, out: list[Command]) -> None:
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
        topic = self.topics.get(header["topic"])
        owed_here = topic is not None and any(not s.best_effort for s in topic.subscriptions.values())
        if (
            header.get("rs")
            and not targets
            and owed_here
            and self.settled.resend_verdict(tag, header.get("inc")) == BEYOND_HORIZON
        ):
            self._refuse_forgotten_resend(tag, origin, report_to, out)
            return
        if targets and topic is not None:
            self._new_targeted_record(ev, header, topic, targets, report_to, now, out)
            return
        if topic is None or not owed_here:
            # Nobody here (any more): we are not owed this delivery.
            message = {"t": "outcome", "d": tag.hex(), "o": outcomes.NONE}
            self._route_control(origin, message, out)
            if topic is not None:
                self._best_effort_copies(topic, tag, ev.payload, out)
            return
        self._new_relayed_record(ev, header, topic, now, out)

    def _known_copy(
        self, record: DeliveryRecord, origin: str, targets: list[str] | None, report_to: str, now: float, out: list[Command]
    ) -> None:
        """A copy of a delivery we hold: a resend (a hop failed, routes changed, its
        publisher resumed elsewhere), never delivered twice."""
        if record.origin_router is None and origin != self.settings.router_id and not targets:
            # We took it from its publisher, which resumed at ``origin`` and resent it.
            # Or, unsettled here, its copy overtook the "stream-resumed" news, which
            # hands the record over when it comes (a copy alone cannot tell the new
            # origin from a stale one: ours, to the router that took over from us).
            if record.pub_settled:
                # Finished and settled here, its record only lingering: as for a tag
                # remembered settled, the resend gets the final outcome, or the new
                # origin would wait for us for ever (issue 16, part 3).
                self._route_control(report_to, self._settle_message(record.tag, self._final_outcome(record), True), out)
                out.append(Log("dropped", {"delivery": record.delivery_id, "reason": "already settled here"}))
            return
        if record.origin_router is not None and record.origin_router != origin and not targets:
            record.origin_router = origin  # its publisher resumed at another router
        if targets:
            self.resumption.accept_targeted(record, targets, report_to, now, out)
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
        self.resumption.accept_targeted(record, targets, report_to, now, out)
        self.resumption.fulfil_placeholders(record, now, out)

    def _new_relayed_record(self, ev: DataReceived, header: dict[str, Any], topic: Topic, now: float, out: list[Command]) -> None:
        """A delivery new here: owed to our subscribers, sent to those who can take it."""
        record = self._relayed_record(ev, header, topic.name, now)
        owed, sent_to, best_effort = self._distribute(record, topic, out)
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
        self._saw_seq(record)
        self.records[ev.tag] = record
        topic.records[record.order] = record
        self._hold_bytes(topic, record.payload)
        self.resumption.after_distribute_to_resumed(record, topic, now, out)
        if record.expires_at is not None:
            if record.expires_at <= now:
                self._expire_message(record, now, out)
            else:
                self._add_timer(record.expires_at, _TIMER_EXPIRY, record)
        if best_effort:
            self._best_effort_copies(topic, ev.tag, ev.payload, out)

    def _on_router_outcome(self, message: dict[str, Any], now: float, out: list[Command]) -> None:
        tag = bytes.fromhex(message["d"])
        record = self.records.get(tag)
        sender: Any = message.get("from")  # wire data: a routed message names its sender
        if record is None:
            if tag in self.settled and sender:
                # Settled and forgotten here, but the settlement we relayed to it was
                # lost (a cut link): without this it would hold its record for ever.
                self._route_control(sender, self._settle_message(tag, self.settled.outcome_of(tag)), out)
            return
        key = message.get("key")
        if key is not None:
            self.resumption.on_moved_outcome(record, key, sender, message, now, out)
            return
        if record.origin_router is not None:
            return
        state = record.remote_routers.get(sender)
        if state is None:
            return
        code = message.get("o", outcomes.NONE)
        out.append(
            Log(
                "outcome-from-router",
                {"delivery": record.delivery_id, "from_router": sender, "outcome": outcomes.NAMES.get(code, str(code))},
            )
        )
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
            state.outcome = Outcome(
                code, message.get("cond"), message.get("desc"), bool(message.get("failed")), bool(message.get("undeliv"))
            )
        else:
            raise ProtocolError("amqp:invalid-field", f"outcome code {code!r} from router {sender}")
        if record.outcome is None:
            self._maybe_answer_publisher(record, now, out)
        else:
            self._maybe_delete(record, now, out)

    def _on_router_settle(self, message: dict[str, Any], now: float, out: list[Command]) -> None:
        tag = bytes.fromhex(message["d"])
        record = self.records.get(tag)
        sender: Any = message.get("from")  # wire data: a routed message names its sender
        final = message.get("o")
        if final not in outcomes.TERMINAL:
            final = None  # absent (an older router) or not an outcome code
        if record is not None and (record.origin_router == sender or sender in record.targeted.values()):
            if final is not None and record.origin_router is not None:
                record.final = final
            self._settle_record(record, "origin-router", now, out)
        elif (
            record is not None
            and message.get("done")
            and final is not None
            and record.origin_router is None
            and record.pub_delivery is not None
            and getattr(record, "resent", False)
        ):
            # A resend its publisher made after failing over: that router finished the
            # delivery earlier (as its origin, or taking part) and forgot it. Its
            # subscribers will not take it again; the outcome it was finished with is
            # that router's answer.
            state = record.remote_routers.get(sender)
            if state is not None and state.outcome is None:
                out.append(
                    Log(
                        "outcome-from-router",
                        {"delivery": record.delivery_id, "from_router": sender, "outcome": outcomes.NAMES.get(final, str(final))},
                    )
                )
                state.outcome = OUTCOME_ACCEPTED if final == outcomes.ACCEPTED else Outcome(final)
                if record.outcome is None:
                    self._maybe_answer_publisher(record, now, out)
        elif (
            record is not None
            and message.get("done")
            and record.origin_router is None
            and record.pub_delivery is None
            and not record.pub_settled
        ):
            # We still act as its origin, but its publisher is not here: it resumed
            # at another router, which finished and settled the delivery meanwhile.
            # Its outcome is the one that router finished it with (what we remember,
            # and tell a resend), not ours so far.
            if final is not None:
                record.outcome = OUTCOME_ACCEPTED if final == ACCEPTED else Outcome(final)
            self._settle_record(record, "settled-elsewhere", now, out)
        elif record is None and message.get("done"):
            self.resumption.placeholder_settled(tag, now, out)  # the answer to our "settled?"

        self._route_control(sender, {"t": "settle-ack", "d": message["d"]}, out)

    def _on_settled_query(self, message: dict[str, Any], out: list[Command]) -> None:
        """Another router holds a placeholder for a delivery it never saw: if we know
        it settled (a record settled, or its tag remembered), say so."""
        tag = bytes.fromhex(message["d"])
        record = self.records.get(tag)
        if (record is not None and record.pub_settled) or (record is None and tag in self.settled):
            code = self._final_outcome(record) if record is not None else self.settled.outcome_of(tag)
            self._route_control(message["from"], self._settle_message(tag, code, True), out)

    def _on_settle_ack(self, message: dict[str, Any], now: float, out: list[Command]) -> None:
        record = self.records.get(bytes.fromhex(message["d"]))
        if record is None or message.get("from") not in record.settle_pending:
            return
        record.settle_pending.discard(message.get("from"))  # a set: the sender is in it
        self._maybe_delete(record, now, out)

    def _topology_changed(self, now: float, out: list[Command]) -> None:
        """Routes may have changed: whatever may have been lost with a hop goes again.
        Receivers recognise resent deliveries by their tag."""
        if not self.net.recompute():
            return
        out.append(
            Log(
                "routes",
                {
                    "reachable": sorted(self.net.reachable()),
                    "next_hops": [f"{d}>{h}" for d, h in sorted(self.net.routes.next_hop.items())],
                },
            )
        )
        me = self.settings.router_id
        reachable = self.net.reachable()
        for router_id in sorted(self.lost & reachable):
            self.lost.discard(router_id)
            self._membership_changed(self.net.membership.router_regained(router_id), now, out)
        for router_id in sorted(self._known_routers - reachable):
            if router_id not in self.lost:
                self.lost.add(router_id)
                self.resumption.router_lost(router_id, now, out)
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
                self._answer_origin(record, record.outcome, record.origin_router, out)
            if not record.pub_settled:
                self.resumption.resend_to_moved(record, out)
        # Subscribers waiting for confirmation from routers we can no longer reach
        # need not wait for them, nor resumed publishers for their stream's numbering.
        reachable = self.net.reachable()
        for pub in list(self.publishers.values()):
            if pub.awaiting_seq:
                pub.awaiting_seq &= reachable
                if not pub.awaiting_seq:
                    self.resumption.stream_seq_known(pub, out)
        for key, (link_id, waiting, _) in list(self._awaiting_acks.items()):
            waiting &= reachable
            if not waiting:
                self._subscriber_ready(key, out)
