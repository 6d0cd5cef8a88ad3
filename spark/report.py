"""The report: summary figures (computed in Spark, collected small), the verdict
table for the terminal, report.json for machines and a self-contained report.html
(matplotlib PNGs inlined as base64; no script, no CDN: it opens offline).
"""

from __future__ import annotations

import base64
import html
import io
import json
import math
import time
from collections.abc import Set as AbstractSet
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F

from spark.reconcile import CHECKS, FIRST, ITEM, OUTCOME, OUTCOME_NAME, Names, Tables

if TYPE_CHECKING:
    from matplotlib.figure import Figure

_NICE_BUCKETS = (0.1, 0.2, 0.5, 1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 21600, 86400)
#: check -> (title, what a count of it is called in the verdict line)
LABELS = {name: (title, name.replace("-", " ")) for name, title, _ in CHECKS} | {
    "lost": ("no loss", "lost"),
    "duplicated": ("no duplicates", "duplicated"),
    "out-of-order": ("publisher order", "out of order"),
    "invented": ("nothing invented", "invented"),
    "left-unsettled": ("clean end", "left unsettled"),
    "ledger": ("router vs applications", "ledger mismatches"),
    "malformed-line": ("every line well-formed", "malformed lines"),
}
#: Checks named in the verdict line even when they found nothing (the others only when they did).
HEADLINE = ("lost", "duplicated", "out-of-order", "invented", "left-unsettled", "ledger")


def bucket_size(span: float, buckets: int = 150) -> float:
    want = max(span, 1e-9) / buckets
    for size in _NICE_BUCKETS:
        if size >= want:
            return float(size)
    return float(math.ceil(want / 86400) * 86400)


def _rows(df: DataFrame) -> list[dict]:
    return [row.asDict(recursive=True) for row in df.collect()]


#: What a row of the summary's one aggregation (_counted) counts: its ``g``.
_TOPIC, _SUBSCRIBER, _FILTERED, _COPIES, _DIED_WITH, _SERIES = range(6)
#: A _TOPIC row's ``b``: which of these its deliveries are (one bit each).
_ORIGIN, _PRESETTLED, _ALO, _TOLD_ACCEPTED, _ANSWERED = (1 << i for i in range(5))
_PART = "struct<g:int,topic:string,a:bigint,b:bigint,c:bigint,n:bigint,t:double>"


def _part(g: int, topic=None, a=None, b=None, c=None, n=None, t=None) -> Column:
    """One contribution of a delivery to _counted's aggregation (one shape for all)."""

    def typed(value, type_: str) -> Column:
        return (value if isinstance(value, Column) else F.lit(value)).cast(type_)

    return F.struct(
        F.lit(g).alias("g"),
        typed(topic, "string").alias("topic"),
        typed(a, "bigint").alias("a"),
        typed(b, "bigint").alias("b"),
        typed(c, "bigint").alias("c"),
        typed(n, "bigint").alias("n"),
        typed(t, "double").alias("t"),
    )


def _counted(f: DataFrame, t0: float | None, bucket: float | None) -> list[dict]:
    """Every count the summary shows but latency, in one job: each delivery's facts
    become rows (``g`` says which count: per topic and outcome; per subscriber, outcome
    and owed; per subscriber filtered; per subscriber extra copies; per router and
    epoch records lost with it; and, given a ``bucket``, per router and bucket
    arrivals), all counted by one aggregation. (Seven jobs over the kept facts before:
    each job's scheduling and read of the facts cost about as much as its counting.)"""

    def each(column: str, fn) -> Column:
        return F.transform(F.coalesce(column, F.array()), fn)

    def flag(cond: Column, bit: int) -> Column:
        return F.when(F.coalesce(cond, F.lit(False)), F.lit(bit)).otherwise(F.lit(0))

    origin = F.col("origin").isNotNull()
    topic = _part(
        _TOPIC,
        topic=F.col("topic"),
        a=F.col("pub.o"),
        b=flag(origin, _ORIGIN)
        + flag(F.col("presettled"), _PRESETTLED)
        + flag(F.col("alo") & origin, _ALO)
        + flag(F.col("told_accepted"), _TOLD_ACCEPTED)
        + flag(F.col("pub").isNotNull(), _ANSWERED),
        t=F.col("recv_ts"),
    )
    parts = [
        F.array(topic),
        each("subs", lambda x: _part(_SUBSCRIBER, a=x["s"], b=x["o"], c=x["owed"].cast("int"))),
        each("filtered", lambda s: _part(_FILTERED, a=s)),
        # At-least-once topics' extra copies (allowed, counted): accepted again (the
        # routers' view, c 0) and handed again (its application's ledger, c 1).
        F.when(
            F.coalesce(F.col("alo"), F.lit(False)),
            F.concat(
                each("alo_dups", lambda d: _part(_COPIES, a=d["s"], c=0, n=d["n"])),
                each("alo_app_dups", lambda d: _part(_COPIES, a=d["s"], c=1, n=d["n"])),
            ),
        ).otherwise(F.array().cast(f"array<{_PART}>")),
        each("died_with", lambda x: _part(_DIED_WITH, a=x["r"], b=x["e"])),
    ]
    if bucket is not None:
        parts.append(each("recvs", lambda x: _part(_SERIES, a=x["r"], b=F.floor((x["t"] - F.lit(t0)) / F.lit(bucket)))))
    rows = f.select(F.explode(F.concat(*parts)).alias("x")).select("x.*")
    return _rows(
        rows.groupBy("g", "topic", "a", "b", "c").agg(
            F.count(F.lit(1)).alias("rows"), F.sum("n").alias("n"), F.min("t").alias("t0"), F.max("t").alias("t1")
        )
    )


def _series(counted: list[dict], names: Names) -> list[dict]:
    series = [{"router": names.router(r["a"]), "b": r["b"], "n": r["rows"]} for r in counted if r["g"] == _SERIES]
    return sorted(series, key=lambda r: (r["router"], r["b"]))


def summarize(t: Tables, deliveries: int | None = None, max_rows: int = 200) -> dict:
    """Everything the report shows besides the violations, as small Python values
    (two jobs over the cached per-delivery facts: the counts, and the latency)."""
    epochs = [
        {k: e[k] for k in ("router", "epoch", "boot", "first_ts", "last_ts", "started_ts", "stopping_ts", "lines", "stopped")}
        for e in t.epochs
    ]
    routers = sorted({e["router"] for e in epochs})
    kinds = t.input["kinds"]
    refused = t.input["refused"]
    names = t.names
    f = t.facts
    starts = [e["first_ts"] for e in epochs if e["first_ts"] is not None]
    ends = [e["last_ts"] for e in epochs if e["last_ts"] is not None]
    # The arrivals' buckets span the logs' first to last line (known before the job, from
    # the first read), or, lacking those, the deliveries' first to last arrival (known after).
    known = bucket_size(max(ends) - min(starts)) if starts and ends else None
    counted = _counted(f, min(starts) if starts else None, known)
    by = {g: [r for r in counted if r["g"] == g] for g in range(_SERIES + 1)}

    def count(rows: list[dict], bit: int) -> int:
        return sum(r["rows"] for r in rows if r["b"] & bit)

    topic_rows = by[_TOPIC]
    arrived = [r for r in topic_rows if r["t0"] is not None]
    totals = {
        "deliveries": count(topic_rows, _ORIGIN),
        "presettled": count(topic_rows, _PRESETTLED),
        "alo": count(topic_rows, _ALO),
        "t0": min((r["t0"] for r in arrived), default=None),
        "t1": max((r["t1"] for r in arrived), default=None),
    }
    outcomes: dict[str, int] = {}
    by_topic: dict = {}
    for r in topic_rows:
        if r["a"] is not None:
            name = OUTCOME_NAME.get(r["a"], "?")
            outcomes[name] = outcomes.get(name, 0) + count([r], _ANSWERED)
        topic = by_topic.setdefault(r["topic"], {"topic": r["topic"], "deliveries": 0, "accepted": 0})
        topic["deliveries"] += count([r], _ORIGIN)
        topic["accepted"] += count([r], _TOLD_ACCEPTED)
    per_topic = sorted((x for x in by_topic.values() if x["deliveries"]), key=lambda x: -x["deliveries"])[:max_rows]
    # Per subscriber, distinct deliveries: owed, and how it answered each.
    subs: dict = {}
    for r in by[_SUBSCRIBER]:
        row = subs.setdefault(r["a"], {"subscriber": r["a"], "owed": 0, **{name: 0 for name in OUTCOME}, "unanswered": 0})
        owed = r["c"] == 1
        row["owed"] += r["rows"] if owed else 0
        for name, code in OUTCOME.items():
            row[name] += r["rows"] if r["b"] == code else 0
        row["unanswered"] += r["rows"] if owed and r["b"] == 0 else 0
    per_sub = list(subs.values())
    # Distinct deliveries its selector did not select (never owed: not lost), per subscriber.
    filtered_by = {r["a"]: r["rows"] for r in by[_FILTERED]}
    copies = {(r["a"], r["c"]): r["n"] for r in by[_COPIES]}
    duplicated_by = {s: n for (s, app), n in copies.items() if app == 0}
    for s_hash in filtered_by:
        if s_hash not in subs:  # a subscriber that was never owed anything: only filtered
            per_sub.append({"subscriber": s_hash, "owed": 0, **{name: 0 for name in OUTCOME}, "unanswered": 0})
    for row in per_sub:
        row["filtered"] = filtered_by.get(row["subscriber"], 0)
        row["duplicated"] = duplicated_by.get(row["subscriber"], 0)
        row["subscriber"] = names.subscriber(row["subscriber"])
    per_sub = sorted(per_sub, key=lambda r: r["subscriber"])[:max_rows]
    unfinished = [{"router": names.router(r["a"]), "epoch": r["b"], "records": r["rows"]} for r in by[_DIED_WITH]]
    unfinished.sort(key=lambda r: (r["router"], r["epoch"]))

    series, latency, lat_overall, bucket = [], [], {}, None
    t0 = min(starts) if starts else (totals["t0"] or 0.0)
    t1 = max(ends) if ends else (totals["t1"] or t0)
    if totals["t0"] is not None:
        bucket = bucket_size(t1 - t0)
        if known is None:  # (the logs gave no span: the arrivals' own, counted again)
            counted = _counted(f, t0, bucket)
        series = _series(counted, names)
        b = F.floor((F.col("t") - F.lit(t0)) / F.lit(bucket)).cast("long")
        lat = f.where(F.col("origin").isNotNull() & F.col("pub").isNotNull() & (F.col("pub.r") == F.col("origin"))).select(
            (F.col("pub.t") - F.col("recv_ts")).alias("lat"), F.col("recv_ts").alias("t")
        )
        # One job: per bucket, and (the rollup's row without a bucket) over the whole run.
        both = _rows(
            lat.withColumn("b", b)
            .rollup("b")
            .agg(
                F.percentile_approx("lat", [0.5, 0.9, 0.99], 10000).alias("p"),
                F.max("lat").alias("max"),
                F.count(F.lit(1)).alias("n"),
                F.grouping("b").alias("all"),
            )
        )
        overall: dict[str, Any] = next((r for r in both if r["all"]), {"n": 0})
        latency = sorted(({k: v for k, v in r.items() if k != "all"} for r in both if not r["all"]), key=lambda r: r["b"])
        if overall["n"]:
            lat_overall = {
                "p50": overall["p"][0],
                "p90": overall["p"][1],
                "p99": overall["p"][2],
                "max": overall["max"],
                "n": overall["n"],
            }
    return {
        "routers": routers,
        "epochs": epochs,
        "events": sum(kinds.values()),
        "kinds": kinds,
        "deliveries": totals["deliveries"] or 0,
        "presettled": totals["presettled"] or 0,
        # at-least-once topics (docs/guarantees.md): their deliveries, and the extra copies
        # subscribers accepted (routers' view) and applications were handed (ledgers)
        "at_least_once": {
            "deliveries": totals["alo"] or 0,
            "duplicates": sum(n for (_, app), n in copies.items() if app == 0),
            "app_duplicates": sum(n for (_, app), n in copies.items() if app == 1),
        },
        "pub_outcomes": outcomes,
        "refused_before_record": refused,
        "per_topic": per_topic,
        "per_subscriber": per_sub,
        "records_lost_with_router": unfinished,
        "t0": t0,
        "bucket_s": bucket,
        "series": series,
        "latency_series": latency,
        "latency": lat_overall,
    }


def collect_violations(
    found: DataFrame, input_rows: list[dict], first: int | None = 20, names: Names | None = None
) -> tuple[dict, list[dict]]:
    """(counts per check: {"rows", "items"}, the first ``first`` violations of each check
    by time) of Spark's violations ``found`` (two small jobs: counts, and the first of
    each check) and of the input checks' ``input_rows``. Spark's rows come back with
    hashes for names (``_spark``: reconcile.decode_all() names them)."""
    from collections import defaultdict

    from spark.reconcile import counted

    counts = {r["check"]: {"rows": r["rows"], "items": r["items"]} for r in _rows(counted(found))}
    items: dict = defaultdict(set)
    for row in input_rows:
        c = counts.setdefault(row["check"], {"rows": 0, "items": 0})
        c["rows"] += 1
        items[row["check"]].add(row["item"])
    for check, seen in items.items():
        counts[check]["items"] += len(seen)
    order: list[Column | str] = [F.col("ts").asc_nulls_last(), "router", "epoch", "seq", "delivery", "subscriber", "kind"]
    if first is None:
        spark_rows = _rows(found.orderBy("check", *order)) if any(c in counts for c in ITEM) else []
        chosen_input = input_rows
    else:
        w = Window.partitionBy("check").orderBy(*order)
        spark_rows = (
            _rows(found.withColumn("n", F.row_number().over(w)).where(F.col("n") <= first).drop("n").orderBy("check", *order))
            if any(c in counts for c in ITEM)
            else []
        )
        per: dict = defaultdict(int)
        chosen_input = []
        for row in input_rows:
            if per[row["check"]] < first:
                per[row["check"]] += 1
                chosen_input.append(row)
    for row in spark_rows:
        row["_spark"] = True
    return counts, chosen_input + spark_rows


def add_message_ids(firsts: list[dict], app: DataFrame, ledgers: DataFrame) -> None:
    """Put the message-id (from the applications' ledgers: the publisher's `sent`,
    else a subscriber's `delivered`) beside each listed violation's delivery."""
    ids = sorted({v["delivery"] for v in firsts if v.get("delivery")})
    if not ids:
        return
    found = {
        r["delivery"]: r["message_id"]
        for r in app.where(F.col("delivery").isin(*ids) & F.col("message_id").isNotNull())
        .select("delivery", "message_id")
        .collect()
    }
    rest = [d for d in ids if d not in found]
    if rest:
        found.update(
            {
                r["delivery"]: r["message_id"]
                for r in ledgers.where(F.col("delivery").isin(*rest) & F.col("message_id").isNotNull())
                .groupBy("delivery")
                .agg(F.first("message_id").alias("message_id"))
                .collect()
            }
        )
    for v in firsts:
        mid = found.get(v.get("delivery"))
        if mid is not None:
            v["message_id"] = mid


# ---------------------------------------------------------------------------
# The verdict
# ---------------------------------------------------------------------------


def verdict(counts: dict, ledgers: bool) -> dict:
    checks = []
    for name, title, unit in CHECKS:
        if name == "ledger" and not ledgers:
            continue
        c = counts.get(name, {"rows": 0, "items": 0})
        checks.append(
            {"check": name, "title": title, "count": c["items"], "rows": c["rows"], "unit": unit, "ok": c["items"] == 0}
        )
    clean = all(c["ok"] for c in checks)
    line = ", ".join(f"{c['count']} {LABELS[c['check']][1]}" for c in checks if c["check"] in HEADLINE or c["count"])
    return {"proven_clean": clean, "line": line, "checks": checks}


def _violation_line(row: dict) -> str:
    mid = f"  [message-id {row['message_id']}]" if row.get("message_id") else ""
    return f"{row['delivery'] or '-'}  {row['detail']}{mid}"


def render_terminal(report: dict, first: int = 5) -> str:
    s = report["summary"]
    v = report["verdict"]
    out = []
    if s is not None:
        n_epochs = len(s["epochs"])
        out.append(
            f"eorouter reconcile: {len(s['routers'])} router(s) ({', '.join(s['routers'])}), {n_epochs} "
            f"epoch(s), {s['events']:,} events, {s['deliveries'] or 0:,} publisher deliveries "
            f"({', '.join(f'{k} {n:,}' for k, n in sorted(s['pub_outcomes'].items())) or 'no outcomes'})"
            f" in {report['elapsed_s']:.1f} s"
        )
    width = max(len(c["title"]) for c in v["checks"])
    died = sum(r["records"] for r in s["records_lost_with_router"]) if s else 0
    for c in v["checks"]:
        mark = "ok  " if c["ok"] else "FAIL"
        extra = ""
        if c["check"] == "left-unsettled" and died:
            extra = f"  ({died} record(s) went with a router that died: see the report)"
        if c["rows"] != c["count"]:
            extra += f"  ({c['rows']} rows)"
        out.append(f"  {mark} {c['title']:<{width}}  {c['count']:>8,} {LABELS[c['check']][1]}{extra}")
    for torn in report.get("torn") or []:
        out.append(
            f"  note: torn last line {torn['file']}:{torn['line']} skipped (a crash cut the router's last "
            f'write; docs/event-log.md, "Torn lines")'
        )
    if report.get("beyond_horizon"):
        out.append(
            f"  note: {report['beyond_horizon']:,} resend(s) refused beyond the resume horizon "
            f'(eorouter:resend-beyond-horizon: their publishers were told rejected, "may have been '
            f'delivered already"; docs/resumption.md)'
        )
    alo = (s or {}).get("at_least_once") or {}
    if alo.get("deliveries"):
        out.append(
            f"  note: {alo['deliveries']:,} deliveries on at-least-once topics: {alo['duplicates']:,} extra "
            f"cop(ies) accepted, {alo['app_duplicates']:,} handed again to applications (allowed there, "
            f"counted; nothing lost is proven as for every topic; docs/guarantees.md)"
        )
    if v["proven_clean"]:
        out.append(f"VERDICT: proven clean: {v['line']}")
    else:
        out.append(f"VERDICT: NOT clean: {v['line']}")
        by_check: dict[str, list] = {}
        for row in report["violations"]:
            by_check.setdefault(row["check"], []).append(row)
        for c in v["checks"]:
            rows = by_check.get(c["check"])
            if not rows:
                continue
            out.append(f"  first {min(first, len(rows))} of {c['rows']:,} {c['check']}:")
            for row in rows[:first]:
                out.append(f"    {_violation_line(row)}")
    if report.get("out"):
        out.append(f"report: {report['out']}/report.html  (machine-readable: {report['out']}/report.json)")
    return "\n".join(out)


# ---------------------------------------------------------------------------
# Files
# ---------------------------------------------------------------------------


def write_json(report: dict, path: Path) -> None:
    path.write_text(json.dumps(report, indent=2, default=str) + "\n", encoding="utf-8")


def _png(fig: Figure) -> str:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110, bbox_inches="tight")
    import matplotlib.pyplot as plt

    plt.close(fig)
    return base64.b64encode(buf.getvalue()).decode("ascii")


def text_overlaps(fig) -> list[tuple[str, str]]:
    """Pairs of visible texts of ``fig`` (labels, tick labels, titles, annotations)
    whose drawn boxes overlap: the report's figures must have none (tests)."""
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    from matplotlib.text import Text

    # (Text only: a legend's TextArea holds a Text and has the same box)
    texts = [t for t in fig.findobj(Text) if t.get_visible() and t.get_text().strip()]
    boxes = [(t.get_text(), t.get_window_extent(renderer)) for t in texts]
    out = []
    for i, (a, ba) in enumerate(boxes):
        for b, bb in boxes[i + 1 :]:
            if ba.overlaps(bb) and ba.width > 0 and bb.width > 0:
                out.append((a, b))
    return out


def load_plotting() -> None:
    """Import matplotlib (a quarter of a second), so that a caller can do it while
    Spark works (spark/job.py: in the summary's thread)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot  # noqa: F401
    import matplotlib.ticker  # noqa: F401


def figures(report: dict) -> dict:
    """The report's matplotlib figures (not yet rendered): timeline, rate, latency, counts."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D

    s = report["summary"]
    figs: dict = {}
    t0 = s["t0"] or 0.0
    bucket = s["bucket_s"]
    routers = s["routers"]
    colors = {r: plt.cm.tab10(i % 10) for i, r in enumerate(routers)}
    by_router: dict[str, list] = {}
    for e in s["epochs"]:
        by_router.setdefault(e["router"], []).append(e)

    if s["epochs"]:
        # Each router's lives as one lane: a bar per epoch, a start marker, and a
        # square (stopped) or a cross (died) at its end. The epoch numbers are
        # written only in bars wide enough to hold them, so nothing overlaps
        # however many restarts there are.
        lanes = max(1, len(routers))
        fig, ax = plt.subplots(figsize=(10, 0.55 * lanes + 1.4))
        span = max((e["last_ts"] or t0) for e in s["epochs"]) - t0 or 1.0
        fig.canvas.draw()
        width_px = ax.get_window_extent().width
        for lane, router in enumerate(routers):
            y = lanes - 1 - lane
            for e in by_router.get(router, []):
                start = (e["started_ts"] if e["started_ts"] is not None else e["first_ts"]) - t0
                last = e["stopping_ts"] if e["stopped"] and e["stopping_ts"] is not None else e["last_ts"]
                end = (last or start) - t0
                ax.barh(y, max(end - start, span / 2000), left=start, height=0.55, color=colors[router], alpha=0.55, lw=0)
                ax.plot([start], [y], marker="|", color="black", ms=14, mew=1.2)
                ax.plot(
                    [end],
                    [y],
                    marker="s" if e["stopped"] else "X",
                    color="black" if e["stopped"] else "#b00020",
                    ms=5 if e["stopped"] else 8,
                    ls="",
                )
                label = f"e{e['epoch']}"
                if (end - start) / span * width_px > 9 * len(label) + 8:
                    ax.text((start + end) / 2, y, label, ha="center", va="center", fontsize=7, color="black", clip_on=True)
        ax.set_yticks(range(lanes))
        ax.set_yticklabels([f"router {r}" for r in reversed(routers)], fontsize=8)
        ax.set_ylim(-0.6, lanes - 0.4)
        ax.set_xlim(0, span * 1.01)
        ax.set_xlabel(f"seconds since {time.strftime('%Y-%m-%d %H:%M:%S', time.gmtime(t0))} UTC")
        n_epochs = len(s["epochs"])
        died = sum(1 for e in s["epochs"] if not e["stopped"])
        ax.set_title(f"Router lives: {n_epochs} epoch(s), {died} ended without a stop (died, or still running)", fontsize=10)
        ax.legend(
            handles=[
                Line2D([], [], marker="|", color="black", ls="", ms=10, label="start"),
                Line2D([], [], marker="s", color="black", ls="", ms=5, label="stopped"),
                Line2D([], [], marker="X", color="#b00020", ls="", ms=7, label="died"),
            ],
            loc="upper center",
            bbox_to_anchor=(0.5, -0.32 - 0.05 / lanes),
            ncol=3,
            fontsize=8,
            frameon=False,
        )
        ax.grid(axis="x", alpha=0.3)
        figs["timeline"] = fig

    if bucket:
        fig, ax = plt.subplots(figsize=(10, 3.8))
        last = max((p["b"] for p in s["series"]), default=0)
        for router in routers:
            counts = {p["b"]: p["n"] for p in s["series"] if p["router"] == router}
            if counts:  # every bucket, zeros included: a router that took nothing shows 0, not its last rate
                xs = [b * bucket for b in range(0, last + 2)]
                ys = [counts.get(b, 0) / bucket for b in range(0, last + 2)]
                ax.plot(xs, ys, drawstyle="steps-post", color=colors[router], label=f"router {router}", lw=1.2)
        for router, eps in by_router.items():  # down: between one epoch's last line and the next one's start
            for a, b in zip(eps, eps[1:]):
                ax.axvspan(a["last_ts"] - t0, (b["started_ts"] or b["first_ts"]) - t0, color=colors[router], alpha=0.15, lw=0)
        ax.set_ylim(bottom=0)
        ax.set_xlabel(f"seconds (buckets of {bucket:g} s; shaded: a router down between two epochs)")
        ax.set_ylabel("deliveries received / s")
        ax.set_title("Deliveries received per second, per router", fontsize=10)
        ax.legend(loc="upper right", fontsize=8)
        ax.grid(alpha=0.3)
        figs["rate"] = fig

    if s["latency_series"]:
        fig, ax = plt.subplots(figsize=(10, 3.4))
        xs = [p["b"] * bucket for p in s["latency_series"]]
        for i, (name, style) in enumerate((("p50", "-"), ("p90", "--"), ("p99", ":"))):
            ax.plot(xs, [p["p"][i] * 1000 for p in s["latency_series"]], ls=style, label=name, drawstyle="steps-post")
        ax.plot(xs, [p["max"] * 1000 for p in s["latency_series"]], ls="", marker=".", ms=3, label="max", color="grey")
        values = [p["max"] for p in s["latency_series"] if p["max"]] or [1.0]
        lows = [p["p"][0] for p in s["latency_series"] if p["p"][0]] or [1.0]
        if max(values) / max(min(lows), 1e-6) > 50:  # wide range (a failover pause): log scale, plain labels
            from matplotlib.ticker import FuncFormatter, LogLocator

            ax.set_yscale("log")
            ax.yaxis.set_major_locator(LogLocator(base=10, numticks=8))
            ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
            ax.yaxis.set_minor_formatter(FuncFormatter(lambda v, _: ""))
        else:
            ax.set_ylim(bottom=0)
        ax.set_xlabel("seconds since start (by arrival at the origin router)")
        ax.set_ylabel("ms")
        ax.set_title("End-to-end latency: arrival at the origin router to the publisher's outcome", fontsize=10)
        ax.legend(fontsize=8)
        ax.grid(alpha=0.3, which="major")
        figs["latency"] = fig

    subs = s["per_subscriber"]
    topics = s["per_topic"]
    if subs or topics:
        rows = max(len(subs), len(topics), 4)
        fig, axes = plt.subplots(1, 2, figsize=(11, max(2.5, 0.28 * rows + 1.2)))
        if topics:
            names = [t["topic"] or "?" for t in topics][::-1]
            axes[0].barh(names, [t["deliveries"] for t in topics][::-1], color="tab:blue", label="published")
            axes[0].barh(
                names, [t["accepted"] or 0 for t in topics][::-1], color="tab:green", height=0.4, label="accepted everywhere"
            )
            axes[0].set_title("Deliveries per topic", fontsize=10)
            axes[0].legend(fontsize=8)
            axes[0].tick_params(axis="y", labelsize=7)
        if subs:
            names = [sub["subscriber"] for sub in subs][::-1]
            axes[1].barh(names, [sub["owed"] or 0 for sub in subs][::-1], color="tab:blue", label="owed")
            axes[1].barh(names, [sub["accepted"] or 0 for sub in subs][::-1], color="tab:green", height=0.4, label="accepted")
            axes[1].set_title("Distinct deliveries per subscriber", fontsize=10)
            axes[1].legend(fontsize=8)
            axes[1].tick_params(axis="y", labelsize=7)
        for ax in axes:
            ax.xaxis.set_major_formatter(_thousands())
        fig.tight_layout()
        figs["counts"] = fig
    return figs


def _thousands():
    from matplotlib.ticker import FuncFormatter, MaxNLocator  # noqa: F401

    return FuncFormatter(lambda v, _: f"{v / 1e6:g} M" if v >= 1e6 else f"{v / 1e3:g} k" if v >= 1e4 else f"{v:g}")


_CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Helvetica,Arial,sans-serif;margin:2em auto;max-width:72em;
color:#222;padding:0 1em}
h1{font-size:1.5em}h2{font-size:1.15em;margin-top:2em;border-bottom:1px solid #ddd}
table{border-collapse:collapse;font-size:.9em;margin:.5em 0}td,th{border:1px solid #ddd;padding:.25em .6em;
text-align:left;vertical-align:top}th{background:#f4f4f4}td.n{text-align:right;font-variant-numeric:tabular-nums}
.ok{color:#176f2c;font-weight:600}.bad{color:#b00020;font-weight:600}
.verdict{font-size:1.2em;padding:.6em 1em;border-radius:6px;margin:1em 0}
.verdict.ok{background:#e6f4ea}.verdict.bad{background:#fde7e9}
img{max-width:100%}code{font-size:.9em}small{color:#666}
"""


def _table(headers: list[str], rows: list[list], numeric: AbstractSet[int] = frozenset()) -> str:
    out = ["<table><tr>" + "".join(f"<th>{html.escape(h)}</th>" for h in headers) + "</tr>"]
    for row in rows:
        cells = []
        for i, value in enumerate(row):
            text = "" if value is None else (f"{value:,}" if isinstance(value, int) else str(value))
            cls = ' class="n"' if i in numeric else ""
            cells.append(f"<td{cls}>{html.escape(text)}</td>")
        out.append("<tr>" + "".join(cells) + "</tr>")
    out.append("</table>")
    return "\n".join(out)


_TITLES = {
    "timeline": "Router lives",
    "rate": "Deliveries per second per router",
    "latency": "End-to-end latency",
    "counts": "Per topic and per subscriber",
}


def drawn(summary: dict) -> dict[str, str]:
    """figures() rendered: each a PNG in base64, as write_html() puts it in the page.
    Only the summary is read, so a caller can draw while the proofs run (spark/job.py)."""
    return {key: _png(fig) for key, fig in figures({"summary": summary}).items()}


def write_html(report: dict, path: Path, figs: dict[str, str] | None = None) -> None:
    """The report as one HTML page; ``figs``: drawn(report["summary"]), if already drawn."""
    s = report["summary"]
    v = report["verdict"]
    if figs is None:
        figs = drawn(s)
    parts = [
        f"<!doctype html><html><head><meta charset='utf-8'><title>eorouter reconciliation</title>"
        f"<style>{_CSS}</style></head><body>",
        "<h1>eorouter: reconciliation of the routers' event logs</h1>",
        f"<p><small>{html.escape(', '.join(report['inputs']))} &middot; generated "
        f"{html.escape(report['generated'])} &middot; {report['elapsed_s']:.1f} s</small></p>",
    ]
    cls = "ok" if v["proven_clean"] else "bad"
    parts.append(
        f"<div class='verdict {cls}'>{'Proven clean' if v['proven_clean'] else 'NOT clean'}: {html.escape(v['line'])}</div>"
    )
    parts.append(
        _table(
            ["check", "result", "count", "counts"],
            [[c["title"], "ok" if c["ok"] else "FAIL", c["count"], c["unit"]] for c in v["checks"]],
            {2},
        )
    )
    for torn in report.get("torn") or []:
        parts.append(
            f"<p><small>note: torn last line {html.escape(str(torn['file']))}:{torn['line']} skipped (a "
            f"crash cut the router's last write)</small></p>"
        )
    if report.get("beyond_horizon"):
        parts.append(
            f"<p><small>note: {report['beyond_horizon']:,} resend(s) refused beyond the resume horizon "
            "(eorouter:resend-beyond-horizon: their publishers were told rejected, “may have been "
            "delivered already”)</small></p>"
        )
    lat = s["latency"]
    alo = s.get("at_least_once") or {}
    parts.append("<h2>The run</h2>")
    parts.append(
        _table(
            ["", ""],
            [
                ["routers", ", ".join(s["routers"])],
                ["events", s["events"]],
                ["publisher deliveries", s["deliveries"] or 0],
                ["publisher outcomes", ", ".join(f"{k} {n:,}" for k, n in sorted(s["pub_outcomes"].items()))],
                ["refused before a record existed", s["refused_before_record"]],
                ["pre-settled (best effort, not owed)", s["presettled"]],
                [
                    "at-least-once: deliveries / extra copies accepted / handed again",
                    " / ".join(f"{alo.get(k, 0):,}" for k in ("deliveries", "duplicates", "app_duplicates")),
                ],
                [
                    "latency p50 / p90 / p99 / max",
                    " / ".join(f"{lat[k] * 1000:.1f} ms" for k in ("p50", "p90", "p99", "max")) if lat else "-",
                ],
            ],
            {1},
        )
    )
    if "timeline" in figs:
        parts.append(
            f"<h2>{_TITLES['timeline']}</h2><img alt='{_TITLES['timeline']}' src='data:image/png;base64,{figs['timeline']}'>"
        )
    parts.append("<h3>Router epochs</h3>")
    parts.append(
        _table(
            ["router", "epoch", "boot", "first line (UTC)", "last line (UTC)", "lines", "end"],
            [
                [
                    e["router"],
                    e["epoch"],
                    e["boot"],
                    _utc(e["first_ts"]),
                    _utc(e["last_ts"]),
                    e["lines"],
                    "stopped" if e["stopped"] else "died (or still running)",
                ]
                for e in s["epochs"]
            ],
            {1, 5},
        )
    )
    if s["records_lost_with_router"]:
        parts.append("<p>Records that went with a router that died (their obligations are judged by the loss proof):</p>")
        parts.append(
            _table(
                ["router", "epoch", "records"],
                [[r["router"], r["epoch"], r["records"]] for r in s["records_lost_with_router"]],
                {1, 2},
            )
        )
    for key in ("rate", "latency", "counts"):
        if key in figs:
            parts.append(f"<h2>{_TITLES[key]}</h2><img alt='{_TITLES[key]}' src='data:image/png;base64,{figs[key]}'>")
    parts.append("<h3>Topics</h3>")
    parts.append(
        _table(
            ["topic", "deliveries", "accepted everywhere"],
            [[t["topic"], t["deliveries"], t["accepted"] or 0] for t in s["per_topic"]],
            {1, 2},
        )
    )
    parts.append("<h3>Subscribers (distinct deliveries)</h3>")
    parts.append(
        _table(
            [
                "subscriber",
                "owed",
                "accepted",
                "rejected",
                "released",
                "modified",
                "settled only",
                "never answered",
                "filtered",
                "accepted again (at-least-once)",
            ],
            [
                [
                    x["subscriber"],
                    x["owed"],
                    x["accepted"],
                    x["rejected"],
                    x["released"],
                    x["modified"],
                    x["none"],
                    x["unanswered"],
                    x.get("filtered", 0),
                    x.get("duplicated", 0),
                ]
                for x in s["per_subscriber"]
            ],
            {1, 2, 3, 4, 5, 6, 7, 8, 9},
        )
    )
    parts.append("<h2>Violations</h2>")
    if report["violations"]:
        parts.append(f"<p>The first {report['first']} of each check (all counts are in the table above).</p>")
        parts.append(
            _table(
                ["check", "delivery", "publisher tag", "message-id", "router", "subscriber", "when (UTC)", "detail"],
                [
                    [
                        r["check"],
                        r["delivery"],
                        r.get("pub_tag"),
                        r.get("message_id"),
                        r["router"],
                        r["subscriber"],
                        _utc(r["ts"]),
                        r["detail"],
                    ]
                    for r in report["violations"]
                ],
            )
        )
    else:
        parts.append("<p class='ok'>None.</p>")
    parts.append("<h2>Event kinds</h2>")
    parts.append(_table(["event", "count"], [[k, n] for k, n in s["kinds"].items()], {1}))
    parts.append("</body></html>")
    path.write_text("\n".join(parts), encoding="utf-8")


def _utc(ts: float | None) -> str:
    if ts is None:
        return ""
    return time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(ts)) + f".{int((ts % 1) * 1000):03d}"


__all__ = [
    "FIRST",
    "add_message_ids",
    "collect_violations",
    "figures",
    "render_terminal",
    "summarize",
    "text_overlaps",
    "verdict",
    "write_html",
    "write_json",
]
