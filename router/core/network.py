"""One router's view of the router network: neighbours, link state, routes and
who subscribes where, and the control messages that keep them in step.

Pure (no I/O, clock or randomness). ``RouterCore`` owns one ``Network`` and asks
it where things go; this module decides nothing about deliveries.

Control messages are plain dicts with a type field "t" (docs/inter-router.md);
the adapter batches and encodes them.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from router.core.announcements import Announcement, SubscriberAttached, SubscriberDetached, SubscribersSnapshot
from router.core.errors import ProtocolError
from router.core.membership import LocalAnnouncer, MembershipTable
from router.core.routing import (
    LinkState,
    LinkStateDatabase,
    Routes,
    SplitDestinations,
    compute_routes,
    split_by_next_hop,
)

LINK_COST = 1


def link_state_message(ls: LinkState) -> dict[str, Any]:
    return {
        "t": "ls",
        "origin": ls.origin,
        "epoch": ls.epoch,
        "boot": ls.boot,
        "version": ls.version,
        "nbrs": [list(pair) for pair in ls.neighbours],
    }


def link_state_from(msg: dict[str, Any]) -> LinkState:
    try:
        return LinkState.of(msg["origin"], msg["epoch"], msg["boot"], msg["version"], msg["nbrs"])
    except (KeyError, TypeError, ValueError) as err:
        raise ProtocolError("amqp:decode-error", f"bad link-state message: {err}") from None


def announcement_message(announcement: Announcement) -> dict[str, Any]:
    msg = announcement._asdict()
    msg["t"] = "sub+" if isinstance(announcement, SubscriberAttached) else "sub-"
    if msg.get("before", 1) is None:
        del msg["before"]  # the usual case: nothing on the wire
    return msg


def announcement_from(msg: dict[str, Any]) -> Announcement:
    kind = SubscriberAttached if msg.get("t") == "sub+" else SubscriberDetached
    fields = {name: msg[name] for name in kind._fields if name in msg}
    try:
        return kind(**fields)
    except TypeError as err:
        raise ProtocolError("amqp:decode-error", f"bad subscriber announcement: {err}") from None


def snapshot_message(snapshot: SubscribersSnapshot) -> dict[str, Any]:
    return {
        "t": "subs",
        "router": snapshot.router,
        "epoch": snapshot.epoch,
        "boot": snapshot.boot,
        "through": snapshot.through,
        "items": [announcement_message(a) for a in snapshot.announcements],
    }


def snapshot_from(msg: dict[str, Any]) -> SubscribersSnapshot:
    try:
        items = tuple(announcement_from(item) for item in msg["items"])
        return SubscribersSnapshot(msg["router"], msg["epoch"], msg["boot"], msg["through"], items)
    except (KeyError, TypeError) as err:
        raise ProtocolError("amqp:decode-error", f"bad subscriber snapshot: {err}") from None


class Network:
    # What the core's compiled twin reads per message (the interest cache), in a plain
    # slot (by offset, router/core/_attrs.h); everything else in the instance's dict.
    __slots__ = ("_interest", "__dict__")

    def __init__(self, self_id: str, epoch: int, boot: str):
        self.self_id = self_id
        self.epoch = epoch
        self.boot = boot
        self.lsdb = LinkStateDatabase(self_id, epoch, boot)
        self.membership = MembershipTable(self_id)
        self.announcer = LocalAnnouncer(self_id, epoch, boot)
        # neighbour router id -> {conn id: (epoch, boot)}: two routers may dial each
        # other, so one neighbour can briefly have two connections.
        self.neighbours: dict[str, dict[int, tuple[int, str]]] = {}
        self.routes: Routes = compute_routes(self_id, self.lsdb)
        # router id -> its client listeners ((host, port), ...), for failover lists
        # router id -> its client listeners: (host, port, scheme), "amqps" for TLS ones
        self.addresses: dict[str, tuple[tuple[str, int, str], ...]] = {}
        # topic -> interested routers; asked once per published message, so cached
        # and cleared whenever the membership table changes.
        self._interest: dict[str, frozenset[str]] = {}

    # ---------------------------------------------------------------- queries

    def has_peers(self) -> bool:
        return bool(self.neighbours)

    def next_hop(self, router_id: str) -> str | None:
        return self.routes.next_hop.get(router_id)

    def reachable(self) -> frozenset[str]:
        return self.routes.reachable

    def split(self, destinations: Iterable[str]) -> SplitDestinations:
        return split_by_next_hop(self.routes, destinations)

    def interested_routers(self, topic: str) -> frozenset[str]:
        routers = self._interest.get(topic)
        if routers is None:
            routers = self._interest[topic] = self.membership.routers_with_subscribers(topic, self.announcer.is_attached)
        return routers

    def membership_changed(self) -> None:
        """Which routers are interested in what may have changed: the membership table
        did, or one of our own subscribers attached or detached (another router's
        retained entry of a subscriber attached here counts for nothing)."""
        self._interest.clear()

    # ---------------------------------------------------------------- changes

    def peer_connected(self, router_id: str, conn_id: int, epoch: int, boot: str) -> LinkState | None:
        """Returns our new link state to flood, if our neighbour set changed."""
        self.neighbours.setdefault(router_id, {})[conn_id] = (epoch, boot)
        return self._update_own()

    def peer_lost(self, router_id: str, conn_id: int) -> LinkState | None:
        conns = self.neighbours.get(router_id)
        if conns is not None:
            conns.pop(conn_id, None)
            if not conns:
                del self.neighbours[router_id]
        return self._update_own()

    def _update_own(self) -> LinkState | None:
        return self.lsdb.local({peer: LINK_COST for peer in self.neighbours})

    def recompute(self) -> bool:
        """Recompute routes; True when any next hop or reachability changed."""
        routes = compute_routes(self.self_id, self.lsdb)
        changed = routes.next_hop != self.routes.next_hop
        self.routes = routes
        return changed

    def sync_messages(self) -> list[dict[str, Any]]:
        """Everything a new neighbour needs: every link state we hold and every
        router's subscribers we know (ours included)."""
        messages = [link_state_message(ls) for ls in self.lsdb.snapshot()]
        messages.append(snapshot_message(self.announcer.snapshot()))
        messages.extend(snapshot_message(s) for s in self.membership.full_snapshot() if s is not None)
        messages.extend(self.address_message(router) for router in sorted(self.addresses))
        messages.append({"t": "synced"})
        return messages

    def address_message(self, router_id: str) -> dict[str, Any]:
        return {"t": "addr", "router": router_id, "addrs": [list(a) for a in self.addresses[router_id]]}

    def learn_addresses(self, msg: dict[str, Any]) -> bool:
        """True when this told us something new (flood it on)."""
        try:
            addrs = tuple(_address(a) for a in msg["addrs"])
            router_id = msg["router"]
        except (KeyError, TypeError, ValueError) as err:
            raise ProtocolError("amqp:decode-error", f"bad addr message: {err}") from None
        if router_id == self.self_id or self.addresses.get(router_id) == addrs:
            return False
        self.addresses[router_id] = addrs
        return True

    def failover_list(self) -> list[tuple[str, int, str]]:
        """Where a client of ours can go if we die: every other reachable router."""
        return [addr for router in sorted(self.routes.reachable) for addr in self.addresses.get(router, ())]


def _address(entry: Any) -> tuple[str, int, str]:
    """One client listener of an addr message: [host, port] (plain AMQP) or [host, port, scheme]."""
    host, port, *rest = entry
    scheme = str(rest[0]) if rest else "amqp"
    if scheme not in ("amqp", "amqps") or len(rest) > 1:
        raise ValueError(f"expected [host, port] or [host, port, 'amqp'|'amqps'], found {entry!r:.80}")
    return str(host), int(port), scheme
