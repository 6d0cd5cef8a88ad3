"""Faults injected into a real run's logs are each detected exactly, and nothing
else is flagged. Each fault goes into its own copy of the logs (router ids, client
ids and delivery ids prefixed), and all copies plus an untouched one go through ONE
reconciliation, through the command line: exit 1, the first violations printed."""

from __future__ import annotations

import json

import pytest
from faults import FAULTS, Logs

from spark.cli import reconcile_main

NAMES = sorted(FAULTS)


@pytest.fixture(scope="module")
def faulty(spark, real_run, tmp_path_factory):
    base = tmp_path_factory.mktemp("faults")
    logs = Logs.read(real_run["routers"])
    expected, dirs = {}, []
    for n, name in enumerate(["clean"] + NAMES):
        ns = f"f{n}."
        copy = logs.copy()
        truth = {} if name == "clean" else FAULTS[name](copy)
        expected[name] = {check: {_ns_item(check, item, ns) for item in items} for check, items in truth.items()}
        dirs += copy.namespaced(ns).write(base / "logs")
    out = base / "report"
    import contextlib
    import io

    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        rc = reconcile_main([*dirs, "--out", str(out), "--first", "1000", "--no-html"])
    report = json.loads((out / "report.json").read_text())
    found: dict[str, dict] = {name: {} for name in ["clean"] + NAMES}
    for v in report["violations"]:
        ns = (v["delivery"] or v["router"]).split(".")[0]
        name = (["clean"] + NAMES)[int(ns[1:])]
        found[name].setdefault(v["check"], set()).add(v["item"])
    return rc, buf.getvalue(), report, expected, found


def _ns_item(check: str, item: str, ns: str) -> str:
    """Items are '|'-joined router, subscriber and delivery ids: prefix each part."""
    if check == "duplicated":  # subscriber | publisher | link | incarnation | pub_tag | reuse
        sub, publisher, *rest = item.split("|")
        return "|".join([ns + sub, ns + publisher, *rest])
    return "|".join(ns + part for part in item.split("|"))


def test_untouched_copy_is_clean(faulty):
    _, _, _, _, found = faulty
    assert found["clean"] == {}


@pytest.mark.parametrize("name", NAMES)
def test_fault_detected_exactly(faulty, name):
    _, _, _, expected, found = faulty
    assert expected[name], "the injector must say what it broke"
    assert found[name] == expected[name]


def test_exit_code_and_first_violations_printed(faulty):
    rc, printed, report, expected, _ = faulty
    assert rc == 1
    assert "VERDICT: NOT clean: 1 lost, 1 duplicated, 1 out of order, 1 invented, 1 left unsettled" in printed
    for check in ("lost", "duplicated", "out-of-order", "invented", "left-unsettled"):
        assert f"first 1 of 1 {check}:" in printed
    assert report["verdict"]["proven_clean"] is False
