"""Delivery records: what a router knows about one publisher delivery.

One record per unsettled publisher delivery (and for a short while after its
settlement, so a resuming receiver's unsettled state can still be matched). The
fields are the design's list: the message, the publisher's identity
(container-id + link name), the publisher's tag, the outgoing disambiguated tag,
each local subscriber's state and each interested remote router's state.
"""

from __future__ import annotations

from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from router.core.msgfields import JMS_NAMES
from router.core.outcomes import OUTCOME_ACCEPTED, Outcome

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Mapping

    from router.core.links import Subscription
    from router.core.settled import StreamSettled

# Shared, read-only stand-ins for a record's maps and set while they are empty: most
# records (one router, no failover) never put anything in them, and four fresh
# containers per message cost allocations and ~450 bytes per record in flight. A
# write goes through the own_*() methods, which give the record its own container
# first; a write that bypasses them fails loudly (TypeError/AttributeError).
# (Typed as the containers they stand in for: read like one, never written.)
EMPTY_MAP: Any = MappingProxyType({})
EMPTY_SET: Any = frozenset()


class SubscriberState:
    """Where one owed subscriber stands with one delivery.

    ``outcome`` None means in doubt. ``sent`` is the subscription's send counter
    when the delivery went out on its current link (0: not sent, or to be resent
    after a re-attach). ``known_settled`` becomes True once the subscriber must
    know the delivery is settled: it settled it itself, or it answered something
    we sent after our settlement (the design's inference rule)."""

    __slots__ = ("outcome", "sent", "link", "remote_settled", "settle_relayed", "known_settled", "resend")

    def __init__(self) -> None:
        self.outcome: Outcome | None = None
        self.sent = 0
        self.link = 0  # the link it was sent on (a re-attach makes a new one)
        self.remote_settled = False
        self.settle_relayed = False
        self.known_settled = False
        self.resend = False  # a resumed receiver reported it: send it again whatever its outcome


# A compact record's answers (DeliveryRecord.answers): one byte per owed subscriber,
# in the order of its Roster. In doubt and sent at ``sent_at`` is 0.
ANSWER_ACCEPTED = 1  # it accepted
ANSWER_SETTLED = 2  # it settled its copy (remote_settled)
ANSWER_UNSENT = 4  # not sent yet: queued for credit, or its durable subscription is detached
ANSWER_DONE = ANSWER_ACCEPTED | ANSWER_SETTLED


class Roster:
    """A topic's owed subscriptions as one immutable snapshot: the subscriptions
    (best-effort ones are never owed), their keys, the link each is attached on (0:
    detached) and each key's position. Compact records share the roster they were
    distributed with, so a record holds no per-subscriber object or map entry.
    A topic builds a new one whenever a subscription comes, goes, or changes link."""

    __slots__ = (
        "subs",
        "keys",
        "links",
        "index",
        "all_done",
        "selective",
        "selections",
        "headers",
        "names",
        "tests",
        "test_of",
        "values_test",
    )

    def __init__(self, subs: Iterable[Subscription]) -> None:
        self.subs = tuple(subs)
        # Some subscription has a selector (docs/selectors.md): a message is owed to the
        # subscriptions that select it, a smaller roster made once per selection.
        self.selective = any(sub.selector is not None for sub in self.subs)
        self.headers = any(sub.selector is not None and sub.selector.names & JMS_NAMES for sub in self.subs)
        # What selection.py needs per message, worked out once here: the application
        # properties the selectors read (only those are decoded), each distinct
        # selector's test once (evaluated once per message), and which test each
        # subscription takes (-1: it has no selector).
        names: set[str] = set()
        tests: dict[str, int] = {}
        test_of = []
        self.tests: list[Callable[[Mapping[str, Any]], bool]] = []
        sole = None  # the selector, when there is one (or the same one for all)
        for sub in self.subs:
            if sub.selector is None:
                test_of.append(-1)
                continue
            names |= sub.selector.names
            if sub.selector.text not in tests:
                tests[sub.selector.text] = len(self.tests)
                self.tests.append(sub.selector.selects)
                sole = sub.selector
            test_of.append(tests[sub.selector.text])
        self.names = tuple(sorted(names - JMS_NAMES))
        self.test_of = tuple(test_of)
        # One selector here, reading no JMS name (the usual): its test of the values of
        # ``names`` as a tuple, which costs less per message than a dict.
        self.values_test: Callable[[tuple[Any, ...]], bool] | None = None
        if len(self.tests) == 1 and sole is not None and sole.value_names == self.names:
            self.values_test = sole.selects_values
        self.selections: dict[tuple[bool, ...], Roster] = {}
        # A list, not a tuple: it goes into "received" lines as it is (never mutated).
        self.keys = [sub.key for sub in self.subs]
        self.links = tuple(sub.link_id or 0 for sub in self.subs)
        self.index = {key: i for i, key in enumerate(self.keys)}
        self.all_done = bytes((ANSWER_DONE,)) * len(self.subs)


class RouterState:
    """Where one interested remote router stands with a delivery this router took
    from its publisher (the origin router tracks each one individually)."""

    __slots__ = ("outcome", "sent", "prev")

    def __init__(self) -> None:
        # stream_seq of the delivery from the same publisher stream sent to that
        # router before this one (-1: none): its receiver keeps publisher order by it.
        self.prev: int | None = None
        self.outcome: Outcome | None = None  # its local subscribers' combined outcome
        self.sent = False  # a copy went towards it on the current routes


class MovedState:
    """A durable subscriber this router was waiting on through another router (that
    died) or locally (it re-attached elsewhere): owed the delivery wherever it is
    now. ``router`` is where a copy addressed to it went (None: not re-attached yet);
    ``prev`` the ``stream_seq`` that copy names as its predecessor there (``prev`` in the
    data header, docs/inter-router.md; -1: none; None: not addressed there yet)."""

    __slots__ = ("outcome", "router", "prev")

    def __init__(self) -> None:
        self.outcome: Outcome | None = None
        self.router: str | None = None
        self.prev: int | None = None


class DeliveryRecord:
    __slots__ = (
        "tag",
        "delivery_id",
        "topic",
        "order",
        "payload",
        "publisher",
        "link_name",
        "pub_tag",
        "incarnation",
        "stream_seq",
        "pub_link",
        "pub_delivery",
        "_states",
        "roster",
        "answers",
        "sent_at",
        "remote_routers",
        "outcome",
        "pub_settled",
        "expires_at",
        "reuse",
        "origin_router",
        "header",
        "moved",
        "targeted",
        "settle_pending",
        "waiting",
        "alo",
        # Set only when they apply (read with getattr(record, name, default)):
        # resent: made from a resumed publisher's resend, which other routers may have
        #   finished and forgotten before; final: at a relaying router, the outcome
        #   code the origin settled it with.
        "resent",
        "final",
        "memory",
        "arrived",
        "filtered",
        "watchers",
        # also_targeted: subscriber key -> the other routers that addressed it a copy
        #   (moved.py, accept_targeted; read with getattr)
        "also_targeted",
    )
    # The optional slots' types (bare annotations: a value would clash with the slot).
    resent: bool
    final: int | None
    also_targeted: dict[str, set[str]]

    def __init__(
        self,
        tag: bytes,
        topic: str,
        order: int,
        payload: bytes,
        publisher: str,
        link_name: str,
        pub_tag: bytes,
        incarnation: str,
        stream_seq: int,
        pub_link: int,
        pub_delivery: int | None,
        expires_at: float | None,
        reuse: int = 0,
    ):
        self.tag = tag
        self.reuse = reuse
        # The id in the event log: the tag, plus a suffix in the rare case a
        # publisher reuses a settled tag within one link incarnation.
        self.delivery_id = tag.hex() if not reuse else f"{tag.hex()}.{reuse}"
        self.topic = topic
        self.order = order  # the topic's publisher-order key
        # Dropped once settled (the publisher is the store), unless a resumed
        # subscriber still awaits its re-send (it holds it unsettled).
        self.payload: bytes | None = payload
        self.publisher = publisher  # container-id
        self.link_name = link_name
        self.pub_tag = pub_tag
        self.incarnation = incarnation
        self.stream_seq = stream_seq
        self.pub_link = pub_link
        self.pub_delivery = pub_delivery  # the adapter's handle; None once the publisher is gone
        # The owed subscribers' states, in one of two forms (``subscribers`` gives the
        # map whichever it is). Compact, the usual one (RouterCore._distribute): the
        # topic's ``roster`` at distribution, one byte per subscriber in ``answers``
        # (ANSWER_*) and the send counter all copies went out at (``sent_at``): no
        # object and no map entry per copy. Otherwise ``_states``: subscription key
        # ("container/link") -> SubscriberState, in attach order. The first read of
        # ``subscribers`` turns a compact record into the map, for good; the core's
        # usual path reads the compact form directly and never does.
        self._states: dict[str, SubscriberState] | None = None
        self.roster: Roster | None = None
        self.answers: bytearray | None = None
        self.sent_at = 0
        # router id -> RouterState: the interested remote routers (origin router only)
        self.remote_routers: dict[str, RouterState] = EMPTY_MAP  # own_remote_routers() to write
        # None when our publisher sent it; else the ingress router we answer to
        self.origin_router: str | None = None
        self.header: dict[str, Any] | None = None  # the inter-router routing header, once built
        # subscriber key -> MovedState: subscribers owed it that moved to another router
        self.moved: dict[str, MovedState] = EMPTY_MAP  # own_moved() to write
        # subscriber key -> router to report its outcome to, for subscribers here that
        # another router addressed a copy to (they answer individually)
        self.targeted: dict[str, str] = EMPTY_MAP  # own_targeted() to write
        # routers we relayed the settlement to that have not acknowledged it
        self.settle_pending: set[str] = EMPTY_SET  # replaced by a set when there is one
        self.outcome: Outcome | None = None  # what the publisher was told
        # How many of ``subscribers`` have no outcome yet, kept by the usual path (a
        # local publisher's delivery; the core's _on_outcome/_on_accepted), so the
        # last answer is found without a scan per copy. -1: not counted (a record
        # from another router, or one whose states changed elsewhere: failover,
        # expiry, a detach): whoever needs to know looks at the states.
        self.waiting = -1
        self.pub_settled = False
        self.expires_at = expires_at
        # Its stream's settled-delivery memory (settled.StreamSettled), for a record
        # its own publisher sent here: its outcome goes there when it goes.
        self.memory: StreamSettled | None = None
        self.arrived = 0.0  # when it came (the core's clock): the age operators see (metrics)
        # The subscriptions here whose selector did not select it (None: none did not):
        # never owed it; logged, so that the proof tells filtered from lost.
        self.filtered: list[str] | None = None
        # Routers that asked whether it was settled ("settled?") before it was, or
        # answered it though we did not wait for them: told when it is (remote_outcomes.py).
        self.watchers: set[str] | None = None
        # Its topic is at-least-once (docs/guarantees.md): finished with no settlement
        # phase between routers and forgotten at once, never remembered as settled.
        self.alo = False

    @property
    def subscribers(self) -> dict[str, SubscriberState]:
        """Subscription key -> SubscriberState for every owed subscriber."""
        states = self._states
        if states is None:
            states = self._states = self.expanded_states()
            self.answers = None
            self.roster = None
        return states

    def owe_no_subscriber(self) -> None:
        """Owed to no subscriber here: the (empty) expanded form from the start."""
        self._states = {}

    def expanded_states(self) -> dict[str, SubscriberState]:
        """The compact form as new SubscriberStates (an empty map when the record is
        not compact), leaving the record as it is."""
        states: dict[str, SubscriberState] = {}
        answers = self.answers
        if answers is None:
            return states
        roster = self.roster
        assert roster is not None  # answers and roster are set together (compact form)
        sent_at = self.sent_at
        links = roster.links
        for i, key in enumerate(roster.keys):
            answer = answers[i]
            state = states[key] = SubscriberState()
            if answer & ANSWER_ACCEPTED:
                state.outcome = OUTCOME_ACCEPTED
            if answer & ANSWER_SETTLED:
                state.remote_settled = True
            if not answer & ANSWER_UNSENT:
                state.sent = sent_at
                state.link = links[i]
        return states

    @property
    def compact(self) -> bool:
        return self.answers is not None

    def owed_count(self) -> int:
        """How many subscribers it is owed to (without leaving the compact form)."""
        return len(self.answers) if self.answers is not None else len(self.subscribers)

    def own_remote_routers(self) -> dict[str, RouterState]:
        d = self.remote_routers
        if d is EMPTY_MAP:
            d = self.remote_routers = {}
        return d

    def own_moved(self) -> dict[str, MovedState]:
        d = self.moved
        if d is EMPTY_MAP:
            d = self.moved = {}
        return d

    def own_targeted(self) -> dict[str, str]:
        d = self.targeted
        if d is EMPTY_MAP:
            d = self.targeted = {}
        return d

    def every_receiver_knows_settled(self) -> bool:
        for state in self.subscribers.values():
            if not state.known_settled:
                return False
        return not self.settle_pending

    def __repr__(self) -> str:
        return (
            f"DeliveryRecord({self.delivery_id[:12]}… topic={self.topic!r} "
            f"pub={self.publisher}/{self.link_name} tag={self.pub_tag!r} "
            f"outcome={self.outcome} settled={self.pub_settled} subs={self.owed_count()})"
        )
