"""The job reads the logs with the writer's schema: parity, every kind, torn lines."""

from __future__ import annotations

import orjson
import pytest
from pyspark.sql import types as T

from router.eventschema import EVENT_SCHEMA, EVENTS, spark_schema_fields, validate_event
from spark.schema import LEDGER_FIELDS, event_schema, ledger_schema

SPARK = {
    "string": T.StringType(),
    "long": T.LongType(),
    "double": T.DoubleType(),
    "boolean": T.BooleanType(),
    "array<string>": T.ArrayType(T.StringType()),
}
SAMPLE = {"string": "x-1", "long": 7, "double": 1.5, "boolean": True, "array<string>": ["a", "b"]}


def test_event_schema_is_the_writers_schema():
    schema = event_schema()
    fields = spark_schema_fields()
    assert [f.name for f in schema.fields] == [name for name, _ in fields]
    for field, (name, type_) in zip(schema.fields, fields):
        assert field.dataType == SPARK[type_], name
        assert field.nullable, name
    # every kind's every field is in it, with the writer's type
    for kind, specific in {**{"*": EVENT_SCHEMA}, **EVENTS}.items():
        for name, type_ in specific.items():
            assert schema[name].dataType == SPARK[type_], (kind, name)


def test_ledger_schema_reads_every_field_the_client_writes():
    from router.client.ledger import FIELDS

    names = [name for name, _ in LEDGER_FIELDS]
    assert set(FIELDS) <= set(names)
    assert ledger_schema().fieldNames() == names


def _line(kind: str, seq: int) -> dict:
    line = {"seq": seq, "ts": 1763785200.0 + seq, "router": "A", "epoch": 1, "boot": "00" * 8, "event": kind}
    line.update({name: SAMPLE[type_] for name, type_ in EVENTS[kind].items()})
    validate_event(line)
    return line


def test_the_fields_the_proof_reads_are_the_writers():
    """spark/load.py converts only the fields the proof reads (a pruned schema is what
    keeps JSON parsing cheap), each with the writer's own type; nothing else."""
    from spark.load import LINE_FIELDS, line_schema
    from spark.schema import CORRUPT

    writer = dict(spark_schema_fields())
    schema = line_schema()
    assert schema.fieldNames() == [*LINE_FIELDS, CORRUPT]
    for name in LINE_FIELDS:
        assert schema[name].dataType == SPARK[writer[name]], name
    # What it leaves out is what no check reads.
    assert set(writer) - set(LINE_FIELDS) == {
        "pid",
        "version",
        "conn",
        "size",
        "peer_boot",
        "next_hops",
        "missing_seq",
        "reported",
        "known",
        "incomplete",
        "incarnation",
        # issue 16's counters: budget, memory sweeps, stream numbering
        "bytes",
        "router_bytes",
        "limit",
        "state",
        "count",
        "remembered",
        "next_seq",
        "stream",
        # issue 20: an at-most-once topic's deliveries are judged as pre-settled ones
        # (``settled`` says so); the mode itself is for people reading the log
        "guarantee",
        # an announce timeout that held a moved subscriber's deliveries: for operators
        "held",
    } - set(LINE_FIELDS)


def test_spark_reads_every_kind_with_every_field(spark, tmp_path):
    from spark.load import LINE_FIELDS, load_events

    events = tmp_path / "A" / "events"
    events.mkdir(parents=True)
    lines = [_line(kind, n) for n, kind in enumerate(EVENTS, 1)]
    data = b"".join(orjson.dumps(line, option=orjson.OPT_APPEND_NEWLINE) for line in lines)
    (events / "events-000001-000001.jsonl").write_bytes(data + b'{"seq": 99, "ts": 17')  # a torn last line
    loaded = load_events(spark, [str(tmp_path / "A")])
    rows = {r["event"]: r.asDict() for r in loaded.events.collect()}
    assert set(rows) == set(EVENTS)
    for line in lines:
        row = rows[line["event"]]
        for name, value in line.items():
            if name in LINE_FIELDS:
                assert row[name] == value, (line["event"], name)
    assert [r["line"] for r in loaded.corrupt.collect()] == ['{"seq": 99, "ts": 17']


@pytest.mark.parametrize("layout", ["data_dir", "events_dir", "file", "dir_of_dirs"])
def test_inputs_resolve(tmp_path, layout):
    from spark.load import resolve

    for router in ("A", "B"):
        d = tmp_path / "net" / router / "events"
        d.mkdir(parents=True)
        (d / "events-000001-000001.jsonl").write_text("{}\n")
        (d / "events-000002-000001.jsonl").write_text("{}\n")
    given = {
        "data_dir": [tmp_path / "net" / "A", tmp_path / "net" / "B"],
        "events_dir": [tmp_path / "net" / "A" / "events", tmp_path / "net" / "B" / "events"],
        "file": [tmp_path / "net" / "A" / "events" / "events-000001-000001.jsonl"],
        "dir_of_dirs": [tmp_path / "net"],
    }[layout]
    sources = resolve([str(p) for p in given])
    assert len(sources) == 1 and sources[0].fmt == "json"
    assert len(sources[0].paths) == (1 if layout == "file" else 4)


def test_missing_input_exits_2_before_spark_starts(tmp_path, capsys):
    from spark.cli import reconcile_main

    assert reconcile_main([str(tmp_path / "nothing")]) == 2
    (tmp_path / "empty").mkdir()
    assert reconcile_main([str(tmp_path / "empty")]) == 2
    assert "no event log found" in capsys.readouterr().err
