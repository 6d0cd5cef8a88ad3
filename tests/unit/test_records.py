"""DeliveryRecord's shared empty containers (router/core/records.py)."""

import pytest

from router.core import records
from router.core.records import EMPTY_MAP, EMPTY_SET, DeliveryRecord, MovedState, RouterState


def _record(tag: bytes = b"t") -> DeliveryRecord:
    return DeliveryRecord(tag, "topic", 1, b"payload", "pub", "link", b"1", "inc", 1, 1, 1, None)


def test_fresh_records_share_the_read_only_empties():
    a, b = _record(b"a"), _record(b"b")
    for r in (a, b):
        assert r.remote_routers is EMPTY_MAP and r.moved is EMPTY_MAP and r.targeted is EMPTY_MAP
        assert r.settle_pending is EMPTY_SET
        assert not r.remote_routers and not r.moved and not r.targeted and not r.settle_pending
        assert r.every_receiver_knows_settled()


def test_a_write_that_bypasses_own_fails_loudly():
    r = _record()
    with pytest.raises(TypeError):
        r.moved["k"] = MovedState()
    with pytest.raises(AttributeError):
        r.settle_pending.discard("x")


def test_own_gives_each_record_its_own_container():
    a, b = _record(b"a"), _record(b"b")
    a.own_moved()["k"] = MovedState()
    a.own_remote_routers()["B"] = RouterState()
    a.own_targeted()["k"] = "B"
    assert set(a.moved) == {"k"} and set(a.remote_routers) == {"B"} and a.targeted == {"k": "B"}
    assert a.own_moved() is a.moved  # the same dict from then on
    assert b.moved is EMPTY_MAP and b.remote_routers is EMPTY_MAP and b.targeted is EMPTY_MAP
    assert len(records.EMPTY_MAP) == 0 and len(records.EMPTY_SET) == 0


def test_recent_tags_keeps_at_least_the_last_keep_and_at_most_twice_that():
    from router.core.router import RecentTags
    recent = RecentTags(3)
    for n in range(10):
        recent.add(bytes([n]))
        assert all(bytes([m]) in recent for m in range(max(0, n - 2), n + 1)), n
        assert len(recent) <= 6
    assert bytes([0]) not in recent


def test_recent_tags_remember_each_tags_outcome_and_reuse_across_a_roll():
    from router.core import outcomes
    from router.core.router import RecentTags
    recent = RecentTags(2)
    recent.add(b"a", outcomes.ACCEPTED)
    recent.add(b"b", outcomes.REJECTED, reuse=2)  # fills the generation: it rolls over
    recent.add(b"c")
    assert [recent.outcome_of(t) for t in (b"a", b"b", b"c", b"x")] == [
        outcomes.ACCEPTED, outcomes.REJECTED, None, None]
    assert [recent.reuse_of(t) for t in (b"a", b"b", b"c")] == [0, 2, 0]
    recent.add(b"d")  # rolls again: a and b are forgotten
    assert b"a" not in recent and recent.outcome_of(b"b") is None and b"c" in recent
