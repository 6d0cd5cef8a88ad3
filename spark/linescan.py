"""The proof's two reads of the routers' JSON lines in plain Java, inside its Spark job:
spark/java/eorouter/spark/LineScan.java (the first read) and DeliveryScan.java (the
per-delivery pass's read).

The first read (``reconcile.input_facts``) needs, of every line, only a few facts: is it
well formed, its router, epoch and seq (the sequence check), its kind (the counts), the
routers it names, and the whole of the few lines that name no delivery (links, peers,
routes). Spark's JSON reader and its aggregations spend ~2 µs of CPU a line on that
(docs/benchmarks.md); Jackson's streaming parser, folding each line straight into a few
counters and bit sets per partition, a fraction of it. It runs as a Spark job over the
text of the same files (so at any scale Spark reaches), and the driver merges the
partitions' facts. The second read makes, of each line, the rows ``unfold`` and
``narrow`` make, and hands them to the SQL rest of the pass as a DataFrame.

The scans answer only for input they can vouch for. A line that is not exactly the
writer's shape — not a JSON object, a field of another JSON type than the schema's, a
field twice, anything the proof calls malformed (``reconcile.bad``) — makes the first
decline (``unusual``), and both reads run in Spark SQL, the specification, which names
and judges every such line. So a line the scan accepts is one Spark's JSON reader reads
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

from spark import jar

#: Why the first read ran in Spark SQL (report.json's ``first_read``), or "java".
JAVA = "java"


def _scanner(spark, name: str = "LineScan"):
    """One of the scans' classes in the session's JVM, or None (no jar on its class path)."""
    from py4j.java_gateway import JavaClass

    found = getattr(spark._jvm.eorouter.spark, name)
    return found if isinstance(found, JavaClass) else None


def scan(spark, sources: list, vocabulary: dict) -> tuple[dict | None, str]:
    """The scan's facts of the JSON ``sources`` and "java", or None and why the first
    read must run in Spark SQL instead. ``vocabulary``: what the scan checks lines
    against (spark/reconcile.py ``line_vocabulary``)."""
    if os.environ.get(jar.ENV, "") == "off":
        return None, f"spark-sql ({jar.ENV}=off)"
    if not sources or any(s.fmt != "json" for s in sources):
        return None, "spark-sql (Parquet input)"
    remote = {s.remote for s in sources}
    if len(remote) > 1:  # one scan reads with one set of options
        return None, "spark-sql (local files and URIs together)"
    scanner = _scanner(spark)
    if scanner is None:
        return None, (
            "spark-sql (the Java classes are not on the driver's class path: no javac to build them, they did not "
            "build, or spark-submit was not given them; python -m spark.jar, docs/reconcile.md)"
        )
    paths = [p for s in sources for p in s.paths]
    facts = json.loads(scanner.inputFacts(spark._jsparkSession, paths, json.dumps(vocabulary), remote.pop()))
    if facts["unusual_lines"]:
        return None, f"spark-sql ({facts['unusual_lines']:,} line(s) not in the writer's shape; the first: {facts['unusual']})"
    return facts, JAVA


#: The Java delivery scan's error when a line it reads is not in the writer's shape (the
#: files changed since the first read vouched for them): the pass is read again in SQL.
CHANGED = "eorouter: a line the first read's scan accepted is not in the writer's shape now"


def is_changed(error: BaseException) -> bool:
    return CHANGED in str(error)


def delivery_events(spark, sources: list, vocabulary: dict, deliveries: dict):
    """The per-delivery pass's narrowed rows (spark/reconcile.py ``_narrowed``) made by
    DeliveryScan.java, as a Java DataFrame; None when the scan is not there. Only for
    input the first read's scan vouched for (``scan``: "java")."""
    scanner = _scanner(spark, "DeliveryScan")
    if scanner is None or os.environ.get(jar.ENV, "") == "off":
        return None
    paths = [p for s in sources for p in s.paths]
    return scanner.events(spark._jsparkSession, paths, json.dumps(vocabulary), json.dumps(deliveries), sources[0].remote)
