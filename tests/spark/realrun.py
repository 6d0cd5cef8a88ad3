"""A real run for the reconciliation tests: three router processes (the default
triangle) or one, and the project's own AMQP clients (router.client: resumable
publishers and durable subscribers, each keeping its ledger, docs/ledger.md).

- subscribers alice@A and bob@B (to the pattern ``spark/+``) accept everything;
  carol@C rejects one "poison" message (so one publisher hears rejected);
- p1@A and p2@B each publish ``messages`` messages at once;
- then every record is allowed to finish (settlement relayed, records deleted)
  and the routers are stopped with SIGTERM.
"""

from __future__ import annotations

import time
from collections import Counter
from pathlib import Path

from eorouter_tools.topology import RouterNetwork, Topology, load_topology
from router.client import ResumablePublisher, ResumableSubscriber
from router.eventlog import read_events

TOPIC = "spark/orders"
PATTERN = "spark/+"
POISON = "poison"


def records_left(data_dirs: list[Path]) -> int:
    left = 0
    for data_dir in data_dirs:
        received, deleted = set(), set()
        for event in read_events(data_dir):
            kind = event["event"]
            if kind == "received" and not event.get("settled"):
                received.add(event["delivery"])
            elif kind == "record-deleted" or (kind == "settled" and event.get("deleted")):
                deleted.add(event["delivery"])
        left += len(received - deleted)
    return left


def run(workdir: Path, messages: int = 20, one_router: bool = False) -> dict:
    """Run it; return {"routers": [data dirs], "clients": ledger dir, "sent": n, ...}.
    ``one_router``: every client on router A alone. Its deliveries then complete on
    the usual path, whose log folds three events into one "completed" line."""
    workdir = Path(workdir)
    clients = workdir / "clients"
    clients.mkdir(parents=True, exist_ok=True)
    topology = Topology(("A",), ()) if one_router else load_topology(None)
    network = RouterNetwork(workdir / "routers", topology, overrides={"delivery": {"record_linger": 0.5}})
    started: list = []
    received: Counter = Counter()
    try:
        network.start()
        url = {r: network.routers["A" if one_router else r].url for r in "ABC"}

        def handler(name):
            def on_message(msg):
                received[name] += 1
                return "rejected" if (name == "carol" and msg.body == POISON) else "accepted"

            return on_message

        # bob subscribes to a pattern taking the topic (issue 20): the proof follows
        # subscriptions, whatever their address.
        for name, router, address in (("alice", "A", TOPIC), ("bob", "B", PATTERN), ("carol", "C", TOPIC)):
            sub = ResumableSubscriber(
                [url[router]],
                address,
                container_id=f"{name}-app",
                link_name=f"{name}-in",
                state_path=clients / f"{name}.state",
                ledger_path=clients / f"{name}.jsonl",
                on_message=handler(name),
            )
            started.append(sub)
            sub.start()
            sub.wait_attached(20)
        pubs = {}
        for name, router in (("p1", "A"), ("p2", "B")):
            pub = ResumablePublisher(
                [url[router]],
                TOPIC,
                container_id=f"{name}-app",
                link_name=f"{name}-out",
                state_path=clients / f"{name}.state",
                ledger_path=clients / f"{name}.jsonl",
            )
            started.append(pub)
            pub.start()
            pub.wait_attached(20)
            pubs[name] = pub
        futures = []
        for i in range(messages):
            for name, pub in pubs.items():
                body = POISON if (name == "p2" and i == messages // 2) else f"{name} #{i}"
                futures.append(pub.send_async(body))
        outcomes = [f.result(60).state for f in futures]
        for pub in pubs.values():
            pub.wait_settled(30)
        data_dirs = [router.data_dir for router in network.routers.values()]
        deadline = time.monotonic() + 15
        while records_left(data_dirs) and time.monotonic() < deadline:
            time.sleep(0.1)
        return {
            "routers": [str(d) for d in data_dirs],
            "clients": str(clients),
            "sent": len(futures),
            "outcomes": sorted(outcomes),
            "received": dict(received),
            "left": records_left(data_dirs),
        }
    finally:
        for client in started:
            try:
                client.close()
            except Exception:
                pass
        network.stop()
