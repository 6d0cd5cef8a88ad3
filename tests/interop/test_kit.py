"""The interop kit without routers: the ledger's body digest, the tag recovery, the matrix rendering."""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess

import pytest
from proton import Message

from interop import clientkit, matrix, peers
from interop.peers import INTEROP


@pytest.mark.parametrize("size", [0, 1, 31, 255, 256, 70000])
def test_the_digest_is_blake2b_128_of_the_body_as_proton_encodes_it(size):
    body = clientkit.body("t/opic", 7, size)
    expected = hashlib.blake2b(Message(body=body).encode(), digest_size=16).hexdigest()
    assert clientkit.digest(body) == expected
    assert clientkit.digest(body.encode()) == expected  # pyamqp hands strings over as bytes


@pytest.mark.skipif(shutil.which("node") is None, reason="node is not installed")
def test_the_rhea_peers_compute_the_same_digest():
    bodies = [clientkit.body("t", n, size) for n, size in enumerate([0, 12, 255, 256, 300000])]
    script = (
        "const {digest} = require(process.argv[1]); let s = ''; process.stdin.on('data', d => s += d); "
        "process.stdin.on('end', () => console.log(JSON.stringify(JSON.parse(s).map(digest))))"
    )
    out = subprocess.run(
        ["node", "-e", script, str(INTEROP / "rhea" / "common.js")],
        input=json.dumps(bodies),
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert json.loads(out) == [clientkit.digest(b) for b in bodies]


def test_the_publisher_tag_is_recovered_from_an_inline_router_tag():
    stream = bytes(range(16))
    assert clientkit.inline_pub_tag(stream + b"\x02" + b"17") == b"17"
    assert clientkit.inline_pub_tag(stream + b"\xff" + bytes(15)) is None  # hashed long tag
    assert clientkit.inline_pub_tag(b"short") is None


def test_the_matrix_groups_failures_by_known_cause(monkeypatch):
    # No cause is known today: a made-up one for the accept scenario.
    monkeypatch.setitem(matrix.KNOWN_CAUSES, "accept", ("a client cannot do this", "no settled disposition"))
    cause_text = matrix.KNOWN_CAUSES["accept"][1]
    results = [matrix.Result("accept", "one router", p, s) for p in matrix.STACKS for s in matrix.STACKS if p != "azure"]
    results += [
        matrix.Result("accept", "one router", "azure", s, "fail", [f"pub: no outcome ({cause_text})"]) for s in matrix.STACKS
    ]
    results.append(matrix.Result("reject", "one router", "rhea", "python", "fail", ["sub: missing seq 3"]))
    text = matrix.render(results)
    assert "  rhea      1/2 [1]" in text
    assert "  azure     0/1 [2]" in text
    assert "[1] FAIL: sub: missing seq 3 (reject; rhea->python; one router)" in text
    assert "[2] FAIL: " + matrix.KNOWN_CAUSES["accept"][0] in text
    assert "(accept; publisher azure x any subscriber; one router)" in text
    # an unexpected failure of a cell with a known cause is not explained away
    odd = matrix.Result("accept", "one router", "azure", "python", "fail", ["sub: duplicate seq 4"])
    assert matrix.known_cause(odd) is None


BASE = ["localhost", "5671", "t", "1", "--ledger", "x.jsonl"]


def test_the_security_options_are_parsed_and_checked(capsys):
    a = clientkit.parse("publisher", [*BASE, "--tls-ca", "ca.pem", "--tls-cert", "c.pem", "--tls-key", "c.key"])
    assert (a.tls_ca, a.tls_cert, a.tls_key, a.user, a.password, a.mech) == ("ca.pem", "c.pem", "c.key", None, None, None)
    a = clientkit.parse("subscriber", [*BASE, "--user", "alice@eorouter", "--password", "pw", "--mech", "PLAIN SCRAM-SHA-256"])
    assert (a.user, a.password, a.mech, a.tls_ca) == ("alice@eorouter", "pw", "PLAIN SCRAM-SHA-256", None)
    for bad, why in (
        (["--tls-ca", "ca.pem", "--tls-cert", "c.pem"], "--tls-cert and --tls-key go together"),
        (["--tls-cert", "c.pem", "--tls-key", "c.key"], "needs TLS (--tls-ca)"),
        (["--password", "pw"], "--password needs --user"),
        (["--mech", " "], "at least one mechanism"),
    ):
        with pytest.raises(SystemExit) as exit_:
            clientkit.parse("publisher", [*BASE, *bad])
        assert exit_.value.code == 2 and why in capsys.readouterr().err, bad


@pytest.mark.parametrize("stack", ["rhea", "protonc", "azure"])
def test_a_stack_refuses_a_mechanism_it_cannot_do_at_start(stack, tmp_path):
    """rhea, Proton C without Cyrus SASL and pyamqp have no SCRAM: exit 2, said on stderr, before
    any connection (nothing listens on the port)."""
    reason = peers.setup(stack)
    if reason is not None:
        pytest.skip(reason)
    if stack == "protonc" and _protonc_has_cyrus():
        pytest.skip("this Proton C has Cyrus SASL: SCRAM is one of its mechanisms")
    for role in ("publisher", "subscriber"):
        argv = [*peers.command(stack, role), "localhost", "1", "t", "1", "--ledger", str(tmp_path / f"{role}.jsonl")]
        done = subprocess.run([*argv, "--mech", "SCRAM-SHA-256"], capture_output=True, text=True, timeout=60)
        assert done.returncode == 2, (stack, role, done.returncode, done.stdout, done.stderr)
        assert "SCRAM-SHA-256" in done.stderr and "not supported by this stack" in done.stderr, done.stderr


def _protonc_has_cyrus() -> bool:
    """Whether the Proton C the peers are linked with uses Cyrus SASL (ldd lists libsasl2)."""
    if shutil.which("ldd") is None:
        return False
    libs = subprocess.run(["ldd", peers.command("protonc", "publisher")[0]], capture_output=True, text=True).stdout
    return "libsasl2" in libs
