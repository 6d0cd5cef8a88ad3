"""Races across routers, as real processes under CPU load (issue 14).

    triangle:  A - B - C - A

A subscriber on C that accepts its messages and closes its connection at once:
C answers A for each delivery, then floods that it has nobody left. On a busy
machine the flood can reach A through B before C's answers do. The publisher on A
must still hear "accepted" for every message: an answer given before a subscriber
left always counts.
"""

from __future__ import annotations

import os
import random
import subprocess
import sys
import time
from pathlib import Path

import pytest
from amqpclients import unique

from eorouter_tools.topology import RouterNetwork, parse_topology

pytestmark = pytest.mark.timeout(240)

SCRIPTS = Path(__file__).parent / "scripts"
MESSAGES = 10


def _topology() -> str:
    routers = "".join(f'[[router]]\nid = "{r}"\n' for r in "ABC")
    return routers + "".join(f'[[link]]\nbetween = ["{a}", "{b}"]\n' for a, b in ("AB", "BC", "CA"))


@pytest.fixture(scope="module")
def triangle(tmp_path_factory):
    net = RouterNetwork(
        tmp_path_factory.mktemp("races"), parse_topology(_topology()), overrides={"delivery": {"record_linger": 1.0}}
    )
    try:
        net.start()
        yield net
    finally:
        net.stop()


@pytest.fixture
def cpu_load():
    """A busy loop on each core for the test's duration: the race needs a busy machine."""
    burners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(os.cpu_count() or 2)]
    try:
        yield
    finally:
        for burner in burners:
            burner.kill()
            burner.wait()


def _round(net, amqp, seed: int) -> list:
    topic = unique("close-after-accept")
    sub = subprocess.Popen(
        [sys.executable, str(SCRIPTS / "take_then_close.py"), net.routers["C"].url, topic, str(MESSAGES)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert sub.stdout.readline().strip() == "attached", sub.stderr.read()
        time.sleep(random.Random(seed).uniform(0.2, 1.2))
        pub = amqp.connect(net.routers["A"].url).publisher(topic)
        sent = [pub.send(f"m{n}") for n in range(MESSAGES)]
        out, err = sub.communicate(timeout=60)
        assert sub.returncode == 0, err
        assert out.split("\n")[:MESSAGES] == [f"got m{n}" for n in range(MESSAGES)]
        amqp.wait(lambda: all(s.outcome for s in sent), what="the publisher's outcomes", timeout=30)
        return [s.outcome for s in sent]
    finally:
        if sub.poll() is None:
            sub.kill()
            sub.wait()


@pytest.mark.parametrize("load", ["idle", "busy"])
def test_a_subscriber_closing_right_after_accepting_counts_as_accepted(triangle, amqp, request, load):
    if load == "busy":
        request.getfixturevalue("cpu_load")
    for seed in range(6):
        outcomes = _round(triangle, amqp, seed)
        assert outcomes == ["accepted"] * MESSAGES, f"round {seed}: the subscriber accepted every message"


@pytest.mark.slow
def test_a_subscriber_closing_right_after_accepting_counts_as_accepted_many_rounds(triangle, amqp, cpu_load):
    for seed in range(40):
        outcomes = _round(triangle, amqp, seed)
        assert outcomes == ["accepted"] * MESSAGES, f"round {seed}: the subscriber accepted every message"
