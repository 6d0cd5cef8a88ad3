"""DeliveryRecord's shared empty containers and its compact form (router/core/records.py)."""

import pytest

from router.core import records
from router.core.links import Subscription
from router.core.outcomes import OUTCOME_ACCEPTED
from router.core.records import (
    ANSWER_ACCEPTED,
    ANSWER_DONE,
    ANSWER_UNSENT,
    EMPTY_MAP,
    EMPTY_SET,
    DeliveryRecord,
    MovedState,
    Roster,
    RouterState,
    SubscriberState,
)


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


def _roster() -> Roster:
    subs = []
    for name, link in (("a", 5), ("b", None), ("c", 7)):
        sub = Subscription(f"c/{name}", "c", name, "topic")
        sub.link_id = link
        subs.append(sub)
    return Roster(subs)


def _fields(states: dict) -> dict:
    return {key: tuple(getattr(state, name) for name in SubscriberState.__slots__) for key, state in states.items()}


def test_a_roster_is_a_snapshot_of_the_owed_subscriptions():
    roster = _roster()
    assert roster.keys == ["c/a", "c/b", "c/c"]
    assert roster.links == (5, 0, 7)  # 0: detached
    assert roster.index == {"c/a": 0, "c/b": 1, "c/c": 2}
    assert roster.all_done == bytes([ANSWER_DONE] * 3)
    roster.subs[0].link_id = 9  # a later change is not in it: the topic builds a new one
    assert roster.links == (5, 0, 7)


def test_a_compact_record_expands_to_the_states_it_stands_for():
    r = _record()
    r.roster = _roster()
    r.answers = bytearray([ANSWER_DONE, ANSWER_UNSENT, ANSWER_ACCEPTED])
    r.sent_at = 42
    assert r.compact and r.owed_count() == 3
    view = r.expanded_states()
    assert r.compact and r._states is None  # reading it leaves the record as it is
    a, b, c = view["c/a"], view["c/b"], view["c/c"]
    assert (a.outcome, a.remote_settled, a.sent, a.link) == (OUTCOME_ACCEPTED, True, 42, 5)
    assert (b.outcome, b.remote_settled, b.sent, b.link) == (None, False, 0, 0)
    assert (c.outcome, c.remote_settled, c.sent, c.link) == (OUTCOME_ACCEPTED, False, 42, 7)
    for state in view.values():
        assert not (state.known_settled or state.settle_relayed or state.resend)
    states = r.subscribers  # the general form, for good
    assert not r.compact and r.roster is None and r.answers is None
    assert list(states) == ["c/a", "c/b", "c/c"] and _fields(states) == _fields(view)
    assert r.subscribers is states and r.owed_count() == 3
    states["c/b"].outcome = OUTCOME_ACCEPTED
    assert r.subscribers["c/b"].outcome is OUTCOME_ACCEPTED


def test_a_record_never_distributed_owes_nobody():
    r = _record()
    assert not r.compact and r.expanded_states() == {} and r.owed_count() == 0
    assert r.subscribers == {} and r.every_receiver_knows_settled()
    relay = _record(b"r")
    relay.owe_no_subscriber()  # a router that only relays it: the empty map from the start
    assert not relay.compact and relay.subscribers == {} and relay.owed_count() == 0
    assert ANSWER_ACCEPTED & ANSWER_DONE and not ANSWER_UNSENT & ANSWER_DONE
