"""The client ledger: what a client sent, each outcome it got, what it handed to its
application (JSON lines, one file per client; format in docs/ledger.md).

Every line has every field of ``FIELDS`` (null where it does not apply), in that
order, then the event's optional extras. One line is appended and flushed per
event, so a killed client loses at most the line being written (readers skip a
torn last line, as they do for the router's event log).
"""

from __future__ import annotations

import json
import os
import threading
import time
from hashlib import blake2b
from pathlib import Path

FIELDS = (
    "ts",
    "client",
    "link",
    "role",
    "event",
    "topic",
    "delivery",
    "pub_tag",
    "seq",
    "outcome",
    "router",
    "incarnation",
    "digest",
    "message_id",
)
EVENTS = ("sent", "outcome", "delivered", "resumed", "failover")
ROLES = ("publisher", "subscriber")


class Ledger:
    """Appends ledger lines for one client link. Thread-safe (one lock per file)."""

    def __init__(self, path: str | os.PathLike | None, *, client: str, link: str, role: str, topic: str, fsync: bool = False):
        if role not in ROLES:
            raise ValueError(f"role must be one of {ROLES}")
        self.path = Path(path) if path is not None else None
        self.common = {"client": client, "link": link, "role": role, "topic": topic}
        self.fsync = fsync
        self._lock = threading.Lock()
        self._fh = None
        if self.path is not None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._fh = open(self.path, "a", encoding="utf-8")

    def write(
        self,
        event: str,
        *,
        delivery: str | None = None,
        pub_tag: str | None = None,
        seq: int | None = None,
        outcome: str | None = None,
        router: str | None = None,
        incarnation: str | None = None,
        digest: str | None = None,
        message_id: str | None = None,
        **extra,
    ) -> dict:
        if event not in EVENTS:
            raise ValueError(f"unknown ledger event {event!r}")
        line = {
            "ts": time.time(),
            **self.common,
            "event": event,
            "topic": self.common["topic"],
            "delivery": delivery,
            "pub_tag": pub_tag,
            "seq": seq,
            "outcome": outcome,
            "router": router,
            "incarnation": incarnation,
            "digest": digest,
            "message_id": message_id,
        }
        line = {key: line[key] for key in FIELDS}
        line.update(extra)
        if self._fh is not None:
            text = json.dumps(line, separators=(",", ":")) + "\n"
            with self._lock:
                self._fh.write(text)
                self._fh.flush()
                if self.fsync:
                    os.fsync(self._fh.fileno())
        return line

    def close(self) -> None:
        with self._lock:
            if self._fh is not None:
                self._fh.close()
                self._fh = None


def body_digest(message) -> str:
    """blake2b-128 (hex) of the message's body alone, AMQP-encoded (a message holding
    only that body): the same on the publisher and the subscriber side, whatever
    annotations routers added on the way."""
    from proton import Message

    return blake2b(Message(body=message.body).encode(), digest_size=16).hexdigest()


def message_id_of(message) -> str | None:
    mid = message.id
    if mid is None:
        return None
    if isinstance(mid, (bytes, memoryview)):
        return bytes(mid).hex()
    return str(mid)


def read_ledger(path: str | os.PathLike) -> list[dict]:
    """Every line of a ledger file, in file order (a torn last line is skipped)."""
    out = []
    lines = Path(path).read_bytes().split(b"\n")
    for index, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            out.append(json.loads(line))
        except ValueError:
            if index == len(lines) - 1:
                continue
            raise ValueError(f"{path}: line {index + 1} is not JSON: {line[:200]!r}") from None
    return out
