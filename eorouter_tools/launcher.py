"""Start and stop real router processes: for the demo, the benchmark, the network
launcher and the integration tests (in the style of qpid-dispatch's system_test.py).

A ``RouterProcess`` owns one ``python -m router run --config FILE`` child: it writes the
TOML config into its own directory, starts the process with stdout/stderr going to
files (never pipes: a chatty router must not block on a full pipe), waits for the one
ready line on stderr under one overall timeout, and knows how to stop it:
``terminate()`` (SIGTERM, expect exit 0), ``kill()`` (SIGKILL, no expectation).
``RouterSet`` starts routers and cleans them up LIFO; cleanup never leaves a process
behind, even when a test fails or the interpreter exits early (``atexit``).

The event log is read with a tiny JSON-lines reader of our own (``read_event_log``):
the tests check the log's format independently of ``router.eventlog``.
"""

from __future__ import annotations

import atexit
import copy
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

from router.eventschema import unfold

# The directory holding the `router` package: the child must import the same code.
PACKAGE_PARENT = Path(__file__).resolve().parents[1]

# "eorouter: router A ready on normal=127.0.0.1:5672,inter-router=127.0.0.1:5673 epoch 3"
READY_RE = re.compile(
    r"eorouter: router (?P<id>\S+) ready on (?P<listeners>[^\s=,]+=[^\s,]+(?:,[^\s=,]+=[^\s,]+)*)"
    r" epoch (?P<epoch>\d+)"
)


def parse_listeners(text: str) -> list[tuple[str, str, int]]:
    """The ready line's listeners, ``role=host:port,...`` -> [(role, host, port), ...]."""
    out = []
    for item in text.split(","):
        role, _, address = item.partition("=")
        host, _, port = address.rpartition(":")
        out.append((role, host.strip("[]"), int(port)))
    return out


# After a ``prelude``: run the `router` package's __main__ as `python -m router` would.
_RUN_ROUTER_MAIN = "import runpy\nrunpy.run_module('router', run_name='__main__', alter_sys=True)"

# Every router this process started and has not reaped yet: the last line of defence
# against orphans (atexit) and what the failure hook prints stderr for.
_LIVE: list[RouterProcess] = []

DEFAULT_CONFIG: dict = {
    "router": {"idle_timeout": 4.0},
    "listener": [{"host": "127.0.0.1", "port": 0}],
    "limits": {
        "max_message_size": 1048576,
        "max_in_flight_per_topic": 1000,
        "publisher_credit_window": 250,
        "default_terminus_timeout": 60,
        "max_terminus_timeout": 3600,
    },
    "delivery": {"no_subscribers": "released", "record_linger": 2.0, "drain_grace": 5.0},
    "eventlog": {"max_bytes": 67108864, "retention": 10, "fsync": False},
}


class RouterError(AssertionError):
    """A router did not behave as a process should (died, never ready, bad exit code).

    The message carries the router's stderr (for a test report); ``brief`` says the
    same in one line, for a command line (``eorouter network``, the demos)."""

    def __init__(self, message: str, brief: str | None = None):
        super().__init__(message)
        self.brief = brief or message.splitlines()[0]


def _last_line(text: str) -> str:
    """The last non-empty line of a router's stderr, without the ``eorouter: `` prefix of
    its one-line startup failures (bad config, data directory in use, port taken)."""
    lines = [line.strip() for line in text.splitlines() if line.strip() and not line.startswith("--- start #")]
    return lines[-1].removeprefix("eorouter: ") if lines else "(it printed nothing)"


# --------------------------------------------------------------------------- config


def _toml_value(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value)  # a JSON string is a valid TOML basic string
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    if isinstance(value, dict):  # an inline table: { "a.b" = 1, c = "x" }
        return "{ " + ", ".join(f"{json.dumps(str(k))} = {_toml_value(v)}" for k, v in value.items()) + " }"
    raise TypeError(f"cannot write {value!r} as TOML")


def to_toml(config: dict) -> str:
    """Write a two-level config (tables, and arrays of tables for lists of dicts) as TOML."""
    lines: list[str] = []
    for section, body in config.items():
        if isinstance(body, list) and all(isinstance(item, dict) for item in body):
            for item in body:
                lines.append(f"[[{section}]]")
                lines.extend(f"{k} = {_toml_value(v)}" for k, v in item.items())
                lines.append("")
        elif isinstance(body, dict):
            lines.append(f"[{section}]")
            lines.extend(f"{k} = {_toml_value(v)}" for k, v in body.items())
            lines.append("")
        else:
            raise TypeError(f"top-level {section!r} must be a table or an array of tables")
    return "\n".join(lines)


def merge_config(base: dict, overrides: dict) -> dict:
    """Deep-merge ``overrides`` (section -> {key: value}) into a copy of ``base``.
    A value of ``None`` removes the key (to test missing keys); a list replaces."""
    merged = copy.deepcopy(base)
    for section, body in overrides.items():
        if body is None:
            merged.pop(section, None)
        elif isinstance(body, dict) and isinstance(merged.get(section), dict):
            for key, value in body.items():
                if value is None:
                    merged[section].pop(key, None)
                else:
                    merged[section][key] = value
        else:
            merged[section] = copy.deepcopy(body)
    return merged


# --------------------------------------------------------------------------- event log


def read_event_log(data_dir: Path) -> list[dict]:
    """All events in ``<data_dir>/events/events-*.jsonl``, in (epoch, seq) order, a
    folded line ("completed") as the events it stands for (router.eventschema.unfold).

    Tolerates a torn last line (a write in progress or a killed router); any other
    undecodable line is a real defect and raises."""
    events: list[dict] = []
    for path in sorted(Path(data_dir, "events").glob("events-*.jsonl")):
        lines = path.read_bytes().split(b"\n")
        for index, line in enumerate(lines):
            if not line.strip():
                continue
            try:
                events.extend(unfold(json.loads(line)))  # a folded line: the events it stands for
            except ValueError:
                if index == len(lines) - 1:  # torn tail: no newline yet
                    continue
                raise AssertionError(f"{path}: line {index + 1} is not JSON: {line[:200]!r}") from None
    events.sort(key=lambda e: (e.get("epoch", 0), e.get("seq", 0)))
    return events


# --------------------------------------------------------------------------- process


class RouterProcess:
    """One router process and its directory.

    ``workdir/<id>.toml`` (config), ``workdir/<id>/`` (data_dir), ``workdir/<id>.stderr``,
    ``workdir/<id>.stdout``. Attributes after ``start()``, from the ready line: ``host``,
    ``port``, ``url`` ("127.0.0.1:PORT": the first normal listener), ``epoch``,
    ``listeners`` ([(role, host, port)] in config order), ``ports_by_role``
    ({"normal": [P1], "inter-router": [P2]}), ``inter_router_port``.

    ``prelude``: Python source the child runs before the router's own ``__main__``
    (``python -c PRELUDE+runpy`` instead of ``python -m router``), on every start: for
    tests that patch the router in its own process (e.g. inject a core failure)."""

    def __init__(
        self,
        workdir: Path,
        router_id: str = "A",
        overrides: dict | None = None,
        ready_timeout: float = 20.0,
        prelude: str | None = None,
    ):
        self.id = router_id
        # Absolute: the child runs with cwd=workdir, so a relative config path (or
        # data_dir) would be resolved a second time, inside workdir (issue 14).
        self.workdir = Path(workdir).absolute()
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.data_dir = self.workdir / router_id
        self.config_path = self.workdir / f"{router_id}.toml"
        self.stderr_path = self.workdir / f"{router_id}.stderr"
        self.stdout_path = self.workdir / f"{router_id}.stdout"
        self.ready_timeout = ready_timeout
        self.prelude = prelude
        self.config = merge_config(DEFAULT_CONFIG, {"router": {"id": router_id, "data_dir": str(self.data_dir)}})
        if overrides:
            self.config = merge_config(self.config, overrides)
            self.data_dir = Path(self.config.get("router", {}).get("data_dir", self.data_dir))
        self.proc: subprocess.Popen | None = None
        self.host: str | None = None
        self.port: int | None = None
        self.epoch: int | None = None
        self.listeners: list[tuple[str, str, int]] = []
        self.expected_exit: int | None = None  # set by terminate()/kill(): the exit is ours
        self.starts = 0

    # -- lifecycle

    def write_config(self, text: str | None = None) -> Path:
        """Write the config file (``text`` verbatim when given, to test bad configs)."""
        self.config_path.write_text(to_toml(self.config) if text is None else text)
        return self.config_path

    def spawn(self, config_text: str | None = None, args: list[str] | None = None) -> RouterProcess:
        """Start the process without waiting for it to be ready."""
        if self.proc is not None and self.proc.poll() is None:
            raise RouterError(f"router {self.id} is already running (pid {self.proc.pid})")
        if args is None:
            self.write_config(config_text)
            args = ["run", "--config", str(self.config_path)]
        self.starts += 1
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        # The child must find the `router` package even without an installed project.
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(PACKAGE_PARENT), env.get("PYTHONPATH")) if p)
        with open(self.stderr_path, "ab") as err, open(self.stdout_path, "ab") as out:
            err.write(f"--- start #{self.starts} ---\n".encode())
            err.flush()
            self._stderr_offset = err.tell()
            if self.prelude is None:
                command = [sys.executable, "-m", "router", *args]
            else:  # the prelude, then exactly what `-m router` runs (argv included)
                command = [sys.executable, "-c", f"{self.prelude}\n{_RUN_ROUTER_MAIN}", *args]
            self.proc = subprocess.Popen(
                command,
                cwd=str(self.workdir),
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=err,
                start_new_session=True,  # a ^C in the terminal reaches pytest, not the router
            )
        self.expected_exit = None
        self.host = self.port = self.epoch = None
        self.listeners = []
        if self not in _LIVE:
            _LIVE.append(self)
        return self

    def start(self) -> RouterProcess:
        """Start and wait until the ready line shows the listening port."""
        self.spawn()
        self.wait_ready()
        return self

    def restart(self) -> RouterProcess:
        """Start again on the same data directory (after terminate() or kill())."""
        if self.is_running():
            raise RouterError(f"router {self.id} is still running; stop it before restart()")
        return self.start()

    def wait_ready(self, timeout: float | None = None) -> None:
        deadline = time.monotonic() + (timeout or self.ready_timeout)
        delay = 0.01
        while True:
            match = READY_RE.search(self.stderr_since_start())
            if match:
                if match["id"] != self.id:
                    raise RouterError(f"ready line names router {match['id']!r}, expected {self.id!r}")
                self.listeners = parse_listeners(match["listeners"])
                first = next((item for item in self.listeners if item[0] == "normal"), self.listeners[0])
                self.host, self.port, self.epoch = first[1], first[2], int(match["epoch"])
                return
            if self.proc.poll() is not None:
                stderr = self.stderr_since_start()
                raise RouterError(
                    f"router {self.id} exited with {self.proc.returncode} before it was ready; stderr:\n{stderr}",
                    brief=f"router {self.id} exited with {self.proc.returncode} before it was ready: "
                    f"{_last_line(stderr)} (its output: {self.stderr_path})",
                )
            if time.monotonic() > deadline:
                self.kill()
                stderr = self.stderr_since_start()
                raise RouterError(
                    f"router {self.id} not ready after {timeout or self.ready_timeout}s; stderr:\n{stderr}",
                    brief=f"router {self.id} not ready after {timeout or self.ready_timeout} s; killed it "
                    f"(its output: {self.stderr_path})",
                )
            time.sleep(delay)  # polling a file for the ready line, under the deadline above
            delay = min(delay * 2, 0.1)

    def wait_exit(self, timeout: float = 20.0) -> int | None:
        """Wait for the process to exit; None if it did not within ``timeout``."""
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            return None

    def send_signal(self, signum: int) -> None:
        """Signal the router without waiting. SIGTERM/SIGINT ask it to drain and exit 0,
        so its exit is no longer unexpected (``terminate()`` then checks the code)."""
        if signum in (signal.SIGTERM, signal.SIGINT):
            self.expected_exit = 0
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signum)

    def terminate(self, timeout: float = 20.0, expect: int = 0, signum: int = signal.SIGTERM) -> int:
        """SIGTERM (drain), wait, and assert the exit code (0 by default).

        A router that does not exit within ``timeout`` is SIGKILLed and reported."""
        if self.proc is None:
            raise RouterError(f"router {self.id} was never started")
        self.expected_exit = expect
        if self.proc.poll() is None:
            self.proc.send_signal(signum)
        code = self.wait_exit(timeout)
        if code is None:
            self.kill()
            what = f"router {self.id} did not exit within {timeout}s of {signal.Signals(signum).name}; killed it"
            raise RouterError(f"{what}. stderr:\n{self.stderr_tail()}", brief=f"{what} (its output: {self.stderr_path})")
        self._reaped()
        if code != expect:
            what = f"router {self.id} exited with {code} after {signal.Signals(signum).name}, expected {expect}"
            raise RouterError(
                f"{what}; stderr:\n{self.stderr_tail()}",
                brief=f"{what}: {_last_line(self.stderr_since_start())} (its output: {self.stderr_path})",
            )
        return code

    def kill(self) -> None:
        """SIGKILL (no drain, no expectation about the exit code)."""
        if self.proc is None:
            return
        self.expected_exit = -signal.SIGKILL
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(timeout=10)
        self._reaped()

    def _reaped(self) -> None:
        if self in _LIVE and self.proc.poll() is not None:
            _LIVE.remove(self)

    # -- state

    def is_running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    @property
    def returncode(self) -> int | None:
        return None if self.proc is None else self.proc.poll()

    def died_unexpectedly(self) -> bool:
        """Exited, and not the way the test asked for (no stop requested, or another code)."""
        if self.proc is None or self.proc.poll() is None:
            return False
        return self.expected_exit is None or self.proc.returncode != self.expected_exit

    def check_alive(self, context: str = "") -> None:
        """Raise with the router's stderr if it is not running."""
        if not self.is_running():
            where = f" ({context})" if context else ""
            raise RouterError(
                f"router {self.id} is not running{where}: exit code {self.returncode}; stderr:\n{self.stderr_tail()}",
                brief=f"router {self.id} is not running{where}: exit code {self.returncode}: "
                f"{_last_line(self.stderr_since_start())} (its output: {self.stderr_path})",
            )

    @property
    def ports_by_role(self) -> dict[str, list[int]]:
        """Bound ports per listener role, from the ready line."""
        ports: dict[str, list[int]] = {}
        for role, _, port in self.listeners:
            ports.setdefault(role, []).append(port)
        return ports

    @property
    def inter_router_port(self) -> int:
        """The first inter-router listener's port."""
        ports = self.ports_by_role.get("inter-router")
        if not ports:
            raise RouterError(f"router {self.id} has no inter-router listener (or is not ready)")
        return ports[0]

    @property
    def url(self) -> str:
        if self.port is None:
            raise RouterError(f"router {self.id} has no port (not started or not ready)")
        return f"{self.host}:{self.port}"

    # -- output

    def stderr(self) -> str:
        try:
            return self.stderr_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def stderr_since_start(self) -> str:
        try:
            with open(self.stderr_path, "rb") as f:
                f.seek(getattr(self, "_stderr_offset", 0))
                return f.read().decode(errors="replace")
        except FileNotFoundError:
            return ""

    def stderr_tail(self, lines: int = 80) -> str:
        return "\n".join(self.stderr().splitlines()[-lines:])

    def events(self) -> list[dict]:
        """The router's event log so far (all epochs), in (epoch, seq) order."""
        return read_event_log(self.data_dir)

    def __repr__(self) -> str:
        state = "running" if self.is_running() else f"exit={self.returncode}"
        return f"<RouterProcess {self.id} {self.host}:{self.port} {state} {self.workdir}>"


class RouterSet:
    """Starts routers under one directory and cleans them up LIFO.

    ``cleanup()`` SIGTERMs every router still running (a router must drain and exit 0
    on SIGTERM at any time, so this is itself a check), SIGKILLs any that do not exit,
    and raises if one exited wrongly or died unexpectedly during the test."""

    def __init__(self, workdir: Path):
        self.workdir = Path(workdir)
        self.routers: list[RouterProcess] = []

    def __call__(
        self,
        router_id: str | None = None,
        *,
        start: bool = True,
        ready_timeout: float = 20.0,
        prelude: str | None = None,
        **overrides,
    ) -> RouterProcess:
        """``routers("A", delivery={"no_subscribers": "rejected"})`` -> a started router.
        ``prelude``: see ``RouterProcess``."""
        router_id = router_id or "ABCDEFGHIJKLMNOPQRSTUVWXYZ"[len(self.routers) % 26] + (
            str(len(self.routers) // 26) if len(self.routers) >= 26 else ""
        )
        if any(r.id == router_id for r in self.routers):
            raise ValueError(f"router id {router_id!r} already used in {self.workdir}")
        router = RouterProcess(self.workdir, router_id, overrides, ready_timeout=ready_timeout, prelude=prelude)
        self.routers.append(router)
        if start:
            router.start()
        return router

    def cleanup(self) -> None:
        problems: list[str] = []
        for router in reversed(self.routers):
            try:
                if router.died_unexpectedly():
                    expected = "no exit" if router.expected_exit is None else f"exit {router.expected_exit}"
                    problems.append(
                        f"router {router.id} exited with code {router.returncode} "
                        f"({expected} expected); stderr:\n{router.stderr_tail()}"
                    )
                    router._reaped()
                elif router.is_running():
                    router.terminate(timeout=20.0)
            except Exception as exc:  # keep going: every router must be stopped
                problems.append(str(exc))
            finally:
                if router.is_running():
                    router.kill()
                if router.proc is not None:
                    router._reaped()
        self.routers.clear()
        if problems:
            raise RouterError("\n\n".join(problems))


def live_routers() -> list[RouterProcess]:
    return list(_LIVE)


@atexit.register
def _kill_leftovers() -> None:
    for router in list(_LIVE):
        if router.is_running():
            router.proc.kill()
            try:
                router.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass
