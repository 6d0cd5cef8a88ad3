"""Selectors in the pure core (issue 20): a message is owed only to the subscriptions
whose selector selects it, the others are named in its "received" line as filtered;
a message nobody's selector selects completes at once, here and across routers; a
selector that does not parse refuses the attach."""

from __future__ import annotations

import pytest
from corekit import decode, encode
from meshkit import Mesh

from router.core import outcomes
from router.core.commands import Forward, Log, SendOutcome
from router.core.errors import ProtocolError
from router.core.events import SUBSCRIBER, CreditChanged, LinkAttached, MessageReceived, PeerLost
from router.core.selector import NOT_A_STRING, compile_selector

PAIR = ("AB", [("A", "B")])


def colored(color: str, n: int = 0) -> bytes:
    return encode(f"{color}-{n}", properties={"color": color, "n": n})


def received(mesh: Mesh, router: str) -> list[dict]:
    return [e.fields for e in mesh.logs[router] if e.kind == "received"]


def test_a_subscriber_is_owed_only_what_its_selector_selects():
    mesh = Mesh(*PAIR)
    red = mesh.subscriber("A", "red", selector="color = 'red'")
    every = mesh.subscriber("A", "every")
    pub = mesh.publisher("A", rcv_first=True)
    d_red = mesh.publish("A", pub, b"1", payload=colored("red"))
    d_blue = mesh.publish("A", pub, b"2", payload=colored("blue"))
    assert [decode(f.payload).body for f in mesh.forwarded("A", red)] == ["red-0"]
    assert len(mesh.forwarded("A", every)) == 2
    lines = received(mesh, "A")
    assert lines[0]["owed"] == ["S-red/red", "S-every/every"] and "filtered" not in lines[0]
    assert lines[1]["owed"] == ["S-every/every"] and lines[1]["filtered"] == ["S-red/red"]
    for link in (red, every):
        for copy in mesh.forwarded("A", link):
            mesh.answer("A", link, copy.tag)
    assert [c.outcome for c in mesh.outcomes_for("A", d_red)] == [outcomes.ACCEPTED]
    assert [c.outcome for c in mesh.outcomes_for("A", d_blue)] == [outcomes.ACCEPTED]
    mesh.advance(60.0)
    assert mesh.cores["A"].record_count() == 0


def test_a_message_nobody_selects_completes_at_once_here_and_across_routers():
    mesh = Mesh(*PAIR)
    mesh.subscriber("A", "red-a", selector="color = 'red'")
    remote = mesh.subscriber("B", "red-b", selector="color IN ('red', 'green') AND n > 1")
    pub = mesh.publisher("A", rcv_first=True)
    blue = mesh.publish("A", pub, b"1", payload=colored("blue", 5))
    mesh.settle()
    assert [c.outcome for c in mesh.outcomes_for("A", blue)] == [outcomes.ACCEPTED]  # nobody waited for
    assert received(mesh, "B")[-1]["filtered"] == ["S-red-b/red-b"] and received(mesh, "B")[-1]["owed"] == []
    green = mesh.publish("A", pub, b"2", payload=colored("green", 5))
    mesh.settle()
    assert mesh.outcomes_for("A", green) == []  # B's subscriber selects it: A waits for its answer
    (copy,) = mesh.forwarded("B", remote)
    mesh.answer("B", remote, copy.tag)
    mesh.settle()
    assert [c.outcome for c in mesh.outcomes_for("A", green)] == [outcomes.ACCEPTED]
    mesh.advance(60.0)
    mesh.advance(60.0)
    for name, core in mesh.cores.items():
        assert core.record_count() == 0, name


def test_equal_selectors_are_evaluated_once_per_message(monkeypatch):
    from router.core import attach

    calls = []

    def counted(text):
        selector = compile_selector(text)
        real, real_values = selector.selects, selector.selects_values
        selector.selects = lambda env: calls.append(1) or real(env)
        selector.selects_values = lambda values: calls.append(1) or real_values(values)
        return selector

    monkeypatch.setattr(attach, "compile_selector", counted)
    mesh = Mesh(*PAIR)
    links = [mesh.subscriber("A", f"s{i}", selector="n >= 3") for i in range(5)]
    pub = mesh.publisher("A", rcv_first=True)
    mesh.publish("A", pub, b"1", payload=colored("red", 4))
    assert len(calls) == 1
    assert all(len(mesh.forwarded("A", link)) == 1 for link in links)


@pytest.mark.parametrize(
    "selector, fragment",
    [
        ("color = ", "selector syntax error at column 7"),
        ("color LIKE 'x' ESCAPE 'yz'", "ESCAPE takes one character"),
        (NOT_A_STRING + "42", "expected a string, found 42"),
    ],
)
def test_a_bad_selector_refuses_the_attach(selector, fragment):
    mesh = Mesh(*PAIR)
    with pytest.raises(ProtocolError) as err:
        mesh.cores["A"].handle(LinkAttached(99, 99, "S-x", "x", SUBSCRIBER, "t", selector=selector), mesh.now)
    assert err.value.condition == "amqp:invalid-field" and fragment in err.value.description
    assert "S-x/x" not in mesh.cores["A"].subscriptions  # nothing changed


def test_a_moved_subscriber_its_selector_skips_is_not_logged_as_owed():
    """Found under CPU load by tests/failover/test_kill.py: a durable subscriber with a
    selector re-attached at B before B noticed that its old router A had died. A
    message B then took in was not for it (filtered); when B lost A, it logged the
    message as owed to A's durable subscribers, this one included, though it owed it
    nothing, and the proof counted it lost."""
    mesh = Mesh("AB", [("A", "B")])
    mesh.subscriber("A", "k", durable=2, timeout=60, selector="color = 'red'")
    pub = mesh.publisher("B", rcv_first=True)
    # A is dead from here on: B's messages to it go nowhere. B hears of it only after
    # the subscriber is back, at B, and after it took in a message that the
    # subscriber's selector does not select.
    b, now, said = mesh.cores["B"], mesh.now, []
    for event in (
        LinkAttached(50, 50, "S-k", "k", SUBSCRIBER, "t", durable=2, timeout=60, selector="color = 'red'", rcv_settle_mode=1),
        CreditChanged(50, 100),
        MessageReceived(pub, 99, b"1", colored("blue"), False),
        PeerLost(mesh.links[frozenset("AB")], "A"),
    ):
        said += b.handle(event, now)
    assert not [c for c in said if isinstance(c, Forward) and c.link_id == 50]
    moves = [c.fields for c in said if isinstance(c, Log) and c.kind == "owed-moved"]
    assert all("S-k/k" not in m["subscribers"] for m in moves), moves
    assert [c.outcome for c in said if isinstance(c, SendOutcome) and c.delivery == 99] == [outcomes.ACCEPTED]
