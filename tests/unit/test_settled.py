"""The settled-delivery memory per publisher stream (router/core/settled.py),
against a reference model that remembers everything (issue 16, part 1).

Safety: a resend of a delivery this router settled, within the last ``keep`` of its
stream, is never taken as new (KNOWN with its outcome, or BEYOND_HORIZON, a visible
refusal) however many other streams settled meanwhile. Liveness: while its stream
has not been quiet for a horizon (and no limit forgot it), it is KNOWN.
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from router.core import outcomes, tags
from router.core.settled import BEYOND_HORIZON, KNOWN, NEW, SWEEPS_PER_HORIZON, SettledMemory

HORIZON = 40.0  # a sweep every 10 s


def stream_of(n: int) -> bytes:
    return tags.stream_id("P", f"link-{n}", f"boot.{n}.0")


def tag_of(n: int, ptag: int) -> bytes:
    return tags.outgoing_tag(stream_of(n), str(ptag).encode())


def test_each_stream_keeps_its_own_last_keep_however_busy_the_others_are():
    memory = SettledMemory(keep=3, horizon=HORIZON, max_streams=100, forgotten_kept=100)
    for n in range(5):
        memory.add(tag_of(0, n), outcomes.ACCEPTED)
    for n in range(100_000):  # another stream settles a great deal meanwhile
        memory.add(tag_of(1, n), outcomes.ACCEPTED)
    assert all(tag_of(0, n) in memory for n in (2, 3, 4))
    assert memory.resend_verdict(tag_of(0, 4), None) == KNOWN
    assert memory.outcome_of(tag_of(0, 3)) == outcomes.ACCEPTED
    assert len(memory.streams[stream_of(1)]) <= 6, "each stream holds at most twice its keep"


def test_a_quiet_stream_is_forgotten_after_its_horizon_and_its_resends_are_refused():
    memory = SettledMemory(keep=10, horizon=HORIZON, max_streams=100, forgotten_kept=100)
    memory.add(tag_of(0, 1), outcomes.ACCEPTED)
    now = 1000.0
    for _ in range(SWEEPS_PER_HORIZON - 1):
        now += 10
        assert memory.sweep(now, lambda s: False, lambda s: 7) == []
    now += 10
    assert memory.sweep(now, lambda s: False, lambda s: 7) == [stream_of(0)]
    assert memory.resend_verdict(tag_of(0, 1), None) == BEYOND_HORIZON
    assert memory.resend_verdict(tag_of(0, 2), None) == BEYOND_HORIZON, "it cannot tell: it refuses"
    assert memory.last_seq_forgotten(stream_of(0)) == 7
    assert memory.resend_verdict(tag_of(5, 1), "boot.5.0") == NEW, "a stream it never saw"


def test_a_stream_in_use_is_never_forgotten():
    memory = SettledMemory(keep=10, horizon=HORIZON, max_streams=100, forgotten_kept=100)
    memory.add(tag_of(0, 1), outcomes.ACCEPTED)
    for n in range(20):
        memory.sweep(1000.0 + n * 10, lambda s: s == stream_of(0), lambda s: -1)
    assert memory.resend_verdict(tag_of(0, 1), None) == KNOWN


def test_over_the_stream_limit_the_quietest_are_forgotten_first():
    memory = SettledMemory(keep=10, horizon=HORIZON, max_streams=2, forgotten_kept=100)
    for n in range(4):
        memory.add(tag_of(n, 1), outcomes.ACCEPTED)
        memory.sweep(1000.0 + n, lambda s: False, lambda s: -1)
    assert set(memory.streams) == {stream_of(2), stream_of(3)}
    assert memory.resend_verdict(tag_of(0, 1), None) == BEYOND_HORIZON


def test_once_forgotten_ids_are_dropped_the_mint_time_decides():
    memory = SettledMemory(keep=10, horizon=HORIZON, max_streams=1, forgotten_kept=1)
    memory.add(tag_of(0, 1), outcomes.ACCEPTED)
    memory.add(tag_of(1, 1), outcomes.ACCEPTED)
    memory.add(tag_of(2, 1), outcomes.ACCEPTED)
    memory.sweep(5000.0, lambda s: False, lambda s: -1)  # forgets two, keeps one id of them
    assert memory.dropped_up_to == 5000.0
    unknown = tags.outgoing_tag(tags.stream_id("Q", "x", "b.1.1"), b"1")
    assert memory.resend_verdict(unknown, "b.1.4000") == BEYOND_HORIZON, "minted before: it might be one"
    assert memory.resend_verdict(unknown, "b.1") == BEYOND_HORIZON, "no mint time: it might be one"
    assert memory.resend_verdict(unknown, "b.1.9000") == NEW, "minted after every dropped id"


def test_a_reused_tag_keeps_its_use_count_and_outcome():
    memory = SettledMemory(keep=2, horizon=HORIZON, max_streams=10, forgotten_kept=10)
    memory.add(tag_of(0, 1), outcomes.ACCEPTED)
    memory.add(tag_of(0, 2), outcomes.REJECTED, reuse=2)  # fills the generation: it rolls over
    memory.add(tag_of(0, 3))
    assert [memory.outcome_of(tag_of(0, n)) for n in (1, 2, 3, 4)] == [outcomes.ACCEPTED, outcomes.REJECTED, None, None]
    assert [memory.reuse_of(tag_of(0, n)) for n in (1, 2, 3)] == [0, 2, 0]
    memory.add(tag_of(0, 4))  # rolls again: 1 and 2 are forgotten
    assert tag_of(0, 1) not in memory and memory.outcome_of(tag_of(0, 2)) is None and tag_of(0, 3) in memory


operations = st.lists(
    st.one_of(
        st.tuples(st.just("settle"), st.integers(0, 3), st.sampled_from([outcomes.ACCEPTED, outcomes.REJECTED])),
        st.tuples(st.just("sweep"), st.integers(0, 3), st.just(0)),
        st.tuples(st.just("use"), st.integers(0, 3), st.booleans()),
    ),
    max_size=200,
)


@settings(max_examples=300, deadline=None)
@given(st.integers(1, 6), st.integers(1, 4), st.integers(1, 3), operations)
def test_never_new_for_a_settled_delivery_within_its_streams_last_keep(keep, max_streams, forgotten_kept, ops):
    memory = SettledMemory(keep=keep, horizon=HORIZON, max_streams=max_streams, forgotten_kept=forgotten_kept)
    now = 1000.0
    settled: dict[int, list] = {n: [] for n in range(4)}  # the model: every settlement, in order
    minted = {n: now - 1 for n in range(4)}  # every stream was minted before it settled anything
    last_settle_sweep = {}
    in_use: set = set()
    remembered_from = {n: 0 for n in range(4)}  # where its history starts since it was last forgotten
    counter = 0
    for op, n, arg in ops:
        if op == "settle":
            counter += 1
            tag = tag_of(n, counter)
            memory.add(tag, arg)
            settled[n].append((tag, arg))
            last_settle_sweep[n] = memory.sweeps
        elif op == "use":
            (in_use.add if arg else in_use.discard)(stream_of(n))
        else:
            now += HORIZON / SWEEPS_PER_HORIZON
            gone = memory.sweep(now, lambda s: s in in_use, lambda s: -1)
            assert not set(gone) & in_use, "a stream in use is never forgotten"
            for m in range(4):
                if stream_of(m) in gone:
                    remembered_from[m] = len(settled[m])
        for m, history in settled.items():
            incarnation = f"boot.{m}.{int(minted[m])}"
            for tag, outcome in history[-keep:]:
                verdict = memory.resend_verdict(tag, incarnation)
                assert verdict in (KNOWN, BEYOND_HORIZON), (m, verdict, "a settled delivery taken as new")
                if verdict == KNOWN:
                    assert memory.outcome_of(tag) == outcome
            quiet = memory.sweeps - last_settle_sweep.get(m, memory.sweeps)
            if history and quiet < SWEEPS_PER_HORIZON and len(memory.streams) <= max_streams and stream_of(m) in memory.streams:
                recent = history[max(remembered_from[m], len(history) - keep) :]
                assert all(memory.resend_verdict(t, incarnation) == KNOWN for t, _ in recent)
        assert len(memory.forgotten) <= forgotten_kept
