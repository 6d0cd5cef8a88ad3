"""The core's compiled twins (router/core/_admission.c: a publisher's message;
router/core/_answers.c: subscribers' accepted answers) against the Python methods they
mirror (admission.py's _on_message and router.py's accepted_batch: the specification).

Two cores hear the same events: one through the compiled twins, the other through the
Python methods. Hypothesis interleaves publishing (four publishers: settling first or
second; an exactly-once topic, one whose subscriber settles second and an at-least-once
one; messages small or large, some with a time to live, some under a tag used before),
credit, runs of accepted answers (settled or not, repeated, unknown tags and links,
several subscribers mixed), other outcomes, the publisher settling, a durable
subscriber detaching and coming back, time and a shutdown. After every step both cores
must have given the same commands (each log line's fields in the same order: the event
log's bytes) and hold the same state: records, topics' counts, the settled memory,
timers, credit.
"""

from __future__ import annotations

from types import MappingProxyType

import pytest
from corekit import encode as encode_message
from corekit import record_states
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from router.core import compiled, outcomes
from router.core.commands import Completed, Log, Received
from router.core.events import (
    DURABLE_UNSETTLED_STATE,
    PUBLISHER,
    RCV_FIRST,
    RCV_SECOND,
    SND_MIXED,
    SUBSCRIBER,
    CreditChanged,
    LinkAttached,
    LinkDetached,
    MessageReceived,
    OutcomeReceived,
    PublisherSettled,
    ShutdownRequested,
    TimerFired,
)
from router.core.guarantees import AT_LEAST_ONCE, GuaranteeRule
from router.core.records import DeliveryRecord, SubscriberState
from router.core.router import RouterCore
from router.core.settings import CoreSettings

pytestmark = pytest.mark.skipif(compiled.accepted_batch is None, reason=f"compiled core: {compiled.status}")

SECOND_PUB = 2  # rcv-settle-mode second (the publisher settles after its outcome); the others first
PUBLISHERS = {1: "t", SECOND_PUB: "t", 3: "alo", 4: "t2"}
ROLES = ("plain", "plain2", "durable", "second", "alo")
# "t": three subscribers settling first (the compiled twin's usual case), one durable;
# "t2": one that settles second (its copies stay unsettled: the Python path's case).
TOPIC_OF = {"plain": "t", "plain2": "t", "durable": "t", "second": "t2", "alo": "alo"}


def encode(body, **fields) -> bytes:
    """An encoded message as the adapter hands it to the core: bytes (a bytearray takes
    admission.py's path)."""
    return bytes(encode_message(body, **fields))


def commands_as_written(commands: list) -> list:
    """The commands, a log line's fields as the ordered pairs the event log writes."""
    return [(c.kind, list(c.fields.items())) if isinstance(c, (Log, Received, Completed)) else c for c in commands]


_UNSET = "<unset>"


def record_slots(record: DeliveryRecord) -> dict:
    """Every slot of a record, as comparable values (the compiled admission makes
    records without DeliveryRecord.__init__: each slot must come out as __init__ sets
    it, unset optional ones included). Objects shared with the rest of the core (its
    roster, its stream's memory) are named by what identifies them."""
    values = {}
    for name in DeliveryRecord.__slots__:
        value = getattr(record, name, _UNSET)
        if name == "roster" and value is not None:
            value = ("roster", list(value.keys))
        elif name == "memory" and value is not None:
            value = ("memory", value.sweep, value.partial)
        elif name == "_states" and value is not None:
            value = {key: tuple(getattr(state, n) for n in SubscriberState.__slots__) for key, state in value.items()}
        elif isinstance(value, bytearray):
            value = ("bytearray", bytes(value))
        elif isinstance(value, (dict, MappingProxyType)):
            value = (type(value).__name__, sorted(value.items()))
        elif isinstance(value, (set, frozenset)):
            value = (type(value).__name__, sorted(value))
        values[name] = value
    return values


def core_state(core: RouterCore) -> tuple:
    """What the answers' path reads or writes, and what it could disturb."""
    records = {tag: record_slots(r) for tag, r in core.records.items()}
    topics = {
        name: (t.unsettled, t.outstanding_credit, t.bytes, t.est, list(t.records), t.published, t.roster is None)
        for name, t in core.topics.items()
    }
    memory = {stream: (dict(m.current), dict(m.previous), m.sweep, m.partial) for stream, m in core.settled.streams.items()}
    return (
        records,
        record_states(core),
        topics,
        memory,
        sorted(core.by_delivery),
        core._sweep_at,
        sorted((deadline, kind) for deadline, _, kind, _ in core._timers),
        {link: (p.credit, p.next_seq) for link, p in core.publishers.items()},
        core._promised,
        core.bytes_held,
        core.draining,
        core._shutdown_done,
        list(core._starved),
    )


class CompiledAgainstPython(RuleBasedStateMachine):
    def __init__(self):
        super().__init__()
        core_settings = CoreSettings(
            router_id="A",
            max_in_flight_per_topic=12,
            publisher_credit_window=6,
            record_linger=1.0,
            resume_horizon=40.0,  # sweeps of the settled memory every 10 s: time_passes sees them
            guarantees=(GuaranteeRule(("alo",), AT_LEAST_ONCE),),
        )
        self.compiled = RouterCore(core_settings, boot_id="b00t", epoch=1)
        self.python = RouterCore(core_settings, boot_id="b00t", epoch=1)
        compiled.uninstall(self.python)  # admission.py's _on_message and router.py's accepted_batch
        assert "accepted_batch" in vars(self.compiled) and "accepted_batch" not in vars(self.python)
        self.now = 1000.0
        self.delivery = 0
        self.links: dict[str, int | None] = {}
        self.next_link = 10
        self.sent: dict[str, list[bytes]] = {role: [] for role in ROLES}  # tags each subscriber was sent
        self.open: dict[int, int] = {}  # delivery -> its publisher's link, while our side holds it unsettled
        self.tags: dict[int, int] = {p: 0 for p in PUBLISHERS}
        for link, topic in PUBLISHERS.items():
            self._both(
                LinkAttached(
                    link,
                    link,
                    "pub",
                    f"p{link}",
                    PUBLISHER,
                    topic,
                    snd_settle_mode=SND_MIXED,
                    rcv_settle_mode=RCV_FIRST if link != SECOND_PUB else RCV_SECOND,
                )
            )
        for role in ROLES:
            self._attach(role)
            self._both(CreditChanged(self.links[role], 6, False))
        self.answered: dict[str, set[bytes]] = {role: set() for role in ROLES}

    # ------------------------------------------------------------ plumbing

    def _record(self, commands: list) -> None:
        for c in commands:
            name = type(c).__name__
            if name == "Forward" and not c.settled:
                role = next((r for r, link in self.links.items() if link == c.link_id), None)
                if role is not None:
                    self.sent[role].append(c.tag)
            elif name == "SendOutcome" and c.settle and c.delivery in self.open:
                del self.open[c.delivery]

    def _compare(self, a: list, b: list) -> None:
        assert commands_as_written(a) == commands_as_written(b), "the compiled answers decided otherwise"
        assert core_state(self.compiled) == core_state(self.python)

    def _both(self, event) -> None:
        a = self.compiled.handle(event, self.now)
        b = self.python.handle(event, self.now)
        self._compare(a, b)
        self._record(a)

    def _both_batch(self, items: list) -> None:
        """One adapter batch of accepted answers, to both cores."""
        a: list = []
        b: list = []
        self.compiled.accepted_batch(list(items), self.now, a)
        self.python.accepted_batch(list(items), self.now, b)
        self._compare(a, b)
        self._record(a)

    def _attach(self, role: str) -> None:
        link = self.next_link
        self.next_link += 1
        self.links[role] = link
        self._both(
            LinkAttached(
                link,
                link,
                "sub",
                role,
                SUBSCRIBER,
                TOPIC_OF[role],
                durable=DURABLE_UNSETTLED_STATE if role == "durable" else 0,
                timeout=1000 if role == "durable" else 0,
                snd_settle_mode=SND_MIXED,
                rcv_settle_mode=RCV_SECOND if role == "second" else RCV_FIRST,
            )
        )

    # ------------------------------------------------------------ rules

    @rule(
        publisher=st.sampled_from([1, 1, 1, 2, 3, 4]),
        count=st.integers(1, 4),
        reuse=st.sampled_from([False, False, False, True]),
        # a string (an amqp-value), bytes (a data section: the shape the compiled twin splices
        # itself) small or large (held bytes counted, UNCOUNTED_BELOW)
        body=st.sampled_from(["m", b"m", b"m", b"x" * 5000]),
        ttl=st.sampled_from([None, None, None, 0.5, 5.0]),
    )
    def publish(self, publisher, count, reuse, body, ttl):
        """A few messages; sometimes the first under a tag the publisher used before
        (settled or not: the core refuses a tag still unsettled)."""
        for n in range(count):
            if reuse and n == 0 and self.tags[publisher]:
                tag = b"p%d-%d" % (publisher, self.tags[publisher] - 1)
            else:
                tag = b"p%d-%d" % (publisher, self.tags[publisher])
                self.tags[publisher] += 1
            self.delivery += 1
            self.open[self.delivery] = publisher
            fields = {"inferred": True} if isinstance(body, bytes) else {}
            if ttl is not None:
                fields["ttl"] = ttl
            payload = encode(body, **fields)
            self._both(MessageReceived(publisher, self.delivery, tag, payload, False))

    @rule(role=st.sampled_from(ROLES), credit=st.integers(1, 8))
    def grant(self, role, credit):
        link = self.links.get(role)
        if link is not None:
            self._both(CreditChanged(link, credit, False))

    @rule(
        picks=st.lists(
            st.tuples(st.sampled_from(ROLES), st.integers(0, 40), st.booleans(), st.integers(0, 9)), min_size=1, max_size=12
        )
    )
    def accepted_run(self, picks):
        """One adapter batch: accepted answers from several subscribers, mostly for copies
        they hold (settled or not), some repeated, some for a tag or link nobody knows."""
        items: list = []
        for role, index, settled, odd in picks:
            link = self.links.get(role)
            sent = self.sent[role]
            if odd == 0:
                items += (link if link is not None else 999, b"nobody's", settled)
            elif odd == 1:
                items += (998, sent[index % len(sent)] if sent else b"x", settled)
            elif link is not None and sent:
                items += (link, sent[index % len(sent)], settled if role != "second" else False)
        self._both_batch(items)

    @rule(roles=st.permutations(ROLES), n=st.integers(1, 6), settled=st.sampled_from([True] * 5 + [False]))
    def accept_pending(self, roles, n, settled):
        """One adapter batch of each subscriber's oldest unanswered copies, accepted (and
        usually settled): deliveries complete, most through the compiled twin."""
        items: list = []
        for role in roles:
            link = self.links.get(role)
            if link is None:
                continue
            pending = [tag for tag in self.sent[role] if tag not in self.answered[role]][:n]
            self.answered[role].update(pending)
            for tag in pending:
                items += (link, tag, settled and role != "second")
        self._both_batch(items)
        for role in roles:  # a client's window: credit again for what it answered
            link = self.links.get(role)
            if link is not None:
                self._both(CreditChanged(link, 6, False))

    @rule(role=st.sampled_from(ROLES), index=st.integers(0, 40), code=st.sampled_from([outcomes.RELEASED, outcomes.REJECTED]))
    def other_outcome(self, role, index, code):
        link = self.links.get(role)
        sent = self.sent[role]
        if link is not None and sent:
            self._both(OutcomeReceived(link, sent[index % len(sent)], code, True))

    @rule(role=st.sampled_from(ROLES), index=st.integers(0, 40))
    def subscriber_settles(self, role, index):
        """A rcv-settle-mode=second subscriber settles after the router did (or anyone, late)."""
        link = self.links.get(role)
        sent = self.sent[role]
        if link is not None and sent:
            self._both(OutcomeReceived(link, sent[index % len(sent)], outcomes.ACCEPTED, True))

    @precondition(lambda self: self.open)
    @rule(pick=st.integers(0, 40))
    def publisher_settles(self, pick):
        """After its outcome (rcv-settle-mode second), or before it (it gave up)."""
        delivery = sorted(self.open)[pick % len(self.open)]
        link = self.open.pop(delivery)
        self._both(PublisherSettled(link, delivery))

    @precondition(lambda self: self.links.get("durable") is not None)
    @rule()
    def durable_detaches(self):
        link = self.links["durable"]
        self.links["durable"] = None
        self._both(LinkDetached(link, False))

    @precondition(lambda self: self.links.get("durable") is None)
    @rule()
    def durable_reattaches(self):
        self.sent["durable"] = []
        self.answered["durable"] = set()
        self._attach("durable")

    @rule(seconds=st.sampled_from([0.1, 0.6, 1.5, 30.0]))
    def time_passes(self, seconds):
        self.now += seconds
        self._both(TimerFired())

    @precondition(lambda self: not self.compiled.draining)
    @rule(now=st.integers(0, 9))
    def shutdown(self, now):
        """Rarely (a draining router refuses every message: the rest of the history)."""
        if now == 0:
            self._both(ShutdownRequested(5.0))

    @invariant()
    def same_state(self):
        assert core_state(self.compiled) == core_state(self.python)


CompiledAgainstPython.TestCase.settings = settings(max_examples=120, stateful_step_count=40, deadline=None)
TestCompiledAgainstPython = CompiledAgainstPython.TestCase


def twin_cores(settings: CoreSettings):
    """A core with the compiled twins and one without, and ``both(event, now)``: the event
    to each, the same commands required; it returns the first core's."""
    core = RouterCore(settings, boot_id="b00t", epoch=1)
    python = RouterCore(settings, boot_id="b00t", epoch=1)
    compiled.uninstall(python)

    def both(event, now):
        a = core.handle(event, now)
        assert commands_as_written(a) == commands_as_written(python.handle(event, now))
        return a

    return core, python, both


def test_the_usual_last_answer_is_taken_by_the_compiled_twin():
    """The case it exists for (a publisher settling first, every subscriber accepting and
    settling its copy) is done without the Python method: with that method made to fail,
    deliveries still complete, as the Python loop completes them; and again after the
    settled memory's sweeps have moved on (the stream's memory is stamped with the sweep)."""
    core, python, both = twin_cores(CoreSettings(router_id="A"))
    both(LinkAttached(1, 1, "pub", "p", PUBLISHER, "t", snd_settle_mode=SND_MIXED, rcv_settle_mode=RCV_FIRST), 1.0)
    for link in (10, 11):
        both(LinkAttached(link, link, "sub", f"s{link}", SUBSCRIBER, "t", rcv_settle_mode=RCV_FIRST), 1.0)
        both(CreditChanged(link, 100, False), 1.0)

    def refuse(*args):
        raise AssertionError("the usual answer went to the Python method")

    core._on_accepted_compact = refuse  # type: ignore[method-assign]
    now = 1.0
    for round_ in range(3):
        tags = []
        for i in range(3):
            delivery = round_ * 3 + i + 1
            a = both(MessageReceived(1, delivery, b"%d" % delivery, encode("m"), False), now)
            tags.append(next(c.tag for c in a if type(c).__name__ == "Forward"))
        items = [x for tag in tags for x in (10, tag, True)] + [x for tag in tags for x in (11, tag, True)]
        a: list = []
        b: list = []
        core.accepted_batch(list(items), now, a)
        python.accepted_batch(list(items), now, b)
        assert commands_as_written(a) == commands_as_written(b)
        assert [c.kind for c in a if isinstance(c, (Log, Completed))] == ["completed"] * 3
        assert core_state(core) == core_state(python)
        assert not core.records and len(core.settled.streams) == 1
        now += core.settled.sweep_interval() + 1  # a sweep of the settled memory
        both(TimerFired(), now)
    assert core.settled.sweeps >= 2
    assert next(iter(core.settled.streams.values())).sweep == core.settled.sweeps - 1


def test_a_completing_answer_that_fails_midway_still_leaves_its_line():
    """The accepted answers' caller executes what ``out`` holds when the core raises
    (RouterCore.accepted_batch). A failure while the last answer's delivery is being
    settled (here: arming the settled memory's sweep) leaves, in both twins, the
    "completed" line in its place (without the settlement it did not finish) and the
    publisher's outcome after it, and raises the same error."""
    core, python, both = twin_cores(CoreSettings(router_id="A"))
    both(LinkAttached(1, 1, "pub", "p", PUBLISHER, "t", snd_settle_mode=SND_MIXED, rcv_settle_mode=RCV_FIRST), 1.0)
    both(LinkAttached(10, 10, "sub", "s10", SUBSCRIBER, "t", rcv_settle_mode=RCV_FIRST), 1.0)
    both(CreditChanged(10, 100, False), 1.0)
    a = both(MessageReceived(1, 1, b"1", encode("m"), False), 1.0)
    tag = next(c.tag for c in a if type(c).__name__ == "Forward")

    def broken(now):
        raise RuntimeError("the sweep could not be armed")

    outs: list = []
    for twin in (core, python):
        twin._arm_sweep = broken  # type: ignore[method-assign]
        out: list = []
        with pytest.raises(RuntimeError, match="could not be armed"):
            twin.accepted_batch([10, tag, True], 1.0, out)
        outs.append(commands_as_written(out))
    assert outs[0] == outs[1]
    assert outs[0][0] == ("completed", list(Completed(tag.hex(), "sub/s10", True, None, False).fields.items()))
    assert type(outs[0][1]).__name__ == "SendOutcome" and len(outs[0]) == 2


def test_a_credit_check_that_grants_nothing_stays_compiled():
    """The credit check after a delivery completes (room in the topic's bound, so a grant
    may be due) grants nothing while every publisher holds more than half its window: the
    twin knows that without credit.py's _refill_credit (made to fail here). Once the
    publisher has used half its window, or other topics wait for the router's room, the
    Python method decides, as it does for the Python core: the same grants, the same state."""
    core, python, both = twin_cores(CoreSettings(router_id="A", max_in_flight_per_topic=100, publisher_credit_window=10))
    both(LinkAttached(1, 1, "pub", "p", PUBLISHER, "t", snd_settle_mode=SND_MIXED, rcv_settle_mode=RCV_FIRST), 1.0)
    both(LinkAttached(10, 10, "sub", "s10", SUBSCRIBER, "t", rcv_settle_mode=RCV_FIRST), 1.0)
    both(CreditChanged(10, 100, False), 1.0)
    checks: list = []
    refill = core._refill_credit

    def counted(*args):
        checks.append(args[0].name)
        return refill(*args)

    core._refill_credit = counted  # type: ignore[method-assign]
    grants = []
    for delivery in range(1, 13):
        a = both(MessageReceived(1, delivery, b"%d" % delivery, encode(b"m", inferred=True), False), 2.0)
        tag = next(c.tag for c in a if type(c).__name__ == "Forward")
        if delivery == 3:
            core._starved["elsewhere"] = None  # another topic waits for the router's room
            python._starved["elsewhere"] = None
        if delivery == 4:
            core._starved.clear()
            python._starved.clear()
        before, credit = len(checks), core.publishers[1].credit
        a, b = [], []
        core.accepted_batch([10, tag, True], 2.0, a)
        python.accepted_batch([10, tag, True], 2.0, b)
        assert commands_as_written(a) == commands_as_written(b)
        assert core_state(core) == core_state(python)
        assert core._starved == python._starved
        grants += [c.credit for c in a if type(c).__name__ == "GrantCredit"]
        # Python decides only while others wait, or when this publisher wants credit.
        assert (len(checks) > before) == (delivery == 3 or (10 - credit) * 2 >= 10), (delivery, credit)
    assert grants, "the publisher's window was topped up again"


def _one_delivery_two_subscribers(python: bool, rcv_second_publisher: bool = False) -> tuple[RouterCore, bytes]:
    core = RouterCore(CoreSettings(router_id="A"), boot_id="b00t", epoch=1)
    if python:
        compiled.uninstall(core)
    mode = RCV_SECOND if rcv_second_publisher else RCV_FIRST
    core.handle(LinkAttached(1, 1, "pub", "p", PUBLISHER, "t", snd_settle_mode=SND_MIXED, rcv_settle_mode=mode), 1.0)
    for link in (10, 11):
        core.handle(LinkAttached(link, link, "sub", f"s{link}", SUBSCRIBER, "t", rcv_settle_mode=RCV_FIRST), 1.0)
        core.handle(CreditChanged(link, 10, False), 1.0)
    commands = core.handle(MessageReceived(1, 1, b"0", encode("m"), False), 1.0)
    return core, next(c.tag for c in commands if type(c).__name__ == "Forward")


def _watched(core: RouterCore, tag: bytes) -> None:
    core.records[tag].watchers = {"B"}  # a router asked "settled?" (remote_outcomes.py)


def _reused(core: RouterCore, tag: bytes) -> None:
    core.records[tag].reuse = 1  # a tag used again after its first delivery was forgotten here


def _first_answer_unsettled(core: RouterCore, tag: bytes) -> None:
    core.accepted_batch([10, tag, False], 1.5, [])  # the other copy accepted, not settled: a settlement to relay


def _no_memory(core: RouterCore, tag: bytes) -> None:
    core.records[tag].memory = None  # (an at-least-once record has none)


def _no_publisher(core: RouterCore, tag: bytes) -> None:
    core.publishers.pop(1)


@pytest.mark.parametrize(
    "setup, rcv_second",
    [
        (_watched, False),
        (_reused, False),
        (_first_answer_unsettled, False),
        (_no_memory, False),
        (_no_publisher, False),
        (None, True),  # the publisher settles second: it hears the outcome, unsettled
    ],
    ids=["watchers", "reused-tag", "a-copy-not-settled", "no-settled-memory", "publisher-gone", "publisher-settles-second"],
)
def test_what_the_compiled_twin_leaves_to_python_ends_as_python_ends_it(setup, rcv_second):
    """Each way a last answer leaves the usual case, made by hand on one delivery owed to
    two subscribers: the compiled core hands it to the Python method before changing
    anything, and both cores give the same commands and keep the same state."""
    cores = [_one_delivery_two_subscribers(python, rcv_second) for python in (False, True)]
    results = []
    deferred = []
    compiled_core = cores[0][0]
    python_method = compiled_core._on_accepted_compact
    compiled_core._on_accepted_compact = lambda *args: deferred.append(args) or python_method(*args)  # type: ignore[method-assign]
    for core, tag in cores:
        if setup is not None:
            setup(core, tag)
        items = ([10, tag, True] if setup is not _first_answer_unsettled else []) + [11, tag, True]
        out: list = []
        core.accepted_batch(items, 2.0, out)
        results.append((commands_as_written(out), core_state(core)))
    assert results[0] == results[1]
    assert any(isinstance(c, tuple) and c[0] == "completed" for c in results[0][0])
    assert deferred, "the compiled twin completed it itself"


def test_the_usual_message_is_taken_by_the_compiled_twin():
    """A new delivery owed to this router's subscribers only is admitted without
    admission.py's _on_message (made to fail here), as that method admits it: the same
    commands (its copies, its "received" line) and the same state; one with a time to
    live (a timer) and one large enough that its bytes are counted, too."""
    core = RouterCore(CoreSettings(router_id="A"), boot_id="b00t", epoch=1)
    python = RouterCore(CoreSettings(router_id="A"), boot_id="b00t", epoch=1)
    compiled.uninstall(python)
    for c in (core, python):
        c.handle(LinkAttached(1, 1, "pub", "p", PUBLISHER, "t", snd_settle_mode=SND_MIXED, rcv_settle_mode=RCV_FIRST), 1.0)
        for link in (10, 11):
            c.handle(LinkAttached(link, link, "sub", f"s{link}", SUBSCRIBER, "t", rcv_settle_mode=RCV_FIRST), 1.0)
        c.handle(CreditChanged(10, 2, False), 1.0)  # 11 has none: its copies wait in its queue
    # (the first message finds the network's interest not yet known: admission.py's)
    first = MessageReceived(1, 1, b"first", encode("m"), False)
    assert commands_as_written(core.handle(first, 1.0)) == commands_as_written(python.handle(first, 1.0))

    def refuse(*args):
        raise AssertionError("the usual message went to admission.py")

    core._on_message = refuse  # type: ignore[method-assign]
    payloads = [
        encode("m"),  # an amqp-value: prepared by admission.py's _prepare_payload
        encode("m", ttl=5.0),
        encode("x" * 5000),
        encode(b"data", inferred=True),  # a data section: spliced by the twin itself (below)
        encode(b"d" * 300, inferred=True, durable=True),  # a header to read: _prepare_payload's
        encode(b"data", inferred=True) + b"\x00\x53",  # damaged after its data section: refused there
    ]
    prepared_in_python: list = []
    prepare = core._prepare_payload
    core._prepare_payload = lambda *args: prepared_in_python.append(args[1].delivery) or prepare(*args)  # type: ignore[method-assign]
    for delivery, payload in enumerate(payloads, start=2):
        event = MessageReceived(1, delivery, b"%d" % delivery, payload, False)
        a = core.handle(event, 2.0)
        assert commands_as_written(a) == commands_as_written(python.handle(event, 2.0))
        assert [type(c).__name__ for c in a].count("Forward") == (1 if delivery == 2 else 0)
        assert core_state(core) == core_state(python)
    assert prepared_in_python == [2, 3, 4, 6, 7]
    assert [c for c in a if type(c).__name__ == "SendOutcome"][0].outcome == outcomes.REJECTED
    assert core.bytes_held == python.bytes_held > 0
    assert len(core.subscribers[11].queue) == 6  # (the damaged one is not queued)
