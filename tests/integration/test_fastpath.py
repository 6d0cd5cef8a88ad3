"""The adapter's compiled fast path (router/adapter/_fastpath.c) against its Python path.

A real ``Engine`` serves a subscriber client (a raw proton connection, transports
wired back to back in memory, as in test_engine_batching.py) and a scripted core.
Hypothesis writes what the subscriber does with its deliveries (every outcome, settled
at once or later, repeated, links detached) and where the router reads; the same
script is played once with the compiled path and once with it switched off, and the
core must hear exactly the same calls, batch by batch, with the adapter left holding
the same copies."""

from __future__ import annotations

import pytest
from cproton_ffi import lib
from enginekit import Subscriber, serve
from hypothesis import given, settings
from hypothesis import strategies as st
from test_interrouter_flow import FakeLog, _conn

from router.adapter import fastpath
from router.adapter.engine import Engine
from router.core.commands import Forward, OpenLink, SettleOutgoing
from router.core.events import LinkAttached, OutcomeReceived

pytestmark = pytest.mark.timeout(120)

compiled_only = pytest.mark.skipif(fastpath.take_accepted is None, reason=f"compiled fast path not in use: {fastpath.status}")

PAYLOAD = b"\x00Sw\xa1\x01x"  # an AMQP value section: the engine forwards bytes as they are


def test_the_compiled_fast_path_is_built_and_bound():
    """A plain install builds it (setup.py); only EOROUTER_FASTPATH=0 turns it off."""
    import os

    if os.environ.get(fastpath.ENV, "1") == "0":
        pytest.skip("EOROUTER_FASTPATH=0")
    assert fastpath.status == "compiled", fastpath.status


class ScriptedCore:
    """Sends each subscriber link ``per_link`` deliveries; records every call. An
    accepted-but-unsettled answer on a tag in ``settle_back`` gets a SettleOutgoing,
    as the real core sends once a publisher settles."""

    def __init__(self, per_link: int, settle_back: frozenset):
        self.calls: list = []
        self.per_link = per_link
        self.settle_back = settle_back
        self.links: list[int] = []

    def tags(self, index: int) -> list[bytes]:
        return [f"L{index}-{i}".encode() for i in range(self.per_link)]

    def handle(self, event, now):
        self.calls.append(event)
        if isinstance(event, LinkAttached):
            self.links.append(event.link_id)
            return [OpenLink(event.link_id)] + [
                Forward(event.link_id, tag, PAYLOAD, False) for tag in self.tags(len(self.links) - 1)
            ]
        if isinstance(event, OutcomeReceived) and not event.settled and event.tag in self.settle_back:
            return [SettleOutgoing(event.link_id, event.tag)]
        return []

    def accepted_batch(self, items, now, out):
        triples = [tuple(items[i : i + 3]) for i in range(0, len(items), 3)]
        self.calls.append(("accepted_batch", triples))
        for link_id, tag, settled in triples:
            if not settled and tag in self.settle_back:
                out.append(SettleOutgoing(link_id, tag))

    def next_deadline(self):
        return None

    def failover_list(self):
        return []


# What the subscriber does with one delivery: (outcome or None, settle it now).
ACTIONS = {
    "accept+settle": (lib.PN_ACCEPTED, True),
    "accept": (lib.PN_ACCEPTED, False),
    "reject+settle": (lib.PN_REJECTED, True),
    "release+settle": (lib.PN_RELEASED, True),
    "modify": (lib.PN_MODIFIED, False),
    "settle": (None, True),
    "received": (lib.PN_RECEIVED, False),
}

steps = st.lists(
    st.one_of(
        st.tuples(st.just("act"), st.integers(0, 2), st.integers(0, 4), st.sampled_from(sorted(ACTIONS))),
        st.tuples(st.just("read")),
        st.tuples(st.just("detach"), st.integers(0, 2)),
    ),
    max_size=40,
)


def play(script: list, links: int, per_link: int, settle_back: frozenset, compiled: bool):
    saved = fastpath.take_accepted
    taken = [0]
    if compiled:

        def counting(*args):
            n = saved(*args)
            taken[0] += n
            return n

        fastpath.take_accepted = counting
    else:
        fastpath.take_accepted = None
    try:
        core = ScriptedCore(per_link, settle_back)
        engine = Engine(core, FakeLog(1, "boot"), max_message_size=1 << 20)
        conn = _conn(True, "router")
        client = Subscriber(links)
        serve(engine, conn, client)
        assert len(client.deliveries) == links * per_link
        for step in script:
            if step[0] == "read":
                serve(engine, conn, client)
            elif step[0] == "detach":
                index = step[1] % links
                if index not in client.closed:
                    client.closed.add(index)
                    lib.pn_link_close(client.links[index])
            else:
                _, index, i, action = step
                index %= links
                tag = f"L{index}-{i % per_link}".encode()
                d = client.deliveries.get(tag)
                if d is None or index in client.closed:
                    continue  # settled by us already (proton may have freed it), or its link is gone
                outcome, settle = ACTIONS[action]
                if outcome is not None:
                    lib.pn_delivery_update(d, outcome)
                if settle:
                    lib.pn_delivery_settle(d)
                    del client.deliveries[tag]
        serve(engine, conn, client)
        # The connection's id is a process-wide counter: the one difference between two plays.
        calls = [c._replace(conn_id=0) if hasattr(c, "conn_id") else c for c in core.calls]
        return calls, engine.counts(), taken[0]
    finally:
        fastpath.take_accepted = saved


@compiled_only
@settings(max_examples=150, deadline=None)
@given(
    script=steps,
    links=st.integers(1, 3),
    per_link=st.integers(1, 5),
    settle_back=st.frozensets(st.sampled_from([f"L{a}-{b}".encode() for a in range(3) for b in range(5)])),
)
def test_the_compiled_path_gives_the_core_what_the_python_path_gives(script, links, per_link, settle_back):
    calls_c, counts_c, _ = play(script, links, per_link, settle_back, compiled=True)
    calls_py, counts_py, taken = play(script, links, per_link, settle_back, compiled=False)
    assert calls_c == calls_py
    assert counts_c == counts_py


@compiled_only
def test_the_compiled_path_takes_the_usual_answers_and_leaves_the_rest():
    """Accepted + settled dispositions go through it; others (here an accept that waits
    for our settlement, and a rejection) reach the core through the Python path, in order."""
    script = [
        ("act", 0, 0, "accept+settle"),
        ("act", 0, 1, "accept"),
        ("act", 0, 2, "reject+settle"),
        ("act", 0, 3, "accept+settle"),
        ("act", 0, 4, "accept+settle"),
        ("read",),
    ]
    calls, counts, taken = play(script, 1, 5, frozenset({b"L0-1"}), compiled=True)
    assert taken == 3
    answers = [c for c in calls if type(c) is tuple or isinstance(c, OutcomeReceived)]
    link_id = calls[0].link_id
    # In the order the client's proton wrote them (its settled deliveries first); the
    # Python path's item (L0-1, unsettled) and the compiled path's share one batch.
    assert answers == [
        ("accepted_batch", [(link_id, b"L0-0", True)]),
        OutcomeReceived(link_id, b"L0-2", lib.PN_REJECTED, True),
        ("accepted_batch", [(link_id, b"L0-1", False), (link_id, b"L0-3", True), (link_id, b"L0-4", True)]),
    ]
    assert counts["outgoing"] == 0  # L0-1 settled by our SettleOutgoing, the rest by the subscriber


# ------------------------------------------------------------------ real router processes


def _fan_out_round(router, amqp, topic: str) -> None:
    """Three subscribers accept (and settle) 30 messages: every copy answered through
    whichever path the router runs, every publisher outcome accepted, no copy left."""
    subs = [amqp.connect(router.url).subscriber(topic, auto_accept=True) for _ in range(3)]
    pub = amqp.connect(router.url).publisher(topic)
    sent = [pub.send(f"m{i}") for i in range(30)]
    amqp.wait(lambda: all(s.outcome for s in sent), what="an outcome for every message")
    assert [s.outcome for s in sent] == ["accepted"] * 30
    for sub in subs:
        assert sub.bodies() == [f"m{i}" for i in range(30)]


@pytest.mark.parametrize("compiled", [True, False], ids=["compiled", "python"])
def test_a_router_process_relays_exactly_once_on_either_path(router_factory, amqp, monkeypatch, compiled):
    if compiled and fastpath.take_accepted is None:
        pytest.skip(f"compiled fast path not in use: {fastpath.status}")
    if not compiled:
        monkeypatch.setenv(fastpath.ENV, "0")
    router = router_factory("A")
    expected = "compiled path" if compiled else f"python ({fastpath.ENV}=0) path"
    assert f"subscribers' accepted dispositions: {expected}" in router.stderr()
    _fan_out_round(router, amqp, f"fastpath-{'c' if compiled else 'py'}")
    # One answer per copy in the log (read back unfolded), whichever path read it; its
    # lines reach the OS before the outcome that follows from them leaves the router.
    answers = [e for e in router.events() if e["event"] == "sub-outcome"]
    assert len(answers) == 90 and all(e["outcome"] == "accepted" for e in answers)
