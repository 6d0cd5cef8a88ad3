"""Command lines of the Spark side: ``reconcile`` and ``logs compact``.

``eorouter reconcile`` / ``eorouter logs compact`` (router/cli.py) and
``python -m spark ...`` / ``spark-submit spark/reconcile.py`` all land here.

Exit codes of reconcile: 0 proven clean, 1 violations found (the first ones are
printed), 2 bad command line or unreadable input.
"""

from __future__ import annotations

import argparse
import sys
import time
from concurrent.futures import ThreadPoolExecutor
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


def run_reconcile(
    spark,
    inputs: list[str],
    *,
    clients: str | None = None,
    out: str | Path | None = None,
    fmt: str = "auto",
    first: int | None = 20,
    partitions: int | None = None,
    html: bool = True,
    summary: bool = True,
) -> dict:
    """Run every proof; return the report (a dict, also written to ``out``).
    ``summary`` False skips the figures of the report (tests that only need the
    verdict); ``first`` None keeps every violation. Raises load.InputError when the
    inputs hold no event at all."""
    from pyspark import StorageLevel

    from spark import load, reconcile, report

    started = time.monotonic()
    phases: dict[str, float] = {}

    def lap(name: str, since: list = [started]) -> None:  # noqa: B006 (a running clock)
        now = time.monotonic()
        phases[name] = round(now - since[0], 2)
        since[0] = now

    sources = load.resolve(inputs, fmt)
    estimate = load.estimate_events(sources)
    if not partitions:
        default = int(spark.conf.get("spark.sql.shuffle.partitions"))
        partitions = max(2 if (estimate or 0) < load.SMALL_INPUT_EVENTS else default, -(-(estimate or 0) // EVENTS_PER_PARTITION))
    # The per-delivery facts (one row per delivery) are cached; on local disk for a
    # large input, so that a small driver holds any size.
    big = estimate is None or estimate > MEMORY_CACHE_EVENTS
    storage = StorageLevel.DISK_ONLY if big else StorageLevel.MEMORY_AND_DISK
    ledgers = app = None
    if clients:  # read once (only the fields the checks read): by the per-delivery pass and the ledger checks
        ledgers = load.load_ledgers(spark, clients).persist(storage)
    t = reconcile.prepare(spark, sources, partitions=partitions, storage=storage, ledgers=ledgers)
    phases["partitions"] = partitions
    pool = None
    try:
        if not t.epochs:
            bad = t.input["bad_count"]
            listed, _ = reconcile.find_bad_lines(spark, sources, first=1) if bad else ([], 0)
            where = f"{listed[0]['file']}:{listed[0]['line']}: {listed[0]['problem']}" if listed else ""
            raise load.InputError(
                f"no events in {', '.join(str(s) for s in sources)}: "
                + (
                    f"{t.input['lines']:,} line(s), none of them an event (the first: {where})"
                    if bad
                    else "the log files are empty"
                )
            )
        lap("read the input, check lines and seq")
        deliveries = t.compute_facts()
        lap("per delivery")
        # The summary's few jobs run beside the proofs': most of a small input's time
        # is the driver planning queries one after the other, and there are 2+ cores.
        pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="eorouter-summary")
        pending = pool.submit(report.summarize, t, deliveries) if summary else None
        if html:
            pool.submit(report.load_plotting)
        in_deliveries = t.bad_in_deliveries.get if t.bad_in_deliveries is not None else {}
        bad_total = max(t.input["bad_count"], in_deliveries.get("bad") or 0)
        located, bad_total = reconcile.find_bad_lines(spark, sources) if bad_total else ([], 0)
        input_rows, torn = reconcile.input_violations(t, located, bad_total)
        app = reconcile.app_outcomes(t, ledgers).persist(storage) if ledgers is not None else None
        found = reconcile.all_violations(t, ledgers, app).persist(StorageLevel.MEMORY_AND_DISK)
        counts, firsts = report.collect_violations(found, input_rows, first, t.names)
        found.unpersist()
        if firsts:
            unknown = {v["subscriber"] for v in firsts if v.get("subscriber") is not None} - set(t.names.subscribers)
            if unknown:  # a subscriber no router saw attach: read its name (cold path)
                t.names.subscribers.update(reconcile.subscriber_names(spark, sources, unknown))
            firsts = reconcile.decode_all(firsts, t.names)
        if app is not None and ledgers is not None and firsts:
            report.add_message_ids(firsts, app, ledgers)
        for v in firsts:
            v["detail"] = reconcile.describe(v)
        lap("proofs")
        summarized = pending.result() if pending is not None else None
        lap("summary")
    finally:
        if pool is not None:
            pool.shutdown(wait=True)  # before the facts it reads are freed
        t.unpersist()
        for frame in (ledgers, app):
            if frame is not None:
                frame.unpersist()
    result = {
        "generated": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
        "inputs": [str(s) for s in sources] + ([f"ledgers:{clients}"] if clients else []),
        "first": first,
        "torn_lines": len(torn),
        "torn": torn,
        # Resends the routers refused because they had forgotten the stream (docs/resumption.md): not a
        # violation (the delivery is judged as delivered once), but the edge of the guarantee, so shown
        "beyond_horizon": t.input["kinds"].get("resend-beyond-horizon", 0),
        "counts": counts,
        "verdict": report.verdict(counts, ledgers is not None),
        "violations": firsts,
        "summary": summarized,
        "elapsed_s": time.monotonic() - started,
        "phases_s": phases,
        "out": str(out) if out else None,
    }
    if out and summarized is not None:
        path = Path(out)
        path.mkdir(parents=True, exist_ok=True)
        report.write_json(result, path / "report.json")
        if html:
            report.write_html(result, path / "report.html")
            lap("report files")
            result["elapsed_s"] = time.monotonic() - started
            report.write_json(result, path / "report.json")
    return result


#: About this many events per partition of delivery ids (sorted in memory by one
#: task; a 1200 MB local driver runs two such tasks at once).
EVENTS_PER_PARTITION = 500_000
#: Above this many events the cached tables go to local disk (DISK_ONLY).
MEMORY_CACHE_EVENTS = 2_000_000


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
