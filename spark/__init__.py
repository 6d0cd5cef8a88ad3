"""The reconciliation job: Spark reads every router's event log and proves
exactly-once (docs/reconcile.md). Modules: schema (explicit schemas), load
(inputs, session), reconcile (the proofs, DataFrame -> DataFrame), job (the proofs
run end to end, into a report), report (verdict, report.json, report.html), compact
(JSON -> Parquet), generate (synthetic logs), bench (the scale benchmark), ledger
(the applications' ledger writer), cli (the command lines), jvm and jvm_dump (the
JVM's class archive)."""
