"""A private network of Linux network namespaces for link-cut tests (root only).

One run gets its own namespaces, named ``eor-<pid>-<random>-<role>`` so parallel runs
never collide:

    switch:   bridge br0, one veth port per member (v-A, v-B, ..., v-cl)
    A, B, C:  eth0 = 10.99.0.1, .2, .3 /24 (the other end is a port of br0), lo
    cl:       eth0 = 10.99.0.100/24: the clients' namespace

Addresses exist only on that private link and there is no default route: nothing
here can reach, or is reachable from, anything but loopback and these namespaces.
The root namespace is not touched (no interface, address or route is added there).

Faults:
  ``link_down(m)`` / ``link_up(m)``  ``ip link set eth0 down|up`` in member m's namespace:
        a clean cut (m's routes vanish, its sends fail at once; its peers hear nothing)
  ``partition(a, b)`` / ``heal(a, b)``  nftables drops everything between a and b,
        in both namespaces: a silent partition only idle timeouts can detect
  ``isolate(m)`` / ``heal(m)``  nftables input+output policy drop in m (loopback kept)

Routers join their namespace from inside their own process before the router starts
(``prelude()``, a setns(2) in the child); client threads are started while the
calling thread is inside the clients' namespace (``entered()``): a thread inherits
its creator's namespace and keeps it, so every socket it opens lives there.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import os
import re
import secrets
import shutil
import subprocess
from pathlib import Path

CLONE_NEWNET = 0x40000000
NETNS_DIR = Path("/run/netns")
SUBNET = "10.99.0"
CLIENTS = "cl"
_NAME_RE = re.compile(r"^eor-(\d+)-[0-9a-f]+-")

_libc = ctypes.CDLL(None, use_errno=True)


def _setns(fd: int) -> None:
    if _libc.setns(fd, CLONE_NEWNET) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"setns: {os.strerror(err)}")


def unusable_reason() -> str | None:
    """Why namespaces cannot be used here (None: they can)."""
    if os.geteuid() != 0:
        return "network namespaces need root (ip netns add); not root"
    if shutil.which("ip") is None:
        return "the ip command (iproute2) is not installed"
    probe = f"eor-{os.getpid()}-{secrets.token_hex(3)}-probe"
    made = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
    if made.returncode != 0:
        return f"ip netns add failed: {made.stderr.strip()}"
    try:
        veth = subprocess.run(
            ["ip", "-n", probe, "link", "add", "p0", "type", "veth", "peer", "name", "p1"], capture_output=True, text=True
        )
        if veth.returncode != 0:
            return f"cannot create a veth pair in a namespace: {veth.stderr.strip()}"
    finally:
        subprocess.run(["ip", "netns", "del", probe], capture_output=True)
    return None


def nft_missing_reason() -> str | None:
    if shutil.which("nft") is None:
        return "nft (Debian package nftables) is not installed: no silent partition (scripts/setup-root installs it)"
    return None


def remove_stale_namespaces() -> list[str]:
    """Delete namespaces left by earlier runs whose process is gone (a run killed -9
    cannot run its finalizers). Only names of our own pattern, only dead owners."""
    removed = []
    if not NETNS_DIR.is_dir():
        return removed
    for entry in NETNS_DIR.iterdir():
        match = _NAME_RE.match(entry.name)
        if match and not Path(f"/proc/{match[1]}").exists():
            if subprocess.run(["ip", "netns", "del", entry.name], capture_output=True).returncode == 0:
                removed.append(entry.name)
    return removed


class NetnsLab:
    def __init__(self, members: list[str]):
        self.members = list(members)
        self.run = f"eor-{os.getpid()}-{secrets.token_hex(3)}"
        self.addresses = {m: f"{SUBNET}.{i + 1}" for i, m in enumerate(self.members)}
        self.addresses[CLIENTS] = f"{SUBNET}.100"
        self.created: list[str] = []
        self.log: list[str] = []  # every command run, for failure reports

    # -- names

    def ns(self, member: str) -> str:
        return f"{self.run}-{member}"

    @property
    def switch(self) -> str:
        return f"{self.run}-sw"

    def address(self, member: str) -> str:
        return self.addresses[member]

    # -- plumbing

    def ip(self, *args: str, ns: str | None = None, check: bool = True) -> subprocess.CompletedProcess:
        command = ["ip", *(["-n", ns] if ns else []), *args]
        return self._run(command, check)

    def nft(self, member: str, script: str) -> None:
        self._run(["ip", "netns", "exec", self.ns(member), "nft", "-f", "-"], True, stdin=script)

    def _run(self, command, check, stdin=None) -> subprocess.CompletedProcess:
        self.log.append(" ".join(command) + (f" <<< {stdin!r}" if stdin else ""))
        done = subprocess.run(command, capture_output=True, text=True, input=stdin, timeout=20)
        if check and done.returncode != 0:
            raise RuntimeError(f"{' '.join(command)} failed ({done.returncode}): {done.stderr.strip()}")
        return done

    def setup(self) -> NetnsLab:
        remove_stale_namespaces()
        atexit.register(self.teardown)  # the fixture's finalizer is the normal path
        for member in ["sw", *self.members, CLIENTS]:
            name = f"{self.run}-{member}"
            self.ip("netns", "add", name)
            self.created.append(name)
            self.ip("link", "set", "lo", "up", ns=name)
        self.ip("link", "add", "br0", "type", "bridge", ns=self.switch)
        self.ip("link", "set", "br0", "up", ns=self.switch)
        for member in [*self.members, CLIENTS]:
            port = f"v-{member}"[:15]
            # Both ends are created inside namespaces: nothing appears in the root namespace.
            self.ip("link", "add", port, "type", "veth", "peer", "name", "eth0", "netns", self.ns(member), ns=self.switch)
            self.ip("link", "set", port, "master", "br0", ns=self.switch)
            self.ip("link", "set", port, "up", ns=self.switch)
            self.ip("addr", "add", f"{self.address(member)}/24", "dev", "eth0", ns=self.ns(member))
            self.ip("link", "set", "eth0", "up", ns=self.ns(member))
        return self

    def teardown(self) -> None:
        """Delete every namespace of this run (idempotent). Deleting a namespace
        removes its veths (and so the switch's ports) with it."""
        for name in reversed(self.created):
            subprocess.run(["ip", "netns", "del", name], capture_output=True)
        self.created.clear()

    def exists(self) -> list[str]:
        return sorted(p.name for p in NETNS_DIR.glob(f"{self.run}-*")) if NETNS_DIR.is_dir() else []

    # -- joining

    def prelude(self, member: str) -> str:
        """Python source a child runs first: move this (single-threaded) process into
        ``member``'s namespace. For RouterProcess(prelude=...)."""
        return (
            "import ctypes, os\n"
            f"_fd = os.open({str(NETNS_DIR / self.ns(member))!r}, os.O_RDONLY)\n"
            f"if ctypes.CDLL(None, use_errno=True).setns(_fd, {CLONE_NEWNET}) != 0:\n"
            f"    raise SystemExit('setns into {self.ns(member)} failed: ' + os.strerror(ctypes.get_errno()))\n"
            "os.close(_fd)\n"
        )

    @contextlib.contextmanager
    def entered(self, member: str = CLIENTS):
        """Run the block with the calling thread in ``member``'s namespace; threads
        started inside it stay there for life."""
        back = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
        target = os.open(NETNS_DIR / self.ns(member), os.O_RDONLY)
        try:
            _setns(target)
            try:
                yield
            finally:
                _setns(back)
        finally:
            os.close(target)
            os.close(back)

    def sockets(self, member: str) -> str:
        """``ss -tno`` in ``member``'s namespace: its TCP sockets with send/receive queues and timers."""
        return self._run(["ip", "netns", "exec", self.ns(member), "ss", "-tno"], False).stdout

    # -- faults

    def link_down(self, member: str) -> None:
        self.ip("link", "set", "eth0", "down", ns=self.ns(member))

    def link_up(self, member: str) -> None:
        self.ip("link", "set", "eth0", "up", ns=self.ns(member))

    def partition(self, a: str, b: str) -> None:
        """Silently drop every packet between ``a`` and ``b`` (both directions, both ends)."""
        for here, there in ((a, b), (b, a)):
            self.nft(
                here,
                f"table inet eor_cut_{there} {{\n"
                f"  chain input {{ type filter hook input priority 0; ip saddr {self.address(there)} drop; }}\n"
                f"  chain output {{ type filter hook output priority 0; ip daddr {self.address(there)} drop; }}\n"
                "}\n",
            )

    def isolate(self, member: str) -> None:
        """Silently drop everything in and out of ``member`` except loopback."""
        self.nft(
            member,
            "table inet eor_isolate {\n"
            "  chain input { type filter hook input priority 0; policy drop; iif lo accept; }\n"
            "  chain output { type filter hook output priority 0; policy drop; oif lo accept; }\n"
            "}\n",
        )

    def heal(self, a: str, b: str | None = None) -> None:
        """Undo ``partition(a, b)`` or ``isolate(a)``."""
        if b is None:
            self.nft(a, "delete table inet eor_isolate\n")
            return
        for here, there in ((a, b), (b, a)):
            self.nft(here, f"delete table inet eor_cut_{there}\n")
