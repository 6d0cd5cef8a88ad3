"""A resumable client's local state: one snapshot file plus an append-only journal.

What a client must not lose across a crash (docs/resumption.md, docs/client.md):

- publisher: link identity, incarnation, tag counter, and every sent, unsettled
  delivery (tag, message bytes, application seq, outcome if one came);
- subscriber: link identity, every delivery it holds unsettled (the router's tag and
  its answer), and the tags already handed to the application (the dedup set).

Every change is one JSON line appended to ``<state_path>.journal`` *before* the
frame it implies leaves the process (a publisher's tag is recorded before its
transfer is written, so a restarted publisher can never reuse a tag for another
message). Appends are flushed to the OS each time (a killed process loses
nothing) and fsync'ed when ``fsync=True`` (a lost machine loses nothing).

The journal is folded into the snapshot ``<state_path>`` when it grows past
twice the state (amortised O(1) per change): the snapshot is written atomically
(tmp file, optional fsync, ``os.replace``) with generation g+1, then the journal is
replaced by an empty one headed g+1. A journal whose header does not match the
snapshot's generation is already contained in it (a crash between the two
replaces) and is ignored. A torn last journal line (killed mid-write) is ignored.
"""

from __future__ import annotations

import base64
import json
import os
import time
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

from router.client.protocol import STATES, TERMINAL

FORMAT = "eorouter-client-state"
VERSION = 1


class StateError(RuntimeError):
    """The state file is unreadable or belongs to another link."""


def _atomic_write(path: Path, text: str, fsync: bool) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w", encoding="utf-8") as fh:
        fh.write(text)
        fh.flush()
        if fsync:
            os.fsync(fh.fileno())
    os.replace(tmp, path)
    if fsync:
        fd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


class Store:
    """Snapshot + journal for one client. Not thread-safe: one owner thread."""

    def __init__(self, path: str | os.PathLike, *, fsync: bool = False):
        self.path = Path(path)
        self.journal_path = self.path.with_name(self.path.name + ".journal")
        self.fsync = fsync
        self.generation = 0
        self.ops = 0
        self._fh: TextIO | None = None

    def load(self) -> tuple[dict | None, list[dict]]:
        """The snapshot (None if there is none) and the journal's operations after it."""
        snapshot = None
        if self.path.exists():
            try:
                snapshot = json.loads(self.path.read_text(encoding="utf-8"))
            except ValueError as err:
                raise StateError(f"{self.path}: not a state file ({err})") from None
            if not isinstance(snapshot, dict) or snapshot.get("format") != FORMAT:
                raise StateError(f"{self.path}: not an eorouter client state file")
            if snapshot.get("version") != VERSION:
                raise StateError(f"{self.path}: state version {snapshot.get('version')} (this client reads {VERSION})")
            self.generation = int(snapshot.get("generation", 0))
        ops: list[dict] = []
        if self.journal_path.exists():
            lines = self.journal_path.read_bytes().split(b"\n")
            header = None
            for index, line in enumerate(lines):
                if not line.strip():
                    continue
                try:
                    item = json.loads(line)
                except ValueError:
                    if index == len(lines) - 1:  # torn tail: the write was cut by a kill
                        break
                    raise StateError(f"{self.journal_path}: line {index + 1} is not JSON") from None
                if header is None:
                    header = item
                    if header.get("generation") != self.generation:
                        break  # already folded into the snapshot
                    continue
                ops.append(item)
        return snapshot, ops

    def write_snapshot(self, data: dict) -> None:
        """Replace the snapshot (generation + 1) and start an empty journal."""
        self.close()
        self.generation += 1
        body = {"format": FORMAT, "version": VERSION, "generation": self.generation, **data}
        self.path.parent.mkdir(parents=True, exist_ok=True)
        _atomic_write(self.path, json.dumps(body, separators=(",", ":")), self.fsync)
        _atomic_write(self.journal_path, json.dumps({"generation": self.generation}) + "\n", self.fsync)
        self._fh = open(self.journal_path, "a", encoding="utf-8")
        self.ops = 0

    def append(self, op: dict) -> None:
        if self._fh is None:
            self._fh = open(self.journal_path, "a", encoding="utf-8")
        self._fh.write(json.dumps(op, separators=(",", ":")) + "\n")
        self._fh.flush()
        if self.fsync:
            os.fsync(self._fh.fileno())
        self.ops += 1

    def close(self) -> None:
        if self._fh is not None:
            self._fh.close()
            self._fh = None


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def _unb64(text: str) -> bytes:
    return base64.b64decode(text.encode("ascii"))


class _State:
    """Common part: identity, the store, replay and compaction."""

    role = ""

    def __init__(self, path, *, container_id: str, link_name: str, topic: str, fsync: bool = False, compact_min: int = 1000):
        self.container_id = container_id
        self.link_name = link_name
        self.topic = topic
        self.attached_once = False
        self.compact_min = compact_min
        self.store = Store(path, fsync=fsync)
        snapshot, ops = self.store.load()
        if snapshot is not None:
            self._check_identity(snapshot)
            self.attached_once = bool(snapshot.get("attached_once"))
            self._load_snapshot(snapshot)
        for op in ops:
            self._apply(op)
        self.resumed_from_file = snapshot is not None or bool(ops)
        self.compact()

    def _check_identity(self, snapshot: dict) -> None:
        mine = {"role": self.role, "container_id": self.container_id, "link_name": self.link_name, "topic": self.topic}
        theirs = {key: snapshot.get(key) for key in mine}
        if theirs != mine:
            raise StateError(f"{self.store.path} belongs to {theirs}, not {mine}")

    def _identity(self) -> dict:
        return {
            "role": self.role,
            "container_id": self.container_id,
            "link_name": self.link_name,
            "topic": self.topic,
            "attached_once": self.attached_once,
        }

    def _record(self, op: dict) -> None:
        self._apply(op)
        self.store.append(op)
        if self.store.ops > max(self.compact_min, 2 * self._size()):
            self.compact()

    def compact(self) -> None:
        self.store.write_snapshot({**self._identity(), **self._snapshot()})

    def close(self) -> None:
        self.store.close()

    def record_attached(self) -> None:
        if not self.attached_once:
            self._record({"op": "attached"})

    # subclasses
    def _apply(self, op: dict) -> None:
        if op.get("op") == "attached":
            self.attached_once = True
        else:
            raise StateError(f"{self.store.journal_path}: unknown operation {op!r}")

    def _size(self) -> int:
        raise NotImplementedError

    def _snapshot(self) -> dict:
        raise NotImplementedError

    def _load_snapshot(self, snapshot: dict) -> None:
        raise NotImplementedError


# --------------------------------------------------------------------------- publisher


@dataclass
class SentEntry:
    """One delivery the publisher sent and has not settled."""

    tag: bytes
    payload: bytes  # the encoded message, resent verbatim
    seq: int | None
    outcome: str | None = None  # terminal outcome received, if any


class PublisherState(_State):
    """Incarnation, tag and seq counters, and the unsettled deliveries in send order."""

    role = "publisher"

    def __init__(self, path: str | os.PathLike, **kw: Any) -> None:
        self.incarnation: str | None = None
        self.next_tag = 1
        self.next_seq = 1
        self.unsettled: OrderedDict[bytes, SentEntry] = OrderedDict()
        super().__init__(path, **kw)

    # -- changes (each journaled before the caller acts on it)

    def record_incarnation(self, incarnation: str) -> None:
        if incarnation != self.incarnation:
            self._record({"op": "incarnation", "value": incarnation})

    def take_seq(self) -> int:
        """The next application sequence number (persisted with the send that uses it)."""
        return self.next_seq

    def record_sent(self, payload: bytes, seq: int | None) -> bytes:
        """Allocate the next tag for ``payload`` and journal it; returns the tag."""
        n = self.next_tag
        tag = str(n).encode("ascii")
        self._record({"op": "sent", "n": n, "seq": seq, "msg": _b64(payload)})
        return tag

    def record_outcome(self, tag: bytes, outcome: str) -> None:
        if outcome not in TERMINAL:
            raise ValueError(f"not a terminal outcome: {outcome!r}")
        entry = self.unsettled.get(tag)
        if entry is not None and entry.outcome != outcome:
            self._record({"op": "outcome", "tag": tag.hex(), "outcome": outcome})

    def record_settled(self, tag: bytes) -> None:
        if tag in self.unsettled:
            self._record({"op": "settled", "tag": tag.hex()})

    def entries(self) -> list[tuple[bytes, str]]:
        """``[tag, state]`` for the resume list, in send order."""
        return [(e.tag, e.outcome or "none") for e in self.unsettled.values()]

    # -- replay

    def _apply(self, op: dict) -> None:
        kind = op.get("op")
        if kind == "sent":
            n = int(op["n"])
            tag = str(n).encode("ascii")
            self.unsettled[tag] = SentEntry(tag, _unb64(op["msg"]), op.get("seq"))
            self.next_tag = max(self.next_tag, n + 1)
            if op.get("seq") is not None:
                self.next_seq = max(self.next_seq, int(op["seq"]) + 1)
        elif kind == "outcome":
            entry = self.unsettled.get(bytes.fromhex(op["tag"]))
            if entry is not None:
                entry.outcome = op["outcome"]
        elif kind == "settled":
            self.unsettled.pop(bytes.fromhex(op["tag"]), None)
        elif kind == "incarnation":
            self.incarnation = op["value"]
        else:
            super()._apply(op)

    def _size(self) -> int:
        return len(self.unsettled)

    def _snapshot(self) -> dict:
        return {
            "incarnation": self.incarnation,
            "next_tag": self.next_tag,
            "next_seq": self.next_seq,
            "unsettled": [
                {"tag": e.tag.hex(), "seq": e.seq, "outcome": e.outcome, "message": _b64(e.payload)}
                for e in self.unsettled.values()
            ],
        }

    def _load_snapshot(self, snapshot: dict) -> None:
        self.incarnation = snapshot.get("incarnation")
        self.next_tag = int(snapshot.get("next_tag", 1))
        self.next_seq = int(snapshot.get("next_seq", 1))
        for item in snapshot.get("unsettled", []):
            tag = bytes.fromhex(item["tag"])
            outcome = item.get("outcome")
            if outcome is not None and outcome not in TERMINAL:
                raise StateError(f"{self.store.path}: bad outcome {outcome!r}")
            self.unsettled[tag] = SentEntry(tag, _unb64(item["message"]), item.get("seq"), outcome)


# --------------------------------------------------------------------------- subscriber


class SubscriberState(_State):
    """Deliveries held unsettled (tag -> our answer), and the dedup set.

    Dedup: a tag handed to the application is known while the router has not
    settled it (it is in ``unsettled``), and afterwards in ``settled`` (tag ->
    when it was settled), which is trimmed to the newest ``dedup_window`` tags,
    except that a tag settled less than ``dedup_linger`` seconds ago is always
    kept. A tag is only ever resent to us while its publisher holds it unsettled;
    the window and linger bound how late that may be after the router settled it
    for us (docs/client.md, "Dedup")."""

    role = "subscriber"

    def __init__(self, path, *, dedup_window: int = 10000, dedup_linger: float = 600.0, **kw):
        self.dedup_window = dedup_window
        self.dedup_linger = dedup_linger
        self.unsettled: OrderedDict[bytes, str] = OrderedDict()
        self.settled: OrderedDict[bytes, tuple[float, str]] = OrderedDict()  # tag -> (when, answer)
        super().__init__(path, **kw)

    def seen(self, tag: bytes) -> str | None:
        """Our recorded answer for a tag already handed to the application, else None."""
        state = self.unsettled.get(tag)
        if state is not None:
            return state
        known = self.settled.get(tag)
        return None if known is None else known[1]

    def record_delivered(self, tag: bytes, state: str, *, settled: bool = False, now: float | None = None) -> None:
        if state not in STATES:
            raise ValueError(f"bad state {state!r}")
        op: dict[str, Any] = {"op": "recv", "tag": tag.hex(), "state": state}
        if settled:
            op["settled_at"] = time.time() if now is None else now
        self._record(op)

    def record_settled(self, tag: bytes, now: float | None = None) -> None:
        if tag in self.unsettled:
            self._record({"op": "settled", "tag": tag.hex(), "at": time.time() if now is None else now})

    def entries(self) -> list[tuple[bytes, str]]:
        return list(self.unsettled.items())

    def trim(self, now: float | None = None) -> int:
        """Drop settled tags beyond the window and older than the linger; returns how many."""
        now = time.time() if now is None else now
        dropped = 0
        while len(self.settled) > self.dedup_window:
            tag, (at, _state) = next(iter(self.settled.items()))
            if at > now - self.dedup_linger:
                break
            del self.settled[tag]
            dropped += 1
        return dropped

    # -- replay

    def _apply(self, op: dict) -> None:
        kind = op.get("op")
        if kind == "recv":
            tag = bytes.fromhex(op["tag"])
            if "settled_at" in op:
                self.unsettled.pop(tag, None)
                self.settled[tag] = (float(op["settled_at"]), op["state"])
                self.settled.move_to_end(tag)
            else:
                self.unsettled[tag] = op["state"]
        elif kind == "settled":
            tag = bytes.fromhex(op["tag"])
            state = self.unsettled.pop(tag, None)
            if state is not None:
                self.settled[tag] = (float(op["at"]), state)
                self.settled.move_to_end(tag)
                self.trim(float(op["at"]))
        else:
            super()._apply(op)

    def _size(self) -> int:
        return len(self.unsettled) + len(self.settled)

    def _snapshot(self) -> dict:
        return {
            "unsettled": [[tag.hex(), state] for tag, state in self.unsettled.items()],
            "settled": [[tag.hex(), at, state] for tag, (at, state) in self.settled.items()],
            "dedup_window": self.dedup_window,
            "dedup_linger": self.dedup_linger,
        }

    def _load_snapshot(self, snapshot: dict) -> None:
        for tag, state in snapshot.get("unsettled", []):
            if state not in STATES:
                raise StateError(f"{self.store.path}: bad state {state!r}")
            self.unsettled[bytes.fromhex(tag)] = state
        for tag, at, state in snapshot.get("settled", []):
            self.settled[bytes.fromhex(tag)] = (float(at), state)
