"""Publisher credit: the in-flight bound and the byte budget.

A mixin of ``RouterCore`` (router/core/router.py): its methods share the core's state,
documented there, and are split out only to keep one concern per module."""

from __future__ import annotations

from typing import TYPE_CHECKING

from router.core.commands import (
    Command,
    GrantCredit,
    Log,
)
from router.core.constants import (
    UNCOUNTED_BELOW,
)
from router.core.links import Topic

if TYPE_CHECKING:
    from router.core.corestate import CoreState
else:
    CoreState = object  # declarations for mypy only: no base class at run time


class CreditMixin(CoreState):
    def _refill_credit(self, topic: Topic, out: list[Command], bound_only: bool = False) -> None:
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
        limits = self._byte_limits(topic, window, room, out)
        if limits is None:
            return  # it waits behind other topics for the router's room
        window, room, eighth = limits
        if bound_only and room * 8 < eighth:
            return
        granted = False
        est = topic.est
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
            self._after_grant(topic, out)

    def _byte_limits(self, topic: Topic, window: int, room: int, out: list[Command]) -> tuple[int, int, int] | None:
        """The byte budget, in messages of the topic's size estimate: (each
        publisher's window, the room, the threshold a partial grant must reach).
        Each publisher's window is its share of the topic's budget, as it is of the
        in-flight bound; the room is what the topic's and the router's budgets have
        left beyond what is held and promised. None: the topic waits behind others
        for the router's room."""
        settings = self.settings
        publishers = topic.publishers
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
            return None
        if (
            room < 1
            and by_bytes == room
            and not topic.at_budget
            and not any(p.credit for p in publishers.values() if not p.presettled)
        ):
            self._at_budget(topic, router_limited, out)
        return window, room, eighth

    def _after_grant(self, topic: Topic, out: list[Command]) -> None:
        """A grant went out: the topic no longer waits for room, its size estimate
        follows its recent messages down, and a budget line says it flows again."""
        self._starved.pop(topic.name, None)
        est = topic.est
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
            out.append(
                Log("budget", {"topic": topic.name, "state": "below", "bytes": topic.bytes, "router_bytes": self.bytes_held})
            )

    def _at_budget(self, topic: Topic, router_wide: bool, out: list[Command]) -> None:
        """The byte budget withholds the topic's credit: say so once, and remember to
        grant again when the router's other topics give bytes back."""
        if router_wide:
            self._starved[topic.name] = None
        if not topic.at_budget:
            topic.at_budget = True
            out.append(
                Log(
                    "budget",
                    {
                        "topic": topic.name,
                        "state": "reached",
                        "bytes": topic.bytes,
                        "router_bytes": self.bytes_held,
                        "limit": "router" if router_wide else "topic",
                    },
                )
            )

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

    def _refill_pending(self, out: list[Command]) -> None:
        pending = self._pending_refills
        self._pending_refills = []
        for topic in pending:
            if self.topics.get(topic.name) is topic:
                self._refill_credit(topic, out)
            else:
                self._starved.pop(topic.name, None)  # gone meanwhile
