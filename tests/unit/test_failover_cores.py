"""Failover with pure cores (docs/resumption.md): a router dies, its publishers and
subscribers resume elsewhere, nothing is lost and nothing is delivered twice.

    A - B
     \\ /
      C
"""

from __future__ import annotations

from router.core import outcomes
from router.core.commands import OpenLink, SendOutcome
from router.core.router import INCARNATION_PROPERTY

from corekit import decode, encode
from meshkit import Mesh

TRIANGLE = ("ABC", [("A", "B"), ("B", "C"), ("C", "A")])


def open_properties(mesh, router, link):
    (opened,) = [c for c in mesh.client[router] if isinstance(c, OpenLink) and c.link_id == link]
    return opened.properties or {}


def test_publisher_resumes_at_another_router_and_nothing_is_delivered_twice():
    mesh = Mesh(*TRIANGLE)
    sub = mesh.subscriber("C", "sc", durable=2, timeout=60)
    pub = mesh.publisher("A", name="p", container="P")
    incarnation = open_properties(mesh, "A", pub)[INCARNATION_PROPERTY]
    payloads = {n: encode(f"m{n}") for n in (1, 2, 3)}
    for n in (1, 2, 3):
        mesh.publish("A", pub, str(n).encode(), payload=payloads[n])
    copies = mesh.forwarded("C", sub)
    assert len(copies) == 3
    mesh.answer("C", sub, copies[0].tag)  # #1 accepted before A dies; #2, #3 in doubt
    mesh.kill("A")
    unsettled = [[str(n).encode(), "none"] for n in (1, 2, 3)]
    resumed = mesh.publisher("B", name="p", container="P", properties={
        INCARNATION_PROPERTY: incarnation, "eorouter:resume": True, "eorouter:unsettled": unsettled})
    assert open_properties(mesh, "B", resumed)[INCARNATION_PROPERTY] == incarnation
    deliveries = [mesh.publish("B", resumed, str(n).encode(), payload=payloads[n]) for n in (1, 2, 3)]
    assert len(mesh.forwarded("C", sub)) == 3, "C recognised the resent deliveries by their tag"
    for copy in mesh.forwarded("C", sub)[1:]:
        mesh.answer("C", sub, copy.tag)
    answers = [mesh.outcomes_for("B", d) for d in deliveries]
    assert answers == [[SendOutcome(d, outcomes.ACCEPTED)] for d in deliveries]
    for d in deliveries:
        mesh.settle_publisher("B", resumed, d)
    mesh.advance(3)
    assert mesh.cores["B"].record_count() == 0 and mesh.cores["C"].record_count() == 0


def test_subscriber_resumes_at_another_router_and_gets_what_it_was_owed():
    mesh = Mesh(*TRIANGLE)
    sub = mesh.subscriber("C", "k", durable=2, timeout=60)
    pub = mesh.publisher("A")
    d1 = mesh.publish("A", pub, b"1", body="one")
    (first,) = mesh.forwarded("C", sub)
    mesh.kill("C")  # dies before the subscriber answered
    d2 = mesh.publish("A", pub, b"2", body="two")  # owed to it while it re-attaches
    resumed = mesh.subscriber("B", "k", durable=2, timeout=60, properties={
        "eorouter:resume": True, "eorouter:unsettled": [[first.tag, "none"]]})
    got = mesh.forwarded("B", resumed)
    assert [decode(c.payload).body for c in got] == ["one", "two"], "in publisher order, once each"
    assert mesh.outcomes_for("A", d1) == []
    for c in got:
        mesh.answer("B", resumed, c.tag)
    assert [c.outcome for c in mesh.outcomes_for("A", d1) + mesh.outcomes_for("A", d2)] == [outcomes.ACCEPTED] * 2


def test_subscriber_that_never_comes_back_stops_being_owed_after_its_timeout():
    mesh = Mesh(*TRIANGLE)
    mesh.subscriber("C", "k", durable=2, timeout=5)
    other = mesh.subscriber("B", "o")
    pub = mesh.publisher("A")
    d1 = mesh.publish("A", pub, b"1")
    mesh.answer("B", other, mesh.forwarded("B", other)[0].tag)
    mesh.kill("C")
    assert mesh.outcomes_for("A", d1) == []
    mesh.advance(5.5)
    assert [c.outcome for c in mesh.outcomes_for("A", d1)] == [outcomes.ACCEPTED]
    assert any(e.kind == "owed-state-discarded" for e in mesh.logs["A"])


def test_placeholder_holds_the_stream_until_the_delivery_arrives():
    """The subscriber reports a tag the new router has not seen: nothing later of
    that publisher stream reaches it before that delivery."""
    mesh = Mesh(*TRIANGLE)
    sub = mesh.subscriber("C", "k", durable=2, timeout=60)
    pub = mesh.publisher("A")
    mesh.publish("A", pub, b"1", body="one")
    (first,) = mesh.forwarded("C", sub)
    # B learns nothing of #1 (it has no subscriber); the subscriber resumes at B,
    # reporting #1, before A's targeted copy can reach B.
    mesh.kill("C")
    mesh.inflight.clear()
    resumed_link = 999
    from router.core.events import LinkAttached, SUBSCRIBER, CreditChanged
    mesh.feed("B", LinkAttached(resumed_link, resumed_link, "S-k", "k", SUBSCRIBER, "t", durable=2, timeout=60,
                                rcv_settle_mode=1, properties={"eorouter:resume": True,
                                                               "eorouter:unsettled": [[first.tag, "none"]]}))
    mesh.feed("B", CreditChanged(resumed_link, 100))
    assert any(e.kind == "placeholder-created" for e in mesh.logs["B"])
    mesh.settle()
    got = mesh.forwarded("B", resumed_link)
    assert [decode(c.payload).body for c in got][:1] == ["one"]


def test_a_reported_delivery_settled_and_forgotten_here_is_not_a_placeholder():
    """The subscriber accepted, the publisher settled, the router relayed the
    settlement on a link that was already dead and forgot the record: on resume
    the subscriber is told it is settled, and its stream is not held back."""
    mesh = Mesh("A", [], record_linger=1.0)
    sub = mesh.subscriber("A", "k", durable=2, timeout=60)
    pub = mesh.publisher("A")
    d1 = mesh.publish("A", pub, b"1", body="one")
    (first,) = mesh.forwarded("A", sub)
    from router.core.events import OutcomeReceived
    mesh.feed("A", OutcomeReceived(sub, first.tag, outcomes.ACCEPTED, False))  # rcv-settle-mode=second
    mesh.detach("A", sub)
    mesh.settle_publisher("A", pub, d1)
    mesh.advance(1.5)  # record_linger: forgotten
    assert mesh.cores["A"].record_count() == 0
    mesh.publish("A", pub, b"2", body="two")
    resumed = mesh.subscriber("A", "k", durable=2, timeout=60, properties={
        "eorouter:resume": True, "eorouter:unsettled": [[first.tag, "accepted"]]})
    assert open_properties(mesh, "A", resumed)["eorouter:unsettled"] == []
    assert not any(e.kind == "placeholder-created" for e in mesh.logs["A"])
    assert [decode(c.payload).body for c in mesh.forwarded("A", resumed)] == ["two"]


def test_takeover_does_not_answer_with_the_old_origins_partial_outcome():
    """B answered the dead origin A for its own subscriber; when the publisher resumes
    at B, B must not hand it that partial answer: C's subscriber has not answered."""
    mesh = Mesh(*TRIANGLE)
    sb = mesh.subscriber("B", "sb", durable=2, timeout=60)
    sc = mesh.subscriber("C", "sc", durable=2, timeout=60)
    pub = mesh.publisher("A", name="p", container="P")
    incarnation = open_properties(mesh, "A", pub)[INCARNATION_PROPERTY]
    payload = encode("one")
    mesh.publish("A", pub, b"1", payload=payload)
    mesh.answer("B", sb, mesh.forwarded("B", sb)[0].tag)  # B's part is done; C holds its answer
    mesh.kill("A")
    resumed = mesh.publisher("B", name="p", container="P", properties={
        INCARNATION_PROPERTY: incarnation, "eorouter:resume": True, "eorouter:unsettled": [[b"1", "none"]]})
    delivery = mesh.publish("B", resumed, b"1", payload=payload)
    assert mesh.outcomes_for("B", delivery) == [], "C's subscriber has not answered yet"
    mesh.answer("C", sc, mesh.forwarded("C", sc)[0].tag)
    assert [c.outcome for c in mesh.outcomes_for("B", delivery)] == [outcomes.ACCEPTED]
