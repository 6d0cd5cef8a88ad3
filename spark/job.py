"""The reconciliation job, end to end, on a Spark session it is given: read the inputs,
run every proof (spark/reconcile.py), and make the report (spark/report.py).

Its callers: the command line (spark/cli.py: ``eorouter reconcile``, ``python -m spark
reconcile``, ``spark-submit spark/reconcile.py``), the class archive's training run
(spark/jvm_dump.py), the benchmark and the tests. It lives apart from the command line so
that none of them imports the command line to run it, and the proofs never do.
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark.sql import DataFrame


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

    from spark import load, reconcile, report, streamorder

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
    ledgers_read = None
    t = None
    # Most of a small input's time is the driver planning queries one after the other, on
    # one core of two: what does not wait on another's result is planned in a second
    # thread (the vocabularies beside the ledgers' read; the summary, its figures and the
    # ledgers' proofs beside the routers' proofs).
    pool = ThreadPoolExecutor(max_workers=2, thread_name_prefix="eorouter-proof")
    try:
        pool.submit(reconcile.plan_vocabularies, spark)  # (prepare() waits for it, or plans them itself)
        if html and summary:
            pool.submit(report.load_plotting)
        if clients:  # read once (only the fields the checks read): by the per-delivery pass and the ledger checks
            # Kept as rows (a local checkpoint), not as a columnar cache: building the
            # columnar cache's compression statistics cost ~1.7x as much, and the checks
            # read most of the columns anyway.
            ledgers, ledgers_read = reconcile.kept_ledgers(spark, clients, storage)
        t = reconcile.prepare(spark, sources, partitions=partitions, storage=storage, ledgers=ledgers)
        if clients:
            t.ledger_bytes = load.largest_ledger(clients)
        phases["partitions"] = partitions
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
        tables = t
        draw = bool(out and html)

        def summary_and_figures() -> tuple[dict, dict | None]:
            summarized = report.summarize(tables, deliveries)
            return summarized, report.drawn(summarized) if draw else None

        def ledgers_proofs(ledgers) -> tuple[DataFrame, DataFrame]:
            # (planned here while the routers' proofs are planned in the caller's thread;
            # the join of what publishers were told is read once, by the proofs: not kept)
            told = reconcile.app_outcomes(tables, ledgers)
            return told, reconcile.union_all(reconcile.ledger_violations(tables, ledgers, told))

        pending = pool.submit(summary_and_figures) if summary else None
        ledger_side = pool.submit(ledgers_proofs, ledgers) if ledgers is not None else None
        in_deliveries = t.bad_in_deliveries.get if t.bad_in_deliveries is not None else {}
        bad_total = max(t.input["bad_count"], in_deliveries.get("bad") or 0)
        located, bad_total = reconcile.find_bad_lines(spark, sources) if bad_total else ([], 0)
        input_rows, torn = reconcile.input_violations(t, located, bad_total)
        found = reconcile.union_all(reconcile.delivery_violations(t))
        if ledger_side is not None:
            app, also = ledger_side.result()
            found = found.unionByName(also)
        try:
            counts, firsts = _collected(found, input_rows, first, t.names)
        except Exception as error:  # noqa: BLE001 (Py4J's and PySpark's errors both carry Spark's)
            if not (t.java_order and streamorder.is_out_of_range(error)):
                raise
            t.java_order = False  # (publisher order by the SQL window: spark/streamorder.py)
            found = reconcile.union_all(reconcile.delivery_violations(t))
            if ledgers is not None and app is not None:
                found = found.unionByName(reconcile.union_all(reconcile.ledger_violations(t, ledgers, app)))
            counts, firsts = _collected(found, input_rows, first, t.names)
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
        summarized, figs = pending.result() if pending is not None else (None, None)
        lap("summary")
    finally:
        # (the pool's work done, or failed, before the tables it reads are freed)
        pool.shutdown(wait=True, cancel_futures=True)
        if t is not None:
            t.unpersist()
        if ledgers is not None:
            reconcile.release(ledgers)
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
        # Which first read ran: the Java scan, or Spark SQL and why (spark/linescan.py).
        "first_read": t.input.get("first_read"),
        # And which read made the ledgers' rows (with --clients): Java, or Spark SQL and why.
        "ledgers_read": ledgers_read,
        "rules": t.rules,
        # And which judged publisher order: Java after a radix sort, or Spark SQL's window and why.
        "order_rules": streamorder.which(spark, t.java_order),
        "out": str(out) if out else None,
    }
    if out and summarized is not None:
        path = Path(out)
        path.mkdir(parents=True, exist_ok=True)
        report.write_json(result, path / "report.json")
        if html:
            report.write_html(result, path / "report.html", figs)
            lap("report files")
            result["elapsed_s"] = time.monotonic() - started
            report.write_json(result, path / "report.json")
    return result


def _collected(found: DataFrame, input_rows: list[dict], first: int | None, names) -> tuple[dict, list[dict]]:
    from pyspark import StorageLevel

    from spark import report

    found = found.persist(StorageLevel.MEMORY_AND_DISK)  # (few rows, read twice)
    try:
        return report.collect_violations(found, input_rows, first, names)
    finally:
        found.unpersist()


#: About this many events per partition of delivery ids (sorted in memory by one
#: task; a 1200 MB local driver runs two such tasks at once).
EVENTS_PER_PARTITION = 500_000
#: Above this many events the cached tables go to local disk (DISK_ONLY).
MEMORY_CACHE_EVENTS = 2_000_000
