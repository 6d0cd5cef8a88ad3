"""The first read's Java scan (spark/linescan.py, spark/java/eorouter/spark/LineScan.java)
against its specification, the first read in Spark SQL (spark/reconcile.py ``_read_facts``):

- on input in the writer's shape (a real run of three routers, generated histories with
  restarts, gaps and repeats) the two find exactly the same facts, and the scan is what ran;
- on every mutation of the audit's, the scan either declines (and SQL runs) or finds
  exactly what SQL finds;
- line by line (hypothesis: lines of the writer's broken in every way a field, a byte or
  an editor can break them), a line the scan accepts is one Spark's JSON reader reads
  whole, well formed by the proof's rule, to the same value in every field: the property
  that makes the scan's answers the specification's.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from java_classes import require
from mutations import MUTATIONS, Copy

from spark import jar, linescan, load, reconcile
from spark.generate import Spec, generate
from spark.schema import CORRUPT, FILE

CI = os.environ.get("HYPOTHESIS_PROFILE") == "ci"


@pytest.fixture(scope="module", autouse=True)
def scanner(spark):
    require(spark, "LineScan")


def read_once(spark, sources: list, partitions: int = 3):
    """linescan.read_once as prepare() runs it: (facts, how, the shuffled rows)."""
    return linescan.read_once(
        spark,
        sources,
        reconcile.line_vocabulary(),
        reconcile.delivery_vocabulary(spark),
        lambda rows: rows.repartition(partitions, "h"),
    )


def both(spark, inputs: list[str], monkeypatch) -> tuple[dict, dict]:
    """input_facts by the one parse (as the job runs it) and by Spark SQL alone; and
    by the first read's scan alone, the same as the one parse's."""
    sources = load.resolve(inputs)
    facts, how, shuffled = read_once(spark, sources)
    assert (shuffled is None) == (facts is None)
    scanned = reconcile.input_facts(spark, sources, (facts, how))
    alone = reconcile.input_facts(spark, sources)
    assert comparable(alone) == comparable(scanned) and alone["first_read"] == scanned["first_read"]
    with monkeypatch.context() as m:
        m.setenv(jar.ENV, "off")
        sql = reconcile.input_facts(spark, sources)
    assert sql["first_read"].startswith("spark-sql")
    return scanned, sql


def comparable(facts: dict) -> dict:
    out = {k: v for k, v in facts.items() if k != "first_read"}
    out["life"] = sorted(facts["life"], key=lambda r: (r["router"], r["epoch"], r["seq"], r["event"]))
    return out


def _histories(base: Path, faults: list[tuple], seed: int, **spec) -> list[str]:
    """One generated history per set of ``faults`` (ids prefixed h<n>.): restarts, folded
    lines, batches, detaches, refused resends; returns their routers' directories."""
    routers = []
    for n, injected in enumerate(faults):
        made = Spec(
            **{"routers": 3, "publishers": 2, "subscribers": 3, "topics": 2, "round_size": 8, "p_restart": 0.3}
            | {"p_fold": 0.5, "p_batch": 0.5, "p_detach": 0.5, "p_refused": 0.1}
            | spec,
            seed=seed + n,
            faults=injected,
            prefix=f"h{n}.",
        )
        info = generate(base / f"h{n}", made)
        routers += [str(base / f"h{n}" / r) for r in info["routers"]]
    return routers


def test_a_real_run_is_scanned_to_the_same_facts(spark, real_run, monkeypatch):
    scanned, sql = both(spark, [str(r) for r in real_run["routers"]], monkeypatch)
    assert scanned["first_read"] == linescan.JAVA
    assert scanned["life"] and scanned["epochs"] and scanned["named_routers"]
    assert comparable(scanned) == comparable(sql)


@pytest.mark.parametrize("seed", [1, 2])
def test_generated_histories_with_restarts_gaps_and_repeats(spark, tmp_path, monkeypatch, seed):
    """Restarts (epochs), folded lines, batches, detaches, refused resends; and a seq
    gap and a repeated seq (the scan names the missing numbers itself; the repeated
    ones come from SQL's cold path either way)."""
    routers = _histories(tmp_path, [(), ("seq-gap",), ("seq-repeated",)], seed * 10, deliveries=60)
    scanned, sql = both(spark, routers, monkeypatch)
    assert scanned["first_read"] == linescan.JAVA
    assert sql["gaps"] and sql["repeated"]
    assert comparable(scanned) == comparable(sql)


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    import realrun

    return realrun.run(tmp_path_factory.mktemp("line-scan-run"), messages=8)


@pytest.mark.parametrize("name", sorted(MUTATIONS))
def test_each_mutation_is_declined_or_scanned_to_the_same_facts(spark, run, tmp_path, monkeypatch, name):
    """And when the scan vouches for the mutated lines (a loss, a reorder, a record
    deleted: lines still in the writer's shape), the delivery scan's rows are narrow()'s."""
    copy = Copy.of(run, tmp_path / "logs")
    MUTATIONS[name](copy)
    dirs = copy.write()
    has_events = any(p.stat().st_size for d in dirs for p in Path(d, "events").glob("*.jsonl"))
    if not has_events:
        pytest.skip("no events left: the command refuses it before any read (test_mutations)")
    scanned, sql = both(spark, dirs, monkeypatch)
    if sql["bad_count"]:
        assert scanned["first_read"].startswith("spark-sql ("), scanned["first_read"]
    assert comparable(scanned) == comparable(sql)
    if scanned["first_read"] == linescan.JAVA:
        java_rows, sql_rows = delivery_rows(spark, dirs)
        assert java_rows == sql_rows


# ---------------------------------------------------------------------------
# The per-delivery pass's rows: DeliveryScan against unfold() and narrow()
# ---------------------------------------------------------------------------


def delivery_rows(spark, inputs: list[str]) -> tuple[list, list]:
    """The narrowed rows of the per-delivery pass, by the one parse (read from its
    shuffle, each row in the partition of its delivery) and by Spark SQL."""
    from pyspark.sql import functions as F

    sources = load.resolve(inputs)
    facts, how, shuffled = read_once(spark, sources)
    assert how == linescan.JAVA and shuffled is not None
    java = shuffled.withColumn("_part", F.spark_partition_id())
    assert java.select("h", "_part").distinct().groupBy("h").count().where("count > 1").count() == 0
    lines = load.load_lines(spark, sources, reconcile.DELIVERY_READ)
    lines = lines.where(F.col("delivery").isNotNull() | F.col("deliveries").isNotNull())
    sql = reconcile._narrowed(reconcile.unfold(lines.withColumn("_bad", reconcile.bad(lines))))
    assert shuffled.schema == sql.schema
    return sorted(shuffled.collect(), key=str), sorted(sql.collect(), key=str)


def test_a_real_runs_delivery_rows_are_narrow_s(spark, real_run):
    java, sql = delivery_rows(spark, [str(r) for r in real_run["routers"]])
    assert java and java == sql


def test_generated_delivery_rows_with_every_kind_of_line(spark, tmp_path):
    """Folded lines (completed, sub-outcomes), rejects, expiries, refused resends,
    at-least-once topics, detaches and restarts."""
    routers = _histories(
        tmp_path, [(), ("invented",), ("dup-tag",)], 0, deliveries=80, alo_topics=1, p_repeat=0.3, p_reject=0.1, p_expire=0.1
    )
    java, sql = delivery_rows(spark, routers)
    kinds = {r["k"] for r in sql}
    assert {reconcile.KIND[k] for k in ("received", "sub-outcome", "pub-outcome", "settled", "expired")} <= kinds
    assert any(r["_pos"] > 0 for r in sql) and any(r["y"] == 4 for r in sql)  # unfolded; at-least-once
    assert java == sql


def _copy(real_run, base: Path) -> list[str]:
    dirs = []
    for data_dir in real_run["routers"]:
        shutil.copytree(data_dir, base / Path(data_dir).name, ignore=shutil.ignore_patterns("*.state"))
        dirs.append(str(base / Path(data_dir).name))
    return dirs


def _shuffle_ids(rdd) -> set[int]:
    """The shuffles a (Java) RDD reads, through its whole lineage."""
    found, deps = set(), rdd.dependencies()
    for i in range(deps.size()):
        dep = deps.apply(i)
        found |= {dep.shuffleId()} if dep.getClass().getSimpleName() == "ShuffleDependency" else _shuffle_ids(dep.rdd())
    return found


def _shuffle_files(spark, shuffles: set[int] | None = None) -> set[Path]:
    """Shuffle files in the local directories (of this JVM's and any other's: compare before and after)."""
    roots = (spark.conf.get("spark.local.dir", None) or tempfile.gettempdir()).split(",")
    found = {p for r in roots for p in Path(r).glob("blockmgr-*/*/shuffle_*")}
    return found if shuffles is None else {p for p in found if int(p.name.split("_")[1]) in shuffles}


def test_each_line_is_parsed_once(spark, real_run, tmp_path):
    """The proof judges the one parse: a file changed after it is not read again."""
    dirs = _copy(real_run, tmp_path / "logs")
    sources = load.resolve(dirs)
    t = reconcile.prepare(spark, sources, partitions=2)
    try:
        assert t.input["first_read"] == linescan.JAVA and t.rules == "java"
        log = sorted(Path(dirs[0], "events").glob("*.jsonl"))[0]
        log.write_bytes(log.read_bytes() + b'{"seq": "not a number"}\n')
        assert t.compute_facts() == real_run_deliveries(spark, real_run) and t.bad_in_deliveries is None
    finally:
        t.unpersist()


def real_run_deliveries(spark, real_run) -> int:
    t = reconcile.prepare(spark, load.resolve([str(r) for r in real_run["routers"]]), partitions=2)
    try:
        return t.compute_facts()
    finally:
        t.unpersist()


@pytest.mark.parametrize("changed", [False, True])
def test_a_lost_shuffle_is_parsed_again(spark, real_run, tmp_path, changed):
    """A partition whose shuffle output is lost is parsed again (its stage run again),
    its facts kept once (by partition). A line there that is no longer in the writer's
    shape fails that stage with a message compute_facts() knows, and the pass is read
    again in Spark SQL, which counts the line."""
    deliveries = real_run_deliveries(spark, real_run)
    dirs = _copy(real_run, tmp_path / "logs")
    before = _shuffle_files(spark)
    t = reconcile.prepare(spark, load.resolve(dirs), partitions=2)
    try:
        assert t.input["first_read"] == linescan.JAVA
        lost = _shuffle_files(spark, _shuffle_ids(t.facts._jdf.queryExecution().analyzed().rdd())) - before
        assert any(p.name.endswith(".data") for p in lost)
        for p in lost:
            p.unlink()
        if changed:
            log = sorted(Path(dirs[0], "events").glob("*.jsonl"))[0]
            log.write_bytes(log.read_bytes() + b'{"seq": "not a number"}\n')
        assert t.compute_facts() == deliveries
        if changed:
            assert t.bad_in_deliveries is not None and t.bad_in_deliveries.get["bad"] == 1
        else:
            assert t.bad_in_deliveries is None and t.rules == "java"
    finally:
        t.unpersist()


# ---------------------------------------------------------------------------
# The applications' ledgers: LedgerScan against load_ledgers()
# ---------------------------------------------------------------------------


def ledger_rows(spark, directory: str) -> tuple[list, list]:
    """The ledgers' rows by the Java scan and by Spark SQL (load_ledgers)."""
    paths, recursive = load.ledger_read(directory)
    sql = load.load_ledgers(spark, directory)
    java, how = linescan.ledger_rows(spark, paths, recursive, load.ledger_rows_schema(spark).json())
    assert how == linescan.JAVA and java is not None and java.schema == sql.schema
    return sorted(java.collect(), key=str), sorted(sql.collect(), key=str)


def test_a_real_runs_ledgers_are_read_to_the_same_rows(spark, real_run):
    java, sql = ledger_rows(spark, str(real_run["clients"]))
    assert {r["event"] for r in sql} >= {"sent", "outcome", "delivered"}
    assert java == sql


def test_ledgers_split_and_packed_are_read_to_the_same_rows(spark, tmp_path):
    """Many files, a file read in several splits and several files in one partition:
    the rows' file hash, split start and place in the partition are Spark's own."""
    _histories(tmp_path, [(), ("ledger-twice", "ledger-pub-outcome")], 3, deliveries=120)
    clients = tmp_path / "clients"
    for n, history in enumerate(sorted(tmp_path.glob("h*"))):
        for ledger in (history / "clients").glob("*.jsonl"):
            clients.mkdir(exist_ok=True)
            shutil.copy(ledger, clients / f"{n}-{ledger.name}")
    saved = {k: spark.conf.get(k) for k in ("spark.sql.files.maxPartitionBytes", "spark.sql.files.openCostInBytes")}
    spark.conf.set("spark.sql.files.maxPartitionBytes", "8192")
    spark.conf.set("spark.sql.files.openCostInBytes", "0")
    try:
        java, sql = ledger_rows(spark, str(clients))
    finally:
        for k, v in saved.items():
            spark.conf.set(k, v)
    assert len({(r["fid"], r["split"]) for r in sql}) > len({r["fid"] for r in sql})  # some file in several splits
    assert java == sql


def test_a_ledger_line_not_in_the_writers_shape_sends_the_ledgers_to_sql(spark, real_run, tmp_path):
    from pyspark import StorageLevel

    clients = tmp_path / "clients"
    shutil.copytree(real_run["clients"], clients)
    ledger = sorted(clients.glob("*.jsonl"))[0]
    ledger.write_bytes(ledger.read_bytes() + b'{"ts": "late", "event": "delivered"}\n')
    kept, how = reconcile.kept_ledgers(spark, str(clients), StorageLevel.MEMORY_AND_DISK)
    try:
        assert how == "spark-sql (a ledger line not in the writer's shape (ts is not double))", how
        assert sorted(kept.collect(), key=str) == sorted(load.load_ledgers(spark, str(clients)).collect(), key=str)
    finally:
        reconcile.release(kept)
    kept, how = reconcile.kept_ledgers(spark, str(real_run["clients"]), StorageLevel.MEMORY_AND_DISK)
    reconcile.release(kept)
    assert how == linescan.JAVA


# ---------------------------------------------------------------------------
# Line by line: what the scan accepts, Spark reads whole, to the same values
# ---------------------------------------------------------------------------

_BASE = [
    {
        "seq": 7,
        "ts": 1763785562.25,
        "router": "A",
        "epoch": 2,
        "boot": "8ffe3085742ca654",
        "event": "received",
        "delivery": "0a0b",
        "topic": "t",
        "publisher": "pub-0",
        "link_name": "pub-0-out",
        "pub_tag": "01",
        "incarnation": "i.1",
        "stream_seq": 3,
        "size": 10,
        "settled": False,
        "owed": ["sub-0/in"],
        "forwarded": ["B"],
    },
    {
        "seq": 8,
        "ts": 1763785562,
        "router": "A",
        "epoch": 2,
        "boot": "8ffe3085742ca654",
        "event": "link-attached",
        "link": 1,
        "conn": 1,
        "container": "sub-0",
        "name": "sub-0-in",
        "role": "subscriber",
        "address": "topic-0",
        "durable": 0,
        "incarnation": "",
        "resumed": False,
    },
    {
        "seq": 9,
        "ts": 1.5,
        "router": "B",
        "epoch": 1,
        "boot": "b",
        "event": "routes",
        "reachable": ["A", "C"],
        "next_hops": ["A>A"],
    },
    {
        "seq": 10,
        "ts": 2.0,
        "router": "B",
        "epoch": 1,
        "boot": "b",
        "event": "sub-outcomes",
        "subscriber": "s/in",
        "outcome": "accepted",
        "deliveries": ["01", "02"],
    },
    {
        "seq": 11,
        "ts": 2.0,
        "router": "B",
        "epoch": 1,
        "boot": "b",
        "event": "completed",
        "delivery": "01",
        "subscriber": "s/in",
        "outcome": "accepted",
        "pub_outcome": "accepted",
        "by": "router",
    },
]

_json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats()
    | st.text(max_size=6)
    | st.sampled_from(["A", "B", "received", "sub-outcomes", "0a0b"]),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=3), inner, max_size=2),
    max_leaves=4,
)
_names = st.sampled_from(sorted(set(load.LINE_FIELDS) | {"size", "conn", "SEQ", "Router", "next_hops", "x"}))


@st.composite
def odd_lines(draw) -> bytes:
    record = dict(draw(st.sampled_from(_BASE)))
    for _ in range(draw(st.sampled_from([0, 0, 0, 1, 1, 2, 3]))):
        action = draw(st.sampled_from(["set", "set", "delete", "array"]))
        name = draw(_names)
        if action == "set":
            record[name] = draw(_json_values)
        elif action == "delete":
            record.pop(name, None)
        else:
            record[name] = draw(st.lists(st.none() | st.text(max_size=3) | st.integers(), max_size=3))
    text = json.dumps(record, ensure_ascii=draw(st.booleans()), separators=draw(st.sampled_from([(",", ":"), (", ", ": ")])))
    line = text.encode("utf-8", "surrogatepass")  # a lone surrogate: bytes that are not quite UTF-8
    edit = draw(st.sampled_from(["none"] * 6 + ["dup", "bom", "space", "tail", "quote", "utf8", "cut", "array", "nan"]))
    if edit == "dup":  # a field twice: Spark keeps the last one
        name = draw(st.sampled_from(sorted(record)))
        line = b"{" + json.dumps(name).encode() + b":" + json.dumps(draw(_json_values)).encode() + b"," + line[1:]
    elif edit == "bom":
        line = b"\xef\xbb\xbf" + line
    elif edit == "space":
        line = draw(st.sampled_from([b" ", b"\t", b"\x0c", b"\x00"])) + line
    elif edit == "tail":
        line = line + draw(st.sampled_from([b" x", b"}", b"{}", b",", b" "]))
    elif edit == "quote":
        line = line.replace(b'"', b"'", draw(st.integers(1, 4)))
    elif edit == "utf8":  # bytes that are not UTF-8 (or not minimal UTF-8) inside a string
        at = line.index(b'"', 2) + 1
        line = line[:at] + draw(st.sampled_from([b"\xff", b"\xc3", b"\xed\xa0\x80", b"\xc0\xaf", b"\xe2\x82"])) + line[at:]
    elif edit == "cut":
        line = line[: draw(st.integers(0, len(line) - 1))]
    elif edit == "array":
        line = b"[" + line + b"]"
    elif edit == "nan":
        line = line.replace(b'"ts": ', b'"ts": NaN, "x": ', 1).replace(b'"ts":', b'"ts":NaN,"x":', 1)
    return line.replace(b"\n", b" ").replace(b"\r", b" ")


def _spark_reads(spark, base: Path, lines: list[bytes]) -> dict[int, list]:
    """Each line in its own file, read by the proof's reader (every field it knows, and
    the corrupt-record column): line number -> the rows Spark made of it, each with
    whether the proof calls it malformed."""
    events = base / "events"
    events.mkdir(parents=True)
    for i, line in enumerate(lines):
        (events / f"events-000001-{i + 1:06d}.jsonl").write_bytes(line + b"\n")
    lines_df = load.load_lines(spark, load.resolve([str(base)]), files=True)
    rows: dict[int, list] = {}
    for r in lines_df.select("*", reconcile.bad(lines_df).alias("_bad")).collect():
        n = int(r[FILE].rsplit("-", 1)[1].split(".")[0]) - 1
        rows.setdefault(n, []).append(r)
    return rows


def _judged(spark, lines: list[bytes]) -> list[dict]:
    return json.loads(linescan._scanner(spark).judgeLines([bytearray(x) for x in lines], json.dumps(reconcile.line_vocabulary())))


def _accepted_lines_read_alike(spark, base: Path, lines: list[bytes]) -> int:
    """Asserts that every line the scan accepts is one row of Spark's, well formed, with
    the scan's values in every field; returns how many it accepted."""
    judged = _judged(spark, lines)
    read = _spark_reads(spark, base, lines)
    accepted = 0
    for i, (line, verdict) in enumerate(zip(lines, judged, strict=True)):
        if "why" in verdict:
            continue
        accepted += 1
        rows = read.get(i, [])
        assert len(rows) == 1, (line, rows)
        row = rows[0]
        assert not row["_bad"] and row[CORRUPT] is None, (line, row)
        assert verdict["values"] == [row[f] for f in load.LINE_FIELDS], line
    return accepted


@settings(
    max_examples=6 if CI else 15,
    deadline=None,
    derandomize=CI,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.function_scoped_fixture],
)
@given(lines=st.lists(odd_lines(), min_size=60, max_size=60))
def test_a_line_the_scan_accepts_is_read_whole_by_spark_to_the_same_values(spark, tmp_path_factory, lines):
    _accepted_lines_read_alike(spark, tmp_path_factory.mktemp("lines"), lines)


def test_lines_not_utf8_are_read_as_spark_reads_them(spark, tmp_path):
    """Spark's JSON reader parses a line's bytes with Jackson's byte parser: a byte that
    cannot be UTF-8 fails the line, an overlong or surrogate form may pass as a character.
    The scan parses the same way, so it reads such a line to the same text or declines it."""
    good = orjson.dumps(_BASE[2])
    odd = [b"\xff", b"\xc3", b"\xed\xa0\x80", b"\xc0\xaf", b"\xe2\x82", b"\xf0\x9f\x98\x80", b"\xc3\xb6", b"\xef\xbb\xbf"]
    lines = [good.replace(b'"B"', b'"B' + x + b'"') for x in odd]
    lines += [good.replace(b'"router":"B"', b'"router":"' + x + b'"') for x in odd]
    assert _accepted_lines_read_alike(spark, tmp_path, lines + [good]) >= 3


def test_lines_the_scan_declines(spark):
    """The shapes it never vouches for, each one alone."""
    good = orjson.dumps(_BASE[0])
    odd = {
        b"": "empty",
        b"\xef\xbb\xbf" + good: "BOM",
        good + b" x": "text after",
        b"[" + good + b"]": "array",
        good.replace(b'"seq":7', b'"seq":7.0'): "float seq",
        good.replace(b'"seq":7', b'"seq":"7"'): "string seq",
        good.replace(b'"seq":7', b'"seq":99999999999999999999'): "big seq",
        good.replace(b'"seq":7', b'"seq":0'): "seq 0",
        good.replace(b'"owed":["sub-0/in"]', b'"owed":["sub-0/in",null]'): "null in a list",
        good.replace(b'"topic":"t"', b'"topic":1'): "number for a string",
        good.replace(b'{"seq":7,', b'{"seq":7,"seq":8,'): "twice",
        good.replace(b'"size":10', b'"SIZE":10,"Seq":1'): "other case",
        good.replace(b'"event":"received"', b'"event":"nonsense"'): "unknown kind",
        good.replace(b'"delivery":"0a0b",', b""): "no delivery",
        good.replace(b'"router":"A",', b""): "no router",
        good.replace(b'"topic":"t"', b"'topic':'t'"): "single quotes",
    }
    accepted = [name for (line, name), v in zip(odd.items(), _judged(spark, list(odd)), strict=True) if "why" not in v]
    assert accepted == []
    escaped, raw = json.dumps({**_BASE[0], "topic": "tö"}).encode(), orjson.dumps({**_BASE[0], "topic": "tö"})
    fine = _judged(spark, [good, escaped, raw])
    assert [v.get("why") for v in fine] == [None, None, None]
    assert fine[1]["values"] == fine[2]["values"]


def test_without_the_jar_the_sql_read_runs_and_says_why(spark, real_run, monkeypatch):
    monkeypatch.setenv(jar.ENV, "off")
    facts = reconcile.input_facts(spark, load.resolve([str(r) for r in real_run["routers"]]))
    assert facts["first_read"] == f"spark-sql ({jar.ENV}=off)"


def test_the_jar_is_rebuilt_when_a_source_changes(tmp_path, monkeypatch):
    if jar.compiler() is None:
        pytest.skip("no javac")
    sources = tmp_path / "java"
    shutil.copytree(jar.SOURCES, sources)
    monkeypatch.setattr(jar, "SOURCES", sources)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    first = jar.build()
    assert first is not None and first.is_file() and jar.build() == first
    java = next(sources.rglob("LineScan.java"))
    java.write_text(java.read_text() + "\n// changed\n")
    second = jar.build()
    assert second != first and second.is_file()
    java.write_text(java.read_text() + "\nnot java\n")
    with pytest.raises(RuntimeError, match="javac failed"):
        jar.build()
    broken = jar.jar_path()
    assert broken is not None and jar.failed(broken).is_file() and not broken.is_file()
    assert jar.available() is None  # remembered: not compiled again, quietly


# ---------------------------------------------------------------------------
# The writer's shape parsed without Jackson (WriterLine.java) against Jackson's parse
# ---------------------------------------------------------------------------


def _both_parses(spark, lines: list[bytes]) -> tuple[list[dict], list[dict]]:
    """Each line judged with the writer's-shape parse first (as the scans run) and with
    Jackson's parse alone."""
    scanner, spec = linescan._scanner(spark), json.dumps(reconcile.line_vocabulary())
    given_lines = [bytearray(x) for x in lines]
    # (each double as its text: -0.0 is not 0.0 here)
    fast, jackson = (json.loads(scanner.judgeLines(given_lines, spec, w), parse_float=str) for w in (True, False))
    return fast, jackson


def _taken(spark, lines: list[bytes]) -> list[bool]:
    scanner = linescan._scanner(spark)
    return list(scanner.writerShapeTakes([bytearray(x) for x in lines], json.dumps(reconcile.line_vocabulary())))


def test_the_writers_own_lines_are_parsed_without_jackson_to_the_same_values(spark, real_run):
    """Every line a real run's routers wrote takes the writer's-shape parse, and it reads
    each to what Jackson's parse reads. (The clients' ledgers are read alike by LedgerScan:
    test_a_real_runs_ledgers_are_read_to_the_same_rows.)"""
    lines = [
        line for path in real_run["routers"] for f in sorted(Path(path).rglob("*.jsonl")) for line in f.read_bytes().splitlines()
    ]
    assert len(lines) > 500
    assert all(_taken(spark, lines))
    fast, jackson = _both_parses(spark, lines)
    assert fast == jackson
    assert all("values" in v for v in fast)


# Number texts: JSON's grammar at every length and exponent, and texts just outside it.
_NUMBER_EDGES = [
        "-0", "-0.0", "0.0", "9223372036854775807", "-9223372036854775808", "999999999999999999", "1000000000000000000",
        "9223372036854775808", "9999999999999999999", "-9999999999999999999",
        "1763785200.1027236", "1763785200.0", "17637852001027236", "4.9e-324", "1.7976931348623157e308", "1e400",
        "01", "1.", ".5", "+1", "1e", "--1", "0x10", "1.5.2", "Infinity", "-Infinity", "NaN", "1 ", " 1", "1e+", "-",
]  # fmt: skip
_numbers = st.from_regex(r"-?(0|[1-9][0-9]{0,24})(\.[0-9]{1,24})?([eE][+-]?[0-9]{1,3})?", fullmatch=True) | st.sampled_from(
    _NUMBER_EDGES
)
_raw_strings = st.text(st.characters(min_codepoint=0, max_codepoint=0x7F), max_size=8).map(
    lambda t: b'"' + t.encode() + b'"'
) | st.text(max_size=6).map(lambda t: json.dumps(t, ensure_ascii=False).encode("utf-8", "surrogatepass"))
_raw_values = (
    _numbers.map(str.encode)
    | _raw_strings
    | st.sampled_from([b"null", b"true", b"false", b"nul", b"truex", b"[]", b"{}", b'["a"]', b'["a",1,null]', b"[[]]"])
    | st.lists(_raw_strings | _numbers.map(str.encode) | st.just(b"null"), max_size=3).map(lambda xs: b"[" + b",".join(xs) + b"]")
)
# Names of every type of the schema's fields, a few it lacks, and one in another letter case.
_raw_names = st.sampled_from(
    ["seq", "epoch", "stream_seq", "ts", "topic", "router", "settled", "owed", "routers", "size", "x", "Topic"]
)


@st.composite
def raw_lines(draw) -> bytes:
    """A line of the writer's (parsed by json.dumps's reading) with a few fields set to raw
    value texts, some in JSON's grammar and some not: every type against every value."""
    record = dict(draw(st.sampled_from(_BASE)))
    parts = [json.dumps(k).encode() + b":" + orjson.dumps(v) for k, v in record.items()]
    for _ in range(draw(st.integers(1, 3))):
        name, value = draw(_raw_names), draw(_raw_values)
        part = json.dumps(name).encode() + b":" + value
        keys = [p.split(b":", 1)[0] for p in parts]
        key = json.dumps(name).encode()
        if key in keys and draw(st.booleans()):
            parts[keys.index(key)] = part
        else:
            parts.insert(draw(st.integers(0, len(parts))), part)
    line = b"{" + b",".join(parts) + b"}"
    return line + draw(st.sampled_from([b""] * 8 + [b" ", b"x", b"}", b",", b"\t"]))


@settings(
    max_examples=20 if CI else 60,
    deadline=None,
    derandomize=CI,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.function_scoped_fixture],
)
@given(lines=st.lists(raw_lines() | odd_lines(), min_size=100, max_size=100))
def test_the_writers_shape_parse_agrees_with_jacksons_on_any_line(spark, lines):
    """Whatever the line, the scan's verdict and values are Jackson's: the writer's-shape
    parse either reads a line to Jackson's values or leaves it to Jackson."""
    fast, jackson = _both_parses(spark, lines)
    for line, a, b in zip(lines, fast, jackson, strict=True):
        assert a == b, line


_EDGE_VALUES = [
    *(n.encode() for n in _NUMBER_EDGES),
    b"0", b"7", b"-7", b"1.5", b"-1.5e-3", b"1E5", b"12345678901234567890123456789", b"0.30000000000000004",
    b'"a"', b'""', b'"a\\"b"', b'"\\u00e9"', b'"t\\u00f6"', b'"\\n"', b'"a\\\\"', b'"\\/"', b'"a\x01"', b'"a\x7f"',
    "\"t\u00f6\"".encode(), b'"\xff"', b"null", b"true", b"false", b"nul", b"True", b"[]", b"{}", b'["a"]', b'["a","b"]',
    b'["a",1]', b'["a",null]', b"[[]]", b'[{"a":1}]', b"[1,2.5,true,null]", b'["a" ]', b"[,]", b'["a",]',
]  # fmt: skip


def test_the_writers_shape_parse_agrees_with_jacksons_on_each_edge(spark):
    """Every value text above in every type of field (and a field the schema lacks, and one
    in another letter case), first, in the middle and last: the same verdict and values."""
    lines = []
    for name in ["seq", "ts", "topic", "settled", "owed", "size", "Topic"]:
        base = orjson.dumps({k: v for k, v in _BASE[0].items() if k != name})
        for value in _EDGE_VALUES:
            part = json.dumps(name).encode() + b":" + value
            lines += [b"{" + part + b"," + base[1:], base[:-1] + b"," + part + b"}"]
            lines.append(base.replace(b'"event":', part + b',"event":', 1))
    fast, jackson = _both_parses(spark, lines)
    for line, a, b in zip(lines, fast, jackson, strict=True):
        assert a == b, line
    taken = _taken(spark, lines)
    assert 0.1 < sum(taken) / len(taken) < 0.9  # (both parses had their share of the lines)
