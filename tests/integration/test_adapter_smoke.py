"""Smoke tests of the adapter and the router process: a real ``python -m router run``
on an ephemeral 127.0.0.1 port, real python-qpid-proton ``Container`` clients.

Self-contained on purpose (no conftest fixtures): these are the first tests to run
when the adapter changes, and must not depend on the larger suite's helpers.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from proton import Message
from proton.handlers import MessagingHandler
from proton.reactor import Container

pytestmark = pytest.mark.timeout(120)

REPO = Path(__file__).resolve().parents[2]
READY = re.compile(r"eorouter: router (\S+) ready on 127\.0\.0\.1:(\d+) epoch (\d+)")
TIMEOUT = 10.0


class Router:
    """One router subprocess, its config and data directory under ``workdir``."""

    def __init__(self, workdir: Path, router_id: str, extra: str = "", prelude: str | None = None):
        self.id = router_id
        self.workdir = workdir
        self.data_dir = workdir / "data"
        self.config = workdir / "router.toml"
        self.config.write_text(
            f'[router]\nid = "{router_id}"\ndata_dir = "{self.data_dir}"\n{extra}\n'
            '[[listener]]\nhost = "127.0.0.1"\nport = 0\n')
        self.stderr_path = workdir / "stderr"
        self._stderr = open(self.stderr_path, "wb")
        args = ["run", "--config", str(self.config)]
        if prelude is None:
            cmd = [sys.executable, "-m", "router", *args]
        else:  # test-only code run in the router process before the CLI
            cmd = [sys.executable, "-c", f"{prelude}\nfrom router.cli import main\nraise SystemExit(main({args!r}))"]
        self.proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.DEVNULL, stderr=self._stderr)
        self.port = self._wait_ready()
        self.url = f"127.0.0.1:{self.port}"

    def stderr(self) -> str:
        return self.stderr_path.read_text(errors="replace")

    def _wait_ready(self) -> int:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            match = READY.search(self.stderr())
            if match:
                assert match.group(1) == self.id
                return int(match.group(2))
            if self.proc.poll() is not None:
                raise AssertionError(f"router exited with {self.proc.returncode}:\n{self.stderr()}")
            time.sleep(0.02)
        self.proc.kill()
        raise AssertionError(f"router never printed its ready line:\n{self.stderr()}")

    def events(self) -> list[dict]:
        out = []
        for path in sorted((self.data_dir / "events").glob("*.jsonl")):
            out.extend(json.loads(line) for line in path.read_text().splitlines() if line.strip())
        return out

    def stop(self, signum=signal.SIGTERM, timeout: float = 20.0) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signum)
        try:
            return self.proc.wait(timeout)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait()
            self._stderr.close()


@pytest.fixture(scope="module")
def router(tmp_path_factory):
    r = Router(tmp_path_factory.mktemp("smoke"), "smoke")
    yield r
    code = r.stop()
    assert code == 0, f"exit code {code}:\n{r.stderr()}"


@pytest.fixture
def alive(router):
    assert router.proc.poll() is None, f"router died:\n{router.stderr()}"
    yield router
    assert router.proc.poll() is None, f"router died:\n{router.stderr()}"


class Scenario(MessagingHandler):
    """One subscriber and one publisher on one topic, over separate connections.
    ``self.error`` starts as the failure text and is cleared only on success."""

    def __init__(self, url: str, topic: str, *, count: int = 3, answer: str = "accept",
                 sasl: bool = True):
        super().__init__(auto_accept=False)
        self.url, self.topic, self.count, self.answer, self.sasl = url, topic, count, answer, sasl
        self.received: list = []
        self.outcomes: list[str] = []
        self.conditions: list = []
        self.sent = 0
        self.router_container: str | None = None
        self.error = "timed out"
        self.timer = None

    def on_start(self, event):
        self.timer = event.container.schedule(TIMEOUT, self)
        kw = {} if self.sasl else {"sasl_enabled": False}
        self.sub_conn = event.container.connect(self.url, **kw)
        self.receiver = event.container.create_receiver(self.sub_conn, self.topic, name="smoke-sub")

    def on_timer_task(self, event):
        event.container.stop()

    def on_connection_opened(self, event):
        self.router_container = event.connection.remote_container

    def on_link_opened(self, event):
        if event.link.name == "smoke-sub" and not hasattr(self, "sender"):
            kw = {} if self.sasl else {"sasl_enabled": False}
            self.pub_conn = event.container.connect(self.url, **kw)
            self.sender = event.container.create_sender(self.pub_conn, self.topic, name="smoke-pub")

    def on_sendable(self, event):
        while event.sender.credit and self.sent < self.count:
            event.sender.send(Message(body=f"m{self.sent}"))
            self.sent += 1

    def on_message(self, event):
        self.received.append(event.message.body)
        if self.answer == "accept":
            self.accept(event.delivery)
        else:
            self.reject(event.delivery)

    def _outcome(self, event, name):
        self.outcomes.append(name)
        self.conditions.append(event.delivery.remote.condition)
        if len(self.outcomes) == self.count:
            self.error = None
            self.timer.cancel()
            self.sub_conn.close()
            self.pub_conn.close()

    def on_accepted(self, event):
        self._outcome(event, "accepted")

    def on_rejected(self, event):
        self._outcome(event, "rejected")

    def on_released(self, event):
        self._outcome(event, "released")

    def on_modified(self, event):
        self._outcome(event, "modified")

    def on_transport_error(self, event):
        self.error = f"transport error: {event.transport.condition}"


def run(handler: Scenario) -> Scenario:
    Container(handler).run()
    assert handler.error is None, f"{handler.error}; outcomes={handler.outcomes} received={handler.received}"
    return handler


def test_publish_subscribe_accepted(alive):
    s = run(Scenario(alive.url, "t"))
    assert s.received == ["m0", "m1", "m2"]
    assert s.outcomes == ["accepted"] * 3
    assert s.router_container == "smoke", "the open frame carries the router id as container-id"


def test_subscriber_rejects_publisher_sees_rejected(alive):
    s = run(Scenario(alive.url, "t-reject", count=2, answer="reject"))
    assert s.received == ["m0", "m1"]
    assert s.outcomes == ["rejected", "rejected"]


def test_client_without_sasl(alive):
    s = run(Scenario(alive.url, "t-nosasl", count=2, sasl=False))
    assert s.outcomes == ["accepted", "accepted"]


def test_garbage_input_closes_only_that_connection(alive):
    with socket.create_connection(("127.0.0.1", alive.port), timeout=5) as sock:
        sock.sendall(b"GET / HTTP/1.0\r\n\r\n")
        data = b""
        while True:  # the router answers with an AMQP header + close, then EOF
            chunk = sock.recv(4096)
            if not chunk:
                break
            data += chunk
    assert data.startswith(b"AMQP")
    run(Scenario(alive.url, "t-after-garbage", count=1))


def test_idle_peer_is_cut_and_sigterm_exits_zero(tmp_path):
    r = Router(tmp_path, "idle", extra="idle_timeout = 0.5")
    try:
        with socket.create_connection(("127.0.0.1", r.port), timeout=5) as sock:
            sock.sendall(b"AMQP\x00\x01\x00\x00")  # a header, then silence
            start = time.monotonic()
            while sock.recv(4096):
                pass
            assert time.monotonic() - start < 4.0, "an idle peer is dropped after the idle timeout"
    finally:
        code = r.stop(signal.SIGTERM)
    assert code == 0, f"exit code {code}:\n{r.stderr()}"
    assert len(READY.findall(r.stderr())) == 1
    kinds = [e["event"] for e in r.events()]
    assert kinds[0] == "router-started"
    assert "router-stopping" in kinds


def test_sigterm_exits_zero_and_logs_router_stopping(tmp_path):
    r = Router(tmp_path, "stopper")
    s = run(Scenario(r.url, "t", count=1))
    assert s.outcomes == ["accepted"]
    code = r.stop(signal.SIGTERM)
    assert code == 0, f"exit code {code}:\n{r.stderr()}"
    assert len(READY.findall(r.stderr())) == 1
    assert "router-stopping" in [e["event"] for e in r.events()]
    assert os.path.exists(r.data_dir / "epoch")


# Makes the core raise a plain exception (a bug, not a ProtocolError) for one topic.
BOOM = """
from router.core import router as _r
from router.core.events import LinkAttached
_handle = _r.RouterCore.handle
def handle(self, event, now):
    if type(event) is LinkAttached and event.address == "boom":
        raise RuntimeError("injected core failure")
    return _handle(self, event, now)
_r.RouterCore.handle = handle
"""


class Boom(MessagingHandler):
    def __init__(self, url):
        super().__init__()
        self.url = url
        self.condition = None
        self.error = "timed out"

    def on_start(self, event):
        self.timer = event.container.schedule(TIMEOUT, self)
        conn = event.container.connect(self.url)
        event.container.create_sender(conn, "boom", name="boom-pub")

    def on_timer_task(self, event):
        event.container.stop()

    def on_connection_error(self, event):
        self.condition = event.connection.remote_condition
        self.error = None
        self.timer.cancel()
        event.connection.close()

    def on_transport_error(self, event):
        if self.condition is None:
            self.condition = event.transport.condition
            self.error = None
            self.timer.cancel()


def test_an_exception_closes_only_that_connection(tmp_path):
    r = Router(tmp_path, "boom", prelude=BOOM)
    try:
        handler = Boom(r.url)
        Container(handler).run()
        assert handler.error is None, handler.error
        assert handler.condition is not None and handler.condition.name == "amqp:internal-error", \
            handler.condition
        assert r.proc.poll() is None, "the router survives"
        s = run(Scenario(r.url, "t-after-boom", count=1))
        assert s.outcomes == ["accepted"]
        assert "injected core failure" in r.stderr(), "the traceback is logged"
    finally:
        code = r.stop()
    assert code == 0, f"exit code {code}:\n{r.stderr()}"
