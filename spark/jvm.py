"""A class-data-sharing archive for the proof's JVM, so that it starts fast.

A reconciliation of a small input (a demo's or a test's logs) spends seconds only
loading and verifying the ~15,000 classes Spark needs. Java (13+) can dump the
classes a run loaded into an archive (``-XX:ArchiveClassesAtExit``) that later JVMs
map instead (``-XX:SharedArchiveFile``): on this project's benchmark that takes ~3 s
off every reconciliation (docs/benchmarks.md, "Reconciliation at scale").

The archive belongs to one Java installation and one Spark: its name carries a key
of both, so an upgrade simply makes a new one. A JVM that cannot use an archive
(another Java, a damaged file) ignores it and starts as it would without: the
archive only ever saves time. ``python -m spark.jvm`` builds it (scripts/_setup.sh
checks on every run that it is there, builds it when not) by reconciling a small generated history, which loads
the classes a real reconciliation loads (in a child process: spark/jvm_dump.py).

``EOROUTER_SPARK_CDS``: ``off`` never uses one; a path puts it there instead of
``$XDG_CACHE_HOME/eorouter`` (default ``~/.cache/eorouter``).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ENV = "EOROUTER_SPARK_CDS"
#: The garbage collector of every proof's JVM (spark/load.py java_options), part of the archive's
#: name: an archive is dumped and mapped under the same collector.
COLLECTOR = "-XX:+UseParallelGC"


def _java() -> Path | None:
    """The java binary Spark's launcher will run (bin/spark-class: $JAVA_HOME, else PATH)."""
    home = os.environ.get("JAVA_HOME")
    found = str(Path(home) / "bin" / "java") if home else shutil.which("java")
    return Path(found).resolve() if found and Path(found).exists() else None


def archive_path() -> Path | None:
    """Where the archive for this Java and this Spark lives (None: switched off, or no java)."""
    setting = os.environ.get(ENV, "")
    if setting == "off":
        return None
    java = _java()
    if java is None:
        return None
    import pyspark

    jars = Path(pyspark.__file__).parent / "jars"
    # A JVM refuses (silently, under -Xlog:cds=off) an archive whose class path jars
    # differ in size or modification time from the ones it was dumped with: a fresh
    # install at the same path is another archive, never a stale one that only looks right.
    listing = sorted(f"{p.name}:{p.stat().st_size}:{p.stat().st_mtime_ns}" for p in jars.glob("*.jar")) if jars.is_dir() else []
    stat = java.stat()
    from spark import jar

    # The proof's own jar is on the class path it was dumped with (spark/load.py): its name is its content.
    own = jar.jar_path() if jar.compiler() is not None else None
    parts = [str(java), str(stat.st_size), str(stat.st_mtime_ns), pyspark.__version__, COLLECTOR, str(jars), *listing, str(own)]
    key = hashlib.sha256("|".join(parts).encode()).hexdigest()[:16]
    if setting:
        return Path(setting)
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "eorouter"
    return cache / f"spark-classes-{key}.jsa"


def java_options() -> list[str]:
    """The JVM options that use the archive, if there is one; its absence is not an error."""
    path = archive_path()
    if path is None or not path.is_file():
        return []
    # Quiet: a JVM that cannot map the archive says so on stderr, under the verdict.
    return [f"-XX:SharedArchiveFile={path}", "-Xlog:cds=off", "-Xlog:cds+dynamic=off"]


def build(force: bool = False) -> Path | None:
    """Make the archive unless it exists: a child process reconciles a small
    generated history in a JVM told to dump its classes at exit, and waits for that
    JVM to finish writing; the file appears under its name only when complete."""
    path = archive_path()
    if path is None or (path.is_file() and not force):
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="eorouter-cds-") as work:
        partial = Path(work) / "classes.jsa"
        # The child's JVM maps no archive (a dynamic archive cannot be dumped on top of another).
        subprocess.run(
            [sys.executable, "-m", "spark.jvm_dump", str(partial), work],
            check=True,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            timeout=600,
            env={**os.environ, ENV: "off"},
        )
        if not partial.is_file() or partial.stat().st_size == 0:
            raise RuntimeError("the JVM wrote no class archive")
        staged = path.with_name(f".{path.name}.{os.getpid()}")
        shutil.move(str(partial), staged)
        os.replace(staged, path)  # atomic: a concurrent build or reader sees all or nothing
    _prune(path)
    return path


KEEP = 3


def _prune(made: Path) -> None:
    """Each archive is ~170 MB and every install (a fresh clone, a rebuilt venv) makes
    one: keep the newest few, for the other checkouts still in use. A JVM that has one
    mapped keeps its pages after the file is removed; a checkout whose archive went
    only starts slower until its setup builds it again."""
    from spark.jar import keep_newest

    keep_newest(made, "spark-classes-*.jsa", KEEP)


if __name__ == "__main__":
    made = build(force="--force" in sys.argv[1:])
    print(made if made is not None else f"no class archive ({ENV}=off, or no java found)")
