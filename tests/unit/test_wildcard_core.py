"""Subscriptions to topic patterns in the pure core (issue 20, wildcard topics): a
subscription to ``sport/+`` is owed every message of every topic it matches, here
and across routers, in publisher order per topic, exactly once; it joins topics
made after it attached; a durable one gets what it missed on re-attach; when it
ends, nothing waits for it and no topic is kept for it; publishers name topics,
never patterns."""

from __future__ import annotations

from corekit import decode, encode
from meshkit import Mesh

from router.core import outcomes
from router.core.commands import DetachLink

PAIR = ("AB", [("A", "B")])
LINE = ("ABC", [("A", "B"), ("B", "C")])


def bodies(mesh: Mesh, router: str, link: int) -> list[str]:
    return [decode(f.payload).body for f in mesh.forwarded(router, link)]


def accept_all(mesh: Mesh, router: str, link: int) -> None:
    for copy in mesh.forwarded(router, link):
        mesh.answer(router, link, copy.tag)


def test_a_pattern_subscriber_gets_every_topic_it_matches_and_nothing_else():
    mesh = Mesh(*PAIR)
    every_sport = mesh.subscriber("A", "sports", topic="sport/+")
    tennis_only = mesh.subscriber("A", "tennis", topic="sport/tennis")
    topics = ("sport/tennis", "sport/golf", "news", "sport/golf/open")
    pubs = {t: mesh.publisher("A", name=t, topic=t, rcv_first=True) for t in topics}
    deliveries = {}
    for n in range(3):
        for topic, link in pubs.items():
            deliveries[(topic, n)] = mesh.publish("A", link, f"{topic}-{n}".encode(), payload=encode(f"{topic}:{n}"))
    got = bodies(mesh, "A", every_sport)
    assert [b for b in got if b.startswith("sport/tennis:")] == [f"sport/tennis:{n}" for n in range(3)]
    assert [b for b in got if b.startswith("sport/golf:")] == [f"sport/golf:{n}" for n in range(3)]
    assert len(got) == 6  # not news, not sport/golf/open (two levels below sport)
    assert bodies(mesh, "A", tennis_only) == [f"sport/tennis:{n}" for n in range(3)]
    accept_all(mesh, "A", every_sport)
    accept_all(mesh, "A", tennis_only)
    for (topic, _), delivery in deliveries.items():
        (answer,) = mesh.outcomes_for("A", delivery)
        expected = mesh.cores["A"].settings.no_subscribers if topic in ("news", "sport/golf/open") else outcomes.ACCEPTED
        assert answer.outcome == expected, topic
    received = [e.fields for e in mesh.logs["A"] if e.kind == "received" and e.fields["topic"] == "sport/tennis"]
    assert received[0]["owed"] == ["S-sports/sports", "S-tennis/tennis"]
    mesh.advance(60.0)
    assert mesh.cores["A"].record_count() == 0


def test_a_remote_pattern_subscriber_is_routed_to_and_a_topic_is_made_for_it():
    mesh = Mesh(*LINE)
    far = mesh.subscriber("C", "far", topic="sensors/#")
    assert mesh.cores["A"].net.interested_routers("sensors/x/temp") == {"C"}
    assert mesh.cores["A"].net.interested_routers("sensors") == {"C"}  # "#" takes no level too
    assert mesh.cores["A"].net.interested_routers("other") == frozenset()
    pub = mesh.publisher("A", topic="sensors/x/temp", rcv_first=True)
    d1 = mesh.publish("A", pub, b"1", payload=encode("t1"))
    d2 = mesh.publish("A", pub, b"2", payload=encode("t2"))
    assert bodies(mesh, "C", far) == ["t1", "t2"]
    assert "sensors/x/temp" in mesh.cores["C"].topics  # made for the pattern's subscriber
    accept_all(mesh, "C", far)
    assert [c.outcome for c in mesh.outcomes_for("A", d1) + mesh.outcomes_for("A", d2)] == [outcomes.ACCEPTED] * 2
    mesh.advance(60.0)
    mesh.advance(60.0)
    assert "sensors/x/temp" not in mesh.cores["C"].topics  # nothing keeps it once its records ended
    assert mesh.cores["C"].subscriptions["S-far/far"].pattern


def test_a_topic_made_after_the_pattern_subscriber_attached_is_joined():
    mesh = Mesh(*PAIR)
    sub = mesh.subscriber("B", "late", topic="+/alerts")
    pub = mesh.publisher("B", topic="kitchen/alerts", rcv_first=True)
    mesh.publish("B", pub, b"1", payload=encode("smoke"))
    remote = mesh.publisher("A", name="r", topic="garage/alerts", rcv_first=True)
    mesh.publish("A", remote, b"1", payload=encode("door"))
    assert sorted(bodies(mesh, "B", sub)) == ["door", "smoke"]


def test_a_durable_pattern_subscriber_gets_what_it_missed_in_publisher_order():
    mesh = Mesh(*PAIR)
    sub = mesh.subscriber("B", "d", topic="log/#", durable=2, timeout=600)
    pubs = [mesh.publisher("A", name=t, topic=t, rcv_first=True) for t in ("log/a", "log/b")]
    mesh.publish("A", pubs[0], b"0", payload=encode("a0"))
    accept_all(mesh, "B", sub)
    mesh.detach("B", sub)
    for n in range(1, 4):
        for i, link in enumerate(pubs):
            mesh.publish("A", link, str(n).encode(), payload=encode(f"{'ab'[i]}{n}"))
    again = mesh.subscriber("B", "d", topic="log/#", durable=2, timeout=600)
    got = bodies(mesh, "B", again)
    assert got == ["a1", "b1", "a2", "b2", "a3", "b3"]  # arrival order, so publisher order per topic
    accept_all(mesh, "B", again)
    mesh.advance(60.0)
    for core in mesh.cores.values():
        assert core.record_count() == 0


def test_a_closed_pattern_subscription_is_waited_for_no_more():
    mesh = Mesh(*PAIR)
    sub = mesh.subscriber("B", "gone", topic="x/+")
    pub = mesh.publisher("A", topic="x/y", rcv_first=True)
    delivery = mesh.publish("A", pub, b"1", payload=encode("m"))
    assert bodies(mesh, "B", sub) == ["m"] and mesh.outcomes_for("A", delivery) == []
    mesh.detach("B", sub, closed=True)
    (answer,) = mesh.outcomes_for("A", delivery)
    assert answer.outcome != outcomes.ACCEPTED  # nobody accepted it: not "accepted"
    assert len(mesh.cores["B"].pattern_subs) == 0
    assert mesh.cores["A"].net.interested_routers("x/y") == frozenset()
    after = mesh.publish("A", pub, b"2", payload=encode("n"))
    assert [a.outcome for a in mesh.outcomes_for("A", after)] == [mesh.cores["A"].settings.no_subscribers]


def test_a_subscriber_that_reattaches_with_another_pattern_starts_over():
    mesh = Mesh(*PAIR)
    sub = mesh.subscriber("A", "s", topic="a/+", durable=2, timeout=600)
    pub = mesh.publisher("A", topic="a/b", rcv_first=True)
    delivery = mesh.publish("A", pub, b"1", payload=encode("m"))
    mesh.detach("A", sub)
    mesh.subscriber("A", "s", topic="a/#", durable=2, timeout=600)
    # The old subscription ended with the new address: what it was owed is not waited for.
    assert [a.outcome for a in mesh.outcomes_for("A", delivery)] == [mesh.cores["A"].settings.no_subscribers]
    assert [str(p) for p, _ in mesh.cores["A"].pattern_subs.patterns()] == ["a/#"]


def test_publishers_name_topics_and_subscribers_name_valid_patterns():
    mesh = Mesh("A")
    for role, address in (("publisher", "sport/+"), ("publisher", "#"), ("subscriber", "a/#/b"), ("subscriber", "a/#/#")):
        link = mesh.publisher("A", topic=address) if role == "publisher" else mesh.subscriber("A", "bad", topic=address)
        (refused,) = [c for c in mesh.client["A"] if isinstance(c, DetachLink) and c.link_id == link]
        assert refused.condition == "amqp:invalid-field", (role, address)
        assert "pattern" in refused.description or "'#'" in refused.description, refused
    assert mesh.cores["A"].topics == {} and mesh.cores["A"].subscriptions == {}


def test_a_pattern_subscriber_through_a_router_death_resumes_elsewhere():
    """A durable subscription to a pattern on B; B dies; the subscriber re-attaches at C
    (the origin A re-targets what B owed it) and gets every message once."""
    mesh = Mesh("ABC", [("A", "B"), ("A", "C"), ("B", "C")])
    sub = mesh.subscriber("B", "k", topic="m/+", durable=2, timeout=600)
    pubs = [mesh.publisher("A", name=t, topic=t, rcv_first=True) for t in ("m/1", "m/2")]
    sent = []
    for n in range(3):
        for i, link in enumerate(pubs):
            sent.append(mesh.publish("A", link, f"{n}".encode(), payload=encode(f"{i}:{n}")))
    first = mesh.forwarded("B", sub)
    mesh.answer("B", sub, first[0].tag)  # one answered before the death
    mesh.kill("B")
    again = mesh.subscriber("C", "k", topic="m/+", durable=2, timeout=600)
    for _ in range(5):
        accept_all(mesh, "C", again)
        mesh.advance(1.0)
    got = [decode(first[0].payload).body] + [b for b in bodies(mesh, "C", again) if b != decode(first[0].payload).body]
    assert sorted(got) == sorted(f"{i}:{n}" for n in range(3) for i in range(2))
    for i in range(2):
        mine = [b for b in got if b.startswith(f"{i}:")]
        assert mine == [f"{i}:{n}" for n in range(3)], mine
    for delivery in sent:
        assert [a.outcome for a in mesh.outcomes_for("A", delivery)] == [outcomes.ACCEPTED], delivery
