"""The audit's mutations of real logs (issues 14 and 15), table-driven: one real run
of three router processes (tests/spark/realrun.py, once for this module), then one
copy of its logs and ledgers per mutation (tests/spark/mutations.py), each
reconciled by the command line's own entry point (in this process, on the tests'
Spark session): each mutation must give exactly its named violations and exit 1,
a clean copy exit 0, and an input without events exit 2 with a clear message."""

from __future__ import annotations

import contextlib
import io
import json

import pytest
from mutations import MUTATIONS, WITHOUT_LEDGERS, Copy, Exit2

from spark.cli import EXIT_CLEAN, EXIT_USAGE, EXIT_VIOLATIONS, reconcile_main

NAMES = sorted(MUTATIONS)


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    import realrun

    result = realrun.run(tmp_path_factory.mktemp("mutations-run"), messages=12)
    assert result["left"] == 0 and result["sent"] == 24
    return result


def reconcile(copy: Copy, out, ledgers: bool = True) -> tuple[int, str, str, dict | None]:
    dirs = copy.write()
    stdout, stderr = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
        rc = reconcile_main(
            [*dirs, *(["--clients", str(copy.ledgers)] if ledgers else []), "--out", str(out), "--first", "1000", "--no-html"]
        )
    report = json.loads((out / "report.json").read_text()) if (out / "report.json").exists() else None
    return rc, stdout.getvalue(), stderr.getvalue(), report


def found(report: dict) -> dict[str, set]:
    out: dict[str, set] = {}
    for v in report["violations"]:
        out.setdefault(v["check"], set()).add(v["item"])
    return out


def test_the_untouched_copy_is_proven_clean(spark, run, tmp_path):
    rc, printed, _, report = reconcile(Copy.of(run, tmp_path / "logs"), tmp_path / "report")
    assert rc == EXIT_CLEAN, printed
    assert report["verdict"]["proven_clean"] and report["violations"] == [] and report["torn"] == []


@pytest.mark.parametrize("name", NAMES)
def test_each_mutation_gives_its_named_violations(spark, run, tmp_path, name):
    copy = Copy.of(run, tmp_path / "logs")
    expected = MUTATIONS[name](copy)
    rc, printed, errors, report = reconcile(copy, tmp_path / "report")
    if isinstance(expected, Exit2):
        assert rc == EXIT_USAGE, printed + errors
        assert "no events in" in errors and expected.text in errors, errors
        assert report is None
        return
    assert found(report) == expected, printed
    if expected:
        assert rc == EXIT_VIOLATIONS and not report["verdict"]["proven_clean"]
        # each listed with a sentence naming where (and the subscriber, when there is one)
        for v in report["violations"]:
            assert v["detail"] and (v["subscriber"] is None or v["subscriber"] in v["detail"]), v
        assert "VERDICT: NOT clean" in printed
    else:  # a torn last line is a note, not a violation; so is a refusal beyond the horizon, shown
        assert rc == EXIT_CLEAN and report["verdict"]["proven_clean"]
    alo = report["summary"]["at_least_once"]
    if "at-least-once" in name:  # its duplicate counted, not failed
        assert (alo["deliveries"], alo["duplicates"], alo["app_duplicates"]) == (2, 1, 1), alo
        assert "1 extra cop(ies) accepted, 1 handed again" in printed, printed
        (bob,) = [s for s in report["summary"]["per_subscriber"] if s["subscriber"] == "bob-app/bob-in"]
        assert bob["duplicated"] == 1
    elif "at-least-once" not in name:
        assert alo["deliveries"] == 0 and "at-least-once" not in printed
    horizon = 1 if "beyond the resume horizon" in name else 0
    assert report["beyond_horizon"] == horizon
    assert ("refused beyond the resume horizon" in printed) == bool(horizon), printed
    assert [(t["file"], t["line"]) for t in report["torn"]] == [(copy.uri(r, f), line) for r, f, line in copy.note]


@pytest.mark.parametrize("name", WITHOUT_LEDGERS)
def test_without_ledgers_the_logs_alone_give_them(spark, run, tmp_path, name):
    copy = Copy.of(run, tmp_path / "logs")
    expected = {check: items for check, items in MUTATIONS[name](copy).items() if check != "ledger"}
    rc, printed, _, report = reconcile(copy, tmp_path / "report", ledgers=False)
    assert found(report) == expected, printed
    assert rc == (EXIT_VIOLATIONS if expected else EXIT_CLEAN)


def test_the_proof_knows_the_routers_refusal_beyond_the_horizon():
    """The job names the core's condition in its own words (spark reads no router
    runtime module): the two must stay the same string."""
    from router.core.constants import BEYOND_HORIZON_CONDITION
    from spark.reconcile import BEYOND_HORIZON

    assert BEYOND_HORIZON == BEYOND_HORIZON_CONDITION
