"""The pure cores' own cost per message along a line of routers, without proton or sockets.

``python -m bench.mesh --messages 3000``: the cores of an A - B - C line, joined by the
fake network of tests/unit/meshkit.py (what each core sends another becomes that core's
event after a JSON round trip), with a publisher on A and a subscriber on C that answers
each message as it arrives (rcv-settle-mode first: A settles with the outcome). Prints
each router's time inside ``RouterCore.handle`` per message, the best of ``--repeat``
runs, with the collector tuned as in ``eorouter run`` (without that, in-process timings
of the core are ~1.5x slower: the collector's young generation fills far faster).

Timings on a shared VM vary by tens of percent between runs; for an A/B, count
instructions instead, the same way for both trees (per message: the difference of two
message counts, so start-up cancels out)::

    valgrind --tool=callgrind --callgrind-out-file=/tmp/m500 python -m bench.mesh --messages 500 --repeat 1
    valgrind --tool=callgrind --callgrind-out-file=/tmp/m2000 python -m bench.mesh --messages 2000 --repeat 1
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from router.core.commands import Forward
from router.core.guarantees import GuaranteeRule
from router.core.router import RouterCore
from router.serving import tune_gc_for_serving

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "unit"))
from meshkit import Mesh  # noqa: E402  (the tests' fake network, not a package)


def run(n: int, guarantee: str | None = None) -> dict[str, float]:
    """µs per message inside each router's RouterCore.handle for ``n`` messages;
    ``guarantee``: the topic's mode by a [[guarantee]] rule (bench.guarantees)."""
    spent: dict[str, float] = {}
    handle = RouterCore.handle

    def timed(core, event, now):
        start = time.perf_counter()
        try:
            return handle(core, event, now)
        finally:
            name = core.settings.router_id
            spent[name] = spent.get(name, 0.0) + time.perf_counter() - start

    rules = (GuaranteeRule(("t",), guarantee),) if guarantee else ()
    mesh = Mesh("ABC", [("A", "B"), ("B", "C")], record_linger=1.0, guarantees=rules)
    sub = mesh.subscriber("C", "s", credit=10 * n + 100)
    pub = mesh.publisher("A", rcv_first=True)
    RouterCore.handle = timed
    try:
        for i in range(n):
            mesh.publish("A", pub, str(i).encode())
            forward = mesh.client["C"][-1]
            if not isinstance(forward, Forward):
                raise SystemExit(f"message {i} did not reach C: {forward}")
            mesh.answer("C", sub, forward.tag)
    finally:
        RouterCore.handle = handle
    return {name: seconds / n * 1e6 for name, seconds in sorted(spent.items())}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.mesh", description=__doc__.split("\n\n")[0])
    p.add_argument("--messages", type=int, default=3000)
    p.add_argument("--repeat", type=int, default=5)
    a = p.parse_args(argv)
    tune_gc_for_serving()
    best: dict[str, float] = {}
    for _ in range(a.repeat):
        for name, us in run(a.messages).items():
            best[name] = min(us, best.get(name, us))
    print(
        f"A - B - C, {a.messages} messages, best of {a.repeat}: "
        + ", ".join(f"{name} {us:.1f}" for name, us in best.items())
        + " µs per message in RouterCore.handle"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
