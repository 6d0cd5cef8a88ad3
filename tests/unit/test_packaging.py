"""pyproject.toml as the build reads it: setuptools' own reader, warnings as errors
(issue 14: ``project.license`` as a table gave a SetuptoolsDeprecationWarning on every
install)."""

from __future__ import annotations

import tomllib
import warnings
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def test_pyproject_reads_without_deprecation_warnings():
    setuptools = pytest.importorskip("setuptools")
    from setuptools.config.pyprojecttoml import apply_configuration
    from setuptools.dist import Distribution

    required = tomllib.loads((REPO / "pyproject.toml").read_text())["build-system"]["requires"]
    assert "setuptools>=77" in required  # the build backend that knows license expressions
    assert int(setuptools.__version__.split(".")[0]) >= 77, "the test extra installs setuptools>=77"
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # any deprecation the build would print fails here
        dist = apply_configuration(Distribution(), REPO / "pyproject.toml")
    assert dist.metadata.license_expression == "Apache-2.0"
    assert dist.metadata.name == "eorouter"
