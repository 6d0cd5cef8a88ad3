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
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from spark.schema import CORRUPT, event_schema, ledger_schema

_LOG_FILE = re.compile(r"^events-(\d{6,})-(\d{6,})\.jsonl$")
_LOG4J = Path(__file__).with_name("log4j2.properties")


class InputError(Exception):
    """The inputs cannot be read (nothing there, mixed formats in one directory, ...)."""


# ---------------------------------------------------------------------------
# The session
# ---------------------------------------------------------------------------

def get_session(master: str | None = "local[*]", app_name: str = "eorouter-reconcile",
                conf: dict[str, str] | None = None, quiet: bool = True) -> SparkSession:
    """The active SparkSession, or a new one.

    ``master`` None leaves the master to whoever launched us (spark-submit).
    ``quiet`` keeps Spark's log at errors and hides the progress bars, so the
    terminal shows the verdict."""
    active = SparkSession.getActiveSession()
    if active is not None:
        return active
    builder = SparkSession.builder.appName(app_name)
    if master:
        builder = builder.master(master)
    settings = {
        "spark.sql.session.timeZone": "UTC",
        # On for the queries; spark/reconcile.py prepare() plans the cached,
        # delivery-partitioned tables without it (it would forget their partitioning).
        "spark.sql.adaptive.enabled": "true",
        "spark.sql.shuffle.partitions": "16",
    }
    if quiet:
        settings["spark.ui.showConsoleProgress"] = "false"
        if _LOG4J.exists():
            settings["spark.driver.extraJavaOptions"] = f"-Dlog4j2.configurationFile=file:{_LOG4J}"
    if master and master.startswith("local"):
        # In local mode the driver's JVM is the executor too: Spark's 1g default
        # spills the cached, delivery-partitioned events to disk early.
        settings["spark.driver.memory"] = "2g"
    settings.update(conf or {})
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
            raise InputError(f"{given}: no event log found (expected a router's data directory, an events/ "
                             f"directory, a directory of router data directories, or a Parquet dataset "
                             f"from 'eorouter logs compact')")
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


# ---------------------------------------------------------------------------
# Reading
# ---------------------------------------------------------------------------

@dataclass
class Loaded:
    events: DataFrame
    sources: list[Source]
    corrupt: DataFrame | None = None  # the lines Spark could not parse (JSON only)
    notes: list[str] = field(default_factory=list)


def _read_json(spark: SparkSession, source: Source, schema) -> DataFrame:
    reader = spark.read.schema(schema).option("mode", "PERMISSIVE") \
        .option("columnNameOfCorruptRecord", CORRUPT)
    if source.remote:
        # Only the routers' log files (not ledgers or anything else under the path).
        reader = reader.option("recursiveFileLookup", "true").option("pathGlobFilter", "events-*.jsonl")
    return reader.json(source.paths)


def load_events(spark: SparkSession, inputs: list[str], fmt: str = "auto") -> Loaded:
    """Every event of every input as one DataFrame with the writer's schema (plus
    nothing). Unparsable lines (a torn last line after a crash) are left out and
    returned separately in ``corrupt`` (one column, the raw line)."""
    sources = resolve(inputs, fmt)
    schema = event_schema()
    json_schema = event_schema(corrupt_column=True)
    frames: list[DataFrame] = []
    corrupt: list[DataFrame] = []
    for source in sources:
        if source.fmt == "json":
            raw = _read_json(spark, source, json_schema)
            # A torn line parses to nulls with the raw text in CORRUPT. Keep the
            # filter on a real column too: Spark refuses queries that reference
            # only the corrupt-record column of a raw JSON scan.
            corrupt.append(raw.where(F.col(CORRUPT).isNotNull() | F.col("event").isNull())
                           .select(F.coalesce(F.col(CORRUPT), F.lit("")).alias("line"),
                                   F.col("event").alias("_event")).select("line"))
            frames.append(raw.where(F.col(CORRUPT).isNull() & F.col("event").isNotNull())
                          .select(*schema.fieldNames()))
        else:
            frames.append(spark.read.schema(schema).parquet(*source.paths).select(*schema.fieldNames()))
    events = frames[0]
    for frame in frames[1:]:
        events = events.unionByName(frame)
    bad = None
    for frame in corrupt:
        bad = frame if bad is None else bad.unionByName(frame)
    return Loaded(events, sources, bad)


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


def load_ledgers(spark: SparkSession, directory: str) -> DataFrame:
    """The applications' ledgers (docs/ledger.md) with their explicit schema, plus
    ``file`` (which ledger) and ``line`` (increasing with the position in the file:
    the application's own order)."""
    paths = resolve_ledgers(directory)
    reader = spark.read.schema(ledger_schema()).option("mode", "PERMISSIVE")
    if _spark_path(directory):
        reader = reader.option("recursiveFileLookup", "true").option("pathGlobFilter", "*.jsonl")
    frame = reader.json(paths)
    # A ledger is one small file per client link, read as one split, in which
    # monotonically_increasing_id() follows the line order.
    return frame.withColumn("file", F.input_file_name()) \
        .withColumn("line", F.monotonically_increasing_id()) \
        .where(F.col("event").isNotNull())


def env_cores() -> int:
    return os.cpu_count() or 1
