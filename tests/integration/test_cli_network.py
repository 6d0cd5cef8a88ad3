"""``eorouter network`` as a user runs it: the README's exact commands, as real processes.

Each command is read from the README's code blocks, run with the installed ``eorouter``
script in a fresh directory (holding only the files the command names, copied from the
repository, as in a clone), and checked the way a user would: it prints where every
router listens, a message goes from the first router to a subscriber on the last one,
Ctrl-C (SIGINT) stops every router gracefully and the command exits 0 without a
traceback. Its default work folder and a relative ``--workdir`` once crashed (issue 14:
the launcher passed a relative config path to routers started with cwd=workdir).
A router that cannot start is reported in one line, and the routers started before it
are stopped.
"""

from __future__ import annotations

import fcntl
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from amqpclients import unique

from eorouter_tools.launcher import read_event_log
from eorouter_tools.topology import load_topology

pytestmark = pytest.mark.timeout(180)

REPO = Path(__file__).resolve().parents[2]
EOROUTER = Path(sys.executable).with_name("eorouter")  # the console script pip installed next to python
ROUTER_LINE = re.compile(r"^  router (?P<id>\S+): clients (?P<url>\S+), routers \S+, neighbours .*$", re.M)
READY = "Ctrl-C stops them all."


def readme_commands(prefix: str = "eorouter network") -> list[list[str]]:
    """Every line of a README code block that starts with ``prefix``, as argv."""
    commands, in_block = [], False
    for line in (REPO / "README.md").read_text().splitlines():
        if line.startswith("```"):
            in_block = not in_block
        elif in_block and line.startswith(prefix):
            commands.append(shlex.split(line, comments=True))
    return commands


def option(command: list[str], name: str) -> str | None:
    return command[command.index(name) + 1] if name in command else None


class NetworkCommand:
    """One ``eorouter network`` process with its output in files; ``stop()`` is Ctrl-C."""

    def __init__(self, cwd: Path, argv: list[str]):
        self.cwd = cwd
        self.out_path, self.err_path = cwd / "network-cmd.stdout", cwd / "network-cmd.stderr"
        with open(self.out_path, "wb") as out, open(self.err_path, "wb") as err:
            self.proc = subprocess.Popen(
                [str(EOROUTER), *argv[1:]], cwd=cwd, stdin=subprocess.DEVNULL, stdout=out, stderr=err, start_new_session=True
            )

    def stdout(self) -> str:
        return self.out_path.read_text()

    def stderr(self) -> str:
        return self.err_path.read_text()

    def wait_ready(self, timeout: float = 90.0) -> dict[str, str]:
        """Until it says the routers converged; {router id: client url}."""
        deadline = time.monotonic() + timeout
        while READY not in self.stdout():
            if self.proc.poll() is not None:
                pytest.fail(
                    f"eorouter network exited with {self.proc.returncode} before it was ready:\n{self.stdout()}{self.stderr()}"
                )
            if time.monotonic() > deadline:
                pytest.fail(f"eorouter network not ready after {timeout} s:\n{self.stdout()}{self.stderr()}")
            time.sleep(0.1)
        return {m["id"]: m["url"] for m in ROUTER_LINE.finditer(self.stdout())}

    def wait_exit(self, timeout: float = 60.0) -> int:
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            pytest.fail(f"eorouter network still running {timeout} s later:\n{self.stdout()}{self.stderr()}")

    def cleanup(self, workdir: Path) -> None:
        """After a failed test: stop the command and any router it left running
        (identified by its pid in its own event log and its config path)."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        for pid, config in router_pids(workdir):
            try:
                if str(config) in Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace"):
                    os.kill(pid, signal.SIGKILL)
            except (FileNotFoundError, ProcessLookupError):
                pass


def router_pids(workdir: Path) -> list[tuple[int, Path]]:
    found = []
    for config in sorted(workdir.glob("*.toml")):
        for event in read_event_log(workdir / config.stem):
            if event["event"] == "router-started":
                found.append((event["pid"], config))
    return found


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return Path(f"/proc/{pid}").exists() and "Z" not in Path(f"/proc/{pid}/stat").read_text().split()[2]


def test_the_readme_shows_the_default_and_a_topology_file():
    commands = readme_commands()
    assert ["eorouter", "network"] in commands, commands
    assert any(option(c, "--topology") for c in commands), commands


@pytest.mark.parametrize("command", readme_commands(), ids=shlex.join)
def test_the_readme_network_command(tmp_path, amqp, command):
    topology = option(command, "--topology")
    if topology:  # the file the command names, where a clone has it
        (tmp_path / topology).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(REPO / topology, tmp_path / topology)
    expected = load_topology(str(REPO / topology) if topology else None).routers
    workdir = tmp_path / (option(command, "--workdir") or "network")
    cmd = NetworkCommand(tmp_path, command)
    try:
        urls = cmd.wait_ready()
        assert list(urls) == list(expected), cmd.stdout()
        # The network works: a subscriber on the last router gets a message published on the first.
        topic = unique("readme")
        sub = amqp.connect(urls[expected[-1]]).subscriber(topic, auto_accept=True)
        sub.wait_attached()
        sent = amqp.connect(urls[expected[0]]).publisher(topic).send("hello")
        amqp.wait(lambda: sent.outcome, what="the publisher's outcome across the network")
        assert sent.outcome == "accepted" and sub.bodies() == ["hello"]
        amqp.close()

        cmd.proc.send_signal(signal.SIGINT)  # Ctrl-C
        code = cmd.wait_exit()
        assert code == 0, cmd.stdout() + cmd.stderr()
        assert "Traceback" not in cmd.stderr(), cmd.stderr()
        started = router_pids(workdir)
        assert sorted(config.stem for _, config in started) == sorted(expected)
        for pid, config in started:
            assert not alive(pid), f"router {config.stem} (pid {pid}) still runs after Ctrl-C"
            # SIGTERM (graceful; the command checked each router's exit 0), not SIGKILL
            kinds = [e["event"] for e in read_event_log(workdir / config.stem)]
            assert "router-stopping" in kinds, f"router {config.stem} was not stopped gracefully"
    finally:
        cmd.cleanup(workdir)


def test_a_router_that_cannot_start_is_one_line_and_the_others_stop(tmp_path):
    # Router B's data directory is locked, as if another router process used it.
    (tmp_path / "network" / "B").mkdir(parents=True)
    lock = os.open(tmp_path / "network" / "B" / "lock", os.O_RDWR | os.O_CREAT)
    fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    cmd = NetworkCommand(tmp_path, ["eorouter", "network"])
    try:
        code = cmd.wait_exit()
        message = cmd.stderr().strip()
        assert code == 1, cmd.stdout() + message
        assert len(message.splitlines()) == 1 and "Traceback" not in message, message
        assert message.startswith("eorouter network: router B exited with 1 before it was ready: "), message
        assert "is in use by another router process" in message, message
        assert str(tmp_path / "network" / "B.stderr") in message, "the line names the file with B's output"
        ((pid, _),) = router_pids(tmp_path / "network")  # A started; B never opened its log
        assert not alive(pid), "router A must be stopped when B cannot start"
        assert "router-stopping" in [e["event"] for e in read_event_log(tmp_path / "network" / "A")]
    finally:
        os.close(lock)
        cmd.cleanup(tmp_path / "network")


def test_a_work_folder_that_cannot_be_made_is_one_line(tmp_path):
    (tmp_path / "taken").write_text("a file, not a folder")
    cmd = NetworkCommand(tmp_path, ["eorouter", "network", "--workdir", "taken/net"])
    code = cmd.wait_exit()
    assert code == 1
    assert cmd.stderr().strip() == f"eorouter network: Not a directory: {tmp_path / 'taken' / 'net'}"


def test_a_bad_topology_file_is_one_line_and_exit_2(tmp_path):
    (tmp_path / "ring.toml").write_text('[[router]]\nid = "A"\n[[router]]\nid = "B"\n[[link]]\nbetwen = ["A", "B"]\n')
    cmd = NetworkCommand(tmp_path, ["eorouter", "network", "--topology", "ring.toml"])
    assert cmd.wait_exit() == 2
    assert cmd.stderr() == (
        "eorouter network: ring.toml: link[0].betwen: unknown key (did you mean 'between'?); known keys in [[link]]: between\n"
    )
    assert not (tmp_path / "network").exists(), "nothing is started for a bad file"
