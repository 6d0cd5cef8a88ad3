"""Publisher order in Java (spark/streamorder.py, StreamOrder.java) against its
specification, the SQL window (spark/reconcile.py ``_order_violations``): the same rows

- on generated groups (hypothesis): groups interleaved over partitions, equal
  stream_seqs that the delivery id breaks, null stream_seqs and ids, nested columns;
- on generated histories with reordered sends and ledger lines, as the job plans both
  checks (a subscriber's copies on a router, an application's ledger), with publisher
  deliveries under one id and under several;
- and a row outside its key's bounds fails the Java job, after which the job judges
  publisher order with the window and reaches the same verdict.
"""

from __future__ import annotations

import os

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from java_classes import require
from pyspark.sql import functions as F
from pyspark.sql import types as T
from test_delivery_rules import _histories

from spark import load, reconcile
from spark.generate import Spec
from spark.job import run_reconcile

CI = os.environ.get("HYPOTHESIS_PROFILE") == "ci"


@pytest.fixture(scope="module", autouse=True)
def java(spark):
    require(spark, "StreamOrder")


SCHEMA = T.StructType(
    [
        T.StructField("g", T.LongType()),
        T.StructField("epoch", T.LongType()),
        T.StructField("seq", T.LongType()),
        T.StructField("stream_seq", T.LongType()),
        T.StructField("delivery", T.StringType()),
        T.StructField("line", T.StructType([T.StructField("split", T.LongType()), T.StructField("row", T.LongType())])),
        T.StructField("subscriber", T.LongType()),
    ]
)
EPOCHS, SEQS = 3, 40


@st.composite
def groups(draw):
    """Rows of a few groups, each row at a distinct (epoch, seq) of its group (a log
    line sends one copy: the window's order among equal keys is Spark's, unspecified)."""
    places = draw(
        st.lists(
            st.tuples(st.integers(0, 3), st.integers(1, EPOCHS), st.integers(1, SEQS)),
            min_size=1,
            max_size=60,
            unique=True,
        )
    )
    rows = []
    for g, epoch, seq in places:
        stream_seq = draw(st.one_of(st.integers(0, 12), st.none()) if draw(st.integers(0, 9)) == 0 else st.integers(0, 12))
        delivery = draw(st.none() if draw(st.integers(0, 19)) == 0 else st.sampled_from(["d1", "d2", "d3", "d10", "e"]))
        rows.append((g, epoch, seq, stream_seq, delivery, (epoch * 100, seq), draw(st.integers(1, 3))))
    return rows


def _found(frame) -> list:
    return sorted((tuple(r.asDict(recursive=True).items()) for r in frame.collect()), key=repr)


@settings(
    max_examples=15 if CI else 60,
    deadline=None,
    derandomize=CI,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(rows=groups(), partitions=st.integers(1, 3))
def test_generated_groups_are_judged_alike(spark, rows, partitions):
    frame = spark.createDataFrame(rows, SCHEMA).repartition(partitions)
    order = ["epoch", "seq"]
    sql = reconcile._order_violations(frame, order)
    key = reconcile._packed(F.col("epoch"), F.col("seq"), EPOCHS, SEQS)
    java = reconcile._order_violations(frame, order, key, java=True)
    assert "LogicalRDD" in java._jdf.queryExecution().analyzed().toString()  # (the Java pass's rows)
    assert _found(java) == _found(sql)


def test_the_highest_before_breaks_equal_stream_seqs_by_delivery_and_skips_nulls(spark):
    """One group, in (epoch, seq) order: stream_seq 5 (d1), 5 (d3), null (d9), 5 (d2),
    4 (d4), null, 3 (d0). The window's highest before a row is (5, d3): struct order,
    nulls first; rows without a stream_seq are never out of order."""
    rows = [
        (1, 1, s, stream_seq, d, (0, s), 1)
        for s, (stream_seq, d) in enumerate(
            [(5, "d1"), (5, "d3"), (None, "d9"), (5, "d2"), (4, "d4"), (None, None), (3, "d0")], 1
        )
    ]
    frame = spark.createDataFrame(rows, SCHEMA)
    key = reconcile._packed(F.col("epoch"), F.col("seq"), EPOCHS, SEQS)
    for judged in (
        reconcile._order_violations(frame, ["epoch", "seq"]),
        reconcile._order_violations(frame, ["epoch", "seq"], key, java=True),
    ):
        found = sorted((r["delivery"], r["prev"]["stream_seq"], r["prev"]["delivery"]) for r in judged.collect())
        assert found == [("d0", 5, "d3"), ("d4", 5, "d3")]


def test_a_key_packs_its_pair_in_order_or_does_not_fit():
    assert reconcile._packed(F.col("a"), F.col("b"), (1 << 30) - 1, (1 << 33) - 1) is not None
    assert reconcile._packed(F.col("a"), F.col("b"), 1 << 30, (1 << 33) - 1) is None  # (64 bits)


def _spec(seed: int, prefix: str, faults: tuple) -> Spec:
    return Spec(
        routers=3, publishers=2, subscribers=3, topics=2, deliveries=40, round_size=8, seed=seed, prefix=prefix, faults=faults
    )


def _as_the_job(spark, routers: list[str], clients: str, java: bool) -> tuple[list, list]:
    t = reconcile.prepare(spark, load.resolve(routers), ledgers=load.load_ledgers(spark, clients))
    t.ledger_bytes = load.largest_ledger(clients)
    t.java_order = java
    t.compute_facts()
    try:
        return _found(reconcile.out_of_order(t)), _found(reconcile.ledger_checks(t, load.load_ledgers(spark, clients)))
    finally:
        t.unpersist()


@pytest.mark.parametrize("faults", [("reorder",), ("reorder", "dup-tag")], ids=["one-id", "several-ids"])
def test_reordered_histories_are_judged_alike(spark, tmp_path, faults):
    specs = [_spec(n + 7, f"h{n}.", faults) for n in range(3)]
    routers, clients = _histories(tmp_path, specs, tries=10)
    assert all(spec.faults for spec in specs)
    java = _as_the_job(spark, routers, clients, java=True)
    sql = _as_the_job(spark, routers, clients, java=False)
    assert java == sql
    sends, ledger = java
    assert sends and all(dict(r)["check"] == "out-of-order" for r in sends)
    assert any(dict(r)["kind"] == "order" for r in ledger)


def test_a_row_outside_its_keys_bounds_leaves_publisher_order_to_the_window(spark, tmp_path, monkeypatch):
    """A key's bound that a row exceeds (here: a ledger line's place in its split, said
    to be below 4): the Java pass fails its job, and the proof judges publisher order
    with the window, to the same verdict."""
    specs = [_spec(11, "h0.", ("reorder",))]
    routers, clients = _histories(tmp_path, specs, tries=10)
    whole = run_reconcile(spark, routers, clients=clients, out=tmp_path / "whole", html=False, summary=False)
    assert whole["order_rules"] == "java"
    monkeypatch.setattr(reconcile, "_LEDGER_ROWS", 3)
    bounded = run_reconcile(spark, routers, clients=clients, out=tmp_path / "bounded", html=False, summary=False)
    assert bounded["order_rules"] == "spark-sql (a row outside its key's bounds)"
    assert bounded["counts"] == whole["counts"] and bounded["verdict"] == whole["verdict"]
    assert whole["counts"].get("out-of-order") and whole["counts"].get("ledger")
