"""The job unfolds folded lines ("completed", "sub-outcomes": router.eventschema.FOLDED)
exactly as the writer's reference does (router.eventschema.unfold()), and reads logs
written before those kinds existed as they are."""

from __future__ import annotations

import orjson

from router.eventschema import FOLDED, unfold, validate_event

COMMON = {"ts": 1763785201.5, "router": "A", "epoch": 3, "boot": "422ab44afffadaaf"}
D1, D2, D3 = "5f1c0a9e8d7b6a5f4e3d2c1b0a998877", "6a2d1b0f9e8c7b6a5f4e3d2c1b0a9988", "77aa01c2e93d4f10.2"

#: One line of each shape the unfolding tells apart, in seq order.
LINES = [
    {"event": "router-started", "pid": 7214, "version": "0.1.0"},
    {
        "event": "received",
        "delivery": D1,
        "topic": "orders",
        "publisher": "pub-1",
        "link_name": "send-1",
        "pub_tag": "01",
        "incarnation": "77aa01c2e93d4f10",
        "stream_seq": 1,
        "size": 100,
        "settled": False,
        "owed": ["sub-1/recv-1", "sub-2/recv-1"],
        "forwarded": ["sub-1/recv-1", "sub-2/recv-1"],
    },
    {"event": "sub-outcomes", "deliveries": [D1, D2, D3], "subscriber": "sub-1/recv-1", "outcome": "accepted", "settled": True},
    {"event": "sub-outcome", "delivery": D1, "subscriber": "sub-2/recv-1", "outcome": "accepted", "settled": True},
    {
        "event": "completed",
        "delivery": D1,
        "subscriber": "sub-2/recv-1",
        "outcome": "accepted",
        "settled": True,
        "pub_outcome": "accepted",
        "by": "router",
        "deleted": True,
    },
    {"event": "sub-outcomes", "deliveries": [D2, D3], "subscriber": "sub-2/recv-1", "outcome": "released", "settled": False},
    {
        "event": "completed",
        "delivery": D2,
        "subscriber": "sub-2/recv-1",
        "outcome": "accepted",
        "settled": True,
        "pub_outcome": "accepted",
        "condition": None,
        "reason": None,
    },  # settled later: no "by"
    {"event": "pub-outcome", "delivery": D3, "outcome": "rejected", "condition": "eorouter:ttl-expired", "reason": "expired"},
    {"event": "settled", "delivery": D2, "by": "publisher", "deleted": False},
    {"event": "router-stopping", "reason": "SIGTERM"},
]


def _write(tmp_path, lines: list[dict]) -> str:
    events = tmp_path / "A" / "events"
    events.mkdir(parents=True)
    data = b"".join(orjson.dumps(line, option=orjson.OPT_APPEND_NEWLINE) for line in lines)
    (events / "events-000003-000001.jsonl").write_bytes(data)
    return str(tmp_path / "A")


def _lines() -> list[dict]:
    lines = [{"seq": seq, **COMMON, **line} for seq, line in enumerate(LINES, 1)]
    for line in lines:
        validate_event(line)
    assert {line["event"] for line in lines} >= set(FOLDED)
    return lines


def _needed(spark, data_dir: str):
    """The log as the job reads it (spark/load.py: the fields the proof reads)."""
    from spark import load

    events = load.load_events(spark, [data_dir]).events
    return events.select(*[c for c in load.LINE_FIELDS if c in events.columns])


def test_spark_unfolds_as_the_writer_does(spark, tmp_path):
    from spark.reconcile import FIRST
    from spark.reconcile import unfold as spark_unfold

    lines = _lines()
    ev = _needed(spark, _write(tmp_path, lines))
    got = [row.asDict(recursive=True) for row in spark_unfold(ev).drop("_pos").collect()]  # one file: its order
    columns = [c for c in ev.columns if c not in ("pub_outcome", "deliveries")]
    expected = [{**{c: event.get(c) for c in columns}, FIRST: n == 0} for line in lines for n, event in enumerate(unfold(line))]
    assert len(expected) == len(lines) + 2 + 1 + 2 + 1  # the runs of 3 and 2, the completed lines of 3 and 2
    assert got == expected
    assert sum(row[FIRST] for row in got) == len(lines)  # the input check counts lines


def test_logs_from_before_folding_are_read_as_they_are(spark, tmp_path):
    """A Parquet dataset compacted from older logs lacks the folded kinds' columns:
    without "deliveries" a "completed" line still unfolds; without both, every row is
    one event of one line."""
    from spark.reconcile import FIRST
    from spark.reconcile import unfold as spark_unfold

    lines = [line for line in _lines() if line["event"] != "sub-outcomes"]
    ev = _needed(spark, _write(tmp_path, lines))
    without_runs = [row.asDict() for row in spark_unfold(ev.drop("deliveries")).drop("_pos").collect()]
    assert [(r["seq"], r["event"]) for r in without_runs] == [
        (line["seq"], event["event"]) for line in lines for event in unfold(line)
    ]
    plain = ev.where(~ev["event"].isin(*FOLDED)).drop("deliveries", "pub_outcome")
    assert [row.asDict() for row in spark_unfold(plain).drop("_pos").collect()] == [
        {**row.asDict(), FIRST: True} for row in plain.collect()
    ]


def test_a_run_without_deliveries_stays_one_line(spark, tmp_path):
    """The router never writes an empty run; if one is read, it names no delivery but
    still counts as a line (the input check must not see a gap in seq)."""
    from spark.reconcile import FIRST
    from spark.reconcile import unfold as spark_unfold

    lines = [
        {"seq": 1, **COMMON, "event": "router-started"},
        {
            "seq": 2,
            **COMMON,
            "event": "sub-outcomes",
            "deliveries": [],
            "subscriber": "s/a",
            "outcome": "accepted",
            "settled": True,
        },
        {"seq": 3, **COMMON, "event": "sub-outcomes", "subscriber": "s/a", "outcome": "accepted"},
    ]
    rows = spark_unfold(_needed(spark, _write(tmp_path, lines))).drop("_pos").collect()
    assert [(r["seq"], r["event"], r["delivery"], r[FIRST]) for r in rows] == [
        (1, "router-started", None, True),
        (2, "sub-outcomes", None, True),
        (3, "sub-outcomes", None, True),
    ]
