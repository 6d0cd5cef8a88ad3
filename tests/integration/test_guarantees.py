"""A guarantee per topic on a real router (issue 20, part 3; docs/guarantees.md): an
at-most-once topic's links are told snd-settle-mode settled, its unsettled publisher
is accepted on arrival and its subscribers get pre-settled copies, no record kept; a
topic a rule makes exactly-once refuses pre-settled links with precondition-failed."""

from __future__ import annotations

import pytest
from proton import Delivery, Link, Message
from proton.reactor import AtMostOnce
from proton.utils import BlockingConnection

RULES = [
    {"topics": ["metrics/#"], "mode": "at-most-once"},
    {"topics": ["orders/#"], "mode": "exactly-once"},
]


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


@pytest.mark.parametrize("role", ["publisher", "subscriber"])
def test_an_exactly_once_rule_refuses_presettled_links(router, role):
    conn = BlockingConnection(router.url, timeout=20)
    try:
        with pytest.raises(Exception, match="precondition-failed") as err:
            if role == "publisher":
                conn.create_sender("orders/eu", options=AtMostOnce())
            else:
                conn.create_receiver("orders/eu", options=AtMostOnce())
        assert "'orders/eu' is exactly-once ([[guarantee]] rule 2)" in str(err.value)
    finally:
        conn.close()
    router.check_alive("after a refused pre-settled link")
