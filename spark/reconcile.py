"""The reconciliation: every invariant of docs/reconcile.md, as DataFrame transformations.

How it runs (docs/reconcile.md, "How it runs"): two reads of the input, each
converting only the fields it needs (spark/load.py), no cached copy of the lines.

1. **Per router** (``input_facts``): one hash aggregation of ``(router, epoch, seq)``
   into 64-bit words of bits (``bit_or``): its partial step leaves one row per 64
   lines to shuffle, and it finds every missing and every repeated ``seq`` exactly.
   The same read counts the malformed lines and collects, as side results of that
   one job (``observe``), every router the events name and the few lines that name
   no delivery (links, routes, peers). The small per-router tables the proofs need
   are made from those on the driver (``small_tables``). Of lines in the writer's
   shape, a pass of plain Java finds the same facts (spark/linescan.py), declining
   any input it cannot vouch for.
2. **Per delivery** (``delivery_facts``): the events that name a delivery, routers
   and subscribers as 64-bit hashes, one shuffle by delivery id (its hash), sorted,
   grouped into one row per delivery (``ev``: its events on every router and epoch,
   in (router, epoch, seq) order), and one projection written in Spark SQL with
   built-in higher-order functions (compiled by Spark: no Python runs on a row)
   that decides every per-delivery invariant, excuses included (the small tables
   are constants of it), and yields its violations (``v``: usually empty) and the
   few facts the other checks and the summary read. Cached: one row per delivery.
   Usually a pass of plain Java over the same sorted rows makes the same row
   (spark/deliveryrules.py), the SQL being its twin and its fallback.
3. **Across deliveries**, from those facts: one publisher delivery under two ids,
   publisher order per subscriber, the applications' ledgers.
4. **On the driver**, for the violations the report lists only: names for the
   hashes, the item each check counts, and a sentence (``describe``).

Malformed lines are counted by both reads; only when there is one is the input
read a third time, as text, to name each bad line's file and line (``find_bad_lines``).
Run it with ``eorouter reconcile LOGDIR...`` or ``spark-submit spark/reconcile.py LOGDIR...``.
"""

from __future__ import annotations

import json
import re
import sys
import threading
from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

if __name__ == "__main__" and __package__ in (None, ""):  # spark-submit spark/reconcile.py
    # Run as a file: import the package from the checkout this file is in (and not
    # this directory's modules as top-level ones).
    _here = str(Path(__file__).resolve().parent)
    sys.path[:] = [p for p in sys.path if p and str(Path(p).resolve()) != _here]
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import xxhash
from pyspark import StorageLevel
from pyspark.sql import Column, DataFrame, Observation, Window
from pyspark.sql import functions as F
from pyspark.sql import types as T

from router.eventschema import EVENT_SCHEMA, EVENTS, FOLDS
from spark.schema import CORRUPT, FILE
from spark.topics import pattern_regex

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

#: A violation found in Spark (routers and subscribers as hashes: ``names`` decodes
#: them). ``kind`` tells a check's variants apart; (kind, delivery, router, epoch,
#: subscriber, other) is what the check counts (the fields it does not count are
#: null); ``info`` is JSON with the check's own facts (describe() makes a sentence).
VIOLATION_SCHEMA = T.StructType(
    [
        T.StructField("check", T.StringType()),
        T.StructField("kind", T.StringType()),
        T.StructField("delivery", T.StringType()),
        T.StructField("router", T.LongType()),
        T.StructField("epoch", T.LongType()),
        T.StructField("seq", T.LongType()),
        T.StructField("subscriber", T.LongType()),
        T.StructField("other", T.LongType()),
        T.StructField("publisher", T.StringType()),
        T.StructField("pub_tag", T.StringType()),
        T.StructField("ts", T.DoubleType()),
        T.StructField("info", T.StringType()),
    ]
)
#: What each check counts, of a violation's fields.
ITEM = {
    "lost": ("delivery",),
    "invented": ("delivery",),
    "outcome-disagrees": ("delivery",),
    "duplicated": ("kind", "subscriber", "delivery"),
    "out-of-order": ("router", "subscriber", "delivery"),
    "record-missing": ("router", "epoch", "delivery"),
    "arrival-unforwarded": ("router", "delivery"),
    "accept-unowed": ("subscriber", "delivery"),
    "accept-unsent": ("subscriber", "router", "delivery"),
    "answer-missing": ("router", "other", "delivery"),
    "left-unsettled": ("router", "delivery"),
    "ledger": ("kind", "subscriber", "delivery"),
}

#: Kind codes: the per-delivery rows carry a small integer, not the kind's name.
#: A kind the proof does not reason about (a kind added to router/eventschema.py
#: later, say) is 0: read, counted, never judged.
KIND = {
    "received": 1,
    "forwarded": 2,
    "sub-outcome": 3,
    "pub-outcome": 4,
    "settled": 5,
    "record-deleted": 6,
    "expired": 7,
    "forwarded-to-router": 8,
    "outcome-to-router": 9,
    "outcome-from-router": 10,
    "settlement-relayed": 11,
    "resend-matched": 12,
    "origin-taken-over": 13,
    "placeholder-created": 14,
    "placeholder-fulfilled": 15,
    "placeholder-expired": 16,
    "placeholder-settled": 17,
    "owed-moved": 18,
    "owed-state-discarded": 19,
    "tag-collision": 20,
    "dropped": 21,
    "order-gap": 22,
}
#: The applications' ledgers' `delivered` lines travel with the routers' events
#: (docs/ledger.md): a subscriber's application was handed the delivery.
APP_DELIVERED = 30
KIND_NAME = {code: name for name, code in KIND.items()} | {0: "other", APP_DELIVERED: "delivered (ledger)"}
#: The kinds in the order a CASE expression tests them: the most frequent first.
_FREQUENT = (
    "sub-outcome",
    "received",
    "pub-outcome",
    "settled",
    "record-deleted",
    "forwarded",
    "outcome-to-router",
    "outcome-from-router",
    "forwarded-to-router",
    "settlement-relayed",
    "expired",
)
_BY_FREQUENCY = _FREQUENT + tuple(k for k in KIND if k not in _FREQUENT)
OUTCOME = {"accepted": 1, "rejected": 2, "released": 3, "modified": 4, "none": 5}
OUTCOME_NAME = {code: name for name, code in OUTCOME.items()} | {6: "other", 7: "expired"}
ACC = OUTCOME["accepted"]
EXPIRED = 7  # an `expired` event, where a subscriber's answer is reported
TERMINAL_NOT_ACCEPTED = (2, 3, 4)
BY = {
    "router": 1,
    "publisher": 2,
    "publisher-gone": 3,
    "origin-router": 4,
    "settled-elsewhere": 5,
    "publisher-resumed": 6,
    "answered": 8,  # an at-least-once record at a router that answered the origin (docs/guarantees.md)
}
BY_NAME = {code: name for name, code in BY.items()} | {7: "other"}
#: A pub-outcome answered from the router's memory of a finished delivery
#: (docs/resumption.md): no record needed, only some earlier event about it.
REMEMBERED = "resent after it was finished and settled; outcome remembered"
#: A pub-outcome refusing a resend of a stream the router forgot (docs/resumption.md,
#: the resume horizon): rejected with this condition, which tells the publisher it
#: may have been delivered. It needs no record, and it is not the subscribers'
#: outcome: the delivery's first life answered for them (router/core/constants.py).
BEYOND_HORIZON = "eorouter:resend-beyond-horizon"
#: A received line's ``guarantee`` on an at-least-once topic (docs/guarantees.md): its
#: duplicates are counted, not failed.
AT_LEAST_ONCE = "at-least-once"

#: Events that name a delivery some router must have received ("nothing
#: invented"). Not tag-collision, dropped, order-gap or placeholder-*: those name
#: a tag the router refused, dropped, holds back or has not seen yet.
REFERENCING = (
    "forwarded",
    "sub-outcome",
    "pub-outcome",
    "settled",
    "record-deleted",
    "expired",
    "outcome-to-router",
    "outcome-from-router",
    "settlement-relayed",
    "forwarded-to-router",
    "resend-matched",
    "origin-taken-over",
    "owed-moved",
    "owed-state-discarded",
)
#: Events a router logs only about a record it holds in that epoch: each must
#: follow a `received` of the delivery on the same router in the same epoch.
#: Not forwarded-to-router (a relay forwards without a record) and not the
#: kinds that name a delivery the router has not seen.
NEEDS_RECORD = (
    "forwarded",
    "sub-outcome",
    "pub-outcome",
    "settled",
    "record-deleted",
    "expired",
    "outcome-to-router",
    "outcome-from-router",
    "settlement-relayed",
    "resend-matched",
    "origin-taken-over",
    "owed-moved",
    "owed-state-discarded",
    "placeholder-fulfilled",
)
#: Kinds whose line must name a delivery.
NAMES_DELIVERY = (
    "received",
    "forwarded",
    "sub-outcome",
    "expired",
    "outcome-to-router",
    "outcome-from-router",
    "forwarded-to-router",
    "settled",
    "record-deleted",
    "settlement-relayed",
    "completed",
)
#: Kinds that name no delivery: links, routers, peers, routes (the per-router tables).
LIFE_KINDS = (
    "router-started",
    "router-stopping",
    "link-attached",
    "link-detached",
    "subscription-expired",
    "routes",
    "peer-connected",
    "peer-lost",
    "peer-restarted",
    "resume-requested",
)
_LIFE_COLUMNS = (
    "router",
    "epoch",
    "seq",
    "ts",
    "boot",
    "event",
    "link",
    "container",
    "name",
    "role",
    "address",
    "durable",
    "closed",
    "reason",
    "reachable",
    "peer",
    "peer_epoch",
)

#: The fields each read converts (spark/load.py LINE_FIELDS has them all).
COMMON = tuple(EVENT_SCHEMA)
ROUTER_READ = COMMON + (
    "delivery",
    "deliveries",
    "by",
    "origin_router",
    "to_router",
    "from_router",
    "routers",
    "dests",
    "link",
    "container",
    "name",
    "role",
    "address",
    "durable",
    "closed",
    "reason",
    "reachable",
    "peer",
    "peer_epoch",
)
DELIVERY_READ = COMMON + (
    "delivery",
    "deliveries",
    "subscriber",
    "outcome",
    "pub_outcome",
    "condition",
    "reason",
    "settled",
    "by",
    "deleted",
    "owed",
    "filtered",
    "guarantee",  # a relaxed topic's (issue 20): at-least-once duplicates are counted, not failed
    "forwarded",
    "routers",
    "origin_router",
    "to_router",
    "from_router",
    "dests",
    "subscribers",
    "topic",
    "publisher",
    "link_name",
    "pub_tag",
    "incarnation",
    "stream_seq",
)

#: Wall-clock tolerance (seconds) when a cross-router fact can only be placed in
#: time by ts (routers' events are ordered by (epoch, seq) only within a router).
CLOCK_SLACK = 5.0

#: Folded lines (router.eventschema.FOLDED) stand for several events at their seq.
COMPLETED, SUB_OUTCOMES = "completed", "sub-outcomes"
#: Column added by unfold(): true only on the first event of a line.
FIRST = "_first_of_line"
#: Column added by validate(): what is wrong with a line (null: nothing).
PROBLEM = "_problem"


# ---------------------------------------------------------------------------
# Small helpers
# ---------------------------------------------------------------------------


def _sql_string(text: str) -> str:
    """``text`` as a Spark SQL string literal."""
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


def _code(field: str, names: tuple, table: dict, other: int) -> Column:
    """A CASE expression mapping the values ``names`` of the string ``field``
    (tested in that order) to their codes in ``table`` (unknown: ``other``; null:
    null). Written as SQL text: one call into the JVM, where a chain of Columns
    took four per name."""
    cases = " ".join(f"WHEN {_sql_string(name)} THEN {int(table[name])}" for name in names)
    return F.expr(f"CASE WHEN `{field}` IS NULL THEN NULL ELSE CASE `{field}` {cases} ELSE {int(other)} END END")


def _key(container: Column, name: Column) -> Column:
    return F.concat_ws("/", container, name)


def _hash(column: Column) -> Column:
    """A name (router, subscriber key) as the 64-bit hash the per-delivery rows
    carry; null stays null (xxhash64 of null is its seed)."""
    return F.when(column.isNotNull(), F.xxhash64(column))


def _hashes(column: Column) -> Column:
    return F.transform(column, lambda x: _hash(x))


def violations(df: DataFrame, check: str, info: dict | None = None, **cols) -> DataFrame:
    """``df`` as violations of ``check`` (VIOLATION_SCHEMA): one row per row of ``df``."""
    return df.select(*violation_columns(check, info, **cols))


def violation_columns(check: str, info: dict | None = None, **cols) -> list[Column]:
    """A violation of ``check`` (VIOLATION_SCHEMA's columns) made of ``cols``, each a
    column name or a Column, and ``info`` (names to columns, kept as JSON)."""

    def col(name, type_):
        value = cols.get(name)
        if value is None:
            return F.lit(None).cast(type_).alias(name)
        return (F.col(value) if isinstance(value, str) else value).cast(type_).alias(name)

    info_col = (
        F.to_json(F.struct(*[(F.col(v) if isinstance(v, str) else v).alias(k) for k, v in info.items()]))
        if info
        else F.lit(None).cast("string")
    )
    fields = [col(f.name, f.dataType) for f in VIOLATION_SCHEMA.fields[1:-1]]
    return [F.lit(check).alias("check"), *fields, info_col.alias("info")]


def union_all(frames: list[DataFrame]) -> DataFrame:
    """One union of many frames of one schema, built as a balanced tree (each step
    of a chain would analyse the whole plan again)."""
    while len(frames) > 1:
        frames = [frames[i].unionByName(frames[i + 1]) if i + 1 < len(frames) else frames[i] for i in range(0, len(frames), 2)]
    return frames[0]


# ---------------------------------------------------------------------------
# 1. Lines: which are malformed, and why
# ---------------------------------------------------------------------------

_KNOWN_KINDS = tuple(EVENTS)
_TYPED = tuple((name, type_) for kind in EVENTS.values() for name, type_ in kind.items())


def bad(lines: DataFrame) -> Column:
    """True for a line that is not a well-formed event: Spark could not read it whole
    (not JSON, not an object, a field of the wrong type), a common field is missing,
    its kind is unknown, its seq or epoch is below 1, or a kind about one delivery
    names none. (The cheap test of every line; ``validate`` says why, for the few.)"""
    return F.expr(_BAD)


def _sql_in(names: Iterable[str]) -> str:
    return "(" + ", ".join(_sql_string(n) for n in names) + ")"


# bad() as SQL text (one call into the JVM where Columns took hundreds).
_BAD = " OR ".join(
    [
        f"`{CORRUPT}` IS NOT NULL",
        *[f"`{name}` IS NULL" for name in COMMON],
        f"NOT (event IN {_sql_in(_KNOWN_KINDS)})",
        "seq < 1",
        "epoch < 1",
        f"(event IN {_sql_in(NAMES_DELIVERY)} AND delivery IS NULL"
        f" AND NOT (event = {_sql_string(SUB_OUTCOMES)} AND deliveries IS NOT NULL))",
        f"(event = {_sql_string(SUB_OUTCOMES)} AND coalesce(size(deliveries), 0) < 1)",
    ]
)


def validate(lines: DataFrame) -> DataFrame:
    """Adds ``PROBLEM``: why a line is not a well-formed event (``bad``), or null."""
    raw = F.col(CORRUPT)
    common = [name for name in COMMON if name in lines.columns]
    any_missing = F.lit(False)
    for name in common:
        any_missing = any_missing | F.col(name).isNull()
    missing = F.concat_ws(", ", *[F.when(F.col(name).isNull(), F.lit(name)) for name in common])
    # Which field Spark could not convert: its value is null though the text has it.
    typed = dict(list(EVENT_SCHEMA.items()) + list(_TYPED))
    wrong = F.concat_ws(
        ", ",
        *[
            F.when(
                F.col(name).isNull() & raw.contains(f'"{name}":') & ~raw.contains(f'"{name}":null'),
                F.lit(f"{name} is not {typed[name]}"),
            )
            for name in typed
            if name in lines.columns
        ],
    )
    nothing_parsed = F.col("seq").isNull() & F.col("router").isNull() & F.col("event").isNull()
    problem = (
        F.when(
            raw.isNotNull() & nothing_parsed,
            F.when(F.trim(raw).startswith("{"), F.lit("unparsable line (not valid JSON)")).otherwise(
                F.lit("unparsable line (not a JSON object)")
            ),
        )
        .when(
            raw.isNotNull(),
            F.concat(F.lit("wrong type: "), F.when(wrong != "", wrong).otherwise(F.lit("a field Spark could not read"))),
        )
        .when(any_missing, F.concat(F.lit("missing common field(s): "), missing))
        .when(~F.col("event").isin(*_KNOWN_KINDS), F.concat(F.lit("unknown event kind "), F.col("event")))
        .when((F.col("seq") < 1) | (F.col("epoch") < 1), F.lit("seq and epoch start at 1"))
        .when(
            F.col("event").isin(*NAMES_DELIVERY)
            & F.col("delivery").isNull()
            & ~((F.col("event") == SUB_OUTCOMES) & F.col("deliveries").isNotNull()),
            F.concat(F.lit("a "), F.col("event"), F.lit(" event without its delivery")),
        )
        .when(
            (F.col("event") == SUB_OUTCOMES) & (F.coalesce(F.size("deliveries"), F.lit(0)) < 1),
            F.lit("a sub-outcomes line without deliveries"),
        )
    )
    return lines.withColumn(PROBLEM, problem)


# ---------------------------------------------------------------------------
# 2. Unfolding: a folded line is the events it stands for (no higher-order function)
# ---------------------------------------------------------------------------


def unfold(lines: DataFrame) -> DataFrame:
    """Every folded line as the events it stands for (router.eventschema.FOLDS, the rule
    router.eventschema.unfold() follows: same seq, same order), with one ``posexplode``
    of an array built without any higher-order function. Adds ``FIRST`` (true on a
    line's first event) and ``_pos`` (the event's place in its line). A "completed"
    line is its sub-outcome, its pub-outcome and, when ``by`` is set, its settled; a
    "sub-outcomes" line one sub-outcome per element of ``deliveries``. A fold whose
    own line fields (``pub_outcome``, ``deliveries``) a pruned read left out is
    skipped; any other field it needs must be there (Spark says so if not)."""
    present = {kind: fold for kind, fold in FOLDS.items() if _line_only(fold) <= set(lines.columns)}
    if not present:
        return lines.withColumn(FIRST, F.lit(True)).withColumn("_pos", F.lit(0))
    kind = F.col("event")
    d = F.col("delivery")
    parts = new_kind = None
    # event field -> its value on each event of a folded line (None: not that event's)
    values: dict[str, list] = {}
    line_only = set().union(*(_line_only(fold) for fold in present.values()))
    for name, (events, fields, optional_last, run_field) in present.items():
        this = kind == name
        if run_field is not None:  # one events[0] per listed delivery
            this = this & (F.size(run_field) > 0)
            parts = _when(parts, this, F.col(run_field))
            new_kind = _when(new_kind, this, F.lit(events[0]))
            for field, line in fields[0].items():
                if field != line:
                    values.setdefault(field, []).append((this, F.col(line)))
            continue
        if optional_last is not None:
            parts = _when(parts, this & F.col(optional_last).isNotNull(), F.array(*[d] * len(events)))
            parts = parts.when(this, F.array(*[d] * (len(events) - 1)))
        else:
            parts = _when(parts, this, F.array(*[d] * len(events)))
        new_kind = _when(new_kind, this, F.element_at(F.array(*[F.lit(e) for e in events]), F.col("_pos") + 1))
        for field in {f for fs in fields for f in fs}:
            value = None
            for i, fs in enumerate(fields):
                if field in fs:
                    value = _when(value, F.col("_pos") == i, F.col(fs[field]))
            assert value is not None  # field is in one of fields: the loop set it
            values.setdefault(field, []).append((this, value.otherwise(F.lit(None))))
    assert parts is not None and new_kind is not None  # present is not empty: the loop set both
    x = lines.select("*", F.posexplode(parts.otherwise(F.array(d))).alias("_pos", "_d"))
    columns = {"event": new_kind.otherwise(kind), "delivery": F.col("_d")}
    for field, cases in values.items():
        value = None
        for cond, v in cases:
            value = _when(value, cond, v)
        assert value is not None  # cases is not empty
        columns[field] = value.otherwise(F.col(field))
    keep = [c for c in lines.columns if c not in line_only]
    pos = F.col("_pos")
    return x.select(
        *[columns[c].cast(lines.schema[c].dataType).alias(c) if c in columns else F.col(c) for c in keep],
        (pos == 0).alias(FIRST),
        pos.alias("_pos"),
    )


def _line_only(fold: tuple) -> set[str]:
    """The fields only a folded line has (no event has a field of that name)."""
    _, fields, _, run_field = fold
    return {line for fs in fields for name, line in fs.items() if name != line} | ({run_field} - {None})


def _when(chain: Column | None, cond: Column, value: Column) -> Column:
    """``chain.when(cond, value)``, starting the chain when there is none."""
    return F.when(cond, value) if chain is None else chain.when(cond, value)


# ---------------------------------------------------------------------------
# The tables the proofs share
# ---------------------------------------------------------------------------


class HashCollision(Exception):
    """Two router or subscriber names have one 64-bit hash (never seen; about one
    chance in 10^12 for a million names): the per-delivery rows could not tell them
    apart, so the proof refuses to run rather than mix them up."""


@dataclass
class Names:
    """Routers and subscribers by the hash the per-delivery rows carry."""

    routers: dict[int, str] = field(default_factory=dict)  # hash -> name
    subscribers: dict[int, str] = field(default_factory=dict)

    def router(self, h: int | None) -> str | None:
        return None if h is None else self.routers.get(h, f"<router {h}>")

    def subscriber(self, h: int | None) -> str | None:
        return None if h is None else self.subscribers.get(h, f"<subscriber {h}>")


@dataclass
class Tables:
    """What the proofs read: ``facts``, one row per delivery (cached); ``input``, what
    input_facts() found; ``small``, the per-router tables (made on the driver);
    ``names`` for the hashes; the reads' ``sources``."""

    facts: DataFrame
    input: dict
    small: dict
    names: Names
    sources: list
    partitions: int = 0
    bad_in_deliveries: Observation | None = None
    persisted: list = field(default_factory=list)
    storage: StorageLevel = field(default_factory=lambda: StorageLevel.MEMORY_AND_DISK)
    #: The hashes of the routers whose log is missing (the per-delivery rules' constant).
    missing: list = field(default_factory=list)

    #: Builds the per-delivery facts again reading every line permissively (set by
    #: prepare() when the facts read strictly: the first read found no malformed line).
    permissive: Callable[[], tuple[DataFrame, Observation | None]] | None = None
    #: Builds the per-delivery facts again with the rules in Spark SQL, which judge any
    #: input (set by prepare(); used when the Java rules leave the input to them).
    sql_rules: Callable[[], tuple[DataFrame, Observation | None]] | None = None
    #: Which per-delivery rules made the facts: "java", or why Spark SQL's (report.json).
    rules: str = ""
    #: The largest ledger file's size in bytes, when known (local ledgers; spark/job.py):
    #: the application-order check's sort key fits one long with it (_ledger_key).
    ledger_bytes: int | None = None
    #: Whether the publisher-order checks may run in Java (spark/streamorder.py); the
    #: tests set it False to run their SQL twin.
    java_order: bool = True
    #: Whether some publisher delivery was received under more than one delivery id
    #: (multiple_ids(): asked once, by the first proof that needs it).
    _multiple_ids: bool | None = None
    #: (the proofs are planned in two threads, spark/job.py: both may ask first)
    _multiple_ids_lock: threading.Lock = field(default_factory=threading.Lock)

    def compute_facts(self) -> int:
        """The per-delivery pass (read, shuffle by delivery, every invariant), run
        now and its rows kept for the proofs; returns how many deliveries. A strict
        read that meets a line Spark cannot read whole (a field only this read
        converts, of the wrong type) is done again permissively, which counts it."""
        from spark import deliveryrules, linescan
        from spark.load import is_malformed

        while True:
            try:
                kept = materialize(self.facts, self.storage)
                break
            except Exception as error:  # noqa: BLE001 (Py4J's and PySpark's errors both carry Spark's)
                if self.sql_rules is not None and deliveryrules.is_unusual(error):
                    self.rules = "spark-sql (" + _unusual_why(error) + ")"
                    self.facts, self.bad_in_deliveries = self.sql_rules()
                    self.sql_rules = None
                elif self.permissive is not None and (is_malformed(error) or linescan.is_changed(error)):
                    self.facts, self.bad_in_deliveries = self.permissive()
                    self.permissive = self.sql_rules = None
                    if self.rules == deliveryrules.JAVA:
                        self.rules = "spark-sql (the pass was read again in Spark SQL, permissively)"
                else:
                    raise
        self.facts = kept
        self.persisted.append(self.facts)
        return self.facts.count()

    def multiple_ids(self) -> bool:
        """Whether any publisher delivery (its publisher identity's 64-bit hash) was
        received under more than one delivery id: usually not, and then the proofs
        that merge a publisher delivery's ids (duplicates across ids, publisher and
        application order) have nothing to merge and skip their grouping. One small job,
        the first time (its shuffle carries one long per delivery)."""
        with self._multiple_ids_lock:
            if self._multiple_ids is None:
                self._multiple_ids = bool(_id_counts(self).limit(1).collect())
            return self._multiple_ids

    def unpersist(self) -> None:
        for frame in self.persisted:
            release(frame)
        self.persisted.clear()

    @property
    def epochs(self) -> list[dict]:
        return self.input["epochs"]


def _unusual_why(error: BaseException) -> str:
    """The Java rules' reason, from the job's error (DeliveryRules.UNUSUAL and what follows)."""
    from spark.deliveryrules import UNUSUAL

    text = str(error)
    at = text.find(UNUSUAL)
    end = text.find(")", at)
    return text[at + len("eorouter: ") : end + 1] if end > at else "a delivery outside the Java rules' shape"


# ---------------------------------------------------------------------------
# Per router: sequence numbers and epochs
# ---------------------------------------------------------------------------

_WORD = 64  # the sequence check packs 64 seq numbers into one long


def _words(lines: DataFrame) -> DataFrame:
    """(router, epoch, w): the bits of the seq numbers w * 64 + 1 .. w * 64 + 64 that
    have a line, how many lines, and the epoch's extent and orderly stop."""
    good = F.col("router").isNotNull() & F.col("epoch").isNotNull() & F.col("seq").isNotNull() & (F.col("seq") > 0)
    word = F.floor((F.col("seq") - 1) / _WORD).cast("long")
    bit = F.expr(f"shiftleft(1L, cast((seq - 1) % {_WORD} as int))")
    return (
        lines.where(good)
        .groupBy("router", "epoch", word.alias("w"))
        .agg(
            F.bit_or(bit).alias("bits"),
            F.count(F.lit(1)).alias("lines"),
            F.max("seq").alias("hi"),
            F.min("ts").alias("first_ts"),
            F.max("ts").alias("last_ts"),
            F.min(F.when(F.col("event") == "router-stopping", F.col("seq"))).alias("stopping_seq"),
            F.min(F.when(F.col("event") == "router-stopping", F.col("ts"))).alias("stopping_ts"),
        )
    )


#: The fields that name other routers (scalars, then lists): input_facts() collects them.
_NAMING = ("origin_router", "to_router", "from_router", "routers", "dests")


@dataclass
class _Read:
    """What the first read found, before the cold paths and the summing up: from Spark
    SQL (``_read_facts``) or from the Java scan (``_scanned``), the same either way."""

    epochs: dict  # (router, epoch) -> distinct, lines, last_seq, first_ts, last_ts, stopping_seq, stopping_ts
    runs: list  # (router, epoch, from, to): the missing seq numbers
    lines: int
    bad: int
    named: set
    life: list  # the lines that name no delivery, as dicts of _LIFE_COLUMNS
    per_kind: list  # events per kind, by the kind's place in EVENTS (a folded line as the events it is)
    refused: int
    completed: int
    completed_settling: int


def input_facts(spark, sources: list, scanned: tuple[dict | None, str] | None = None) -> dict:
    """Everything about the input itself, from one read of it (the common fields,
    the links', peers' and routes' fields, the routers events name):

    - per (router, epoch): its extent (first/last ts, lines), whether it stopped in
      order, and every missing or repeated ``seq``, exactly: each line sets one bit
      of a 64-bit word (word ``(seq - 1) div 64``) with ``bit_or``, a hash
      aggregation whose partial step leaves one row per 64 lines to shuffle; an
      epoch whose words hold fewer bits than its highest seq has a gap, one with
      more lines than bits repeats a seq. Only then (cold path) are the words read
      again to name the missing numbers, and the lines to name the repeated ones;
    - side results of the same job (``observe``): how many lines are malformed,
      every router the events about deliveries name, and the lines that name no
      delivery (links, routes, peers: few).

    Of JSON lines in the writer's shape, the Java scan (spark/linescan.py) finds the
    same, faster; ``first_read`` says which read ran, and why not the scan.
    ``scanned``: the scan's answer when it already ran (``linescan.read_once``).
    """
    from spark import linescan

    scan, how = scanned if scanned is not None else linescan.scan(spark, sources, line_vocabulary())
    found = _scanned(scan) if scan is not None else _read_facts(spark, sources)
    epochs, kinds = found.epochs, tuple(EVENTS)
    repeats = [key for key, e in epochs.items() if e["lines"] != e["distinct"]]
    repeated = []
    if repeats:  # cold path: which seq numbers, on which lines
        from spark.load import load_lines

        wanted = [F.struct(F.lit(r).alias("router"), F.lit(e).alias("epoch")) for r, e in repeats]
        again = load_lines(spark, sources, ROUTER_READ, files=True)
        repeated = [
            r.asDict()
            for r in again.where(F.struct("router", "epoch").isin(*wanted) & (F.col("seq") > 0))
            .groupBy("router", "epoch", "seq")
            .agg(
                F.count(F.lit(1)).alias("n"),
                F.array_sort(F.collect_set(FILE)).alias("files"),
                F.array_sort(F.collect_set("event")).alias("kinds"),
                F.min("ts").alias("ts"),
            )
            .where(F.col("n") > 1)
            .orderBy("router", "epoch", "seq")
            .limit(10_000)
            .collect()
        ]
    for r in found.life:  # the boot of each epoch (from its router-started line)
        if r["event"] == "router-started" and (r["router"], r["epoch"]) in epochs:
            e = epochs[(r["router"], r["epoch"])]
            if e.get("started_seq") is None or r["seq"] < e["started_seq"]:
                e.update(started_seq=r["seq"], started_ts=r["ts"], boot=r["boot"])
    for e in epochs.values():
        e.setdefault("started_ts", None)
        e.setdefault("boot", None)
        e["stopped"] = e["stopping_seq"] is not None
    ordered = sorted(epochs, key=lambda k: (str(k[0]), k[1]))
    per_kind: dict[str, int] = {}
    for i, kind in enumerate(kinds):  # a folded line's events under the kinds they are
        n = found.per_kind[i]
        if kind == SUB_OUTCOMES:
            per_kind["sub-outcome"] = per_kind.get("sub-outcome", 0) + n
        elif kind == COMPLETED:
            continue  # below: its sub-outcome, pub-outcome and settled
        elif n:
            per_kind[kind] = per_kind.get(kind, 0) + n
    for kind, n in (
        ("sub-outcome", found.completed),
        ("pub-outcome", found.completed),
        ("settled", found.completed_settling),
    ):
        if n:
            per_kind[kind] = per_kind.get(kind, 0) + n
    return {
        "epochs": [epochs[k] for k in ordered],
        "gaps": sorted(found.runs, key=lambda r: (str(r[0]), r[1], r[2])),
        "repeated": repeated,
        "lines": found.lines,
        "bad_count": found.bad,
        "named_routers": sorted(found.named - {None}),
        "life": found.life,
        "kinds": dict(sorted(per_kind.items())),
        "refused": found.refused,
        "first_read": how,
    }


def line_vocabulary() -> dict:
    """What the Java scan checks a line against and folds it by (spark/linescan.py):
    the fields and their types, the kinds, and the rules' lists above."""
    from router.eventschema import spark_schema_fields
    from spark.load import LINE_FIELDS

    types = dict(spark_schema_fields())
    return {
        "fields": [[name, types[name]] for name in LINE_FIELDS],
        "common": list(COMMON),
        "kinds": list(EVENTS),
        "names_delivery": list(NAMES_DELIVERY),
        "life_kinds": list(LIFE_KINDS),
        "life_columns": list(_LIFE_COLUMNS),
        "naming": list(_NAMING),
        "sub_outcomes": SUB_OUTCOMES,
        "completed": COMPLETED,
        "pub_outcome": "pub-outcome",
        "router_stopping": "router-stopping",
    }


def _ledger_rows_schema(spark) -> str:
    from spark.load import ledger_rows_schema

    return ledger_rows_schema(spark).json()


def _narrowed_schema(spark) -> str:
    from spark.load import line_schema

    empty = spark.createDataFrame([], line_schema(DELIVERY_READ))
    return _narrowed(unfold(empty.withColumn("_bad", bad(empty)))).schema.json()


def _facts_schema(spark) -> str:
    from pyspark.sql.types import _parse_datatype_string

    return _parse_datatype_string(FACTS_SCHEMA).json()


#: What the vocabularies derive by planning, as JSON: the ledgers' rows' schema
#: (LedgerScan's), narrow()'s (the one parse's rows, planned over an empty frame) and
#: the facts' (the Java rules'). Planning them is a second of a small input's driver
#: time; they are the code's, not the input's, so each is made once per process
#: (_derived()).
_DERIVATIONS: dict[str, Callable[[Any], str]] = {
    "ledger_rows": _ledger_rows_schema,
    "narrowed": _narrowed_schema,
    "facts": _facts_schema,
}
_DERIVED: dict[str, str] = {}
_DERIVED_LOCKS = {name: threading.Lock() for name in _DERIVATIONS}


def _derived(spark, name: str) -> str:
    """_DERIVATIONS[name] made by whichever thread asks first (spark/job.py asks in a
    second thread while its first reads); another asker meanwhile waits for it."""
    with _DERIVED_LOCKS[name]:
        if name not in _DERIVED:
            _DERIVED[name] = _DERIVATIONS[name](spark)
        return _DERIVED[name]


def plan_vocabularies(spark) -> None:
    """Make every _DERIVATIONS now (a caller's second thread)."""
    for name in _DERIVATIONS:
        _derived(spark, name)


def delivery_vocabulary(spark) -> dict:
    """What the Java delivery scan makes a line's events into (spark/linescan.py): the
    codes of narrow(), the folds, and narrow()'s own schema (the rows are its rows)."""
    from router.eventschema import FOLDS

    schema = _derived(spark, "narrowed")
    return {
        "kind_codes": KIND,
        "outcomes": OUTCOME,
        "other_outcome": 6,
        "by": BY,
        "other_by": 7,
        "remembered": REMEMBERED,
        "beyond_horizon": BEYOND_HORIZON,
        "at_least_once": AT_LEAST_ONCE,
        "filtered_reason": "filtered",
        "folds": {
            kind: {"events": list(events), "fields": list(fields), "optional_last": optional_last, "run_field": run_field}
            for kind, (events, fields, optional_last, run_field) in FOLDS.items()
        },
        "schema": schema,
    }


def _read_facts(spark, sources: list) -> _Read:
    """The first read in Spark SQL (the specification of the Java scan)."""
    from spark.load import load_lines

    lines = load_lines(spark, sources, ROUTER_READ)
    obs = Observation("input")
    is_bad = bad(lines)
    # How many events of each kind the well-formed lines stand for (a folded line is
    # the events it stands for), for the report: one small code per line, then sums.
    # (The codes are the kinds' places in EVENTS; tested most frequent first.)
    kinds = tuple(EVENTS)
    frequent = tuple(k for k in _BY_FREQUENCY if k in kinds)
    code = _code("event", frequent + tuple(k for k in kinds if k not in frequent), {k: i for i, k in enumerate(kinds)}, -1)
    life_codes = [kinds.index(k) for k in LIFE_KINDS]
    events = (
        F.when(F.col("event") == SUB_OUTCOMES, F.coalesce(F.size("deliveries"), F.lit(0)))
        .when(F.col("event") == COMPLETED, F.when(F.col("by").isNotNull(), F.lit(3)).otherwise(F.lit(2)))
        .otherwise(F.lit(1))
    )
    good = lines.select("*", F.when(~is_bad, code).alias("_code"), is_bad.alias("_bad"), events.alias("_events"))
    observed = good.observe(
        obs,
        F.count(F.lit(1)).alias("lines"),
        F.sum(F.col("_bad").cast("long")).alias("bad"),
        # The routers events name: a set per field (the two lists' sets hold their few
        # distinct lists), joined on the driver; one array built per line cost ~20 % of the read.
        *[F.collect_set(name).alias(f"named_{name}") for name in _NAMING],
        F.collect_list(F.when(F.col("_code").isin(*life_codes), F.struct(*_LIFE_COLUMNS))).alias("life"),
        F.sum(F.when((F.col("_code") == kinds.index("pub-outcome")) & F.col("delivery").isNull(), F.lit(1))).alias("refused"),
        F.sum(F.when(F.col("_code") == kinds.index(COMPLETED), F.lit(1))).alias("completed"),
        F.sum(F.when((F.col("_code") == kinds.index(COMPLETED)) & F.col("by").isNotNull(), F.lit(1))).alias("completed_settling"),
        *[F.expr(f"sum(CASE WHEN _code = {i} THEN _events END) AS k{i}") for i in range(len(kinds))],
    )
    per_epoch = (
        _words(observed)
        .groupBy("router", "epoch")
        .agg(
            F.sum(F.bit_count("bits")).alias("distinct"),
            F.sum("lines").alias("lines"),
            F.max("hi").alias("last_seq"),
            F.min("first_ts").alias("first_ts"),
            F.max("last_ts").alias("last_ts"),
            F.min("stopping_seq").alias("stopping_seq"),
            F.min("stopping_ts").alias("stopping_ts"),
        )
    )
    epochs = {(r["router"], r["epoch"]): r.asDict() for r in per_epoch.collect()}
    seen = obs.get
    named: set[str] = set()
    for name in _NAMING:
        for value in seen[f"named_{name}"] or ():
            named.update(value if isinstance(value, list) else (value,))
    gaps = [key for key, e in epochs.items() if e["distinct"] != e["last_seq"]]
    runs = []
    if gaps:  # cold path: the words of the epochs with a gap name the missing numbers
        wanted = [F.struct(F.lit(r).alias("router"), F.lit(e).alias("epoch")) for r, e in gaps]
        words: dict = defaultdict(dict)
        for h in (
            _words(load_lines(spark, sources, ROUTER_READ))
            .where(F.struct("router", "epoch").isin(*wanted))
            .select("router", "epoch", "w", "bits")
            .collect()
        ):
            words[(h["router"], h["epoch"])][h["w"]] = h["bits"]
        for key in gaps:
            runs += [(key[0], key[1], lo, hi) for lo, hi in _missing(words[key], epochs[key]["last_seq"])]
    return _Read(
        epochs=epochs,
        runs=runs,
        lines=seen["lines"],
        bad=seen["bad"] or 0,
        named=named,
        life=[r.asDict() for r in seen["life"]],
        per_kind=[seen[f"k{i}"] or 0 for i in range(len(kinds))],
        refused=seen["refused"] or 0,
        completed=seen["completed"] or 0,
        completed_settling=seen["completed_settling"] or 0,
    )


def _scanned(scan: dict) -> _Read:
    """The Java scan's facts (spark/linescan.py) in the form of ``_read_facts``'."""
    epochs, runs = {}, []
    for e in scan["epochs"]:
        key = (e["router"], e["epoch"])
        runs += [(key[0], key[1], lo, hi) for lo, hi in e.pop("missing")]
        epochs[key] = {"stopping_seq": None, "stopping_ts": None} | e
    return _Read(
        epochs=epochs,
        runs=runs,
        lines=scan["lines"],
        bad=0,  # the scan declines any input with a line it cannot vouch for
        named=set(scan["named"]),
        life=[dict(zip(_LIFE_COLUMNS, row, strict=True)) for row in scan["life"]],
        per_kind=scan["per_kind"],
        refused=scan["refused"],
        completed=scan["completed"],
        completed_settling=scan["completed_settling"],
    )


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


def small_tables(life: list[dict], epochs: list[dict], h) -> dict:
    """From the collected lines that name no delivery, keyed by hashes (``h``: name
    -> the hash the per-delivery rows carry):

    - ``ends``: (router, epoch, subscriber) -> the moments a subscription stopped
      being owed what it had not answered (docs/delivery-rule.md): a detach of a
      non-durable link, a closing detach, a durable subscriber that moved away (not
      a stolen link: the subscription carries on on the new one),
      ``subscription-expired``, and the name attaching again with another address
      than its previous attach there (``re-attached``: the router ends the old
      subscription then; the same address, a topic or a pattern, carries it on);
    - ``durable``: (router, epoch, subscriber) -> each attach's durability, valid from
      its seq to the next attach;
    - ``windows``: (router, epoch, subscriber) -> (attach seq, resume-requested seq): a
      sub-outcome logged between them is an answer a resuming subscriber *reported*
      (docs/resumption.md), the same answer again, not a new one;
    - ``routes``: (router, epoch) -> its `routes` events (seq, ts, reachable);
    - ``gone``: router -> (ts, topic, re) when it lost interest in a topic (a
      subscription ended there; ``re``: the regular expression of the topics a
      pattern takes, spark/topics.py) or stopped or died (topic null);
    - ``died``: the (router, epoch) that ended without `router-stopping`;
    - ``attached``: every subscriber that attached anywhere;
    - ``peers``: (peer, peer_epoch) -> the first (router, epoch, seq) that saw it (names).
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
    addresses: dict = {}  # (router hash, epoch, subscriber hash) -> the address of its last attach
    for r in rows:
        router, epoch, seq, kind = r["router"], r["epoch"], r["seq"], r["event"]
        rh = h(router)
        sub = f"{r['container']}/{r['name']}" if r.get("container") is not None else None
        sh = h(sub) if sub is not None else None
        if kind == "link-attached" and r["role"] == "subscriber":
            attaches[(router, epoch, r["link"])].append((seq, r["durable"] or 0, r["address"]))
            before = addresses.get((rh, epoch, sh))
            addresses[(rh, epoch, sh)] = r["address"]
            if before is not None and before != r["address"]:
                ends[key(rh, epoch, sh)].append({"seq": seq, "kind": "re-attached", "topic": r["address"]})
            durable[key(rh, epoch, sh)].append({"from": seq, "durable": r["durable"] or 0})
            pending_attach[(router, epoch, r["link"])] = (seq, sh)
            attached.add(sh)
        elif kind == "resume-requested" and r["role"] == "subscriber":
            found = pending_attach.pop((router, epoch, r["link"]), None)
            if found is not None and found[0] < seq:
                windows[(rh, epoch, found[1])].append([found[0], seq])
        elif kind == "link-detached" and r["role"] == "subscriber":
            before = [a for a in attaches.get((router, epoch, r["link"]), []) if a[0] < seq]
            link_durable, topic = (before[-1][1], before[-1][2]) if before else (None, None)
            reason = r.get("reason") or ""
            if reason != "stolen" and (r.get("closed") or (link_durable or 0) == 0 or reason == "moved"):
                ends[key(rh, epoch, sh)].append({"seq": seq, "kind": "closed" if r.get("closed") else "detached", "topic": topic})
                gone[str(rh)].append({"ts": r["ts"], "topic": topic, "re": pattern_regex(topic) if topic else None})
        elif kind == "subscription-expired":
            ends[key(rh, epoch, sh)].append({"seq": seq, "kind": "subscription-expired", "topic": r["address"]})
            gone[str(rh)].append({"ts": r["ts"], "topic": r["address"], "re": pattern_regex(r["address"] or "")})
        elif kind == "routes":
            routes[key(rh, epoch)].append({"seq": seq, "ts": r["ts"], "reachable": [h(x) for x in (r["reachable"] or [])]})
        elif kind in ("peer-connected", "peer-restarted") and r.get("peer") is not None and r.get("peer_epoch") is not None:
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
    died = [key(h(e["router"]), e["epoch"]) for e in epochs if not e["stopped"]]
    for e in epochs:
        end = e["stopping_ts"] if e["stopping_ts"] is not None else e["last_ts"]
        gone[str(h(e["router"]))].append({"ts": end, "topic": None, "re": None})
    return {
        "ends": dict(ends),
        "durable": dict(durable),
        "windows": merged,
        "routes": dict(routes),
        "gone": dict(gone),
        "died": died,
        "attached": sorted(attached),
        "peers": peers,
    }


def spark_hash(name: str) -> int:
    """Spark's ``xxhash64`` of a string, on the driver: XXH64 of its UTF-8 bytes
    with Spark's seed 42, as a signed long (tests/spark/test_job.py holds the two
    equal); a Spark job for a few names cost a small input a second."""
    unsigned = xxhash.xxh64_intdigest(name.encode("utf-8"), seed=42)
    return unsigned - (1 << 64) if unsigned >= 1 << 63 else unsigned


def hashes_of(names: Iterable[str | None]) -> dict[str, int]:
    """name -> Spark's xxhash64 of it."""
    return {n: spark_hash(n) for n in sorted({n for n in names if n is not None})}


# ---------------------------------------------------------------------------
# Bad lines: where, and torn or not (cold path)
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


def find_bad_lines(spark, sources: list, first: int = 1000) -> tuple[list[dict], int]:
    """The malformed lines, with their file and line number, and which of them is a
    torn write: an unparsable last line of the last file of its epoch, cut by a
    crash (a note, not a violation; docs/event-log.md, "Torn lines"). Cold path,
    only when a read counted a malformed line: the JSON logs are read again as
    text, numbered in file order and judged with the same rules; a Parquet dataset
    from 'eorouter logs compact' kept its malformed lines with their file and line.
    Returns (the first ``first`` of them, how many)."""
    from spark.load import LINE_FIELDS, line_schema, load_lines

    out: list[dict] = []
    total = 0
    for source in sources:
        if source.fmt == "json":
            reader = spark.read
            if source.remote:
                reader = reader.option("recursiveFileLookup", "true").option("pathGlobFilter", "events-*.jsonl")
            text = reader.text(source.paths).select(
                "value",
                F.col("_metadata.file_path").alias(FILE),
                F.struct(F.col("_metadata.file_block_start"), F.monotonically_increasing_id()).alias("at"),
            )
            w = Window.partitionBy(FILE)
            numbered = text.withColumn("line", F.row_number().over(w.orderBy("at"))).withColumn(
                "lines", F.count(F.lit(1)).over(w)
            )
            parsed = (
                numbered.where(F.trim("value") != "")
                .select(
                    FILE,
                    "line",
                    "lines",
                    F.col("value").alias("raw_line"),
                    F.from_json("value", line_schema(), {"mode": "PERMISSIVE", "columnNameOfCorruptRecord": CORRUPT}).alias("j"),
                )
                .select(FILE, "line", "lines", "raw_line", "j.*")
            )
            judged = validate(parsed).where(F.col(PROBLEM).isNotNull()).persist()
            try:
                total += judged.count()
                rows = judged.orderBy(FILE, "line").limit(first).collect()
                finals = last_files([r[0] for r in text.select(FILE).distinct().collect()]) if rows else set()
            finally:
                judged.unpersist()
            for r in rows:
                out.append(
                    {
                        "router": r["router"],
                        "epoch": r["epoch"],
                        "seq": r["seq"],
                        "ts": r["ts"],
                        "file": r[FILE],
                        "line": r["line"],
                        "problem": r[PROBLEM],
                        "text": r["raw_line"],
                        "torn": (r["line"] == r["lines"] and r[FILE] in finals and r[PROBLEM].startswith("unparsable")),
                    }
                )
        else:
            data = validate(load_lines(spark, [source], LINE_FIELDS, files=True))
            have = set(spark.read.parquet(*source.paths).columns)
            line = F.col("_line") if "_line" in have else F.lit(None).cast("long")
            judged = data.where(F.col(PROBLEM).isNotNull())
            total += judged.count()
            for r in (
                judged.select("router", "epoch", "seq", "ts", FILE, line.alias("line"), PROBLEM, CORRUPT).limit(first).collect()
            ):
                out.append(
                    {
                        "router": r["router"],
                        "epoch": r["epoch"],
                        "seq": r["seq"],
                        "ts": r["ts"],
                        "file": r[FILE],
                        "line": r["line"],
                        "problem": r[PROBLEM],
                        "text": r[CORRUPT],
                        "torn": False,
                    }
                )
    return out[:first], total


# ---------------------------------------------------------------------------
# 3. Per delivery: one row per delivery, every per-delivery invariant
# ---------------------------------------------------------------------------

#: One event of a delivery, as the per-delivery row holds it (names kept short:
#: there are ~14 of them per delivery, 10 million at scale). Routers and
#: subscribers are 64-bit hashes: no string is compared per event.
#:   r router, e epoch, q seq, t ts, k kind code, s subscriber, o outcome code,
#:   p the other router (origin_router, to_router or from_router), l a list (owed,
#:   dests or subscribers), f forwarded, x routers, b settled (received, sub-outcome)
#:   or deleted (settled), y settled's by code, or for a pub-outcome 1 remembered, 2 refused beyond the horizon,
#:   for an owed-state-discarded 3 filtered out, for a received 4 its topic at-least-once,
#:   rep a sub-outcome a resuming subscriber reported.
EVENT_FIELDS = ("r", "e", "q", "t", "k", "s", "o", "p", "l", "f", "x", "b", "y", "fl", "rep")


def narrow(events: DataFrame, windows: dict) -> DataFrame:
    """The well-formed events that name a delivery, as (h, delivery, id, _pos, the
    EVENT_FIELDS). ``windows``: small_tables()' resume windows (a broadcast join
    marks the reported answers; none without a resumed subscriber)."""
    return mark_reported(_narrowed(events), windows)


def _narrowed(events: DataFrame) -> DataFrame:
    """narrow() before the resume windows: what the Java delivery scan makes too."""
    kind = F.col("event")
    return events.where(F.col("delivery").isNotNull() & ~F.col("_bad")).select(
        F.xxhash64("delivery").alias("h"),
        "delivery",
        _hash(F.col("router")).alias("r"),
        F.col("epoch").alias("e"),
        F.col("seq").alias("q"),
        F.col("ts").alias("t"),
        _code("event", _BY_FREQUENCY, KIND, 0).alias("k"),
        _hash(F.col("subscriber")).alias("s"),
        _code("outcome", tuple(OUTCOME), OUTCOME, 6).alias("o"),
        _hash(F.coalesce(F.col("origin_router"), F.col("to_router"), F.col("from_router"))).alias("p"),
        F.when(kind == "received", _hashes(F.col("owed")))
        .when(kind == "forwarded-to-router", _hashes(F.col("dests")))
        .when(kind == "owed-moved", _hashes(F.col("subscribers")))
        .alias("l"),
        F.when(kind == "received", _hashes(F.col("forwarded"))).alias("f"),
        F.when(kind == "received", _hashes(F.col("routers"))).alias("x"),
        F.when(kind == "settled", F.col("deleted")).otherwise(F.col("settled")).alias("b"),
        F.when(kind == "settled", _code("by", tuple(BY), BY, 7))
        .when((kind == "pub-outcome") & (F.col("reason") == REMEMBERED), F.lit(1))
        .when((kind == "pub-outcome") & (F.col("condition") == BEYOND_HORIZON), F.lit(2))
        .when((kind == "owed-state-discarded") & (F.col("reason") == "filtered"), F.lit(3))
        .when((kind == "received") & (F.col("guarantee") == AT_LEAST_ONCE), F.lit(4))
        .alias("y"),
        # who filtered it out (selectors): never owed it
        F.when((kind == "received") & F.col("filtered").isNotNull(), _hashes(F.col("filtered"))).alias("fl"),
        F.when(kind == "received", F.struct("topic", "publisher", "link_name", "incarnation", "pub_tag", "stream_seq")).alias(
            "id"
        ),
        F.col("_pos"),
    )


def mark_reported(out: DataFrame, windows: dict) -> DataFrame:
    """Adds ``rep``: a sub-outcome inside a resuming subscriber's window (small_tables()'
    ``windows``) is an answer it reported again, not a new one."""
    if not windows:
        return out.withColumn("rep", F.lit(False))
    rows = [(k[0], k[1], k[2], a, b) for k, spans in windows.items() for a, b in spans]
    w = F.broadcast(out.sparkSession.createDataFrame(rows, "wr long, we long, ws long, a_seq long, r_seq long"))
    flagged = out.join(
        w,
        (out["r"] == w["wr"])
        & (out["e"] == w["we"])
        & (out["s"] == w["ws"])
        & (out["k"] == KIND["sub-outcome"])
        & (out["q"] > w["a_seq"])
        & (out["q"] < w["r_seq"]),
        "left",
    )
    return flagged.select(*[out[c] for c in out.columns], w["a_seq"].isNotNull().alias("rep"))


def ordered_deliveries(narrowed: DataFrame, partitions: int) -> DataFrame:
    """The one shuffle by delivery id (its 64-bit hash, also the sort's cheap prefix),
    each partition sorted: a delivery's events together, in (router, epoch, seq) order."""
    return narrowed.repartition(partitions, "h").sortWithinPartitions(*DELIVERY_ORDER)


#: A partition's order for the per-delivery pass: a delivery's events together (by its hash,
#: then its id), in (router, epoch, seq, place in the line) order.
DELIVERY_ORDER = ("h", "delivery", "r", "e", "q", "_pos")


def hashed_deliveries(narrowed: DataFrame, partitions: int) -> DataFrame:
    """The one shuffle by delivery id for the Java rules: each partition sorted by the id's
    hash alone, which Spark sorts by radix, ~6x faster than by DELIVERY_ORDER's six columns
    (at 10 M events ~9 s of task time, a quarter of the pass). The Java pass puts the few
    events that share a hash in the rest of DELIVERY_ORDER itself (DeliveryRules.EVENT_ORDER)."""
    return narrowed.repartition(partitions, "h").sortWithinPartitions("h")


def group_deliveries(narrowed: DataFrame, partitions: int) -> DataFrame:
    """ordered_deliveries(), then one row per delivery: ``ev`` (its events in (router,
    epoch, seq) order) and ``id`` (who published it: the `received` with the smallest
    stream_seq, its first numbering: a new origin that did not hold it when its
    publisher resumed there numbered the resend above everything, which says nothing
    of its place)."""
    return (
        ordered_deliveries(narrowed, partitions)
        .groupBy("h", "delivery")
        .agg(F.collect_list(F.struct(*EVENT_FIELDS)).alias("ev"), F.min_by("id", F.col("id.stream_seq")).alias("id"))
    )


#: delivery_facts()' rows (with or without ledgers: the same columns); the Java rules
#: make rows of it (spark/deliveryrules.py; tests/spark/test_delivery_rules.py holds it
#: to the SQL's).
FACTS_SCHEMA = (
    "struct<delivery:string,topic:string,publisher:string,link_name:string,incarnation:string,pub_tag:string,"
    "stream_seq:bigint,pub_id:string,stream:string,received:boolean,presettled:boolean,origin:bigint,"
    "origin_epoch:bigint,recv_ts:double,pub:struct<q:bigint,t:double,o:int,r:bigint,e:bigint>,told_accepted:boolean,"
    "recvs:array<struct<r:bigint,e:bigint,t:double>>,subs:array<struct<s:bigint,owed:boolean,o:int>>,"
    "first_sends:array<struct<e:bigint,q:bigint,r:bigint,s:bigint,t:double>>,died_with:array<struct<r:bigint,e:bigint>>,"
    "app:array<struct<s:bigint,n:int,first:struct<fid:bigint,split:bigint,row:bigint,t:double>>>,"
    "app_missing:array<bigint>,partial:boolean,horizon:boolean,filtered:array<bigint>,alo:boolean,"
    "alo_dups:array<struct<s:bigint,n:int>>,alo_app_dups:array<struct<s:bigint,n:int>>,"
    "v:array<struct<check:string,kind:string,router:bigint,epoch:bigint,seq:bigint,ts:double,subscriber:bigint,"
    "other:bigint,info:string>>>"
)


def rules_vocabulary(spark, ledgers: bool) -> dict:
    """What the Java rules (spark/deliveryrules.py) need of this module's vocabulary:
    the kind and outcome codes, the kinds two checks list, the clock slack, the schema."""
    return {
        "kind": KIND,
        "app": APP_DELIVERED,
        "accepted": ACC,
        "expired": EXPIRED,
        "none": OUTCOME["none"],
        "not_accepted": [*TERMINAL_NOT_ACCEPTED, EXPIRED],
        "referencing": list(REFERENCING),
        "needs_record": list(NEEDS_RECORD),
        "clock_slack": CLOCK_SLACK,
        "ledgers": ledgers,
        "schema": _derived(spark, "facts"),
    }


def rules_constants(small: dict, missing: list) -> dict:
    """The small tables the per-delivery rules read (Constants, for the Java rules)."""
    return {k: small[k] for k in ("ends", "durable", "routes", "gone", "died", "attached")} | {"missing": sorted(missing)}


def _sql_const(value, type_: str) -> str:
    """A constant of Spark type ``type_`` in SQL text (from_json of a literal: the
    optimizer folds it once, when the query is planned)."""
    return f"from_json({_sql_string(json.dumps(value))}, {_sql_string(type_)})"


def _kinds(*names: str) -> str:
    codes = [str(KIND[n]) for n in names]
    return f"= {codes[0]}" if len(codes) == 1 else f"IN ({', '.join(codes)})"


_EMPTY = "cast(array() as array<bigint>)"


class Constants:
    """The small tables (small_tables()) as SQL constants of the per-delivery projection."""

    def __init__(self, small: dict, missing: list):
        self.ends = _sql_const(small["ends"], "map<string, array<struct<seq:bigint, kind:string, topic:string>>>")
        self.durable = _sql_const(small["durable"], "map<string, array<struct<from:bigint, to:bigint, durable:bigint>>>")
        self.routes = _sql_const(small["routes"], "map<string, array<struct<seq:bigint, ts:double, reachable:array<bigint>>>>")
        self.gone = _sql_const(small["gone"], "map<string, array<struct<ts:double, topic:string, re:string>>>")
        self.died = _sql_const(small["died"], "array<string>")
        self.attached = _sql_const(small["attached"], "array<bigint>")
        self.missing = _sql_const(sorted(missing), "array<bigint>")

    @staticmethod
    def at(table: str, *parts: str) -> str:
        """The list ``table`` holds at the key made of ``parts`` (empty if none)."""
        key = " || '|' || ".join(f"cast({p} as string)" for p in parts)
        return f"coalesce(try_element_at({table}, {key}), array())"


def _violation(
    check: str, *, kind="NULL", r="NULL", e="NULL", q="NULL", t="NULL", s="NULL", other="NULL", info: dict | None = None
) -> str:
    """One violation as a SQL struct, inside the per-delivery projection (the
    delivery, publisher and tag are added from the row)."""
    fields = ", ".join(f"'{k}', {v}" for k, v in (info or {}).items())
    info_sql = f"to_json(named_struct({fields}))" if info else "cast(NULL as string)"
    return (
        f"named_struct('check', '{check}', 'kind', cast({kind} as string), 'router', cast({r} as bigint), "
        f"'epoch', cast({e} as bigint), 'seq', cast({q} as bigint), 'ts', cast({t} as double), "
        f"'subscriber', cast({s} as bigint), 'other', cast({other} as bigint), 'info', {info_sql})"
    )


def _first_per(arr: str, key: str, value: str, var: str = "z") -> str:
    """SQL: the elements of array ``arr`` grouped by ``key`` (an expression of
    ``var``): one ``named_struct(key, n, first)`` per key, ``first`` the smallest
    ``value`` (a struct expression of ``var`` whose first field orders)."""
    k2 = key.replace(f"{var}.", f"{var}2.")
    return (
        f"transform(array_distinct(transform({arr}, {var} -> {key})), kk -> named_struct("
        f"'key', kk, 'n', size(filter({arr}, {var}2 -> {k2} = kk)), "
        f"'first', array_min(transform(filter({arr}, {var}2 -> {k2} = kk), {var} -> {value}))))"
    )


def layers(columns: list[str]) -> list[list[str]]:
    """``columns`` ("<SQL> AS <name>", each over a frame's columns and the earlier
    ones) grouped by depth of dependence: the first group uses none of the others,
    each later one at least one column of the group before. A name is taken as used
    wherever it occurs as a word in the SQL: a false match only moves a column one
    group later."""
    depth: dict[str, int] = {}
    for text in columns:
        sql, name = text.rsplit(" AS ", 1)
        depth[name] = 1 + max((d for earlier, d in depth.items() if re.search(rf"\b{earlier}\b", sql)), default=0)
    return [[t for t in columns if depth[t.rsplit(" AS ", 1)[1]] == level] for level in sorted(set(depth.values()))]


def _in_layers(frame: DataFrame, columns: list[str]) -> DataFrame:
    """``frame`` with ``columns`` added in one projection per layer (layers()) rather
    than one per group of columns as written: every projection above the per-delivery
    aggregation runs outside whole-stage code generation and writes its whole row
    again (docs/benchmarks.md, "Where the CPU goes"), and Spark does not merge
    projections whose expressions it would have to repeat."""
    for layer in layers(columns):
        frame = frame.selectExpr("*", *layer)
    return frame


def delivery_facts(grouped: DataFrame, c: Constants, ledgers: bool = False) -> DataFrame:
    """One row per delivery: who published it, where it started and what the
    publisher was told, the sets the cross-delivery checks and the summary need,
    and ``v``: the violations of every per-delivery invariant (usually empty).
    Written as Spark SQL (one call per column: building it is cheap)."""
    K = _kinds
    topic = "id.topic"
    # --- the delivery's events by kind
    columns = [
        f"filter(ev, e -> e.k {K('received')}) AS recv_all",
        f"filter(ev, e -> e.k {K('received')} AND NOT coalesce(e.b, false)) AS records",
        # (not a refusal beyond the resume horizon: that is not the subscribers' outcome)
        f"filter(ev, e -> e.k {K('pub-outcome')} AND coalesce(e.y, 0) != 2) AS pubs",
        f"array_distinct(transform(filter(ev, e -> e.k {K('sub-outcome')} AND e.o = {ACC}), e -> e.s)) AS acc_subs",
        f"transform(filter(ev, e -> e.k {K('owed-state-discarded')}), e -> e.s) AS discarded",
        # the subscribers a router's selector filtered it out for (never owed it there)
        f"array_distinct(flatten(transform(filter(ev, e -> e.k {K('received')}), e -> coalesce(e.fl, {_EMPTY})))) "
        "AS filtered_out",
        f"filter(ev, e -> e.k {K('owed-moved')}) AS moves",
        f"flatten(transform(filter(ev, e -> e.k {K('owed-moved')}), e -> coalesce(e.l, {_EMPTY}))) AS moved_subs",
        f"array_distinct(flatten(transform(filter(ev, e -> e.k {K('received')} AND NOT coalesce(e.b, false)), "
        f"e -> coalesce(e.l, {_EMPTY})))) AS owed_subs",
        # every send to a subscriber: in `received.forwarded` (pre-settled copies too: an
        # at-most-once topic's, docs/guarantees.md), or a `forwarded`
        f"concat(flatten(transform(filter(ev, e -> e.k {K('received')}), "
        f"e -> transform(coalesce(e.f, {_EMPTY}), s -> named_struct('r', e.r, 'e', e.e, 'q', e.q, 's', s, 't', e.t)))), "
        f"transform(filter(ev, e -> e.k {K('forwarded')}), e -> named_struct('r', e.r, 'e', e.e, 'q', e.q, 's', e.s, 't', e.t))"
        f") AS sends",
        # a subscriber's answers that count as new ones (not reported on a resume)
        f"filter(ev, e -> e.k {K('sub-outcome')} AND NOT coalesce(e.rep, false)) AS answers",
        # the subscribers that reported holding it where the router had no record yet
        f"filter(ev, e -> e.k {K('placeholder-created')}) AS placeholders",
    ]
    # each record with its router's first answer in that epoch (pub-outcome or outcome-to-router)
    columns += [
        "transform(records, rec -> named_struct('r', rec.r, 'e', rec.e, 'q', rec.q, 't', rec.t, 'p', rec.p, "
        f"'owed', coalesce(rec.l, {_EMPTY}), 'routers', coalesce(rec.x, {_EMPTY}), "
        f"'ans', array_min(transform(filter(ev, e -> e.k {K('pub-outcome', 'outcome-to-router')} AND e.r = rec.r "
        "AND e.e = rec.e), e -> named_struct('q', e.q, 'o', e.o))))) AS recs",
    ]
    columns += [
        "try_element_at(filter(recs, x -> x.p IS NULL), 1) AS origin",
        "array_min(transform(pubs, e -> named_struct('q', e.q, 't', e.t, 'o', e.o, 'r', e.r, 'e', e.e))) AS pub",
        f"exists(pubs, e -> e.o = {ACC}) AS told_accepted",
        # Done with it: accepted it, its obligation discarded, or filtered out by a
        # router's selector. A moved obligation needs the last: a router that took a
        # delivery over knows no remote subscriber's selector, so it owes the delivery
        # to every durable subscriber of the dead origin, and when the publisher
        # already had its outcome it settles at once, before any of them re-attaches
        # to be judged by its selector (tests/failover/test_kill.py, selective).
        "array_union(acc_subs, array_union(discarded, filtered_out)) AS done",
        "array_distinct(transform(recv_all, e -> e.r)) AS reached",
        "transform(moves, m -> m.p) AS moved_from",
    ]
    columns += ["try_element_at(filter(pubs, e -> e.r = origin.r AND e.e = origin.e), 1) AS origin_answer"]

    def said(rec: str, s: str) -> str:
        return f"filter(ev, e -> e.k {K('sub-outcome', 'expired')} AND e.r = {rec}.r AND e.e = {rec}.e AND e.s = {s})"

    def said_codes(rec: str, s: str) -> str:
        return f"transform({said(rec, s)}, e -> CASE WHEN e.k {K('expired')} THEN {EXPIRED} ELSE e.o END)"

    # --- lost: an owed subscriber never accepted it, on any router. Excused: its
    # subscription ended after the delivery arrived and before its router answered;
    # it was not durable and its router died before answering; its obligation moved.
    ended = f"exists({c.at(c.ends, 'rec.r', 'rec.e', 's')}, x -> x.seq > rec.q AND (rec.ans IS NULL OR x.seq < rec.ans.q))"
    durable = (
        f"coalesce(try_element_at(filter({c.at(c.durable, 'rec.r', 'rec.e', 's')}, x -> x.from < rec.q "
        f"AND rec.q < x.to), 1).durable, 1)"
    )
    died_nondurable = (
        f"(rec.ans IS NULL AND array_contains({c.died}, cast(rec.r as string) || '|' || cast(rec.e as string)) AND {durable} = 0)"
    )
    lost_subs = (
        "flatten(transform(recs, rec -> transform(filter(rec.owed, s -> NOT array_contains(done, s) "
        f"AND NOT array_contains(moved_subs, s) AND NOT {ended} AND NOT {died_nondurable}), s -> "
        + _violation(
            "lost",
            r="rec.r",
            e="rec.e",
            q="rec.q",
            t="rec.t",
            s="s",
            info={
                "said": f"array_distinct({said_codes('rec', 's')})",
                "sent": "array_min(transform(filter(sends, x -> x.r = rec.r AND x.e = rec.e AND x.s = s), x -> x.q))",
                "answer": "rec.ans.o",
                "answer_seq": "rec.ans.q",
            },
        )
        + ")))"
    )
    lost_moved = (
        "transform(filter(array_distinct(moved_subs), s -> NOT array_contains(done, s)), s -> "
        "transform(array(try_element_at(filter(moves, m -> array_contains(coalesce(m.l, "
        f"{_EMPTY}), s)), 1)), m -> "
        + _violation("lost", kind="'moved'", r="m.r", e="m.e", q="m.q", t="m.t", s="s", other="m.p")
        + ")[0])"
    )

    def told_by(x: str) -> str:  # the outcomes the origin logged from router x
        return (
            f"array_distinct(transform(filter(ev, e -> e.k {K('outcome-from-router')} AND e.r = origin.r "
            f"AND e.e = origin.e AND e.p = {x}), e -> e.o))"
        )

    unreachable = (
        f"exists({c.at(c.routes, 'origin.r', 'origin.e')}, rt -> rt.ts >= origin.t AND (pub.q IS NULL "
        "OR rt.seq < pub.q) AND NOT array_contains(rt.reachable, x))"
    )
    lost_interest = (
        f"exists(coalesce(try_element_at({c.gone}, cast(x as string)), array()), g -> (g.topic IS NULL "
        f"OR g.topic = {topic} OR (g.re IS NOT NULL AND {topic} rlike g.re)) "
        f"AND g.ts >= origin.t - {CLOCK_SLACK} AND g.ts <= pub.t + {CLOCK_SLACK})"
    )
    lost_routers = (
        f"transform(filter(coalesce(origin.routers, {_EMPTY}), x -> NOT array_contains(reached, x) "
        f"AND NOT array_contains(moved_from, x) AND NOT array_contains({c.missing}, x) "
        f"AND (size({told_by('x')}) = 0 OR exists({told_by('x')}, y -> y != {OUTCOME['none']})) "
        f"AND NOT (size({told_by('x')}) = 0 AND ({unreachable} OR {lost_interest}))), x -> "
        + _violation("lost", kind="'router'", r="x", e="origin.e", t="origin.t", other="origin.r", info={"told": told_by("x")})
        + ")"
    )
    columns += [
        f"CASE WHEN told_accepted THEN concat({lost_subs}, {lost_moved}, "
        f"CASE WHEN origin IS NOT NULL THEN {lost_routers} ELSE array() END) END AS v_lost",
    ]

    # --- duplicated: one subscriber accepted this delivery id twice (reports aside). On an
    # at-least-once topic that is allowed: counted (alo_dups), not failed. Nor is the
    # answer to the re-send a router owes a subscriber that reported holding the
    # delivery before the router had it (a placeholder, docs/resumption.md): the
    # subscriber recognises the tag and answers with the state it reported.
    accepts = (
        f"filter(answers, e -> e.o = {ACC} AND NOT exists(placeholders, p -> p.r = e.r AND p.e = e.e "
        "AND p.s = e.s AND p.q < e.q))"
    )
    twice = (
        f"filter(transform(array_distinct(transform({accepts}, e -> e.s)), s -> named_struct("
        f"'s', s, 'a', filter({accepts}, e -> e.s = s))), x -> size(x.a) > 1)"
    )
    columns += ["exists(recv_all, e -> coalesce(e.y, 0) = 4) AS alo", f"{twice} AS twice"]
    v_dup = (
        "CASE WHEN alo THEN array() ELSE transform(twice, x -> "
        + _violation(
            "duplicated",
            kind="'id'",
            r="x.a[0].r",
            e="x.a[0].e",
            q="x.a[0].q",
            t="x.a[0].t",
            s="x.s",
            info={"where": "transform(x.a, e -> named_struct('r', e.r, 'e', e.e, 'q', e.q))"},
        )
        + ") END"
    )
    # --- invented: events about a delivery no router received
    referencing = ", ".join(str(KIND[n]) for n in REFERENCING)
    v_invented = (
        f"CASE WHEN size(recv_all) = 0 THEN transform(filter(ev, e -> e.k IN ({referencing}) "
        f"AND NOT (e.k {K('pub-outcome')} AND coalesce(e.y, 0) = 2)), e -> "
        + _violation("invented", r="e.r", e="e.e", q="e.q", t="e.t", s="e.s", info={"kind": "e.k", "outcome": "e.o"})
        + ") END"
    )
    # --- record-missing: an event that needs the router's record, before any
    # `received` of the delivery on that router in that epoch
    needs = ", ".join(str(KIND[n]) for n in NEEDS_RECORD)
    orphans = (
        f"CASE WHEN size(recv_all) > 0 THEN filter(ev, e -> e.k IN ({needs}) AND CASE "
        f"WHEN e.k {K('pub-outcome')} AND coalesce(e.y, 0) = 1 "
        "THEN NOT exists(ev, x -> x.r = e.r AND x.e = e.e AND x.q < e.q) "
        f"WHEN e.k {K('pub-outcome')} AND coalesce(e.y, 0) = 2 THEN false "
        "ELSE NOT exists(recv_all, x -> x.r = e.r AND x.e = e.e AND x.q <= e.q) END) ELSE array() END"
    )
    columns += [f"{v_dup} AS v_dup", f"{v_invented} AS v_invented", f"{orphans} AS orphans"]
    by_router = _first_per(
        "orphans", "named_struct('r', z.r, 'e', z.e)", "named_struct('q', z.q, 'k', z.k, 'o', z.o, 's', z.s, 't', z.t)"
    )
    v_record = (
        f"transform({by_router}, g -> "
        + _violation(
            "record-missing",
            r="g.key.r",
            e="g.key.e",
            q="g.first.q",
            t="g.first.t",
            s="g.first.s",
            info={
                "kind": "g.first.k",
                "outcome": "g.first.o",
                "more": "g.n - 1",
                "received_in": "transform(filter(recv_all, x -> x.r = g.key.r), x -> x.e)",
            },
        )
        + ")"
    )
    # --- arrival-unforwarded: a copy from another router that no router logged forwarding
    v_arrival = (
        f"transform(filter(recv_all, x -> x.p IS NOT NULL AND NOT array_contains({c.missing}, x.p) AND NOT exists("
        f"ev, f -> f.k {K('forwarded-to-router')} AND (array_contains(coalesce(f.l, {_EMPTY}), x.r) OR f.p = x.r))), "
        "x -> " + _violation("arrival-unforwarded", r="x.r", e="x.e", q="x.q", t="x.t", other="x.p") + ")"
    )
    ever_owed = (
        f"array_distinct(concat(owed_subs, transform(sends, x -> x.s), moved_subs, transform(filter(ev, "
        f"e -> e.k {K('placeholder-fulfilled')}), e -> e.s)))"
    )
    columns += [f"{v_record} AS v_record", f"{v_arrival} AS v_arrival", f"{ever_owed} AS ever_owed"]
    # --- accept-unowed / accept-unsent (of a delivery some router received: the
    # others are invented, and that is all they are)
    first_answer = "named_struct('q', z.q, 'r', z.r, 'e', z.e, 't', z.t, 'o', z.o)"
    columns += [
        f"filter(ev, e -> e.k {K('sub-outcome')} AND size(recv_all) > 0 AND NOT array_contains(ever_owed, e.s)) AS unowed",
        "filter(answers, e -> size(recv_all) > 0 AND array_contains(ever_owed, e.s) AND NOT exists(sends, x -> "
        "x.r = e.r AND x.e = e.e AND x.s = e.s AND x.q < e.q)) AS unsent",
    ]
    v_unowed = (
        f"transform({_first_per('unowed', 'z.s', first_answer)}, g -> "
        + _violation(
            "accept-unowed",
            r="g.first.r",
            e="g.first.e",
            q="g.first.q",
            t="g.first.t",
            s="g.key",
            info={"outcome": "g.first.o", "attached": f"array_contains({c.attached}, g.key)"},
        )
        + ")"
    )
    per_router = _first_per("unsent", "named_struct('s', z.s, 'r', z.r)", first_answer)
    v_unsent = (
        f"transform({per_router}, g -> "
        + _violation(
            "accept-unsent", r="g.key.r", e="g.first.e", q="g.first.q", t="g.first.t", s="g.key.s", info={"outcome": "g.first.o"}
        )
        + ")"
    )

    # --- answer-missing: the origin answered its publisher without logging the
    # answer of a router it owed the delivery to, which received it and owed it to
    # a subscriber there. Excused: the origin logged that router unreachable (after the delivery arrived) before
    # answering; that router died before it answered; or it answered `none` (its
    # subscribers left: the origin may stop waiting for a router that lost interest
    # before that answer reaches it, and then does not log it).
    its_record = "try_element_at(filter(recs, y -> y.r = x AND size(y.owed) > 0), 1)"
    router_answer = (
        f"array_min(transform(filter(ev, e -> e.k {K('outcome-to-router')} AND e.r = x), "
        "e -> named_struct('q', e.q, 'o', e.o, 'e', e.e)))"
    )
    heard = f"exists(ev, e -> e.k {K('outcome-from-router')} AND e.r = origin.r AND e.e = origin.e AND e.p = x)"
    excused = (
        f"(exists({c.at(c.routes, 'origin.r', 'origin.e')}, rt -> rt.seq > origin.q AND rt.seq < origin_answer.q AND NOT "
        f"array_contains(rt.reachable, x)) OR ({router_answer} IS NULL AND array_contains({c.died}, "
        f"cast(x as string) || '|' || cast({its_record}.e as string))) OR "
        f"coalesce({router_answer}.o = {OUTCOME['none']}, false))"
    )
    v_answer = (
        f"CASE WHEN origin IS NOT NULL AND origin_answer IS NOT NULL AND NOT array_contains({c.missing}, origin.r) "
        f"THEN transform(filter(coalesce(origin.routers, {_EMPTY}), x -> {its_record} IS NOT NULL AND NOT {heard} "
        f"AND NOT array_contains(moved_from, x) AND NOT array_contains({c.missing}, x) AND NOT {excused}), x -> "
        + _violation(
            "answer-missing",
            r="origin.r",
            e="origin.e",
            q="origin_answer.q",
            t="origin_answer.t",
            other="x",
            info={
                "outcome": "origin_answer.o",
                "received": f"named_struct('e', {its_record}.e, 'q', {its_record}.q)",
                "owed": f"{its_record}.owed",
                "answer": router_answer,
            },
        )
        + ") ELSE array() END"
    )
    # --- outcome-disagrees: the publisher's outcome against what its owed
    # subscribers did (docs/delivery-rule.md). Excused, for "every owed subscriber
    # accepted": a router that received it never logged its answer and died, or
    # the origin had it unreachable when it answered: the origin could not know.
    # A subscriber's answer at the answer's own seq came before it: a "completed"
    # line folds the sub-outcome and the pub-outcome it caused, in that order
    # (comparing with < missed a refusal folded into its own answer's line:
    # found by the generated histories, --fault outcome-refused with p_fold 1).
    pairs = (
        "flatten(transform(recs, rec -> transform(rec.owed, s -> named_struct('r', rec.r, 'e', rec.e, 's', s, "
        f"'ans', rec.ans, 'first', array_min(transform(filter({said('rec', 's')}, e -> rec.ans IS NULL OR "
        f"e.q <= rec.ans.q), e -> named_struct('q', e.q, 'o', CASE WHEN e.k {K('expired')} THEN {EXPIRED} "
        "ELSE e.o END)))))))"
    )
    # A delivery a router whose log is missing took part in (it received it, or sent
    # it on): what that router's subscribers did is not in the input, the missing
    # log is reported once, as router-log-missing
    partial = (
        f"coalesce(exists(coalesce(origin.routers, {_EMPTY}), x -> array_contains({c.missing}, x)) OR "
        f"exists(recv_all, x -> (x.p IS NOT NULL AND array_contains({c.missing}, x.p)) OR "
        f"exists(coalesce(x.x, {_EMPTY}), m -> array_contains({c.missing}, m))), false)"
    )
    columns += [
        f"{v_unowed} AS v_unowed",
        f"{v_unsent} AS v_unsent",
        f"{v_answer} AS v_answer",
        f"{pairs} AS pairs",
        f"{partial} AS partial",
    ]
    all_accepted = "(size(pairs) > 0 AND forall(pairs, y -> array_contains(acc_subs, y.s)))"
    bad_codes = ", ".join(str(x) for x in (*TERMINAL_NOT_ACCEPTED, EXPIRED))
    refused = f"filter(pairs, y -> y.first IS NOT NULL AND y.first.o IN ({bad_codes}) AND NOT array_contains(acc_subs, y.s))"
    unknowable = (
        f"exists(pairs, y -> y.r != p.r AND y.ans IS NULL AND (array_contains({c.died}, "
        f"cast(y.r as string) || '|' || cast(y.e as string)) OR exists({c.at(c.routes, 'p.r', 'p.e')}, "
        # (unreachable after the delivery arrived there: a router the origin sent it to was reachable then)
        "rt -> rt.seq < p.q AND (origin IS NULL OR origin.r != p.r OR origin.e != p.e OR rt.seq > origin.q) "
        "AND NOT array_contains(rt.reachable, y.r))))"
    )
    v_disagree = (
        f"transform(filter(transform(pubs, p -> named_struct('p', p, 'kind', CASE WHEN p.o != {ACC} AND "
        f"{all_accepted} AND NOT {unknowable} THEN 'all-accepted' WHEN p.o = {ACC} AND size({refused}) > 0 "
        f"THEN 'refused' END)), w -> w.kind IS NOT NULL AND NOT partial), "
        "w -> "
        + _violation(
            "outcome-disagrees",
            kind="w.kind",
            r="w.p.r",
            e="w.p.e",
            q="w.p.q",
            t="w.p.t",
            info={
                "outcome": "w.p.o",
                "pairs": f"transform(CASE WHEN w.kind = 'refused' THEN {refused} ELSE pairs END, "
                "y -> named_struct('s', y.s, 'r', y.r, 'first', y.first))",
            },
        )
        + ")"
    )
    # --- left-unsettled: records never deleted in their epoch; on a router that
    # stopped in order a violation, on one that died a note (its records went with it)
    closed = (
        f"exists(ev, e -> e.r = rec.r AND e.e = rec.e AND ((e.k {K('settled')} AND coalesce(e.b, false)) "
        f"OR e.k {K('record-deleted')}))"
    )
    left = (
        f"transform(filter(recs, rec -> NOT {closed}), rec -> named_struct('rec', rec, 'died', array_contains("
        f"{c.died}, cast(rec.r as string) || '|' || cast(rec.e as string)), 'by', try_element_at(transform("
        f"filter(ev, e -> e.r = rec.r AND e.e = rec.e AND e.k {K('settled')}), e -> e.y), 1), 'waiting', "
        f"array_except(rec.owed, transform(filter(ev, e -> e.r = rec.r AND e.e = rec.e AND "
        f"e.k {K('sub-outcome', 'expired')}), e -> e.s))))"
    )
    columns += [f"{v_disagree} AS v_disagree", f"{left} AS left"]
    v_left = (
        "transform(filter(left, x -> NOT x.died), x -> "
        + _violation(
            "left-unsettled",
            r="x.rec.r",
            e="x.rec.e",
            q="x.rec.q",
            t="x.rec.t",
            other="x.rec.p",
            info={"by": "x.by", "answer": "x.rec.ans", "waiting": "x.waiting"},
        )
        + ")"
    )
    # --- the applications' view (with ledgers): each subscriber's application was
    # handed the delivery once (twice is a duplicate at the application), nothing
    # no router sent it, and whatever it accepted (router view): `app_missing` lists
    # those the application never got (a violation for subscribers that keep a ledger)
    if ledgers:
        apps = f"filter(ev, e -> e.k = {APP_DELIVERED})"
        app = (
            f"transform(array_distinct(transform({apps}, e -> e.s)), s -> named_struct('s', s, 'n', "
            f"size(filter({apps}, e -> e.s = s)), 'first', array_min(transform(filter({apps}, e -> e.s = s), "
            "e -> named_struct('fid', e.p, 'split', e.e, 'row', e.q, 't', e.t)))))"
        )
        columns += [f"{app} AS app"]
        v_app = (
            "concat(transform(filter(app, a -> a.n > 1 AND NOT alo), a -> "
            + _violation("ledger", kind="'twice'", s="a.s", t="a.first.t", info={"n": "a.n"})
            + "), "
            # (not for a delivery a router whose log is missing took part in: what it sent, it
            # logged there; the missing log is reported once, as router-log-missing)
            # A delivery no router received is unsent too (unless a log is missing: it may be there).
            f"transform(filter(app, a -> (size(recv_all) > 0 OR size({c.missing}) = 0) AND NOT exists(sends, "
            "x -> x.s = a.s) AND NOT partial), a -> " + _violation("ledger", kind="'unsent'", s="a.s", t="a.first.t") + "))"
        )
        app_missing = "filter(acc_subs, s -> size(recv_all) > 0 AND NOT exists(app, a -> a.s = s))"
    else:
        no_app = "array<struct<s:bigint,n:int,first:struct<fid:bigint,split:bigint,row:bigint,t:double>>>"
        columns += [f"cast(NULL as {no_app}) AS app"]
        v_app = "array()"
        app_missing = "cast(array() as array<bigint>)"
    # --- what the cross-delivery checks and the summary read
    # Not a send of what the subscriber reported holding when it resumed at that router (a
    # placeholder there, or an outcome it reported there): a resend, which it recognises
    # and never hands its application again. The router sends it to have a live delivery
    # to settle, not as a first copy; the publisher resumed there numbers it above what
    # it held back behind it (found under CPU load, test_resume_under_load [A]).
    held = (
        "exists(placeholders, p -> p.r = x.r AND p.e = x.e AND p.s = x.s) OR "
        f"exists(ev, e -> e.k {K('sub-outcome')} AND coalesce(e.rep, false) AND e.r = x.r AND e.e = x.e AND e.s = x.s)"
    )
    first_sends = (
        f"transform(array_distinct(transform(filter(sends, x -> NOT ({held})), x -> named_struct('r', x.r, 's', x.s))), rs -> "
        "array_min(transform(filter(sends, x -> x.r = rs.r AND x.s = rs.s), x -> named_struct("
        "'e', x.e, 'q', x.q, 'r', x.r, 's', x.s, 't', x.t))))"
    )
    # On an at-least-once topic a subscriber that failed over may be sent a delivery again
    # at its new router after later ones (a resend its new router had forgotten): a repeat,
    # counted as such, not the first copy whose place in publisher order is judged there.
    columns += [f"{first_sends} AS fs0"]
    first_sends = "CASE WHEN alo THEN filter(fs0, x -> NOT exists(fs0, y -> y.s = x.s AND y.r != x.r AND y.t < x.t)) ELSE fs0 END"
    # Each subscriber owed it or answering it: accepted if it ever accepted, else its
    # first answer, else 0 (never answered).
    statuses = (
        "transform(array_distinct(concat(owed_subs, transform(answers, e -> e.s))), s -> named_struct("
        f"'s', s, 'owed', array_contains(owed_subs, s), 'o', CASE WHEN array_contains(acc_subs, s) THEN {ACC} "
        "ELSE coalesce(try_element_at(transform(filter(answers, e -> e.s = s), e -> e.o), 1), 0) END))"
    )
    return _in_layers(grouped, columns).selectExpr(
        "delivery",
        f"{topic} AS topic",
        "id.publisher AS publisher",
        "id.link_name AS link_name",
        "id.incarnation AS incarnation",
        "id.pub_tag AS pub_tag",
        "id.stream_seq AS stream_seq",
        "concat_ws('|', id.publisher, id.link_name, id.incarnation, id.pub_tag, "
        "regexp_extract(delivery, '\\\\.(\\\\d+)$', 1)) AS pub_id",
        "concat_ws('|', id.publisher, id.link_name, id.incarnation) AS stream",
        "size(recv_all) > 0 AS received",
        "size(recv_all) > 0 AND size(records) = 0 AS presettled",
        "origin.r AS origin",
        "origin.e AS origin_epoch",
        "origin.t AS recv_ts",
        "pub",
        "told_accepted",
        "transform(recs, x -> named_struct('r', x.r, 'e', x.e, 't', x.t)) AS recvs",
        f"{statuses} AS subs",
        f"{first_sends} AS first_sends",
        "transform(filter(left, x -> x.died), x -> named_struct('r', x.rec.r, 'e', x.rec.e)) AS died_with",
        "app",
        f"{app_missing} AS app_missing",
        "partial",
        # a resend of it was refused beyond the resume horizon: its publisher was told
        # rejected ("may have been delivered") whatever its first life's outcome was
        f"exists(ev, e -> e.k {K('pub-outcome')} AND coalesce(e.y, 0) = 2) AS horizon",
        # the subscribers whose selector did not select it, here or where they re-attached
        f"array_distinct(concat(filtered_out, "
        f"transform(filter(ev, e -> e.k {K('owed-state-discarded')} AND coalesce(e.y, 0) = 3), e -> e.s))) AS filtered",
        "alo",
        # an at-least-once delivery's extra copies, per subscriber: accepted again (the
        # routers' view) and handed again (its application's ledger), counted, not failed
        "CASE WHEN alo THEN transform(twice, x -> named_struct('s', x.s, 'n', size(x.a) - 1)) END AS alo_dups",
        "CASE WHEN alo THEN transform(filter(app, a -> a.n > 1), a -> named_struct('s', a.s, 'n', a.n - 1)) END AS alo_app_dups",
        f"concat(coalesce(v_lost, array()), v_dup, coalesce(v_invented, array()), v_record, v_arrival, v_unowed, "
        f"v_unsent, v_answer, v_disagree, {v_left}, {v_app}) AS v",
    )


# ---------------------------------------------------------------------------
# Preparing everything
# ---------------------------------------------------------------------------


def prepare(
    spark,
    sources: list,
    partitions: int | None = None,
    storage: StorageLevel = StorageLevel.MEMORY_AND_DISK,
    ledgers: DataFrame | None = None,
) -> Tables:
    """Read the input for everything about the input itself (input_facts) and for the
    per-delivery facts (not yet computed: compute_facts()), with the applications'
    ``ledgers`` if given: one parse for both when the Java scans read it, two reads
    in Spark SQL otherwise."""
    from spark import deliveryrules, linescan

    if partitions is None:
        partitions = int(spark.conf.get("spark.sql.shuffle.partitions"))
    # JSON lines in the writer's shape are parsed once for both reads: the first read's
    # facts and the per-delivery rows, through the one shuffle's map side (ReadOnce.java).
    # (whether an answer was reported again is marked after the shuffle, when the resume
    # windows are known: never for an application's line, ``rep`` false)
    ledger_events = app_events(ledgers).drop("rep") if ledgers is not None else None

    def shuffle(rows: DataFrame) -> DataFrame:
        return (rows.unionByName(ledger_events) if ledger_events is not None else rows).repartition(partitions, "h")

    once, how, shuffled = (
        linescan.read_once(spark, sources, line_vocabulary(), delivery_vocabulary(spark), shuffle)
        if deliveryrules.available(spark)
        else (None, "", None)
    )
    facts_in = input_facts(spark, sources, (once, how) if once is not None or how else None)
    present = {e["router"] for e in facts_in["epochs"]}
    facts_in["missing_routers"] = sorted(set(facts_in["named_routers"]) - present)
    life = facts_in["life"]
    subscribers = {f"{r['container']}/{r['name']}" for r in life if r.get("container") is not None}
    known = hashes_of(
        sorted(present | set(facts_in["named_routers"]) | subscribers | {x for r in life for x in (r.get("reachable") or [])})
    )
    if len(set(known.values())) != len(known):  # two names, one 64-bit hash: the proof could mix them up
        by_hash: dict = defaultdict(list)
        for name, value in known.items():
            by_hash[value].append(name)
        raise HashCollision(", ".join(" and ".join(n) for n in by_hash.values() if len(n) > 1))
    names = Names(
        {known[n]: n for n in present | set(facts_in["named_routers"]) if n in known},
        {known[n]: n for n in subscribers if n in known},
    )
    small = small_tables(life, facts_in["epochs"], lambda n: known.get(n) if n is not None else None)
    missing = [known[n] for n in facts_in["missing_routers"]]
    # Input the first read found clean is read again strictly (no corrupt-record column to
    # fill per line); should a field only the second read converts be of the wrong type,
    # compute_facts() reads it again permissively. (Not read again when parsed once.)
    strict = facts_in["bad_count"] == 0
    facts, observation = facts_frame(spark, sources, small, missing, partitions, ledgers, strict=strict, shuffled=shuffled)
    t = Tables(facts, facts_in, small, names, sources, partitions, observation, storage=storage, missing=missing)
    if observation is None and deliveryrules.available(spark):
        t.rules = deliveryrules.JAVA
        t.sql_rules = lambda: facts_frame(
            spark, sources, small, missing, partitions, ledgers, strict=strict, java_rules=False, shuffled=shuffled
        )
    elif observation is not None:
        t.rules = "spark-sql (a malformed line: the SQL read counts them in an Observation the Java pass would not report)"
    else:
        t.rules = "spark-sql (no Java rules: the jar is not on the class path, or off)"
    if strict:  # (the SQL read: the SQL rules)
        t.permissive = lambda: facts_frame(spark, sources, small, missing, partitions, ledgers)
    return t


def kept_ledgers(spark, directory: str, storage: StorageLevel) -> tuple[DataFrame, str]:
    """The applications' ledgers (spark/load.py ``load_ledgers``' rows) read now and kept
    (materialize()), and which read made them: "java" (LedgerScan.java: the same rows, a
    third of the CPU), or Spark SQL and why. Java reads only ledgers in the writer's shape:
    a line that is not fails its job, and Spark SQL reads them all."""
    from spark import linescan
    from spark.load import ledger_read, load_ledgers

    paths, recursive = ledger_read(directory)
    java, how = linescan.ledger_rows(spark, paths, recursive, _derived(spark, "ledger_rows"))
    if java is not None:
        try:
            return materialize(java, storage), how
        except Exception as error:  # noqa: BLE001 (Py4J's and PySpark's errors both carry Spark's)
            if not linescan.is_unusual_ledger(error):
                raise
            how = f"spark-sql ({linescan.unusual_ledger_why(error)})"
    return materialize(load_ledgers(spark, directory), storage), how


def materialize(frame: DataFrame, storage: StorageLevel) -> DataFrame:
    """``frame`` computed now and kept (at ``storage``) as a plain table, its plan
    cut: every later query over it is planned over a scan of the kept rows, not over
    the per-delivery expressions again (analysing and optimizing those took most of
    a small input's time, query after query). release() frees it."""
    return frame.localCheckpoint(eager=True, storageLevel=storage)


def release(frame: DataFrame) -> None:
    """Free what ``frame`` keeps: a materialize()d frame's rows, or a persist()ed one's cache."""
    plan = frame._jdf.queryExecution().analyzed()
    if plan.getClass().getSimpleName() == "LogicalRDD":
        plan.rdd().unpersist(False)
    else:
        frame.unpersist()


def app_events(ledgers: DataFrame) -> DataFrame:
    """The applications' `delivered` lines (docs/ledger.md) as events of their
    delivery, in narrow()'s shape: s the subscriber (hashed), o what the
    application answered, t when; p the ledger file, e and q its place in that file
    (the split's offset, the row): the application's own order."""
    delivered = ledgers.where((F.col("role") == "subscriber") & (F.col("event") == "delivered") & F.col("delivery").isNotNull())
    none = F.lit(None)
    return delivered.select(
        F.xxhash64("delivery").alias("h"),
        "delivery",
        none.cast("long").alias("r"),
        F.col("split").alias("e"),
        F.col("row").alias("q"),
        F.col("ts").alias("t"),
        F.lit(APP_DELIVERED).alias("k"),
        _hash(_key(F.col("client"), F.col("link"))).alias("s"),
        _code("outcome", tuple(OUTCOME), OUTCOME, 6).alias("o"),
        F.col("fid").alias("p"),
        none.cast("array<bigint>").alias("l"),
        none.cast("array<bigint>").alias("f"),
        none.cast("array<bigint>").alias("x"),
        none.cast("boolean").alias("b"),
        none.cast("int").alias("y"),
        none.cast("array<bigint>").alias("fl"),
        none.cast(
            "struct<topic:string,publisher:string,link_name:string,incarnation:string,pub_tag:string,stream_seq:bigint>"
        ).alias("id"),
        F.lit(0).alias("_pos"),
        F.lit(False).alias("rep"),
    )


def facts_frame(
    spark,
    sources: list,
    small: dict,
    missing: list,
    partitions: int,
    ledgers: DataFrame | None = None,
    strict: bool = False,
    java_rules: bool = True,
    shuffled: DataFrame | None = None,
) -> tuple[DataFrame, Observation | None]:
    """The per-delivery facts from the events about deliveries: unfold, narrow, one
    shuffle by delivery id, one row per delivery, every per-delivery invariant. With
    ``ledgers``, the applications' `delivered` lines join the same shuffle (app_events).
    ``shuffled``: the rows of the one parse (``linescan.read_once``: the Java scan vouched
    for every line), the ledgers' with them, already in the one shuffle's partitions;
    without it, a second read of the input in Spark SQL, which also counts (``observe``)
    the malformed lines among those it converts differently (a field of the wrong type
    among its fields). ``strict``: read as load_lines() says (a line Spark cannot read
    whole fails the job). ``java_rules``: the per-delivery rules in Java
    (spark/deliveryrules.py) when its class is there and the rows are the Java scan's
    or read strictly, else in SQL."""
    from spark import deliveryrules
    from spark.load import load_lines

    if shuffled is not None:
        events = mark_reported(shuffled, small["windows"])
        if java_rules:
            hashed = events.sortWithinPartitions("h")  # (hashed_deliveries(), already partitioned)
            vocabulary = rules_vocabulary(spark, ledgers is not None)
            return deliveryrules.facts(spark, hashed, vocabulary, rules_constants(small, missing)), None
        # (the SQL rules group again: a second shuffle, of rows, not of the files' text)
        return delivery_facts(group_deliveries(events, partitions), Constants(small, missing), ledgers is not None), None
    observation: Observation | None = None
    lines = load_lines(spark, sources, DELIVERY_READ, strict=strict)
    lines = lines.where(F.col("delivery").isNotNull() | F.col("deliveries").isNotNull() | F.col(CORRUPT).isNotNull())
    lines = lines.withColumn("_bad", bad(lines))
    if not strict:
        # (Read strictly, the count is 0 or the job fails: bad() reads only fields the first
        # read converted too, and it found none bad; a line of the wrong type here fails
        # the read, and compute_facts() reads again permissively, counting.)
        observation = Observation("deliveries")
        lines = lines.observe(observation, F.sum(F.col("_bad").cast("long")).alias("bad"))
    events = narrow(unfold(lines.where(F.col("delivery").isNotNull() | F.col("deliveries").isNotNull())), small["windows"])
    if ledgers is not None:
        events = events.unionByName(app_events(ledgers))
    # (not over a permissive read: it counts its malformed lines in an Observation, which
    # only a Dataset's own action reports, not the Java pass's job)
    if java_rules and observation is None and deliveryrules.available(spark):
        hashed = hashed_deliveries(events, partitions)
        vocabulary = rules_vocabulary(spark, ledgers is not None)
        return deliveryrules.facts(spark, hashed, vocabulary, rules_constants(small, missing)), observation
    grouped = group_deliveries(events, partitions)
    return delivery_facts(grouped, Constants(small, missing), ledgers is not None), observation


# ---------------------------------------------------------------------------
# The input checks (from what input_facts found: Python rows)
# ---------------------------------------------------------------------------


def input_violations(t: Tables, located: list[dict], bad_total: int) -> tuple[list[dict], list[dict]]:
    """Malformed lines, sequence gaps and repeats, and the routers and epochs whose
    log is missing, as violation dicts (with names). Returns (violations, torn
    lines: notes)."""
    rows, torn = [], []

    def row(check, item, router=None, epoch=None, seq=None, file=None, line=None, ts=None, **info):
        rows.append(
            {
                "check": check,
                "item": item,
                "delivery": None,
                "router": router,
                "epoch": epoch,
                "seq": seq,
                "subscriber": None,
                "publisher": None,
                "pub_tag": None,
                "file": file,
                "line": line,
                "ts": ts,
                "info": json.dumps(info) if info else None,
            }
        )

    for b in located:
        if b["torn"]:
            torn.append({"file": b["file"], "line": b["line"]})
            continue
        row(
            "malformed-line",
            f"{b['file']}:{b['line']}",
            b["router"],
            b["epoch"],
            b["seq"],
            b["file"],
            b["line"],
            b["ts"],
            problem=b["problem"],
            text=(b["text"] or "")[:80],
        )
    listed = len(located)
    if bad_total > listed:
        row("malformed-line", "(more)", more=bad_total - listed)
    epochs = {(e["router"], e["epoch"]): e for e in t.epochs}
    for router, epoch, lo, hi in t.input["gaps"]:
        e = epochs[(router, epoch)]
        row("seq-gap", f"{router}|{epoch}|{lo}", router, epoch, lo, ts=e["first_ts"], lo=lo, hi=hi, last=e["last_seq"])
    for r in t.input["repeated"]:
        row(
            "seq-repeated",
            f"{r['router']}|{r['epoch']}|{r['seq']}",
            r["router"],
            r["epoch"],
            r["seq"],
            ", ".join(r["files"]),
            ts=r["ts"],
            n=r["n"],
            kinds=r["kinds"],
        )
    for router in t.input["missing_routers"]:
        row("router-log-missing", router, router)
    present = {e["router"] for e in t.epochs}
    for (peer, peer_epoch), (by, by_epoch, by_seq) in sorted(t.small["peers"].items(), key=lambda kv: str(kv[0])):
        if peer in present and (peer, peer_epoch) not in epochs:
            row("router-log-missing", f"{peer}|{peer_epoch}", peer, peer_epoch, by=by, by_epoch=by_epoch, by_seq=by_seq)
    return rows, torn


# ---------------------------------------------------------------------------
# 4. Across deliveries
# ---------------------------------------------------------------------------


def per_delivery(t: Tables) -> DataFrame:
    """The violations the per-delivery pass found, as rows."""
    return (
        t.facts.where(F.size("v") > 0)
        .select("delivery", "publisher", "pub_tag", F.explode("v").alias("x"))
        .select(
            "x.check",
            "x.kind",
            "delivery",
            "x.router",
            "x.epoch",
            "x.seq",
            "x.subscriber",
            "x.other",
            "publisher",
            "pub_tag",
            "x.ts",
            "x.info",
        )
    )


def under_many_ids(t: Tables) -> DataFrame:
    """The facts of the publisher deliveries received under more than one delivery
    id (few; usually none), and perhaps a few more: the publisher identities are
    counted by their 64-bit hash, so that the shuffle of one row per delivery carries
    a long instead of the identity's text (~8x smaller). Two identities sharing a
    hash only let more deliveries through; the callers group by the identity itself."""
    received = t.facts.where(F.col("received"))
    if not t.multiple_ids():
        return received.where(F.lit(False))  # planned as an empty relation: nothing downstream runs
    multi = _id_counts(t)
    return received.join(F.broadcast(multi), F.xxhash64("pub_id") == multi["ph"], "left_semi")


def _id_counts(t: Tables) -> DataFrame:
    """(ph, ids): the publisher identities' hashes received under more than one delivery id."""
    hashed = F.xxhash64("pub_id")
    received = t.facts.where(F.col("received"))
    return received.groupBy(hashed.alias("ph")).agg(F.count(F.lit(1)).alias("ids")).where(F.col("ids") > 1)


def duplicated_by_publisher(t: Tables) -> DataFrame:
    """No subscriber accepted one publisher delivery (same publisher, link,
    incarnation, tag and reuse suffix) under two delivery ids: first the publisher
    deliveries with more than one id (one small shuffle of one row per delivery),
    then who accepted them."""
    accepted = (
        under_many_ids(t)
        .select("delivery", "pub_id", "publisher", "pub_tag", F.explode("subs").alias("x"))
        .where(F.col("x.o") == ACC)
        .select("delivery", "pub_id", "publisher", "pub_tag", F.col("x.s").alias("subscriber"))
    )
    by_pub = (
        accepted.groupBy("subscriber", "pub_id")
        .agg(
            F.count_distinct("delivery").alias("n"),
            F.array_sort(F.collect_set("delivery")).alias("ids"),
            F.first("publisher").alias("publisher"),
            F.first("pub_tag").alias("pub_tag"),
        )
        .where(F.col("n") > 1)
    )
    return violations(
        by_pub,
        "duplicated",
        {"pub_id": "pub_id", "ids": "ids"},
        kind=F.lit("pub_id"),
        delivery=F.try_element_at("ids", F.lit(1)),
        subscriber="subscriber",
        publisher="publisher",
        pub_tag="pub_tag",
    )


def _order_violations(
    first_seen: DataFrame, order: list[str | Column], key: Column | None = None, *, java: bool = False, by_g: bool = False
) -> DataFrame:
    """``first_seen`` (_first_per_publisher_delivery()): one row per (partition...,
    pub_id) with its group ``g``, stream_seq and the ``order`` columns. A row whose
    stream_seq is below the highest one seen before it (in ``order``) in the same group
    is out of publisher order. ``key``: the ``order`` columns packed into one long that
    sorts as they do (None: they do not fit one; _packed()), with which StreamOrder.java
    judges the rows in one pass after a radix sort (spark/streamorder.py) when ``java``
    and its class is there; else the SQL window, its specification. ``by_g``: the rows
    are already partitioned by ``g``."""
    from spark import streamorder

    if key is not None and java and streamorder.available(first_seen.sparkSession):
        keyed = first_seen.withColumn("k", key)
        return streamorder.violations(keyed if by_g else keyed.repartition("g"))
    w = Window.partitionBy("g").orderBy(*order).rowsBetween(Window.unboundedPreceding, -1)
    before = first_seen.withColumn("prev", F.max(F.struct("stream_seq", "delivery")).over(w))
    return before.where(F.col("prev").isNotNull() & (F.col("stream_seq") < F.col("prev.stream_seq")))


def _first_per_publisher_delivery(t: Tables, rows: DataFrame, partition: list[str], fields: list[str]) -> DataFrame:
    """``rows`` (one per delivery id and ``partition``) reduced to one per publisher
    delivery (``pub_id``) and ``partition``: the smallest ``fields`` (in order), so
    that one publisher delivery under two ids counts once. When no publisher delivery
    has two ids (Tables.multiple_ids()) every row is already its own (the usual case:
    no grouping). Each row gets ``g``, the 64-bit hash of its ``partition``: the window
    over a group (_order_violations) sorts by one long and its order columns instead
    of by the partition's columns (a stream id is text), ~1.5x faster. Two groups that
    share a hash are judged as one: their running maximum can only be higher, so that
    can report an order violation where there is none, never hide one. With several
    ids, partitioned by ``g`` once: the grouping and the window share one shuffle."""
    g = F.xxhash64(*partition).alias("g")
    if not t.multiple_ids():
        return rows.select(g, *partition, *fields)
    return (
        rows.withColumn("g", g)
        .repartition("g")
        .groupBy("g", *partition, "pub_id")
        .agg(F.min(F.struct(*fields)).alias("m"))
        .select("g", *partition, "m.*")
    )


def _packed(high: Column, low: Column, high_max: int, low_max: int) -> Column | None:
    """(high, low), each between 0 and its maximum, as one long that sorts as the pair
    does, or None when the two do not fit 63 bits. A value outside its range (which the
    callers' bounds exclude) makes the key null, and StreamOrder fails its job on it
    rather than judge rows out of order."""
    bits = max(low_max, 0).bit_length()
    if max(high_max, 0).bit_length() + bits > 63:
        return None
    inside = high.between(0, high_max) & low.between(0, low_max)
    return F.when(inside, F.shiftleft(high, bits).bitwiseOR(low))


def _send_key(t: Tables) -> Column | None:
    """A send's (epoch, seq) as one long (_packed): every event the facts hold is of a
    line the read counted in its epoch (seq and epoch at least 1), so the epochs'
    highest epoch and seq bound them."""
    if not t.epochs:
        return None
    return _packed(
        F.col("epoch"),
        F.col("seq"),
        max(e["epoch"] for e in t.epochs),
        max(e["last_seq"] or 0 for e in t.epochs),
    )


#: load.py _ledger_rows: a ledger line's place in its split is below 2^33.
_LEDGER_ROWS = (1 << 33) - 1


def _ledger_key(t: Tables) -> Column | None:
    """A ledger line's place (its split's start in the file, its row in the split) as
    one long (_packed), when the largest ledger file's size is known (local files):
    a split starts inside its file."""
    if t.ledger_bytes is None:
        return None
    return _packed(F.col("line.split"), F.col("line.row"), t.ledger_bytes, _LEDGER_ROWS)


def out_of_order(t: Tables) -> DataFrame:
    """Per router, subscriber and publisher stream, the deliveries were sent to the
    subscriber in stream_seq order (each at its first send; one publisher delivery
    under two ids counts once: that is a duplicate)."""
    sends = (
        t.facts.where(F.col("received") & ~F.col("presettled"))
        .select("delivery", "stream", "pub_id", "stream_seq", "publisher", "pub_tag", F.explode("first_sends").alias("x"))
        .select(
            "delivery",
            "stream",
            "pub_id",
            "stream_seq",
            "publisher",
            "pub_tag",
            F.col("x.r").alias("router"),
            F.col("x.s").alias("subscriber"),
            F.col("x.e").alias("epoch"),
            F.col("x.q").alias("seq"),
        )
    )
    bad = _order_violations(
        _first_per_publisher_delivery(
            t, sends, ["router", "subscriber", "stream"], ["epoch", "seq", "delivery", "stream_seq", "publisher", "pub_tag"]
        ),
        ["epoch", "seq"],
        _send_key(t),
        java=t.java_order,
        by_g=t.multiple_ids(),  # (the grouping of several ids partitioned the rows by g)
    )
    return violations(
        bad,
        "out-of-order",
        {"stream_seq": "stream_seq", "prev_seq": "prev.stream_seq", "prev": "prev.delivery", "stream": "stream"},
        delivery="delivery",
        router="router",
        subscriber="subscriber",
        epoch="epoch",
        seq="seq",
        publisher="publisher",
        pub_tag="pub_tag",
    )


# ---------------------------------------------------------------------------
# The applications' ledgers (--clients)
# ---------------------------------------------------------------------------


def ledger_checks(t: Tables, ledgers: DataFrame) -> DataFrame:
    """Router view against application view (docs/ledger.md), for the links that
    keep a ledger. Decided in the per-delivery pass (the `delivered` lines travel
    with the events, app_events()): an application handed a delivery twice, or one
    no router sent it. Here: whatever a subscriber accepted (router view) its
    application was handed (``app_missing`` of the subscribers that keep a ledger);
    no application was handed one publisher delivery under two ids (the publisher
    deliveries with more than one id, few); each application saw each publisher
    stream in stream_seq order (one window, as for publisher order). (A publisher's
    last outcome line against its origin's pub-outcome: told_violations().)"""
    keepers = (
        ledgers.where((F.col("role") == "subscriber") & (F.col("event") == "delivered"))
        .select(
            _hash(_key(F.col("client"), F.col("link"))).alias("subscriber"), _key(F.col("client"), F.col("link")).alias("name")
        )
        .distinct()
    )
    missing = (
        t.facts.where(F.size("app_missing") > 0)
        .select("delivery", "publisher", "pub_tag", F.explode("app_missing").alias("subscriber"))
        .join(F.broadcast(keepers), "subscriber", "left_semi")
    )
    rows = [
        violations(
            missing,
            "ledger",
            None,
            kind=F.lit("missing"),
            delivery="delivery",
            subscriber="subscriber",
            publisher="publisher",
            pub_tag="pub_tag",
        )
    ]
    handed = (
        under_many_ids(t)
        .where(F.size("app") > 0)
        .select("delivery", "pub_id", "publisher", "pub_tag", F.explode("app").alias("a"))
    )
    by_pub = (
        handed.groupBy(F.col("a.s").alias("subscriber"), "pub_id")
        .agg(
            F.count_distinct("delivery").alias("n"),
            F.array_sort(F.collect_set("delivery")).alias("ids"),
            F.min("a.first.t").alias("ts"),
            F.first("publisher").alias("publisher"),
            F.first("pub_tag").alias("pub_tag"),
        )
        .where(F.col("n") > 1)
    )
    rows.append(
        violations(
            by_pub,
            "ledger",
            {"ids": "ids", "pub_id": "pub_id"},
            kind=F.concat(F.lit("dup|"), F.col("pub_id")),
            delivery=F.try_element_at("ids", F.lit(1)),
            subscriber="subscriber",
            ts="ts",
            publisher="publisher",
            pub_tag="pub_tag",
        )
    )
    # Application order, per subscriber link (its ledger file) and publisher stream,
    # each publisher delivery at the first time it was handed over, in file order.
    firsts = (
        t.facts.where(F.col("received") & (F.size(F.coalesce("app", F.array())) > 0))
        .select("delivery", "stream", "pub_id", "stream_seq", "publisher", "pub_tag", F.explode("app").alias("a"))
        .select(
            "delivery",
            "stream",
            "pub_id",
            "stream_seq",
            "publisher",
            "pub_tag",
            F.col("a.s").alias("subscriber"),
            F.col("a.first.fid").alias("fid"),
            F.struct(F.col("a.first.split").alias("split"), F.col("a.first.row").alias("row")).alias("line"),
            F.col("a.first.t").alias("ts"),
        )
    )
    first = _first_per_publisher_delivery(
        t, firsts, ["subscriber", "fid", "stream"], ["line", "delivery", "stream_seq", "ts", "publisher", "pub_tag"]
    )
    bad = _order_violations(
        first, [F.col("line.split"), F.col("line.row")], _ledger_key(t), java=t.java_order, by_g=t.multiple_ids()
    )
    rows.append(
        violations(
            bad,
            "ledger",
            {"stream_seq": "stream_seq", "prev_seq": "prev.stream_seq", "stream": "stream"},
            kind=F.lit("order"),
            delivery="delivery",
            subscriber="subscriber",
            ts="ts",
            publisher="publisher",
            pub_tag="pub_tag",
        )
    )
    return union_all(rows)


def publisher_outcomes(ledgers: DataFrame) -> DataFrame:
    """Each publisher delivery's last outcome line in its application's ledger:
    (publisher, link_name, l_inc, pub_tag, app_outcome, app_ts, message_id)."""
    L = ledgers.where(F.col("role") == "publisher")
    # Partitioned once, by the keys app_outcomes() joins on, and grouped in an order that
    # begins with them: the join then needs neither another shuffle nor another sort of
    # this side (a partial aggregation first would sort every line, shuffle, sort again,
    # and shuffle and sort once more for the join).
    rows = (
        L.repartition("client", "link", "pub_tag")
        .groupBy("client", "link", "pub_tag", "incarnation")
        .agg(
            F.max_by(
                F.when(F.col("event") == "outcome", F.col("outcome")),
                F.when(F.col("event") == "outcome", F.struct("split", "row")),
            ).alias("app_outcome"),
            F.max(F.when(F.col("event") == "outcome", F.col("ts"))).alias("app_ts"),
            F.first("message_id", ignorenulls=True).alias("message_id"),
        )
    )
    return rows.where(F.col("app_outcome").isNotNull()).select(
        F.col("client").alias("publisher"),
        F.col("link").alias("link_name"),
        F.col("incarnation").alias("l_inc"),
        "pub_tag",
        "app_outcome",
        "app_ts",
        "message_id",
    )


def app_outcomes(t: Tables, ledgers: DataFrame) -> DataFrame:
    """The routers' publisher deliveries (their origin's pub-outcome) beside what each
    application's ledger says it was told, matched on (client, link, incarnation,
    pub_tag), or (client, link, pub_tag) for a ledger without the incarnation: one
    full outer join, of the publishers that keep a ledger. Columns: delivery,
    publisher, link_name, pub_tag, router (origin), o (routers' outcome), accepted,
    ts, owed (the subscribers owed it), owed_accepted (every one of them accepted it),
    app_outcome, app_ts, message_id. (The routers'
    side carries those few values, not the facts' ``subs`` and ``pub``: its shuffle and
    sort are half as large.)"""
    told = publisher_outcomes(ledgers)
    pubs = (
        ledgers.where(F.col("role") == "publisher")
        .select(F.col("client").alias("publisher"), F.col("link").alias("link_name"))
        .distinct()
    )
    owed = F.filter("subs", lambda x: x["owed"])
    router = (
        # (an at-most-once topic's delivery has no origin record: its publisher was told
        # accepted on arrival, a pub-outcome of its own)
        t.facts.where(F.col("pub").isNotNull() & (F.col("origin").isNotNull() | F.col("presettled")))
        .select(
            "delivery",
            "publisher",
            "link_name",
            "incarnation",
            "pub_tag",
            "told_accepted",
            F.col("pub.o").alias("o"),
            F.col("pub.t").alias("ts"),
            F.transform(owed, lambda x: x["s"]).alias("owed"),
            F.forall(owed, lambda x: x["o"] == ACC).alias("owed_accepted"),
            "origin",
            "partial",
            "horizon",
        )
        .join(F.broadcast(pubs), ["publisher", "link_name"], "left_semi")
    )
    cond = (
        (F.col("r.publisher") == F.col("l.publisher"))
        & (F.col("r.link_name") == F.col("l.link_name"))
        & (F.col("r.pub_tag") == F.col("l.pub_tag"))
        & (F.col("l.l_inc").isNull() | (F.col("l.l_inc") == F.col("r.incarnation")))
    )
    return (
        router.alias("r")
        .join(told.alias("l"), cond, "full_outer")
        .select(
            F.coalesce("r.publisher", "l.publisher").alias("publisher"),
            F.coalesce("r.link_name", "l.link_name").alias("link_name"),
            F.coalesce("r.pub_tag", "l.pub_tag").alias("pub_tag"),
            "r.delivery",
            F.col("r.origin").alias("router"),
            "r.o",
            F.col("r.told_accepted").alias("accepted"),
            "r.ts",
            "r.owed",
            "r.owed_accepted",
            "r.partial",
            F.coalesce("r.horizon", F.lit(False)).alias("horizon"),
            "l.app_outcome",
            "l.app_ts",
            "l.message_id",
        )
    )


def told_violations(told: DataFrame, some_log_missing: bool = False) -> DataFrame:
    """The checks of each row of ``told`` (app_outcomes()), in one pass: a publisher's
    ledger against its origin's pub-outcome (``ledger``), and outcome-disagrees from
    the applications' side. One pass, so that the join is neither kept nor made twice."""
    checks = [_publisher_ledger(some_log_missing), _app_outcome_disagrees()]
    found = F.array(*[F.when(cond, F.struct(*columns)) for cond, columns in checks])
    return told.select(F.explode(F.filter(found, lambda x: x.isNotNull())).alias("x")).select("x.*")


def _app_outcome_disagrees() -> tuple[Column, list[Column]]:
    """outcome-disagrees from the applications' side: a publisher whose ledger says
    it was told released, rejected or modified although every subscriber owed the
    delivery accepted it, where its origin router logged accepted. (A row of
    app_outcomes() where the condition holds, and its violation.)"""
    cond = (
        F.col("delivery").isNotNull()
        & ~F.col("partial")
        & ~F.col("horizon")
        & F.col("app_outcome").isNotNull()
        & (F.col("app_outcome") != "accepted")
        & (F.col("o") == ACC)  # (a router's row is one with a pub-outcome)
        & (F.size("owed") > 0)
        & F.col("owed_accepted")
    )
    return cond, violation_columns(
        "outcome-disagrees",
        {"app_outcome": "app_outcome", "pairs": F.transform("owed", lambda s: F.struct(s.alias("s")))},
        kind=F.lit("ledger"),
        delivery="delivery",
        router="router",
        publisher="publisher",
        pub_tag="pub_tag",
        ts="app_ts",
    )


def _publisher_ledger(some_log_missing: bool = False) -> tuple[Column, list[Column]]:
    """A publisher's last outcome line says ``accepted`` exactly when its origin's
    pub-outcome did. (A row of app_outcomes() where it does not, and its violation.)"""
    app_accepted = F.coalesce(F.col("app_outcome") == "accepted", F.lit(False))
    router_accepted = F.coalesce(F.col("accepted"), F.lit(False))
    # (a publisher told rejected beyond the resume horizon was told the truth: "it
    # may have been delivered")
    beyond = F.col("horizon") & (F.col("app_outcome") == "rejected")
    cond = (
        (F.col("delivery").isNotNull() | F.col("app_outcome").isNotNull())
        & (app_accepted != router_accepted)
        & ~F.coalesce(beyond, F.lit(False))
    )
    if some_log_missing:  # an outcome no present log records may be in the missing one: reported once, as such
        cond = cond & F.col("delivery").isNotNull()
    return cond, violation_columns(
        "ledger",
        {"link": "link_name", "outcome": "o", "app_outcome": "app_outcome", "message_id": "message_id"},
        kind=F.concat_ws("|", F.lit("pub"), "publisher", "link_name", "pub_tag"),
        delivery="delivery",
        router="router",
        ts=F.coalesce(F.col("ts"), F.col("app_ts")),
        publisher="publisher",
        pub_tag="pub_tag",
    )


# ---------------------------------------------------------------------------
# Everything
# ---------------------------------------------------------------------------


def all_violations(t: Tables, ledgers: DataFrame | None = None, told: DataFrame | None = None) -> DataFrame:
    """Every per-delivery and cross-delivery check (the input checks come from
    ``input_violations``), as rows of VIOLATION_SCHEMA. ``told``: app_outcomes()."""
    frames = delivery_violations(t)
    if ledgers is not None:
        assert told is not None, "all_violations(t, ledgers, told): told is app_outcomes(t, ledgers)"
        frames += ledger_violations(t, ledgers, told)
    return union_all(frames)


def delivery_violations(t: Tables) -> list[DataFrame]:
    """all_violations()' frames from the routers' logs alone."""
    return [per_delivery(t), duplicated_by_publisher(t), out_of_order(t)]


def ledger_violations(t: Tables, ledgers: DataFrame, told: DataFrame) -> list[DataFrame]:
    """all_violations()' frames that read the applications' ledgers (``told``:
    app_outcomes()). Planned apart from delivery_violations()' so that a caller can plan
    both at once (spark/job.py)."""
    return [ledger_checks(t, ledgers), told_violations(told, bool(t.input["missing_routers"]))]


def counted(violations_df: DataFrame) -> DataFrame:
    """(check, rows, items) of Spark's violations: what each check counts (ITEM) is
    the distinct values of its fields among the row's."""
    fields = ("kind", "delivery", "router", "epoch", "subscriber", "other")
    item = F.struct(*[F.when(F.col("check").isin(*[c for c, fs in ITEM.items() if f in fs]), F.col(f)).alias(f) for f in fields])
    return violations_df.groupBy("check").agg(F.count(F.lit(1)).alias("rows"), F.count_distinct(item).alias("items"))


def subscriber_names(spark, sources: list, hashes: set) -> dict:
    """hash -> subscriber key, for subscribers no router saw attach (cold path:
    one more read of the events' subscriber fields)."""
    from spark.load import load_lines

    lines = load_lines(spark, sources, ("subscriber", "owed", "forwarded", "subscribers"))
    empty = F.array().cast("array<string>")
    names = (
        lines.select(
            F.explode(
                F.array_distinct(
                    F.array_compact(
                        F.concat(
                            F.array("subscriber"),
                            F.coalesce("owed", empty),
                            F.coalesce("forwarded", empty),
                            F.coalesce("subscribers", empty),
                        )
                    )
                )
            ).alias("n")
        )
        .distinct()
        .where(F.xxhash64("n").isin(*sorted(hashes)))
    )
    return {r["h"]: r["n"] for r in names.select("n", F.xxhash64("n").alias("h")).collect()}


def decode_all(rows: list[dict], names: Names) -> list[dict]:
    """The listed violations with names (Spark's rows; the input checks' rows have
    them already)."""
    spark_rows = [r for r in rows if r.get("_spark")]
    decoded = iter(decode(spark_rows, names))
    out = []
    for r in rows:
        if r.get("_spark"):
            v = next(decoded)
            v.pop("_spark", None)
            out.append(v)
        else:
            out.append(r)
    return out


# ---------------------------------------------------------------------------
# On the driver: names, items and sentences for the violations the report lists
# ---------------------------------------------------------------------------


def decode(rows: list[dict], names: Names) -> list[dict]:
    """Spark's violation rows with names for the hashes, ``item`` (what the check
    counts, as text) and ``detail`` (the sentence)."""
    out = []
    for row in rows:
        v = dict(row)
        info = json.loads(v["info"]) if v.get("info") else {}
        v["router"] = names.router(v["router"])
        v["other"] = names.router(v["other"])
        if info.get("name"):  # a ledger's subscriber the routers never named
            names.subscribers.setdefault(v["subscriber"], info["name"])
        v["subscriber"] = names.subscriber(v["subscriber"])
        for p in info.get("pairs") or []:
            p["s"] = names.subscriber(p.get("s"))
            p["r"] = names.router(p.get("r"))
        for w in info.get("where") or []:
            w["r"] = names.router(w.get("r"))
        if "owed" in info:
            info["owed"] = [names.subscriber(s) for s in info["owed"] or []]
        if "waiting" in info:
            info["waiting"] = [names.subscriber(s) for s in info["waiting"] or []]
        v["info"] = json.dumps(info) if info else None
        v["item"] = item_of(v)
        v.setdefault("file", None)
        v.setdefault("line", None)
        out.append(v)
    return out


def item_of(v: dict) -> str:
    """What a check counts, as text (the tests and the report name items so)."""
    check, kind = v["check"], v.get("kind")
    if check == "duplicated" and kind == "pub_id":
        return f"{v['subscriber']}|{json.loads(v['info'])['pub_id']}"
    if check == "ledger":
        assert kind is not None  # every ledger row has one (missing, twice, unsent, dup|, order, pub|)
        if kind.startswith("pub|"):
            return f"{kind}|{v['delivery'] or ''}"
        if kind.startswith("dup|"):
            return f"dup|{v['subscriber']}|{kind[4:]}"
        return f"{kind}|{v['subscriber']}|{v['delivery']}"
    parts = {
        "delivery": v["delivery"],
        "router": v["router"],
        "epoch": v["epoch"],
        "subscriber": v["subscriber"],
        "other": v["other"],
        "kind": kind,
    }
    return "|".join(str(parts[f]) for f in ITEM[check] if f != "kind")


def _outcome(code) -> str:
    return OUTCOME_NAME.get(code, "?") if code is not None else "nothing"


def describe(v: dict) -> str:
    """The sentence for one violation (decoded: names, not hashes)."""
    info: Any = json.loads(v["info"]) if v.get("info") else {}  # a JSON object: its fields depend on the check
    check = v["check"]
    tag = f"; publisher {v['publisher']} tag {v['pub_tag']}" if v.get("publisher") else ""
    where = f"router {v['router']} epoch {v['epoch']} seq {v['seq']}"
    sub = v.get("subscriber")
    if check == "malformed-line":
        if "more" in info:
            return f"and {info['more']:,} more malformed line(s) not listed"
        text = f": {info['text']!r}" if info.get("text") else ""
        place = f"{v['file']}:{v['line']}" if v.get("line") else f"{v['file']} (a line)"
        return f"{place}: {info['problem']}{text}"
    if check == "seq-gap":
        lo, hi = info["lo"], info["hi"]
        what = f"seq {lo} is missing" if lo == hi else f"seq {lo}..{hi} are missing ({hi - lo + 1:,} lines)"
        why = "its first lines (its first log file is missing?)" if lo == 1 else "a log file is missing, or lines were deleted"
        return f"router {v['router']} epoch {v['epoch']}: {what}; its lines run to seq {info['last']:,}: {why}"
    if check == "seq-repeated":
        return (
            f"router {v['router']} epoch {v['epoch']}: seq {v['seq']} is on {info['n']} lines "
            f"({', '.join(info['kinds'])}; in {v['file']}): a line copied, or a log file given twice"
        )
    if check == "router-log-missing":
        if v.get("epoch") is not None:
            return (
                f"no log of router {v['router']} epoch {v['epoch']}, though router {info['by']} connected to it "
                f"then (its epoch {info['by_epoch']} seq {info['by_seq']}): its files are missing (retention?)"
            )
        return (
            f"no log of router {v['router']}, which the other routers' events about deliveries name: pass its "
            f"data directory too (what it did cannot be proven, and is not reported delivery by delivery)"
        )
    if check == "lost":
        if v.get("kind") == "moved":
            return (
                f"publisher told accepted, but durable subscriber {sub} (moved from router {v['other']}, owed "
                f"wherever it re-attached) never accepted it anywhere, and its obligation was never "
                f"discarded{tag}"
            )
        if v.get("kind") == "router":
            told = ",".join(_outcome(o) for o in info.get("told") or [])
            return (
                f"publisher told accepted by {v['other']}, but router {v['router']} (owed it: in the origin's "
                f"routers) "
                + (f"answered {told} without logging its arrival" if told else "never received it and never answered")
                + tag
            )
        said = ",".join(_outcome(o) for o in info.get("said") or [])
        what = (
            f"answered {said}"
            if said
            else f"was sent it (seq {info['sent']}) and never answered"
            if info.get("sent") is not None
            else "was owed it and never sent it"
        )
        reply = (
            "the router never answered for it"
            if info.get("answer_seq") is None
            else f"the router answered {_outcome(info.get('answer'))} at seq {info['answer_seq']}"
        )
        return f"publisher told accepted, but subscriber {sub} on router {v['router']} {what}; {reply}{tag}"
    if check == "duplicated":
        if v.get("kind") == "pub_id":
            return (
                f"subscriber {sub} accepted one publisher delivery ({info['pub_id']}) under {len(info['ids'])} "
                f"delivery ids: {', '.join(info['ids'])}{tag}"
            )
        places = "; ".join(f"router {w['r']} epoch {w['e']} seq {w['q']}" for w in info["where"])
        return f"subscriber {sub} accepted it {len(info['where'])} times ({places}){tag}"
    if check == "out-of-order":
        return (
            f"sent to {sub} on router {v['router']}: stream_seq {info['stream_seq']} after stream_seq "
            f"{info['prev_seq']} ({info['prev']}) of stream {info['stream']}{tag}"
        )
    if check == "invented":
        kind = KIND_NAME.get(info.get("kind"), "?")
        outcome = f" ({_outcome(info.get('outcome'))})" if kind in ("sub-outcome", "pub-outcome") else ""
        by = f" by subscriber {sub}" if sub else ""
        return f"{kind} on {where}{by}{outcome}, but no router received this delivery"
    if check == "record-missing":
        kind = KIND_NAME.get(info.get("kind"), "?")
        outcome = f" ({_outcome(info.get('outcome'))})" if kind in ("sub-outcome", "pub-outcome", "outcome-to-router") else ""
        more = f" (and {info['more']} more event(s))" if info.get("more") else ""
        earlier = info.get("received_in") or []
        why = (
            f"it received the delivery in epoch {', '.join(str(e) for e in earlier)} (a restarted router acting "
            f"for its previous life)"
            if earlier
            else "it never received the delivery"
        )
        return (
            f"router {v['router']} epoch {v['epoch']} logged {kind}{outcome}"
            + (f" for {sub}" if sub else "")
            + f" at seq {v['seq']}{more} without a record of it in that epoch: {why}{tag}"
        )
    if check == "arrival-unforwarded":
        return (
            f"router {v['router']} received it from origin {v['other']} (epoch {v['epoch']} seq {v['seq']}), but "
            f"no router logged forwarding it there{tag}"
        )
    if check == "accept-unowed":
        never = "" if info.get("attached") else ", and it never attached to any router"
        return (
            f"subscriber {sub} answered {_outcome(info.get('outcome'))} on {where} but was never owed this "
            f"delivery: no router listed it as owed, sent it or moved an obligation to it{never}{tag}"
        )
    if check == "accept-unsent":
        return (
            f"subscriber {sub} answered {_outcome(info.get('outcome'))} on {where} but that router had not sent "
            f"it this delivery before{tag}"
        )
    if check == "answer-missing":
        received = info.get("received") or {}
        answer = info.get("answer")
        then = (
            f"and answered {_outcome(answer['o'])} at seq {answer['q']}: the origin never logged that answer"
            if answer
            else "and never logged an answer (nor did the origin log one)"
        )
        return (
            f"origin {v['router']} told its publisher {_outcome(info.get('outcome'))} (seq {v['seq']}) without an "
            f"answer from router {v['other']}, which received it (epoch {received.get('e')} seq "
            f"{received.get('q')}) for {', '.join(info.get('owed') or [])} {then}{tag}"
        )
    if check == "outcome-disagrees":
        pairs = info.get("pairs") or []

        def who(p):
            first = p.get("first")
            did = f" {_outcome(first['o'])} at seq {first['q']}" if first else ""
            return f"{p['s']}@{p['r']}{did}" if p.get("r") else p["s"]

        people = ", ".join(sorted(who(p) for p in pairs))
        if v.get("kind") == "ledger":
            return (
                f"the publisher's ledger says it was told {info['app_outcome']}, but every subscriber owed it "
                f"accepted it: {people}{tag}"
            )
        told = f"publisher told {_outcome(info.get('outcome'))} by router {v['router']} (seq {v['seq']})"
        if v.get("kind") == "all-accepted":
            routers = ", ".join(sorted({p["r"] for p in pairs}))
            return f"{told}, but every subscriber owed it accepted it: {people} (routers {routers}){tag}"
        return (
            f"{told}, but owed subscriber(s) answered otherwise before their router answered and never accepted it: {people}{tag}"
        )
    if check == "left-unsettled":
        answer = info.get("answer")
        if info.get("by") is not None:
            why = (
                f"settled by {BY_NAME.get(info['by'], '?')}, but the record was never deleted (receivers not "
                f"known to have seen the settlement)"
            )
        elif answer:
            why = f"answered {_outcome(answer['o'])}; " + (
                "the publisher never settled it"
                if v.get("other") is None
                else f"origin router {v['other']} never relayed a settlement"
            )
        else:
            why = "never answered: waiting for " + (", ".join(info.get("waiting") or []) or "remote routers")
        return f"record left on router {v['router']}: {why}{tag}"
    if check == "ledger":
        kind = v.get("kind") or ""
        mid = f", message-id {info['message_id']}" if info.get("message_id") else ""
        if kind == "missing":
            return f"subscriber {sub} accepted it (router view), but its application's ledger never got it{tag}"
        if kind == "twice":
            return f"handed to the application of {sub} {info['n']} times{tag}{mid}"
        if kind == "unsent":
            return f"the application of {sub} was handed a delivery no router logged sending it{mid}"
        if kind.startswith("dup|"):
            return (
                f"the application of {sub} was handed one publisher delivery under {len(info['ids'])} ids: "
                f"{', '.join(info['ids'])}{mid}"
            )
        if kind == "order":
            return (
                f"the application of {sub} was handed stream_seq {info['stream_seq']} after {info['prev_seq']} "
                f"of stream {info['stream']}{mid}"
            )
        routers = _outcome(info.get("outcome")) if info.get("outcome") is not None else "nothing"
        return (
            f"publisher {v['publisher']}/{info.get('link')} tag {v['pub_tag']}{mid}: routers said {routers}, the "
            f"application's ledger says {info.get('app_outcome') or 'nothing'}"
        )
    return json.dumps(info)


if __name__ == "__main__":
    # ``spark-submit spark/reconcile.py LOGDIR... [options]``: this file run as a script
    # (the module ``__main__``, not ``spark.reconcile``) is the command line of
    # ``eorouter reconcile``, with the master from spark-submit. Only the script
    # imports the command line: the module never does (scripts/check-cycles).
    from spark.cli import reconcile_main

    raise SystemExit(reconcile_main(default_master=None))
