"""docs/reconcile.md's specification table and the code, held to each other (issue 15).

The table "## The checks (specification)" has one row per check of
``spark.reconcile.CHECKS``, in that order, and names in "Tested by" the tests that
expect each check: mutations of a real run (tests/spark/mutations.py, in quotes),
faults of the generator (spark/generate.py, ``--fault NAME``) and injectors into a
real run's events (tests/spark/faults.py, ``faults:NAME``). Both ways: every test
named in a row exists and expects that check, and every check a test expects is
named in that check's row. What a mutation or an injector expects is read from
its source (the keys of the dicts it returns); what a generator fault expects from
the truth the generator writes for it (small histories, pure Python). No Spark
session: this runs in well under a second.
"""

from __future__ import annotations

import ast
import inspect
import os
import re
import tempfile
import textwrap
from pathlib import Path

import faults
import mutations
import pytest

from spark import generate
from spark.reconcile import CHECK_NAMES

DOC = Path(__file__).resolve().parents[2] / "docs" / "reconcile.md"
HEADING = "## The checks (specification)"
COLUMNS = ["Check", "Invariant", "Evidence it needs", "Excused when", "Faults it catches", "Tested by"]
#: Checks no test can exercise (none: keep it so, or say here why one cannot be).
UNTESTABLE: frozenset = frozenset()

MUTATION = re.compile(r'"([^"]+)"')
FAULT = re.compile(r"`--fault ([a-z0-9-]+)`")
INJECTOR = re.compile(r"`faults:([a-z0-9-]+)`")
GENERATOR_FAULTS = generate.FAULTS + generate.LEDGER_FAULTS
INJECTORS = {**faults.FAULTS, **faults.BATCH_FAULTS}


def _cells(line: str) -> list[str]:
    line = line.strip()
    assert line.startswith("|") and line.endswith("|"), line
    return [cell.strip() for cell in re.split(r"(?<!\\)\|", line[1:-1])]


def table_lines(text: str) -> list[str]:
    """The lines of the first table after HEADING (header and rule included)."""
    assert text.count(HEADING) == 1, f"docs/reconcile.md needs exactly one {HEADING!r}"
    lines = text.split(HEADING, 1)[1].splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("|"))
    assert not any(line.startswith("## ") for line in lines[:start]), "the table must be in its section"
    table = []
    for line in lines[start:]:
        if not line.startswith("|"):
            break
        table.append(line)
    return table


def read_table(text: str) -> list[dict]:
    """The rows of the table, as {column: cell}."""
    header, rule, *rows = table_lines(text)
    assert _cells(header) == COLUMNS
    assert all(re.fullmatch(r":?-{3,}:?", cell) for cell in _cells(rule)), rule
    out = []
    for row in rows:
        cells = _cells(row)
        assert len(cells) == len(COLUMNS), f"{len(cells)} cells, not {len(COLUMNS)}: {row[:80]}"
        out.append(dict(zip(COLUMNS, cells)))
    return out


def check_name(cell: str) -> str:
    m = re.fullmatch(r"`([a-z-]+)`", cell)
    assert m, f"the Check column holds a check's name in backticks, not {cell!r}"
    return m.group(1)


def names_in(cell: str) -> tuple[list[str], list[str], list[str]]:
    """(mutations, generator faults, injectors) named in a "Tested by" cell, which
    must hold nothing else but commas."""
    named = (MUTATION.findall(cell), FAULT.findall(cell), INJECTOR.findall(cell))
    rest = INJECTOR.sub("", FAULT.sub("", MUTATION.sub("", cell)))
    assert re.fullmatch(r"[\s,]*", rest), f"not a test name: {rest.strip(' ,')!r} in {cell!r}"
    return named


@pytest.fixture(scope="module")
def doc() -> str:
    return DOC.read_text(encoding="utf-8")


@pytest.fixture(scope="module")
def table(doc) -> list[dict]:
    return read_table(doc)


@pytest.fixture(scope="module")
def rows(table) -> dict[str, dict]:
    out = {check_name(row["Check"]): row for row in table}
    assert len(out) == len(table), "a check has two rows"
    return out


# ----------------------------------------------------------------------------- what each test expects


def expected_by_source(function) -> set[str]:
    """The checks a mutation or injector expects: the string keys of the dict
    literals it returns (an ``Exit2`` expects none: the command refuses the input)."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(function)))
    checks: set[str] = set()
    returns = [node for node in ast.walk(tree) if isinstance(node, ast.Return) and node.value is not None]
    assert returns, f"{function.__name__} returns nothing"
    for node in returns:
        value = node.value
        if isinstance(value, ast.Call) and getattr(value.func, "id", None) == "Exit2":
            continue
        assert isinstance(value, ast.Dict), (
            f"{function.__name__}: cannot read what it expects (line {node.lineno}: return a dict literal of check names)"
        )
        for key in value.keys:
            assert isinstance(key, ast.Constant) and isinstance(key.value, str), (
                f"{function.__name__}: a key that is not a check's name (line {node.lineno})"
            )
            checks.add(key.value)
    return checks


class GeneratorTruth:
    """fault -> the checks the generator's truth names for it, over the small
    histories (seeds 1, 2, ...) it could inject it into: the first two, and more
    when asked. Some checks follow from where a fault lands (a duplicate on a remote
    router is also an unforwarded arrival; a publisher's ledger saying rejected is
    also an outcome-disagrees when every subscriber had accepted): two histories
    show them, so that the table must name them too."""

    SEEDS = 12

    def __init__(self, base: Path):
        self.base = base
        self.next_seed: dict[str, int] = {}
        self.checks: dict[str, set[str]] = {}

    def more(self, fault: str) -> bool:
        """Add the truth of the next history the fault goes into; False when none is left."""
        while self.next_seed.get(fault, 1) <= self.SEEDS:
            seed = self.next_seed.get(fault, 1)
            self.next_seed[fault] = seed + 1
            spec = generate.Spec(
                routers=3 if fault == "seq-repeated" else 2,
                publishers=2,
                subscribers=3,
                deliveries=10,
                round_size=10,
                seed=seed,
                p_reject=0.2,
                p_restart=0.5 if fault == "restart-answer" else 0.0,
                faults=(fault,),
            )
            try:
                info = generate.generate(self.base / f"{fault}-{seed}", spec)
            except generate.CannotInject:
                continue
            self.checks.setdefault(fault, set()).update(info["truth"])
            return True
        return False


@pytest.fixture(scope="module")
def generator_truth(tmp_path_factory):
    def first_two(truth: GeneratorTruth) -> GeneratorTruth:
        for fault in GENERATOR_FAULTS:
            assert truth.more(fault), f"the generator found no place for --fault {fault} in {truth.SEEDS} histories"
            truth.more(fault)
        return truth

    # ~40 small histories of ~15 files each: in memory (tmpfs) when the machine has
    # one, where creating a file costs microseconds, not milliseconds.
    shm = Path("/dev/shm")
    if shm.is_dir() and os.access(shm, os.W_OK | os.X_OK):
        with tempfile.TemporaryDirectory(prefix="eorouter-spec-", dir=shm) as base:
            yield first_two(GeneratorTruth(Path(base)))
    else:
        yield first_two(GeneratorTruth(tmp_path_factory.mktemp("spec-generator")))


# ----------------------------------------------------------------------------- the table and CHECKS


def test_the_check_column_is_checks_in_order(table):
    assert [check_name(row["Check"]) for row in table] == list(CHECK_NAMES)


def test_every_test_named_exists(doc, rows):
    """Every test the table names (in any column: quotes are for mutations only)
    is a real one, and a row names a test at most once in "Tested by"."""
    table = "\n".join(table_lines(doc))
    for name in MUTATION.findall(table):
        assert name in mutations.MUTATIONS, f"no mutation {name!r} in tests/spark/mutations.py MUTATIONS"
    for name in FAULT.findall(table):
        assert name in GENERATOR_FAULTS, f"no --fault {name} in spark/generate.py"
    for name in INJECTOR.findall(table):
        assert name in INJECTORS, f"no injector {name!r} in tests/spark/faults.py"
    for check in CHECK_NAMES:
        for named in names_in(rows[check]["Tested by"]):
            assert len(named) == len(set(named)), (check, named)


def test_every_check_names_a_test(rows):
    assert UNTESTABLE <= set(CHECK_NAMES)
    for check in CHECK_NAMES:
        if check in UNTESTABLE:
            continue
        assert any(names_in(rows[check]["Tested by"])), f"{check}: no test named in 'Tested by'"
    for check in UNTESTABLE:  # if a test exists after all, it is no longer untestable
        assert not any(names_in(rows[check]["Tested by"])), f"{check} is tested: take it out of UNTESTABLE"


def test_every_row_has_every_column_filled(rows):
    for check in CHECK_NAMES:
        for column in COLUMNS[1:-1]:
            assert rows[check][column], f"{check}: {column} is empty"


# ----------------------------------------------------------------------------- the tests, both ways


def _named_in_rows(rows, which: int) -> dict[str, set[str]]:
    """test name -> the checks whose row names it in "Tested by"."""
    out: dict[str, set[str]] = {}
    for check in CHECK_NAMES:
        for name in names_in(rows[check]["Tested by"])[which]:
            out.setdefault(name, set()).add(check)
    return out


def test_mutations_expect_exactly_the_checks_whose_rows_name_them(rows):
    named = _named_in_rows(rows, 0)
    for name, mutation in mutations.MUTATIONS.items():
        expected = expected_by_source(mutation)
        assert expected <= set(CHECK_NAMES), (name, expected - set(CHECK_NAMES))
        assert named.get(name, set()) == expected, (
            f"mutation {name!r} expects {sorted(expected)}; the table names it under {sorted(named.get(name, ()))}"
        )


def test_injectors_expect_exactly_the_checks_whose_rows_name_them(rows):
    named = _named_in_rows(rows, 2)
    for name, injector in INJECTORS.items():
        expected = expected_by_source(injector)
        assert expected, f"faults:{name} must expect a violation"
        assert named.get(name, set()) == expected, (
            f"faults:{name} expects {sorted(expected)}; the table names it under {sorted(named.get(name, ()))}"
        )


def test_generator_faults_expect_exactly_the_checks_whose_rows_name_them(rows, generator_truth):
    named = _named_in_rows(rows, 1)
    for fault in GENERATOR_FAULTS:
        while named.get(fault, set()) - generator_truth.checks[fault] and generator_truth.more(fault):
            pass  # a check that follows from where the fault lands: another history may show it
        expected = generator_truth.checks[fault]
        assert expected <= set(CHECK_NAMES), (fault, expected - set(CHECK_NAMES))
        assert named.get(fault, set()) == expected, (
            f"--fault {fault}: its truth names {sorted(expected)}; the table names it under {sorted(named.get(fault, ()))}"
        )


def test_the_doc_mentions_every_test(doc):
    """A test that expects no check (a clean history, a note, an input refused with
    exit 2) is still described somewhere in docs/reconcile.md."""
    for name in mutations.MUTATIONS:
        assert f'"{name}"' in doc, f"docs/reconcile.md never mentions the mutation {name!r}"
    for fault in GENERATOR_FAULTS:
        assert f"`--fault {fault}`" in doc, f"docs/reconcile.md never mentions --fault {fault}"
    for name in INJECTORS:
        assert f"`faults:{name}`" in doc, f"docs/reconcile.md never mentions faults:{name}"
