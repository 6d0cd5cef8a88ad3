"""The event log's schema: what every line of a router's event log may hold.

Defined here and only here, and read by everyone who reads or writes the log: the
writer (router/eventlog.py), the Python reader (``unfold``), the Spark proof
(spark/schema.py builds its explicit schema from ``spark_schema_fields()``;
spark/reconcile.py unfolds with ``FOLDS``) and the synthetic-log generator
(spark/generate.py: ``fold``, the ``Kind`` names). It depends on nothing else of the
router (an import-linter contract in pyproject.toml keeps it so), so the proof can
read it without importing the router's runtime.

``EVENT_SCHEMA``: the fields every line carries; ``EVENTS``: each kind's own fields;
``FOLDS``: the lines that stand for several events; ``validate_event``: one decoded
line against all of it. Full description: docs/event-log.md.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Any

# ---------------------------------------------------------------------------
# The schema. Types are Spark SQL type names so the Spark job can map them
# one to one: string, long, double, boolean, array<string>.
# ---------------------------------------------------------------------------

TYPES = frozenset({"string", "long", "double", "boolean", "array<string>"})

# Fields every line carries, in the order they appear on the line.
EVENT_SCHEMA: dict[str, str] = {
    "seq": "long",  # per-router, per-epoch sequence number, from 1, no gaps
    "ts": "double",  # unix time, seconds (the loop iteration's timestamp)
    "router": "string",  # router id (config router.id)
    "epoch": "long",  # restart counter persisted in data_dir/epoch, from 1
    "boot": "string",  # random per open (16 hex chars): a wiped data_dir never reuses an identity
    "event": "string",  # the event kind, a key of EVENTS
}

# Each kind's own fields. Any of them may be missing or null on a given line.
# "delivery" is always the hex of the router's outgoing (disambiguated) tag: it
# names one publisher delivery across every event about it.
EVENTS: dict[str, dict[str, str]] = {
    "router-started": {"pid": "long", "version": "string"},
    "link-attached": {
        "link": "long",
        "conn": "long",
        "container": "string",
        "name": "string",
        "role": "string",
        "address": "string",
        "durable": "long",
        "incarnation": "string",
        "resumed": "boolean",
    },
    "link-detached": {
        "link": "long",
        "container": "string",
        "name": "string",
        "role": "string",
        "closed": "boolean",
        "reason": "string",
    },
    "subscription-expired": {"container": "string", "name": "string", "address": "string"},
    "received": {
        "delivery": "string",
        "topic": "string",
        "publisher": "string",  # the publisher's container-id
        "link_name": "string",
        "pub_tag": "string",  # hex of the publisher's delivery tag
        "incarnation": "string",
        "stream_seq": "long",
        "size": "long",
        "settled": "boolean",
        "owed": "array<string>",  # subscriber keys "container/link-name"
        "forwarded": "array<string>",  # the owed subscribers it was sent to at once
        "routers": "array<string>",  # the interested remote routers it is owed to (origin router)
        "filtered": "array<string>",  # subscribers here whose selector did not select it: never owed it
        "origin_router": "string",  # set when another router took it from its publisher
        # set when a [[guarantee]] rule relaxed its topic (docs/guarantees.md): "at-most-once"
        # (with settled: relayed pre-settled, owed to nobody, its publisher told accepted on arrival)
        "guarantee": "string",
    },
    "forwarded": {"delivery": "string", "subscriber": "string", "link": "long", "settled": "boolean"},
    "sub-outcome": {"delivery": "string", "subscriber": "string", "outcome": "string", "settled": "boolean"},
    "pub-outcome": {"delivery": "string", "outcome": "string", "condition": "string", "reason": "string"},
    # by: "publisher" or "publisher-gone"; deleted: the record went at once (every
    # receiver already knew), else a "record-deleted" event follows later.
    "settled": {"delivery": "string", "by": "string", "deleted": "boolean"},
    # One line standing for three: a subscriber's outcome that completed the delivery
    # ("sub-outcome": subscriber, outcome, settled), the publisher's outcome it caused
    # ("pub-outcome": pub_outcome, condition, reason) and, when ``by`` is set, the
    # settlement in the same step ("settled": by, deleted), in that order. Readers
    # unfold it (unfold(), read_events(); spark/reconcile.py).
    "completed": {
        "delivery": "string",
        "subscriber": "string",
        "outcome": "string",
        "settled": "boolean",
        "pub_outcome": "string",
        "condition": "string",
        "reason": "string",
        "by": "string",
        "deleted": "boolean",
    },
    # One line standing for consecutive "sub-outcome" events of one subscriber with the
    # same outcome and settled flag, one per delivery in ``deliveries``, in that order
    # (the router writes it for a run of two or more within one loop iteration).
    "sub-outcomes": {"deliveries": "array<string>", "subscriber": "string", "outcome": "string", "settled": "boolean"},
    "record-deleted": {"delivery": "string", "reason": "string"},
    "expired": {"delivery": "string", "subscriber": "string"},
    "router-stopping": {"reason": "string"},
    # Not in the original list; the core emits them (router/core/router.py).
    "tag-collision": {"delivery": "string", "link": "long", "container": "string", "name": "string", "incarnation": "string"},
    "dropped": {"delivery": "string", "reason": "string"},
    # Inter-router connections, written by the adapter (docs/inter-router.md).
    # peer: the neighbour's router id (as it claimed it, for a refusal; null when it
    # never said); conn: the adapter's connection id.
    "peer-connected": {"peer": "string", "conn": "long", "peer_epoch": "long", "peer_boot": "string", "role": "string"},
    "peer-lost": {"peer": "string", "conn": "long", "reason": "string"},
    "peer-refused": {"peer": "string", "conn": "long", "reason": "string"},
    # The router network, written by the core (docs/inter-router.md): a delivery
    # followed across every hop.
    "forwarded-to-router": {"delivery": "string", "to_router": "string", "dests": "array<string>"},
    "outcome-to-router": {"delivery": "string", "to_router": "string", "outcome": "string"},
    "outcome-from-router": {"delivery": "string", "from_router": "string", "outcome": "string"},
    "settlement-relayed": {"delivery": "string", "to_router": "string"},
    "peer-restarted": {"peer": "string", "peer_epoch": "long", "peer_boot": "string"},
    # held: a subscriber that moved here from another router: its attach is answered, its
    # deliveries held until every router confirmed (or the placeholder timeout)
    "announce-timeout": {"subscriber": "string", "routers": "array<string>", "held": "boolean"},
    "order-gap": {"delivery": "string", "missing_seq": "long"},
    # routes changed: the routers reachable now, and "destination>next hop" pairs
    "routes": {"reachable": "array<string>", "next_hops": "array<string>"},
    # Failover (docs/resumption.md): every resumption step, so a replay can account
    # for every delivery across a router's death.
    "resume-requested": {"link": "long", "role": "string", "reported": "long", "known": "long", "incomplete": "boolean"},
    "resend-matched": {"delivery": "string", "link": "long"},
    # A resumed publisher link's numbering: where it continues (after every router
    # said how far it saw the stream numbered), or which routers never said.
    "stream-seq-continued": {"link": "long", "next_seq": "long"},
    # A resumed publisher's resend of a stream this router forgot (resume horizon or
    # memory limit): refused, never delivered as new (docs/resumption.md).
    "resend-beyond-horizon": {"delivery": "string", "stream": "string", "origin_router": "string"},
    # The byte budget (docs/configuration.md, [limits]): a topic's publishers get no
    # more credit ("reached": by the topic's own budget or the router's, ``limit``)
    # or get it again ("below"); bytes: the topic's message bytes held then.
    "budget": {"topic": "string", "state": "string", "bytes": "long", "router_bytes": "long", "limit": "string"},
    # A sweep of the settled-delivery memory forgot ``count`` quiet streams.
    "streams-forgotten": {"count": "long", "remembered": "long"},
    "stream-seq-timeout": {"link": "long", "routers": "array<string>"},
    "origin-taken-over": {"delivery": "string", "from_router": "string", "to_router": "string"},
    "placeholder-created": {"delivery": "string", "subscriber": "string"},
    "placeholder-fulfilled": {"delivery": "string", "subscriber": "string"},
    "placeholder-expired": {"delivery": "string", "subscriber": "string"},
    "placeholder-settled": {"delivery": "string", "subscriber": "string"},
    "owed-moved": {"delivery": "string", "from_router": "string", "subscribers": "array<string>"},
    # reason "filtered": its selector does not select it (where it re-attached); else expired
    "owed-state-discarded": {"delivery": "string", "subscriber": "string", "reason": "string"},
}


class Kind(StrEnum):
    """The event kinds by name, for code that writes them (``Kind.RECEIVED`` is
    ``"received"``): a misspelt kind is an AttributeError, not a line the proof
    calls malformed. Checked equal to ``EVENTS`` at import."""

    ROUTER_STARTED = "router-started"
    LINK_ATTACHED = "link-attached"
    LINK_DETACHED = "link-detached"
    SUBSCRIPTION_EXPIRED = "subscription-expired"
    RECEIVED = "received"
    FORWARDED = "forwarded"
    SUB_OUTCOME = "sub-outcome"
    PUB_OUTCOME = "pub-outcome"
    SETTLED = "settled"
    COMPLETED = "completed"
    SUB_OUTCOMES = "sub-outcomes"
    RECORD_DELETED = "record-deleted"
    EXPIRED = "expired"
    ROUTER_STOPPING = "router-stopping"
    TAG_COLLISION = "tag-collision"
    DROPPED = "dropped"
    PEER_CONNECTED = "peer-connected"
    PEER_LOST = "peer-lost"
    PEER_REFUSED = "peer-refused"
    FORWARDED_TO_ROUTER = "forwarded-to-router"
    OUTCOME_TO_ROUTER = "outcome-to-router"
    OUTCOME_FROM_ROUTER = "outcome-from-router"
    SETTLEMENT_RELAYED = "settlement-relayed"
    PEER_RESTARTED = "peer-restarted"
    ANNOUNCE_TIMEOUT = "announce-timeout"
    ORDER_GAP = "order-gap"
    ROUTES = "routes"
    RESUME_REQUESTED = "resume-requested"
    RESEND_MATCHED = "resend-matched"
    STREAM_SEQ_CONTINUED = "stream-seq-continued"
    RESEND_BEYOND_HORIZON = "resend-beyond-horizon"
    BUDGET = "budget"
    STREAMS_FORGOTTEN = "streams-forgotten"
    STREAM_SEQ_TIMEOUT = "stream-seq-timeout"
    ORIGIN_TAKEN_OVER = "origin-taken-over"
    PLACEHOLDER_CREATED = "placeholder-created"
    PLACEHOLDER_FULFILLED = "placeholder-fulfilled"
    PLACEHOLDER_EXPIRED = "placeholder-expired"
    PLACEHOLDER_SETTLED = "placeholder-settled"
    OWED_MOVED = "owed-moved"
    OWED_STATE_DISCARDED = "owed-state-discarded"


if set(Kind) != set(EVENTS):  # pragma: no cover - a kind added to one and not the other fails at import
    raise ValueError(f"Kind and EVENTS differ: {sorted(set(Kind) ^ set(EVENTS))}")


# Kinds whose line stands for several events (the hot path writes fewer lines), in
# one table every reader and writer of folded lines follows (unfold() here, the
# Spark job's unfold(), the synthetic-log generator's fold()):
#   FOLDS[kind] = (events, fields, optional_last, run_field)
# ``events``: the kinds of the events the line stands for, in order (all at the
# line's ``seq``); ``fields[i]``: event field -> line field, for event i (besides
# the common fields and ``delivery``); ``optional_last``: the last event is there
# only when this line field is set ("completed" settles only when it says by whom);
# ``run_field``: the line lists deliveries in this field, one event (events[0])
# per delivery, in order.
_SUB_OUTCOME_FIELDS = {"subscriber": "subscriber", "outcome": "outcome", "settled": "settled"}
FOLDS: dict[str, tuple[tuple[str, ...], tuple[dict[str, str], ...], str | None, str | None]] = {
    "completed": (
        ("sub-outcome", "pub-outcome", "settled"),
        (
            _SUB_OUTCOME_FIELDS,
            {"outcome": "pub_outcome", "condition": "condition", "reason": "reason"},
            {"by": "by", "deleted": "deleted"},
        ),
        "by",
        None,
    ),
    "sub-outcomes": (("sub-outcome",), (_SUB_OUTCOME_FIELDS,), None, "deliveries"),
}
# kind -> what unfold() makes of it.
FOLDED = {kind: events for kind, (events, _, _, _) in FOLDS.items()}
_COMMON = tuple(EVENT_SCHEMA)


def unfold(record: dict[str, Any]) -> list[dict[str, Any]]:
    """The events one decoded line stands for (``FOLDS``), as the kinds of ``EVENTS``
    that are not folded: a "completed" line gives its "sub-outcome", "pub-outcome"
    and (when ``by`` is set) "settled" event, each with the line's common fields
    (the same ``seq``), in that order; a "sub-outcomes" line gives one "sub-outcome"
    event per delivery of its ``deliveries``, in that order. Any other line is
    returned as it is, alone."""
    fold = FOLDS.get(record.get("event") or "")
    if fold is None:
        return [record]
    events, fields, optional_last, run_field = fold
    common = {name: record[name] for name in _COMMON if name in record}
    if run_field is not None:
        rest = {name: record.get(line) for name, line in fields[0].items()}
        return [{**common, "event": events[0], "delivery": delivery, **rest} for delivery in record.get(run_field) or ()]
    n = len(events) - 1 if optional_last is not None and record.get(optional_last) is None else len(events)
    delivery = record.get("delivery")
    return [
        {**common, "event": events[i], "delivery": delivery, **{name: record.get(line) for name, line in fields[i].items()}}
        for i in range(n)
    ]


def fold(kind: str, parts: list[dict[str, Any]]) -> dict[str, Any]:
    """The inverse of unfold() for the writers that fold (the synthetic-log
    generator): the fields of one ``kind`` line standing for ``parts`` (each event's
    own fields, without the common ones), in FOLDS' order. A field an event does not
    have (or has as None) is left out: readers take a missing field as null."""
    _, fields, _, run_field = FOLDS[kind]
    if run_field is not None:
        first = parts[0]
        return {
            run_field: [p["delivery"] for p in parts],
            **{line: first[name] for name, line in fields[0].items() if first.get(name) is not None},
        }
    out: dict[str, Any] = {"delivery": parts[0]["delivery"]}
    for i, part in enumerate(parts):
        out.update({line: part[name] for name, line in fields[i].items() if part.get(name) is not None})
    return out


def _union_fields() -> list[tuple[str, str]]:
    fields = dict(EVENT_SCHEMA)
    for kind, specific in EVENTS.items():
        for name, type_ in specific.items():
            if type_ not in TYPES:
                raise ValueError(f"event {kind!r}: field {name!r} has unknown type {type_!r}")
            if name in EVENT_SCHEMA:
                raise ValueError(f"event {kind!r}: field {name!r} shadows a common field")
            if fields.setdefault(name, type_) != type_:
                raise ValueError(f"event {kind!r}: field {name!r} is {type_}, elsewhere {fields[name]}")
    return list(fields.items())


_ALL_FIELDS = _union_fields()  # checked at import: a conflicting schema fails loudly


def spark_schema_fields() -> list[tuple[str, str]]:
    """The union of every field of every event kind as ``(name, type)`` pairs: the
    common fields first (in line order), then each kind's fields in ``EVENTS``
    order. The Spark job builds its explicit StructType from this (all nullable)."""
    return list(_ALL_FIELDS)


_CHECKS = {
    "string": lambda v: isinstance(v, str),
    "long": lambda v: isinstance(v, int) and not isinstance(v, bool),
    "double": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
    "boolean": lambda v: isinstance(v, bool),
    "array<string>": lambda v: isinstance(v, list) and all(isinstance(x, str) for x in v),
}


def validate_event(record: dict[str, Any]) -> None:
    """Check one decoded line against the schema; raise ValueError on the first
    problem. For tests and tools, never on the hot path. Common fields are
    required and non-null; a kind's own fields may be missing or null; a field the
    kind does not declare is an error."""
    for name, type_ in EVENT_SCHEMA.items():
        if name not in record or record[name] is None:
            raise ValueError(f"missing common field {name!r} in {record!r}")
        if not _CHECKS[type_](record[name]):
            raise ValueError(f"field {name!r} should be {type_}, found {record[name]!r}")
    kind = record["event"]
    if kind not in EVENTS:
        raise ValueError(f"unknown event kind {kind!r}")
    specific = EVENTS[kind]
    for name, value in record.items():
        if name in EVENT_SCHEMA:
            continue
        if name not in specific:
            raise ValueError(f"event {kind!r} has no field {name!r}")
        if value is not None and not _CHECKS[specific[name]](value):
            raise ValueError(f"event {kind!r}: field {name!r} should be {specific[name]}, found {value!r}")
