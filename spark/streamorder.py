"""Publisher order in plain Java inside the proof's Spark job: spark/java/eorouter/spark/StreamOrder.java.

The SQL (spark/reconcile.py ``_order_violations``) is a window over each group (a
subscriber's copies of one publisher stream, on a router or in its application's ledger)
sorted by the group and its order columns: Spark compares whole rows, as nearly every
two rows share the group, and the sort was most of the check's time. When the order
columns fit one long ``k`` (reconcile.py ``_send_key``, ``_ledger_key``), the rows are
sorted by ``k`` alone (Spark's radix sort) and StreamOrder keeps each group's running
maximum in one pass. The SQL stays the specification: tests/spark/test_stream_order.py
holds the two to the same rows.

The key's bounds come from the input (the epochs' highest seq, the largest ledger file);
a row outside them (a ledger file rewritten shorter while it was read, say) has no key,
and the pass fails its job with ``OUT_OF_RANGE``: the proof then judges publisher order
with the SQL window instead (spark/job.py).
"""

from __future__ import annotations

import os

from pyspark.sql import DataFrame

from spark import jar

#: StreamOrder.OUT_OF_RANGE: the job's error when a row's key is outside its bounds.
OUT_OF_RANGE = "eorouter: a publisher-order row outside its key's bounds"


def is_out_of_range(error: BaseException) -> bool:
    return OUT_OF_RANGE in str(error)


def available(spark) -> bool:
    from spark.linescan import _scanner

    return os.environ.get(jar.ENV, "") != "off" and _scanner(spark, "StreamOrder") is not None


def which(spark, java: bool) -> str:
    """report.json's ``order_rules``: "java", or "spark-sql" and why. (With "java", a
    check whose key does not fit one long, or whose bound is unknown, such as ledgers at
    a URI, still runs the window: reconcile.py ``_packed``.)"""
    if os.environ.get(jar.ENV, "") == "off":
        return f"spark-sql ({jar.ENV}=off)"
    if not available(spark):
        return "spark-sql (the Java classes are not on the driver's class path)"
    return "java" if java else "spark-sql (a row outside its key's bounds)"


def violations(keyed: DataFrame) -> DataFrame:
    """The rows of ``keyed`` (partitioned by ``g``, with the order key ``k``, ``stream_seq``
    and ``delivery``) out of publisher order, without ``k``, each with ``prev``
    (struct<stream_seq, delivery>: the highest of its group before it)."""
    from spark.linescan import _scanner

    spark = keyed.sparkSession
    order = _scanner(spark, "StreamOrder")
    return DataFrame(order.violations(spark._jsparkSession, keyed.sortWithinPartitions("k")._jdf), spark).drop("k")
