"""The proof's reads of the routers' JSON lines in plain Java, inside its Spark job:
spark/java/eorouter/spark/LineScan.java (the first read's facts), DeliveryScan.java (the
per-delivery pass's rows) and ReadOnce.java (both from one parse, as the job runs them).

The first read (``reconcile.input_facts``) needs, of every line, only a few facts: is it
well formed, its router, epoch and seq (the sequence check), its kind (the counts), the
routers it names, and the whole of the few lines that name no delivery (links, peers,
routes). Spark's JSON reader and its aggregations spend ~2 µs of CPU a line on that
(docs/benchmarks.md); Jackson's streaming parser, folding each line straight into a few
counters and bit sets per partition, a fraction of it. The per-delivery pass needs, of
each line, the rows ``unfold`` and ``narrow`` make. The job parses each line once for
both (``read_once``): one Spark job over the text of the files (so at any scale Spark
reaches) makes the rows and writes them into the one shuffle by delivery, and hands
each partition's facts to the driver, which merges them; the per-delivery rules read
the shuffle afterwards, with what the facts told (the epochs, the resume windows, the
missing routers). ``scan`` is the first read alone.

The scans answer only for input they can vouch for. A line that is not exactly the
writer's shape — not a JSON object, a field of another JSON type than the schema's, a
field twice, anything the proof calls malformed (``reconcile.bad``) — makes the scan
decline (``unusual``; the one parse's shuffle is dropped), and both reads run in Spark
SQL, the specification, which names and judges every such line. So a line the scan accepts is one Spark's JSON reader reads
whole, to the same values, and on such input the two give the same facts and rows
(tests/spark/test_line_scan.py holds them to it, on real routers' logs, on generated
histories and on every mutation of the audit's). The vocabulary the scans check
against (fields and their types, kinds, codes, folds) is sent from spark/reconcile.py
(``line_vocabulary``, ``delivery_vocabulary``): it is defined once, there and in
router/eventschema.py.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable

from pyspark.sql import DataFrame

from spark import jar

#: Why the first read ran in Spark SQL (report.json's ``first_read``), or "java".
JAVA = "java"


def _scanner(spark, name: str = "LineScan"):
    """One of the scans' classes in the session's JVM, or None (no jar on its class path)."""
    from py4j.java_gateway import JavaClass

    found = getattr(spark._jvm.eorouter.spark, name)
    return found if isinstance(found, JavaClass) else None


def _why_not(spark, sources: list, name: str) -> str | None:
    """Why the scan ``name`` cannot read ``sources`` (the reads then run in Spark SQL), or None."""
    if os.environ.get(jar.ENV, "") == "off":
        return f"spark-sql ({jar.ENV}=off)"
    if not sources or any(s.fmt != "json" for s in sources):
        return "spark-sql (Parquet input)"
    if len({s.remote for s in sources}) > 1:  # one scan reads with one set of options
        return "spark-sql (local files and URIs together)"
    if _scanner(spark, name) is None:
        return (
            "spark-sql (the Java classes are not on the driver's class path: no javac to build them, they did not "
            "build, or spark-submit was not given them; python -m spark.jar, docs/reconcile.md)"
        )
    return None


def _vouched(facts: dict) -> tuple[dict | None, str]:
    if facts["unusual_lines"]:
        return None, f"spark-sql ({facts['unusual_lines']:,} line(s) not in the writer's shape; the first: {facts['unusual']})"
    return facts, JAVA


def scan(spark, sources: list, vocabulary: dict) -> tuple[dict | None, str]:
    """The scan's facts of the JSON ``sources`` and "java", or None and why the first
    read must run in Spark SQL instead. ``vocabulary``: what the scan checks lines
    against (spark/reconcile.py ``line_vocabulary``)."""
    why = _why_not(spark, sources, "LineScan")
    if why is not None:
        return None, why
    paths = [p for s in sources for p in s.paths]
    facts = _scanner(spark).inputFacts(spark._jsparkSession, paths, json.dumps(vocabulary), sources[0].remote)
    return _vouched(json.loads(facts))


def read_once(
    spark, sources: list, vocabulary: dict, deliveries: dict, shuffle: Callable[[DataFrame], DataFrame]
) -> tuple[dict | None, str, DataFrame | None]:
    """Both reads as one parse (ReadOnce.java): the first read's facts, "java", and the
    per-delivery pass's rows already through ``shuffle`` (its map side run now: a frame
    that reads the shuffle's output). ``shuffle`` makes the one repartition by delivery
    of the rows (DeliveryScan's, narrow()'s schema). None, why and None when the reads
    must run in Spark SQL (as ``scan``)."""
    why = _why_not(spark, sources, "ReadOnce")
    if why is not None:
        return None, why, None
    scanner = _scanner(spark, "ReadOnce")
    paths = [p for s in sources for p in s.paths]
    once = scanner.scan(spark._jsparkSession, paths, json.dumps(vocabulary), json.dumps(deliveries), sources[0].remote)
    shuffled = DataFrame(scanner.mapSide(spark._jsparkSession, shuffle(DataFrame(once.rows(), spark))._jdf), spark)
    merged = once.facts()
    if merged is None:  # (a partition's facts did not come back: never expected)
        raise RuntimeError("eorouter: the one parse's map side finished without every partition's facts")
    facts, how = _vouched(json.loads(merged))
    return facts, how, shuffled if facts is not None else None


#: ReadOnce.CHANGED: the job's error when a partition read again (its shuffle output lost)
#: meets a line not in the writer's shape: the file changed since the driver took its facts.
CHANGED = "eorouter: a line the first read's scan accepted is not in the writer's shape now"


def is_changed(error: BaseException) -> bool:
    return CHANGED in str(error)


#: LedgerScan.UNUSUAL: the ledger scan's error when a ledger line is not in the writer's shape.
LEDGER_UNUSUAL = "eorouter: a ledger line not in the writer's shape"


def is_unusual_ledger(error: BaseException) -> bool:
    return LEDGER_UNUSUAL in str(error)


def unusual_ledger_why(error: BaseException) -> str:
    """LedgerScan's reason, from its job's error."""
    text = str(error)
    at = text.find(LEDGER_UNUSUAL)
    end = text.find(")", at)
    return text[at + len("eorouter: ") : end + 1] if at >= 0 and end > at else "a ledger line not in the writer's shape"


def ledger_rows(spark, paths: list[str], recursive: bool, schema: str) -> tuple[DataFrame | None, str]:
    """The ledgers at ``paths`` as spark/load.py ``load_ledgers`` reads them (``schema``:
    its rows' as JSON, ``ledger_rows_schema``: the same rows, over the same splits), by LedgerScan.java, and "java"; or
    None and why Spark SQL reads them. The scan's job fails with ``LEDGER_UNUSUAL`` at
    a line not in the writer's shape (the SQL read then reads them all)."""
    if os.environ.get(jar.ENV, "") == "off":
        return None, f"spark-sql ({jar.ENV}=off)"
    scanner = _scanner(spark, "LedgerScan")
    if scanner is None:
        return None, "spark-sql (the Java classes are not on the driver's class path)"
    return DataFrame(scanner.rows(spark._jsparkSession, paths, schema, recursive), spark), JAVA
