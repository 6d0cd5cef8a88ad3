"""Selectors set by other stacks' subscribers (issue 20): a rhea and a python-qpid-proton
subscriber, each with a JMS selector over the interop messages' ``seq`` property, and an
unfiltered rhea one, behind one router with a rhea publisher: each subscriber's ledger holds
exactly the messages its selector selects, once, in order; the publisher was told accepted for
every message."""

from __future__ import annotations

import json
import subprocess
import time

import pytest

from eorouter_tools.launcher import RouterSet
from interop import peers

pytestmark = pytest.mark.timeout(120)
N = 30


@pytest.fixture(scope="module")
def router(tmp_path_factory):
    routers = RouterSet(tmp_path_factory.mktemp("selector-peers"))
    yield routers("A")
    routers.cleanup()


def ledger(path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


@pytest.mark.parametrize("sub_stack", ["rhea", "python"])
def test_a_selective_subscriber_of_another_stack(router, tmp_path, sub_stack):
    for stack in {"rhea", sub_stack}:
        reason = peers.setup(stack)
        if reason:
            pytest.skip(f"{stack}: {reason}")
    topic = f"selectors/{sub_stack}/{time.monotonic_ns()}"
    host, port = "127.0.0.1", str(router.port)
    selectors = {"odd-high": ("seq > 10 AND seq BETWEEN 11 AND 25", lambda n: 11 <= n <= 25), "all": (None, lambda n: True)}
    subs = {}
    for name, (selector, wanted) in selectors.items():
        stack = sub_stack if selector else "rhea"
        count = sum(1 for n in range(1, N + 1) if wanted(n))
        cmd = [*peers.command(stack, "subscriber"), host, port, topic, str(count), "--ledger", str(tmp_path / f"{name}.jsonl")]
        cmd += ["--link", f"{name}-{sub_stack}", "--container-id", f"{name}-{sub_stack}"]
        if selector:
            cmd += ["--selector", selector]
        subs[name] = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        assert subs[name].stdout.readline().strip() == "ready", subs[name].stderr.read()
    pub = subprocess.run(
        [*peers.command("rhea", "publisher"), host, port, topic, str(N), "--ledger", str(tmp_path / "pub.jsonl")],
        capture_output=True,
        text=True,
        timeout=90,
    )
    assert pub.returncode == 0, pub.stdout + pub.stderr
    outcomes = [e["outcome"] for e in ledger(tmp_path / "pub.jsonl") if e["event"] == "outcome"]
    assert outcomes == ["accepted"] * N
    for name, (_, wanted) in selectors.items():
        out, err = subs[name].communicate(timeout=60)
        assert subs[name].returncode == 0, out + err
        seqs = [e["seq"] for e in ledger(tmp_path / f"{name}.jsonl") if e["event"] == "delivered"]
        assert seqs == [n for n in range(1, N + 1) if wanted(n)], (name, seqs)
    router.check_alive("after selective subscribers of other stacks")


@pytest.mark.parametrize("sub_stack", ["rhea", "python", "protonc"])
def test_a_pattern_subscriber_of_another_stack(router, tmp_path, sub_stack):
    """A subscriber of another stack to a topic pattern (``.../+``) takes two rhea
    publishers' topics: every message of both once, each publisher's in order (a
    delivery's tag starts with its publisher stream's id), all accepted."""
    from router.core.tags import STREAM_ID_SIZE

    for stack in {"rhea", sub_stack}:
        reason = peers.setup(stack)
        if reason:
            pytest.skip(f"{stack}: {reason}")
    root = f"patterns/{sub_stack}/{time.monotonic_ns()}"
    host, port = "127.0.0.1", str(router.port)
    cmd = [*peers.command(sub_stack, "subscriber"), host, port, f"{root}/+", str(2 * N), "--ledger", str(tmp_path / "sub.jsonl")]
    sub = subprocess.Popen(
        [*cmd, "--link", f"wild-{sub_stack}", "--container-id", f"wild-{sub_stack}"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert sub.stdout.readline().strip() == "ready", sub.stderr.read()
    pubs = [
        subprocess.Popen(
            [*peers.command("rhea", "publisher"), host, port, f"{root}/{leaf}", str(N), "--ledger", str(tmp_path / f"{leaf}.j")],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for leaf in ("a", "b")
    ]
    for leaf, pub in zip(("a", "b"), pubs):
        out, err = pub.communicate(timeout=90)
        assert pub.returncode == 0, out + err
        assert [e["outcome"] for e in ledger(tmp_path / f"{leaf}.j") if e["event"] == "outcome"] == ["accepted"] * N
    out, err = sub.communicate(timeout=60)
    assert sub.returncode == 0, out + err
    by_stream: dict[str, list[int]] = {}
    for e in ledger(tmp_path / "sub.jsonl"):
        if e["event"] == "delivered":
            by_stream.setdefault(e["delivery"][: 2 * STREAM_ID_SIZE], []).append(e["seq"])
    assert sorted(by_stream.values()) == [list(range(1, N + 1))] * 2, by_stream
    router.check_alive("after a pattern subscriber of another stack")
