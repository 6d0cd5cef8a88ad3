"""The class-data-sharing archive (spark/jvm.py): where it lives, when it is used,
and that the proof's JVM really maps it."""

from __future__ import annotations

from pathlib import Path

import pytest

from spark import jvm


@pytest.fixture
def default_archive(monkeypatch, tmp_path) -> Path:
    """Where the archive would be under the default setting, with the cache in ``tmp_path``."""
    monkeypatch.delenv(jvm.ENV, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    path = jvm.archive_path()
    if path is None:
        pytest.skip("no java on PATH")
    return path


def test_the_archive_is_named_for_this_java_and_this_spark(monkeypatch, tmp_path, default_archive):
    path = default_archive
    assert path.parent == tmp_path / "eorouter" and path.name.startswith("spark-classes-")
    import pyspark

    monkeypatch.setattr(pyspark, "__version__", pyspark.__version__ + ".other")
    assert jvm.archive_path() != path  # another Spark: another archive, never a stale one
    assert jvm.java_options() == []  # not built yet: nothing to map, and no error


def test_a_reinstalled_spark_at_the_same_path_gets_another_archive(monkeypatch, tmp_path):
    """The JVM checks each class path jar's size and time against the archive; a new
    install at the same place (a CI clone at a fixed path) must not reuse the old one."""
    monkeypatch.delenv(jvm.ENV, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    if jvm._java() is None:
        pytest.skip("no java on PATH")
    import os

    import pyspark

    package = tmp_path / "pyspark"
    (package / "jars").mkdir(parents=True)
    jar = package / "jars" / "spark-core.jar"
    jar.write_bytes(b"PK")
    monkeypatch.setattr(pyspark, "__file__", str(package / "__init__.py"))
    first = jvm.archive_path()
    os.utime(jar, ns=(jar.stat().st_atime_ns, jar.stat().st_mtime_ns + 1_000_000_000))
    assert jvm.archive_path() != first
    jar.write_bytes(b"PK..")
    assert jvm.archive_path() != first


def test_old_archives_are_pruned_to_the_newest_few(tmp_path):
    import os

    paths = []
    for age in range(6):
        old = tmp_path / f"spark-classes-{age:016x}.jsa"
        old.write_bytes(b"x")
        os.utime(old, (1_000_000 - age, 1_000_000 - age))
        paths.append(old)
    made = tmp_path / "spark-classes-ffffffffffffffff.jsa"
    made.write_bytes(b"x")
    jvm._prune(made)
    assert sorted(tmp_path.iterdir()) == sorted([made, *paths[: jvm.KEEP - 1]])


def test_options_follow_the_setting(monkeypatch, tmp_path):
    archive = tmp_path / "classes.jsa"
    monkeypatch.setenv(jvm.ENV, str(archive))
    if jvm._java() is None:
        pytest.skip("no java on PATH")
    assert jvm.java_options() == []
    archive.write_bytes(b"not an archive")  # a JVM ignores an archive it cannot map (docs/reconcile.md)
    assert jvm.java_options()[0] == f"-XX:SharedArchiveFile={archive}"
    monkeypatch.setenv(jvm.ENV, "off")
    assert jvm.archive_path() is None and jvm.java_options() == []


def test_the_session_jvm_maps_the_archive(spark):
    """scripts/_setup.sh builds the archive at install; the tests' JVM, started
    through load.get_session, then has it mapped into memory."""
    path = jvm.archive_path()
    if path is None or not path.is_file():
        pytest.skip("no class archive built (python -m spark.jvm; scripts/_setup.sh builds it)")
    pid = spark._jvm.java.lang.ProcessHandle.current().pid()
    maps = Path(f"/proc/{pid}/maps").read_text()
    assert str(path) in maps


def test_the_collector_names_the_archive_and_runs_every_proof(monkeypatch, default_archive):
    """An archive is dumped and mapped under one collector: another collector, another archive."""
    from spark import load

    path = default_archive
    assert jvm.COLLECTOR in load.java_options(small=True) and jvm.COLLECTOR in load.java_options(small=False)
    monkeypatch.setattr(jvm, "COLLECTOR", "-XX:+UseSerialGC")
    assert jvm.archive_path() != path


def test_a_large_inputs_jvm_leaves_the_drivers_code_to_c1():
    """spark/jit-directives.json: a large input's JVM is given it (a small one's compiles
    with C1 only anyway), and this Java reads every pattern of it with C2 excluded (the
    JVM takes some mistakes in a directive in silence: the test reads what it printed)."""
    import json
    import subprocess

    from spark import load

    option = f"-XX:CompilerDirectivesFile={load.JIT_DIRECTIVES}"
    assert option in load.java_options(small=False) and "-XX:+UnlockDiagnosticVMOptions" in load.java_options(small=False)
    assert option not in load.java_options(small=True)
    java = jvm._java()  # (the one Spark's launcher runs: $JAVA_HOME's, else PATH's)
    if java is None:
        pytest.skip("no java ($JAVA_HOME or PATH)")
    printed = subprocess.run(
        [str(java), "-XX:+UnlockDiagnosticVMOptions", option, "-XX:+CompilerDirectivesPrint", "-version"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert printed.returncode == 0, printed.stderr
    out = printed.stdout + printed.stderr
    (directive,) = json.loads(load.JIT_DIRECTIVES.read_text())
    matching = next(line for line in out.splitlines() if line.strip().startswith("matching:"))
    assert set(matching.split(":", 1)[1].replace(" ", "").split(",")) == set(directive["match"])
    c2 = out.split("c2 directives:", 1)[1]
    assert "Exclude:true" in c2.split("\n\n", 1)[0]
