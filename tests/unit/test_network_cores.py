"""The router network as pure cores over a fake network (tests/unit/meshkit.py)."""

from __future__ import annotations

from corekit import encode
from meshkit import Mesh

from router.core import outcomes
from router.core.commands import SendOutcome, SettleOutgoing
from router.core.events import ConnectionLost, MessageReceived, OutcomeReceived


def test_line_routes_converge():
    """A - B - C"""
    mesh = Mesh("ABC", [("A", "B"), ("B", "C")])
    assert dict(mesh.cores["A"].net.routes.next_hop) == {"B": "B", "C": "B"}
    assert dict(mesh.cores["C"].net.routes.next_hop) == {"A": "B", "B": "B"}


def test_subscribers_everywhere_get_it_once_and_accept_waits_for_the_farthest():
    """A - B - C, publisher on A, a subscriber on each router."""
    mesh = Mesh("ABC", [("A", "B"), ("B", "C")])
    subs = {r: mesh.subscriber(r, f"s{r}") for r in "ABC"}
    assert all(mesh.opened(r, subs[r]) for r in "ABC"), "attaches confirmed by the network"
    pub = mesh.publisher("A")
    delivery = mesh.publish("A", pub, b"1")
    copies = {r: mesh.forwarded(r, subs[r]) for r in "ABC"}
    assert all(len(c) == 1 for c in copies.values()), copies
    tag = copies["A"][0].tag
    assert {c[0].tag for c in copies.values()} == {tag}, "every router uses the same tag"
    assert {c[0].payload for c in copies.values()} == {copies["A"][0].payload}
    # A and C settle their copies with their answers, B (rcv-settle-mode second) waits.
    mesh.answer("A", subs["A"], tag)
    mesh.answer("B", subs["B"], tag, settled=False)
    assert mesh.outcomes_for("A", delivery) == [], "C has not answered"
    mesh.answer("C", subs["C"], tag)
    assert mesh.outcomes_for("A", delivery) == [SendOutcome(delivery, outcomes.ACCEPTED)]
    mesh.settle_publisher("A", pub, delivery)
    # The settlement reaches every router; it is relayed to the one subscriber that
    # still holds its copy unsettled (the others settled theirs: nothing to relay).
    assert SettleOutgoing(subs["B"], tag) in mesh.client["B"], "settlement relayed to B"
    for r in "AC":
        assert SettleOutgoing(subs[r], tag) not in mesh.client[r], r
    mesh.answer("B", subs["B"], tag)  # it settles in turn
    assert all(core.record_count() == 0 for core in mesh.cores.values())


def test_rcv_first_publisher_settled_with_the_outcome_and_settlement_reaches_every_router():
    mesh = Mesh("ABC", [("A", "B"), ("B", "C")])
    subs = {r: mesh.subscriber(r, f"s{r}") for r in "ABC"}
    pub = mesh.publisher("A", rcv_first=True)
    delivery = mesh.publish("A", pub, b"1")
    tag = mesh.forwarded("A", subs["A"])[0].tag
    for r in "ABC":
        mesh.answer(r, subs[r], tag, settled=False)  # rcv-settle-mode second: each waits for the router
    assert mesh.outcomes_for("A", delivery) == [SendOutcome(delivery, outcomes.ACCEPTED, True)]
    for r in "ABC":
        assert SettleOutgoing(subs[r], tag) in mesh.client[r], f"settlement relayed to {r}"
        mesh.answer(r, subs[r], tag)  # and settles in turn
    assert all(core.record_count() == 0 for core in mesh.cores.values())


def test_a_rejection_far_away_reaches_the_publisher():
    mesh = Mesh("ABC", [("A", "B"), ("B", "C")])
    sa, sc = mesh.subscriber("A", "sa"), mesh.subscriber("C", "sc")
    pub = mesh.publisher("A")
    delivery = mesh.publish("A", pub, b"1")
    tag = mesh.forwarded("A", sa)[0].tag
    mesh.answer("A", sa, tag)
    mesh.answer("C", sc, tag, outcomes.REJECTED)
    (sent,) = mesh.outcomes_for("A", delivery)
    assert sent.outcome == outcomes.REJECTED


def test_one_copy_per_link():
    """A - B, with C and D behind B: the message crosses A-B once."""
    mesh = Mesh("ABCD", [("A", "B"), ("B", "C"), ("B", "D")])
    for r in "CD":
        mesh.subscriber(r, f"s{r}")
    pub = mesh.publisher("A")
    mesh.publish("A", pub, b"1")
    to_b = [e for e in mesh.logs["A"] if e.kind == "forwarded-to-router"]
    assert [(e.fields["to_router"], e.fields["dests"]) for e in to_b] == [("B", ["C", "D"])]


def test_no_subscriber_anywhere_is_released():
    mesh = Mesh("AB", [("A", "B")])
    pub = mesh.publisher("A")
    delivery = mesh.publish("A", pub, b"1")
    (sent,) = mesh.outcomes_for("A", delivery)
    assert sent.outcome == outcomes.RELEASED


def test_remote_subscriber_leaving_stops_counting():
    mesh = Mesh("AB", [("A", "B")])
    sa, sb = mesh.subscriber("A", "sa"), mesh.subscriber("B", "sb")
    pub = mesh.publisher("A")
    delivery = mesh.publish("A", pub, b"1")
    mesh.answer("A", sa, mesh.forwarded("A", sa)[0].tag)
    mesh.detach("B", sb)
    assert [c.outcome for c in mesh.outcomes_for("A", delivery)] == [outcomes.ACCEPTED]


def test_cut_link_resends_on_the_new_path_and_nothing_is_delivered_twice():
    """Ring A - B - C - A: cut A-C while C's copy is in flight; it goes via B."""
    mesh = Mesh("ABC", [("A", "B"), ("B", "C"), ("C", "A")])
    sc = mesh.subscriber("C", "sc")
    pub = mesh.publisher("A")
    from corekit import encode

    from router.core.events import MessageReceived

    mesh.feed("A", MessageReceived(pub, 1, b"1", encode("x"), False))
    mesh.cut("A", "C")  # the copy on A-C is lost
    mesh.settle()
    copies = mesh.forwarded("C", sc)
    assert len(copies) == 1
    mesh.answer("C", sc, copies[0].tag)
    assert [c.outcome for c in mesh.outcomes_for("A", 1)] == [outcomes.ACCEPTED]


def test_a_duplicate_copy_is_not_delivered_twice_and_the_answer_is_repeated():
    mesh = Mesh("AB", [("A", "B")])
    sb = mesh.subscriber("B", "sb")
    pub = mesh.publisher("A")
    mesh.publish("A", pub, b"1")
    tag = mesh.forwarded("B", sb)[0].tag
    mesh.answer("B", sb, tag)
    # Force a resend as after a topology change.
    record = mesh.cores["A"].records[tag]
    record.remote_routers["B"].outcome = None
    out = []
    mesh.cores["A"]._send_towards(record, ["B"], mesh.now, out)
    for c in out:
        if c.__class__.__name__ == "SendData":
            mesh._send(
                "A",
                "B",
                lambda conn, c=c: __import__("router.core.events", fromlist=["x"]).DataReceived(
                    conn, "A", c.tag, dict(c.header), c.payload
                ),
            )
    mesh.settle()
    assert len(mesh.forwarded("B", sb)) == 1
    assert record.remote_routers["B"].outcome == outcomes.OUTCOME_ACCEPTED


def test_subscriber_attach_waits_for_the_network_to_know():
    mesh = Mesh("AB", [("A", "B")])
    from router.core.events import SUBSCRIBER, LinkAttached

    mesh.feed("B", LinkAttached(77, 77, "S", "s", SUBSCRIBER, "t"))
    assert not mesh.opened("B", 77), "answered before A confirmed"
    mesh.settle()
    assert mesh.opened("B", 77)


def test_attach_is_answered_after_a_timeout_if_confirmation_never_comes():
    mesh = Mesh("AB", [("A", "B")])
    from router.core.events import SUBSCRIBER, LinkAttached

    mesh.feed("B", LinkAttached(77, 77, "S", "s", SUBSCRIBER, "t"))
    mesh.inflight.clear()  # the announcement is lost
    mesh.advance(2.5)
    assert mesh.opened("B", 77)
    assert any(e.kind == "announce-timeout" for e in mesh.logs["B"])


def test_a_subscriber_that_moved_keeps_its_router_interested():
    """A late detach from A must not undo the subscriber's attach at B."""
    mesh = Mesh("ABC", [("A", "B"), ("B", "C")])
    first = mesh.subscriber("A", "s", durable=2, timeout=60)
    mesh.detach("A", first, closed=True)
    mesh.subscriber("B", "s", durable=2, timeout=60)
    assert mesh.cores["C"].net.interested_routers("t") == frozenset({"B"})


def test_a_copy_on_a_newer_path_does_not_overtake_an_earlier_one():
    """A - B - C and A - C. #1 goes A-C directly and is held up on that link; the
    route changes; #2 arrives at C first via B. C must deliver #1 before #2."""
    from corekit import encode

    from router.core.events import MessageReceived

    mesh = Mesh("ABC", [("A", "B"), ("B", "C"), ("C", "A")])
    sc = mesh.subscriber("C", "sc")
    pub = mesh.publisher("A")
    mesh.feed("A", MessageReceived(pub, 1, b"1", encode("one"), False))
    delayed = [m for m in mesh.inflight if m[2] == "C"]  # #1 on the A-C link
    mesh.inflight = type(mesh.inflight)(m for m in mesh.inflight if m[2] != "C")
    # A new, cheaper view of the world sends A's traffic for C through B.
    mesh.cores["A"].net.routes.next_hop["C"] = "B"
    mesh.feed("A", MessageReceived(pub, 2, b"2", encode("two"), False))
    mesh.settle()
    assert mesh.forwarded("C", sc) == [], "#2 is held until #1 arrives"
    mesh.inflight.extend(delayed)
    mesh.settle()
    from corekit import decode

    assert [decode(f.payload).body for f in mesh.forwarded("C", sc)] == ["one", "two"]


def test_a_lost_predecessor_does_not_block_for_ever():
    from corekit import decode, encode

    from router.core.events import MessageReceived

    mesh = Mesh("AB", [("A", "B")])
    sb = mesh.subscriber("B", "sb")
    pub = mesh.publisher("A")
    mesh.feed("A", MessageReceived(pub, 1, b"1", encode("one"), False))
    mesh.inflight.clear()  # lost, and no route change will resend it
    mesh.feed("A", MessageReceived(pub, 2, b"2", encode("two"), False))
    mesh.settle()
    assert mesh.forwarded("B", sb) == []
    mesh.advance(5.5)
    assert [decode(f.payload).body for f in mesh.forwarded("B", sb)] == ["two"]
    assert any(e.kind == "order-gap" for e in mesh.logs["B"])


def test_an_addressed_copy_does_not_overtake_an_earlier_one_its_relay_had_no_route_for():
    """A - B - C, a durable subscriber at C. The link B - C goes down, comes back and goes
    down again: A, hearing C is lost and then back, addresses the subscriber's copies of
    #1 and #2 to it at C through B. #1 reaches B while B has no route to C (dropped, as
    what was in flight on a cut link is); the link comes back before #2 does, which B
    relays. C must still deliver #1 (A's resend) before #2: addressed copies name their
    predecessor as the interested routers' copies do (found by the generated network
    histories, tests/unit/test_network_histories.py, which C got #2 then #1 in)."""
    from corekit import decode

    mesh = Mesh("ABC", [("A", "B"), ("B", "C")], record_linger=1.0)
    sc = mesh.subscriber("C", "sC", durable=2, timeout=1000)
    pub = mesh.publisher("A", name="p0")
    for n in (1, 2):
        mesh.feed("A", MessageReceived(pub, n, str(n).encode(), encode(str(n)), False))
    mesh.cut("B", "C")
    mesh.settle()  # the copies reach B, which has no route to C; A hears that C is lost
    assert "C" in mesh.cores["A"].lost
    mesh.connect("B", "C")
    mesh.cut("B", "C")
    mesh.deliver_from("B", "A")  # A hears that B reached C again: it addresses sC's copies there
    mesh.deliver_from("A", "B")  # #1's reaches B while B has no route to C again
    mesh.connect("B", "C")
    for _ in range(5):
        mesh.settle()
        mesh.advance(6.0)
    assert [decode(f.payload).body for f in mesh.forwarded("C", sc)] == ["1", "2"]
    assert not any(e.kind == "order-gap" for e in mesh.logs["C"])
    assert mesh.cores["A"].addressed_last  # its chain of addressed copies to C...
    for f in mesh.forwarded("C", sc):
        mesh.answer("C", sc, f.tag)
    for delivery in (1, 2):
        mesh.settle_publisher("A", pub, delivery)
    mesh.detach("A", pub, closed=True)
    assert mesh.cores["A"].addressed_last == {}  # ...goes with its stream


def test_a_router_that_passed_a_moved_subscribers_copies_on_forgets_their_chain_with_the_stream():
    """C, not the origin, addresses what it owed a subscriber that moved to B: its chain of
    those copies (``addressed_last``) goes when the stream is forgotten (the settled sweep,
    a resume horizon later); the publisher's detach, which ends it at the origin, never
    happens at C."""
    from router.core.events import LinkDetached

    mesh = Mesh("ABC", [("A", "B"), ("B", "C")], record_linger=0.5, resume_horizon=40.0)
    sc = mesh.subscriber("C", "sC", durable=2, timeout=1000)
    pub = mesh.publisher("A", name="p0")
    mesh.feed("A", MessageReceived(pub, 1, b"1", encode("1"), False))
    mesh.feed("C", LinkDetached(sc, False))  # it leaves C holding the copy, and attaches at B
    mesh.settle()
    sb = mesh.subscriber("B", "sC", durable=2, timeout=1000)
    assert list(mesh.cores["C"].addressed_last.values()) == [0]
    for f in mesh.forwarded("B", sb):
        mesh.answer("B", sb, f.tag)
    mesh.settle_publisher("A", pub, 1)
    for _ in range(8):
        mesh.advance(10.0)
    assert any(e.kind == "streams-forgotten" for e in mesh.logs["C"])
    assert mesh.cores["C"].addressed_last == {}


def test_two_copies_naming_the_same_predecessor_are_both_delivered_after_it():
    """A router holds a copy until the one its origin names as its predecessor arrived;
    two chains (the interested routers' copies and the addressed ones) may name the same
    predecessor. Both copies wait, and both go, in their stream's order, once it came
    (one held in the other's place was never delivered nor answered)."""
    from corekit import decode

    mesh = Mesh("AB", [("A", "B")])
    sb = mesh.subscriber("B", "sb")
    pub = mesh.publisher("A")
    for n in (1, 2, 3):
        mesh.feed("A", MessageReceived(pub, n, str(n).encode(), encode(str(n)), False))
    copies = [item for item in mesh.inflight if item[2] == "B" and type(item[3]).__name__ == "DataReceived"]
    assert [item[3].header["prev"] for item in copies] == [{"B": -1}, {"B": 0}, {"B": 1}]
    copies[2][3].header["prev"] = {"B": 0}  # #3 names #1 as well
    mesh.inflight.clear()
    for item in (copies[1], copies[2], copies[0]):
        mesh.inflight.append(item)
    mesh.settle()
    assert [decode(f.payload).body for f in mesh.forwarded("B", sb)] == ["1", "2", "3"]
    for f in mesh.forwarded("B", sb):
        mesh.answer("B", sb, f.tag)
    assert [o.delivery for o in mesh.client["A"] if isinstance(o, SendOutcome)] == [1, 2, 3]


def test_a_settlement_lost_with_a_cut_link_is_repeated_when_the_outcome_comes_again():
    """The origin relayed its settlement just as the link to B was cut, then forgot
    the record. When B repeats its outcome after the heal, the origin tells it again
    that the delivery is settled, so B's record goes too."""
    from router.core.events import OutcomeReceived

    mesh = Mesh("AB", [("A", "B")], record_linger=1.0)
    sub = mesh.subscriber("B", "sb", durable=2, timeout=60)
    pub = mesh.publisher("A", rcv_first=True)
    delivery = mesh.publish("A", pub, b"1")
    (copy,) = mesh.forwarded("B", sub)
    mesh.feed("B", OutcomeReceived(sub, copy.tag, outcomes.ACCEPTED, True))
    pair, conn, target, event = mesh.inflight.popleft()  # B's outcome, to A
    assert target == "A"
    mesh.feed("A", event)
    assert mesh.outcomes_for("A", delivery) == [SendOutcome(delivery, outcomes.ACCEPTED, True)]
    mesh.cut("A", "B")  # A's "settle" for B is lost with the link
    mesh.settle()
    mesh.advance(1.5)
    assert mesh.cores["A"].record_count() == 0, "A forgot it after record_linger"
    assert mesh.cores["B"].record_count() == 1
    mesh.connect("A", "B")
    mesh.settle()
    mesh.advance(1.5)
    assert mesh.cores["B"].record_count() == 0, "B learned the settlement after the heal"


def test_a_presettled_delivery_reaches_subscribers_on_other_routers_best_effort():
    from router.core.events import MessageReceived

    mesh = Mesh("ABC", [("A", "B"), ("B", "C")])
    subs = {r: mesh.subscriber(r, f"s{r}") for r in "BC"}
    pub = mesh.publisher("A")
    mesh.feed("A", MessageReceived(pub, 1, b"1", encode("m"), True))  # pre-settled
    mesh.settle()
    for r in "BC":
        (copy,) = mesh.forwarded(r, subs[r])
        assert copy.settled, f"a pre-settled copy at {r}"
    assert all(core.record_count() == 0 for core in mesh.cores.values()), "nothing recorded, nothing owed"


def test_an_answer_given_before_the_subscriber_left_counts_when_the_news_of_leaving_wins_the_race():
    """A, B, C each linked to the other two (issue 14). The only subscriber, on C,
    accepts every message and its connection closes at once: C answers A for each
    delivery, then floods that it has no subscriber left. The flood reaches A
    through B before C's own transfer to A (another connection, read first on a busy
    router). A must still count C's answers: they were given before the subscriber
    left, and the publisher must hear "accepted", not "released"."""
    mesh = Mesh("ABC", [("A", "B"), ("A", "C"), ("B", "C")])
    sub = mesh.subscriber("C", "sc")
    pub = mesh.publisher("A")
    deliveries = [mesh.publish("A", pub, str(n).encode()) for n in range(1, 11)]
    copies = mesh.forwarded("C", sub)
    assert len(copies) == 10
    for copy in copies:  # one read: ten accepted dispositions, then the close
        mesh.feed("C", OutcomeReceived(sub, copy.tag, outcomes.ACCEPTED, True))
    mesh.feed("C", ConnectionLost(sub))
    assert [m["t"] for e in mesh.in_flight("C", "A") for m in e.messages].count("outcome") == 10
    mesh.deliver_from("C", "B", len(mesh.in_flight("C", "B")))  # B hears C has nobody left...
    mesh.deliver_from("B", "A", len(mesh.in_flight("B", "A")))  # ...and tells A first
    assert all(mesh.outcomes_for("A", d) == [] for d in deliveries), "C's answers are on their way"
    mesh.settle()
    assert [[c.outcome for c in mesh.outcomes_for("A", d)] for d in deliveries] == [[outcomes.ACCEPTED]] * 10
    for d in deliveries:
        mesh.settle_publisher("A", pub, d)
    mesh.advance(60.0)
    assert all(core.record_count() == 0 for core in mesh.cores.values())


def test_a_router_that_lost_its_subscriber_before_the_copy_arrived_answers_none():
    """The other side of the same race: C's subscriber left before A's copy reached
    C. A keeps waiting for C (the copy was sent), and C, owing it to nobody, answers
    "none": the publisher hears released, as with no subscriber anywhere."""
    mesh = Mesh("ABC", [("A", "B"), ("A", "C"), ("B", "C")])
    sub = mesh.subscriber("C", "sc")
    pub = mesh.publisher("A")
    mesh.feed("A", MessageReceived(pub, 1, b"1", encode("m"), False))
    mesh.feed("C", ConnectionLost(sub))  # before A's copy arrives
    mesh.settle()
    assert mesh.forwarded("C", sub) == []
    assert [c.outcome for c in mesh.outcomes_for("A", 1)] == [outcomes.RELEASED]
    mesh.settle_publisher("A", pub, 1)
    mesh.advance(60.0)
    assert all(core.record_count() == 0 for core in mesh.cores.values())


# ------------------------------------------------------------------ a partition heals


LINE4 = ("ABCD", [("A", "B"), ("B", "C"), ("C", "D")])


def test_a_subscriber_that_attached_during_a_partition_is_known_everywhere_once_it_heals():
    """A - B - C - D, cut between B and C: a subscriber attaches at D meanwhile, which
    only C and D hear of. When B and C meet again they exchange their snapshots; what
    B learns from C's it must pass on to A, or A never sends D anything (it released
    what D's subscriber was owed). Found by the scale model (issue 21 part 4)."""
    mesh = Mesh(*LINE4)
    mesh.cut("B", "C")
    sub = mesh.subscriber("D", "late", durable=2, timeout=60)
    mesh.connect("B", "C")
    mesh.settle()
    mesh.advance(50.0)
    pub = mesh.publisher("A", rcv_first=True)
    d = mesh.publish("A", pub, b"1", payload=encode("after the partition"))
    (copy,) = mesh.forwarded("D", sub)
    mesh.answer("D", sub, copy.tag)
    assert [c.outcome for c in mesh.outcomes_for("A", d)] == [outcomes.ACCEPTED]


def test_a_subscriber_that_left_during_a_partition_is_forgotten_everywhere_once_it_heals():
    """The mirror: D's subscriber closes its link while B and C are apart; once they
    meet again A must no longer count D as interested (it would wait for D's answer,
    or send D copies for nobody)."""
    mesh = Mesh(*LINE4)
    sub = mesh.subscriber("D", "gone")
    mesh.cut("B", "C")
    mesh.detach("D", sub, closed=True)
    mesh.connect("B", "C")
    mesh.settle()
    mesh.advance(50.0)
    assert "D" not in mesh.cores["A"].net.interested_routers("t")
    pub = mesh.publisher("A", rcv_first=True)
    d = mesh.publish("A", pub, b"1", payload=encode("nobody"))
    assert [c.outcome for c in mesh.outcomes_for("A", d)] == [mesh.cores["A"].settings.no_subscribers]


def test_what_a_router_keeps_to_recognise_repeated_floods_does_not_grow_with_churn():
    """Every attach and detach is flooded over every link; a router used to keep a stamp
    of each one it ever passed on, so its memory grew with churn (docs/benchmarks.md,
    the scale model). The membership table's versions recognise a repeat instead,
    and a resumed stream's flood is forgotten a resume horizon later."""
    mesh = Mesh("ABC", [("A", "B"), ("B", "C"), ("C", "A")], resume_horizon=60.0)
    for n in range(300):
        link = mesh.subscriber("A", f"s{n % 7}", durable=0)
        mesh.detach("A", link, closed=True)
    for name in "BC":
        membership = mesh.cores[name].net.membership
        view = membership._views["A"]
        assert not view.above and view.through >= 600, (name, view.through, len(view.above))
        assert len(view.entries) <= 7  # at most one tombstone per key, folded as versions go by
        assert not mesh.cores[name]._flooded
    # Each announcement was applied once at each router, though it came by two paths.
    assert mesh.cores["B"].announcements_learnt == {("A", "attached"): 300, ("A", "detached"): 300}
    # A resumed stream's flood is kept as a stamp until a horizon later.
    pub = mesh.publisher("A", name="p", container="P")
    incarnation = mesh.cores["A"].publishers[pub].incarnation
    mesh.detach("A", pub)
    mesh.publisher(
        "B",
        name="p",
        container="P",
        properties={"eorouter:incarnation": incarnation, "eorouter:resume": True, "eorouter:unsettled": []},
    )
    assert len(mesh.cores["C"]._flooded) == 1
    for _ in range(8):
        mesh.advance(30.0)
    assert not mesh.cores["C"]._flooded
