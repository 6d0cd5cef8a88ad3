"""What the two-step settlement costs a router, with the resumable Python client.

``python -m bench.settle_modes [--messages 20000] [--rounds 3]`` (``scripts/bench
--settle-modes``): one router, one ``router.client`` publisher and one subscriber on
an exactly-once topic; the router is started with ``publisher_rcv_settle_mode``
"resumable" (the default: the client asks for second and says it resumes, so it
settles each delivery after its outcome and the router relays that settlement to the
subscriber) and with "first" (the router settles with the outcome), the two taking
turns round after round so that drift in the machine's speed falls on both alike.
Prints the router's CPU per message (from /proc, over the timed messages only) and
the messages per second, per round and as medians, and their ratio
(docs/delivery-rule.md, "Settlement"; docs/benchmarks.md).
"""

from __future__ import annotations

import argparse
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from router.client import ResumablePublisher, ResumableSubscriber

MODES = ("resumable", "first")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def one_run(mode: str, messages: int) -> tuple[float, float]:
    """(router CPU µs per message, messages per second) for one router in ``mode``."""
    work = Path(tempfile.mkdtemp(prefix="eobench-settle-"))
    port = _free_port()
    config = work / "router.toml"
    config.write_text(
        f'[router]\nid = "A"\ndata_dir = "{work}/data"\n[[listener]]\nport = {port}\n'
        f'[delivery]\npublisher_rcv_settle_mode = "{mode}"\n'
    )
    router = subprocess.Popen(
        [sys.executable, "-m", "router", "run", "--config", str(config)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        url = f"127.0.0.1:{port}"
        deadline = time.monotonic() + 20
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), 0.2).close()
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)
        sub = ResumableSubscriber(
            [url], "t", container_id="s", link_name="s", state_path=work / "s.state", ledger_path=work / "s.jsonl", prefetch=200
        )
        pub = ResumablePublisher(
            [url], "t", container_id="p", link_name="p", state_path=work / "p.state", ledger_path=work / "p.jsonl"
        )
        sub.start()
        pub.start()
        if not (sub.wait_attached(20) and pub.wait_attached(20)):
            raise RuntimeError("the clients did not attach")
        pub.send_many([b"warm-up"] * 500, timeout=120)
        cpu0, t0 = _cpu_seconds(router.pid), time.monotonic()
        outcomes = pub.send_many([b"x" * 32] * messages, timeout=1200)
        cpu1, t1 = _cpu_seconds(router.pid), time.monotonic()
        if not all(o.accepted for o in outcomes):
            raise RuntimeError("not every message was accepted")
        pub.close()
        sub.close()
        return (cpu1 - cpu0) / messages * 1e6, messages / (t1 - t0)
    finally:
        router.terminate()
        router.wait(10)
        shutil.rmtree(work, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.settle_modes", description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=20000, help="timed messages per run (default 20000)")
    parser.add_argument("--rounds", type=int, default=3, help="rounds, each running both modes (default 3)")
    args = parser.parse_args(argv)
    results: dict[str, list[tuple[float, float]]] = {mode: [] for mode in MODES}
    for n in range(args.rounds):
        for mode in MODES if n % 2 == 0 else tuple(reversed(MODES)):
            us, rate = one_run(mode, args.messages)
            results[mode].append((us, rate))
            print(f"round {n + 1} {mode}: router {us:.1f} µs/msg, {rate:,.0f} msgs/s", flush=True)
    cpu = {m: statistics.median(us for us, _ in r) for m, r in results.items()}
    rate = {m: statistics.median(x for _, x in r) for m, r in results.items()}
    print(
        f"medians: two-step (resumable) {cpu['resumable']:.1f} µs/msg, {rate['resumable']:,.0f} msgs/s; "
        f"first {cpu['first']:.1f} µs/msg, {rate['first']:,.0f} msgs/s; "
        f"router CPU ratio {cpu['resumable'] / cpu['first']:.2f}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
