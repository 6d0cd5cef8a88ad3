"""Management over AMQP: requests to ``$management``, answered on the requester's
reply link, following the AMQP Management conventions (docs/operations.md).

A client attaches a sending link to the address ``$management`` and a receiving
link whose source is *dynamic* (the router names it: ``$management-reply/<n>``)
or names such an address; each request message carries ``operation`` and
``type`` (and for READ, ``name`` or ``identity``) in its application properties
and the reply link's address in ``reply-to``. The answer goes to that link, with
the request's message-id (or correlation-id) as its correlation-id and
``statusCode`` / ``statusDescription`` in its application properties. Any AMQP
client can do this (``proton.utils.SyncRequestResponse`` does it in a few lines);
``eorouter stat`` (router/stat.py) is one.

These links never reach the core: the adapter answers them itself, on the
event loop's thread, from the same state the metrics read (router/adapter/metrics.py).
"""

from __future__ import annotations

import logging
import time
from typing import Any

from cproton_ffi import ffi, lib
from proton import Message

from router import __version__
from router.adapter.endpoints import Link, cstr
from router.adapter.pn import (
    _delivery_new,
    _delivery_partial,
    _delivery_pending,
    _delivery_settle,
    _delivery_update,
    _link_advance,
    _link_flow,
    _link_recv,
    _link_send,
)
from router.core import outcomes

log = logging.getLogger("eorouter.management")

FORCED_CONNECTION = "amqp:connection:forced"
FORCED_LINK = "amqp:link:detach-forced"

ADDRESS = "$management"
REPLY_PREFIX = "$management-reply/"
CREDIT = 16  # requests a requester may have outstanding
PREFIX = "org.eorouter."
OPERATIONS = ("QUERY", "READ", "DELETE", "GET-TYPES", "GET-OPERATIONS")
#: The types an operator may DELETE: close a connection, detach a link, expire a
#: durable subscription whose subscriber is away.
DELETABLE = ("connection", "link", "subscription")
#: Each entity type's attributes, in the order a QUERY without attributeNames returns them.
ATTRIBUTES = {
    "router": ("identity", "name", "epoch", "boot", "version", "connections", "publishers", "subscribers", "topics", "records"),
    "connection": ("identity", "name", "host", "container", "role", "router", "links"),
    "link": ("identity", "name", "connection", "container", "role", "address", "attached", "queued", "credit"),
    "topic": (
        "identity",
        "name",
        "records",
        "unsettled",
        "bytes",
        "publishers",
        "subscriptions",
        "oldest_age",
        "published",
        "copies",
        "outcomes",
    ),
    "peer": ("identity", "name", "up", "next_hop", "cost", "reachable", "subscribers"),
    "subscription": ("identity", "name", "topic", "durable", "attached", "link", "expires_in"),
    "inflight": (
        "identity",
        "name",
        "topic",
        "publisher",
        "pub_tag",
        "age",
        "origin_router",
        "told",
        "settled",
        "subscribers",
        "routers",
        "waiting_on",
    ),
}


class Management:
    """The ``$management`` node of one router. ``server``: the adapter's Server
    (its connections, engine and core)."""

    def __init__(self, server: Any) -> None:
        self.server = server
        self.replies: dict[str, Link] = {}  # reply address -> the requester's receiving link
        self._next = 0
        self.types = {
            PREFIX + "router": self._routers,
            PREFIX + "connection": self._connections,
            PREFIX + "link": self._links,
            PREFIX + "topic": self._topics,
            PREFIX + "peer": self._peers,
            PREFIX + "inflight": self.inflight,
            PREFIX + "subscription": self._subscriptions,
        }

    # ------------------------------------------------------------ links
    @staticmethod
    def wants(link: Link, address: str | None) -> bool:
        """Is this attach for management: a request link to $management, or a
        reply link (a dynamic source, or a $management-reply/ address)?"""
        if link.is_receiver:
            return address == ADDRESS
        if address is not None and address.startswith(REPLY_PREFIX):
            return True
        return address is None and bool(lib.pn_terminus_is_dynamic(lib.pn_link_remote_source(link.ptr)))

    def attach(self, link: Link, address: str | None) -> None:
        ptr = link.ptr
        lib.pn_terminus_copy(lib.pn_link_source(ptr), lib.pn_link_remote_source(ptr))
        lib.pn_terminus_copy(lib.pn_link_target(ptr), lib.pn_link_remote_target(ptr))
        if link.is_receiver:
            link.management = "requests"
            lib.pn_link_open(ptr)
            _link_flow(ptr, CREDIT)
        else:
            if address is None:  # dynamic: we name it
                self._next += 1
                address = f"{REPLY_PREFIX}{link.conn.conn_id}.{self._next}"
                lib.pn_terminus_set_address(lib.pn_link_source(ptr), address.encode())
                lib.pn_terminus_set_dynamic(lib.pn_link_source(ptr), True)
            link.management = "replies"
            link.address = address
            self.replies[address] = link
            lib.pn_link_set_snd_settle_mode(ptr, lib.PN_SND_SETTLED)  # answers go pre-settled
            lib.pn_link_open(ptr)

    def forget(self, link: Link) -> None:
        if link.management == "replies" and self.replies.get(link.address or "") is link:
            del self.replies[link.address or ""]

    # ------------------------------------------------------------ requests
    def request(self, d: Any, link: Link) -> None:
        """A delivery on a request link: answer it once it is whole."""
        if _delivery_partial(d):
            return  # more frames to come: proton tells us again
        n = _delivery_pending(d)
        buf = bytearray(max(n, 1))
        got = _link_recv(link.ptr, ffi.from_buffer(buf), n) if n else 0
        _link_advance(link.ptr)
        request = Message()
        try:
            request.decode(bytes(buf[: max(got, 0)]))
        except Exception as exc:  # noqa: BLE001 - a client's bytes: answered, never fatal
            _delivery_update(d, outcomes.REJECTED)
            _delivery_settle(d)
            _link_flow(link.ptr, 1)
            log.info("management: undecodable request on connection %d: %s", link.conn.conn_id, exc)
            return
        _delivery_update(d, outcomes.ACCEPTED)
        _delivery_settle(d)
        _link_flow(link.ptr, 1)
        reply_to = request.reply_to
        target = self.replies.get(reply_to) if reply_to else None
        if target is None:
            log.info("management: request with reply-to %r, which names no reply link here: not answered", reply_to)
            return
        try:
            status, description, body = self.answer(request, link.conn)
        except Exception as exc:  # a bug here must not cost the requester its connection
            log.exception("management: error answering %r", request.properties)
            status, description, body = 500, f"internal error: {type(exc).__name__}: {exc}", None
        reply = Message(
            body=body,
            correlation_id=request.correlation_id or request.id,
            address=reply_to,
            properties={"statusCode": status, "statusDescription": description},
        )
        data = bytes(reply.encode())
        self._next += 1
        tag = str(self._next).encode()
        dlv = _delivery_new(target.ptr, (len(tag), ffi.from_buffer(tag)))
        _link_send(target.ptr, data, len(data))
        _link_advance(target.ptr)
        _delivery_settle(dlv)
        self.server.engine.touched.add(target.conn)

    def answer(self, request: Message, requester: Any = None) -> tuple[int, str, Any]:
        """(status code, description, body) for one request; ``requester``: the
        connection it came on."""
        props: dict = request.properties or {}
        operation = props.get("operation")
        kind = props.get("type") or props.get("entityType")
        if operation == "GET-TYPES":
            return 200, "OK", {t: list(ATTRIBUTES[t[len(PREFIX) :]]) for t in self.types}
        if operation == "GET-OPERATIONS":
            return 200, "OK", {t: ["QUERY", "READ"] + (["DELETE"] if t[len(PREFIX) :] in DELETABLE else []) for t in self.types}
        if operation not in OPERATIONS:
            return 501, f"operation {operation!r} is not implemented (implemented: {', '.join(OPERATIONS)})", None
        if kind not in self.types:
            return 404, f"unknown type {kind!r} (types: {', '.join(self.types)})", None
        if operation == "DELETE":
            return self._delete(kind[len(PREFIX) :], props.get("identity") or props.get("name"), requester)
        rows = self.types[kind]()
        if operation == "READ":
            name = props.get("name") or props.get("identity")
            found = [r for r in rows if str(r.get("name")) == str(name) or str(r.get("identity")) == str(name)]
            if not found:
                return 404, f"no {kind} named {name!r}", None
            return 200, "OK", found[0]
        wanted = (request.body or {}).get("attributeNames") if isinstance(request.body, dict) else None
        names = list(wanted) if wanted else list(ATTRIBUTES[kind[len(PREFIX) :]])
        return 200, "OK", {"attributeNames": names, "results": [[r.get(n) for n in names] for r in rows]}

    # ------------------------------------------------------------ writes
    def _delete(self, kind: str, name: Any, requester: Any) -> tuple[int, str, Any]:
        if kind not in DELETABLE:
            return 501, f"{PREFIX}{kind} cannot be deleted (deletable: {', '.join(DELETABLE)})", None
        if name is None:
            return 400, "DELETE needs the entity's identity (or name) in the application properties", None
        engine = self.server.engine
        if kind == "connection":
            conn = next((c for c in self.server.conns.values() if str(c.conn_id) == str(name) and not c.dead), None)
            if conn is None:
                return 404, f"no open connection {name!r}", None
            if conn is requester:
                return 400, "that is the connection this request came on", None
            log.info("management: closing connection %d (%s)", conn.conn_id, conn.peer)
            engine.close_connection(conn, FORCED_CONNECTION, "closed by management")
            return 204, "No Content", None
        if kind == "link":
            link = next((lk for lk in engine._links.values() if str(lk.link_id) == str(name)), None)
            if link is None or link.management is not None or link.conn.ir is not None:
                return 404, f"no client link {name!r}", None
            log.info("management: detaching link %d %r (connection %d)", link.link_id, link.name, link.conn.conn_id)
            engine.detach_by_management(link, FORCED_LINK, "detached by management")
            return 204, "No Content", None
        sub = self.server.core.subscriptions.get(str(name))
        if sub is None:
            return 404, f"no subscription {name!r}", None
        if sub.link_id is not None:
            return 400, f"subscription {name!r} is attached: detach its link first (DELETE {PREFIX}link)", None
        log.info("management: expiring durable subscription %s now", name)
        engine.expire_subscription(str(name))
        return 204, "No Content", None

    # ------------------------------------------------------------ entities
    def _subscriptions(self) -> list[dict]:
        now = self.server.engine.now or time.time()
        return [
            {
                "identity": key,
                "name": key,
                "topic": sub.topic,
                "durable": sub.durable,
                "attached": sub.link_id is not None,
                "link": sub.link_id,
                "expires_in": round(sub.expires_at - now, 3) if sub.link_id is None and sub.expires_at else None,
            }
            for key, sub in sorted(self.server.core.subscriptions.items())
        ]

    def _routers(self) -> list[dict]:
        core = self.server.core
        eventlog = self.server.eventlog
        return [
            {
                "identity": core.net.self_id,
                "name": core.net.self_id,
                "epoch": core.epoch,
                "boot": eventlog.boot_id,
                "version": __version__,
                "connections": sum(1 for c in self.server.conns.values() if not c.dead),
                "publishers": len(core.publishers),
                "subscribers": len(core.subscribers),
                "topics": len(core.topics),
                "records": len(core.records),
            }
        ]

    def _connections(self) -> list[dict]:
        out = []
        for conn in self.server.conns.values():
            if conn.dead:
                continue
            ir = conn.ir
            out.append(
                {
                    "identity": conn.conn_id,
                    "name": f"connection/{conn.conn_id}",
                    "host": conn.peer,
                    "container": cstr(lib.pn_connection_remote_container(conn.connection)) or "",
                    "role": "inter-router" if ir is not None else "client",
                    "router": ir.hello.router_id if ir is not None and ir.hello is not None else None,
                    "links": len(conn.links),
                }
            )
        return out

    def _links(self) -> list[dict]:
        core = self.server.core
        out = []
        for link in self.server.engine._links.values():
            if link.management is not None or link.conn.ir is not None:
                continue
            sub = core.subscribers.get(link.link_id)
            out.append(
                {
                    "identity": link.link_id,
                    "name": link.name,
                    "connection": link.conn.conn_id,
                    "container": cstr(lib.pn_connection_remote_container(link.conn.connection)) or "",
                    "role": "publisher" if link.is_receiver else "subscriber",
                    "address": link.address,
                    "attached": link.core_attached,
                    "queued": len(sub.queue) if sub is not None else None,  # copies waiting for its credit
                    "credit": sub.credit if sub is not None else None,
                }
            )
        return out

    def _topics(self) -> list[dict]:
        from router.adapter.snapshots import snapshot_topics

        return [
            {"identity": t["topic"], "name": t["topic"], **{k: v for k, v in t.items() if k != "topic"}}
            for t in snapshot_topics(self.server)
        ]

    def _peers(self) -> list[dict]:
        net = self.server.core.net
        peers = self.server.engine.peers
        routes = net.routes
        known = (set(net.lsdb.routers()) | set(peers.current) | set(self.server.core.lost)) - {net.self_id}
        return [
            {
                "identity": r,
                "name": r,
                "up": r in peers.current,
                "next_hop": routes.next_hop.get(r),
                "cost": routes.cost.get(r),
                "reachable": r in routes.reachable,
                "subscribers": [str(key) for key in net.membership.keys_at(r)],
            }
            for r in sorted(known)
        ]

    def inflight(self) -> list[dict]:
        """Every record, oldest first, with whom it waits on: the subscribers here
        that have not answered, and the routers whose subscribers have not."""
        core = self.server.core
        now = self.server.engine.now or time.time()
        out = []
        for topic in core.topics.values():
            for record in topic.records.values():
                states = record.expanded_states() if record.compact else record.subscribers
                subs = {key: _state(s) for key, s in states.items()}
                routers = {
                    r: (outcomes.NAMES.get(s.outcome.code, "?") if s.outcome is not None else "waiting")
                    for r, s in record.remote_routers.items()
                }
                out.append(
                    {
                        "identity": record.delivery_id,
                        "name": record.delivery_id,
                        "topic": record.topic,
                        "publisher": f"{record.publisher}/{record.link_name}",
                        "pub_tag": record.pub_tag.hex(),
                        "age": round(now - record.arrived, 6) if record.arrived else None,
                        "origin_router": record.origin_router,
                        "told": outcomes.NAMES.get(record.outcome.code, "?") if record.outcome is not None else None,
                        "settled": record.pub_settled,
                        "subscribers": subs,
                        "routers": routers,
                        "waiting_on": sorted(
                            [k for k, v in subs.items() if v in ("sent", "unsent")]
                            + [f"router:{r}" for r, v in routers.items() if v == "waiting"]
                        ),
                    }
                )
        out.sort(key=lambda r: -(r["age"] or 0.0))
        return out


def _state(state: Any) -> str:
    if state.outcome is not None:
        return outcomes.NAMES.get(state.outcome.code, "?")
    return "sent" if state.sent else "unsent"
