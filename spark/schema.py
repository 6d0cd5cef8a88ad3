"""Explicit Spark schemas: the routers' event log and the applications' ledgers.

The event log's schema is defined once, in ``router.eventschema``; this
module only maps ``spark_schema_fields()`` one to one onto a ``StructType``, all
fields nullable. Nothing here infers a schema: inference reads the data twice
and guesses (a column that happens to be all-null becomes a string, an integer
ts a long), and the job's joins would silently break on a guess.
"""

from __future__ import annotations

from pyspark.sql import types as T

from router.eventschema import spark_schema_fields

#: Column that receives the text of a line Spark could not read whole (unparsable,
#: or a field of the wrong type). Not part of the writer's schema: the proof judges
#: those lines (spark/reconcile.py, ``validate``).
CORRUPT = "_corrupt_record"
#: Column that says which file a line came from.
FILE = "_file"

_TYPES = {
    "string": T.StringType(),
    "long": T.LongType(),
    "double": T.DoubleType(),
    "boolean": T.BooleanType(),
    "array<string>": T.ArrayType(T.StringType(), containsNull=True),
}


def spark_type(name: str) -> T.DataType:
    """The Spark type for one of the writer's type names."""
    try:
        return _TYPES[name]
    except KeyError:
        raise ValueError(f"unknown event-log type {name!r}") from None


def event_schema(*, corrupt_column: bool = False) -> T.StructType:
    """The event log as a StructType: the union of every kind's fields, in the
    writer's order (common fields first), every field nullable."""
    fields = [T.StructField(name, spark_type(type_), True) for name, type_ in spark_schema_fields()]
    if corrupt_column:
        fields.append(T.StructField(CORRUPT, T.StringType(), True))
    return T.StructType(fields)


#: The applications' ledgers (docs/ledger.md; written by router.client and the
#: interop clients): the fields the reconciliation reads. Other fields (those of
#: `resumed` and `failover` lines) are ignored.
LEDGER_FIELDS: list[tuple[str, str]] = [
    ("ts", "double"),  # unix seconds
    ("client", "string"),  # the application's AMQP container-id
    ("link", "string"),  # the link name
    ("role", "string"),  # publisher | subscriber
    ("event", "string"),  # sent | outcome | delivered | resumed | failover
    ("topic", "string"),
    ("delivery", "string"),  # hex of the router's delivery tag (subscriber's delivered)
    ("pub_tag", "string"),  # hex of the publisher's own delivery tag
    ("seq", "long"),  # the application's sequence number (not the line order)
    ("outcome", "string"),  # publisher: what the router said; delivered: what the application answered
    ("router", "string"),  # host:port the client was attached to
    ("incarnation", "string"),  # the publisher link's eorouter:incarnation
    ("digest", "string"),  # blake2b-128 of the body
    ("message_id", "string"),
    ("stream_seq", "long"),  # optional
    ("resend", "boolean"),  # a `sent` line of a delivery resent after a resume
    ("condition", "string"),  # a publisher outcome's error condition
]


def ledger_schema(*, corrupt_column: bool = False) -> T.StructType:
    fields = [T.StructField(name, spark_type(type_), True) for name, type_ in LEDGER_FIELDS]
    if corrupt_column:
        fields.append(T.StructField(CORRUPT, T.StringType(), True))
    return T.StructType(fields)
