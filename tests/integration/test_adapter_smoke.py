"""Smoke tests of the adapter: what a router process does at the connection level that
the delivery-rule, bad-input and shutdown modules do not already cover.

- the open frame names the router (container-id = router id);
- a client without a SASL layer (bare AMQP header) is served like any other;
- non-AMQP bytes close *that* connection only: live connections carry on;
- a silent peer is cut after the idle timeout, a peer that keeps alive is not;
- an exception inside the router (a bug, injected here through a ``prelude`` run in
  the router process) closes only the connection it happened on, with
  ``amqp:internal-error``, and is logged with its traceback.

Covered elsewhere and so not repeated here: publish/subscribe and outcomes
(test_delivery_rule.py), garbage bytes not killing the router (test_bad_input.py),
the ready line, SIGTERM exit 0 and ``router-stopping`` (test_shutdown.py).
"""

from __future__ import annotations

import socket
import time

import pytest
from amqpclients import assert_round_trip, unique

pytestmark = pytest.mark.timeout(90)


def _host_port(router) -> tuple[str, int]:
    return router.host, router.port


def _read_until_eof(sock: socket.socket) -> bytes:
    data = b""
    while True:
        chunk = sock.recv(4096)
        if not chunk:
            return data
        data += chunk


def _pub_sub(amqp, router, topic, **connect):
    """A subscriber and a publisher of ``topic``, each on its own connection."""
    sub = amqp.connect(router.url, **connect).subscriber(topic, credit=10, auto_accept=True)
    pub = amqp.connect(router.url, **connect).publisher(topic)
    return pub, sub


def _send_accepted(amqp, pub, sub, body, what):
    before = len(sub.received)
    sent = pub.send(body)
    amqp.wait(lambda: sent.outcome, what=f"{what}: publisher outcome")
    assert sent.outcome == "accepted", f"{what}: {sent!r}"
    assert sub.bodies()[before:] == [body], f"{what}: subscriber got {sub.received[before:]!r}"


def test_open_frame_carries_the_router_id_as_container_id(router, amqp):
    conn = amqp.connect(router.url)
    assert conn.connection.remote_container == router.id


def test_client_without_sasl(router, amqp):
    pub, sub = _pub_sub(amqp, router, unique("nosasl"), sasl=False)
    for i in range(2):
        _send_accepted(amqp, pub, sub, f"m{i}", "client without SASL")


def test_non_amqp_bytes_close_only_that_connection(router, amqp):
    pub, sub = _pub_sub(amqp, router, unique("bystander"))
    _send_accepted(amqp, pub, sub, "before", "before the garbage")
    with socket.create_connection(_host_port(router), timeout=5) as sock:
        sock.sendall(b"GET / HTTP/1.0\r\n\r\n")
        data = _read_until_eof(sock)  # the router answers with an AMQP header + close, then EOF
    assert data.startswith(b"AMQP"), data[:64]
    assert not pub.conn.gone and not sub.conn.gone, "only the garbage connection is closed"
    _send_accepted(amqp, pub, sub, "after", "existing connections after the garbage")


def test_idle_peer_is_cut_after_the_idle_timeout(router_factory, amqp):
    idle_timeout = 0.5
    router = router_factory("I", router={"idle_timeout": idle_timeout})
    with socket.create_connection(_host_port(router), timeout=10) as sock:
        sock.sendall(b"AMQP\x00\x01\x00\x00")  # a header, then silence
        start = time.monotonic()
        _read_until_eof(sock)
        elapsed = time.monotonic() - start
    assert elapsed < 4.0, f"a silent peer must be dropped after the idle timeout (took {elapsed:.2f}s)"
    # A peer that is quiet but sends proton's keepalives (at half the router's advertised
    # idle timeout) stays connected: three idle timeouts with no traffic of its own.
    pub, sub = _pub_sub(amqp, router, unique("keepalive"))
    amqp.pump(3 * idle_timeout)
    assert not pub.conn.gone and not sub.conn.gone, (pub.conn.remote_condition, pub.conn.transport_condition)
    _send_accepted(amqp, pub, sub, "still here", "after a quiet spell")


# Makes the core raise a plain exception (a bug, not a ProtocolError) when a link
# attaches to the topic "boom". Runs in the router process before its __main__.
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


def test_an_exception_closes_only_that_connection(router_factory, amqp):
    router = router_factory("B", prelude=BOOM)
    pub, sub = _pub_sub(amqp, router, unique("bystander"))
    doomed = amqp.connect(router.url)
    link = doomed.publisher("boom", wait=False)
    amqp.wait(lambda: doomed.gone, what="the router closing the connection whose attach failed")
    condition = doomed.remote_condition or doomed.transport_condition
    assert condition is not None and condition.name == "amqp:internal-error", condition
    assert "injected core failure" in (condition.description or ""), condition
    assert not link.remote_opened, "the failed attach is not answered"
    assert not pub.conn.gone and not sub.conn.gone, "other connections are untouched"
    _send_accepted(amqp, pub, sub, "after boom", "a bystander after the failure")
    assert_round_trip(amqp, router, "new connections after the failure")
    router.check_alive("a core exception must not kill the router")
    stderr = router.stderr_since_start()
    assert "injected core failure" in stderr and "Traceback" in stderr, "the traceback is logged"
