"""The byte budget (issue 16, part 4): publisher credit is withheld before the
message bytes a router's records hold reach its budget, per topic and router-wide;
it comes back as deliveries finish; small messages are not throttled by it."""

from __future__ import annotations

from corekit import Harness, encode
from hypothesis import given, settings
from hypothesis import strategies as st

from router.core.commands import Forward, GrantCredit

KB = 1024
BIG = encode("x" * (100 * KB))  # one AMQP message of about 100 KB


def credit_of(h, link) -> int:
    return h.core.publishers[link].credit


def granted(commands, link) -> int:
    return sum(c.credit for c in commands if isinstance(c, GrantCredit) and c.link_id == link)


def fill(h, pub, sub, limit=10_000):
    """Publish 100 KB messages while the publisher has credit; the subscriber takes
    them and answers nothing. Returns the tags sent to it."""
    tags = []
    n = 0
    while credit_of(h, pub) and n < limit:
        n += 1
        _, out = h.publish(pub, str(n).encode(), payload=BIG)
        tags += [c.tag for c in out if isinstance(c, Forward) and c.link_id == sub]
    return tags


def budget_lines(h):
    return [(e.fields["topic"], e.fields["state"]) for e in h.logs if e.kind == "budget"]


def test_a_topic_at_its_byte_budget_gets_no_more_credit_until_deliveries_finish():
    h = Harness(max_message_size=128 * KB, max_bytes_in_flight_per_topic=1024 * KB, max_bytes_in_flight=64 * 1024 * KB)
    h.attach_subscriber(1, topic="big")
    h.credit(1, 1000)
    h.attach_publisher(2, topic="big", rcv_first=True)
    tags = fill(h, 2, 1)
    held = h.core.topics["big"].bytes
    assert held <= 1024 * KB, f"{held} bytes held, over the topic's budget"
    assert len(tags) >= 8, "the budget is used, not left idle"
    assert credit_of(h, 2) == 0
    assert budget_lines(h) == [("big", "reached")]
    for tag in tags[:5]:  # five finish: their bytes go back, and credit with them
        out = h.answer(1, tag)
    assert granted(out, 2) > 0 or credit_of(h, 2) > 0
    assert budget_lines(h) == [("big", "reached"), ("big", "below")]


def test_the_router_wide_budget_holds_across_topics_and_credit_returns_where_it_waited():
    h = Harness(max_message_size=128 * KB, max_bytes_in_flight_per_topic=1024 * KB, max_bytes_in_flight=1536 * KB)
    for n, topic in ((1, "a"), (3, "b")):
        h.attach_subscriber(n, topic=topic)
        h.credit(n, 1000)
    h.attach_publisher(2, topic="a", rcv_first=True)
    tags_a = fill(h, 2, 1)
    h.attach_publisher(4, topic="b", rcv_first=True)
    tags_b = fill(h, 4, 3)
    assert h.core.bytes_held <= 1536 * KB
    assert credit_of(h, 2) == 0 and credit_of(h, 4) == 0
    assert ("b", "reached") in budget_lines(h)
    for tag in tags_a:  # topic a's deliveries finish: b may go on
        h.answer(1, tag)
    assert credit_of(h, 4) > 0, "b's credit came back when a gave its bytes back"
    assert tags_b


def test_small_messages_are_not_throttled_by_the_budget():
    h = Harness(max_bytes_in_flight_per_topic=4 * 1024 * KB, max_bytes_in_flight=8 * 1024 * KB)
    h.attach_subscriber(1, topic="small")
    h.credit(1, 100_000)
    h.attach_publisher(2, topic="small", rcv_first=True)
    sent = 0
    for n in range(3000):
        if not credit_of(h, 2):
            break
        _, out = h.publish(2, str(n).encode(), body="tiny")
        for c in out:
            if isinstance(c, Forward):
                h.answer(1, c.tag)
        sent += 1
    assert sent == 3000, f"credit ran out after {sent} small messages"
    assert h.core.topics["small"].est < 4 * KB, "the size estimate followed the messages down"
    assert budget_lines(h) == []
    assert h.core.bytes_held == 0 and h.core._promised == h.core.topics["small"].outstanding_credit * h.core.topics["small"].est


def test_a_topic_keeps_flowing_while_stuck_topics_hold_the_whole_router_budget():
    """Every topic may hold a few largest messages whatever the others hold."""
    h = Harness(max_message_size=128 * KB, max_bytes_in_flight_per_topic=1024 * KB, max_bytes_in_flight=2048 * KB)
    for n, topic in ((1, "stuck-1"), (3, "stuck-2")):
        h.attach_subscriber(n, topic=topic)
        h.credit(n, 1000)
        h.attach_publisher(n + 1, topic=topic, rcv_first=True)
        fill(h, n + 1, n)
    assert h.core.bytes_held >= 1800 * KB, "the stuck topics hold the router's budget"
    h.attach_subscriber(5, topic="live")
    h.credit(5, 100_000)
    h.attach_publisher(6, topic="live", rcv_first=True)
    delivered = 0
    for n in range(500):
        assert credit_of(h, 6), f"the live topic stopped after {n} messages"
        _, out = h.publish(6, str(n).encode(), body="small")
        for c in out:
            if isinstance(c, Forward):
                h.answer(5, c.tag)
                delivered += 1
    assert delivered == 500


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.one_of(
            st.tuples(st.just("publish"), st.integers(0, 1), st.sampled_from([10, 3000, 5000, 70_000, 120_000])),
            st.tuples(st.just("answer"), st.integers(0, 1), st.booleans()),
            st.tuples(st.just("detach"), st.integers(0, 1), st.just(0)),
        ),
        max_size=80,
    )
)
def test_the_byte_count_follows_the_records_exactly(plan):
    """Whatever happens, the bytes counted are the payloads the records hold (of
    those counted), the promise is each topic's outstanding credit at its estimate,
    and once every delivery finished nothing is counted."""
    h = Harness(
        max_message_size=128 * KB, max_bytes_in_flight_per_topic=512 * KB, max_bytes_in_flight=768 * KB, record_linger=0.0
    )
    for n in (0, 1):
        h.attach_subscriber(10 + n, topic=f"t{n}")
        h.credit(10 + n, 100_000)
    pubs = {0: 20, 1: 21}
    for n, link in pubs.items():
        h.attach_publisher(link, topic=f"t{n}", rcv_first=True)
    sent: dict[int, list] = {0: [], 1: []}
    tick = 0
    for action, n, arg in plan:
        tick += 1
        if action == "publish" and pubs[n] in h.core.publishers and credit_of(h, pubs[n]):
            _, out = h.publish(pubs[n], str(tick).encode(), payload=encode("x" * arg))
            sent[n] += [c.tag for c in out if isinstance(c, Forward)]
        elif action == "answer" and sent[n]:
            h.answer(10 + n, sent[n].pop(0))
        elif action == "detach" and pubs[n] in h.core.publishers:
            h.detach(pubs[n])
            pubs[n] = 30 + tick
            h.attach_publisher(pubs[n], topic=f"t{n}", rcv_first=True)
        core = h.core
        counted = {
            name: sum(len(r.payload) for r in t.records.values() if r.payload is not None and len(r.payload) >= 4096)
            for name, t in core.topics.items()
        }
        assert {name: t.bytes for name, t in core.topics.items()} == counted
        assert core.bytes_held == sum(counted.values())
        assert core._promised == sum(t.outstanding_credit * t.est for t in core.topics.values())
    for n in (0, 1):
        while sent[n]:
            h.answer(10 + n, sent[n].pop(0))
    h.advance(10.0)
    assert h.core.bytes_held == 0 and not h.core.records
