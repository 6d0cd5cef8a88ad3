"""What the router's state is between two loop iterations, as plain values: the snapshots
that the metrics and health checks (router/adapter/metrics.py), the console
(router/adapter/console.py) and the management interface (router/adapter/management.py)
report.

Every function here runs on the event loop's thread (``Server.call_in_loop``): the state
belongs to the loop, which changes it between any two bytes another thread could read.
The readers format what these return on their own threads.
"""

from __future__ import annotations

import os
import time
from typing import Any

from router.core.outcomes import NAMES as OUTCOME_NAMES


def snapshot(server: Any) -> dict:
    """Everything the metrics and health checks report, read from the server, its
    engine, the core and the event log as they are between two loop iterations.
    Plain values only: the HTTP thread formats them."""
    core = server.core
    engine = server.engine
    now = engine.now or time.time()
    conns = [c for c in server.conns.values() if not c.dead]
    topics = snapshot_topics(server)
    net = core.net
    peers = engine.peers
    known = (set(net.lsdb.routers()) | set(peers.current) | set(core.lost)) - {net.self_id}
    eventlog = server.eventlog
    attached_subs = len(core.subscribers)
    return {
        "router": net.self_id,
        "epoch": core.epoch,
        "now": now,
        "connections": {
            "client": sum(1 for c in conns if c.ir is None),
            "inter-router": sum(1 for c in conns if c.ir is not None),
        },
        "links": {
            "publisher": len(core.publishers),
            "subscriber": attached_subs,
            "durable-detached": sum(1 for s in core.subscriptions.values() if s.link_id is None),
        },
        "records": len(core.records),
        "bytes_held": core.bytes_held,
        "topics": topics,
        "peers": {r: r in peers.current for r in sorted(known)},
        "routes": len(net.routes.reachable),
        "routers_known": len(net.lsdb.routers()),
        "settled_tags": len(core.settled),
        "placeholders": sum(len(tags) for s in core.subscriptions.values() for tags in s.placeholders.values())
        if core.subscriptions
        else 0,
        "eventlog": {
            "bytes": eventlog.bytes_written,
            "rotations": eventlog.rotations,
            "flush": _histogram(eventlog.flush_seconds),
            "fsync": _histogram(eventlog.fsync_seconds),
            "closed": eventlog.closed,
            "path": str(eventlog.path),
        },
        "loop": _histogram(server.loop_seconds),
        "happenings": {
            **engine.happenings,
            **{("announcement", r, kind): n for (r, kind), n in core.announcements_learnt.items()},
        },
        "ready": readiness(server),
    }


def snapshot_topics(server: Any) -> list[dict]:
    """Per topic the router holds: its records, links, the age of its oldest record
    and its counters (also the management interface's topic entities)."""
    core = server.core
    engine = server.engine
    now = engine.now or time.time()
    _forget_gone_topics(engine, core.topics)
    told_by_topic: dict = {}
    for (address, code), n in engine.outcomes_told.items():
        told_by_topic.setdefault(address, {})[OUTCOME_NAMES.get(code, str(code))] = n
    topics = []
    for topic in core.topics.values():
        oldest = next(iter(topic.records.values()), None)  # insertion (publisher) order: the first is oldest
        topics.append(
            {
                "topic": topic.name,
                "records": len(topic.records),
                "unsettled": topic.unsettled,
                "bytes": topic.bytes,
                "publishers": len(topic.publishers),
                "subscriptions": len(topic.subscriptions),
                "oldest_age": max(0.0, now - oldest.arrived) if oldest is not None and oldest.arrived else 0.0,
                "published": topic.published,
                "copies": engine.copies_sent.get(topic.name, 0),
                "outcomes": told_by_topic.get(topic.name, {}),
            }
        )
    return topics


def _forget_gone_topics(engine: Any, topics: dict) -> None:
    """The adapter's per-topic counts of topics the core no longer has (it forgets
    an idle topic): dropped, so that they stay as many as the live topics. A topic
    that comes back counts from 0 again (Prometheus reads that as a counter reset)."""
    for address in [a for a in engine.copies_sent if a not in topics]:
        del engine.copies_sent[address]
    for key in [k for k in engine.outcomes_told if k[0] not in topics]:
        del engine.outcomes_told[key]


def _histogram(buckets: Any) -> dict:
    return {"buckets": buckets.cumulative(), "sum": buckets.sum}


def readiness(server: Any) -> dict[str, str | None]:
    """check -> None (passing) or why it fails. ``routes``: a router with
    connectors is a network member; it is ready once each connector's peer has
    been up and its routes cover every router its link-state database knows. It
    stays ready after that: a later peer loss is a metric (eorouter_peer_up), not a
    reason to send its clients elsewhere."""
    checks: dict[str, str | None] = {}
    unbound = [f"{lst.role} {lst.host}:{lst.port}" for lst in server.listeners if lst.sock is None]
    checks["listeners"] = f"not bound: {', '.join(unbound)}" if unbound else None
    eventlog = server.eventlog
    directory = os.path.dirname(str(eventlog.path))
    if eventlog.closed:
        checks["eventlog"] = "closed"
    elif not os.access(directory, os.W_OK):
        checks["eventlog"] = f"{directory} is not writable"
    else:
        checks["eventlog"] = None
    checks["routes"] = _routes_check(server)
    return checks


def _routes_check(server: Any) -> str | None:
    if getattr(server, "routes_converged", False) or not server.dialers:
        return None
    peers = server.engine.peers
    up = {p.dialer for p in peers.current.values() if getattr(p, "dialer", None) is not None}
    down = [d.name for d in server.dialers if d not in up]
    if down:
        return f"connector(s) not up yet: {', '.join(down)}"
    net = server.core.net
    unreached = sorted(set(net.lsdb.routers()) - set(net.routes.reachable) - {net.self_id})
    if unreached:
        return f"no route yet to: {', '.join(unreached)}"
    server.routes_converged = True  # from now on ready (see readiness())
    return None
