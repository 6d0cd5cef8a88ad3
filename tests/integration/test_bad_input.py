"""Bad client input: each gets a clear AMQP error condition, and nothing else is lost,
blocked or crashed. After every test the module's router must still be running (the
``router`` fixture checks) and a fresh publish/subscribe round trip must work.

This module's router has a small max message size (8 KiB) so oversized messages are cheap.
"""

from __future__ import annotations

import pytest
from amqpclients import TERMINAL, assert_round_trip, unique
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from proton import Message

pytestmark = pytest.mark.timeout(120)

HOLD = 0.5  # seconds a negative check waits; the router answers in ms on loopback
MAX_MESSAGE_SIZE = 8192


@pytest.fixture(scope="module")
def _shared_router(module_router_factory):
    return module_router_factory("A", limits={"max_message_size": MAX_MESSAGE_SIZE})


# --------------------------------------------------------------------------- message contents


def test_oversized_message_rejected_and_link_keeps_working(router, amqp):
    topic = unique("big")
    sub = amqp.connect(router.url).subscriber(topic, auto_accept=True)
    pub = amqp.connect(router.url).publisher(topic)
    big = pub.send("x" * (MAX_MESSAGE_SIZE * 3))
    amqp.wait(lambda: big.outcome, what="outcome for an oversized message")
    assert big.outcome == "rejected"
    assert big.condition is not None and big.condition.name == "amqp:link:message-size-exceeded", big.condition
    small = pub.send("small")
    amqp.wait(lambda: small.outcome, what="outcome of the next message on the same link")
    assert small.outcome == "accepted"
    assert sub.bodies() == ["small"], "the oversized message must not be forwarded"
    assert not pub.gone
    assert_round_trip(amqp, router)


def _truncated() -> bytes:
    encoded = Message(body="x" * 200, subject="s").encode()
    return encoded[: len(encoded) // 2]


MALFORMED = {
    "garbage": b"\xde\xad\xbe\xef" * 8,
    "truncated-message": _truncated(),
    "string-without-length": b"\x00\x53\x77\xa1",  # amqp-value section, str8 with nothing after
    "bad-section-descriptor-format": b"\x00\xff\xff",
}


@pytest.mark.parametrize("payload", list(MALFORMED.values()), ids=list(MALFORMED))
def test_malformed_message_rejected_with_decode_error(router, amqp, payload):
    topic = unique("malformed")
    sub = amqp.connect(router.url).subscriber(topic, auto_accept=True)
    pub = amqp.connect(router.url).publisher(topic)
    bad = pub.send(raw=payload)
    amqp.wait(lambda: bad.outcome, what="outcome for a malformed message")
    assert bad.outcome == "rejected"
    assert bad.condition is not None and bad.condition.name == "amqp:decode-error", bad.condition
    good = pub.send("good")
    amqp.wait(lambda: good.outcome, what="outcome of the next message on the same link")
    assert good.outcome == "accepted"
    assert sub.bodies() == ["good"], "the malformed message must not be forwarded"
    assert_round_trip(amqp, router)


def _mutations(data: bytes):
    """Strategies that damage a valid encoded message: truncate, flip, insert."""
    n = len(data)
    truncate = st.integers(0, n - 1).map(lambda i: data[:i])
    flip = st.tuples(st.integers(0, n - 1), st.integers(0, 255)).map(lambda t: data[: t[0]] + bytes([t[1]]) + data[t[0] + 1 :])
    insert = st.tuples(st.integers(0, n), st.binary(min_size=1, max_size=8)).map(lambda t: data[: t[0]] + t[1] + data[t[0] :])
    return st.one_of(truncate, flip, insert)


_VALID = Message(body={"k": [1, 2.5, "three"]}, subject="fuzz", properties={"p": 1}, annotations={"x-opt-a": "b"}).encode()


@settings(deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(payload=st.one_of(st.binary(max_size=300), _mutations(_VALID)))
def test_fuzz_message_bytes_never_kill_the_router(router, amqp, payload):
    # One publisher and one subscriber for all examples (a fresh topic per module run).
    state = _fuzz_state(router, amqp)
    sent = state["pub"].send(raw=payload)
    amqp.wait(lambda: sent.outcome, what=f"outcome for fuzzed payload {payload!r}")
    assert sent.outcome in TERMINAL
    event(f"{sent.outcome} {sent.condition.name if sent.condition else ''}")  # --hypothesis-show-statistics
    if sent.outcome == "accepted":
        # The router parses only the sections it must read, so it may relay a message
        # whose body proton-python cannot decode (invalid UTF-8, a list as a map key).
        # But relaying must not *break* a message: what fails to decode after the relay
        # must have failed before it too.
        last = state["sub"].received[-1]
        event("relayed: " + ("decodes" if last.decode_error is None else "does not decode"))
        if last.decode_error is not None:
            with pytest.raises(Exception):
                Message().decode(payload)
    if sent.outcome == "rejected" and sent.condition is not None:
        assert sent.condition.name in ("amqp:decode-error", "amqp:link:message-size-exceeded"), sent.condition
    router.check_alive("fuzzed payload")


_FUZZ: dict = {}


def _fuzz_state(router, amqp):
    if _FUZZ.get("amqp") is not amqp:  # one set of links per test run (the harness is per test)
        topic = unique("fuzz")
        _FUZZ.clear()
        _FUZZ["amqp"] = amqp
        _FUZZ["sub"] = amqp.connect(router.url).subscriber(topic, credit=10_000, auto_accept=True)
        _FUZZ["pub"] = amqp.connect(router.url).publisher(topic)
    return _FUZZ


def test_router_works_after_fuzzing(router, amqp):
    _FUZZ.clear()
    assert_round_trip(amqp, router)


def test_tag_reused_while_unsettled_is_rejected(router, amqp):
    topic = unique("dup")
    sub = amqp.connect(router.url).subscriber(topic)  # answers only when told
    pub = amqp.connect(router.url).publisher(topic)
    first = pub.send("first", tag=b"same")
    amqp.wait(lambda: len(sub.received) == 1, what="first delivery forwarded")
    second = pub.send("second", tag=b"same")  # AMQP: tags must be unique among unsettled ones
    amqp.wait(lambda: second.outcome, what="outcome for the reused tag")
    assert second.outcome == "rejected"
    assert second.condition is not None and second.condition.name == "amqp:invalid-field", second.condition
    assert first.outcome is None, "the earlier delivery with that tag is unaffected"
    sub.accept(sub.received[0])
    amqp.wait(lambda: first.outcome, what="outcome of the first delivery")
    assert first.outcome == "accepted"
    amqp.pump(HOLD)  # negative check: the rejected duplicate was never forwarded
    assert sub.bodies() == ["first"]
    assert_round_trip(amqp, router)


# --------------------------------------------------------------------------- attach


@pytest.mark.parametrize("role", ["publisher", "subscriber"])
def test_attach_without_address_is_refused(router, amqp, role):
    conn = amqp.connect(router.url)
    if role == "publisher":
        link = conn.publisher(None, name=unique("noaddr"), wait=False)
    else:
        link = conn.subscriber(None, name=unique("noaddr"), wait=False)
    link.wait_gone()
    assert link.remote_closed or link.remote_detached
    assert link.remote_condition is not None, "the refusal must carry an error condition"
    assert link.remote_condition.name.startswith("amqp:"), link.remote_condition
    # The connection itself is unharmed: a proper link on it works.
    topic = unique("afternoaddr")
    sub = conn.subscriber(topic, auto_accept=True)
    pub = conn.publisher(topic)
    sent = pub.send("ok")
    amqp.wait(lambda: sent.outcome, what="round trip on the same connection")
    assert sent.outcome == "accepted" and sub.bodies() == ["ok"]


@pytest.mark.parametrize("role", ["subscriber", "publisher"])
def test_second_attach_with_same_name_steals_the_link(router, amqp, role):
    topic, cid, name = unique("steal"), unique("steal-client"), unique("steal-link")
    sub = amqp.connect(router.url).subscriber(topic, auto_accept=True) if role == "publisher" else None
    pub = amqp.connect(router.url).publisher(topic) if role == "subscriber" else None
    c1 = amqp.connect(router.url, container_id=cid)
    c2 = amqp.connect(router.url, container_id=cid)
    if role == "subscriber":
        old = c1.subscriber(topic, name=name, auto_accept=True)
        new = c2.subscriber(topic, name=name, auto_accept=True)
    else:
        old = c1.publisher(topic, name=name)
        new = c2.publisher(topic, name=name)
    old.wait_gone()
    assert old.remote_condition is not None and old.remote_condition.name == "amqp:link:stolen", old.remote_condition
    assert new.attached, "the newer attach wins"
    assert not c1.gone, "only the link is taken over, not the old connection"
    if role == "subscriber":
        sent = pub.send("to the new link")
        amqp.wait(lambda: sent.outcome, what="outcome via the stealing subscriber")
        assert sent.outcome == "accepted"
        assert new.bodies() == ["to the new link"] and old.received == []
    else:
        sent = new.send("from the new link")
        amqp.wait(lambda: sent.outcome, what="outcome for the stealing publisher")
        assert sent.outcome == "accepted" and sub.bodies() == ["from the new link"]
    assert_round_trip(amqp, router)


# --------------------------------------------------------------------------- broken connections


def test_abrupt_disconnect_mid_delivery(router, amqp):
    topic = unique("midway")
    sub = amqp.connect(router.url).subscriber(topic, auto_accept=True)
    doomed = amqp.connect(router.url).publisher(topic)
    steady = amqp.connect(router.url).publisher(topic)
    encoded = Message(body="y" * 4000).encode()
    partial = doomed.send(raw=encoded[:1000], complete=False)  # more bytes promised
    transport = doomed.conn.connection.transport
    amqp.wait(lambda: transport.pending() == 0, what="the partial transfer to reach the socket")
    ok = steady.send("steady")  # interleaves with the unfinished delivery
    amqp.wait(lambda: ok.outcome, what="the other publisher's outcome")
    doomed.conn.abort()
    after = steady.send("after")
    amqp.wait(lambda: after.outcome, what="outcome after the abrupt disconnect")
    assert (ok.outcome, after.outcome) == ("accepted", "accepted")
    amqp.pump(HOLD)  # negative check: no fragment of the partial delivery is forwarded
    assert sub.bodies() == ["steady", "after"]
    assert partial.outcome is None
    assert_round_trip(amqp, router)


def test_aborted_transfer_is_discarded(router, amqp):
    topic = unique("aborted")
    sub = amqp.connect(router.url).subscriber(topic, auto_accept=True)
    pub = amqp.connect(router.url).publisher(topic)
    encoded = Message(body="z" * 4000).encode()
    partial = pub.send(raw=encoded[:1000], complete=False)
    amqp.wait(lambda: pub.conn.connection.transport.pending() == 0, what="partial transfer sent")
    pub.abort(partial)
    good = pub.send("good")
    amqp.wait(lambda: good.outcome, what="outcome after an aborted transfer")
    assert good.outcome == "accepted"
    amqp.pump(HOLD)  # negative check
    assert sub.bodies() == ["good"]
    assert_round_trip(amqp, router)


def test_publisher_vanishing_with_unsettled_deliveries(router, amqp):
    topic = unique("pubgone")
    sub = amqp.connect(router.url).subscriber(topic)  # holds its outcomes
    pub = amqp.connect(router.url).publisher(topic)
    for i in range(3):
        pub.send(f"v{i}")
    amqp.wait(lambda: len(sub.received) == 3, what="subscriber receives all three")
    pub.conn.abort()
    for rec in sub.received:
        sub.accept(rec)
    amqp.flush()
    assert_round_trip(amqp, router)
    amqp.pump(HOLD)  # negative check: no duplicate after the publisher vanished
    assert sub.bodies() == ["v0", "v1", "v2"]


def test_subscriber_vanishing_mid_stream(router, amqp):
    topic = unique("subgone")
    stays = amqp.connect(router.url).subscriber(topic, auto_accept=True)
    goes = amqp.connect(router.url).subscriber(topic, credit=2)
    pub = amqp.connect(router.url).publisher(topic)
    sent = [pub.send(f"s{i}") for i in range(5)]
    amqp.wait(lambda: len(goes.received) == 2 and len(stays.received) == 5, what="deliveries")
    goes.conn.abort()
    amqp.wait(lambda: all(s.outcome for s in sent), what="outcomes after the subscriber vanished")
    assert [s.outcome for s in sent] == ["accepted"] * 5
    assert_round_trip(amqp, router)


def test_subscriber_that_never_grants_credit(router, amqp):
    topic = unique("nocredit")
    lazy = amqp.connect(router.url).subscriber(topic, credit=0)
    eager = amqp.connect(router.url).subscriber(topic, auto_accept=True)
    pub = amqp.connect(router.url).publisher(topic)
    sent = [pub.send(f"n{i}") for i in range(3)]
    amqp.wait(lambda: len(eager.received) == 3, what="the eager subscriber receives everything")
    amqp.pump(HOLD)  # negative check: the outcomes wait for the subscriber without credit
    assert [s.outcome for s in sent] == [None] * 3
    assert lazy.received == []
    assert_round_trip(amqp, router, "other topics unaffected by a creditless subscriber")
    lazy.close()  # non-durable: it leaves, so it is no longer owed anything
    amqp.wait(lambda: all(s.outcome for s in sent), what="outcomes once the lazy subscriber left")
    assert [s.outcome for s in sent] == ["accepted"] * 3


def test_garbage_bytes_instead_of_amqp(router, amqp):
    import socket

    host, port = router.url.rsplit(":", 1)
    for junk in (b"GET / HTTP/1.1\r\nHost: x\r\n\r\n", b"AMQP\x07\x01\x00\x00", b"\x00" * 64):
        with socket.create_connection((host, int(port)), timeout=5) as sock:
            sock.sendall(junk)
            sock.settimeout(3)
            try:
                while sock.recv(4096):  # the router answers (a header or nothing) and hangs up
                    pass
            except (ConnectionResetError, TimeoutError):
                pass
    router.check_alive("after non-AMQP bytes")
    assert_round_trip(amqp, router)


def _send_junk(host: str, port: int, junk: bytes) -> None:
    import socket

    with socket.create_connection((host, port), timeout=5) as sock:
        sock.sendall(junk)
        sock.settimeout(3)
        try:
            while sock.recv(4096):
                pass
        except (ConnectionResetError, TimeoutError):
            pass


def test_garbage_bytes_are_logged_as_a_bounded_escaped_prefix(router_factory, amqp):
    """One such line was 1,149 characters: every byte a non-AMQP client sent, as proton
    quotes them. On a client and an inter-router listener alike, the log keeps a bounded,
    escaped prefix and says how much more there was."""
    import re
    import time

    from router.adapter.endpoints import LOG_TEXT_LIMIT

    router = router_factory(
        "G",
        listener=[{"host": "127.0.0.1", "port": 0, "role": "normal"}, {"host": "127.0.0.1", "port": 0, "role": "inter-router"}],
        network={"secret": "s3cret"},
    )
    http = b"GET / HTTP/1.1\r\nHost: x\r\n" + b"A" * 1100 + b"\r\n\r\n"
    binary = bytes(range(256)) * 4
    for port in (router.port, router.inter_router_port):
        _send_junk(router.host, port, http)
        _send_junk(router.host, port, binary)
    deadline = time.monotonic() + 10
    while True:
        lines = [line for line in router.stderr_since_start().splitlines() if "transport error" in line]
        if len(lines) == 4 or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert len(lines) == 4, router.stderr_since_start()
    for line in lines:
        description = line.split("framing-error: ", 1)[1]
        assert re.fullmatch(r".*\.\.\. \(\d[\d,]* more characters\)", description), line
        assert len(description.split("... (")[0]) <= LOG_TEXT_LIMIT, line
        assert line.isprintable(), repr(line)
    assert "Unknown protocol detected: 'GET / HTTP/1.1\\x0d\\x0aHost: x\\x0d\\x0aAAAA" in lines[0]
    assert "Unknown protocol detected: '\\x00\\x01\\x02\\x03" in lines[1]
    router.check_alive("after non-AMQP bytes")
    assert_round_trip(amqp, router)


@pytest.mark.parametrize(
    "text, logged",
    [
        ("plain", "plain"),
        ("tab\there\r\n\x00", "tab\\x09here\\x0d\\x0a\\x00"),
        ("caf\u00e9 \u2028 \U0001f600", "caf\u00e9 \\u2028 \U0001f600"),  # printable non-ASCII stays
        ("x" * 160, "x" * 160),
        ("x" * 161, "x" * 160 + "... (1 more characters)"),
        ("\x01" * 50, "\\x01" * 40 + "... (10 more characters)"),
        # proton's own escapes are text: a cut never ends inside one
        ("y" * 158 + "\\x0d" + "z" * 10, "y" * 158 + "... (14 more characters)"),
        (None, "-"),
    ],
)
def test_printable(text, logged):
    from router.adapter.endpoints import printable

    assert printable(text) == logged


def test_every_refused_attach_is_logged_the_same_way(router_factory, amqp):
    """A refusal decided by the core (no address, an address too long) was not logged at
    all, while the adapter's own (a reserved address) was, in another form: now each is
    one INFO line naming the connection, role, link, address, condition and reason."""
    import re
    import time

    from router.core.router import MAX_ADDRESS_LENGTH

    router = router_factory("R")
    conn = amqp.connect(router.url)
    long_address = "t" * (MAX_ADDRESS_LENGTH + 1)
    attempts = [  # (role, address, link name, condition)
        ("publisher", None, "no-target", "amqp:invalid-field"),
        ("subscriber", None, "no-source", "amqp:invalid-field"),
        ("publisher", "_eorouter/control", "reserved", "amqp:unauthorized-access"),
        ("subscriber", long_address, "too-long", "amqp:invalid-field"),
    ]
    for role, address, name, condition in attempts:
        link = (conn.publisher if role == "publisher" else conn.subscriber)(address, name=name, wait=False)
        link.wait_gone()
        assert link.remote_condition is not None and link.remote_condition.name == condition, link.remote_condition
    line = re.compile(
        r"INFO eorouter\.adapter: connection \d+ \(127\.0\.0\.1:\d+\): refused (?P<role>publisher|"
        r"subscriber) link '(?P<name>[^']*)' \(address (?P<address>.*?)\): (?P<condition>amqp:\S+): "
        r"(?P<reason>.+)$"
    )
    deadline = time.monotonic() + 5
    while True:
        found = [m.groupdict() for m in map(line.search, router.stderr_since_start().splitlines()) if m]
        if len(found) >= len(attempts) or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert [(f["role"], f["name"], f["condition"]) for f in found] == [
        (role, name, condition) for role, _, name, condition in attempts
    ], router.stderr_since_start()
    assert [f["address"] for f in found[:3]] == ["None", "None", "'_eorouter/control'"]
    assert found[3]["address"].endswith("more characters)")  # bounded like any peer text
    assert "needs a target address" in found[0]["reason"] and "needs a source address" in found[1]["reason"]
    assert_round_trip(amqp, router)
