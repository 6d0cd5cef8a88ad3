"""The full interop matrix (slow): every publisher stack x every subscriber stack x every scenario of
interop/matrix.py (accept, reject, release, two-step, hold, disconnects, settle modes, message sizes),
through one router and across a 2-router path; plus the publisher-only scenarios.

``scripts/interop`` runs it and prints the matrix; ``scripts/test --slow tests/interop`` also does.
"""

from __future__ import annotations

import pytest

from interop.matrix import PUBLISHER_SCENARIOS, REFERENCE, SCENARIOS, STACKS

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]

TOPOLOGIES = ["one router", "2-router path"]
CELLS = [(t, sc, p, s) for t in TOPOLOGIES for p in STACKS for s in STACKS for sc in SCENARIOS]
PUB_CELLS = [(t, sc, p) for t in TOPOLOGIES for p in STACKS for sc in PUBLISHER_SCENARIOS]


def _id(t: str) -> str:
    return "one" if t == "one router" else "two"


@pytest.mark.parametrize("topology,scenario,pub,sub", CELLS, ids=[f"{_id(t)}-{sc}-{p}-to-{s}" for t, sc, p, s in CELLS])
def test_cell(interop_cell, topology, scenario, pub, sub):
    interop_cell(scenario, pub, sub, topology)


@pytest.mark.parametrize("topology,scenario,pub", PUB_CELLS, ids=[f"{_id(t)}-{sc}-{p}" for t, sc, p in PUB_CELLS])
def test_publisher_cell(interop_cell, topology, scenario, pub):
    interop_cell(scenario, pub, REFERENCE, topology)
