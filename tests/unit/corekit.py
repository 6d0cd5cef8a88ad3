"""Drive a RouterCore by hand: a test's stand-in for the proton adapter."""

from __future__ import annotations

import copy

from proton import Message

from router.core import outcomes
from router.core.commands import Completed, Log, Received, SubOutcome, SubOutcomes
from router.core.events import (
    DURABLE_NONE,
    PUBLISHER,
    RCV_FIRST,
    RCV_SECOND,
    SND_MIXED,
    SND_SETTLED,
    SUBSCRIBER,
    ConnectionLost,
    CreditChanged,
    LinkAttached,
    LinkDetached,
    MessageReceived,
    OutcomeReceived,
    PublisherSettled,
    ShutdownRequested,
    TimerFired,
)
from router.core.records import SubscriberState
from router.core.router import RouterCore
from router.core.settings import CoreSettings

LOG_KINDS = (Log, Received, Completed, SubOutcome, SubOutcomes)  # what the adapter writes to the event log


def encode(body, **fields) -> bytes:
    return Message(body=body, **fields).encode()


class Harness:
    """Feeds events with a controllable clock; splits the core's answer into the
    commands an adapter executes and the log records it writes."""

    def __init__(self, **settings):
        settings.setdefault("router_id", "A")
        self.core = RouterCore(CoreSettings(**settings), boot_id="b00t", epoch=1)
        self.now = 1000.0
        self.logs: list[Log] = []
        self._delivery = 0

    def do(self, event) -> list:
        commands = self.core.handle(event, self.now)
        self.logs.extend(c for c in commands if isinstance(c, LOG_KINDS))
        return [c for c in commands if not isinstance(c, LOG_KINDS)]

    def advance(self, seconds: float) -> list:
        self.now += seconds
        return self.do(TimerFired())

    def accepted_batch(self, items: list) -> list:
        """The adapter's call for accepted dispositions read in one go:
        ``items`` = [link_id, tag, settled, ...]."""
        out: list = []
        self.core.accepted_batch(items, self.now, out)
        self.logs.extend(c for c in out if isinstance(c, LOG_KINDS))
        return [c for c in out if not isinstance(c, LOG_KINDS)]

    def attach_publisher(
        self, link, topic="t", name=None, container="pub", conn=None, settled=False, properties=None, rcv_first=False
    ):
        """``rcv_first=False`` (rcv-settle-mode=second): the two-step flow most exact
        command lists here follow (outcome unsettled, then the publisher settles);
        tests of the first-mode answer (outcome and settlement at once) pass True."""
        return self.do(
            LinkAttached(
                link,
                conn if conn is not None else link,
                container,
                name or f"p{link}",
                PUBLISHER,
                topic,
                snd_settle_mode=SND_SETTLED if settled else SND_MIXED,
                rcv_settle_mode=RCV_FIRST if rcv_first else RCV_SECOND,
                properties=properties,
            )
        )

    def attach_subscriber(
        self,
        link,
        topic="t",
        name=None,
        container="sub",
        conn=None,
        durable=DURABLE_NONE,
        rcv_second=False,
        expiry_policy="session-end",
        timeout=0,
        best_effort=False,
    ):
        return self.do(
            LinkAttached(
                link,
                conn if conn is not None else link,
                container,
                name or f"s{link}",
                SUBSCRIBER,
                topic,
                durable=durable,
                expiry_policy=expiry_policy,
                timeout=timeout,
                snd_settle_mode=SND_SETTLED if best_effort else SND_MIXED,
                rcv_settle_mode=RCV_SECOND if rcv_second else RCV_FIRST,
            )
        )

    def credit(self, link, credit, drain=False):
        return self.do(CreditChanged(link, credit, drain))

    def publish(self, link, tag: bytes, body="m", settled=False, payload=None, **fields):
        self._delivery += 1
        delivery = self._delivery
        payload = payload if payload is not None else encode(body, **fields)
        return delivery, self.do(MessageReceived(link, delivery, tag, payload, settled))

    def answer(self, link, tag, outcome=outcomes.ACCEPTED, settled=True, **detail):
        return self.do(OutcomeReceived(link, tag, outcome, settled, **detail))

    def settle(self, link, delivery):
        return self.do(PublisherSettled(link, delivery))

    def detach(self, link, closed=False):
        return self.do(LinkDetached(link, closed))

    def lose_connection(self, conn):
        return self.do(ConnectionLost(conn))

    def shutdown(self, grace=5.0):
        return self.do(ShutdownRequested(grace))

    def log_kinds(self) -> list[str]:
        return [entry.kind for entry in self.logs]


def decode(payload: bytes) -> Message:
    message = Message()
    message.decode(payload)
    return message


def one_by_one(commands) -> list:
    """``commands`` with each SubOutcomes as the SubOutcome commands it stands for."""
    flat = []
    for command in commands:
        flat.extend(command.each() if isinstance(command, SubOutcomes) else (command,))
    return flat


def record_states(core) -> dict:
    """Every record's decisions and its subscribers' states, whatever form the record
    keeps them in (a compact record is read without changing it)."""
    result = {}
    for tag, record in core.records.items():
        states = record.expanded_states() if record.compact else record.subscribers
        result[tag] = (
            record.outcome,
            record.waiting,
            record.pub_settled,
            record.payload is None,
            {key: _comparable(core, key, state) for key, state in states.items()},
        )
    return result


def _comparable(core, key: str, state: SubscriberState) -> tuple:
    """A subscriber's state; its send count as what the core can decide by it: whether
    it was sent, and how many of the settlements relayed to that subscriber and not yet
    evidenced were relayed before it (the evidence rule: settlement.py's _answered). A
    compact record's queued copy is sent later than the ``sent_at`` its answer byte
    stands for, and only when that makes no difference to these (admission.py's
    _send_compact); the count itself would tell the two forms apart."""
    values = [getattr(state, name) for name in SubscriberState.__slots__]
    sub = core.subscriptions.get(key)
    pending = sub.awaiting_evidence if sub is not None else ()
    sent = state.sent
    values[SubscriberState.__slots__.index("sent")] = (bool(sent), sum(1 for count, _ in pending if count < sent))
    return tuple(values)


class TwinHarness(Harness):
    """A Harness whose every step also runs on a twin core that turns each of its
    records into SubscriberStates after every step (``record.subscribers``), so the
    twin decides on the general path what the first core decides on its compact
    records' path. The two must give the same commands and the same states."""

    def __init__(self, **settings):
        super().__init__(**settings)
        self.twin = RouterCore(self.core.settings, boot_id="b00t", epoch=1)
        self.compact_steps = 0  # steps after which the first core held a compact record

    def _twin_step(self, commands: list, twin_commands: list) -> None:
        for record in self.twin.records.values():
            record.subscribers  # expand it: the twin's records leave the compact form
        # A run of accepted answers is one SubOutcomes on the compact path and one
        # SubOutcome each on the general one: the same log lines.
        assert one_by_one(twin_commands) == one_by_one(commands), "the compact path decided otherwise than the general path"
        assert record_states(self.twin) == record_states(self.core)
        if any(record.compact for record in self.core.records.values()):
            self.compact_steps += 1

    def do(self, event) -> list:
        twin_event = copy.deepcopy(event)
        commands = self.core.handle(event, self.now)
        self._twin_step(commands, self.twin.handle(twin_event, self.now))
        self.logs.extend(c for c in commands if isinstance(c, LOG_KINDS))
        return [c for c in commands if not isinstance(c, LOG_KINDS)]

    def accepted_batch(self, items: list) -> list:
        out: list = []
        twin_out: list = []
        self.core.accepted_batch(list(items), self.now, out)
        self.twin.accepted_batch(list(items), self.now, twin_out)
        self._twin_step(out, twin_out)
        self.logs.extend(c for c in out if isinstance(c, LOG_KINDS))
        return [c for c in out if not isinstance(c, LOG_KINDS)]
