"""The per-delivery read of input the first read found clean is strict (no corrupt-record
column, spark/load.py ``load_lines(strict=True)``); a field only that read converts, of the
wrong type, makes it read again permissively, and the line is counted as malformed."""

from __future__ import annotations

import json

from spark import load, reconcile

BOOT = "b00t"


def _line(seq: int, event: str, **fields) -> str:
    return json.dumps({"seq": seq, "ts": 1763785200.0 + seq, "router": "A", "epoch": 1, "boot": BOOT, "event": event, **fields})


def _logs(tmp_path, settled) -> list[str]:
    events = tmp_path / "A" / "events"
    events.mkdir(parents=True)
    lines = [
        _line(1, "router-started"),
        _line(
            2,
            "received",
            delivery="d1",
            topic="t",
            publisher="p",
            link_name="p-out",
            pub_tag="01",
            incarnation="i.1",
            stream_seq=0,
            size=1,
            settled=False,
            owed=["s/in"],
            forwarded=[],
        ),
        _line(3, "forwarded", delivery="d1", subscriber="s/in", link=2, settled=settled),
    ]
    (events / "events-000001-000001.jsonl").write_text("\n".join(lines) + "\n")
    return [str(tmp_path / "A")]


def _prepared(spark, inputs):
    t = reconcile.prepare(spark, load.resolve(inputs), partitions=2)
    strict = t.permissive is not None
    try:
        t.compute_facts()
        bad = (t.bad_in_deliveries.get if t.bad_in_deliveries is not None else {}).get("bad") or 0
        return t, strict, bad
    finally:
        t.unpersist()


def test_clean_input_is_read_strictly_once(spark, tmp_path):
    t, strict, bad = _prepared(spark, _logs(tmp_path, settled=False))
    assert strict and t.permissive is not None  # (not used: nothing to read again)
    assert t.input["bad_count"] == 0 and bad == 0


def test_a_field_only_the_second_read_converts_makes_it_read_again(spark, tmp_path):
    t, strict, bad = _prepared(spark, _logs(tmp_path, settled="no"))  # `settled` is a boolean
    assert strict and t.input["bad_count"] == 0  # the first read does not convert `settled`
    assert t.permissive is None and bad == 1  # read again permissively, and the line counted
