"""The demos as a user runs them, without Spark (the whole main demo with Spark's verdict:
tests/spark/test_failover_demo.py, slow): a router that cannot start is one line, and
the main demo says it restarted the router it killed (issue 14, parts 3 and 4)."""

from __future__ import annotations

import fcntl
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from test_cli import help_of, option_help


def test_demo_help_lists_rule(capsys):
    text = help_of(capsys, "demo", "--help")
    assert "--kill ROUTER" in text  # the main demo's own help
    assert "delivery rule" in option_help(text, "--rule")


def test_demo_rule_help_is_the_rule_demos(capsys):
    text = help_of(capsys, "demo", "--rule", "--help")
    assert text.startswith("usage: eorouter demo --rule ")
    assert "--hold" in text and "--kill" not in text


@pytest.mark.parametrize("demo", [["demo"], ["demo", "--rule"]], ids=" ".join)
def test_a_demo_whose_router_cannot_start_says_so_in_one_line(tmp_path, demo):
    # Router B's data directory is locked, as if another router process used it.
    data = tmp_path / ("routers" if demo == ["demo"] else "") / "B"
    data.mkdir(parents=True)
    lock = os.open(data / "lock", os.O_RDWR | os.O_CREAT)
    fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    try:
        done = subprocess.run(
            [sys.executable, "-m", "router", *demo, "--workdir", str(tmp_path)],
            capture_output=True,
            text=True,
            timeout=120,
            cwd=tmp_path,
        )
    finally:
        os.close(lock)
    message = done.stderr.strip()
    assert done.returncode == 1, done.stdout + message
    assert len(message.splitlines()) == 1 and "Traceback" not in message, message
    assert message.startswith("eorouter demo: router B exited with 1 before it was ready: "), message
    assert "is in use by another router process" in message, message
    # Router A had started: it was stopped again (its process gone, its log says so).
    stderr_a = Path(data.parent / "A.stderr").read_text()
    assert "shutdown complete" in stderr_a, stderr_a


def test_the_failover_demo_says_it_restarted_the_router_it_killed(tmp_path, capsys):
    """The demo's traffic part (no Spark; the whole demo: tests/spark/test_failover_demo.py,
    slow). With a stream shorter than the pause before the restart, the restart used to
    happen after the stream, silently."""
    from eorouter_tools import failover_demo
    from eorouter_tools.launcher import read_event_log
    from eorouter_tools.topology import load_topology

    outcomes = failover_demo.stream(load_topology(None), "A", tmp_path, messages=10, rate=50, restart_after=1.0)
    out = capsys.readouterr().out
    killed = re.search(r"^\*\*\* killed router A \(SIGKILL\) at [\d.]+ s \*\*\*$", out, re.M)
    restarted = re.search(r"^\*\*\* restarted router A at [\d.]+ s \(epoch 2\) \*\*\*$", out, re.M)
    assert killed and restarted and killed.start() < restarted.start(), out
    assert outcomes == {"pub-A": {"accepted": 10}, "pub-B": {"accepted": 10}}, out
    starts = [e["epoch"] for e in read_event_log(tmp_path / "routers" / "A") if e["event"] == "router-started"]
    assert starts == [1, 2]
