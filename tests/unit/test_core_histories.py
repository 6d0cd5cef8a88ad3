"""Random histories through one core: no loss, no duplicate, publisher order.

Two publishers and three subscriptions on one topic (a plain one, a durable one
that detaches and re-attaches, and one with rcv-settle-mode=second). Hypothesis
interleaves publishing, credit, answers, settlement, detaches and time; the
invariants are checked after every step and a final drain must leave no record.
Every step also runs on a twin core whose records are expanded to SubscriberStates
(corekit.TwinHarness): the compact records' path must decide exactly as the general
one.
"""

from __future__ import annotations

from corekit import TwinHarness, encode
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from router.core import outcomes
from router.core.commands import Forward, SendOutcome, SettleOutgoing
from router.core.events import DURABLE_UNSETTLED_STATE, MessageReceived

PUBLISHERS = (1, 2)
PLAIN, DURABLE, SECOND = "plain", "durable", "second"


class CoreHistory(RuleBasedStateMachine):
    def __init__(self):
        super().__init__()
        self.h = TwinHarness(max_in_flight_per_topic=8, publisher_credit_window=4, record_linger=1.0)
        self.next_link = 10
        self.links: dict[str, int | None] = {}
        self.credit = {p: 0 for p in PUBLISHERS}
        self.received = {role: [] for role in (PLAIN, DURABLE, SECOND)}  # (link, tag) in arrival order
        self.unanswered = {role: [] for role in (PLAIN, DURABLE, SECOND)}  # forwarded tags awaiting an answer
        self.answers = {}  # (tag, role) -> outcome code
        self.outcome_of = {}  # delivery -> code
        self.unsettled_outcomes = []  # deliveries answered, publisher not yet settled
        for link in PUBLISHERS:
            self._run(self.h.attach_publisher(link))
        for role in (PLAIN, DURABLE, SECOND):
            self._attach(role)
        self.sent_tags = {p: 0 for p in PUBLISHERS}
        self.delivery_of = {}  # delivery -> (publisher, seq)
        self.owed = {}  # delivery -> set of roles owed at publish time
        self.ended = set()  # (delivery, role): the role stopped being owed
        self.tag_delivery = {}

    # --------------------------------------------------------------- plumbing

    def _attach(self, role):
        link = self.next_link
        self.next_link += 1
        self.links[role] = link
        if role == DURABLE:
            self._run(self.h.attach_subscriber(link, name=role, durable=DURABLE_UNSETTLED_STATE, timeout=1000))
        else:
            self._run(self.h.attach_subscriber(link, name=role, rcv_second=role == SECOND))

    def _role_of(self, link):
        for role, current in self.links.items():
            if current == link:
                return role
        raise AssertionError(f"forward on a link that is not attached: {link}")

    def _run(self, commands):
        for command in commands:
            if isinstance(command, Forward):
                role = self._role_of(command.link_id)
                assert (command.link_id, command.tag) not in self.received[role], "duplicate on one link"
                assert (command.tag, role) not in self.answers or self.answers[(command.tag, role)] is None, (
                    "resent after a terminal answer"
                )
                self.received[role].append((command.link_id, command.tag))
                self.unanswered[role].append(command.tag)
            elif isinstance(command, SendOutcome):
                assert command.delivery not in self.outcome_of, "two outcomes for one delivery"
                self.outcome_of[command.delivery] = command.outcome
                if not command.settle:
                    self.unsettled_outcomes.append(command.delivery)
            elif isinstance(command, SettleOutgoing):
                assert command.link_id in self.links.values()
            elif hasattr(command, "credit") and command.link_id in PUBLISHERS:
                self.credit[command.link_id] += command.credit

    # ------------------------------------------------------------------ rules

    @rule(publisher=st.sampled_from(PUBLISHERS))
    def publish(self, publisher):
        if self.credit[publisher] <= 0:
            return
        self.credit[publisher] -= 1
        self.sent_tags[publisher] += 1
        pub_tag = str(self.sent_tags[publisher]).encode()
        self.h._delivery += 1
        delivery = self.h._delivery
        self.delivery_of[delivery] = (publisher, self.sent_tags[publisher])
        owed = {role for role, link in self.links.items() if link is not None or role == DURABLE}
        self.owed[delivery] = owed
        commands = self.h.do(MessageReceived(publisher, delivery, pub_tag, encode("m"), False))
        record_tag = next((r for r, rec in self.h.core.records.items() if rec.pub_delivery == delivery), None)
        if record_tag is not None:
            self.tag_delivery[record_tag] = delivery
        self._run(commands)

    @rule(role=st.sampled_from((PLAIN, DURABLE, SECOND)), credit=st.integers(0, 5))
    def grant(self, role, credit):
        link = self.links[role]
        if link is not None:
            self._run(self.h.credit(link, credit))

    @rule(
        role=st.sampled_from((PLAIN, DURABLE, SECOND)),
        code=st.sampled_from([outcomes.ACCEPTED] * 6 + [outcomes.RELEASED, outcomes.REJECTED, outcomes.MODIFIED]),
        pick=st.integers(0, 3),
    )
    def answer(self, role, code, pick):
        link = self.links[role]
        pending = self.unanswered[role]
        if link is None or not pending:
            return
        tag = pending.pop(min(pick, len(pending) - 1))
        self.answers[(tag, role)] = code
        self._run(self.h.answer(link, tag, code, settled=role != SECOND))

    @rule(role=st.sampled_from((PLAIN, DURABLE, SECOND)), n=st.integers(1, 4), repeat=st.booleans())
    def accepts_in_one_go(self, role, n, repeat):
        """The adapter's batch of accepted dispositions (RouterCore.accepted_batch),
        oldest first; ``repeat``: the last one comes twice (a repeated frame)."""
        link = self.links[role]
        pending = self.unanswered[role]
        if link is None or not pending:
            return
        taken, self.unanswered[role] = pending[:n], pending[n:]
        if repeat:
            taken.append(taken[-1])
        items = []
        for tag in taken:
            self.answers[(tag, role)] = outcomes.ACCEPTED
            items += [link, tag, role != SECOND]
        self._run(self.h.accepted_batch(items))

    @rule(pick=st.integers(0, 3))
    def publisher_settles(self, pick):
        if not self.unsettled_outcomes:
            return
        delivery = self.unsettled_outcomes.pop(min(pick, len(self.unsettled_outcomes) - 1))
        publisher, _ = self.delivery_of[delivery]
        self._run(self.h.settle(publisher, delivery))

    @precondition(lambda self: self.links[DURABLE] is not None)
    @rule()
    def durable_detaches(self):
        self._run(self.h.detach(self.links[DURABLE]))
        self.links[DURABLE] = None
        self.unanswered[DURABLE] = []

    @precondition(lambda self: self.links[DURABLE] is None)
    @rule()
    def durable_reattaches(self):
        self._attach(DURABLE)

    @rule(seconds=st.sampled_from([0.1, 0.5, 2.0]))
    def time_passes(self, seconds):
        self._run(self.h.advance(seconds))

    # ------------------------------------------------------------- invariants

    @invariant()
    def accepted_means_every_owed_subscriber_accepted(self):
        for delivery, code in self.outcome_of.items():
            if code != outcomes.ACCEPTED or delivery not in self.owed:
                continue
            tag = next(t for t, d in self.tag_delivery.items() if d == delivery)
            for role in self.owed[delivery]:
                assert self.answers.get((tag, role)) == outcomes.ACCEPTED, (delivery, role)

    @invariant()
    def publisher_order_per_subscriber_link(self):
        for role, arrivals in self.received.items():
            by_link = {}
            for link, tag in arrivals:
                delivery = self.tag_delivery.get(tag)
                if delivery is None:
                    continue
                publisher, seq = self.delivery_of[delivery]
                last = by_link.get((link, publisher), 0)
                assert seq > last, f"{role} got {publisher}#{seq} after #{last} on link {link}"
                by_link[(link, publisher)] = seq

    def teardown(self):
        # Drain: everyone re-attached with credit answers everything; the publishers
        # settle; time passes. Every delivery is answered and no record remains.
        if self.links[DURABLE] is None:
            self._attach(DURABLE)
        for _ in range(50):
            progressed = False
            for role, link in self.links.items():
                self._run(self.h.credit(link, 100))
                while self.unanswered[role]:
                    tag = self.unanswered[role].pop(0)
                    self.answers[(tag, role)] = outcomes.ACCEPTED
                    self._run(self.h.answer(link, tag, outcomes.ACCEPTED, settled=role != SECOND))
                    progressed = True
            while self.unsettled_outcomes:
                delivery = self.unsettled_outcomes.pop()
                self._run(self.h.settle(self.delivery_of[delivery][0], delivery))
                progressed = True
            if not progressed:
                break
        self._run(self.h.advance(5.0))
        assert set(self.outcome_of) == set(self.delivery_of), "a delivery never got its outcome"
        assert self.h.core.record_count() == 0, self.h.core.records


CoreHistory.TestCase.settings = settings(max_examples=150, stateful_step_count=40, deadline=None)
test_core_histories = CoreHistory.TestCase
