"""Launch a network of routers on loopback from one topology file.

```toml
secret = "change-me"          # optional: a random one is made per launch
[[router]]
id = "A"
[[router]]
id = "B"
[[link]]
between = ["A", "B"]
```

Routers start in file order, each with a client listener and an inter-router
listener on ephemeral ports; for every link the router started later dials the
one started earlier (so no port needs choosing in advance, and any topology,
rings included, can be built). The launch waits until every router's routes
reach every other router (its `routes` events in its event log).
"""

from __future__ import annotations

import secrets
import signal
import sys
import time
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

from router.launcher import RouterError, RouterProcess, read_event_log

DEFAULT_TOPOLOGY = """\
# The embedded default: three routers, each linked to the other two.
[[router]]
id = "A"
[[router]]
id = "B"
[[router]]
id = "C"
[[link]]
between = ["A", "B"]
[[link]]
between = ["B", "C"]
[[link]]
between = ["C", "A"]
"""


class TopologyError(ValueError):
    pass


@dataclass(frozen=True)
class Topology:
    routers: tuple[str, ...]
    links: tuple[tuple[str, str], ...]
    secret: str | None = None

    def neighbours(self, router_id: str) -> list[str]:
        return sorted({b for a, b in self.links if a == router_id} | {a for a, b in self.links if b == router_id})


def parse_topology(text: str, source: str = "<topology>") -> Topology:
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as err:
        raise TopologyError(f"{source}: {err}") from None
    unknown = set(data) - {"router", "link", "secret"}
    if unknown:
        raise TopologyError(f"{source}: unknown key(s) {sorted(unknown)}; expected router, link, secret")
    routers = []
    for index, entry in enumerate(data.get("router", [])):
        if not isinstance(entry, dict) or not isinstance(entry.get("id"), str) or not entry["id"]:
            raise TopologyError(f"{source}: router[{index}] needs a string id")
        if set(entry) - {"id"}:
            raise TopologyError(f"{source}: router[{index}]: unknown key(s) {sorted(set(entry) - {'id'})}")
        if entry["id"] in routers:
            raise TopologyError(f"{source}: router id {entry['id']!r} appears twice")
        routers.append(entry["id"])
    if not routers:
        raise TopologyError(f"{source}: no [[router]] entries")
    links = []
    for index, entry in enumerate(data.get("link", [])):
        between = entry.get("between") if isinstance(entry, dict) else None
        if (not isinstance(between, list) or len(between) != 2 or between[0] == between[1]
                or any(r not in routers for r in between)):
            raise TopologyError(f"{source}: link[{index}].between must name two different routers "
                                f"declared above, found {between!r}")
        pair = tuple(sorted(between, key=routers.index))
        if pair in links:
            raise TopologyError(f"{source}: link {between} appears twice")
        links.append(pair)
    secret = data.get("secret")
    if secret is not None and (not isinstance(secret, str) or not secret):
        raise TopologyError(f"{source}: secret must be a non-empty string")
    return Topology(tuple(routers), tuple(links), secret)


def load_topology(path: str | None) -> Topology:
    if path is None:
        return parse_topology(DEFAULT_TOPOLOGY, "<embedded default>")
    try:
        text = Path(path).read_text()
    except OSError as err:
        raise TopologyError(f"cannot read topology file {path}: {err.strerror}") from None
    return parse_topology(text, path)


@dataclass
class RouterNetwork:
    """Real router processes wired as ``topology`` says."""

    workdir: Path
    topology: Topology
    overrides: dict = field(default_factory=dict)
    routers: dict[str, RouterProcess] = field(default_factory=dict)

    def __post_init__(self):
        self.workdir = Path(self.workdir)
        self.secret = self.topology.secret or secrets.token_hex(16)

    def _config_for(self, router_id: str) -> dict:
        order = self.topology.routers
        connectors = []
        for a, b in self.topology.links:
            if router_id in (a, b):
                other = b if a == router_id else a
                if order.index(other) < order.index(router_id):
                    connectors.append({"host": "127.0.0.1", "port": self.routers[other].inter_router_port,
                                       "role": "inter-router"})
        config = {
            "listener": [{"host": "127.0.0.1", "port": 0, "role": "normal"},
                         {"host": "127.0.0.1", "port": 0, "role": "inter-router"}],
            "network": {"secret": self.secret},
        }
        if connectors:
            config["connector"] = connectors
        for key, value in self.overrides.items():
            config[key] = {**config.get(key, {}), **value} if isinstance(value, dict) else value
        return config

    def start(self, timeout: float = 30.0) -> "RouterNetwork":
        for router_id in self.topology.routers:
            router = RouterProcess(self.workdir, router_id, self._config_for(router_id))
            self.routers[router_id] = router
            router.start()
        self.wait_converged(timeout)
        return self

    def restart(self, router_id: str, timeout: float = 30.0) -> RouterProcess:
        """Start a stopped (or killed) router again: a new epoch, on the same ports,
        so its neighbours' connectors and the clients' failover lists find it."""
        router = self.routers[router_id]
        if router.listeners:
            router.config["listener"] = [{"host": host, "port": port, "role": role}
                                         for role, host, port in router.listeners]
        router.start()
        self.wait_converged(timeout)
        return router

    def routes_of(self, router_id: str) -> set[str] | None:
        """The routers ``router_id`` last logged it can reach (None before any)."""
        router = self.routers[router_id]
        latest = None
        for event in read_event_log(router.data_dir):
            if event.get("event") == "routes" and event.get("epoch") == router.epoch:
                latest = event
        return None if latest is None else set(latest.get("reachable") or [])

    def wait_converged(self, timeout: float = 30.0, routers=None) -> None:
        """Until every (live) router reaches every other live one."""
        live = [r for r in (routers or self.routers) if self.routers[r].is_running()]
        deadline = time.monotonic() + timeout
        while True:
            missing = {r: set(live) - {r} - (self.routes_of(r) or set()) for r in live}
            if not any(missing.values()):
                return
            for r in live:
                self.routers[r].check_alive("waiting for routes to converge")
            if time.monotonic() > deadline:
                raise TimeoutError(f"routes did not converge in {timeout} s; unreachable: "
                                   f"{ {r: sorted(m) for r, m in missing.items() if m} }")
            time.sleep(0.05)

    def stop(self) -> None:
        """SIGTERM every running router, the last started first (one that will not stop
        is SIGKILLed); a router that stopped wrongly is reported once all are down."""
        problems = []
        for router in reversed(list(self.routers.values())):
            try:
                if router.is_running():
                    router.terminate()
            except RouterError as err:
                problems.append(err)
            finally:
                if router.is_running():
                    router.kill()
        if problems:
            raise problems[0]

    def describe(self) -> str:
        lines = []
        for router_id, router in self.routers.items():
            lines.append(f"  router {router_id}: clients {router.url}, routers 127.0.0.1:{router.inter_router_port}, "
                         f"neighbours {', '.join(self.topology.neighbours(router_id)) or '-'}")
        return "\n".join(lines)


# What launching, watching and stopping routers can raise: a router that failed
# (RouterError), routes that never converged (TimeoutError), files that could not be
# made (OSError). A command line reports them in one line (launch_failure), never as
# a traceback.
LAUNCH_ERRORS = (RouterError, OSError)


def launch_failure(err: BaseException) -> str:
    """One line saying why a launch failed (the router's own stderr stays in its file)."""
    if isinstance(err, RouterError):
        text = err.brief
    elif isinstance(err, OSError) and err.strerror and err.filename:
        text = f"{err.strerror}: {err.filename}"  # not "[Errno 20] Not a directory: '...'"
    else:
        text = str(err)
    return " ".join(text.split()) or type(err).__name__


def main(args) -> int:
    """``eorouter network``: launch, print where each router listens, wait for Ctrl-C
    (or SIGTERM). Exit 0 after a stop asked for, 1 when a router failed (one line on
    stderr says which and why), 2 for a bad topology file."""
    try:
        topology = load_topology(args.topology)
    except TopologyError as err:
        print(f"eorouter network: {err}", file=sys.stderr)
        return 2
    workdir = Path(args.workdir or "network")
    network = RouterNetwork(workdir, topology)
    stop = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(True))
    failure = None
    try:
        network.start()
        print(f"eorouter network: {len(topology.routers)} routers converged (data in {workdir})\n"
              f"{network.describe()}\nCtrl-C stops them all.", flush=True)
        while not stop:
            time.sleep(0.2)
            for router_id, router in network.routers.items():
                if router.died_unexpectedly():
                    failure = RouterError(f"router {router_id} exited with {router.returncode}",
                                          brief=f"router {router_id} exited with {router.returncode}: "
                                                f"{router.stderr_tail(1).strip() or '(no output)'} "
                                                f"(its output: {router.stderr_path})")
                    stop.append(True)
    except KeyboardInterrupt:
        pass
    except LAUNCH_ERRORS as err:
        failure = err
    finally:
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # a second Ctrl-C must not orphan routers
        try:
            network.stop()
        except LAUNCH_ERRORS as err:
            failure = failure or err
    if failure is not None:
        print(f"eorouter network: {launch_failure(failure)}", file=sys.stderr, flush=True)
        return 1
    return 0
