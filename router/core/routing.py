"""Link-state routing between routers: the link-state database and next hops.

Pure: no I/O, no clock, no randomness. The inter-router layer floods
``LinkState`` messages and feeds them to a ``LinkStateDatabase``; whenever
``apply`` or ``local`` reports a change, it floods the new state on and calls
``compute_routes`` again.

Rules
-----
Identity and ordering
    A router is a ``RouterId`` (a string). Each run of it is an *incarnation*
    ``(epoch, boot)``: a restart has a higher epoch (persisted and incremented
    at start) and a fresh random boot id. Every ``LinkState`` carries a
    ``stamp`` ``(epoch, boot, version)`` and stamps compare as tuples, so

    * within one incarnation the higher version wins;
    * a newer epoch wins whatever its version (a restarted router counts from 0
      again): an older incarnation's state is never taken for the new one's;
    * two incarnations with the same epoch and different boot ids (a router id
      used twice, or a lost epoch file) are ordered by boot id. That is
      arbitrary, but every router picks the same one, so the network still
      converges; detecting the clash is the job of the router handshake.

    Equal stamps with different neighbours are a protocol violation
    (``ProtocolError``); equal stamps with equal contents are a duplicate.

Our own state
    The database holds our own state too; only ``local`` changes it, with the
    version bumped. A flooded ``LinkState`` that claims our id is ignored
    (typically our previous incarnation's state still circulating; it loses to
    ours everywhere as soon as ours arrives, because our epoch is higher).

Removal
    ``remove(router)`` forgets a router (aged out, unreachable). Its stamp is
    remembered, so a stale copy still in flight cannot bring back an older
    state; a copy with the *same* stamp is accepted again (that router may be
    reachable again with nothing new to say; its links only count if its
    neighbours report them too, so a dead router's copy attracts no traffic).

Which links count
    A link A-B is used only if A reports B *and* B reports A. A half-reported
    link is ignored: that is how a dead router's last advertisement stops
    attracting traffic as soon as its neighbours withdraw their side. A link's
    cost is the larger of the two reported costs, so both ends agree on it.
    Costs are integers >= 1.

Next hops
    ``compute_routes`` runs Dijkstra from ``self_id``. Among all shortest paths
    to a destination the next hop is the neighbour with the *smallest router id*
    (a rule about the graph, not about the order links were read in: every
    router computing from the same database agrees, and forwarding hop by hop
    always gets strictly closer to the destination, so it cannot loop). While
    databases differ (an update still flooding) two routers can briefly
    disagree; loop protection for data in flight belongs to the forwarding
    layer (a hop trace or limit in the inter-router message).

One copy per hop
    ``split_by_next_hop`` groups a message's destination routers by next hop: a
    message from A for C and D, both behind B, crosses A-B once carrying the
    destination set {C, D}; B splits it again. This answers the design seed's
    open question ("one message to all, or one per target router?"): one copy
    per link, with an explicit destination set, so a link carries a message at
    most once however many routers lie behind it.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Mapping
from typing import NamedTuple

from router.core.errors import ProtocolError

RouterId = str


class Incarnation(NamedTuple):
    """One run of a router. Compares as a tuple: a higher epoch is newer."""

    epoch: int
    boot: str


class Stamp(NamedTuple):
    """How new a router's link state is. Compares as a tuple (see module rules)."""

    epoch: int
    boot: str
    version: int


class LinkState(NamedTuple):
    """A router's own view of its links: which neighbours it is connected to, at
    what cost. ``neighbours`` is sorted by router id, without duplicates."""

    origin: RouterId
    epoch: int
    boot: str
    version: int
    neighbours: tuple[tuple[RouterId, int], ...]

    @classmethod
    def of(
        cls,
        origin: RouterId,
        epoch: int,
        boot: str,
        version: int,
        neighbours: Mapping[RouterId, int] | Iterable[tuple[RouterId, int]],
    ) -> LinkState:
        """Build one from a mapping or pairs, in any order (sorted here)."""
        pairs = neighbours.items() if isinstance(neighbours, Mapping) else neighbours
        return cls(origin, epoch, boot, version, tuple(sorted(tuple(pair) for pair in pairs)))

    @property
    def stamp(self) -> Stamp:
        return Stamp(self.epoch, self.boot, self.version)

    @property
    def incarnation(self) -> Incarnation:
        return Incarnation(self.epoch, self.boot)

    def costs(self) -> dict[RouterId, int]:
        return dict(self.neighbours)

    def __repr__(self) -> str:
        links = " ".join(f"{peer}:{cost}" for peer, cost in self.neighbours)
        return f"LS({self.origin} e{self.epoch}/{self.boot} v{self.version} [{links}])"


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def validate_link_state(ls: LinkState) -> None:
    """Raise ``ProtocolError`` unless ``ls`` is well formed."""
    if not isinstance(ls, LinkState):
        raise ProtocolError("amqp:invalid-field", f"not a link state: {ls!r}")
    if not isinstance(ls.origin, str) or not ls.origin:
        raise ProtocolError("amqp:invalid-field", f"link state origin {ls.origin!r}")
    if not _is_int(ls.epoch) or ls.epoch < 0 or not isinstance(ls.boot, str):
        raise ProtocolError("amqp:invalid-field", f"link state incarnation {ls.epoch!r}/{ls.boot!r}")
    if not _is_int(ls.version) or ls.version < 0:
        raise ProtocolError("amqp:invalid-field", f"link state version {ls.version!r}")
    if not isinstance(ls.neighbours, tuple):
        raise ProtocolError("amqp:invalid-field", "link state neighbours must be a tuple")
    previous = None
    for pair in ls.neighbours:
        if not isinstance(pair, tuple) or len(pair) != 2:
            raise ProtocolError("amqp:invalid-field", f"neighbour entry {pair!r}")
        peer, cost = pair
        if not isinstance(peer, str) or not peer or peer == ls.origin:
            raise ProtocolError("amqp:invalid-field", f"neighbour {peer!r} of {ls.origin!r}")
        if not _is_int(cost) or cost < 1:
            raise ProtocolError("amqp:invalid-field", f"link cost {cost!r} to {peer!r}")
        if previous is not None and peer <= previous:
            raise ProtocolError("amqp:invalid-field", "neighbours not sorted by id, or repeated")
        previous = peer


class LinkStateDatabase:
    """Every router's latest link state, ours included (see module rules)."""

    def __init__(self, self_id: RouterId, epoch: int, boot: str):
        own = LinkState(self_id, epoch, boot, 0, ())
        validate_link_state(own)
        self.self_id = self_id
        self._states: dict[RouterId, LinkState] = {self_id: own}
        self._removed: dict[RouterId, Stamp] = {}  # forgotten router -> its last stamp

    @property
    def own(self) -> LinkState:
        return self._states[self.self_id]

    def get(self, router_id: RouterId) -> LinkState | None:
        return self._states.get(router_id)

    def routers(self) -> frozenset[RouterId]:
        """Routers with a link state here (reachable or not)."""
        return frozenset(self._states)

    def local(self, neighbours: Mapping[RouterId, int]) -> LinkState | None:
        """Set our own neighbours and costs. Returns our new link state (version
        bumped) to flood, or None when nothing changed."""
        current = self.own
        candidate = LinkState.of(self.self_id, current.epoch, current.boot, current.version + 1, neighbours)
        if candidate.neighbours == current.neighbours:
            return None
        validate_link_state(candidate)
        self._states[self.self_id] = candidate
        return candidate

    def apply(self, ls: LinkState) -> bool:
        """Take a flooded link state. True when it replaced what we had (flood it on,
        recompute routes); False when it was older, a duplicate, or ours."""
        validate_link_state(ls)
        if ls.origin == self.self_id:
            return False
        current = self._states.get(ls.origin)
        if current is not None:
            if ls.stamp < current.stamp:
                return False
            if ls.stamp == current.stamp:
                if ls != current:
                    raise ProtocolError("amqp:invalid-field", f"two link states of {ls.origin!r} with stamp {tuple(ls.stamp)}")
                return False
        else:
            removed = self._removed.get(ls.origin)
            if removed is not None and ls.stamp < removed:
                return False
        self._states[ls.origin] = ls
        self._removed.pop(ls.origin, None)
        return True

    def remove(self, router_id: RouterId) -> bool:
        """Forget a router's link state (it aged out). True if there was one."""
        if router_id == self.self_id:
            raise ValueError("cannot remove our own link state")
        ls = self._states.pop(router_id, None)
        if ls is None:
            return False
        self._removed[router_id] = ls.stamp
        return True

    def snapshot(self) -> list[LinkState]:
        """Every link state we hold, ours included, sorted by origin."""
        return [self._states[router] for router in sorted(self._states)]

    def digest(self) -> dict[RouterId, Stamp]:
        """Per router, the stamp we hold: a peer compares it with its own."""
        return {router: ls.stamp for router, ls in self._states.items()}

    def newer_here(self, peer_digest: Mapping[RouterId, tuple[int, str, int]]) -> list[LinkState]:
        """What to send a peer that showed us ``peer_digest``: our states it lacks
        or holds an older stamp of."""
        out = []
        for router in sorted(self._states):
            ls = self._states[router]
            theirs = peer_digest.get(router)
            if theirs is None or Stamp(*theirs) < ls.stamp:
                out.append(ls)
        return out

    def newer_at_peer(self, peer_digest: Mapping[RouterId, tuple[int, str, int]]) -> list[RouterId]:
        """Routers whose state the peer holds newer than ours: ask it for those."""
        out = []
        for router in sorted(peer_digest):
            if router == self.self_id:
                continue
            theirs = Stamp(*peer_digest[router])
            ours = self._states.get(router)
            floor = ours.stamp if ours is not None else self._removed.get(router)
            if floor is None or floor < theirs:
                out.append(router)
        return out


class Routes(NamedTuple):
    """Where to send a message for each reachable router. ``next_hop`` and
    ``cost`` cover every reachable router except ``self_id``."""

    self_id: RouterId
    next_hop: Mapping[RouterId, RouterId]
    cost: Mapping[RouterId, int]
    reachable: frozenset[RouterId]


def _usable_links(states: Mapping[RouterId, LinkState]) -> dict[RouterId, dict[RouterId, int]]:
    """Links both ends report, with the larger of the two costs."""
    links: dict[RouterId, dict[RouterId, int]] = {}
    for origin, ls in states.items():
        for peer, cost in ls.neighbours:
            other = states.get(peer)
            if other is None:
                continue
            back = other.costs().get(origin)
            if back is None:
                continue
            links.setdefault(origin, {})[peer] = max(cost, back)
    return links


def compute_routes(self_id: RouterId, db: LinkStateDatabase | Iterable[LinkState]) -> Routes:
    """Shortest paths from ``self_id`` over the links both ends report.

    Ties between equal-cost paths go to the path whose first hop has the
    smallest router id. Pure: the same database always gives the same routes."""
    source = db.snapshot() if isinstance(db, LinkStateDatabase) else db
    states: dict[RouterId, LinkState] = {}
    for ls in source:
        held = states.get(ls.origin)
        if held is None or held.stamp < ls.stamp:
            states[ls.origin] = ls
    links = _usable_links(states)

    cost: dict[RouterId, int] = {self_id: 0}
    first_hop: dict[RouterId, RouterId] = {}
    done: set[RouterId] = set()
    frontier: list[tuple[int, RouterId]] = [(0, self_id)]
    while frontier:
        distance, router = heapq.heappop(frontier)
        if router in done:
            continue  # a stale entry: popped earlier at a lower cost
        done.add(router)
        # Every shortest-path predecessor of ``router`` is closer (costs >= 1), so it
        # was finished earlier and ``first_hop[router]`` is final here.
        for peer, link_cost in links.get(router, {}).items():
            if peer in done:
                continue
            candidate = distance + link_cost
            hop = peer if router == self_id else first_hop[router]
            known = cost.get(peer)
            if known is None or candidate < known:
                cost[peer] = candidate
                first_hop[peer] = hop
                heapq.heappush(frontier, (candidate, peer))
            elif candidate == known and hop < first_hop[peer]:
                first_hop[peer] = hop
    del cost[self_id]
    return Routes(self_id, first_hop, cost, frozenset(first_hop))


class SplitDestinations(NamedTuple):
    """Destination routers grouped by the neighbour to send one copy to."""

    by_next_hop: dict[RouterId, frozenset[RouterId]]
    unreachable: frozenset[RouterId]


def split_by_next_hop(routes: Routes, destinations: Iterable[RouterId]) -> SplitDestinations:
    """Group ``destinations`` by next hop: one copy per neighbour, carrying the set
    of routers it is for. Our own id is skipped (local delivery is the caller's);
    routers with no route come back in ``unreachable``."""
    grouped: dict[RouterId, set[RouterId]] = {}
    unreachable = set()
    for dest in destinations:
        if dest == routes.self_id:
            continue
        hop = routes.next_hop.get(dest)
        if hop is None:
            unreachable.add(dest)
        else:
            grouped.setdefault(hop, set()).add(dest)
    return SplitDestinations({hop: frozenset(dests) for hop, dests in sorted(grouped.items())}, frozenset(unreachable))
