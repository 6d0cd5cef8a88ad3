"""A mesh of pure cores over a fake network: the router network without sockets.

Commands a core addresses to another router (SendControl, SendData) become that
router's ControlReceived/DataReceived events, after a JSON round trip (what the
wire does to them). Everything else a core says is for its clients and is kept
per router for the test to read. Links can be cut and restored; messages in
flight on a cut link are lost, as on a real connection.
"""

from __future__ import annotations

import copy
import itertools
from collections import deque

import orjson
from corekit import encode, record_states

from router.core import outcomes
from router.core.commands import Completed, Forward, Log, Received, SendControl, SendData, SendOutcome, SubOutcome
from router.core.events import (
    PUBLISHER,
    SND_MIXED,
    SUBSCRIBER,
    ControlReceived,
    CreditChanged,
    DataReceived,
    LinkAttached,
    LinkDetached,
    MessageReceived,
    OutcomeReceived,
    PeerConnected,
    PeerLost,
    PublisherSettled,
    TimerFired,
)
from router.core.router import RouterCore
from router.core.settings import CoreSettings


class Mesh:
    def __init__(self, names, links=(), twins=False, **settings):
        """``twins``: each core has a twin fed the same events whose records are
        expanded to SubscriberStates after every step (corekit.TwinHarness): it must
        give the same commands and states."""
        self.now = 1000.0
        self.cores = {n: RouterCore(CoreSettings(router_id=n, **settings), boot_id=f"boot-{n}", epoch=1) for n in names}
        self.twins = (
            {n: RouterCore(core.settings, boot_id=core.boot_id, epoch=1) for n, core in self.cores.items()} if twins else {}
        )
        self.inflight: deque = deque()
        self.links: dict[frozenset, int] = {}
        self.client: dict[str, list] = {n: [] for n in names}
        self.logs: dict[str, list] = {n: [] for n in names}
        self._conn = itertools.count(1000)
        self._link = itertools.count(1)
        self._delivery = itertools.count(1)
        for a, b in links:
            self.connect(a, b)
        self.settle()

    # ------------------------------------------------------------ plumbing

    def feed(self, name, event):
        twin = self.twins.get(name)
        twin_event = copy.deepcopy(event) if twin is not None else None
        commands = self.cores[name].handle(event, self.now)
        if twin is not None:
            twin_commands = twin.handle(twin_event, self.now)
            for record in twin.records.values():
                record.subscribers  # expand it
            assert twin_commands == commands, f"{name}: the compact path decided otherwise"
            assert record_states(twin) == record_states(self.cores[name]), name
        for c in commands:
            if isinstance(c, SendControl):
                wire = orjson.loads(orjson.dumps(c.message))
                self._send(name, c.router_id, lambda conn, w=wire: ControlReceived(conn, name, [w]))
            elif isinstance(c, SendData):
                header = orjson.loads(orjson.dumps(c.header))
                self._send(name, c.router_id, lambda conn, c=c, h=header: DataReceived(conn, name, c.tag, h, c.payload))
            elif isinstance(c, (Log, Received, Completed, SubOutcome)):
                self.logs[name].append(c)
            else:
                self.client[name].append(c)
        return commands

    def _send(self, source, target, make):
        pair = frozenset((source, target))
        conn = self.links.get(pair)
        assert conn is not None, f"{source} sent to {target}, which is not its neighbour"
        self.inflight.append((pair, conn, target, make(conn)))

    def settle(self, limit=100_000):
        """Deliver everything in flight (and whatever that causes)."""
        steps = 0
        while self.inflight:
            pair, conn, target, event = self.inflight.popleft()
            if self.links.get(pair) != conn:
                continue  # the link was cut while this was in flight
            self.feed(target, event)
            steps += 1
            assert steps < limit, "the mesh does not quiesce"

    def deliver_from(self, source, target, count=1):
        """Deliver the oldest ``count`` messages in flight from ``source`` to ``target``
        (one link's queue, in its order) and nothing else: a test's way to make one
        path win a race against another."""
        for _ in range(count):
            for index, (pair, conn, to, event) in enumerate(self.inflight):
                if to == target and event.router_id == source:
                    del self.inflight[index]
                    if self.links.get(pair) == conn:
                        self.feed(target, event)
                    break
            else:
                raise AssertionError(f"nothing in flight from {source} to {target}")

    def in_flight(self, source, target):
        """The messages in flight from ``source`` to ``target``, oldest first."""
        return [event for _, _, to, event in self.inflight if to == target and event.router_id == source]

    def deliver_one_queue_head(self, pick):
        """Deliver the head of one queue (per link, direction and kind: control and data
        are separate AMQP links on one connection, and the adapter sends data as credit
        allows and control at the end of a loop iteration, so either may go first):
        the ``pick``-th of the queues with something in flight."""
        if not self.inflight:
            return
        heads = {}
        for index, item in enumerate(self.inflight):
            heads.setdefault((item[0], item[2], type(item[3])), index)
        index = sorted(heads.values())[pick % len(heads)]
        pair, conn, target, event = self.inflight[index]
        del self.inflight[index]
        if self.links.get(pair) == conn:
            self.feed(target, event)

    def connect(self, a, b):
        conn = next(self._conn)
        self.links[frozenset((a, b))] = conn
        self.feed(a, PeerConnected(conn, b, 1, f"boot-{b}"))
        self.feed(b, PeerConnected(conn, a, 1, f"boot-{a}"))

    def kill(self, router):
        """A router dies: every link to it drops (its own state is simply never used again)."""
        for pair in [p for p in self.links if router in p]:
            a, b = sorted(pair)
            conn = self.links.pop(pair)
            other = b if a == router else a
            self.feed(other, PeerLost(conn, router))
        self.settle()

    def cut(self, a, b):
        conn = self.links.pop(frozenset((a, b)))
        self.feed(a, PeerLost(conn, b))
        self.feed(b, PeerLost(conn, a))

    def advance(self, seconds):
        self.now += seconds
        for name in self.cores:
            self.feed(name, TimerFired())
        self.settle()

    # ------------------------------------------------------------ clients

    def publisher(self, router, name="pub", container="P", properties=None, rcv_first=False, topic="t"):
        """``rcv_first``: the router settles with the outcome (rcv-settle-mode=first);
        otherwise the test settles the publisher's delivery itself (settle_publisher)."""
        link = next(self._link)
        self.feed(
            router,
            LinkAttached(
                link,
                link,
                container,
                name,
                PUBLISHER,
                topic,
                snd_settle_mode=SND_MIXED,
                rcv_settle_mode=0 if rcv_first else 1,
                properties=properties,
            ),
        )
        self.settle()
        return link

    def subscriber(self, router, name, credit=100, topic="t", **attach):
        """``topic``: the address, a topic or a pattern of topics."""
        link = self.attach_subscriber(router, name, credit, topic, **attach)
        self.settle()
        return link

    def attach_subscriber(self, router, name, credit=100, topic="t", **attach):
        """As ``subscriber``, leaving what the attach sends (its announcement) in flight."""
        link = next(self._link)
        attach.setdefault("rcv_settle_mode", 1 if attach.get("durable") else 0)
        self.feed(router, LinkAttached(link, link, f"S-{name}", name, SUBSCRIBER, topic, **attach))
        self.feed(router, CreditChanged(link, credit))
        return link

    def publish(self, router, link, tag: bytes, body="m", payload=None):
        delivery = next(self._delivery)
        self.feed(router, MessageReceived(link, delivery, tag, payload or encode(body), False))
        self.settle()
        return delivery

    def forwarded(self, router, link):
        return [c for c in self.client[router] if isinstance(c, Forward) and c.link_id == link]

    def answer(self, router, link, tag, outcome=outcomes.ACCEPTED, settled=True):
        self.feed(router, OutcomeReceived(link, tag, outcome, settled))
        self.settle()

    def outcomes_for(self, router, delivery):
        return [c for c in self.client[router] if isinstance(c, SendOutcome) and c.delivery == delivery]

    def settle_publisher(self, router, link, delivery):
        self.feed(router, PublisherSettled(link, delivery))
        self.settle()

    def detach(self, router, link, closed=False):
        self.feed(router, LinkDetached(link, closed))
        self.settle()

    def opened(self, router, link):
        from router.core.commands import OpenLink

        return any(isinstance(c, OpenLink) and c.link_id == link for c in self.client[router])
