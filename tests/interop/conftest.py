"""Fixtures for the interop tests: the peers installed once, and the routers they run through.

``interop_ready``   session: every stack set up (npm ci, pip install -e .[interop], the Proton C
                    build; see interop/peers.py); {stack: None or why it cannot run}, printed.
``interop_topologies``  session: {"one router": ..., "2-router path": ...} -> (routers, Topology):
                    one router, and a network of two (A - B) where publishers attach to A and the
                    subscriber under test to B. Both run with interop.matrix.ROUTER_OVERRIDES.
``interop_cell``    ``interop_cell(scenario, pub, sub, topology)`` runs one matrix cell (the routers
                    must be alive before and after), records it for the matrix, and turns it into the
                    test's outcome: skip (with the reason) when a stack cannot be installed or the
                    client cannot do that scenario, xfail when it failed for a known cause
                    (interop.matrix.KNOWN_CAUSES), a failure with every peer's output otherwise.

``--interop-matrix PATH`` prints the matrix of every cell run at the end and writes it to PATH, and
the cells as JSON next to it (scripts/interop uses it).
"""

from __future__ import annotations

import datetime
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from eorouter_tools.launcher import RouterSet  # noqa: E402
from eorouter_tools.topology import RouterNetwork, parse_topology  # noqa: E402
from interop import matrix, peers  # noqa: E402

RESULTS: list[matrix.Result] = []

TWO_ROUTERS = """
[[router]]
id = "A"
[[router]]
id = "B"
[[link]]
between = ["A", "B"]
"""


def pytest_addoption(parser):
    parser.addoption(
        "--interop-matrix", metavar="PATH", default=None, help="print the interop matrix at the end and write it to PATH"
    )


@pytest.fixture(scope="session")
def interop_ready() -> dict[str, str | None]:
    status = {stack: peers.setup(stack) for stack in matrix.STACKS}
    for reason in status.values():
        if reason is not None:
            print(f"\ninterop: cannot install {reason}", file=sys.stderr)
    return status


@pytest.fixture(scope="session")
def interop_topologies(tmp_path_factory, interop_ready):
    single = RouterSet(tmp_path_factory.mktemp("interop-one"))
    net = RouterNetwork(tmp_path_factory.mktemp("interop-two"), parse_topology(TWO_ROUTERS), overrides=matrix.ROUTER_OVERRIDES)
    try:
        a = single("A", **matrix.ROUTER_OVERRIDES)
        net.start()
        ra, rb = net.routers["A"], net.routers["B"]
        yield {
            "one router": ([a], matrix.Topology("one router", (a.host, a.port), (a.host, a.port))),
            "2-router path": ([ra, rb], matrix.Topology("2-router path", (ra.host, ra.port), (rb.host, rb.port))),
        }
    finally:
        try:
            net.stop()
        finally:
            single.cleanup()


@pytest.fixture
def interop_cell(interop_topologies, tmp_path):
    def run(scenario: str, pub: str, sub: str, topology: str) -> matrix.Result:
        routers, topo = interop_topologies[topology]
        for r in routers:
            r.check_alive("before this interop cell")
        result = matrix.run_scenario(scenario, pub, sub, topo, tmp_path)
        RESULTS.append(result)
        for r in routers:
            r.check_alive(f"after {scenario} {pub} -> {sub}: a peer's traffic killed it")
        if result.status == "skip":
            pytest.skip(result.reason)
        cause = matrix.known_cause(result)
        if cause:
            pytest.xfail(f"known: {cause}")
        assert result.status == "pass", (
            f"{scenario} {pub} -> {sub} ({topology}):\n  " + "\n  ".join(result.problems) + f"\n{result.diagnostics}"
        )
        return result

    return run


def _header() -> str:
    try:
        rev = subprocess.run(
            ["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True, text=True
        ).stdout.strip()
    except OSError:
        rev = "?"
    return (
        f"eorouter interop matrix ({datetime.date.today().isoformat()}, commit {rev or '?'} + working tree; {len(RESULTS)} cells)"
    )


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    path = config.getoption("--interop-matrix")
    if not path or not RESULTS:
        return
    text = matrix.render(RESULTS, _header())
    terminalreporter.write_sep("=", "interop matrix")
    terminalreporter.write_line(text)
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(text + "\n")
    matrix.save(RESULTS, Path(path).with_suffix(".json"))
    terminalreporter.write_line(f"(written to {path}, the cells to {Path(path).with_suffix('.json')})")
