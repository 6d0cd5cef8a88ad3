"""Failover: resuming publishers and subscribers, takeovers and placeholders
(docs/resumption.md). Following subscribers that moved away from a dead router is
the component's base, ``MovedSubscribers`` (router/core/moved.py).

A component of ``RouterCore`` (class ``Resumption``), not a mixin: it works
through the core's public state and named services only. Pure like the rest of
the core.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from router.core import outcomes, tags
from router.core.announcements import SubscriberKey
from router.core.commands import Command, DetachLink, Forward, Log
from router.core.constants import _TIMER_PLACEHOLDER, _TIMER_STREAM_SEQ
from router.core.errors import ProtocolError
from router.core.guarantees import AT_LEAST_ONCE
from router.core.links import hold_in_order, release_in_order
from router.core.moved import MovedSubscribers
from router.core.outcomes import OUTCOME_ACCEPTED, Outcome
from router.core.records import EMPTY_MAP, EMPTY_SET, DeliveryRecord, RouterState, SubscriberState

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable

    from router.core.events import MessageReceived
    from router.core.links import PublisherLink, Subscription, Topic

RESUME_PROPERTY = "eorouter:resume"
UNSETTLED_PROPERTY = "eorouter:unsettled"
INCOMPLETE_PROPERTY = "eorouter:incomplete-unsettled"

#: ``[delivery] publisher_rcv_settle_mode`` (docs/delivery-rule.md, "Settlement")
SETTLE_MODES = ("resumable", "first", "as-requested")


def publisher_settles_first(mode: str, asks_second: bool, properties: dict[str, Any] | None) -> bool:
    """Whether the router settles a publisher's deliveries itself, with their outcome
    (rcv-settle-mode first), rather than after the publisher settled them (second).

    A publisher that resumes resends what it has not seen settled. With the first mode
    its router settles the subscribers' copies in the same breath as the publisher's
    delivery: should the router die after a subscriber saw its copy settled and before
    the publisher saw its own, the resend finds nobody alive who remembers the
    delivery, and a subscriber that forgot it is sent it as new. With the second mode
    the subscribers' copies stay unsettled (they report them when they resume) until
    the publisher has settled, after which it never resends. So "resumable" gives the
    second mode to a publisher that asks for it and speaks the resume protocol (its
    attach carries ``eorouter:resume``, true or false); any other publisher gets first,
    which clients that complete a send only on a settled disposition need."""
    if mode == "first" or not asks_second:
        return True
    if mode == "as-requested":
        return False
    return not (properties and RESUME_PROPERTY in properties)


_STATE_NAMES = {
    "none": outcomes.NONE,
    "accepted": outcomes.ACCEPTED,
    "rejected": outcomes.REJECTED,
    "released": outcomes.RELEASED,
    "modified": outcomes.MODIFIED,
}


def reported_unsettled(properties: dict[str, Any] | None) -> tuple[bool, dict[bytes, int], bool]:
    """(resuming?, {tag: outcome code}, incomplete?) from a resuming attach's
    properties; malformed entries are skipped (the peer then resends them)."""
    props = properties or {}
    resuming = props.get(RESUME_PROPERTY) is True
    reported: dict[bytes, int] = {}
    pairs = props.get(UNSETTLED_PROPERTY)
    if isinstance(pairs, list):
        for pair in pairs:
            if isinstance(pair, (list, tuple)) and len(pair) == 2:
                tag, state = pair
                if (
                    isinstance(tag, (bytes, bytearray, memoryview))
                    and isinstance(state, str)
                    and state in _STATE_NAMES
                    and len(tag) <= tags.MAX_TAG_SIZE
                ):
                    reported[bytes(tag)] = _STATE_NAMES[state]
        resuming = True
    return resuming, reported, props.get(INCOMPLETE_PROPERTY) is True


def _pop_holders(pub: PublisherLink, ptag: bytes) -> set[str]:
    """The routers that said they hold ``ptag`` when ``pub`` resumed (each is told once)."""
    holders = pub.resend_holders
    routers = holders.pop(ptag, None) if holders else None
    if holders is not None and not holders:
        pub.resend_holders = None
    return routers or set()


def _held_seqs(pairs: object, sender: object) -> list[tuple[bytes, int]]:
    """A ``stream-seq`` answer's ``seqs``: [[publisher tag (hex), stream_seq], ...]."""
    if not isinstance(pairs, (list, tuple)):
        raise ProtocolError("amqp:invalid-field", f"stream-seq from {sender}: seqs {pairs!r}")
    held: list[tuple[bytes, int]] = []
    for pair in pairs:
        try:
            ptag, seq = pair
            if not isinstance(seq, int) or isinstance(seq, bool) or seq < 0:
                raise ValueError(seq)
            held.append((bytes.fromhex(ptag), seq))
        except (TypeError, ValueError):
            raise ProtocolError("amqp:invalid-field", f"stream-seq from {sender}: seqs entry {pair!r}") from None
    return held


#: A resumed stream's numbering never continues below the wall clock in microseconds.
SEQ_PER_SECOND = 1_000_000


def continued_seq(next_seq: int, highest_seen: int, now: float) -> int:
    """Where a resumed publisher stream's numbering (stream_seq, publisher order)
    continues: after every number this router and the other routers still know of
    (``highest_seen``; their answers raise it further, on_stream_seq), and never below
    ``now`` in microseconds of wall time.

    The floor is for what no live router knows. The routers that numbered the stream
    last may all be dead (every router its publisher and subscribers were on), and the
    survivors may never have seen it (no subscriber there), so their answers say
    nothing: continuing at 0 would number the next messages below ones the subscribers
    already have (the receivers' order chains, router/core/relay.py, would pass
    anything, and the proof would call every later delivery out of order). Numbers
    need only grow in publisher order, not be dense, and one run of numbering grows by
    one per message, so it stays below a later floor unless it numbered more than a
    million messages per second since it began, or the wall clocks of the two routers
    differ by more than the time between the two resumes (the same assumption as the
    mint-time rule, router/core/settled.py)."""
    return max(next_seq, highest_seen + 1, int(now * SEQ_PER_SECOND))


def state_name(outcome: Outcome | None) -> str:
    return "none" if outcome is None else outcomes.NAMES[outcome.code]


class Resumption(MovedSubscribers):
    """Failover as a component of the core, with a stated interface both ways.

    The core calls the public methods below and those of its base (router/core/moved.py)
    (each says when). This component reads the core's public state (``records``,
    ``topics``, ``publishers``, ``subscriptions``, ``by_delivery``, ``net``,
    ``settings``, ``epoch``, ``stream_seq``, ``lost``, ``settled``, ``moved_away``,
    ``moved_via``, ``resumed_at``, ``answers_held``, ``addressed_last``) and calls only the
    core's services named in ``RouterCore.SERVICES`` (router/core/router.py). It keeps no
    state of its own: what it needs rides on the links (``PublisherLink.resumed_with``,
    ``Subscription.placeholders``) and in those maps of the core's."""

    # ------------------------------------------------------------ publishers

    def resume_publisher(
        self, pub: PublisherLink, properties: dict[str, Any] | None, topic: Topic, now: float, out: list[Command]
    ) -> list[list[bytes | str]]:
        """A publisher re-attached with its incarnation: we become the origin of
        its stream's deliveries we hold. Returns our unsettled answer."""
        _, reported, incomplete = reported_unsettled(properties)
        # Continue the stream's numbering (publisher order) where any router left it.
        pub.next_seq = continued_seq(pub.next_seq, self.core.stream_seq.get(pub.stream, -1), now)
        answer: list[list[bytes | str]] = []
        for pub_tag in reported:
            record = self.core.records.get(tags.outgoing_tag(pub.stream, pub_tag))
            if record is not None:
                answer.append([pub_tag, state_name(record.outcome) if record.outcome else "none"])
        pub.resending = set(reported) or None
        pub.resend_seqs = dict.fromkeys(reported) if reported else None
        if not incomplete:
            pub.resumed_with = frozenset(tags.outgoing_tag(pub.stream, t) for t in reported)
        out.append(
            Log(
                "resume-requested",
                {
                    "link": pub.link_id,
                    "role": "publisher",
                    "reported": len(reported),
                    "known": len(answer),
                    "incomplete": incomplete,
                },
            )
        )
        if self.core.net.reachable() - {self.core.settings.router_id}:
            self.core.answers_held.add(pub.link_id)
        self._become_origin(pub, topic, reported, incomplete, now, out)
        self.wait_for_earlier_resends(pub, now, out)
        if not incomplete:
            self._stream_resumed(pub.stream, reported, now, out)
        self._announce_resumed_stream(pub, reported, incomplete, now, out)
        if not pub.awaiting_seq:  # no other router to ask: numbered from what we hold
            self._number_resends(pub)
        return answer

    def resume_at_most_once(
        self, pub: PublisherLink, properties: dict[str, Any] | None, now: float, out: list[Command]
    ) -> list[list[bytes | str]]:
        """A publisher of an at-most-once topic resumed here: nothing of its stream is
        kept anywhere, so we know none of what it reports; what it resends of those may
        have been delivered before its router died, and is not relayed again
        (admission's ``_relay_best_effort``): at most once, never twice."""
        _, reported, incomplete = reported_unsettled(properties)
        pub.next_seq = continued_seq(pub.next_seq, self.core.stream_seq.get(pub.stream, -1), now)
        pub.resending = set(reported) or None
        out.append(
            Log(
                "resume-requested",
                {"link": pub.link_id, "role": "publisher", "reported": len(reported), "known": 0, "incomplete": incomplete},
            )
        )
        # Its numbering continues after the highest any router saw (publisher order),
        # as for an exactly-once stream: its credit waits for their answers.
        self._announce_resumed_stream(pub, reported, incomplete, now, out)
        return []

    def _become_origin(
        self, pub: PublisherLink, topic: Topic, reported: dict[bytes, int], incomplete: bool, now: float, out: list[Command]
    ) -> None:
        """The resumed publisher's deliveries held here and not settled are ours to
        finish now, as their origin; those a complete list leaves out, it settled."""
        for record in [r for r in topic.records.values() if r.tag[: tags.STREAM_ID_SIZE] == pub.stream]:
            if record.pub_settled:
                continue
            # Before a takeover, which may answer: a record made from another origin's
            # copy has no publisher link here (GONE), and would be settled for it.
            record.pub_link = pub.link_id
            if record.origin_router is not None:
                self._take_over(record, topic, now, out)
            if not incomplete and record.pub_tag not in reported:
                # It does not hold it unsettled any more: it settled it.
                self.core.settle_record(record, "publisher-resumed", now, out)

    def wait_for_earlier_resends(self, pub: PublisherLink, now: float, out: list[Command]) -> None:
        """A subscriber that moved here is owed a delivery of the resumed stream that
        we hold, and the publisher listed deliveries we never saw before it (its list is
        in its send order): they come with its resends, and may be owed to it too (they
        are, when older than what the old origin sent us: admission's PREDATES). It
        waits for them (placeholders) before it gets the later one: at the resume, and
        when such a subscriber comes back while the resends come. (Sent it at once, a
        subscriber of a router that died got #2, then the publisher's resend of #1:
        found by the generated histories.)"""
        listed = pub.resend_seqs
        if not listed:
            return
        records = self.core.records
        unseen: list[bytes] = []  # outgoing tags listed so far that we never saw
        waiting: set[str] = set()  # subscribers given placeholders for them already
        for ptag in listed:
            tag = tags.outgoing_tag(pub.stream, ptag)
            record = records.get(tag)
            if record is None:
                if tag not in self.core.settled:
                    unseen.append(tag)
                continue
            if not unseen or record.pub_settled:
                continue
            for key, state in record.subscribers.items():
                if key in waiting or state.outcome is not None or state.sent:
                    continue
                sub = self.core.subscriptions.get(key)
                if sub is None or not self.core.net.membership.locations(SubscriberKey(sub.container_id, sub.name)):
                    continue  # (began here: owed none of them, PREDATES)
                waiting.add(key)
                for earlier in unseen:
                    if earlier not in sub.placeholders.get(pub.stream, ()):
                        sub.placeholders.setdefault(pub.stream, set()).add(earlier)
                        self.core.add_timer(now + self.core.settings.placeholder_timeout, _TIMER_PLACEHOLDER, (sub, earlier))
                        out.append(Log("placeholder-created", {"subscriber": key, "delivery": earlier.hex()}))

    def _announce_resumed_stream(
        self, pub: PublisherLink, reported: dict[bytes, int], incomplete: bool, now: float, out: list[Command]
    ) -> None:
        """Tell every router where the publisher is now and what it still holds, and
        hold its credit back until they said how far they saw its stream numbered."""
        # Routers holding this stream's deliveries from the old origin may never hear
        # that the publisher settled some: tell them what it still holds. And every
        # router must learn where the publisher is now, complete list or not: an old
        # origin that outlived its link hands its records over, or the copies we send
        # it would wait for its answer for ever (issue 16, part 3).
        message: dict[str, Any] = {
            "t": "stream-resumed",
            "stream": pub.stream.hex(),
            "at": self.core.settings.router_id,
            "n": f"{self.core.epoch}.{pub.link_id}",
            "unsettled": sorted(t.hex() for t in reported),
        }
        if incomplete:
            message["incomplete"] = True
        self.heard_resumed(pub.stream, self.core.settings.router_id, now)
        self.core.flood(message, None, out)
        # Every router answers with how far it saw the stream numbered; until they
        # have (or are unreachable, or a timeout), the link gets no credit, so every
        # new delivery here is numbered after all of theirs.
        others = self.core.net.reachable() - {self.core.settings.router_id}
        if others:
            pub.awaiting_seq = set(others)
            self.core.add_timer(now + self.core.settings.stream_seq_timeout, _TIMER_STREAM_SEQ, pub)

    def on_stream_seq(self, message: dict[str, Any], now: float, out: list[Command]) -> None:
        """A router's answer to our "stream-resumed": the highest stream_seq it saw."""
        stream = bytes.fromhex(message["stream"])
        seq = message.get("seq", -1)
        sender = message.get("from")
        if not isinstance(seq, int):
            raise ProtocolError("amqp:invalid-field", f"stream-seq from {sender}: seq {seq!r}")
        held = _held_seqs(message.get("seqs", ()), sender)
        for pub in list(self.core.publishers.values()):
            if pub.stream == stream and pub.awaiting_seq and sender in pub.awaiting_seq:
                pub.next_seq = max(pub.next_seq, seq + 1)
                self._wait_for_holder(pub, sender, held, now, out)
                numbers = pub.resend_seqs
                if numbers:
                    for ptag, held_seq in held:
                        if ptag in numbers:
                            known = numbers[ptag]
                            numbers[ptag] = held_seq if known is None else min(known, held_seq)
                            if pub.resend_holders is None:
                                pub.resend_holders = {}
                            pub.resend_holders.setdefault(ptag, set()).add(sender)
                pub.awaiting_seq.discard(sender)
                if not pub.awaiting_seq:
                    self.stream_seq_known(pub, now, out)

    def _wait_for_holder(
        self, pub: PublisherLink, sender: str, held: list[tuple[bytes, int]], now: float, out: list[Command]
    ) -> None:
        """``sender`` holds these deliveries of the resumed stream: a record we took over
        waits for its answer too (and is sent again, which it answers). A router the
        delivery went through for a subscriber that moved on holds that subscriber's
        answer; counted neither as interested nor as having addressed a copy here, it
        was not waited for, and the publisher heard "released" for what the subscriber
        accepted (found by the generated histories, a subscriber moving twice)."""
        for ptag, _ in held:
            record = self.core.records.get(tags.outgoing_tag(pub.stream, ptag))
            if record is not None and record.origin_router is None and record.pub_link == pub.link_id:
                self._wait_for(record, (sender,), now, out)

    def release_answers(self, link_id: int, now: float, out: list[Command]) -> None:
        """The outcomes of a resumed publisher's deliveries stop waiting (every router
        answered, or the wait timed out, or the link went)."""
        if link_id not in self.core.answers_held:
            return
        self.core.answers_held.discard(link_id)
        for record in list(self.core.records.values()):
            if record.pub_link == link_id and record.origin_router is None and not record.pub_settled and record.outcome is None:
                self.core.maybe_answer_publisher(record, now, out)

    def stream_seq_known(self, pub: PublisherLink, now: float, out: list[Command]) -> None:
        pub.awaiting_seq = None
        self._number_resends(pub)
        self.core.stream_seq[pub.stream] = max(self.core.stream_seq.get(pub.stream, -1), pub.next_seq - 1)
        out.append(Log("stream-seq-continued", {"link": pub.link_id, "next_seq": pub.next_seq}))
        self.core.refill_credit(self.core.topics[pub.topic], out)
        self.release_answers(pub.link_id, now, out)

    def _number_resends(self, pub: PublisherLink) -> None:
        """The numbers the resumed publisher's resends of deliveries we never saw take,
        before it can send (its credit waits for this): what the routers that hold them
        said (or our own records), so that every router orders them as their first
        router did; a tag nobody holds, one below the next listed tag's number (the
        list is in send order, and its first router numbered no two deliveries alike,
        so this is never below the number it gave it); after the last held one, the
        stream's continued numbering. (Numbered on from the highest number anyone saw,
        as new deliveries are, a resend we never saw came after later deliveries of its
        stream we held from the old origin, and a subscriber that moved here and was
        owed both got them out of order: found by the generated histories.)"""
        numbers = pub.resend_seqs
        if not numbers:
            return
        records = self.core.records
        for ptag, known in numbers.items():
            record = records.get(tags.outgoing_tag(pub.stream, ptag))
            if record is not None and (known is None or record.stream_seq < known):
                numbers[ptag] = record.stream_seq
        following: int | None = None
        for ptag in reversed(numbers):
            known = numbers[ptag]
            if known is not None:
                following = known
            elif following is not None:
                following = max(following - 1, 0)
                numbers[ptag] = following
        for ptag, known in numbers.items():
            if known is None:
                numbers[ptag] = pub.next_seq
                pub.next_seq += 1

    def wait_for_holders(self, pub: PublisherLink, record: DeliveryRecord, now: float, out: list[Command]) -> None:
        """A resend became ``record``, ours as origin: routers that hold it (they said
        so when the publisher resumed here) and that we do not wait for yet are sent it
        and waited for: each answers (again: it may have answered once it heard the
        publisher is here, before the resend made our record) and hears the end. Not
        sent the settlement, such a router held its record for ever (found by
        tests/failover/test_moving_subscribers.py, the publisher moving too); not waited
        for, one holding the answer of a subscriber that moved on from there was left
        out, and the publisher heard "released" for what it accepted (found by the
        generated histories, a subscriber moving twice)."""
        routers = _pop_holders(pub, record.pub_tag)
        if routers:
            self._wait_for(record, routers, now, out)

    def _wait_for(self, record: DeliveryRecord, routers: Iterable[str], now: float, out: list[Command]) -> None:
        reachable = self.core.net.reachable()
        added = [
            r for r in sorted(routers) if r not in record.remote_routers and r != self.core.settings.router_id and r in reachable
        ]
        if not added or record.pub_settled or record.outcome is not None:
            return
        remote = record.own_remote_routers()
        for router_id in added:
            remote[router_id] = RouterState()
        record.waiting = -1
        self.core.send_towards(record, added, now, out)

    def resend_seq(self, pub: PublisherLink, ptag: bytes, seq: int) -> int:
        """The number of a resend of ``ptag`` we never saw (``seq``: the next one of
        the stream, when it has none of its own)."""
        numbers = pub.resend_seqs
        if not numbers:
            return seq
        reserved = numbers.pop(ptag, None)
        if not numbers:
            pub.resend_seqs = None
        return seq if reserved is None else reserved

    def on_stream_resumed(self, message: dict[str, Any], now: float, out: list[Command]) -> None:
        """A publisher resumed elsewhere: that router is the origin of its stream's
        deliveries we still act as origin for. With its complete unsettled list, the
        deliveries of its stream we hold that it does not list, it settled."""
        stream = bytes.fromhex(message["stream"])
        unsettled = {bytes.fromhex(t) for t in message.get("unsettled", ())}
        at = message["at"]
        if at == self.core.settings.router_id:
            return  # our own announcement, come back round a loop
        self.heard_resumed(stream, at, now)
        # An incomplete list says where the publisher is, not what it settled.
        complete = not message.get("incomplete")
        if complete:
            self._stream_resumed(stream, unsettled, now, out)
        for pub in [p for p in self.core.publishers.values() if p.stream == stream]:
            # Its link here still looks live, but the publisher already resumed at
            # ``at`` (we lost it before we noticed: a cut link, not a death). The
            # newer attach wins, as link stealing does on one router.
            out.append(DetachLink(pub.link_id, "amqp:link:stolen", f"the link resumed at router {at}", close=False))
            self.core.detach_publisher(pub, "stolen", now, out)
        # Tell it how far we saw the stream numbered (after taking our link down:
        # nothing more of the stream is numbered here), and the number of each delivery
        # it still holds unsettled that we hold: its resends of them keep their place.
        answer: dict[str, Any] = {"t": "stream-seq", "stream": message["stream"], "seq": self.core.stream_seq.get(stream, -1)}
        held = [
            [record.pub_tag.hex(), record.stream_seq]
            for ptag in unsettled
            if (record := self.core.records.get(tags.outgoing_tag(stream, ptag))) is not None
        ]
        if held:
            answer["seqs"] = held
        self.core.route_control(at, answer, out)
        for record in list(self.core.records.values()):
            if record.tag[: tags.STREAM_ID_SIZE] != stream or record.pub_settled:
                continue
            if complete and record.pub_tag not in unsettled:
                self.core.settle_record(record, "publisher-resumed", now, out)
            elif record.origin_router is None:
                self._hand_origin_over(record, at, now, out)
            elif not self.origin_moved(record, at, now, out) and record.outcome is not None:
                # Our answer went to the old origin, which may have died with the
                # settlement it owed us: the new one takes it, or, having finished
                # the delivery already, tells us it is settled.
                self.core.answer_origin(record, record.outcome, at, out)

    def heard_resumed(self, stream: bytes, at: str, now: float) -> None:
        """Remember where the stream's publisher resumed last, as heard here."""
        resumed_at = self.core.resumed_at
        resumed_at.pop(stream, None)  # (to the end: the map is oldest first)
        resumed_at[stream] = (at, now)
        self.core.arm_sweep(now)

    def may_be_new_origin(self, stream: bytes, sender: str) -> bool:
        """Whether a plain copy from ``sender`` of a delivery of ``stream`` we hold from
        another origin can be its new origin's: the publisher last resumed there, or we
        heard of no resume. A copy from anywhere else is stale: sent before its sender
        handed the stream over (held up on a busy link, it can come after the new
        origin's). Taken for the new origin's, it turned our record back to a router
        that had forgotten the delivery, and the true origin waited for our answer for
        ever (found under CPU load by tests/failover/test_moving_subscribers.py). A new
        origin's copy that overtook its news is left to the news, which moves the
        record when it comes (on_stream_resumed)."""
        last = self.core.resumed_at.get(stream)
        return last is None or last[0] == sender

    def _stream_resumed(self, stream: bytes, unsettled_pub_tags: Iterable[bytes], now: float, out: list[Command]) -> None:
        """The stream's publisher resumed with a complete unsettled list: drop resuming
        subscribers' placeholders for tags it no longer holds (they were made before
        this resume, so the publisher had sent them: it settled them, and they will
        never arrive) so they stop holding the stream back."""
        still = frozenset(tags.outgoing_tag(stream, t) for t in unsettled_pub_tags)
        self._drop_placeholders(stream, lambda waiting: sorted(waiting - still), now, out)

    def _hand_origin_over(self, record: DeliveryRecord, new_origin: str, now: float, out: list[Command]) -> None:
        """The reverse of a takeover: its publisher resumed at ``new_origin`` while we
        still acted as origin (we were cut off from it, not dead). That router is the
        origin now; we are one of the routers it waits for, answering for our own
        subscribers only."""
        out.append(
            Log(
                "origin-taken-over",
                {"delivery": record.delivery_id, "from_router": self.core.settings.router_id, "to_router": new_origin},
            )
        )
        if record.pub_delivery is not None:
            self.core.by_delivery.pop(record.pub_delivery, None)
            record.pub_delivery = None
        record.pub_link = -1
        record.origin_router = new_origin
        record.remote_routers = EMPTY_MAP
        record.moved = EMPTY_MAP
        record.settle_pending = EMPTY_SET
        self.core.topics[record.topic].unsettled -= 1
        record.outcome = None
        if record.targeted:
            # (As origin we counted them ourselves; those addressed by a router that died
            # count in our own answer now: their reports would reach nobody.)
            reachable = self.core.net.reachable()
            self.untarget(record, {r for r in record.targeted.values() if r not in reachable}, now, out)
        if not record.subscribers:
            # Owed to nobody here, so nothing left to keep. But the new origin may
            # count us among the routers it waits for and have sent us its copy
            # already: one that came before this news was left for it
            # (relay._known_copy), and without an answer that origin would wait for
            # ever. "none" ends its wait; an origin that did not wait for us ignores it.
            self.core.route_control(new_origin, {"t": "outcome", "d": record.tag.hex(), "o": outcomes.NONE}, out)
            self.core.delete(record, "origin-handed-over", out)
            return
        self.core.maybe_answer_publisher(record, now, out)

    def _take_over(
        self, record: DeliveryRecord, topic: Topic, now: float, out: list[Command], holders: Iterable[str] = ()
    ) -> None:
        """Its origin router died and its publisher resumed here: this router is the
        origin now. Every other interested router is sent the delivery again (they
        recognise the tag and answer us)."""
        old_origin = record.origin_router
        out.append(Log("origin-taken-over", {"delivery": record.delivery_id, "from_router": old_origin}))
        record.origin_router = None
        record.header = None
        # Who addressed copies to our subscribers (record.targeted) stays: as origin we
        # count those subscribers ourselves (_owed_answers), but the router that passed
        # a copy on to one (it had moved here from there) still waits for its answer,
        # and only that answer lets it answer us and hear the end: wiped, it held its
        # record for ever (the old origin, alive, had handed the delivery over to us
        # and forgotten it; found by the generated histories).
        # Its outcome so far was our subscribers' answer to the old origin, not the
        # network's: the publisher hears only once everyone answered us.
        record.outcome = None
        topic.unsettled += 1
        # Every interested router, and those that said they hold it when its publisher
        # resumed here (wait_for_holders).
        holding = (set(holders) & self.core.net.reachable()) - {self.core.settings.router_id}
        for router_id in sorted(self.core.net.interested_routers(record.topic) | holding):
            record.own_remote_routers().setdefault(router_id, RouterState())
        pending = [r for r, st in record.remote_routers.items() if st.outcome is None]
        if pending:
            self.core.send_towards(record, pending, now, out)
        if old_origin in self.core.lost:
            # The old origin owed it to its own subscribers too, and may have died
            # before they had it: its durable ones are owed it by us now, wherever
            # they re-attach (what _router_lost does for a router we wait for).
            keys = self.durable_owed_at(old_origin, record)
            owed = [key for key in keys if self._owe_moved_or_local(record, key, now, out)]
            if owed:
                out.append(Log("owed-moved", {"delivery": record.delivery_id, "from_router": old_origin, "subscribers": owed}))
        if old_origin is not None:
            self.readdress_from(record, old_origin, out)
        self.core.maybe_answer_publisher(record, now, out)

    def resent_by_publisher(
        self, record: DeliveryRecord, pub: PublisherLink, ev: MessageReceived, now: float, out: list[Command]
    ) -> bool:
        """A resumed publisher resent a delivery we hold: attach the new transfer to
        the record (never forward it twice) and answer it if we can already."""
        if record.pub_delivery is not None:
            return False
        if pub.resend_seqs:
            self.resend_seq(pub, record.pub_tag, 0)  # it keeps its number
        if record.origin_router is not None and not record.pub_settled:
            # A copy from its old origin that reached us after the publisher resumed
            # here (still in flight, or resent on a route change before that router
            # heard): the publisher is here, so we are its origin now.
            record.pub_link = pub.link_id
            self._take_over(record, self.core.topics[record.topic], now, out, _pop_holders(pub, record.pub_tag))
        record.pub_delivery = ev.delivery
        record.pub_link = pub.link_id
        self.core.by_delivery[ev.delivery] = record
        out.append(Log("resend-matched", {"delivery": record.delivery_id, "link": pub.link_id}))
        if record.pub_settled:
            # Settled on its behalf meanwhile: it hears the outcome, and we are done.
            # (Settled by another origin: the outcome that origin finished it with.)
            outcome = record.outcome
            final = self.core.final_outcome(record) if record.origin_router is not None else None
            if final is not None:
                outcome = OUTCOME_ACCEPTED if final == outcomes.ACCEPTED else Outcome(final)
            self.core.send_publisher_outcome(record, outcome or OUTCOME_ACCEPTED, out, settle=True)
            self.core.by_delivery.pop(ev.delivery, None)
            record.pub_delivery = None
        elif record.outcome is not None:
            self.core.outcome_to_publisher(record, record.outcome, now, out)
        return True

    # ------------------------------------------------------------ subscribers

    def resume_subscriber(
        self,
        sub: Subscription,
        properties: dict[str, Any] | None,
        records: list[DeliveryRecord],
        now: float,
        out: list[Command],
    ) -> list[list[bytes | str]]:
        """The design's rules for a resuming receiver (``records``: those of the
        topics it subscribes to, in publisher order). Returns our unsettled answer."""
        _, reported, incomplete = reported_unsettled(properties)
        key = sub.key
        topic = None if sub.pattern else self.core.topics.get(sub.topic)
        # At-least-once (docs/guarantees.md): a delivery it holds that we never saw is
        # not waited for; should it come, it is delivered again.
        waits = topic is None or topic.guarantee.mode != AT_LEAST_ONCE
        known: list[tuple[bytes, DeliveryRecord, SubscriberState]] = []  # what it reported that we hold
        awaited: list[list[bytes | str]] = []  # what it reported that we wait for
        for tag, code in reported.items():
            record = self.core.records.get(tag)
            if record is None:
                # Else settled and forgotten here: left out of our answer.
                if waits and tag not in self.core.settled and self._placeholder_for(sub, tag, now, out):
                    # Listed, with its state: left out, it would forget the delivery, and
                    # at its next router, reporting nothing, be sent it as one it never
                    # got (found by tests/failover/test_moving_subscribers.py: the proof
                    # called it a duplicate).
                    awaited.append([tag, outcomes.NAMES[code]])
                    sub.listed.add(tag)
                continue
            if record.pub_settled:
                state = record.subscribers.get(key)
                if state is not None:
                    state.known_settled = True
                continue  # left out of our answer: it is settled
            known.append((tag, record, self._owe_reported(record, key, code, now, out)))
        if not incomplete:
            # Unsettled records it did not report: it never got them. But not those its
            # subscription began after, at the router it comes from (that router's
            # announcement of it says what it held then): never owed to it.
            began = [
                s for s in self.core.net.membership.announced_elsewhere(SubscriberKey(sub.container_id, sub.name)) if s.before
            ]
            for record in records:
                if began and any(s.was_here_before(record.tag[: tags.STREAM_ID_SIZE], record.stream_seq) for s in began):
                    continue
                if not record.pub_settled and record.tag not in reported and record.payload is not None:
                    state = record.subscribers.get(key)
                    if (state is None or state.outcome is None) and (state is not None or self.selects(record, key, out)):
                        self.owe_here(record, key)
        # Its reported outcome may have been the last answer a record needed, and
        # the record settled meanwhile: that one is settled, so left out too.
        answer: list[list[bytes | str]] = [
            [tag, state_name(state.outcome)] for tag, record, state in known if not record.pub_settled
        ]
        answer += awaited
        out.append(
            Log(
                "resume-requested",
                {
                    "link": sub.link_id,
                    "role": "subscriber",
                    "reported": len(reported),
                    "known": len(answer),
                    "incomplete": incomplete,
                },
            )
        )
        return answer

    def await_moved(self, sub: Subscription, tag: bytes, now: float, out: list[Command]) -> None:
        """Another router owed ``tag`` to ``sub``, which attached here, and is sending it
        here (its answer to our announcement): a placeholder, as for a delivery the
        subscriber reported, unless its topic is at-least-once (order is not held for
        a repeat there) or we know it settled."""
        topic = None if sub.pattern else self.core.topics.get(sub.topic)
        if topic is not None and topic.guarantee.mode == AT_LEAST_ONCE:
            return
        if tag in self.core.settled or tag in sub.placeholders.get(tag[: tags.STREAM_ID_SIZE], ()):
            return
        self._placeholder_for(sub, tag, now, out)

    def _placeholder_for(self, sub: Subscription, tag: bytes, now: float, out: list[Command]) -> bool:
        """A resuming subscriber reported ``tag``, which we never saw: it waits for it
        (a placeholder holds the rest of its stream back) unless its publisher
        resumed without it (settled). True when it waits."""
        stream = tag[: tags.STREAM_ID_SIZE]
        if self.settled_before_resume(tag):
            # Its publisher resumed here without it: settled (its router died
            # before this subscriber heard). Left out of our answer.
            out.append(Log("placeholder-settled", {"subscriber": sub.key, "delivery": tag.hex()}))
            return False
        sub.placeholders.setdefault(stream, set()).add(tag)
        self.core.add_timer(now + self.core.settings.placeholder_timeout, _TIMER_PLACEHOLDER, (sub, tag))
        out.append(Log("placeholder-created", {"subscriber": sub.key, "delivery": tag.hex()}))
        # It may be on its way here, or settled long ago by a router that is
        # still alive (its settlement died with the subscriber's old router):
        # ask; a router that knows it settled answers "settle" with "done".
        for router_id in sorted(self.core.net.reachable() - {self.core.settings.router_id}):
            self.core.route_control(router_id, {"t": "settled?", "d": tag.hex()}, out)
        return True

    def settled_before_resume(self, tag: bytes) -> bool:
        """Whether ``tag``, a delivery this router holds no record of and does not
        remember settled, is one its publisher had settled: true when the publisher
        resumed *here* with a complete unsettled list that leaves it out, and its link
        has stayed attached since. Every delivery of the stream published after that
        resume came through this router (it would hold the record or remember it
        settled), so the tag is older, and the publisher no longer held it.

        Not so from another router's list (a "stream-resumed" heard earlier): a tag
        published after that resume is missing from it too. Trusting such a list
        told a subscriber that moved to a freshly restarted router that a delivery
        was settled which was still on its way, and then sent it as a new one
        (found by `scripts/bench --failover`)."""
        stream = tag[: tags.STREAM_ID_SIZE]
        for pub in self.core.publishers.values():
            if pub.stream == stream and pub.resumed_with is not None:
                return tag not in pub.resumed_with
        return False

    def _owe_reported(self, record: DeliveryRecord, key: str, code: int, now: float, out: list[Command]) -> SubscriberState:
        """A resuming subscriber reported a delivery we hold unsettled: owed to it and
        sent again; the terminal outcome it reports is its answer."""
        state = self.owe_here(record, key)
        state.resend = True
        if code in outcomes.TERMINAL and state.outcome is None:
            state.outcome = OUTCOME_ACCEPTED if code == outcomes.ACCEPTED else Outcome(code)
            out.append(
                Log(
                    "sub-outcome",
                    {"delivery": record.delivery_id, "subscriber": key, "outcome": outcomes.NAMES[code], "settled": False},
                )
            )
            self.core.after_subscriber_outcome(record, key, now, out)
        return state

    def placeholder_blocks(self, sub: Subscription, record: DeliveryRecord) -> bool:
        return (
            bool(sub.placeholders)
            and record.tag[: tags.STREAM_ID_SIZE] in sub.placeholders
            and record.tag not in sub.placeholders[record.tag[: tags.STREAM_ID_SIZE]]
        )

    def after_distribute_to_resumed(self, record: DeliveryRecord, topic: Topic, now: float, out: list[Command]) -> None:
        """A new record was queued (never sent directly) for subscribers holding
        placeholders: fulfil theirs, then send it through the placeholder check."""
        resumed = [sub for sub in topic.subscriptions.values() if sub.placeholders]
        if not resumed:
            return
        self.fulfil_placeholders(record, now, out)
        for sub in resumed:
            self.core.pump(sub, now, out)

    def fulfil_placeholders(
        self, record: DeliveryRecord, now: float, out: list[Command], only: Iterable[str] | None = None
    ) -> None:
        """A delivery arrived here (for subscribers ``only``, when given: a copy of one we
        hold, addressed to them): resumed subscribers waiting for it get it first, then
        what they held back of its stream."""
        topic = self.core.topics.get(record.topic)
        if topic is None:
            return
        stream = None
        for sub in topic.subscriptions.values():
            if not sub.placeholders:  # the usual case, checked first: this runs per message
                continue
            if only is not None and sub.key not in only:
                continue
            if stream is None:
                stream = record.tag[: tags.STREAM_ID_SIZE]
            waiting = sub.placeholders.get(stream)
            if not waiting or record.tag not in waiting:
                continue
            waiting.discard(record.tag)
            sub.listed.discard(record.tag)
            out.append(Log("placeholder-fulfilled", {"subscriber": sub.key, "delivery": record.delivery_id}))
            state = self.owe_here(record, sub.key)
            state.resend = True
            # Held with what its stream held back, in publisher order, and all of it
            # sent once the last placeholder is fulfilled. (Put at the head of the
            # queue instead, several fulfilled while the subscriber waited to be ready
            # went out in reverse: found by `scripts/bench --failover`.)
            hold_in_order(sub.held.setdefault(stream, []), record)
            if not waiting:
                self._release_held(sub, stream)
            self.core.pump(sub, now, out)

    def placeholder_expired(self, sub: Subscription, tag: bytes, now: float, out: list[Command]) -> None:
        stream = tag[: tags.STREAM_ID_SIZE]
        waiting = sub.placeholders.get(stream)
        if not waiting or tag not in waiting:
            return
        waiting.discard(tag)
        sub.listed.discard(tag)
        out.append(Log("placeholder-expired", {"subscriber": sub.key, "delivery": tag.hex()}))
        if not waiting:
            self._release_held(sub, stream)
            self.core.pump(sub, now, out)

    def placeholder_settled(self, tag: bytes, now: float, out: list[Command]) -> None:
        """Another router says ``tag`` was settled: placeholders for it wait for nothing."""
        self._drop_placeholders(tag[: tags.STREAM_ID_SIZE], lambda waiting: [tag] if tag in waiting else [], now, out)

    def _drop_placeholders(
        self, stream: bytes, settled: Callable[[set[bytes]], list[bytes]], now: float, out: list[Command]
    ) -> None:
        """Drop the placeholders ``settled(waiting)`` names (settled deliveries will
        never arrive) from every subscription waiting on ``stream``; one left with
        none gets what it held back."""
        for sub in list(self.core.subscriptions.values()):
            waiting = sub.placeholders.get(stream)
            if not waiting:
                continue
            dropped = settled(waiting)
            for tag in dropped:
                waiting.discard(tag)
                out.append(Log("placeholder-settled", {"subscriber": sub.key, "delivery": tag.hex()}))
                if tag in sub.listed:
                    self._settle_listed(sub, tag, out)
            if dropped and not waiting:
                self._release_held(sub, stream)
                self.core.pump(sub, now, out)

    @staticmethod
    def _settle_listed(sub: Subscription, tag: bytes, out: list[Command]) -> None:
        """A delivery the subscriber reported holding, which our answer listed and which
        another router finished: settle it on the subscriber's link, or the subscriber
        keeps it unsettled until its next resume. The only way to settle a tag on a link
        that never carried it is a transfer under it: pre-settled and empty, which the
        subscriber (holding the tag) answers as before without a message to hand over
        (docs/resumption.md, "Placeholders")."""
        sub.listed.discard(tag)
        assert sub.link_id is not None  # unlinking clears ``listed``
        if sub.credit > 0:
            sub.credit -= 1  # the transfer takes a credit, as a copy does
        out.append(Forward(sub.link_id, tag, b"", True))

    def _release_held(self, sub: Subscription, stream: bytes) -> None:
        sub.placeholders.pop(stream, None)
        held = sub.held.pop(stream, None)
        if held:
            release_in_order(sub.queue, held, stream)
