"""Logs of a real run (three router processes, proton clients keeping ledgers) are
proven clean, through the command line, from JSON lines and from Parquet."""

from __future__ import annotations

import json
from collections import Counter

import pytest

from router.cli import main as eorouter


@pytest.fixture(scope="module")
def json_report(spark, real_run, tmp_path_factory):
    out = tmp_path_factory.mktemp("report")
    rc = eorouter(["reconcile", *real_run["routers"], "--clients", real_run["clients"], "--out", str(out)])
    return rc, json.loads((out / "report.json").read_text()), out


def test_the_run_itself_went_as_planned(real_run):
    assert real_run["left"] == 0
    assert Counter(real_run["outcomes"]) == {"accepted": real_run["sent"] - 1, "rejected": 1}
    assert set(real_run["received"].values()) == {real_run["sent"]}


def test_real_run_is_proven_clean(json_report, real_run):
    rc, report, out = json_report
    assert rc == 0
    verdict = report["verdict"]
    assert verdict["proven_clean"] is True
    assert verdict["line"].startswith("0 lost, 0 duplicated, 0 out of order, 0 invented, 0 left unsettled")
    assert {c["check"] for c in verdict["checks"]} >= {
        "lost",
        "duplicated",
        "out-of-order",
        "invented",
        "left-unsettled",
        "ledger",
    }
    assert report["violations"] == []
    s = report["summary"]
    assert s["routers"] == ["A", "B", "C"]
    assert s["deliveries"] == real_run["sent"]
    assert s["pub_outcomes"] == dict(Counter(real_run["outcomes"]))
    assert all(e["stopped"] for e in s["epochs"])
    subs = {row["subscriber"]: row for row in s["per_subscriber"]}
    assert subs["carol-app/carol-in"]["rejected"] == 1
    assert subs["alice-app/alice-in"]["accepted"] == real_run["sent"]
    assert s["latency"]["n"] == real_run["sent"] and 0 < s["latency"]["p50"] < 5


def test_report_html_is_self_contained(json_report):
    _, _, out = json_report
    html = (out / "report.html").read_text()
    assert html.count("data:image/png;base64,") == 4
    assert "<script" not in html and "http://" not in html and "https://" not in html
    assert "Proven clean" in html


def test_compacted_parquet_gives_the_same_verdict(spark, json_report, real_run, tmp_path):
    from spark.job import run_reconcile

    _, from_json, _ = json_report
    out = tmp_path / "parquet"
    assert eorouter(["logs", "compact", *real_run["routers"], "--out", str(out)]) == 0
    assert list(out.glob("*.parquet"))
    from_parquet = run_reconcile(spark, [str(out)], clients=real_run["clients"], first=None, summary=False)
    assert from_parquet["inputs"][0].startswith("parquet:")
    assert from_parquet["counts"] == from_json["counts"] == {}
    assert from_parquet["verdict"]["proven_clean"]
    # Parquet keeps the lines as written; the job counts the events they stand for
    # (a folded line is several: router.eventschema.FOLDED).
    from router.eventlog import read_events

    lines = sum(1 for d in real_run["routers"] for _ in read_events(d, raw=True))
    events = sum(1 for d in real_run["routers"] for _ in read_events(d))
    assert spark.read.parquet(str(out)).count() == lines
    assert from_json["summary"]["events"] == events


def test_one_routers_log_with_folded_lines_is_proven_clean(spark, real_run_one_router, tmp_path):
    """With every client on one router, deliveries complete on the usual path and
    the log folds the completing sub-outcome, pub-outcome and settlement into one
    "completed" line (docs/event-log.md): the proof unfolds it and holds."""
    from router.eventlog import read_events

    run = real_run_one_router
    assert run["left"] == 0
    raw = Counter(e["event"] for d in run["routers"] for e in read_events(d, raw=True))
    assert raw["completed"] >= run["sent"] // 2, raw  # most deliveries complete on the usual path
    rc = eorouter(["reconcile", *run["routers"], "--clients", run["clients"], "--out", str(tmp_path), "--no-html"])
    report = json.loads((tmp_path / "report.json").read_text())
    assert rc == 0 and report["verdict"]["proven_clean"] is True, report["verdict"]
    assert report["violations"] == []
    assert report["summary"]["deliveries"] == run["sent"]
    assert report["summary"]["pub_outcomes"] == dict(Counter(run["outcomes"]))
