"""The delivery rule, driven through the pure core with exact command lists."""

from __future__ import annotations

import subprocess
import sys

import pytest
from corekit import Harness, decode, encode, one_by_one
from hypothesis import given, settings
from hypothesis import strategies as st

from router.core import outcomes, tags
from router.core.commands import (
    DetachLink,
    Drained,
    Forward,
    GrantCredit,
    OpenLink,
    SendOutcome,
    SettleOutgoing,
    ShutdownComplete,
    SubOutcomes,
)
from router.core.events import (
    DURABLE_CONFIGURATION,
    DURABLE_UNSETTLED_STATE,
    ExpireSubscription,
    MessageTooLarge,
    OutcomeReceived,
)
from router.core.message import read_origin
from router.core.router import INCARNATION_PROPERTY

INCARNATION_1 = "b00t.1.1000"  # boot id, counter, mint time (the harness starts at now=1000)


def stream_tag(pub_tag: bytes, container="pub", name="p1", incarnation=INCARNATION_1) -> bytes:
    return tags.outgoing_tag(tags.stream_id(container, name, incarnation), pub_tag)


def forwarded(commands):
    return [c for c in commands if isinstance(c, Forward)]


def outcomes_sent(commands):
    return [c for c in commands if isinstance(c, SendOutcome)]


def test_attach_publisher_opens_with_incarnation_and_grants_window():
    h = Harness(publisher_credit_window=100)
    assert h.attach_publisher(1) == [OpenLink(1, 0, {INCARNATION_PROPERTY: INCARNATION_1}), GrantCredit(1, 100)]


def test_one_subscriber_full_life_of_a_delivery():
    h = Harness()
    h.attach_publisher(1)
    assert h.attach_subscriber(2) == [OpenLink(2, 0, None)]
    assert h.credit(2, 10) == []
    delivery, commands = h.publish(1, b"1", body="hello")
    tag = stream_tag(b"1")
    assert [type(c) for c in commands] == [Forward]
    (fwd,) = commands
    assert (fwd.link_id, fwd.tag, fwd.settled) == (2, tag, False)
    message = decode(fwd.payload)
    assert message.body == "hello"
    origin = read_origin(fwd.payload)
    assert (origin.container_id, origin.link_name, origin.tag, origin.ingress_router) == ("pub", "p1", b"1", "A")
    assert h.answer(2, tag) == [SendOutcome(delivery, outcomes.ACCEPTED)]
    assert h.core.record_count() == 1
    # The subscriber settled its copy with its answer (rcv-settle-mode=first): the
    # adapter settled ours then, so there is no settlement to relay; the record goes.
    assert h.settle(1, delivery) == []
    assert h.core.record_count() == 0
    # The subscriber's accept completed the delivery: one "completed" line stands for
    # its sub-outcome and the pub-outcome; the publisher's settle comes later.
    assert h.log_kinds() == ["link-attached", "link-attached", "received", "completed", "settled"]
    assert h.logs[3].fields == {
        "delivery": tag.hex(),
        "subscriber": "sub/s2",
        "outcome": "accepted",
        "settled": True,
        "pub_outcome": "accepted",
    }
    received, settled = h.logs[2].fields, h.logs[-1].fields
    assert (received["owed"], received["forwarded"]) == (["sub/s2"], ["sub/s2"])
    assert settled["deleted"] is True
    ids = {entry.fields["delivery"] for entry in h.logs if "delivery" in entry.fields}
    assert ids == {tag.hex()}


def test_accepted_only_after_every_subscriber_accepted():
    h = Harness()
    h.attach_publisher(1)
    for link in (2, 3, 4):
        h.attach_subscriber(link)
        h.credit(link, 5)
    delivery, commands = h.publish(1, b"1")
    assert [c.link_id for c in forwarded(commands)] == [2, 3, 4]
    tag = stream_tag(b"1")
    assert h.answer(2, tag) == []
    assert h.answer(3, tag) == []
    assert h.answer(4, tag) == [SendOutcome(delivery, outcomes.ACCEPTED)]


def test_the_usual_path_keeps_records_compact_until_they_go():
    """Every subscriber accepts and settles, one by one and in the adapter's batches:
    no record is ever expanded to SubscriberStates (records.py, the compact form)."""
    h = Harness()
    h.attach_publisher(1, rcv_first=True)
    for link in (2, 3, 4):
        h.attach_subscriber(link)
        h.credit(link, 10)
    deliveries = {}
    for n in (b"1", b"2", b"3"):
        delivery, commands = h.publish(1, n)
        assert [c.link_id for c in forwarded(commands)] == [2, 3, 4]
        deliveries[stream_tag(n)] = delivery
    t1, t2, t3 = deliveries

    def all_compact():
        return all(r.compact and r._states is None for r in h.core.records.values())

    assert h.core.record_count() == 3 and all_compact()
    assert h.answer(2, t1) == [] and all_compact()
    assert h.accepted_batch([3, t1, True, 3, t2, True, 2, t2, True, 2, t3, True]) == [] and all_compact()
    assert h.accepted_batch([4, t2, True, 4, t1, True]) == [
        SendOutcome(deliveries[t2], outcomes.ACCEPTED, True),
        SendOutcome(deliveries[t1], outcomes.ACCEPTED, True),
    ]
    assert h.core.record_count() == 1 and all_compact()
    assert h.answer(3, t3) == [] and h.answer(4, t3) == [SendOutcome(deliveries[t3], outcomes.ACCEPTED, True)]
    assert h.core.record_count() == 0
    assert h.log_kinds()[-7:] == [
        "sub-outcome",
        "sub-outcomes",
        "sub-outcomes",
        "completed",
        "completed",
        "sub-outcome",
        "completed",
    ]


def _accepted_batch_against_events(steps, cuts, pub_settled_first=(), rcv_first=True):
    """Run ``steps`` ((link, pub_tag, settled) accepted dispositions) through
    handle(OutcomeReceived) one by one and through accepted_batch() in the batches
    ``cuts`` makes; return both command lists (flattened) and the batch run's raw ones."""
    results = []
    for batched in (False, True):
        h = Harness()
        h.attach_publisher(1, rcv_first=rcv_first)
        for link in (2, 3, 4):
            h.attach_subscriber(link)
            h.credit(link, 5)
        deliveries = {ptag: h.publish(1, ptag)[0] for ptag in (b"1", b"2", b"3")}
        for ptag in pub_settled_first:
            h.settle(1, deliveries[ptag])
        items = [x for link, ptag, settled in steps for x in (link, stream_tag(ptag), settled)]
        commands = []
        if batched:
            start = 0
            for cut in [*sorted(cuts), len(steps)]:
                out = []
                h.core.accepted_batch(items[3 * start : 3 * cut], h.now, out)
                commands.extend(out)
                start = max(start, cut)
        else:
            for i in range(0, len(items), 3):
                commands.extend(h.core.handle(OutcomeReceived(items[i], items[i + 1], outcomes.ACCEPTED, items[i + 2]), h.now))
        # Then the publisher settles what it has not: what the core does then depends
        # on what it remembered of the subscribers' settlements.
        for ptag, delivery in deliveries.items():
            if ptag not in pub_settled_first:
                commands.extend(h.settle(1, delivery))
        results.append((commands, _core_state(h.core)))
    (events, events_state), (batched, batched_state) = results
    assert batched_state == events_state
    return events, one_by_one(batched), batched


def _core_state(core) -> dict:
    return {
        tag: (
            r.outcome,
            r.waiting,
            r.pub_settled,
            {key: (s.outcome, s.remote_settled, s.known_settled, s.settle_relayed) for key, s in r.subscribers.items()},
        )
        for tag, r in core.records.items()
    }


def test_accepted_batch_answers_as_the_events_do():
    """RouterCore.accepted_batch() (the adapter's call for the accepted dispositions it
    read in one go) gives the commands handle(OutcomeReceived(..., ACCEPTED, ...))
    gives for each, in the same order; a subscriber's consecutive lines come as one
    SubOutcomes."""
    steps = [
        (2, b"1", True),
        (2, b"2", True),
        (2, b"3", True),
        (3, b"2", False),
        (3, b"1", True),
        (3, b"2", True),
        (9, b"1", True),
        (2, b"x", True),
        (4, b"1", False),
        (4, b"1", True),
        (4, b"2", True),
        (3, b"3", True),
        (4, b"3", True),
    ]
    events, flat, batched = _accepted_batch_against_events(steps, cuts=[])
    assert flat == events
    assert [c.__class__.__name__ for c in flat].count("SendOutcome") == 3
    runs = [c for c in batched if isinstance(c, SubOutcomes)]
    assert [(len(r.deliveries), r.subscriber, r.settled) for r in runs][0] == (3, "sub/s2", True)


@settings(max_examples=200)
@given(
    steps=st.lists(
        st.tuples(st.sampled_from([2, 3, 4, 9]), st.sampled_from([b"1", b"2", b"3", b"x"]), st.booleans()), max_size=14
    ),
    cuts=st.lists(st.integers(min_value=0, max_value=14), max_size=4),
    pub_settled_first=st.lists(st.sampled_from([b"1", b"2"]), max_size=2, unique=True),
    rcv_first=st.booleans(),
)
def test_accepted_batch_equals_the_events_in_any_batches(steps, cuts, pub_settled_first, rcv_first):
    events, flat, _ = _accepted_batch_against_events(steps, cuts, pub_settled_first, rcv_first)
    assert flat == events


def test_the_last_of_several_accepts_answers_even_after_a_release_elsewhere():
    h = Harness()
    h.attach_publisher(1)
    for link in (2, 3, 4):
        h.attach_subscriber(link)
        h.credit(link, 5)
    delivery, _ = h.publish(1, b"1")
    tag = stream_tag(b"1")
    assert h.answer(3, tag) == []
    assert h.answer(2, tag, outcomes.RELEASED) == []
    assert h.answer(4, tag) == [SendOutcome(delivery, outcomes.RELEASED)]


def test_one_release_among_accepts_gives_released():
    h = Harness()
    h.attach_publisher(1)
    for link in (2, 3):
        h.attach_subscriber(link)
        h.credit(link, 5)
    delivery, _ = h.publish(1, b"1")
    tag = stream_tag(b"1")
    (record,) = h.core.records.values()
    assert h.answer(2, tag, settled=False) == [] and record.compact  # accepted, unsettled: still compact
    assert h.answer(3, tag, outcomes.RELEASED) == [SendOutcome(delivery, outcomes.RELEASED)]
    # Anything but an accept turns the record into SubscriberStates, with what the bytes said.
    assert not record.compact
    assert {k: (s.outcome.code, s.remote_settled) for k, s in record.subscribers.items()} == {
        "sub/s2": (outcomes.ACCEPTED, False),
        "sub/s3": (outcomes.RELEASED, True),
    }
    # The publisher settles: sub/s2 did not settle its copy, so the settlement is relayed to it.
    assert h.settle(1, delivery) == [SettleOutgoing(2, tag)]


def test_rejection_wins_and_carries_its_condition():
    h = Harness()
    h.attach_publisher(1)
    for link in (2, 3, 4):
        h.attach_subscriber(link)
        h.credit(link, 5)
    delivery, _ = h.publish(1, b"1")
    tag = stream_tag(b"1")
    h.answer(2, tag, outcomes.RELEASED)
    h.answer(3, tag, outcomes.REJECTED, condition="app:bad", description="nope")
    assert h.answer(4, tag, outcomes.MODIFIED, delivery_failed=True) == [
        SendOutcome(delivery, outcomes.REJECTED, False, "app:bad", "nope")
    ]


def test_modified_flags_are_merged():
    h = Harness()
    h.attach_publisher(1)
    for link in (2, 3):
        h.attach_subscriber(link)
        h.credit(link, 5)
    delivery, _ = h.publish(1, b"1")
    tag = stream_tag(b"1")
    h.answer(2, tag, outcomes.MODIFIED, delivery_failed=True)
    assert h.answer(3, tag, outcomes.MODIFIED, undeliverable_here=True) == [
        SendOutcome(delivery, outcomes.MODIFIED, False, None, None, True, True)
    ]


@pytest.mark.parametrize("answer", ["released", "rejected", "accepted", "modified"])
def test_no_subscribers_answer_is_configurable(answer):
    h = Harness(no_subscribers=outcomes.BY_NAME[answer])
    h.attach_publisher(1)
    delivery, commands = h.publish(1, b"1")
    (sent,) = outcomes_sent(commands)
    assert (sent.delivery, sent.outcome) == (delivery, outcomes.BY_NAME[answer])


def test_subscriber_without_credit_holds_the_publisher_and_gets_it_later():
    h = Harness()
    h.attach_publisher(1)
    h.attach_subscriber(2)
    delivery, commands = h.publish(1, b"1")
    assert commands == []
    (fwd,) = h.credit(2, 1)
    assert fwd.tag == stream_tag(b"1")
    assert h.answer(2, fwd.tag) == [SendOutcome(delivery, outcomes.ACCEPTED)]


def test_queued_deliveries_go_out_in_publisher_order():
    h = Harness()
    h.attach_publisher(1)
    h.attach_subscriber(2)
    for n in range(5):
        h.publish(1, str(n).encode())
    sent = forwarded(h.credit(2, 3)) + forwarded(h.credit(2, 2))
    assert [decode(f.payload).body for f in sent] == ["m"] * 5
    assert [f.tag for f in sent] == [stream_tag(str(n).encode()) for n in range(5)]


def test_drain_with_nothing_queued_spends_credit():
    h = Harness()
    h.attach_subscriber(2)
    assert h.credit(2, 7, drain=True) == [Drained(2)]


def test_slow_subscriber_throttles_publisher_credit():
    h = Harness(max_in_flight_per_topic=4, publisher_credit_window=4)
    assert h.attach_publisher(1)[-1] == GrantCredit(1, 4)
    h.attach_subscriber(2)
    deliveries = [h.publish(1, str(n).encode())[0] for n in range(4)]
    # Four unsettled deliveries: the topic is at its bound, so no more credit.
    assert not any(isinstance(c, GrantCredit) for c in h.credit(2, 1))
    tag0 = stream_tag(b"0")
    h.answer(2, tag0)
    assert h.settle(1, deliveries[0])[-1] == GrantCredit(1, 1)


def test_credit_limited_by_the_bound_comes_in_batches_of_an_eighth_window():
    h = Harness(max_in_flight_per_topic=16, publisher_credit_window=16)
    assert h.attach_publisher(1)[-1] == GrantCredit(1, 16)
    h.attach_subscriber(2)
    h.credit(2, 100)
    deliveries = [h.publish(1, str(n).encode())[0] for n in range(16)]
    grants = []
    for n, delivery in enumerate(deliveries[:4]):
        h.answer(2, stream_tag(str(n).encode()))
        grants.append([c for c in h.settle(1, delivery) if isinstance(c, GrantCredit)])
    # Not one credit per settled delivery: two at a time (16 / 8), within the bound.
    assert grants == [[], [GrantCredit(1, 2)], [], [GrantCredit(1, 2)]]


def test_credit_is_shared_among_publishers_of_a_topic():
    h = Harness(max_in_flight_per_topic=100, publisher_credit_window=250)
    assert h.attach_publisher(1)[-1] == GrantCredit(1, 100)
    grants = [c for c in h.attach_publisher(2, name="other") if isinstance(c, GrantCredit)]
    assert grants == []  # the first publisher still holds the whole bound


def test_non_durable_detach_stops_counting():
    h = Harness()
    h.attach_publisher(1)
    h.attach_subscriber(2)
    h.attach_subscriber(3)
    h.credit(2, 5)
    h.credit(3, 5)
    delivery, _ = h.publish(1, b"1")
    h.answer(2, stream_tag(b"1"))
    assert outcomes_sent(h.detach(3)) == [SendOutcome(delivery, outcomes.ACCEPTED)]


@pytest.mark.parametrize("durable", [DURABLE_CONFIGURATION, DURABLE_UNSETTLED_STATE])
def test_durable_reattach_receives_what_it_missed_in_order(durable):
    h = Harness()
    h.attach_publisher(1)
    h.attach_subscriber(2, name="d", durable=durable, timeout=30)
    h.credit(2, 10)
    d0, (f0,) = h.publish(1, b"0")
    h.detach(2)
    d1, c1 = h.publish(1, b"1")
    d2, c2 = h.publish(1, b"2")
    assert c1 == c2 == []  # owed to the detached durable subscriber, not forwarded
    assert outcomes_sent(h.advance(10)) == []
    assert h.attach_subscriber(5, name="d", durable=durable, timeout=30) == [OpenLink(5, 30, None)]
    sent = forwarded(h.credit(5, 10))
    assert [f.tag for f in sent] == [stream_tag(b"0"), stream_tag(b"1"), stream_tag(b"2")]
    results = [outcomes_sent(h.answer(5, f.tag)) for f in sent]
    assert results == [[SendOutcome(d, outcomes.ACCEPTED)] for d in (d0, d1, d2)]
    assert h.log_kinds().count("link-attached") == 3


def test_durable_subscription_expires_and_stops_holding_the_publisher():
    h = Harness()
    h.attach_publisher(1)
    h.attach_subscriber(2, name="d", durable=DURABLE_CONFIGURATION, timeout=5)
    h.attach_subscriber(3)
    h.credit(3, 5)
    h.detach(2)
    delivery, _ = h.publish(1, b"1")
    h.answer(3, stream_tag(b"1"))
    assert h.core.next_deadline() == pytest.approx(h.now + 5)
    assert outcomes_sent(h.advance(4.9)) == []
    assert outcomes_sent(h.advance(0.2)) == [SendOutcome(delivery, outcomes.ACCEPTED)]
    assert "subscription-expired" in h.log_kinds()


def test_an_operator_expires_an_away_durable_subscription_now():
    """ExpireSubscription (management) ends a detached durable subscription at
    once, as its timeout would: the publisher's delivery stops waiting for it. It
    does nothing to an attached subscription, nor to an unknown key."""
    h = Harness()
    h.attach_publisher(1)
    h.attach_subscriber(2, name="d", durable=DURABLE_CONFIGURATION, timeout=3600)
    h.attach_subscriber(3, name="live", durable=DURABLE_CONFIGURATION, timeout=3600)
    h.credit(3, 5)
    h.detach(2)
    delivery, _ = h.publish(1, b"1")
    h.answer(3, stream_tag(b"1"))
    assert h.do(ExpireSubscription("sub/nobody")) == []
    assert h.do(ExpireSubscription("sub/live")) == []  # attached: untouched
    assert "sub/live" in h.core.subscriptions
    assert outcomes_sent(h.do(ExpireSubscription("sub/d"))) == [SendOutcome(delivery, outcomes.ACCEPTED)]
    assert "sub/d" not in h.core.subscriptions and "subscription-expired" in h.log_kinds()


def test_closing_a_durable_link_ends_the_subscription():
    h = Harness()
    h.attach_publisher(1)
    h.attach_subscriber(2, name="d", durable=DURABLE_CONFIGURATION, timeout=60)
    h.detach(2, closed=True)
    delivery, commands = h.publish(1, b"1")
    assert outcomes_sent(commands) == [SendOutcome(delivery, outcomes.RELEASED)]


def test_durable_terminus_timeout_is_bounded():
    h = Harness(default_terminus_timeout=60, max_terminus_timeout=100)
    assert h.attach_subscriber(2, name="a", durable=DURABLE_CONFIGURATION)[0] == OpenLink(2, 60, None)
    assert h.attach_subscriber(3, name="b", durable=DURABLE_CONFIGURATION, timeout=500)[0] == OpenLink(3, 100, None)
    assert h.attach_subscriber(4, name="c", durable=DURABLE_CONFIGURATION, expiry_policy="never")[0] == OpenLink(4, 100, None)


def test_second_link_with_same_identity_steals_the_first():
    h = Harness()
    h.attach_publisher(1)
    h.attach_subscriber(2, name="s", container="c")
    h.credit(2, 5)
    h.publish(1, b"1")
    commands = h.attach_subscriber(3, name="s", container="c")
    assert commands[0] == DetachLink(
        2, "amqp:link:stolen", "a newer link with the same container-id and name attached", close=False
    )
    # The newer link takes over the terminus: what the old one held unanswered is resent.
    assert commands[1:] == [OpenLink(3, 0, None)]
    (fwd,) = h.credit(3, 5)
    assert fwd.tag == stream_tag(b"1")
    assert outcomes_sent(h.answer(3, fwd.tag)) == [SendOutcome(1, outcomes.ACCEPTED)]


def test_publisher_link_stolen():
    h = Harness()
    h.attach_publisher(1, name="p")
    commands = h.attach_publisher(2, name="p")
    assert commands[0].link_id == 1 and commands[0].condition == "amqp:link:stolen"


def test_rcv_settle_second_sees_settlement_only_after_publisher_and_record_needs_evidence():
    h = Harness(record_linger=30)
    h.attach_publisher(1)
    h.attach_subscriber(2, rcv_second=True)
    h.credit(2, 10)
    d1, _ = h.publish(1, b"1")
    t1 = stream_tag(b"1")
    assert h.answer(2, t1, settled=False) == [SendOutcome(d1, outcomes.ACCEPTED)]
    assert h.settle(1, d1) == [SettleOutgoing(2, t1)]
    assert h.core.record_count() == 1  # it may not have seen our settlement yet
    d2, _ = h.publish(1, b"2")
    h.answer(2, stream_tag(b"2"), settled=False)
    # Answering a delivery sent after our settlement proves it saw the settlement.
    assert h.core.record_count() == 1
    assert [e.fields["reason"] for e in h.logs if e.kind == "record-deleted"] == ["receivers-know-settled"]


def test_a_copy_queued_for_credit_is_sent_and_answered_on_the_compact_record():
    # A subscriber out of credit: its copy waits in its queue. Sent when credit comes,
    # the record stays compact (one answer byte per subscriber), so its answer takes
    # the compact path like any other.
    h = Harness()
    h.attach_publisher(1, rcv_first=True)
    h.attach_subscriber(2)
    h.attach_subscriber(3)
    h.credit(3, 10)
    delivery, commands = h.publish(1, b"1")
    tag = stream_tag(b"1")
    assert commands == [Forward(3, tag, commands[0].payload, False)]
    assert h.credit(2, 1) == [Forward(2, tag, commands[0].payload, False)]
    record = h.core.records[tag]
    assert record.compact and record.waiting == 2
    assert h.logs[-1].kind == "forwarded" and h.logs[-1].fields["subscriber"] == "sub/s2"
    assert h.accepted_batch([3, tag, True]) == []
    assert h.accepted_batch([2, tag, True]) == [SendOutcome(delivery, outcomes.ACCEPTED, True)]
    assert h.core.record_count() == 0


def test_a_queued_copy_sent_after_a_relayed_settlement_is_evidence_of_it():
    # The subscriber's copy of d2 waits for credit while d1's settlement is relayed to
    # it; d2 then goes out after that settlement, so its answer proves the subscriber
    # saw it. The compact record's one send count (d2's distribution, before the
    # settlement) would not prove it: that copy is sent on the general path.
    h = Harness(record_linger=30)
    h.attach_publisher(1)
    h.attach_subscriber(2, rcv_second=True)
    h.credit(2, 1)
    d1, _ = h.publish(1, b"1")
    d2, queued = h.publish(1, b"2")
    assert queued == []
    t1, t2 = stream_tag(b"1"), stream_tag(b"2")
    assert h.answer(2, t1, settled=False) == [SendOutcome(d1, outcomes.ACCEPTED)]
    assert h.settle(1, d1) == [SettleOutgoing(2, t1)]
    assert [type(c) for c in h.credit(2, 1)] == [Forward]
    h.answer(2, t2, settled=False)
    assert t1 not in h.core.records
    assert [e.fields["reason"] for e in h.logs if e.kind == "record-deleted"] == ["receivers-know-settled"]


def test_rcv_first_publisher_gets_its_outcome_settled_and_that_settles_the_delivery():
    # rcv-settle-mode=first (every client's default): AMQP has the receiver settle
    # spontaneously. The final outcome goes out settled, and that is the delivery's
    # settlement: the subscriber's copy is settled at once, with no publisher settle.
    h = Harness()
    h.attach_publisher(1, rcv_first=True)
    h.attach_subscriber(2)
    h.credit(2, 10)
    delivery, _ = h.publish(1, b"1")
    tag = stream_tag(b"1")
    assert h.answer(2, tag) == [SendOutcome(delivery, outcomes.ACCEPTED, True)]
    assert h.core.record_count() == 0  # the subscriber settled first: it knows
    # One line for the subscriber's accept, the publisher's outcome and the settlement.
    assert h.log_kinds()[-2:] == ["received", "completed"]
    assert h.logs[-1].fields == {
        "delivery": tag.hex(),
        "subscriber": "sub/s2",
        "outcome": "accepted",
        "settled": True,
        "pub_outcome": "accepted",
        "by": "router",
        "deleted": True,
    }
    assert h.settle(1, delivery) == []  # a crossing settle from the publisher changes nothing


def test_rcv_first_publisher_gets_a_rejection_settled_too():
    h = Harness(record_linger=30)
    h.attach_publisher(1, rcv_first=True)
    h.attach_subscriber(2, rcv_second=True)
    h.attach_subscriber(3)
    h.credit(2, 10)
    h.credit(3, 10)
    delivery, _ = h.publish(1, b"1")
    tag = stream_tag(b"1")
    assert h.answer(3, tag) == []
    # The second-mode subscriber holds its copy unsettled until the delivery is settled.
    assert h.answer(2, tag, outcomes.REJECTED, settled=False, condition="app:bad", description="no") == [
        SendOutcome(delivery, outcomes.REJECTED, True, "app:bad", "no"),
        SettleOutgoing(2, tag),
    ]
    assert h.core.record_count() == 1  # 2 has not yet shown it saw the settlement


def test_rcv_first_publisher_released_at_shutdown_is_settled():
    h = Harness()
    h.attach_publisher(1, rcv_first=True)
    h.attach_subscriber(2)
    h.credit(2, 5)
    d1, _ = h.publish(1, b"1")
    assert h.shutdown(grace=3) == []
    commands = h.advance(3.1)
    assert commands == [SendOutcome(d1, outcomes.RELEASED, True), SettleOutgoing(2, stream_tag(b"1")), ShutdownComplete()]


def test_last_delivery_record_lingers_then_goes():
    h = Harness(record_linger=2.0)
    h.attach_publisher(1)
    h.attach_subscriber(2, rcv_second=True)
    h.credit(2, 10)
    d1, _ = h.publish(1, b"1")
    h.answer(2, stream_tag(b"1"), settled=False)
    h.settle(1, d1)
    assert h.core.record_count() == 1
    h.advance(2.1)
    assert h.core.record_count() == 0


def test_presettled_publisher_is_best_effort():
    h = Harness()
    h.attach_publisher(1, settled=True)
    h.attach_subscriber(2)
    h.attach_subscriber(3)
    h.credit(2, 5)
    _, commands = h.publish(1, b"1", settled=True)
    assert [(f.link_id, f.settled) for f in commands] == [(2, True)]  # 3 has no credit: dropped, not waited for
    assert h.core.record_count() == 0


def test_best_effort_subscriber_is_not_owed():
    h = Harness()
    h.attach_publisher(1)
    h.attach_subscriber(2, best_effort=True)
    h.credit(2, 5)
    delivery, commands = h.publish(1, b"1")
    assert [type(c) for c in commands] == [SendOutcome, Forward]
    assert commands[0] == SendOutcome(delivery, outcomes.RELEASED)
    assert commands[1].settled


def test_message_ttl_expires_while_queued():
    h = Harness()
    h.attach_publisher(1)
    h.attach_subscriber(2)
    delivery, commands = h.publish(1, b"1", ttl=1.5)
    assert commands == []
    assert outcomes_sent(h.advance(1.6)) == [
        SendOutcome(delivery, outcomes.REJECTED, False, outcomes.EXPIRED, "message expired before it reached every subscriber")
    ]
    assert forwarded(h.credit(2, 5)) == []


def test_already_expired_message_is_rejected_at_once():
    h = Harness()
    h.attach_publisher(1)
    h.attach_subscriber(2)
    h.credit(2, 5)
    delivery, commands = h.publish(1, b"1", expiry_time=h.now - 1)
    assert forwarded(commands) == []
    (sent,) = outcomes_sent(commands)
    assert (sent.outcome, sent.condition, sent.settle) == (outcomes.REJECTED, outcomes.EXPIRED, True)


def test_malformed_message_is_rejected_and_nothing_else_changes():
    h = Harness()
    h.attach_publisher(1)
    h.attach_subscriber(2)
    h.credit(2, 5)
    delivery, commands = h.publish(1, b"1", payload=b"\x00\x53\x77\xa1\xff")
    (sent,) = outcomes_sent(commands)
    assert (sent.outcome, sent.condition) == (outcomes.REJECTED, "amqp:decode-error")
    assert h.core.record_count() == 0
    _, ok = h.publish(1, b"2")
    assert len(forwarded(ok)) == 1


def test_oversized_message_is_rejected():
    h = Harness(max_message_size=100)
    h.attach_publisher(1)
    commands = h.do(MessageTooLarge(1, 9, b"1", 101, False))
    (sent,) = outcomes_sent(commands)
    assert (sent.delivery, sent.outcome, sent.condition) == (9, outcomes.REJECTED, "amqp:link:message-size-exceeded")


def test_attach_without_address_is_refused():
    h = Harness()
    (detach,) = h.attach_subscriber(2, topic=None)
    assert detach.condition == "amqp:invalid-field" and detach.close


def test_tag_reuse_while_unsettled_is_refused():
    h = Harness()
    h.attach_publisher(1)
    h.attach_subscriber(2)
    h.publish(1, b"1")
    _, commands = h.publish(1, b"1")
    (sent,) = outcomes_sent(commands)
    assert sent.condition == "amqp:invalid-field"


def test_connection_loss_detaches_every_link_on_it():
    h = Harness()
    h.attach_publisher(1, conn=7)
    h.attach_subscriber(2, conn=7)
    h.attach_subscriber(3, conn=8)
    h.credit(3, 5)
    h.lose_connection(7)
    assert h.core.publishers == {} and list(h.core.subscribers) == [3]


def test_publisher_gone_records_are_finished_for_it():
    h = Harness()
    h.attach_publisher(1)
    h.attach_subscriber(2)
    h.credit(2, 5)
    h.publish(1, b"1")
    h.detach(1)
    h.answer(2, stream_tag(b"1"))
    assert "settled" not in h.log_kinds(), "it may still resume and resend"
    h.advance(8.1)  # publisher_resume_timeout
    kinds = h.log_kinds()
    assert "settled" in kinds and h.core.record_count() == 0


def test_closing_the_publisher_link_settles_for_it_at_once():
    h = Harness()
    h.attach_publisher(1)
    h.attach_subscriber(2)
    h.credit(2, 5)
    h.publish(1, b"1")
    h.detach(1, closed=True)
    h.answer(2, stream_tag(b"1"))
    assert "settled" in h.log_kinds() and h.core.record_count() == 0


def test_shutdown_answers_what_is_in_flight_then_completes():
    h = Harness()
    h.attach_publisher(1)
    h.attach_subscriber(2)
    h.credit(2, 5)
    d1, _ = h.publish(1, b"1")
    assert h.shutdown(grace=3) == []
    # New deliveries during the drain are released at once.
    d2, commands = h.publish(1, b"2")
    assert commands == [SendOutcome(d2, outcomes.RELEASED, True)]
    commands = h.advance(3.1)
    assert commands == [SendOutcome(d1, outcomes.RELEASED), ShutdownComplete()]


def test_shutdown_with_nothing_in_flight_completes_at_once():
    h = Harness()
    h.attach_publisher(1)
    assert h.shutdown() == [ShutdownComplete()]


def test_importing_the_core_does_not_import_proton():
    code = (
        "import sys, router.core.router, router.core.message, router.core.tags; "
        "assert not [m for m in sys.modules if m.startswith(('proton', 'cproton'))], 'proton imported'"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_expiry_policy_link_detach_with_no_timeout_ends_at_detach():
    h = Harness()
    h.attach_publisher(1)
    assert h.attach_subscriber(2, name="d", durable=DURABLE_CONFIGURATION, expiry_policy="link-detach")[0] == OpenLink(2, 0, None)
    h.detach(2)
    delivery, commands = h.publish(1, b"1")
    assert outcomes_sent(commands) == [SendOutcome(delivery, outcomes.RELEASED)]


def test_a_client_cannot_forge_the_origin_annotation():
    from router.core.message import Origin, prepare

    h = Harness()
    h.attach_publisher(1)
    h.attach_subscriber(2)
    h.credit(2, 5)
    forged = prepare(encode("x"), Origin("someone", "else", b"9", "i", "B")).payload
    delivery, commands = h.publish(1, b"1", payload=forged)
    (sent,) = outcomes_sent(commands)
    assert (sent.outcome, sent.condition) == (outcomes.REJECTED, "amqp:unauthorized-access")
    assert forwarded(commands) == []
