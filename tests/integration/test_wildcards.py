"""Subscriptions to topic patterns on real routers (issue 20, wildcard topics):
python-qpid-proton subscribers to ``+``/``#`` patterns, on one router and across
two, each handed every message of every topic its pattern matches, once, in
publisher order per topic; a publisher naming a pattern, or a malformed pattern,
refused with amqp:invalid-field while the router serves on."""

from __future__ import annotations

import time

import pytest
from amqpclients import unique
from proton.utils import BlockingConnection

from router.client import ResumablePublisher, ResumableSubscriber

SECRET = {"network": {"secret": "wildcard-test-secret"}}


def subscribe(url: str, address: str, name: str, got: list, tmp_path) -> ResumableSubscriber:
    return ResumableSubscriber(
        [url],
        address,
        container_id=f"sub-{name}",
        link_name=f"sub-{name}-l",
        state_path=tmp_path / f"{name}.state",
        on_message=lambda m: got.append(m.body),
    ).start()


def publish_all(url: str, topics: list[str], count: int, tmp_path) -> list[str]:
    """``count`` messages to each topic, interleaved, each publisher resumable; the
    outcomes, in order."""
    pubs = [
        ResumablePublisher([url], t, container_id=f"pub-{i}", link_name=f"pub-{i}-l", state_path=tmp_path / f"p{i}.state")
        for i, t in enumerate(topics)
    ]
    try:
        for p in pubs:
            p.start()
            assert p.wait_attached(20)
        futures = [p.send_async(f"{t}:{n}") for n in range(1, count + 1) for p, t in zip(pubs, topics)]
        return [f.result(30).state for f in futures]
    finally:
        for p in pubs:
            p.close()


def per_topic(got: list[str], topic: str) -> list[int]:
    return [int(b.rsplit(":", 1)[1]) for b in got if b.rsplit(":", 1)[0] == topic]


def test_a_pattern_subscriber_gets_every_matching_topic_once_in_order(router, tmp_path):
    root = unique("wild")
    topics = [f"{root}/a", f"{root}/b", f"{root}/a/deep", f"other-{root}"]
    got = {"one": [], "rest": [], "exact": []}
    subs = [
        subscribe(router.url, f"{root}/+", "one", got["one"], tmp_path),
        subscribe(router.url, f"{root}/#", "rest", got["rest"], tmp_path),
        subscribe(router.url, f"{root}/a", "exact", got["exact"], tmp_path),
    ]
    try:
        assert all(s.wait_attached(20) for s in subs)
        states = publish_all(router.url, topics, 10, tmp_path)
        time.sleep(1.0)  # the callbacks may lag the outcomes a little
    finally:
        for s in subs:
            s.close()
    # Every message of a topic somebody matches is accepted; the other topic has nobody.
    assert [s for s, t in zip(states, topics * 10) if not t.startswith("other-")] == ["accepted"] * 30
    everything = list(range(1, 11))
    assert per_topic(got["one"], topics[0]) == everything and per_topic(got["one"], topics[1]) == everything
    assert per_topic(got["one"], topics[2]) == [] and len(got["one"]) == 20
    assert all(per_topic(got["rest"], t) == everything for t in topics[:3]) and len(got["rest"]) == 30
    assert got["exact"] == [f"{topics[0]}:{n}" for n in everything]
    lines = [e for e in router.events() if e["event"] == "received" and e.get("topic") == topics[0]]
    assert len(lines) == 10 and all(
        sorted(e["owed"]) == ["sub-exact/sub-exact-l", "sub-one/sub-one-l", "sub-rest/sub-rest-l"] for e in lines
    )


@pytest.mark.parametrize(
    "role, address, fragment",
    [("publisher", "w/+", "is a topic pattern"), ("publisher", "#", "is a topic pattern"), ("subscriber", "w/#/x", "'#'")],
)
def test_patterns_where_they_do_not_belong_are_refused(router, role, address, fragment):
    conn = BlockingConnection(router.url, timeout=20)
    try:
        with pytest.raises(Exception, match="invalid-field") as err:
            if role == "publisher":
                conn.create_sender(address)
            else:
                conn.create_receiver(address)
        assert fragment in str(err.value)
    finally:
        conn.close()
    router.check_alive("after a refused pattern")


def test_pattern_subscribers_across_routers(router_factory, tmp_path):
    """Publishers at A on two topics; at B one subscriber to a pattern taking both and
    one to a pattern taking one; at A one to "#"-below-root: each gets its topics'
    messages once, in order; every message is accepted; A forwards each message to B
    once, whatever the number of B's patterns that match it."""
    a = router_factory(
        "A", **SECRET, listener=[{"host": "127.0.0.1", "port": 0}, {"host": "127.0.0.1", "port": 0, "role": "inter-router"}]
    )
    b = router_factory("B", **SECRET, connector=[{"host": "127.0.0.1", "port": a.inter_router_port, "role": "inter-router"}])
    root = unique("wild-net")
    topics = [f"{root}/x/temp", f"{root}/y/temp"]
    got = {"both": [], "x": [], "local": []}
    subs = [
        subscribe(b.url, f"{root}/+/temp", "both", got["both"], tmp_path),
        subscribe(b.url, f"{root}/x/+", "x", got["x"], tmp_path),
        subscribe(a.url, f"{root}/#", "local", got["local"], tmp_path),
    ]
    try:
        assert all(s.wait_attached(20) for s in subs)
        states = publish_all(a.url, topics, 15, tmp_path)
        time.sleep(1.0)
    finally:
        for s in subs:
            s.close()
    assert states == ["accepted"] * 30
    everything = list(range(1, 16))
    assert per_topic(got["both"], topics[0]) == everything and per_topic(got["both"], topics[1]) == everything
    assert per_topic(got["x"], topics[0]) == everything and per_topic(got["x"], topics[1]) == []
    assert all(per_topic(got["local"], t) == everything for t in topics)
    at_a = [e for e in a.events() if e["event"] == "received" and e.get("topic") in topics]
    assert len(at_a) == 30 and all(e["routers"] == ["B"] for e in at_a)
    at_b = [e for e in b.events() if e["event"] == "received" and e.get("topic") in topics]
    assert len(at_b) == 30  # one copy per message crossed, however many patterns matched there
