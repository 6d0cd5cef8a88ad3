"""The command lines as separate processes (their own JVM each): slow, run with
scripts/test --slow. The in-process runs (tests/spark/test_real_run.py,
test_faults.py) cover the same code paths in the fast suite."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from spark.generate import Spec, generate

REPO = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.slow, pytest.mark.skipif(shutil.which("java") is None, reason="Spark needs Java")]


def _history(tmp_path: Path, faults=()) -> list[str]:
    info = generate(tmp_path / "logs", Spec(deliveries=60, seed=11, faults=faults))
    return [str(tmp_path / "logs" / r) for r in info["routers"]]


def test_eorouter_reconcile_exit_codes(tmp_path):
    clean = _history(tmp_path / "clean")
    eorouter = [sys.executable, "-m", "router"]
    done = subprocess.run(
        [
            *eorouter,
            "reconcile",
            *clean,
            "--clients",
            str(tmp_path / "clean" / "logs" / "clients"),
            "--master",
            "local[2]",
            "--out",
            str(tmp_path / "r1"),
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "VERDICT: proven clean: 0 lost, 0 duplicated" in done.stdout
    bad = _history(tmp_path / "bad", faults=("drop-accept",))
    done = subprocess.run(
        [*eorouter, "reconcile", *bad, "--master", "local[2]", "--out", str(tmp_path / "r2")],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 1
    assert "VERDICT: NOT clean: 1 lost" in done.stdout and "first 1 of 1 lost:" in done.stdout


def test_spark_submit_runs_the_job_file(tmp_path):
    spark_submit = Path(sys.executable).with_name("spark-submit")
    if not spark_submit.exists():
        pytest.skip("no spark-submit next to the interpreter")
    logs = _history(tmp_path)
    env = dict(os.environ, PYSPARK_PYTHON=sys.executable, PYSPARK_DRIVER_PYTHON=sys.executable)
    done = subprocess.run(
        [
            str(spark_submit),
            "--master",
            "local[2]",
            str(REPO / "spark" / "reconcile.py"),
            *logs,
            "--out",
            str(tmp_path / "out"),
            "--no-html",
        ],
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    assert report["verdict"]["proven_clean"] is True
