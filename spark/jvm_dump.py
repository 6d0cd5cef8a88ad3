"""The child process of spark/jvm.py's ``build``: ``python -m spark.jvm_dump ARCHIVE WORKDIR``.

It reconciles a small generated history (spark/generate.py, then spark/job.py) in a JVM
told to dump the classes it loaded into ARCHIVE when it exits, and waits until it has.
Apart from spark/jvm.py because it runs the job, which needs the session's settings
(spark/load.py), which read spark/jvm.py for the archive: jvm.py itself imports none of them.
"""

from __future__ import annotations

import sys
from pathlib import Path


def dump(archive: str, work: str) -> None:
    """(In the child.) Reconcile a small history in a JVM that dumps its classes to
    ``archive`` when it exits; make it exit and wait until it has."""
    from spark import generate, load
    from spark.job import run_reconcile

    logs = Path(work) / "logs"
    generate.main([str(logs), "--events", "3000", "--routers", "3", "--publishers", "2", "--subscribers", "2", "--topics", "1"])
    import json

    truth = json.loads((logs / "truth.json").read_text())
    options = [*load.java_options(small=True), f"-XX:ArchiveClassesAtExit={archive}"]
    spark = load.get_session(
        "local[2]", app_name="eorouter-class-archive", events=3000, conf={"spark.driver.extraJavaOptions": " ".join(options)}
    )
    run_reconcile(spark, [str(logs / r) for r in truth["routers"]], clients=str(logs / "clients"), out=Path(work) / "report")
    from pyspark import SparkContext

    gateway = SparkContext._gateway
    spark.stop()
    proc = getattr(gateway, "proc", None)
    if gateway is not None and proc is not None:  # the JVM exits when its stdin closes, dumping the archive first
        gateway.shutdown()
        if proc.stdin is not None:
            proc.stdin.close()
        proc.wait(timeout=300)


if __name__ == "__main__":
    if len(sys.argv) != 3:
        print("usage: python -m spark.jvm_dump ARCHIVE WORKDIR (run by python -m spark.jvm)", file=sys.stderr)
        raise SystemExit(2)
    dump(sys.argv[1], sys.argv[2])
