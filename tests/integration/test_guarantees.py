"""A guarantee per topic on a real router (issue 20, part 3; docs/guarantees.md): an
at-most-once topic's links are told snd-settle-mode settled, its unsettled publisher
is accepted on arrival and its subscribers get pre-settled copies, no record kept; an
at-least-once topic's publisher waits for its subscribers and is settled with the
outcome, and nothing is remembered after; a topic a rule makes exactly-once or
at-least-once refuses pre-settled links with precondition-failed."""

from __future__ import annotations

import pytest
from proton import Delivery, Link, Message
from proton.reactor import AtLeastOnce, AtMostOnce
from proton.utils import BlockingConnection

RULES = [
    {"topics": ["metrics/#"], "mode": "at-most-once"},
    {"topics": ["orders/#"], "mode": "exactly-once"},
    {"topics": ["jobs/#"], "mode": "at-least-once"},
]


class AtLeastOnceSecond(AtLeastOnce):
    """Unsettled, and asks the router to wait for our settlement (rcv-settle-mode second)."""

    def apply(self, link):
        super().apply(link)
        link.rcv_settle_mode = Link.RCV_SECOND


@pytest.fixture(scope="module")
def router(module_router_factory):
    return module_router_factory("A", guarantee=RULES)


def test_an_at_most_once_topic_is_presettled_end_to_end(router):
    conn = BlockingConnection(router.url, timeout=20)
    try:
        receiver = conn.create_receiver("metrics/cpu", credit=10)
        sender = conn.create_sender("metrics/cpu")  # asks unsettled: the topic's mode is answered
        assert receiver.link.remote_snd_settle_mode == Link.SND_SETTLED
        assert sender.link.remote_snd_settle_mode == Link.SND_SETTLED
        states = [sender.send(Message(body=f"m{n}")).remote_state for n in range(5)]
        assert states == [Delivery.ACCEPTED] * 5  # accepted on arrival
        got = []
        for _ in range(5):
            message = receiver.receive(timeout=10)
            got.append(message.body)  # pre-settled: nothing to accept
        assert got == [f"m{n}" for n in range(5)]
    finally:
        conn.close()
    lines = [e for e in router.events() if e["event"] == "received" and e.get("topic") == "metrics/cpu"]
    assert len(lines) == 5 and all(e["settled"] and e["guarantee"] == "at-most-once" for e in lines)
    assert not [e for e in router.events() if e["event"] == "sub-outcome" and e.get("subscriber", "").endswith("metrics/cpu")]


def test_an_at_least_once_topic_waits_for_its_subscribers_and_forgets(router):
    conn = BlockingConnection(router.url, timeout=20)
    try:
        receiver = conn.create_receiver("jobs/build", credit=10)
        sender = conn.create_sender("jobs/build", options=AtLeastOnceSecond())  # asks second: first is answered
        assert receiver.link.remote_snd_settle_mode != Link.SND_SETTLED
        assert sender.link.remote_rcv_settle_mode == Link.RCV_FIRST
        delivery = sender.link.send(Message(body="j1"))
        message = receiver.receive(timeout=10)
        assert message.body == "j1"
        assert not delivery.settled  # owed to the subscriber: nothing yet
        receiver.accept()
        conn.wait(lambda: delivery.remote_state == Delivery.ACCEPTED and delivery.settled, timeout=10)
    finally:
        conn.close()
    mine = [e for e in router.events() if e.get("topic") == "jobs/build" and e["event"] == "received"]
    assert [e.get("guarantee") for e in mine] == ["at-least-once"]
    settled = [e for e in router.events() if e["event"] in ("settled", "completed") and e.get("delivery") == mine[0]["delivery"]]
    assert settled and settled[-1]["deleted"], settled  # forgotten at once, remembered by nobody


@pytest.mark.parametrize(("topic", "mode", "rule"), [("orders/eu", "exactly-once", 2), ("jobs/x", "at-least-once", 3)])
@pytest.mark.parametrize("role", ["publisher", "subscriber"])
def test_an_exactly_or_at_least_once_rule_refuses_presettled_links(router, role, topic, mode, rule):
    conn = BlockingConnection(router.url, timeout=20)
    try:
        with pytest.raises(Exception, match="precondition-failed") as err:
            if role == "publisher":
                conn.create_sender(topic, options=AtMostOnce())
            else:
                conn.create_receiver(topic, options=AtMostOnce())
        assert f"'{topic}' is {mode} ([[guarantee]] rule {rule})" in str(err.value)
    finally:
        conn.close()
    router.check_alive("after a refused pre-settled link")
