"""Latency buckets kept as plain numbers on the router's own thread.

The event loop and the event log time themselves (a loop iteration, a flush, an
fsync) far more often than anyone reads the result, so they only count: one
``bisect`` and two additions per observation, no lock, no object per sample.
router/adapter/metrics.py turns a copy into a Prometheus histogram when scraped.
"""

from __future__ import annotations

from bisect import bisect_left

#: Seconds, from 10 µs (one iteration of an idle loop) to 10 s (a stalled disk).
LATENCY_BOUNDS = (1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 10.0)


class Buckets:
    """Counts of observations at or below each bound (Prometheus' ``le``), and their sum."""

    __slots__ = ("bounds", "counts", "sum")

    def __init__(self, bounds: tuple[float, ...] = LATENCY_BOUNDS) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)  # the last: above every bound (+Inf)
        self.sum = 0.0

    def observe(self, value: float) -> None:
        self.counts[bisect_left(self.bounds, value)] += 1
        self.sum += value

    def cumulative(self) -> list[tuple[str, int]]:
        """``[(le, count of observations <= le), ..., ("+Inf", all)]``."""
        out, running = [], 0
        for bound, n in zip((*(repr(b) for b in self.bounds), "+Inf"), self.counts):
            running += n
            out.append((bound, running))
        return out
