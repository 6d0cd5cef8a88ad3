"""A guarantee per topic in the pure core (issue 20, part 3; docs/guarantees.md): the
config's [[guarantee]] rules, first match wins; an at-most-once topic is relayed
pre-settled to whoever has credit, with no record, its unsettled publisher told
accepted on arrival and every attach saying snd-settle-mode settled; an at-least-once
topic keeps its records until every subscriber answered, with no settlement phase
between routers and no memory of settled deliveries, so a resend after a failover is
delivered again; a topic a rule makes exactly-once or at-least-once refuses links that
ask for pre-settled deliveries."""

from __future__ import annotations

from corekit import decode, encode
from meshkit import Mesh

from router.core import outcomes
from router.core.commands import DetachLink, OpenLink
from router.core.events import SND_SETTLED
from router.core.guarantees import AT_LEAST_ONCE, AT_MOST_ONCE, EXACTLY_ONCE, GuaranteeRule, guarantee_of

RULES = (
    GuaranteeRule(("metrics/#", "debug"), AT_MOST_ONCE),
    GuaranteeRule(("orders/+",), EXACTLY_ONCE),
    GuaranteeRule(("orders/#",), AT_MOST_ONCE),  # after orders/+: never takes orders/x
    GuaranteeRule(("jobs/#",), AT_LEAST_ONCE),
)


def opened(mesh: Mesh, router: str, link: int) -> OpenLink:
    (found,) = [c for c in mesh.client[router] if isinstance(c, OpenLink) and c.link_id == link]
    return found


def refused(mesh: Mesh, router: str, link: int) -> DetachLink:
    (found,) = [c for c in mesh.client[router] if isinstance(c, DetachLink) and c.link_id == link]
    return found


def test_the_first_rule_that_takes_a_topic_gives_its_guarantee():
    assert guarantee_of(RULES, "metrics/cpu").mode == AT_MOST_ONCE
    assert guarantee_of(RULES, "debug").rule == 0
    assert guarantee_of(RULES, "orders/eu") == (EXACTLY_ONCE, 1)
    assert guarantee_of(RULES, "orders/eu/42") == (AT_MOST_ONCE, 2)
    assert guarantee_of(RULES, "elsewhere") == (EXACTLY_ONCE, None)  # the default
    assert "[[guarantee]] rule 2" in guarantee_of(RULES, "orders/eu").describe("orders/eu")


def test_an_at_most_once_topic_is_relayed_presettled_and_keeps_no_record():
    mesh = Mesh("AB", [("A", "B")], guarantees=RULES)
    here = mesh.subscriber("A", "here", topic="metrics/cpu")  # it asked unsettled: the topic's mode wins
    there = mesh.subscriber("B", "there", topic="metrics/cpu", credit=1)
    pub = mesh.publisher("A", topic="metrics/cpu")  # unsettled, rcv-settle-mode second
    assert opened(mesh, "A", pub).presettled and opened(mesh, "A", here).presettled
    assert opened(mesh, "B", there).presettled
    deliveries = [mesh.publish("A", pub, str(n).encode(), payload=encode(f"m{n}")) for n in range(3)]
    for d in deliveries:  # accepted on arrival, settled: nobody is waited for
        assert [(c.outcome, c.settle) for c in mesh.outcomes_for("A", d)] == [(outcomes.ACCEPTED, True)]
    assert [decode(f.payload).body for f in mesh.forwarded("A", here)] == ["m0", "m1", "m2"]
    assert all(f.settled for f in mesh.forwarded("A", here) + mesh.forwarded("B", there))
    # One credit at B: the rest is not kept for it (at most once: what finds no credit is dropped).
    assert [decode(f.payload).body for f in mesh.forwarded("B", there)] == ["m0"]
    for name, core in mesh.cores.items():
        assert core.record_count() == 0, name
    lines = [e.fields for e in mesh.logs["A"] if e.kind == "received"]
    assert all(e["settled"] and e["owed"] == [] and e["guarantee"] == AT_MOST_ONCE for e in lines)


def test_a_rule_made_exactly_once_topic_refuses_presettled_links():
    mesh = Mesh("A", guarantees=RULES)
    pub = mesh.publisher("A", topic="orders/eu", name="p")
    assert not opened(mesh, "A", pub).presettled
    from router.core.events import PUBLISHER, SUBSCRIBER, LinkAttached

    mesh.feed("A", LinkAttached(50, 50, "C", "pre", PUBLISHER, "orders/eu", snd_settle_mode=SND_SETTLED))
    mesh.feed("A", LinkAttached(51, 51, "C", "pre-sub", SUBSCRIBER, "orders/eu", snd_settle_mode=SND_SETTLED))
    for link, who in ((50, "a publisher must send"), (51, "a subscriber must take")):
        detach = refused(mesh, "A", link)
        assert detach.condition == "amqp:precondition-failed"
        assert "topic 'orders/eu' is exactly-once ([[guarantee]] rule 2)" in detach.description and who in detach.description
    # A topic no rule takes keeps today's choice: a pre-settled publisher is relayed best effort.
    mesh.feed("A", LinkAttached(52, 52, "C", "be", PUBLISHER, "elsewhere", snd_settle_mode=SND_SETTLED))
    assert opened(mesh, "A", 52).presettled


def test_a_pattern_subscriber_takes_each_topic_under_its_own_guarantee():
    mesh = Mesh("A", guarantees=RULES)
    sub = mesh.subscriber("A", "all", topic="#")
    assert not opened(mesh, "A", sub).presettled  # mixed: pre-settled copies only where a topic says so
    loose = mesh.publisher("A", name="m", topic="metrics/x")
    strict = mesh.publisher("A", name="o", topic="orders/eu", rcv_first=True)
    mesh.publish("A", loose, b"1", payload=encode("loose"))
    d = mesh.publish("A", strict, b"1", payload=encode("strict"))
    copies = {decode(f.payload).body: f for f in mesh.forwarded("A", sub)}
    assert copies["loose"].settled and not copies["strict"].settled
    assert mesh.outcomes_for("A", d) == []  # owed to the subscriber: waits for its answer
    mesh.answer("A", sub, copies["strict"].tag)
    assert [c.outcome for c in mesh.outcomes_for("A", d)] == [outcomes.ACCEPTED]


def test_an_at_most_once_publisher_resumed_elsewhere_never_resends_twice():
    """Its router died after relaying #1 and before its "accepted" reached it: it
    resumes at B reporting #1 and resends it. B relays it no more (it may have been
    delivered): accepted and dropped; #2 goes on as usual."""
    from router.core.events import MessageReceived
    from router.core.router import INCARNATION_PROPERTY

    mesh = Mesh("ABC", [("A", "B"), ("B", "C"), ("A", "C")], guarantees=RULES)
    sub = mesh.subscriber("C", "s", topic="metrics/cpu", durable=2, timeout=60)
    pub = mesh.publisher("A", topic="metrics/cpu", name="p", container="P")
    incarnation = opened(mesh, "A", pub).properties[INCARNATION_PROPERTY]
    mesh.publish("A", pub, b"1", payload=encode("one"))
    assert [decode(f.payload).body for f in mesh.forwarded("C", sub)] == ["one"]
    mesh.kill("A")
    resumed = mesh.publisher(
        "B",
        topic="metrics/cpu",
        name="p",
        container="P",
        properties={INCARNATION_PROPERTY: incarnation, "eorouter:resume": True, "eorouter:unsettled": [[b"1", "none"]]},
    )
    assert opened(mesh, "B", resumed).properties["eorouter:unsettled"] == []
    mesh.feed("B", MessageReceived(resumed, 900, b"1", encode("one"), False))
    mesh.settle()
    two = mesh.publish("B", resumed, b"2", payload=encode("two"))
    assert [(c.outcome, c.settle) for c in mesh.outcomes_for("B", 900)] == [(outcomes.ACCEPTED, True)]
    assert [c.outcome for c in mesh.outcomes_for("B", two)] == [outcomes.ACCEPTED]
    assert [decode(f.payload).body for f in mesh.forwarded("C", sub)] == ["one", "two"]  # never "one" twice
    assert any(e.kind == "dropped" and "at-most-once" in e.fields["reason"] for e in mesh.logs["B"])


def test_an_at_least_once_topic_waits_for_every_subscriber_and_has_no_settlement_phase():
    """Owed like exactly-once (the publisher hears accepted only once every subscriber,
    here and at B, accepted); but B settles and forgets its record as soon as it
    answered A, A relays no settlement to it, and nobody remembers the delivery."""
    mesh = Mesh("AB", [("A", "B")], guarantees=RULES)
    here = mesh.subscriber("A", "here", topic="jobs/x")
    there = mesh.subscriber("B", "there", topic="jobs/x", rcv_settle_mode=1)  # waits for our settlement
    pub = mesh.publisher("A", topic="jobs/x")  # asks rcv-settle-mode second: the topic's first wins
    assert opened(mesh, "A", pub).settles_first and not opened(mesh, "A", pub).presettled
    d = mesh.publish("A", pub, b"1", payload=encode("one"))
    (copy_b,) = mesh.forwarded("B", there)
    assert not copy_b.settled
    mesh.answer("B", there, copy_b.tag, settled=False)
    assert mesh.cores["B"].record_count() == 0  # answered the origin: done at B
    settle = [c for c in mesh.client["B"] if type(c).__name__ == "SettleOutgoing"]
    assert [c.tag for c in settle] == [copy_b.tag]  # its subscriber sees the copy settled
    assert mesh.outcomes_for("A", d) == []  # "here" has not answered yet
    (copy_a,) = mesh.forwarded("A", here)
    mesh.answer("A", here, copy_a.tag)
    assert [(c.outcome, c.settle) for c in mesh.outcomes_for("A", d)] == [(outcomes.ACCEPTED, True)]
    assert mesh.cores["A"].record_count() == 0
    assert not any(e.kind == "settlement-relayed" for e in mesh.logs["A"])
    for name, core in mesh.cores.items():
        assert copy_a.tag not in core.settled, name  # never remembered
        received = [e.fields for e in mesh.logs[name] if e.kind == "received"]
        assert [e.get("guarantee") for e in received] == [AT_LEAST_ONCE], name


def test_an_at_least_once_topic_refuses_presettled_links():
    from router.core.events import PUBLISHER, SUBSCRIBER, LinkAttached

    mesh = Mesh("A", guarantees=RULES)
    mesh.feed("A", LinkAttached(50, 50, "C", "pre", PUBLISHER, "jobs/x", snd_settle_mode=SND_SETTLED))
    mesh.feed("A", LinkAttached(51, 51, "C", "pre-sub", SUBSCRIBER, "jobs/x", snd_settle_mode=SND_SETTLED))
    for link in (50, 51):
        detach = refused(mesh, "A", link)
        assert detach.condition == "amqp:precondition-failed"
        assert "topic 'jobs/x' is at-least-once ([[guarantee]] rule 4)" in detach.description


def _finished_then_resent(topic: str) -> list[str]:
    """A delivers #1 to C's subscriber, which accepts; A's "accepted" never reaches the
    publisher (A dies first); it resumes at B and resends #1. What C's subscriber gets."""
    from router.core.events import MessageReceived
    from router.core.router import INCARNATION_PROPERTY

    mesh = Mesh("ABC", [("A", "B"), ("B", "C"), ("A", "C")], guarantees=RULES)
    sub = mesh.subscriber("C", "s", topic=topic, durable=2, timeout=60)
    pub = mesh.publisher("A", topic=topic, name="p", container="P", rcv_first=True)
    incarnation = opened(mesh, "A", pub).properties[INCARNATION_PROPERTY]
    mesh.publish("A", pub, b"1", payload=encode("one"))
    (first,) = mesh.forwarded("C", sub)
    mesh.answer("C", sub, first.tag, settled=False)
    mesh.kill("A")
    resumed = mesh.publisher(
        "B",
        topic=topic,
        name="p",
        container="P",
        rcv_first=True,
        properties={INCARNATION_PROPERTY: incarnation, "eorouter:resume": True, "eorouter:unsettled": [[b"1", "none"]]},
    )
    mesh.feed("B", MessageReceived(resumed, 900, b"1", encode("one"), False))
    mesh.settle()
    for copy in mesh.forwarded("C", sub)[1:]:
        mesh.answer("C", sub, copy.tag)
    assert [c.outcome for c in mesh.outcomes_for("B", 900)] == [outcomes.ACCEPTED]  # nothing lost, either way
    return [decode(f.payload).body for f in mesh.forwarded("C", sub)]


def test_a_resend_after_the_delivery_was_finished_is_delivered_again_only_at_least_once():
    """What at-least-once gives up: exactly-once remembers the finished delivery at C and
    answers the resend from that memory; at-least-once keeps no such memory, so the
    resend is a new delivery there, and the subscriber gets it twice (same tag)."""
    assert _finished_then_resent("orders/eu") == ["one"]  # (a rule's exactly-once)
    assert _finished_then_resent("jobs/x") == ["one", "one"]


def test_a_resuming_at_least_once_subscriber_waits_for_nothing_it_reports():
    """A delivery it reports that the new router never saw gets no placeholder: the
    rest of its stream is not held back, and the delivery, should it come, is new."""
    mesh = Mesh("AB", [("A", "B")], guarantees=RULES)
    mesh.kill("A")
    unknown = b"\x01" * 16 + b"\x01" + b"9"
    sub = mesh.subscriber(
        "B",
        "s",
        topic="jobs/x",
        durable=2,
        timeout=60,
        properties={"eorouter:resume": True, "eorouter:unsettled": [[unknown, "accepted"]]},
    )
    assert opened(mesh, "B", sub).properties["eorouter:unsettled"] == []
    assert not any(e.kind == "placeholder-created" for e in mesh.logs["B"])
    assert not mesh.cores["B"].subscriptions["S-s/s"].placeholders
