"""[policy] (issue 18, part 4): who may publish, subscribe, connect and manage,
decided at open and attach on real routers, with identities from TLS client
certificates (their common name) or "anonymous"."""

from __future__ import annotations

import logging
import subprocess
import sys

import pytest
from proton import Message, SSLDomain
from proton.utils import BlockingConnection, SyncRequestResponse
from tlskit import Pki

from eorouter_tools.launcher import to_toml
from router import cli
from router.client import ResumablePublisher, ResumableSubscriber
from router.config import load_config

POLICY = {
    "default_group": "guests",
    "users": {"writer": ["writers"], "reader": ["readers"], "ops": ["operators"]},
    "groups": {
        "writers": {"publish": ["orders", "orders/#"], "max_connections": 2},
        "readers": {"subscribe": ["orders", "orders/+"]},
        "operators": {"admin": True},
        "guests": {"subscribe": ["news"], "max_connections": 1},
    },
}


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    return Pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture
def router(router_factory, pki):
    cert, key = pki.server()
    return router_factory(
        "A",
        policy=POLICY,
        listener=[
            {
                "host": "127.0.0.1",
                "port": 0,
                "tls_cert_file": str(cert),
                "tls_key_file": str(key),
                "tls_ca_file": str(pki.ca),
                "tls_require_client_cert": True,
                "tls_allow_plain": True,
            }
        ],
    )


def as_user(pki, user: str | None) -> SSLDomain:
    domain = SSLDomain(SSLDomain.MODE_CLIENT)
    domain.set_trusted_ca_db(str(pki.ca))
    domain.set_peer_authentication(SSLDomain.VERIFY_PEER_NAME)
    if user is not None:
        cert, key = pki.issue(f"user-{user}", user)
        domain.set_credentials(str(cert), str(key), None)
    return domain


def _url(router) -> str:
    return f"amqps://localhost:{router.port}"


def attach_error(router, pki, user, role: str, topic: str) -> str | None:
    """None if ``user`` may attach a ``role`` link to ``topic``, else the condition it got."""
    conn = BlockingConnection(_url(router), timeout=10, ssl_domain=as_user(pki, user))
    try:
        if role == "publisher":
            conn.create_sender(topic)
        else:
            conn.create_receiver(topic)
        return None
    except Exception as exc:  # noqa: BLE001 - proton's LinkDetached carries the condition
        return str(exc)
    finally:
        try:
            conn.close()
        except Exception:  # noqa: BLE001
            pass


@pytest.mark.parametrize(
    "user, role, topic, allowed",
    [
        ("writer", "publisher", "orders", True),
        ("writer", "publisher", "orders/eu/1", True),
        ("writer", "subscriber", "orders", False),
        ("writer", "publisher", "payroll", False),
        ("reader", "subscriber", "orders/eu", True),
        ("reader", "subscriber", "orders/eu/1", False),
        ("reader", "publisher", "orders", False),
        ("reader", "subscriber", "orders/+", True),  # a pattern its rule covers (issue 20)
        ("reader", "subscriber", "orders/#", False),  # would also take orders/eu/1
        ("reader", "subscriber", "#", False),
        ("stranger", "subscriber", "news", True),  # not listed: the default group
        ("stranger", "publisher", "news", False),
    ],
)
def test_attaches_follow_the_policy(router, pki, user, role, topic, allowed):
    error = attach_error(router, pki, user, role, topic)
    if allowed:
        assert error is None, error
    else:
        assert error is not None and "amqp:unauthorized-access" in error and repr(user) in error, error
    router.check_alive("after a refused attach")


def test_an_allowed_pair_carries_messages_exactly_once(router, pki, tmp_path):
    got: list = []
    sub = ResumableSubscriber(
        [_url(router)],
        "orders/eu",
        container_id="r",
        link_name="r-l",
        state_path=tmp_path / "r.state",
        ssl_domain=as_user(pki, "reader"),
        on_message=got.append,
    ).start()
    pub = ResumablePublisher(
        [_url(router)],
        "orders/eu",
        container_id="w",
        link_name="w-l",
        state_path=tmp_path / "w.state",
        ssl_domain=as_user(pki, "writer"),
    ).start()
    try:
        assert sub.wait_attached(10) and pub.wait_attached(10)
        assert {pub.send_async(f"m{i}").result(timeout=20).state for i in range(10)} == {"accepted"}
        assert [m.body for m in got] == [f"m{i}" for i in range(10)]
    finally:
        pub.close()
        sub.close()


def test_connection_limits_and_anonymous_clients(router, pki):
    held = [BlockingConnection(_url(router), timeout=10, ssl_domain=as_user(pki, "writer")) for _ in range(2)]
    try:
        with pytest.raises(Exception, match="resource-limit-exceeded"):
            BlockingConnection(_url(router), timeout=10, ssl_domain=as_user(pki, "writer")).create_sender("orders")
    finally:
        for conn in held:
            conn.close()
    # a plain client is "anonymous": the default group, limited to one connection, may subscribe to news only
    anon = BlockingConnection(f"amqp://127.0.0.1:{router.port}", timeout=10)
    try:
        anon.create_receiver("news")
        with pytest.raises(Exception, match="unauthorized-access"):
            anon.create_sender("news")
        with pytest.raises(Exception, match="resource-limit-exceeded"):
            BlockingConnection(f"amqp://127.0.0.1:{router.port}", timeout=10).create_receiver("news")
    finally:
        anon.close()
    router.check_alive("after refusing connections")


def test_management_needs_an_admin(router, pki):
    for user, allowed in (("ops", True), ("writer", False)):
        conn = BlockingConnection(_url(router), timeout=10, ssl_domain=as_user(pki, user))
        try:
            if allowed:
                reply = SyncRequestResponse(conn, "$management").call(
                    Message(properties={"operation": "QUERY", "type": "org.eorouter.router"}, body={})
                )
                assert reply.properties["statusCode"] == 200
            else:
                with pytest.raises(Exception, match="unauthorized-access"):
                    SyncRequestResponse(conn, "$management")
        finally:
            conn.close()


def test_a_bad_policy_is_a_config_error(router_factory):
    router = router_factory("A", start=False, policy={"users": {"u": ["nosuch"]}, "groups": {"g": {}}})
    router.spawn()
    assert router.wait_exit(20) == 2
    router.expected_exit = 2
    assert "policy.users.u" in router.stderr_since_start() and "'nosuch'" in router.stderr_since_start()
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            "import tomllib; from router.config import parse_config; "
            'parse_config(tomllib.loads(\'[router]\\nid="A"\\n[policy.groups.g]\\npublish=["a/#/b"]\\n\'),'
            " 'r.toml')",
        ],
        capture_output=True,
        text=True,
    )
    assert "'#' must be a whole level, and the last" in done.stderr


OPEN = "is reachable from other machines and authenticates no one"
NO_POLICY = "is reachable from other machines and has no [policy]"


@pytest.mark.parametrize(
    "host, logins, policy, expected",
    [
        ("0.0.0.0", "anonymous", False, OPEN),
        ("0.0.0.0", "anonymous", True, OPEN),  # a policy, but anyone is "anonymous"
        ("::", "anonymous", False, OPEN),
        ("0.0.0.0", "scram", False, NO_POLICY),
        ("0.0.0.0", "scram", True, None),
        ("0.0.0.0", "certificates", True, None),
        ("127.0.0.1", "anonymous", False, None),
        ("localhost", "anonymous", False, None),
    ],
)
def test_a_listener_other_machines_reach_without_authentication_is_warned_about(
    pki, tmp_path, caplog, host, logins, policy, expected
):
    """The start-up warning (cli._warn_if_open) on the config as an operator writes it.
    Never bound: the tests listen on loopback only. The router process calls the same
    function once its listeners are bound, naming each listener's bound port
    (test_sasl.py's PLAIN-in-clear warning, and the loopback router below, show the
    call in a real start)."""
    listener: dict = {"host": host, "port": 0}
    config: dict = {"router": {"id": "A"}}
    if logins == "scram":
        (tmp_path / "users.sasldb").write_bytes(b"")
        config["sasl"] = {"users_db": str(tmp_path / "users.sasldb")}
        listener["sasl_mechanisms"] = ["SCRAM-SHA-256"]
    elif logins == "certificates":
        cert, key = pki.server()
        listener.update(tls_cert_file=str(cert), tls_key_file=str(key), tls_ca_file=str(pki.ca), tls_require_client_cert=True)
    config["listener"] = [listener]
    if policy:
        config["policy"] = POLICY
    path = tmp_path / "router.toml"
    path.write_text(to_toml(config))
    with caplog.at_level(logging.WARNING, logger="eorouter"):
        cli._warn_if_open(load_config(path), [(host, 5999)])
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    if expected is None:
        assert warnings == []
    else:
        assert len(warnings) == 1 and expected in warnings[0], warnings
        assert warnings[0].startswith(f"listener {host}:5999 "), warnings


def test_an_open_router_on_loopback_starts_quietly_and_serves_anyone(router_factory):
    """The default when nothing is configured: on 127.0.0.1, today's open router and no warning."""
    router = router_factory("A")
    assert "reachable from other machines" not in router.stderr_since_start()
    conn = BlockingConnection(f"amqp://127.0.0.1:{router.port}", timeout=10)
    try:
        conn.create_sender("any/topic")
        conn.create_receiver("any/topic")
    finally:
        conn.close()
