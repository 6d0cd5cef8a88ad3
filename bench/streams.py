"""What a router remembers per publisher stream, in bytes (issue 16, part 1).

``python -m bench.streams [--streams 10000]``: a RouterCore with the router's
defaults is fed what the adapter would feed it: for each stream a publisher link
attaches, publishes, its subscriber accepts and settles, the router settles with
the outcome, and the link detaches. Python's tracemalloc measures what the core
holds afterwards, per stream, for: streams that settled one delivery each, streams
that settled ten each, one stream that settled far more than it keeps (at most two
generations of ``max_in_flight_per_topic``), and the forgotten ids once a resume
horizon passed. Memory is counted by tracemalloc (Python objects the core
allocated), not the process's RSS.
"""

from __future__ import annotations

import argparse
import gc
import tracemalloc

from proton import Message

from router.core.commands import Forward
from router.core.events import (
    PUBLISHER,
    RCV_FIRST,
    SND_MIXED,
    SUBSCRIBER,
    CreditChanged,
    LinkAttached,
    LinkDetached,
    MessageReceived,
    OutcomeReceived,
    TimerFired,
)
from router.core.router import RouterCore
from router.core.settings import CoreSettings

SUB = 1


def _core() -> tuple[RouterCore, float]:
    core = RouterCore(CoreSettings(router_id="A"), boot_id="b00t", epoch=1)
    now = 1000.0
    core.handle(LinkAttached(SUB, SUB, "sub", "s", SUBSCRIBER, "t", rcv_settle_mode=RCV_FIRST), now)
    core.handle(CreditChanged(SUB, 10**9, False), now)
    return core, now


def _stream(core: RouterCore, now: float, link: int, messages: int, payload: bytes, delivery: int) -> int:
    core.handle(
        LinkAttached(link, link, "pub", f"p{link}", PUBLISHER, "t", snd_settle_mode=SND_MIXED, rcv_settle_mode=RCV_FIRST), now
    )
    for n in range(messages):
        delivery += 1
        for c in core.handle(MessageReceived(link, delivery, str(n).encode(), payload, False), now):
            if c.__class__ is Forward:
                core.handle(OutcomeReceived(SUB, c.tag, 0x24, True), now)
    core.handle(LinkDetached(link, False), now)
    return delivery


def measure(streams: int, messages: int) -> tuple[float, int]:
    """Bytes the core holds per stream after ``streams`` streams of ``messages``
    settled deliveries each; and the settled tags it holds in all."""
    payload = Message(body="x" * 100).encode()
    core, now = _core()
    gc.collect()
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    delivery = 0
    for s in range(streams):
        delivery = _stream(core, now, 100 + s, messages, payload, delivery)
    core.handle(TimerFired(), now + core.settings.publisher_resume_timeout + 1)
    gc.collect()
    held = tracemalloc.get_traced_memory()[0] - before
    tracemalloc.stop()
    return held / streams, len(core.settled)


def measure_forgotten(streams: int) -> float:
    """Bytes per forgotten stream id, once the resume horizon passed."""
    payload = Message(body="x").encode()
    core, now = _core()
    delivery = 0
    for s in range(streams):
        delivery = _stream(core, now, 100 + s, 1, payload, delivery)
    gc.collect()
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    step = core.settled.sweep_interval()
    for n in range(1, 7):
        core.handle(TimerFired(), now + n * step + 0.001)
    gc.collect()
    after = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    assert len(core.settled.streams) == 0 and len(core.settled.forgotten) == streams
    return (after - before) / streams  # negative: the forgotten id costs less than the memory it replaced


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m bench.streams", description=__doc__.split("\n\n")[0])
    p.add_argument("--streams", type=int, default=10_000)
    args = p.parse_args(argv)
    n = args.streams
    one, _ = measure(n, 1)
    ten, _ = measure(n, 10)
    busy, tags = measure(1, 20_000)
    gone = measure_forgotten(n)
    print(f"per stream, {n} streams, 1 settled delivery each: {one:.0f} B ({one * n / 2**20:.1f} MiB for all)")
    print(f"per stream, {n} streams, 10 settled deliveries each: {ten:.0f} B ({ten * n / 2**20:.1f} MiB for all)")
    print(
        f"one stream that settled 20,000 deliveries: {busy / 1024:.0f} KiB ({tags} settled tags kept; "
        f"max_in_flight_per_topic {CoreSettings().max_in_flight_per_topic})"
    )
    print(f"a stream forgotten after the resume horizon: {gone:+.0f} B each (its id kept, its tags freed)")


if __name__ == "__main__":
    main()
