"""Build the benchmark's C clients (adapted Qpid Proton C examples) into the repo's ignored build/ dir.

    from eorouter_tools.build import build_c_clients
    paths = build_c_clients()          # {"send": Path, "receive": Path, "broker": Path}

A binary is rebuilt when it is missing or stale: the stamp next to it records a hash of its source
files and the compiler command, so an edited source, header or flag triggers a rebuild. Builds write
to a temporary name and rename, so concurrent callers never see a half-written binary.
Needs gcc, pkg-config and libqpid-proton11-dev (`sudo scripts/setup-root` installs them).

`python -m eorouter_tools.build` builds and prints the paths.
"""

from __future__ import annotations

import hashlib
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SRC_DIR = ROOT / "bench" / "cclients"  # the benchmark's C clients
BUILD_DIR = ROOT / "build" / "cclients"
# Headers every program may include (the shared proton event loop, proton_loop.h):
# on the include path, and hashed into every program's fingerprint.
C_INCLUDE = Path(__file__).resolve().parent / "c"

# name -> (main source, extra sources hashed because they are #included, extra link flags)
CLIENTS: dict[str, tuple[str, tuple[str, ...], tuple[str, ...]]] = {
    "send": ("send.c", (), ()),
    "receive": ("receive.c", (), ()),
    "broker": ("broker.c", ("thread.h",), ("-lpthread",)),
}

CFLAGS = ("-O2", "-Wall")


class BuildError(RuntimeError):
    pass


def _pkg_config() -> tuple[list[str], list[str]]:
    if shutil.which("pkg-config") is None:
        raise BuildError("pkg-config not found: run `sudo scripts/setup-root` (installs pkg-config, gcc, libqpid-proton11-dev)")
    try:
        cflags = subprocess.run(
            ["pkg-config", "--cflags", "libqpid-proton"], check=True, capture_output=True, text=True
        ).stdout.split()
        libs = subprocess.run(
            ["pkg-config", "--libs", "libqpid-proton"], check=True, capture_output=True, text=True
        ).stdout.split()
    except subprocess.CalledProcessError as e:
        raise BuildError(
            "pkg-config does not know libqpid-proton: run `sudo scripts/setup-root` "
            f"(installs libqpid-proton11-dev): {e.stderr.strip()}"
        ) from None
    return cflags, libs


def _command(name: str, out: Path, cflags: list[str], libs: list[str], programs=CLIENTS, src_dir: Path = SRC_DIR) -> list[str]:
    main, _extra, ldflags = programs[name]
    return ["gcc", *CFLAGS, "-I", str(C_INCLUDE), "-o", str(out), str(src_dir / main), *cflags, *libs, *ldflags]


def _fingerprint(name: str, cmd: list[str], programs=CLIENTS, src_dir: Path = SRC_DIR) -> str:
    main, extra, _ = programs[name]
    h = hashlib.sha256()
    for src in (main, *extra):
        h.update(src.encode() + b"\0" + (src_dir / src).read_bytes() + b"\0")
    for header in sorted(C_INCLUDE.glob("*.h")):
        h.update(header.name.encode() + b"\0" + header.read_bytes() + b"\0")
    h.update(" ".join(cmd).encode())
    return h.hexdigest()


def build_c_clients(build_dir: Path | None = None, *, force: bool = False, verbose: bool = False) -> dict[str, Path]:
    """Build (when missing or stale) and return {"send", "receive", "broker"} -> executable path."""
    return build_c_programs(
        CLIENTS, SRC_DIR, Path(build_dir) if build_dir is not None else BUILD_DIR, force=force, verbose=verbose
    )


def build_c_programs(
    programs: dict[str, tuple[str, tuple[str, ...], tuple[str, ...]]],
    src_dir: Path,
    build_dir: Path,
    *,
    force: bool = False,
    verbose: bool = False,
) -> dict[str, Path]:
    """Build other Proton C programs the same way (the interop peers use it): ``programs`` maps
    name -> (main source, #included sources, extra link flags), sources in ``src_dir``."""
    bdir = Path(build_dir)
    src_dir = Path(src_dir)
    if shutil.which("gcc") is None:
        raise BuildError("gcc not found: run `sudo scripts/setup-root`")
    cflags, libs = _pkg_config()
    bdir.mkdir(parents=True, exist_ok=True)
    paths: dict[str, Path] = {}
    for name in programs:
        out = bdir / name
        stamp = bdir / f".{name}.stamp"
        # the command is hashed with a fixed output name (the real build writes a temporary one)
        fp = _fingerprint(name, _command(name, Path(name), cflags, libs, programs, src_dir), programs, src_dir)
        if not force and out.exists() and stamp.exists() and stamp.read_text().strip() == fp:
            paths[name] = out
            continue
        tmp = bdir / f".{name}.tmp.{os.getpid()}"
        cmd = _command(name, tmp, cflags, libs, programs, src_dir)
        if verbose:
            print("build:", shlex.join(cmd), file=sys.stderr)
        r = subprocess.run(cmd, capture_output=True, text=True)
        if r.returncode != 0:
            tmp.unlink(missing_ok=True)
            raise BuildError(f"building {name} failed:\n{shlex.join(cmd)}\n{r.stderr}")
        os.replace(tmp, out)
        stamp_tmp = bdir / f".{name}.stamp.{os.getpid()}"
        stamp_tmp.write_text(fp + "\n")
        os.replace(stamp_tmp, stamp)
        paths[name] = out
    return paths


def main(argv: list[str] | None = None) -> int:
    import argparse

    p = argparse.ArgumentParser(prog="python -m eorouter_tools.build", description=__doc__.split("\n\n")[0])
    p.add_argument("--force", action="store_true", help="rebuild even when up to date")
    p.add_argument("--build-dir", type=Path, default=None)
    a = p.parse_args(argv)
    try:
        paths = build_c_clients(a.build_dir, force=a.force, verbose=True)
    except BuildError as e:
        print(f"eorouter_tools.build: {e}", file=sys.stderr)
        return 1
    for name, path in paths.items():
        print(f"{name}\t{path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
