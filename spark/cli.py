"""Command lines of the Spark side: ``reconcile`` and ``logs compact``.

``eorouter reconcile`` / ``eorouter logs compact`` (router/cli.py) and
``python -m spark ...`` / ``spark-submit spark/reconcile.py`` all land here; the job
itself, once the command line is read, is spark/job.py's ``run_reconcile``.

Exit codes of reconcile: 0 proven clean, 1 violations found (the first ones are
printed), 2 bad command line or unreadable input.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

EXIT_CLEAN, EXIT_VIOLATIONS, EXIT_USAGE = 0, 1, 2


def add_reconcile_arguments(parser: argparse.ArgumentParser, default_master: str | None = "local[*]") -> None:
    parser.add_argument(
        "logdirs",
        nargs="+",
        metavar="LOGDIR",
        help="a router's data directory, a directory of them, an events/ directory or file, "
        "a Parquet dataset from 'eorouter logs compact', or any URI Spark reads",
    )
    parser.add_argument(
        "--clients", metavar="DIR", help="the applications' ledgers (docs/ledger.md), one JSON-lines file per client"
    )
    parser.add_argument(
        "--master", default=default_master, help="Spark master (default: %(default)s; under spark-submit, spark-submit's)"
    )
    parser.add_argument(
        "--out", metavar="DIR", default="reconcile-report", help="where report.json and report.html go (default: ./%(default)s)"
    )
    parser.add_argument(
        "--format",
        default="auto",
        choices=("auto", "json", "parquet"),
        help="input format (default: by what the directories hold)",
    )
    parser.add_argument(
        "--first", type=int, default=20, metavar="N", help="violations of each check kept in the report (default %(default)s)"
    )
    parser.add_argument(
        "--partitions",
        type=int,
        metavar="N",
        help="hash partitions of delivery ids (default: ~200,000 events each, from the input "
        "size; at least spark.sql.shuffle.partitions)",
    )
    parser.add_argument("--no-html", action="store_true", help="skip report.html")
    parser.add_argument(
        "--conf",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="extra Spark configuration, e.g. --conf spark.driver.memory=4g (repeatable)",
    )


def _conf(pairs: list[str]) -> dict[str, str]:
    conf = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep:
            raise ValueError(f"--conf {pair!r}: expected KEY=VALUE")
        conf[key.strip()] = value.strip()
    return conf


def reconcile_main(
    argv: list[str] | None = None, default_master: str | None = "local[*]", args: argparse.Namespace | None = None
) -> int:
    if args is None:
        parser = argparse.ArgumentParser(
            prog="reconcile", description="Prove exactly-once from the routers' event logs (docs/reconcile.md)."
        )
        add_reconcile_arguments(parser, default_master)
        args = parser.parse_args(argv)
    try:
        conf = _conf(args.conf)
    except ValueError as exc:
        print(f"eorouter reconcile: {exc}", file=sys.stderr)
        return EXIT_USAGE
    from spark import load, reconcile, report
    from spark.job import run_reconcile

    try:
        sources = load.resolve(args.logdirs, args.format)  # fail fast, before starting Spark
        if args.clients:
            load.resolve_ledgers(args.clients)
    except load.InputError as exc:
        print(f"eorouter reconcile: {exc}", file=sys.stderr)
        return EXIT_USAGE
    spark = load.get_session(args.master, conf=conf, events=load.estimate_events(sources))
    try:
        result = run_reconcile(
            spark,
            args.logdirs,
            clients=args.clients,
            out=args.out,
            fmt=args.format,
            first=args.first,
            partitions=args.partitions,
            html=not args.no_html,
        )
    except load.InputError as exc:
        print(f"eorouter reconcile: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except reconcile.HashCollision as exc:
        print(f"eorouter reconcile: cannot prove: these names have one 64-bit hash: {exc}", file=sys.stderr)
        return EXIT_USAGE
    print(report.render_terminal(result), flush=True)
    return EXIT_CLEAN if result["verdict"]["proven_clean"] else EXIT_VIOLATIONS


def add_compact_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("logdirs", nargs="+", metavar="LOGDIR", help="as for reconcile (JSON-lines logs)")
    parser.add_argument("--out", required=True, metavar="DIR", help="the Parquet dataset to write")
    parser.add_argument("--master", default="local[*]", help="Spark master (default: %(default)s)")
    parser.add_argument("--files", type=int, default=0, metavar="N", help="Parquet files to write (default: one per ~1 M lines)")
    parser.add_argument("--overwrite", action="store_true", help="replace DIR if it exists")
    parser.add_argument(
        "--conf",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="extra Spark configuration, e.g. --conf spark.driver.memory=4g (repeatable)",
    )


def compact_main(argv: list[str] | None = None, args: argparse.Namespace | None = None) -> int:
    if args is None:
        parser = argparse.ArgumentParser(prog="logs compact", description="Event logs to Parquet.")
        add_compact_arguments(parser)
        args = parser.parse_args(argv)
    from spark import compact, load

    try:
        conf = _conf(args.conf)
        load.resolve(args.logdirs, "json")
    except (ValueError, load.InputError) as exc:
        print(f"eorouter logs compact: {exc}", file=sys.stderr)
        return EXIT_USAGE
    if Path(args.out).exists() and not args.overwrite:
        print(f"eorouter logs compact: {args.out} exists (--overwrite to replace it)", file=sys.stderr)
        return EXIT_USAGE
    spark = load.get_session(args.master, app_name="eorouter-compact", conf=conf)
    info = compact.compact(spark, args.logdirs, args.out, files=args.files)
    print(
        f"eorouter logs compact: {info['lines']:,} lines from {info['inputs']} input(s) -> {args.out} "
        f"({info['files']} Parquet file(s), {info['bytes'] / 1e6:.1f} MB; JSON was {info['json_bytes'] / 1e6:.1f} "
        f"MB) in {info['seconds']:.1f} s"
    )
    for torn in info["torn"]:
        print(f"  torn last line {torn['file']}:{torn['line']} left out (a crash cut the router's last write)")
    if info["malformed_lines"]:
        print(f"  {info['malformed_lines']} malformed line(s) kept for the reconciliation to report")
    return 0
