"""Container tests: the failover verdict of tests/failover, with each router in a Docker container."""

import sys
from pathlib import Path

# test_kill's Scenario (traffic, ledgers, verdict) and the integration helpers live there.
for sub in ("failover", "integration"):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / sub))
