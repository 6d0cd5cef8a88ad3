"""``eorouter logs compact``: the routers' JSON-lines logs to one Parquet dataset.

Same schema (router.eventlog.spark_schema_fields(), as StructType), same rows
(torn lines left out and counted), sorted by (router, epoch, seq) so that each
router's lines sit together and compress well. ``eorouter reconcile`` reads
either; see docs/reconcile.md for what the difference costs.
"""

from __future__ import annotations

import json
import math
import os
import time
from pathlib import Path

from spark.load import load_events

#: Rows are lines as written: a folded line (router.eventlog.FOLDED) stays one row
#: (the reconciliation unfolds it), so the dataset counts lines, not events.
LINES_PER_FILE = 1_000_000


def _size(paths: list[str]) -> int:
    total = 0
    for p in paths:
        try:
            total += os.path.getsize(p)
        except OSError:
            pass
    return total


def compact(spark, inputs: list[str], out: str, files: int = 0) -> dict:
    started = time.monotonic()
    loaded = load_events(spark, inputs, "json")
    json_bytes = sum(_size(s.paths) for s in loaded.sources if not s.remote)
    events = loaded.events
    if files <= 0:
        lines = events.count()
        files = max(1, math.ceil(lines / LINES_PER_FILE))
    events.repartitionByRange(files, "router", "epoch", "seq") \
        .sortWithinPartitions("router", "epoch", "seq") \
        .write.mode("overwrite").option("compression", "zstd").parquet(out)
    written = spark.read.parquet(out).count()
    torn = loaded.corrupt.count() if loaded.corrupt is not None else 0
    out_path = Path(out)
    parquet = sorted(out_path.rglob("*.parquet")) if out_path.exists() else []
    info = {"lines": written, "inputs": len(loaded.sources), "files": len(parquet),
            "bytes": sum(p.stat().st_size for p in parquet), "json_bytes": json_bytes, "torn_lines": torn,
            "seconds": time.monotonic() - started,
            "sources": [str(s) for s in loaded.sources]}
    if out_path.exists():
        (out_path / "_eorouter_compact.json").write_text(json.dumps(info, indent=2) + "\n")
    return info

