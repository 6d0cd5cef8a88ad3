"""Hypothesis draws random histories of a router network (spark/generate.py: the
model of what routers log) with known truth: faults injected or not, each with the
exact violations it must cause. The job's verdict must match the truth exactly.

Each example is a batch of histories (router, client and delivery ids prefixed per
history) reconciled in ONE Spark job: Spark's cost is per job, not per history."""

from __future__ import annotations

import json
import os
import shutil

from faults import BATCH_FAULTS, Logs
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from spark.generate import FAULTS, LEDGER_FAULTS, CannotInject, Spec, generate
from spark.job import run_reconcile

CI = os.environ.get("HYPOTHESIS_PROFILE") == "ci"
BATCH = 5


@st.composite
def specs(draw):
    return Spec(
        routers=draw(st.integers(1, 3)),
        publishers=draw(st.integers(1, 3)),
        subscribers=draw(st.integers(1, 4)),
        topics=draw(st.integers(1, 2)),
        deliveries=draw(st.integers(3, 30)),
        round_size=draw(st.integers(4, 20)),
        seed=draw(st.integers(0, 2**32 - 1)),
        p_reject=draw(st.sampled_from([0.0, 0.1])),
        p_expire=draw(st.sampled_from([0.0, 0.1])),
        p_detach=draw(st.sampled_from([0.0, 0.5])),
        p_presettled=draw(st.sampled_from([0.0, 0.2])),
        p_refused=draw(st.sampled_from([0.0, 0.1])),
        p_late=draw(st.sampled_from([0.0, 0.5])),
        p_restart=draw(st.sampled_from([0.0, 0.3])),
        p_fold=draw(st.sampled_from([0.0, 1.0])),
        p_batch=draw(st.sampled_from([0.0, 1.0])),
        alo_topics=draw(st.sampled_from([0, 0, 1])),  # issue 20: repeats counted, never violations
        faults=tuple(draw(st.lists(st.sampled_from(FAULTS + LEDGER_FAULTS), max_size=2, unique=True))),
    )


def violations_by_history(result: dict, prefixes) -> dict[str, dict]:
    """The job's violations of several histories reconciled together, per history
    (its id prefix): check -> the items it found. A line that could not be read
    belongs to the history whose routers' directory (h<n>.<router>) holds its file."""
    found: dict[str, dict] = {prefix: {} for prefix in prefixes}
    for v in result["violations"]:
        name = v["delivery"] or v["router"] or v["subscriber"]
        if name is None:
            name = v["file"].rsplit("/", 3)[-3]
        found[name.split(".")[0] + "."].setdefault(v["check"], set()).add(v["item"])
    return found


@settings(max_examples=3, deadline=None, derandomize=CI, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(batch=st.lists(specs(), min_size=BATCH, max_size=BATCH))
def test_verdict_matches_known_truth(spark, tmp_path_factory, batch):
    base = tmp_path_factory.mktemp("histories")
    clients = base / "clients"
    routers, truth = [], {}
    for n, spec in enumerate(batch):
        spec.prefix = f"h{n}."
        out = base / f"h{n}"
        try:
            info = generate(out, spec)
        except CannotInject:  # no place for that fault in this history: the clean history then
            shutil.rmtree(out)
            spec.faults = ()
            info = generate(out, spec)
        truth[spec.prefix] = {check: set(items) for check, items in info["truth"].items()}
        routers += [str(out / r) for r in info["routers"]]
        clients.mkdir(exist_ok=True)
        for ledger in sorted(out.glob("clients/*.jsonl")):
            ledger.rename(clients / ledger.name)
    result = run_reconcile(spark, routers, clients=str(clients), first=None, summary=False)
    found = violations_by_history(result, truth)
    for prefix in truth:
        assert found[prefix] == truth[prefix], (prefix, batch[int(prefix[1:-1])])
    assert result["verdict"]["proven_clean"] == (not any(truth.values()))


def _add_history(base, spec: Spec, routers: list, truth: dict) -> dict:
    """Generate ``spec``'s history under ``base``/<prefix>, its ledgers into
    ``base``/clients; add its routers and its truth. Returns generate()'s info."""
    out = base / spec.prefix.rstrip(".")
    info = generate(out, spec)
    truth[spec.prefix] = {check: set(items) for check, items in info["truth"].items()}
    routers += [str(out / r) for r in info["routers"]]
    for ledger in sorted(out.glob("clients/*.jsonl")):
        ledger.rename(base / "clients" / ledger.name)
    return info


def test_folded_lines_give_the_same_verdicts(spark, tmp_path):
    """The router's hot path writes one "completed" line for a sub-outcome, the
    accepted pub-outcome it caused and the settlement (router.eventschema.FOLDED). With
    every such run folded, each fault is still found exactly, and nothing else.
    Each history's first topic is at-least-once (issue 20): some of its copies are
    repeated at their subscribers (accepted again, half of them handed again), which
    the report counts, exactly, and which are never violations."""
    clients = tmp_path / "clients"
    clients.mkdir()
    routers, truth, folded = [], {}, 0
    made = {"deliveries": 0, "duplicates": 0, "app_duplicates": 0}
    for n, faults in enumerate(
        [
            (),
            ("drop-accept",),
            ("dup-tag",),
            ("reorder",),
            ("invented",),
            ("leftover",),
            ("ledger-missing",),
            ("ledger-pub-outcome",),
        ]
    ):
        spec = Spec(
            routers=2,
            publishers=2,
            subscribers=3,
            topics=2,
            alo_topics=1,
            p_repeat=0.3,
            deliveries=40,
            round_size=10,
            seed=n,
            p_restart=0.2,
            p_fold=1.0,
            faults=faults,
            prefix=f"h{n}.",
        )
        info = _add_history(tmp_path, spec, routers, truth)
        folded += info["folded_lines"]
        for key in made:
            made[key] += info["at_least_once"][key]
    assert folded > 50 and all(truth[f"h{n}."] for n in range(1, 8))
    assert made["duplicates"] > 5 and made["app_duplicates"] > 0, made
    # Found by test_verdict_matches_known_truth: a subscriber's refusal folded into
    # the "completed" line of its router's (wrong) accepted answer, at the same seq,
    # was not counted as coming before that answer (outcome-disagrees missed).
    spec = Spec(
        routers=1,
        publishers=3,
        subscribers=2,
        topics=2,
        deliveries=25,
        round_size=11,
        seed=0,  # a seed whose refused subscriber's answer is folded into that line
        p_reject=0.1,
        p_presettled=0.2,
        p_refused=0.1,
        p_fold=1.0,
        p_batch=1.0,
        faults=("outcome-refused",),
        prefix="h8.",
    )
    _add_history(tmp_path, spec, routers, truth)
    assert set(truth[spec.prefix]) == {"outcome-disagrees", "lost"}
    result = run_reconcile(spark, routers, clients=str(clients), first=None)
    found = violations_by_history(result, truth)
    assert found == truth
    assert result["summary"]["at_least_once"] == made


def test_batched_lines_give_the_same_verdicts(spark, tmp_path):
    """The router writes one "sub-outcomes" line for consecutive sub-outcomes of one
    subscriber with the same outcome (router.eventschema.FOLDED). With every such run
    batched (and half the completing ones folded), a clean history is proven clean,
    each generator fault is still found exactly, and so is a fault hidden inside a
    batched line: an accept missing from it, or one delivery named twice in it."""
    clients = tmp_path / "clients"
    clients.mkdir()
    routers, truth, batched = [], {}, 0
    histories = [
        (),
        ("drop-accept",),
        ("dup-tag",),
        ("reorder",),
        ("invented",),
        ("leftover",),
        ("ledger-missing",),
        ("ledger-pub-outcome",),
    ] + sorted(BATCH_FAULTS)
    for n, faults in enumerate(histories):
        hidden = faults if isinstance(faults, str) else None
        # No detaching subscriber where an accept goes missing: its leaving would excuse it.
        spec = Spec(
            routers=2,
            publishers=2,
            subscribers=3,
            deliveries=40,
            round_size=10,
            seed=n,
            p_restart=0.2,
            p_fold=0.5,
            p_batch=1.0,
            p_detach=0.0 if hidden else 0.3,
            faults=() if hidden else faults,
            prefix=f"h{n}.",
        )
        out = tmp_path / f"h{n}"
        info = generate(out, spec)
        batched += info["batched_lines"]
        truth[spec.prefix] = {check: set(items) for check, items in info["truth"].items()}
        dirs = [str(out / r) for r in info["routers"]]
        if hidden:  # into the clean history's lines as written
            assert not truth[spec.prefix]
            logs = Logs.read(dirs, raw=True)
            truth[spec.prefix] = BATCH_FAULTS[hidden](logs)
            dirs = logs.write(tmp_path / f"h{n}-{hidden}")
        routers += dirs
        for ledger in sorted(out.glob("clients/*.jsonl")):
            ledger.rename(clients / ledger.name)
    assert batched > 20 and all(truth[f"h{n}."] for n in range(1, len(histories)))
    result = run_reconcile(spark, routers, clients=str(clients), first=None, summary=False)
    found = violations_by_history(result, truth)
    assert found == truth


def test_adjacent_missing_seqs_are_one_gap(spark, tmp_path):
    """Found by test_verdict_matches_known_truth: a line whose seq is a string right
    before a deleted line leaves two adjacent numbers missing, which the proof names
    as one run (docs/reconcile.md, `seq-gap`: an item is a run), beside the one
    malformed line. The generator's truth once named each missing number."""
    (tmp_path / "clients").mkdir()
    routers: list = []
    truth: dict = {}
    spec = Spec(
        routers=3,
        publishers=2,
        subscribers=3,
        topics=2,
        deliveries=5,
        round_size=5,
        seed=8682,  # the malformed peer-connected line at seq 2, the deleted one at seq 3
        faults=("malformed", "seq-gap"),
        prefix="h0.",
    )
    _add_history(tmp_path, spec, routers, truth)
    assert truth["h0."]["seq-gap"] == {"h0.A|1|2"} and len(truth["h0."]["malformed-line"]) == 1
    result = run_reconcile(spark, routers, clients=str(tmp_path / "clients"), first=None, summary=False)
    assert violations_by_history(result, truth) == truth
    (gap,) = [v for v in result["violations"] if v["check"] == "seq-gap"]
    assert json.loads(gap["info"])["lo"] == 2 and json.loads(gap["info"])["hi"] == 3, gap
