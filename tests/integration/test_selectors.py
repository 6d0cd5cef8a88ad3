"""Selectors on real routers (issue 20, part 1): python-qpid-proton subscribers with
JMS selectors on a router and across two, each handed exactly what its selector
selects, the filter echoed in the router's attach, a message nobody selects
answered at once, a bad selector refused with its column (the router serving on),
and the event log naming who filtered what."""

from __future__ import annotations

import time

import pytest
from amqpclients import unique
from proton import Described, Message, symbol
from proton.reactor import Selector
from proton.utils import BlockingConnection

from router.client import ResumablePublisher, ResumableSubscriber

SECRET = {"network": {"secret": "selector-test-secret"}}
SELECTOR = "apache.org:selector-filter:string"


def color_of(n: int) -> str:
    return ("red", "green", "blue")[n % 3]


def publish(url: str, topic: str, count: int) -> list[int]:
    """Send messages 1..count (properties n and color); their outcome codes."""
    conn = BlockingConnection(url, timeout=20)
    try:
        sender = conn.create_sender(topic)
        return [
            sender.send(Message(body=f"m{n}", properties={"n": n, "color": color_of(n)})).remote_state
            for n in range(1, count + 1)
        ]
    finally:
        conn.close()


def filters_of(receiver) -> dict:
    """The filter set of the router's attach for ``receiver`` (what it applies)."""
    data = receiver.link.remote_source.filter
    data.rewind()
    return data.get_object() if data.next() else {}


def receive(conn: BlockingConnection, receiver, until: float = 1.5) -> list[str]:
    got = []
    while True:
        try:
            message = receiver.receive(timeout=until)
        except Exception:  # noqa: BLE001 - proton's Timeout: nothing more came
            return got
        got.append(message.body)
        receiver.accept()


def test_the_router_echoes_the_selector_it_applies(router):
    conn = BlockingConnection(router.url, timeout=20)
    try:
        topic = unique("sel-echo")
        reds = conn.create_receiver(topic, name="reds", options=Selector("color = 'red' OR n = 1"))
        every = conn.create_receiver(topic, name="every")
        (echo,) = filters_of(reds).values()
        assert isinstance(echo, Described) and echo.descriptor == symbol(SELECTOR)
        assert echo.value == "color = 'red' OR n = 1"  # the router applies it, so it says so
        assert not filters_of(every)  # and applies nothing to this one
    finally:
        conn.close()


def subscribers(urls: dict[str, str], topic: str, selectors: dict[str, str | None], tmp_path) -> tuple[list, dict]:
    got: dict[str, list] = {name: [] for name in selectors}
    subs = [
        ResumableSubscriber(
            [urls[name]],
            topic,
            container_id=f"sub-{name}",
            link_name=f"sub-{name}-l",
            state_path=tmp_path / f"{name}.state",
            selector=selector,
            on_message=lambda m, name=name: got[name].append(m.body),
        ).start()
        for name, selector in selectors.items()
    ]
    return subs, got


def run_traffic(publisher_url: str, topic: str, subs: list, got: dict, tmp_path, count: int = 30) -> list[str]:
    pub = ResumablePublisher([publisher_url], topic, container_id="pub", link_name="pub-l", state_path=tmp_path / "p.state")
    pub.start()
    try:
        # (a subscriber's attach is answered once the network knows it)
        assert all(s.wait_attached(20) for s in subs) and pub.wait_attached(20)
        states = [
            pub.send_async(f"m{n}", properties={"n": n, "color": color_of(n)}).result(30).state for n in range(1, count + 1)
        ]
        time.sleep(1.0)  # every copy answered before the outcome; the callbacks may lag a little
        return states
    finally:
        pub.close()
        for s in subs:
            s.close()


def test_each_subscriber_gets_what_its_selector_selects(router, tmp_path):
    topic = unique("sel")
    selectors = {"reds": "color = 'red' OR n = 1", "big": "n BETWEEN 7 AND 9 AND color <> 'green'", "every": None}
    subs, got = subscribers(dict.fromkeys(selectors, router.url), topic, selectors, tmp_path)
    assert run_traffic(router.url, topic, subs, got, tmp_path, 12) == ["accepted"] * 12
    assert got["reds"] == [f"m{n}" for n in range(1, 13) if color_of(n) == "red" or n == 1]
    assert got["big"] == [f"m{n}" for n in (7, 8, 9) if color_of(n) != "green"]
    assert got["every"] == [f"m{n}" for n in range(1, 13)]
    lines = {e["stream_seq"]: e for e in router.events() if e["event"] == "received" and e.get("topic") == topic}
    assert len(lines) == 12
    assert sorted(lines[1]["filtered"]) == ["sub-big/sub-big-l", "sub-reds/sub-reds-l"]  # m2, blue: "every" only
    assert lines[1]["owed"] == ["sub-every/sub-every-l"]
    assert lines[5]["filtered"] == ["sub-big/sub-big-l"]  # m6, red: "big" does not want it


def test_a_message_nobody_selects_is_answered_at_once(router):
    topic = unique("sel-none")
    conn = BlockingConnection(router.url, timeout=20)
    try:
        conn.create_receiver(topic, options=Selector("color = 'purple'"))
        started = time.monotonic()
        sender = conn.create_sender(topic)
        delivery = sender.send(Message(body="x", properties={"color": "red"}))
        assert delivery.remote_state == delivery.ACCEPTED
        assert time.monotonic() - started < 5
    finally:
        conn.close()


@pytest.mark.parametrize(
    "selector, fragment",
    [("color = ", "column 7"), ("color LIKE 'x' ESCAPE 'yz'", "ESCAPE takes one character"), ("and = 1", "is a keyword")],
)
def test_a_bad_selector_refuses_the_attach(router, selector, fragment):
    conn = BlockingConnection(router.url, timeout=20)
    try:
        with pytest.raises(Exception, match="invalid-field") as err:
            conn.create_receiver(unique("sel-bad"), options=Selector(selector))
        assert fragment in str(err.value)
    finally:
        conn.close()
    router.check_alive("after a bad selector")


def test_a_selector_that_is_not_a_string_is_refused(router):
    from proton.reactor import Filter

    conn = BlockingConnection(router.url, timeout=20)
    try:
        with pytest.raises(Exception, match="invalid-field") as err:
            conn.create_receiver(unique("sel-bad"), options=Filter({symbol("s"): Described(symbol(SELECTOR), 42)}))
        assert "expected a string" in str(err.value)
    finally:
        conn.close()


def test_selectors_across_routers(router_factory, tmp_path):
    """A publisher at A; subscribers with selectors at B (one reds, one nothing at
    all) and an unfiltered one at A: each gets exactly its messages, in order, once;
    every publish is accepted; B answers for a message its subscribers filter."""
    a = router_factory(
        "A", **SECRET, listener=[{"host": "127.0.0.1", "port": 0}, {"host": "127.0.0.1", "port": 0, "role": "inter-router"}]
    )
    b = router_factory("B", **SECRET, connector=[{"host": "127.0.0.1", "port": a.inter_router_port, "role": "inter-router"}])
    topic = unique("sel-net")
    selectors = {"reds": "color = 'red'", "none": "n < 0", "all": None}
    subs, got = subscribers({"reds": b.url, "none": b.url, "all": a.url}, topic, selectors, tmp_path)
    assert run_traffic(a.url, topic, subs, got, tmp_path) == ["accepted"] * 30
    assert got["all"] == [f"m{n}" for n in range(1, 31)]
    assert got["reds"] == [f"m{n}" for n in range(1, 31) if color_of(n) == "red"]
    assert got["none"] == []
    at_b = [e for e in b.events() if e["event"] == "received" and e.get("topic") == topic]
    assert len(at_b) == 30 and sum(1 for e in at_b if not e["owed"]) == 20  # B filtered the 20 not red
