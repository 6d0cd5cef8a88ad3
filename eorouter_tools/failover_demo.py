"""The main job: a router dies mid-stream and Spark proves nothing was lost.

1. Start a network of routers on loopback (default: three, fully linked).
2. Resumable publishers (router.client) on two routers, resumable durable
   subscribers on every router, each writing its ledger (docs/ledger.md).
3. Steady traffic with a progress line; kill one router (SIGKILL) a third of the
   way in; its clients fail over and resume their links; restart it after a pause.
4. Drain: every publisher has every outcome and every record is settled.
5. Stop the routers and run the Spark reconciliation over every router's event
   log and every client's ledger: the verdict, and where the HTML report is.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path

from eorouter_tools.topology import LAUNCH_ERRORS, RouterNetwork, TopologyError, launch_failure, load_topology
from router.client import ResumablePublisher, ResumableSubscriber

TOPIC = "demo/orders"


def _progress(line: str) -> None:
    sys.stdout.write("\r" + line.ljust(100))
    sys.stdout.flush()


def run(
    messages: int, rate: float, topology: str | None, victim: str | None, workdir: str | None, restart_after: float, master: str
) -> int:
    try:
        layout = load_topology(topology)
    except TopologyError as err:
        print(f"eorouter demo: {err}", file=sys.stderr)
        return 2
    routers = list(layout.routers)
    victim = victim or routers[0]
    if victim not in routers:
        print(f"eorouter demo: --kill {victim}: no such router (have {', '.join(routers)})", file=sys.stderr)
        return 2
    base = Path(workdir) if workdir else Path(tempfile.mkdtemp(prefix="eorouter-demo-"))
    stream(layout, victim, base, messages, rate, restart_after)
    print("\nreconciling every router's event log and every client's ledger with Spark ...\n", flush=True)
    from spark.cli import reconcile_main

    # Its last line says where report.html and report.json are.
    return reconcile_main(
        [str(base / "routers"), "--clients", str(base / "clients"), "--out", str(base / "report"), "--master", master]
    )


def stream(layout, victim: str, base: Path, messages: int, rate: float, restart_after: float) -> dict:
    """Steps 1-4: the network under ``base/routers``, the clients' ledgers under
    ``base/clients``, the kill and the restart of ``victim``; every router stopped at
    the end. Returns each publisher's outcomes ({name: Counter})."""
    routers = list(layout.routers)
    clients_dir = base / "clients"
    clients_dir.mkdir(parents=True, exist_ok=True)
    network = RouterNetwork(base / "routers", layout, overrides={"delivery": {"record_linger": 1.0}})
    pubs, subs = {}, {}
    received: Counter = Counter()
    try:
        network.start()
        print(f"{len(routers)} routers on loopback, routes converged (data in {base}):")
        print(network.describe())

        def urls(first):
            return [network.routers[first].url] + [network.routers[r].url for r in routers if r != first]

        for where in routers:
            name = f"sub-{where}"
            subs[name] = ResumableSubscriber(
                urls(where),
                TOPIC,
                container_id=name,
                link_name=name,
                state_path=clients_dir / f"{name}.state",
                ledger_path=clients_dir / f"{name}.jsonl",
                on_message=lambda m, n=name: received.update([n]),
                heartbeat=1.0,
            )
            subs[name].start()
            subs[name].wait_attached(20)
        for where in routers[:2]:
            name = f"pub-{where}"
            pubs[name] = ResumablePublisher(
                urls(where),
                TOPIC,
                container_id=name,
                link_name=name,
                state_path=clients_dir / f"{name}.state",
                ledger_path=clients_dir / f"{name}.jsonl",
                heartbeat=1.0,
            )
            pubs[name].start()
            pubs[name].wait_attached(20)
        print(
            f"\npublishers on {', '.join(routers[:2])}; durable subscribers on {', '.join(routers)}; "
            f"{messages} messages each at ~{rate:.0f}/s; router {victim} will be killed\n"
        )
        outcomes: dict[str, list] = {}

        def publish(name, pub):
            futures = []
            for n in range(messages):
                futures.append(pub.send_async(f"{name}:{n + 1}"))
                time.sleep(1.0 / rate)
            outcomes[name] = [f.result(300) for f in futures]

        threads = [threading.Thread(target=publish, args=item, daemon=True) for item in pubs.items()]
        started = time.monotonic()
        for t in threads:
            t.start()
        killed = restarted = None
        total = messages * len(pubs)
        # Until the publishers are done and the victim is back: a short stream can end
        # before the restart is due, and the restart is part of the story told.
        while any(t.is_alive() for t in threads) or restarted is None:
            done = min(received.values(), default=0)
            if killed is None and (done >= total // 3 or not any(t.is_alive() for t in threads)):
                network.routers[victim].kill()
                killed = time.monotonic()
                print(f"\n*** killed router {victim} (SIGKILL) at {killed - started:.1f} s ***")
            if killed is not None and restarted is None and time.monotonic() - killed >= restart_after:
                network.restart(victim)
                restarted = time.monotonic()
                print(
                    f"\n*** restarted router {victim} at {restarted - started:.1f} s (epoch {network.routers[victim].epoch}) ***"
                )
            state = "  ".join(f"{n}:{c}" for n, c in sorted(received.items()))
            _progress(f"{time.monotonic() - started:5.1f} s  delivered to applications  {state}")
            time.sleep(0.2)
        for pub in pubs.values():
            pub.wait_settled(60)
        _progress(
            f"{time.monotonic() - started:5.1f} s  all outcomes in: "
            + ", ".join(f"{n} {dict(Counter(o.state for o in outs))}" for n, outs in sorted(outcomes.items()))
        )
        print()
        time.sleep(1.5)  # record_linger: the last settled records are deleted before the routers stop
    finally:
        for client in list(pubs.values()) + list(subs.values()):
            try:
                client.close()
            except Exception:  # a demo that failed half-way still stops everything it started
                pass
        network.stop()
    return {name: Counter(o.state for o in outs) for name, outs in outcomes.items()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="eorouter demo", description=__doc__.splitlines()[0])
    # router/cli.py hands `--rule` to eorouter_tools/demo.py before this parser runs: listed for --help.
    parser.add_argument(
        "--rule",
        action="store_true",
        help="instead: the delivery rule at work across the network, without a failure "
        "(its options: eorouter demo --rule --help)",
    )
    parser.add_argument("--messages", type=int, default=300, help="messages per publisher (default 300)")
    parser.add_argument("--rate", type=float, default=100.0, help="messages per second per publisher (default 100)")
    parser.add_argument("--topology", help="topology TOML file (default: three routers, fully linked)")
    parser.add_argument("--kill", metavar="ROUTER", help="the router to kill (default: the first one)")
    parser.add_argument(
        "--restart-after", type=float, default=3.0, metavar="SECONDS", help="seconds between the kill and the restart (default 3)"
    )
    parser.add_argument("--workdir", help="where routers' and clients' files go (default: a temp dir)")
    parser.add_argument("--master", default="local[2]", help="Spark master for the reconciliation")
    args = parser.parse_args(argv)
    try:
        return run(args.messages, args.rate, args.topology, args.kill, args.workdir, args.restart_after, args.master)
    except LAUNCH_ERRORS as err:
        print(f"eorouter demo: {launch_failure(err)}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    raise SystemExit(main())
