"""Failover with pure cores (docs/resumption.md): a router dies, its publishers and
subscribers resume elsewhere, nothing is lost and nothing is delivered twice.

    A - B
     \\ /
      C
"""

from __future__ import annotations

from collections import deque

import pytest
from corekit import decode, encode
from meshkit import Mesh

from router.core import outcomes
from router.core.commands import Forward, Log, OpenLink, SendOutcome, SettleOutgoing
from router.core.events import CreditChanged
from router.core.resumption import publisher_settles_first
from router.core.router import INCARNATION_PROPERTY

TRIANGLE = ("ABC", [("A", "B"), ("B", "C"), ("C", "A")])


def open_properties(mesh, router, link):
    (opened,) = [c for c in mesh.client[router] if isinstance(c, OpenLink) and c.link_id == link]
    return opened.properties or {}


def resume_publisher(mesh, router, incarnation, unsettled, rcv_first=False):
    """Publisher "p" of container "P" resumes at ``router`` with its incarnation and
    its unsettled list (``[[tag, state], ...]``)."""
    return mesh.publisher(
        router,
        name="p",
        container="P",
        rcv_first=rcv_first,
        properties={INCARNATION_PROPERTY: incarnation, "eorouter:resume": True, "eorouter:unsettled": unsettled},
    )


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
    resumed = resume_publisher(mesh, "B", incarnation, unsettled)
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


@pytest.mark.parametrize("address", ["t", "+", "#"])
def test_subscriber_resumes_at_another_router_and_gets_what_it_was_owed(address):
    mesh = Mesh(*TRIANGLE)
    sub = mesh.subscriber("C", "k", durable=2, timeout=60, topic=address)
    pub = mesh.publisher("A")
    d1 = mesh.publish("A", pub, b"1", body="one")
    (first,) = mesh.forwarded("C", sub)
    mesh.kill("C")  # dies before the subscriber answered
    d2 = mesh.publish("A", pub, b"2", body="two")  # owed to it while it re-attaches
    resumed = mesh.subscriber(
        "B",
        "k",
        durable=2,
        timeout=60,
        topic=address,
        properties={"eorouter:resume": True, "eorouter:unsettled": [[first.tag, "none"]]},
    )
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
    from router.core.events import SUBSCRIBER, CreditChanged, LinkAttached

    mesh.feed(
        "B",
        LinkAttached(
            resumed_link,
            resumed_link,
            "S-k",
            "k",
            SUBSCRIBER,
            "t",
            durable=2,
            timeout=60,
            rcv_settle_mode=1,
            properties={"eorouter:resume": True, "eorouter:unsettled": [[first.tag, "none"]]},
        ),
    )
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
    resumed = mesh.subscriber(
        "A", "k", durable=2, timeout=60, properties={"eorouter:resume": True, "eorouter:unsettled": [[first.tag, "accepted"]]}
    )
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
    resumed = resume_publisher(mesh, "B", incarnation, [[b"1", "none"]])
    delivery = mesh.publish("B", resumed, b"1", payload=payload)
    assert mesh.outcomes_for("B", delivery) == [], "C's subscriber has not answered yet"
    mesh.answer("C", sc, mesh.forwarded("C", sc)[0].tag)
    assert [c.outcome for c in mesh.outcomes_for("B", delivery)] == [outcomes.ACCEPTED]


# ------------------------------------------------------------------ placeholders that nothing fills


def _accept_unsettled(mesh, router, link, tag):
    """A rcv-settle-mode=second subscriber's answer: accepted, not yet settled."""
    from router.core.events import OutcomeReceived

    mesh.feed(router, OutcomeReceived(link, tag, outcomes.ACCEPTED, False))
    mesh.settle()


def _resume_subscriber(mesh, router, name, reported):
    return mesh.subscriber(
        router,
        name,
        durable=2,
        timeout=60,
        properties={"eorouter:resume": True, "eorouter:unsettled": [[tag, state] for tag, state in reported]},
    )


def _kill_a_with_one_settled_delivery(mesh):
    """Publisher and subscriber on A: #1 accepted and settled at A (the subscriber
    never heard: A dies), #2 and #3 in flight. Returns (incarnation, tags, payloads)."""
    sub = mesh.subscriber("A", "k", durable=2, timeout=60)
    pub = mesh.publisher("A", name="p", container="P", rcv_first=True)
    incarnation = open_properties(mesh, "A", pub)[INCARNATION_PROPERTY]
    payloads = {n: encode(f"m{n}") for n in (1, 2, 3)}
    deliveries = [mesh.publish("A", pub, str(n).encode(), payload=payloads[n]) for n in (1, 2, 3)]
    copies = mesh.forwarded("A", sub)
    _accept_unsettled(mesh, "A", sub, copies[0].tag)
    assert mesh.outcomes_for("A", deliveries[0]) == [SendOutcome(deliveries[0], outcomes.ACCEPTED, True)]
    mesh.kill("A")
    return incarnation, [c.tag for c in copies], payloads


def _resume_publisher(mesh, router, incarnation, unsettled):
    return mesh.publisher(
        router,
        name="p",
        container="P",
        rcv_first=True,
        properties={
            INCARNATION_PROPERTY: incarnation,
            "eorouter:resume": True,
            "eorouter:unsettled": [[n, "none"] for n in unsettled],
        },
    )


def test_a_delivery_its_publisher_settled_before_resuming_here_gets_no_placeholder():
    mesh = Mesh(*TRIANGLE)
    incarnation, (t1, t2, t3), payloads = _kill_a_with_one_settled_delivery(mesh)
    pub = _resume_publisher(mesh, "B", incarnation, [b"2", b"3"])
    sub = _resume_subscriber(mesh, "B", "k", [(t1, "accepted"), (t2, "none"), (t3, "none")])
    logs = [e.kind for e in mesh.logs["B"]]
    assert "placeholder-settled" in logs
    # #1 is settled: left out (forget it); #2 and #3 are awaited: listed (keep them)
    assert open_properties(mesh, "B", sub)["eorouter:unsettled"] == [[t2, "none"], [t3, "none"]]
    resent = [mesh.publish("B", pub, n, payload=payloads[int(n)]) for n in (b"2", b"3")]
    d4 = mesh.publish("B", pub, b"4", body="m4")
    got = mesh.forwarded("B", sub)
    assert [decode(c.payload).body for c in got] == ["m2", "m3", "m4"], "no wait, in publisher order"
    for copy in got:
        mesh.answer("B", sub, copy.tag)
    for d in resent + [d4]:
        assert [c.outcome for c in mesh.outcomes_for("B", d)] == [outcomes.ACCEPTED]
    mesh.advance(3)
    assert "placeholder-expired" not in [e.kind for e in mesh.logs["B"]]
    assert all(core.record_count() == 0 for name, core in mesh.cores.items() if name != "A")


def test_a_placeholder_is_dropped_when_its_publisher_resumes_elsewhere_without_it():
    mesh = Mesh(*TRIANGLE)
    incarnation, (t1, t2, t3), payloads = _kill_a_with_one_settled_delivery(mesh)
    sub = _resume_subscriber(mesh, "B", "k", [(t1, "accepted"), (t2, "none"), (t3, "none")])
    assert [e.kind for e in mesh.logs["B"]].count("placeholder-created") == 3
    pub = _resume_publisher(mesh, "C", incarnation, [b"2", b"3"])  # "stream-resumed" reaches B
    assert [e.fields["delivery"] for e in mesh.logs["B"] if e.kind == "placeholder-settled"] == [t1.hex()]
    for n in (b"2", b"3"):
        mesh.publish("C", pub, n, payload=payloads[int(n)])
    mesh.publish("C", pub, b"4", body="m4")
    got = mesh.forwarded("B", sub)
    # #1, listed in B's answer, is settled on k's link (pre-settled, no message); then the rest
    assert got[0] == Forward(sub, t1, b"", True)
    assert [decode(c.payload).body for c in got[1:]] == ["m2", "m3", "m4"]
    assert "placeholder-expired" not in [e.kind for e in mesh.logs["B"]]


def test_a_delivery_published_after_a_resume_heard_elsewhere_is_not_taken_for_settled():
    """Found by `scripts/bench --failover`: the publisher resumed at B with nothing
    unsettled (C heard its "stream-resumed"), then published #4, which the
    subscriber at B accepted before B died. The subscriber moves to C and reports #4.
    C must not conclude from the list it heard that #4 was settled (it was published
    after that list): it waits for it (a placeholder) and, when the publisher
    resumes at C with #4 and resends it, sends it as the re-send it is."""
    from router.core import tags

    mesh = Mesh(*TRIANGLE, record_linger=1.0)
    pub = mesh.publisher("A", name="p", container="P", rcv_first=True)
    incarnation = open_properties(mesh, "A", pub)[INCARNATION_PROPERTY]
    mesh.kill("A")
    at_b = _resume_publisher(mesh, "B", incarnation, [])
    mesh.settle()
    sub = mesh.subscriber("B", "k", durable=2, timeout=60)
    payload = encode("m4")
    mesh.publish("B", at_b, b"4", payload=payload)
    (copy,) = mesh.forwarded("B", sub)
    _accept_unsettled(mesh, "B", sub, copy.tag)
    mesh.kill("B")
    moved = _resume_subscriber(mesh, "C", "k", [(copy.tag, "accepted")])
    kinds = [(e.kind, e.fields.get("delivery")) for e in mesh.logs["C"]]
    assert ("placeholder-created", copy.tag.hex()) in kinds
    assert ("placeholder-settled", copy.tag.hex()) not in kinds
    at_c = _resume_publisher(mesh, "C", incarnation, [b"4"])
    assert ("placeholder-settled", copy.tag.hex()) not in [(e.kind, e.fields.get("delivery")) for e in mesh.logs["C"]]
    resent = mesh.publish("C", at_c, b"4", payload=payload)
    assert [e.fields["delivery"] for e in mesh.logs["C"] if e.kind == "placeholder-fulfilled"] == [copy.tag.hex()]
    (again,) = mesh.forwarded("C", moved)
    assert again.tag == copy.tag == tags.outgoing_tag(tags.stream_id("P", "p", incarnation), b"4")
    mesh.answer("C", moved, again.tag)
    assert [c.outcome for c in mesh.outcomes_for("C", resent)] == [outcomes.ACCEPTED]


def test_the_publisher_where_it_resumed_answers_for_a_tag_it_settled_before():
    """The sound form of the rule above: asked "settled?" about a tag it never saw,
    the router where the publisher resumed (and stayed) answers for it when the
    publisher's complete list left it out, so the subscriber's stream is not held
    back until the placeholder expires."""
    mesh = Mesh(*TRIANGLE, record_linger=1.0)
    incarnation, (t1, t2, t3), payloads = _kill_a_with_one_settled_delivery(mesh)
    pub = _resume_publisher(mesh, "B", incarnation, [b"2", b"3"])
    sub = _resume_subscriber(mesh, "C", "k", [(t1, "accepted"), (t2, "none"), (t3, "none")])
    settled = [e.fields["delivery"] for e in mesh.logs["C"] if e.kind == "placeholder-settled"]
    assert settled == [t1.hex()], "B said #1 was settled before its publisher resumed there"
    for n in (b"2", b"3"):
        mesh.publish("B", pub, n, payload=payloads[int(n)])
    mesh.publish("B", pub, b"4", body="m4")
    got = mesh.forwarded("C", sub)
    assert got[0] == Forward(sub, t1, b"", True), "#1, listed in C's answer, settled on k's link"
    assert [decode(c.payload).body for c in got[1:]] == ["m2", "m3", "m4"]
    assert "placeholder-expired" not in [e.kind for e in mesh.logs["C"]]


def test_fulfilled_placeholders_go_out_in_publisher_order_to_a_subscriber_without_credit():
    """Found by `scripts/bench --failover`: several placeholders fulfilled while the
    resumed subscriber could not be sent anything were sent in reverse once it
    could (each was put at the head of its queue)."""
    mesh = Mesh(*TRIANGLE, record_linger=1.0)
    incarnation, (t1, t2, t3), payloads = _kill_a_with_one_settled_delivery(mesh)
    sub = mesh.subscriber(
        "B",
        "k",
        credit=0,
        durable=2,
        timeout=60,
        properties={"eorouter:resume": True, "eorouter:unsettled": [[t2, "none"], [t3, "none"]]},
    )
    pub = _resume_publisher(mesh, "B", incarnation, [b"2", b"3"])
    for n in (b"2", b"3"):
        mesh.publish("B", pub, n, payload=payloads[int(n)])
    mesh.publish("B", pub, b"4", body="m4")
    assert mesh.forwarded("B", sub) == []
    mesh.feed("B", CreditChanged(sub, 10))
    mesh.settle()
    assert [decode(c.payload).body for c in mesh.forwarded("B", sub)] == ["m2", "m3", "m4"]


def test_a_new_delivery_waits_behind_a_placeholder_of_its_stream():
    """The subscriber has credit and an empty queue: a new delivery of a stream it
    holds a placeholder for must still wait for that placeholder."""
    from router.core import tags

    mesh = Mesh("A", [])
    pub = mesh.publisher("A", name="p", container="P", rcv_first=True)
    incarnation = open_properties(mesh, "A", pub)[INCARNATION_PROPERTY]
    stream = tags.stream_id("P", "p", incarnation)
    missing = tags.outgoing_tag(stream, b"0")  # a delivery of this stream not seen here yet
    sub = _resume_subscriber(mesh, "A", "k", [(missing, "none")])
    d1 = mesh.publish("A", pub, b"1", body="m1")
    assert mesh.forwarded("A", sub) == [], "held behind the placeholder"
    mesh.advance(mesh.cores["A"].settings.placeholder_timeout + 0.5)
    assert [decode(c.payload).body for c in mesh.forwarded("A", sub)] == ["m1"]
    mesh.answer("A", sub, mesh.forwarded("A", sub)[0].tag)
    assert [c.outcome for c in mesh.outcomes_for("A", d1)] == [outcomes.ACCEPTED]


def test_a_resumed_answer_that_completes_a_delivery_is_not_listed_as_unsettled():
    """Its reported "accepted" was the last answer the record needed: the delivery
    settles in the same step (rcv-settle-mode=first publisher), so the router's
    answer leaves it out (settled) instead of promising a settlement that never comes."""
    mesh = Mesh("A", [], record_linger=1.0)
    sub = mesh.subscriber("A", "k", durable=2, timeout=60)
    pub = mesh.publisher("A", rcv_first=True)
    d1 = mesh.publish("A", pub, b"1", body="one")
    (first,) = mesh.forwarded("A", sub)
    mesh.detach("A", sub)  # it accepted, but the answer was lost with its connection
    resumed = _resume_subscriber(mesh, "A", "k", [(first.tag, "accepted")])
    assert open_properties(mesh, "A", resumed)["eorouter:unsettled"] == []
    assert mesh.outcomes_for("A", d1) == [SendOutcome(d1, outcomes.ACCEPTED, True)]
    assert mesh.forwarded("A", resumed) == []
    mesh.advance(1.5)
    assert mesh.cores["A"].record_count() == 0


def test_a_placeholder_for_a_delivery_settled_by_a_live_origin_is_resolved_by_asking():
    """The subscriber's router died after the origin (alive) settled the delivery and
    before the subscriber heard: its new router asks the others, the origin says it
    is settled, and the stream is not held back until the placeholder expires. The
    tag, listed in the new router's answer, is settled on the subscriber's link (a
    pre-settled transfer with no message, which the subscriber, holding it, answers
    as before): without that it kept the tag unsettled for ever (found by
    tests/integration/test_client.py, the subscriber failing over when its router is
    killed, one run in two once the compiled path read messages faster)."""
    mesh = Mesh(*TRIANGLE, record_linger=1.0)
    sub = mesh.subscriber("B", "k", durable=2, timeout=60)
    pub = mesh.publisher("A", rcv_first=True)
    d1 = mesh.publish("A", pub, b"1", body="one")
    (first,) = mesh.forwarded("B", sub)
    _accept_unsettled(mesh, "B", sub, first.tag)
    assert mesh.outcomes_for("A", d1) == [SendOutcome(d1, outcomes.ACCEPTED, True)]
    mesh.kill("B")
    mesh.advance(1.5)  # A forgets the record (linger): only its settled-tag memory is left
    assert mesh.cores["A"].record_count() == 0
    resumed = _resume_subscriber(mesh, "C", "k", [(first.tag, "accepted")])
    kinds = [e.kind for e in mesh.logs["C"]]
    assert "placeholder-created" in kinds and "placeholder-settled" in kinds
    assert [bytes(t) for t, _ in open_properties(mesh, "C", resumed)["eorouter:unsettled"]] == [first.tag], "listed"
    mesh.publish("A", pub, b"2", body="two")
    got = mesh.forwarded("C", resumed)
    assert got[0] == Forward(resumed, first.tag, b"", True), "settled on k's link"
    assert [decode(c.payload).body for c in got[1:]] == ["two"], "not held back"


def test_a_live_router_whose_publisher_resumed_elsewhere_hands_its_stream_over():
    """A never noticed its publisher's link die (a cut, not a death): when the
    publisher resumes at B, A's stale link is stolen and B becomes the origin of what
    A still held; the publisher hears B's answer, and nothing stays behind."""
    mesh = Mesh(*TRIANGLE, record_linger=1.0)
    sub = mesh.subscriber("C", "k", durable=2, timeout=60)
    pub = mesh.publisher("A", name="p", container="P", rcv_first=True)
    incarnation = open_properties(mesh, "A", pub)[INCARNATION_PROPERTY]
    payload = encode("m1")
    mesh.publish("A", pub, b"1", payload=payload)  # C has not answered yet
    resumed = _resume_publisher(mesh, "B", incarnation, [b"1"])
    from router.core.commands import DetachLink

    assert DetachLink(pub, "amqp:link:stolen", "the link resumed at router B", False) in mesh.client["A"]
    assert [e.fields.get("to_router") for e in mesh.logs["A"] if e.kind == "origin-taken-over"] == ["B"]
    d = mesh.publish("B", resumed, b"1", payload=payload)
    copies = mesh.forwarded("C", sub)
    assert len(copies) == 1, "C recognised the resend by its tag"
    mesh.answer("C", sub, copies[0].tag)
    assert mesh.outcomes_for("B", d) == [SendOutcome(d, outcomes.ACCEPTED, True)]
    mesh.advance(2)
    assert all(core.record_count() == 0 for core in mesh.cores.values())


def _k_and_p_on_a_with_m1():
    """Routers A - B; durable subscriber k and publisher p (rcv-settle-mode first) at A;
    p published #1 and A sent it to k. Returns (mesh, k's link, p's incarnation, #1's payload)."""
    mesh = Mesh("AB", [("A", "B")], twins=True, record_linger=1.0)
    sub = mesh.subscriber("A", "k", durable=2, timeout=60)
    pub = mesh.publisher("A", name="p", container="P", rcv_first=True)
    incarnation = open_properties(mesh, "A", pub)[INCARNATION_PROPERTY]
    payload = encode("m1")
    mesh.publish("A", pub, b"1", payload=payload)
    return mesh, sub, incarnation, payload


def _p_resumes_at_b_resending_m1(mesh, incarnation, payload):
    """p resumes at B with #1 unsettled and resends it (delivery 7), nothing delivered yet."""
    from router.core.events import PUBLISHER, LinkAttached, MessageReceived

    properties = {INCARNATION_PROPERTY: incarnation, "eorouter:resume": True, "eorouter:unsettled": [[b"1", "none"]]}
    mesh.feed("B", LinkAttached(500, 500, "P", "p", PUBLISHER, "t", rcv_settle_mode=0, properties=properties))
    mesh.feed("B", MessageReceived(500, 7, b"1", payload, False))


def _k_accepts_at_b_and_m1_ends(mesh, link):
    """Everything in flight arrives, k accepts at B what B sent it: p hears accepted at B,
    and no record is left on either router."""
    mesh.settle()
    for c in mesh.forwarded("B", link):
        mesh.answer("B", link, c.tag)
    assert mesh.outcomes_for("B", 7) == [SendOutcome(7, outcomes.ACCEPTED, True)]
    mesh.advance(2)
    assert {name: core.record_count() for name, core in mesh.cores.items()} == {"A": 0, "B": 0}


@pytest.mark.parametrize("copy_first", [True, False], ids=["copy-before-news", "news-before-copy"])
def test_a_router_handing_over_a_delivery_it_owes_nobody_answers_the_new_origin(copy_first):
    """Found under CPU load (tests/failover/test_resume_under_load.py): the subscriber's
    and then the publisher's links to A are cut, A lives on, and both resume at B. B
    takes over as origin and sends A its copy (it still counts A among the interested
    routers); data and control are separate links, so the copy can reach A before the
    "stream-resumed" news. A, owing it to nobody any more, left that copy for the news
    and then deleted its record without answering: B waited for A for ever and the
    publisher never heard. A must tell B "none" whichever comes first. (B sends A the
    copy for j, who attached at A after #1: since B counts no other router's entry of a
    subscriber attached at B itself, k's alone no longer makes it send one. Copy first,
    A still holds #1 and owes it nobody; news first, A gave its record up and B's copy is
    a delivery j is owed there like any other.)"""
    from router.core.events import DataReceived

    mesh, sub, incarnation, payload = _k_and_p_on_a_with_m1()
    (copy,) = mesh.forwarded("A", sub)
    j = mesh.subscriber("A", "j", durable=2, timeout=60)
    resumed_sub = _resume_subscriber(mesh, "B", "k", [(copy.tag, "none")])
    mesh.detach("A", sub)  # A moves what it owed k to B
    _p_resumes_at_b_resending_m1(mesh, incarnation, payload)
    kinds = [type(event) for event in mesh.in_flight("B", "A")]
    assert DataReceived in kinds and len(kinds) > 1, "B sent A its copy and the news"
    ordered = sorted(mesh.inflight, key=lambda item: isinstance(item[3], DataReceived) != copy_first)
    mesh.inflight.clear()
    mesh.inflight.extend(ordered)
    mesh.settle()
    copies = mesh.forwarded("A", j)
    assert len(copies) == (0 if copy_first else 1)
    for c in copies:
        mesh.answer("A", j, c.tag)
    _k_accepts_at_b_and_m1_ends(mesh, resumed_sub)


def test_an_old_origin_answering_a_new_origin_that_does_not_wait_for_it_is_told_the_end():
    """Found under CPU load (tests/failover/test_link_cut.py, test_resume_under_load [A]):
    k accepted #1 at A, A told p, and both were cut off from A before p settled. Both
    resume at B; A, not having noticed k go, hands #1 over to B and answers it for k. B,
    where k is attached now, does not count A among the routers it waits for (k's entry
    at A says nothing B does not know), so it ignored A's answer, never settled with A,
    and A held its record until something else made it answer again: minutes. An
    origin answered by a router it does not wait for tells that router the end too."""
    mesh = Mesh("AB", [("A", "B")], twins=True, record_linger=1.0)
    sub = mesh.subscriber("A", "k", durable=2, timeout=60)
    pub = mesh.publisher("A", name="p", container="P")  # settles after our outcome
    incarnation = open_properties(mesh, "A", pub)[INCARNATION_PROPERTY]
    payload = encode("m1")
    d = mesh.publish("A", pub, b"1", payload=payload)
    (copy,) = mesh.forwarded("A", sub)
    _accept_unsettled(mesh, "A", sub, copy.tag)
    assert [c.outcome for c in mesh.outcomes_for("A", d)] == [outcomes.ACCEPTED], "p heard, and was cut off"
    resumed_sub = _resume_subscriber(mesh, "B", "k", [(copy.tag, "accepted")])
    _p_resumes_at_b_resending_m1(mesh, incarnation, payload)
    mesh.settle()
    assert [e.kind for e in mesh.logs["A"] if e.kind == "origin-taken-over"] == ["origin-taken-over"]
    assert "B" not in [r for rec in mesh.cores["B"].records.values() for r in rec.remote_routers], "B waits for nobody"
    _k_accepts_at_b_and_m1_ends(mesh, resumed_sub)


def _k_gets_m1_then_m2_at_b(mesh, moved, origin):
    """Everything in flight arrives: k, at B, gets #1 then #2 and accepts both; their
    origin tells p accepted for each."""
    mesh.settle()
    copies = mesh.forwarded("B", moved)
    assert [decode(c.payload).body for c in copies] == ["m1", "m2"]
    for c in copies:
        mesh.answer("B", moved, c.tag)
    assert [c.outcome for d in (1, 2) for c in mesh.outcomes_for(origin, d)] == [outcomes.ACCEPTED] * 2


@pytest.mark.parametrize("answer_first", [False, True], ids=["copies-first", "answer-first"])
def test_a_subscriber_attached_elsewhere_before_its_router_noticed_gets_what_it_missed_there_first(answer_first):
    """Found under CPU load (tests/failover/test_resume_under_load.py): a subscriber's
    connection to A dies and it attaches at B before A notices. A sends #1 on the dead
    link; then it hears of the attach at B and, B being interested now, sends B #2. Kept
    for k until A noticed the loss, #1 reached B after #2, and the application got #2
    first. A takes the subscription over when it hears (its old link is stolen) and sends
    #1 on to B before anything later; its answer to B's announcement names #1, so that B
    holds #2 back until #1 is there should the answer (control) overtake the copy (data)."""
    from router.core.commands import DetachLink
    from router.core.events import ControlReceived, MessageReceived

    mesh = Mesh("AB", [("A", "B")], twins=True, record_linger=1.0)
    sub = mesh.subscriber("A", "k", durable=2, timeout=60)
    pub = mesh.publisher("A", name="p", container="P", rcv_first=True)
    moved = mesh.attach_subscriber(
        "B", "k", durable=2, timeout=60, properties={"eorouter:resume": True, "eorouter:unsettled": []}
    )
    mesh.feed("A", MessageReceived(pub, 1, b"1", encode("m1"), False))
    assert [decode(c.payload).body for c in mesh.forwarded("A", sub)] == ["m1"], "sent on the dead link"
    mesh.deliver_from("B", "A", len(mesh.in_flight("B", "A")))  # A hears of the attach at B
    stolen = [c for c in mesh.client["A"] if isinstance(c, DetachLink) and c.link_id == sub]
    assert [c.condition for c in stolen] == ["amqp:link:detach-forced"]
    mesh.feed("A", MessageReceived(pub, 2, b"2", encode("m2"), False))
    acks = [e for e in mesh.in_flight("A", "B") if isinstance(e, ControlReceived) and e.messages[0]["t"] == "sub-ack"]
    assert [len(e.messages[0]["moved"]) for e in acks] == [1], "the answer names #1"
    if answer_first:
        mesh.inflight = deque(sorted(mesh.inflight, key=lambda item: not isinstance(item[3], ControlReceived)))
    _k_gets_m1_then_m2_at_b(mesh, moved, origin="A")
    mesh.advance(2)
    assert {name: core.record_count() for name, core in mesh.cores.items()} == {"A": 0, "B": 0}


def test_a_new_origin_counts_its_subscriber_an_old_origin_addressed_a_copy_to():
    """Found by the generated histories of a subscriber and a publisher leaving a live
    router: k moves from A to B, and A sends #1, which it owed k, on to B addressed to
    k (answer A individually). Before that copy arrives, #1's publisher resumes at B and
    resends it: B is its origin now, and A, handing it over, waits for nobody. The late
    copy marked k as A's at B, B left k out of the answers it waits for, and with A's
    "none" told the publisher "released" for what k accepted."""
    from router.core.events import DataReceived

    mesh, sub, incarnation, payload = _k_and_p_on_a_with_m1()
    assert len(mesh.forwarded("A", sub)) == 1  # on a link that is dead already
    moved = mesh.attach_subscriber(
        "B", "k", durable=2, timeout=60, properties={"eorouter:resume": True, "eorouter:unsettled": []}
    )
    mesh.deliver_from("B", "A", len(mesh.in_flight("B", "A")))  # A moves #1 to B, addressed to k
    assert DataReceived in [type(e) for e in mesh.in_flight("A", "B")]
    _p_resumes_at_b_resending_m1(mesh, incarnation, payload)
    _k_accepts_at_b_and_m1_ends(mesh, moved)


def test_a_copy_sent_to_the_old_router_of_a_subscriber_that_moved_still_reaches_it():
    """k, durable at A, resumes at B; p publishes at C. C sends #1 to A (k is there, as
    far as C knows); A hears of the attach at B first, gives the subscription up and
    moves what it owed k (nothing yet); then #1 arrives at A. Owed to nobody there, it
    never reached k, and p was told released (with another subscriber at A, accepted).
    Found by the generated histories of a subscriber leaving a live router with the
    publisher at a third one (it happened before the takeover too, when A had noticed
    the loss before #1 came). A passes on what origins still send it for a subscriber
    that moved on lately, addressed to it where it is now."""
    from router.core.events import DataReceived, MessageReceived

    mesh = Mesh(*TRIANGLE, twins=True, record_linger=1.0)
    sub = mesh.subscriber("A", "k", durable=2, timeout=60)
    pub = mesh.publisher("C", name="p", container="P", rcv_first=True)
    moved = mesh.attach_subscriber(
        "B", "k", durable=2, timeout=60, properties={"eorouter:resume": True, "eorouter:unsettled": []}
    )
    mesh.feed("C", MessageReceived(pub, 1, b"1", encode("m1"), False))
    assert [type(e) for e in mesh.in_flight("C", "A")] == [DataReceived], "C sends #1 to A only"
    mesh.deliver_from("B", "A", len(mesh.in_flight("B", "A")))  # A hears of the attach at B first
    mesh.settle()
    assert not mesh.forwarded("A", sub), "#1 came after A gave k up"
    copies = mesh.forwarded("B", moved)
    assert [decode(c.payload).body for c in copies] == ["m1"]
    mesh.answer("B", moved, copies[0].tag)
    assert [c.outcome for c in mesh.outcomes_for("C", 1)] == [outcomes.ACCEPTED]


def test_a_copy_passed_on_for_a_subscriber_that_moved_and_the_origins_own_copy_count_once():
    """k moves from A (where j stays) to B, and C, which heard of it, publishes #1 to both
    A (for j) and B (for k). A, in its grace after k moved, passes its copy on to B
    addressed to k too, and that copy reaches B first. B then answers C's own copy for
    its untargeted subscribers (none), not "released": p hears accepted once j and k did."""
    from router.core.events import DataReceived, MessageReceived

    mesh = Mesh(*TRIANGLE, twins=True, record_linger=1.0)
    sub = mesh.subscriber("A", "k", durable=2, timeout=60)
    j = mesh.subscriber("A", "j", durable=2, timeout=60)
    pub = mesh.publisher("C", name="p", container="P", rcv_first=True)
    moved = mesh.subscriber("B", "k", durable=2, timeout=60, properties={"eorouter:resume": True, "eorouter:unsettled": []})
    assert mesh.cores["A"].moved_away, "A gave k up when it heard"
    mesh.feed("C", MessageReceived(pub, 1, b"1", encode("m1"), False))
    assert [type(e) for e in mesh.in_flight("C", "B")] == [DataReceived], "C sends #1 to B itself"
    mesh.deliver_from("C", "A")  # A passes it on to B, addressed to k
    assert [type(e) for e in mesh.in_flight("A", "B")] == [DataReceived]
    mesh.deliver_from("A", "B")  # ... and that copy reaches B first
    mesh.settle()
    for link, router in ((moved, "B"), (j, "A")):
        for c in mesh.forwarded(router, link):
            mesh.answer(router, link, c.tag)
    assert len(mesh.forwarded("B", moved)) == 1 and not mesh.forwarded("A", sub)
    assert [c.outcome for c in mesh.outcomes_for("C", 1)] == [outcomes.ACCEPTED]
    mesh.advance(2)
    assert {name: core.record_count() for name, core in mesh.cores.items()} == {"A": 0, "B": 0, "C": 0}


def _k_leaves_a_for(to: str, a_noticed: bool):
    """k, durable at A, resumes at ``to`` (p is at C); A gives the subscription up when it
    hears, or first notices the old link drop and announces k detached and retained there.
    Once everyone heard, p publishes #1. Returns (mesh, k's link at ``to``)."""
    from router.core.events import LinkDetached, MessageReceived

    mesh = Mesh(*TRIANGLE, twins=True, record_linger=1.0)
    sub = mesh.subscriber("A", "k", durable=2, timeout=60)
    pub = mesh.publisher("C", name="p", container="P", rcv_first=True)
    if a_noticed:
        mesh.feed("A", LinkDetached(sub, False))
    moved = mesh.subscriber(to, "k", durable=2, timeout=60, properties={"eorouter:resume": True, "eorouter:unsettled": []})
    mesh.settle()
    mesh.feed("C", MessageReceived(pub, 1, b"1", encode("m1"), False))
    return mesh, moved


@pytest.mark.parametrize("a_noticed", [False, True], ids=["a-heard-first", "a-noticed-first"])
def test_an_origin_stops_sending_the_old_router_copies_for_a_subscriber_that_moved_on(a_noticed):
    """k, durable at A, resumes at B; A gives the subscription up when it hears, or first
    notices the old link drop and announces k detached and retained there. Either way C,
    publishing once it heard of both, sends B its copy and A none: before, A's retained
    entry had C send A a copy of everything for the topic until k's terminus timeout,
    each answered "none" (or passed on to B as a second copy, within A's grace)."""
    from router.core.events import DataReceived

    mesh, moved = _k_leaves_a_for("B", a_noticed)
    assert [type(e) for e in mesh.in_flight("C", "B")] == [DataReceived] and not mesh.in_flight("C", "A")
    mesh.settle()
    (copy,) = mesh.forwarded("B", moved)
    mesh.answer("B", moved, copy.tag)
    assert [c.outcome for c in mesh.outcomes_for("C", 1)] == [outcomes.ACCEPTED]


@pytest.mark.parametrize("a_noticed", [False, True], ids=["a-heard-first", "a-noticed-first"])
def test_an_origin_the_subscriber_moved_to_stops_sending_its_old_router_copies(a_noticed):
    """k, durable at A, resumes at C, where p publishes. C, holding k itself, sends A no
    copy: before, A's entry (retained there, or not yet given up) still counted at C, the
    only router that had no other router's word for where k was, so C sent A a copy of
    everything for the topic until k's terminus timeout, each passed back to C within A's
    grace (a second copy for k) and answered "none" or "left" after it."""
    mesh, moved = _k_leaves_a_for("C", a_noticed)
    assert not mesh.in_flight("C", "A") and not mesh.in_flight("C", "B")
    (copy,) = mesh.forwarded("C", moved)
    mesh.answer("C", moved, copy.tag)
    assert [c.outcome for c in mesh.outcomes_for("C", 1)] == [outcomes.ACCEPTED]
    mesh.settle()
    assert len(mesh.forwarded("C", moved)) == 1
    mesh.advance(2)
    assert {name: core.record_count() for name, core in mesh.cores.items()} == {"A": 0, "B": 0, "C": 0}


def _k_moves_to_b_while_c_sends_m1_to_a(x_at_b: bool):
    """k, durable at A (and, with ``x_at_b``, x at B, which gets #1 before k attaches
    there), resumes at B while p publishes #1 at C, which sends it to A. Every router but
    A hears of the attach at B and answers it before #1 reaches A; C's answer names #1
    (unanswered at A). Then C publishes #2, which reaches B directly first. Returns (mesh,
    k's link at B, x's link or None)."""
    from router.core.events import DataReceived, MessageReceived

    mesh = Mesh(*TRIANGLE, twins=True, record_linger=1.0)
    mesh.subscriber("A", "k", durable=2, timeout=60)
    x = mesh.subscriber("B", "x", durable=2, timeout=60) if x_at_b else None
    pub = mesh.publisher("C", name="p", container="P", rcv_first=True)
    mesh.feed("C", MessageReceived(pub, 1, b"1", encode("m1"), False))
    assert [type(e) for e in mesh.in_flight("C", "A")] == [DataReceived], "C sends #1 to A"
    mesh.deliver_from("C", "B", len(mesh.in_flight("C", "B")))  # (and to B for x)
    moved = mesh.attach_subscriber(
        "B", "k", durable=2, timeout=60, properties={"eorouter:resume": True, "eorouter:unsettled": []}
    )
    mesh.deliver_from("B", "C", len(mesh.in_flight("B", "C")))  # C hears of k at B ...
    (ack,) = mesh.in_flight("C", "B")
    assert ack.messages[0]["t"] == "sub-ack" and ack.messages[0]["moved"], "... and names #1 in its answer"
    mesh.deliver_from("C", "B")
    mesh.deliver_from("B", "A", len(mesh.in_flight("B", "A")))  # A hears of it too, and answers
    mesh.deliver_from("A", "B", len(mesh.in_flight("A", "B")))
    mesh.feed("C", MessageReceived(pub, 2, b"2", encode("m2"), False))
    mesh.deliver_from("C", "B", len(mesh.in_flight("C", "B")))  # #2 reaches B first
    return mesh, moved, x


@pytest.mark.parametrize("x_at_b", [False, True], ids=["b-never-saw-1", "b-held-1-for-another"])
def test_a_copy_the_old_router_passes_on_reaches_the_subscriber_before_the_origins_later_ones(x_at_b):
    """The order half of the moving race with the publisher at a third router: #1, which
    C sent A before it heard of the move, reaches k only through A, after #2, which C
    sent B directly. C's answer to B's announcement names #1, and B holds #2 back for k
    until #1 came. (Found by the generated histories; before, k's application got #2
    first.) When B held #1 already, for x, k got it from B, once."""
    mesh, moved, x = _k_moves_to_b_while_c_sends_m1_to_a(x_at_b)
    # (B holding #1 unsettled, k's resume, reporting nothing, had it owed #1 at B.)
    assert [decode(c.payload).body for c in mesh.forwarded("B", moved)] == (["m1", "m2"] if x_at_b else []), "#2 waits"
    mesh.settle()
    copies = mesh.forwarded("B", moved)
    assert [decode(c.payload).body for c in copies] == ["m1", "m2"]
    for link in (moved, x) if x else (moved,):
        for c in mesh.forwarded("B", link):
            mesh.answer("B", link, c.tag)
    assert [c.outcome for d in (1, 2) for c in mesh.outcomes_for("C", d)] == [outcomes.ACCEPTED] * 2
    mesh.advance(2)
    assert {name: core.record_count() for name, core in mesh.cores.items()} == {"A": 0, "B": 0, "C": 0}


def test_copies_passed_on_before_the_origins_answer_go_out_before_the_later_ones_it_named():
    """Found under CPU load (tests/failover/test_moving_subscribers.py, one run in ten: the
    application got #206 where #16 belonged). A noticed k's loss first; k attached at B
    and A, hearing of it, passed #1 on to B addressed to k, queued there (k's attach not
    answered yet). C's answer to B's announcement came later and named #1 and #2, both
    sent to A unanswered: a placeholder for #2, which A passed on too. Fulfilled while k
    had no credit, #2 was put at the head of k's queue, ahead of #1 queued before it."""
    from router.core.events import CreditChanged, DataReceived, LinkDetached, MessageReceived

    mesh = Mesh(*TRIANGLE, twins=True, record_linger=1.0)
    k = mesh.subscriber("A", "k", durable=2, timeout=60)
    pub = mesh.publisher("C", name="p", container="P", rcv_first=True)
    mesh.publish("C", pub, b"1", body="m1")
    assert [decode(c.payload).body for c in mesh.forwarded("A", k)] == ["m1"], "sent to k, never answered"
    mesh.feed("C", MessageReceived(pub, 2, b"2", encode("m2"), False))
    (m2_to_a,) = mesh.in_flight("C", "A")
    assert isinstance(m2_to_a, DataReceived)
    mesh.feed("A", LinkDetached(k, False))  # A notices the loss first
    for target in ("B", "C"):
        mesh.deliver_from("A", target, len(mesh.in_flight("A", target)))
    moved = mesh.attach_subscriber(
        "B", "k", credit=0, durable=2, timeout=60, properties={"eorouter:resume": True, "eorouter:unsettled": []}
    )
    mesh.deliver_from("B", "A", len(mesh.in_flight("B", "A")))  # A hears of it: passes #1 on
    mesh.deliver_from("A", "B", len(mesh.in_flight("A", "B")))  # the copy of #1, queued for k, and A's answer
    mesh.deliver_from("B", "C", len(mesh.in_flight("B", "C")))  # C hears of it ...
    mesh.deliver_from("C", "B", len(mesh.in_flight("C", "B")))  # ... and names #1 and #2: a placeholder for #2
    assert [c.kind for c in mesh.logs["B"] if getattr(c, "kind", "").startswith("placeholder")] == ["placeholder-created"]
    mesh.deliver_from("C", "A")  # #2 reaches A, which passes it on ...
    mesh.deliver_from("A", "B", len(mesh.in_flight("A", "B")))  # ... fulfilling B's placeholder
    mesh.feed("B", CreditChanged(moved, 10))
    _k_gets_m1_then_m2_at_b(mesh, moved, origin="C")
    mesh.advance(2)
    assert {name: core.record_count() for name, core in mesh.cores.items()} == {"A": 0, "B": 0, "C": 0}


@pytest.mark.parametrize("x_at_b", [False, True], ids=["b-never-saw-1", "b-held-1-for-another"])
def test_a_copy_the_old_router_never_passes_on_stops_holding_the_subscriber_once_settled(x_at_b):
    """As above, but k's selector does not select #1: A never passes it on. B's wait for
    it ends when C settles #1, not at the placeholder timeout: B asked C whether it was
    settled and C tells it when it is; or, when B held #1 for x from before k came, C's
    settlement of B's own copy ends it."""
    from router.core.events import DataReceived, MessageReceived

    mesh = Mesh(*TRIANGLE, twins=True, record_linger=1.0)
    mesh.subscriber("A", "k", durable=2, timeout=60, selector="n > 1")
    x = mesh.subscriber("B", "x", durable=2, timeout=60) if x_at_b else None
    pub = mesh.publisher("C", name="p", container="P", rcv_first=True)
    mesh.feed("C", MessageReceived(pub, 1, b"1", encode("m1", properties={"n": 1}), False))
    assert [type(e) for e in mesh.in_flight("C", "A")] == [DataReceived]
    mesh.deliver_from("C", "B", len(mesh.in_flight("C", "B")))  # (and to B for x)
    moved = mesh.attach_subscriber(
        "B", "k", durable=2, timeout=60, selector="n > 1", properties={"eorouter:resume": True, "eorouter:unsettled": []}
    )
    mesh.deliver_from("B", "C", len(mesh.in_flight("B", "C")))
    mesh.deliver_from("C", "B", len(mesh.in_flight("C", "B")))
    mesh.deliver_from("B", "A", len(mesh.in_flight("B", "A")))
    mesh.deliver_from("A", "B", len(mesh.in_flight("A", "B")))
    assert any(c.kind == "placeholder-created" for c in mesh.logs["B"] if hasattr(c, "kind"))
    mesh.feed("C", MessageReceived(pub, 2, b"2", encode("m2", properties={"n": 2}), False))
    mesh.deliver_from("C", "B", len(mesh.in_flight("C", "B")))
    assert not mesh.forwarded("B", moved), "#2 waits: #1 may still come by way of A"
    mesh.settle()
    if x:
        for c in mesh.forwarded("B", x):
            mesh.answer("B", x, c.tag)
        mesh.settle()
    copies = mesh.forwarded("B", moved)
    assert [decode(c.payload).body for c in copies] == ["m2"]
    mesh.answer("B", moved, copies[0].tag)
    assert [c.outcome for d in (1, 2) for c in mesh.outcomes_for("C", d)] == [outcomes.ACCEPTED] * 2
    assert not any(c.kind == "placeholder-expired" for c in mesh.logs["B"] if hasattr(c, "kind"))


def test_a_subscriber_that_moved_gets_nothing_before_every_router_said_what_may_still_come():
    """As above, but C's answer to B's announcement is slower than the announce timeout.
    B answers k's attach then (its client would give up), but holds what it owes k until
    C's answer came (it names #1, still on its way by way of A): #2, which C sent B
    directly, goes to k after #1. Before, B delivered #2 at the timeout, and #1 after it."""
    from router.core.constants import ANNOUNCE_TIMEOUT
    from router.core.events import DataReceived, MessageReceived, TimerFired

    mesh = Mesh(*TRIANGLE, twins=True, record_linger=1.0)
    mesh.subscriber("A", "k", durable=2, timeout=60)
    pub = mesh.publisher("C", name="p", container="P", rcv_first=True)
    mesh.feed("C", MessageReceived(pub, 1, b"1", encode("m1"), False))
    moved = mesh.attach_subscriber(
        "B", "k", durable=2, timeout=60, properties={"eorouter:resume": True, "eorouter:unsettled": []}
    )
    mesh.deliver_from("B", "A", len(mesh.in_flight("B", "A")))  # A hears of it, and answers
    mesh.deliver_from("A", "B", len(mesh.in_flight("A", "B")))
    mesh.deliver_from("B", "C", len(mesh.in_flight("B", "C")))  # C hears; its answer stays in flight
    mesh.now += ANNOUNCE_TIMEOUT + 0.5
    mesh.feed("B", TimerFired())
    assert mesh.opened("B", moved), "B answers k's attach at the timeout"
    mesh.feed("C", MessageReceived(pub, 2, b"2", encode("m2"), False))
    (index,) = [i for i, item in enumerate(mesh.inflight) if item[2] == "B" and isinstance(item[3], DataReceived)]
    *_, m2 = mesh.inflight[index]
    del mesh.inflight[index]
    mesh.feed("B", m2)  # #2 reaches B before C's answer (data and control are separate links)
    assert not mesh.forwarded("B", moved), "#2 waits for C's answer"
    mesh.deliver_from("C", "B")  # C's answer, naming #1
    assert not mesh.forwarded("B", moved), "#2 waits for #1"
    _k_gets_m1_then_m2_at_b(mesh, moved, origin="C")


def test_a_copy_reaching_the_old_router_past_its_grace_is_owed_by_its_origin():
    """#1, which C sent A before it heard that k moved to B, reaches A more than the grace
    after A gave k up: A no longer passes it on, but tells C it left k out ("left"), and
    C, whose answer to B's announcement named #1, owes it to k itself. Before, #1 was
    lost for k and p heard "released" (found by the generated histories with a long
    pause)."""
    from router.core.events import DataReceived, MessageReceived, TimerFired
    from router.core.moved import MOVED_AWAY_GRACE

    mesh = Mesh(*TRIANGLE, twins=True, record_linger=1.0)
    mesh.subscriber("A", "k", durable=2, timeout=60)
    pub = mesh.publisher("C", name="p", container="P", rcv_first=True)
    mesh.feed("C", MessageReceived(pub, 1, b"1", encode("m1"), False))
    (copy,) = mesh.in_flight("C", "A")
    assert isinstance(copy, DataReceived)
    moved = mesh.attach_subscriber(
        "B", "k", durable=2, timeout=60, properties={"eorouter:resume": True, "eorouter:unsettled": []}
    )
    for source, target in (("B", "C"), ("C", "B"), ("B", "A"), ("A", "B")):
        mesh.deliver_from(source, target, len([e for e in mesh.in_flight(source, target) if e is not copy]))
    mesh.now += MOVED_AWAY_GRACE + 1
    for name in mesh.cores:
        mesh.feed(name, TimerFired())
    mesh.settle()
    copies = mesh.forwarded("B", moved)
    assert [decode(c.payload).body for c in copies] == ["m1"]
    mesh.answer("B", moved, copies[0].tag)
    assert [c.outcome for c in mesh.outcomes_for("C", 1)] == [outcomes.ACCEPTED]
    mesh.advance(2)
    assert {name: core.record_count() for name, core in mesh.cores.items()} == {"A": 0, "B": 0, "C": 0}


def test_a_subscriber_that_moved_twice_is_passed_a_copy_by_both_its_old_routers_and_answers_both():
    """k moves from A to B and on to C, p's router, within A's and B's grace; each takes
    it over and passes on what comes for it. C sends #1 to A and B (their retained
    entries for k still count there) and to k directly; A and B each address a copy of
    it to k at C. k's answer must reach both: before, the second copy's router replaced
    the first's, which never answered C, and p never heard (found under CPU load by
    tests/failover/test_moving_subscribers.py: 42 deliveries stuck until shutdown)."""
    from router.core.events import MessageReceived

    mesh = Mesh(*TRIANGLE, twins=True, record_linger=1.0)
    mesh.subscriber("A", "k", durable=2, timeout=60)
    pub = mesh.publisher("C", name="p", container="P", rcv_first=True)
    for to in ("B", "C"):
        last = mesh.subscriber(to, "k", durable=2, timeout=60, properties={"eorouter:resume": True, "eorouter:unsettled": []})
    mesh.feed("C", MessageReceived(pub, 1, b"1", encode("m1"), False))
    mesh.settle()
    for c in mesh.forwarded("C", last):
        mesh.answer("C", last, c.tag)
    assert [decode(c.payload).body for c in mesh.forwarded("C", last)] == ["m1"]
    assert [c.outcome for c in mesh.outcomes_for("C", 1)] == [outcomes.ACCEPTED]
    mesh.advance(2)
    assert {name: core.record_count() for name, core in mesh.cores.items()} == {"A": 0, "B": 0, "C": 0}


# C never saw #1: it reaches C only as A's copy, once A noticed the old link drop.
@pytest.mark.parametrize(
    "to, answer_first",
    [("B", True), ("B", False), ("C", False)],
    ids=["to-the-origin-answered-before-A-noticed", "to-the-origin", "to-a-third-router"],
)
def test_a_live_router_whose_subscriber_moved_away_answers_the_origin_for_it(to, answer_first):
    """Only the subscriber's link to A was cut (A lives on): it resumes at ``to`` and
    accepts there; A sees its old link drop before or after that. The router it moved
    to answers A for it (a targeted copy) and leaves it out of its own answer, so A
    must answer the origin B with its outcome, not "none": else the outcome counts
    nowhere, and B never sends A the settlement that ends A's record."""
    mesh = Mesh(*TRIANGLE, record_linger=1.0)
    sub = mesh.subscriber("A", "k", durable=2, timeout=60)
    pub = mesh.publisher("B", name="p", container="P", rcv_first=True)
    d = mesh.publish("B", pub, b"1", body="one")
    (copy,) = mesh.forwarded("A", sub)
    resumed = _resume_subscriber(mesh, to, "k", [(copy.tag, "none")])
    if not answer_first:
        mesh.detach("A", sub)
    (again,) = mesh.forwarded(to, resumed)
    assert again.tag == copy.tag
    mesh.answer(to, resumed, again.tag)
    if answer_first:
        mesh.detach("A", sub)
    assert mesh.outcomes_for("B", d) == [SendOutcome(d, outcomes.ACCEPTED, True)]
    mesh.advance(2)
    assert {name: core.record_count() for name, core in mesh.cores.items()} == {"A": 0, "B": 0, "C": 0}


def _finish_at_a_unheard(mesh, subscribers):
    """Publisher on A, one durable subscriber per router named in ``subscribers``:
    #1 is accepted by all and settled by A (rcv-settle-mode first), but the publisher
    never hears (its link to A is cut). Returns (incarnation, subscriber links, payload)."""
    subs = {r: mesh.subscriber(r, f"k{r}", durable=2, timeout=60) for r in subscribers}
    pub = mesh.publisher("A", name="p", container="P", rcv_first=True)
    incarnation = open_properties(mesh, "A", pub)[INCARNATION_PROPERTY]
    payload = encode("m1")
    d = mesh.publish("A", pub, b"1", payload=payload)
    for r, link in subs.items():
        (copy,) = mesh.forwarded(r, link)
        mesh.answer(r, link, copy.tag)
    assert mesh.outcomes_for("A", d) == [SendOutcome(d, outcomes.ACCEPTED, True)]
    mesh.advance(2)  # every record lingers out: only the settled tags are left
    assert all(core.record_count() == 0 for core in mesh.cores.values())
    return incarnation, subs, payload


@pytest.mark.parametrize("subscribers", ["ABC", "AC"], ids=["B-took-part", "B-never-saw-it"])
def test_a_resend_of_a_delivery_finished_while_its_publisher_was_cut_off_gets_the_outcome_it_had(subscribers):
    """The publisher resumes at B and resends #1, which A finished and every router
    forgot. If B took part (its subscriber accepted it) it answers at once with the
    outcome A settled it with; if B never saw it, A and C answer its copy with that
    outcome. Either way the publisher gets "accepted" and no subscriber gets it twice."""
    mesh = Mesh(*TRIANGLE, record_linger=1.0)
    incarnation, subs, payload = _finish_at_a_unheard(mesh, subscribers)
    resumed = _resume_publisher(mesh, "B", incarnation, [b"1"])
    d = mesh.publish("B", resumed, b"1", payload=payload)
    assert mesh.outcomes_for("B", d) == [SendOutcome(d, outcomes.ACCEPTED, True)]
    assert all(len(mesh.forwarded(r, link)) == 1 for r, link in subs.items()), "nobody got it twice"
    mesh.advance(2)
    assert all(core.record_count() == 0 for core in mesh.cores.values())


@pytest.mark.parametrize("where", ["B", "C"], ids=["subscriber-at-the-origin", "subscriber-elsewhere"])
def test_a_reused_tag_is_a_new_delivery_even_where_the_old_one_is_remembered_settled(where):
    """A publisher may reuse a settled tag (AMQP allows it); only a resumed link's
    resend of a tag it reported unsettled is answered from the settled-tag memory.
    Routers that remember the first use settled take the second as new, and name it
    as the origin does."""
    mesh = Mesh(*TRIANGLE, record_linger=1.0)
    sub = mesh.subscriber(where, "k", durable=2, timeout=60)
    pub = mesh.publisher("B", name="p", container="P", rcv_first=True)
    deliveries = []
    for body in ("one", "two"):
        deliveries.append(mesh.publish("B", pub, b"1", body=body))
        mesh.answer(where, sub, mesh.forwarded(where, sub)[-1].tag)
        assert mesh.outcomes_for("B", deliveries[-1]) == [SendOutcome(deliveries[-1], outcomes.ACCEPTED, True)]
        mesh.advance(2)  # the record lingers out: only the settled tag is left
        assert all(core.record_count() == 0 for core in mesh.cores.values())
    got = mesh.forwarded(where, sub)
    assert [decode(c.payload).body for c in got] == ["one", "two"]
    assert [e.fields["delivery"] for e in mesh.logs[where] if e.kind == "received"] == [got[0].tag.hex(), got[0].tag.hex() + ".1"]


def test_a_resumed_subscriber_sees_the_settlement_of_a_delivery_settled_before_the_resend():
    """It accepted #1 (rcv-settle-mode second, so it holds it unsettled), lost its
    connection and resumed reporting #1, with no credit yet; the publisher settled
    #1 before the router could re-send it on the new link. The re-send still goes
    when credit comes, followed by the settlement: else the subscriber would hold
    #1 unsettled for ever."""
    from router.core.commands import Forward, SettleOutgoing
    from router.core.events import CreditChanged, OutcomeReceived

    mesh = Mesh("A", [], record_linger=30.0)
    sub = mesh.subscriber("A", "k", durable=2, timeout=60)
    pub = mesh.publisher("A")
    d = mesh.publish("A", pub, b"1")
    (copy,) = mesh.forwarded("A", sub)
    mesh.feed("A", OutcomeReceived(sub, copy.tag, outcomes.ACCEPTED, False))
    mesh.settle()
    assert mesh.outcomes_for("A", d) == [SendOutcome(d, outcomes.ACCEPTED)]
    mesh.detach("A", sub)
    resumed = mesh.subscriber(
        "A",
        "k",
        credit=0,
        durable=2,
        timeout=60,
        properties={"eorouter:resume": True, "eorouter:unsettled": [[copy.tag, "accepted"]]},
    )
    mesh.settle_publisher("A", pub, d)
    assert mesh.cores["A"].record_count() == 1, "kept until the subscriber saw the settlement"
    mesh.feed("A", CreditChanged(resumed, 10))
    mesh.settle()
    on_new_link = [c for c in mesh.client["A"] if isinstance(c, (Forward, SettleOutgoing)) and c.link_id == resumed]
    assert [(type(c).__name__, c.tag) for c in on_new_link] == [("Forward", copy.tag), ("SettleOutgoing", copy.tag)]


def test_copies_an_origin_owes_a_dead_routers_subscriber_go_out_before_later_ones_it_sent_its_new_router():
    """Found by the generated histories: A dies with #1, which C sent it for k, on its
    way; k (which never got it) resumes at B, where x subscribed after #1. C owes #1 to
    k, A's durable subscriber, and sends it to B addressed to k once it hears where k
    is; but #2, sent to B for x, was there first, owed to k as well. C's answer to B's
    announcement of k overtook the copy of #1 (control and data are separate links) and
    did not name it: k got #2 before #1. It names what C itself sends k there now."""
    from router.core.events import ControlReceived, DataReceived, MessageReceived

    mesh = Mesh(*TRIANGLE, twins=True, record_linger=1.0)
    mesh.subscriber("A", "k", durable=2, timeout=60)
    pub = mesh.publisher("C", name="p", container="P", rcv_first=True)
    mesh.feed("C", MessageReceived(pub, 1, b"1", encode("m1"), False))
    (m1_to_a,) = mesh.in_flight("C", "A")
    assert isinstance(m1_to_a, DataReceived), "#1 on its way to A"
    x = mesh.attach_subscriber("B", "x", durable=2, timeout=60)
    mesh.kill("A")  # (kill settles everything else: x is subscribed)
    moved = mesh.attach_subscriber(
        "B", "k", durable=2, timeout=60, properties={"eorouter:resume": True, "eorouter:unsettled": []}
    )
    mesh.feed("C", MessageReceived(pub, 2, b"2", encode("m2"), False))
    mesh.deliver_from("C", "B", len(mesh.in_flight("C", "B")))  # #2, for x (and k, attached here)
    mesh.deliver_from("B", "C", len(mesh.in_flight("B", "C")))  # C hears of k at B: #1 goes there, addressed to k
    (ack,) = [e for e in mesh.in_flight("C", "B") if isinstance(e, ControlReceived) and e.messages[0]["t"] == "sub-ack"]
    assert m1_to_a.tag.hex() in ack.messages[0].get("moved", ()), "C's answer names #1"
    mesh.inflight = deque(sorted(mesh.inflight, key=lambda item: not isinstance(item[3], ControlReceived)))
    mesh.deliver_from("C", "B")  # the answer first
    mesh.settle()
    copies = mesh.forwarded("B", moved)
    assert [decode(c.payload).body for c in copies] == ["m1", "m2"]
    _all_accept_at_b(mesh, [moved, x], "C", (1, 2))
    mesh.advance(2)
    assert {name: core.record_count() for name, core in mesh.cores.items() if name != "A"} == {"B": 0, "C": 0}


def _publisher_settles_and_every_record_ends(mesh, router: str, link, deliveries) -> None:
    """The publisher on ``link`` at ``router`` settles ``deliveries``; once the routers'
    timers ran, no router holds a record."""
    for d in deliveries:
        mesh.settle_publisher(router, link, d)
    mesh.advance(2)
    mesh.advance(2)
    assert {name: core.record_count() for name, core in mesh.cores.items()} == {"A": 0, "B": 0, "C": 0}


def _all_accept_at_b(mesh, links, origin: str, deliveries) -> None:
    """The subscribers on ``links`` at B accept every copy they were sent; the publisher
    hears "accepted" at ``origin`` for each of ``deliveries``."""
    for link in links:
        for copy in mesh.forwarded("B", link):
            mesh.answer("B", link, copy.tag)
    assert [c.outcome for d in deliveries for c in mesh.outcomes_for(origin, d)] == [outcomes.ACCEPTED] * len(deliveries)


def test_a_new_origin_reports_to_the_router_that_passed_its_subscriber_a_copy():
    """Found by the generated histories: #1, which C sent A, reaches A after k moved on
    to B; A passes it on to B, addressed to k, and waits for k's answer. Then p resumes
    at B: B takes over as origin (C, alive, hands the delivery over and forgets it). As
    origin B counts k itself, but it also wiped who had addressed k its copy: it never
    told A k's answer, A never answered, nobody settled with A, and A held its record
    for ever."""
    from router.core.events import LinkDetached, MessageReceived

    mesh = Mesh(*TRIANGLE, twins=True, record_linger=1.0)
    k = mesh.subscriber("A", "k", durable=2, timeout=60)
    pub = mesh.publisher("C", name="p", container="P")
    incarnation = open_properties(mesh, "C", pub)[INCARNATION_PROPERTY]
    mesh.feed("C", MessageReceived(pub, 1, b"1", encode("m1"), False))  # on its way to A
    moved = mesh.attach_subscriber(
        "B", "k", durable=2, timeout=60, properties={"eorouter:resume": True, "eorouter:unsettled": []}
    )
    mesh.feed("A", LinkDetached(k, False))
    mesh.settle()
    (copy,) = mesh.forwarded("B", moved)
    assert decode(copy.payload).body == "m1", "A passed #1 on to k at B"
    resumed = resume_publisher(mesh, "B", incarnation, [[b"1", "none"]])
    mesh.feed("B", MessageReceived(resumed, 2, b"1", encode("m1"), False))
    mesh.settle()
    mesh.answer("B", moved, copy.tag)
    assert [c.outcome for c in mesh.outcomes_for("B", 2)] == [outcomes.ACCEPTED]
    _publisher_settles_and_every_record_ends(mesh, "B", resumed, (2,))


def _x_joins_at_b_then_p_resumes_at(router: str):
    """k at A; x attaches at B while p publishes at C: #1 goes to A only (C has not heard
    of x yet), #2 to A and B, and x gets #2. Then p resumes at ``router``, resending both.
    Returns (mesh, k's link, x's link, p's resumed link)."""
    from router.core.events import MessageReceived

    mesh = Mesh(*TRIANGLE, twins=True, record_linger=1.0)
    k = mesh.subscriber("A", "k", durable=2, timeout=60)
    pub = mesh.publisher("C", name="p", container="P")
    incarnation = open_properties(mesh, "C", pub)[INCARNATION_PROPERTY]
    x = mesh.attach_subscriber("B", "x", durable=2, timeout=60)
    mesh.feed("C", MessageReceived(pub, 1, b"1", encode("m1"), False))
    mesh.settle()
    mesh.feed("C", MessageReceived(pub, 2, b"2", encode("m2"), False))
    mesh.settle()
    assert [decode(c.payload).body for c in mesh.forwarded("B", x)] == ["m2"]
    resumed = resume_publisher(mesh, router, incarnation, [[b"1", "none"], [b"2", "none"]])
    for d, n in ((3, b"1"), (4, b"2")):
        mesh.feed(router, MessageReceived(resumed, d, n, encode(f"m{int(n)}"), False))
    mesh.settle()
    return mesh, k, x, resumed


@pytest.mark.parametrize("resumes_at", ["A", "B"], ids=["at-a-new-origin-sends-b", "at-b-itself"])
def test_a_joining_subscriber_gets_nothing_older_than_what_it_had_when_its_publisher_resumes(resumes_at):
    """Found by the generated histories: x attaches at B while p publishes at C; #1 goes
    to A only (k is there; C has not heard of x yet), #2 to A and B, and x gets #2. C
    never sent B #1 (#2 was the first of the stream it sent B), so nobody at B was owed
    it. Then p resumes and resends both: at A, which takes them over and sends them to
    every router interested now, B got #1 as new and gave it to x after #2 (now B
    answers A "none"); at B itself, B took the resend of #1, which it never saw, as a
    new delivery owed to x (now it is owed only to subscribers that moved to B or wait
    for it)."""
    mesh, k, x, resumed = _x_joins_at_b_then_p_resumes_at(resumes_at)
    assert [decode(c.payload).body for c in mesh.forwarded("B", x)] == ["m2"], "nothing older after it"
    assert [decode(c.payload).body for c in mesh.forwarded("A", k)] == ["m1", "m2"]
    for link, router in ((k, "A"), (x, "B")):
        for c in mesh.forwarded(router, link):
            mesh.answer(router, link, c.tag)
    assert [c.outcome for d in (3, 4) for c in mesh.outcomes_for(resumes_at, d)] == [outcomes.ACCEPTED] * 2
    _publisher_settles_and_every_record_ends(mesh, resumes_at, resumed, (3, 4))


def test_a_resend_the_new_origin_never_saw_keeps_its_first_routers_number():
    """Found by the generated histories: as above, x at B had #2 from C, never #1, when p
    resumed at B. B numbered its resend of #1 on from the highest number any router had
    seen, after #2 (C's number), as it numbers new deliveries. Then k, which had both at
    A and answered neither, moved to B: A passed both on to it, and B, keeping a stream
    in its numbers' order, sent #2 first. The routers that hold a resumed publisher's
    deliveries now tell its new router their numbers, and a resend keeps its number."""
    from router.core.events import LinkDetached

    mesh, k, x, resumed = _x_joins_at_b_then_p_resumes_at("B")
    numbers = {c.fields["pub_tag"]: c.fields["stream_seq"] for c in mesh.logs["B"] if c.kind == "received"}
    assert numbers == {"31": 0, "32": 1}, "C's numbers, whichever way each came to B"
    moved = mesh.attach_subscriber(
        "B", "k", durable=2, timeout=60, properties={"eorouter:resume": True, "eorouter:unsettled": []}
    )
    mesh.feed("A", LinkDetached(k, False))
    mesh.settle()
    copies = mesh.forwarded("B", moved)
    assert [decode(c.payload).body for c in copies] == ["m1", "m2"]
    _all_accept_at_b(mesh, [moved, x], "B", (3, 4))


@pytest.mark.parametrize("subscriber_first", [True, False], ids=["k-first", "p-first"])
def test_a_subscriber_moved_to_the_new_origin_waits_for_the_publishers_earlier_resends(subscriber_first):
    """Found by the generated histories: p moved from C to A, which took its deliveries
    over; A died with k's copies of #1 and #2, and x at B had #2 only. k and p both went
    to B: B, origin now, owed #2 (from A) to k at once, and sent it before p resent #1,
    which B never saw. p's list says #1 came first: k now waits for it (attached before
    p resumed, or after, before p resent anything)."""
    from router.core.events import MessageReceived

    mesh = Mesh(*TRIANGLE, twins=True, record_linger=1.0)
    k = mesh.subscriber("A", "k", durable=2, timeout=60)
    pub = mesh.publisher("C", name="p", container="P")
    incarnation = open_properties(mesh, "C", pub)[INCARNATION_PROPERTY]
    x = mesh.attach_subscriber("B", "x", durable=2, timeout=60)
    mesh.feed("C", MessageReceived(pub, 1, b"1", encode("m1"), False))  # before C heard of x
    mesh.settle()
    mesh.feed("C", MessageReceived(pub, 2, b"2", encode("m2"), False))
    mesh.settle()
    assert [decode(c.payload).body for c in mesh.forwarded("A", k)] == ["m1", "m2"], "k never answers them"
    at_a = resume_publisher(mesh, "A", incarnation, [[b"1", "none"], [b"2", "none"]])
    for d, n in ((3, b"1"), (4, b"2")):
        mesh.feed("A", MessageReceived(at_a, d, n, encode(f"m{int(n)}"), False))
    mesh.settle()
    mesh.kill("A")
    if not subscriber_first:
        at_b = resume_publisher(mesh, "B", incarnation, [[b"1", "none"], [b"2", "none"]])
        mesh.settle()
    moved = mesh.attach_subscriber(
        "B", "k", durable=2, timeout=60, properties={"eorouter:resume": True, "eorouter:unsettled": []}
    )
    if subscriber_first:
        at_b = resume_publisher(mesh, "B", incarnation, [[b"1", "none"], [b"2", "none"]])
    mesh.settle()
    assert mesh.forwarded("B", moved) == [], "#2 waits for #1"
    for d, n in ((5, b"1"), (6, b"2")):
        mesh.feed("B", MessageReceived(at_b, d, n, encode(f"m{int(n)}"), False))
    mesh.settle()
    copies = mesh.forwarded("B", moved)
    assert [decode(c.payload).body for c in copies] == ["m1", "m2"]
    _all_accept_at_b(mesh, [moved, x], "B", (5, 6))


def test_a_copy_the_old_origin_passed_to_a_moved_subscriber_counts_for_the_new_origin():
    """Found by the generated histories: k moved from A to B; #1, which C sent A before
    it heard, reached A past the grace A passes copies on for k, so A told C it left k
    out, and C sent #1 to B addressed to k (k answers C for it). Then p resumed at A
    (the router k had left): C handed the delivery over to A and forgot it, and A sent
    B its copy. B answered A "none" (its only subscriber owed #1 answered C), k's answer
    went to C, which no longer held it, and p heard "released" for what k accepted."""
    from router.core.events import LinkDetached, MessageReceived, TimerFired
    from router.core.moved import MOVED_AWAY_GRACE

    mesh = Mesh(*TRIANGLE, twins=True, record_linger=1.0)
    k = mesh.subscriber("A", "k", durable=2, timeout=600)
    pub = mesh.publisher("C", name="p", container="P")
    incarnation = open_properties(mesh, "C", pub)[INCARNATION_PROPERTY]
    moved = mesh.attach_subscriber(
        "B", "k", durable=2, timeout=600, properties={"eorouter:resume": True, "eorouter:unsettled": []}
    )
    mesh.feed("A", LinkDetached(k, False))
    mesh.feed("C", MessageReceived(pub, 1, b"1", encode("m1"), False))  # C has not heard: to A
    mesh.deliver_from("B", "A", len(mesh.in_flight("B", "A")))  # A hears k is at B
    mesh.now += MOVED_AWAY_GRACE + 1
    for name in mesh.cores:
        mesh.feed(name, TimerFired())
    mesh.settle()
    assert any(c.kind == "owed-moved" for c in mesh.logs["C"] if isinstance(c, Log)), "C owes k #1 itself"
    (copy,) = mesh.forwarded("B", moved)
    resumed = resume_publisher(mesh, "A", incarnation, [[b"1", "none"]])
    mesh.settle()
    mesh.feed("A", MessageReceived(resumed, 2, b"1", encode("m1"), False))
    mesh.settle()
    assert mesh.outcomes_for("A", 2) == [], "k has not answered"
    mesh.answer("B", moved, copy.tag)
    assert [c.outcome for c in mesh.outcomes_for("A", 2)] == [outcomes.ACCEPTED]
    _publisher_settles_and_every_record_ends(mesh, "A", resumed, (2,))


def test_a_router_that_answered_before_the_resend_came_hears_the_end():
    """Found by tests/failover/test_moving_subscribers.py (the publisher moving too): k
    accepted #1 at A, which answered C; p never heard (cut off) and resumed at B, where k
    had moved. A, hearing p is at B, answered B, before B had any record of #1: B
    dropped the answer, made its record from p's resend, finished it without A (nobody
    at A is owed it now), and A held its record for ever. A router that says it holds a
    listed delivery (its stream-seq answer) is now sent the resend's settlement."""
    from router.core.events import LinkDetached, MessageReceived

    mesh = Mesh(*TRIANGLE, twins=True, record_linger=1.0)
    k = mesh.subscriber("A", "k", durable=2, timeout=60)
    pub = mesh.publisher("C", name="p", container="P")
    incarnation = open_properties(mesh, "C", pub)[INCARNATION_PROPERTY]
    mesh.feed("C", MessageReceived(pub, 1, b"1", encode("m1"), False))
    mesh.settle()
    (copy,) = mesh.forwarded("A", k)
    mesh.answer("A", k, copy.tag, settled=False)  # accepted; settled only once A settles
    assert [c.outcome for c in mesh.outcomes_for("C", 1)] == [outcomes.ACCEPTED], "p never hears it"
    moved = mesh.attach_subscriber(
        "B", "k", durable=2, timeout=60, properties={"eorouter:resume": True, "eorouter:unsettled": [[copy.tag, "accepted"]]}
    )
    mesh.feed("A", LinkDetached(k, False))
    mesh.settle()
    resumed = resume_publisher(mesh, "B", incarnation, [[b"1", "none"]])
    mesh.settle()  # A answers B, which holds no record of #1 yet
    mesh.feed("B", MessageReceived(resumed, 2, b"1", encode("m1"), False))
    mesh.settle()
    for again in mesh.forwarded("B", moved):
        mesh.answer("B", moved, again.tag)
    assert [c.outcome for c in mesh.outcomes_for("B", 2)] == [outcomes.ACCEPTED]
    _publisher_settles_and_every_record_ends(mesh, "B", resumed, (2,))


def _settle_holding(mesh, held_back) -> list:
    """Deliver everything in flight (and whatever that causes) but the messages
    ``held_back(target, event)`` picks (held up on their busy links); returns those."""
    held = []
    while mesh.inflight:
        pair, conn, target, event = item = mesh.inflight.popleft()
        if held_back(target, event):
            held.append(item)
        elif mesh.links.get(pair) == conn:
            mesh.feed(target, event)
    return held


@pytest.mark.parametrize("order", ["news-copy-stale", "copy-stale-news"])
def test_a_stale_copy_from_the_old_origin_does_not_take_the_delivery_back(order):
    """Found by tests/failover/test_moving_subscribers.py under CPU load: C sent #1 to A
    and B; p, cut off from C, resumed at B, which took over and sent A its copy; C heard,
    handed the delivery over and forgot it. C's own copy, held up on its busy link, then
    reached A after B's: A took C for the origin again and answered C, which no longer
    held #1, and B waited for A for ever (p got no outcome). A copy moves a delivery to
    the router it came from only if that is where its publisher last resumed, as heard
    here (or nothing was heard: then the news, when it comes, settles it)."""
    from router.core.events import PUBLISHER, ControlReceived, DataReceived, LinkAttached, MessageReceived

    mesh = Mesh(*TRIANGLE, twins=True, record_linger=1.0)
    k = mesh.subscriber("A", "k", durable=2, timeout=60)
    j = mesh.subscriber("B", "j", durable=2, timeout=60)
    pub = mesh.publisher("C", name="p", container="P")
    incarnation = open_properties(mesh, "C", pub)[INCARNATION_PROPERTY]
    mesh.feed("C", MessageReceived(pub, 1, b"1", encode("m1"), False))
    stale = _settle_holding(mesh, lambda to, ev: to == "A" and ev.router_id == "C" and isinstance(ev, DataReceived))
    assert len(stale) == 1, "C's copy of #1 to A is held up"
    properties = {INCARNATION_PROPERTY: incarnation, "eorouter:resume": True, "eorouter:unsettled": [[b"1", "none"]]}
    mesh.feed("B", LinkAttached(500, 500, "P", "p", PUBLISHER, "t", rcv_settle_mode=1, properties=properties))
    if order == "news-copy-stale":
        mesh.settle()  # A hears p resumed at B, then has B's copy
        mesh.inflight.extend(stale)
    else:
        news = _settle_holding(mesh, lambda to, ev: to == "A" and isinstance(ev, ControlReceived))
        assert any(m.get("t") == "stream-resumed" for item in news for m in item[3].messages), "A has not heard yet"
        mesh.inflight.extend(stale + news)  # B's copy first, then C's, then the news
    mesh.settle()
    mesh.feed("B", MessageReceived(500, 2, b"1", encode("m1"), False))
    mesh.settle()
    assert [e.fields.get("to_router") for e in mesh.logs["C"] if e.kind == "origin-taken-over"] == ["B"]
    (k_copy,) = mesh.forwarded("A", k)
    mesh.answer("A", k, k_copy.tag)
    for copy in mesh.forwarded("B", j):
        mesh.answer("B", j, copy.tag)
    assert [c.outcome for c in mesh.outcomes_for("B", 2)] == [outcomes.ACCEPTED]
    _publisher_settles_and_every_record_ends(mesh, "B", 500, (2,))


def test_a_subscriber_keeps_what_a_router_made_a_placeholder_for_and_is_not_sent_it_as_new_after():
    """Found by tests/failover/test_moving_subscribers.py under CPU load (the proof
    called it a duplicate; our client's dedup window hid it from the application): k
    accepted #1 at A (unsettled: C's publisher never settled, its connection dark) and
    moved to B, which never saw #1 and made a placeholder for it, but left it out of its
    answer, which says "settled, forget it". k then moved on to C, reporting nothing: C,
    holding #1 unsettled, took it for one k never got and sent it as new. A placeholder
    is in the answer, with the state k reported: it keeps the tag until a router that
    knows it settled leaves it out."""
    from router.core.events import LinkDetached, MessageReceived

    mesh = Mesh(*TRIANGLE, twins=True, record_linger=1.0)
    k = mesh.subscriber("A", "k", durable=2, timeout=60)
    pub = mesh.publisher("C", name="p", container="P")
    mesh.feed("C", MessageReceived(pub, 1, b"1", encode("m1"), False))
    mesh.settle()
    (copy,) = mesh.forwarded("A", k)
    _accept_unsettled(mesh, "A", k, copy.tag)
    assert [c.outcome for c in mesh.outcomes_for("C", 1)] == [outcomes.ACCEPTED], "p has not settled"
    held = [[copy.tag, "accepted"]]
    for router in ("B", "C"):
        link = _resume_subscriber(mesh, router, "k", held)
        mesh.feed("A" if router == "B" else "B", LinkDetached(k, False))
        mesh.settle()
        answer = open_properties(mesh, router, link)["eorouter:unsettled"]
        held = [[tag, state] for tag, state in held if tag in {bytes(t) for t, _ in answer}]  # what a client keeps
        assert held == [[copy.tag, "accepted"]], f"{router} lists #1 in its answer"
        k = link
    assert {c.tag for c in mesh.forwarded("C", k)} <= {tag for tag, _ in held}, "C sends k nothing it does not hold"
    for again in mesh.forwarded("C", k):
        mesh.answer("C", k, again.tag)
    _publisher_settles_and_every_record_ends(mesh, "C", pub, (1,))


def test_a_placeholder_the_subscriber_did_not_report_gets_no_settling_transfer():
    """Only a tag the subscriber holds is settled on its link: a placeholder made for a
    copy another router said it was sending (the subscriber never had it) just goes."""
    mesh = Mesh(*TRIANGLE)
    k = mesh.subscriber("C", "k", durable=2, timeout=60)
    core = mesh.cores["C"]
    sub = next(s for s in core.subscriptions.values() if s.link_id == k)
    out: list = []
    tag = b"\x01" * 16 + b"\x011"
    core.resumption.await_moved(sub, tag, mesh.now, out)
    assert tag in sub.placeholders[tag[:16]] and tag not in sub.listed
    core.resumption.placeholder_settled(tag, mesh.now, out)
    assert not [c for c in out if isinstance(c, Forward)]


def test_a_listed_tag_is_settled_only_on_the_link_whose_answer_listed_it():
    """The subscriber detached after C's answer listed a placeholder and came back
    without resuming (a fresh client holds no such tag): when the delivery turns out
    settled, nothing is sent under the tag on the new link."""
    from router.core.events import LinkDetached

    mesh = Mesh(*TRIANGLE)
    tag = b"\x01" * 16 + b"\x011"
    k = _resume_subscriber(mesh, "C", "k", [[tag, "accepted"]])
    core = mesh.cores["C"]
    sub = next(s for s in core.subscriptions.values() if s.link_id == k)
    assert tag in sub.listed, "listed in C's answer"
    mesh.feed("C", LinkDetached(k, False))
    again = mesh.subscriber("C", "k", durable=2, timeout=60)
    out: list = []
    core.resumption.placeholder_settled(tag, mesh.now, out)
    assert not [c for c in out if isinstance(c, Forward)] and not mesh.forwarded("C", again)


# ------------------------------------------------------------------ the dead origin's own subscribers


@pytest.mark.parametrize("subscriber_first", [False, True])
def test_takeover_owes_the_dead_origins_own_subscribers(subscriber_first):
    """A took #1 from its publisher and owed it to its own durable subscriber, then
    died before that subscriber got it. The publisher resumes at B; B, origin now,
    must not answer before that subscriber, re-attached at B, has it and answered
    (whether it re-attaches before or after the publisher resumes)."""
    mesh = Mesh(*TRIANGLE)
    mesh.subscriber("A", "sa", durable=2, timeout=60)
    sb = mesh.subscriber("B", "sb", durable=2, timeout=60)
    pub = mesh.publisher("A", name="p", container="P")
    incarnation = open_properties(mesh, "A", pub)[INCARNATION_PROPERTY]
    payload = encode("one")
    mesh.publish("A", pub, b"1", payload=payload)
    mesh.answer("B", sb, mesh.forwarded("B", sb)[0].tag)
    mesh.kill("A")  # its copy to its own subscriber never left
    if subscriber_first:
        sa = _resume_subscriber(mesh, "B", "sa", [])
    resumed = resume_publisher(mesh, "B", incarnation, [[b"1", "none"]])
    delivery = mesh.publish("B", resumed, b"1", payload=payload)
    if not subscriber_first:
        assert mesh.outcomes_for("B", delivery) == [], "A's subscriber has not had it yet"
        sa = _resume_subscriber(mesh, "B", "sa", [])
    copies = mesh.forwarded("B", sa)
    assert [decode(c.payload).body for c in copies] == ["one"]
    assert mesh.outcomes_for("B", delivery) == []
    mesh.answer("B", sa, copies[0].tag)
    assert [c.outcome for c in mesh.outcomes_for("B", delivery)] == [outcomes.ACCEPTED]


# ------------------------------------------------------------------ a resend while the record lingers


@pytest.mark.parametrize("linger", [30.0, 0.5], ids=["record-lingering", "record-forgotten"])
def test_a_resend_reaching_the_origin_while_its_settled_record_lingers_is_answered(linger):
    """Issue 16, part 3: the subscriber is on A with the publisher; A finished #1 and
    settled it (rcv-settle-mode first) as the publisher's connection was cut, so the
    publisher never heard. It resumes at B and resends #1; B, which never saw it,
    forwards it to A. A still holds its settled record (it lingers) or only the tag:
    either way A must answer B with the outcome it finished #1 with, or the
    publisher's resend never completes."""
    mesh = Mesh(*TRIANGLE, record_linger=linger)
    sub = mesh.subscriber("A", "k", durable=2, timeout=60)
    pub = mesh.publisher("A", name="p", container="P", rcv_first=True)
    incarnation = open_properties(mesh, "A", pub)[INCARNATION_PROPERTY]
    payload = encode("m1")
    d = mesh.publish("A", pub, b"1", payload=payload)
    (copy,) = mesh.forwarded("A", sub)
    mesh.answer("A", sub, copy.tag, settled=False)  # rcv-settle-mode second: A relays the settlement
    assert mesh.outcomes_for("A", d) == [SendOutcome(d, outcomes.ACCEPTED, True)]
    mesh.advance(1.0)
    assert mesh.cores["A"].record_count() == (1 if linger > 1.0 else 0)
    mesh.detach("A", pub)
    resumed = _resume_publisher(mesh, "B", incarnation, [b"1"])
    again = mesh.publish("B", resumed, b"1", payload=payload)
    assert mesh.outcomes_for("B", again) == [SendOutcome(again, outcomes.ACCEPTED, True)]
    assert len(mesh.forwarded("A", sub)) == 1, "A's subscriber did not get it twice"
    mesh.answer("A", sub, copy.tag)
    mesh.advance(60.0)
    assert all(core.record_count() == 0 for core in mesh.cores.values())


@pytest.mark.parametrize("linger", [30.0, 0.5], ids=["record-lingering", "record-forgotten"])
def test_a_resend_reaching_a_participant_while_its_settled_record_lingers_is_answered(linger):
    """The same at a router that took part: the subscriber is on C, the publisher on A.
    A finished #1 and settled it, and C, told so, holds its settled record until its
    subscriber (rcv-settle-mode second) shows it knows. A dies before the publisher
    heard; it resumes at B and resends #1, which B forwards to C. C must answer B with
    the outcome #1 was finished with, lingering record or remembered tag alike (it
    answered nothing while its record lingered, and B waited for ever)."""
    mesh = Mesh(*TRIANGLE, record_linger=linger)
    sub = mesh.subscriber("C", "k", durable=2, timeout=60)
    pub = mesh.publisher("A", name="p", container="P", rcv_first=True)
    incarnation = open_properties(mesh, "A", pub)[INCARNATION_PROPERTY]
    payload = encode("m1")
    d = mesh.publish("A", pub, b"1", payload=payload)
    (copy,) = mesh.forwarded("C", sub)
    mesh.answer("C", sub, copy.tag, settled=False)
    assert mesh.outcomes_for("A", d) == [SendOutcome(d, outcomes.ACCEPTED, True)]
    mesh.advance(1.0)
    assert mesh.cores["C"].record_count() == (1 if linger > 1.0 else 0)
    mesh.kill("A")
    resumed = _resume_publisher(mesh, "B", incarnation, [b"1"])
    again = mesh.publish("B", resumed, b"1", payload=payload)
    assert mesh.outcomes_for("B", again) == [SendOutcome(again, outcomes.ACCEPTED, True)]
    assert len(mesh.forwarded("C", sub)) == 1, "C's subscriber did not get it twice"
    mesh.answer("C", sub, copy.tag)
    mesh.advance(60.0)
    assert all(core.record_count() == 0 for name, core in mesh.cores.items() if name != "A")


# ------------------------------------------------------------------ publisher order across a resume


@pytest.mark.parametrize("subscribers", ["A", "C", "AC"])
def test_a_stream_resumed_at_a_router_that_never_saw_it_continues_its_numbering(subscribers):
    """Issue 16, part 2: the publisher sent #1-#3 at A (all finished, heard), then
    resumes at B, which never saw its stream (no subscriber there). #4 must be
    numbered after #3 wherever a subscriber is, at either end: B asks every router
    how far it saw the stream numbered before it gives the link credit."""
    from router.core.commands import GrantCredit
    from router.core.events import PUBLISHER, LinkAttached

    mesh = Mesh(*TRIANGLE, record_linger=0.5)
    subs = {r: mesh.subscriber(r, f"k{r}", durable=2, timeout=60) for r in subscribers}
    pub = mesh.publisher("A", name="p", container="P", rcv_first=True)
    incarnation = open_properties(mesh, "A", pub)[INCARNATION_PROPERTY]
    for n in (1, 2, 3):
        mesh.publish("A", pub, str(n).encode(), body=f"m{n}")
    for r, link in subs.items():
        for copy in mesh.forwarded(r, link):
            mesh.answer(r, link, copy.tag)
    mesh.detach("A", pub)
    mesh.advance(2)
    # The resumed attach: no credit until A and C have answered "stream-seq".
    mesh.feed(
        "B",
        LinkAttached(
            500,
            500,
            "P",
            "p",
            PUBLISHER,
            "t",
            rcv_settle_mode=0,
            properties={INCARNATION_PROPERTY: incarnation, "eorouter:resume": True, "eorouter:unsettled": []},
        ),
    )
    assert not [c for c in mesh.client["B"] if isinstance(c, GrantCredit) and c.link_id == 500]
    mesh.settle()
    assert [c for c in mesh.client["B"] if isinstance(c, GrantCredit) and c.link_id == 500]
    (continued,) = [e.fields["next_seq"] for e in mesh.logs["B"] if e.kind == "stream-seq-continued"]
    assert continued > 2
    mesh.publish("B", 500, b"4", body="m4")
    for r, link in subs.items():
        seq_of = {e.fields["delivery"]: e.fields["stream_seq"] for e in mesh.logs[r] if e.kind == "received"}
        copies = mesh.forwarded(r, link)
        assert [decode(c.payload).body for c in copies] == ["m1", "m2", "m3", "m4"]
        assert [seq_of[c.tag.hex()] for c in copies] == [0, 1, 2, continued], r


def test_a_stream_whose_every_router_died_continues_above_what_its_subscribers_have():
    """Found by `scripts/bench --failover`: the publisher and its only subscriber were
    on A, which numbered #1-#3 and died; the publisher resumes at B, and neither B nor
    C ever saw the stream (no subscriber there), so every answer says "nothing". The
    numbering must still continue above #3, which the subscriber already has: at 0,
    the proof called every later message out of order, and the receivers' order
    chains (prev <= their head) let any copy through. It continues at the resuming
    router's wall clock in microseconds, above any number a run of numbering that
    began earlier can have reached."""
    mesh = Mesh(*TRIANGLE, record_linger=0.5)
    sub = mesh.subscriber("A", "k", durable=2, timeout=60)
    pub = mesh.publisher("A", name="p", container="P", rcv_first=True)
    incarnation = open_properties(mesh, "A", pub)[INCARNATION_PROPERTY]
    for n in (1, 2, 3):
        mesh.publish("A", pub, str(n).encode(), body=f"m{n}")
    for copy in mesh.forwarded("A", sub):
        mesh.answer("A", sub, copy.tag)
    seq_at_a = [e.fields["stream_seq"] for e in mesh.logs["A"] if e.kind == "received"]
    assert seq_at_a == [0, 1, 2]
    mesh.kill("A")
    mesh.settle()
    moved = _resume_subscriber(mesh, "B", "k", [])
    resumed = _resume_publisher(mesh, "B", incarnation, [])
    mesh.settle()
    (continued,) = [e.fields["next_seq"] for e in mesh.logs["B"] if e.kind == "stream-seq-continued"]
    assert continued > max(seq_at_a)
    mesh.publish("B", resumed, b"4", body="m4")
    mesh.publish("B", resumed, b"5", body="m5")
    seq_of = {e.fields["delivery"]: e.fields["stream_seq"] for e in mesh.logs["B"] if e.kind == "received"}
    copies = mesh.forwarded("B", moved)
    assert [decode(c.payload).body for c in copies] == ["m4", "m5"]
    assert [seq_of[c.tag.hex()] for c in copies] == [continued, continued + 1]


def test_a_resumed_publisher_waits_for_its_numbering_no_longer_than_the_timeout():
    """A router that never answers (it went quiet, not yet noticed as gone) delays
    the resumed link's credit only by ``stream_seq_timeout``."""
    from router.core.commands import GrantCredit
    from router.core.events import PUBLISHER, LinkAttached

    mesh = Mesh(*TRIANGLE, stream_seq_timeout=2.0)
    pub = mesh.publisher("A", name="p", container="P")
    incarnation = open_properties(mesh, "A", pub)[INCARNATION_PROPERTY]
    mesh.detach("A", pub)
    mesh.feed(
        "B",
        LinkAttached(
            500,
            500,
            "P",
            "p",
            PUBLISHER,
            "t",
            properties={INCARNATION_PROPERTY: incarnation, "eorouter:resume": True, "eorouter:unsettled": []},
        ),
    )
    mesh.deliver_from("B", "C", len(mesh.in_flight("B", "C")))
    mesh.inflight = type(mesh.inflight)(x for x in mesh.inflight if x[2] != "A")  # A hears nothing
    mesh.settle()
    assert not [c for c in mesh.client["B"] if isinstance(c, GrantCredit) and c.link_id == 500], "waits for A"
    mesh.advance(2.5)
    assert [c for c in mesh.client["B"] if isinstance(c, GrantCredit) and c.link_id == 500]
    assert [e.fields["routers"] for e in mesh.logs["B"] if e.kind == "stream-seq-timeout"] == [["A"]]


# ------------------------------------------------------------------ the memory horizon (issue 16, part 1)


def _finish_unheard(mesh, where, count, pub_router="A"):
    """A publisher on ``pub_router`` whose ``count`` deliveries every subscriber (one
    per router in ``where``) accepted, settled with their outcome, while the
    publisher heard nothing (its link was being cut). Returns (incarnation, subs, payloads)."""
    subs = {r: mesh.subscriber(r, f"k{r}", credit=10_000, durable=2, timeout=600) for r in where}
    pub = mesh.publisher(pub_router, name="p", container="P", rcv_first=True)
    incarnation = open_properties(mesh, pub_router, pub)[INCARNATION_PROPERTY]
    payloads = {n: encode(f"m{n}") for n in range(1, count + 1)}
    for n in payloads:
        mesh.publish(pub_router, pub, str(n).encode(), payload=payloads[n])
    for r, link in subs.items():
        for copy in mesh.forwarded(r, link):
            mesh.answer(r, link, copy.tag)
    mesh.detach(pub_router, pub)
    mesh.advance(3)
    assert all(core.record_count() == 0 for core in mesh.cores.values())
    return incarnation, subs, payloads


@pytest.mark.parametrize("where", ["AB", "A"], ids=["B-took-part", "B-never-saw-it"])
def test_resends_are_answered_from_memory_however_busy_the_other_streams_were(where):
    """Issue 16, part 1: after the publisher's deliveries were finished unheard, other
    publishers settle far more deliveries than any router-wide memory of recent tags
    would hold. The resends at B are still answered with their outcome, and no
    subscriber gets one twice."""
    mesh = Mesh(*TRIANGLE, record_linger=0.5, max_in_flight_per_topic=20)
    incarnation, subs, payloads = _finish_unheard(mesh, where, 20)
    other = mesh.publisher("A", name="busy", container="Q", rcv_first=True)
    for n in range(2000):
        delivery = mesh.publish("A", other, str(n).encode(), body=f"q{n}")
        for r, link in subs.items():
            mesh.answer(r, link, mesh.forwarded(r, link)[-1].tag)
        assert [a.outcome for a in mesh.outcomes_for("A", delivery)] == [outcomes.ACCEPTED], n
    mesh.advance(3)
    resumed = _resume_publisher(mesh, "B", incarnation, [str(n).encode() for n in payloads])
    answers = [mesh.outcomes_for("B", mesh.publish("B", resumed, str(n).encode(), payload=payloads[n])) for n in payloads]
    assert [[a.outcome for a in answer] for answer in answers] == [[outcomes.ACCEPTED]] * 20
    for r, link in subs.items():
        bodies = [decode(c.payload).body for c in mesh.forwarded(r, link)]
        assert len(bodies) == len(set(bodies)) == 2020, f"nobody got one twice at {r}"


@pytest.mark.parametrize("where", ["AB", "A"], ids=["B-took-part", "B-never-saw-it"])
def test_a_resend_after_the_horizon_is_refused_visibly_never_delivered_twice(where):
    """The same, but the publisher comes back after the resume horizon: every router
    that took part forgot its stream. Its resends are refused with
    eorouter:resend-beyond-horizon (rejected: do not resend blindly) and logged, and
    no subscriber gets them again."""
    mesh = Mesh(*TRIANGLE, record_linger=0.5, resume_horizon=40.0)
    incarnation, subs, payloads = _finish_unheard(mesh, where, 3)
    for _ in range(6):
        mesh.advance(10.0)
    assert any(e.kind == "streams-forgotten" for e in mesh.logs["A"])
    resumed = _resume_publisher(mesh, "B", incarnation, [str(n).encode() for n in payloads])
    answers = [mesh.outcomes_for("B", mesh.publish("B", resumed, str(n).encode(), payload=payloads[n])) for n in payloads]
    assert [[(a.outcome, a.condition) for a in answer] for answer in answers] == [
        [(outcomes.REJECTED, "eorouter:resend-beyond-horizon")]
    ] * 3
    logged = [e for r in "AB" for e in mesh.logs[r] if e.kind == "resend-beyond-horizon"]
    assert len(logged) == 3
    for r, link in subs.items():
        assert len(mesh.forwarded(r, link)) == 3, f"nobody got one twice at {r}"
    mesh.advance(10.0)
    assert all(core.record_count() == 0 for core in mesh.cores.values())


def test_a_settlement_lost_with_the_dead_origin_reaches_a_participant_from_the_new_one():
    """A settled a delivery and relayed the settlement to B and C; the copy to C died
    with A. The publisher, which never heard A's answer, resumes at B, which finished
    the delivery and answers the resend from its memory. C, holding its answered
    record for A, learns from B's "stream-resumed" that B is the origin now: it
    answers B again, B tells it the delivery is settled, and C's record ends (it
    used to wait for ever: a kill test found it under load)."""
    from router.core.events import OutcomeReceived

    mesh = Mesh(*TRIANGLE, record_linger=1.0)
    sb = mesh.subscriber("B", "sb", durable=2, timeout=60)
    sc = mesh.subscriber("C", "sc", durable=2, timeout=60)
    pub = mesh.publisher("A", name="p", container="P", rcv_first=True)
    incarnation = open_properties(mesh, "A", pub)[INCARNATION_PROPERTY]
    payload = encode("one")
    d1 = mesh.publish("A", pub, b"1", payload=payload)
    mesh.answer("B", sb, mesh.forwarded("B", sb)[0].tag)
    mesh.feed("C", OutcomeReceived(sc, mesh.forwarded("C", sc)[0].tag, outcomes.ACCEPTED, True))
    # Deliver C's answer to A, then everything but A's settlement to C.
    while mesh.inflight:
        pair, conn, target, event = mesh.inflight.popleft()
        if target == "C" and "A" in pair:
            continue  # lost: A died before it left
        if mesh.links.get(pair) == conn:
            mesh.feed(target, event)
    assert [c.outcome for c in mesh.outcomes_for("A", d1)] == [outcomes.ACCEPTED]
    mesh.kill("A")
    mesh.advance(2.0)  # B forgets its record (linger), remembering the outcome
    assert mesh.cores["B"].record_count() == 0 and mesh.cores["C"].record_count() == 1
    resumed = resume_publisher(mesh, "B", incarnation, [[b"1", "none"]], rcv_first=True)
    again = mesh.publish("B", resumed, b"1", payload=payload)
    assert [c.outcome for c in mesh.outcomes_for("B", again)] == [outcomes.ACCEPTED]
    for _ in range(3):
        mesh.settle()
        mesh.advance(2.0)
    assert mesh.cores["C"].record_count() == 0, "C still waits for a settlement"


def _origin_dies_with_a_finished_delivery_its_publisher_never_heard_settled(rcv_first):
    """C (origin) has a publisher and a durable subscriber; B another. Every subscriber
    accepts delivery 1 and C tells its publisher "accepted"; C dies before the
    publisher has seen the delivery settled. Both resume at A, the subscriber with
    what it still holds unsettled, the publisher resending 1. Returns the copies A
    sent the moved subscriber, the tags it held when it resumed, the copies B's
    subscriber got, and the publisher's answers at A."""
    mesh = Mesh(*TRIANGLE)
    local = mesh.subscriber("C", "local", durable=2, timeout=60)
    remote = mesh.subscriber("B", "remote", durable=2, timeout=60)
    pub = mesh.publisher("C", name="p", container="P", rcv_first=rcv_first)
    incarnation = open_properties(mesh, "C", pub)[INCARNATION_PROPERTY]
    payload = encode("m1")
    delivery = mesh.publish("C", pub, b"1", payload=payload)
    (copy,) = mesh.forwarded("C", local)
    mesh.answer("B", remote, mesh.forwarded("B", remote)[0].tag, settled=False)
    mesh.answer("C", local, copy.tag, settled=False)
    assert [c.outcome for c in mesh.outcomes_for("C", delivery)] == [outcomes.ACCEPTED]
    # What the subscriber at C still holds unsettled: its copy, unless C settled it.
    settled_at_c = any(isinstance(c, SettleOutgoing) and c.link_id == local for c in mesh.client["C"])
    held = [] if settled_at_c else [[copy.tag, "accepted"]]
    mesh.kill("C")  # the publisher never saw its delivery settled
    moved = mesh.subscriber("A", "local", durable=2, timeout=60, properties={"eorouter:resume": True, "eorouter:unsettled": held})
    resumed = resume_publisher(mesh, "A", incarnation, [[b"1", "accepted"]], rcv_first=rcv_first)
    again = mesh.publish("A", resumed, b"1", payload=payload)
    for c in mesh.forwarded("A", moved):
        mesh.answer("A", moved, c.tag, settled=False)
    return mesh.forwarded("A", moved), [t for t, _ in held], mesh.forwarded("B", remote), mesh.outcomes_for("A", again)


def test_a_resumable_publishers_delivery_finished_by_a_dying_origin_reaches_nobody_twice():
    """The two-step settlement (rcv-settle-mode second, what a resumable publisher gets
    by default): the subscribers' copies stay unsettled until the publisher settled,
    so the moved subscriber still holds its copy; the resend is matched to it (sent
    again under the tag it holds, which the resume protocol says to recognise)."""
    copies, held, remote_copies, answers = _origin_dies_with_a_finished_delivery_its_publisher_never_heard_settled(
        rcv_first=False
    )
    assert held, "C settled a subscriber's copy before the publisher settled its delivery"
    assert all(c.tag in held for c in copies), "the moved subscriber was sent a delivery it no longer holds"
    assert len(remote_copies) == 1
    assert [a.outcome for a in answers] == [outcomes.ACCEPTED]


@pytest.mark.xfail(
    strict=True,
    reason="rcv-settle-mode first settles the subscribers' copies with the publisher's outcome: "
    "a router dying between the two leaves nobody who remembers (docs/delivery-rule.md, 'Settlement')",
)
def test_with_the_first_mode_the_same_death_sends_a_forgotten_delivery_again():
    copies, held, _, _ = _origin_dies_with_a_finished_delivery_its_publisher_never_heard_settled(rcv_first=True)
    assert all(c.tag in held for c in copies)


@pytest.mark.parametrize(
    "mode,asks_second,properties,first",
    [
        ("resumable", True, {"eorouter:resume": False}, False),  # a resumable publisher's first attach
        ("resumable", True, {"eorouter:resume": True, "eorouter:unsettled": []}, False),
        ("resumable", True, None, True),  # a plain client asking second (Azure's needs a settled outcome)
        ("resumable", True, {"other": 1}, True),
        ("resumable", False, {"eorouter:resume": False}, True),  # it asked first: it would never settle
        ("as-requested", True, None, False),
        ("as-requested", False, None, True),
        ("first", True, {"eorouter:resume": True}, True),
    ],
)
def test_who_settles_a_publishers_delivery_first(mode, asks_second, properties, first):
    assert publisher_settles_first(mode, asks_second, properties) is first


def test_a_router_cut_off_before_its_publisher_settled_learns_it_did_when_the_cut_heals():
    """A finished delivery 1 and told its publisher, which settled it and moved to B
    while A was cut off (the settlement never reached A; B's "stream-resumed" did not
    either). When A regains the others, it asks, and B (where the publisher resumed
    with a complete list without 1, and stayed) says it is settled: A ends its record
    then, not publisher_resume_timeout later."""
    mesh = Mesh(*TRIANGLE, publisher_resume_timeout=60)
    sub = mesh.subscriber("B", "s", durable=2, timeout=60)
    pub = mesh.publisher("A", name="p", container="P")
    incarnation = open_properties(mesh, "A", pub)[INCARNATION_PROPERTY]
    delivery = mesh.publish("A", pub, b"1")
    mesh.answer("B", sub, mesh.forwarded("B", sub)[0].tag, settled=False)
    assert [c.outcome for c in mesh.outcomes_for("A", delivery)] == [outcomes.ACCEPTED]
    mesh.cut("A", "B")
    mesh.cut("A", "C")
    mesh.settle()
    mesh.detach("A", pub)  # its connection went with the cut; its settlement never arrived
    resume_publisher(mesh, "B", incarnation, [])
    mesh.advance(2)
    assert mesh.cores["A"].record_count() == 1
    mesh.connect("A", "B")
    mesh.connect("A", "C")
    mesh.settle()
    mesh.advance(5)  # past record_linger, far before publisher_resume_timeout
    settled = [e.fields for e in mesh.logs["A"] if e.kind == "settled"]
    assert [s["by"] for s in settled] == ["settled-elsewhere"]
    assert mesh.cores["A"].record_count() == 0


@pytest.mark.parametrize("late_first", [False, True])
def test_a_subscription_that_began_after_a_delivery_arrived_is_not_owed_it_when_its_router_dies(late_first):
    """docs/resumption.md: a new durable subscription at C is owed what reaches C after
    it began, not what C already held. When C dies, A (the origin) owes C's durable
    subscribers what C owed them; its announcement said what C held when it began,
    so A leaves that out (it used to owe it everything: the late one got a message it
    was never owed, after a later one it already had: out of publisher order)."""
    mesh = Mesh(*TRIANGLE)
    early = mesh.subscriber("C", "early", durable=2, timeout=60)
    pub = mesh.publisher("A")
    d1 = mesh.publish("A", pub, b"1", body="one")
    late = mesh.subscriber("C", "late", durable=2, timeout=60)
    d2 = mesh.publish("A", pub, b"2", body="two")
    assert [decode(c.payload).body for c in mesh.forwarded("C", late)] == ["two"]
    held_early = [[c.tag, "none"] for c in mesh.forwarded("C", early)]
    held_late = [[c.tag, "none"] for c in mesh.forwarded("C", late)]
    mesh.kill("C")  # before anyone answered
    resumed = {
        name: mesh.subscriber("B", name, durable=2, timeout=60, properties={"eorouter:resume": True, "eorouter:unsettled": held})
        for name, held in sorted((("early", held_early), ("late", held_late)), reverse=late_first)
    }
    got = {name: [decode(c.payload).body for c in mesh.forwarded("B", link)] for name, link in resumed.items()}
    assert got == {"early": ["one", "two"], "late": ["two"]}
    for link in resumed.values():
        for c in mesh.forwarded("B", link):
            mesh.answer("B", link, c.tag)
    for d in (d1, d2):
        assert [c.outcome for c in mesh.outcomes_for("A", d)] == [outcomes.ACCEPTED]
        mesh.settle_publisher("A", pub, d)
    mesh.advance(5)
    assert all(core.record_count() == 0 for name, core in mesh.cores.items() if name != "C")


def test_a_subscriber_back_at_the_old_origin_answers_the_new_origin_for_what_it_was_passed():
    """Found under CPU load (tests/failover/test_resume_under_load.py [A], subscribers
    flapping A -> B -> A on missed heartbeats while their publisher was cut off from A):
    k left A for B, where #1 (from A, the origin) was owed to it; k came back to A, and
    B passed its obligation on to A as a copy addressed to k; then p resumed at B. A
    handed #1 over to B and forgot that it owed B k's answer for the copy B addressed to
    it; B waited for that answer for ever and p never heard."""
    mesh = Mesh("AB", [("A", "B")], twins=True, record_linger=1.0)
    sub = mesh.subscriber("A", "k", durable=2, timeout=60)
    pub = mesh.publisher("A", name="p", container="P")
    incarnation = open_properties(mesh, "A", pub)[INCARNATION_PROPERTY]
    at_b = _resume_subscriber(mesh, "B", "k", [])
    mesh.detach("A", sub)
    payload = encode("m1")
    d = mesh.publish("A", pub, b"1", payload=payload)
    mesh.settle()
    (copy,) = mesh.forwarded("B", at_b)
    back = _resume_subscriber(mesh, "A", "k", [(copy.tag, "none")])
    mesh.detach("B", at_b)
    mesh.settle()
    _p_resumes_at_b_resending_m1(mesh, incarnation, payload)
    mesh.settle()
    for c in mesh.forwarded("A", back):
        mesh.answer("A", back, c.tag)
    assert [c.outcome for c in mesh.outcomes_for("B", 7)] == [outcomes.ACCEPTED]
    assert len(mesh.forwarded("A", back)) == 1 and [c.outcome for c in mesh.outcomes_for("A", d)] == []
    mesh.advance(2)
    assert {name: core.record_count() for name, core in mesh.cores.items()} == {"A": 0, "B": 0}
