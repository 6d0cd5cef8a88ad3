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

The format, its checks and its error messages: docs/configuration.md, "Topology files".
Routers start in file order, each with a client listener and an inter-router
listener on ephemeral ports; for every link the router started later dials the
one started earlier (so no port needs choosing in advance, and any topology,
rings included, can be built). The launch waits until every router's routes
reach every other router (its `routes` events in its event log).
"""

from __future__ import annotations

import difflib
import json
import secrets
import signal
import sys
import time
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

from eorouter_tools.launcher import RouterError, RouterProcess
from router.config import ROUTER_ID_RE, _describe, _syntax_error

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


# key -> what it is, for the error messages; every key is checked like the router's
# config (router/config.py): unknown keys are errors, with the likeliest intended key.
_TOP_KEYS = ("router", "link", "secret")
_TABLE_KEYS = {"router": ("id",), "link": ("between",)}


def _found(value) -> str:
    """A found value as the user wrote it (an array with its items)."""
    if isinstance(value, list):
        text = "[" + ", ".join(_found(v) for v in value) + "]"
        return text if len(text) <= 60 else text[:56] + "...]"
    if isinstance(value, str):
        text = json.dumps(value, ensure_ascii=False)  # a TOML basic string
        return text if len(text) <= 60 else text[:56] + '..."'
    return _describe(value)


def _suggest(word: str, known) -> str:
    guess = difflib.get_close_matches(word, list(known), n=1)
    return f" (did you mean '{guess[0]}'?)" if guess else ""


def _array_of_tables(data: dict, name: str, source: str) -> list:
    raw = data.get(name, [])
    if isinstance(raw, dict):
        raise TopologyError(f"{source}: {name}: expected an array of tables (write [[{name}]], not [{name}]), found a table")
    if not isinstance(raw, list) or not all(isinstance(entry, dict) for entry in raw):
        raise TopologyError(f"{source}: {name}: expected an array of tables ([[{name}]]), found {_found(raw)}")
    return raw


def _check_keys(entry: dict, where: str, table: str, source: str) -> None:
    for key in entry:
        if key not in _TABLE_KEYS[table]:
            if key in _TOP_KEYS:  # TOML puts every key after a [[table]] header into that table
                hint = (
                    f" ('{key}' is a top-level key: put it before the first [[...]] header)"
                    if key == "secret"
                    else f" ('{key}' is a table of its own: write [[{key}]])"
                )
            else:
                hint = _suggest(key, _TABLE_KEYS[table])
                elsewhere = [other for other, keys in _TABLE_KEYS.items() if other != table and key in keys]
                if not hint and elsewhere:  # "id" under [[link]]: a [[router]] header went missing
                    hint = f" ('{key}' belongs in a [[{elsewhere[0]}]] table)"
            raise TopologyError(
                f"{source}: {where}.{key}: unknown key{hint}; known keys in [[{table}]]: " + ", ".join(_TABLE_KEYS[table])
            )


def parse_topology(text: str, source: str = "<topology>") -> Topology:
    """Validate a topology file's text (docs/configuration.md, "Topology files") as
    strictly as a router's config: every problem is a one-line ``TopologyError`` naming
    the file, the key path and what was expected versus found."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as err:
        raise TopologyError(str(_syntax_error(err, text, source))) from None
    for key in data:
        if key not in _TOP_KEYS:
            raise TopologyError(f"{source}: unknown key '{key}'{_suggest(key, _TOP_KEYS)}; known keys: " + ", ".join(_TOP_KEYS))
    routers: list[str] = []
    for index, entry in enumerate(_array_of_tables(data, "router", source)):
        _check_keys(entry, f"router[{index}]", "router", source)
        if "id" not in entry:
            raise TopologyError(f"{source}: router[{index}].id: required key is missing")
        router_id = entry["id"]
        if not isinstance(router_id, str) or not ROUTER_ID_RE.fullmatch(router_id):
            raise TopologyError(
                f"{source}: router[{index}].id: expected a router id of 1 to 64 characters from "
                f"A-Z a-z 0-9 . _ -, found {_found(router_id)}"
            )
        if router_id in routers:
            raise TopologyError(f"{source}: router[{index}].id: {router_id!r} is already router[{routers.index(router_id)}]'s id")
        routers.append(router_id)
    if not routers:
        raise TopologyError(f'{source}: router: required key is missing (add one [[router]] table with id = "..." per router)')
    links: list[tuple[str, str]] = []
    for index, entry in enumerate(_array_of_tables(data, "link", source)):
        where = f"link[{index}].between"
        _check_keys(entry, f"link[{index}]", "link", source)
        if "between" not in entry:
            raise TopologyError(f"{source}: {where}: required key is missing")
        between = entry["between"]
        if (
            not isinstance(between, list)
            or len(between) != 2
            or not all(isinstance(r, str) for r in between)
            or between[0] == between[1]
        ):
            raise TopologyError(
                f'{source}: {where}: expected two different router ids, as in ["A", "B"], found {_found(between)}'
            )
        for router_id in between:
            if router_id not in routers:
                raise TopologyError(
                    f"{source}: {where}: {router_id!r} is not a router of this file"
                    f"{_suggest(router_id, routers)}; routers: {', '.join(routers)}"
                )
        pair = tuple(sorted(between, key=routers.index))
        if pair in links:
            raise TopologyError(f"{source}: {where}: the link {pair[0]} - {pair[1]} is already link[{links.index(pair)}]")
        links.append(pair)
    unreachable = _unreachable(routers, links)
    if unreachable:
        raise TopologyError(
            f"{source}: link: no path of links from {routers[0]} to {', '.join(unreachable)} "
            f"(every router must reach every other one)"
        )
    secret = data.get("secret")
    if secret is not None and (not isinstance(secret, str) or not secret.strip()):
        raise TopologyError(f"{source}: secret: expected a non-empty string, found {_found(secret)}")
    return Topology(tuple(routers), tuple(links), secret)


def _unreachable(routers: list[str], links: list[tuple[str, str]]) -> list[str]:
    """The routers no path of links joins to the first one (the launch waits until every
    router reaches every other: it would wait forever)."""
    seen, todo = {routers[0]}, [routers[0]]
    while todo:
        here = todo.pop()
        for a, b in links:
            for other in (b,) if a == here else (a,) if b == here else ():
                if other not in seen:
                    seen.add(other)
                    todo.append(other)
    return [r for r in routers if r not in seen]


def load_topology(path: str | None) -> Topology:
    if path is None:
        return parse_topology(DEFAULT_TOPOLOGY, "<embedded default>")
    try:
        raw = Path(path).read_bytes()
    except OSError as err:
        raise TopologyError(f"{path}: cannot read topology file: {err.strerror or err}") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as err:
        line = raw[: err.start].count(b"\n") + 1
        raise TopologyError(f"{path}, line {line}: not valid UTF-8 (TOML files are UTF-8)") from None
    return parse_topology(text, path)


class RoutesTail:
    """The last ``routes`` event of one epoch of a router, read as its log grows: each
    call reads only what was appended since the last (wait_converged() polls every
    router 20 times a second, and reading whole logs, which grow for as long as the
    network runs, took a benchmark's process a core, starving the clients in it)."""

    def __init__(self, data_dir: Path, epoch: int | None):
        self.data_dir = data_dir
        self.epoch = epoch
        self._offsets: dict[Path, int] = {}
        self._latest: dict | None = None

    def latest(self) -> dict | None:
        if self.epoch is None:
            return None
        for path in sorted(Path(self.data_dir, "events").glob(f"events-{self.epoch:06d}-*.jsonl")):
            start = self._offsets.get(path, 0)
            with open(path, "rb") as f:
                f.seek(start)
                data = f.read()
            end = data.rfind(b"\n") + 1  # (a torn last line is read whole next time)
            self._offsets[path] = start + end
            for line in data[:end].splitlines():
                if b'"routes"' in line:  # (a folded line never stands for a routes event)
                    event = json.loads(line)
                    if event.get("event") == "routes" and event.get("epoch") == self.epoch:
                        self._latest = event
        return self._latest


@dataclass
class RouterNetwork:
    """Real router processes wired as ``topology`` says."""

    workdir: Path
    topology: Topology
    overrides: dict = field(default_factory=dict)
    routers: dict[str, RouterProcess] = field(default_factory=dict)
    # Extra keys of every router's client listener (e.g. its tls_* settings).
    client_listener: dict = field(default_factory=dict)

    def __post_init__(self):
        self.workdir = Path(self.workdir)
        self.secret = self.topology.secret or secrets.token_hex(16)
        self._routes: dict[str, RoutesTail] = {}  # routes_of()'s reader of each router's log

    def _config_for(self, router_id: str) -> dict:
        order = self.topology.routers
        connectors = []
        for a, b in self.topology.links:
            if router_id in (a, b):
                other = b if a == router_id else a
                if order.index(other) < order.index(router_id):
                    connectors.append(
                        {"host": "127.0.0.1", "port": self.routers[other].inter_router_port, "role": "inter-router"}
                    )
        config = {
            "listener": [
                {"host": "127.0.0.1", "port": 0, "role": "normal", **self.client_listener},
                {"host": "127.0.0.1", "port": 0, "role": "inter-router"},
            ],
            "network": {"secret": self.secret},
        }
        if connectors:
            config["connector"] = connectors
        for key, value in self.overrides.items():
            config[key] = {**config.get(key, {}), **value} if isinstance(value, dict) else value
        return config

    def start(self, timeout: float = 30.0) -> RouterNetwork:
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
            router.config["listener"] = [
                {"host": host, "port": port, "role": role, **(self.client_listener if role == "normal" else {})}
                for role, host, port in router.listeners
                if role != "metrics"
            ]
        router.start()
        self.wait_converged(timeout)
        return router

    def routes_of(self, router_id: str) -> set[str] | None:
        """The routers ``router_id`` last logged it can reach (None before any)."""
        router = self.routers[router_id]
        tail = self._routes.get(router_id)
        if tail is None or tail.data_dir != router.data_dir or tail.epoch != router.epoch:
            tail = self._routes[router_id] = RoutesTail(router.data_dir, router.epoch)
        latest = tail.latest()
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
                raise TimeoutError(
                    f"routes did not converge in {timeout} s; unreachable: { {r: sorted(m) for r, m in missing.items() if m} }"
                )
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
            lines.append(
                f"  router {router_id}: clients {router.url}, routers 127.0.0.1:{router.inter_router_port}, "
                f"neighbours {', '.join(self.topology.neighbours(router_id)) or '-'}"
            )
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
        print(
            f"eorouter network: {len(topology.routers)} routers converged (data in {workdir})\n"
            f"{network.describe()}\nCtrl-C stops them all.",
            flush=True,
        )
        while not stop:
            time.sleep(0.2)
            for router_id, router in network.routers.items():
                if router.died_unexpectedly():
                    failure = RouterError(
                        f"router {router_id} exited with {router.returncode}",
                        brief=f"router {router_id} exited with {router.returncode}: "
                        f"{router.stderr_tail(1).strip() or '(no output)'} "
                        f"(its output: {router.stderr_path})",
                    )
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
