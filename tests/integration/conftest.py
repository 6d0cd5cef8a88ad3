"""Fixtures for integration tests: real router processes, real AMQP 1.0 clients.

Fixtures
--------
``router``          the module's shared router (default config), started once per module
                    (CI time: see DEVELOPERS.md). Checked alive before and after every test
                    that uses it: a router killed by client input fails the test that did it.
``router_factory``  ``router_factory("A", delivery={"no_subscribers": "rejected"}, limits={...})``
                    -> a started ``RouterProcess`` with that config, in the test's own tmp dir;
                    stopped (SIGTERM, exit 0 asserted) LIFO at test end. ``start=False`` gives an
                    unstarted one (bad-config tests call ``.spawn(config_text=...)``).
``module_router_factory``  the same, module-scoped (a module needing one special router).
``amqp``            a ``Harness`` (see amqpclients.py): ``amqp.connect(router.url)`` ...;
                    its waits fail at once if any router of this test process dies.

On a failing test, the stderr of every router the test used is attached to the report.
"""

from __future__ import annotations

import pytest
from amqpclients import Harness

from eorouter_tools.launcher import RouterProcess, RouterSet, live_routers


@pytest.fixture
def router_factory(tmp_path):
    routers = RouterSet(tmp_path / "routers")
    yield routers
    routers.cleanup()


@pytest.fixture(scope="module")
def module_router_factory(tmp_path_factory, request):
    routers = RouterSet(tmp_path_factory.mktemp(request.module.__name__.rsplit(".", 1)[-1]))
    yield routers
    routers.cleanup()


@pytest.fixture(scope="module")
def _shared_router(module_router_factory) -> RouterProcess:
    return module_router_factory("A")


@pytest.fixture
def router(_shared_router) -> RouterProcess:
    _shared_router.check_alive("it died during an earlier test of this module")
    yield _shared_router
    _shared_router.check_alive("after this test")


@pytest.fixture
def amqp():
    harness = Harness(timeout=10.0, routers=live_routers)
    yield harness
    harness.close()


def _routers_of(item) -> list[RouterProcess]:
    found: list[RouterProcess] = []
    for value in getattr(item, "funcargs", {}).values():
        if isinstance(value, RouterProcess):
            found.append(value)
        elif isinstance(value, RouterSet):
            found.extend(value.routers)
    found.extend(live_routers())
    unique_routers: list[RouterProcess] = []
    for router in found:
        if all(router is not seen for seen in unique_routers):
            unique_routers.append(router)
    return unique_routers


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if report.failed and report.when in ("setup", "call"):
        for router in _routers_of(item):
            report.sections.append((f"router {router.id} stderr (last 60 lines of {router.stderr_path})", router.stderr_tail(60)))
