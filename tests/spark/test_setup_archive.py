"""scripts/_setup.sh keeps the class archive (spark/jvm.py) there on every run, not only at
install: another checkout's install may prune it (spark/jvm.py _prune), and a change of the
JVM's options in spark/jvm.py names another one. The setup script runs for real, with a
stand-in venv whose python records each call; its `-m spark.jvm` makes the archive file
the way the real one ends (the real build is what every fresh setup runs)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# what makes the setup install again (the compiled parts' sources among them)
INSTALL_INPUTS = ("pyproject.toml", "setup.py", *(str(p.relative_to(ROOT)) for p in sorted(ROOT.glob("router/**/*.[ch]"))))


def _venv(tmp_path: Path) -> tuple[Path, Path]:
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    calls = tmp_path / "calls.log"
    python = venv / "bin" / "python"
    python.write_text(
        "#!/bin/sh\n"
        f'echo "$*" >> {calls}\n'
        'if [ "$*" = "-m spark.jvm" ]; then printf built > "$EOROUTER_SPARK_CDS"; echo "$EOROUTER_SPARK_CDS"; exit 0; fi\n'
        "exit 3\n"
    )
    python.chmod(0o755)
    stamp = venv / ".eorouter-installed"  # installed: the install step is not what this tests
    stamp.touch()
    later = max((ROOT / p).stat().st_mtime for p in INSTALL_INPUTS) + 10
    os.utime(stamp, (later, later))
    return venv, calls


def _setup(venv: Path, archive: Path | str) -> subprocess.CompletedProcess:
    env = {**os.environ, "EOROUTER_VENV": str(venv), "EOROUTER_SPARK_CDS": str(archive)}
    return subprocess.run(
        ["bash", "-c", f'source "{ROOT}/scripts/_setup.sh"'], env=env, capture_output=True, text=True, timeout=60
    )


def _builds(calls: Path) -> int:
    return calls.read_text().count("-m spark.jvm") if calls.exists() else 0


def test_setup_builds_the_archive_when_it_is_gone_and_otherwise_leaves_it(tmp_path):
    venv, calls = _venv(tmp_path)
    archive = tmp_path / "classes.jsa"
    record = venv / ".eorouter-class-archive"

    first = _setup(venv, archive)
    assert first.returncode == 0, first.stderr
    assert _builds(calls) == 1 and archive.read_text() == "built"
    assert record.read_text() == str(archive)

    again = _setup(venv, archive)  # the usual run: the file is there, no Python started for it
    assert again.returncode == 0, again.stderr
    assert _builds(calls) == 1

    archive.unlink()  # pruned by another checkout's install
    gone = _setup(venv, archive)
    assert gone.returncode == 0, gone.stderr
    assert _builds(calls) == 2 and archive.exists()
    assert "archiving Spark's classes" in gone.stderr

    old = (ROOT / "spark" / "jvm.py").stat().st_mtime - 10  # spark/jvm.py changed since (another collector, say)
    os.utime(record, (old, old))
    assert _setup(venv, archive).returncode == 0
    assert _builds(calls) == 3


def test_setup_leaves_the_archive_alone_when_it_is_switched_off(tmp_path):
    venv, calls = _venv(tmp_path)
    done = _setup(venv, "off")
    assert done.returncode == 0, done.stderr
    assert _builds(calls) == 0 and not (venv / ".eorouter-class-archive").exists()
