"""The interop peers over TLS with SASL logins (issue 18): rhea with PLAIN, python-qpid-proton with
EXTERNAL (its client certificate), Proton C with PLAIN and with EXTERNAL, a mixed pair, each
publishing and subscribing exactly-once through one real router; and the refusals (a wrong password,
a certificate from a CA the router does not trust), after which the router still serves.

The router has three listeners, all TLS with a server certificate for ``localhost`` (the peers dial
``localhost``: Qpid Proton checks a server's certificate by name, not by IP address):

- ``password``: SASL PLAIN and SCRAM-SHA-256 against a sasldb made with ``eorouter passwd``;
- ``certificate``: a client certificate from the test CA required, SASL EXTERNAL (the user is the
  certificate's common name);
- ``tls-only``: TLS, SASL ANONYMOUS (the user ``anonymous``): what runs when Qpid Proton has no
  Cyrus SASL (``proton.SASL.extended()`` False), and then only that listener exists.

A ``[policy]`` lets the writers (alice, and carol's certificate) publish to ``interop/#``, the
readers (bob, dave's certificate) subscribe to it, and ``anonymous`` do both; a peer logged in as a
reader is refused a publisher link, which shows the router saw the user each login names.

Each case checks the ledgers as the interop matrix does (interop/matrix.py): every message
delivered once and intact, the publisher told accepted for every one, after the subscriber
answered, every peer exiting 0. A stack that cannot be installed here is skipped with the reason
(interop/peers.py), as in test_interop.py.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import proton
import pytest

from eorouter_tools.launcher import RouterSet
from interop import matrix, peers

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "integration"))
from tlskit import Pki, other_ca  # noqa: E402  (tests/integration/tlskit.py: a throwaway PKI)

pytestmark = pytest.mark.timeout(120)

EXTENDED = proton.SASL.extended()  # Cyrus SASL in this Qpid Proton: PLAIN, SCRAM, EXTERNAL on the router
NO_SASL = "Qpid Proton built without Cyrus SASL (sudo scripts/setup-root, then scripts/test rebuilds it)"
N = 20
PASSWORDS = {"alice": "alice-secret", "bob": "bob-secret"}
# Writers publish, readers subscribe: a peer logged in as the wrong one is refused its link, so a
# passing pair shows the router took each peer for the user its login (or certificate) names.
POLICY = {
    "users": {"alice": ["writers"], "carol": ["writers"], "bob": ["readers"], "dave": ["readers"], "anonymous": ["peers"]},
    "groups": {
        "writers": {"publish": ["interop/#"]},
        "readers": {"subscribe": ["interop/#"]},
        "peers": {"publish": ["interop/#"], "subscribe": ["interop/#"]},
    },
}


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    return Pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture(scope="module")
def secure_router(tmp_path_factory, pki):
    """One router: {listener name: port} and the process."""
    work = tmp_path_factory.mktemp("secure-router")
    cert, key = pki.server()
    tls = {"host": "127.0.0.1", "port": 0, "tls_cert_file": str(cert), "tls_key_file": str(key)}
    listeners = {"tls-only": dict(tls)}
    overrides: dict = {"policy": POLICY, **matrix.ROUTER_OVERRIDES}
    if EXTENDED:
        db = work / "users.sasldb"
        for name, password in PASSWORDS.items():
            done = subprocess.run(
                [sys.executable, "-m", "router.cli", "passwd", "--db", str(db), name, "--password-stdin"],
                input=password + "\n",
                capture_output=True,
                text=True,
            )
            assert done.returncode == 0, done.stderr
        overrides["sasl"] = {"users_db": str(db), "login_failure_delay": 0.2}
        listeners = {
            "password": {**tls, "sasl_mechanisms": ["PLAIN", "SCRAM-SHA-256"]},
            "certificate": {
                **tls,
                "tls_ca_file": str(pki.ca),
                "tls_require_client_cert": True,
                "sasl_mechanisms": ["EXTERNAL"],
            },
            **listeners,
        }
    routers = RouterSet(work)
    try:
        router = routers("A", listener=list(listeners.values()), **overrides)
        ports = [p for role, _, p in router.listeners if role == "normal"]
        yield router, dict(zip(listeners, ports))
    finally:
        routers.cleanup()


@pytest.fixture
def secure(secure_router):
    router, _ = secure_router
    router.check_alive("before this test")
    yield secure_router
    router.check_alive("after this test: a peer's traffic killed it")


def ready(*stacks: str) -> None:
    for stack in dict.fromkeys(stacks):
        reason = peers.setup(stack)
        if reason is not None:
            pytest.skip(reason)


def credentials(pki: Pki, login: str) -> tuple[str, dict]:
    """(listener, peer options) for a login: ``alice`` / ``bob`` (PLAIN), ``scram:alice`` (SCRAM-SHA-256),
    ``cert:carol`` (EXTERNAL with a certificate for CN=carol), ``anonymous`` (TLS only)."""
    tls = {"tls_ca": str(pki.ca)}
    if login == "anonymous":
        return "tls-only", tls
    if not EXTENDED:
        pytest.skip(NO_SASL)
    if login.startswith("cert:"):
        name = login.split(":", 1)[1]
        cert, key = pki.issue(f"peer-{name}", name)
        return "certificate", {**tls, "tls_cert": str(cert), "tls_key": str(key), "mech": "EXTERNAL"}
    mech = "PLAIN"
    if login.startswith("scram:"):
        mech, login = "SCRAM-SHA-256", login.split(":", 1)[1]
    return "password", {**tls, "user": f"{login}@eorouter", "password": PASSWORDS[login], "mech": mech}


def topology(ports: dict, pub_listener: str, sub_listener: str) -> matrix.Topology:
    """Publishers on one listener, the subscriber on another, both dialled as ``localhost`` (the
    name in the router's certificate)."""
    name = pub_listener if pub_listener == sub_listener else f"{pub_listener} -> {sub_listener}"
    return matrix.Topology(f"TLS ({name})", ("localhost", ports[pub_listener]), ("localhost", ports[sub_listener]))


# (case, publisher stack, its login, subscriber stack, its login)
PAIRS = [
    ("rhea-plain", "rhea", "alice", "rhea", "bob"),
    ("python-external", "python", "cert:carol", "python", "cert:dave"),
    ("protonc-plain", "protonc", "alice", "protonc", "bob"),
    ("protonc-external", "protonc", "cert:carol", "protonc", "cert:dave"),
    ("python-scram", "python", "scram:alice", "python", "scram:bob"),
    ("rhea-plain-to-python-external", "rhea", "alice", "python", "cert:dave"),
    ("protonc-external-to-rhea-plain", "protonc", "cert:carol", "rhea", "bob"),
    ("azure-plain", "azure", "alice", "azure", "bob"),
    ("azure-external", "azure", "cert:carol", "azure", "cert:dave"),
    ("rhea-tls-only", "rhea", "anonymous", "rhea", "anonymous"),
    ("python-tls-only", "python", "anonymous", "python", "anonymous"),
    ("protonc-tls-only", "protonc", "anonymous", "protonc", "anonymous"),
    ("azure-tls-only", "azure", "anonymous", "azure", "anonymous"),
]


@pytest.mark.parametrize("case, pub, pub_login, sub, sub_login", PAIRS, ids=[p[0] for p in PAIRS])
def test_secure_peers_publish_and_subscribe_exactly_once(secure, pki, tmp_path, case, pub, pub_login, sub, sub_login):
    router, ports = secure
    ready(pub, sub)
    pub_listener, pub_opts = credentials(pki, pub_login)
    sub_listener, sub_opts = credentials(pki, sub_login)
    run = matrix.Run(tmp_path, topology(ports, pub_listener, sub_listener), case, pub, sub)
    try:
        (s,) = run.subscribers(("sub", sub, "sub", N, sub_opts))
        p = run.start("pub", pub, "publisher", "pub", N, **pub_opts)
        code = run.finish_publisher(p)
        run.finish_subscribers([s], expect_exit=code == 0, cap=matrix.SUB_TIMEOUT if code == 0 else 1.0)
    except matrix.ScenarioError as err:
        run.problems.append(str(err))
    finally:
        run.kill_all()
    if not run.problems:
        seqs = set(range(1, N + 1))
        matrix.check_outcomes(run, p, "accepted", seqs)
        matrix.check_once(run, s, seqs)
        matrix.check_after(run, p, [s])
        matrix.check_integrity(run, p, [s])
        matrix.check_format(run)
        for peer in (p, s):
            matrix.check_exit(run, peer)
    assert not run.problems, f"{case}:\n  " + "\n  ".join(run.problems) + f"\n{run.diagnostics()}"


# (case, stack, the publisher's login, the subscriber's, what the refused publisher is given instead
# of the publisher's login, a text its error must carry)
REFUSALS = [
    ("rhea-wrong-password", "rhea", "alice", "bob", {"password": "guess"}, "amqp:unauthorized-access"),
    ("protonc-wrong-password", "protonc", "alice", "bob", {"password": "guess"}, "amqp:unauthorized-access"),
    ("python-untrusted-certificate", "python", "cert:carol", "cert:dave", "untrusted", "unknown ca"),
    ("rhea-reader-publishes", "rhea", "alice", "bob", "login:bob", "amqp:unauthorized-access"),
    ("python-reader-certificate-publishes", "python", "cert:carol", "cert:dave", "login:cert:dave", "amqp:unauthorized-access"),
    # pyamqp reports the SASL outcome's code (1: auth), no AMQP condition: ValueError('SASL negotiation failed...')
    ("azure-wrong-password", "azure", "alice", "bob", {"password": "guess"}, "Outcome: 1"),
    ("protonc-reader-certificate-publishes", "protonc", "cert:carol", "cert:dave", "login:cert:dave", "amqp:unauthorized-access"),
]


@pytest.mark.parametrize("case, stack, pub_login, sub_login, bad, error_text", REFUSALS, ids=[r[0] for r in REFUSALS])
def test_a_refused_peer_exits_with_the_condition_and_the_router_keeps_serving(
    secure, pki, tmp_path, tmp_path_factory, case, stack, pub_login, sub_login, bad, error_text
):
    """A subscriber logged in well is attached; a publisher of the same stack is refused (a wrong
    password, a certificate from another CA: at login; a reader's login: at attach, by the policy):
    it exits non-zero, the condition in its error, having had no outcome; then a good publisher's
    messages all reach that subscriber exactly once."""
    router, ports = secure
    ready(stack)
    listener, good = credentials(pki, pub_login)
    sub_listener, sub_opts = credentials(pki, sub_login)
    if bad == "untrusted":
        cert, key = other_ca(tmp_path_factory.mktemp("other-ca")).issue("stranger", "carol")  # right name, wrong CA
        bad_opts = {**good, "tls_cert": str(cert), "tls_key": str(key)}
    elif isinstance(bad, str):  # "login:NAME": another user's (good) login
        bad_opts = credentials(pki, bad.split(":", 1)[1])[1]
    else:
        bad_opts = {**good, **bad}
    run = matrix.Run(tmp_path, topology(ports, listener, sub_listener), case, stack, stack)
    try:
        (s,) = run.subscribers(("sub", stack, "sub", N, sub_opts))
        refused = run.start("refused", stack, "publisher", "pub", N, **bad_opts)
        code = refused.wait(20)
        if code is None:
            refused.kill()
        summary = refused.summary()
        assert code not in (0, None), f"the refused publisher exited {code}: {summary}\n{run.diagnostics()}"
        assert error_text in str(summary.get("error")), f"its error: {summary}\n{run.diagnostics()}"
        assert not matrix.sent(refused) and not matrix.outcomes(refused), "the refused publisher sent messages"
        router.check_alive(f"after {case}")
        p = run.start("pub", stack, "publisher", "pub", N, **good)
        code = run.finish_publisher(p)
        run.finish_subscribers([s], expect_exit=code == 0, cap=matrix.SUB_TIMEOUT if code == 0 else 1.0)
    except matrix.ScenarioError as err:
        run.problems.append(str(err))
    finally:
        run.kill_all()
    if not run.problems:
        seqs = set(range(1, N + 1))
        matrix.check_outcomes(run, p, "accepted", seqs)
        matrix.check_once(run, s, seqs)
        matrix.check_integrity(run, p, [s])
        for peer in (p, s):
            matrix.check_exit(run, peer)
    assert not run.problems, f"{case}:\n  " + "\n  ".join(run.problems) + f"\n{run.diagnostics()}"
