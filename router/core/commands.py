"""Commands: what the core tells the adapter to do (imperative, immutable).

The adapter executes them in order, deciding nothing. ``Log`` commands go to the
event log, and the adapter writes the log (one ``write()``) before it lets any
frame produced by the same batch of commands reach a socket.
"""

from __future__ import annotations

from typing import Any, NamedTuple


class OpenLink(NamedTuple):
    """Answer a peer's attach: mirror its terminus, with our terminus timeout and
    our link properties. For a publisher the adapter also sets max-message-size."""

    link_id: int
    timeout: int = 0
    properties: dict[str, Any] | None = None
    # Every delivery on the link goes pre-settled (an at-most-once topic,
    # router/core/guarantees.py): our attach says so (snd-settle-mode settled);
    # otherwise it mirrors the peer's.
    presettled: bool = False
    # A publisher's link says rcv-settle-mode first whatever the config's
    # publisher_rcv_settle_mode (an at-least-once topic: the router settles with the outcome).
    settles_first: bool = False


class DetachLink(NamedTuple):
    """Detach (``close=False``) or close a link with an AMQP error condition; if the
    link was never opened the adapter opens it first, as AMQP requires."""

    link_id: int
    condition: str | None = None
    description: str | None = None
    close: bool = True


class GrantCredit(NamedTuple):
    """Give a publisher link ``credit`` more credit (pn_link_flow)."""

    link_id: int
    credit: int


class Forward(NamedTuple):
    """Send a new delivery to a subscriber link under our disambiguated ``tag``.
    ``settled`` sends it pre-settled (best effort, no outcome expected)."""

    link_id: int
    tag: bytes
    payload: bytes
    settled: bool


class SendOutcome(NamedTuple):
    """Give a publisher delivery its outcome; ``settle`` also settles our side
    (used when the publisher's delivery needs no further tracking)."""

    delivery: int
    outcome: int
    settle: bool = False
    condition: str | None = None
    description: str | None = None
    delivery_failed: bool = False
    undeliverable_here: bool = False


class SettleOutgoing(NamedTuple):
    """Settle the delivery we sent on ``link_id`` under ``tag`` (relays the
    publisher's settlement; a rcv-settle-mode=second subscriber now settles too)."""

    link_id: int
    tag: bytes


class Drained(NamedTuple):
    """The subscriber asked to drain and nothing is left to send: spend its credit."""

    link_id: int


class Log(NamedTuple):
    """Append an event to the router's event log (schema in ``router.eventlog``)."""

    kind: str
    fields: dict[str, Any]


class Received(NamedTuple):
    """``Log("received", {...})`` for a publisher's message the way the usual one is
    admitted: no remote router's answer awaited or one, no selector filtering it out,
    exactly-once. Built without a dict (one tuple), the adapter writes the same line
    (router/adapter/_fastpath.c encodes it from the tuple; ``fields`` is the line's
    fields, in the line's order, for the Python path and for tests and tools).
    ``pub_tag`` is the publisher's delivery tag as bytes (its line has it in hex)."""

    delivery: str
    topic: str
    publisher: str
    link_name: str
    pub_tag: bytes
    incarnation: str
    stream_seq: int
    size: int
    owed: Any
    forwarded: Any
    routers: Any

    @property
    def kind(self) -> str:
        return "received"

    @property
    def fields(self) -> dict[str, Any]:
        """The line's fields, as a Log's."""
        return {
            "delivery": self.delivery,
            "topic": self.topic,
            "publisher": self.publisher,
            "link_name": self.link_name,
            "pub_tag": self.pub_tag.hex(),
            "incarnation": self.incarnation,
            "stream_seq": self.stream_seq,
            "size": self.size,
            "settled": False,
            "owed": self.owed,
            "forwarded": self.forwarded,
            "routers": self.routers,
        }


class Completed(NamedTuple):
    """``Log("completed", {...})``: the last owed subscriber's accepted answer that
    completed a delivery, which the line also stands for the accepted pub-outcome and,
    when the router settled it in the same step, the settlement (``by``, ``deleted``;
    ``by`` None: not settled then, no such fields). Built without a dict, as
    SubOutcome is; ``fields`` is the line's fields in the line's order, for the Python
    path and for tests and tools (docs/event-log.md, "completed")."""

    delivery: str
    subscriber: str
    settled: bool
    by: str | None
    deleted: bool

    @property
    def kind(self) -> str:
        return "completed"

    @property
    def fields(self) -> dict[str, Any]:
        """The line's fields, as a Log's."""
        fields = {
            "delivery": self.delivery,
            "subscriber": self.subscriber,
            "outcome": "accepted",
            "settled": self.settled,
            "pub_outcome": "accepted",
        }
        if self.by is not None:
            fields["by"] = self.by
            fields["deleted"] = self.deleted
        return fields


class SubOutcome(NamedTuple):
    """``Log("sub-outcome", {"delivery", "subscriber", "outcome", "settled"})`` in the
    form the per-copy path builds cheaply (no dict): the adapter writes the same line
    (EventLog.append_sub_outcome). ``delivery`` is a record's delivery id (hex)."""

    delivery: str
    subscriber: str
    outcome: str
    settled: bool

    @property
    def kind(self) -> str:
        return "sub-outcome"

    @property
    def fields(self) -> dict[str, Any]:
        """The line's fields, as a Log's (for tests and tools)."""
        return {"delivery": self.delivery, "subscriber": self.subscriber, "outcome": self.outcome, "settled": self.settled}


class SubOutcomes(NamedTuple):
    """One ``SubOutcome`` per delivery of ``deliveries``, in order, for one subscriber
    and outcome: what a batch of accepted dispositions usually comes to
    (``RouterCore.accepted_batch``). The adapter writes them as one run
    (EventLog.append_sub_outcomes)."""

    deliveries: list[str]
    subscriber: str
    outcome: str
    settled: bool

    @property
    def kind(self) -> str:
        return "sub-outcomes"

    @property
    def fields(self) -> dict[str, Any]:
        """The line's fields, as a Log's (for tests and tools)."""
        return {"deliveries": self.deliveries, "subscriber": self.subscriber, "outcome": self.outcome, "settled": self.settled}

    def each(self) -> list[SubOutcome]:
        """The SubOutcome commands this stands for (for tests and tools)."""
        return [SubOutcome(d, self.subscriber, self.outcome, self.settled) for d in self.deliveries]


class ShutdownComplete(NamedTuple):
    """Every publisher delivery has its outcome; the adapter may close and exit."""


# ---------------------------------------------------------------- router network


class SendControl(NamedTuple):
    """Send one control message (a dict with a type field "t") to the neighbour
    ``router_id``. The adapter batches every control message for one neighbour
    produced in one loop iteration into one transfer, in order."""

    router_id: str
    message: dict[str, Any]


class SendData(NamedTuple):
    """Relay a topic delivery to the neighbour ``router_id`` with a routing header
    (its destination routers, origin, publisher identity; docs/inter-router.md)."""

    router_id: str
    tag: bytes
    header: dict[str, Any]
    payload: bytes


# Every command the core gives, for annotations (``out: list[Command]``).
Command = (
    OpenLink
    | DetachLink
    | GrantCredit
    | Forward
    | SendOutcome
    | SettleOutgoing
    | Drained
    | Log
    | Received
    | Completed
    | SubOutcome
    | SubOutcomes
    | ShutdownComplete
    | SendControl
    | SendData
)
