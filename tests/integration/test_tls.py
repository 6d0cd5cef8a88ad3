"""TLS on listeners and connectors (issue 18, part 1), through Qpid Proton's
OpenSSL layer, on real router processes with certificates made by openssl.
Clients dial "localhost": Qpid Proton verifies a server's certificate by name
(DNS names and the common name), not by IP address."""

from __future__ import annotations

import json
import socket
import ssl
import subprocess
import sys

import pytest
from amqpclients import unique
from proton import SSLDomain
from proton.utils import BlockingConnection
from tlskit import Pki

from router.client import ResumablePublisher, ResumableSubscriber

SECRET = {"network": {"secret": "tls-test-secret"}}


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    return Pki(tmp_path_factory.mktemp("pki"))


def client_tls(pki, cert=None, key=None, ca=None) -> SSLDomain:
    domain = SSLDomain(SSLDomain.MODE_CLIENT)
    domain.set_trusted_ca_db(str(ca or pki.ca))
    domain.set_peer_authentication(SSLDomain.VERIFY_PEER_NAME)
    if cert is not None:
        domain.set_credentials(str(cert), str(key), None)
    return domain


def tls_listener(pki, **extra) -> dict:
    cert, key = pki.server()
    return {"host": "127.0.0.1", "port": 0, "tls_cert_file": str(cert), "tls_key_file": str(key), **extra}


def _connects(url: str, ssl_domain=None) -> bool:
    try:
        conn = BlockingConnection(url, timeout=5, ssl_domain=ssl_domain)
    except Exception:  # noqa: BLE001 - any refusal: TLS failure, closed, timed out
        return False
    conn.close()
    return True


def test_resumable_clients_publish_and_subscribe_over_tls(router_factory, pki, tmp_path):
    """amqps:// with the routers' CA: every message accepted and delivered once, in order."""
    router = router_factory("A", listener=[tls_listener(pki)])
    url = f"amqps://localhost:{router.port}"
    topic = unique("tls")
    got: list = []
    sub = ResumableSubscriber(
        [url],
        topic,
        container_id="tls-sub",
        link_name="tls-sub-l",
        state_path=tmp_path / "sub.state",
        ssl_domain=client_tls(pki),
        on_message=got.append,
    ).start()
    pub = ResumablePublisher(
        [url], topic, container_id="tls-pub", link_name="tls-pub-l", state_path=tmp_path / "pub.state", ssl_domain=client_tls(pki)
    ).start()
    try:
        assert sub.wait_attached(10) and pub.wait_attached(10)
        results = [pub.send_async(f"m{i}") for i in range(20)]
        assert {f.result(timeout=20).state for f in results} == {"accepted"}
        assert [m.body for m in got] == [f"m{i}" for i in range(20)]
    finally:
        pub.close()
        sub.close()
    with pytest.raises(ValueError, match="amqps:// URLs need ssl_domain"):
        ResumablePublisher([url], topic, container_id="x", link_name="y", state_path=tmp_path / "x.state")


def test_plain_clients_are_refused_unless_allowed(router_factory, pki):
    strict = router_factory("A", listener=[tls_listener(pki)])
    assert not _connects(f"amqp://127.0.0.1:{strict.port}")
    assert _connects(f"amqps://localhost:{strict.port}", client_tls(pki))
    lenient = router_factory("B", listener=[tls_listener(pki, tls_allow_plain=True)])
    assert _connects(f"amqp://127.0.0.1:{lenient.port}")
    assert _connects(f"amqps://localhost:{lenient.port}", client_tls(pki))
    strict.check_alive("after refusing a plain client")


def test_client_certificates_when_required(router_factory, pki, tmp_path):
    router = router_factory("A", listener=[tls_listener(pki, tls_require_client_cert=True, tls_ca_file=str(pki.ca))])
    url = f"amqps://localhost:{router.port}"
    assert not _connects(url, client_tls(pki))  # no certificate
    cert, key = pki.issue("app", "app-client")
    assert _connects(url, client_tls(pki, cert, key))
    stranger = Pki(tmp_path / "other-ca")
    other_cert, other_key = stranger.issue("stranger", "stranger")
    assert not _connects(url, client_tls(pki, other_cert, other_key))  # a CA the router does not trust
    # and a server certificate the client does not trust: the client refuses the router
    assert not _connects(url, client_tls(pki, cert, key, ca=stranger.ca))


def test_expired_certificates_are_refused(router_factory, pki):
    """A client's expired certificate is refused by the router (which goes on serving);
    a router's expired certificate is refused by the client."""
    router = router_factory("A", listener=[tls_listener(pki, tls_require_client_cert=True, tls_ca_file=str(pki.ca))])
    url = f"amqps://localhost:{router.port}"
    old_cert, old_key = pki.expired("old-client", "old-client")
    assert not _connects(url, client_tls(pki, old_cert, old_key))
    cert, key = pki.issue("fresh-client", "fresh-client")
    assert _connects(url, client_tls(pki, cert, key))
    router.check_alive("after an expired client certificate")
    server_cert, server_key = pki.expired("old-server", "localhost", ("DNS:localhost",))
    stale = router_factory(
        "B", listener=[{"host": "127.0.0.1", "port": 0, "tls_cert_file": str(server_cert), "tls_key_file": str(server_key)}]
    )
    assert not _connects(f"amqps://localhost:{stale.port}", client_tls(pki))


def _handshake(port: int, pki, maximum=None) -> str:
    """A raw TLS handshake (Python's own ``ssl``, not proton) with at most ``maximum``:
    the version agreed, or the error of a refused handshake."""
    context = ssl.create_default_context(cafile=str(pki.ca))
    if maximum is not None:
        context.maximum_version = maximum
    with socket.create_connection(("127.0.0.1", port), timeout=5) as raw:
        try:
            with context.wrap_socket(raw, server_hostname="localhost") as tls:
                return str(tls.version())
        except (ssl.SSLError, OSError) as exc:
            return f"refused: {exc}"


def test_tls_min_protocol_refuses_older_clients(router_factory, pki):
    """A listener with ``tls_min_protocol = "TLSv1.3"`` refuses a client that speaks at
    most TLS 1.2 during the handshake, while a TLS 1.3 client connects, and the
    router goes on serving; the default minimum (TLS 1.2) takes that same client."""
    router = router_factory("A", listener=[tls_listener(pki, tls_min_protocol="TLSv1.3"), tls_listener(pki)])
    strict, default = (p for role, _, p in router.listeners if role == "normal")
    refused = _handshake(strict, pki, maximum=ssl.TLSVersion.TLSv1_2)
    assert refused.startswith("refused:") and "protocol version" in refused.lower(), refused
    assert _handshake(strict, pki) == "TLSv1.3"
    assert _connects(f"amqps://localhost:{strict}", client_tls(pki))
    router.check_alive("after refusing a TLS 1.2 client")
    assert _handshake(default, pki, maximum=ssl.TLSVersion.TLSv1_2) == "TLSv1.2"
    assert _connects(f"amqps://localhost:{default}", client_tls(pki))


def test_an_encrypted_key_opens_with_its_password_file(router_factory, pki):
    cert, key = pki.issue("locked", "localhost", ("DNS:localhost", "IP:127.0.0.1"), password="s3cret")
    router = router_factory(
        "A",
        listener=[
            {
                "host": "127.0.0.1",
                "port": 0,
                "tls_cert_file": str(cert),
                "tls_key_file": str(key),
                "tls_key_password_file": str(pki.dir / "locked.password"),
            }
        ],
    )
    assert _connects(f"amqps://localhost:{router.port}", client_tls(pki))


@pytest.mark.parametrize("case", ["missing-file", "wrong-key", "wrong-password", "ca-needed", "half-pair"])
def test_bad_tls_settings_are_clear_errors(router_factory, pki, case):
    cert, key = pki.server()
    other_cert, other_key = pki.issue("other", "other")
    locked_cert, locked_key = pki.issue("locked2", "localhost", password="right")
    (pki.dir / "wrong.password").write_text("wrong\n")
    listener = {
        "missing-file": {"tls_cert_file": str(pki.dir / "nope.pem"), "tls_key_file": str(key)},
        "wrong-key": {"tls_cert_file": str(cert), "tls_key_file": str(other_key)},
        "wrong-password": {
            "tls_cert_file": str(locked_cert),
            "tls_key_file": str(locked_key),
            "tls_key_password_file": str(pki.dir / "wrong.password"),
        },
        "ca-needed": {"tls_cert_file": str(cert), "tls_key_file": str(key), "tls_require_client_cert": True},
        "half-pair": {"tls_cert_file": str(cert)},
    }[case]
    expected = {
        "missing-file": "no such file",
        "wrong-key": "cannot load the certificate",
        "wrong-password": "cannot load the certificate",
        "ca-needed": "tls_ca_file",
        "half-pair": "tls_key_file",
    }[case]
    router = router_factory("A", start=False, listener=[{"host": "127.0.0.1", "port": 0, **listener}])
    router.spawn()
    assert router.wait_exit(20) == 2
    router.expected_exit = 2
    stderr = router.stderr_since_start()
    assert expected in stderr and "Traceback" not in stderr, stderr


def test_routers_talk_over_mutual_tls(router_factory, pki, amqp):
    """A's inter-router listener speaks TLS and requires a certificate from the
    network's CA; B dials it over TLS with its own, each certificate naming its
    router id: the two connect, and a message published at B reaches A's
    subscriber. A third router whose certificate names another router is refused,
    and the refusal is logged."""
    port_probe = __import__("socket").socket()
    port_probe.bind(("127.0.0.1", 0))
    port = port_probe.getsockname()[1]
    port_probe.close()
    a_cert, a_key = pki.issue("router-a", "A", ("DNS:localhost",))  # its name for TLS, its router id for us
    a = router_factory(
        "A",
        **SECRET,
        listener=[
            {"host": "127.0.0.1", "port": 0},
            {
                "host": "127.0.0.1",
                "port": port,
                "role": "inter-router",
                "tls_cert_file": str(a_cert),
                "tls_key_file": str(a_key),
                "tls_require_client_cert": True,
                "tls_ca_file": str(pki.ca),
            },
        ],
    )
    b_cert, b_key = pki.issue("router-b", "B")
    b = router_factory(
        "B",
        **SECRET,
        connector=[
            {
                "host": "127.0.0.1",
                "port": port,
                "role": "inter-router",
                "tls": True,
                "tls_ca_file": str(pki.ca),
                # proton checks names, not IP addresses: the
                # certificate's name, for the address dialled
                "tls_server_name": "localhost",
                "tls_cert_file": str(b_cert),
                "tls_key_file": str(b_key),
            }
        ],
    )

    def network_of(router):
        done = subprocess.run(
            [sys.executable, "-m", "router", "stat", "-b", f"127.0.0.1:{router.port}", "--network", "--json"],
            capture_output=True,
            text=True,
            timeout=30,
        )
        return {r["name"]: r for r in map(json.loads, done.stdout.splitlines())}

    amqp.wait(lambda: network_of(b).get("A", {}).get("up"), what="B connected to A over TLS", timeout=30)
    topic = unique("mtls")
    sub = amqp.connect(a.url).subscriber(topic, auto_accept=True)
    sub.wait_attached()
    amqp.wait(
        lambda: "A" in {r for r, p in network_of(b).items() if p["subscribers"]}, what="A's subscriber known at B", timeout=30
    )
    pub = amqp.connect(b.url).publisher(topic)
    sent = [pub.send(f"x{i}") for i in range(5)]
    amqp.wait(lambda: all(s.outcome for s in sent), what="outcomes", timeout=30)
    assert [s.outcome for s in sent] == ["accepted"] * 5
    assert sub.bodies() == [f"x{i}" for i in range(5)]

    # C presents a certificate of the network's CA that names B: A refuses it.
    c_cert, c_key = pki.issue("router-c-as-b", "B")
    c = router_factory(
        "C",
        **SECRET,
        connector=[
            {
                "host": "127.0.0.1",
                "port": port,
                "role": "inter-router",
                "tls": True,
                "tls_ca_file": str(pki.ca),
                "tls_server_name": "localhost",
                "tls_cert_file": str(c_cert),
                "tls_key_file": str(c_key),
            }
        ],
    )
    amqp.wait(
        lambda: any(e["event"] == "peer-refused" and e.get("peer") == "C" for e in a.events()), what="A to refuse C", timeout=30
    )
    refusal = next(e for e in a.events() if e["event"] == "peer-refused" and e.get("peer") == "C")
    assert "certificate names 'B', not the router id 'C'" in refusal["reason"]
    assert not network_of(c).get("A", {}).get("up")


@pytest.mark.parametrize(
    "entry, key, message",
    [
        ({"role": "inter-router", "tls_ca_file": "CA"}, "tls_require_client_cert", "expected true"),
    ],
)
def test_inter_router_tls_is_mutual(pki, tmp_path, entry, key, message):
    import tomllib

    from router.config import ConfigError, parse_config

    cert, tls_key = pki.server()
    listener = {
        "host": "127.0.0.1",
        "port": 5673,
        "tls_cert_file": str(cert),
        "tls_key_file": str(tls_key),
        **{k: (str(pki.ca) if v == "CA" else v) for k, v in entry.items()},
    }
    text = '[router]\nid = "A"\n[network]\nsecret = "s"\n[[listener]]\n' + "".join(
        f"{k} = {json.dumps(v)}\n" for k, v in listener.items()
    )
    with pytest.raises(ConfigError) as err:
        parse_config(tomllib.loads(text), str(tmp_path / "r.toml"))
    assert key in str(err.value) and message in str(err.value)
    connector = (
        '[router]\nid = "A"\n[network]\nsecret = "s"\n[[connector]]\nhost = "h"\nport = 1\n'
        f'role = "inter-router"\ntls = true\ntls_ca_file = {json.dumps(str(pki.ca))}\n'
    )
    with pytest.raises(ConfigError, match="tls_cert_file"):
        parse_config(tomllib.loads(connector), str(tmp_path / "r.toml"))


def test_mutual_tls_alone_and_the_failover_list_names_tls_routers(router_factory, pki, amqp):
    """No network secret: mutual TLS alone lets A and B in (each certificate names its
    router id). B's clients are offered A's TLS listener as amqps in the failover
    list. C, which has a secret, is refused by A (their proofs differ)."""
    from proton.utils import BlockingConnection as Blocking

    a_cert, a_key = pki.issue("router-a2", "A", ("DNS:localhost",))
    server_cert, server_key = pki.server()
    a = router_factory(
        "A",
        listener=[
            {"host": "127.0.0.1", "port": 0, "tls_cert_file": str(server_cert), "tls_key_file": str(server_key)},
            {
                "host": "127.0.0.1",
                "port": 0,
                "role": "inter-router",
                "tls_cert_file": str(a_cert),
                "tls_key_file": str(a_key),
                "tls_require_client_cert": True,
                "tls_ca_file": str(pki.ca),
            },
        ],
    )

    def dial(router_id: str) -> dict:
        cert, key = pki.issue(f"router-{router_id.lower()}2", router_id)
        return {
            "host": "127.0.0.1",
            "port": a.inter_router_port,
            "role": "inter-router",
            "tls": True,
            "tls_ca_file": str(pki.ca),
            "tls_server_name": "localhost",
            "tls_cert_file": str(cert),
            "tls_key_file": str(key),
        }

    b = router_factory("B", connector=[dial("B")])

    def failover_list() -> list:
        conn = Blocking(b.url, timeout=10)
        try:
            props = {str(k): v for k, v in (conn.conn.remote_properties or {}).items()}
            return [{str(k): v for k, v in e.items()} for e in props.get("failover-server-list", [])]
        finally:
            conn.close()

    amqp.wait(lambda: failover_list(), what="A in B's failover list (B connected to A without a secret)", timeout=30)
    (entry,) = failover_list()
    assert entry["scheme"] == "amqps" and entry["port"] == str(a.port)

    c = router_factory("C", **SECRET, connector=[dial("C")])
    amqp.wait(
        lambda: any(e["event"] == "peer-refused" and e.get("peer") == "C" for e in a.events() + c.events()),
        what="C refused",
        timeout=30,
    )
    refusal = next(e for e in a.events() + c.events() if e["event"] == "peer-refused" and e.get("peer") in ("A", "C"))
    assert "secrets differ" in refusal["reason"], refusal
