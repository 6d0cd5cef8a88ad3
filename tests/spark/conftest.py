"""Fixtures for the Spark reconciliation tests.

``spark``     ONE local SparkSession for the whole run (local[2], 4 shuffle partitions,
              no UI, adaptive execution off: the data here is tiny, and every job
              counts). Skips the Spark tests when Java is missing.
``real_run``  one real run (tests/spark/realrun.py: three router processes, proton
              clients keeping ledgers), shared by the module tests that need real logs.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))


@pytest.fixture(scope="session")
def spark():
    pytest.importorskip("pyspark")
    if shutil.which("java") is None:
        pytest.skip("Spark needs Java (17+): apt-get install openjdk-17-jdk-headless")
    from spark.load import get_session

    session = get_session(
        "local[2]",
        app_name="eorouter-tests",
        conf={
            "spark.sql.shuffle.partitions": "4",
            "spark.ui.enabled": "false",
            "spark.sql.adaptive.enabled": "false",
            "spark.driver.memory": "1g",
        },
    )
    yield session
    session.stop()


@pytest.fixture(scope="session")
def real_run(tmp_path_factory):
    import realrun

    return realrun.run(tmp_path_factory.mktemp("realrun"), messages=20)


@pytest.fixture(scope="module")
def real_run_one_router(tmp_path_factory):
    import realrun

    return realrun.run(tmp_path_factory.mktemp("realrun1"), messages=20, one_router=True)
