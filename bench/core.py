"""The pure core's own cost per message, without proton, sockets or the event log.

``python -m bench.core --subscribers 16 --in-flight 1000``: a RouterCore (the router's
defaults) with one publisher and K subscribers is fed what the adapter would feed it
for N messages: each message (exactly-once: unsettled; best-effort: pre-settled), and,
exactly-once, every subscriber's accepted-and-settled answers in batches of 50 per
subscriber (as the adapter hands them over, one connection per subscriber), answering
each message once ``--in-flight`` later ones have arrived. Prints µs per message for
both modes (the best of ``--repeat`` runs, alternating) and what an exactly-once copy
adds over a best-effort one.

What it is for: splitting the router's exactly-once cost between the core and the
adapter (docs/benchmarks.md, "Compact records"). ``--in-flight`` shows what the
copies held in flight cost in cache misses: the same work with 20 messages in flight
runs hot. Timings on a shared VM vary; compare numbers from one invocation.
"""

from __future__ import annotations

import argparse
import time

from proton import Message

from router.core.commands import Forward
from router.core.events import (
    DURABLE_NONE,
    PUBLISHER,
    RCV_FIRST,
    SND_MIXED,
    SND_SETTLED,
    SUBSCRIBER,
    CreditChanged,
    LinkAttached,
    MessageReceived,
)
from router.core.guarantees import AT_LEAST_ONCE, AT_MOST_ONCE, GuaranteeRule
from router.core.router import RouterCore
from router.core.settings import CoreSettings
from router.serving import tune_gc_for_serving

BATCH = 50  # answers per subscriber per adapter batch (~ one loop iteration's worth in timed runs)


def run(
    k: int,
    in_flight: int,
    n: int,
    best_effort: bool,
    selector_for=None,
    payload: bytes | None = None,
    address_for=None,
    installed_patterns: int = 0,
    at_most_once: bool = False,
    at_least_once: bool = False,
) -> float:
    """µs per message; ``selector_for(s)``: subscriber s's JMS selector (bench.selectors);
    ``address_for(s)``: its address (a pattern taking "t", bench.wildcards);
    ``installed_patterns``: that many more subscriptions, each to a pattern taking
    other topics (attached, no credit), as a router serving many devices holds;
    ``at_most_once``: the topic is at-most-once by a [[guarantee]] rule and the
    publisher sends unsettled (accepted on arrival; bench.guarantees); ``at_least_once``:
    the topic is at-least-once (bench.guarantees)."""
    # Bounds high enough that credit never limits this open-loop feed.
    rules: tuple[GuaranteeRule, ...] = ()
    if at_most_once:
        rules = (GuaranteeRule(("t",), AT_MOST_ONCE),)
    elif at_least_once:
        rules = (GuaranteeRule(("t",), AT_LEAST_ONCE),)
    core = RouterCore(
        CoreSettings(
            router_id="A",
            max_in_flight_per_topic=10 * (n + in_flight),
            publisher_credit_window=10 * (n + in_flight),
            guarantees=rules,
        ),
        boot_id="b00t",
        epoch=1,
    )
    if hasattr(getattr(core, "settled", None), "streams"):
        # The settled-delivery memory keeps max_in_flight_per_topic per stream: what a
        # router with the default bound keeps, not the open loop's bound.
        core.settled.keep = CoreSettings().max_in_flight_per_topic
    now = 1000.0
    core.handle(
        LinkAttached(
            1,
            1,
            "pub",
            "p1",
            PUBLISHER,
            "t",
            snd_settle_mode=SND_SETTLED if best_effort else SND_MIXED,
            rcv_settle_mode=RCV_FIRST,
        ),
        now,
    )
    for s in range(k):
        link = 100 + s
        core.handle(
            LinkAttached(
                link,
                link,
                "sub",
                f"s{link}",
                SUBSCRIBER,
                address_for(s) if address_for is not None else "t",
                durable=DURABLE_NONE,
                snd_settle_mode=SND_MIXED,
                rcv_settle_mode=RCV_FIRST,
                selector=selector_for(s) if selector_for is not None else None,
            ),
            now,
        )
        core.handle(CreditChanged(link, 10**9, False), now)
    for i in range(installed_patterns):
        link = 10**6 + i
        address = f"region{i % 100}/+/device{i}/#"
        core.handle(LinkAttached(link, link, "dev", f"d{i}", SUBSCRIBER, address, durable=DURABLE_NONE), now)
    if payload is None:
        payload = Message(body="x" * 100).encode()
    # Only each message's outgoing tag is kept (as the adapter keeps it): holding the
    # Forward commands themselves would add their memory to what is measured.
    pending: list[bytes] = []
    links = range(100, 100 + k)
    start = time.perf_counter()
    for i in range(n):
        commands = core.handle(MessageReceived(1, i + 1, str(i).encode(), payload, best_effort), now)
        if best_effort or at_most_once:
            continue
        for c in commands:
            if c.__class__ is Forward:
                pending.append(c.tag)
                break
        if len(pending) >= in_flight + BATCH:
            batch, pending[:BATCH] = pending[:BATCH], []
            for link in links:
                items: list = []
                for tag in batch:
                    items += (link, tag, True)
                core.accepted_batch(items, now, [])
    return (time.perf_counter() - start) / n * 1e6


def best_alternating(runs: dict, repeat: int) -> dict[str, float]:
    """``runs``: name -> a function returning µs per message. Each is run ``repeat``
    times, the names alternating (so drift on a shared machine hits all alike);
    the best of each."""
    best: dict[str, float] = {}
    for _ in range(repeat):
        for name, measure in runs.items():
            t = measure()
            best[name] = min(best.get(name, t), t)
    return best


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m bench.core", description=__doc__.split("\n\n")[0])
    p.add_argument("--subscribers", type=int, default=16)
    p.add_argument("--in-flight", type=int, default=1000, help="messages answered this many later (default 1000)")
    p.add_argument("--messages", type=int, default=20000)
    p.add_argument("--repeat", type=int, default=3)
    args = p.parse_args(argv)
    tune_gc_for_serving()  # the collector's settings of `eorouter run`: they matter here as much as there
    eo, be = [], []
    for _ in range(args.repeat):
        be.append(run(args.subscribers, args.in_flight, args.messages, True))
        eo.append(run(args.subscribers, args.in_flight, args.messages, False))
    k = args.subscribers
    print(
        f"core only, K={k}, {args.in_flight} in flight, {args.messages} messages, best of {args.repeat}: "
        f"exactly-once {min(eo):.1f} µs/msg, best-effort {min(be):.1f} µs/msg "
        f"({min(eo) / min(be):.2f}x); an exactly-once copy adds {(min(eo) - min(be)) / k:.2f} µs"
    )


if __name__ == "__main__":
    main()
