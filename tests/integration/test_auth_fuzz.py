"""TLS and SASL under hostile input (issue 18): garbage after the protocol headers,
handshakes cut short at any byte, stalled handshakes and floods of failed logins,
sent over raw sockets to a real router. The router stays up, keeps serving a good
client, and its memory stays flat."""

from __future__ import annotations

import socket
import ssl
import struct
import threading

import proton
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_memory_budget import rss
from test_sasl import login, passwd
from tlskit import Pki

pytestmark = pytest.mark.skipif(not proton.SASL.extended(), reason="Qpid Proton built without Cyrus SASL")

SASL_HEADER = b"AMQP\x03\x01\x00\x00"
TLS_HEADER = b"AMQP\x02\x01\x00\x00"
AMQP_HEADER = b"AMQP\x00\x01\x00\x00"


@pytest.fixture(scope="module")
def router(module_router_factory, tmp_path_factory):
    pki = Pki(tmp_path_factory.mktemp("pki"))
    db = tmp_path_factory.mktemp("sasl") / "users.sasldb"
    passwd(db, "alice", "alice-secret")
    cert, key = pki.server()
    r = module_router_factory(
        "A",
        sasl={"users_db": str(db), "login_failure_delay": 0.2},
        listener=[
            {
                "host": "127.0.0.1",
                "port": 0,
                "tls_cert_file": str(cert),
                "tls_key_file": str(key),
                "sasl_mechanisms": ["PLAIN", "SCRAM-SHA-256"],
            },
            {"host": "127.0.0.1", "port": 0, "sasl_mechanisms": ["SCRAM-SHA-256"]},
        ],
        router={"idle_timeout": 1.0},  # stalled handshakes are cut after this
    )
    r.pki = pki
    return r


def ports(router) -> tuple[int, int]:
    tls_port, plain_port = [p for role, _, p in router.listeners if role == "normal"]
    return tls_port, plain_port


def client_hello() -> bytes:
    """The first flight of a real TLS client: a ClientHello, as bytes."""
    ctx = ssl.create_default_context()
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    tls = ctx.wrap_bio(incoming, outgoing, server_hostname="localhost")
    try:
        tls.do_handshake()
    except ssl.SSLWantReadError:
        pass
    return outgoing.read()


HELLO = client_hello()


def sasl_init(mech: bytes, response: bytes) -> bytes:
    """A SASL frame carrying sasl-init (descriptor 0x41): mechanism and initial response."""
    body = b"\x00\x53\x41" + _list([b"\xa3" + bytes([len(mech)]) + mech, b"\xb0" + struct.pack(">I", len(response)) + response])
    return struct.pack(">IBBH", 8 + len(body), 2, 1, 0) + body


def _list(items: list[bytes]) -> bytes:
    payload = b"".join(items)
    return b"\xd0" + struct.pack(">II", len(payload) + 4, len(items)) + payload


def send_and_drop(port: int, data: bytes, read: bool = True) -> None:
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        try:
            s.sendall(data)
            if read:
                s.settimeout(0.5)
                try:
                    s.recv(4096)
                except (TimeoutError, OSError):
                    pass
        except OSError:
            pass  # the router may cut us first: that is its right


def still_serving(router) -> None:
    router.check_alive("after hostile input")
    url = f"amqp://127.0.0.1:{ports(router)[1]}"
    assert login(url, user="alice@eorouter", password="alice-secret", mechs="SCRAM-SHA-256") is None


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    header=st.sampled_from([SASL_HEADER, TLS_HEADER, AMQP_HEADER, b"", HELLO]),
    garbage=st.binary(min_size=0, max_size=300),
    tls_port=st.booleans(),
)
def test_garbage_after_a_header(router, header, garbage, tls_port):
    send_and_drop(ports(router)[0 if tls_port else 1], header + garbage)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(cut=st.integers(min_value=0, max_value=len(HELLO) - 1), read=st.booleans())
def test_a_tls_handshake_cut_at_any_byte(router, cut, read):
    send_and_drop(ports(router)[0], HELLO[:cut], read=read)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    mech=st.sampled_from([b"PLAIN", b"SCRAM-SHA-256", b"GSSAPI", b"", b"x" * 200]),
    response=st.binary(max_size=200),
    cut=st.integers(min_value=0, max_value=400),
)
def test_sasl_init_whole_cut_or_bogus(router, mech, response, cut):
    frame = sasl_init(mech, response)
    send_and_drop(ports(router)[1], SASL_HEADER + frame[: cut or len(frame)])


def test_the_router_survives_it_all_and_its_memory_stays_flat(router):
    """A flood of each kind, twice: the second round must not grow the router's memory
    (what a failed login or a cut handshake holds is freed). A good client is served
    throughout."""
    tls_port, plain_port = ports(router)

    def flood(n: int) -> None:
        def one(i: int) -> None:
            kind = i % 5
            if kind == 0:
                send_and_drop(tls_port, HELLO[: (i * 37) % len(HELLO)])
            elif kind == 1:
                send_and_drop(plain_port, SASL_HEADER + sasl_init(b"PLAIN", b"\x00alice@eorouter\x00wrong"))
            elif kind == 2:
                send_and_drop(plain_port, SASL_HEADER + bytes(range(256)) * 2)
            elif kind == 3:
                send_and_drop(tls_port, TLS_HEADER + b"\x16\x03\x01" + b"\xff" * 500)
            else:  # a stalled handshake: connect, say half a header, go quiet
                with socket.create_connection(("127.0.0.1", plain_port), timeout=5) as s:
                    s.sendall(SASL_HEADER[:4])

        threads = [threading.Thread(target=lambda k=k: [one(k + j * 8) for j in range(n // 8)]) for k in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)

    flood(400)
    still_serving(router)
    settled = rss(router.proc.pid)
    flood(1200)
    still_serving(router)
    grown = rss(router.proc.pid) - settled
    assert grown < 8 * 1024 * 1024, f"the router grew {grown / 1e6:.1f} MB over 1,200 hostile connections"
    still_serving(router)
