"""Which subscribers are attached at which router: announcements and the table.

Pure: no I/O, no clock (``now`` is an argument), no randomness.

A router announces each subscriber (receiving link on a topic) that attaches or
detaches to every other router (``LocalAnnouncer``); every router keeps what the
others announced in a ``MembershipTable``. Announcements travel over a mesh, so
they may arrive late, twice, or in any order; the rules below make every order
converge to the same table.

Rules
-----
Identity
    A subscriber is a ``SubscriberKey`` (container-id, link name): a pair, not
    the string "container/link", which would be ambiguous when either contains
    a "/" (``str(key)`` gives that string for display and logs). The table
    holds one entry per (router, key): the same subscriber can be known at two
    routers at once (it moved, and the news has not all arrived).

Versions
    Each router numbers its announcements 1, 2, 3... per incarnation
    ``(epoch, boot)`` (``routing.Incarnation``). For each router the table
    remembers which versions it has applied: ``through`` (every version up to it
    is applied or known superseded) plus the ones above it. An announcement
    whose version was already seen is a duplicate and changes nothing.
    Otherwise it is news about its key, applied only if its version is higher
    than the announcement we hold for that key (last writer wins, per key, by
    the origin's own counter). Detaches are kept as tombstones until ``through``
    passes them, so a late attach can never undo a newer detach (and a late
    detach never undoes a newer attach). Since the outcome for a key is always
    "the highest version about that key", any order and any duplication give
    the same table.

Where a subscriber is
    A detach from router A removes the subscriber *at A only*: its attach at B
    is untouched, so a late detach from A never undoes a move A -> B. An attach
    at B while the key is known at other routers also reports
    ``SubscriberMoved`` for each of them.

    ``where(key)`` is the router at which the key is attached, counting only
    attached (not retained) entries at routers not marked lost. If it is
    attached at several (transiently, during a move), the answer is the router
    whose attach *this table applied last* (a local counter; the items of one
    snapshot count in version order). That is local knowledge: two routers may
    answer differently while the double attachment lasts; all agree once the
    stale router's detach (or its restart, or expiry) arrives.

Detach, retained, closed
    ``SubscriberDetached.retained`` is True when the router still holds the
    subscription after the link went (a durable terminus detached without
    closing, within its timeout): deliveries for the topic are still owed to it
    there, so the router still counts in ``routers_with_subscribers``. The
    table reports ``RemoteSubscriberRetained``. When the subscription really
    ends (closed, non-durable detach, the retained timeout expired at its
    router), the entry goes: ``RemoteSubscriberRemoved``.

Incarnations
    A newer incarnation of a router replaces everything we held from the older
    one (``RemoteSubscriberRemoved`` with reason "restarted"): its old
    subscribers are gone unless it announces them again. Announcements of an
    older incarnation are ignored. A restarted router's first message is its
    snapshot, even an empty one: that is what tells the others its previous
    incarnation's subscribers are gone.

Snapshots
    A joining or restarted router gets ``SubscribersSnapshot`` messages: for
    each router, every live announcement (plus, from a relaying router, the
    detaches it still keeps above ``through``), and ``through``, meaning "this is
    that router's state as of all its versions up to ``through``". The
    receiver applies the items like deltas, drops what it holds at or below
    ``through`` that the snapshot no longer lists (it was superseded by a
    detach we missed), and advances its own ``through``. Snapshot then deltas,
    deltas then snapshot, or snapshots from different routers: all converge.

Lost routers
    ``router_lost(router, now)`` keeps that router's subscribers, marked lost
    at ``now``: they are "waiting to re-attach" (``awaiting_reattach``), so a
    router waiting on acceptance from a failed router can follow them as they
    re-attach elsewhere (``SubscriberMoved``). A lost router is left out of
    ``routers_with_subscribers`` and ``where`` (nothing can be sent to it).
    ``expire_lost(now)`` removes those lost for longer than their terminus
    timeout (reason "expired"); ``router_regained`` clears the mark and brings
    back what had expired (the router was only cut off; its own announcements
    and a snapshot from it then correct anything that changed meanwhile).
    Late news from a lost router is applied like any other; if the router's
    lost time already exceeds the timeout, ``next_expiry`` is already due.

Our own subscribers
    The table ignores announcements claiming our own router id (echoes, and
    our previous incarnation's news still in flight): our own subscribers are
    ``LocalAnnouncer``'s.
"""

from __future__ import annotations

from collections.abc import Callable

from sortedcontainers import SortedDict, SortedSet

from router.core.announcements import (  # noqa: F401  (re-exported: the table's vocabulary)
    REASON_CLOSED,
    REASON_DETACHED,
    REASON_EXPIRED,
    REASON_RESTARTED,
    REASON_SUPERSEDED,
    Announcement,
    Before,
    Change,
    MembershipStamp,
    RemoteSubscriber,
    RemoteSubscriberAdded,
    RemoteSubscriberLost,
    RemoteSubscriberRemoved,
    RemoteSubscriberRetained,
    SubscriberAttached,
    SubscriberDetached,
    SubscriberKey,
    SubscriberMoved,
    SubscribersSnapshot,
    _check_origin,
    _is_int,
    validate_announcement,
    validate_snapshot,
)
from router.core.routing import Incarnation, RouterId
from router.core.topictrie import PatternIndex, is_pattern, pattern_problem


def _is_live(message: Announcement) -> bool:
    """Does this announcement leave a subscription at its router?"""
    return isinstance(message, SubscriberAttached) or message.retained


# --- the table ------------------------------------------------------------------------------


class _Entry:
    __slots__ = ("message", "learnt", "expired")

    def __init__(self, message: Announcement, learnt: int):
        self.message = message  # the newest announcement about this key at this router
        self.learnt = learnt  # table-local order in which entries were applied
        self.expired = False  # its router is lost and the timeout passed


class _RouterView:
    """What we know of one incarnation of one router."""

    __slots__ = ("incarnation", "through", "above", "entries", "tombstones", "lost_at")

    def __init__(self, incarnation: Incarnation):
        self.incarnation = incarnation
        self.through = 0  # every version <= through is applied or known superseded
        self.above: SortedSet = SortedSet()  # versions > through applied
        self.entries: dict[SubscriberKey, _Entry] = {}  # live entries and detach tombstones
        self.tombstones: SortedDict = SortedDict()  # tombstone version -> key
        self.lost_at: float | None = None

    def put(self, key: SubscriberKey, entry: _Entry) -> _Entry | None:
        """Hold ``entry`` as the newest about ``key``; return the one it replaces."""
        held = self.pop(key)
        self.entries[key] = entry
        if not _is_live(entry.message):
            self.tombstones[entry.message.version] = key
        return held

    def pop(self, key: SubscriberKey) -> _Entry | None:
        held = self.entries.pop(key, None)
        if held is not None and not _is_live(held.message):
            del self.tombstones[held.message.version]
        return held

    def seen(self, version: int) -> bool:
        return version <= self.through or version in self.above

    def mark(self, version: int) -> None:
        self.above.add(version)
        self._fold()

    def advance_to(self, through: int) -> None:
        if through > self.through:
            self.through = through
            del self.above[: self.above.bisect_right(through)]
            self._fold()

    def _fold(self) -> None:
        while self.above and self.above[0] == self.through + 1:
            self.through = self.above.pop(0)
        # Tombstones at or below ``through`` are no longer needed: anything older
        # about their key is a version we have already seen.
        while self.tombstones and self.tombstones.keys()[0] <= self.through:
            _, key = self.tombstones.popitem(0)
            del self.entries[key]


def _view_of(router: RouterId, entry: _Entry, lost_at: float | None) -> RemoteSubscriber:
    m = entry.message
    if isinstance(m, SubscriberAttached):
        return RemoteSubscriber(router, m.key, m.topic, True, m.durable, m.resumed, m.timeout, m.version, lost_at, m.before)
    return RemoteSubscriber(router, m.key, m.topic, False, True, False, m.timeout, m.version, lost_at)


class MembershipTable:
    """The subscribers announced by every other router (see module rules)."""

    def __init__(self, self_id: RouterId):
        self.self_id = self_id
        self._views: dict[RouterId, _RouterView] = {}
        # Indexes over live, unexpired entries.
        self._by_topic: dict[str, dict[RouterId, set[SubscriberKey]]] = {}
        self._patterns = PatternIndex()  # the addresses in _by_topic that are patterns (each its own value)
        self._locations: dict[SubscriberKey, set[RouterId]] = {}
        self._learnt = 0

    # --- input ----------------------------------------------------------------------------

    def apply(self, message: Announcement | SubscribersSnapshot) -> list[Change]:
        """Apply an announcement or a snapshot; return what changed. Raises
        ``ProtocolError`` (changing nothing) on a malformed message."""
        if isinstance(message, SubscribersSnapshot):
            return self._apply_snapshot(message)
        validate_announcement(message)
        out: list[Change] = []
        if message.router == self.self_id:
            return out
        view = self._current_view(message.router, Incarnation(message.epoch, message.boot), out)
        if view is not None:
            self._apply_news(view, message, out)
        return out

    def already_seen(self, message: Announcement) -> bool:
        """Whether ``message`` is news no more: its version of its router's current
        incarnation was applied here (or covered by a snapshot), or it comes from an
        older incarnation than the one we know."""
        view = self._views.get(message.router)
        if view is None:
            return False
        incarnation = Incarnation(message.epoch, message.boot)
        if incarnation == view.incarnation:
            return view.seen(message.version)
        return incarnation < view.incarnation

    def _apply_snapshot(self, snapshot: SubscribersSnapshot) -> list[Change]:
        validate_snapshot(snapshot)
        out: list[Change] = []
        if snapshot.router == self.self_id:
            return out
        view = self._current_view(snapshot.router, Incarnation(snapshot.epoch, snapshot.boot), out)
        if view is None:
            return out
        for item in sorted(snapshot.announcements, key=lambda a: a.version):
            self._apply_news(view, item, out)
        if snapshot.through > view.through:
            listed = {item.key for item in snapshot.announcements}
            for key in sorted(view.entries):
                entry = view.entries[key]
                if entry.message.version <= snapshot.through and key not in listed:
                    # Superseded by a detach at or below ``through`` that we missed.
                    self._drop(snapshot.router, view, key, REASON_SUPERSEDED, out)
            view.advance_to(snapshot.through)
        return out

    def _current_view(self, router: RouterId, incarnation: Incarnation, out: list[Change]) -> _RouterView | None:
        """The view for this incarnation; a newer one replaces an older one's view;
        None when the message is from an older incarnation."""
        view = self._views.get(router)
        if view is not None:
            if incarnation == view.incarnation:
                return view
            if incarnation < view.incarnation:
                return None
            for key in sorted(view.entries):
                self._drop(router, view, key, REASON_RESTARTED, out)
        view = _RouterView(incarnation)
        self._views[router] = view
        return view

    def _apply_news(self, view: _RouterView, message: Announcement, out: list[Change]) -> None:
        if view.seen(message.version):
            return  # a duplicate, or covered by a snapshot
        router, key = message.router, message.key
        held = view.entries.get(key)
        if held is not None and held.message.version > message.version:
            view.mark(message.version)
            return  # older news about this key
        self._learnt += 1
        entry = _Entry(message, self._learnt)
        view.put(key, entry)
        # The announcement this news replaces, if it left a subscription there
        live_before = held.message if held is not None and _is_live(held.message) and not held.expired else None
        if live_before is not None:
            self._unindex(router, live_before)
        if _is_live(message):
            if live_before is not None and live_before.topic != message.topic:
                out.append(RemoteSubscriberRemoved(router, key, live_before.topic, REASON_SUPERSEDED))
            elsewhere = sorted(self._locations.get(key, set()) - {router})
            self._index(router, message)
            if isinstance(message, SubscriberAttached):
                out.append(RemoteSubscriberAdded(router, key, message.topic, message.durable, message.resumed, message.timeout))
                out.extend(SubscriberMoved(key, other, router) for other in elsewhere)
            else:
                out.append(RemoteSubscriberRetained(router, key, message.topic, message.timeout))
        elif live_before is not None:
            assert isinstance(message, SubscriberDetached)  # not live: a detach
            reason = REASON_CLOSED if message.closed else REASON_DETACHED
            out.append(RemoteSubscriberRemoved(router, key, live_before.topic, reason))
        view.mark(message.version)

    def _drop(self, router: RouterId, view: _RouterView, key: SubscriberKey, reason: str, out: list[Change]) -> None:
        entry = view.pop(key)
        assert entry is not None  # callers drop keys the view holds
        if _is_live(entry.message) and not entry.expired:
            self._unindex(router, entry.message)
            out.append(RemoteSubscriberRemoved(router, key, entry.message.topic, reason))

    def _index(self, router: RouterId, message: Announcement) -> None:
        topic = message.topic
        if topic not in self._by_topic and is_pattern(topic) and pattern_problem(topic) is None:
            self._patterns.add(topic, topic)
        self._by_topic.setdefault(topic, {}).setdefault(router, set()).add(message.key)
        self._locations.setdefault(message.key, set()).add(router)

    def _unindex(self, router: RouterId, message: Announcement) -> None:
        at_router = self._by_topic[message.topic]
        keys = at_router[router]
        keys.discard(message.key)
        if not keys:
            del at_router[router]
            if not at_router:
                del self._by_topic[message.topic]
                if is_pattern(message.topic):
                    self._patterns.remove(message.topic, message.topic)
        routers = self._locations[message.key]
        routers.discard(router)
        if not routers:
            del self._locations[message.key]

    # --- failures -------------------------------------------------------------------------

    def router_lost(self, router: RouterId, now: float) -> list[Change]:
        """Mark ``router``'s subscribers as waiting to re-attach elsewhere."""
        view = self._views.get(router)
        if view is None or view.lost_at is not None:
            return []
        view.lost_at = now
        return [
            RemoteSubscriberLost(router, key, entry.message.topic, now)
            for key, entry in sorted(view.entries.items())
            if _is_live(entry.message) and not entry.expired
        ]

    def router_regained(self, router: RouterId) -> list[Change]:
        """``router`` is reachable again (same incarnation): clear the lost mark and
        restore the entries that expired meanwhile."""
        view = self._views.get(router)
        if view is None or view.lost_at is None:
            return []
        view.lost_at = None
        out: list[Change] = []
        for key, entry in sorted(view.entries.items()):
            if entry.expired:
                entry.expired = False
                m = entry.message
                self._index(router, m)
                if isinstance(m, SubscriberAttached):
                    out.append(RemoteSubscriberAdded(router, key, m.topic, m.durable, m.resumed, m.timeout))
                else:
                    out.append(RemoteSubscriberRetained(router, key, m.topic, m.timeout))
        return out

    def expire_lost(self, now: float) -> list[Change]:
        """Remove subscribers whose router has been lost for longer than their
        terminus timeout (reason "expired")."""
        out: list[Change] = []
        for router in sorted(self._views):
            view = self._views[router]
            if view.lost_at is None:
                continue
            for key, entry in sorted(view.entries.items()):
                m = entry.message
                if _is_live(m) and not entry.expired and view.lost_at + m.timeout <= now:
                    entry.expired = True
                    self._unindex(router, m)
                    out.append(RemoteSubscriberRemoved(router, key, m.topic, REASON_EXPIRED))
        return out

    def next_expiry(self) -> float | None:
        """When ``expire_lost`` next has something to do (for a timer)."""
        deadlines = [
            view.lost_at + entry.message.timeout
            for view in self._views.values()
            if view.lost_at is not None
            for entry in view.entries.values()
            if _is_live(entry.message) and not entry.expired
        ]
        return min(deadlines, default=None)

    # --- queries --------------------------------------------------------------------------

    def _reachable(self, router: RouterId) -> bool:
        return self._views[router].lost_at is None

    def _addresses(self, topic: str) -> list[str]:
        """The addresses subscribed to that take ``topic``: itself, and the patterns
        that match it."""
        if not len(self._patterns):
            return [topic]
        return [topic, *sorted(str(p) for p in self._patterns.match(topic))]

    def routers_with_subscribers(
        self, topic: str, attached_here: Callable[[SubscriberKey], bool] | None = None
    ) -> frozenset[RouterId]:
        """Routers (not lost) holding a subscription to ``topic`` (or to a pattern
        matching it), attached or retained; but not a retained one whose subscriber
        attached at another router since, or here (``attached_here``: this router's own
        subscribers, which no other router's word covers): it moved on, and its old
        router gives it up when it hears (what reaches that router meanwhile it passes
        on). Else origins sent the old router a copy of everything for the topic until
        the subscription's terminus timeout, answered "none" (or passed on, a second
        copy) each time."""
        routers: set[RouterId] = set()
        for address in self._addresses(topic):
            for router, keys in self._by_topic.get(address, {}).items():
                if (
                    router not in routers
                    and self._reachable(router)
                    and any(self._holds(router, key, attached_here) for key in keys)
                ):
                    routers.add(router)
        return frozenset(routers)

    def _holds(self, router: RouterId, key: SubscriberKey, attached_here: Callable[[SubscriberKey], bool] | None) -> bool:
        """Whether ``router`` holds ``key``'s subscription: attached there, or retained
        there and attached nowhere else (the usual case, attached, decided first)."""
        if isinstance(self._views[router].entries[key].message, SubscriberAttached):
            return True
        if attached_here is not None and attached_here(key):
            return False
        where = self.where(key)
        return where is None or where == router

    def subscribers_at(self, router: RouterId, topic: str) -> tuple[RemoteSubscriber, ...]:
        """The subscriptions at ``router`` (lost or not) that take ``topic``, by key."""
        keys: set[SubscriberKey] = set()
        for address in self._addresses(topic):
            keys.update(self._by_topic.get(address, {}).get(router, ()))
        if not keys:
            return ()
        view = self._views[router]  # a router indexed under a topic has a view
        return tuple(_view_of(router, view.entries[key], view.lost_at) for key in sorted(keys))

    def keys_at(self, router: RouterId) -> tuple[SubscriberKey, ...]:
        """Every subscriber key known at ``router`` (attached or retained, lost or not), sorted."""
        return tuple(sorted(key for key, routers in self._locations.items() if router in routers))

    def locations(self, key: SubscriberKey) -> tuple[RemoteSubscriber, ...]:
        """Every router where ``key`` is known, attached or retained, lost or not."""
        return tuple(
            _view_of(router, self._views[router].entries[key], self._views[router].lost_at)
            for router in sorted(self._locations.get(key, ()))
        )

    def where(self, key: SubscriberKey) -> RouterId | None:
        """The router where ``key`` is attached; among several, the attach applied last."""
        best, best_learnt = None, -1
        for router in self._locations.get(key, ()):
            view = self._views[router]
            entry = view.entries[key]
            if view.lost_at is None and isinstance(entry.message, SubscriberAttached) and entry.learnt > best_learnt:
                best, best_learnt = router, entry.learnt
        return best

    def announced_elsewhere(self, key: SubscriberKey) -> tuple[RemoteSubscriber, ...]:
        """Every other router's entry for ``key``, lost routers' included, by router."""
        return tuple(
            _view_of(router, self._views[router].entries[key], self._views[router].lost_at)
            for router in sorted(self._locations.get(key, ()))
        )

    def awaiting_reattach(self, router: RouterId) -> frozenset[SubscriberKey]:
        """Subscribers of lost ``router`` (not expired) not yet attached at a router
        that is not lost."""
        view = self._views.get(router)
        if view is None or view.lost_at is None:
            return frozenset()
        return frozenset(
            key
            for key, entry in view.entries.items()
            if _is_live(entry.message) and not entry.expired and self.where(key) is None
        )

    def all_subscribers(self) -> tuple[RemoteSubscriber, ...]:
        """Every live entry, by router then key."""
        return tuple(
            _view_of(router, entry, view.lost_at)
            for router, view in sorted(self._views.items())
            for _, entry in sorted(view.entries.items())
            if _is_live(entry.message) and not entry.expired
        )

    def incarnation_of(self, router: RouterId) -> Incarnation | None:
        view = self._views.get(router)
        return view.incarnation if view is not None else None

    def lost_routers(self) -> frozenset[RouterId]:
        return frozenset(router for router, view in self._views.items() if view.lost_at is not None)

    def digest(self) -> dict[RouterId, MembershipStamp]:
        """Per router, its incarnation and how far we hold its announcements."""
        return {
            router: MembershipStamp(view.incarnation.epoch, view.incarnation.boot, view.through)
            for router, view in self._views.items()
        }

    # --- snapshots ------------------------------------------------------------------------

    def snapshot_for(self, router: RouterId) -> SubscribersSnapshot | None:
        """What we know of ``router``, to relay to a joining router."""
        view = self._views.get(router)
        if view is None:
            return None
        return self._snapshot(router, view)

    def _snapshot(self, router: RouterId, view: _RouterView) -> SubscribersSnapshot:
        items = tuple(sorted((entry.message for entry in view.entries.values()), key=lambda m: m.version))
        return SubscribersSnapshot(router, view.incarnation.epoch, view.incarnation.boot, view.through, items)

    def full_snapshot(self) -> list[SubscribersSnapshot]:
        """A snapshot of every router we know, by router id (add our own from
        ``LocalAnnouncer.snapshot``)."""
        return [self._snapshot(router, self._views[router]) for router in sorted(self._views)]


# --- our own side ---------------------------------------------------------------------------


class LocalAnnouncer:
    """Numbers this router's own announcements and remembers its live subscribers."""

    def __init__(self, self_id: RouterId, epoch: int, boot: str):
        _check_origin(self_id, epoch, boot)
        self.self_id = self_id
        self.epoch = epoch
        self.boot = boot
        self.version = 0  # the last version announced
        self._live: dict[SubscriberKey, Announcement] = {}

    def attached(
        self,
        topic: str,
        container_id: str,
        link_name: str,
        *,
        durable: bool,
        resumed: bool,
        timeout: int,
        before: Before | None = None,
    ) -> SubscriberAttached:
        """A subscriber attached here: the announcement to flood."""
        self.version += 1
        message = SubscriberAttached(
            self.self_id, self.epoch, self.boot, self.version, topic, container_id, link_name, durable, resumed, timeout, before
        )
        self._live[message.key] = message
        return message

    def is_attached(self, key: SubscriberKey) -> bool:
        """Whether ``key`` is attached here (not retained, not gone)."""
        return isinstance(self._live.get(key), SubscriberAttached)

    def detached(self, container_id: str, link_name: str, *, closed: bool) -> SubscriberDetached:
        """A subscriber's link detached here. The subscription is retained (still
        owed messages) when it is durable with a timeout and was not closed;
        the core's rule for keeping a durable subscription."""
        key = SubscriberKey(container_id, link_name)
        held = self._live.get(key)
        if not isinstance(held, SubscriberAttached):
            raise KeyError(f"subscriber {key} is not attached at {self.self_id}")
        retained = held.durable and held.timeout > 0 and not closed
        return self._detach(held, closed=closed, retained=retained)

    def expired(self, container_id: str, link_name: str) -> SubscriberDetached:
        """A retained subscription's terminus timeout passed here: it ends."""
        key = SubscriberKey(container_id, link_name)
        held = self._live.get(key)
        if not isinstance(held, SubscriberDetached):
            raise KeyError(f"subscriber {key} is not retained at {self.self_id}")
        return self._detach(held, closed=True, retained=False)

    def _detach(self, held: Announcement, *, closed: bool, retained: bool) -> SubscriberDetached:
        self.version += 1
        message = SubscriberDetached(
            self.self_id,
            self.epoch,
            self.boot,
            self.version,
            held.topic,
            held.container_id,
            held.link_name,
            closed,
            retained,
            held.timeout,
        )
        if retained:
            self._live[message.key] = message
        else:
            del self._live[message.key]
        return message

    def snapshot(self) -> SubscribersSnapshot:
        """Our live subscribers as of our latest version: what a joining router gets."""
        items = tuple(sorted(self._live.values(), key=lambda m: m.version))
        return SubscribersSnapshot(self.self_id, self.epoch, self.boot, self.version, items)
