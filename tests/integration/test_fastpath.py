"""The adapter's compiled fast path (router/adapter/_fastpath.c) against its Python path.

A real ``Engine`` serves a subscriber client, or a publisher client (a raw proton
connection, transports wired back to back in memory, as in test_engine_batching.py),
and a scripted core. For the publisher, hypothesis writes what it sends (whole, in two
transfers, aborted, too large, pre-settled), settles and closes; otherwise as follows.
Hypothesis writes what the subscriber does with its deliveries (every outcome, settled
at once or later, repeated, links detached) and where the router reads; the same
script is played once with the compiled path and once with it switched off, and the
core must hear exactly the same calls, batch by batch, with the adapter left holding
the same copies."""

from __future__ import annotations

from contextlib import contextmanager

import pytest
from cproton_ffi import ffi, lib
from enginekit import Publisher, Subscriber, move, serve
from hypothesis import given, settings
from hypothesis import strategies as st
from test_interrouter_flow import FakeLog, _conn, _socks

from router.adapter import fastpath
from router.adapter.engine import Engine
from router.core.commands import DetachLink, Forward, GrantCredit, Log, OpenLink, SendOutcome, SettleOutgoing, SubOutcomes
from router.core.errors import ProtocolError
from router.core.events import CreditChanged, LinkAttached, MessageReceived, MessageTooLarge, OutcomeReceived

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
        self.credit_trouble = False  # refuse or fail on some credit (REFUSED_CREDIT, FAILING_CREDIT)

    def tags(self, index: int) -> list[bytes]:
        return [f"L{index}-{i}".encode() for i in range(self.per_link)]

    def handle(self, event, now):
        self.calls.append(event)
        if self.credit_trouble and isinstance(event, CreditChanged) and event.credit % 17 == REFUSED_CREDIT:
            raise ProtocolError("amqp:not-allowed", f"no credit of {event.credit} here")
        if self.credit_trouble and isinstance(event, CreditChanged) and event.credit % 17 == FAILING_CREDIT:
            raise RuntimeError(f"the core failed on a credit of {event.credit}")
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


# A subscriber's credit (modulo 17: its link starts at 100) the scripted core refuses (the
# link is detached), or fails on (the connection is closed): the flow path's two ways out,
# taken alike on either path.
REFUSED_CREDIT = 7
FAILING_CREDIT = 13

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
        # the client's frames so far reach the router's transport, unread: what it does next
        # comes after them in the same read (a credit after answers: answers first)
        st.tuples(st.just("send")),
        st.tuples(st.just("detach"), st.integers(0, 2)),
        # more credit (the link's total goes past 100), drained, or one the core refuses or fails on
        st.tuples(st.just("flow"), st.integers(0, 2), st.sampled_from([1, 3, 7, 13, "drain"])),
    ),
    max_size=40,
)


COMPILED = (
    "take_accepted",
    "take_messages",
    "_forward",
    "_send_outcome",
    "_log_line",
    "_deliver_messages",
    "_deliver_answers",
    "read_into",
    "write_out",
    "_take_flows",
)


@contextmanager
def on_path(compiled: bool, counted: str):
    """The compiled path, with calls of ``counted`` summed into the list yielded; or the
    Python path (every compiled function switched off, as EOROUTER_FASTPATH=0 does)."""
    saved = {name: getattr(fastpath, name) for name in COMPILED}
    taken = [0]
    if compiled:

        def counting(*args):
            n = saved[counted](*args)
            taken[0] += n
            return n

        setattr(fastpath, counted, counting)
    else:
        for name in COMPILED:
            setattr(fastpath, name, None)
    try:
        yield taken
    finally:
        for name, value in saved.items():
            setattr(fastpath, name, value)
        while _socks:  # the play's connection's file descriptors (hypothesis plays hundreds)
            _socks.pop().close()


def act(client: Subscriber, step: tuple, links: int, per_link: int) -> None:
    """The subscriber does ``step``'s action with one of its deliveries (none when it
    settled that one already, proton may have freed it, or its link is gone)."""
    _, index, i, action = step
    index %= links
    tag = f"L{index}-{i % per_link}".encode()
    d = client.deliveries.get(tag)
    if d is None or index in client.closed:
        return
    outcome, settle = ACTIONS[action]
    if outcome is not None:
        lib.pn_delivery_update(d, outcome)
    if settle:
        lib.pn_delivery_settle(d)
        del client.deliveries[tag]


def play(script: list, links: int, per_link: int, settle_back: frozenset, compiled: bool):
    with on_path(compiled, "take_accepted") as taken:
        core = ScriptedCore(per_link, settle_back)
        core.credit_trouble = True
        engine = Engine(core, FakeLog(1, "boot"), max_message_size=1 << 20)
        conn = _conn(True, "router")
        client = Subscriber(links)
        serve(engine, conn, client)
        assert len(client.deliveries) == links * per_link
        for step in script:
            if step[0] == "read":
                serve(engine, conn, client)
            elif step[0] == "send":
                move(client.transport, conn.transport)
            elif step[0] == "detach":
                index = step[1] % links
                if index not in client.closed:
                    client.closed.add(index)
                    lib.pn_link_close(client.links[index])
            elif step[0] == "flow":
                index = step[1] % links
                if index not in client.closed:
                    if step[2] == "drain":
                        lib.pn_link_drain(client.links[index], 0)
                    else:
                        lib.pn_link_flow(client.links[index], step[2])
            else:
                act(client, step, links, per_link)
        serve(engine, conn, client)
        # The connection's id is a process-wide counter: the one difference between two plays.
        calls = [c._replace(conn_id=0) if hasattr(c, "conn_id") else c for c in core.calls]
        return calls, engine.counts(), taken[0]


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
def test_a_credit_read_after_answers_reaches_the_core_after_them_on_either_path():
    """A subscriber's answer and then more credit, in one read: the compiled flow path
    hands the answer to the core first (take_flows's -1), as the Python loop does."""
    script = [("act", 0, 0, "accept+settle"), ("send",), ("flow", 0, 5), ("read",)]
    taken = []
    original = fastpath._take_flows

    def counting(*args):
        taken.append(original(*args))
        return taken[-1]

    fastpath._take_flows = counting
    try:
        calls_c, counts_c, _ = play(script, 1, 3, frozenset(), compiled=True)
    finally:
        fastpath._take_flows = original
    calls_py, counts_py, _ = play(script, 1, 3, frozenset(), compiled=False)
    assert calls_c == calls_py and counts_c == counts_py
    assert -1 in taken and 1 in taken  # the answers went first, then the credit was taken compiled
    answers = calls_c.index(("accepted_batch", [(1, b"L0-0", True)]))
    assert [c.credit for c in calls_c[answers + 1 :] if isinstance(c, CreditChanged)] == [102]


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


# ------------------------------------------------------------------ the answers' commands


class AnswersCore(ScriptedCore):
    """ScriptedCore whose accepted_batch answers batch n with ``responses[n % len]``:
    what the real core gives (a lone SubOutcomes run, log lines, settlements) and what
    it must never give unnoticed (an error after some commands, a ProtocolError, an
    unknown command)."""

    def __init__(self, per_link: int, responses: list):
        super().__init__(per_link, frozenset())
        self.responses = responses
        self.batches = 0

    def accepted_batch(self, items, now, out):
        triples = [tuple(items[i : i + 3]) for i in range(0, len(items), 3)]
        self.calls.append(("accepted_batch", triples))
        response = self.responses[self.batches % len(self.responses)]
        self.batches += 1
        ids = [tag.decode() for _, tag, _ in triples]
        for what in response:
            if what == "run":
                out.append(SubOutcomes(ids, "sub/a", "accepted", True))
            elif what == "line":
                out.append(Log("pub-outcome", {"delivery": ids[0], "outcome": "accepted"}))
            elif what == "settle":
                out.append(SettleOutgoing(triples[0][0], triples[0][1]))
            elif what == "unknown":
                out.append(("not", "a", "command"))
            elif what == "protocol":
                raise ProtocolError("amqp:not-allowed", "scripted refusal")
            else:
                raise RuntimeError("scripted failure")


responses = st.lists(
    st.lists(st.sampled_from(["run", "run", "line", "settle", "unknown", "protocol", "fail"]), max_size=3),
    min_size=1,
    max_size=4,
)


def answer_play(script: list, links: int, per_link: int, response_list: list, directory, compiled: bool):
    """The subscriber's script played against an Engine with a real EventLog: what the
    core heard, the log's lines after router-started (boot id made constant), what
    happened to the connection, and the adapter's maps."""
    from router.eventlog import EventLog

    with on_path(compiled, "take_accepted"):
        core = AnswersCore(per_link, response_list)
        log = EventLog(directory, "R", buffer=fastpath.log_buffer() if compiled else None)
        engine = Engine(core, log, max_message_size=1 << 20)
        engine.now = 100.0
        conn = _conn(True, "router")
        client = Subscriber(links)
        serve(engine, conn, client)
        error = None
        for step in script:
            try:
                if step[0] == "read":
                    serve(engine, conn, client)
                elif step[0] == "act":
                    act(client, step, links, per_link)
            except TypeError as exc:  # an unknown command stops the loop on either path
                error = str(exc)
                break
        log.flush()
        lines = log.path.read_bytes().splitlines()[1:]
        boot = log.boot_id.encode()
        log.close()
        condition = lib.pn_connection_remote_condition(client.connection)
        name = lib.pn_condition_get_name(condition)
        closed = ffi.string(name).decode() if name != ffi.NULL else None
        calls = [c._replace(conn_id=0) if hasattr(c, "conn_id") else c for c in core.calls]
        return calls, [line.replace(boot, b"B") for line in lines], closed, error, engine.counts()


@compiled_only
@settings(max_examples=100, deadline=None)
@given(
    script=st.lists(
        st.one_of(
            st.tuples(st.just("act"), st.integers(0, 1), st.integers(0, 4), st.sampled_from(["accept+settle", "accept"])),
            st.tuples(st.just("read")),
        ),
        max_size=30,
    ),
    links=st.integers(1, 2),
    per_link=st.integers(1, 5),
    response_list=responses,
)
def test_the_compiled_path_carries_out_the_answers_commands_as_the_python_path(
    script, links, per_link, response_list, tmp_path_factory
):
    """The core's commands for a batch of accepted answers (a lone run of sub-outcomes,
    log lines, settlements), and its failures (an error after some commands, a
    ProtocolError, an unknown command): the same calls, the same log bytes, the same
    end of the connection, the same copies held, on both paths."""
    compiled = answer_play(script, links, per_link, response_list, tmp_path_factory.mktemp("c"), compiled=True)
    python = answer_play(script, links, per_link, response_list, tmp_path_factory.mktemp("p"), compiled=False)
    assert compiled == python


@compiled_only
def test_the_compiled_path_carries_out_answers_itself():
    """With the compiled path, the answers' batch never enters Engine._accepted_batch."""
    import tempfile

    called = []
    original = Engine._accepted_batch
    Engine._accepted_batch = lambda self, items, conn: called.append(items) or original(self, items, conn)
    try:
        with tempfile.TemporaryDirectory() as directory:
            calls, lines, closed, error, counts = answer_play(
                [("act", 0, 0, "accept+settle"), ("act", 0, 1, "accept+settle"), ("read",)], 1, 2, [["run"]], directory, True
            )
    finally:
        Engine._accepted_batch = original
    assert called == []
    assert [line.split(b'"event":')[1][:14] for line in lines] == [b'"sub-outcomes"']
    assert closed is None and error is None and counts["outgoing"] == 0


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
    assert f"subscribers' accepted dispositions and publishers' whole messages: {expected}" in router.stderr()
    _fan_out_round(router, amqp, f"fastpath-{'c' if compiled else 'py'}")
    # One answer per copy in the log (read back unfolded), whichever path read it; its
    # lines reach the OS before the outcome that follows from them leaves the router.
    answers = [e for e in router.events() if e["event"] == "sub-outcome"]
    assert len(answers) == 90 and all(e["outcome"] == "accepted" for e in answers)


# ------------------------------------------------------------------ publishers' messages


class RecordingCore:
    """A core that records every call; subclasses answer events in ``handle``."""

    def __init__(self):
        self.calls: list = []

    def accepted_batch(self, items, now, out):
        self.calls.append(("accepted_batch", items))

    def next_deadline(self):
        return None

    def failover_list(self):
        return []


class PublisherCore(RecordingCore):
    """Gives every publisher link credit; answers (accepted) the messages whose tag is in
    ``answer``, settling our side unless the tag is in ``hold`` (the publisher settles
    later: rcv-settle-mode second), closes a link on a message whose tag is in
    ``detach_on``, rejects what is too large; records every call. ``trouble``: tag ->
    "refuse" (a ProtocolError: the link is closed), "fail" (an error: the connection is
    closed) or "unknown" (a command the engine does not know: the connection is closed)."""

    def __init__(self, answer: frozenset, detach_on: frozenset, hold: frozenset = frozenset(), trouble=None):
        super().__init__()
        self.answer = answer
        self.detach_on = detach_on
        self.hold = hold
        self.trouble = trouble or {}

    def handle(self, event, now):
        self.calls.append(event)
        if isinstance(event, LinkAttached):
            return [OpenLink(event.link_id), GrantCredit(event.link_id, 50)]
        if isinstance(event, MessageReceived):
            trouble = self.trouble.get(event.tag)
            if trouble == "refuse":
                raise ProtocolError("amqp:not-allowed", "refused by the test's core")
            if trouble == "fail":
                raise RuntimeError("the test's core failed")
            if trouble == "unknown":
                return ["not a command"]
            out: list = []
            if event.tag in self.answer and not event.settled:
                out.append(SendOutcome(event.delivery, lib.PN_ACCEPTED, event.tag not in self.hold))
            if event.tag in self.detach_on:
                out.append(DetachLink(event.link_id))
            return out
        if isinstance(event, MessageTooLarge) and not event.settled:
            return [SendOutcome(event.delivery, lib.PN_REJECTED, True)]
        return []


SMALL, HALVED, TOO_LARGE = b"s" * 100, b"h" * 600, b"L" * 1500  # the engine's limit below: 1000 bytes

publishing = st.lists(
    st.one_of(
        st.tuples(st.just("send"), st.integers(0, 1), st.sampled_from(["small", "too-large"]), st.booleans()),
        st.tuples(st.just("begin"), st.integers(0, 1)),
        st.tuples(st.just("finish"), st.integers(0, 1)),
        st.tuples(st.just("abort"), st.integers(0, 1)),
        st.tuples(st.just("read")),
        st.tuples(st.just("settle"), st.integers(0, 30)),
        st.tuples(st.just("detach"), st.integers(0, 1)),
    ),
    max_size=40,
)


def publish(script: list, answer: frozenset, detach_on: frozenset, compiled: bool, hold: frozenset = frozenset(), trouble=None):
    """The script played by a two-link publisher against a real Engine; returns what the
    core heard, the engine's counts (the outcomes told per topic with them), what the
    publisher was answered, and how many messages the compiled path took."""
    with on_path(compiled, "take_messages") as taken:
        core = PublisherCore(answer, detach_on, hold, trouble)
        engine = Engine(core, FakeLog(1, "boot"), max_message_size=1000)
        conn = _conn(True, "router")
        client = Publisher(2)
        serve(engine, conn, client)
        open_part: dict[int, bytes] = {}  # link index -> the tag of its delivery in progress
        n = 0
        for step in script:
            kind = step[0]
            if kind == "read":
                serve(engine, conn, client)
                continue
            if kind == "settle":
                tag = f"m{step[1]}".encode()
                if tag not in open_part.values():  # (one still being sent is finished or aborted first)
                    d = client.sent.pop(tag, None)
                    if d is not None:
                        lib.pn_delivery_settle(d)
                continue
            index = step[1]
            if index in client.closed:
                continue
            if kind == "detach":
                client.closed.add(index)
                lib.pn_link_close(client.links[index])
            elif kind in ("finish", "abort"):
                tag = open_part.pop(index, None)
                if tag is None:
                    continue
                if kind == "finish":
                    client.finish(index, HALVED)
                else:
                    lib.pn_delivery_abort(client.sent.pop(tag))
            elif index not in open_part:  # a link sends one delivery at a time
                tag = f"m{n}".encode()
                n += 1
                if kind == "begin":
                    client.send(index, tag, HALVED, whole=False)
                    open_part[index] = tag
                else:
                    client.send(index, tag, SMALL if step[2] == "small" else TOO_LARGE, settled=step[3])
        serve(engine, conn, client)
        calls = [c._replace(conn_id=0) if hasattr(c, "conn_id") else c for c in core.calls]
        # What the publisher saw of its connection and links (closed by the router, with which condition).
        ends = [
            (lib.pn_connection_state(client.connection), _condition(lib.pn_connection_remote_condition(client.connection)))
        ] + [(lib.pn_link_state(link), _condition(lib.pn_link_remote_condition(link))) for link in client.links]
        # The deliveries the router has not settled on its side, per link it still has.
        held = {link.link_id: lib.pn_link_unsettled(link.ptr) for link in engine._links.values()}
        return calls, (engine.counts(), dict(engine.outcomes_told), held), (client.outcomes(), ends), taken[0]


def _condition(condition) -> str | None:
    if not lib.pn_condition_is_set(condition):
        return None
    return ffi.string(lib.pn_condition_get_name(condition)).decode()


@compiled_only
@settings(max_examples=150, deadline=None)
@given(
    script=publishing,
    answer=st.frozensets(st.sampled_from([f"m{i}".encode() for i in range(30)])),
    detach_on=st.frozensets(st.sampled_from([f"m{i}".encode() for i in range(30)]), max_size=2),
    hold=st.frozensets(st.sampled_from([f"m{i}".encode() for i in range(30)])),
    trouble=st.dictionaries(
        st.sampled_from([f"m{i}".encode() for i in range(30)]), st.sampled_from(["refuse", "fail", "unknown"]), max_size=2
    ),
)
def test_the_compiled_path_gives_the_core_the_messages_the_python_path_gives(script, answer, detach_on, hold, trouble):
    """Messages whole or in two transfers, aborted, too large, pre-settled, settled by the
    publisher later, answered and settled at once or answered and held, links closed by
    either side, a message the core refuses or fails on, read at any point: the core
    hears the same events and the publisher the same answers on both paths, and the
    outcomes told are counted alike."""
    calls_c, counts_c, outcomes_c, _ = publish(script, answer, detach_on, compiled=True, hold=hold, trouble=trouble)
    calls_py, counts_py, outcomes_py, _ = publish(script, answer, detach_on, compiled=False, hold=hold, trouble=trouble)
    assert calls_c == calls_py
    assert counts_c == counts_py
    assert outcomes_c == outcomes_py


@compiled_only
def test_the_compiled_path_takes_whole_messages_and_leaves_the_rest():
    """Whole messages within the limit go through it, pre-settled or not; a message in two
    transfers, an aborted one and one too large reach the core through the Python path,
    and every one in the order the publisher sent it."""
    script = [
        ("send", 0, "small", False),  # m0
        ("send", 0, "small", True),  # m1, pre-settled
        ("begin", 1),  # m2, its first half
        ("read",),
        ("finish", 1),
        ("send", 0, "too-large", False),  # m3
        ("begin", 1),  # m4, aborted
        ("read",),
        ("abort", 1),
        ("send", 0, "small", False),  # m5
        ("send", 1, "small", False),  # m6
        ("read",),
    ]
    calls, counts, (outcomes, _), taken = publish(script, frozenset({b"m0", b"m5"}), frozenset(), compiled=True)
    assert taken == 4  # m0, m1, m5, m6
    heard = [(type(c).__name__, c.tag, c.settled) for c in calls if isinstance(c, (MessageReceived, MessageTooLarge))]
    assert heard == [
        ("MessageReceived", b"m0", False),
        ("MessageReceived", b"m1", True),
        ("MessageReceived", b"m2", False),
        ("MessageTooLarge", b"m3", False),
        ("MessageReceived", b"m5", False),
        ("MessageReceived", b"m6", False),
    ]
    assert outcomes[b"m0"] == (lib.PN_ACCEPTED, True) and outcomes[b"m3"] == (lib.PN_REJECTED, True)
    assert outcomes[b"m6"] == (0, False)  # unanswered: the core holds it


@compiled_only
def test_a_message_the_core_refuses_or_fails_on_ends_its_link_or_connection_on_either_path():
    """A ProtocolError from the core closes the message's link with its condition; any
    other error in the core or in executing its commands closes the connection
    (amqp:internal-error), and the messages read with it still reach the core: the same
    on both paths (what the router still holds unsettled included)."""
    script = [("send", 0, "small", True)] + [("send", i % 2, "small", False) for i in range(1, 7)] + [("read",)]
    for trouble, closed in (
        ({b"m2": "refuse"}, "link"),
        ({b"m3": "fail"}, "connection"),
        ({b"m4": "unknown"}, "connection"),
    ):
        calls_c, counts_c, (outcomes_c, ends_c), taken = publish(
            script, frozenset({b"m1", b"m5"}), frozenset(), compiled=True, trouble=trouble
        )
        calls_py, counts_py, (outcomes_py, ends_py), _ = publish(
            script, frozenset({b"m1", b"m5"}), frozenset(), compiled=False, trouble=trouble
        )
        assert taken == 7
        assert (calls_c, counts_c, outcomes_c, ends_c) == (calls_py, counts_py, outcomes_py, ends_py)
        assert [c.tag for c in calls_c if isinstance(c, MessageReceived)] == [b"m%d" % i for i in range(7)]
        connection, *links = ends_c
        if closed == "link":
            assert connection[1] is None and links[0][1] == "amqp:not-allowed"
        else:
            assert connection[1] == "amqp:internal-error"


@compiled_only
def test_the_compiled_path_sends_accepted_outcomes_and_leaves_the_rest(monkeypatch):
    """An accepted outcome, settled at once or held for the publisher to settle, is sent by
    the compiled twin; a rejection (the message too large) by CORE_send_outcome; the
    publisher sees each, and the counts per topic are the Python path's."""
    python_sent: list = []
    python_method = Engine.CORE_send_outcome

    def counted(self, cmd):
        python_sent.append(cmd)
        return python_method(self, cmd)

    monkeypatch.setattr(Engine, "CORE_send_outcome", counted)
    script = [("send", 0, "small", False), ("send", 1, "small", False), ("send", 0, "too-large", False), ("read",)]
    answer, hold = frozenset({b"m0", b"m1"}), frozenset({b"m1"})
    calls, counts, (outcomes, _), _ = publish(script, answer, frozenset(), compiled=True, hold=hold)
    assert [cmd.outcome for cmd in python_sent] == [lib.PN_REJECTED]
    assert outcomes == {b"m0": (lib.PN_ACCEPTED, True), b"m1": (lib.PN_ACCEPTED, False), b"m2": (lib.PN_REJECTED, True)}
    python_sent.clear()
    python_counts, (python_outcomes, _) = publish(script, answer, frozenset(), compiled=False, hold=hold)[1:3]
    assert (python_counts, python_outcomes) == (counts, outcomes)
    assert len(python_sent) == 3


@compiled_only
def test_messages_after_one_that_closed_their_link_are_dropped_as_the_python_path_drops_them():
    """The core closes the link on the first message of a run the compiled path read in
    one call: the rest of the run never reaches the core, as when read one by one."""
    script = [("send", 0, "small", False) for _ in range(4)] + [("read",)]
    calls_c, _, outcomes_c, taken = publish(script, frozenset(), frozenset({b"m1"}), compiled=True)
    calls_py, _, outcomes_py, _ = publish(script, frozenset(), frozenset({b"m1"}), compiled=False)
    assert taken == 4
    assert [c.tag for c in calls_c if isinstance(c, MessageReceived)] == [b"m0", b"m1"]
    assert calls_c == calls_py and outcomes_c == outcomes_py


# ------------------------------------------------------------------ copies sent


class CopiesCore(RecordingCore):
    """Sends the subscriber link a pre-settled copy, an unsettled one and one large
    enough to go out piece by piece (streaming.py); records every call."""

    LARGE = b"\x00Sw\xb0" + (300 * 1024).to_bytes(4, "big") + b"y" * (300 * 1024)  # a 300 KiB binary value

    def handle(self, event, now):
        self.calls.append(event)
        if isinstance(event, LinkAttached):
            return [
                OpenLink(event.link_id),
                Forward(event.link_id, b"settled", PAYLOAD, True),
                Forward(event.link_id, b"unsettled", PAYLOAD, False),
                Forward(event.link_id, b"large", self.LARGE, False),
                Forward(event.link_id + 99, b"no-such-link", PAYLOAD, False),
            ]
        return []


@pytest.mark.parametrize("compiled", [True, False], ids=["compiled", "python"])
def test_copies_go_out_alike_on_either_path(compiled):
    """A small copy by the compiled path (pre-settled or held until answered), a large
    one by the Python path's streaming, a copy for a link gone: the subscriber gets the
    same bytes, and the adapter holds and counts the same, on both paths."""
    if compiled and fastpath._forward is None:
        pytest.skip(f"compiled fast path not in use: {fastpath.status}")
    with on_path(compiled, "take_accepted"):
        core = CopiesCore()
        engine = Engine(core, FakeLog(1, "boot"), max_message_size=1 << 20)
        if compiled:
            assert engine._command_handlers[Forward] != engine.CORE_forward
        conn = _conn(True, "router")
        client = Subscriber(1, credit=10)
        serve(engine, conn, client)
        settled = {tag: bool(lib.pn_delivery_settled(d)) for tag, d in client.deliveries.items()}
        link = next(iter(engine._links.values()))
        # The small ones whole; the large one on its way piece by piece, held by the streaming path.
        assert client.bodies == {b"settled": PAYLOAD, b"unsettled": PAYLOAD}
        assert settled == {b"settled": True, b"unsettled": False}
        assert list(link.out) == [b"unsettled", b"large"] and link.streams
        assert engine.copies_sent == {"topic": 3}


class CountedCopiesCore(RecordingCore):
    """Opens the subscriber's two links (one topic); once both have credit, a run of
    copies to them in turn, one to a link gone in between, and then (``trouble``) a
    command nobody knows."""

    def __init__(self, trouble: bool):
        super().__init__()
        self.trouble = trouble
        self.credited: list[int] = []

    def handle(self, event, now):
        self.calls.append(event)
        if isinstance(event, LinkAttached):
            return [OpenLink(event.link_id)]
        if isinstance(event, CreditChanged) and event.link_id not in self.credited:
            self.credited.append(event.link_id)
            if len(self.credited) < 2:
                return []
            one, two = self.credited
            out = [Forward(one, b"a", PAYLOAD, False), Forward(two, b"b", PAYLOAD, True), Forward(one, b"c", PAYLOAD, True)]
            out += [Forward(two + 99, b"gone", PAYLOAD, False), Forward(two, b"d", PAYLOAD, False)]
            return out + [("not", "a", "command")] if self.trouble else out
        return []


@pytest.mark.parametrize("trouble", [False, True], ids=["usual", "failing"])
def test_a_batch_of_copies_is_counted_alike_on_either_path(trouble):
    """The compiled path counts a batch's run of copies per topic once, at the batch's end
    (execute_commands), across the links of one topic: the same counts as the Python
    path's one by one, when the batch fails midway too."""
    counts = {}
    for compiled in (True, False):
        if compiled and fastpath._forward is None:
            pytest.skip(f"compiled fast path not in use: {fastpath.status}")
        with on_path(compiled, "take_accepted"):
            engine = Engine(CountedCopiesCore(trouble), FakeLog(1, "boot"), max_message_size=1 << 20)
            conn = _conn(True, "router")
            client = Subscriber(2, credit=10)
            try:
                serve(engine, conn, client)
            except TypeError:  # the unknown command stops the loop on either path
                assert trouble
            counts[compiled] = dict(engine.copies_sent)
            assert set(client.bodies) == {b"a", b"b", b"c", b"d"}
    assert counts[True] == counts[False] == {"topic": 4}


class BatchAnswersCore(PublisherCore):
    """Holds its answers until the publisher's sixth message, then answers all six in one
    batch: accepted (settled, and one held for the publisher to settle), one rejected
    (CORE_send_outcome's part), one to a handle nobody knows, and then (``trouble``) a
    command nobody knows."""

    def __init__(self, trouble: bool):
        super().__init__(frozenset(), frozenset())
        self.batch_trouble = trouble
        self.held: list[int] = []

    def handle(self, event, now):
        if not isinstance(event, MessageReceived):
            return super().handle(event, now)
        self.calls.append(event)
        self.held.append(event.delivery)
        if len(self.held) < 6:
            return []
        one, two, three, four, five, six = self.held
        out = [SendOutcome(one, lib.PN_ACCEPTED, True), SendOutcome(two, lib.PN_ACCEPTED, False)]
        out += [SendOutcome(three, lib.PN_REJECTED, True), SendOutcome(four, lib.PN_ACCEPTED, True)]
        out += [SendOutcome(six + 99, lib.PN_ACCEPTED, True), SendOutcome(five, lib.PN_ACCEPTED, True)]
        out += [SendOutcome(six, lib.PN_ACCEPTED, True)]
        return out + [("not", "a", "command")] if self.batch_trouble else out


@pytest.mark.parametrize("trouble", [False, True], ids=["usual", "failing"])
def test_a_batch_of_answers_is_counted_alike_on_either_path(trouble):
    """The compiled path counts a batch's run of outcomes told per (topic, outcome) once,
    at the batch's end, across the publisher's two links of one topic, with a rejection
    (told by the Python method) and an unknown handle among them: the same counts as the
    Python path's one by one, when the batch fails midway too."""
    told = {}
    for compiled in (True, False):
        if compiled and fastpath._send_outcome is None:
            pytest.skip(f"compiled fast path not in use: {fastpath.status}")
        with on_path(compiled, "take_messages"):
            engine = Engine(BatchAnswersCore(trouble), FakeLog(1, "boot"), max_message_size=1000)
            conn = _conn(True, "router")
            client = Publisher(2)
            serve(engine, conn, client)
            for i in range(6):
                client.send(i % 2, f"m{i}".encode(), SMALL)
            serve(engine, conn, client)
            told[compiled] = dict(engine.outcomes_told)
            outcomes = client.outcomes()
            assert outcomes[b"m2"] == (lib.PN_REJECTED, True)
            assert outcomes[b"m1"] == (lib.PN_ACCEPTED, False)
            assert all(outcomes[b"m%d" % i] == (lib.PN_ACCEPTED, True) for i in (0, 3, 4, 5))
    assert told[True] == told[False] == {("topic", lib.PN_ACCEPTED): 5, ("topic", lib.PN_REJECTED): 1}


class RelayCore(PublisherCore):
    """Opens every link, gives publishers credit; each publisher message is copied to
    every subscriber link (and one to a link gone) and answered accepted at once, except
    the tags in ``trouble`` (PublisherCore's)."""

    def __init__(self, trouble=None):
        super().__init__(frozenset(), frozenset(), trouble=trouble)
        self.subscribers: list[int] = []

    def handle(self, event, now):
        if isinstance(event, LinkAttached) and event.role == "subscriber":
            self.calls.append(event)
            self.subscribers.append(event.link_id)
            return [OpenLink(event.link_id)]
        out = super().handle(event, now)
        if isinstance(event, MessageReceived) and event.tag not in self.trouble:
            out = [Forward(s, event.tag, PAYLOAD, False) for s in self.subscribers + [max(self.subscribers) + 99]]
            out.append(SendOutcome(event.delivery, lib.PN_ACCEPTED, True))
        return out


@pytest.mark.parametrize(
    "trouble, relayed", [({}, 6), ({b"m3": "fail"}, 5), ({b"m2": "refuse"}, 5)], ids=["usual", "failing", "refused"]
)
def test_a_run_of_messages_copies_and_answers_are_counted_alike_on_either_path(trouble, relayed):
    """Messages read together are one batch on the compiled path (deliver_messages): their
    copies to a subscriber's two links of the topic and their answers are counted once,
    at the run's end, when the core fails on a message midway or refuses one too (the
    rest of the run read with it is still relayed): the same counts as the Python path's."""
    counts = {}
    for compiled in (True, False):
        if compiled and fastpath._deliver_messages is None:
            pytest.skip(f"compiled fast path not in use: {fastpath.status}")
        with on_path(compiled, "take_messages") as taken:
            engine = Engine(RelayCore(trouble), FakeLog(1, "boot"), max_message_size=1000)
            sub_conn, pub_conn = _conn(True, "router"), _conn(True, "router")
            subscriber, publisher = Subscriber(2, credit=10), Publisher(2)
            serve(engine, sub_conn, subscriber)
            serve(engine, pub_conn, publisher)
            for i in range(6):
                publisher.send(i % 2, f"m{i}".encode(), SMALL)
            serve(engine, pub_conn, publisher)
            # (read before anything else runs: nothing of the run may be left pending)
            counts[compiled] = (dict(engine.copies_sent), dict(engine.outcomes_told))
            serve(engine, sub_conn, subscriber)
            assert len(subscriber.bodies) == relayed
            if compiled:
                assert taken[0] == 6  # read together
    assert counts[True] == counts[False] == ({"topic": 2 * relayed}, {("topic", lib.PN_ACCEPTED): relayed})


def test_an_extension_built_from_an_older_source_leaves_the_router_on_the_python_path(monkeypatch):
    """An editable install whose _fastpath was built before a function was added: the
    router runs every part in Python (and says so) rather than failing at start-up."""
    import importlib
    import types

    older = types.SimpleNamespace(bind=lambda path, accepted: None, take_accepted=lambda *a: 0, set_link_id=lambda *a: None)
    monkeypatch.setattr(importlib, "import_module", lambda name: older)
    saved = {name: getattr(fastpath, name) for name in (*COMPILED, "_set_link_id", "status")}
    try:
        for name in COMPILED:
            setattr(fastpath, name, None)
        monkeypatch.delenv(fastpath.ENV, raising=False)
        fastpath._load()
        assert fastpath.status.startswith("python (compiled fast path unusable"), fastpath.status
        assert all(getattr(fastpath, name) is None for name in COMPILED)
    finally:
        for name, value in saved.items():
            setattr(fastpath, name, value)


# ------------------------------------------------------------------ event-log lines

KINDS = ("received", "completed", "pub-outcome", "forwarded", "link-attached")  # link-attached: counted by CORE_log

ODD_VALUES = ("plain", None, True, -7, 2**63 - 1, 2**64 - 1, 1.5, "é", 'q"', "a\\b", "\n", {"k": 1}, [["x"]], ("t", 1))

writing = st.lists(
    st.one_of(
        # (a field the compiled encoder writes itself, or one it leaves to orjson: a float, a
        # string to escape or not ASCII, an int past 64 bits, a nested dict)
        st.tuples(st.just("line"), st.sampled_from(KINDS), st.integers(0, 3), st.sampled_from(ODD_VALUES)),
        st.tuples(st.just("sub-outcome"), st.sampled_from(["s1", "s2"]), st.booleans()),
        # the usual "received" line, a Received (no dict): an odd value in one of its places
        # (which the compiled encoder leaves to orjson), a tag of any bytes, lists of any length
        st.tuples(
            st.just("received"),
            st.integers(0, 10),
            st.sampled_from(ODD_VALUES),
            st.binary(max_size=33),
            st.integers(0, 3),
            st.booleans(),
        ),
        # the usual "completed" line, a Completed (no dict): settled by the router now or not,
        # an odd value in one of its places
        st.tuples(st.just("completed"), st.integers(0, 4), st.sampled_from(ODD_VALUES), st.sampled_from([None, "router"])),
        st.tuples(st.just("sub-outcomes"), st.sampled_from(["s1", "s2"]), st.integers(1, 3)),
        st.tuples(st.just("tick")),
        st.tuples(st.just("flush")),
        st.tuples(st.just("empty")),  # a line without fields of its own
        # a log far into its sequence numbers (digits carried over, and as long as they get)
        st.tuples(st.just("seq"), st.sampled_from([8, 9, 98, 99, 999_999, 10**12 - 1, 2**63 - 2])),
    ),
    max_size=40,
)


def write_lines(script: list, directory, compiled: bool, in_place: bool = True) -> tuple[list[bytes], dict]:
    """The script's commands executed by a real Engine into a real EventLog; the lines
    written after router-started (its boot id made constant) and the events counted."""
    from router.core.commands import Completed, Log, Received, SubOutcome, SubOutcomes
    from router.eventlog import EventLog

    with on_path(compiled, "take_accepted"):
        # the compiled path writes into the buffer a router gives its log, or into a BytesIO
        log = EventLog(directory, "R", buffer=fastpath.log_buffer() if compiled and in_place else None)
        engine = Engine(RecordingCore(), log, max_message_size=1000)
        engine.now = 100.0
        n = 0
        for step in script:
            if step[0] == "tick":
                engine.now = engine.now + 0.25  # a new float object per loop iteration, as the loop gives
                continue
            if step[0] == "flush":
                log.flush()
                continue
            if step[0] == "seq":
                log._seq = step[1]
                continue
            n += 1
            if step[0] == "line":
                fields: dict = {"delivery": f"{n:04x}", "n": step[2], "owed": ["a/b"] * step[2], "x": step[3]}
                if step[1] == "link-attached":
                    fields = {"role": "publisher", "container": "c", "name": f"l{n}"}
                command = Log(step[1], fields)
            elif step[0] == "received":
                owed, forwarded = ["S/in"] * step[4], ["S/in"] * (step[4] // 2)
                values = [f"{n:04x}", "topic", "P", "P-out", step[3], "inc.1", n, 100, owed, forwarded, None]
                if step[5]:
                    values[10] = ["R1", "R2"]
                if step[1] not in (4, 8, 9):  # (the tag stays bytes; the lists' places take their own odd values)
                    values[step[1]] = step[2]
                elif step[1] != 4:
                    values[step[1]] = [step[2], "x"]
                command = Received(*values)
            elif step[0] == "completed":
                done = [f"{n:04x}", "S/in", True, step[3], True]
                if step[1] != 3 or step[3] is not None:  # (by None: no by or deleted in the line)
                    done[step[1]] = step[2]
                command = Completed(*done)
            elif step[0] == "sub-outcome":
                command = SubOutcome(f"{n:04x}", step[1], "accepted", step[2])
            elif step[0] == "sub-outcomes":
                command = SubOutcomes([f"{n:04x}.{i}" for i in range(step[2])], step[1], "accepted", True)
            else:
                command = Log("router-stopping", {})
            engine.execute([command])
        log.flush()
        lines = log.path.read_bytes().splitlines()[1:]
        boot = log.boot_id.encode()
        log.close()
        return [line.replace(boot, b"B") for line in lines], dict(engine.happenings)


@compiled_only
@settings(max_examples=100, deadline=None)
@given(script=writing, in_place=st.booleans())
def test_the_compiled_path_writes_the_event_log_lines_the_python_path_writes(script, in_place, tmp_path_factory):
    """Lines of every kind (with fields, without, counted by the adapter), runs of
    sub-outcome lines before and after them, new timestamps and flushes anywhere: the
    same bytes in the log, the same counts (the compiled path writing into a router's
    LogBuffer in place, or into a BytesIO)."""
    compiled = write_lines(script, tmp_path_factory.mktemp("c"), compiled=True, in_place=in_place)
    python = write_lines(script, tmp_path_factory.mktemp("p"), compiled=False)
    assert compiled == python


@compiled_only
def test_the_compiled_path_appends_the_usual_lines_itself(tmp_path, monkeypatch):
    """A line of a kind nobody counts, at a timestamp the log has seen, is appended without
    CORE_log; a counted kind and a new timestamp go through it."""
    python_logged: list = []
    python_method = Engine.CORE_log

    def counted(self, cmd):
        python_logged.append(cmd.kind)
        return python_method(self, cmd)

    monkeypatch.setattr(Engine, "CORE_log", counted)
    script = [("line", "received", 1, "x"), ("tick",), ("line", "received", 2, 1.5), ("line", "completed", 0, "é")]
    script += [("line", "link-attached", 0, None), ("sub-outcome", "s1", True), ("line", "completed", 1, "x")]
    script += [("received", 0, "plain", b"\x01\xfe", 2, True), ("received", 3, "\n", b"", 0, False)]
    script += [("completed", 2, False, "router"), ("completed", 0, "plain", None)]
    lines, happenings = write_lines(script, tmp_path, compiled=True)
    # each "received" Log is the first line at its timestamp (router-started's was another);
    # a Received is written by the compiled path too, where its values are its to encode
    # (the second's link name is a character to escape: orjson encodes those fields, the
    # compiled path still writes the line)
    assert python_logged == ["received", "received", "link-attached"]
    assert len(lines) == 10 and happenings
    assert b'"pub_tag":"01fe","incarnation":"inc.1"' in lines[6] and b'"link_name":"\\n"' in lines[7]
    assert lines[8].endswith(b'"settled":false,"pub_outcome":"accepted","by":"router","deleted":true}')
    assert lines[9].endswith(b'"subscriber":"S/in","outcome":"accepted","settled":true,"pub_outcome":"accepted"}')
