"""``eorouter logs compact``: the routers' JSON-lines logs to one Parquet dataset.

Every line, as written (a folded line stays one row: the reconciliation unfolds
it), with the fields the reconciliation reads (spark/load.py ``LINE_FIELDS``, the
writer's types), the file it came from (``FILE``) and, for a line Spark could not
read whole, its text (``CORRUPT``): a malformed line stays in the dataset, for the
reconciliation to judge. A torn last line (a crash cut the router's last write:
docs/event-log.md) is left out and counted. Rows are sorted by (router, epoch,
seq), so each router's lines sit together and compress well. ``eorouter
reconcile`` reads either form; docs/reconcile.md says what the difference costs.
"""

from __future__ import annotations

import json
import math
import os
import time
from pathlib import Path

from pyspark.sql import functions as F

from spark.load import load_lines, resolve
from spark.schema import CORRUPT, FILE

#: Rows are lines as written, so the dataset counts lines, not events.
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
    from spark import reconcile

    started = time.monotonic()
    sources = resolve(inputs, "json")
    json_bytes = sum(_size(s.paths) for s in sources if not s.remote)
    lines = load_lines(spark, sources, files=True)
    counts = lines.agg(F.count(F.lit(1)).alias("n"), F.sum(reconcile.bad(lines).cast("long")).alias("bad")).collect()[0]
    bad, total_bad = reconcile.find_bad_lines(spark, sources) if counts["bad"] else ([], 0)
    torn = [b for b in bad if b["torn"]]
    keep = lines
    for b in torn:
        keep = keep.where(~((F.col(FILE) == b["file"]) & (F.col(CORRUPT) == b["text"])))
    if files <= 0:
        files = max(1, math.ceil(counts["n"] / LINES_PER_FILE))
    keep.repartitionByRange(files, "router", "epoch", "seq").sortWithinPartitions("router", "epoch", "seq").write.mode(
        "overwrite"
    ).option("compression", "zstd").parquet(out)
    written = spark.read.parquet(out).count()
    out_path = Path(out)
    parquet = sorted(out_path.rglob("*.parquet")) if out_path.exists() else []
    info = {
        "lines": written,
        "inputs": len(sources),
        "files": len(parquet),
        "bytes": sum(p.stat().st_size for p in parquet),
        "json_bytes": json_bytes,
        "torn_lines": len(torn),
        "torn": [{"file": b["file"], "line": b["line"]} for b in torn],
        "malformed_lines": total_bad - len(torn),
        "seconds": time.monotonic() - started,
        "sources": [str(s) for s in sources],
    }
    if out_path.exists():
        (out_path / "_eorouter_compact.json").write_text(json.dumps(info, indent=2) + "\n")
    return info
