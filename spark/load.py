"""Finding and reading the inputs: routers' event logs (JSON lines or Parquet) and
the applications' ledgers, always with an explicit schema; and the SparkSession.

An input is one of:
- a router's data directory (``<data_dir>/events/events-*.jsonl``);
- an ``events/`` directory, or one log file;
- a directory of router data directories (what ``eorouter network`` / the demo leave);
- a Parquet dataset written by ``eorouter logs compact`` (a directory of ``*.parquet``);
- any URI Spark reads (``hdfs://``, ``s3a://``, ``file://``, a glob such as
  ``/logs/*/events`` or ``s3a://b/net/{A,B,C}/events``): passed to Spark as given and
  listed recursively (only ``events-*.jsonl`` files for JSON); ``--format`` (or a
  ``.parquet`` suffix) says which reader.
Local directories are resolved to explicit file lists here (so a missing router
shows up as "no input" rather than as an empty DataFrame).

Every line read keeps the file it came from (``FILE``) and, when Spark could not
read it whole (unparsable, or a field of the wrong type), its text (``CORRUPT``):
the proof judges those lines (spark/reconcile.py, ``validate``), it never drops them.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path

from pyspark.sql import DataFrame, DataFrameReader, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import StructType

from spark.schema import CORRUPT, FILE, event_schema, ledger_schema

_LOG_FILE = re.compile(r"^events-(\d{6,})-(\d{6,})\.jsonl$")
_LOG4J = Path(__file__).with_name("log4j2.properties")
#: HotSpot compiler directives for a large input's JVM (java_options).
JIT_DIRECTIVES = Path(__file__).with_name("jit-directives.json")

#: The writer's fields the proof reads (router/eventschema.py has a few more:
#: pid, version, size, conn, ...). The JSON reader converts only these: a pruned
#: schema is what makes parsing cheap, every field it converts costs.
LINE_FIELDS = (
    "seq",
    "ts",
    "router",
    "epoch",
    "boot",
    "event",
    # a delivery's events
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
    "filtered",  # subscribers whose selector did not select it (issue 20)
    "guarantee",  # a relaxed topic's (issue 20)
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
    # links, peers and routes
    "link",
    "container",
    "name",
    "role",
    "address",
    "durable",
    "closed",
    "resumed",
    "reachable",
    "peer",
    "peer_epoch",
)


class InputError(Exception):
    """The inputs cannot be read (nothing there, mixed formats in one directory, no events, ...)."""


# ---------------------------------------------------------------------------
# The session
# ---------------------------------------------------------------------------

#: Below this many events (estimated) the session is set up for a small input:
#: a few partitions, a smaller heap, and a JVM tuned to start fast.
SMALL_INPUT_EVENTS = 300_000


def java_options(small: bool, quiet: bool = True) -> list[str]:
    """The driver JVM's options: a quiet log, and for a small input a JVM that
    starts fast (C1 only; the class archive of spark/jvm.py when there is one)."""
    from spark import jvm

    # The throughput collector: the proof is a batch job on few cores, and G1's
    # concurrent threads and write barriers took a share of them (docs/reconcile.md, "Speed").
    java = [jvm.COLLECTOR]
    if quiet and _LOG4J.exists():
        java.append(f"-Dlog4j2.configurationFile=file:{_LOG4J}")
    if small:
        # A short job: compiling with C1 only starts the JVM's code faster. (Code
        # generation stays on: the proof's expressions are large enough that even
        # for a few thousand rows, interpreting them costs more than compiling.)
        java.append("-XX:TieredStopAtLevel=1")
    elif JIT_DIRECTIVES.exists():
        # A large one: C2, HotSpot's optimizing compiler, spent ~50 of its ~220 CPU seconds
        # at 10 M events, a fifth of it on code the driver runs once per query (Spark's
        # SQL parser, the code generator's own compiler, Java serialization of tasks, the
        # planner's rules). Left to C1 they run a little slower and C2 compiles what the
        # rows run through (docs/reconcile.md, "Speed").
        java += ["-XX:+UnlockDiagnosticVMOptions", f"-XX:CompilerDirectivesFile={JIT_DIRECTIVES}"]
    return java + jvm.java_options()


def get_session(
    master: str | None = "local[*]",
    app_name: str = "eorouter-reconcile",
    conf: dict[str, str] | None = None,
    quiet: bool = True,
    events: int | None = None,
) -> SparkSession:
    """The active SparkSession, or a new one.

    ``master`` None leaves the master to whoever launched us (spark-submit).
    ``quiet`` keeps Spark's log at errors and hides the progress bars, so the
    terminal shows the verdict. ``events``: about how many events the input holds
    (None: unknown), to size the session (docs/reconcile.md, "Speed")."""
    active = SparkSession.getActiveSession()
    if active is not None:
        return active
    builder = SparkSession.builder.appName(app_name)
    if master:
        builder = builder.master(master)
    small = events is not None and events < SMALL_INPUT_EVENTS
    settings = {
        "spark.sql.session.timeZone": "UTC",
        "spark.sql.adaptive.enabled": "true",
        "spark.sql.shuffle.partitions": "4" if small else "16",
        # Sorted input aggregates without a hash table (spark/reconcile.py: the
        # per-delivery grouping reads its exchange sorted by delivery).
        "spark.sql.execution.replaceHashWithSortAgg": "true",
        # The proofs' shuffles after the per-delivery pass (by publisher identity, by
        # subscriber stream) hold ~100 MB at 10 M events: at the default 64 MB per
        # partition adaptive execution coalesced them to 3 tasks on 2 cores, which
        # spilled; 16 MB keeps both cores busy and the sorts in memory (docs/reconcile.md).
        "spark.sql.adaptive.advisoryPartitionSizeInBytes": "16m",
        # What is kept on local disk (above 2 M events: the per-delivery rows and the
        # ledgers, read by every proof) is written and read by this serializer: Kryo
        # took 10 M events from 123 to 112 s against Java serialization.
        "spark.serializer": "org.apache.spark.serializer.KryoSerializer",
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
    }
    java = java_options(small, quiet)
    if java:
        settings["spark.driver.extraJavaOptions"] = " ".join(java)
    from spark import jar

    classes = jar.available()  # the proof's own Java passes (spark/linescan.py); without them, their SQL twins run
    if classes is not None:
        settings["spark.driver.extraClassPath"] = str(classes)
        if master and not master.startswith("local"):
            settings["spark.jars"] = str(classes)  # and to the executors of a cluster
    if master and master.startswith("local"):
        # In local mode the driver's JVM is the executor too. The proof caches
        # little (docs/reconcile.md, "Memory"): 1200 MB of heap keep the whole
        # process tree under 2 GiB at 10 million events.
        settings["spark.driver.memory"] = "1200m" if not small else "768m"
    for key, value in (conf or {}).items():
        if key == "spark.driver.extraClassPath" and key in settings:
            value = f"{settings[key]}{os.pathsep}{value}"
        settings[key] = value
    for key, value in settings.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    if quiet:
        spark.sparkContext.setLogLevel("ERROR")
    return spark


# ---------------------------------------------------------------------------
# Resolving inputs
# ---------------------------------------------------------------------------


@dataclass
class Source:
    """One group of paths read with one reader."""

    fmt: str  # "json" | "parquet"
    paths: list[str]
    label: str  # what the user gave
    remote: bool = False  # a URI passed to Spark as is

    def __repr__(self) -> str:  # short, for messages
        return f"{self.fmt}:{self.label} ({len(self.paths)} path(s))"


def _is_uri(path: str) -> bool:
    scheme = path.split("://", 1)[0] if "://" in path else ""
    return bool(scheme) and scheme != "file"


_GLOB = re.compile(r"[*?\[{]")


def _spark_path(given: str) -> bool:
    """Passed to Spark as given: a URI of another file system, or a glob (Spark
    expands ``*``, ``?``, ``[...]`` and ``{a,b}`` itself, locally too)."""
    if _is_uri(given):
        return True
    local = given.removeprefix("file://")
    return bool(_GLOB.search(local)) and not Path(local).expanduser().exists()


def _log_files(directory: Path) -> list[Path]:
    found = []
    for entry in directory.iterdir():
        m = _LOG_FILE.match(entry.name)
        if m and entry.is_file():
            found.append(((int(m.group(1)), int(m.group(2))), entry))
    return [p for _, p in sorted(found)]


def _parquet_files(directory: Path) -> list[Path]:
    return sorted(p for p in directory.rglob("*.parquet") if p.is_file())


def resolve(inputs: list[str], fmt: str = "auto") -> list[Source]:
    """Turn the command line's inputs into Sources. Raises InputError when a local
    input holds nothing readable."""
    if fmt not in ("auto", "json", "parquet"):
        raise InputError(f"unknown format {fmt!r} (auto, json or parquet)")
    sources: list[Source] = []
    for given in inputs:
        if _spark_path(given):
            chosen = fmt if fmt != "auto" else ("parquet" if given.rstrip("/").endswith(".parquet") else "json")
            sources.append(Source(chosen, [given], given, remote=True))
            continue
        path = Path(given.removeprefix("file://")).expanduser()
        if not path.exists():
            raise InputError(f"{given}: no such file or directory")
        if path.is_file():
            chosen = fmt if fmt != "auto" else ("parquet" if path.suffix == ".parquet" else "json")
            sources.append(Source(chosen, [str(path.resolve())], given))
            continue
        json_files: list[Path] = []
        if fmt in ("auto", "json"):
            json_files = _log_files(path)
            if not json_files and (path / "events").is_dir():  # a router's data_dir
                json_files = _log_files(path / "events")
            if not json_files:  # a directory of data dirs
                for child in sorted(path.iterdir()):
                    if (child / "events").is_dir():
                        json_files.extend(_log_files(child / "events"))
        parquet_files = _parquet_files(path) if fmt in ("auto", "parquet") else []
        if json_files and parquet_files and fmt == "auto":
            raise InputError(f"{given}: holds both JSON logs and Parquet files; say which with --format")
        if json_files:
            sources.append(Source("json", [str(p.resolve()) for p in json_files], given))
        elif parquet_files:
            sources.append(Source("parquet", [str(path.resolve())], given))
        else:
            raise InputError(
                f"{given}: no event log found (expected a router's data directory, an events/ "
                f"directory, a directory of router data directories, or a Parquet dataset "
                f"from 'eorouter logs compact')"
            )
    if not sources:
        raise InputError("no input given")
    return _merge(sources)


def _merge(sources: list[Source]) -> list[Source]:
    """One Source per (format, local or not): one scan of many files plans and runs
    far better than a union of many scans."""
    merged: dict[tuple, Source] = {}
    for source in sources:
        key = (source.fmt, source.remote)
        if key in merged:
            merged[key].paths.extend(p for p in source.paths if p not in merged[key].paths)
            merged[key].label += f", {source.label}"
        else:
            merged[key] = Source(source.fmt, list(source.paths), source.label, source.remote)
    return list(merged.values())


#: Average bytes of one JSON line as the routers write them (folded lines are
#: counted as lines here: an underestimate of events where routers fold much).
JSON_BYTES_PER_EVENT = 250


def estimate_events(sources: list[Source]) -> int | None:
    """About how many events the inputs hold: from the size of local JSON logs and
    the row counts of Parquet datasets (their compaction note, else their bytes);
    None for remote inputs."""
    events = 0
    for source in sources:
        if source.remote:
            return None
        if source.fmt == "json":
            events += sum(os.path.getsize(p) for p in source.paths) // JSON_BYTES_PER_EVENT
        else:
            for path in source.paths:
                note = Path(path) / "_eorouter_compact.json"
                if note.exists():
                    import json

                    events += int(json.loads(note.read_text()).get("lines", 0))
                else:
                    events += sum(p.stat().st_size for p in _parquet_files(Path(path))) // 12
    return events


# ---------------------------------------------------------------------------
# Reading
# ---------------------------------------------------------------------------


@dataclass
class Loaded:
    """Every line of every input, as read: the fields the proof reads, ``FILE`` and
    ``CORRUPT`` (the text of a line Spark could not read whole, else null)."""

    lines: DataFrame
    sources: list[Source]
    notes: list[str] = field(default_factory=list)

    @property
    def events(self) -> DataFrame:
        """The lines read whole, with the writer's field names only."""
        return self.lines.where(F.col(CORRUPT).isNull()).drop(CORRUPT, FILE)

    @property
    def corrupt(self) -> DataFrame:
        """The lines Spark could not read whole: ``line``, their text (and ``seq``, as
        far as it was read: Spark refuses a query of a raw JSON scan that reads
        nothing but the corrupt-record column)."""
        return self.lines.where(F.col(CORRUPT).isNotNull()).select(F.col(CORRUPT).alias("line"), "seq")


def _json_reader(spark: SparkSession, source: Source, schema, strict: bool = False):
    from pyspark.sql import types as T

    if strict:  # no corrupt-record column: a line Spark cannot read whole stops the job
        reader = spark.read.schema(T.StructType([f for f in schema.fields if f.name != CORRUPT])).option("mode", "FAILFAST")
    else:
        reader = spark.read.schema(schema).option("mode", "PERMISSIVE").option("columnNameOfCorruptRecord", CORRUPT)
    if source.remote:
        # Only the routers' log files (not ledgers or anything else under the path).
        reader = reader.option("recursiveFileLookup", "true").option("pathGlobFilter", "events-*.jsonl")
    return reader


def is_malformed(error: BaseException) -> bool:
    """True of the error a ``strict`` read raises at a line Spark cannot read whole."""
    text = str(error)
    return "MALFORMED_RECORD_IN_PARSING" in text or "Malformed records are detected in record parsing" in text


def _fields(schema) -> list[str]:
    return [name for name in LINE_FIELDS if name in schema.fieldNames()]


def line_schema(fields=None):
    """The explicit schema a line is read with: ``fields`` (default ``LINE_FIELDS``)
    with the schema's types (router.eventschema), and ``CORRUPT``."""
    from pyspark.sql import types as T

    full = event_schema()
    wanted = [name for name in (fields or LINE_FIELDS) if name in full.fieldNames()]
    return T.StructType([full[name] for name in wanted] + [T.StructField(CORRUPT, T.StringType(), True)])


def load_lines(spark: SparkSession, sources: list[Source], fields=None, files: bool = False, strict: bool = False) -> DataFrame:
    """Every line of ``sources`` as one DataFrame: ``fields`` (default ``LINE_FIELDS``)
    with the writer's types, and ``CORRUPT``; with ``files``, also ``FILE`` (a string
    per line: it costs as much as converting a few fields, so only the cold paths
    ask for it). Nothing is dropped here. Only the fields asked for are converted.

    ``strict``: JSON is read in Spark's FAILFAST mode, ``CORRUPT`` always null: a line
    Spark cannot read whole (not JSON, a field of the wrong type) fails the job that
    reads it, with ``is_malformed`` true of its error. For a read of input another read
    found clean: keeping the corrupt-record column makes Spark re-map every parsed row
    by field name (~20 % of the per-delivery read, docs/benchmarks.md)."""
    full = event_schema()
    schema = line_schema(fields)
    wanted = [f.name for f in schema.fields if f.name != CORRUPT]
    frames: list[DataFrame] = []
    for source in sources:
        if source.fmt == "json":
            raw = _json_reader(spark, source, schema, strict).json(source.paths)
            corrupt = F.lit(None).cast("string").alias(CORRUPT) if strict else F.col(CORRUPT)
            cols = [*wanted, corrupt] + ([F.col("_metadata.file_path").alias(FILE)] if files else [])
            frames.append(raw.select(*cols))
        else:
            data = spark.read.parquet(*source.paths)
            have = set(data.columns)
            cols = [F.col(n) if n in have else F.lit(None).cast(full[n].dataType).alias(n) for n in wanted]
            # A dataset written by 'eorouter logs compact' keeps the text of lines that
            # were not read whole, and each line's source file; an older one has neither.
            cols.append(F.col(CORRUPT) if CORRUPT in have else F.lit(None).cast("string").alias(CORRUPT))
            if files:
                cols.append(F.col(FILE) if FILE in have else F.col("_metadata.file_path").alias(FILE))
            frames.append(data.select(*cols))
    lines = frames[0]
    for frame in frames[1:]:
        lines = lines.unionByName(frame)
    return lines


def load_events(spark: SparkSession, inputs: list[str], fmt: str = "auto") -> Loaded:
    """``resolve`` then ``load_lines`` (every field the proof reads, and each line's file)."""
    sources = resolve(inputs, fmt)
    return Loaded(load_lines(spark, sources, files=True), sources)


def resolve_ledgers(directory: str) -> list[str]:
    if _spark_path(directory):
        return [directory]
    path = Path(directory).expanduser()
    if path.is_file():
        return [str(path.resolve())]
    if not path.is_dir():
        raise InputError(f"--clients {directory}: no such directory")
    files = sorted(str(p.resolve()) for p in path.rglob("*.jsonl") if p.is_file())
    if not files:
        raise InputError(f"--clients {directory}: no ledger (*.jsonl) found")
    return files


#: The ledger fields the proof reads (spark/schema.py LEDGER_FIELDS has them all).
LEDGER_READ = ("ts", "client", "link", "role", "event", "delivery", "pub_tag", "outcome", "incarnation", "message_id")


def ledger_read(directory: str) -> tuple[list[str], bool]:
    """The ledgers' files, and whether they are a URI listed recursively (the Java read
    of spark/linescan.py ``ledger_rows``; its schema: ledger_rows_schema())."""
    return resolve_ledgers(directory), _spark_path(directory)


def largest_ledger(directory: str) -> int | None:
    """The largest ledger file's size in bytes (None for a URI: not listed here)."""
    paths, remote = ledger_read(directory)
    return None if remote else max(os.path.getsize(p) for p in paths)


def load_ledgers(spark: SparkSession, directory: str) -> DataFrame:
    """The applications' ledgers (docs/ledger.md) with their explicit schema, plus
    ``file`` (which ledger) and ``line``, which orders a file's lines as written:
    (the start of the file split a line was read in, its place in that split).
    Only the fields the proof reads are converted."""
    paths = resolve_ledgers(directory)
    return _ledger_rows(_ledger_reader(spark, recursive=_spark_path(directory)).json(paths))


def ledger_rows_schema(spark: SparkSession) -> StructType:
    """load_ledgers()' schema, planned over no file: the rows' shape is the code's, not
    the files'."""
    return _ledger_rows(_ledger_reader(spark, recursive=False).json([])).schema


def _ledger_reader(spark: SparkSession, recursive: bool) -> DataFrameReader:
    from pyspark.sql import types as T

    full = ledger_schema()
    schema = T.StructType([full[name] for name in LEDGER_READ])
    reader = spark.read.schema(schema).option("mode", "PERMISSIVE")
    if recursive:
        reader = reader.option("recursiveFileLookup", "true").option("pathGlobFilter", "*.jsonl")
    return reader


def _ledger_rows(frame: DataFrame) -> DataFrame:
    # A large ledger is read in several splits, which Spark may schedule in any
    # order: a line's place is its split's offset in the file, then its position
    # in the split (monotonically_increasing_id grows along a partition's rows).
    # The file is told apart by its size and modification time (fixed-width: a
    # path per line would cost as much as converting a few fields).
    meta = F.col("_metadata")
    return frame.select(
        *LEDGER_READ,
        F.xxhash64(meta["file_size"], meta["file_modification_time"]).alias("fid"),
        meta["file_block_start"].alias("split"),
        (F.monotonically_increasing_id() % F.lit(1 << 33)).alias("row"),
    ).where(F.col("event").isNotNull())
