"""Router memory against message bytes in flight, under the byte budget (issue 16, part 4).

``python -m bench.budget [--budgets 64,128,256,512] [--topics 8] [--size 1000000]``: for
each router-wide budget (MiB; each topic's is a quarter of it), one router; on each
of ``--topics`` topics a publisher sends ``--size``-byte messages as fast as credit
allows to a subscriber that takes them (prefetch 2,000) and never answers. Once the
topics sit at their budgets, it reports the bytes the subscribers hold unanswered
(the router holds the same: nothing is settled), the router's resident memory above
its idle size, and their ratio. Then every subscriber answers, and it reports the
memory once everything finished. Python clients (proton) in threads.
"""

from __future__ import annotations

import argparse
import tempfile
import threading
import time
from pathlib import Path

from proton import Message
from proton.handlers import MessagingHandler
from proton.reactor import Container

from eorouter_tools.launcher import RouterProcess

MIB = 1024 * 1024


def rss(pid: int) -> int:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


class Holder(MessagingHandler):
    def __init__(self, url: str, topic: str):
        super().__init__(prefetch=2000, auto_accept=False)
        self.url, self.topic = url, topic
        self.held: list = []
        self.bytes = 0
        self.release = threading.Event()

    def on_start(self, event):
        event.container.create_receiver(event.container.connect(self.url), self.topic)
        event.container.schedule(0.2, self)

    def on_message(self, event):
        self.held.append(event.delivery)
        self.bytes += len(event.message.body)

    def on_timer_task(self, event):
        if self.release.is_set():
            for delivery in self.held:
                self.accept(delivery)
            self.held.clear()
        event.container.schedule(0.2, self)


class Sender(MessagingHandler):
    def __init__(self, url: str, topic: str, body: bytes):
        super().__init__()
        self.url, self.topic, self.body = url, topic, body
        self.sent = 0
        self.settled = 0
        self.stop = False  # set once the budget was measured: only what was sent finishes

    def on_start(self, event):
        event.container.create_sender(event.container.connect(self.url), self.topic)

    def on_sendable(self, event):
        while event.sender.credit and not self.stop:
            self.sent += 1
            event.sender.send(Message(body=self.body))

    def on_settled(self, event):
        self.settled += 1


def one(budget_mib: int, topics: int, size: int, hold_s: float) -> dict:
    with tempfile.TemporaryDirectory(prefix="eobench-budget-") as tmp:
        router = RouterProcess(
            Path(tmp),
            "A",
            overrides={
                "limits": {
                    "max_bytes_in_flight": budget_mib * MIB,
                    "max_bytes_in_flight_per_topic": budget_mib * MIB // 4,
                    "max_message_size": max(size + 4096, MIB),
                }
            },
        )
        router.start()
        containers = []
        try:
            idle = rss(router.proc.pid)
            holders = [Holder(router.url, f"t{n}") for n in range(topics)]
            senders = [Sender(router.url, f"t{n}", b"x" * size) for n in range(topics)]
            for handler in holders + senders:
                container = Container(handler)
                containers.append(container)
                threading.Thread(target=container.run, daemon=True).start()
                if handler is holders[-1]:
                    time.sleep(1.0)
            last, stable_since, peak = -1, time.monotonic(), 0
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline:  # until nothing more arrives for hold_s
                time.sleep(0.5)
                peak = max(peak, rss(router.proc.pid))
                now_held = sum(h.bytes for h in holders)
                if now_held != last:
                    last, stable_since = now_held, time.monotonic()
                elif time.monotonic() - stable_since >= hold_s:
                    break
            at_budget = rss(router.proc.pid)
            for sender in senders:
                sender.stop = True
            for holder in holders:
                holder.release.set()
            sent = sum(s.sent for s in senders)
            deadline = time.monotonic() + 120
            while sum(s.settled for s in senders) < sent and time.monotonic() < deadline:
                time.sleep(0.2)
            time.sleep(3.0)  # records linger (delivery.record_linger, 2 s), then go
            after = rss(router.proc.pid)
            return {
                "budget_mib": budget_mib,
                "held_mib": last / MIB,
                "idle_mib": idle / MIB,
                "rss_at_budget_mib": at_budget / MIB,
                "peak_mib": peak / MIB,
                "after_mib": after / MIB,
            }
        finally:
            for container in containers:
                container.stop()
            router.terminate()


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m bench.budget", description=__doc__.split("\n\n")[0])
    p.add_argument("--budgets", default="64,128,256,512", help="router-wide budgets, MiB (each topic's: a quarter)")
    p.add_argument("--topics", type=int, default=8)
    p.add_argument("--size", type=int, default=1_000_000, help="message body bytes")
    p.add_argument("--hold", type=float, default=3.0, help="seconds without progress that mean 'at the budget'")
    args = p.parse_args(argv)
    rows = [one(int(b), args.topics, args.size, args.hold) for b in args.budgets.split(",")]
    print(
        f"\n{args.topics} topics of {args.size:,}-byte messages, subscribers that never answer; each topic's "
        f"budget a quarter of the router's"
    )
    print(
        f"{'budget':>8} {'held':>8} {'RSS idle':>9} {'RSS at budget':>14} {'peak':>8} {'over idle':>10} "
        f"{'RSS-idle / held':>16} {'after release':>14}"
    )
    for r in rows:
        over = r["rss_at_budget_mib"] - r["idle_mib"]
        ratio = over / r["held_mib"] if r["held_mib"] else float("nan")
        print(
            f"{r['budget_mib']:>5} MiB {r['held_mib']:>6.0f} M {r['idle_mib']:>7.0f} M {r['rss_at_budget_mib']:>12.0f} M "
            f"{r['peak_mib']:>6.0f} M {over:>8.0f} M {ratio:>16.2f} {r['after_mib']:>12.0f} M"
        )


if __name__ == "__main__":
    main()
