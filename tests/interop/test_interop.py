"""Each stack once as publisher and once as subscriber (to and from the python-qpid-proton
reference), through one router and across a 2-router path: the normal suite's share of the
interop matrix (the full matrix is test_matrix.py, marked slow; scripts/interop prints it).

The peers install themselves (interop_ready: npm ci, pip install -e .[interop], the C build); a
stack that cannot be installed is skipped with the reason printed.
"""

from __future__ import annotations

import pytest

from interop.matrix import REFERENCE, STACKS

pytestmark = pytest.mark.timeout(120)

PAIRS = [(REFERENCE, REFERENCE)] + [pair for s in STACKS if s != REFERENCE for pair in ((s, REFERENCE), (REFERENCE, s))]


@pytest.mark.parametrize("topology", ["one router", "2-router path"], ids=["one-router", "two-routers"])
@pytest.mark.parametrize("pub,sub", PAIRS, ids=[f"{p}-to-{s}" for p, s in PAIRS])
def test_every_subscriber_gets_every_message_once_and_the_publisher_accepted_after_all(interop_cell, pub, sub, topology):
    interop_cell("accept", pub, sub, topology)
