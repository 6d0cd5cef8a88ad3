"""router.core.membership: subscriber announcements and the table every router keeps."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from router.core.errors import ProtocolError
from router.core.membership import (
    REASON_CLOSED,
    REASON_DETACHED,
    REASON_EXPIRED,
    REASON_RESTARTED,
    REASON_SUPERSEDED,
    LocalAnnouncer,
    MembershipTable,
    RemoteSubscriberAdded,
    RemoteSubscriberLost,
    RemoteSubscriberRemoved,
    RemoteSubscriberRetained,
    SubscriberAttached,
    SubscriberDetached,
    SubscriberKey,
    SubscriberMoved,
    SubscribersSnapshot,
)
from router.core.routing import Incarnation

S1 = SubscriberKey("client-1", "sub")
S2 = SubscriberKey("client-2", "sub")


def attach(
    announcer: LocalAnnouncer,
    key: SubscriberKey = S1,
    topic: str = "t",
    *,
    durable: bool = False,
    resumed: bool = False,
    timeout: int | None = None,
) -> SubscriberAttached:
    timeout = (30 if durable else 0) if timeout is None else timeout
    return announcer.attached(topic, key.container_id, key.link_name, durable=durable, resumed=resumed, timeout=timeout)


def detach(announcer: LocalAnnouncer, key: SubscriberKey = S1, *, closed: bool = False) -> SubscriberDetached:
    return announcer.detached(key.container_id, key.link_name, closed=closed)


def added(router, key=S1, topic="t", durable=False, resumed=False, timeout=0):
    return RemoteSubscriberAdded(router, key, topic, durable, resumed, timeout)


def state(table: MembershipTable) -> set[tuple]:
    """Everything the table holds, minus the lost marks (and what was there before)."""
    return {s[:8] for s in table.all_subscribers()}


def truth(announcers) -> set[tuple]:
    """What the announcers say they have now, in the table's terms."""
    out = set()
    for announcer in announcers:
        for m in announcer.snapshot().announcements:
            if isinstance(m, SubscriberAttached):
                out.add((m.router, m.key, m.topic, True, m.durable, m.resumed, m.timeout, m.version))
            else:
                out.add((m.router, m.key, m.topic, False, True, False, m.timeout, m.version))
    return out


# --- apply and ignore ---------------------------------------------------------------------------


def test_an_attach_is_added_and_a_duplicate_changes_nothing():
    a, table = LocalAnnouncer("A", 1, "a"), MembershipTable("X")
    message = attach(a)
    assert message == SubscriberAttached("A", 1, "a", 1, "t", "client-1", "sub", False, False, 0)
    assert table.apply(message) == [added("A")]
    assert table.apply(message) == []
    assert table.routers_with_subscribers("t") == {"A"}
    assert table.routers_with_subscribers("other") == frozenset()
    assert [s.key for s in table.subscribers_at("A", "t")] == [S1]
    assert table.subscribers_at("B", "t") == ()
    assert table.where(S1) == "A"
    assert table.where(S2) is None
    assert str(S1) == "client-1/sub"


def test_detach_before_attach_leaves_nothing_and_the_late_attach_is_ignored():
    a, table = LocalAnnouncer("A", 1, "a"), MembershipTable("X")
    first, second = attach(a), detach(a)
    assert table.apply(second) == []
    assert table.apply(first) == []
    assert table.all_subscribers() == ()
    assert table.routers_with_subscribers("t") == frozenset()


def test_detach_reasons_and_a_retained_durable_subscription():
    a, table = LocalAnnouncer("A", 1, "a"), MembershipTable("X")
    table.apply(attach(a, S1))
    table.apply(attach(a, S2, durable=True))
    assert table.apply(detach(a, S1)) == [RemoteSubscriberRemoved("A", S1, "t", REASON_DETACHED)]
    # A durable subscriber that detaches without closing is still held at A, still owed messages.
    assert table.apply(detach(a, S2)) == [RemoteSubscriberRetained("A", S2, "t", 30)]
    assert table.routers_with_subscribers("t") == {"A"}
    assert table.where(S2) is None  # held, not attached
    [held] = table.subscribers_at("A", "t")
    assert (held.key, held.attached, held.durable, held.timeout) == (S2, False, True, 30)
    # It re-attaches at A, then closes.
    assert table.apply(attach(a, S2, durable=True, resumed=True)) == [added("A", S2, durable=True, resumed=True, timeout=30)]
    assert table.apply(detach(a, S2, closed=True)) == [RemoteSubscriberRemoved("A", S2, "t", REASON_CLOSED)]
    assert table.routers_with_subscribers("t") == frozenset()


def test_a_retained_subscription_that_expires_at_its_router_is_removed():
    a, table = LocalAnnouncer("A", 1, "a"), MembershipTable("X")
    table.apply(attach(a, durable=True))
    table.apply(detach(a))
    message = a.expired(S1.container_id, S1.link_name)
    assert (message.closed, message.retained) == (True, False)
    assert table.apply(message) == [RemoteSubscriberRemoved("A", S1, "t", REASON_CLOSED)]


def test_reattaching_on_another_topic_at_the_same_router_replaces_the_old_one():
    a, table = LocalAnnouncer("A", 1, "a"), MembershipTable("X")
    table.apply(attach(a, topic="t"))
    assert table.apply(attach(a, topic="u")) == [RemoteSubscriberRemoved("A", S1, "t", REASON_SUPERSEDED), added("A", topic="u")]
    assert table.routers_with_subscribers("t") == frozenset()
    assert table.routers_with_subscribers("u") == {"A"}


def test_announcements_claiming_our_own_id_are_ignored():
    table = MembershipTable("A")
    assert table.apply(attach(LocalAnnouncer("A", 0, "old"))) == []
    assert table.apply(LocalAnnouncer("A", 0, "old").snapshot()) == []
    assert table.all_subscribers() == ()


@pytest.mark.parametrize(
    "bad",
    [
        SubscriberAttached("A", 1, "a", 0, "t", "c", "l", False, False, 0),  # version starts at 1
        SubscriberAttached("A", 1, "a", 1, "t", "c", "l", 1, False, 0),  # not a bool
        SubscriberAttached("A", 1, "a", 1, "t", "c", "l", False, False, -1),
        SubscriberAttached("", 1, "a", 1, "t", "c", "l", False, False, 0),
        SubscriberAttached("A", -1, "a", 1, "t", "c", "l", False, False, 0),
        SubscriberAttached("A", 1, "a", 1, None, "c", "l", False, False, 0),
        SubscriberDetached("A", 1, "a", 1, "t", "c", "l", "yes"),
        ("A", 1, "a", 1, "t", "c", "l", False, False, 0),
        SubscribersSnapshot("A", 1, "a", -1, ()),
        SubscribersSnapshot("A", 1, "a", 2, (SubscriberAttached("B", 1, "a", 1, "t", "c", "l", False, False, 0),)),
        SubscribersSnapshot(
            "A",
            1,
            "a",
            2,
            (
                SubscriberAttached("A", 1, "a", 1, "t", "c", "l", False, False, 0),
                SubscriberAttached("A", 1, "a", 2, "t", "c", "l", False, False, 0),
            ),
        ),
        SubscribersSnapshot(
            "A",
            1,
            "a",
            2,
            (
                SubscriberAttached("A", 1, "a", 1, "t", "c", "l", False, False, 0),
                SubscriberAttached("A", 1, "a", 1, "t", "c", "m", False, False, 0),
            ),
        ),
        SubscribersSnapshot("A", 1, "a", 2, [SubscriberAttached("A", 1, "a", 1, "t", "c", "l", False, False, 0)]),
    ],
)
def test_malformed_messages_are_refused_and_change_nothing(bad):
    a, table = LocalAnnouncer("A", 1, "a"), MembershipTable("X")
    table.apply(attach(a))
    before = (table.all_subscribers(), table.digest())
    with pytest.raises(ProtocolError):
        table.apply(bad)
    assert (table.all_subscribers(), table.digest()) == before


# --- a subscriber that moves ----------------------------------------------------------------------


def test_a_subscriber_moves_and_the_late_detach_from_the_old_router_does_not_undo_it():
    """S1 was at A, re-attached at B; A's detach arrives after B's attach."""
    a, b, table = LocalAnnouncer("A", 1, "a"), LocalAnnouncer("B", 1, "b"), MembershipTable("X")
    table.apply(attach(a))
    at_b = attach(b, resumed=True)
    assert table.apply(at_b) == [added("B", resumed=True), SubscriberMoved(S1, "A", "B")]
    assert table.where(S1) == "B"  # attached at both for now: the attach learnt last wins
    assert [s.router for s in table.locations(S1)] == ["A", "B"]
    assert table.apply(detach(a)) == [RemoteSubscriberRemoved("A", S1, "t", REASON_DETACHED)]
    assert table.where(S1) == "B"
    assert table.routers_with_subscribers("t") == {"B"}


def test_a_move_whose_old_attach_arrives_last():
    """The old router's detach, then B's attach, then the old router's attach."""
    a, b, table = LocalAnnouncer("A", 1, "a"), LocalAnnouncer("B", 1, "b"), MembershipTable("X")
    old_attach, old_detach, new_attach = attach(a), detach(a), attach(b)
    table.apply(old_detach)
    assert table.apply(new_attach) == [added("B")]
    assert table.apply(old_attach) == []
    assert table.where(S1) == "B"
    assert table.routers_with_subscribers("t") == {"B"}


def test_where_is_the_attach_learnt_last_while_attached_at_two_routers():
    a, b, table = LocalAnnouncer("A", 1, "a"), LocalAnnouncer("B", 1, "b"), MembershipTable("X")
    at_a, at_b = attach(a), attach(b)
    table.apply(at_b)
    table.apply(at_a)
    assert table.where(S1) == "A"


# --- restarts -------------------------------------------------------------------------------------


def test_a_newer_epoch_replaces_the_old_incarnations_subscribers():
    old, table = LocalAnnouncer("A", 1, "a1"), MembershipTable("X")
    table.apply(attach(old, S1))
    table.apply(attach(old, S2))
    late = detach(old, S1)
    new = LocalAnnouncer("A", 2, "a2")
    assert table.apply(attach(new, S1)) == [
        RemoteSubscriberRemoved("A", S1, "t", REASON_RESTARTED),
        RemoteSubscriberRemoved("A", S2, "t", REASON_RESTARTED),
        added("A"),
    ]
    assert table.incarnation_of("A") == Incarnation(2, "a2")
    # The old incarnation's news, however late and whatever its version, changes nothing.
    assert table.apply(late) == []
    assert table.apply(SubscriberAttached("A", 1, "a1", 99, "t", "c", "l", False, False, 0)) == []
    assert [(s.key, s.version) for s in table.all_subscribers()] == [(S1, 1)]


def test_a_newer_epoch_wins_even_with_a_lower_version():
    table = MembershipTable("X")
    table.apply(SubscriberAttached("A", 1, "a1", 50, "t", "c", "l", False, False, 0))
    table.apply(SubscriberAttached("A", 2, "a2", 1, "t", "c", "m", False, False, 0))
    assert [s.key for s in table.all_subscribers()] == [SubscriberKey("c", "m")]


# --- snapshots ------------------------------------------------------------------------------------


def test_a_joining_router_gets_full_snapshots_then_deltas():
    a, b, relay = LocalAnnouncer("A", 1, "a"), LocalAnnouncer("B", 1, "b"), MembershipTable("B")
    for message in (attach(a, S1), attach(a, S2, durable=True), detach(a, S1), detach(a, S2), attach(b, S1)):
        relay.apply(message)
    joiner = MembershipTable("J")
    for snapshot in relay.full_snapshot() + [b.snapshot()]:
        joiner.apply(snapshot)
    assert state(joiner) == truth([a, b])
    assert joiner.digest() == {"A": (1, "a", 4), "B": (1, "b", 1)}
    joiner.apply(attach(a, S1))
    assert state(joiner) == truth([a, b])


def test_a_snapshot_drops_what_was_detached_meanwhile():
    """We hold S1@A from version 1; A's snapshot through version 3 does not list
    it: it was detached by an announcement we never got."""
    a, table = LocalAnnouncer("A", 1, "a"), MembershipTable("X")
    table.apply(attach(a, S1))
    detach(a, S1)  # lost on the way
    table.apply(attach(a, S2))
    changes = table.apply(a.snapshot())
    assert changes == [RemoteSubscriberRemoved("A", S1, "t", REASON_SUPERSEDED)]
    assert state(table) == truth([a])
    assert table.digest()["A"].through == 3


def test_a_relayed_snapshot_carries_the_detaches_above_its_through():
    """The relay got A's versions 1 and 3 (S1 attached, then S1 detached) but not 2:
    its snapshot must carry the detach, or a table holding only version 1 would
    keep S1."""
    a = LocalAnnouncer("A", 1, "a")
    v1, v2, v3 = attach(a, S1), attach(a, S2), detach(a, S1)
    relay = MembershipTable("R")
    relay.apply(v1)
    relay.apply(v3)
    snapshot = relay.snapshot_for("A")
    assert snapshot.through == 1 and v3 in snapshot.announcements
    joiner = MembershipTable("J")
    joiner.apply(v1)
    joiner.apply(snapshot)
    joiner.apply(v2)
    assert state(joiner) == truth([a])
    assert relay.snapshot_for("nobody") is None


# --- lost routers ---------------------------------------------------------------------------------


def test_lost_router_subscribers_wait_to_reattach_then_expire():
    a, b, table = LocalAnnouncer("A", 1, "a"), LocalAnnouncer("B", 1, "b"), MembershipTable("X")
    table.apply(attach(a, S1, durable=True, timeout=30))
    table.apply(attach(a, S2))
    assert table.router_lost("A", now=100.0) == [
        RemoteSubscriberLost("A", S1, "t", 100.0),
        RemoteSubscriberLost("A", S2, "t", 100.0),
    ]
    assert table.router_lost("A", now=101.0) == []  # already lost
    assert table.lost_routers() == {"A"}
    assert table.routers_with_subscribers("t") == frozenset()
    assert table.where(S1) is None
    assert table.awaiting_reattach("A") == {S1, S2}
    assert {s.lost_at for s in table.subscribers_at("A", "t")} == {100.0}
    # S1 re-attaches at B.
    assert table.apply(attach(b, S1, durable=True, resumed=True, timeout=30)) == [
        added("B", S1, durable=True, resumed=True, timeout=30),
        SubscriberMoved(S1, "A", "B"),
    ]
    assert table.awaiting_reattach("A") == {S2}
    assert table.where(S1) == "B"
    # S2 was not durable: nothing to wait for once the expiry runs; S1's timeout is 30 s.
    assert table.next_expiry() == 100.0
    assert table.expire_lost(100.0) == [RemoteSubscriberRemoved("A", S2, "t", REASON_EXPIRED)]
    assert table.next_expiry() == 130.0
    assert table.expire_lost(129.9) == []
    assert table.expire_lost(130.0) == [RemoteSubscriberRemoved("A", S1, "t", REASON_EXPIRED)]
    assert table.next_expiry() is None
    assert table.awaiting_reattach("A") == frozenset()
    assert table.routers_with_subscribers("t") == {"B"}


def test_a_regained_router_gets_its_subscribers_back():
    a, table = LocalAnnouncer("A", 1, "a"), MembershipTable("X")
    table.apply(attach(a, S1))
    table.apply(attach(a, S2, durable=True))
    table.router_lost("A", now=0.0)
    assert table.expire_lost(0.0) == [RemoteSubscriberRemoved("A", S1, "t", REASON_EXPIRED)]
    assert table.router_regained("A") == [added("A", S1)]
    assert table.router_regained("A") == []
    assert table.routers_with_subscribers("t") == {"A"}
    assert state(table) == truth([a])
    assert table.router_lost("nobody", now=0.0) == [] and table.router_regained("nobody") == []


def test_a_lost_router_that_restarts_replaces_its_old_subscribers():
    old, table = LocalAnnouncer("A", 1, "a1"), MembershipTable("X")
    table.apply(attach(old, S1, durable=True))
    table.router_lost("A", now=0.0)
    new = LocalAnnouncer("A", 2, "a2")
    assert table.apply(new.snapshot()) == [RemoteSubscriberRemoved("A", S1, "t", REASON_RESTARTED)]
    assert table.lost_routers() == frozenset()


# --- the local side -------------------------------------------------------------------------------


def test_local_announcer_numbers_and_remembers():
    a = LocalAnnouncer("A", 3, "a3")
    first = attach(a, S1, durable=True)
    second = attach(a, S2)
    assert (first.version, second.version, a.version) == (1, 2, 2)
    third = detach(a, S1)
    assert (third.version, third.retained, third.timeout, third.topic) == (3, True, 30, "t")
    assert detach(a, S2, closed=False).retained is False  # not durable: nothing kept
    assert a.snapshot() == SubscribersSnapshot("A", 3, "a3", 4, (third,))
    with pytest.raises(KeyError):
        detach(a, S2)
    with pytest.raises(KeyError):
        detach(a, S1)  # retained, not attached
    with pytest.raises(KeyError):
        a.expired("nobody", "x")


def test_a_closed_durable_detach_is_not_retained():
    a = LocalAnnouncer("A", 1, "a")
    attach(a, durable=True)
    assert detach(a, closed=True).retained is False
    attach(a, durable=True, timeout=0)
    assert detach(a).retained is False  # no timeout: the core ends it at once
    assert a.snapshot().announcements == ()


# --- any delivery order converges -----------------------------------------------------------------

ROUTERS = ("A", "B", "C")
KEYS = (S1, S2, SubscriberKey("client-3", "x"))
TOPICS = ("t", "u")

operations = st.lists(
    st.tuples(
        st.sampled_from(ROUTERS),
        st.sampled_from(["attach", "attach", "detach", "detach", "expire", "restart", "snapshot"]),
        st.sampled_from(KEYS),
        st.sampled_from(TOPICS),
        st.booleans(),
        st.booleans(),
    ),
    max_size=40,
)


def run_history(ops):
    """Play the operations on one announcer per router. Returns the final
    announcers, every message in the order made (announcements, and the snapshot
    each restart begins with), and snapshots taken on the way."""
    announcers = {r: LocalAnnouncer(r, 1, f"{r}1") for r in ROUTERS}
    made, snapshots = [], []
    for router, op, key, topic, flag, closed in ops:
        a = announcers[router]
        held = {m.key: m for m in a.snapshot().announcements}.get(key)
        if op == "attach":
            made.append(attach(a, key, topic, durable=flag, resumed=closed))
        elif op == "detach" and isinstance(held, SubscriberAttached):
            made.append(detach(a, key, closed=closed))
        elif op == "expire" and isinstance(held, SubscriberDetached):
            made.append(a.expired(key.container_id, key.link_name))
        elif op == "restart":
            # A restarted router's first word is its (empty) snapshot: that is
            # how the others learn its old incarnation's subscribers are gone.
            announcers[router] = LocalAnnouncer(router, a.epoch + 1, f"{router}{a.epoch + 1}")
            made.append(announcers[router].snapshot())
        elif op == "snapshot":
            snapshots.append(a.snapshot())
    return list(announcers.values()), made, snapshots


class Mirror:
    """Rebuilds the table's contents from nothing but the changes it reported."""

    def __init__(self):
        self.held: dict[tuple, tuple] = {}

    def follow(self, changes):
        for change in changes:
            if isinstance(change, (RemoteSubscriberAdded, RemoteSubscriberRetained)):
                self.held[(change.router, change.key)] = (change.topic, isinstance(change, RemoteSubscriberAdded))
            elif isinstance(change, RemoteSubscriberRemoved):
                assert self.held.pop((change.router, change.key))[0] == change.topic

    def matches(self, table):
        return self.held == {(s.router, s.key): (s.topic, s.attached) for s in table.all_subscribers()}


@given(operations, st.data())
def test_any_order_with_duplicates_and_snapshots_converges(ops, data):
    announcers, made, snapshots = run_history(ops)
    in_order = MembershipTable("X")
    for message in made:
        in_order.apply(message)
    assert state(in_order) == truth(announcers)

    # Another router got a random part of the history, in a random order: its
    # relayed snapshots (with gaps and detaches above ``through``) join the stream.
    relay = MembershipTable("R")
    for message in data.draw(st.lists(st.sampled_from(made), max_size=len(made))) if made else ():
        relay.apply(message)
    relayed = relay.full_snapshot()

    stream = made + data.draw(st.lists(st.sampled_from(made), max_size=10)) if made else []
    stream = stream + data.draw(st.lists(st.sampled_from(snapshots + relayed), max_size=6)) if snapshots + relayed else stream
    stream = data.draw(st.permutations(stream))
    table, mirror = MembershipTable("X"), Mirror()
    for message in stream:
        mirror.follow(table.apply(message))
        assert mirror.matches(table)
    assert state(table) == state(in_order) == truth(announcers)
    for key in KEYS:
        at = {s.router for s in table.locations(key) if s.attached}
        assert (table.where(key) in at) if at else table.where(key) is None


@given(operations, st.data())
def test_lost_announcements_are_repaired_by_the_origins_snapshots(ops, data):
    announcers, made, _ = run_history(ops)
    delivered = data.draw(st.lists(st.sampled_from(made), max_size=len(made))) if made else []
    table, mirror = MembershipTable("X"), Mirror()
    for message in delivered:
        mirror.follow(table.apply(message))
    for announcer in data.draw(st.permutations(announcers)):
        mirror.follow(table.apply(announcer.snapshot()))
    assert state(table) == truth(announcers)
    assert mirror.matches(table)
    for message in data.draw(st.permutations(made)):  # the stragglers arrive after all
        mirror.follow(table.apply(message))
    assert state(table) == truth(announcers)
    assert mirror.matches(table)


def test_client_addresses_carry_whether_they_need_tls():
    """Routers flood their client listeners as [host, port, scheme]; the failover list
    offered to clients keeps the scheme (amqps: TLS needed). An older [host, port] is
    plain AMQP; anything else is a decode error."""
    from router.core.network import Network

    net = Network("A", 1, "boot-a")
    assert net.learn_addresses({"t": "addr", "router": "B", "addrs": [["h", 5671, "amqps"], ["h", 5672]]})
    assert net.addresses["B"] == (("h", 5671, "amqps"), ("h", 5672, "amqp"))
    assert not net.learn_addresses(net.address_message("B"))  # the same again: nothing new to flood
    for bad in ([["h", 1, "http"]], [["h", 1, "amqp", "x"]], [["h"]]):
        with pytest.raises(ProtocolError, match="bad addr message"):
            net.learn_addresses({"t": "addr", "router": "C", "addrs": bad})


def test_what_was_there_before_a_subscription_travels_as_runs_of_stream_seq():
    from router.core.announcements import RemoteSubscriber, seq_ranges

    assert seq_ranges([5, 3, 4, 4, 9, 10, 1]) == [[1, 1], [3, 5], [9, 10]]
    stream = bytes(16)
    s = RemoteSubscriber("C", S1, "t", True, True, False, 60, 1, None, {stream.hex(): seq_ranges([3, 4, 5, 9])})
    assert [n for n in range(12) if s.was_here_before(stream, n)] == [3, 4, 5, 9]
    assert not s.was_here_before(b"\x01" * 16, 4)
    assert not s._replace(before=None).was_here_before(stream, 4)
