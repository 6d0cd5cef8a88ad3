"""Drive a RouterCore by hand: a test's stand-in for the proton adapter."""

from __future__ import annotations

from proton import Message

from router.core import outcomes
from router.core.commands import Log, SubOutcome
from router.core.events import (
    DURABLE_NONE, PUBLISHER, RCV_FIRST, RCV_SECOND, SND_MIXED, SND_SETTLED, SUBSCRIBER, ConnectionLost,
    CreditChanged, LinkAttached, LinkDetached, MessageReceived, OutcomeReceived, PublisherSettled,
    ShutdownRequested, TimerFired,
)
from router.core.router import RouterCore
from router.core.settings import CoreSettings


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
        self.logs.extend(c for c in commands if isinstance(c, (Log, SubOutcome)))
        return [c for c in commands if not isinstance(c, (Log, SubOutcome))]

    def advance(self, seconds: float) -> list:
        self.now += seconds
        return self.do(TimerFired())

    def attach_publisher(self, link, topic="t", name=None, container="pub", conn=None, settled=False,
                         properties=None, rcv_first=False):
        """``rcv_first=False`` (rcv-settle-mode=second): the two-step flow most exact
        command lists here follow (outcome unsettled, then the publisher settles);
        tests of the first-mode answer (outcome and settlement at once) pass True."""
        return self.do(LinkAttached(link, conn if conn is not None else link, container, name or f"p{link}",
                                    PUBLISHER, topic, snd_settle_mode=SND_SETTLED if settled else SND_MIXED,
                                    rcv_settle_mode=RCV_FIRST if rcv_first else RCV_SECOND,
                                    properties=properties))

    def attach_subscriber(self, link, topic="t", name=None, container="sub", conn=None, durable=DURABLE_NONE,
                          rcv_second=False, expiry_policy="session-end", timeout=0, best_effort=False):
        return self.do(LinkAttached(link, conn if conn is not None else link, container, name or f"s{link}",
                                    SUBSCRIBER, topic, durable=durable, expiry_policy=expiry_policy,
                                    timeout=timeout, snd_settle_mode=SND_SETTLED if best_effort else SND_MIXED,
                                    rcv_settle_mode=RCV_SECOND if rcv_second else RCV_FIRST))

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
