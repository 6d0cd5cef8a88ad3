"""The proof's Java passes in the tests' Spark session (spark/jar.py): a test module of a
pass skips when they are switched off or cannot be built here (no javac), and fails when
javac is here but the class is not on the session's class path."""

from __future__ import annotations

import os

import pytest

from spark import jar
from spark.linescan import _scanner


def require(spark, name: str) -> None:
    if os.environ.get(jar.ENV, "") == "off":
        pytest.skip(f"the proof's Java passes are switched off ({jar.ENV}=off)")
    if _scanner(spark, name) is None:
        if jar.compiler() is None:
            pytest.skip("no javac (a JDK) to build the proof's Java classes: spark/jar.py")
        pytest.fail(f"javac is here but the tests' Spark session has no {name} class")
