"""The demo: one router on loopback, two publishers, three subscribers.

Shows the delivery rule at work with standard python-qpid-proton clients:
- alice accepts everything at once;
- bob accepts everything, but only after holding each delivery for a while, so
  every publisher outcome waits for him;
- carol (a durable subscription) rejects one "poison" message, so that one
  delivery's publisher hears rejected although alice and bob accepted it.

Then it stops the router with SIGTERM and reads its event log: every delivery
received, forwarded to all three, answered, settled and its record deleted.
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

from router.eventlog import read_events
from router.launcher import RouterProcess

TOPIC = "demo/news"
POISON = "poison"


class Demo(MessagingHandler):
    def __init__(self, url: str, messages: int, hold: float):
        super().__init__(auto_accept=False, auto_settle=True)
        self.url = url
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
            conn = event.container.connect(self.url)
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
                    conn = event.container.connect(self.url)
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


def _summarise_log(data_dir: Path) -> dict:
    reader = read_events(data_dir)
    kinds = collections.Counter()
    deliveries = set()
    deleted = set()
    for event in reader:
        kinds[event["event"]] += 1
        if event["event"] == "received" and not event.get("settled"):
            deliveries.add(event["delivery"])
        elif event["event"] == "record-deleted" or (event["event"] == "settled" and event.get("deleted")):
            deleted.add(event["delivery"])
    return {"kinds": kinds, "deliveries": len(deliveries), "left": len(deliveries - deleted)}


def run(messages: int = 10, hold: float = 0.05, workdir: str | None = None) -> int:
    base = Path(workdir) if workdir else Path(tempfile.mkdtemp(prefix="eorouter-demo-"))
    router = RouterProcess(base, "A")
    router.start()
    print(f"router A ready on {router.url} (data in {router.data_dir})")
    demo = Demo(router.url, messages, hold)
    started = time.monotonic()
    try:
        Container(demo).run()
    finally:
        router.terminate()
    elapsed = time.monotonic() - started
    if demo.error:
        print(f"demo failed: {demo.error}", file=sys.stderr)
        return 1
    print(f"\n{2 * messages} messages from two publishers to topic {TOPIC!r} in {elapsed:.2f} s\n")
    print("what each subscriber received:")
    for name in ("alice", "bob", "carol"):
        bodies = demo.received[name]
        note = {"alice": "accepts at once", "bob": f"holds each delivery {hold * 1000:.0f} ms, then accepts",
                "carol": f"durable; rejects {POISON!r}"}[name]
        print(f"  {name:6} {len(bodies):3} messages ({note})")
    print("\nwhat each publisher was told:")
    for name in ("sensor-1", "sensor-2"):
        counts = ", ".join(f"{k} {v}" for k, v in sorted(demo.outcomes[name].items()))
        rejected = f"  (rejected: {', '.join(map(repr, demo.rejected[name]))})" if demo.rejected[name] else ""
        print(f"  {name}: {counts}{rejected}")
    print(f"  fastest outcome came {min(demo.waited) * 1000:.0f} ms after its send: bob holds each "
          f"delivery {hold * 1000:.0f} ms, and no publisher heard anything before all three answered")
    summary = _summarise_log(router.data_dir)
    print(f"\nevent log: {summary['deliveries']} deliveries, records left at the end: {summary['left']}")
    print("  " + ", ".join(f"{k} {v}" for k, v in sorted(summary["kinds"].items())))
    ok = (all(len(demo.received[n]) == 2 * messages for n in ("alice", "bob", "carol"))
          and demo.outcomes["sensor-2"]["rejected"] == 1 and summary["left"] == 0
          and min(demo.waited) >= hold)
    print("\nthe delivery rule held: every subscriber got every message once; a publisher heard "
          "'accepted' only when all three accepted" if ok else "\nUNEXPECTED RESULT: see above")
    return 0 if ok else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="eorouter demo", description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=10, help="messages per publisher (default 10)")
    parser.add_argument("--hold", type=float, default=0.05, help="seconds bob holds each delivery")
    parser.add_argument("--workdir", help="where the router's config and data go (default: a temp dir)")
    args = parser.parse_args(argv)
    return run(args.messages, args.hold, args.workdir)


if __name__ == "__main__":
    raise SystemExit(main())
