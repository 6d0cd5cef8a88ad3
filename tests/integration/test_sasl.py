"""SASL logins (issue 18, part 3) on a real router: PLAIN over TLS, SCRAM-SHA-256,
EXTERNAL from a client certificate, checked by Cyrus SASL against a sasldb that
`eorouter passwd` made; refusals for wrong passwords, unknown mechanisms, PLAIN in
clear and clients that skip SASL, with the router serving everyone else."""

from __future__ import annotations

import subprocess
import sys
import threading
import time

import proton
import pytest
from amqpclients import unique
from proton import SSLDomain
from proton.utils import BlockingConnection
from test_metrics import scrape, value
from tlskit import Pki

from router.client import ResumablePublisher, ResumableSubscriber

pytestmark = pytest.mark.skipif(
    not proton.SASL.extended(),
    reason="Qpid Proton built without Cyrus SASL (sudo scripts/setup-root, then scripts/test rebuilds it)",
)

POLICY = {
    "users": {"alice": ["writers"], "bob": ["readers"], "carol": ["readers"]},
    "groups": {"writers": {"publish": ["orders/#"]}, "readers": {"subscribe": ["orders/#"]}},
}
DELAY = 0.5  # [sasl] login_failure_delay of the router under test


def passwd(db, name: str, password: str) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "router.cli", "passwd", "--db", str(db), name, "--password-stdin"],
        input=password + "\n",
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    return Pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture(scope="module")
def router(module_router_factory, pki, tmp_path_factory):
    db = tmp_path_factory.mktemp("sasl") / "users.sasldb"
    passwd(db, "alice", "alice-secret")
    passwd(db, "bob", "bob-secret")
    cert, key = pki.server()
    tls = {"tls_cert_file": str(cert), "tls_key_file": str(key)}
    return module_router_factory(
        "A",
        policy=POLICY,
        metrics={"port": 0},
        sasl={"users_db": str(db), "login_failure_delay": DELAY},
        listener=[
            # 0: TLS, passwords only
            {"host": "127.0.0.1", "port": 0, **tls, "sasl_mechanisms": ["PLAIN", "SCRAM-SHA-256"]},
            # 1: TLS with client certificates, EXTERNAL
            {
                "host": "127.0.0.1",
                "port": 0,
                **tls,
                "tls_ca_file": str(pki.ca),
                "tls_require_client_cert": True,
                "sasl_mechanisms": ["EXTERNAL"],
            },
            # 2: plain TCP: SCRAM (the password never crosses)
            {"host": "127.0.0.1", "port": 0, "sasl_mechanisms": ["SCRAM-SHA-256"]},
            # 3: TLS that also takes clients in clear: PLAIN is offered only under TLS
            {"host": "127.0.0.1", "port": 0, **tls, "tls_allow_plain": True, "sasl_mechanisms": ["PLAIN", "SCRAM-SHA-256"]},
        ],
    )


def port(router, i: int) -> int:
    return [p for role, _, p in router.listeners if role == "normal"][i]


def tls_domain(pki, cert_for: str | None = None) -> SSLDomain:
    domain = SSLDomain(SSLDomain.MODE_CLIENT)
    domain.set_trusted_ca_db(str(pki.ca))
    domain.set_peer_authentication(SSLDomain.VERIFY_PEER_NAME)
    if cert_for is not None:
        cert, key = pki.issue(f"user-{cert_for}", cert_for)
        domain.set_credentials(str(cert), str(key), None)
    return domain


def login(url: str, *, user=None, password=None, mechs=None, ssl_domain=None, sasl_enabled=True, topic="orders/x"):
    """None when the client could log in and subscribe to ``topic``, else what it was told."""
    try:
        conn = BlockingConnection(
            url,
            timeout=10,
            ssl_domain=ssl_domain,
            user=user,
            password=password,
            allowed_mechs=mechs,
            sasl_enabled=sasl_enabled,
            allow_insecure_mechs=True,  # so that a refusal of PLAIN in clear is the router's
        )
    except Exception as exc:  # noqa: BLE001 - the refusal's text carries the condition
        return str(exc) or type(exc).__name__
    try:
        conn.create_receiver(topic)
        return None
    except Exception as exc:  # noqa: BLE001
        return str(exc)
    finally:
        conn.close()


def test_password_logins_carry_messages_exactly_once(router, pki, tmp_path):
    """alice publishes with SCRAM-SHA-256 over plain TCP, bob subscribes with PLAIN
    over TLS: the policy sees them as alice and bob, every message arrives once."""
    topic = unique("orders/sasl")
    got: list = []
    sub = ResumableSubscriber(
        [f"amqps://localhost:{port(router, 0)}"],
        topic,
        container_id="bob-app",
        link_name="bob-l",
        state_path=tmp_path / "s.state",
        ssl_domain=tls_domain(pki),
        user="bob@eorouter",
        password="bob-secret",
        sasl_mechanisms="PLAIN",
        on_message=got.append,
    ).start()
    pub = ResumablePublisher(
        [f"127.0.0.1:{port(router, 2)}"],
        topic,
        container_id="alice-app",
        link_name="alice-l",
        state_path=tmp_path / "p.state",
        user="alice@eorouter",
        password="alice-secret",
        sasl_mechanisms="SCRAM-SHA-256",
    ).start()
    try:
        assert sub.wait_attached(10) and pub.wait_attached(10)
        assert {pub.send_async(f"m{i}").result(timeout=20).state for i in range(20)} == {"accepted"}
        assert [m.body for m in got] == [f"m{i}" for i in range(20)]
    finally:
        pub.close()
        sub.close()


def test_external_takes_the_user_from_the_certificate(router, pki):
    url = f"amqps://localhost:{port(router, 1)}"
    assert login(url, ssl_domain=tls_domain(pki, "carol"), mechs="EXTERNAL") is None  # carol: a reader
    error = login(url, ssl_domain=tls_domain(pki, "mallory"), mechs="EXTERNAL")
    assert error is not None and "unauthorized-access" in error and "'mallory'" in error, error


@pytest.mark.parametrize(
    "case, listener, kwargs",
    [
        ("wrong password", 0, {"user": "alice@eorouter", "password": "guess", "mechs": "SCRAM-SHA-256"}),
        ("unknown user", 0, {"user": "eve@eorouter", "password": "x", "mechs": "PLAIN"}),
        ("user without the realm", 0, {"user": "alice", "password": "alice-secret", "mechs": "PLAIN"}),
        ("a mechanism not offered", 0, {"user": "alice@eorouter", "password": "alice-secret", "mechs": "DIGEST-MD5"}),
        ("anonymous where logins are required", 0, {"mechs": "ANONYMOUS"}),
        ("PLAIN in clear", 3, {"user": "alice@eorouter", "password": "alice-secret", "mechs": "PLAIN"}),
        ("no SASL at all", 2, {"sasl_enabled": False}),
        ("EXTERNAL without a certificate listener", 0, {"mechs": "EXTERNAL"}),
    ],
)
def test_refused_logins(router, pki, case, listener, kwargs):
    tls = listener in (0, 1)  # (3 is reached in clear)
    url = f"amqps://localhost:{port(router, listener)}" if tls else f"amqp://127.0.0.1:{port(router, listener)}"
    error = login(url, ssl_domain=tls_domain(pki) if tls else None, **kwargs)
    assert error is not None, f"{case}: logged in"
    if kwargs.get("sasl_enabled", True):
        assert "unauthorized-access" in error or "Authentication failed" in error, f"{case}: {error}"
    router.check_alive(f"after {case}")
    # ... and still serves a good login
    good = f"amqp://127.0.0.1:{port(router, 2)}"
    assert login(good, user="bob@eorouter", password="bob-secret", mechs="SCRAM-SHA-256") is None


def test_failed_logins_are_delayed_and_counted(router, pki):
    url = f"amqp://127.0.0.1:{port(router, 2)}"
    before = value(scrape(router), "eorouter_login_failures_total", mechanism="SCRAM-SHA-256") or 0
    started = time.monotonic()
    assert login(url, user="alice@eorouter", password="nope", mechs="SCRAM-SHA-256") is not None
    assert time.monotonic() - started >= DELAY * 0.9
    # many at once: each waits, none holds up a good client meanwhile
    errors: list = []
    threads = [
        threading.Thread(target=lambda: errors.append(login(url, user="alice@eorouter", password="nope", mechs="SCRAM-SHA-256")))
        for _ in range(20)
    ]
    for t in threads:
        t.start()
    good_started = time.monotonic()
    assert login(url, user="bob@eorouter", password="bob-secret", mechs="SCRAM-SHA-256") is None
    good_took = time.monotonic() - good_started
    for t in threads:
        t.join(30)
    assert len(errors) == 20 and all(e is not None for e in errors)
    assert good_took < 5, f"a good login took {good_took:.1f}s during a flood of bad ones"
    after = value(scrape(router), "eorouter_login_failures_total", mechanism="SCRAM-SHA-256")
    assert after == before + 21
    router.check_alive("after a flood of failed logins")


def test_passwd_adds_lists_and_deletes_users(tmp_path):
    db = tmp_path / "u.sasldb"

    def cli(*args, stdin=""):
        return subprocess.run(
            [sys.executable, "-m", "router.cli", "passwd", "--db", str(db), *args],
            input=stdin,
            capture_output=True,
            text=True,
        )

    assert cli("dave", "--password-stdin", stdin="pw\n").returncode == 0
    assert cli("erin", "--realm", "corp", stdin="pw2\n").returncode == 0
    assert oct(db.stat().st_mode & 0o777) == "0o600"
    assert cli("--list").stdout.split() == ["dave@eorouter", "erin@corp"]
    assert cli("--delete", "dave").returncode == 0
    assert cli("--list").stdout.split() == ["erin@corp"]
    for args, stdin, fragment in (
        (("--delete", "dave"), "", "no user dave@eorouter"),
        (("x@y",), "pw\n", "without '@'"),
        (("frank",), "\n", "an empty password"),
        ((), "", "NAME is required"),
    ):
        done = cli(*args, stdin=stdin)
        assert done.returncode == 2 and fragment in done.stderr, (args, done.stderr)


LIMITED = {
    "users": {"alice": ["writers"], "bob": ["readers"]},
    "groups": {
        "writers": {"publish": ["orders/#"], "max_links": 2, "max_message_size": 1000},
        "readers": {"subscribe": ["orders/#"]},
    },
}


@pytest.fixture(scope="module")
def users_db(tmp_path_factory):
    db = tmp_path_factory.mktemp("sasl-users") / "users.sasldb"
    passwd(db, "alice", "alice-secret")
    passwd(db, "bob", "bob-secret")
    return db


def scram_listener(**extra) -> dict:
    return {"host": "127.0.0.1", "port": 0, "sasl_mechanisms": ["SCRAM-SHA-256"], **extra}


def two_routers(router_factory, sasl: dict, a_policy: dict, b_policy: dict, **a_extra):
    """Routers A and B joined by an inter-router link, each with its policy and SCRAM
    logins on its client listener: a client fails over from A to B."""
    secret = {"network": {"secret": "sasl-resume-secret"}}
    a = router_factory(
        "A",
        policy=a_policy,
        sasl=sasl,
        **secret,
        **a_extra,
        listener=[scram_listener(), {"host": "127.0.0.1", "port": 0, "role": "inter-router"}],
    )
    b = router_factory(
        "B",
        policy=b_policy,
        sasl=sasl,
        **secret,
        listener=[scram_listener()],
        connector=[{"host": "127.0.0.1", "port": a.inter_router_port, "role": "inter-router"}],
    )
    return a, b


def logged_in(kind, routers, topic: str, name: str, tmp_path, **kw):
    """A resumable client of user ``name`` (password ``<name>-secret``), started, that
    fails over along ``routers`` in order."""
    return kind(
        [f"127.0.0.1:{r.port}" for r in routers],
        topic,
        container_id=f"{name}-app",
        link_name=f"{name}-l",
        state_path=tmp_path / f"{name}.state",
        user=f"{name}@eorouter",
        password=f"{name}-secret",
        **kw,
    ).start()


def as_alice(router, **kw) -> BlockingConnection:
    return BlockingConnection(f"amqp://127.0.0.1:{router.port}", timeout=10, user="alice@eorouter", password="alice-secret", **kw)


def test_plain_in_clear_where_a_listener_allows_it(router_factory, users_db, tmp_path):
    """``sasl_allow_plain_in_clear``: the router warns at start, naming the listener,
    and PLAIN then works without TLS there: bob subscribes and alice publishes with
    their passwords in clear, the message arrives once; a wrong password is still
    refused, and the router serves on."""
    router = router_factory(
        "A",
        policy=LIMITED,
        sasl={"users_db": str(users_db), "login_failure_delay": DELAY},
        listener=[{"host": "127.0.0.1", "port": 0, "sasl_mechanisms": ["PLAIN"], "sasl_allow_plain_in_clear": True}],
    )
    warning = f"listener 127.0.0.1:{router.port} accepts SASL PLAIN without TLS (sasl_allow_plain_in_clear)"
    assert warning in router.stderr_since_start()
    url = f"amqp://127.0.0.1:{router.port}"
    assert login(url, user="bob@eorouter", password="bob-secret", mechs="PLAIN") is None  # a reader: subscribes
    topic = unique("orders/clear")
    got: list = []
    sub = ResumableSubscriber(
        [f"127.0.0.1:{router.port}"],
        topic,
        container_id="bob-clear",
        link_name="bob-clear-l",
        state_path=tmp_path / "s.state",
        user="bob@eorouter",
        password="bob-secret",
        sasl_mechanisms="PLAIN",
        on_message=got.append,
    ).start()
    alice = BlockingConnection(
        url, timeout=10, user="alice@eorouter", password="alice-secret", allowed_mechs="PLAIN", allow_insecure_mechs=True
    )
    try:
        assert sub.wait_attached(10)
        sender = alice.create_sender(topic)
        assert sender.send(proton.Message(body="in clear")).remote_state == proton.Delivery.ACCEPTED
        assert [m.body for m in got] == ["in clear"]
    finally:
        alice.close()
        sub.close()
    error = login(url, user="alice@eorouter", password="guess", mechs="PLAIN")
    assert error is not None and ("Authentication failed" in error or "unauthorized-access" in error), error
    router.check_alive("after logins in clear")


def test_link_limits_and_message_size_per_user(router_factory, users_db):
    """alice may hold 2 links (a third is refused with resource-limit-exceeded, naming
    the group; closing one frees its place) and publish messages up to 1000 bytes (a
    larger one is rejected with message-size-exceeded naming her limit, and the
    publisher link advertises the limit)."""
    router = router_factory("A", policy=LIMITED, sasl={"users_db": str(users_db)}, listener=[scram_listener()])
    conn = as_alice(router)
    try:
        topic = unique("orders/limits")
        first = conn.create_sender(topic)
        second = conn.create_sender(topic + "-2")
        with pytest.raises(Exception, match="resource-limit-exceeded") as refused:
            conn.create_sender(topic + "-3")
        assert "may hold 2 link(s) (group writers)" in str(refused.value)
        second.close()
        third = conn.create_sender(topic + "-3")  # the closed link's place
        assert first.link.remote_max_message_size == 1000
        delivery = first.link.send(proton.Message(body="x" * 2000))
        conn.wait(lambda: delivery.remote_state, timeout=10, msg="the outcome of a too large message")
        assert delivery.remote_state == proton.Delivery.REJECTED
        assert "message-size-exceeded" in str(delivery.remote.condition.name)
        assert "limit of 1000 bytes" in delivery.remote.condition.description
        third.close()
    finally:
        conn.close()
    router.check_alive("after refusing links and messages")


def test_a_resumed_link_gets_the_rights_its_user_has_there(router_factory, users_db, tmp_path):
    """alice publishes at A, where she may; A dies and her publisher resumes at B,
    whose policy lets her only subscribe: B refuses the resumed link with
    unauthorized-access, naming the rule, the client stops with that error and keeps
    its unsettled deliveries in its state file (the publisher is their only store),
    and B goes on serving bob."""
    b_policy = {"users": {"alice": ["readers"], "bob": ["readers"]}, "groups": {"readers": {"subscribe": ["orders/#"]}}}
    a, b = two_routers(router_factory, {"users_db": str(users_db)}, LIMITED, b_policy)
    topic = unique("orders/resume")
    got: list = []
    sub = logged_in(ResumableSubscriber, [b], topic, "bob", tmp_path, on_message=got.append)
    pub = logged_in(ResumablePublisher, [a, b], topic, "alice", tmp_path)
    try:
        assert sub.wait_attached(10) and pub.wait_attached(10)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:  # until A knows of bob at B
            if pub.send_async("probe").result(timeout=20).state == "accepted" and got:
                break
            time.sleep(0.2)
        assert got, "the network never carried alice's messages to bob"
        a.kill()
        with pytest.raises(Exception, match="unauthorized-access") as refused:
            pub.wait_for(lambda: False, timeout=30)
        assert "may not publish" in str(refused.value) and "'alice'" in str(refused.value)
        assert "refused" in b.stderr_since_start()
        assert sub.router is not None  # bob is still served at B
        b.check_alive("after refusing a resumed link")
    finally:
        pub.close()
        sub.close()


def test_a_resumed_subscriber_gets_the_rights_its_user_has_there(router_factory, users_db, tmp_path):
    """bob subscribes at A, where he may; A dies and his durable subscriber resumes at
    B, whose policy lets him only publish: B refuses the resumed link with
    unauthorized-access naming the rule, the client stops with that error, and B goes
    on serving carol (a reader there). A delivery published at B after A died is owed
    to bob too (a durable subscriber of a lost router, wherever he re-attaches): B
    holds alice's outcome until bob's terminus timeout (A's max_terminus_timeout, as
    the resumable subscriber asks for expiry "never"), then discards what it owed him
    (owed-state-discarded) and answers alice with carol's outcome; carol gets it
    once, bob never."""
    sasl = {"users_db": str(users_db), "login_failure_delay": DELAY}
    passwd(users_db, "carol", "carol-secret")
    a_policy = {"users": {"bob": ["readers"]}, "groups": {"readers": {"subscribe": ["orders/#"]}}}
    b_policy = {
        "users": {"alice": ["writers"], "bob": ["writers"], "carol": ["readers"]},
        "groups": {"writers": {"publish": ["orders/#"]}, "readers": {"subscribe": ["orders/#"]}},
    }
    terminus_timeout = 3  # bob's subscription outlives A by this long
    limits = {"default_terminus_timeout": terminus_timeout, "max_terminus_timeout": terminus_timeout}
    a, b = two_routers(router_factory, sasl, a_policy, b_policy, limits=limits)
    topic = unique("orders/resume-sub")
    bob_got: list = []
    carol_got: list = []
    bob = logged_in(ResumableSubscriber, [a, b], topic, "bob", tmp_path, on_message=bob_got.append)
    carol = logged_in(ResumableSubscriber, [b], topic, "carol", tmp_path, on_message=carol_got.append)
    pub = logged_in(ResumablePublisher, [b], topic, "alice", tmp_path)
    try:
        assert bob.wait_attached(10) and carol.wait_attached(10) and pub.wait_attached(10)
        deadline = time.monotonic() + 20
        while not bob_got and time.monotonic() < deadline:  # until B knows of bob at A
            assert pub.send_async("probe").result(timeout=20).state == "accepted"
            time.sleep(0.2)
        assert bob_got, "the network never carried alice's messages to bob"
        assert bob.wait_for(lambda: bob.unsettled_count == 0, timeout=10)
        a.kill()
        a_died = time.monotonic()
        with pytest.raises(Exception, match="unauthorized-access") as refused:
            bob.wait_for(lambda: False, timeout=30)
        assert "may not subscribe" in str(refused.value) and "'bob'" in str(refused.value)
        assert "refused" in b.stderr_since_start()
        probes = len(bob_got)
        outcome = pub.send_async("after").result(timeout=terminus_timeout + 10)
        answered = time.monotonic() - a_died
        assert outcome.state == "accepted"
        assert answered >= terminus_timeout - 0.5, f"answered {answered:.1f}s after A died: bob's share was not waited for"
        assert [m.body for m in carol_got].count("after") == 1 and carol.router is not None  # B serves carol
        assert len(bob_got) == probes  # nothing more reached bob
        events = b.events()
        after = [e["delivery"] for e in events if e["event"] == "received" and e["pub_tag"] == outcome.tag.hex()]
        discarded = [e for e in events if e["event"] == "owed-state-discarded"]
        assert [(e["delivery"], e["subscriber"]) for e in discarded] == [(after[0], "bob-app/bob-l")], discarded
        b.check_alive("after refusing a resumed subscriber")
    finally:
        pub.close()
        carol.close()
        bob.close()
