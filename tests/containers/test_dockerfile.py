"""The repository's Dockerfile, built with ``docker build`` and checked: the compiled fast
path (setup.py, router/adapter/_fastpath.c) is in the image, and a router started from the
image's own entrypoint runs on it, answers a client and stops cleanly on SIGTERM.

Issue 14: the Dockerfile copied pyproject.toml but not setup.py, and its base image has
no C compiler, so an image built from it silently ran the slower Python path.

The build needs the Dockerfile's base image (``ARG BASE``, default python:3.11-slim) in
the engine already: no image registry is reachable from these machines. Set
``EOROUTER_DOCKER_BASE`` to another local Debian-based image with Python 3.11+ (and
apt sources) to build on that; ``scripts/containers`` makes one with debootstrap when it
can. The build itself needs the package indexes (apt, PyPI) through the host's network.
Without an engine, or without the base image, the tests are skipped with the reason.
"""

from __future__ import annotations

import os
import re
import time
from pathlib import Path

import pytest

from eorouter_tools.launcher import DEFAULT_CONFIG, READY_RE, merge_config, parse_listeners, to_toml

REPO = Path(__file__).resolve().parents[2]
TAG = "eorouter-dockerfile:test"


def _dockerfile_base() -> str:
    match = re.search(r"^ARG BASE=(\S+)$", (REPO / "Dockerfile").read_text(), re.M)
    assert match, "the Dockerfile names its base image in ARG BASE=..."
    return match.group(1)


BASE = os.environ.get("EOROUTER_DOCKER_BASE") or _dockerfile_base()


def _problem() -> str | None:
    try:
        import docker
    except ImportError as err:
        return f"the docker package is not installed ({err}); pip install -e '.[test]'"
    try:
        client = docker.from_env(timeout=5)
        client.ping()
    except Exception as err:  # noqa: BLE001 - any failure means: no engine here
        where = os.environ.get("DOCKER_HOST", "the default socket")
        return (
            f"no Docker engine reachable at {where} ({type(err).__name__}); "
            f"sudo scripts/containers starts a private one and runs this suite"
        )
    try:
        client.images.get(BASE)
    except docker.errors.ImageNotFound:
        return (
            f"cannot build the Dockerfile: its base image {BASE} is not in the engine and no image registry "
            f"is reachable to pull it (docker pull {BASE} where one is, or set EOROUTER_DOCKER_BASE to a "
            f"local Debian-based image with Python 3.11+)"
        )
    finally:
        client.close()
    return None


_PROBLEM = _problem()
if _PROBLEM:
    print(f"\ntests/containers/test_dockerfile.py: skipped: {_PROBLEM}")
pytestmark = [pytest.mark.containers, pytest.mark.timeout(1800), pytest.mark.skipif(_PROBLEM is not None, reason=_PROBLEM or "")]


@pytest.fixture(scope="module")
def docker_client():
    import docker

    client = docker.from_env(timeout=1800)
    yield client
    client.close()


@pytest.fixture(scope="module")
def image(docker_client):
    import docker

    try:
        built, _ = docker_client.images.build(
            path=str(REPO), tag=TAG, buildargs={"BASE": BASE}, network_mode="host", rm=True, forcerm=True, pull=False
        )
    except docker.errors.BuildError as err:
        log = "".join(str(chunk.get("stream") or chunk.get("error") or "") for chunk in err.build_log)
        pytest.fail(f"docker build of the Dockerfile (BASE={BASE}) failed: {err.msg}\n{log[-6000:]}")
    yield built
    try:
        docker_client.images.remove(built.id, force=True)
    except docker.errors.APIError:
        pass


def test_the_image_holds_the_compiled_fast_path(docker_client, image):
    out = docker_client.containers.run(
        TAG,
        entrypoint=[
            "python3",
            "-c",
            "from router.adapter import _fastpath, fastpath; print(fastpath.status, _fastpath.__file__)",
        ],
        working_dir="/",
        remove=True,
    )
    status, path = out.decode().split()
    assert status == "compiled", out
    assert path.startswith("/opt/eorouter/lib/python3.") and path.endswith(".so"), out


def test_a_router_from_the_image_runs_on_the_compiled_path(docker_client, image, tmp_path):
    from amqpclients import Harness, unique  # tests/integration, on sys.path by conftest.py

    data = tmp_path / "data"
    data.mkdir()
    data.chmod(0o777)  # the image runs as an unprivileged user
    config = tmp_path / "router.toml"
    config.write_text(to_toml(merge_config(DEFAULT_CONFIG, {"router": {"id": "D", "data_dir": "/var/lib/eorouter"}})))
    container = docker_client.containers.run(
        TAG,
        detach=True,
        network_mode="host",
        volumes={
            str(config): {"bind": "/etc/eorouter/router.toml", "mode": "ro"},
            str(data): {"bind": "/var/lib/eorouter", "mode": "rw"},
        },
    )
    try:
        deadline = time.monotonic() + 60
        while not (ready := READY_RE.search(logs := container.logs().decode(errors="replace"))):
            container.reload()
            assert container.status == "running", f"the router's container exited:\n{logs}"
            assert time.monotonic() < deadline, f"no ready line in 60 s:\n{logs}"
            time.sleep(0.1)
        assert "subscribers' accepted dispositions and publishers' whole messages: compiled path" in logs, logs
        ((_, host, port),) = parse_listeners(ready["listeners"])
        harness = Harness(timeout=10.0)
        try:
            topic = unique("docker")
            sub = harness.connect(f"{host}:{port}").subscriber(topic, auto_accept=True)
            sub.wait_attached()
            sent = harness.connect(f"{host}:{port}").publisher(topic).send("from a container")
            harness.wait(lambda: sent.outcome, what="the outcome from the containerised router")
            assert sent.outcome == "accepted" and sub.bodies() == ["from a container"]
        finally:
            harness.close()
        container.stop(timeout=20)  # SIGTERM: drain, exit 0
        assert container.wait(timeout=30)["StatusCode"] == 0, container.logs().decode(errors="replace")
    finally:
        container.remove(force=True)
