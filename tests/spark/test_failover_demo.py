"""``eorouter demo`` (eorouter_tools/failover_demo.py) end to end, small: three real routers, the
kill, the restart, and Spark's verdict in this test run's shared session (issue 14:
the output showed the kill but never the restart, and the report's path twice)."""

from __future__ import annotations

import re

import pytest

from eorouter_tools import failover_demo

# Spark alone takes minutes on a busy 2-core machine; the fast suite runs the traffic part
# (tests/integration/test_cli.py).
pytestmark = pytest.mark.slow


def test_the_demo_kills_restarts_and_proves(spark, tmp_path, capsys):
    code = failover_demo.main(
        ["--messages", "30", "--rate", "60", "--restart-after", "0.5", "--workdir", str(tmp_path), "--master", "local[2]"]
    )
    out = capsys.readouterr().out
    assert code == 0, out
    killed = re.search(r"^\*\*\* killed router A \(SIGKILL\) at [\d.]+ s \*\*\*$", out, re.M)
    restarted = re.search(r"^\*\*\* restarted router A at [\d.]+ s \(epoch 2\) \*\*\*$", out, re.M)
    assert killed and restarted and killed.start() < restarted.start(), out
    assert "VERDICT: proven clean" in out, out
    assert out.count("report.html") == 1, out
    assert (tmp_path / "report" / "report.html").is_file()
