"""The per-delivery rules (spark/reconcile.py ``delivery_facts``) in plain Java inside the
proof's Spark job: spark/java/eorouter/spark/DeliveryRules.java.

The SQL projection decides every per-delivery invariant from one row per delivery, an
array of its events built by ``collect_list``, through ~60 higher-order expressions,
each a pass over that array, each writing its column again (docs/benchmarks.md: the
reduce side of the one shuffle was the largest single cost of the proof). The Java
pass reads the same sorted rows of the same shuffle, one delivery at a time, and makes
the same row: the same columns, the same violations, the same ``info`` text.

The SQL stays the specification: tests/spark/test_delivery_rules.py holds the two to
the same rows on real routers' logs, on generated histories and on every mutation of
the audit's. Where a delivery's events hold a null the writer never writes (an answer
without its subscriber, a list with a null in it, ...), Spark SQL's three-valued logic
decides in ways the Java does not follow; the Java pass then fails its job with
``UNUSUAL`` and the proof runs the SQL rules instead (``Tables.compute_facts``).

The job runs them over the Java scan's rows (input in the writer's shape) and over the
SQL read's when it is strict (no malformed line: Parquet input, say). Over a permissive
read the SQL rules run: it counts its malformed lines in an ``Observation``, which only
a Dataset's own action reports, not this pass's job.
"""

from __future__ import annotations

import json
import os

from pyspark.sql import DataFrame

from spark import jar

#: DeliveryRules.UNUSUAL: the job's error when a delivery is left to the SQL rules.
UNUSUAL = "eorouter: a delivery outside the Java rules' shape"
#: report.json's ``rules`` when the Java pass made the facts.
JAVA = "java"


def is_unusual(error: BaseException) -> bool:
    return UNUSUAL in str(error)


def available(spark) -> bool:
    from spark.linescan import _scanner

    return os.environ.get(jar.ENV, "") != "off" and _scanner(spark, "DeliveryRules") is not None


def facts(spark, hashed: DataFrame, vocabulary: dict, constants: dict) -> DataFrame:
    """delivery_facts()' rows from ``hashed`` (narrow()'s rows in the one shuffle's
    partitions, sorted by the delivery id's hash: reconcile.hashed_deliveries), made by
    DeliveryRules.java.
    ``vocabulary``: reconcile.rules_vocabulary(); ``constants``: the small tables."""
    from spark.linescan import _scanner

    rules = _scanner(spark, "DeliveryRules")
    return DataFrame(rules.facts(spark._jsparkSession, hashed._jdf, json.dumps(vocabulary), json.dumps(constants)), spark)
