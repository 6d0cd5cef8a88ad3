"""The ``eorouter network`` and ``eorouter demo`` commands, registered with the
router's command line through the ``eorouter.commands`` entry points
(pyproject.toml): the router never imports the tools."""

from __future__ import annotations

import argparse


def register_network(commands) -> None:
    network = commands.add_parser(
        "network",
        help="launch a network of routers on loopback",
        description="Start the routers of a topology file on loopback, wait until "
        "their routes converge, and stop them all on Ctrl-C.",
    )
    network.add_argument("--topology", "-t", metavar="PATH", help="topology TOML file (default: the embedded 3-router triangle)")
    network.add_argument("--workdir", "-w", metavar="DIR", help="where configs and data go (default: ./network)")
    network.set_defaults(func=cmd_network)


def register_demo(commands) -> None:
    demo = commands.add_parser(
        "demo",
        help="the main job: kill a router mid-stream, prove nothing was lost (--rule: the delivery rule without a failure)",
        add_help=False,
    )
    demo.set_defaults(func=cmd_demo)


def cmd_network(args: argparse.Namespace) -> int:
    from eorouter_tools import topology

    return topology.main(args)


def cmd_demo(args: argparse.Namespace) -> int:
    # Client applications: they import proton's Container (and Spark), unlike the router.
    if "--rule" in args.rest:
        from eorouter_tools import demo  # the delivery rule across the network, no failure

        return demo.main([a for a in args.rest if a != "--rule"])
    from eorouter_tools import failover_demo  # the main job: a router dies, Spark proves nothing was lost

    return failover_demo.main(args.rest)
