"""Failover tests: real router processes killed mid-stream; the clients' own ledgers decide."""

import sys
from pathlib import Path

# The integration helpers (amqpclients, fixtures' conventions) live next door.
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "integration"))
