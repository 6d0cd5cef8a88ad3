"""The report's figures (spark/report.py ``summarize``: one aggregation over the kept
per-delivery facts, then the latency) against the same figures counted here, in plain
Python, from every delivery's facts collected whole: on a real run of three routers and
on generated histories with restarts (records lost with a router), detaches (owed and
never answered), rejects and expiries (every outcome) and at-least-once topics (extra
copies, the routers' and the applications')."""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from pathlib import Path

import pytest
from test_delivery_rules import _histories

from spark import load, reconcile, report
from spark.generate import Spec
from spark.reconcile import OUTCOME, OUTCOME_NAME


def counted_here(t: reconcile.Tables, t0: float, bucket: float | None) -> dict:
    """The summary's counts from the facts' rows, one delivery at a time."""
    rows = [r.asDict(recursive=True) for r in t.facts.collect()]
    names = t.names
    origin = [r for r in rows if r["origin"] is not None]
    topics: dict = defaultdict(lambda: {"deliveries": 0, "accepted": 0})
    for r in rows:
        topics[r["topic"]]["deliveries"] += r["origin"] is not None
        topics[r["topic"]]["accepted"] += bool(r["told_accepted"])
    subs: dict = {}
    blank = {"owed": 0, **dict.fromkeys(OUTCOME, 0), "unanswered": 0, "filtered": 0, "duplicated": 0}
    for r in rows:
        for x in r["subs"] or []:
            row = subs.setdefault(x["s"], dict(blank))
            row["owed"] += bool(x["owed"])
            for name, code in OUTCOME.items():
                row[name] += x["o"] == code
            row["unanswered"] += bool(x["owed"]) and x["o"] == 0
        for s in r["filtered"] or []:
            subs.setdefault(s, dict(blank))["filtered"] += 1
        for d in (r["alo_dups"] or []) if r["alo"] else []:
            subs.setdefault(d["s"], dict(blank))["duplicated"] += d["n"]
    died = Counter((names.router(x["r"]), x["e"]) for r in rows for x in r["died_with"] or [])
    series = Counter((names.router(x["r"]), math.floor((x["t"] - t0) / bucket)) for r in rows for x in r["recvs"] or [] if bucket)
    return {
        "deliveries": len(origin),
        "presettled": sum(bool(r["presettled"]) for r in rows),
        "at_least_once": {
            "deliveries": sum(bool(r["alo"]) for r in origin),
            "duplicates": sum(d["n"] for r in rows if r["alo"] for d in r["alo_dups"] or []),
            "app_duplicates": sum(d["n"] for r in rows if r["alo"] for d in r["alo_app_dups"] or []),
        },
        "pub_outcomes": dict(
            Counter(OUTCOME_NAME.get(r["pub"]["o"], "?") for r in rows if r["pub"] and r["pub"]["o"] is not None)
        ),
        "per_topic": sorted(({"topic": k, **v} for k, v in topics.items() if v["deliveries"]), key=lambda x: str(x["topic"])),
        "per_subscriber": sorted(
            ({"subscriber": names.subscriber(s), **v} for s, v in subs.items()), key=lambda x: x["subscriber"]
        ),
        "records_lost_with_router": sorted(
            ({"router": r, "epoch": e, "records": n} for (r, e), n in died.items()), key=lambda x: (x["router"], x["epoch"])
        ),
        "series": sorted(({"router": r, "b": b, "n": n} for (r, b), n in series.items()), key=lambda x: (x["router"], x["b"])),
    }


def assert_counts_agree(spark, routers: list[str], clients: str | None) -> dict:
    ledgers = load.load_ledgers(spark, clients) if clients else None
    t = reconcile.prepare(spark, load.resolve(routers), ledgers=ledgers)
    try:
        deliveries = t.compute_facts()
        got = report.summarize(t, deliveries)
        starts = [e["first_ts"] for e in t.epochs if e["first_ts"] is not None]
        ends = [e["last_ts"] for e in t.epochs if e["last_ts"] is not None]
        assert got["t0"] == min(starts) and got["bucket_s"] == report.bucket_size(max(ends) - min(starts))
        want = counted_here(t, got["t0"], got["bucket_s"])
    finally:
        t.unpersist()
    got = {**got, "per_topic": sorted(got["per_topic"], key=lambda x: str(x["topic"]))}  # (ties: any order)
    for key, value in want.items():
        assert got[key] == value, key
    return got


def test_a_real_runs_figures(spark, real_run):
    got = assert_counts_agree(spark, real_run["routers"], real_run["clients"])
    assert got["deliveries"] >= 20 and got["per_subscriber"] and got["series"] and got["latency"]["n"]


@pytest.mark.parametrize("seed", [1, 2])
def test_generated_histories_figures(spark, tmp_path, seed):
    specs = [
        Spec(
            routers=3,
            publishers=4,
            subscribers=3,
            topics=2,
            deliveries=60,
            round_size=10,
            seed=seed * 10 + n,
            prefix=f"h{n}.",
            p_restart=0.3,
            p_detach=0.5 if n == 0 else 0.1,  # (an at-least-once copy is repeated to a steady link)
            p_reject=0.1,
            p_expire=0.1,
            p_presettled=0.5,  # (per publisher)
            alo_topics=2 * n,  # (the second history: every topic at-least-once)
            p_repeat=0.6,
        )
        for n in range(2)
    ]
    routers, clients = _histories(tmp_path, specs)
    # One router crashes: its last file ends early (no `router-stopping`), with
    # records open (the proof finds them lost; here they are counted).
    last = sorted(Path(routers[0]).rglob("events-*.jsonl"))[-1]
    lines = last.read_text().splitlines(keepends=True)
    last.write_text("".join(lines[: len(lines) * 2 // 3]))
    got = assert_counts_agree(spark, routers, clients)
    # (what the histories were made to hold, so that every count above is counted)
    assert got["records_lost_with_router"] and got["at_least_once"]["duplicates"] and got["presettled"]
    assert {"accepted", "rejected"} <= set(got["pub_outcomes"])
    assert any(s["unanswered"] for s in got["per_subscriber"])
