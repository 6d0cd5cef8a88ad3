"""The reconciliation: every invariant of docs/reconcile.md, as DataFrame transformations.

How it runs (docs/reconcile.md, "How it runs"):

1. **Lines.** Every line of every input, as read (spark/load.py: explicit schema, each
   line's file, the text of a line Spark could not read whole), with what is wrong
   with it, if anything (``validate``). A JSON input is parsed once and cached
   (columnar); a Parquet input is read again instead.
2. **Per router** (``input_facts``): one hash aggregation of ``(router, epoch, seq)``
   into 64-bit words of bits (``bit_or``): its partial step leaves one row per 64
   lines to shuffle, and it finds every missing and every repeated ``seq`` exactly.
   The lines that name no delivery (links, routes, peers: few) are collected; the
   small per-router tables the proofs need are made from them on the driver
   (``small_tables``) and handed to the per-delivery pass as constants.
3. **Per delivery** (``delivery_facts``): the events that name a delivery, one
   shuffle by delivery id (its 64-bit hash), sorted, grouped into one row per
   delivery (``ev``: its events on every router and epoch, in (router, epoch, seq)
   order), and one projection with Spark's built-in higher-order functions (compiled
   by Spark: no Python runs on a row) that decides every per-delivery invariant,
   excuses included, and yields its violations (``v``: usually empty) and the few
   facts the other checks and the summary read. Cached: one row per delivery.
4. **Across deliveries**, from those facts: one publisher delivery under two ids,
   publisher order per subscriber, the applications' ledgers.

A violation is a row of ``VIOLATION_COLUMNS``: where (delivery, router, epoch,
seq, subscriber, publisher and tag, file and line) and ``info`` (JSON: the
check's own facts). ``describe()`` writes its sentence, on the driver, only for
the violations the report lists. Run it with ``eorouter reconcile LOGDIR...``
or ``spark-submit spark/reconcile.py LOGDIR...``.
"""

from __future__ import annotations

import json
import re
import sys
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

if __name__ == "__main__" and __package__ in (None, ""):  # spark-submit spark/reconcile.py
    # Run as a file: import the package from the checkout this file is in (and not
    # this directory's modules as top-level ones).
    _here = str(Path(__file__).resolve().parent)
    sys.path[:] = [p for p in sys.path if p and str(Path(p).resolve()) != _here]
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pyspark import StorageLevel
from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F
from pyspark.sql import types as T

from router.eventlog import EVENT_SCHEMA, EVENTS
from spark.schema import CORRUPT, FILE

# ---------------------------------------------------------------------------
# Vocabulary
# ---------------------------------------------------------------------------

#: Every check, in the order the verdict lists them: (name, title, what one item is).
#: docs/reconcile.md has the table of what each needs and catches; the tests
#: (tests/spark/test_spec.py) hold that table and this one to each other.
CHECKS = (
    ("malformed-line", "every line well-formed", "lines"),
    ("seq-gap", "no sequence gap", "runs of missing seq"),
    ("seq-repeated", "no repeated seq", "repeated seq numbers"),
    ("router-log-missing", "every router's log", "routers or epochs"),
    ("lost", "no loss", "deliveries"),
    ("duplicated", "no duplicates", "subscriber x publisher delivery"),
    ("out-of-order", "publisher order", "subscriber x delivery"),
    ("invented", "nothing invented", "deliveries"),
    ("record-missing", "every event has its record", "router x epoch x delivery"),
    ("arrival-unforwarded", "every arrival was forwarded", "router x delivery"),
    ("accept-unowed", "every answer was owed", "subscriber x delivery"),
    ("accept-unsent", "every answer was sent first", "subscriber x router x delivery"),
    ("answer-missing", "every router's answer reached its origin", "origin x router x delivery"),
    ("outcome-disagrees", "publisher outcome follows the subscribers'", "deliveries"),
    ("left-unsettled", "clean end", "router x delivery"),
    ("ledger", "router vs applications", "mismatches"),
)
CHECK_NAMES = tuple(name for name, _, _ in CHECKS)

#: Columns every check's output has. ``item`` is what the check counts (distinct);
#: ``info`` is JSON with the check's own facts (describe() turns it into a sentence).
VIOLATION_COLUMNS = ("check", "item", "delivery", "router", "epoch", "seq", "subscriber", "publisher", "pub_tag",
                     "file", "line", "ts", "info")
_VIOLATION_TYPES = {"epoch": "long", "seq": "long", "line": "long", "ts": "double"}

#: Kind codes: the per-delivery rows carry a small integer, not the kind's name.
#: A kind the proof does not reason about (a kind added to router/eventlog.py
#: later, say) is 0: read, counted, never judged.
KIND = {"received": 1, "forwarded": 2, "sub-outcome": 3, "pub-outcome": 4, "settled": 5, "record-deleted": 6,
        "expired": 7, "forwarded-to-router": 8, "outcome-to-router": 9, "outcome-from-router": 10,
        "settlement-relayed": 11, "resend-matched": 12, "origin-taken-over": 13, "placeholder-created": 14,
        "placeholder-fulfilled": 15, "placeholder-expired": 16, "placeholder-settled": 17, "owed-moved": 18,
        "owed-state-discarded": 19, "tag-collision": 20, "dropped": 21, "order-gap": 22}
KIND_NAME = {code: name for name, code in KIND.items()} | {0: "other"}
#: The kinds in the order a CASE expression tests them: the most frequent first.
_FREQUENT = ("sub-outcome", "received", "pub-outcome", "settled", "record-deleted", "forwarded", "outcome-to-router",
             "outcome-from-router", "forwarded-to-router", "settlement-relayed", "expired")
_BY_FREQUENCY = _FREQUENT + tuple(k for k in KIND if k not in _FREQUENT)
OUTCOME = {"accepted": 1, "rejected": 2, "released": 3, "modified": 4, "none": 5}
OUTCOME_NAME = {code: name for name, code in OUTCOME.items()} | {6: "other", 7: "expired"}
ACC = OUTCOME["accepted"]
EXPIRED = 7  # an `expired` event, where a subscriber's answer is reported
TERMINAL_NOT_ACCEPTED = (2, 3, 4)
BY = {"router": 1, "publisher": 2, "publisher-gone": 3, "origin-router": 4, "settled-elsewhere": 5,
      "publisher-resumed": 6}
BY_NAME = {code: name for name, code in BY.items()} | {7: "other"}
#: A pub-outcome answered from the router's memory of a finished delivery
#: (docs/resumption.md): no record needed, only some earlier event about it.
REMEMBERED = "resent after it was finished and settled; outcome remembered"

#: Events that name a delivery some router must have received ("nothing
#: invented"). Not tag-collision, dropped, order-gap or placeholder-*: those name
#: a tag the router refused, dropped, holds back or has not seen yet.
REFERENCING = ("forwarded", "sub-outcome", "pub-outcome", "settled", "record-deleted", "expired",
               "outcome-to-router", "outcome-from-router", "settlement-relayed", "forwarded-to-router",
               "resend-matched", "origin-taken-over", "owed-moved", "owed-state-discarded")
#: Events a router logs only about a record it holds in that epoch: each must
#: follow a `received` of the delivery on the same router in the same epoch.
#: Not forwarded-to-router (a relay forwards without a record) and not the
#: kinds that name a delivery the router has not seen.
NEEDS_RECORD = ("forwarded", "sub-outcome", "pub-outcome", "settled", "record-deleted", "expired",
                "outcome-to-router", "outcome-from-router", "settlement-relayed", "resend-matched",
                "origin-taken-over", "owed-moved", "owed-state-discarded", "placeholder-fulfilled")
#: Kinds whose line must name a delivery.
NAMES_DELIVERY = ("received", "forwarded", "sub-outcome", "expired", "outcome-to-router", "outcome-from-router",
                  "forwarded-to-router", "settled", "record-deleted", "settlement-relayed", "completed")
#: Kinds that name no delivery: links, routers, peers, routes (the per-router tables).
LIFE_KINDS = ("router-started", "router-stopping", "link-attached", "link-detached", "subscription-expired",
              "routes", "peer-connected", "peer-lost", "peer-restarted", "resume-requested")
_LIFE_COLUMNS = ("router", "epoch", "seq", "ts", "boot", "event", "link", "container", "name", "role", "address",
                 "durable", "closed", "reason", "reachable", "peer", "peer_epoch")

#: Wall-clock tolerance (seconds) when a cross-router fact can only be placed in
#: time by ts (routers' events are ordered by (epoch, seq) only within a router).
CLOCK_SLACK = 5.0

#: Folded lines (router.eventlog.FOLDED) stand for several events at their seq.
COMPLETED, SUB_OUTCOMES = "completed", "sub-outcomes"
#: Column added by unfold(): true only on the first event of a line.
FIRST = "_first_of_line"
#: Column added by validate(): what is wrong with a line (null: nothing).
PROBLEM = "_problem"


def _empty() -> Column:
    return F.array().cast("array<string>")


# ---------------------------------------------------------------------------
# Small helpers
# ---------------------------------------------------------------------------

def _code(column: Column, names: tuple, table: dict, other: int) -> Column:
    """A CASE expression mapping ``names`` (tested in that order) to their codes in
    ``table`` (unknown: ``other``; null: null)."""
    expr = None
    for name in names:
        code = F.lit(table[name])
        expr = F.when(column == name, code) if expr is None else expr.when(column == name, code)
    return F.when(column.isNull(), F.lit(None)).otherwise(expr.otherwise(F.lit(other)))


def _key(container: Column, name: Column) -> Column:
    return F.concat_ws("/", container, name)


def violation(check: str, item: Column, *, r=None, e=None, q=None, t=None, s=None, info: dict | None = None) -> Column:
    """One violation as a struct, inside the per-delivery projection."""
    def col(value, type_):
        return F.lit(None).cast(type_) if value is None else value.cast(type_)
    return F.struct(F.lit(check).alias("check"), item.cast("string").alias("item"), col(r, "string").alias("router"),
                    col(e, "long").alias("epoch"), col(q, "long").alias("seq"), col(t, "double").alias("ts"),
                    col(s, "string").alias("subscriber"),
                    (F.to_json(F.struct(*[v.alias(k) for k, v in info.items()])) if info else
                     F.lit(None).cast("string")).alias("info"))


def violations(df: DataFrame, check: str, item: Column, info: dict | None = None, **cols) -> DataFrame:
    """``df`` as violations of ``check``: one row per row of ``df``."""
    def col(name):
        value = cols.get(name)
        type_ = _VIOLATION_TYPES.get(name, "string")
        if value is None:
            return F.lit(None).cast(type_).alias(name)
        return (F.col(value) if isinstance(value, str) else value).cast(type_).alias(name)
    info_col = F.to_json(F.struct(*[(F.col(v) if isinstance(v, str) else v).alias(k) for k, v in info.items()])) \
        if info else F.lit(None).cast("string")
    return df.select(F.lit(check).alias("check"), item.cast("string").alias("item"),
                     *[col(n) for n in VIOLATION_COLUMNS[2:12]], info_col.alias("info"))


def violation_schema() -> T.StructType:
    return T.StructType([T.StructField(n, T.DoubleType() if n == "ts" else T.LongType()
                                       if n in ("epoch", "seq", "line") else T.StringType())
                         for n in VIOLATION_COLUMNS])


def union_all(frames: list[DataFrame]) -> DataFrame:
    """One union of many frames of one schema, built as a balanced tree (each step
    of a chain would analyse the whole plan again)."""
    while len(frames) > 1:
        frames = [frames[i].unionByName(frames[i + 1]) if i + 1 < len(frames) else frames[i]
                  for i in range(0, len(frames), 2)]
    return frames[0]


def _json_literal(value, type_: str) -> Column:
    """A constant of Spark type ``type_`` (folded by the optimizer: from_json of a
    literal is computed once, when the query is planned)."""
    return F.from_json(F.lit(json.dumps(value)), type_)


# ---------------------------------------------------------------------------
# 1. Lines: what is wrong with each
# ---------------------------------------------------------------------------

_KNOWN_KINDS = tuple(EVENTS)
_TYPED = tuple((name, type_) for kind in EVENTS.values() for name, type_ in kind.items())


def validate(lines: DataFrame) -> DataFrame:
    """Adds ``PROBLEM``: why a line is not a well-formed event, or null. A line is
    malformed when Spark could not read it whole (not JSON, not an object, or a
    field of the wrong type: Spark then keeps the other fields and the text),
    when a common field is missing, when its kind is unknown, when its seq or epoch
    is below 1, or when a kind about one delivery names none."""
    raw = F.col(CORRUPT)
    common = [name for name in EVENT_SCHEMA if name in lines.columns]
    any_missing = F.lit(False)
    for name in common:
        any_missing = any_missing | F.col(name).isNull()
    missing = F.concat_ws(", ", *[F.when(F.col(name).isNull(), F.lit(name)) for name in common])
    # Which field Spark could not convert: its value is null though the text has it.
    typed = dict(list(EVENT_SCHEMA.items()) + list(_TYPED))
    wrong = F.concat_ws(", ", *[
        F.when(F.col(name).isNull() & raw.contains(f'"{name}":') & ~raw.contains(f'"{name}":null'),
               F.lit(f"{name} is not {typed[name]}"))
        for name in typed if name in lines.columns])
    nothing_parsed = F.col("seq").isNull() & F.col("router").isNull() & F.col("event").isNull()
    problem = (
        F.when(raw.isNotNull() & nothing_parsed,
               F.when(F.trim(raw).startswith("{"), F.lit("unparsable line (not valid JSON)"))
               .otherwise(F.lit("unparsable line (not a JSON object)")))
        .when(raw.isNotNull(), F.concat(F.lit("wrong type: "),
                                        F.when(wrong != "", wrong).otherwise(F.lit("a field Spark could not read"))))
        .when(any_missing, F.concat(F.lit("missing common field(s): "), missing))
        .when(~F.col("event").isin(*_KNOWN_KINDS), F.concat(F.lit("unknown event kind "), F.col("event")))
        .when((F.col("seq") < 1) | (F.col("epoch") < 1), F.lit("seq and epoch start at 1"))
        .when(F.col("event").isin(*NAMES_DELIVERY) & F.col("delivery").isNull()
              & ~((F.col("event") == SUB_OUTCOMES) & F.col("deliveries").isNotNull()),
              F.concat(F.lit("a "), F.col("event"), F.lit(" event without its delivery")))
        .when((F.col("event") == SUB_OUTCOMES) & (F.coalesce(F.size("deliveries"), F.lit(0)) < 1),
              F.lit("a sub-outcomes line without deliveries")))
    return lines.withColumn(PROBLEM, problem)


# ---------------------------------------------------------------------------
# 2. Unfolding: a folded line is the events it stands for (no higher-order function)
# ---------------------------------------------------------------------------

def unfold(lines: DataFrame) -> DataFrame:
    """Every folded line as the events it stands for (router.eventlog.unfold(), same
    seq, in the same order), with one ``posexplode`` of an array built without any
    higher-order function. Adds ``FIRST`` (true on a line's first event) and ``_pos``
    (the event's place in its line). A "completed" line is its sub-outcome, its
    pub-outcome and, when ``by`` is set, its settled; a "sub-outcomes" line one
    sub-outcome per element of ``deliveries``."""
    has_completed = "pub_outcome" in lines.columns
    has_runs = "deliveries" in lines.columns
    if not (has_completed or has_runs):
        return lines.withColumn(FIRST, F.lit(True)).withColumn("_pos", F.lit(0))
    kind = F.col("event")
    d = F.col("delivery")
    parts = None
    if has_runs:
        parts = F.when((kind == SUB_OUTCOMES) & (F.size("deliveries") > 0), F.col("deliveries"))
    if has_completed:
        three = (kind == COMPLETED) & F.col("by").isNotNull()
        parts = (parts.when(three, F.array(d, d, d)) if parts is not None else F.when(three, F.array(d, d, d)))
        parts = parts.when(kind == COMPLETED, F.array(d, d))
    parts = parts.otherwise(F.array(d))
    x = lines.select("*", F.posexplode(parts).alias("_pos", "_d"))
    pos = F.col("_pos")
    completed = (kind == COMPLETED) if has_completed else F.lit(False)
    new_kind = F.when(completed, F.element_at(F.array(F.lit("sub-outcome"), F.lit("pub-outcome"),
                                                      F.lit("settled")), pos + 1))
    if has_runs:
        new_kind = new_kind.when((kind == SUB_OUTCOMES) & (F.size("deliveries") > 0), F.lit("sub-outcome"))
    new_kind = new_kind.otherwise(kind)

    def only(p: int, name: str) -> Column:  # a "completed" line's field belongs to one of its events
        return F.when(completed & (pos != p), F.lit(None)).otherwise(F.col(name))

    columns = {"event": new_kind, "delivery": F.col("_d")}
    if has_completed:
        columns.update({
            "subscriber": only(0, "subscriber"), "settled": only(0, "settled"),
            "outcome": F.when(completed & (pos == 1), F.col("pub_outcome"))
            .when(completed & (pos == 2), F.lit(None)).otherwise(F.col("outcome")),
            "condition": only(1, "condition"), "reason": only(1, "reason"),
            "by": only(2, "by"), "deleted": only(2, "deleted"),
        })
    keep = [c for c in lines.columns if c not in ("pub_outcome", "deliveries")]
    return x.select(*[columns[c].cast(lines.schema[c].dataType).alias(c) if c in columns else F.col(c)
                      for c in keep], (pos == 0).alias(FIRST), pos.alias("_pos"))


# ---------------------------------------------------------------------------
# The tables the proofs share
# ---------------------------------------------------------------------------

@dataclass
class Tables:
    """What the proofs read. ``lines``: every line, validated. ``facts``: one row per
    delivery (cached). ``input``: what input_facts() collected. ``small``: the small
    per-router tables (Python values, made on the driver from the few lines that
    name no delivery)."""
    lines: DataFrame
    facts: DataFrame
    input: dict
    small: dict
    partitions: int = 0
    persisted: list = field(default_factory=list)

    def unpersist(self) -> None:
        for frame in self.persisted:
            frame.unpersist()
        self.persisted.clear()

    @property
    def epochs(self) -> list[dict]:
        return self.input["epochs"]


# ---------------------------------------------------------------------------
# Per router: sequence numbers and epochs
# ---------------------------------------------------------------------------

_WORD = 64  # the sequence check packs 64 seq numbers into one long


def input_facts(lines: DataFrame, first_bad: int = 1000) -> dict:
    """Everything about the input itself, in three small jobs over ``lines``:

    - per (router, epoch): its extent (first/last ts, lines), whether it stopped in
      order, and every missing or repeated ``seq``, exactly: each line sets one bit
      of a 64-bit word (word ``(seq - 1) div 64``) with ``bit_or``, a hash
      aggregation whose partial step leaves one row per 64 lines to shuffle; an epoch
      whose words hold fewer bits than its highest seq has a gap, one with more
      lines than bits repeats a seq. Only then (cold path) are the words read again
      to name the missing numbers, and the lines to name the repeated ones;
    - how many lines are malformed, and every router the events about deliveries
      name (to find the routers whose log is missing);
    - the lines that name no delivery (links, routes, peers: few), collected;
    - the first ``first_bad`` malformed lines (cold path).
    """
    good = F.col("router").isNotNull() & F.col("epoch").isNotNull() & F.col("seq").isNotNull() & (F.col("seq") > 0)
    word = F.floor((F.col("seq") - 1) / _WORD).cast("long")
    bit = F.expr(f"shiftleft(1L, cast((seq - 1) % {_WORD} as int))")
    per_word = lines.where(good).groupBy("router", "epoch", word.alias("w")).agg(
        F.bit_or(bit).alias("bits"), F.count(F.lit(1)).alias("lines"), F.max("seq").alias("hi"),
        F.min("ts").alias("first_ts"), F.max("ts").alias("last_ts"),
        F.min(F.when(F.col("event") == "router-stopping", F.col("seq"))).alias("stopping_seq"),
        F.min(F.when(F.col("event") == "router-stopping", F.col("ts"))).alias("stopping_ts"))
    per_epoch = per_word.groupBy("router", "epoch").agg(
        F.sum(F.bit_count("bits")).alias("distinct"), F.sum("lines").alias("lines"), F.max("hi").alias("last_seq"),
        F.min("first_ts").alias("first_ts"), F.max("last_ts").alias("last_ts"),
        F.min("stopping_seq").alias("stopping_seq"), F.min("stopping_ts").alias("stopping_ts"))
    epochs = {(r["router"], r["epoch"]): r.asDict() for r in per_epoch.collect()}
    totals = lines.agg(
        F.sum(F.col(PROBLEM).isNotNull().cast("long")).alias("bad"),
        F.array_distinct(F.flatten(F.collect_set(F.array_compact(F.concat(
            F.array("origin_router", "to_router", "from_router"), F.coalesce(F.col("routers"), _empty()),
            F.coalesce(F.col("dests"), _empty())))))).alias("named")).collect()[0]
    life = [r.asDict() for r in lines.where(F.col("event").isin(*LIFE_KINDS) & F.col(PROBLEM).isNull())
            .select(*_LIFE_COLUMNS).collect()]
    gaps, repeats = [], []
    for key, e in epochs.items():
        e["first_seq"] = 1 if e["distinct"] == e["last_seq"] else None
        if e["distinct"] != e["last_seq"]:
            gaps.append(key)
        if e["lines"] != e["distinct"]:
            repeats.append(key)
    runs = []
    if gaps:  # cold path: the words of the epochs with a gap name the missing numbers
        wanted = [F.struct(F.lit(r).alias("router"), F.lit(e).alias("epoch")) for r, e in gaps]
        words: dict = defaultdict(dict)
        for h in per_word.where(F.struct("router", "epoch").isin(*wanted)).select("router", "epoch", "w", "bits") \
                .collect():
            words[(h["router"], h["epoch"])][h["w"]] = h["bits"]
        for key in gaps:
            last = epochs[key]["last_seq"]
            found = _missing(words[key], last)
            runs += [(key[0], key[1], lo, hi) for lo, hi in found]
            epochs[key]["first_seq"] = found[0][1] + 1 if found and found[0][0] == 1 else 1
    repeated = []
    if repeats:  # cold path: which seq numbers, on which lines
        wanted = [F.struct(F.lit(r).alias("router"), F.lit(e).alias("epoch")) for r, e in repeats]
        repeated = [r.asDict() for r in lines.where(good & F.struct("router", "epoch").isin(*wanted))
                    .groupBy("router", "epoch", "seq").agg(
                        F.count(F.lit(1)).alias("n"), F.array_sort(F.collect_set(FILE)).alias("files"),
                        F.array_sort(F.collect_set("event")).alias("kinds"), F.min("ts").alias("ts"))
                    .where(F.col("n") > 1).orderBy("router", "epoch", "seq").limit(10_000).collect()]
    bad = []
    if totals["bad"]:
        bad = [r.asDict() for r in lines.where(F.col(PROBLEM).isNotNull()).select(
            "router", "epoch", "seq", "event", "ts", FILE, PROBLEM, CORRUPT).limit(first_bad).collect()]
    for r in life:  # the boot of each epoch (from its router-started line)
        if r["event"] == "router-started" and (r["router"], r["epoch"]) in epochs:
            e = epochs[(r["router"], r["epoch"])]
            if e.get("started_seq") is None or r["seq"] < e["started_seq"]:
                e.update(started_seq=r["seq"], started_ts=r["ts"], boot=r["boot"])
    for e in epochs.values():
        e.setdefault("started_ts", None)
        e.setdefault("boot", None)
        e["stopped"] = e["stopping_seq"] is not None
    ordered = sorted(epochs, key=lambda k: (str(k[0]), k[1]))
    return {"epochs": [epochs[k] for k in ordered], "gaps": runs, "repeated": repeated, "bad": bad,
            "bad_count": totals["bad"] or 0, "named_routers": sorted(totals["named"] or []), "life": life}


def _missing(words: dict[int, int], last: int) -> list[tuple[int, int]]:
    """Runs (from, to) of seq numbers in 1..last whose bit is not set in ``words``
    (word w, bit b stands for seq w * 64 + b + 1; ``bits`` is a signed long)."""
    runs, start = [], None
    for w in range((last - 1) // _WORD + 1):
        bits = words.get(w, 0) & 0xFFFFFFFFFFFFFFFF
        if bits == 0xFFFFFFFFFFFFFFFF and start is None:
            continue
        for b in range(_WORD):
            seq = w * _WORD + b + 1
            if seq > last:
                break
            present = bits >> b & 1
            if not present and start is None:
                start = seq
            elif present and start is not None:
                runs.append((start, seq - 1))
                start = None
    if start is not None:
        runs.append((start, last))
    return runs


# ---------------------------------------------------------------------------
# The small per-router tables (on the driver, from the lines that name no delivery)
# ---------------------------------------------------------------------------

def small_tables(life: list[dict], epochs: list[dict]) -> dict:
    """From the collected lines that name no delivery:

    - ``ends``: (router, epoch, subscriber) -> the moments a subscription stopped
      being owed what it had not answered (docs/delivery-rule.md): a detach of a
      non-durable link, a closing detach, a durable subscriber that moved away (not
      a stolen link: the subscription carries on on the new one),
      ``subscription-expired``, and the name attaching again (``re-attached``: counts
      only for deliveries of another topic);
    - ``durable``: (router, epoch, subscriber) -> each attach's durability, valid from
      its seq to the next attach;
    - ``windows``: (router, epoch, subscriber) -> (attach seq, resume-requested seq): a
      sub-outcome logged between them is an answer a resuming subscriber *reported*
      (docs/resumption.md), the same answer again, not a new one;
    - ``routes``: (router, epoch) -> its `routes` events (seq, ts, reachable);
    - ``gone``: router -> (ts, topic) when it lost interest in a topic (a
      subscription ended there) or stopped or died (topic null);
    - ``died``: the (router, epoch) that ended without `router-stopping`;
    - ``attached``: every subscriber key that attached anywhere;
    - ``peers``: (peer, peer_epoch) -> the first (router, epoch, seq) that saw it.
    """
    def key(*parts) -> str:
        return "|".join(str(p) for p in parts)

    rows = sorted(life, key=lambda r: (str(r["router"]), r["epoch"], r["seq"]))
    attaches: dict = defaultdict(list)  # (router, epoch, link) -> [(seq, durable, topic)]
    ends: dict = defaultdict(list)
    durable: dict = defaultdict(list)
    windows: dict = defaultdict(list)
    routes: dict = defaultdict(list)
    gone: dict = defaultdict(list)
    attached: set = set()
    peers: dict = {}
    pending_attach: dict = {}  # (router, epoch, link) -> (seq, subscriber)
    for r in rows:
        router, epoch, seq, kind = r["router"], r["epoch"], r["seq"], r["event"]
        sub = f"{r['container']}/{r['name']}" if r.get("container") is not None else None
        if kind == "link-attached" and r["role"] == "subscriber":
            attaches[(router, epoch, r["link"])].append((seq, r["durable"] or 0, r["address"]))
            ends[key(router, epoch, sub)].append({"seq": seq, "kind": "re-attached", "topic": r["address"]})
            durable[key(router, epoch, sub)].append({"from": seq, "durable": r["durable"] or 0})
            pending_attach[(router, epoch, r["link"])] = (seq, sub)
            attached.add(sub)
        elif kind == "resume-requested" and r["role"] == "subscriber":
            found = pending_attach.pop((router, epoch, r["link"]), None)
            if found is not None and found[0] < seq:
                windows[(router, epoch, found[1])].append([found[0], seq])
        elif kind == "link-detached" and r["role"] == "subscriber":
            before = [a for a in attaches.get((router, epoch, r["link"]), []) if a[0] < seq]
            link_durable, topic = (before[-1][1], before[-1][2]) if before else (None, None)
            reason = r.get("reason") or ""
            if reason != "stolen" and (r.get("closed") or (link_durable or 0) == 0 or reason == "moved"):
                ends[key(router, epoch, sub)].append({"seq": seq, "kind": "closed" if r.get("closed") else "detached",
                                                      "topic": topic})
                gone[router].append({"ts": r["ts"], "topic": topic})
        elif kind == "subscription-expired":
            ends[key(router, epoch, sub)].append({"seq": seq, "kind": "subscription-expired",
                                                  "topic": r["address"]})
            gone[router].append({"ts": r["ts"], "topic": r["address"]})
        elif kind == "routes":
            routes[key(router, epoch)].append({"seq": seq, "ts": r["ts"], "reachable": r["reachable"] or []})
        elif kind in ("peer-connected", "peer-restarted") and r.get("peer") is not None \
                and r.get("peer_epoch") is not None:
            peers.setdefault((r["peer"], r["peer_epoch"]), (router, epoch, seq))
    for spans in durable.values():  # each attach's durability lasts until the next attach
        for a, b in zip(spans, spans[1:]):
            a["to"] = b["from"]
        spans[-1]["to"] = 2**62
    merged: dict = {}
    for k, spans in windows.items():  # overlapping windows of one subscriber merged
        out: list = []
        for a, b in sorted(spans):
            if out and a < out[-1][1]:
                out[-1][1] = max(out[-1][1], b)
            else:
                out.append([a, b])
        merged[k] = out
    died = [key(e["router"], e["epoch"]) for e in epochs if not e["stopped"]]
    for e in epochs:
        end = e["stopping_ts"] if e["stopping_ts"] is not None else e["last_ts"]
        gone[e["router"]].append({"ts": end, "topic": None})
    return {"ends": dict(ends), "durable": dict(durable), "windows": merged, "routes": dict(routes),
            "gone": dict(gone), "died": died, "attached": sorted(attached), "peers": peers}


# ---------------------------------------------------------------------------
# Bad lines: where, and torn or not
# ---------------------------------------------------------------------------

def last_files(files: list[str]) -> set:
    """Of ``files``, those that are the last of their epoch in their directory (a
    file not named events-<epoch>-<n>.jsonl counts as one: nothing says otherwise)."""
    last: dict = {}
    out = set()
    for path in files:
        m = re.search(r"events-(\d+)-(\d+)\.jsonl$", path)
        if not m:
            out.add(path)
            continue
        key = (path.rsplit("/", 1)[0], int(m.group(1)))
        if key not in last or int(m.group(2)) > last[key][0]:
            last[key] = (int(m.group(2)), path)
    return out | {path for _, path in last.values()}


def locate_bad_lines(spark, lines: DataFrame, bad: list[dict]) -> list[dict]:
    """Line numbers for the malformed lines ``bad`` of ``lines`` (cold path: only the
    files that hold one are read again, as text, numbered in file order and judged
    again with the same rules), and which of them is a torn write: an unparsable
    last line of the last file of its epoch, cut by a crash (a note, not a
    violation; docs/event-log.md, "Torn lines"). A line whose file cannot be read
    again (a Parquet dataset whose JSON is gone) is listed as it was read."""
    from spark.load import line_schema
    finals = last_files([r[0] for r in lines.select(FILE).distinct().collect()])
    files = sorted({b[FILE] for b in bad})
    out = []
    for path in files:
        if not path or not path.endswith(".jsonl") or not _readable(spark, path):
            out += [{**b, "line": None, "torn": False} for b in bad if b[FILE] == path]
            continue
        text = spark.read.text(path).select(
            "value", F.struct(F.col("_metadata.file_block_start"), F.monotonically_increasing_id()).alias("at"))
        numbered = text.withColumn("line", F.row_number().over(Window.orderBy("at")))
        total = numbered.count()
        parsed = numbered.where(F.trim("value") != "").select(
            "line", F.col("value").alias("raw_line"),
            F.from_json("value", line_schema(), {"mode": "PERMISSIVE",
                                                 "columnNameOfCorruptRecord": CORRUPT}).alias("j"))
        judged = validate(parsed.select("line", "raw_line", "j.*"))
        for r in judged.where(F.col(PROBLEM).isNotNull()).select(
                "line", "raw_line", "router", "epoch", "seq", "event", "ts", PROBLEM, CORRUPT).orderBy("line") \
                .limit(1000).collect():
            torn = (r["line"] == total and path in finals and r[PROBLEM].startswith("unparsable"))
            out.append({"router": r["router"], "epoch": r["epoch"], "seq": r["seq"], "event": r["event"],
                        "ts": r["ts"], FILE: path, PROBLEM: r[PROBLEM], CORRUPT: r["raw_line"], "line": r["line"],
                        "torn": torn})
    return out


def _readable(spark, path: str) -> bool:
    try:
        jvm = spark.sparkContext._jvm
        hadoop_path = jvm.org.apache.hadoop.fs.Path(path)
        return hadoop_path.getFileSystem(spark.sparkContext._jsc.hadoopConfiguration()).exists(hadoop_path)
    except Exception:  # noqa: BLE001 (any file system's refusal means: cannot read it again)
        return False


# ---------------------------------------------------------------------------
# 3. Per delivery: one row per delivery, every per-delivery invariant
# ---------------------------------------------------------------------------

#: One event of a delivery, as the per-delivery row holds it (names kept short:
#: there are ~14 of them per delivery, 10 million at scale).
#:   r router, e epoch, q seq, t ts, k kind code, s subscriber, o outcome code,
#:   p the other router (origin_router, to_router or from_router), l a list (owed,
#:   dests or subscribers), f forwarded, x routers, b settled (received, sub-outcome)
#:   or deleted (settled), y settled's by code, or 1 for a remembered pub-outcome,
#:   n a pub-outcome's reason, rep a sub-outcome a resuming subscriber reported.
EVENT_FIELDS = ("r", "e", "q", "t", "k", "s", "o", "p", "l", "f", "x", "b", "y", "n", "rep")


def narrow(events: DataFrame, windows: dict) -> DataFrame:
    """The events that name a delivery, as (h, delivery, id, _pos, the EVENT_FIELDS).
    ``windows``: small_tables()' resume windows (a broadcast join marks the reported
    answers; none without a resumed subscriber)."""
    kind = F.col("event")
    out = events.where(F.col("delivery").isNotNull() & F.col(PROBLEM).isNull()).select(
        F.xxhash64("delivery").alias("h"), "delivery", F.col("router").alias("r"), F.col("epoch").alias("e"),
        F.col("seq").alias("q"), F.col("ts").alias("t"), _code(kind, _BY_FREQUENCY, KIND, 0).alias("k"),
        F.col("subscriber").alias("s"), _code(F.col("outcome"), tuple(OUTCOME), OUTCOME, 6).alias("o"),
        F.coalesce(F.col("origin_router"), F.col("to_router"), F.col("from_router")).alias("p"),
        F.when(kind == "received", F.col("owed")).when(kind == "forwarded-to-router", F.col("dests"))
        .when(kind == "owed-moved", F.col("subscribers")).alias("l"),
        F.when(kind == "received", F.col("forwarded")).alias("f"),
        F.when(kind == "received", F.col("routers")).alias("x"),
        F.when(kind == "settled", F.col("deleted")).otherwise(F.col("settled")).alias("b"),
        F.when(kind == "settled", _code(F.col("by"), tuple(BY), BY, 7))
        .when((kind == "pub-outcome") & (F.col("reason") == REMEMBERED), F.lit(1)).alias("y"),
        F.when(kind == "pub-outcome", F.coalesce(F.col("reason"), F.col("condition"))).alias("n"),
        F.when(kind == "received", F.struct("topic", "publisher", "link_name", "incarnation", "pub_tag",
                                            "stream_seq")).alias("id"),
        F.col("_pos"))
    if not windows:
        return out.withColumn("rep", F.lit(False))
    rows = [(k[0], k[1], k[2], a, b) for k, spans in windows.items() for a, b in spans]
    schema = "wr string, we long, ws string, a_seq long, r_seq long"
    w = F.broadcast(events.sparkSession.createDataFrame(rows, schema))
    flagged = out.join(w, (out["r"] == w["wr"]) & (out["e"] == w["we"]) & (out["s"] == w["ws"])
                       & (out["k"] == KIND["sub-outcome"]) & (out["q"] > w["a_seq"]) & (out["q"] < w["r_seq"]),
                       "left")
    return flagged.select(*[out[c] for c in out.columns], w["a_seq"].isNotNull().alias("rep"))


def group_deliveries(narrowed: DataFrame, partitions: int) -> DataFrame:
    """One shuffle by delivery id (its 64-bit hash, also the sort's cheap prefix),
    sorted, then one row per delivery: ``ev`` (its events in (router, epoch, seq)
    order) and ``id`` (who published it, from its first `received`)."""
    return narrowed.repartition(partitions, "h") \
        .sortWithinPartitions("h", "delivery", "r", "e", "q", "_pos") \
        .groupBy("h", "delivery").agg(
            F.collect_list(F.struct(*EVENT_FIELDS)).alias("ev"),
            F.first("id", ignorenulls=True).alias("id"))


def _sql_string(text: str) -> str:
    """``text`` as a Spark SQL string literal."""
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


def _sql_const(value, type_: str) -> str:
    """A constant of Spark type ``type_`` in SQL text (from_json of a literal: the
    optimizer folds it once, when the query is planned)."""
    return f"from_json({_sql_string(json.dumps(value))}, {_sql_string(type_)})"


def _kinds(*names: str) -> str:
    codes = [str(KIND[n]) for n in names]
    return f"= {codes[0]}" if len(codes) == 1 else f"IN ({', '.join(codes)})"


_EMPTY = "cast(array() as array<string>)"


class Constants:
    """The small tables (small_tables()) as SQL constants of the per-delivery projection."""

    def __init__(self, small: dict, missing: set):
        self.ends = _sql_const(small["ends"], "map<string, array<struct<seq:bigint, kind:string, topic:string>>>")
        self.durable = _sql_const(small["durable"],
                                  "map<string, array<struct<from:bigint, to:bigint, durable:bigint>>>")
        self.routes = _sql_const(small["routes"],
                                 "map<string, array<struct<seq:bigint, ts:double, reachable:array<string>>>>")
        self.gone = _sql_const(small["gone"], "map<string, array<struct<ts:double, topic:string>>>")
        self.died = _sql_const(small["died"], "array<string>")
        self.attached = _sql_const(small["attached"], "array<string>")
        self.missing = _sql_const(sorted(missing), "array<string>")

    @staticmethod
    def at(table: str, *parts: str) -> str:
        """The list ``table`` holds at the key made of ``parts`` (empty if none)."""
        key = " || '|' || ".join(f"cast({p} as string)" for p in parts)
        return f"coalesce(try_element_at({table}, {key}), array())"


def _violation(check: str, item: str, *, r="NULL", e="NULL", q="NULL", t="NULL", s="NULL",
               info: dict | None = None) -> str:
    """One violation as a SQL struct, inside the per-delivery projection."""
    fields = ", ".join(f"'{k}', {v}" for k, v in (info or {}).items())
    info_sql = f"to_json(named_struct({fields}))" if info else "cast(NULL as string)"
    return (f"named_struct('check', '{check}', 'item', cast({item} as string), 'router', cast({r} as string), "
            f"'epoch', cast({e} as bigint), 'seq', cast({q} as bigint), 'ts', cast({t} as double), "
            f"'subscriber', cast({s} as string), 'info', {info_sql})")


def _first_per(arr: str, key: str, value: str, var: str = "z") -> str:
    """SQL: the elements of array ``arr`` grouped by ``key`` (an expression of
    ``var``): one ``named_struct(key, n, first)`` per key, ``first`` the smallest
    ``value`` (a struct expression of ``var`` whose first field orders)."""
    k2 = key.replace(f"{var}.", f"{var}2.")
    return (f"transform(array_distinct(transform({arr}, {var} -> {key})), kk -> named_struct("
            f"'key', kk, 'n', size(filter({arr}, {var}2 -> {k2} = kk)), "
            f"'first', array_min(transform(filter({arr}, {var}2 -> {k2} = kk), {var} -> {value}))))")


def delivery_facts(grouped: DataFrame, c: Constants) -> DataFrame:
    """One row per delivery: who published it, where it started and what the
    publisher was told, the sets the cross-delivery checks and the summary need,
    and ``v``: the violations of every per-delivery invariant (usually empty).
    Written as Spark SQL (one call per column: building it is cheap)."""
    K = _kinds
    topic = "id.topic"
    # --- the delivery's events by kind
    step = grouped.selectExpr(
        "delivery", "id", "ev",
        f"filter(ev, e -> e.k {K('received')}) AS recv_all",
        f"filter(ev, e -> e.k {K('received')} AND NOT coalesce(e.b, false)) AS records",
        f"filter(ev, e -> e.k {K('pub-outcome')}) AS pubs",
        f"array_distinct(transform(filter(ev, e -> e.k {K('sub-outcome')} AND e.o = {ACC}), e -> e.s)) AS acc_subs",
        f"transform(filter(ev, e -> e.k {K('owed-state-discarded')}), e -> e.s) AS discarded",
        f"filter(ev, e -> e.k {K('owed-moved')}) AS moves",
        f"flatten(transform(filter(ev, e -> e.k {K('owed-moved')}), e -> coalesce(e.l, {_EMPTY}))) AS moved_subs",
        f"array_distinct(flatten(transform(filter(ev, e -> e.k {K('received')} AND NOT coalesce(e.b, false)), "
        f"e -> coalesce(e.l, {_EMPTY})))) AS owed_subs",
        # every send to a subscriber: in `received.forwarded`, or a `forwarded`
        f"concat(flatten(transform(filter(ev, e -> e.k {K('received')} AND NOT coalesce(e.b, false)), "
        f"e -> transform(coalesce(e.f, {_EMPTY}), s -> named_struct('r', e.r, 'e', e.e, 'q', e.q, 's', s)))), "
        f"transform(filter(ev, e -> e.k {K('forwarded')}), e -> named_struct('r', e.r, 'e', e.e, 'q', e.q, 's', e.s))"
        f") AS sends",
        # a subscriber's answers that count as new ones (not reported on a resume)
        f"filter(ev, e -> e.k {K('sub-outcome')} AND NOT coalesce(e.rep, false)) AS answers")
    # each record with its router's first answer in that epoch (pub-outcome or outcome-to-router)
    step = step.selectExpr(
        "*", "transform(records, rec -> named_struct('r', rec.r, 'e', rec.e, 'q', rec.q, 't', rec.t, 'p', rec.p, "
        f"'owed', coalesce(rec.l, {_EMPTY}), 'routers', coalesce(rec.x, {_EMPTY}), "
        f"'ans', array_min(transform(filter(ev, e -> e.k {K('pub-outcome', 'outcome-to-router')} AND e.r = rec.r "
        "AND e.e = rec.e), e -> named_struct('q', e.q, 'o', e.o))))) AS recs")
    step = step.selectExpr(
        "*", "try_element_at(filter(recs, x -> x.p IS NULL), 1) AS origin",
        "array_min(transform(pubs, e -> named_struct('q', e.q, 't', e.t, 'o', e.o, 'r', e.r, 'e', e.e, 'n', e.n))) "
        "AS pub",
        f"exists(pubs, e -> e.o = {ACC}) AS told_accepted", "array_union(acc_subs, discarded) AS done",
        f"array_distinct(transform(recv_all, e -> e.r)) AS reached", "transform(moves, m -> m.p) AS moved_from",
        f"try_element_at(filter(pubs, e -> e.r = try_element_at(filter(recs, x -> x.p IS NULL), 1).r "
        f"AND e.e = try_element_at(filter(recs, x -> x.p IS NULL), 1).e), 1) AS origin_answer")

    def said(rec: str, s: str) -> str:
        return f"filter(ev, e -> e.k {K('sub-outcome', 'expired')} AND e.r = {rec}.r AND e.e = {rec}.e AND e.s = {s})"

    def said_codes(rec: str, s: str) -> str:
        return f"transform({said(rec, s)}, e -> CASE WHEN e.k {K('expired')} THEN {EXPIRED} ELSE e.o END)"

    # --- lost: an owed subscriber never accepted it, on any router. Excused: its
    # subscription ended after the delivery arrived and before its router answered;
    # it was not durable and its router died before answering; its obligation moved.
    ended = (f"exists({c.at(c.ends, 'rec.r', 'rec.e', 's')}, x -> x.seq > rec.q AND (rec.ans IS NULL "
             f"OR x.seq < rec.ans.q) AND (x.kind != 're-attached' OR x.topic IS DISTINCT FROM {topic}))")
    durable = (f"coalesce(try_element_at(filter({c.at(c.durable, 'rec.r', 'rec.e', 's')}, x -> x.from < rec.q "
               f"AND rec.q < x.to), 1).durable, 1)")
    died_nondurable = (f"(rec.ans IS NULL AND array_contains({c.died}, rec.r || '|' || cast(rec.e as string)) "
                       f"AND {durable} = 0)")
    lost_subs = (
        "flatten(transform(recs, rec -> transform(filter(rec.owed, s -> NOT array_contains(done, s) "
        f"AND NOT array_contains(moved_subs, s) AND NOT {ended} AND NOT {died_nondurable}), s -> "
        + _violation("lost", "delivery", r="rec.r", e="rec.e", q="rec.q", t="rec.t", s="s", info={
            "said": f"array_distinct({said_codes('rec', 's')})",
            "sent": "array_min(transform(filter(sends, x -> x.r = rec.r AND x.e = rec.e AND x.s = s), x -> x.q))",
            "answer": "rec.ans.o", "answer_seq": "rec.ans.q"}) + ")))")
    lost_moved = (
        "transform(filter(array_distinct(moved_subs), s -> NOT array_contains(done, s)), s -> "
        "transform(array(try_element_at(filter(moves, m -> array_contains(coalesce(m.l, "
        f"{_EMPTY}), s)), 1)), m -> "
        + _violation("lost", "delivery", r="m.r", e="m.e", q="m.q", t="m.t", s="s", info={"moved_from": "m.p"})
        + ")[0])")

    def told_by(x: str) -> str:  # the outcomes the origin logged from router x
        return (f"array_distinct(transform(filter(ev, e -> e.k {K('outcome-from-router')} AND e.r = origin.r "
                f"AND e.e = origin.e AND e.p = {x}), e -> e.o))")

    unreachable = (f"exists({c.at(c.routes, 'origin.r', 'origin.e')}, rt -> rt.ts >= origin.t AND (pub.q IS NULL "
                   "OR rt.seq < pub.q) AND NOT array_contains(rt.reachable, x))")
    lost_interest = (f"exists(coalesce(try_element_at({c.gone}, x), array()), g -> (g.topic IS NULL OR "
                     f"g.topic = {topic}) AND g.ts >= origin.t - {CLOCK_SLACK} AND g.ts <= pub.t + {CLOCK_SLACK})")
    lost_routers = (
        f"transform(filter(coalesce(origin.routers, {_EMPTY}), x -> NOT array_contains(reached, x) "
        f"AND NOT array_contains(moved_from, x) AND NOT array_contains({c.missing}, x) "
        f"AND (size({told_by('x')}) = 0 OR exists({told_by('x')}, y -> y != {OUTCOME['none']})) "
        f"AND NOT (size({told_by('x')}) = 0 AND ({unreachable} OR {lost_interest}))), x -> "
        + _violation("lost", "delivery", r="x", e="origin.e", t="origin.t",
                     info={"origin": "origin.r", "told": told_by("x")}) + ")")
    step = step.selectExpr("*", f"CASE WHEN told_accepted THEN concat({lost_subs}, {lost_moved}, "
                                f"CASE WHEN origin IS NOT NULL THEN {lost_routers} ELSE array() END) END AS v_lost")

    # --- duplicated: one subscriber accepted this delivery id twice (reports aside)
    accepts = f"filter(answers, e -> e.o = {ACC})"
    v_dup = (f"transform(filter(transform(array_distinct(transform({accepts}, e -> e.s)), s -> named_struct("
             f"'s', s, 'a', filter({accepts}, e -> e.s = s))), x -> size(x.a) > 1), x -> "
             + _violation("duplicated", "x.s || '|' || delivery", r="x.a[0].r", e="x.a[0].e", q="x.a[0].q",
                          t="x.a[0].t", s="x.s", info={
                              "where": "transform(x.a, e -> named_struct('r', e.r, 'e', e.e, 'q', e.q))"}) + ")")
    # --- invented: events about a delivery no router received
    referencing = ", ".join(str(KIND[n]) for n in REFERENCING)
    v_invented = (f"CASE WHEN size(recv_all) = 0 THEN transform(filter(ev, e -> e.k IN ({referencing})), e -> "
                  + _violation("invented", "delivery", r="e.r", e="e.e", q="e.q", t="e.t", s="e.s",
                               info={"kind": "e.k", "outcome": "e.o"}) + ") END")
    # --- record-missing: an event that needs the router's record, before any
    # `received` of the delivery on that router in that epoch
    needs = ", ".join(str(KIND[n]) for n in NEEDS_RECORD)
    orphans = (f"CASE WHEN size(recv_all) > 0 THEN filter(ev, e -> e.k IN ({needs}) AND CASE "
               f"WHEN e.k {K('pub-outcome')} AND coalesce(e.y, 0) = 1 "
               "THEN NOT exists(ev, x -> x.r = e.r AND x.e = e.e AND x.q < e.q) "
               "ELSE NOT exists(recv_all, x -> x.r = e.r AND x.e = e.e AND x.q <= e.q) END) ELSE array() END")
    step = step.selectExpr("*", f"{v_dup} AS v_dup", f"{v_invented} AS v_invented", f"{orphans} AS orphans")
    by_router = _first_per("orphans", "named_struct('r', z.r, 'e', z.e)",
                           "named_struct('q', z.q, 'k', z.k, 'o', z.o, 's', z.s, 't', z.t)")
    v_record = (
        f"transform({by_router}, g -> "
        + _violation("record-missing", "g.key.r || '|' || cast(g.key.e as string) || '|' || delivery", r="g.key.r",
                     e="g.key.e", q="g.first.q", t="g.first.t", s="g.first.s", info={
                         "kind": "g.first.k", "outcome": "g.first.o", "more": "g.n - 1",
                         "received_in": "transform(filter(recv_all, x -> x.r = g.key.r), x -> x.e)"}) + ")")
    # --- arrival-unforwarded: a copy from another router that no router logged forwarding
    v_arrival = (
        f"transform(filter(recv_all, x -> x.p IS NOT NULL AND NOT array_contains({c.missing}, x.p) AND NOT exists("
        f"ev, f -> f.k {K('forwarded-to-router')} AND (array_contains(coalesce(f.l, {_EMPTY}), x.r) OR f.p = x.r))), "
        "x -> " + _violation("arrival-unforwarded", "x.r || '|' || delivery", r="x.r", e="x.e", q="x.q", t="x.t",
                             info={"origin": "x.p"}) + ")")
    ever_owed = (f"array_distinct(concat(owed_subs, transform(sends, x -> x.s), moved_subs, transform(filter(ev, "
                 f"e -> e.k {K('placeholder-fulfilled')}), e -> e.s)))")
    step = step.selectExpr("*", f"{v_record} AS v_record", f"{v_arrival} AS v_arrival", f"{ever_owed} AS ever_owed")
    # --- accept-unowed / accept-unsent
    first_answer = "named_struct('q', z.q, 'r', z.r, 'e', z.e, 't', z.t, 'o', z.o)"
    step = step.selectExpr(
        # (of a delivery some router received: the others are invented, and that is all they are)
        "*", f"filter(ev, e -> e.k {K('sub-outcome')} AND size(recv_all) > 0 AND NOT array_contains(ever_owed, e.s)) "
        "AS unowed",
        "filter(answers, e -> size(recv_all) > 0 AND array_contains(ever_owed, e.s) AND NOT exists(sends, x -> "
        "x.r = e.r AND x.e = e.e AND x.s = e.s AND x.q < e.q)) AS unsent")
    v_unowed = (f"transform({_first_per('unowed', 'z.s', first_answer)}, g -> "
                + _violation("accept-unowed", "g.key || '|' || delivery", r="g.first.r", e="g.first.e",
                             q="g.first.q", t="g.first.t", s="g.key",
                             info={"outcome": "g.first.o", "attached": f"array_contains({c.attached}, g.key)"}) + ")")
    per_router = _first_per("unsent", "named_struct('s', z.s, 'r', z.r)", first_answer)
    v_unsent = (f"transform({per_router}, g -> "
                + _violation("accept-unsent", "g.key.s || '|' || g.key.r || '|' || delivery", r="g.key.r",
                             e="g.first.e", q="g.first.q", t="g.first.t", s="g.key.s",
                             info={"outcome": "g.first.o"}) + ")")

    # --- answer-missing: the origin answered its publisher without logging the
    # answer of a router it owed the delivery to, which received it and owed it to
    # a subscriber there. Excused: the origin logged that router unreachable before
    # answering; that router died before it answered; or it answered `none` (its
    # subscribers left: the origin may stop waiting for a router that lost interest
    # before that answer reaches it, and then does not log it).
    its_record = "try_element_at(filter(recs, y -> y.r = x AND size(y.owed) > 0), 1)"
    router_answer = (f"array_min(transform(filter(ev, e -> e.k {K('outcome-to-router')} AND e.r = x), "
                     "e -> named_struct('q', e.q, 'o', e.o, 'e', e.e)))")
    heard = f"exists(ev, e -> e.k {K('outcome-from-router')} AND e.r = origin.r AND e.e = origin.e AND e.p = x)"
    excused = (f"(exists({c.at(c.routes, 'origin.r', 'origin.e')}, rt -> rt.seq < origin_answer.q AND NOT "
               f"array_contains(rt.reachable, x)) OR ({router_answer} IS NULL AND array_contains({c.died}, "
               f"x || '|' || cast({its_record}.e as string))) OR coalesce({router_answer}.o = {OUTCOME['none']}, "
               "false))")
    v_answer = (
        f"CASE WHEN origin IS NOT NULL AND origin_answer IS NOT NULL AND NOT array_contains({c.missing}, origin.r) "
        f"THEN transform(filter(coalesce(origin.routers, {_EMPTY}), x -> {its_record} IS NOT NULL AND NOT {heard} "
        f"AND NOT array_contains(moved_from, x) AND NOT array_contains({c.missing}, x) AND NOT {excused}), x -> "
        + _violation("answer-missing", "origin.r || '|' || x || '|' || delivery", r="origin.r", e="origin.e",
                     q="origin_answer.q", t="origin_answer.t", info={
                         "router": "x", "outcome": "origin_answer.o",
                         "received": f"named_struct('e', {its_record}.e, 'q', {its_record}.q)",
                         "owed": f"{its_record}.owed", "answer": router_answer}) + ") ELSE array() END")
    # --- outcome-disagrees: the publisher's outcome against what its owed
    # subscribers did (docs/delivery-rule.md). Excused, for "every owed subscriber
    # accepted": a router that received it never logged its answer and died, or
    # the origin had it unreachable when it answered: the origin could not know.
    pairs = ("flatten(transform(recs, rec -> transform(rec.owed, s -> named_struct('r', rec.r, 'e', rec.e, 's', s, "
             f"'ans', rec.ans, 'first', array_min(transform(filter({said('rec', 's')}, e -> rec.ans IS NULL OR "
             f"e.q < rec.ans.q), e -> named_struct('q', e.q, 'o', CASE WHEN e.k {K('expired')} THEN {EXPIRED} "
             "ELSE e.o END)))))))")
    step = step.selectExpr("*", f"{v_unowed} AS v_unowed", f"{v_unsent} AS v_unsent", f"{v_answer} AS v_answer",
                           f"{pairs} AS pairs")
    all_accepted = "(size(pairs) > 0 AND forall(pairs, y -> array_contains(acc_subs, y.s)))"
    bad_codes = ", ".join(str(x) for x in (*TERMINAL_NOT_ACCEPTED, EXPIRED))
    refused = (f"filter(pairs, y -> y.first IS NOT NULL AND y.first.o IN ({bad_codes}) "
               "AND NOT array_contains(acc_subs, y.s))")
    unknowable = (f"exists(pairs, y -> y.r != p.r AND y.ans IS NULL AND (array_contains({c.died}, "
                  f"y.r || '|' || cast(y.e as string)) OR exists({c.at(c.routes, 'p.r', 'p.e')}, rt -> rt.seq < p.q "
                  "AND NOT array_contains(rt.reachable, y.r))))")
    v_disagree = (
        f"transform(filter(transform(pubs, p -> named_struct('p', p, 'kind', CASE WHEN p.o != {ACC} AND "
        f"{all_accepted} AND NOT {unknowable} THEN 'all-accepted' WHEN p.o = {ACC} AND size({refused}) > 0 "
        f"THEN 'refused' END)), w -> w.kind IS NOT NULL AND NOT exists(pairs, y -> array_contains({c.missing}, y.r))), "
        "w -> " + _violation("outcome-disagrees", "delivery", r="w.p.r", e="w.p.e", q="w.p.q", t="w.p.t", info={
            "kind": "w.kind", "outcome": "w.p.o", "reason": "w.p.n",
            "pairs": f"transform(CASE WHEN w.kind = 'refused' THEN {refused} ELSE pairs END, y -> named_struct("
                     "'s', y.s, 'r', y.r, 'first', y.first))"}) + ")")
    # --- left-unsettled: records never deleted in their epoch; on a router that
    # stopped in order a violation, on one that died a note (its records went with it)
    closed = (f"exists(ev, e -> e.r = rec.r AND e.e = rec.e AND ((e.k {K('settled')} AND coalesce(e.b, false)) "
              f"OR e.k {K('record-deleted')}))")
    left = (f"transform(filter(recs, rec -> NOT {closed}), rec -> named_struct('rec', rec, 'died', array_contains("
            f"{c.died}, rec.r || '|' || cast(rec.e as string)), 'by', try_element_at(transform(filter(ev, e -> "
            f"e.r = rec.r AND e.e = rec.e AND e.k {K('settled')}), e -> e.y), 1), 'waiting', array_except(rec.owed, "
            f"transform(filter(ev, e -> e.r = rec.r AND e.e = rec.e AND e.k {K('sub-outcome', 'expired')}), "
            "e -> e.s))))")
    step = step.selectExpr("*", f"{v_disagree} AS v_disagree", f"{left} AS left")
    v_left = ("transform(filter(left, x -> NOT x.died), x -> "
              + _violation("left-unsettled", "x.rec.r || '|' || delivery", r="x.rec.r", e="x.rec.e", q="x.rec.q",
                           t="x.rec.t", info={"by": "x.by", "answer": "x.rec.ans", "origin": "x.rec.p",
                                              "waiting": "x.waiting"}) + ")")
    # --- what the cross-delivery checks and the summary read
    first_sends = ("transform(array_distinct(transform(sends, x -> named_struct('r', x.r, 's', x.s))), rs -> "
                   "array_min(transform(filter(sends, x -> x.r = rs.r AND x.s = rs.s), x -> named_struct("
                   "'e', x.e, 'q', x.q, 'r', x.r, 's', x.s))))")
    # Each subscriber owed it or answering it: accepted if it ever accepted, else its
    # first answer, else 0 (never answered).
    statuses = ("transform(array_distinct(concat(owed_subs, transform(answers, e -> e.s))), s -> named_struct("
                f"'s', s, 'owed', array_contains(owed_subs, s), 'o', CASE WHEN array_contains(acc_subs, s) THEN {ACC} "
                "ELSE coalesce(try_element_at(transform(filter(answers, e -> e.s = s), e -> e.o), 1), 0) END))")
    return step.selectExpr(
        "delivery", f"{topic} AS topic", "id.publisher AS publisher", "id.link_name AS link_name",
        "id.incarnation AS incarnation", "id.pub_tag AS pub_tag", "id.stream_seq AS stream_seq",
        "concat_ws('|', id.publisher, id.link_name, id.incarnation, id.pub_tag, "
        "regexp_extract(delivery, '\\\\.(\\\\d+)$', 1)) AS pub_id",
        "concat_ws('|', id.publisher, id.link_name, id.incarnation) AS stream",
        "size(recv_all) > 0 AS received", "size(recv_all) > 0 AND size(records) = 0 AS presettled",
        "origin.r AS origin", "origin.e AS origin_epoch", "origin.t AS recv_ts", "pub", "told_accepted",
        "transform(recs, x -> named_struct('r', x.r, 'e', x.e, 't', x.t)) AS recvs",
        f"{statuses} AS subs", f"{first_sends} AS first_sends",
        "transform(filter(left, x -> x.died), x -> named_struct('r', x.rec.r, 'e', x.rec.e)) AS died_with",
        f"concat(coalesce(v_lost, array()), v_dup, coalesce(v_invented, array()), v_record, v_arrival, v_unowed, "
        f"v_unsent, v_answer, v_disagree, {v_left}) AS v")


# ---------------------------------------------------------------------------
# Preparing everything
# ---------------------------------------------------------------------------

def prepare(lines: DataFrame, partitions: int | None = None, storage: StorageLevel = StorageLevel.MEMORY_AND_DISK,
            cache_lines: bool = True) -> Tables:
    """Validate the lines, collect the input's facts, build the per-delivery facts.
    ``lines``: what spark/load.py read. ``cache_lines``: keep the validated lines
    cached while the tables are built (a JSON source: parsed once, read three
    times; a Parquet source is cheap to read again instead)."""
    spark = lines.sparkSession
    if partitions is None:
        partitions = int(spark.conf.get("spark.sql.shuffle.partitions"))
    persisted = []
    lines = validate(lines)
    if cache_lines:
        lines = lines.persist(storage)
        persisted.append(lines)
    facts_in = input_facts(lines)
    small = small_tables(facts_in["life"], facts_in["epochs"])
    present = {e["router"] for e in facts_in["epochs"]}
    facts_in["missing_routers"] = sorted(set(facts_in["named_routers"]) - present)
    facts = facts_frame(lines, small, set(facts_in["missing_routers"]), partitions).persist(storage)
    persisted.append(facts)
    return Tables(lines, facts, facts_in, small, partitions, persisted)


def facts_frame(lines: DataFrame, small: dict, missing: set, partitions: int) -> DataFrame:
    """The per-delivery facts from the validated lines (not cached): unfold, narrow,
    one shuffle by delivery id, one row per delivery, every per-delivery invariant."""
    events = unfold(lines.where(F.col("delivery").isNotNull() | F.col("deliveries").isNotNull()))
    grouped = group_deliveries(narrow(events, small["windows"]), partitions)
    return delivery_facts(grouped, Constants(small, missing))


# ---------------------------------------------------------------------------
# The input checks (from what input_facts collected)
# ---------------------------------------------------------------------------

def input_violations(spark, t: Tables, located: list[dict]) -> tuple[DataFrame, list[dict]]:
    """Malformed lines, sequence gaps and repeats, and the routers and epochs whose
    log is missing. Returns (violations, torn lines: notes)."""
    rows, torn = [], []

    def row(check, item, router=None, epoch=None, seq=None, file=None, line=None, ts=None, **info):
        rows.append((check, item, None, router, epoch, seq, None, None, None, file, line, ts,
                     json.dumps(info) if info else None))

    for b in located:
        if b["torn"]:
            torn.append({"file": b[FILE], "line": b["line"]})
            continue
        row("malformed-line", f"{b[FILE]}:{b['line']}", b["router"], b["epoch"], b["seq"], b[FILE], b["line"], b["ts"],
            problem=b[PROBLEM], text=(b[CORRUPT] or "")[:80])
    listed = sum(1 for b in located if not b["torn"])
    if t.input["bad_count"] > listed + len(torn):
        row("malformed-line", "(more)", more=t.input["bad_count"] - listed - len(torn))
    epochs = {(e["router"], e["epoch"]): e for e in t.epochs}
    for router, epoch, lo, hi in t.input["gaps"]:
        e = epochs[(router, epoch)]
        row("seq-gap", f"{router}|{epoch}|{lo}", router, epoch, lo, ts=e["first_ts"], lo=lo, hi=hi,
            last=e["last_seq"])
    for r in t.input["repeated"]:
        row("seq-repeated", f"{r['router']}|{r['epoch']}|{r['seq']}", r["router"], r["epoch"], r["seq"],
            ", ".join(r["files"]), ts=r["ts"], n=r["n"], kinds=r["kinds"])
    for router in t.input["missing_routers"]:
        row("router-log-missing", router, router)
    present = {e["router"] for e in t.epochs}
    for (peer, peer_epoch), (by, by_epoch, by_seq) in sorted(t.small["peers"].items(), key=lambda kv: str(kv[0])):
        if peer in present and (peer, peer_epoch) not in epochs:
            row("router-log-missing", f"{peer}|{peer_epoch}", peer, peer_epoch, by=by, by_epoch=by_epoch,
                by_seq=by_seq)
    return spark.createDataFrame(rows, violation_schema()), torn


# ---------------------------------------------------------------------------
# 4. Across deliveries
# ---------------------------------------------------------------------------

def per_delivery(t: Tables) -> DataFrame:
    """The violations the per-delivery pass found, as rows."""
    return t.facts.where(F.size("v") > 0).select("delivery", "publisher", "pub_tag", F.explode("v").alias("x")) \
        .select(F.col("x.check").alias("check"), F.col("x.item").alias("item"), "delivery",
                F.col("x.router").alias("router"), F.col("x.epoch").alias("epoch"), F.col("x.seq").alias("seq"),
                F.col("x.subscriber").alias("subscriber"), "publisher", "pub_tag",
                F.lit(None).cast("string").alias("file"), F.lit(None).cast("long").alias("line"),
                F.col("x.ts").alias("ts"), F.col("x.info").alias("info"))


def duplicated_by_publisher(t: Tables) -> DataFrame:
    """No subscriber accepted one publisher delivery (same publisher, link,
    incarnation, tag and reuse suffix) under two delivery ids: first the publisher
    deliveries with more than one id (one small shuffle of one row per delivery),
    then who accepted them."""
    multi = t.facts.where(F.col("received")).groupBy("pub_id").agg(F.count(F.lit(1)).alias("ids")) \
        .where(F.col("ids") > 1)
    accepted = t.facts.join(F.broadcast(multi), "pub_id", "left_semi").select(
        "delivery", "pub_id", "publisher", "pub_tag", F.explode("subs").alias("x")) \
        .where(F.col("x.o") == ACC).select("delivery", "pub_id", "publisher", "pub_tag",
                                           F.col("x.s").alias("subscriber"))
    by_pub = accepted.groupBy("subscriber", "pub_id").agg(
        F.count_distinct("delivery").alias("n"), F.array_sort(F.collect_set("delivery")).alias("ids"),
        F.first("publisher").alias("publisher"), F.first("pub_tag").alias("pub_tag")).where(F.col("n") > 1)
    return violations(by_pub, "duplicated", F.concat_ws("|", "subscriber", "pub_id"), {"pub_id": "pub_id",
                                                                                       "ids": "ids"},
                      delivery=F.try_element_at("ids", F.lit(1)), subscriber="subscriber", publisher="publisher",
                      pub_tag="pub_tag")


def _order_violations(first_seen: DataFrame, partition: list[str], order: list[str]) -> DataFrame:
    """``first_seen``: one row per (partition..., pub_id) with stream_seq and the
    order columns. A row whose stream_seq is below the highest one seen before it
    (in ``order``) in the same partition is out of publisher order."""
    w = Window.partitionBy(*partition).orderBy(*order).rowsBetween(Window.unboundedPreceding, -1)
    before = first_seen.withColumn("prev", F.max(F.struct("stream_seq", "delivery")).over(w))
    return before.where(F.col("prev").isNotNull() & (F.col("stream_seq") < F.col("prev.stream_seq")))


def out_of_order(t: Tables) -> DataFrame:
    """Per router, subscriber and publisher stream, the deliveries were sent to the
    subscriber in stream_seq order (each at its first send; one publisher delivery
    under two ids counts once: that is a duplicate)."""
    sends = t.facts.where(F.col("received") & ~F.col("presettled")).select(
        "delivery", "stream", "pub_id", "stream_seq", "publisher", "pub_tag", F.explode("first_sends").alias("x")) \
        .select("delivery", "stream", "pub_id", "stream_seq", "publisher", "pub_tag", F.col("x.r").alias("router"),
                F.col("x.s").alias("subscriber"), F.col("x.e").alias("epoch"), F.col("x.q").alias("seq"))
    first = sends.groupBy("router", "subscriber", "stream", "pub_id").agg(
        F.min(F.struct("epoch", "seq", "delivery", "stream_seq", "publisher", "pub_tag")).alias("m")) \
        .select("router", "subscriber", "stream", "m.*")
    bad = _order_violations(first, ["router", "subscriber", "stream"], ["epoch", "seq"])
    return violations(bad, "out-of-order", F.concat_ws("|", "router", "subscriber", "delivery"), {
        "stream_seq": "stream_seq", "prev_seq": "prev.stream_seq", "prev": "prev.delivery", "stream": "stream"},
        delivery="delivery", router="router", subscriber="subscriber", epoch="epoch", seq="seq",
        publisher="publisher", pub_tag="pub_tag")


# ---------------------------------------------------------------------------
# The applications' ledgers (--clients)
# ---------------------------------------------------------------------------

def ledger_checks(t: Tables, ledgers: DataFrame) -> DataFrame:
    """Router view against application view (docs/ledger.md):
    - each delivery a subscriber accepted (router view) was handed to that
      application exactly once (``delivered`` lines), and the application was
      handed nothing the router never sent it, nor one publisher delivery under
      two delivery ids;
    - each subscriber application saw each publisher stream in stream_seq order;
    - a publisher's ledger says ``accepted`` (its last outcome line for the
      delivery) exactly when a router's ``pub-outcome`` said accepted.
    Only links that keep a ledger are judged."""
    L = ledgers.withColumn("key", _key(F.col("client"), F.col("link")))
    delivered = L.where((F.col("role") == "subscriber") & (F.col("event") == "delivered")) \
        .select("key", "delivery", "ts", "line", "file", "message_id")
    clients = delivered.select(F.col("key").alias("subscriber")).distinct()
    got = delivered.groupBy(F.col("key").alias("subscriber"), "delivery").agg(
        F.count(F.lit(1)).alias("n"), F.min("ts").alias("ts"), F.first("message_id", ignorenulls=True).alias("mid"))
    router_acc = t.facts.select("delivery", "pub_tag", "publisher", F.explode("subs").alias("x")) \
        .where(F.col("x.o") == ACC).select("delivery", "pub_tag", "publisher", F.col("x.s").alias("subscriber")) \
        .join(F.broadcast(clients), "subscriber", "left_semi")
    both = router_acc.join(got, ["delivery", "subscriber"], "full_outer")
    rows = [
        violations(both.where(F.col("publisher").isNotNull() & F.col("n").isNull()), "ledger",
                   F.concat_ws("|", F.lit("missing"), "subscriber", "delivery"), {"kind": F.lit("missing")},
                   delivery="delivery", subscriber="subscriber", publisher="publisher", pub_tag="pub_tag"),
        violations(both.where(F.col("n") > 1), "ledger", F.concat_ws("|", F.lit("twice"), "subscriber", "delivery"),
                   {"kind": F.lit("twice"), "n": "n", "message_id": "mid"},
                   delivery="delivery", subscriber="subscriber", ts="ts", publisher="publisher", pub_tag="pub_tag"),
    ]
    sent = t.facts.select("delivery", F.explode("first_sends").alias("x")).select("delivery",
                                                                                  F.col("x.s").alias("subscriber"))
    unsent = got.join(sent, ["delivery", "subscriber"], "left_anti")
    rows.append(violations(unsent, "ledger", F.concat_ws("|", F.lit("unsent"), "subscriber", "delivery"),
                           {"kind": F.lit("unsent"), "message_id": "mid"},
                           delivery="delivery", subscriber="subscriber", ts="ts"))
    ident = t.facts.select("delivery", "pub_id", "stream", "stream_seq", "publisher", "pub_tag")
    by_pub = got.join(ident, "delivery").groupBy("subscriber", "pub_id").agg(
        F.count_distinct("delivery").alias("n"), F.array_sort(F.collect_set("delivery")).alias("ids"),
        F.min("ts").alias("ts"), F.first("publisher").alias("publisher"), F.first("pub_tag").alias("pub_tag"),
        F.first("mid", ignorenulls=True).alias("mid")).where(F.col("n") > 1)
    rows.append(violations(by_pub, "ledger", F.concat_ws("|", F.lit("dup"), "subscriber", "pub_id"),
                           {"kind": F.lit("dup"), "ids": "ids", "message_id": "mid"},
                           delivery=F.try_element_at("ids", F.lit(1)), subscriber="subscriber", ts="ts",
                           publisher="publisher", pub_tag="pub_tag"))
    # Application order, per subscriber link and publisher stream (the first time
    # each publisher delivery was handed over), in the ledger's line order.
    first = delivered.join(ident, "delivery").groupBy(F.col("key").alias("subscriber"), "file", "stream", "pub_id") \
        .agg(F.min(F.struct("line", "delivery", "stream_seq", "ts", "publisher", "pub_tag", "message_id")).alias("m")) \
        .select("subscriber", "file", "stream", "m.*")
    bad = _order_violations(first, ["subscriber", "file", "stream"], ["line"])
    rows.append(violations(bad, "ledger", F.concat_ws("|", F.lit("order"), "subscriber", "delivery"), {
        "kind": F.lit("order"), "stream_seq": "stream_seq", "prev_seq": "prev.stream_seq", "stream": "stream",
        "message_id": "message_id"},
        delivery="delivery", subscriber="subscriber", ts="ts", publisher="publisher", pub_tag="pub_tag"))
    rows.append(_publisher_ledger(t, L))
    return union_all(rows)


def publisher_outcomes(ledgers: DataFrame) -> DataFrame:
    """Each publisher delivery's last outcome line in its application's ledger:
    (publisher, link_name, l_inc, pub_tag, app_outcome, app_ts, message_id)."""
    L = ledgers
    mids = L.where((F.col("role") == "publisher") & (F.col("event") == "sent")) \
        .groupBy("client", "link", "pub_tag").agg(F.first("message_id", ignorenulls=True).alias("message_id"))
    told = L.where((F.col("role") == "publisher") & (F.col("event") == "outcome")) \
        .groupBy("client", "link", "incarnation", "pub_tag").agg(
            F.max_by("outcome", "line").alias("app_outcome"), F.max("ts").alias("app_ts"))
    return told.join(mids, ["client", "link", "pub_tag"], "left").select(
        F.col("client").alias("publisher"), F.col("link").alias("link_name"), F.col("incarnation").alias("l_inc"),
        "pub_tag", "app_outcome", "app_ts", "message_id")


def app_outcomes(t: Tables, ledgers: DataFrame) -> DataFrame:
    """(delivery, app_outcome, app_ts, message_id) for publisher deliveries whose
    application keeps a ledger: matched on (client, link, incarnation, pub_tag), or
    (client, link, pub_tag) for a ledger without the incarnation."""
    told = publisher_outcomes(ledgers)
    ids = t.facts.where(F.col("received")).select("delivery", "publisher", "link_name", "incarnation", "pub_tag")
    cond = ((ids["publisher"] == told["publisher"]) & (ids["link_name"] == told["link_name"])
            & (ids["pub_tag"] == told["pub_tag"]) & (told["l_inc"].isNull() | (told["l_inc"] == ids["incarnation"])))
    return ids.join(told, cond).select(ids["delivery"], "app_outcome", "app_ts", "message_id")


def app_outcome_disagrees(t: Tables, app: DataFrame) -> DataFrame:
    """outcome-disagrees from the applications' side: a publisher whose ledger says
    it was told released, rejected or modified although every subscriber owed the
    delivery accepted it, where the routers' log has no such outcome for it (its
    pub-outcome is missing, or says accepted)."""
    told = app.where(F.col("app_outcome").isNotNull() & (F.col("app_outcome") != "accepted"))
    owed = F.filter("subs", lambda x: x["owed"])
    f = t.facts.join(told, "delivery").where(
        (F.col("pub").isNull() | (F.col("pub.o") == ACC)) & (F.size(owed) > 0)
        & F.forall(owed, lambda x: x["o"] == ACC))
    return violations(f, "outcome-disagrees", F.col("delivery"), {
        "kind": F.lit("ledger"), "app_outcome": "app_outcome", "pairs": F.transform(owed, lambda x: F.struct(
            x["s"].alias("s")))}, delivery="delivery", router="origin", publisher="publisher", pub_tag="pub_tag",
        ts="app_ts")


def _publisher_ledger(t: Tables, L: DataFrame) -> DataFrame:
    told = publisher_outcomes(L)
    pubs = L.where(F.col("role") == "publisher").select(F.col("client").alias("publisher"),
                                                      F.col("link").alias("link_name")).distinct()
    router = t.facts.where(F.col("pub").isNotNull() & F.col("origin").isNotNull()).select(
        "delivery", "publisher", "link_name", "incarnation", "pub_tag", F.col("told_accepted").alias("accepted"),
        F.col("pub.o").alias("o"), F.col("pub.t").alias("ts"), F.col("origin").alias("router")) \
        .join(F.broadcast(pubs), ["publisher", "link_name"], "left_semi")
    cond = ((F.col("r.publisher") == F.col("l.publisher")) & (F.col("r.link_name") == F.col("l.link_name"))
            & (F.col("r.pub_tag") == F.col("l.pub_tag"))
            & (F.col("l.l_inc").isNull() | (F.col("l.l_inc") == F.col("r.incarnation"))))
    matched = router.alias("r").join(told.alias("l"), cond, "full_outer").select(
        F.coalesce("r.publisher", "l.publisher").alias("publisher"),
        F.coalesce("r.link_name", "l.link_name").alias("link_name"),
        F.coalesce("r.pub_tag", "l.pub_tag").alias("pub_tag"), "r.delivery", "r.router", "r.o",
        "r.accepted", "r.ts", "l.app_outcome", "l.app_ts", "l.message_id")
    app_accepted = F.coalesce(F.col("app_outcome") == "accepted", F.lit(False))
    router_accepted = F.coalesce(F.col("accepted"), F.lit(False))
    bad = matched.where(app_accepted != router_accepted)
    return violations(bad, "ledger", F.concat_ws("|", F.lit("pub"), "publisher", "link_name", "pub_tag",
                                                 F.coalesce("delivery", F.lit(""))),
                      {"kind": F.lit("pub"), "link": "link_name", "outcome": "o", "app_outcome": "app_outcome",
                       "message_id": "message_id"},
                      delivery="delivery", router="router", ts=F.coalesce(F.col("ts"), F.col("app_ts")),
                      publisher="publisher", pub_tag="pub_tag")


# ---------------------------------------------------------------------------
# Everything
# ---------------------------------------------------------------------------

def all_violations(t: Tables, ledgers: DataFrame | None = None, app: DataFrame | None = None) -> DataFrame:
    """Every per-delivery and cross-delivery check (the input checks come from
    ``input_violations``)."""
    frames = [per_delivery(t), duplicated_by_publisher(t), out_of_order(t)]
    if ledgers is not None:
        frames.append(ledger_checks(t, ledgers))
    if app is not None:
        frames.append(app_outcome_disagrees(t, app))
    return union_all(frames)


# ---------------------------------------------------------------------------
# Sentences (on the driver, for the violations the report lists)
# ---------------------------------------------------------------------------

def _outcome(code) -> str:
    return OUTCOME_NAME.get(code, "?") if code is not None else "nothing"


def describe(v: dict) -> str:
    """The sentence for one violation (a row of VIOLATION_COLUMNS as a dict)."""
    info = json.loads(v["info"]) if v.get("info") else {}
    check = v["check"]
    tag = (f"; publisher {v['publisher']} tag {v['pub_tag']}" if v.get("publisher") else "") + (
        f" (message-id {v['message_id']})" if v.get("message_id") else "")
    where = f"router {v['router']} epoch {v['epoch']} seq {v['seq']}"
    sub = v.get("subscriber")
    if check == "malformed-line":
        if "more" in info:
            return f"and {info['more']:,} more malformed line(s) not listed"
        text = f": {info['text']!r}" if info.get("text") else ""
        return f"{v['file']}:{v['line']}: {info['problem']}{text}"
    if check == "seq-gap":
        lo, hi = info["lo"], info["hi"]
        what = f"seq {lo} is missing" if lo == hi else f"seq {lo}..{hi} are missing ({hi - lo + 1:,} lines)"
        why = ("its first lines (its first log file is missing?)" if lo == 1 else
               "a log file is missing, or lines were deleted")
        return f"router {v['router']} epoch {v['epoch']}: {what}; its lines run to seq {info['last']:,}: {why}"
    if check == "seq-repeated":
        return (f"router {v['router']} epoch {v['epoch']}: seq {v['seq']} is on {info['n']} lines "
                f"({', '.join(info['kinds'])}; in {v['file']}): a line copied, or a log file given twice")
    if check == "router-log-missing":
        if v.get("epoch") is not None:
            return (f"no log of router {v['router']} epoch {v['epoch']}, though router {info['by']} connected to it "
                    f"then (its epoch {info['by_epoch']} seq {info['by_seq']}): its files are missing (retention?)")
        return (f"no log of router {v['router']}, which the other routers' events about deliveries name: pass its "
                f"data directory too (what it did cannot be proven, and is not reported delivery by delivery)")
    if check == "lost":
        if "moved_from" in info:
            return (f"publisher told accepted, but durable subscriber {sub} (moved from router "
                    f"{info['moved_from']}, owed wherever it re-attached) never accepted it anywhere, and its "
                    f"obligation was never discarded{tag}")
        if "origin" in info:
            told = ",".join(_outcome(o) for o in info.get("told") or [])
            return (f"publisher told accepted by {info['origin']}, but router {v['router']} (owed it: in the "
                    f"origin's routers) " + (f"answered {told} without logging its arrival" if told else
                                             "never received it and never answered") + tag)
        said = ",".join(_outcome(o) for o in info.get("said") or [])
        what = (f"answered {said}" if said else f"was sent it (seq {info['sent']}) and never answered"
                if info.get("sent") is not None else "was owed it and never sent it")
        answer = ("the router never answered for it" if info.get("answer_seq") is None else
                  f"the router answered {_outcome(info.get('answer'))} at seq {info['answer_seq']}")
        return f"publisher told accepted, but subscriber {sub} on router {v['router']} {what}; {answer}{tag}"
    if check == "duplicated":
        if "ids" in info:
            return (f"subscriber {sub} accepted one publisher delivery ({info['pub_id']}) under {len(info['ids'])} "
                    f"delivery ids: {', '.join(info['ids'])}{tag}")
        places = "; ".join(f"router {w['r']} epoch {w['e']} seq {w['q']}" for w in info["where"])
        return f"subscriber {sub} accepted it {len(info['where'])} times ({places}){tag}"
    if check == "out-of-order":
        return (f"sent to {sub} on router {v['router']}: stream_seq {info['stream_seq']} after stream_seq "
                f"{info['prev_seq']} ({info['prev']}) of stream {info['stream']}{tag}")
    if check == "invented":
        kind = KIND_NAME.get(info.get("kind"), "?")
        outcome = f" ({_outcome(info.get('outcome'))})" if kind in ("sub-outcome", "pub-outcome") else ""
        by = f" by subscriber {sub}" if sub else ""
        return f"{kind} on {where}{by}{outcome}, but no router received this delivery"
    if check == "record-missing":
        kind = KIND_NAME.get(info.get("kind"), "?")
        outcome = f" ({_outcome(info.get('outcome'))})" if kind in ("sub-outcome", "pub-outcome",
                                                                    "outcome-to-router") else ""
        more = f" (and {info['more']} more event(s))" if info.get("more") else ""
        earlier = info.get("received_in") or []
        why = (f"it received the delivery in epoch {', '.join(str(e) for e in earlier)} (a restarted router acting "
               f"for its previous life)" if earlier else "it never received the delivery")
        return (f"router {v['router']} epoch {v['epoch']} logged {kind}{outcome}" + (f" for {sub}" if sub else "")
                + f" at seq {v['seq']}{more} without a record of it in that epoch: {why}{tag}")
    if check == "arrival-unforwarded":
        return (f"router {v['router']} received it from origin {info['origin']} (epoch {v['epoch']} seq {v['seq']}), "
                f"but no router logged forwarding it there{tag}")
    if check == "accept-unowed":
        never = "" if info.get("attached") else ", and it never attached to any router"
        return (f"subscriber {sub} answered {_outcome(info.get('outcome'))} on {where} but was never owed this "
                f"delivery: no router listed it as owed, sent it or moved an obligation to it{never}{tag}")
    if check == "accept-unsent":
        return (f"subscriber {sub} answered {_outcome(info.get('outcome'))} on {where} but that router had not "
                f"sent it this delivery before{tag}")
    if check == "answer-missing":
        received = info.get("received") or {}
        answer = info.get("answer")
        then = (f"and answered {_outcome(answer['o'])} at seq {answer['q']}: the origin never logged that answer"
                if answer else "and never logged an answer (nor did the origin log one)")
        return (f"origin {v['router']} told its publisher {_outcome(info.get('outcome'))} (seq {v['seq']}) without an "
                f"answer from router {info['router']}, which received it (epoch {received.get('e')} seq "
                f"{received.get('q')}) for {', '.join(info.get('owed') or [])} {then}{tag}")
    if check == "outcome-disagrees":
        pairs = info.get("pairs") or []

        def who(p):
            first = p.get("first")
            did = f" {_outcome(first['o'])} at seq {first['q']}" if first else ""
            return f"{p['s']}@{p['r']}{did}" if p.get("r") else p["s"]
        people = ", ".join(sorted(who(p) for p in pairs))
        if info.get("kind") == "ledger":
            return (f"the publisher's ledger says it was told {info['app_outcome']}, but every subscriber owed it "
                    f"accepted it: {people}{tag}")
        reason = f" ({info['reason']})" if info.get("reason") else ""
        told = f"publisher told {_outcome(info.get('outcome'))}{reason} by router {v['router']} (seq {v['seq']})"
        if info.get("kind") == "all-accepted":
            routers = ", ".join(sorted({p["r"] for p in pairs}))
            return f"{told}, but every subscriber owed it accepted it: {people} (routers {routers}){tag}"
        return (f"{told}, but owed subscriber(s) answered otherwise before their router answered and never accepted "
                f"it: {people}{tag}")
    if check == "left-unsettled":
        answer = info.get("answer")
        if info.get("by") is not None:
            why = (f"settled by {BY_NAME.get(info['by'], '?')}, but the record was never deleted (receivers not "
                   f"known to have seen the settlement)")
        elif answer:
            why = f"answered {_outcome(answer['o'])}; " + (
                "the publisher never settled it" if info.get("origin") is None else
                f"origin router {info['origin']} never relayed a settlement")
        else:
            why = "never answered: waiting for " + (", ".join(info.get("waiting") or []) or "remote routers")
        return f"record left on router {v['router']}: {why}{tag}"
    if check == "ledger":
        kind = info.get("kind")
        mid = f", message-id {info['message_id']}" if info.get("message_id") else ""
        if kind == "missing":
            return f"subscriber {sub} accepted it (router view), but its application's ledger never got it{tag}"
        if kind == "twice":
            return f"handed to the application of {sub} {info['n']} times{tag}{mid}"
        if kind == "unsent":
            return f"the application of {sub} was handed a delivery no router logged sending it{mid}"
        if kind == "dup":
            return (f"the application of {sub} was handed one publisher delivery under {len(info['ids'])} ids: "
                    f"{', '.join(info['ids'])}{mid}")
        if kind == "order":
            return (f"the application of {sub} was handed stream_seq {info['stream_seq']} after {info['prev_seq']} "
                    f"of stream {info['stream']}{mid}")
        routers = _outcome(info.get("outcome")) if info.get("outcome") is not None else "nothing"
        return (f"publisher {v['publisher']}/{info.get('link')} tag {v['pub_tag']}{mid}: routers said {routers}, the "
                f"application's ledger says {info.get('app_outcome') or 'nothing'}")
    return json.dumps(info)


def main(argv: list[str] | None = None) -> int:
    """``spark-submit spark/reconcile.py LOGDIR... [options]``: the master comes from
    spark-submit (use ``eorouter reconcile`` for a local run)."""
    from spark.cli import reconcile_main
    return reconcile_main(argv, default_master=None)


if __name__ == "__main__":
    raise SystemExit(main())
