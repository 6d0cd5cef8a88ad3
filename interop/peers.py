"""The interop stacks: where each one's publisher and subscriber programs are, and how to install them.

    from interop import peers
    reason = peers.setup("rhea")          # None when ready, else why it cannot run here
    argv = peers.command("rhea", "subscriber") + [host, port, topic, count, "--ledger", path, ...]

Setup is idempotent and fast when nothing changed:
- ``python``: python-qpid-proton, a dependency of the project itself;
- ``azure``: ``azure.servicebus._pyamqp``; when it does not import, ``pip install -e .[interop]``
  into the running interpreter's environment;
- ``rhea``: ``npm ci`` in interop/rhea (from the committed lockfile) when node_modules is missing or
  older than package-lock.json; needs ``node`` and ``npm`` on PATH;
- ``protonc``: interop/protonc/*.c built into build/interop-protonc with eorouter_tools/build.py's compiler logic
  (gcc, pkg-config, libqpid-proton11-dev); when those are missing and we are root, runs
  ``scripts/setup-root`` (apt-get) once and retries.

``python -m interop.peers [STACK...]`` sets them up and prints one line per stack.
This module imports nothing from ``router``.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
import threading
from pathlib import Path

INTEROP = Path(__file__).resolve().parent
ROOT = INTEROP.parent
STACKS = ("python", "rhea", "protonc", "azure")
PROTONC_BUILD = ROOT / "build" / "interop-protonc"
# name -> (main source, #included sources, extra link flags): eorouter_tools.build.build_c_programs' format
PROTONC_PROGRAMS = {
    "publisher": ("publisher.c", ("ledger.h", "blake2b.h"), ()),
    "subscriber": ("subscriber.c", ("ledger.h", "blake2b.h"), ()),
}

_lock = threading.Lock()
_results: dict[str, str | None] = {}


class SetupError(RuntimeError):
    pass


def _run(cmd: list[str], cwd: Path | None = None, timeout: float = 600) -> None:
    r = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=timeout)
    if r.returncode != 0:
        tail = "\n".join((r.stderr or r.stdout).strip().splitlines()[-15:])
        raise SetupError(f"`{' '.join(cmd)}` failed ({r.returncode}):\n{tail}")


def _setup_python() -> None:
    if importlib.util.find_spec("proton") is None:
        raise SetupError("python-qpid-proton does not import (the project's own dependency: pip install -e .)")


def _azure_importable() -> bool:
    r = subprocess.run([sys.executable, "-c", "import azure.servicebus._pyamqp.client"], capture_output=True, text=True)
    return r.returncode == 0


def _setup_azure() -> None:
    if _azure_importable():
        return
    print("interop setup: installing azure-servicebus (pip install -e .[interop])", file=sys.stderr)
    _run([sys.executable, "-m", "pip", "install", "-q", "-e", f"{ROOT}[interop]"], timeout=900)
    if not _azure_importable():
        raise SetupError("azure.servicebus._pyamqp still does not import after pip install -e .[interop]")


def _root_setup(why: str) -> None:
    """Run scripts/setup-root (apt-get) when we are root, else say how."""
    setup_root = ROOT / "scripts" / "setup-root"
    if os.geteuid() != 0 or not setup_root.exists() or shutil.which("apt-get") is None:
        raise SetupError(f"{why} (as root: scripts/setup-root)")
    print(f"interop setup: {why}\ninterop setup: running scripts/setup-root", file=sys.stderr)
    _run(["bash", str(setup_root)], timeout=900)


def _setup_rhea() -> None:
    if shutil.which("node") is None or shutil.which("npm") is None:
        _root_setup("node and npm are needed on PATH for the rhea peers")
    node, npm = shutil.which("node"), shutil.which("npm")
    if node is None or npm is None:
        raise SetupError("node and npm are still not on PATH after scripts/setup-root")
    rhea_dir = INTEROP / "rhea"
    lock = rhea_dir / "package-lock.json"
    stamp = rhea_dir / "node_modules" / ".package-lock.json"  # npm writes it on every install
    if (
        (rhea_dir / "node_modules" / "rhea" / "package.json").exists()
        and stamp.exists()
        and stamp.stat().st_mtime >= lock.stat().st_mtime
    ):
        return
    print("interop setup: npm ci in interop/rhea", file=sys.stderr)
    _run([npm, "ci", "--no-audit", "--no-fund", "--loglevel=error"], cwd=rhea_dir)


def build_protonc(force: bool = False, verbose: bool = False) -> dict[str, Path]:
    """Build the Proton C peers (eorouter_tools/build.py's compiler logic and staleness stamps)."""
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    from eorouter_tools.build import build_c_programs

    return build_c_programs(PROTONC_PROGRAMS, INTEROP / "protonc", PROTONC_BUILD, force=force, verbose=verbose)


def _setup_protonc() -> None:
    from eorouter_tools.build import BuildError

    try:
        build_protonc()
        return
    except BuildError as err:
        reason = str(err)
    _root_setup(reason)
    try:
        build_protonc()
    except BuildError as err:
        raise SetupError(str(err)) from None


_SETUP = {"python": _setup_python, "azure": _setup_azure, "rhea": _setup_rhea, "protonc": _setup_protonc}


def setup(stack: str) -> str | None:
    """Install what ``stack`` needs (once per process): None when ready, else the reason it cannot run."""
    with _lock:
        if stack not in _results:
            try:
                _SETUP[stack]()
                _results[stack] = None
            except (SetupError, OSError, subprocess.TimeoutExpired) as err:
                _results[stack] = f"{stack}: {err}"
        return _results[stack]


def command(stack: str, role: str) -> list[str]:
    """The argv prefix that runs ``stack``'s ``role`` ("publisher" or "subscriber") program."""
    if stack in ("python", "azure"):
        return [sys.executable, str(INTEROP / stack / f"{role}.py")]
    if stack == "rhea":
        return [shutil.which("node") or "node", str(INTEROP / "rhea" / f"{role}.js")]
    if stack == "protonc":
        return [str(PROTONC_BUILD / role)]
    raise ValueError(f"unknown stack {stack!r}; known: {', '.join(STACKS)}")


def main(argv: list[str] | None = None) -> int:
    stacks = (argv if argv is not None else sys.argv[1:]) or list(STACKS)
    failed = 0
    for stack in stacks:
        reason = setup(stack)
        print(f"{stack:8} {'ready' if reason is None else 'NOT READY: ' + reason}")
        failed += reason is not None
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
