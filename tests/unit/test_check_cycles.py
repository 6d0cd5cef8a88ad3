"""scripts/check-cycles (issue 17, "no import cycles anywhere"): it finds cycles planted in
a package of its own, whether the import is at a module's top, inside a function, or of a
module's own package; imports that never run on importing the module (under
``if TYPE_CHECKING:``, under ``if __name__ == "__main__":``) make none."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

CHECKER = Path(__file__).resolve().parents[2] / "scripts" / "check-cycles"


def _package(root: Path, name: str, files: dict[str, str]) -> None:
    for relative, source in {"__init__.py": "", **files}.items():
        path = root / name / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(source))


def _check(root: Path, name: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(CHECKER), "--path", str(root), name], capture_output=True, text=True, timeout=120)


NOT_CYCLES = {
    # type-only: never imported at run time
    "typed.py": """
        from typing import TYPE_CHECKING

        if TYPE_CHECKING:
            from {name}.typer import Typer
        """,
    "typer.py": "from {name} import typed\n",
    # the file run as a script is __main__, not the module
    "script.py": """
        def run():
            pass

        if __name__ == "__main__":
            from {name}.runner import go
            go()
        """,
    "runner.py": "from {name}.script import run\n\ndef go():\n    run()\n",
}


def _with_name(files: dict[str, str], name: str) -> dict[str, str]:
    return {path: source.replace("{name}", name) for path, source in files.items()}


def test_finds_planted_cycles(tmp_path):
    planted = {
        # at the top of one module, inside a function of the other
        "first.py": "from planted import second\n",
        "second.py": "def later():\n    from planted import first\n",
        # a module importing its own package, whose __init__ imports it
        "inner/__init__.py": "from planted.inner.leaf import LEAF\nNAME = 'inner'\n",
        "inner/leaf.py": "from planted.inner import NAME\nLEAF = NAME\n",
        **NOT_CYCLES,
    }
    _package(tmp_path, "planted", _with_name(planted, "planted"))
    result = _check(tmp_path, "planted")
    assert result.returncode == 1, result.stdout + result.stderr
    found = [line for line in result.stdout.splitlines() if line.startswith("check-cycles:")]
    assert len(found) == 2, result.stdout
    assert "planted.first, planted.second" in result.stdout
    assert "planted.second -> planted.first (planted/second.py:2)" in result.stdout
    assert "planted.inner, planted.inner.leaf" in result.stdout
    for innocent in ("planted.typed", "planted.typer", "planted.script", "planted.runner"):
        assert innocent not in result.stdout


def test_type_only_and_script_imports_make_no_cycle(tmp_path):
    _package(tmp_path, "clean", _with_name(NOT_CYCLES, "clean"))
    result = _check(tmp_path, "clean")
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout == ""
