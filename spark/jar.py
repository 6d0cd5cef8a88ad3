"""The proof's own Java classes (spark/java/), compiled once into a jar its JVM loads.

The proof's specification is Spark SQL (spark/reconcile.py). Where Spark's operators
cost more per line than the work itself, a pass is also written in plain Java and run
inside the same Spark job (spark/linescan.py says which and how it hands back to SQL);
the SQL stays, as the twin the tests hold it to and as the path taken without the jar.

The jar is built from source here, with the JDK's ``javac`` against this install's
Spark jars, into ``$XDG_CACHE_HOME/eorouter`` (default ``~/.cache/eorouter``); its name
carries a key of the sources and of Spark's version, so an edit or an upgrade simply
makes another. Without ``javac`` (a Java runtime without its compiler) there is no jar
and every pass runs in Spark SQL: the verdict is the same, only slower (the report says
which read ran). ``EOROUTER_SPARK_JAVA=off`` switches the jar off. The first Spark session that
misses it builds it (spark/load.py ``get_session``), which scripts/_setup.sh's class
archive run is; ``python -m spark.jar`` builds it and prints its path (for spark-submit).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

ENV = "EOROUTER_SPARK_JAVA"
SOURCES = Path(__file__).with_name("java")
#: The oldest Java Spark 4 runs on: the classes load on any JVM that runs Spark.
RELEASE = "17"


def _sources() -> list[Path]:
    return sorted(SOURCES.rglob("*.java"))


def _spark_jars() -> Path:
    import pyspark

    return Path(pyspark.__file__).parent / "jars"


def jar_path() -> Path | None:
    """Where the jar of these sources for this Spark lives (None: switched off)."""
    if os.environ.get(ENV, "") == "off":
        return None
    import pyspark

    digest = hashlib.sha256(f"{pyspark.__version__}|{RELEASE}".encode())
    for source in _sources():
        digest.update(source.relative_to(SOURCES).as_posix().encode() + b"\0" + source.read_bytes())
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "eorouter"
    return cache / f"eorouter-spark-{digest.hexdigest()[:16]}.jar"


def compiler() -> str | None:
    """The JDK's javac: $JAVA_HOME's (the Java Spark's launcher runs), else on PATH."""
    home = os.environ.get("JAVA_HOME")
    if home and (Path(home) / "bin" / "javac").is_file():
        return str(Path(home) / "bin" / "javac")
    return shutil.which("javac")


def build(force: bool = False) -> Path | None:
    """The jar, compiled now if it is missing; None when it cannot be (switched off,
    no ``javac``). A failed compilation raises, with javac's message."""
    path = jar_path()
    if path is None or (path.is_file() and not force):
        return path
    javac = compiler()
    if javac is None:
        return None
    path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="eorouter-jar-") as work:
        classes = Path(work) / "classes"
        done = subprocess.run(
            [javac, "--release", RELEASE, "-Xlint:all,-path,-serial", "-Werror", "-d", str(classes)]
            + ["-cp", str(_spark_jars() / "*"), *map(str, _sources())],
            capture_output=True,
            text=True,
            timeout=300,
        )
        if done.returncode != 0:
            # Remembered, so that every later session of these sources and this Spark (another
            # Spark's classes, say) runs the SQL without trying again; an edit is another key.
            failed(path).write_text(done.stderr or done.stdout)
            raise RuntimeError(f"javac failed on {SOURCES}:\n{done.stderr or done.stdout}")
        staged = path.with_name(f".{path.name}.{os.getpid()}")
        with zipfile.ZipFile(staged, "w", zipfile.ZIP_DEFLATED) as jar:
            jar.writestr("META-INF/MANIFEST.MF", "Manifest-Version: 1.0\r\nCreated-By: eorouter spark/jar.py\r\n\r\n")
            for item in sorted(classes.rglob("*.class")):
                jar.write(item, item.relative_to(classes).as_posix())
        os.replace(staged, path)  # atomic: a concurrent build or reader sees all or nothing
    _prune(path)
    return path


def failed(path: Path) -> Path:
    """Where a failed compilation of the jar at ``path`` left javac's message."""
    return path.with_suffix(".failed")


def available() -> Path | None:
    """The jar if it is there or can be built now (quietly: without it the proof runs
    its SQL twin); None otherwise. A compilation that failed once is not tried again
    (``python -m spark.jar --force`` does)."""
    path = jar_path()
    if path is not None and not path.is_file() and failed(path).is_file():
        return None
    try:
        return build()
    except (OSError, RuntimeError, subprocess.SubprocessError) as error:
        print(f"eorouter: the proof's Java classes did not build, its SQL runs instead: {error}", file=sys.stderr)
        return None


def _prune(made: Path) -> None:
    """Keep the newest few jars (other checkouts may use theirs)."""
    keep_newest(made, "eorouter-spark-*.jar", 3)


def keep_newest(made: Path, pattern: str, keep: int) -> None:
    """Of the cache's files named like ``pattern``, remove all but ``made`` and the
    newest others, ``keep`` in all (spark/jvm.py's archives too)."""
    others = sorted(
        (p for p in made.parent.glob(pattern) if p != made),
        key=lambda p: p.stat().st_mtime,
        reverse=True,
    )
    for stale in others[keep - 1 :]:
        stale.unlink(missing_ok=True)


if __name__ == "__main__":
    force = "--force" in sys.argv[1:]
    target = jar_path()
    if force and target is not None:
        failed(target).unlink(missing_ok=True)
    made = build(force=force)
    print(made if made is not None else f"no jar ({ENV}=off, or no javac: install a JDK, e.g. openjdk-17-jdk-headless)")
