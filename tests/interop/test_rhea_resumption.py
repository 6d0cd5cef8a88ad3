"""Resumption from another stack: the rhea resumable clients (interop/rhea/resumable-*.js) survive a router kill.

Three routers, each linked to the other two (A, B, C). A rhea resumable publisher and subscriber are given only
their own router (they learn the others from its failover-server-list); steady traffic (the publisher keeps
FAILOVER_WINDOW messages unanswered, the subscriber's application takes a few ms a message); A is SIGKILLed
mid-stream; the clients resume their links on another router with their unsettled state. From the clients'
own ledgers: every message the publisher got accepted was handed to the subscriber's application exactly once,
in publisher order, intact, nothing else; the resume carried unsettled deliveries; no live router keeps a
record. Variants: both clients on A (plus a router.client subscriber on C as a bystander), only the
subscriber's router dies, only the publisher's. The logic and checks are interop/matrix.py's
``run_failover_scenario``; each run is a cell of the interop matrix (``scripts/interop`` prints it).

Skipped, with the reason printed, only when node/npm or the rhea package cannot be installed.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from eorouter_tools.launcher import read_event_log
from eorouter_tools.topology import RouterNetwork, parse_topology
from interop import matrix, peers

pytestmark = pytest.mark.timeout(150)

TRIANGLE = (
    '[[router]]\nid = "A"\n[[router]]\nid = "B"\n[[router]]\nid = "C"\n'
    '[[link]]\nbetween = ["A", "B"]\n[[link]]\nbetween = ["B", "C"]\n[[link]]\nbetween = ["C", "A"]\n'
)
TOPOLOGY = "3 routers, A killed"


def _matrix_results(config) -> list | None:
    """tests/interop/conftest.py's RESULTS (what --interop-matrix prints), found among the loaded conftests."""
    here = Path(__file__).resolve().parent / "conftest.py"
    for plugin in config.pluginmanager.get_plugins():
        if getattr(plugin, "__file__", None) and Path(plugin.__file__).resolve() == here:
            return getattr(plugin, "RESULTS", None)
    return None


def _events(net: RouterNetwork):
    """{router: this epoch's event log} for the live routers."""

    def events(dead) -> dict:
        return {
            rid: [e for e in read_event_log(router.data_dir) if e.get("epoch") == router.epoch]
            for rid, router in net.routers.items()
            if rid not in dead and router.is_running()
        }

    return events


def _leftovers(net: RouterNetwork):
    """{router: deliveries it received and still holds} for the live routers (tests/failover's check)."""

    def left(dead) -> dict:
        out = {}
        for rid, router in net.routers.items():
            if rid in dead or not router.is_running():
                continue
            events = [e for e in read_event_log(router.data_dir) if e.get("epoch") == router.epoch]
            received = {e["delivery"] for e in events if e["event"] == "received" and not e.get("settled")}
            gone = {
                e["delivery"] for e in events if e["event"] == "record-deleted" or (e["event"] == "settled" and e.get("deleted"))
            }
            if received - gone:
                out[rid] = len(received - gone)
        return out

    return left


@pytest.fixture(scope="module")
def rhea_ready():
    reason = peers.setup("rhea")
    if reason is not None:
        print(f"\nrhea resumption: skipped: cannot install {reason}", file=sys.stderr)
        pytest.skip(f"cannot install {reason}")


@pytest.mark.parametrize(
    "scenario, sub_pattern",
    [*((s, False) for s in matrix.FAILOVER_SCENARIOS), ("resume-kill-sub", True)],
    ids=[*matrix.FAILOVER_SCENARIOS, "resume-kill-sub-pattern"],
)
def test_rhea_resumable_clients_survive_a_router_kill(rhea_ready, tmp_path, request, scenario, sub_pattern):
    """(``-pattern``: the rhea subscriber subscribes to a topic pattern, issue 20, and resumes it.)"""
    # placeholder_timeout 5 s (30 by default): a placeholder nothing fulfils would hold the subscriber's stream
    # that long; a regression then fails in seconds rather than half a minute
    net = RouterNetwork(
        tmp_path / "routers",
        parse_topology(TRIANGLE),
        overrides={"delivery": {"record_linger": 1.0}, "failover": {"publisher_resume_timeout": 20, "placeholder_timeout": 5}},
    )
    try:
        net.start()
        topo = matrix.FailoverTopology(
            TOPOLOGY,
            {rid: (r.host, r.port) for rid, r in net.routers.items()},
            kill=lambda rid: net.routers[rid].kill(),
            leftovers=_leftovers(net),
            events=_events(net),
        )
        result = matrix.run_failover_scenario(scenario, "rhea", "rhea", topo, tmp_path / "peers", sub_pattern=sub_pattern)
        results = _matrix_results(request.config)
        if results is not None:
            results.append(result)
        for rid, router in net.routers.items():
            if rid != matrix.FAILOVER_KILLED:
                router.check_alive(f"after {scenario}")
    finally:
        net.stop()
    if result.status == "skip":
        pytest.skip(result.reason)
    print(f"\n{scenario} ({result.seconds:.1f} s, {result.status}): " + "; ".join(result.notes + result.problems))
    cause = matrix.known_cause(result)
    if cause:
        # a router defect, not the client's: shown as such (and in the matrix), never as a pass
        pytest.xfail(f"known: {cause}; router data: {tmp_path / 'routers'}")
    assert result.status == "pass", (
        f"{scenario}:\n  " + "\n  ".join(result.problems) + f"\n{result.diagnostics}" + f"\nrouter data: {tmp_path / 'routers'}"
    )
