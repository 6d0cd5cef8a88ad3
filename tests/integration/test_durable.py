"""Durable subscriptions, end to end.

A receiver whose source terminus is durable (configuration = 1 or unsettled-state = 2)
with an expiry policy other than link-detach keeps its subscription when its link
detaches without closing (or its connection drops), for the terminus timeout. While
it is away, publisher outcomes for messages owed to it wait; when the same
container-id + link name re-attaches, it receives what it missed (deliveries still
unsettled at the publisher), in publisher order. Closing the link ends it.

Negative checks use ``amqp.pump(HOLD)``: on loopback the router answers in
milliseconds, so ``HOLD`` seconds of silence means it is waiting, not slow.
"""

from __future__ import annotations

import pytest
from amqpclients import TERMINAL, assert_round_trip, unique

pytestmark = pytest.mark.timeout(90)

HOLD = 0.5


def durable_subscriber(amqp, router, topic, container_id, name, durable=2, **kw):
    return amqp.connect(router.url, container_id=container_id).subscriber(topic, name=name, durable=durable, **kw)


def go_away(sub, how):
    """Leave without ending the durable terminus."""
    if how == "detach-link":
        sub.detach()
    elif how == "close-connection":
        sub.conn.close()
    elif how == "abort-connection":
        sub.conn.abort()
    else:
        raise ValueError(how)


@pytest.mark.parametrize("durable", [1, 2], ids=["configuration", "unsettled-state"])
@pytest.mark.parametrize("how", ["detach-link", "close-connection", "abort-connection"])
def test_reattach_receives_what_it_missed_in_order(router, amqp, durable, how):
    topic, cid, name = unique("dur"), unique("dur-client"), unique("dur-link")
    other = amqp.connect(router.url).subscriber(topic, auto_accept=True)
    first = durable_subscriber(amqp, router, topic, cid, name, durable, auto_accept=True)
    pub = amqp.connect(router.url).publisher(topic)
    before = pub.send("m1")
    amqp.wait(lambda: before.outcome, what="outcome while both are attached")
    assert before.outcome == "accepted"

    go_away(first, how)
    missed = [pub.send(f"m{i}") for i in range(2, 5)]
    amqp.wait(lambda: len(other.received) == 4, what="the attached subscriber to get m2..m4")
    amqp.pump(HOLD)  # negative check: the detached durable subscriber is still owed them
    assert [s.outcome for s in missed] == [None] * 3, missed

    again = durable_subscriber(amqp, router, topic, cid, name, durable, auto_accept=True)
    amqp.wait(lambda: all(s.outcome for s in missed), what="outcomes after re-attach")
    assert [s.outcome for s in missed] == ["accepted"] * 3
    amqp.pump(HOLD)  # negative check: nothing else (m1 was settled) is redelivered
    assert again.bodies() == ["m2", "m3", "m4"]
    # The outgoing tags are the ones the other subscriber saw for the same deliveries.
    assert [r.tag for r in again.received] == [r.tag for r in other.received[1:]]


def test_reattach_on_the_same_connection(router, amqp):
    topic, name = unique("samecon"), unique("samecon-link")
    conn = amqp.connect(router.url, container_id=unique("samecon-client"))
    first = conn.subscriber(topic, name=name, durable=2, auto_accept=True)
    pub = amqp.connect(router.url).publisher(topic)
    first.detach()
    missed = pub.send("while detached")
    amqp.pump(HOLD)  # negative check: owed to the detached subscription
    assert missed.outcome is None
    again = conn.subscriber(topic, name=name, durable=2, auto_accept=True)
    amqp.wait(lambda: missed.outcome, what="outcome after re-attach on the same connection")
    assert missed.outcome == "accepted" and again.bodies() == ["while detached"]


def test_reattach_after_the_publisher_left(router, amqp):
    """The publisher is gone, but its deliveries are still owed: the returning durable
    subscriber gets them (the router settles them for the publisher afterwards)."""
    topic, cid, name = unique("publeft"), unique("pl-client"), unique("pl-link")
    first = durable_subscriber(amqp, router, topic, cid, name)
    first.conn.close()
    pub = amqp.connect(router.url).publisher(topic)
    pub.send("orphan")
    pub.conn.close()
    again = durable_subscriber(amqp, router, topic, cid, name, auto_accept=True)
    amqp.wait(lambda: len(again.received) == 1, what="the orphaned delivery to reach the subscriber")
    assert again.bodies() == ["orphan"]
    amqp.wait(
        lambda: (
            again.received[0].remote_settled
            or any(
                e["event"] == "settled" and e.get("by") == "publisher-gone" and e.get("delivery") == again.received[0].tag.hex()
                for e in router.events()
            )
        ),
        what="the router settling for the departed publisher",
    )


def test_reattach_gets_in_doubt_delivery_again_first(router, amqp):
    topic, cid, name = unique("doubt"), unique("doubt-client"), unique("doubt-link")
    first = durable_subscriber(amqp, router, topic, cid, name)
    pub = amqp.connect(router.url).publisher(topic)
    in_doubt = pub.send("m1")
    amqp.wait(lambda: len(first.received) == 1, what="durable subscriber receives m1")
    first.conn.abort()  # m1 received but never answered: in doubt
    later = pub.send("m2")
    again = durable_subscriber(amqp, router, topic, cid, name, auto_accept=True)
    amqp.wait(lambda: in_doubt.outcome and later.outcome, what="outcomes after re-attach")
    assert (in_doubt.outcome, later.outcome) == ("accepted", "accepted")
    assert again.bodies() == ["m1", "m2"]
    assert again.received[0].tag == first.received[0].tag


def test_reattach_order_with_two_publishers(router, amqp):
    topic, cid, name = unique("dur2p"), unique("dur2p-client"), unique("dur2p-link")
    first = durable_subscriber(amqp, router, topic, cid, name, auto_accept=True)
    first.conn.close()
    pub_a = amqp.connect(router.url).publisher(topic)
    pub_b = amqp.connect(router.url).publisher(topic)
    sent = []
    for i in range(5):
        sent.append(pub_a.send(f"a{i}"))
        sent.append(pub_b.send(f"b{i}"))
    amqp.pump(HOLD)  # negative check: all owed to the absent durable subscriber
    assert all(s.outcome is None for s in sent)
    again = durable_subscriber(amqp, router, topic, cid, name, auto_accept=True)
    amqp.wait(lambda: all(s.outcome for s in sent), what="outcomes after re-attach")
    assert {s.outcome for s in sent} == {"accepted"}
    bodies = again.bodies()
    assert sorted(bodies) == sorted(f"{p}{i}" for p in "ab" for i in range(5))
    assert [b for b in bodies if b[0] == "a"] == [f"a{i}" for i in range(5)]
    assert [b for b in bodies if b[0] == "b"] == [f"b{i}" for i in range(5)]


def test_closing_a_durable_link_ends_the_subscription(router, amqp):
    topic, cid, name = unique("durclose"), unique("durclose-client"), unique("durclose-link")
    other = amqp.connect(router.url).subscriber(topic, auto_accept=True)
    durable = durable_subscriber(amqp, router, topic, cid, name)  # receives, never answers
    pub = amqp.connect(router.url).publisher(topic)
    sent = pub.send("x")
    amqp.wait(lambda: len(durable.received) == 1 and len(other.received) == 1, what="both receive")
    durable.close()  # detach with closed=true: the terminus, and the subscription, end
    amqp.wait(lambda: sent.outcome, what="publisher outcome after the durable link closed")
    assert sent.outcome == "accepted"
    after = pub.send("y")
    amqp.wait(lambda: after.outcome, what="next outcome")
    assert after.outcome == "accepted", "the closed subscription must not be owed new messages"
    again = durable_subscriber(amqp, router, topic, cid, name, auto_accept=True)
    amqp.pump(HOLD)  # negative check: a new subscription, nothing missed to replay
    assert again.received == []


def test_expiry_policy_link_detach_is_not_durable(router, amqp):
    topic, cid, name = unique("durlinkdetach"), unique("dld-client"), unique("dld-link")
    other = amqp.connect(router.url).subscriber(topic, auto_accept=True)
    sub = durable_subscriber(amqp, router, topic, cid, name, expiry_policy="link-detach")
    pub = amqp.connect(router.url).publisher(topic)
    sub.detach()
    sent = pub.send("x")
    amqp.wait(lambda: sent.outcome, what="publisher outcome")
    assert sent.outcome == "accepted", "expiry-policy link-detach: the subscription ended at detach"
    assert other.bodies() == ["x"]


def test_durable_subscription_expires_after_its_timeout(router, amqp):
    topic, cid, name = unique("durexp"), unique("durexp-client"), unique("durexp-link")
    other = amqp.connect(router.url).subscriber(topic, auto_accept=True)
    sub = durable_subscriber(amqp, router, topic, cid, name, timeout=1, expiry_policy="session-end")
    assert sub.link.remote_source.timeout == 1, "router should grant the requested 1 s timeout"
    sub.conn.close()
    pub = amqp.connect(router.url).publisher(topic)
    sent = pub.send("x")
    amqp.wait(lambda: len(other.received) == 1, what="attached subscriber receives")
    amqp.wait(lambda: sent.outcome, timeout=10, what="publisher outcome once the subscription expired")
    assert sent.outcome in TERMINAL
    assert any(e["event"] == "subscription-expired" for e in router.events()), "expiry of a durable subscription must be logged"
    again = pub.send("y")
    amqp.wait(lambda: again.outcome, what="next outcome")
    assert again.outcome == "accepted", "an expired subscription is not owed new messages"


@pytest.mark.parametrize("durable", [0, 2], ids=["non-durable", "durable"])
def test_stealing_link_takes_over_unanswered_deliveries(router, amqp, durable):
    """A failing-over client re-attaches before the router noticed the old link died:
    the new link steals the subscription and is sent what the old one left unanswered."""
    topic, cid, name = unique("stealover"), unique("so-client"), unique("so-link")
    old = durable_subscriber(amqp, router, topic, cid, name, durable)  # receives, never answers
    pub = amqp.connect(router.url).publisher(topic)
    sent = [pub.send(f"s{i}") for i in range(3)]
    amqp.wait(lambda: len(old.received) == 3, what="old link receives all three")
    old.accept(old.received[0])  # answered: not resent
    amqp.flush()
    amqp.wait(lambda: sent[0].outcome, what="outcome of the answered one")
    new = durable_subscriber(amqp, router, topic, cid, name, durable, auto_accept=True)
    old.wait_gone()
    assert old.remote_condition is not None and old.remote_condition.name == "amqp:link:stolen"
    amqp.wait(lambda: all(s.outcome for s in sent), what="outcomes via the new link")
    assert [s.outcome for s in sent] == ["accepted"] * 3
    assert new.bodies() == ["s1", "s2"]
    assert [r.tag for r in new.received] == [r.tag for r in old.received[1:]]


@pytest.mark.parametrize(
    "policy, requested, granted",
    [
        ("session-end", 0, 60),
        ("session-end", 5, 5),
        ("connection-close", 5, 5),
        ("session-end", 999999, 3600),
        ("never", 5, 3600),
    ],
)
def test_terminus_timeout_is_bounded(router, amqp, policy, requested, granted):
    """0 asks for the default, more than the cap gets the cap; expiry-policy never
    gets the cap (documented in docs/delivery-rule.md)."""
    sub = durable_subscriber(
        amqp, router, unique("durtimeout"), unique("dt-client"), unique("dt-link"), timeout=requested, expiry_policy=policy
    )
    assert sub.link.remote_source.timeout == granted
    assert sub.link.remote_source.durability == 2
    sub.close()


def test_router_survives_durable_churn(router, amqp):
    topic, cid, name = unique("churn"), unique("churn-client"), unique("churn-link")
    pub = amqp.connect(router.url).publisher(topic)
    sent = []
    for i in range(5):
        sub = durable_subscriber(amqp, router, topic, cid, name, auto_accept=True)
        sent.append(pub.send(f"c{i}"))
        amqp.wait(lambda sub=sub: len(sub.received) >= 1, what=f"round {i}: delivery")
        sub.conn.abort()
    last = durable_subscriber(amqp, router, topic, cid, name, auto_accept=True)
    amqp.wait(lambda: all(s.outcome for s in sent), what="all outcomes")
    assert {s.outcome for s in sent} == {"accepted"}
    last.close()
    assert_round_trip(amqp, router)
