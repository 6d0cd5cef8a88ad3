"""The proofs that merge a publisher delivery's delivery ids (duplicates across ids,
publisher order, application order) skip their grouping when no publisher delivery was
received under more than one id (spark/reconcile.py ``Tables.multiple_ids``), the
usual case. The shortcut must find exactly what the grouping finds: each check here runs
both ways on the same facts, on generated histories with and without the faults those
checks exist for."""

from __future__ import annotations

import pytest
from pyspark import StorageLevel

from spark import load, reconcile
from spark.generate import Spec, generate

CASES = {
    "clean": (),
    "reorder": ("reorder",),  # sent out of publisher order: out-of-order, and the applications' order
    "dup-tag": ("dup-tag",),  # one publisher delivery under two ids: duplicated
}


@pytest.fixture(scope="module", params=sorted(CASES))
def tables(request, spark, tmp_path_factory):
    base = tmp_path_factory.mktemp(f"ids-{request.param}") / "net"
    generate(base, Spec(deliveries=60, seed=11, round_size=10, faults=CASES[request.param]))
    ledgers = reconcile.materialize(load.load_ledgers(spark, str(base / "clients")), StorageLevel.MEMORY_AND_DISK)
    t = reconcile.prepare(spark, load.resolve([str(base)]), partitions=2, ledgers=ledgers)
    t.compute_facts()
    yield request.param, t, ledgers
    t.unpersist()
    reconcile.release(ledgers)


def _found(frame) -> list[tuple]:
    return sorted(tuple(r) for r in frame.select("check", "kind", "delivery", "router", "subscriber", "seq").collect())


def _both_ways(t: reconcile.Tables, check) -> tuple[list, list]:
    asked = t.multiple_ids()
    shortcut = _found(check())
    t._multiple_ids = True  # as if some delivery had two ids: the grouping runs
    try:
        grouped = _found(check())
    finally:
        t._multiple_ids = asked
    return shortcut, grouped


def test_only_a_delivery_under_two_ids_takes_the_grouping(tables):
    name, t, _ = tables
    assert t.multiple_ids() is (name == "dup-tag")


def test_publisher_order_is_judged_alike_either_way(tables):
    name, t, _ = tables
    shortcut, grouped = _both_ways(t, lambda: reconcile.out_of_order(t))
    assert shortcut == grouped
    assert bool(shortcut) is (name == "reorder")


def test_the_ledgers_are_judged_alike_either_way(tables):
    name, t, ledgers = tables
    told = reconcile.app_outcomes(t, ledgers)
    shortcut, grouped = _both_ways(t, lambda: reconcile.union_all(reconcile.ledger_violations(t, ledgers, told)))
    assert shortcut == grouped
    if name == "reorder":
        assert any(kind == "order" for _, kind, *_ in shortcut)


def test_duplicates_across_ids_are_found_only_through_the_grouping(tables):
    name, t, _ = tables
    found = _found(reconcile.duplicated_by_publisher(t))
    assert bool(found) is (name == "dup-tag")
