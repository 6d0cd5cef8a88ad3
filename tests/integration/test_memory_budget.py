"""A router stays inside its byte budget whatever its clients do (issue 16, part 4).

One real router with a small budget (128 MiB router-wide, 32 MiB per topic, 1 MiB
largest message). Five topics get 1 MB messages as fast as credit allows, for
subscribers that take them (prefetch 2,000) and never answer; a sixth one's
subscriber answers a few a second; a seventh topic carries small messages for a
subscriber that accepts everything. While the stuck topics sit at their budgets the
router's resident memory stays under the budget plus a fixed overhead, and the
small-message topic keeps flowing. Then every stuck subscriber accepts what it
holds: every message reaches its subscriber exactly once, every publisher hears
"accepted", and the memory goes back to the operating system.
"""

from __future__ import annotations

import threading
import time

import pytest
from proton import Message
from proton.handlers import MessagingHandler
from proton.reactor import Container

pytestmark = pytest.mark.timeout(240)

MIB = 1024 * 1024
BUDGET = 128 * MIB
TOPIC_BUDGET = 32 * MIB
LARGE = b"x" * 1_000_000
OVERHEAD = 140 * MIB  # the router's own memory, proton's transport buffers, a message being read


def rss(pid: int) -> int:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


class Subscriber(MessagingHandler):
    """Takes messages; accepts them all, none (``hold``) or ``rate`` a second."""

    def __init__(self, url, topic, hold=False, rate=None):
        super().__init__(prefetch=2000, auto_accept=False)
        self.url, self.topic, self.hold, self.rate = url, topic, hold, rate
        self.bodies: list = []
        self.waiting: list = []
        self.release = threading.Event()
        self.container = None

    def on_start(self, event):
        self.container = event.container
        event.container.create_receiver(event.container.connect(self.url), self.topic)
        event.container.schedule(0.1, self)

    def on_message(self, event):
        self.bodies.append(event.message.body)
        if self.hold or self.rate:
            self.waiting.append(event.delivery)
        else:
            self.accept(event.delivery)

    def on_timer_task(self, event):
        if self.release.is_set():
            for delivery in self.waiting:
                self.accept(delivery)
            self.waiting.clear()
        elif self.rate and self.waiting:
            for delivery in self.waiting[: max(1, int(self.rate / 10))]:
                self.accept(delivery)
            del self.waiting[: max(1, int(self.rate / 10))]
        event.container.schedule(0.1, self)


class Publisher(MessagingHandler):
    def __init__(self, url, topic, body, count):
        super().__init__()
        self.url, self.topic, self.body, self.count = url, topic, body, count
        self.sent = 0
        self.outcomes: dict[str, int] = {}

    def on_start(self, event):
        event.container.create_sender(event.container.connect(self.url), self.topic)

    def on_sendable(self, event):
        while event.sender.credit and self.sent < self.count:
            self.sent += 1
            event.sender.send(Message(body=self.body if isinstance(self.body, bytes) else f"{self.body}{self.sent}"))

    def on_accepted(self, event):
        self.outcomes["accepted"] = self.outcomes.get("accepted", 0) + 1

    def on_rejected(self, event):
        self.outcomes["rejected"] = self.outcomes.get("rejected", 0) + 1

    def on_released(self, event):
        self.outcomes["released"] = self.outcomes.get("released", 0) + 1


RUNNING: list[tuple[Container, threading.Thread]] = []


def run(handler) -> Container:
    container = Container(handler)
    thread = threading.Thread(target=container.run, daemon=True)
    thread.start()
    RUNNING.append((container, thread))
    return container


@pytest.fixture(autouse=True)
def stop_clients():
    """Every client's container stops and its thread ends before the test does: a
    proton reactor left running in a daemon thread crashes the interpreter at exit."""
    yield
    for container, _ in RUNNING:
        container.stop()
    for _, thread in RUNNING:
        thread.join(10)
    alive = sum(thread.is_alive() for _, thread in RUNNING)
    RUNNING.clear()
    assert not alive, f"{alive} client container(s) still running 10 s after stop()"


def wait(condition, what, timeout=60.0):
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"not within {timeout:g} s: {what}"
        time.sleep(0.2)


def test_stuck_topics_of_large_messages_stay_inside_the_budget_and_the_rest_flows(router_factory):
    router = router_factory(
        "A", limits={"max_bytes_in_flight": BUDGET, "max_bytes_in_flight_per_topic": TOPIC_BUDGET, "max_message_size": MIB}
    )
    url = router.url
    base = rss(router.proc.pid)
    large = {f"stuck-{n}": 60 for n in range(5)}
    large["slow"] = 60
    subs = {topic: Subscriber(url, topic, hold=topic.startswith("stuck"), rate=5 if topic == "slow" else None) for topic in large}
    subs["live"] = Subscriber(url, "live")
    for sub in subs.values():
        run(sub)
    time.sleep(1.0)  # attached before anything is published
    pubs = {topic: Publisher(url, topic, LARGE, count) for topic, count in large.items()}
    pubs["live"] = Publisher(url, "live", "small-", 3000)
    for pub in pubs.values():
        run(pub)
    # The stuck topics fill up to their budgets (and the router's), then wait.
    wait(lambda: sum(len(subs[t].bodies) for t in large if t.startswith("stuck")) >= 100, "the stuck topics filled up")
    peak = 0
    live_before = len(subs["live"].bodies)
    for _ in range(25):  # 5 s at the budget
        peak = max(peak, rss(router.proc.pid))
        time.sleep(0.2)
    assert peak < BUDGET + OVERHEAD + base, (
        f"RSS {peak / MIB:.0f} MiB at the budget ({BUDGET / MIB:.0f} MiB + {OVERHEAD / MIB:.0f} MiB overhead)"
    )
    held = sum(pubs[t].sent for t in large if t.startswith("stuck"))
    assert held * len(LARGE) <= BUDGET + 5 * 4 * MIB, f"{held} messages of 1 MB taken for stuck subscribers"
    assert len(subs["live"].bodies) > live_before or len(subs["live"].bodies) == 3000, (
        "the small-message topic stopped while the others sat at their budgets"
    )
    assert any(e["event"] == "budget" and e["state"] == "reached" for e in router.events())
    # Now every stuck subscriber answers: everything finishes, exactly once.
    for sub in subs.values():
        sub.release.set()
    wait(lambda: all(sum(p.outcomes.values()) == p.count for p in pubs.values()), "every publisher's outcomes", timeout=120)
    for topic, pub in pubs.items():
        assert pub.outcomes == {"accepted": pub.count}, (topic, pub.outcomes)
        bodies = subs[topic].bodies
        assert len(bodies) == pub.count, f"{topic}: {len(bodies)} of {pub.count}"
        if topic == "live":
            assert bodies == [f"small-{n}" for n in range(1, 3001)]
    time.sleep(3.0)  # records linger, then go
    after = rss(router.proc.pid)
    assert after < base + 60 * MIB, (
        f"RSS {after / MIB:.0f} MiB once everything finished (started at {base / MIB:.0f} MiB): not given back"
    )
