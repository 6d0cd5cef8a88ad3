"""test_kill's scenario with each router in a Docker container, started and killed
through testcontainers-python.

Three routers (A, B, C, each linked to the other two), each in its own container with
host networking; resumable publishers on A and B and durable subscribers on A, B and C
run in this process. Mid-stream the container of A (a publisher's and a subscriber's
router) is killed (``docker kill``: SIGKILL to the router, PID 1 of its container).
Same verdict as tests/failover/test_kill.py: every message a publisher got "accepted"
for was handed to every subscriber's application exactly once, in publisher order,
per the clients' own ledgers; no surviving router keeps a record.

The image (``EOROUTER_IMAGE``, default ``eorouter-local:test``) runs
``... run --config /etc/eorouter/router.toml`` with its data in /var/lib/eorouter, like
the repository's Dockerfile. ``scripts/containers`` starts a private engine, imports a
skeleton image whose label ``eorouter.host-mounts`` lists the host paths to bind
read-only (/usr, Python, the venv, the source) and runs this suite. With an engine and
a registry of your own: ``docker build -t eorouter .`` and ``EOROUTER_IMAGE=eorouter``.
Without a reachable engine or without the image, the test is skipped with the reason.
"""

from __future__ import annotations

import os
import time
from collections import defaultdict
from pathlib import Path

import pytest

os.environ.setdefault("TESTCONTAINERS_RYUK_DISABLED", "true")  # Ryuk's image comes from a registry

from test_kill import TRIANGLE, Scenario  # noqa: E402

from eorouter_tools.launcher import DEFAULT_CONFIG, READY_RE, merge_config, parse_listeners, read_event_log, to_toml  # noqa: E402
from eorouter_tools.topology import RouterNetwork, parse_topology  # noqa: E402
from router.client import ResumablePublisher, ResumableSubscriber  # noqa: E402

IMAGE = os.environ.get("EOROUTER_IMAGE", "eorouter-local:test")
CONFIG_IN_CONTAINER = "/etc/eorouter/router.toml"
DATA_IN_CONTAINER = "/var/lib/eorouter"


def _engine_problem() -> tuple[str | None, list[str]]:
    """(why the suite cannot run here or None, host paths the image wants bind-mounted)."""
    try:
        import docker
        import testcontainers  # noqa: F401
    except ImportError as err:
        return f"testcontainers is not installed ({err}); pip install -e '.[test]'", []
    try:
        client = docker.from_env(timeout=5)
        client.ping()
    except Exception as err:  # noqa: BLE001 - any failure means: no engine here
        where = os.environ.get("DOCKER_HOST", "the default socket")
        return (
            f"no Docker engine reachable at {where} ({type(err).__name__}); "
            f"sudo scripts/containers starts a private one and runs this suite"
        ), []
    try:
        image = client.images.get(IMAGE)
    except docker.errors.ImageNotFound:
        return (
            f"image {IMAGE} not found: scripts/containers imports it, or with a registry "
            f"`docker build -t eorouter .` and EOROUTER_IMAGE=eorouter"
        ), []
    finally:
        client.close()
    mounts = (image.labels or {}).get("eorouter.host-mounts", "")
    return None, [m for m in mounts.split(":") if m]


_PROBLEM, HOST_MOUNTS = _engine_problem()
if _PROBLEM:
    print(f"\ntests/containers: skipped: {_PROBLEM}")
pytestmark = [pytest.mark.containers, pytest.mark.timeout(240), pytest.mark.skipif(_PROBLEM is not None, reason=_PROBLEM or "")]


class ContainerRouter:
    """One router in one container: the parts of RouterProcess that RouterNetwork and
    the scenario use (url, ports, epoch, events, is_running, kill)."""

    def __init__(self, workdir: Path, router_id: str, overrides: dict):
        self.id = router_id
        self.workdir = Path(workdir)
        self.data_dir = self.workdir / router_id
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.data_dir.chmod(0o777)  # the Dockerfile's image runs as an unprivileged user
        self.config_path = self.workdir / f"{router_id}.toml"
        self.log_path = self.workdir / f"{router_id}.container.log"
        self.config = merge_config(
            merge_config(DEFAULT_CONFIG, overrides), {"router": {"id": router_id, "data_dir": DATA_IN_CONTAINER}}
        )
        self.container = None
        self.host = self.port = self.epoch = None
        self.listeners: list[tuple[str, str, int]] = []

    def start(self, timeout: float = 60.0) -> ContainerRouter:
        from testcontainers.core.container import DockerContainer

        self.config_path.write_text(to_toml(self.config))
        container = (
            DockerContainer(IMAGE)
            .with_kwargs(network_mode="host", init=False)
            .with_volume_mapping(str(self.config_path), CONFIG_IN_CONTAINER, "ro")
            .with_volume_mapping(str(self.data_dir), DATA_IN_CONTAINER, "rw")
        )
        for path in HOST_MOUNTS:
            container.with_volume_mapping(path, path, "ro")
        self.container = container.start()
        deadline = time.monotonic() + timeout
        while True:
            match = READY_RE.search(self.logs())
            if match:
                self.listeners = parse_listeners(match["listeners"])
                first = next(item for item in self.listeners if item[0] == "normal")
                self.host, self.port, self.epoch = first[1], first[2], int(match["epoch"])
                return self
            if not self.is_running():
                raise AssertionError(f"router {self.id}'s container exited before it was ready:\n{self.logs()}")
            assert time.monotonic() < deadline, f"router {self.id} not ready in {timeout} s:\n{self.logs()}"
            time.sleep(0.05)

    def logs(self) -> str:
        out, err = self.container.get_logs()
        return (out + err).decode(errors="replace")

    def is_running(self) -> bool:
        if self.container is None:
            return False
        wrapped = self.container.get_wrapped_container()
        try:
            wrapped.reload()
        except Exception:  # noqa: BLE001 - removed
            return False
        return wrapped.status == "running"

    def check_alive(self, context: str = "") -> None:
        if not self.is_running():
            raise AssertionError(f"router {self.id}'s container is not running ({context}):\n{self.logs()}")

    def kill(self) -> None:
        """``docker kill``: SIGKILL to the router (PID 1 in its container)."""
        wrapped = self.container.get_wrapped_container()
        wrapped.kill()
        wrapped.wait(timeout=20)

    def stop(self) -> None:
        """SIGTERM (the router drains), then remove the container; its log is kept."""
        if self.container is None:
            return
        try:
            wrapped = self.container.get_wrapped_container()
            if self.is_running():
                wrapped.stop(timeout=20)
            self.log_path.write_text(self.logs())
        finally:
            self.container.stop()  # removes it
            self.container = None

    def events(self) -> list[dict]:
        return read_event_log(self.data_dir)

    @property
    def url(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def inter_router_port(self) -> int:
        return next(port for role, _, port in self.listeners if role == "inter-router")


class ContainerNetwork(RouterNetwork):
    """RouterNetwork's wiring (listeners on 127.0.0.1, port 0; the later router of a link
    dials the earlier), every router in a container on the host's network."""

    def start(self, timeout: float = 60.0) -> ContainerNetwork:
        for router_id in self.topology.routers:
            router = ContainerRouter(self.workdir, router_id, self._config_for(router_id))
            self.routers[router_id] = router
            router.start()
        self.wait_converged(timeout)
        return self

    def stop(self) -> None:
        for router in reversed(list(self.routers.values())):
            router.stop()


class ContainerScenario(Scenario):
    """test_kill's Scenario on containerised routers (clients in this process)."""

    def __init__(self, tmp_path: Path, publishers=("A", "B"), subscribers=("A", "B", "C")):
        self.dir = tmp_path
        self.pubs, self.subs = {}, {}
        self.net = ContainerNetwork(
            tmp_path / "routers",
            parse_topology(TRIANGLE),
            overrides={"delivery": {"record_linger": 1.0}, "failover": {"publisher_resume_timeout": 20}},
        )
        try:
            self._start(tmp_path, publishers, subscribers)
        except BaseException:
            self.close()  # a half-built network: its containers and clients go too
            raise

    def _start(self, tmp_path, publishers, subscribers):
        self.net.start()
        self.topic = "orders"
        self.received: dict[str, list] = defaultdict(list)
        self.outcomes: dict[str, list] = {}
        for where in subscribers:
            name = f"sub-{where}"
            self.subs[name] = ResumableSubscriber(
                self.urls(first=where),
                self.topic,
                container_id=name,
                link_name=f"{name}-link",
                state_path=tmp_path / f"{name}.state",
                ledger_path=tmp_path / f"{name}.ledger.jsonl",
                on_message=lambda msg, name=name: self.received[name].append(msg.body),
                heartbeat=1.0,
            )
            self.subs[name].start()
            assert self.subs[name].wait_attached(20)
        for where in publishers:
            name = f"pub-{where}"
            self.pubs[name] = ResumablePublisher(
                self.urls(first=where),
                self.topic,
                container_id=name,
                link_name=f"{name}-link",
                state_path=tmp_path / f"{name}.state",
                ledger_path=tmp_path / f"{name}.ledger.jsonl",
                heartbeat=1.0,
            )
            self.pubs[name].start()
            assert self.pubs[name].wait_attached(20)


@pytest.fixture
def container_scenario(tmp_path):
    made = []

    def make(**kw):
        made.append(ContainerScenario(tmp_path, **kw))
        return made[-1]

    yield make
    for s in made:
        s.close()


def test_kill_the_container_of_the_router_with_a_publisher_and_a_subscriber(container_scenario):
    s = container_scenario()
    threads = s.publish_in_background()
    s.wait_progress(40)
    killed_at = time.time()
    s.net.routers["A"].kill()
    assert not s.net.routers["A"].is_running()
    s.finish(threads)
    s.verify(dead={"A"})
    print(f"\nrecovery after killing A's container (publisher + subscriber): {s.recovery_time(killed_at, 'A'):.2f} s")
