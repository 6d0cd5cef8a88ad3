"""Answers between routers about a relayed delivery: each router's outcome to the delivery's
origin, the origin's settlement back to the routers it sent copies to, and the
acknowledgements and questions ("settled?") that keep either end from waiting for ever.

A mixin of ``RouterCore`` (router/core/router.py): its methods share the core's state,
documented there, and are split out only to keep one concern per module."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from router.core import outcomes
from router.core.commands import (
    Command,
    Log,
)
from router.core.constants import (
    ACCEPTED,
)
from router.core.errors import ProtocolError
from router.core.outcomes import OUTCOME_ACCEPTED, OUTCOME_NOT_OWED, Outcome
from router.core.records import (
    DeliveryRecord,
)

if TYPE_CHECKING:
    from router.core.corestate import CoreState
else:
    CoreState = object  # declarations for mypy only: no base class at run time


class RemoteOutcomesMixin(CoreState):
    def _answer_origin(self, record: DeliveryRecord, outcome: Outcome, origin: str, out: list[Command]) -> None:
        """Tell ``origin`` (the record's origin router) its ``outcome`` here."""
        # With no subscriber left here that was owed it, we are not owed it either. A
        # subscriber that moved away still counts: the router it moved to answered us
        # for it (a targeted copy) and leaves it out of its own answer; and we keep a
        # record that only the origin's settlement ends. (One another router addressed
        # here and that moved on again answers that router individually: not ours to
        # count; counted, the placeholder outcome of a record made for such copies went
        # out as our answer, "released", found by the generated histories.)
        targeted = record.targeted
        if (
            record.filtered
            or any(k not in targeted for k in record.subscribers)
            or (record.moved and any(k not in targeted for k in record.moved))
        ):
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
        if "left" in message:  # "none", with the moved subscribers it left out ("left")
            self.resumption.on_left({"d": message["d"], "keys": message["left"], "from": sender}, now, out)
        state = record.remote_routers.get(sender)
        if state is None:
            # A router we do not wait for answered: it holds a record of it all the same
            # (an old origin its publisher left for us, answering for subscribers it has
            # not noticed leave, who are here now), and only our settlement ends that
            # record. Its answer takes no part in the outcome; it is told the end.
            if isinstance(sender, str):
                if record.pub_settled:
                    self._route_control(sender, self._settle_message(record.tag, self._final_outcome(record), True), out)
                else:
                    _watch(record, sender)
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
        if record is not None and (
            record.origin_router == sender
            # (A router that addressed a copy to a subscriber here settles it with us; not
            # when we are the origin: our publisher is here, and taken for ours, that
            # settlement, come while the publisher's outcomes waited for the routers'
            # numbering answers, settled the delivery with none: found by the
            # generated histories.)
            or (
                record.origin_router is not None
                and (
                    sender in record.targeted.values()
                    or any(sender in routers for routers in (getattr(record, "also_targeted", None) or {}).values())
                )
            )
        ):
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
        if message.get("done") and (record is None or record.pub_settled):
            # The answer to our "settled?": a placeholder for it waits for nothing. (Also
            # when we hold it: it came before a subscriber that moved here, which waits
            # for a copy addressed to it, and that copy came or never will.)
            self.resumption.placeholder_settled(tag, now, out)

        self._route_control(sender, {"t": "settle-ack", "d": message["d"]}, out)

    def _on_settled_query(self, message: dict[str, Any], out: list[Command]) -> None:
        """Another router holds a placeholder for a delivery it never saw: if we know
        it settled (a record settled, or its tag remembered, or its publisher resumed
        here without it and stayed: resumption.settled_before_resume), say so."""
        tag = bytes.fromhex(message["d"])
        record = self.records.get(tag)
        if (record is not None and record.pub_settled) or (record is None and tag in self.settled):
            code = self._final_outcome(record) if record is not None else self.settled.outcome_of(tag)
            self._route_control(message["from"], self._settle_message(tag, code, True), out)
        elif record is None and self.resumption.settled_before_resume(tag):
            self._route_control(message["from"], self._settle_message(tag, None, True), out)
        elif record is not None and isinstance(message.get("from"), str):
            # Not settled yet: told when it is (_settle_record), or the asker's
            # placeholder would hold its stream back until it times out, should the
            # delivery never come there (nobody there was owed it after all).
            _watch(record, message["from"])

    def _on_settle_ack(self, message: dict[str, Any], now: float, out: list[Command]) -> None:
        record = self.records.get(bytes.fromhex(message["d"]))
        if record is None or message.get("from") not in record.settle_pending:
            return
        record.settle_pending.discard(message.get("from"))  # a set: the sender is in it
        self._maybe_delete(record, now, out)


def _watch(record: DeliveryRecord, router_id: str) -> None:
    """``router_id`` is sent the settlement of ``record`` when it comes (_settle_record)."""
    if record.watchers is None:
        record.watchers = set()
    record.watchers.add(router_id)
