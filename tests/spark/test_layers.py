"""The per-delivery projection is built in layers (spark/reconcile.py ``layers``): one Spark
projection per depth of dependence among its columns, not one per group as the code lists
them, because each projection above the aggregation rewrites the whole row
(docs/benchmarks.md, "Fewer projections per delivery")."""

from __future__ import annotations

from test_strict_read import _logs

from spark import load, reconcile


def test_columns_are_grouped_by_what_they_use():
    columns = ["1 AS a", "a + 1 AS b", "2 AS c", "b + c AS d", "length('ab') AS e", "size(filter(x, a_ -> a_ > 0)) AS f"]
    assert reconcile.layers(columns) == [
        ["1 AS a", "2 AS c", "length('ab') AS e", "size(filter(x, a_ -> a_ > 0)) AS f"],
        ["a + 1 AS b"],
        ["b + c AS d"],
    ]


def test_a_column_is_never_placed_before_one_it_uses():
    columns = [f"{'c%d + ' % (i - 1) if i else ''}1 AS c{i}" for i in range(6)]
    assert reconcile.layers(columns) == [[c] for c in columns]


def test_the_per_delivery_rows_take_few_projections(spark, tmp_path):
    t = reconcile.prepare(spark, load.resolve(_logs(tmp_path, settled=False)), partitions=2)
    try:
        plan = t.facts._jdf.queryExecution().optimizedPlan().toString()
    finally:
        t.unpersist()
    above_aggregation = plan.split("Aggregate [")[0]
    # Five layers, the last merged with the final selection; written as one projection per
    # group of columns the same rules took ten (Spark merges only the cheap ones).
    assert above_aggregation.count("Project [") <= 5, above_aggregation
