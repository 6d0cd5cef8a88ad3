"""The ``eorouter reconcile`` and ``eorouter logs compact`` commands, registered with
the router's command line through the ``eorouter.commands`` entry points
(pyproject.toml): the router never imports the proof. Registering imports only
argparse-level code; pyspark is imported when a command runs."""

from __future__ import annotations

import argparse


def register_reconcile(commands) -> None:
    from spark import cli as spark_cli

    reconcile = commands.add_parser(
        "reconcile",
        help="prove exactly-once from the routers' event logs (Spark)",
        description="Replay every router's event log with Spark and prove no loss, "
        "no duplicates, publisher order, nothing invented and a clean end. "
        "Exit 0 only when proven clean.",
    )
    spark_cli.add_reconcile_arguments(reconcile)
    reconcile.set_defaults(func=cmd_reconcile)


def register_logs(commands) -> None:
    from spark import cli as spark_cli

    logs = commands.add_parser("logs", help="event log tools").add_subparsers(dest="logs_command", metavar="LOGS_COMMAND")
    logs.required = True
    compact = logs.add_parser(
        "compact",
        help="turn event logs into Parquet (Spark)",
        description="Rewrite JSON-lines event logs as one Parquet dataset with the same schema; eorouter reconcile reads either.",
    )
    spark_cli.add_compact_arguments(compact)
    compact.set_defaults(func=cmd_logs_compact)


def cmd_reconcile(args: argparse.Namespace) -> int:
    from spark.cli import reconcile_main

    return reconcile_main(args=args)


def cmd_logs_compact(args: argparse.Namespace) -> int:
    from spark.cli import compact_main

    return compact_main(args=args)
