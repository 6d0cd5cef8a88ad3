"""The delivery rule, end to end: a real router process, python-qpid-proton clients.

A publisher hears its outcome only when every subscriber owed the message reached a
terminal outcome: accepted only if all accepted, otherwise the most severe
(rejected > modified > released). No subscribers: the configured answer (released by
default). Pre-settled publishers get best effort. rcv-settle-mode=second subscribers
see settlement only after the publisher settled. Expired messages are not forwarded.

Negative checks ("still no outcome") use ``amqp.pump(HOLD)``: on loopback the router
answers in milliseconds, so ``HOLD`` seconds without an answer is strong evidence
that it is (correctly) waiting, not slow.
"""

from __future__ import annotations

import time

import pytest
from amqpclients import assert_round_trip, unique
from proton import Link, Message

from router.eventlog import read_events

pytestmark = pytest.mark.timeout(90)

HOLD = 0.5  # seconds a negative check waits (see module docstring)
N = 3


def subscribers(amqp, router, topic, n=N, **kw):
    """``n`` subscribers of ``topic``, each on its own connection, all attached."""
    return [amqp.connect(router.url).subscriber(topic, **kw) for _ in range(n)]


def wait_received(amqp, subs, count):
    amqp.wait(
        lambda: all(len(s.received) >= count for s in subs),
        what=f"every subscriber to receive {count} message(s): {[len(s.received) for s in subs]}",
    )


# --------------------------------------------------------------------------- fan-out


def test_fan_out_each_subscriber_gets_every_message_once_in_order(router, amqp):
    topic = unique("fanout")
    subs = subscribers(amqp, router, topic, auto_accept=True)
    pub = amqp.connect(router.url).publisher(topic)
    count = 20
    sent = [pub.send(f"m{i}") for i in range(count)]
    amqp.wait(lambda: all(s.outcome for s in sent), what="an outcome for every message")
    assert [s.outcome for s in sent] == ["accepted"] * count
    # Negative check: nothing more (no duplicate, no redelivery) turns up afterwards.
    amqp.pump(HOLD)
    expected = [f"m{i}" for i in range(count)]
    for sub in subs:
        assert sub.bodies() == expected
        assert len({r.tag for r in sub.received}) == count, "outgoing tags must be distinct"
    # One record per publisher delivery, one outgoing (disambiguated) tag for all subscribers.
    assert [r.tag for r in subs[0].received] == [r.tag for r in subs[1].received] == [r.tag for r in subs[2].received]
    assert all(len(r.tag) <= 32 for r in subs[0].received)


def test_publisher_reattach_same_name_gets_fresh_tags(router, amqp):
    """proton restarts tags at "1" on every new link: a re-attached publisher (same
    container-id + link name) must not be confused with its earlier incarnation, even
    while the earlier delivery is unsettled."""
    topic, cid, name = unique("reinc"), unique("reinc-client"), unique("reinc-link")
    sub = amqp.connect(router.url).subscriber(topic, auto_accept=True)
    first = amqp.connect(router.url, container_id=cid).publisher(topic, name=name, auto_settle=False)
    one = first.send("one")  # tag b"1"
    amqp.wait(lambda: one.outcome, what="first incarnation's outcome")
    first.conn.close()  # never settled it
    second = amqp.connect(router.url, container_id=cid).publisher(topic, name=name)
    two = second.send("two")  # tag b"1" again
    assert one.tag == two.tag == b"1"
    amqp.wait(lambda: two.outcome, what="second incarnation's outcome")
    assert two.outcome == "accepted"
    assert sub.bodies() == ["one", "two"]
    assert sub.received[0].tag != sub.received[1].tag


def test_two_publishers_one_topic_each_in_order(router, amqp):
    topic = unique("twopub")
    subs = subscribers(amqp, router, topic, n=2, auto_accept=True)
    pub_a = amqp.connect(router.url).publisher(topic)
    pub_b = amqp.connect(router.url).publisher(topic)
    sent = []
    for i in range(10):
        sent.append(pub_a.send(f"a{i}"))
        sent.append(pub_b.send(f"b{i}"))
    amqp.wait(lambda: all(s.outcome for s in sent), what="outcomes for both publishers")
    assert {s.outcome for s in sent} == {"accepted"}
    for sub in subs:
        bodies = sub.bodies()
        assert sorted(bodies) == sorted(f"{p}{i}" for p in "ab" for i in range(10))
        assert [b for b in bodies if b[0] == "a"] == [f"a{i}" for i in range(10)]
        assert [b for b in bodies if b[0] == "b"] == [f"b{i}" for i in range(10)]
    # Publishers reuse proton's tags "1", "2", ...: the outgoing tags must still differ.
    assert len({r.tag for r in subs[0].received}) == 20


def test_topics_are_isolated(router, amqp):
    topic_a, topic_b = unique("iso-a"), unique("iso-b")
    sub_a = amqp.connect(router.url).subscriber(topic_a, auto_accept=True)
    sub_b = amqp.connect(router.url).subscriber(topic_b, auto_accept=True)
    conn = amqp.connect(router.url)
    sent_a = conn.publisher(topic_a).send("for a")
    sent_b = conn.publisher(topic_b).send("for b")
    amqp.wait(lambda: sent_a.outcome and sent_b.outcome, what="both outcomes")
    assert (sent_a.outcome, sent_b.outcome) == ("accepted", "accepted")
    amqp.pump(HOLD)  # negative check: no cross-talk arrives late
    assert sub_a.bodies() == ["for a"] and sub_b.bodies() == ["for b"]


def test_message_content_relayed_intact_multi_frame(router, amqp):
    topic = unique("intact")
    sub = amqp.connect(router.url).subscriber(topic, auto_accept=True)
    pub = amqp.connect(router.url).publisher(topic)
    big = bytes(range(256)) * 800  # 200 KiB: several transfer frames each way
    msg = Message(
        body=big,
        subject="subj",
        id="msg-1",
        correlation_id="corr-1",
        content_type="application/octet-stream",
        durable=True,
        priority=7,
        properties={"app": "prop", "n": 42},
        annotations={"x-opt-mine": "kept"},
    )
    sent = pub.send(message=msg)
    amqp.wait(lambda: sent.outcome, what="outcome of a 200 KiB message")
    assert sent.outcome == "accepted"
    got = sub.received[0].message
    assert got.body == big
    assert (got.subject, got.id, got.correlation_id, got.content_type) == ("subj", "msg-1", "corr-1", "application/octet-stream")
    assert got.durable and got.priority == 7
    assert got.properties == {"app": "prop", "n": 42}
    assert got.annotations.get("x-opt-mine") == "kept", got.annotations


def test_drain_with_nothing_to_send_spends_credit(router, amqp):
    sub = amqp.connect(router.url).subscriber(unique("drain"), credit=0)
    sub.link.drain(10)
    amqp.flush()
    amqp.wait(lambda: sub.link.credit == 0 and not sub.link.draining(), what="the router to answer a drain with nothing to send")


# --------------------------------------------------------------------------- acceptance waits for all


def test_accepted_only_after_all_subscribers_accepted(router, amqp):
    topic = unique("allacc")
    subs = subscribers(amqp, router, topic)
    pub = amqp.connect(router.url).publisher(topic)
    sent = pub.send("x")
    wait_received(amqp, subs, 1)
    subs[0].accept(subs[0].received[0])
    subs[1].accept(subs[1].received[0])
    amqp.pump(HOLD)  # negative check: two of three accepted is not enough
    assert sent.outcome is None, f"publisher answered before the third subscriber: {sent!r}"
    subs[2].accept(subs[2].received[0])
    amqp.wait(lambda: sent.outcome, what="publisher outcome after the last accept")
    assert sent.outcome == "accepted"


def test_withheld_outcome_holds_publisher_then_release_gives_released(router, amqp):
    topic = unique("withhold")
    subs = subscribers(amqp, router, topic)
    pub = amqp.connect(router.url).publisher(topic)
    sent = pub.send("x")
    wait_received(amqp, subs, 1)
    subs[0].accept(subs[0].received[0])
    subs[1].accept(subs[1].received[0])
    amqp.pump(HOLD)  # negative check: subscriber 2 is withholding its outcome
    assert sent.outcome is None
    # ... and the hold is per delivery: the same topic keeps flowing meanwhile.
    later = pub.send("y")
    wait_received(amqp, subs, 2)
    for sub in subs:
        sub.accept(sub.received[1])
    amqp.wait(lambda: later.outcome, what="outcome of the second message")
    assert later.outcome == "accepted"
    assert sent.outcome is None
    subs[2].release(subs[2].received[0])
    amqp.wait(lambda: sent.outcome, what="publisher outcome after the release")
    assert sent.outcome == "released"


def test_rejection_does_not_short_circuit_the_wait(router, amqp):
    topic = unique("rejwait")
    subs = subscribers(amqp, router, topic)
    pub = amqp.connect(router.url).publisher(topic)
    sent = pub.send("x")
    wait_received(amqp, subs, 1)
    subs[0].reject(subs[0].received[0])
    amqp.pump(HOLD)  # negative check: the others have not answered yet
    assert sent.outcome is None, "the publisher must hear only after every subscriber answered"
    subs[1].accept(subs[1].received[0])
    subs[2].accept(subs[2].received[0])
    amqp.wait(lambda: sent.outcome, what="publisher outcome")
    assert sent.outcome == "rejected"


@pytest.mark.parametrize(
    "answers, expected",
    [
        (("accepted", "accepted", "accepted"), "accepted"),
        (("accepted", "accepted", "rejected"), "rejected"),
        (("released", "accepted", "accepted"), "released"),
        (("accepted", "released", "released"), "released"),
        (("released", "modified", "accepted"), "modified"),
        (("accepted", "released", "modified"), "modified"),
        (("rejected", "modified", "released"), "rejected"),
        (("modified", "rejected", "accepted"), "rejected"),
        # settled without a terminal outcome counts as released (docs/delivery-rule.md)
        (("accepted", "settle-only", "accepted"), "released"),
    ],
)
def test_outcome_priority(router, amqp, answers, expected):
    topic = unique("prio")
    subs = subscribers(amqp, router, topic, n=len(answers))
    pub = amqp.connect(router.url).publisher(topic)
    sent = pub.send("x")
    wait_received(amqp, subs, 1)
    for sub, answer in zip(subs, answers):
        assert sent.outcome is None
        sub.answer(sub.received[0], answer)
    amqp.wait(lambda: sent.outcome, what="publisher outcome")
    assert sent.outcome == expected, f"subscribers said {answers}"


def test_modified_merges_flags(router, amqp):
    topic = unique("modflags")
    subs = subscribers(amqp, router, topic)
    pub = amqp.connect(router.url).publisher(topic)
    sent = pub.send("x")
    wait_received(amqp, subs, 1)
    subs[0].modify(subs[0].received[0], failed=True)
    subs[1].modify(subs[1].received[0], undeliverable=True)
    subs[2].accept(subs[2].received[0])
    amqp.wait(lambda: sent.outcome, what="publisher outcome")
    assert sent.outcome == "modified"
    assert sent.delivery_failed and sent.undeliverable_here


def test_rejection_condition_reaches_publisher(router, amqp):
    topic = unique("rejcond")
    subs = subscribers(amqp, router, topic, n=2)
    pub = amqp.connect(router.url).publisher(topic)
    sent = pub.send("x")
    wait_received(amqp, subs, 1)
    subs[0].accept(subs[0].received[0])
    subs[1].reject(subs[1].received[0], condition="app:poison", description="cannot parse order")
    amqp.wait(lambda: sent.outcome, what="publisher outcome")
    assert sent.outcome == "rejected"
    assert sent.condition is not None and sent.condition.name == "app:poison", sent.condition


# --------------------------------------------------------------------------- no subscribers


def test_no_subscribers_gives_released_by_default(router, amqp):
    topic = unique("nosub")
    pub = amqp.connect(router.url).publisher(topic)
    sent = pub.send("x")
    amqp.wait(lambda: sent.outcome, what="publisher outcome with no subscribers")
    assert sent.outcome == "released"
    # Nobody was owed it: a subscriber attaching afterwards does not get it.
    sub = amqp.connect(router.url).subscriber(topic)
    amqp.pump(HOLD)  # negative check: nothing arrives
    assert sub.received == []


@pytest.mark.parametrize("answer", ["rejected", "accepted", "modified"])
def test_no_subscribers_answer_is_configurable(router_factory, amqp, answer):
    router = router_factory("NS", delivery={"no_subscribers": answer})
    pub = amqp.connect(router.url).publisher(unique("nosubcfg"))
    sent = pub.send("x")
    amqp.wait(lambda: sent.outcome, what="publisher outcome with no subscribers")
    assert sent.outcome == answer


def test_subscriber_that_left_is_no_longer_owed(router, amqp):
    topic = unique("left")
    sub = amqp.connect(router.url).subscriber(topic, auto_accept=True)
    sub.close()
    pub = amqp.connect(router.url).publisher(topic)
    sent = pub.send("x")
    amqp.wait(lambda: sent.outcome, what="publisher outcome")
    assert sent.outcome == "released", "no subscriber left: the no-subscribers answer"


# --------------------------------------------------------------------------- pre-settled publishers


def test_presettled_publisher_best_effort_never_waits(router, amqp):
    topic = unique("presettled")
    eager = amqp.connect(router.url).subscriber(topic, credit=100, auto_accept=True)
    withholding = amqp.connect(router.url).subscriber(topic, credit=100)  # never answers
    pub = amqp.connect(router.url).publisher(topic, presettled=True)
    for i in range(20):
        pub.send(f"p{i}")  # waits for credit: a held-up router would stall here
    amqp.wait(
        lambda: len(eager.received) == 20 and len(withholding.received) == 20,
        what=f"best-effort relay: {len(eager.received)}, {len(withholding.received)}",
    )
    expected = [f"p{i}" for i in range(20)]
    assert eager.bodies() == expected
    assert withholding.bodies() == expected
    assert all(r.arrived_settled for r in eager.received + withholding.received), (
        "a pre-settled publisher's messages are relayed pre-settled"
    )
    assert all(s.outcome is None for s in pub.sent)


def test_at_most_once_subscriber_is_never_owed(router, amqp):
    topic = unique("amo")
    amo = amqp.connect(router.url).subscriber(topic, at_most_once=True)
    normal = amqp.connect(router.url).subscriber(topic)
    pub = amqp.connect(router.url).publisher(topic)
    sent = pub.send("x")
    wait_received(amqp, [amo, normal], 1)
    assert amo.received[0].arrived_settled, "snd-settle-mode=settled: the copy comes pre-settled"
    normal.accept(normal.received[0])
    amqp.wait(lambda: sent.outcome, what="publisher outcome")
    assert sent.outcome == "accepted"


# --------------------------------------------------------------------------- settlement


def test_publisher_gets_its_outcome_settled_and_a_second_mode_subscriber_its_settlement(router, amqp):
    # Default: the router chooses rcv-settle-mode=first for publisher links that do not
    # speak the resume protocol, whatever they ask, and settles each delivery with its
    # final outcome.
    topic = unique("firstpub")
    second = amqp.connect(router.url).subscriber(topic, rcv_second=True)
    pub = amqp.connect(router.url).publisher(topic, auto_settle=False, rcv_second=True)
    assert pub.link.remote_rcv_settle_mode == Link.RCV_FIRST, "the router states the mode it uses"
    sent = pub.send("x")
    amqp.wait(lambda: second.received, what="subscriber receives")
    rec = second.received[0]
    second.accept(rec)  # rcv-settle-mode=second: outcome sent unsettled
    amqp.wait(lambda: sent.remote_settled, what="the publisher's outcome, settled")
    assert sent.outcome == "accepted"
    amqp.wait(lambda: rec.remote_settled, what="the settlement relayed to the rcv-second subscriber")
    assert rec.settled_state == "accepted", "the settling disposition echoes the subscriber's outcome"
    assert rec.locally_settled
    delivery = rec.tag.hex()
    settled = [e for e in router.events() if e["event"] == "settled" and e.get("delivery") == delivery]
    assert [e.get("by") for e in settled] == ["router"]


@pytest.mark.parametrize("resume", [False, True])
def test_a_resumable_publisher_asking_second_gets_the_two_step_settlement_by_default(router, amqp, resume):
    """A publisher that will resume resends what it has not seen settled: the router
    must not settle any subscriber's copy before the publisher settled
    (resumption.publisher_settles_first). eorouter:resume false: a first attach."""
    topic = unique("resumable")
    second = amqp.connect(router.url).subscriber(topic, rcv_second=True)
    props = {"eorouter:resume": resume}
    pub = amqp.connect(router.url).publisher(topic, auto_settle=False, rcv_second=True, properties=props)
    assert pub.link.remote_rcv_settle_mode == Link.RCV_SECOND
    sent = pub.send("x")
    amqp.wait(lambda: second.received, what="subscriber receives")
    rec = second.received[0]
    second.accept(rec)
    amqp.wait(lambda: sent.outcome, what="publisher outcome")
    assert sent.outcome == "accepted" and not sent.remote_settled
    amqp.pump(HOLD)  # negative check: the publisher has not settled, so neither may the router
    assert not rec.remote_settled, "router settled a subscriber's copy before the resumable publisher settled"
    pub.settle(sent)
    amqp.wait(lambda: rec.remote_settled, what="router relaying the publisher's settlement")
    settled = [e for e in router.events() if e["event"] == "settled" and e.get("delivery") == rec.tag.hex()]
    assert [e.get("by") for e in settled] == ["publisher"]


def test_a_resumable_publisher_asking_first_gets_first(router, amqp):
    topic = unique("resumable1st")
    pub = amqp.connect(router.url).publisher(topic, rcv_second=False, properties={"eorouter:resume": False})
    assert pub.link.remote_rcv_settle_mode == Link.RCV_FIRST


@pytest.fixture(scope="module")
def two_step_router(module_router_factory):
    return module_router_factory("TWO", delivery={"publisher_rcv_settle_mode": "as-requested"})


def test_rcv_settle_mode_second_settled_only_after_publisher_settled(two_step_router, amqp):
    router = two_step_router
    topic = unique("second")
    second = amqp.connect(router.url).subscriber(topic, rcv_second=True)
    first = amqp.connect(router.url).subscriber(topic, auto_accept=True)
    pub = amqp.connect(router.url).publisher(topic, auto_settle=False, rcv_second=True)
    assert pub.link.remote_rcv_settle_mode == Link.RCV_SECOND
    sent = pub.send("x")
    wait_received(amqp, [second, first], 1)
    rec = second.received[0]
    assert not rec.arrived_settled
    second.accept(rec)  # rcv-settle-mode=second: outcome sent unsettled
    amqp.wait(lambda: sent.outcome, what="publisher outcome")
    assert sent.outcome == "accepted"
    amqp.pump(HOLD)  # negative check: the publisher has not settled, so neither may the router
    assert not rec.remote_settled, "router settled a rcv-second delivery before the publisher settled"
    pub.settle(sent)
    amqp.wait(lambda: rec.remote_settled, what="router relaying the publisher's settlement")
    assert rec.locally_settled
    assert rec.settled_state == "accepted"


def test_publisher_gone_router_settles_on_its_behalf(two_step_router, amqp):
    router = two_step_router
    topic = unique("pubgone2nd")
    second = amqp.connect(router.url).subscriber(topic, rcv_second=True)
    pub = amqp.connect(router.url).publisher(topic, auto_settle=False, rcv_second=True)
    sent = pub.send("x")
    amqp.wait(lambda: len(second.received) == 1, what="subscriber receives")
    rec = second.received[0]
    second.accept(rec)
    amqp.wait(lambda: sent.outcome, what="publisher outcome")
    assert sent.outcome == "accepted"
    pub.conn.abort()  # the publisher never settles
    amqp.wait(lambda: rec.remote_settled, what="router settling for the vanished publisher")
    delivery = rec.tag.hex()
    settled = [e for e in router.events() if e["event"] == "settled" and e.get("delivery") == delivery]
    assert [e.get("by") for e in settled] == ["publisher-gone"]


# --------------------------------------------------------------------------- back-pressure


def test_slow_subscriber_throttles_publisher_credit(router_factory, amqp):
    router = router_factory("BP", limits={"max_in_flight_per_topic": 5, "publisher_credit_window": 5})
    topic = unique("slow")
    slow = amqp.connect(router.url).subscriber(topic, credit=100)  # answers only when told
    pub = amqp.connect(router.url).publisher(topic)
    sent = [pub.send(f"b{i}") for i in range(5)]
    amqp.wait(lambda: len(slow.received) == 5, what="the slow subscriber receives five")
    amqp.pump(HOLD)  # negative check: five in flight is the limit, no more credit comes
    assert pub.credit == 0, f"publisher holds {pub.credit} credit beyond the in-flight limit"
    # Other topics are not throttled by this one.
    assert_round_trip(amqp, router, "another topic while this one is at its limit")
    for rec in slow.received:
        slow.accept(rec)
    amqp.wait(lambda: all(s.outcome for s in sent), what="outcomes once the subscriber caught up")
    assert [s.outcome for s in sent] == ["accepted"] * 5
    amqp.wait(lambda: pub.credit > 0, what="credit returning to the publisher")
    more = pub.send("after")
    amqp.wait(lambda: len(slow.received) == 6, what="the next message flows")
    slow.accept(slow.received[-1])
    amqp.wait(lambda: more.outcome, what="outcome of the next message")
    assert more.outcome == "accepted"


# --------------------------------------------------------------------------- message expiry


def test_expired_message_not_forwarded_publisher_rejected(router, amqp):
    topic = unique("expired")
    sub = amqp.connect(router.url).subscriber(topic, auto_accept=True)
    pub = amqp.connect(router.url).publisher(topic)
    msg = Message(body="stale")
    msg.expiry_time = time.time() - 60  # absolute-expiry-time a minute ago
    sent = pub.send(message=msg)
    amqp.wait(lambda: sent.outcome, what="publisher outcome for an expired message")
    assert sent.outcome == "rejected"
    assert sent.condition is not None and sent.condition.name == "eorouter:ttl-expired", sent.condition
    amqp.pump(HOLD)  # negative check: it is not forwarded afterwards either
    assert sub.received == []
    fresh = pub.send("fresh")
    amqp.wait(lambda: fresh.outcome, what="outcome of the next message")
    assert fresh.outcome == "accepted" and sub.bodies() == ["fresh"]


def test_ttl_expires_while_waiting_for_credit(router, amqp):
    topic = unique("ttl")
    sub = amqp.connect(router.url).subscriber(topic, credit=0, auto_accept=True)
    pub = amqp.connect(router.url).publisher(topic)
    msg = Message(body="short-lived")
    msg.ttl = 0.5
    sent = pub.send(message=msg)
    # The ttl has to pass before the subscriber offers credit: here waiting is the point.
    amqp.pump(1.0)
    sub.flow(10)
    amqp.wait(lambda: sent.outcome, what="publisher outcome for a message whose ttl passed")
    assert sent.outcome == "rejected"
    assert sent.condition is not None and sent.condition.name == "eorouter:ttl-expired", sent.condition
    amqp.pump(HOLD)  # negative check: the subscriber, now with credit, does not get it
    assert sub.received == []


# --------------------------------------------------------------------------- subscribers leaving


@pytest.mark.parametrize("how", ["close-link", "detach-link", "close-connection", "abort-connection"])
def test_non_durable_subscriber_leaving_stops_counting(router, amqp, how):
    topic = unique("leave")
    stays = amqp.connect(router.url).subscriber(topic, auto_accept=True)
    leaves = amqp.connect(router.url).subscriber(topic)  # receives, never answers
    pub = amqp.connect(router.url).publisher(topic)
    sent = pub.send("x")
    wait_received(amqp, [stays, leaves], 1)
    amqp.pump(HOLD)  # negative check: held for the silent subscriber
    assert sent.outcome is None
    {
        "close-link": leaves.close,
        "detach-link": leaves.detach,
        "close-connection": leaves.conn.close,
        "abort-connection": leaves.conn.abort,
    }[how]()
    amqp.wait(lambda: sent.outcome, what=f"publisher outcome after the subscriber left ({how})")
    assert sent.outcome == "accepted", "the remaining subscriber accepted; the one that left is not owed"
    assert_round_trip(amqp, router)


# --------------------------------------------------------------------------- event log


def _by_kind(events):
    kinds: dict[str, list[dict]] = {}
    for event in events:
        kinds.setdefault(event["event"], []).append(event)
    return kinds


def test_event_log_tells_the_delivery_story(router, amqp):
    topic = unique("log")
    subs = subscribers(amqp, router, topic, n=2, auto_accept=True)
    pub = amqp.connect(router.url).publisher(topic)
    sent = pub.send("logged")
    amqp.wait(lambda: sent.outcome, what="publisher outcome")
    assert sent.outcome == "accepted"
    delivery = subs[0].received[0].tag.hex()
    assert subs[1].received[0].tag.hex() == delivery
    # Write discipline: the events leading to an outcome reach the OS before the outcome
    # is sent, so they are in the file now (no polling).
    events = router.events()
    story = [e for e in events if e.get("delivery") == delivery]
    kinds = _by_kind(story)
    assert len(kinds.get("received", [])) == 1, story
    assert len(kinds.get("sub-outcome", [])) == 2, story
    assert len(kinds.get("pub-outcome", [])) == 1, story
    keys = sorted(f"{sub.conn.container_id}/{sub.name}" for sub in subs)
    received = kinds["received"][0]
    assert sorted(received.get("owed") or []) == keys, "owed lists both subscriptions"
    # Both had credit: the immediate sends are folded into the received event.
    assert sorted(received.get("forwarded") or []) == keys
    assert "forwarded" not in kinds, "no separate forwarded events for immediate sends"
    assert sorted(e.get("subscriber") for e in kinds["sub-outcome"]) == keys
    assert all(e.get("outcome") == "accepted" for e in kinds["sub-outcome"] + kinds["pub-outcome"])
    seq = {k: [e["seq"] for e in v] for k, v in kinds.items()}
    assert max(seq["received"]) < min(seq["sub-outcome"])
    # The last sub-outcome and the pub-outcome are one "completed" line (same seq).
    assert sorted(seq["sub-outcome"])[0] < max(seq["sub-outcome"]) == min(seq["pub-outcome"])
    raw = [e for e in read_events(router.data_dir, raw=True) if e.get("delivery") == delivery]
    assert [e["event"] for e in raw] == ["received", "sub-outcome", "completed"]
    for event in story:
        for key in ("seq", "ts", "router", "epoch", "boot", "event", "delivery"):
            assert key in event, f"{key!r} missing from {event}"
        assert event["router"] == router.id
        assert event["epoch"] == router.epoch
    # seq numbers are unique within one epoch of the whole log (per line: the events of
    # a folded line share its seq) and have no gaps
    this_epoch = [e["seq"] for e in read_events(router.data_dir, raw=True) if e.get("epoch") == router.epoch]
    assert this_epoch == list(range(1, len(this_epoch) + 1))

    # The record is settled and deleted: at once (the subscribers settled first, so they
    # know), or after record_linger (2 s).
    def record_gone():
        story = [e for e in router.events() if e.get("delivery") == delivery]
        return any(e["event"] == "record-deleted" or (e["event"] == "settled" and e.get("deleted")) for e in story)

    amqp.wait(record_gone, timeout=15, what="the delivery's record deleted")


def test_event_log_records_links_and_start(router, amqp):
    topic = unique("loglinks")
    sub = amqp.connect(router.url).subscriber(topic)
    sub.close()
    amqp.wait(lambda: "link-detached" in {e["event"] for e in router.events()}, timeout=5, what="link-detached in the event log")
    kinds = _by_kind(router.events())
    assert kinds.get("router-started"), "router-started missing"
    assert kinds.get("link-attached")
