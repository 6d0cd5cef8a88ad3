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
from pathlib import Path

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from spark.reconcile import CHECKS, Tables, unfinished_records

_NICE_BUCKETS = (0.1, 0.2, 0.5, 1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 21600, 86400)
LABELS = {
    "lost": ("no loss", "lost"),
    "duplicated": ("no duplicates", "duplicated"),
    "out-of-order": ("publisher order", "out of order"),
    "invented": ("nothing invented", "invented"),
    "left-unsettled": ("clean end", "left unsettled"),
    "incomplete-input": ("input complete", "input problems"),
    "ledger": ("router vs applications", "ledger mismatches"),
}


def bucket_size(span: float, buckets: int = 150) -> float:
    want = max(span, 1e-9) / buckets
    for size in _NICE_BUCKETS:
        if size >= want:
            return float(size)
    return float(math.ceil(want / 86400) * 86400)


def _rows(df: DataFrame) -> list[dict]:
    return [row.asDict(recursive=True) for row in df.collect()]


def summarize(t: Tables, max_rows: int = 200) -> dict:
    """Everything the report shows besides the violations, as small Python values."""
    kinds = {r["event"]: r["n"] for r in _rows(
        t.keyed.groupBy("event").agg(F.count(F.lit(1)).alias("n"))
        .unionByName(t.life.groupBy("event").agg(F.count(F.lit(1)).alias("n")))
        .groupBy("event").agg(F.sum("n").alias("n")))}
    epochs = _rows(t.epochs.orderBy("router", "epoch"))
    routers = sorted({e["router"] for e in epochs})

    origin = t.recv.where(F.col("origin_router").isNull())
    pub = t.keyed.where(F.col("event") == "pub-outcome")
    totals = _rows(origin.agg(F.count_distinct("delivery").alias("deliveries"),
                              F.min("ts").alias("t0"), F.max("ts").alias("t1")))[0]
    presettled = t.keyed.where((F.col("event") == "received") & F.col("settled")).count() \
        if kinds.get("received") else 0
    outcomes = {r["outcome"] or "none": r["n"] for r in _rows(
        pub.where(F.col("delivery").isNotNull()).groupBy("outcome").agg(F.count(F.lit(1)).alias("n")))}
    refused = pub.where(F.col("delivery").isNull()).count() if kinds.get("pub-outcome") else 0

    per_topic = _rows(origin.groupBy("topic").agg(F.count_distinct("delivery").alias("deliveries"))
                      .join(pub.where(F.col("outcome") == "accepted").select("delivery").distinct()
                            .join(t.ident.select("delivery", "topic"), "delivery")
                            .groupBy("topic").agg(F.count(F.lit(1)).alias("accepted")), "topic", "left")
                      .orderBy(F.desc("deliveries")).limit(max_rows))
    owed = t.recv.select("delivery", F.explode("owed").alias("subscriber")).distinct() \
        .groupBy("subscriber").agg(F.count(F.lit(1)).alias("owed"))
    answered = t.keyed.where(F.col("event") == "sub-outcome").groupBy("subscriber").pivot(
        "outcome", ["accepted", "rejected", "released", "modified", "none"]).agg(F.count(F.lit(1)))
    per_sub = _rows(owed.join(answered, "subscriber", "full_outer").orderBy("subscriber").limit(max_rows))

    unfinished = _rows(unfinished_records(t).where(~F.col("stopped")).groupBy("router", "epoch")
                       .agg(F.count(F.lit(1)).alias("records")).orderBy("router", "epoch"))

    series, latency, lat_overall, bucket = [], [], {}, None
    if totals["t0"] is not None:
        all_recv = t.recv.agg(F.min("ts").alias("a"), F.max("ts").alias("b")).collect()[0]
        t0 = min(all_recv["a"], min((e["first_ts"] for e in epochs), default=all_recv["a"]))
        t1 = max(all_recv["b"], max((e["last_ts"] for e in epochs), default=all_recv["b"]))
        bucket = bucket_size(t1 - t0)
        b = F.floor((F.col("ts") - F.lit(t0)) / F.lit(bucket))
        series = _rows(t.recv.groupBy("router", b.alias("b")).agg(F.count(F.lit(1)).alias("n"))
                       .orderBy("router", "b"))
        lat = origin.select("delivery", "router", "epoch", F.col("ts").alias("ts")) \
            .join(pub.where(F.col("delivery").isNotNull()).select(
                "delivery", "router", "epoch", F.col("ts").alias("pub_ts"), "outcome"),
                ["delivery", "router", "epoch"]) \
            .withColumn("lat", F.col("pub_ts") - F.col("ts"))
        latency = _rows(lat.groupBy(b.alias("b")).agg(
            F.percentile_approx("lat", [0.5, 0.9, 0.99], 1000).alias("p"), F.max("lat").alias("max"),
            F.count(F.lit(1)).alias("n")).orderBy("b"))
        overall = _rows(lat.agg(F.percentile_approx("lat", [0.5, 0.9, 0.99], 10000).alias("p"),
                                F.max("lat").alias("max"), F.count(F.lit(1)).alias("n")))[0]
        if overall["n"]:
            lat_overall = {"p50": overall["p"][0], "p90": overall["p"][1], "p99": overall["p"][2],
                           "max": overall["max"], "n": overall["n"]}
    else:
        t0 = min((e["first_ts"] for e in epochs), default=0.0)
    return {
        "routers": routers, "epochs": epochs, "events": sum(kinds.values()), "kinds": dict(sorted(kinds.items())),
        "deliveries": totals["deliveries"], "presettled": presettled, "pub_outcomes": outcomes,
        "refused_before_record": refused, "per_topic": per_topic, "per_subscriber": per_sub,
        "records_lost_with_router": unfinished, "t0": t0, "bucket_s": bucket, "series": series,
        "latency_series": latency, "latency": lat_overall,
    }


def collect_violations(violations: DataFrame, first: int | None = 20) -> tuple[dict, list[dict]]:
    """(counts per check: {"rows", "items"}, the first ``first`` violations of each check
    by time). Two small jobs over the (persisted) violations."""
    counts = {r["check"]: {"rows": r["rows"], "items": r["items"]} for r in _rows(
        violations.groupBy("check").agg(F.count(F.lit(1)).alias("rows"),
                                        F.count_distinct("item").alias("items")))}
    from pyspark.sql import Window
    if first is None:
        return counts, _rows(violations.orderBy("check", F.col("ts").asc_nulls_last()))
    w = Window.partitionBy("check").orderBy(F.col("ts").asc_nulls_last(), "router", "epoch", "seq", "delivery",
                                            "subscriber", "detail")
    firsts = _rows(violations.withColumn("n", F.row_number().over(w)).where(F.col("n") <= first).drop("n")
                   .orderBy("check", F.col("ts").asc_nulls_last()))
    return counts, firsts


# ---------------------------------------------------------------------------
# The verdict
# ---------------------------------------------------------------------------

def verdict(counts: dict, ledgers: bool) -> dict:
    checks = []
    for name, unit in CHECKS:
        if name == "ledger" and not ledgers:
            continue
        c = counts.get(name, {"rows": 0, "items": 0})
        checks.append({"check": name, "title": LABELS[name][0], "count": c["items"], "rows": c["rows"],
                       "unit": unit, "ok": c["items"] == 0})
    clean = all(c["ok"] for c in checks)
    line = ", ".join(f"{c['count']} {LABELS[c['check']][1]}" for c in checks
                     if c["check"] not in ("incomplete-input",) or c["count"])
    return {"proven_clean": clean, "line": line, "checks": checks}


def render_terminal(report: dict, first: int = 5) -> str:
    s = report["summary"]
    v = report["verdict"]
    out = []
    died = sum(r["records"] for r in s["records_lost_with_router"])
    n_epochs = len(s["epochs"])
    out.append(f"eorouter reconcile: {len(s['routers'])} router(s) ({', '.join(s['routers'])}), {n_epochs} "
               f"epoch(s), {s['events']:,} events, {s['deliveries'] or 0:,} publisher deliveries "
               f"({', '.join(f'{k} {n:,}' for k, n in sorted(s['pub_outcomes'].items())) or 'no outcomes'})"
               f" in {report['elapsed_s']:.1f} s")
    width = max(len(c["title"]) for c in v["checks"])
    for c in v["checks"]:
        mark = "ok  " if c["ok"] else "FAIL"
        extra = ""
        if c["check"] == "left-unsettled" and died:
            extra = f"  ({died} record(s) went with a router that died: see the report)"
        if c["check"] == "lost" and c["rows"] != c["count"]:
            extra = f"  ({c['rows']} places)"
        out.append(f"  {mark} {c['title']:<{width}}  {c['count']:>8,} {LABELS[c['check']][1]}{extra}")
    if report.get("torn_lines"):
        out.append(f"  note: {report['torn_lines']} unparsable line(s) skipped (a torn last line after a crash "
                   f"is expected; anything else is corruption)")
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
                out.append(f"    {row['delivery'] or '-'}  {row['detail']}")
    if report.get("out"):
        out.append(f"report: {report['out']}/report.html  (machine-readable: {report['out']}/report.json)")
    return "\n".join(out)


# ---------------------------------------------------------------------------
# Files
# ---------------------------------------------------------------------------

def write_json(report: dict, path: Path) -> None:
    path.write_text(json.dumps(report, indent=2, default=str) + "\n", encoding="utf-8")


def _png(fig) -> str:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110, bbox_inches="tight")
    import matplotlib.pyplot as plt
    plt.close(fig)
    return base64.b64encode(buf.getvalue()).decode("ascii")


def _figures(report: dict) -> dict[str, str]:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    s = report["summary"]
    figs: dict[str, str] = {}
    t0 = s["t0"] or 0.0
    bucket = s["bucket_s"]
    colors = {r: plt.cm.tab10(i % 10) for i, r in enumerate(s["routers"])}

    if bucket:
        fig, ax = plt.subplots(figsize=(10, 4.2))
        last = max((p["b"] for p in s["series"]), default=0)
        for router in s["routers"]:
            counts = {p["b"]: p["n"] for p in s["series"] if p["router"] == router}
            if counts:  # every bucket, zeros included: a router that took nothing shows 0, not its last rate
                xs = [b * bucket for b in range(0, last + 2)]
                ys = [counts.get(b, 0) / bucket for b in range(0, last + 2)]
                ax.plot(xs, ys, drawstyle="steps-post", color=colors[router], label=f"router {router}", lw=1.2)
        ax.set_ylim(bottom=0)
        top = ax.get_ylim()[1]
        n_routers = max(1, len(s["routers"]))
        for e in s["epochs"]:
            c = colors[e["router"]]
            level = top * (0.97 - 0.08 * (s["routers"].index(e["router"]) % n_routers))
            start = (e["started_ts"] if e["started_ts"] is not None else e["first_ts"]) - t0
            ax.axvline(start, color=c, lw=1, ls="-", alpha=0.5)
            ax.plot([start], [level], marker="^", color=c, ms=7)
            ax.annotate(f" {e['router']} up (e{e['epoch']})", (start, level), fontsize=7, color=c, va="center")
            if e["stopped"]:
                end = e["stopping_ts"] - t0
                ax.axvline(end, color=c, lw=1, ls="--", alpha=0.5)
                ax.plot([end], [level], marker="s", color=c, ms=6)
                ax.annotate(f"{e['router']} stop ", (end, level), fontsize=7, color=c, va="center", ha="right")
            else:
                end = e["last_ts"] - t0
                ax.axvline(end, color=c, lw=2, ls=":", alpha=0.9)
                ax.plot([end], [level], marker="X", color="black", ms=9)
                ax.annotate(f"{e['router']} DIED ", (end, level), fontsize=8, color=c, va="center", ha="right",
                            fontweight="bold")
        by_router: dict[str, list] = {}
        for e in s["epochs"]:
            by_router.setdefault(e["router"], []).append(e)
        for router, eps in by_router.items():
            for a, b in zip(eps, eps[1:]):
                ax.axvspan(a["last_ts"] - t0, (b["started_ts"] or b["first_ts"]) - t0, color=colors[router],
                           alpha=0.12, lw=0)
        ax.set_xlabel(f"seconds since {time.strftime('%Y-%m-%d %H:%M:%S', time.gmtime(t0))} UTC "
                      f"(buckets of {bucket:g} s)")
        ax.set_ylabel("deliveries received / s")
        ax.set_title("Deliveries received per second, per router (\u25b2 start, \u25a0 stop, X died; "
                     "shaded: down)")
        ax.legend(loc="upper right", fontsize=8)
        ax.grid(alpha=0.3)
        figs["rate"] = _png(fig)

    if s["latency_series"]:
        fig, ax = plt.subplots(figsize=(10, 3.6))
        xs = [p["b"] * bucket for p in s["latency_series"]]
        for i, (name, style) in enumerate((("p50", "-"), ("p90", "--"), ("p99", ":"))):
            ax.plot(xs, [p["p"][i] * 1000 for p in s["latency_series"]], ls=style, label=name,
                    drawstyle="steps-post")
        ax.plot(xs, [p["max"] * 1000 for p in s["latency_series"]], ls="", marker=".", ms=3, label="max",
                color="grey")
        values = [p["max"] for p in s["latency_series"] if p["max"]] or [1.0]
        lows = [p["p"][0] for p in s["latency_series"] if p["p"][0]] or [1.0]
        if max(values) / max(min(lows), 1e-6) > 50:  # wide range (a failover pause): log scale, plain labels
            from matplotlib.ticker import FuncFormatter
            ax.set_yscale("log")
            ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
        else:
            ax.set_ylim(bottom=0)
        ax.set_xlabel("seconds since start (by arrival at the origin router)")
        ax.set_ylabel("ms")
        ax.set_title("End-to-end latency: arrival at the origin router to the publisher's outcome")
        ax.legend(fontsize=8)
        ax.grid(alpha=0.3, which="both")
        figs["latency"] = _png(fig)

    subs = s["per_subscriber"]
    topics = s["per_topic"]
    if subs or topics:
        fig, axes = plt.subplots(1, 2, figsize=(11, max(2.5, 0.3 * max(len(subs), len(topics), 4) + 1)))
        if topics:
            names = [t["topic"] or "?" for t in topics][::-1]
            axes[0].barh(names, [t["deliveries"] for t in topics][::-1], color="tab:blue", label="published")
            axes[0].barh(names, [t["accepted"] or 0 for t in topics][::-1], color="tab:green", height=0.4,
                         label="accepted")
            axes[0].set_title("Deliveries per topic")
            axes[0].legend(fontsize=8)
        if subs:
            names = [sub["subscriber"] for sub in subs][::-1]
            axes[1].barh(names, [sub["owed"] or 0 for sub in subs][::-1], color="tab:blue", label="owed")
            axes[1].barh(names, [sub["accepted"] or 0 for sub in subs][::-1], color="tab:green", height=0.4,
                         label="accepted")
            axes[1].set_title("Deliveries per subscriber")
            axes[1].legend(fontsize=8)
            axes[1].tick_params(axis="y", labelsize=7)
        fig.tight_layout()
        figs["counts"] = _png(fig)
    return figs


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


def _table(headers: list[str], rows: list[list], numeric: set[int] = frozenset()) -> str:
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


def write_html(report: dict, path: Path) -> None:
    s = report["summary"]
    v = report["verdict"]
    figs = _figures(report)
    parts = [f"<!doctype html><html><head><meta charset='utf-8'><title>eorouter reconciliation</title>"
             f"<style>{_CSS}</style></head><body>",
             "<h1>eorouter: reconciliation of the routers' event logs</h1>",
             f"<p><small>{html.escape(', '.join(report['inputs']))} &middot; generated "
             f"{html.escape(report['generated'])} &middot; {report['elapsed_s']:.1f} s</small></p>"]
    cls = "ok" if v["proven_clean"] else "bad"
    parts.append(f"<div class='verdict {cls}'>{'Proven clean' if v['proven_clean'] else 'NOT clean'}: "
                 f"{html.escape(v['line'])}</div>")
    parts.append(_table(["check", "result", "count", "counts"],
                        [[c["title"], "ok" if c["ok"] else "FAIL", c["count"], c["unit"]] for c in v["checks"]],
                        {2}))
    lat = s["latency"]
    parts.append("<h2>The run</h2>")
    parts.append(_table(["", ""], [
        ["routers", ", ".join(s["routers"])], ["events", s["events"]],
        ["publisher deliveries", s["deliveries"] or 0],
        ["publisher outcomes", ", ".join(f"{k} {n:,}" for k, n in sorted(s["pub_outcomes"].items()))],
        ["refused before a record existed", s["refused_before_record"]],
        ["pre-settled (best effort, not owed)", s["presettled"]],
        ["latency p50 / p90 / p99 / max", " / ".join(f"{lat[k] * 1000:.1f} ms" for k in ("p50", "p90", "p99", "max"))
         if lat else "-"],
    ], {1}))
    parts.append("<h3>Router epochs</h3>")
    parts.append(_table(["router", "epoch", "boot", "first line (UTC)", "last line (UTC)", "lines", "end"], [
        [e["router"], e["epoch"], e["boot"], _utc(e["first_ts"]), _utc(e["last_ts"]), e["lines"],
         "stopped" if e["stopped"] else "died (or still running)"] for e in s["epochs"]], {1, 5}))
    if s["records_lost_with_router"]:
        parts.append("<p>Records that went with a router that died (their obligations are judged by the loss "
                     "proof):</p>")
        parts.append(_table(["router", "epoch", "records"], [[r["router"], r["epoch"], r["records"]]
                                                             for r in s["records_lost_with_router"]], {1, 2}))
    for key, title in (("rate", "Deliveries per second per router"), ("latency", "End-to-end latency"),
                       ("counts", "Per topic and per subscriber")):
        if key in figs:
            parts.append(f"<h2>{title}</h2><img alt='{title}' src='data:image/png;base64,{figs[key]}'>")
    parts.append("<h3>Topics</h3>")
    parts.append(_table(["topic", "deliveries", "accepted"], [[t["topic"], t["deliveries"], t["accepted"] or 0]
                                                              for t in s["per_topic"]], {1, 2}))
    parts.append("<h3>Subscribers</h3>")
    parts.append(_table(["subscriber", "owed", "accepted", "rejected", "released", "modified", "none"],
                        [[x["subscriber"], x["owed"], x["accepted"], x["rejected"], x["released"], x["modified"],
                          x["none"]] for x in s["per_subscriber"]], {1, 2, 3, 4, 5, 6}))
    parts.append("<h2>Violations</h2>")
    if report["violations"]:
        parts.append(f"<p>The first {report['first']} of each check (all counts are in the table above).</p>")
        parts.append(_table(["check", "delivery", "router", "subscriber", "when (UTC)", "detail"], [
            [r["check"], r["delivery"], r["router"], r["subscriber"], _utc(r["ts"]), r["detail"]]
            for r in report["violations"]]))
    else:
        parts.append("<p class='ok'>None.</p>")
    parts.append("<h2>Event kinds</h2>")
    parts.append(_table(["event", "count"], [[k, n] for k, n in s["kinds"].items()], {1}))
    parts.append("</body></html>")
    path.write_text("\n".join(parts), encoding="utf-8")


def _utc(ts) -> str:
    if ts is None:
        return ""
    return time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(ts)) + f".{int((ts % 1) * 1000):03d}"
