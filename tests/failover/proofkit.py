"""The Spark proof over a failover test's run: `eorouter reconcile` of the routers' logs
and the clients' ledgers, which must prove the run clean."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path


def prove_clean(routers: Path, clients: Path, out: Path, timeout: float = 900) -> dict:
    """Run the proof (no HTML report) and return its report.json; fails the test with the
    command's output unless it exits 0 and calls the run proven clean."""
    result = subprocess.run(
        [sys.executable, "-m", "router", "reconcile", str(routers), "--clients", str(clients), "--out", str(out), "--no-html"],
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
    report = json.loads((out / "report.json").read_text())
    assert report["verdict"]["proven_clean"], report["verdict"]
    return report
