"""The demo: a network of routers on loopback, two publishers, three subscribers.

By default three routers A, B and C, each linked to the other two (any topology
file works: --topology). Subscribers and publishers are spread over them, and
the delivery rule is shown at work across the network with standard
python-qpid-proton clients:
- alice accepts everything at once;
- bob accepts everything, but only after holding each delivery for a while, so
  every publisher outcome waits for him;
- carol (a durable subscription) rejects one "poison" message, so that one
  delivery's publisher hears rejected although alice and bob accepted it.

Then it stops the routers with SIGTERM and reads their event logs: every
delivery received, relayed to the routers with subscribers, answered, settled and
its record deleted on every router.
"""

from __future__ import annotations

import argparse
import collections
import sys
import tempfile
import time
from pathlib import Path

from proton import Message
from proton.handlers import MessagingHandler
from proton.reactor import Container, DurableSubscription

from eorouter_tools.topology import LAUNCH_ERRORS, RouterNetwork, TopologyError, launch_failure, load_topology
from router.eventlog import read_events

TOPIC = "demo/news"
POISON = "poison"


class Demo(MessagingHandler):
    def __init__(self, urls: dict[str, str], messages: int, hold: float):
        super().__init__(auto_accept=False, auto_settle=True)
        self.urls = urls
        self.messages = messages
        self.hold = hold
        self.received = collections.defaultdict(list)  # subscriber -> bodies
        self.outcomes = collections.defaultdict(collections.Counter)  # publisher -> outcome -> count
        self.rejected = collections.defaultdict(list)  # publisher -> bodies rejected
        self.subscribers_ready = 0
        self.senders = {}
        self.sent = collections.Counter()
        self.bodies = {}  # delivery -> body
        self.answered = 0
        self.waited = []  # seconds from send to outcome, per delivery
        self.error = "demo did not finish"
        self.container = None

    # ---------------------------------------------------------------- setup

    def on_start(self, event):
        self.container = event.container
        for name in ("alice", "bob", "carol"):
            conn = event.container.connect(self.urls[name])
            options = [DurableSubscription()] if name == "carol" else []
            event.container.create_receiver(conn, TOPIC, name=f"{name}-sub", options=options)
        self.deadline = event.container.schedule(60, self)

    def on_timer_task(self, event):
        event.container.stop()

    def on_link_opened(self, event):
        if event.receiver:
            self.subscribers_ready += 1
            if self.subscribers_ready == 3:
                for name in ("sensor-1", "sensor-2"):
                    conn = event.container.connect(self.urls[name])
                    self.senders[event.container.create_sender(conn, TOPIC, name=name)] = name

    # ---------------------------------------------------------- publishing

    def on_sendable(self, event):
        name = self.senders.get(event.sender)
        if name is None:
            return
        while event.sender.credit and self.sent[name] < self.messages:
            n = self.sent[name] + 1
            body = POISON if (name == "sensor-2" and n == 5) else f"{name} #{n}"
            delivery = event.sender.send(Message(body=body, durable=True))
            self.bodies[delivery] = (name, body, time.monotonic())
            self.sent[name] = n

    def _outcome(self, event, outcome):
        name, body, sent_at = self.bodies.pop(event.delivery)
        self.waited.append(time.monotonic() - sent_at)
        self.outcomes[name][outcome] += 1
        if outcome == "rejected":
            self.rejected[name].append(body)
        self.answered += 1
        if self.answered == 2 * self.messages:
            self.error = None
            event.container.stop()

    def on_accepted(self, event):
        self._outcome(event, "accepted")

    def on_rejected(self, event):
        self._outcome(event, "rejected")

    def on_released(self, event):
        self._outcome(event, "released")

    def on_modified(self, event):
        self._outcome(event, "modified")

    # ---------------------------------------------------------- subscribing

    def on_message(self, event):
        name = event.receiver.name.removesuffix("-sub")
        body = event.message.body
        self.received[name].append(body)
        delivery = event.delivery
        if name == "carol" and body == POISON:
            self.reject(delivery)
        elif name == "bob":
            event.container.schedule(self.hold, _Later(lambda: self.accept(delivery)))
        else:
            self.accept(delivery)


class _Later:
    def __init__(self, action):
        self.action = action

    def on_timer_task(self, event):
        self.action()


def _summarise_logs(data_dirs: list[Path]) -> dict:
    kinds = collections.Counter()
    left = 0
    deliveries = set()
    for data_dir in data_dirs:
        received, deleted = set(), set()
        for event in read_events(data_dir):
            kinds[event["event"]] += 1
            if event["event"] == "received" and not event.get("settled"):
                received.add(event["delivery"])
                if not event.get("origin_router"):
                    deliveries.add(event["delivery"])
            elif event["event"] == "record-deleted" or (event["event"] == "settled" and event.get("deleted")):
                deleted.add(event["delivery"])
        left += len(received - deleted)
    return {"kinds": kinds, "deliveries": len(deliveries), "left": left}


def _placement(routers: list[str]) -> dict[str, str]:
    """Who connects where: spread over the network, farthest apart first."""
    at = lambda i: routers[i % len(routers)]  # noqa: E731
    return {"alice": at(0), "bob": at(1), "carol": at(2), "sensor-1": at(0), "sensor-2": at(1)}


def run(messages: int = 10, hold: float = 0.05, workdir: str | None = None, topology: str | None = None) -> int:
    try:
        layout = load_topology(topology)
    except TopologyError as err:
        print(f"eorouter demo: {err}", file=sys.stderr)
        return 2
    base = Path(workdir) if workdir else Path(tempfile.mkdtemp(prefix="eorouter-demo-"))
    network = RouterNetwork(base, layout)
    placement = _placement(list(layout.routers))
    try:
        network.start()
        print(f"{len(layout.routers)} routers on loopback, routes converged (data in {base}):")
        print(network.describe())
        urls = {who: network.routers[router].url for who, router in placement.items()}
        demo = Demo(urls, messages, hold)
        started = time.monotonic()
        Container(demo).run()
        elapsed = time.monotonic() - started
        # Settlements and record deletions travel on after the last outcome: let
        # every router finish (records return to zero) before stopping them.
        deadline = time.monotonic() + 10
        data_dirs = [router.data_dir for router in network.routers.values()]
        while _summarise_logs(data_dirs)["left"] and time.monotonic() < deadline:
            time.sleep(0.1)
    finally:
        network.stop()
    if demo.error:
        print(f"demo failed: {demo.error}", file=sys.stderr)
        return 1
    print(f"\n{2 * messages} messages from two publishers to topic {TOPIC!r} in {elapsed:.2f} s\n")
    print("what each subscriber received:")
    for name in ("alice", "bob", "carol"):
        bodies = demo.received[name]
        note = {
            "alice": "accepts at once",
            "bob": f"holds each delivery {hold * 1000:.0f} ms, then accepts",
            "carol": f"durable; rejects {POISON!r}",
        }[name]
        print(f"  {name:6} on {placement[name]}: {len(bodies):3} messages ({note})")
    print("\nwhat each publisher was told:")
    for name in ("sensor-1", "sensor-2"):
        counts = ", ".join(f"{k} {v}" for k, v in sorted(demo.outcomes[name].items()))
        rejected = f"  (rejected: {', '.join(map(repr, demo.rejected[name]))})" if demo.rejected[name] else ""
        print(f"  {name} on {placement[name]}: {counts}{rejected}")
    print(
        f"  fastest outcome came {min(demo.waited) * 1000:.0f} ms after its send: bob holds each "
        f"delivery {hold * 1000:.0f} ms, and no publisher heard anything before all three answered"
    )
    summary = _summarise_logs([router.data_dir for router in network.routers.values()])
    print(f"\nevent logs: {summary['deliveries']} deliveries, records left on all routers at the end: {summary['left']}")
    print("  " + ", ".join(f"{k} {v}" for k, v in sorted(summary["kinds"].items())))
    ok = (
        all(len(demo.received[n]) == 2 * messages for n in ("alice", "bob", "carol"))
        and demo.outcomes["sensor-2"]["rejected"] == 1
        and summary["left"] == 0
        and min(demo.waited) >= hold
    )
    print(
        "\nthe delivery rule held across the network: every subscriber got every message once; a "
        "publisher heard 'accepted' only when all three accepted"
        if ok
        else "\nUNEXPECTED RESULT: see above"
    )
    return 0 if ok else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="eorouter demo --rule", description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=10, help="messages per publisher (default 10)")
    parser.add_argument("--hold", type=float, default=0.05, help="seconds bob holds each delivery")
    parser.add_argument("--workdir", help="where the routers' configs and data go (default: a temp dir)")
    parser.add_argument("--topology", help="topology TOML file (default: three routers, fully linked)")
    args = parser.parse_args(argv)
    try:
        return run(args.messages, args.hold, args.workdir, args.topology)
    except LAUNCH_ERRORS as err:
        print(f"eorouter demo: {launch_failure(err)}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    raise SystemExit(main())
