"""Delivery outcomes and the rule that folds many subscribers' outcomes into one.

Codes are AMQP's descriptor codes (the same numbers proton uses for PN_ACCEPTED
etc.), so the adapter passes them through untranslated.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import NamedTuple

NONE = 0  # no terminal outcome yet (in doubt)
RECEIVED = 0x23
ACCEPTED = 0x24
REJECTED = 0x25
RELEASED = 0x26
MODIFIED = 0x27

TERMINAL = frozenset({ACCEPTED, REJECTED, RELEASED, MODIFIED})
NAMES = {
    NONE: "none",
    RECEIVED: "received",
    ACCEPTED: "accepted",
    REJECTED: "rejected",
    RELEASED: "released",
    MODIFIED: "modified",
}
BY_NAME = {v: k for k, v in NAMES.items()}

# Router-originated error conditions (documented in docs/delivery-rule.md).
EXPIRED = "eorouter:ttl-expired"
SUBSCRIPTION_EXPIRED = "eorouter:subscription-expired"
SHUTTING_DOWN = "eorouter:shutting-down"


class Outcome(NamedTuple):
    """A terminal outcome with the detail AMQP lets it carry."""

    code: int
    condition: str | None = None
    description: str | None = None
    delivery_failed: bool = False
    undeliverable_here: bool = False


OUTCOME_ACCEPTED = Outcome(ACCEPTED)
OUTCOME_RELEASED = Outcome(RELEASED)
# What a router owed nothing answers for a copy it was sent ("none" on the wire):
# it takes no part in the outcome, but holds a record until the settlement.
OUTCOME_NOT_OWED = Outcome(NONE)

# Which outcome wins when subscribers disagree: the publisher hears the most
# severe one. Rejected means "this message is bad for someone, do not resend it
# blindly"; modified carries delivery-failed/undeliverable-here hints; released
# means "not delivered everywhere, safe to resend". Accepted only when *every*
# owed subscriber accepted (qpid-dispatch answers accepted if any one did).
_SEVERITY = {ACCEPTED: 0, RELEASED: 1, MODIFIED: 2, REJECTED: 3}


def aggregate(outcomes: Iterable[Outcome]) -> Outcome:
    """Fold terminal outcomes into the single outcome the publisher receives.

    An empty collection (no subscriber was owed the delivery) is the caller's
    decision (the configurable no-subscriber answer), not ours."""
    worst: Outcome | None = None
    failed = False
    undeliverable = False
    for outcome in outcomes:
        if outcome.code == MODIFIED:
            failed = failed or outcome.delivery_failed
            undeliverable = undeliverable or outcome.undeliverable_here
        if worst is None or _SEVERITY[outcome.code] > _SEVERITY[worst.code]:
            worst = outcome
    if worst is None:
        raise ValueError("aggregate() needs at least one outcome")
    if worst.code == MODIFIED:
        return Outcome(MODIFIED, delivery_failed=failed, undeliverable_here=undeliverable)
    return worst
