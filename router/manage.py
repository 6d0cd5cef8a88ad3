"""``eorouter manage``: the few changes an operator makes to a running router,
over AMQP management (router/adapter/management.py):

    eorouter manage -b 127.0.0.1:5672 close-connection 7
    eorouter manage -b 127.0.0.1:5672 detach-link 12
    eorouter manage -b 127.0.0.1:5672 expire-subscription audit-app/audit

Find the identities with ``eorouter stat --connections / --links`` and the
subscription keys (container-id/link name) with ``eorouter stat --json --links``
or the management type org.eorouter.subscription. Exit codes: 0 done, 1 refused or
unreachable, 2 a bad command line.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from router.stat import TYPE, StatError, request

ACTIONS = {  # sub-command -> (entity type, what the argument is, what it does)
    "close-connection": ("connection", "ID", "close a client's connection (it may reconnect)"),
    "detach-link": ("link", "ID", "detach a client's link (a durable subscription stays, to resume)"),
    "expire-subscription": ("subscription", "KEY", "end a durable subscription whose subscriber is away, now"),
}


def register(commands: Any) -> None:
    p = commands.add_parser("manage", help="change a running router (over AMQP management)", description=__doc__.split("\n\n")[0])
    p.add_argument(
        "-b", "--bus", default="127.0.0.1:5672", metavar="HOST:PORT", help="the router's client listener (default %(default)s)"
    )
    p.add_argument("--timeout", type=float, default=5.0, help="seconds to wait for the router (default 5)")
    actions = p.add_subparsers(dest="action", metavar="ACTION")
    actions.required = True
    for name, (_, what, help_text) in ACTIONS.items():
        a = actions.add_parser(name, help=help_text, description=help_text)
        a.add_argument("target", metavar=what)
    p.set_defaults(func=cmd_manage)


def cmd_manage(args: argparse.Namespace) -> int:
    entity, _, _ = ACTIONS[args.action]
    try:
        status, description, _ = request(
            args.bus, {"operation": "DELETE", "type": TYPE + entity, "identity": args.target}, args.timeout
        )
    except StatError as exc:
        print(f"eorouter manage: {exc}", file=sys.stderr)
        return 1
    if status not in (200, 204):
        print(f"eorouter manage: the router at {args.bus} refused: {status} {description}", file=sys.stderr)
        return 1
    print(f"eorouter manage: {args.action} {args.target}: done")
    return 0
