"""The per-delivery rules in Java (spark/deliveryrules.py, DeliveryRules.java) against
their specification, the SQL projection (spark/reconcile.py ``delivery_facts``): the
same row for every delivery — every column, every violation, every ``info`` text —

- on a real run of three routers, with and without the applications' ledgers;
- on generated histories carrying every fault the generator knows (each check's
  violations, with their excuses: restarts, detaches, expiries, refused resends,
  at-least-once repeats, folded and batched lines), and on hypothesis' histories;
- on every mutation of the audit's, or the Java rules leave the input to SQL (a
  delivery outside their shape) and the facts are the SQL's.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shutil
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from java_classes import require
from mutations import MUTATIONS, Copy
from test_histories import specs as history_specs  # (its generated histories' strategy)

from spark import deliveryrules, jar, load, reconcile
from spark.generate import FAULTS, LEDGER_FAULTS, CannotInject, Spec, generate

CI = os.environ.get("HYPOTHESIS_PROFILE") == "ci"


@pytest.fixture(scope="module", autouse=True)
def rules(spark):
    require(spark, "DeliveryRules")


def _rows(frame) -> dict:
    return {r["delivery"]: r.asDict(recursive=True) for r in frame.collect()}


def _events(spark, sources: list, small: dict, ledgers):
    """The per-delivery pass's rows by the SQL read (narrow(unfold()), the ledgers'
    `delivered` lines with them): the one input both rules are given here."""
    from pyspark.sql import functions as F

    lines = load.load_lines(spark, sources, reconcile.DELIVERY_READ)
    lines = lines.where(F.col("delivery").isNotNull() | F.col("deliveries").isNotNull())
    events = reconcile.narrow(reconcile.unfold(lines.withColumn("_bad", reconcile.bad(lines))), small["windows"])
    return events.unionByName(reconcile.app_events(ledgers)) if ledgers is not None else events


def twin(spark, routers: list[str], clients: str | None) -> tuple[dict | None, dict, str]:
    """Every delivery's facts by the Java rules and by the SQL rules, over the same rows
    of the one shuffle; and which rules the job would run. The Java side is None when
    it leaves the input to SQL (UNUSUAL)."""
    sources = load.resolve(routers)
    ledgers = load.load_ledgers(spark, clients) if clients else None
    t = reconcile.prepare(spark, sources, ledgers=ledgers)
    events = _events(spark, sources, t.small, ledgers)
    java = deliveryrules.facts(
        spark,
        reconcile.hashed_deliveries(events, 4),
        reconcile.rules_vocabulary(spark, ledgers is not None),
        reconcile.rules_constants(t.small, t.missing),
    )
    sql = reconcile.delivery_facts(
        reconcile.group_deliveries(events, 4), reconcile.Constants(t.small, t.missing), ledgers is not None
    )
    try:
        java_rows = _rows(java)
    except Exception as error:  # noqa: BLE001 (Py4J's error carries the job's)
        if not deliveryrules.is_unusual(error):
            raise
        java_rows = None
    return java_rows, _rows(sql), t.rules


def as_the_job_runs(t) -> tuple[dict, dict]:
    """The facts compute_facts() keeps (asserting the Java rules made them), and the
    SQL rules' over the same read."""
    assert t.rules == deliveryrules.JAVA and t.sql_rules is not None
    sql_rules = t.sql_rules
    t.compute_facts()
    try:
        assert t.rules == deliveryrules.JAVA
        return _rows(t.facts), _rows(sql_rules()[0])
    finally:
        t.unpersist()


def assert_same(java: dict, sql: dict) -> None:
    assert java.keys() == sql.keys()
    differ = [d for d in sql if java[d] != sql[d]]
    if differ:
        d = differ[0]
        columns = {k: (java[d][k], sql[d][k]) for k in sql[d] if java[d][k] != sql[d][k]}
        pytest.fail(f"{len(differ)} deliveries differ; {d}: (java, sql) {columns}")


def checks(rows: dict) -> set[str]:
    return {v["check"] for r in rows.values() for v in r["v"]}


def test_the_schema_is_the_sql_rules(spark, real_run):
    from pyspark.sql.types import _parse_datatype_string

    sources = load.resolve(real_run["routers"])
    for ledgers in (None, load.load_ledgers(spark, real_run["clients"])):
        t = reconcile.prepare(spark, sources, ledgers=ledgers)
        sql, _ = t.sql_rules()
        assert sql.schema.simpleString() == reconcile.FACTS_SCHEMA
        assert t.facts.schema == _parse_datatype_string(reconcile.FACTS_SCHEMA)


@pytest.mark.parametrize("ledgers", [True, False])
def test_a_real_runs_facts_are_the_sql_rules(spark, real_run, ledgers):
    """As the job runs them (compute_facts, over the Java scan's rows) and over the SQL
    read's rows."""
    sources = load.resolve(real_run["routers"])
    t = reconcile.prepare(spark, sources, ledgers=load.load_ledgers(spark, real_run["clients"]) if ledgers else None)
    java, sql = as_the_job_runs(t)
    assert len(sql) >= 20 and all(r["received"] for r in sql.values())
    assert_same(java, sql)
    java, sql, _ = twin(spark, real_run["routers"], real_run["clients"] if ledgers else None)
    assert java is not None
    assert_same(java, sql)


def test_deliveries_sharing_a_hash_and_events_out_of_order(spark, real_run):
    """The Java pass is given rows sorted by the delivery id's hash alone (a radix sort) and
    orders a hash's events itself: here every delivery shares its hash with a third of the
    others and a hash's events come in a random order, and the facts are still the SQL
    rules' (which group by hash and id, and sort each delivery's events in Spark)."""
    from pyspark.sql import functions as F

    sources = load.resolve(real_run["routers"])
    ledgers = load.load_ledgers(spark, real_run["clients"])
    t = reconcile.prepare(spark, sources, ledgers=ledgers)
    events = _events(spark, sources, t.small, ledgers).withColumn("h", F.col("h") % 3)
    shuffled = events.repartition(2, "h").sortWithinPartitions("h", F.rand(7))
    java = deliveryrules.facts(
        spark, shuffled, reconcile.rules_vocabulary(spark, True), reconcile.rules_constants(t.small, t.missing)
    )
    sql = reconcile.delivery_facts(reconcile.group_deliveries(events, 2), reconcile.Constants(t.small, t.missing), True)
    java_rows, sql_rows = _rows(java), _rows(sql)
    assert len(sql_rows) >= 20
    assert_same(java_rows, sql_rows)


def _histories(base: Path, specs: list[Spec], tries: int = 1) -> tuple[list[str], str]:
    """Several generated histories in one input (ids prefixed), their ledgers together.
    A history with no place for its faults is made again with the next seed, ``tries``
    times in all, then without them."""
    routers: list[str] = []
    clients = base / "clients"
    clients.mkdir(parents=True)
    for spec in specs:
        out = base / spec.prefix.rstrip(".")
        for attempt in range(tries + 1):
            if attempt == tries:
                spec.faults = ()
            try:
                info = generate(out, spec)
                break
            except CannotInject:
                shutil.rmtree(out)
                spec.seed += 1000
        routers += [str(out / r) for r in info["routers"]]
        for ledger in sorted(out.glob("clients/*.jsonl")):
            ledger.rename(clients / ledger.name)
    return routers, str(clients)


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_histories_with_every_fault_are_judged_alike(spark, tmp_path, seed):
    """Every fault the generator injects, two to a history, over restarts, detaches,
    expiries, rejects, refused resends, folded and batched lines and at-least-once
    topics: every per-delivery check but one finds something, and the rows agree."""
    faults = list(FAULTS + LEDGER_FAULTS)  # (the malformed-line ones too: both rules see the same SQL-read rows)
    pairs = [tuple(faults[i : i + 2]) for i in range(0, len(faults), 2)]
    specs = [
        Spec(
            routers=3,
            publishers=2,
            subscribers=3,
            topics=2,
            deliveries=40,
            round_size=8,
            seed=seed * 100 + n,
            prefix=f"h{n}.",
            p_restart=0.3,
            p_fold=0.5 if n % 2 else 0.0,
            p_batch=0.0 if n % 2 else 0.5,
            p_detach=0.5,
            p_reject=0.1,
            p_expire=0.1,
            p_refused=0.1,
            alo_topics=1 if n % 3 == 0 else 0,
            faults=injected,
        )
        for n, injected in enumerate(pairs)
    ]
    routers, clients = _histories(tmp_path, specs, tries=10)
    assert all(spec.faults for spec in specs)
    java, sql, _ = twin(spark, routers, clients)
    assert java is not None
    assert_same(java, sql)
    found = checks(sql)
    per_delivery = set(reconcile.ITEM) - {"duplicated", "out-of-order"}  # (both across deliveries here; the
    # mutations have a subscriber accepting one id twice)
    assert per_delivery <= found, per_delivery - found
    assert any(r["alo_dups"] for r in sql.values())


@settings(
    max_examples=2 if CI else 6,
    deadline=None,
    derandomize=CI,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.function_scoped_fixture],
)
@given(data=st.data())
def test_generated_histories_are_judged_alike(spark, tmp_path_factory, data):
    batch = [dataclasses.replace(data.draw(history_specs()), prefix=f"h{n}.") for n in range(4)]
    routers, clients = _histories(tmp_path_factory.mktemp("rules-histories"), batch)
    java, sql, _ = twin(spark, routers, clients)
    assert java is not None
    assert_same(java, sql)


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    import realrun

    return realrun.run(tmp_path_factory.mktemp("rules-run"), messages=8)


@pytest.mark.parametrize("name", sorted(MUTATIONS))
def test_each_mutation_is_judged_alike_or_left_to_sql(spark, run, tmp_path, name):
    """Over the same rows, the two rules agree, or the Java rules leave the input to SQL.
    (What the job then reports for each mutation: test_mutations.py.)"""
    copy = Copy.of(run, tmp_path / "logs")
    MUTATIONS[name](copy)
    dirs = copy.write()
    if not any(p.stat().st_size for d in dirs for p in Path(d, "events").glob("*.jsonl")):
        pytest.skip("no events left: the command refuses it before any read (test_mutations)")
    java, sql, how = twin(spark, dirs, str(tmp_path / "logs" / "clients"))
    if java is not None:
        assert_same(java, sql)
    else:
        assert how == deliveryrules.JAVA or how.startswith("spark-sql (")


def test_a_delivery_outside_the_java_rules_shape_is_judged_by_sql(spark, real_run, tmp_path):
    """A sub-outcome without its subscriber (well formed to the first read; the writer
    never writes one): the Java pass fails its job with UNUSUAL, compute_facts() runs
    the SQL rules instead, and report.json would say so."""
    base = tmp_path / "logs"
    dirs = []
    for d in real_run["routers"]:
        shutil.copytree(d, base / Path(d).name)
        dirs.append(str(base / Path(d).name))
    changed = False
    for path in sorted(Path(dirs[0], "events").glob("*.jsonl")):
        lines = path.read_bytes().splitlines(keepends=True)
        for i, line in enumerate(lines):
            event = json.loads(line)
            if event.get("event") == "sub-outcome" and not changed:
                del event["subscriber"]
                lines[i] = json.dumps(event, separators=(",", ":")).encode() + b"\n"
                changed = True
        path.write_bytes(b"".join(lines))
    assert changed
    t = reconcile.prepare(spark, load.resolve(dirs))
    assert t.rules == deliveryrules.JAVA
    sql_rules = t.sql_rules
    t.compute_facts()
    try:
        assert t.rules.startswith("spark-sql (a delivery outside the Java rules' shape (an event about a subscriber without one")
        sql_frame, _ = sql_rules()
        assert_same(_rows(t.facts), _rows(sql_frame))
    finally:
        t.unpersist()


def test_every_method_of_the_proofs_java_is_small_enough_to_be_compiled(tmp_path):
    """HotSpot never compiles a method of more than 8,000 bytes of bytecode
    (-XX:-DontCompileHugeMethods is off by default): such a method is interpreted for
    ever, ~10x slower. The rules were first one method of 8,935 bytes: 35 µs a delivery
    instead of 3."""
    import subprocess
    import zipfile

    javap = Path(jar.compiler()).with_name("javap")
    built = jar.build()
    assert built is not None
    with zipfile.ZipFile(built) as archive:
        archive.extractall(tmp_path)
    classes = sorted(str(p) for p in tmp_path.rglob("*.class"))
    listing = subprocess.run([str(javap), "-c", "-p", *classes], capture_output=True, text=True, check=True).stdout
    sizes: dict[str, int] = {}
    method = ""
    for line in listing.splitlines():
        if line.startswith("  ") and not line.startswith("   ") and "(" in line:
            method = line.strip()
        else:
            instruction = re.match(r"\s+(\d+): [a-z]", line)  # (not a switch's "key: target")
            if instruction:
                sizes[method] = int(instruction.group(1))
    assert len(sizes) > 50
    huge = {m: n for m, n in sizes.items() if n >= 8000}
    assert not huge, huge


def test_parquet_input_is_judged_by_the_java_rules(spark, real_run, tmp_path):
    """Parquet input reads in SQL; read strictly (the first read found no malformed line),
    it counts nothing the Java pass would have to report, so the Java rules judge it."""
    from spark.compact import compact

    compact(spark, real_run["routers"], str(tmp_path / "parquet"))
    t = reconcile.prepare(spark, load.resolve([str(tmp_path / "parquet")]), ledgers=load.load_ledgers(spark, real_run["clients"]))
    assert t.input["first_read"].startswith("spark-sql (Parquet input")
    assert t.bad_in_deliveries is None
    java, sql = as_the_job_runs(t)
    assert len(sql) >= 20
    assert_same(java, sql)
