"""The router network's control plane: neighbours coming and going, routed and flooded control
messages, subscriber announcements, and what the membership and route changes they bring mean
for the records here.

A mixin of ``RouterCore`` (router/core/router.py): its methods share the core's state,
documented there, and are split out only to keep one concern per module."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from router.core.announcements import RemoteSubscriberAdded, SubscriberMoved, validate_announcement
from router.core.commands import (
    Command,
    DetachLink,
    Log,
    OpenLink,
    SendControl,
)
from router.core.errors import ProtocolError
from router.core.events import (
    ControlReceived,
    PeerConnected,
    PeerLost,
)
from router.core.moved import _split_key
from router.core.network import (
    announcement_from,
    link_state_from,
    link_state_message,
    snapshot_from,
)
from router.core.tags import STREAM_ID_SIZE

if TYPE_CHECKING:
    from router.core.announcements import Change
    from router.core.corestate import CoreState
    from router.core.links import Subscription, Topic
else:
    CoreState = object  # declarations for mypy only: no base class at run time


class ControlMixin(CoreState):
    def _neighbours_except(self, source: str | None) -> list[str]:
        return [peer for peer in self.net.neighbours if peer != source]

    def _flood(self, message: dict[str, Any], source: str | None, out: list[Command]) -> None:
        """Send a link state or announcement to every neighbour but the one it came from."""
        for peer in self._neighbours_except(source):
            out.append(SendControl(peer, message))

    def _flood_once(self, stamp: tuple[Any, ...], message: dict[str, Any], source: str, now: float, out: list[Command]) -> bool:
        """Flood a message on the first time we see it; False for a repeat. The stamp is
        kept for a resume horizon (every copy of one flood arrives within seconds), then
        forgotten by the settled memory's sweep (router.RouterCore._sweep_settled)."""
        if stamp in self._flooded:
            return False
        self._flooded[stamp] = now
        self._arm_sweep(now)
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

    def _subscriber_ready(self, key: str, out: list[Command]) -> None:
        link_id, _, _ = self._awaiting_acks.pop(key)
        sub = self.subscriptions.get(key)
        if sub is None or sub.link_id != link_id:
            self._answered_early.discard(key)
            return
        sub.ready = True
        if key in self._answered_early:
            self._answered_early.discard(key)
        else:
            self._answer_attach(sub, link_id, out)
        self._pump(sub, 0.0, out)

    def _answer_attach(self, sub: Subscription, link_id: int, out: list[Command]) -> None:
        out.append(
            OpenLink(link_id, sub.timeout if sub.durable else 0, self._open_properties.pop(link_id, None), sub.best_effort)
        )

    def _moved_here(self, key: str) -> bool:
        """Whether subscriber ``key`` was held (attached or retained) at another router."""
        return bool(self.net.membership.locations(_split_key(key)))

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
                    moved = message.get("moved")
                    if moved:
                        self._await_moved(message["key"], waiting[0], moved, now, out)
                    waiting[1].discard(message.get("from"))
                    if not waiting[1]:
                        self._subscriber_ready(message["key"], out)
                elif waiting is None and message.get("moved"):
                    # Later than the announce timeout: the attach was answered without it,
                    # but what has not gone out yet still waits for what comes before it.
                    self._await_moved(message["key"], None, message["moved"], now, out)
            elif kind == "subs":
                changes = self.net.membership.apply(snapshot_from(message))
                if changes:
                    # Only the two ends of a link that comes up exchange snapshots: what one
                    # taught us (a partition healing: subscribers that came or went on the
                    # other side meanwhile), the routers behind us do not know either. Passed
                    # on only when it changed something here, so it stops where it is known.
                    self._flood(message, ev.router_id, out)
                self._membership_changed(changes, now, out)
            elif kind == "stream-resumed":
                if self._flood_once(
                    ("stream", message.get("stream"), message.get("at"), message.get("n"), len(message.get("unsettled", ()))),
                    message,
                    ev.router_id,
                    now,
                    out,
                ):
                    self.resumption.on_stream_resumed(message, now, out)
            elif kind == "stream-seq":
                self.resumption.on_stream_seq(message, now, out)
            elif kind == "left":
                self.resumption.on_left(message, now, out)
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
        if announcement.router == self.settings.router_id:
            return
        # Checked before it is flooded on: a malformed one must not go round a loop.
        validate_announcement(announcement)
        # A repeat (it came by another path too) or older news is not flooded again.
        # The membership table's per-incarnation versions say so: what they keep grows
        # with the subscribers, not with every attach and detach ever seen.
        key = f"{announcement.container_id}/{announcement.link_name}"
        held = self.subscriptions.get(key)
        held_here = held is not None
        # (its topics, asked before the news changes them: what is owed to it is there)
        held_topics = self._topics_of(held) if held is not None and message["t"] == "sub+" else []
        # Where else the subscriber was held (attached or retained) before this news; not
        # a router we lost (what it was sent is owed to its durable subscribers already).
        came_from = (
            [
                r.router
                for r in self.net.membership.locations(announcement.key)
                if r.router != announcement.router and r.lost_at is None
            ]
            if message["t"] == "sub+"
            else []
        )
        if not self.net.membership.already_seen(announcement):
            learnt = (announcement.router, "attached" if message["t"] == "sub+" else "detached")
            self.announcements_learnt[learnt] = self.announcements_learnt.get(learnt, 0) + 1
            self._flood(message, source, out)
            self._membership_changed(self.net.membership.apply(announcement), now, out)
        if message["t"] == "sub+":
            # Confirm even a duplicate: the announcing router may be holding an attach.
            ack: dict[str, Any] = {"t": "sub-ack", "key": key, "version": announcement.version}
            # What we owe it ourselves follows it as copies addressed to it (data), which
            # this answer (control) may overtake: what it was owed here when it held a
            # subscription here, or, as an origin, what we had sent a router we lost while
            # it was there (owed to that router's durable subscribers). Named in the
            # answer, so that the router holding its attach waits for each (a
            # placeholder) before anything later of the same publisher stream goes out to
            # it. (Without the second, a subscriber whose router died with our copies on
            # their way there got a later delivery, sent to its new router for another
            # subscriber, before them: found by the generated histories.)
            moved = [
                record.tag.hex()
                for topic in (held_topics if held_here else self._topics_matching(announcement.topic))
                for record in topic.records.values()
                if (state := record.moved.get(key)) is not None
                and state.outcome is None
                and state.router == announcement.router
                and not record.pub_settled
            ]
            if not held_here and came_from:
                # It moved between two other routers. What we, its origin, sent the old
                # one for its address and the old one has not answered, the old one
                # may pass on to it, addressed to it, behind what we send the new one
                # directly from now on: named too, the new router holds the rest of
                # each of those streams back until each came (or settled).
                via = [tag for old in came_from for tag in self.resumption.unanswered_at(old, announcement.topic)]
                if via:
                    moved_via = self.moved_via
                    for tag in [t for t in moved_via if t not in self.records]:
                        del moved_via[tag]  # (settled and gone meanwhile)
                    for entry in via:
                        moved_via.setdefault(bytes.fromhex(entry), set()).add(key)
                    named = set(moved)
                    moved.extend(tag for tag in via if tag not in named)
            if moved:
                ack["moved"] = moved
            self._route_control(announcement.router, ack, out)

    def _await_moved(self, key: str, link_id: int | None, moved: object, now: float, out: list[Command]) -> None:
        """A router answered our announcement of subscriber ``key`` (attach ``link_id``,
        held until every router answers; None: an answer after the announce timeout) with
        the deliveries that may still come here addressed to it: each not owed to it here
        yet gets a placeholder, holding back what comes after it in its publisher stream.
        (Malformed entries are ignored: the copies themselves still come, only their
        order is not guarded.)"""
        sub = self.subscriptions.get(key)
        if sub is None or sub.link_id is None or link_id not in (None, sub.link_id) or not isinstance(moved, list):
            return
        for entry in moved:
            try:
                tag = bytes.fromhex(entry) if isinstance(entry, str) else None
            except ValueError:
                tag = None
            if tag is None or len(tag) <= STREAM_ID_SIZE:
                continue
            record = self.records.get(tag)
            # Held here already, but not owed to it here (it came before the subscriber):
            # the copy addressed to it still comes.
            if record is None or (not record.pub_settled and key not in record.subscribers):
                self.resumption.await_moved(sub, tag, now, out)

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
                if (
                    local is not None
                    and local.link_id is not None
                    and local.durable
                    and self.net.membership.where(change.key) == change.router
                ):
                    # It attached there while its link here still looks alive (its
                    # connection died and we have not noticed yet). The newer attach
                    # takes the subscription over, as link stealing does on one router,
                    # and what it is owed here moves there now: kept here until we
                    # noticed, it went there after later messages of the same streams,
                    # which it had been sent there meanwhile (found under CPU load,
                    # tests/failover/test_resume_under_load.py). Not amqp:link:stolen,
                    # which tells a client another process took its identity (ours stop
                    # for good): should the news be older than its attach here, the
                    # client is alive and must only fail over once more.
                    link_id = local.link_id
                    reason = f"the subscription attached at router {change.router}"
                    out.append(DetachLink(link_id, "amqp:link:detach-forced", reason, close=False))
                    self._forget_link(link_id)
                    self._unlink_subscriber(local, now, out, reason="stolen", closed=False)
                elif local is not None and not local.attached:
                    self.resumption.local_subscriber_moved(key, change.router, now, out)
                else:
                    self.resumption.moved_subscriber_at(key, change.router, now, out)
        for change in changes:
            topic_name = getattr(change, "topic", None)
            router_id = getattr(change, "router", None)
            if topic_name is None or router_id is None:
                continue
            for topic in self._topics_matching(topic_name):  # (a pattern's: every topic it matches)
                self._drop_uninterested(topic, router_id, now, out)

    def _drop_uninterested(self, topic: Topic, router_id: str, now: float, out: list[Command]) -> None:
        """``router_id`` has no subscriber to ``topic`` any more: what was not sent
        there yet is not owed there."""
        if router_id in self.net.interested_routers(topic.name):
            return
        for record in list(topic.records.values()):
            state = record.remote_routers.get(router_id)
            if state is not None and state.outcome is None and not state.sent:
                del record.remote_routers[router_id]
                if record.outcome is None:
                    self._maybe_answer_publisher(record, now, out)
                else:
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
        regained = sorted(self.lost & reachable)
        for router_id in regained:
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
                if regained and record.origin_router is None and record.pub_delivery is None:
                    # Its publisher went while we were cut off, and may have resumed
                    # behind the cut: that router's "stream-resumed" never reached us.
                    # Where it resumed, or where the delivery was finished, says so
                    # (settle, done); else it waits for publisher_resume_timeout.
                    for router_id in regained:
                        self._route_control(router_id, {"t": "settled?", "d": record.tag.hex()}, out)
        # Subscribers waiting for confirmation from routers we can no longer reach
        # need not wait for them, nor resumed publishers for their stream's numbering.
        reachable = self.net.reachable()
        for pub in list(self.publishers.values()):
            if pub.awaiting_seq:
                pub.awaiting_seq &= reachable
                if not pub.awaiting_seq:
                    self.resumption.stream_seq_known(pub, now, out)
        for key, (link_id, waiting, _) in list(self._awaiting_acks.items()):
            waiting &= reachable
            if not waiting:
                self._subscriber_ready(key, out)
