"""How the router process is tuned for serving, whatever drives the core: the
garbage collector's settings (the benchmarks of the pure core use the same)."""

from __future__ import annotations

import gc

# Young-generation threshold of the cyclic garbage collector while the router serves.
# Each loop iteration builds and drops thousands of container objects (events,
# commands, log dicts, delivery records); with CPython's default of 700 net
# allocations a gen-0 collection ran every ~130 messages and, with the survivors'
# gen-1/gen-2 passes, cost ~1.2 µs per message at K=1 exactly-once. Almost nothing
# the router allocates is cyclic (records, commands and log dicts are freed by
# reference counting), so collecting less often only delays freeing the rare cycle.
GC_GEN0_THRESHOLD = 10_000


def tune_gc_for_serving() -> None:
    """Called once by ``eorouter run`` before the loop starts (not by tests that embed
    the adapter): freeze everything loaded so far (modules, config: never garbage)
    out of the collector's sight, and raise the gen-0 threshold."""
    gc.collect()
    gc.freeze()
    _, gen1, gen2 = gc.get_threshold()
    gc.set_threshold(GC_GEN0_THRESHOLD, gen1, gen2)
