"""``python -m router.client``: a resumable publisher or subscriber as a process.

    python -m router.client publish --url 127.0.0.1:5672 --url 127.0.0.1:5772 --topic t \\
        --container-id pub-1 --link pub-1-t --state pub-1.state --ledger pub-1.jsonl --count 1000
    python -m router.client subscribe --url ... --topic t --container-id sub-1 --link sub-1-t \\
        --state sub-1.state --ledger sub-1.jsonl --expect 1000

The publisher sends messages with application property ``seq`` 1..count (body
``"<container-id> <seq>"``), at most ``--window`` unanswered at a time, and exits 0
once every one of them has an outcome. Run again with the same state file after a
crash, it resumes: unsettled ones are resent first, then it goes on from the next
seq. The subscriber hands each message over once (into its ledger) and exits 0
once ``--expect`` distinct deliveries are in its ledger (this run's and earlier runs'),
or after ``--idle-exit`` seconds without a message. Both print ``ready <url>``
when first attached and a JSON summary at the end; SIGTERM detaches and exits.
"""

from __future__ import annotations

import argparse
import json
import logging
import signal
import sys
import threading
import time
from pathlib import Path

from router.client import ResumablePublisher, ResumableSubscriber, read_ledger


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--url", action="append", required=True, help="router host:port (repeat for a failover list)")
    p.add_argument("--topic", required=True)
    p.add_argument("--container-id", required=True)
    p.add_argument("--link", required=True, help="link name")
    p.add_argument("--state", required=True, help="state file")
    p.add_argument("--ledger", required=True, help="ledger file (JSON lines)")
    p.add_argument("--heartbeat", type=float, default=2.0, help="AMQP heartbeat (idle timeout) in seconds")
    p.add_argument("--timeout", type=float, default=120.0, help="give up after this many seconds")
    p.add_argument("--fsync", action="store_true", help="fsync state and ledger on every change")
    p.add_argument("-v", "--verbose", action="store_true")


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m router.client", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    pub = sub.add_parser("publish", help="send --count messages, exactly once")
    _common(pub)
    pub.add_argument("--count", type=int, required=True)
    pub.add_argument("--window", type=int, default=100, help="messages in flight at most")
    pub.add_argument("--rate", type=float, default=0.0, help="messages per second (0: as fast as credit allows)")
    s = sub.add_parser("subscribe", help="receive into the ledger, each message once")
    _common(s)
    s.add_argument("--expect", type=int, default=0, help="exit once this many distinct deliveries are in the ledger (all runs)")
    s.add_argument("--idle-exit", type=float, default=0.0, help="exit after this long without a message")
    s.add_argument("--delay", type=float, default=0.0, help="seconds the application takes per message")
    s.add_argument("--prefetch", type=int, default=100)
    return parser.parse_args(argv)


def _install_sigterm(stop: threading.Event) -> None:
    signal.signal(signal.SIGTERM, lambda *_: stop.set())


def run_publisher(args, stop: threading.Event) -> int:
    pub = ResumablePublisher(
        args.url,
        args.topic,
        container_id=args.container_id,
        link_name=args.link,
        state_path=args.state,
        ledger_path=args.ledger,
        heartbeat=args.heartbeat,
        fsync=args.fsync,
    )
    deadline = time.monotonic() + args.timeout
    outcomes: dict[str, int] = {}
    lock = threading.Lock()

    def count(outcome) -> None:
        with lock:
            outcomes[outcome.state] = outcomes.get(outcome.state, 0) + 1

    pub.on_outcome = count
    pub.start()
    if not pub.wait_attached(timeout=args.timeout):
        print(json.dumps({"error": "never attached", "history": list(pub.history)[-5:]}), flush=True)
        pub.close()
        return 1
    print(f"ready {pub.router}", flush=True)
    first = pub.state.next_seq
    in_flight: list = []
    open_futures = [0]

    def done_one(_future) -> None:
        with lock:
            open_futures[0] -= 1

    interval = 1.0 / args.rate if args.rate > 0 else 0.0
    next_at = time.monotonic()
    seq = first
    while seq <= args.count and not stop.is_set() and time.monotonic() < deadline:
        in_flight = [f for f in in_flight if not f.done()]
        if len(in_flight) >= args.window:
            time.sleep(0.002)
            continue
        if interval:
            now = time.monotonic()
            if now < next_at:
                time.sleep(min(interval, next_at - now))
                continue
            next_at = max(next_at + interval, now - 1.0)
        with lock:
            open_futures[0] += 1
        future = pub.send_async(f"{args.container_id} {seq}", seq=seq)
        future.add_done_callback(done_one)
        in_flight.append(future)
        seq += 1
    ok = pub.wait_for(
        lambda: stop.is_set() or (open_futures[0] == 0 and not pub.state.unsettled), timeout=max(0.0, deadline - time.monotonic())
    )
    summary = {
        "role": "publisher",
        "sent_from": first,
        "next_seq": pub.state.next_seq,
        "outcomes": outcomes,
        "unsettled": pub.unsettled_count,
        "resent": pub.resent_count,
        "attaches": pub.attaches,
        "incarnation": pub.incarnation,
        "complete": bool(ok and not stop.is_set()),
    }
    pub.close()
    print(json.dumps(summary), flush=True)
    return 0 if summary["complete"] else 1


def run_subscriber(args, stop: threading.Event) -> int:
    seen: set = set()
    if Path(args.ledger).exists():
        seen = {line["delivery"] for line in read_ledger(args.ledger) if line.get("event") == "delivered"}
    last = [time.monotonic()]

    def on_message(msg) -> None:
        if args.delay:
            time.sleep(args.delay)
        seen.add(msg.delivery_tag.hex())
        last[0] = time.monotonic()

    sub = ResumableSubscriber(
        args.url,
        args.topic,
        container_id=args.container_id,
        link_name=args.link,
        state_path=args.state,
        ledger_path=args.ledger,
        heartbeat=args.heartbeat,
        on_message=on_message,
        prefetch=args.prefetch,
        fsync=args.fsync,
    )
    sub.start()
    if not sub.wait_attached(timeout=args.timeout):
        print(json.dumps({"error": "never attached", "history": list(sub.history)[-5:]}), flush=True)
        sub.close()
        return 1
    print(f"ready {sub.router}", flush=True)
    deadline = time.monotonic() + args.timeout

    def done() -> bool:
        if stop.is_set() or time.monotonic() > deadline:
            return True
        if args.expect and len(seen) >= args.expect:
            return True
        return bool(args.idle_exit) and time.monotonic() - last[0] > args.idle_exit

    while not done():
        sub.wait_for(lambda: False, timeout=0.05)
    # let the router's settlements of the last deliveries arrive before detaching
    sub.wait_for(lambda: not sub.state.unsettled, timeout=2.0)
    summary = {
        "role": "subscriber",
        "distinct_deliveries": len(seen),
        "delivered_now": sub.delivered,
        "duplicates_suppressed": sub.duplicates,
        "unsettled": sub.unsettled_count,
        "attaches": sub.attaches,
        "complete": bool(args.expect and len(seen) >= args.expect),
    }
    sub.close()
    print(json.dumps(summary), flush=True)
    return 0 if (summary["complete"] or not args.expect) else 1


def main(argv=None) -> int:
    args = parse_args(argv)
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING, stream=sys.stderr, format="%(asctime)s %(name)s %(message)s"
    )
    stop = threading.Event()
    _install_sigterm(stop)
    if args.command == "publish":
        return run_publisher(args, stop)
    return run_subscriber(args, stop)


if __name__ == "__main__":
    sys.exit(main())
