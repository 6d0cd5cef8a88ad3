"""Subscribers' outcomes, the publisher's outcome, settlement, and the end of a record.

A mixin of ``RouterCore`` (router/core/router.py): its methods share the core's state,
documented there, and are split out only to keep one concern per module."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from router.core import outcomes
from router.core.commands import (
    Command,
    Completed,
    Log,
    SendOutcome,
    SettleOutgoing,
    SubOutcome,
)
from router.core.constants import (
    _NAMES,
    _RELEASED,
    _TERMINAL,
    _TIMER_LINGER,
    ACCEPTED,
    GONE,
    _new,
)
from router.core.events import (
    OutcomeReceived,
    PublisherSettled,
)
from router.core.links import Subscription, Topic
from router.core.outcomes import OUTCOME_ACCEPTED, OUTCOME_NOT_OWED, Outcome
from router.core.records import (
    ANSWER_ACCEPTED,
    ANSWER_DONE,
    DeliveryRecord,
    SubscriberState,
)

if TYPE_CHECKING:
    from collections.abc import Iterator

    from router.core.corestate import CoreState
else:
    CoreState = object  # declarations for mypy only: no base class at run time


class SettlementMixin(CoreState):
    def _on_outcome(self, ev: OutcomeReceived, now: float, out: list[Command]) -> None:
        sub = self.subscribers.get(ev.link_id)
        if sub is None:
            return
        record = self.records.get(ev.tag)
        if record is None:
            return  # pre-settled copy, or a record already retired
        key = sub.key
        code = ev.outcome
        settled = ev.settled
        if code == ACCEPTED and record.roster is not None:  # compact: roster and answers are set together
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
            state.outcome = Outcome(code, ev.condition, ev.description, ev.delivery_failed, ev.undeliverable_here)
            if record.waiting > 0:
                record.waiting -= 1
            out.append(
                _new(
                    Log,
                    (
                        "sub-outcome",
                        {"delivery": record.delivery_id, "subscriber": key, "outcome": _NAMES[code], "settled": settled},
                    ),
                )
            )
        self._answered(sub, record, state, settled, now, out)
        self._after_subscriber_outcome(record, key, now, out)

    def _answered(
        self, sub: Subscription, record: DeliveryRecord, state: SubscriberState, settled: bool, now: float, out: list[Command]
    ) -> None:
        """What any answer of a subscriber tells besides its outcome: it answered a
        delivery sent at counter ``state.sent``, so it has seen every settlement we
        relayed before that (evidence); and whether it settled its copy."""
        sent = state.sent
        if sent and sub.awaiting_evidence and sub.awaiting_evidence[0][0] < sent:
            self._evidence(sub, sent, now, out)
        if settled:
            state.remote_settled = True
            if record.pub_settled:
                state.known_settled = True

    def _on_accepted_compact(
        self, sub: Subscription, record: DeliveryRecord, i: int, settled: bool, now: float, out: list[Command]
    ) -> None:
        """_on_accepted on a compact record, for the answer at ``i`` of its roster:
        the usual case (the copy's first answer, local subscribers only, its publisher
        attached, no settlement evidence due, the count kept) on its answer byte;
        anything else on its SubscriberStates, which the record becomes for good."""
        # Not narrowed by a check or a cast: the callers saw it compact, and this is per copy.
        answers: bytearray = record.answers  # type: ignore[assignment]
        waiting = record.waiting
        if (
            answers[i]
            or waiting < 1
            or record.targeted
            or record.outcome is not None
            or record.remote_routers
            or record.moved
            or record.origin_router is not None
            or record.pub_delivery is None
            or (sub.awaiting_evidence and sub.awaiting_evidence[0][0] < record.sent_at)
        ):
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
        logged = len(out)
        out.append(None)  # type: ignore[arg-type]  # its "completed" line's place, filled below
        self._complete(sub, record, settled, logged, now, out)

    def _complete(
        self, sub: Subscription, record: DeliveryRecord, settled: bool, logged: int, now: float, out: list[Command]
    ) -> None:
        """``sub``'s accepted answer completed ``record``: the publisher is told, and its
        line at ``out[logged]`` is one "completed" line that also stands for the
        pub-outcome and, when the router settles now, the settled line
        (docs/event-log.md, "completed")."""
        fold: dict[str, Any] = {}  # the settlement's by and deleted, when it happens now
        try:
            self._outcome_to_publisher(record, OUTCOME_ACCEPTED, now, out, fold)
        finally:  # (on an exception too: the caller executes what ``out`` holds)
            out[logged] = _new(Completed, (record.delivery_id, sub.key, settled, fold.get("by"), fold.get("deleted", False)))

    def _on_accepted(
        self, sub: Subscription, record: DeliveryRecord, state: SubscriberState, settled: bool, now: float, out: list[Command]
    ) -> None:
        """_on_outcome for an accepted outcome on an expanded record (records.py): per
        copy for a relayed copy, one sent from a queue the compact record could not stand
        for (admission.py's _send_compact), or one of a
        record failover, expiry or a detach expanded."""
        logged = -1  # where this outcome's line goes in ``out`` (-1: none, it said so before)
        if state.outcome is None:
            state.outcome = OUTCOME_ACCEPTED
            waiting = record.waiting
            if waiting > 0:
                record.waiting = waiting - 1
            # Its line's place, filled below: a "sub-outcome" (SubOutcome), or the
            # "completed" line when this outcome completes the delivery.
            logged = len(out)
            out.append(None)  # type: ignore[arg-type]  # a placeholder, replaced on every path below
        self._answered(sub, record, state, settled, now, out)
        if (
            not record.targeted
            and record.outcome is None
            and not record.remote_routers
            and not record.moved
            and record.origin_router is None
            and record.pub_delivery is not None
        ):
            # _after_subscriber_outcome, _maybe_answer_publisher and _answer_publisher,
            # inlined for the usual case: local subscribers only, its publisher attached.
            if record.waiting > 0:  # still waiting for someone (the count says so: no scan per copy)
                if logged >= 0:
                    out[logged] = _new(SubOutcome, (record.delivery_id, sub.key, "accepted", settled))
                return
            # Perhaps the last answer: a step of its own, taken once per delivery.
            if self._last_local_answer(sub, record, settled, logged, now, out):
                return
        if logged >= 0:
            out[logged] = _new(SubOutcome, (record.delivery_id, sub.key, "accepted", settled))
        self._after_subscriber_outcome(record, sub.key, now, out)

    def _last_local_answer(
        self, sub: Subscription, record: DeliveryRecord, settled: bool, logged: int, now: float, out: list[Command]
    ) -> bool:
        """_on_accepted when nobody is counted as still to answer a record owed to local
        subscribers only (or it is not counted): if every one accepted, the delivery
        is complete and the publisher is told. False: not all accepted, for the
        general rule (_maybe_answer_publisher) to judge; True: done here."""
        states = record.subscribers.values()
        if record.waiting < 0:  # not counted (failover, expiry, a detach): look
            for other in states:
                if other.outcome is None:
                    if logged >= 0:
                        out[logged] = _new(SubOutcome, (record.delivery_id, sub.key, "accepted", settled))
                    return True
        for other in states:
            if other.outcome is not OUTCOME_ACCEPTED:
                return False  # not all accepted: the general rule (_maybe_answer_publisher)
        record.outcome = OUTCOME_ACCEPTED
        if logged < 0:
            out.append(
                _new(
                    Log,
                    (
                        "pub-outcome",
                        {"delivery": record.delivery_id, "outcome": "accepted", "condition": None, "reason": None},
                    ),
                )
            )
            self._outcome_to_publisher(record, OUTCOME_ACCEPTED, now, out)
            return True
        self._complete(sub, record, settled, logged, now, out)
        return True

    def _after_subscriber_outcome(self, record: DeliveryRecord, key: str, now: float, out: list[Command]) -> None:
        if record.targeted and key in record.targeted and record.subscribers[key].outcome is not None and not record.pub_settled:
            self.resumption.report_targeted(record, key, out)
        if record.outcome is None:
            self._maybe_answer_publisher(record, now, out)
        elif record.pub_settled:
            self._maybe_delete(record, now, out)
        elif record.alo and record.origin_router is not None:
            self._finish_at_least_once(record, now, out)

    def _finish_at_least_once(self, record: DeliveryRecord, now: float, out: list[Command]) -> None:
        """An at-least-once record another router sent here is done once every subscriber
        here answered and the origin was told: this router settles it itself and forgets
        it, with no settlement from the origin to wait for (docs/guarantees.md). Should
        the origin die before its publisher hears, the resend is delivered again."""
        if record.pub_settled or record.outcome is None:
            return
        for state in record.subscribers.values():
            if state.outcome is None:
                return
        self._settle_record(record, "answered", now, out)

    def _evidence(self, sub: Subscription, sent_at: int, now: float, out: list[Command]) -> None:
        pending = sub.awaiting_evidence
        key = sub.key
        while pending and pending[0][0] < sent_at:
            _, record = pending.popleft()
            state = record.subscribers.get(key)
            if state is not None and not state.known_settled:
                state.known_settled = True
                self._maybe_delete(record, now, out)

    def _maybe_answer_publisher(self, record: DeliveryRecord, now: float, out: list[Command]) -> None:
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
        answers = []
        for outcome in self._owed_answers(record):
            if outcome is None:
                return  # someone has yet to answer
            answers.append(outcome)
        if not answers and record.filtered:
            outcome = OUTCOME_ACCEPTED  # every subscriber that wanted it has it: none did
        elif not answers:
            outcome = Outcome(self.settings.no_subscribers, description="no subscribers left")
        elif all(a is OUTCOME_ACCEPTED for a in answers):
            outcome = OUTCOME_ACCEPTED
        else:
            outcome = outcomes.aggregate(answers)
        self._answer_publisher(record, outcome, now, out)

    @staticmethod
    def _owed_answers(record: DeliveryRecord) -> Iterator[Outcome | None]:
        """The answer (None: not yet) of every party the delivery is owed to: its
        subscribers here (but those another router addressed a copy to: they answer
        that router individually), the interested routers (but those owed nothing),
        and subscribers that moved away from a dead router.

        An origin counts every local subscriber, targeted or not: a copy addressed to
        one here by a router that acted as origin before us (its publisher resumed
        here, and the copy left that router before the news reached it) came after
        our takeover, and that router, handing the delivery over, waits for nobody
        (skipping its subscriber, we told the publisher "released" for what it
        accepted: tests/unit/test_failover_histories.py, a publisher after a
        subscriber leaving a live router). A relayed copy's subscriber the origin
        addressed a copy to answers that router individually, and is not ours."""
        targeted = record.targeted if record.origin_router is not None else None
        for key, state in record.subscribers.items():
            if not (targeted and key in targeted):
                yield state.outcome
        for router_state in record.remote_routers.values():
            if router_state.outcome is not OUTCOME_NOT_OWED:
                yield router_state.outcome
        for moved in record.moved.values():
            yield moved.outcome

    def _answer_publisher(self, record: DeliveryRecord, outcome: Outcome, now: float, out: list[Command]) -> None:
        if self.answers_held and record.origin_router is None and record.pub_link in self.answers_held:
            return  # until every router said what it holds (resumption.stream_seq_known)
        record.outcome = outcome
        if record.origin_router is not None:
            self._answer_origin(record, outcome, record.origin_router, out)
            if record.alo:
                self._finish_at_least_once(record, now, out)
            return
        out.append(
            _new(
                Log,
                (
                    "pub-outcome",
                    {
                        "delivery": record.delivery_id,
                        "outcome": _NAMES[outcome.code],
                        "condition": outcome.condition,
                        "reason": outcome.description,
                    },
                ),
            )
        )
        if record.pub_delivery is None:
            if record.pub_link == GONE:
                self._settle_record(record, "publisher-gone", now, out)
            return  # it hears the outcome when it resumes and resends
        self._outcome_to_publisher(record, outcome, now, out)

    def _outcome_to_publisher(
        self, record: DeliveryRecord, outcome: Outcome, now: float, out: list[Command], fold: dict[str, Any] | None = None
    ) -> None:
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

    def _send_publisher_outcome(self, record: DeliveryRecord, outcome: Outcome, out: list[Command], settle: bool = False) -> None:
        delivery = record.pub_delivery
        assert delivery is not None  # answered only while its publisher's delivery is here
        if outcome.code == outcomes.REJECTED:
            out.append(SendOutcome(delivery, outcome.code, settle, outcome.condition, outcome.description))
        elif outcome.code == outcomes.MODIFIED:
            out.append(
                SendOutcome(delivery, outcome.code, settle, None, None, outcome.delivery_failed, outcome.undeliverable_here)
            )
        else:
            out.append(_new(SendOutcome, (delivery, outcome.code, settle, None, None, False, False)))

    def _on_publisher_settled(self, ev: PublisherSettled, now: float, out: list[Command]) -> None:
        record = self.by_delivery.pop(ev.delivery, None)
        if record is None:
            return
        record.pub_delivery = None
        self._settle_record(record, "publisher", now, out)

    def _settle_record(
        self, record: DeliveryRecord, by: str, now: float, out: list[Command], fold: dict[str, Any] | None = None
    ) -> None:
        """Settle the record (``by`` whom, for the log). ``fold``: the fields of this
        step's "completed" line: the settlement goes into it (by, deleted) instead of
        a "settled" line of its own."""
        if record.pub_settled:
            return
        record.pub_settled = True
        self._arm_sweep(now)  # the first settlement arms the settled memory's sweeps
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
        roster = record.roster  # compact when set (with answers)
        # (bytearray == bytes compares the bytes; mypy (strict bytes) takes them as unrelated types.)
        if (
            roster is not None
            and record.answers == roster.all_done  # type: ignore[comparison-overlap]
            and not record.remote_routers
            and not record.moved
        ):
            # Compact, and every subscriber settled its copy itself: each knows it is
            # settled, nothing to relay, and the record goes now (below): the usual case.
            everyone_knows = True
        else:
            everyone_knows = self._relay_settlement(record, topic, payload, out)
            if record.alo and record.payload is None:
                # At-least-once: no resuming receiver is matched against a settled record
                # (docs/guarantees.md), so none lingers; only a re-send still due keeps it.
                everyone_knows = True
        if topic.bytes and payload is not None and record.payload is None:
            self._release_bytes(topic, payload)
        watchers = record.watchers
        if watchers:
            # Routers that asked whether it was settled ("settled?") while it was not, or
            # answered it though we did not wait for them.
            message = self._settle_message(record.tag, self._final_outcome(record), True)
            for router_id in sorted(watchers):
                self._route_control(router_id, dict(message), out)
        if everyone_knows:
            # self._delete(record, None, out), inlined (settled, so no unsettled count to fix)
            tag = record.tag
            records = self.records
            if records.get(tag) is record:
                del records[tag]
                del topic.records[record.order]
                settled = self.settled
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
                elif not record.alo:
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

    def _relay_settlement(self, record: DeliveryRecord, topic: Topic, payload: bytes | None, out: list[Command]) -> bool:
        """Tell the settlement to every subscriber here that holds the copy unsettled,
        and to every router that took part; True when every receiver knows already."""
        everyone_knows = True
        subscriptions = topic.subscriptions
        for key, state in record.subscribers.items():
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
        if record.remote_routers or record.moved:  # else settle_pending stays the empty set
            alo = record.alo  # at-least-once: a router that answered has settled its copy already
            targets = {r for r, state in record.remote_routers.items() if not alo or state.outcome is None}
            for moved in record.moved.values():
                if moved.router is not None and moved.router != self.settings.router_id and not (alo and moved.outcome):
                    targets.add(moved.router)
            for router_id in sorted(targets):
                everyone_knows = False
                self._route_control(router_id, self._settle_message(record.tag, self._final_outcome(record)), out)
                out.append(Log("settlement-relayed", {"delivery": record.delivery_id, "to_router": router_id}))
            record.settle_pending = targets
        return everyone_knows

    def _maybe_delete(self, record: DeliveryRecord, now: float, out: list[Command]) -> None:
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
    def _settle_message(tag: bytes, outcome: int | None, done: bool = False) -> dict[str, Any]:
        """docs/inter-router.md, ``settle``: "o" the final outcome when known; "done"
        when the delivery was settled and forgotten here (an answer, not a relay)."""
        message: dict[str, Any] = {"t": "settle", "d": tag.hex()}
        if outcome is not None:
            message["o"] = outcome
        if done:
            message["done"] = True
        return message

    def _delete(self, record: DeliveryRecord, reason: str | None, out: list[Command]) -> None:
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
        if record.pub_settled and not record.alo:
            self.settled.add(record.tag, self._final_outcome(record), record.reuse)
        if reason is not None:
            out.append(Log("record-deleted", {"delivery": record.delivery_id, "reason": reason}))
        if not topic.records:
            self._drop_topic_if_idle(topic)

    def _expire_message(self, record: DeliveryRecord, now: float, out: list[Command]) -> None:
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
