"""``eorouter stat``: what a router holds, asked over AMQP (its ``$management``
node, router/adapter/management.py), printed as tables or JSON (like qdstat).

    eorouter stat -b 127.0.0.1:5672 --connections
    eorouter stat -b 127.0.0.1:5672 --inflight --topic orders
    eorouter stat --network --json

Exit codes: 0 answered, 1 the router could not be reached or refused, 2 a bad
command line.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

TYPE = "org.eorouter."
VIEWS = {  # flag -> (entity type, columns shown in the table, title)
    "router": ("router", ["name", "epoch", "version", "connections", "publishers", "subscribers", "topics", "records"], "Router"),
    "connections": ("connection", ["identity", "host", "container", "role", "router", "links"], "Connections"),
    "links": ("link", ["identity", "connection", "container", "name", "role", "address", "queued", "credit"], "Links"),
    "topics": (
        "topic",
        ["name", "publishers", "subscriptions", "records", "unsettled", "oldest_age", "published", "copies", "outcomes"],
        "Topics",
    ),
    "network": ("peer", ["name", "up", "next_hop", "cost", "subscribers"], "Network (other routers)"),
    "inflight": (
        "inflight",
        ["identity", "topic", "publisher", "pub_tag", "age", "told", "waiting_on"],
        "In-flight deliveries, oldest first",
    ),
    "subscriptions": (
        "subscription",
        ["name", "topic", "durable", "attached", "link", "expires_in"],
        "Subscriptions (attached, or durable and away)",
    ),
}


def register(commands: Any) -> None:
    p = commands.add_parser("stat", help="show what a router holds (over AMQP management)", description=__doc__.split("\n\n")[0])
    p.add_argument(
        "-b", "--bus", default="127.0.0.1:5672", metavar="HOST:PORT", help="the router's client listener (default %(default)s)"
    )
    views = p.add_mutually_exclusive_group()
    for flag in VIEWS:
        views.add_argument(f"--{flag}", dest="view", action="store_const", const=flag, help=f"{VIEWS[flag][2].lower()}")
    p.add_argument("--topic", help="with --inflight or --topics: only this topic")
    p.add_argument("--json", action="store_true", help="the rows as JSON, one object per row")
    p.add_argument("--timeout", type=float, default=5.0, help="seconds to wait for the router (default 5)")
    p.set_defaults(func=cmd_stat, view="router")


class StatError(Exception):
    pass


def request(bus: str, properties: dict, timeout: float = 5.0) -> tuple[int, str, Any]:
    """One management request to the router at ``bus``: (status code, description, body)."""
    from proton import Message
    from proton.utils import BlockingConnection, SyncRequestResponse

    url = bus if "://" in bus else f"amqp://{bus}"
    try:
        conn = BlockingConnection(url, timeout=timeout)
    except Exception as exc:  # noqa: BLE001 - whatever proton raises, the user needs one sentence
        raise StatError(f"cannot reach a router at {bus}: {exc}") from exc
    try:
        client = SyncRequestResponse(conn, "$management")
        reply = client.call(Message(properties=properties, body={}))
    except Exception as exc:  # noqa: BLE001
        raise StatError(f"the router at {bus} did not answer: {exc}") from exc
    finally:
        try:
            conn.close()
        except Exception:  # noqa: BLE001 - closing after a failure
            pass
    props: dict = reply.properties or {}
    return props.get("statusCode", 0), str(props.get("statusDescription", "")), reply.body


def query(bus: str, entity: str, timeout: float = 5.0) -> list[dict]:
    """QUERY one entity type of the router at ``bus``: its rows as dicts."""
    status, description, body = request(bus, {"operation": "QUERY", "type": TYPE + entity}, timeout)
    if status != 200:
        raise StatError(f"the router at {bus} refused: {status} {description}")
    if not isinstance(body, dict):
        raise StatError(f"the router at {bus} answered with no table (a {type(body).__name__})")
    names = body.get("attributeNames", [])
    return [dict(zip(names, row)) for row in body.get("results", [])]


def table(rows: list[dict], columns: list[str]) -> str:
    cells = [[_cell(r.get(c)) for c in columns] for r in rows]
    widths = [max([len(c)] + [len(row[i]) for row in cells]) for i, c in enumerate(columns)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(columns, widths)), "  ".join("=" * w for w in widths)]
    lines += ["  ".join(v.ljust(w) for v, w in zip(row, widths)).rstrip() for row in cells]
    return "\n".join(lines)


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.3f}"
    if isinstance(value, dict):
        return " ".join(f"{k}:{v}" for k, v in sorted(value.items())) or "-"
    if isinstance(value, (list, tuple)):
        return ",".join(str(v) for v in value) or "-"
    return str(value)


def cmd_stat(args: argparse.Namespace) -> int:
    entity, columns, title = VIEWS[args.view]
    try:
        rows = query(args.bus, entity, args.timeout)
    except StatError as exc:
        print(f"eorouter stat: {exc}", file=sys.stderr)
        return 1
    if args.topic is not None:
        key = "topic" if args.view == "inflight" else "name"
        rows = [r for r in rows if r.get(key) == args.topic]
    if args.json:
        for row in rows:
            print(json.dumps(row, sort_keys=True))
        return 0
    print(f"{title} of {args.bus}")
    print(table(rows, columns) if rows else "(none)")
    return 0
