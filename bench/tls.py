"""What TLS costs the router: its client listener on TLS against plain AMQP, same
code, in one run (issue 18's target: at most 1.3x plaintext CPU per message at K=1);
with ``--policy`` also a ``[policy]`` against none (its target: nothing measurable,
since it is decided at open and attach, not per message).

``python -m bench.tls [--subscribers 1,4] [--messages 50000] [--rounds 5] [--policy]``: the C
clients (bench/cclients, ``-T CAFILE``) reach the router over TLS (OpenSSL through
Qpid Proton on both sides, TLS 1.3, certificates from a throwaway CA) or in clear,
alternating round by round (bench/sides.py)."""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
from pathlib import Path

from bench.run import parse_args as bench_args
from bench.run import snapshot_router
from bench.sides import alternate, report
from eorouter_tools.build import BuildError, build_c_clients
from eorouter_tools.pki import Pki


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.tls", description=__doc__.split("\n\n")[0])
    p.add_argument("--subscribers", default="1,4")
    p.add_argument("--messages", type=int, default=50000)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--policy", action="store_true", help="also a [policy] against none (what authorization costs)")
    args = p.parse_args(argv)
    try:
        bins = build_c_clients()
    except BuildError as e:
        print(f"bench.tls: {e}", file=sys.stderr)
        return 2
    pki_dir = Path(tempfile.mkdtemp(prefix="eobench-pki-"))
    run_args = bench_args(["--messages", str(args.messages)])
    snapshot_router(run_args)  # every run uses the same router/, even while it is being edited
    try:
        pki = Pki(pki_dir)
        cert, key = pki.server()
        tls = {"cert": str(cert), "key": str(key), "ca": str(pki.ca)}

        def plain(a: argparse.Namespace) -> None:
            a.tls = None

        def secure(a: argparse.Namespace) -> None:
            a.tls = tls

        def open_door(a: argparse.Namespace) -> None:
            a.tls, a.policy = None, False

        def policy(a: argparse.Namespace) -> None:
            a.tls, a.policy = None, True

        ks = [int(k) for k in args.subscribers.split(",")]
        results = alternate(run_args, bins, ks, args.rounds, args.messages, (("plain", plain), ("tls", secure)))
        print(f"\nrouter CPU per message, exactly-once, C clients, {args.messages} messages, {args.rounds} rounds")
        report(results, ks, "plain", "tls")
        if args.policy:
            results = alternate(run_args, bins, ks, args.rounds, args.messages, (("none", open_door), ("policy", policy)))
            print("\n... and a [policy] (rights, connection, link and message size limits) against none, both plain:")
            report(results, ks, "none", "policy")
        return 0
    finally:
        shutil.rmtree(pki_dir, ignore_errors=True)
        if getattr(run_args, "snapshot_dir", None):
            shutil.rmtree(run_args.snapshot_dir, ignore_errors=True)


if __name__ == "__main__":
    raise SystemExit(main())
