"""A publisher's message: its tag, its admission, and its fan-out to subscribers (and best effort).

A mixin of ``RouterCore`` (router/core/router.py): its methods share the core's state,
documented there, and are split out only to keep one concern per module."""

from __future__ import annotations

from typing import TYPE_CHECKING

from router.core import outcomes, tags
from router.core.commands import (
    Command,
    Drained,
    Forward,
    Log,
    Received,
    SendOutcome,
    SettleOutgoing,
)
from router.core.constants import (
    _TAG_SIZE,
    _TIMER_EXPIRY,
    BEYOND_HORIZON_CONDITION,
    UNCOUNTED_BELOW,
    _new,
)
from router.core.errors import ProtocolError
from router.core.events import (
    CreditChanged,
    MessageReceived,
    MessageTooLarge,
)
from router.core.guarantees import AT_LEAST_ONCE
from router.core.links import PublisherLink, Subscription, Topic, hold_in_order
from router.core.message import MessageError, OriginTemplate, splice_origin
from router.core.msgfields import application_values
from router.core.outcomes import OUTCOME_ACCEPTED, Outcome
from router.core.records import (
    ANSWER_UNSENT,
    DeliveryRecord,
    Roster,
    RouterState,
    SubscriberState,
)
from router.core.selection import selected_roster
from router.core.settled import BEYOND_HORIZON, KNOWN

if TYPE_CHECKING:
    from router.core.corestate import CoreState
else:
    CoreState = object  # declarations for mypy only: no base class at run time


#: A resend of a delivery never seen here that is older than a delivery of its stream
#: its old origin sent here (``_predates_what_its_old_origin_sent_here``).
PREDATES = 2


class AdmissionMixin(CoreState):
    def _on_message(self, ev: MessageReceived, now: float, out: list[Command]) -> None:
        """A publisher's transfer: counted against its credit and the topic's size
        estimate, numbered in its stream, then named (its outgoing tag: a new
        delivery, a resend, or a reuse), prepared (the origin annotation, expiry),
        recorded and fanned out. Each step returns None when it answered the
        transfer itself."""
        pub = self.publishers.get(ev.link_id)
        if pub is None:
            raise ProtocolError("amqp:internal-error", f"message on unknown link {ev.link_id}")
        topic = self.topics[pub.topic]
        # Counted against its credit and the topic's size estimate, then numbered: inline
        # rather than steps of their own, a call saved per message.
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
        self.stream_seq[pub.stream] = seq
        if ev.settled or pub.presettled:
            topic.published += 1
            self._relay_best_effort(pub, topic, ev, now, out)
            return
        if self.draining:
            self._refuse_while_draining(ev, out)
            return
        named = self._name_delivery(pub, topic, ev, now, out)
        if named is None:
            return
        prepared = self._prepare_payload(pub, ev, now, out)
        if prepared is None:
            return
        topic.published += 1
        if named[2] and pub.resend_seqs:  # a resend we never saw: it keeps its place
            seq = self.resumption.resend_seq(pub, ev.tag, seq)
        record = self._new_record(pub, topic, ev, seq, named, prepared, now)
        self._fan_out(record, prepared[0], pub, topic, ev, size, now, out, named[2] == PREDATES)
        if named[2] and pub.resend_holders:  # routers that hold it: waited for too
            self.resumption.wait_for_holders(pub, record, now, out)

    def _refuse_while_draining(self, ev: MessageReceived, out: list[Command]) -> None:
        """A shutting-down router takes nothing new: released, so the publisher may
        send it again elsewhere."""
        out.append(SendOutcome(ev.delivery, outcomes.RELEASED, True))
        out.append(
            Log(
                "pub-outcome",
                {
                    "delivery": None,
                    "outcome": "released",
                    "condition": outcomes.SHUTTING_DOWN,
                    "reason": "router is shutting down",
                },
            )
        )

    def _new_record(
        self,
        pub: PublisherLink,
        topic: Topic,
        ev: MessageReceived,
        seq: int,
        named: tuple[bytes, int, int],
        prepared: tuple[bytes, float | None],
        now: float,
    ) -> DeliveryRecord:
        """The record of a new delivery, from what naming and preparing it gave."""
        tag, reuse, resent = named
        payload, expires_at = prepared
        record = DeliveryRecord(
            tag,
            topic.name,
            next(self._order),
            payload,
            pub.container_id,
            pub.name,
            ev.tag,
            pub.incarnation,
            seq,
            pub.link_id,
            ev.delivery,
            expires_at,
            reuse,
        )
        record.arrived = now
        if resent:
            record.resent = True
        if topic.guarantee.mode == AT_LEAST_ONCE:
            record.alo = True  # never remembered settled: no memory to add its outcome to
            return record
        memory = pub.memory
        if memory is None:
            memory = pub.memory = self.settled.memory_of(pub.stream)
        record.memory = memory
        return record

    def _name_delivery(
        self, pub: PublisherLink, topic: Topic, ev: MessageReceived, now: float, out: list[Command]
    ) -> tuple[bytes, int, int] | None:
        """(outgoing tag, reuse count, resent: 0, 1 or PREDATES) of a transfer: a new delivery, a resend
        of one the publisher reported unsettled when it resumed (answered here when
        this router knows its end), or a reuse of a settled tag. None: answered."""
        ptag = ev.tag
        if len(ptag) <= tags.MAX_INLINE_TAG:  # tags.outgoing_tag() inlined for short tags
            tag = pub.stream + _TAG_SIZE[len(ptag)] + ptag
        else:
            try:
                tag = tags.outgoing_tag(pub.stream, ptag)
            except ProtocolError as err:
                self._refuse(ev.delivery, err.condition, err.description, out)
                return None
        reuse = 0
        resent = 0
        existing = self.records.get(tag)
        resending = pub.resending
        alo = topic.guarantee.mode == AT_LEAST_ONCE
        if resending is not None and ptag in resending:
            resending.discard(ptag)
            resent = 1  # a resend of a delivery it reported unsettled: never a reuse
            # (At-least-once keeps no settled memory to consult, docs/guarantees.md: a
            # resend this router no longer holds is delivered again.)
            if existing is None and not alo:
                settled = self.settled
                verdict = settled.resend_verdict(tag, pub.incarnation)
                final = settled.outcome_of(tag) if verdict == KNOWN else None
                if final is not None:
                    self._answer_finished_resend(tag, final, ev, out)
                    self._refill_credit(topic, out)
                    return None
                if verdict == BEYOND_HORIZON:
                    self._refuse_beyond_horizon(tag, ev.delivery, out)
                    self._refill_credit(topic, out)
                    return None
                if self._predates_what_its_old_origin_sent_here(pub, resending):
                    return tag, reuse, PREDATES
        elif existing is None and not alo:
            # ``tag in self.settled``, inlined: once per message
            memory = pub.memory
            if memory is None:
                memory = pub.memory = self.settled.memory_of(pub.stream)
            if tag in memory.current or tag in memory.previous:
                # Reused after the old delivery was settled and forgotten here: other
                # routers may still remember the old one, so the copy says which use it is.
                reuse = self.settled.reuse_of(tag) + 1
        if existing is not None:
            existing_reuse = self._existing_delivery(existing, pub, topic, ev, resent, now, out)
            if existing_reuse is None:
                return None
            reuse = existing_reuse
        return tag, reuse, resent

    def _predates_what_its_old_origin_sent_here(self, pub: PublisherLink, resending: set[bytes]) -> bool:
        """A resumed publisher resends, in its order, what it reported unsettled; this
        resend names a delivery we never saw. Another router, its origin before, sent us
        a delivery of the stream that the publisher has yet to resend (a later one):
        that router sent us nothing of the stream before that one, so it never sent us
        this one, and our subscribers then were not owed it (docs/inter-router.md, "A
        publisher moving too")."""
        start = self._chain_start.get(pub.stream) if self._chain_start else None
        if start is None or start[1] == self.settings.router_id:
            return False
        stream = pub.stream
        for ptag in resending:
            record = self.records.get(tags.outgoing_tag(stream, ptag))
            # (Held, its resend still to come: another router sent it us. We may have
            # taken it over as origin already, at the resume.)
            if record is not None and record.stream_seq >= start[0]:
                return True
        return False

    def _existing_delivery(
        self,
        existing: DeliveryRecord,
        pub: PublisherLink,
        topic: Topic,
        ev: MessageReceived,
        resent: int,
        now: float,
        out: list[Command],
    ) -> int | None:
        """The transfer's tag names a record we hold: a resend (matched to it), a
        reuse of a settled tag (the reuse count of the new delivery), or an error.
        None: answered."""
        if existing.pub_tag != ev.tag:
            out.append(Log("tag-collision", {"delivery": existing.delivery_id, "link": ev.link_id}))
            self._refuse(ev.delivery, "amqp:internal-error", "delivery-tag hash collision; resend it", out)
            return None
        # No live publisher delivery (its link went: a resumed publisher resends it),
        # or settled on its behalf while it was away: a resend, never a new delivery.
        if (
            existing.pub_delivery is None
            and (resent or not existing.pub_settled or existing.pub_link != ev.link_id)
            and self.resumption.resent_by_publisher(existing, pub, ev, now, out)
        ):
            self._refill_credit(topic, out)
            return None
        if not existing.pub_settled:
            self._refuse(ev.delivery, "amqp:invalid-field", "delivery-tag reused while the earlier delivery is unsettled", out)
            return None
        # The publisher reused a settled tag: the old record has done its job.
        self._delete(existing, "tag-reused", out)
        return existing.reuse + 1

    def _origin_template(self, pub: PublisherLink) -> OriginTemplate:
        """The origin annotation of the publisher's messages, encoded once per link."""
        template = pub.origin
        if template is None:
            template = pub.origin = OriginTemplate(pub.container_id, pub.name, pub.incarnation, self.settings.router_id)
        return template

    def _prepare_payload(
        self, pub: PublisherLink, ev: MessageReceived, now: float, out: list[Command]
    ) -> tuple[bytes, float | None] | None:
        """(the message with the origin annotation spliced in, when it expires) or
        None: refused (malformed, forged annotation, expired)."""
        template = pub.origin  # self._origin_template(pub), inlined: once per message
        if template is None:
            template = self._origin_template(pub)
        try:
            prepared = splice_origin(ev.payload, template, ev.tag)
        except MessageError as err:
            self._refuse(ev.delivery, err.condition, str(err), out)
            return None
        if prepared is None:
            # Only routers set the origin annotation: a client's would be a forgery.
            self._refuse(
                ev.delivery, "amqp:unauthorized-access", "message already carries an x-opt-eorouter-origin annotation", out
            )
            return None
        payload, ttl_ms, absolute_expiry_ms = prepared
        expires_at = None
        if ttl_ms is not None:
            expires_at = now + ttl_ms / 1000.0
        if absolute_expiry_ms:
            absolute = absolute_expiry_ms / 1000.0
            expires_at = absolute if expires_at is None else min(expires_at, absolute)
        if expires_at is not None and expires_at <= now:
            self._refuse(ev.delivery, outcomes.EXPIRED, "message expired before it could be delivered", out)
            return None
        return payload, expires_at

    def _fan_out(
        self,
        record: DeliveryRecord,
        payload: bytes,
        pub: PublisherLink,
        topic: Topic,
        ev: MessageReceived,
        size: int,
        now: float,
        out: list[Command],
        predates: bool = False,
    ) -> None:
        """A new delivery: owed to the topic's subscribers here (sent to those who can
        take it) and to every interested router, logged, and kept. ``payload``: the
        record's message (the caller's reference: the record's field is optional).
        ``predates``: a resend older than what its old origin sent here: owed only to
        subscribers that moved here from elsewhere or wait for it (a placeholder)."""
        owed, sent_to, best_effort = self._distribute(record, topic, out, self._moved_in(record, topic) if predates else None)
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
        received = _new(
            Received,
            (
                record.delivery_id,
                topic.name,
                pub.container_id,
                pub.name,
                ev.tag,
                pub.incarnation,
                record.stream_seq,
                size,
                owed,
                sent_to,
                routers,
            ),
        )
        if record.filtered or record.alo:  # (only where selectors filter or a rule relaxes it)
            fields = received.fields
            if record.filtered:
                fields["filtered"] = record.filtered
            if record.alo:
                fields["guarantee"] = AT_LEAST_ONCE
            out.append(_new(Log, ("received", fields)))
        else:  # the usual line: a tuple, no dict
            out.append(received)
        tag = record.tag
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
        if self.lost:
            self.resumption.owe_lost_subscribers(record, out)
        for sub in topic.subscriptions.values():  # only resumed subscribers hold placeholders
            if sub.placeholders:
                self.resumption.after_distribute_to_resumed(record, topic, now, out)
                break
        if not owed and not routers and not record.moved:
            if record.filtered:  # delivered to every subscriber that wanted it: none did
                self._answer_publisher(record, OUTCOME_ACCEPTED, now, out)
            else:
                self._answer_publisher(record, Outcome(self.settings.no_subscribers, description="no subscribers"), now, out)
        elif record.expires_at is not None:
            self._add_timer(record.expires_at, _TIMER_EXPIRY, record)
        if best_effort:
            self._best_effort_copies(topic, tag, payload, out)
        if pub.credit * 2 < self.settings.publisher_credit_window:
            self._refill_credit(topic, out, bound_only=True)

    def _refuse_beyond_horizon(self, tag: bytes, delivery: int, out: list[Command]) -> None:
        """A resumed publisher resent a delivery of a stream this router finished
        with and forgot (docs/resumption.md): it may have been delivered, so it is
        refused (rejected, a condition of its own), never taken as new."""
        description = (
            "resent after the router forgot its stream (resume horizon or memory limit): it may have been delivered already"
        )
        out.append(SendOutcome(delivery, outcomes.REJECTED, True, BEYOND_HORIZON_CONDITION, description))
        out.append(Log("resend-beyond-horizon", {"delivery": tag.hex(), "stream": tag[: tags.STREAM_ID_SIZE].hex()}))
        out.append(
            Log(
                "pub-outcome",
                {"delivery": tag.hex(), "outcome": "rejected", "condition": BEYOND_HORIZON_CONDITION, "reason": description},
            )
        )

    def _answer_finished_resend(self, tag: bytes, final: int, ev: MessageReceived, out: list[Command]) -> None:
        """A failed-over publisher resent a delivery this router took part in and saw
        finished (settled by its origin, now forgotten): the subscribers have it;
        the publisher gets the outcome it was finished with, and nobody a copy."""
        out.append(SendOutcome(ev.delivery, final, True))
        out.append(
            Log(
                "pub-outcome",
                {
                    "delivery": tag.hex(),
                    "outcome": outcomes.NAMES.get(final, str(final)),
                    "condition": None,
                    "reason": "resent after it was finished and settled; outcome remembered",
                },
            )
        )

    def _moved_in(self, record: DeliveryRecord, topic: Topic) -> Roster:
        """The topic's owed subscriptions that moved here from another router (held
        there, as far as we know) or wait for ``record`` (a placeholder)."""
        stream = record.tag[: tags.STREAM_ID_SIZE]
        return Roster(
            sub
            for sub in topic.subscriptions.values()
            if not sub.best_effort and (self._moved_here(sub.key) or record.tag in sub.placeholders.get(stream, ()))
        )

    def _distribute(
        self, record: DeliveryRecord, topic: Topic, out: list[Command], only: Roster | None = None
    ) -> tuple[list[str], list[str], bool]:
        """Owe ``record`` to the topic's subscriptions (``only``'s, when given) and send it
        to those that can take it now; the others get it from their queue, or on
        re-attach. The record is compact (records.py): it shares the topic's roster and
        holds one answer byte per subscriber. Returns (keys owed, keys sent to, whether
        best-effort subscribers exist); the lists are shared: never change them."""
        roster = topic.roster
        if roster is None:
            roster = topic.roster = Roster(sub for sub in topic.subscriptions.values() if not sub.best_effort)
        best_effort = len(roster.subs) != len(topic.subscriptions)
        if only is not None:
            roster = only
        if roster.selective:
            # One selector here (the usual) that selects it: its test, inlined; anything
            # else (several selectors, or it does not select it) is selected_roster's.
            values_test = roster.values_test
            if values_test is None or not values_test(application_values(record.payload or b"", roster.names)):
                roster = selected_roster(record, roster)
        subs = roster.subs
        if not subs:
            # Owed to nobody here (a router that only relays or originates it, only
            # best-effort subscribers, or none whose selector selects it): an empty
            # map from the start costs less than a compact record that would be
            # expanded at its first look.
            record.owe_no_subscriber()
            return roster.keys, roster.keys, best_effort
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
        if not unsent:
            return keys, keys, best_effort
        return keys, [key for key, answer in zip(keys, answers) if not answer], best_effort

    def _refuse(self, delivery: int, condition: str, description: str, out: list[Command]) -> None:
        """Answer a publisher delivery the router will not carry."""
        out.append(SendOutcome(delivery, outcomes.REJECTED, True, condition, description))
        out.append(Log("pub-outcome", {"delivery": None, "outcome": "rejected", "condition": condition, "reason": description}))

    def _on_too_large(self, ev: MessageTooLarge, now: float, out: list[Command]) -> None:
        pub = self.publishers.get(ev.link_id)
        if pub is not None and pub.credit > 0:
            pub.credit -= 1
            self.topics[pub.topic].outstanding_credit -= 1
            self._promised -= self.topics[pub.topic].est
        description = (
            f"message of {ev.size}+ bytes exceeds this publisher's limit of {ev.limit} bytes (its user's, in the policy)"
            if ev.limit
            else f"message of {ev.size}+ bytes exceeds the router's limit of {self.settings.max_message_size}"
        )
        if ev.settled:
            out.append(Log("dropped", {"delivery": None, "reason": description}))
        else:
            self._refuse(ev.delivery, "amqp:link:message-size-exceeded", description, out)
        if pub is not None:
            self._refill_credit(self.topics[pub.topic], out)

    def _send(
        self, sub: Subscription, link_id: int, record: DeliveryRecord, payload: bytes, state: SubscriberState, out: list[Command]
    ) -> None:
        """Send ``record`` (its ``payload``) on ``link_id``, the link ``sub`` is attached on."""
        state.sent = self._copy_out(sub, link_id, record, payload, out)
        state.link = link_id
        state.remote_settled = False  # a new copy (a resend after a resume): not settled by it yet

    def _copy_out(self, sub: Subscription, link_id: int, record: DeliveryRecord, payload: bytes, out: list[Command]) -> int:
        """A copy of ``record`` to ``sub`` on ``link_id`` after its distribution, on its
        credit, with its "forwarded" line; returns its send count."""
        sub.credit -= 1
        self._send_counter += 1
        out.append(Forward(link_id, record.tag, payload, False))
        out.append(Log("forwarded", {"delivery": record.delivery_id, "subscriber": sub.key, "link": link_id, "settled": False}))
        return self._send_counter

    def _pump(self, sub: Subscription, now: float, out: list[Command]) -> None:
        """Send queued records while the subscriber has credit."""
        if not sub.ready:
            return
        queue = sub.queue
        key = sub.key
        # Used only while it has credit, which only an attached link gets: not None then.
        # (Not checked: detached, with no credit, this sends nothing and must stay a no-op.)
        link_id: int = sub.link_id  # type: ignore[assignment]
        while queue and sub.credit > 0:
            record = queue.popleft()
            if record.answers is not None and self._send_compact(sub, link_id, record, out):
                continue
            state = record.subscribers.get(key)
            if state is None or state.sent or record.payload is None:
                continue
            if state.outcome is not None and not state.resend:
                continue
            if sub.placeholders and self.resumption.placeholder_blocks(sub, record):
                hold_in_order(sub.held.setdefault(record.tag[: tags.STREAM_ID_SIZE], []), record)
                continue
            self._send(sub, link_id, record, record.payload, state, out)
            if record.pub_settled:  # a resumed subscriber's re-send, settled meanwhile
                out.append(SettleOutgoing(link_id, record.tag))
                state.settle_relayed = True
                sub.awaiting_evidence.append((self._send_counter, record))
        if sub.drain and not queue and sub.credit > 0:
            sub.credit = 0
            sub.drain = False
            out.append(Drained(link_id))

    def _send_compact(self, sub: Subscription, link_id: int, record: DeliveryRecord, out: list[Command]) -> bool:
        """_pump's send of a queued copy that leaves a compact record compact (records.py),
        for its usual case: not sent yet, not answered, the subscription's link the one
        the record's roster names, its publisher not settled, no placeholder here. Its
        answer byte then says "in doubt, sent at ``sent_at``", though this copy goes out
        at a later count: that count is only ever compared with the counts of the
        settlements relayed to the subscriber (the evidence rule, settlement.py), and
        when none of those lies between the two the comparisons come out the same. Any
        other case: False, for the general path (which expands the record). Expanding
        every queued record gave each copy's answer the slow path: a subscriber whose
        credit ran out made exactly-once ~3.6x best-effort's work per message at K=16."""
        roster = record.roster
        i = roster.index.get(sub.key)  # type: ignore[union-attr]  # compact: its roster is set
        if i is None or record.payload is None or record.pub_settled or sub.placeholders:
            return False
        answers: bytearray = record.answers  # type: ignore[assignment]
        if answers[i] != ANSWER_UNSENT or roster.links[i] != link_id:  # type: ignore[union-attr]
            return False
        evidence = sub.awaiting_evidence
        if evidence and evidence[-1][0] >= record.sent_at:
            return False
        answers[i] = 0
        self._copy_out(sub, link_id, record, record.payload, out)
        return True

    def _on_credit(self, ev: CreditChanged, now: float, out: list[Command]) -> None:
        sub = self.subscribers.get(ev.link_id)
        if sub is None:
            return
        sub.credit = ev.credit
        sub.drain = ev.drain
        self._pump(sub, now, out)
