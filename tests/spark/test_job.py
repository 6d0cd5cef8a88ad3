"""Spark used as Spark (issue 5, items 1 to 3): the job's plan keeps the events
partitioned by delivery id and runs no Python on the rows; the input may be any
path Spark reads (a glob, a file:// URI); report.html marks restarts and deaths
and lists the violations."""

from __future__ import annotations

import json
import shutil

import pytest

from spark.generate import Spec, generate
from spark.job import run_reconcile


@pytest.fixture(scope="module")
def history(tmp_path_factory):
    base = tmp_path_factory.mktemp("job") / "net"
    info = generate(base, Spec(deliveries=40, seed=5, round_size=10, p_restart=0.3, p_late=0.5))
    assert info["truth"] == {}
    return base, info


def test_the_driver_hashes_names_as_spark_does(spark):
    """The per-delivery rows carry names as Spark's xxhash64; the driver hashes the
    names it knows with spark_hash(): the two must agree on every string."""
    from hypothesis import given, settings
    from hypothesis import strategies as st
    from pyspark.sql import functions as F

    from spark.reconcile import spark_hash

    seen: list[str] = ["", "A", "router-é", "pub-1/pub-1-link", "日本語/リンク", "x" * 1000]

    @settings(max_examples=60, deadline=None)
    @given(st.text(max_size=80))
    def collect(name):
        seen.append(name)

    collect()
    rows = spark.createDataFrame([(n,) for n in seen], "n string").select("n", F.xxhash64("n").alias("h")).collect()
    assert [r["h"] for r in rows] == [spark_hash(r["n"]) for r in rows]


def _plan(df) -> str:
    return df._jdf.queryExecution().executedPlan().toString()


def test_plan_is_one_shuffle_by_delivery_without_python(spark, history):
    """The per-delivery pass reads the lines, shuffles them once by delivery id (its
    hash), sorts them and aggregates them in that order (no second shuffle, no
    second sort, no hash table of deliveries); the sequence check aggregates with a
    hash table (its partial step leaves one row per 64 lines); no Python runs on a
    row anywhere."""
    from spark import load, reconcile

    base, info = history
    adaptive = spark.conf.get("spark.sql.adaptive.enabled")
    # The plan as planned (adaptive execution re-plans stage by stage, on this shape).
    spark.conf.set("spark.sql.adaptive.enabled", "false")
    spark.conf.set("spark.sql.execution.replaceHashWithSortAgg", "true")  # as load.get_session() sets it
    try:
        sources = load.resolve([str(base / r) for r in info["routers"]])
        facts_in = reconcile.input_facts(spark, sources)
        small = reconcile.small_tables(facts_in["life"], facts_in["epochs"], hash)
        ledgers = load.load_ledgers(spark, str(base / "clients"))
        # (the SQL rules' plan: the Java rules read the same sorted shuffle, test_delivery_rules.py)
        facts, _ = reconcile.facts_frame(spark, sources, small, [], partitions=3, ledgers=ledgers, java_rules=False)
        plan = facts._jdf.queryExecution().executedPlan().toString()
        assert plan.count("Exchange") == 1 and "Exchange hashpartitioning(h#" in plan and ", 3)" in plan, plan
        assert plan.count("Sort [h#") == 1 and "SortAggregate(key=[h#" in plan, plan
        assert "HashAggregate" not in plan and "ObjectHashAggregate" not in plan, plan
        words = reconcile._words(load.load_lines(spark, sources, reconcile.ROUTER_READ))
        assert "SortAggregate" not in words._jdf.queryExecution().executedPlan().toString()
        t = reconcile.prepare(spark, sources, partitions=3, ledgers=ledgers)
        try:
            t.compute_facts()
            told = reconcile.app_outcomes(t, ledgers)
            violations = reconcile.all_violations(t, ledgers, told)
            text = violations._jdf.queryExecution().executedPlan().toString() + plan
            for python in ("BatchEvalPython", "ArrowEvalPython", "PythonUDF", "MapInPandas", "FlatMapGroupsInPandas"):
                assert python not in text
        finally:
            t.unpersist()
    finally:
        spark.conf.set("spark.sql.adaptive.enabled", adaptive)


def test_the_publishers_ledger_lines_are_shuffled_once(spark, history):
    """app_outcomes(): the publishers' ledger lines are partitioned by the keys of the
    join that follows and grouped in an order that begins with them, so that side of
    the join is shuffled and sorted once (Exchanges in the plan: the routers' side, the
    publishers that keep a ledger, and that one)."""
    from spark import load, reconcile

    base, info = history
    adaptive = spark.conf.get("spark.sql.adaptive.enabled")
    spark.conf.set("spark.sql.adaptive.enabled", "false")
    try:
        ledgers = load.load_ledgers(spark, str(base / "clients"))
        t = reconcile.prepare(spark, load.resolve([str(base / r) for r in info["routers"]]), partitions=3, ledgers=ledgers)
        try:
            t.compute_facts()
            plan = reconcile.app_outcomes(t, ledgers)._jdf.queryExecution().executedPlan().toString()
        finally:
            t.unpersist()
    finally:
        spark.conf.set("spark.sql.adaptive.enabled", adaptive)
    assert plan.count("Exchange hashpartitioning(") == 3, plan
    assert plan.count("Exchange hashpartitioning(client#") == 1 and "partial_max_by" not in plan, plan


@pytest.mark.parametrize("form", ["glob", "file-uri-glob"])
def test_input_may_be_any_path_spark_reads(spark, history, form):
    from spark.load import resolve

    base, info = history
    given = {"glob": f"{base}/*/events", "file-uri-glob": f"file://{base}/*"}[form]
    (source,) = resolve([given])
    assert source.remote and source.paths == [given]  # handed to Spark as is
    # file://…/* also matches clients/ and truth.json: only events-*.jsonl files are read.
    result = run_reconcile(spark, [given], clients=str(base / "clients"), first=None)
    assert result["verdict"]["proven_clean"], result["violations"][:5]
    assert result["summary"]["events"] == info["events"]
    assert result["summary"]["routers"] == info["routers"]


def test_report_marks_restarts_and_deaths_and_lists_violations(spark, history, tmp_path):
    base, info = history
    # One router dies at the end: its last epoch loses the `router-stopping` line and
    # what follows it (as if killed right there; seq stays gapless). Another history
    # with a dropped accept gives the report a violation.
    net = tmp_path / "net"
    shutil.copytree(base, net)
    victim = info["routers"][0]
    last = sorted((net / victim / "events").glob("events-*.jsonl"))[-1]
    lines = last.read_text().splitlines(keepends=True)
    cut = next(i for i, line in enumerate(lines) if '"event":"router-stopping"' in line)
    last.write_text("".join(lines[:cut]))
    bad = generate(tmp_path / "bad", Spec(deliveries=30, seed=8, prefix="x.", faults=("drop-accept",)))
    for ledger in (tmp_path / "bad" / "clients").glob("*.jsonl"):
        ledger.rename(net / "clients" / ledger.name)
    out = tmp_path / "report"
    result = run_reconcile(
        spark,
        [str(net / r) for r in info["routers"]] + [str(tmp_path / "bad" / r) for r in bad["routers"]],
        clients=str(net / "clients"),
        out=out,
    )
    assert result["counts"] == {"lost": {"rows": 1, "items": 1}}
    assert {v["item"] for v in result["violations"]} == set(bad["truth"]["lost"])
    epochs = result["summary"]["epochs"]
    died = [e for e in epochs if not e["stopped"]]
    assert [(e["router"], e["epoch"]) for e in died] == [(victim, max(e["epoch"] for e in epochs if e["router"] == victim))]
    assert any(e["epoch"] > 1 for e in epochs)  # restarts
    report = json.loads((out / "report.json").read_text())
    assert report["summary"]["latency_series"] and report["summary"]["series"]
    html = (out / "report.html").read_text()
    assert html.count("data:image/png;base64,") == 4  # router lives, rate per router, latency, per topic/subscriber
    assert "<script" not in html and "http://" not in html and "https://" not in html
    assert "died (or still running)" in html and "NOT clean" in html
    (lost,) = bad["truth"]["lost"]
    assert lost in html  # the violations table


def test_a_derived_schema_is_made_once_however_many_threads_ask(monkeypatch):
    """The job asks for the Java passes' schemas in a second thread while its first
    reads (spark/job.py); whichever asks second waits for the first's answer: one
    derivation, one answer for all."""
    import threading
    import time
    from concurrent.futures import ThreadPoolExecutor

    from spark import reconcile

    made = []

    def slow(spark):
        made.append(threading.current_thread().name)
        time.sleep(0.2)  # (long enough that every asker arrives while it runs)
        return '{"type": "struct", "fields": []}'

    monkeypatch.setitem(reconcile._DERIVATIONS, "narrowed", slow)
    real = reconcile._DERIVED.pop("narrowed", None)
    try:
        with ThreadPoolExecutor(max_workers=4) as pool:
            answers = list(pool.map(lambda _: reconcile._derived(None, "narrowed"), range(4)))
    finally:  # (the real schema, or none, for the tests after this one)
        reconcile._DERIVED.pop("narrowed", None)
        if real is not None:
            reconcile._DERIVED["narrowed"] = real
    assert len(made) == 1 and set(answers) == {'{"type": "struct", "fields": []}'}
