"""The reconciliation: proofs over every router's event log, as DataFrame transformations.

Every check is a function from DataFrames to a DataFrame of violations (schema
``VIOLATION_COLUMNS``); nothing is collected to the driver but the final counts and
the first violations. The events that name a delivery are hash-partitioned by
``delivery`` once and cached, so the per-delivery joins and aggregations below run
without another shuffle; the small per-router tables (epochs, subscription ends,
routes) are broadcast.

What each proof means is in docs/reconcile.md. The event kinds each proof reads
are named in the module-level tuples below: a new kind (failover, issue 4) that
ends an obligation or references a delivery is added there.

Run it with ``eorouter reconcile LOGDIR...`` or
``spark-submit spark/reconcile.py LOGDIR... [--out DIR]``.
"""

from __future__ import annotations

import sys
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

# ---------------------------------------------------------------------------
# Vocabulary
# ---------------------------------------------------------------------------

#: Events whose ``delivery`` must name a delivery some router received
#: ("nothing invented"). Not tag-collision, dropped or order-gap: those name a
#: tag the router refused, dropped or holds back.
REFERENCING_KINDS = ("forwarded", "sub-outcome", "pub-outcome", "settled", "record-deleted", "expired",
                     "outcome-to-router", "outcome-from-router", "settlement-relayed", "forwarded-to-router",
                     # failover (docs/resumption.md): each names a record the logging router holds.
                     # Not the placeholder-* kinds: they name a delivery the router has not seen yet.
                     "resend-matched", "origin-taken-over", "owed-moved", "owed-state-discarded")

#: Failover: a dead router's (or a moved subscriber's) durable subscribers stay owed
#: a delivery wherever they re-attach (``owed-moved``, its ``subscribers``) until
#: they accept it or their terminus timeout ends the obligation (``owed-state-discarded``).
MOVED_KIND = "owed-moved"
DISCARDED_KIND = "owed-state-discarded"

#: How a router answers for a delivery: to its publisher (origin) or to the origin router.
ANSWER_KINDS = ("pub-outcome", "outcome-to-router")

#: Columns every check's output has. ``item`` is what the check counts (distinct).
VIOLATION_COLUMNS = ("check", "item", "delivery", "router", "subscriber", "detail", "ts", "epoch", "seq")

#: The checks, in the order the verdict lists them: (name, what a count means).
CHECKS = (
    ("lost", "deliveries"),
    ("duplicated", "subscriber x publisher delivery"),
    ("out-of-order", "subscriber x delivery"),
    ("invented", "deliveries"),
    ("left-unsettled", "router x delivery"),
    ("incomplete-input", "problems"),
    ("ledger", "mismatches"),
)

#: Wall-clock tolerance (seconds) when a cross-router fact can only be placed in
#: time by ts (routers' events are ordered by (epoch, seq) only within a router).
CLOCK_SLACK = 5.0

_NEEDED = ("seq", "ts", "router", "epoch", "boot", "event", "delivery", "topic", "publisher", "link_name",
           "pub_tag", "incarnation", "stream_seq", "settled", "owed", "forwarded", "routers", "origin_router",
           "subscriber", "outcome", "by", "deleted", "to_router", "from_router", "link", "container", "name",
           "role", "address", "durable", "closed", "reason", "reachable", "resumed", "dests", "subscribers",
           "pub_outcome", "deliveries")

#: Folded lines (router.eventlog.FOLDED) stand for several events at their seq:
#: "completed" is a sub-outcome, a pub-outcome and, when ``by`` is set, a settled;
#: "sub-outcomes" is one sub-outcome per delivery of its ``deliveries``.
COMPLETED = "completed"
SUB_OUTCOMES = "sub-outcomes"
#: Column added by unfold(): true only on the first event of a line (so the input
#: check counts lines, not events).
FIRST = "_first_of_line"


def unfold(ev: DataFrame) -> DataFrame:
    """Every folded line as the events it stands for (router.eventlog.unfold(), same
    seq, in the same order), in one pass (an explode, no union: the input is read
    once). Adds ``FIRST``.

    Each line becomes an array of (kind, delivery) parts, exploded with their
    position: a "completed" line its two or three parts, all of its delivery; a
    "sub-outcomes" line one "sub-outcome" per element of ``deliveries``; any other
    line itself. An input without the folded kinds' own columns (a log, or a Parquet
    dataset, written before they existed) has none of those lines."""
    folds_completed = "pub_outcome" in ev.columns
    folds_runs = "deliveries" in ev.columns
    if not (folds_completed or folds_runs):
        return ev.withColumn(FIRST, F.lit(True))

    def event_of_line(kind: Column, delivery: Column) -> Column:
        return F.struct(kind.alias("kind"), delivery.cast("string").alias("delivery"))

    def of_the_lines_delivery(*kinds: str) -> Column:
        return F.array(*(event_of_line(F.lit(k), F.col("delivery")) for k in kinds))

    completed = (F.col("event") == COMPLETED) if folds_completed else F.lit(False)
    cases = []
    if folds_completed:
        cases += [(completed & F.col("by").isNotNull(),
                   of_the_lines_delivery("sub-outcome", "pub-outcome", "settled")),
                  (completed, of_the_lines_delivery("sub-outcome", "pub-outcome"))]
    if folds_runs:
        # A run without deliveries (the router never writes one) stays the line it
        # is: it then names no delivery, and still counts as a line against seq.
        cases.append(((F.col("event") == SUB_OUTCOMES) & (F.size("deliveries") > 0),
                      F.transform("deliveries", lambda d: event_of_line(F.lit("sub-outcome"), d))))
    parts = F.when(*cases[0])
    for condition, value in cases[1:]:
        parts = parts.when(condition, value)
    parts = parts.otherwise(F.array(event_of_line(F.col("event"), F.col("delivery"))))
    x = ev.select("*", F.posexplode(parts).alias("_pos", "_part"))
    kind = F.col("_part.kind")

    def only(part: str, name: str) -> Column:  # a "completed" line's field belongs to one of its events
        return F.when(completed & (kind != part), F.lit(None)).otherwise(F.col(name))

    # A "sub-outcomes" line's subscriber, outcome and settled are every one of its
    # events' as they are: only its kind and delivery change.
    columns = {"event": kind, "delivery": F.col("_part.delivery")}
    if folds_completed:
        columns.update({
            "subscriber": only("sub-outcome", "subscriber"),
            "settled": only("sub-outcome", "settled"),
            "outcome": F.when(completed & (kind == "pub-outcome"), F.col("pub_outcome"))
            .when(completed & (kind == "settled"), F.lit(None)).otherwise(F.col("outcome")),
            "reason": only("pub-outcome", "reason"),
            "by": only("settled", "by"),
            "deleted": only("settled", "deleted"),
        })
    return x.select(*[columns[c].cast(ev.schema[c].dataType).alias(c) if c in columns else F.col(c)
                      for c in ev.columns if c not in ("pub_outcome", "deliveries")],
                    (F.col("_pos") == 0).alias(FIRST))


def _key(container: Column, name: Column) -> Column:
    return F.concat_ws("/", container, name)


def _violations(df: DataFrame, check: str, item: Column, *, delivery=None, router=None, subscriber=None,
                detail=None, ts=None, epoch=None, seq=None) -> DataFrame:
    def col(value, type_):
        if value is None:
            return F.lit(None).cast(type_)
        return (F.col(value) if isinstance(value, str) else value).cast(type_)
    return df.select(
        F.lit(check).alias("check"), item.cast("string").alias("item"),
        col(delivery, "string").alias("delivery"), col(router, "string").alias("router"),
        col(subscriber, "string").alias("subscriber"), col(detail, "string").alias("detail"),
        col(ts, "double").alias("ts"), col(epoch, "long").alias("epoch"), col(seq, "long").alias("seq"))


def empty_violations(spark) -> DataFrame:
    schema = T.StructType([T.StructField(n, T.DoubleType() if n == "ts" else
                                         T.LongType() if n in ("epoch", "seq") else T.StringType())
                           for n in VIOLATION_COLUMNS])
    return spark.createDataFrame([], schema)


# ---------------------------------------------------------------------------
# The tables every proof shares
# ---------------------------------------------------------------------------

@dataclass
class Tables:
    """The event log cut into the tables the proofs join. ``keyed`` holds every
    event naming a delivery, hash-partitioned by delivery; the rest are derived
    from it (same partitioning) or are small per-router tables."""
    keyed: DataFrame   # events with a delivery, partitioned by delivery
    life: DataFrame    # events without one (links, routers, routes)
    recv: DataFrame    # non-pre-settled `received`, one row per (router, epoch, delivery)
    ident: DataFrame   # one row per received delivery: who published it, where in the stream
    accepts: DataFrame  # sub-outcome accepted
    sends: DataFrame   # a delivery sent to a subscriber (received.forwarded or forwarded)
    epochs: DataFrame  # one row per (router, epoch): how it started and ended
    sub_ends: DataFrame  # when a subscriber stopped being owed what it had not answered
    routes: DataFrame  # `routes` events: which routers were reachable
    durability: DataFrame  # every subscriber attach: (router, epoch, subscriber, attach_seq, durable)
    per_delivery: DataFrame | None = None  # lives(): one row per delivery, every event about it (cached)
    persisted: list = field(default_factory=list)

    def unpersist(self) -> None:
        for frame in self.persisted:
            frame.unpersist()
        self.persisted.clear()


def prepare(events: DataFrame, partitions: int | None = None, persist: bool = True,
            storage: StorageLevel = StorageLevel.MEMORY_AND_DISK) -> Tables:
    """Cut the events into ``Tables``. ``partitions``: how many hash partitions of
    delivery ids (default: spark.sql.shuffle.partitions). ``storage``: how the two
    big cached tables are kept (DISK_ONLY for large inputs on a small driver)."""
    spark = events.sparkSession
    # The plan this job wants: every per-delivery table below stays hash-partitioned
    # by delivery, so joins on (delivery, router, ...) need no shuffle when Spark may
    # use a partitioning on a subset of the join keys; small per-router tables are
    # broadcast explicitly (F.broadcast), nothing else is.
    spark.conf.set("spark.sql.requireAllClusterKeysForCoPartition", "false")
    spark.conf.set("spark.sql.autoBroadcastJoinThreshold", "-1")
    if partitions is None:
        partitions = int(spark.conf.get("spark.sql.shuffle.partitions"))
    # A table cached under adaptive execution forgets its partitioning (its plan is
    # adaptive, its output partitioning unknown): every aggregation and join by
    # delivery over it would shuffle it again. So the cached tables are planned
    # without it; the queries over them may still use it (coalescing the small
    # per-subscriber shuffles). tests/spark/test_job.py checks the plan.
    adaptive = spark.conf.get("spark.sql.adaptive.enabled", "false")
    spark.conf.set("spark.sql.adaptive.enabled", "false")
    try:
        return _prepare(events, partitions, persist, storage)
    finally:
        spark.conf.set("spark.sql.adaptive.enabled", adaptive)


def _prepare(events: DataFrame, partitions: int, persist: bool, storage: StorageLevel) -> Tables:
    ev = unfold(events.select(*[c for c in _NEEDED if c in events.columns]))
    keyed = ev.where(F.col("delivery").isNotNull()).repartition(partitions, "delivery")
    life = ev.where(F.col("delivery").isNull())
    persisted = []
    if persist:
        keyed = keyed.persist(storage)
        life = life.persist(StorageLevel.MEMORY_AND_DISK)
        persisted = [keyed, life]

    received_all = keyed.where(F.col("event") == "received")
    recv = received_all.where(~F.coalesce(F.col("settled"), F.lit(False))).select(
        "delivery", "router", "epoch", "boot", "seq", "ts", "topic", "publisher", "link_name", "incarnation",
        "pub_tag", "stream_seq", F.coalesce(F.col("owed"), F.array().cast("array<string>")).alias("owed"),
        F.coalesce(F.col("forwarded"), F.array().cast("array<string>")).alias("forwarded"),
        "routers", "origin_router")
    # A publisher delivery's identity: (publisher, link, incarnation, its own tag) and
    # the ".N" suffix the router adds when a settled tag is reused (docs/tags.md).
    ident = received_all.groupBy("delivery").agg(
        F.first("publisher", ignorenulls=True).alias("publisher"),
        F.first("link_name", ignorenulls=True).alias("link_name"),
        F.first("incarnation", ignorenulls=True).alias("incarnation"),
        F.first("pub_tag", ignorenulls=True).alias("pub_tag"),
        F.first("stream_seq", ignorenulls=True).alias("stream_seq"),
        F.first("topic", ignorenulls=True).alias("topic"),
        F.max(F.coalesce(F.col("settled"), F.lit(False))).alias("presettled"),
        F.max(F.col("origin_router").isNull()).alias("from_publisher"),
    ).withColumn("reuse", F.regexp_extract("delivery", r"\.(\d+)$", 1)) \
        .withColumn("pub_id", F.concat_ws("|", "publisher", "link_name", "incarnation", "pub_tag", "reuse")) \
        .withColumn("stream", F.concat_ws("|", "publisher", "link_name", "incarnation"))

    accepts = keyed.where((F.col("event") == "sub-outcome") & (F.col("outcome") == "accepted")) \
        .select("delivery", "router", "epoch", "seq", "ts", "subscriber")
    sends = recv.select("delivery", "router", "epoch", "seq", "ts", F.explode("forwarded").alias("subscriber")) \
        .unionByName(keyed.where(F.col("event") == "forwarded")
                     .select("delivery", "router", "epoch", "seq", "ts", "subscriber"))

    epochs = life.where(F.col("event").isin("router-started", "router-stopping")).groupBy("router", "epoch") \
        .agg(F.first("boot", ignorenulls=True).alias("boot"),
             F.min(F.when(F.col("event") == "router-started", F.col("ts"))).alias("started_ts"),
             F.min(F.when(F.col("event") == "router-stopping", F.col("ts"))).alias("stopping_ts"),
             F.min(F.when(F.col("event") == "router-stopping", F.col("seq"))).alias("stopping_seq"))
    # The extent of each epoch comes from every event (a died router's last words
    # may be about deliveries): a small aggregate over both tables.
    lines = keyed.select("router", "epoch", "seq", "ts", FIRST) \
        .unionByName(life.select("router", "epoch", "seq", "ts", FIRST))
    extent = lines.groupBy("router", "epoch").agg(
        F.min("ts").alias("first_ts"), F.max("ts").alias("last_ts"), F.min("seq").alias("first_seq"),
        F.max("seq").alias("last_seq"), F.sum(F.col(FIRST).cast("long")).alias("lines"))
    epochs = extent.join(epochs, ["router", "epoch"], "left") \
        .withColumn("stopped", F.col("stopping_seq").isNotNull())

    sub_ends = _subscription_ends(life)
    routes = life.where(F.col("event") == "routes").select("router", "epoch", "seq", "ts", "reachable")
    durability = _durability(life)
    if persist:  # small per-router tables, used by several proofs
        epochs, sub_ends, routes, durability = (f.persist(StorageLevel.MEMORY_AND_DISK)
                                                for f in (epochs, sub_ends, routes, durability))
        persisted += [epochs, sub_ends, routes, durability]
    tables = Tables(keyed, life, recv, ident, accepts, sends, epochs, sub_ends, routes, durability,
                    persisted=persisted)
    tables.per_delivery = lives(tables)
    if persist:  # read by three proofs and the summary: built once
        tables.per_delivery = tables.per_delivery.persist(storage)
        persisted.append(tables.per_delivery)
    return tables


def _subscription_ends(life: DataFrame) -> DataFrame:
    """(router, epoch, seq, ts, subscriber, kind, topic): the moments a subscription
    stopped being owed what it had not answered (docs/delivery-rule.md):
    - a detach of a non-durable link, or a closing detach (not a stolen link: the
      subscription carries on on the new one);
    - ``subscription-expired`` (a durable subscription's terminus timeout ran out);
    - the same name attaching to another topic (``kind`` = "re-attached": counts only
      for deliveries of another topic).
    Failover (issue 4) adds its own kinds here."""
    attached = life.where((F.col("event") == "link-attached") & (F.col("role") == "subscriber")).select(
        "router", "epoch", "link", F.col("seq").alias("attach_seq"), F.col("durable").alias("link_durable"),
        F.col("address").alias("link_topic"))
    detached = life.where((F.col("event") == "link-detached") & (F.col("role") == "subscriber"))
    # The attach a detach belongs to: the latest attach of that link id before it.
    joined = detached.join(attached, ["router", "epoch", "link"], "left") \
        .where(F.col("attach_seq").isNull() | (F.col("attach_seq") < F.col("seq")))
    latest = joined.groupBy("router", "epoch", "seq").agg(
        F.first("ts").alias("ts"), F.first("container").alias("container"), F.first("name").alias("name"),
        F.first("closed").alias("closed"), F.first("reason").alias("reason"),
        F.max_by("link_durable", "attach_seq").alias("durable"), F.max_by("link_topic", "attach_seq").alias("topic"))
    ends_by_detach = latest.where(
        (F.coalesce(F.col("reason"), F.lit("")) != "stolen")
        & (F.coalesce(F.col("closed"), F.lit(False)) | (F.coalesce(F.col("durable"), F.lit(0)) == 0))
    ).select("router", "epoch", "seq", "ts", _key(F.col("container"), F.col("name")).alias("subscriber"),
             F.when(F.col("closed"), F.lit("closed")).otherwise(F.lit("detached")).alias("kind"), "topic")
    expired = life.where(F.col("event") == "subscription-expired").select(
        "router", "epoch", "seq", "ts", _key(F.col("container"), F.col("name")).alias("subscriber"),
        F.lit("subscription-expired").alias("kind"), F.col("address").alias("topic"))
    reattached = life.where((F.col("event") == "link-attached") & (F.col("role") == "subscriber")).select(
        "router", "epoch", "seq", "ts", _key(F.col("container"), F.col("name")).alias("subscriber"),
        F.lit("re-attached").alias("kind"), F.col("address").alias("topic"))
    return ends_by_detach.unionByName(expired).unionByName(reattached)


def _durability(life: DataFrame) -> DataFrame:
    """(router, epoch, subscriber, attach_seq, durable): every subscriber attach."""
    return life.where((F.col("event") == "link-attached") & (F.col("role") == "subscriber")).select(
        "router", "epoch", _key(F.col("container"), F.col("name")).alias("subscriber"),
        F.col("seq").alias("attach_seq"), F.coalesce(F.col("durable"), F.lit(0)).alias("durable"))


# ---------------------------------------------------------------------------
# A delivery's life: every event about it, on every router, in one row
# ---------------------------------------------------------------------------

_LIFE_FIELDS = ("event", "router", "epoch", "seq", "ts", "subscriber", "outcome", "owed", "forwarded", "routers",
                "origin_router", "from_router", "deleted", "by", "settled", "topic", "subscribers")


def lives(t: Tables) -> DataFrame:
    """One row per delivery id: ``ev``, the array of every event about it (on every
    router, every epoch). ``keyed`` is partitioned by delivery, so this needs no
    shuffle; the proofs below read a delivery's story with higher-order functions
    on ``ev`` instead of joining a dozen tables."""
    if t.per_delivery is not None:
        return t.per_delivery
    return t.keyed.groupBy("delivery").agg(F.collect_list(F.struct(*_LIFE_FIELDS)).alias("ev"))


def _kind(e: Column, *kinds: str) -> Column:
    return e["event"].isin(*kinds)


def _here(e: Column, router: Column, epoch: Column) -> Column:
    return (e["router"] == router) & (e["epoch"] == epoch)


def _recv_rows(ev: Column) -> Column:
    return F.filter(ev, lambda e: _kind(e, "received") & ~F.coalesce(e["settled"], F.lit(False)))


def _answer_of(ev: Column, router: Column, epoch: Column) -> Column:
    """The first answer (pub-outcome / outcome-to-router) on ``router``'s ``epoch``:
    a struct (seq, outcome), or null."""
    answers = F.filter(ev, lambda e: _kind(e, *ANSWER_KINDS) & _here(e, router, epoch))
    return F.array_min(F.transform(answers, lambda e: F.struct(e["seq"].alias("seq"),
                                                               e["outcome"].alias("outcome"))))


# ---------------------------------------------------------------------------
# No loss
# ---------------------------------------------------------------------------

def _accepted(life: DataFrame) -> DataFrame:
    """Deliveries whose publisher was told accepted, with when (first time)."""
    told = lambda e: _kind(e, "pub-outcome") & (e["outcome"] == "accepted")  # noqa: E731
    return life.where(F.exists("ev", told)).withColumn(
        "accepted_ts", F.array_min(F.transform(F.filter("ev", told), lambda e: e["ts"])))


def no_loss(t: Tables, life: DataFrame | None = None) -> DataFrame:
    """Every delivery whose publisher was told accepted was accepted by every
    subscriber owed it, on every router it reached, and reached every router it was
    owed to (following ``routers`` from the origin and ``owed`` on each router)."""
    accepted = _accepted(life if life is not None else lives(t))
    return _lost_at_subscribers(t, accepted).unionByName(_lost_at_routers(t, accepted))


def _lost_at_subscribers(t: Tables, accepted: DataFrame) -> DataFrame:
    # Accepted anywhere counts: a subscriber that failed over answers on another router.
    # An owed-state-discarded ends an obligation that moved (failover).
    acc_subs = F.transform(F.filter("ev", lambda e: _kind(e, "sub-outcome") & (e["outcome"] == "accepted")),
                           lambda e: e["subscriber"])
    discarded = F.transform(F.filter("ev", lambda e: _kind(e, DISCARDED_KIND)), lambda e: e["subscriber"])
    moved = F.flatten(F.transform(F.filter("ev", lambda e: _kind(e, MOVED_KIND)),
                                  lambda e: F.coalesce(e["subscribers"], F.array().cast("array<string>"))))
    accepted = accepted.select("delivery", "ev", F.array_union(acc_subs, discarded).alias("done"),
                               moved.alias("moved"))
    owed = accepted.select("delivery", "ev", "done", "moved", F.explode(_recv_rows(F.col("ev"))).alias("r"))
    pending = owed.select("delivery", "ev", "done", "moved", F.col("r.router").alias("router"),
                          F.col("r.epoch").alias("epoch"), F.col("r.seq").alias("recv_seq"),
                          F.col("r.ts").alias("recv_ts"), F.col("r.topic").alias("topic"),
                          F.explode("r.owed").alias("subscriber")) \
        .where(~F.array_contains("done", F.col("subscriber")))
    router, epoch, sub = F.col("router"), F.col("epoch"), F.col("subscriber")
    said = F.filter("ev", lambda e: _kind(e, "sub-outcome", "expired") & _here(e, router, epoch)
                    & (e["subscriber"] == sub))
    sends = F.filter("ev", lambda e: _here(e, router, epoch) & (
        (_kind(e, "received") & F.array_contains(F.coalesce(e["forwarded"], F.array().cast("array<string>")), sub))
        | (_kind(e, "forwarded") & (e["subscriber"] == sub))))
    answer = _answer_of(F.col("ev"), router, epoch)
    pending = pending.select(
        "delivery", "router", "epoch", "recv_seq", "recv_ts", "topic", "subscriber",
        F.array_contains("moved", F.col("subscriber")).alias("obligation_moved"),
        answer["seq"].alias("answer_seq"), answer["outcome"].alias("answer"),
        F.array_join(F.array_distinct(F.transform(said, lambda e: F.when(_kind(e, "expired"), F.lit("expired"))
                                                  .otherwise(e["outcome"]))), ",").alias("said"),
        F.array_min(F.transform(sends, lambda e: e["seq"])).alias("sent_seq"))
    # Excused: the subscription ended after the delivery arrived and before this
    # router answered for it (a subscriber that leaves after the answer was counted
    # in it; one that left before its arrival was not owed it).
    ends = F.broadcast(t.sub_ends.select("router", "epoch", "subscriber", F.col("seq").alias("end_seq"),
                                         F.col("kind").alias("end_kind"), F.col("topic").alias("end_topic")))
    ended = pending.join(ends, ["router", "epoch", "subscriber"]) \
        .where((F.col("end_seq") > F.col("recv_seq"))
               & (F.col("answer_seq").isNull() | (F.col("end_seq") < F.col("answer_seq")))
               & ((F.col("end_kind") != "re-attached") | (F.col("end_topic") != F.col("topic")))) \
        .select("delivery", "router", "epoch", "subscriber").distinct()
    pending = pending.join(ended, ["delivery", "router", "epoch", "subscriber"], "left_anti")
    # Excused: a non-durable subscriber of a router that died before answering (its
    # link died with the process; nobody could be told anything).
    dur = F.broadcast(t.durability)
    with_dur = pending.select("delivery", "router", "epoch", "subscriber", "recv_seq") \
        .join(dur, ["router", "epoch", "subscriber"]) \
        .where(F.col("attach_seq") < F.col("recv_seq")) \
        .groupBy("delivery", "router", "epoch", "subscriber").agg(F.max_by("durable", "attach_seq").alias("durable"))
    died = F.broadcast(t.epochs.where(~F.col("stopped")).select("router", "epoch", F.lit(True).alias("died")))
    # A durable one's obligation survives only if it moved (owed-moved): it is then
    # judged below as a moved obligation.
    rows = pending.join(with_dur, ["delivery", "router", "epoch", "subscriber"], "left") \
        .join(died, ["router", "epoch"], "left") \
        .where(~(F.col("answer_seq").isNull() & F.coalesce(F.col("died"), F.lit(False))
                 & (F.coalesce(F.col("durable"), F.lit(1)) == 0))) \
        .where(~F.col("obligation_moved"))
    detail = F.concat(
        F.lit("publisher told accepted, but subscriber "), F.col("subscriber"), F.lit(" on router "),
        F.col("router"), F.lit(" "),
        F.when(F.col("said") != "", F.concat(F.lit("answered "), F.col("said")))
        .when(F.col("sent_seq").isNotNull(),
              F.concat(F.lit("was sent it (seq "), F.col("sent_seq").cast("string"), F.lit(") and never answered")))
        .otherwise(F.lit("was owed it and never sent it")),
        F.when(F.col("answer_seq").isNull(), F.lit("; the router never answered for it"))
        .otherwise(F.concat(F.lit("; the router answered "), F.coalesce(F.col("answer"), F.lit("?")),
                            F.lit(" at seq "), F.col("answer_seq").cast("string"))))
    local = _violations(rows, "lost", F.col("delivery"), delivery="delivery", router="router",
                        subscriber="subscriber", detail=detail, ts="recv_ts", epoch="epoch", seq="recv_seq")
    # Moved obligations: accepted anywhere, or discarded, or lost.
    moves = accepted.select("delivery", "done", F.explode(F.filter("ev", lambda e: _kind(e, MOVED_KIND))).alias("m"))
    moves = moves.select("delivery", "done", F.col("m.router").alias("router"), F.col("m.epoch").alias("epoch"),
                         F.col("m.seq").alias("seq"), F.col("m.ts").alias("ts"),
                         F.col("m.from_router").alias("from_router"),
                         F.explode(F.coalesce(F.col("m.subscribers"), F.array().cast("array<string>")))
                         .alias("subscriber")) \
        .where(~F.array_contains("done", F.col("subscriber"))) \
        .dropDuplicates(["delivery", "subscriber"])
    moved_rows = _violations(
        moves, "lost", F.col("delivery"), delivery="delivery", router="router", subscriber="subscriber",
        ts="ts", epoch="epoch", seq="seq",
        detail=F.concat(F.lit("publisher told accepted, but durable subscriber "), F.col("subscriber"),
                        F.lit(" (moved from router "), F.coalesce(F.col("from_router"), F.lit("?")),
                        F.lit(", owed wherever it re-attached) never accepted it anywhere, and its obligation "
                              "was never discarded")))
    return local.unionByName(moved_rows)


def _lost_at_routers(t: Tables, accepted: DataFrame) -> DataFrame:
    origins = F.filter(_recv_rows(F.col("ev")), lambda e: e["origin_router"].isNull())
    rows = accepted.select("delivery", "ev", "accepted_ts", F.explode(origins).alias("o"))
    rows = rows.select("delivery", "ev", "accepted_ts", F.col("o.router").alias("origin"),
                       F.col("o.epoch").alias("epoch"), F.col("o.seq").alias("recv_seq"),
                       F.col("o.ts").alias("recv_ts"), F.col("o.topic").alias("topic"),
                       F.explode(F.coalesce(F.col("o.routers"), F.array().cast("array<string>"))).alias("router"))
    router, origin = F.col("router"), F.col("origin")
    reached = F.exists("ev", lambda e: _kind(e, "received") & (e["router"] == router))
    told = F.array_distinct(F.transform(
        F.filter("ev", lambda e: _kind(e, "outcome-from-router") & (e["router"] == origin)
                 & (e["from_router"] == router)), lambda e: e["outcome"]))
    answer = _answer_of(F.col("ev"), origin, F.col("epoch"))
    # A router that died took the obligation with it only as far as its durable
    # subscribers' obligations moved (owed-moved from_router = it): judged above.
    moved_from = F.exists("ev", lambda e: _kind(e, MOVED_KIND) & (e["from_router"] == router))
    pending = rows.where(~reached & ~moved_from).select(
        "delivery", "origin", "epoch", "recv_seq", "recv_ts", "accepted_ts", "topic", "router",
        F.when(F.size(told) > 0, F.array_join(F.array_sort(told), ",")).alias("told"),
        answer["seq"].alias("answer_seq")) \
        .where(F.col("told").isNull() | (F.col("told") != "none"))  # "none": nobody there was owed it
    # Excused: the origin logged that router unreachable between receiving the
    # delivery and answering its publisher (it stopped waiting for it).
    routes = F.broadcast(t.routes.select(F.col("router").alias("origin"), "epoch", F.col("seq").alias("r_seq"),
                                         "reachable"))
    unreachable = pending.where(F.col("told").isNull()).join(routes, ["origin", "epoch"]) \
        .where((F.col("r_seq") > F.col("recv_seq"))
               & (F.col("answer_seq").isNull() | (F.col("r_seq") < F.col("answer_seq")))
               & ~F.array_contains(F.coalesce(F.col("reachable"), F.array().cast("array<string>")),
                                   F.col("router"))) \
        .select("delivery", "router").distinct()
    pending = pending.join(unreachable, ["delivery", "router"], "left_anti")
    # Excused: that router lost interest in the topic while the delivery was on its
    # way (a subscription of the topic ended there, or the router stopped or died):
    # the origin learns that from membership announcements, which it does not log.
    # Placed in time by ts, within CLOCK_SLACK.
    ends = t.sub_ends.where(F.col("kind") != "re-attached").select("router", "ts", "topic")
    stops = t.epochs.select("router", F.coalesce(F.col("stopping_ts"), F.col("last_ts")).alias("ts"),
                            F.lit(None).cast("string").alias("topic"))
    lost_interest = F.broadcast(ends.unionByName(stops).withColumnRenamed("ts", "end_ts")
                                .withColumnRenamed("topic", "end_topic"))
    excused = pending.where(F.col("told").isNull()).join(lost_interest, "router") \
        .where((F.col("end_topic").isNull() | (F.col("end_topic") == F.col("topic")))
               & (F.col("end_ts") >= F.col("recv_ts") - CLOCK_SLACK)
               & (F.col("end_ts") <= F.col("accepted_ts") + CLOCK_SLACK)) \
        .select("delivery", "router").distinct()
    pending = pending.join(excused, ["delivery", "router"], "left_anti")
    detail = F.concat(F.lit("publisher told accepted by "), F.col("origin"), F.lit(", but router "),
                      F.col("router"), F.lit(" (owed it: in routers) "),
                      F.when(F.col("told").isNotNull(),
                             F.concat(F.lit("answered "), F.col("told"), F.lit(" without logging its arrival")))
                      .otherwise(F.lit("never received it and never answered")))
    return _violations(pending, "lost", F.col("delivery"), delivery="delivery", router="router",
                       detail=detail, ts="recv_ts", epoch="epoch", seq="recv_seq")


# ---------------------------------------------------------------------------
# No duplicates
# ---------------------------------------------------------------------------

def no_duplicates(t: Tables) -> DataFrame:
    """No subscriber accepted one publisher delivery twice: neither the same
    delivery id twice (on one router or two), nor two delivery ids that are one
    publisher delivery (same publisher, link, incarnation, tag and reuse suffix)."""
    # A resuming subscriber reports what it had accepted (docs/resumption.md): the
    # router logs that as a sub-outcome between the link's attach and its
    # resume-requested. It is the same acceptance again, not a second hand-over.
    attach = t.life.where((F.col("event") == "link-attached") & (F.col("role") == "subscriber")).select(
        "router", "epoch", "link", F.col("seq").alias("a_seq"), _key(F.col("container"), F.col("name"))
        .alias("subscriber"))
    resumed = t.life.where((F.col("event") == "resume-requested") & (F.col("role") == "subscriber")).select(
        "router", "epoch", "link", F.col("seq").alias("r_seq"))
    windows = F.broadcast(attach.join(resumed, ["router", "epoch", "link"])
                          .where(F.col("r_seq") > F.col("a_seq")).drop("link"))
    reports = t.accepts.join(windows, ["router", "epoch", "subscriber"]) \
        .where((F.col("seq") > F.col("a_seq")) & (F.col("seq") < F.col("r_seq"))) \
        .select("delivery", "router", "epoch", "seq")
    fresh = t.accepts.join(reports, ["delivery", "router", "epoch", "seq"], "left_anti")
    same_id = fresh.groupBy("delivery", "subscriber").agg(
        F.count(F.lit(1)).alias("n"), F.min("ts").alias("ts"), F.min("epoch").alias("epoch"),
        F.min("seq").alias("seq"), F.array_join(F.array_sort(F.collect_list("router")), ",").alias("where"),
        F.min("router").alias("router")).where(F.col("n") > 1)
    rows1 = _violations(
        same_id, "duplicated", F.concat_ws("|", "subscriber", "delivery"), delivery="delivery", router="router",
        subscriber="subscriber", ts="ts", epoch="epoch", seq="seq",
        detail=F.concat(F.lit("accepted "), F.col("n").cast("string"), F.lit(" times (routers "), F.col("where"),
                        F.lit(")")))
    by_pub = t.accepts.join(t.ident.select("delivery", "pub_id"), "delivery") \
        .groupBy("subscriber", "pub_id").agg(
            F.count_distinct("delivery").alias("n"), F.array_sort(F.collect_set("delivery")).alias("ids"),
            F.min("ts").alias("ts"), F.min("router").alias("router")).where(F.col("n") > 1)
    rows2 = _violations(
        by_pub, "duplicated", F.concat_ws("|", "subscriber", "pub_id"), delivery=F.try_element_at("ids", F.lit(1)),
        router="router", subscriber="subscriber", ts="ts",
        detail=F.concat(F.lit("one publisher delivery ("), F.col("pub_id"), F.lit(") accepted under "),
                        F.col("n").cast("string"), F.lit(" delivery ids: "), F.array_join("ids", ", ")))
    return rows1.unionByName(rows2)


# ---------------------------------------------------------------------------
# Publisher order
# ---------------------------------------------------------------------------

def _order_violations(first_seen: DataFrame, partition: list[str], order: list[str]) -> DataFrame:
    """``first_seen``: one row per (partition..., pub_id) with stream_seq and the
    order columns. A row whose stream_seq is below the highest one seen before it
    (in ``order``) in the same partition is out of publisher order."""
    w = Window.partitionBy(*partition).orderBy(*order).rowsBetween(Window.unboundedPreceding, -1)
    before = first_seen.withColumn("prev", F.max(F.struct("stream_seq", "delivery")).over(w))
    return before.where(F.col("prev").isNotNull() & (F.col("stream_seq") < F.col("prev.stream_seq")))


def publisher_order(t: Tables) -> DataFrame:
    """Per router, subscriber and publisher stream, the deliveries were sent to the
    subscriber in stream_seq order. A delivery counts at its first send (a resend
    after a re-attach repeats an earlier one); one publisher delivery under two
    ids counts once (that is a duplicate, reported as such)."""
    first = t.sends.groupBy("router", "subscriber", "delivery").agg(
        F.min(F.struct("epoch", "seq", "ts")).alias("at"))
    first = first.join(t.ident.select("delivery", "stream", "pub_id", "stream_seq"), "delivery") \
        .groupBy("router", "subscriber", "stream", "pub_id").agg(
            F.min(F.struct("at", "delivery", "stream_seq")).alias("m")) \
        .select("router", "subscriber", "stream", "m.delivery", "m.stream_seq",
                F.col("m.at.epoch").alias("epoch"), F.col("m.at.seq").alias("seq"), F.col("m.at.ts").alias("ts"))
    bad = _order_violations(first, ["router", "subscriber", "stream"], ["epoch", "seq"])
    detail = F.concat(F.lit("sent to "), F.col("subscriber"), F.lit(" on router "), F.col("router"),
                      F.lit(": stream_seq "), F.col("stream_seq").cast("string"), F.lit(" after stream_seq "),
                      F.col("prev.stream_seq").cast("string"), F.lit(" ("), F.col("prev.delivery"),
                      F.lit(") of stream "), F.col("stream"))
    return _violations(bad, "out-of-order", F.concat_ws("|", "router", "subscriber", "delivery"),
                       delivery="delivery", router="router", subscriber="subscriber", detail=detail, ts="ts",
                       epoch="epoch", seq="seq")


# ---------------------------------------------------------------------------
# Nothing invented
# ---------------------------------------------------------------------------

def nothing_invented(t: Tables, life: DataFrame | None = None) -> DataFrame:
    """Every event about a delivery names one that some router received."""
    life = life if life is not None else lives(t)
    refs = life.where(~F.exists("ev", lambda e: _kind(e, "received"))) \
        .select("delivery", F.explode(F.filter("ev", lambda e: _kind(e, *REFERENCING_KINDS))).alias("e")) \
        .select("delivery", "e.*")
    detail = F.concat(F.col("event"), F.lit(" on router "), F.col("router"),
                      F.when(F.col("subscriber").isNotNull(), F.concat(F.lit(" for "), F.col("subscriber")))
                      .otherwise(F.lit("")),
                      F.when(F.col("outcome").isNotNull(), F.concat(F.lit(" ("), F.col("outcome"), F.lit(")")))
                      .otherwise(F.lit("")),
                      F.lit(", but no router received this delivery"))
    return _violations(refs, "invented", F.col("delivery"), delivery="delivery", router="router",
                       subscriber="subscriber", detail=detail, ts="ts", epoch="epoch", seq="seq")


# ---------------------------------------------------------------------------
# Clean end
# ---------------------------------------------------------------------------

def unfinished_records(t: Tables, life: DataFrame | None = None) -> DataFrame:
    """Every non-pre-settled ``received`` whose record was not deleted in the same
    router epoch (``settled`` with deleted=true, or ``record-deleted``), with why
    and whether the router's epoch ended in an orderly stop (``stopped``)."""
    life = life if life is not None else lives(t)
    rows = life.select("delivery", "ev", F.explode(_recv_rows(F.col("ev"))).alias("r")) \
        .select("delivery", "ev", F.col("r.router").alias("router"), F.col("r.epoch").alias("epoch"),
                F.col("r.seq").alias("seq"), F.col("r.ts").alias("ts"), F.col("r.owed").alias("owed"),
                F.col("r.origin_router").alias("origin_router"))
    router, epoch = F.col("router"), F.col("epoch")
    closed = F.exists("ev", lambda e: _here(e, router, epoch) & (
        (_kind(e, "settled") & F.coalesce(e["deleted"], F.lit(False))) | _kind(e, "record-deleted")))
    settled_by = F.filter("ev", lambda e: _here(e, router, epoch) & _kind(e, "settled"))
    answered = F.transform(F.filter("ev", lambda e: _here(e, router, epoch) & _kind(e, "sub-outcome", "expired")),
                           lambda e: e["subscriber"])
    answer = _answer_of(F.col("ev"), router, epoch)
    left = rows.where(~closed).select(
        "delivery", "router", "epoch", "seq", "ts", "origin_router",
        F.try_element_at(F.transform(settled_by, lambda e: e["by"]), F.lit(1)).alias("settled_by"),
        answer["seq"].alias("answer_seq"), answer["outcome"].alias("answer"),
        F.array_except(F.coalesce(F.col("owed"), F.array().cast("array<string>")), answered).alias("waiting")) \
        .dropDuplicates(["delivery", "router", "epoch"]) \
        .join(F.broadcast(t.epochs.select("router", "epoch", "stopped")), ["router", "epoch"], "left")
    why = F.when(F.col("settled_by").isNotNull(),
                 F.concat(F.lit("settled by "), F.col("settled_by"),
                          F.lit(", but the record was never deleted (receivers not known to have seen the "
                                "settlement)"))) \
        .when(F.col("answer_seq").isNotNull(),
              F.concat(F.lit("answered "), F.coalesce(F.col("answer"), F.lit("?")),
                       F.when(F.col("origin_router").isNull(), F.lit("; the publisher never settled it"))
                       .otherwise(F.concat(F.lit("; origin router "), F.col("origin_router"),
                                           F.lit(" never relayed a settlement"))))) \
        .otherwise(F.concat(F.lit("never answered: waiting for "),
                            F.when(F.size("waiting") > 0, F.array_join("waiting", ", "))
                            .otherwise(F.lit("remote routers"))))
    return left.withColumn("why", why).withColumn("stopped", F.coalesce(F.col("stopped"), F.lit(False)))


def clean_end(t: Tables, life: DataFrame | None = None) -> DataFrame:
    """Records left on routers that stopped in order (a router that died took its
    records with it: those are counted in the summary, and what they owed is
    judged by the loss proof)."""
    left = unfinished_records(t, life).where(F.col("stopped"))
    return _violations(left, "left-unsettled", F.concat_ws("|", "router", "delivery"), delivery="delivery",
                       router="router", detail=F.concat(F.lit("record left on router "), F.col("router"),
                                                        F.lit(": "), F.col("why")),
                       ts="ts", epoch="epoch", seq="seq")


# ---------------------------------------------------------------------------
# The input itself
# ---------------------------------------------------------------------------

def input_complete(t: Tables) -> DataFrame:
    """Every router the deliveries name has a log here, and every epoch's log is
    whole: seq runs from 1 with no gap (a gap is a file lost to retention or
    deleted; a torn tail after a crash is not a gap)."""
    spark = t.keyed.sparkSession
    present = t.epochs.select("router").distinct()
    named = t.keyed.select(F.explode(F.array_compact(F.array(
        "origin_router", "to_router", "from_router"))).alias("router")) \
        .unionByName(t.keyed.where(F.col("event") == "received").select(F.explode("routers").alias("router"))) \
        .distinct()
    missing = named.join(present, "router", "left_anti")
    rows1 = _violations(missing, "incomplete-input", F.concat(F.lit("missing|"), F.col("router")),
                        router="router", detail=F.concat(F.lit("no log of router "), F.col("router"),
                                                         F.lit(", which other routers name (pass its data "
                                                               "directory too)")))
    gaps = t.epochs.where((F.col("first_seq") != 1) | (F.col("lines") != F.col("last_seq")))
    rows2 = _violations(
        gaps, "incomplete-input", F.concat_ws("|", F.lit("gap"), "router", "epoch"), router="router",
        epoch="epoch", seq="first_seq", ts="first_ts",
        detail=F.concat(F.lit("router "), F.col("router"), F.lit(" epoch "), F.col("epoch").cast("string"),
                        F.lit(": "), F.col("lines").cast("string"), F.lit(" lines for seq "),
                        F.col("first_seq").cast("string"), F.lit(".."), F.col("last_seq").cast("string"),
                        F.lit(" (a log file is missing, or lines are repeated)")))
    del spark
    return rows1.unionByName(rows2)


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
        .select("key", "delivery", "ts", "line", "file")
    clients = delivered.select(F.col("key").alias("subscriber")).distinct()
    got = delivered.groupBy(F.col("key").alias("subscriber"), "delivery").agg(
        F.count(F.lit(1)).alias("n"), F.min("ts").alias("ts"))
    router_acc = t.accepts.groupBy("delivery", "subscriber").agg(F.min("router").alias("router"),
                                                                 F.min("ts").alias("acc_ts"))
    # Only subscribers that keep a ledger, and only deliveries some router received
    # (an accept of an invented one is reported as invented).
    router_acc = router_acc.join(F.broadcast(clients), "subscriber", "left_semi") \
        .join(t.ident.select("delivery"), "delivery", "left_semi")
    both = router_acc.join(got, ["delivery", "subscriber"], "full_outer")
    never_got = both.where(F.col("acc_ts").isNotNull() & F.col("n").isNull())
    twice = both.where(F.col("n") > 1)
    rows = [
        _violations(never_got, "ledger", F.concat_ws("|", F.lit("missing"), "subscriber", "delivery"),
                    delivery="delivery", router="router", subscriber="subscriber", ts="acc_ts",
                    detail=F.concat(F.col("subscriber"), F.lit(" accepted it on router "), F.col("router"),
                                    F.lit(", but its application's ledger never got it"))),
        _violations(twice, "ledger", F.concat_ws("|", F.lit("twice"), "subscriber", "delivery"),
                    delivery="delivery", router="router", subscriber="subscriber", ts="ts",
                    detail=F.concat(F.lit("handed to the application of "), F.col("subscriber"), F.lit(" "),
                                    F.col("n").cast("string"), F.lit(" times"))),
    ]
    sent = t.sends.select("delivery", "subscriber").distinct()
    unsent = got.join(sent, ["delivery", "subscriber"], "left_anti")
    rows.append(_violations(unsent, "ledger", F.concat_ws("|", F.lit("unsent"), "subscriber", "delivery"),
                            delivery="delivery", subscriber="subscriber", ts="ts",
                            detail=F.concat(F.lit("the application of "), F.col("subscriber"),
                                            F.lit(" was handed a delivery no router logged sending it"))))
    by_pub = got.join(t.ident.select("delivery", "pub_id"), "delivery").groupBy("subscriber", "pub_id").agg(
        F.count_distinct("delivery").alias("n"), F.array_sort(F.collect_set("delivery")).alias("ids"),
        F.min("ts").alias("ts")).where(F.col("n") > 1)
    rows.append(_violations(by_pub, "ledger", F.concat_ws("|", F.lit("dup"), "subscriber", "pub_id"),
                            delivery=F.try_element_at("ids", F.lit(1)), subscriber="subscriber", ts="ts",
                            detail=F.concat(F.lit("the application of "), F.col("subscriber"),
                                            F.lit(" was handed one publisher delivery under "),
                                            F.col("n").cast("string"), F.lit(" ids: "), F.array_join("ids", ", "))))
    # Application order, per subscriber link and publisher stream (the first time
    # each publisher delivery was handed over), in the ledger's line order.
    first = delivered.join(t.ident.select("delivery", "stream", "pub_id", "stream_seq"), "delivery") \
        .groupBy(F.col("key").alias("subscriber"), "file", "stream", "pub_id").agg(
            F.min(F.struct("line", "delivery", "stream_seq", "ts")).alias("m")) \
        .select("subscriber", "file", "stream", "m.line", "m.delivery", "m.stream_seq", "m.ts")
    bad = _order_violations(first, ["subscriber", "file", "stream"], ["line"])
    rows.append(_violations(bad, "ledger", F.concat_ws("|", F.lit("order"), "subscriber", "delivery"),
                            delivery="delivery", subscriber="subscriber", ts="ts",
                            detail=F.concat(F.lit("the application of "), F.col("subscriber"),
                                            F.lit(" was handed stream_seq "), F.col("stream_seq").cast("string"),
                                            F.lit(" after "), F.col("prev.stream_seq").cast("string"),
                                            F.lit(" of stream "), F.col("stream"))))
    rows.append(_publisher_ledger(t, L))
    out = rows[0]
    for frame in rows[1:]:
        out = out.unionByName(frame)
    return out


def _publisher_ledger(t: Tables, L: DataFrame) -> DataFrame:
    # The application's last outcome line per delivery (a resent copy's outcome may
    # be logged again after a crash: the last one is what the application was given).
    told = L.where((F.col("role") == "publisher") & (F.col("event") == "outcome")) \
        .groupBy("client", "link", "incarnation", "pub_tag").agg(
            F.max_by("outcome", "line").alias("app_outcome"), F.max("ts").alias("app_ts")) \
        .select(F.col("client").alias("publisher"), F.col("link").alias("link_name"),
                F.col("incarnation").alias("l_inc"), "pub_tag", "app_outcome", "app_ts")
    pubs = L.where(F.col("role") == "publisher").select(F.col("client").alias("publisher"),
                                                      F.col("link").alias("link_name")).distinct()
    router = t.keyed.where(F.col("event") == "pub-outcome").groupBy("delivery").agg(
        F.max(F.col("outcome") == "accepted").alias("accepted"),
        F.array_join(F.array_sort(F.collect_set("outcome")), ",").alias("outcome"), F.min("ts").alias("ts"),
        F.min("router").alias("router")) \
        .join(t.ident.where(F.col("from_publisher")).select("delivery", "publisher", "link_name", "incarnation",
                                                            "pub_tag"), "delivery") \
        .join(F.broadcast(pubs), ["publisher", "link_name"], "left_semi")
    # Match on (client, link, incarnation, pub_tag); a ledger without the
    # incarnation matches on (client, link, pub_tag).
    cond = ((F.col("r.publisher") == F.col("l.publisher")) & (F.col("r.link_name") == F.col("l.link_name"))
            & (F.col("r.pub_tag") == F.col("l.pub_tag"))
            & (F.col("l.l_inc").isNull() | (F.col("l.l_inc") == F.col("r.incarnation"))))
    matched = router.alias("r").join(told.alias("l"), cond, "full_outer").select(
        F.coalesce("r.publisher", "l.publisher").alias("publisher"),
        F.coalesce("r.link_name", "l.link_name").alias("link_name"),
        F.coalesce("r.pub_tag", "l.pub_tag").alias("pub_tag"), "r.delivery", "r.router", "r.outcome",
        "r.accepted", "r.ts", "l.app_outcome", "l.app_ts")
    app_accepted = F.coalesce(F.col("app_outcome") == "accepted", F.lit(False))
    router_accepted = F.coalesce(F.col("accepted"), F.lit(False))
    bad = matched.where(app_accepted != router_accepted)
    detail = F.concat(F.lit("publisher "), F.col("publisher"), F.lit("/"), F.col("link_name"), F.lit(" tag "),
                      F.col("pub_tag"), F.lit(": routers said "), F.coalesce(F.col("outcome"), F.lit("nothing")),
                      F.lit(", the application's ledger says "), F.coalesce(F.col("app_outcome"), F.lit("nothing")))
    return _violations(bad, "ledger", F.concat_ws("|", F.lit("pub"), "publisher", "link_name", "pub_tag",
                                                  F.coalesce("delivery", F.lit(""))),
                       delivery="delivery", router="router", detail=detail,
                       ts=F.coalesce(F.col("ts"), F.col("app_ts")))


# ---------------------------------------------------------------------------
# Everything
# ---------------------------------------------------------------------------

def all_violations(t: Tables, ledgers: DataFrame | None = None) -> DataFrame:
    life = lives(t)
    frames = [no_loss(t, life), no_duplicates(t), publisher_order(t), nothing_invented(t, life),
              clean_end(t, life), input_complete(t)]
    if ledgers is not None:
        frames.append(ledger_checks(t, ledgers))
    out = frames[0]
    for frame in frames[1:]:
        out = out.unionByName(frame)
    return out


def main(argv: list[str] | None = None) -> int:
    """``spark-submit spark/reconcile.py LOGDIR... [options]``: the master comes from
    spark-submit (use ``eorouter reconcile`` for a local run)."""
    from spark.cli import reconcile_main
    return reconcile_main(argv, default_master=None)


if __name__ == "__main__":
    raise SystemExit(main())
