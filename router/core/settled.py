"""What a router remembers of deliveries it settled and forgot, per publisher stream
(docs/resumption.md, "What a publisher may rely on").

A publisher that fails over resends every delivery it has not seen settled. Some
of them the network may have finished while it was cut off: a router that took
part must recognise such a resend and answer it with the outcome it was settled
with, never deliver it again. How many of one stream's deliveries can be settled
and still unseen by its publisher is bounded by that stream alone: the publisher
only heard nothing after some moment, and after that moment the router could
settle at most what the publisher then had unsettled plus what its credit then
allowed, together at most ``max_in_flight_per_topic`` (the router never lets a
topic's unsettled deliveries and outstanding credit exceed it). So each stream
keeps the outcomes of at least its last ``keep`` settled deliveries, however busy
the router's other streams are.

A stream is remembered while it is in use here and for ``horizon`` (seconds,
counted in sweeps of a quarter of it) after its last settlement; then it is
forgotten, and its id kept as *forgotten*, so that a resend of it is refused
visibly ("beyond the horizon") instead of being taken for a new delivery. The
forgotten ids are bounded too (``forgotten_kept``); once one is dropped, a resent
delivery of a stream not known here can only be judged by its incarnation's mint
time: minted before the newest dropped id was forgotten, it might be one of those
and is refused; minted after, it cannot be, and is new here.

Pure: no clock (the core passes ``now`` to ``sweep``), no I/O.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable

from router.core import tags

# The verdicts of resend_verdict()
KNOWN = "known"  # remembered settled: answer with the remembered outcome
NEW = "new"  # certainly never settled here: take it as a new delivery
BEYOND_HORIZON = "beyond-horizon"  # maybe settled here and forgotten: refuse it
SWEEPS_PER_HORIZON = 4
# What is kept of a settled tag: its final outcome code (None: not known here), or
# (that, reuse) when the tag was used again (reuse != 0).
_Settled = int | tuple[int | None, int] | None


class StreamSettled:
    """One stream's settled tags, each with the final outcome code (None when this
    router never learnt it), in two generations: at least the last ``keep`` and up
    to twice as many; when the current one is full it becomes the previous one and
    the older goes whole (no per-entry eviction churn)."""

    __slots__ = ("current", "previous", "sweep", "partial")

    def __init__(self, sweep: int, partial: bool = False):
        self.current: dict[bytes, _Settled] = {}
        self.previous: dict[bytes, _Settled] = {}
        self.sweep = sweep  # the sweep number of its last settlement
        # Remembered again after it was forgotten: until a whole generation (keep
        # settlements) is new, a tag missing here may be one it forgot.
        self.partial = partial

    def get(self, tag: bytes) -> _Settled:
        value = self.current.get(tag)
        return self.previous.get(tag) if value is None else value

    def __len__(self) -> int:
        return len(self.current) + len(self.previous)


class SettledMemory:
    """Settled tags per stream, forgotten streams, and the sweep that expires them."""

    # What the core's compiled twin reads per completed delivery, in plain slots (by
    # offset, router/core/_attrs.h); everything else in the instance's dict.
    __slots__ = ("keep", "sweeps", "__dict__")

    def __init__(self, keep: int, horizon: float, max_streams: int, forgotten_kept: int):
        self.keep = keep
        self.horizon = horizon
        self.max_streams = max_streams
        self.forgotten_kept = forgotten_kept
        self.streams: dict[bytes, StreamSettled] = {}
        # stream id -> (wall time it was forgotten, the highest stream_seq seen of
        # it), oldest first (dicts keep insertion order)
        self.forgotten: OrderedDict[bytes, tuple[float, int]] = OrderedDict()
        # When the newest forgotten id that had to be dropped was forgotten (0: none
        # dropped yet): streams minted before it may be ones we no longer know.
        self.dropped_up_to = 0.0
        self.sweeps = 0

    # ------------------------------------------------------------ the usual path

    def memory_of(self, stream: bytes) -> StreamSettled:
        """The stream's memory, made (empty) when there is none: the core keeps a
        reference to it on the stream's publisher link and records, which the usual
        path adds to directly (the stream is in use, so no sweep forgets it)."""
        memory = self.streams.get(stream)
        if memory is None:
            forgot = bool(self.forgotten) and self.forgotten.pop(stream, None) is not None
            memory = self.streams[stream] = StreamSettled(self.sweeps, forgot or self.may_have_forgotten(stream))
        return memory

    def add(self, tag: bytes, outcome: int | None = None, reuse: int = 0) -> None:
        """Remember ``tag`` settled with ``outcome``; ``reuse``: which use of the tag
        (docs/tags.md), kept (as a pair with the outcome) only when not 0."""
        memory = self.memory_of(tag[: tags.STREAM_ID_SIZE])
        memory.sweep = self.sweeps
        current = memory.current
        current[tag] = (outcome, reuse) if reuse else outcome
        if len(current) >= self.keep:
            memory.previous = current
            memory.current = {}
            memory.partial = False

    def __contains__(self, tag: bytes) -> bool:
        memory = self.streams.get(tag[: tags.STREAM_ID_SIZE])
        return memory is not None and (tag in memory.current or tag in memory.previous)

    def outcome_of(self, tag: bytes) -> int | None:
        """The final outcome code ``tag`` was settled with, if known here."""
        memory = self.streams.get(tag[: tags.STREAM_ID_SIZE])
        value = memory.get(tag) if memory is not None else None
        return value[0] if isinstance(value, tuple) else value  # the same test here (no tuple subclass)

    def reuse_of(self, tag: bytes) -> int:
        """Which use of ``tag`` (by its publisher, on one link incarnation) was settled."""
        memory = self.streams.get(tag[: tags.STREAM_ID_SIZE])
        value = memory.get(tag) if memory is not None else None
        return value[1] if type(value) is tuple else 0

    def __len__(self) -> int:
        """Settled tags held, over every stream (a count for tests and metrics)."""
        return sum(len(m) for m in self.streams.values())

    # ------------------------------------------------------------ resends

    def resend_verdict(self, tag: bytes, incarnation: str | None) -> str:
        """What a resumed publisher's resend of ``tag``, not held in a record here,
        is to this router: KNOWN (settled, remembered), NEW, or BEYOND_HORIZON."""
        stream = tag[: tags.STREAM_ID_SIZE]
        memory = self.streams.get(stream)
        if memory is not None:
            if tag in memory.current or tag in memory.previous:
                return KNOWN
            return BEYOND_HORIZON if memory.partial else NEW
        if stream in self.forgotten:
            return BEYOND_HORIZON
        if self.dropped_up_to:
            minted = tags.incarnation_minted(incarnation)
            if minted is None or minted <= self.dropped_up_to + MINT_CLOCK_SLACK:
                return BEYOND_HORIZON
        return NEW

    def may_have_forgotten(self, stream: bytes) -> bool:
        """Whether ``stream``, not remembered and not among the forgotten ids, may be
        one whose id was dropped: only once some were (its mint time is not known
        here, so any may be)."""
        return self.dropped_up_to > 0

    def last_seq_forgotten(self, stream: bytes) -> int | None:
        entry = self.forgotten.get(stream)
        return entry[1] if entry is not None else None

    # ------------------------------------------------------------ expiry

    def sweep_interval(self) -> float:
        return self.horizon / SWEEPS_PER_HORIZON

    def sweep(self, now: float, in_use: Callable[[bytes], bool], last_seq: Callable[[bytes], int]) -> list[bytes]:
        """One sweep: forget the streams not in use (``in_use(stream)``) whose last
        settlement is a horizon old, and, over ``max_streams``, the least recently
        settled ones not in use. ``last_seq(stream)``: its highest stream_seq, kept
        with the forgotten id. Returns the streams forgotten."""
        self.sweeps += 1
        cutoff = self.sweeps - SWEEPS_PER_HORIZON
        gone = [s for s, m in self.streams.items() if m.sweep <= cutoff and not in_use(s)]
        over = len(self.streams) - len(gone) - self.max_streams
        if over > 0:
            expiring = set(gone)
            spare = sorted((m.sweep, s) for s, m in self.streams.items() if s not in expiring and not in_use(s))
            gone += [s for _, s in spare[:over]]
        for stream in gone:
            del self.streams[stream]
            self.forgotten[stream] = (now, last_seq(stream))
        while len(self.forgotten) > self.forgotten_kept:
            _, (when, _) = self.forgotten.popitem(last=False)
            self.dropped_up_to = max(self.dropped_up_to, when)
        return gone


# How far apart two routers' wall clocks may be for the mint-time rule (a resend of
# a stream minted this close to the newest dropped forgotten id is refused).
MINT_CLOCK_SLACK = 60.0
