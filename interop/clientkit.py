"""What every interop peer program shares: its command line, its message shape and its ledger.

Used by the Python peers (interop/python, interop/azure); the rhea (interop/rhea/common.js) and
Proton C (interop/protonc/ledger.h) peers implement the same contract in their own language:

    publisher.*  HOST PORT TOPIC COUNT --ledger PATH [--container-id ID] [--link NAME] [--size N]
                 [--settle on-outcome|default|presettled] [--disconnect-after K] [--timeout S]
    subscriber.* HOST PORT TOPIC COUNT --ledger PATH [--container-id ID] [--link NAME]
                 [--outcome accept|reject|release|modify|hold] [--rcv-settle-mode first|second]
                 [--snd-settle-mode unsettled|settled] [--credit N] [--disconnect-after K]
                 [--linger S] [--timeout S] [--selector TEXT]

and, on both, the security options (none given: plain AMQP, SASL ANONYMOUS as before):

    [--tls-ca PATH] [--tls-cert PATH --tls-key PATH] [--user NAME --password PW] [--mech MECHS]

``--tls-ca PATH``: connect with TLS, trust the CA(s) in PATH (PEM) and verify the server's certificate
against HOST (its name: dial ``localhost``, not 127.0.0.1, when the certificate names localhost).
``--tls-cert PATH --tls-key PATH`` (both or neither, only with ``--tls-ca``): present that client
certificate (PEM, unencrypted key). ``--user NAME --password PW``: log in with SASL as NAME (for
eorouter ``NAME@eorouter``). ``--mech MECHS``: the SASL mechanisms the client may use, space
separated (e.g. ``PLAIN``, ``EXTERNAL``, ``"PLAIN SCRAM-SHA-256"``); without it the stack picks among
what it supports (with a client certificate and no password: EXTERNAL; with a password: PLAIN or
better). A stack that cannot do an option refuses it at start: usage error, exit 2, the reason on
stderr (``... not supported by this stack``). A refused login or handshake is an error (exit 1) whose
summary ``error`` carries the condition (e.g. ``amqp:unauthorized-access``).

Publisher: sends COUNT messages (seq 1..COUNT) to TOPIC over one sender link and waits for every
outcome. ``--settle on-outcome`` (default) settles each delivery as soon as its outcome arrives;
``default`` leaves settlement to the stack's own default behaviour; ``presettled`` sends with
snd-settle-mode=settled (best effort, no outcomes). ``--disconnect-after K`` drops the connection
abruptly (process exit: no AMQP close) as soon as K outcomes arrived, other deliveries in flight.

Subscriber: prints ``ready`` on stdout once the router answered its attach, receives until it got
COUNT messages and gave each its ``--outcome`` (``hold``: no answer at all); with
rcv-settle-mode=second it answers unsettled and settles only when the router settled (two-step),
and waits for that. Then it stays attached ``--linger`` seconds and closes cleanly.
``--disconnect-after K`` drops the connection abruptly right after the K-th message arrived,
before answering it.

Both exit 0 when done, 3 after ``--timeout`` seconds without progress, 1 on an error, and print one
JSON summary line on stdout at the end.

Message: application property ``seq`` (long), body an AMQP string of exactly ``--size`` characters
(default 32) starting with ``"<topic>#<seq>:"`` padded with ``x``.

Ledger: docs/ledger.md (JSON lines, one file per client, appended and flushed line by line). Every
line has ``ts, client, link, role, event, topic, delivery, pub_tag, seq, outcome, router, incarnation,
digest, message_id`` in that order (``message_id`` is always null: the peers set none), then extra
fields: ``size`` (body length) on ``sent``/``delivered``, ``condition`` on ``outcome``, and ``error``.
Events: publisher ``sent`` / ``outcome``; subscriber ``delivered`` (``outcome``: its own answer, or null
with ``"held": true`` for hold, ``"presettled": true`` when the router sent it settled, nothing more when
it disconnected before answering; ``pub_tag`` recovered from the router's tag, docs/tags.md) and, beyond
docs/ledger.md, ``settled``: the router settled a delivery this subscriber answered in
rcv-settle-mode=second (``outcome``: the state the router's settling disposition carried, or null).
``incarnation``: the ``eorouter:incarnation`` link property of the router's attach (publisher lines).
``digest``: BLAKE2b-128 of the body alone as python-qpid-proton encodes ``Message(body=body)``
(``digest()`` below; the C and node peers compute the same bytes).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import time
from typing import NoReturn


def parse(role: str, argv: list[str] | None = None, stack: str = "python", extra=()) -> argparse.Namespace:
    """The common command line; ``extra``: (option, type, default) a single stack adds."""
    p = argparse.ArgumentParser(prog=f"{stack} {role}", description=f"eorouter interop {role} ({stack})")
    p.add_argument("host")
    p.add_argument("port", type=int)
    p.add_argument("topic")
    p.add_argument("count", type=int)
    p.add_argument("--ledger", required=True)
    p.add_argument("--container-id", default=None)
    p.add_argument("--link", default=None)
    p.add_argument("--disconnect-after", type=int, default=0)
    p.add_argument("--timeout", type=float, default=20.0)
    if role == "publisher":
        p.add_argument("--size", type=int, default=32)
        p.add_argument("--settle", choices=("on-outcome", "default", "presettled"), default="on-outcome")
    else:
        p.add_argument("--outcome", choices=("accept", "reject", "release", "modify", "hold"), default="accept")
        p.add_argument("--rcv-settle-mode", choices=("first", "second"), default="first")
        p.add_argument("--snd-settle-mode", choices=("unsettled", "settled"), default="unsettled")
        p.add_argument("--credit", type=int, default=100)
        p.add_argument("--linger", type=float, default=0.0)
        p.add_argument("--selector", default=None, help="a JMS selector (docs/selectors.md): only what it selects")
    security = p.add_argument_group("security (TLS, SASL)")
    security.add_argument("--tls-ca", default=None, metavar="PATH", help="use TLS, trust this CA, verify HOST")
    security.add_argument("--tls-cert", default=None, metavar="PATH", help="client certificate (with --tls-key)")
    security.add_argument("--tls-key", default=None, metavar="PATH", help="its private key (unencrypted)")
    security.add_argument("--user", default=None, metavar="NAME", help="SASL login name (NAME@eorouter)")
    security.add_argument("--password", default=None, metavar="PW", help="SASL password (with --user)")
    security.add_argument("--mech", default=None, metavar="MECHS", help="SASL mechanisms allowed, space separated")
    for option, kind, default in extra:
        p.add_argument(option, type=kind, default=default)
    a = p.parse_args(argv)
    problem = security_problem(a)
    if problem:
        p.error(problem)
    short = "pub" if role == "publisher" else "sub"
    a.role = role
    a.stack = stack
    a.container_id = a.container_id or f"{stack}-{short}-{os.getpid()}"
    a.link = a.link or f"{a.container_id}-{short}"
    return a


def security_problem(a: argparse.Namespace) -> str | None:
    """What is wrong with the security options together (None when they make sense)."""
    if (a.tls_cert is None) != (a.tls_key is None):
        return "--tls-cert and --tls-key go together"
    if a.tls_cert is not None and a.tls_ca is None:
        return "a client certificate (--tls-cert) needs TLS (--tls-ca)"
    if a.password is not None and a.user is None:
        return "--password needs --user"
    if a.mech is not None and not a.mech.split():
        return "--mech needs at least one mechanism"
    return None


def usage_error(a: argparse.Namespace, why: str) -> NoReturn:
    """A command line that makes no sense for this stack: exit 2 with the reason on stderr."""
    print(f"{a.stack} {a.role}: error: {why}", file=sys.stderr)
    sys.exit(2)


def unsupported(a: argparse.Namespace, what: str) -> NoReturn:
    """Refuse an option this stack cannot do: the usage error's exit status 2, the reason on stderr
    and in the summary line."""
    print(f"{a.stack} {a.role}: {what}: not supported by this stack", file=sys.stderr)
    summary(stack=a.stack, role=a.role, error=f"{what}: not supported by this stack")
    sys.exit(2)


OUTCOME_WORD = {"accept": "accepted", "reject": "rejected", "release": "released", "modify": "modified", "hold": "held"}


def body(topic: str, seq: int, size: int) -> str:
    head = f"{topic}#{seq}:"
    return head + "x" * max(0, size - len(head))


def seq_from(properties, value) -> int | None:
    """The message's seq: its application property, else parsed from the body."""
    if properties:
        for key, v in dict(properties).items():
            if (key.decode() if isinstance(key, bytes) else str(key)) == "seq":
                return int(v)
    if isinstance(value, bytes):
        value = value.decode(errors="replace")
    if isinstance(value, str) and "#" in value:
        try:
            return int(value.split("#", 1)[1].split(":", 1)[0])
        except ValueError:
            return None
    return None


def digest(body) -> str:
    """BLAKE2b-128 (hex) of ``Message(body=body).encode()`` as python-qpid-proton writes it for a string
    body: empty header and properties lists, then the amqp-value section. Bytes (pyamqp hands AMQP
    strings over as bytes) are taken as the UTF-8 string they encode."""
    text = body.decode("utf-8", errors="surrogateescape") if isinstance(body, bytes) else str(body)
    data = text.encode("utf-8", errors="surrogateescape")
    head = bytes.fromhex("0053704500537345005377")
    size = b"\xa1" + len(data).to_bytes(1, "big") if len(data) <= 255 else b"\xb1" + len(data).to_bytes(4, "big")
    return hashlib.blake2b(head + size + data, digest_size=16).hexdigest()


def inline_pub_tag(router_tag: bytes | None) -> bytes | None:
    """The publisher's own tag inside the router's disambiguated tag (docs/tags.md), when inline."""
    if router_tag and len(router_tag) >= 17 and router_tag[16] <= 15 and len(router_tag) == 17 + router_tag[16]:
        return bytes(router_tag[17:])
    return None


def incarnation_of(properties) -> str | None:
    """``eorouter:incarnation`` from a link's remote properties (symbol keys as str or bytes)."""
    for key, value in dict(properties or {}).items():
        if (key.decode() if isinstance(key, bytes) else str(key)) == "eorouter:incarnation":
            return value.decode() if isinstance(value, bytes) else str(value)
    return None


class Ledger:
    def __init__(self, args: argparse.Namespace):
        self.args = args
        self.router = f"{args.host}:{args.port}"
        self.incarnation: str | None = None
        self.f = open(args.ledger, "a", buffering=1)

    def write(
        self,
        event: str,
        *,
        seq=None,
        delivery: bytes | None = None,
        pub_tag: bytes | None = None,
        outcome: str | None = None,
        digest: str | None = None,
        ts: float | None = None,
        **extra,
    ) -> None:
        if pub_tag is None and event == "delivered":
            pub_tag = inline_pub_tag(delivery)
        line = {
            "ts": time.time() if ts is None else ts,
            "client": self.args.container_id,
            "link": self.args.link,
            "role": self.args.role,
            "event": event,
            "topic": self.args.topic,
            "delivery": delivery.hex() if delivery is not None else None,
            "pub_tag": pub_tag.hex() if pub_tag is not None else None,
            "seq": seq,
            "outcome": outcome,
            "router": self.router,
            "incarnation": self.incarnation if self.args.role == "publisher" else None,
            "digest": digest,
            "message_id": None,
        }
        line.update(extra)
        self.f.write(json.dumps(line) + "\n")
        self.f.flush()


def ready() -> None:
    print("ready", flush=True)


def summary(**fields) -> None:
    print(json.dumps(fields), flush=True)


def crash(ledger: Ledger | None = None) -> None:
    """Drop the connection abruptly: exit the process now (no AMQP close, no detach)."""
    if ledger is not None:
        ledger.f.flush()
    sys.stdout.flush()
    os._exit(0)


class Watchdog:
    """Ends the process (exit 3, with a summary line) when ``progress()`` was not called for
    ``timeout`` seconds: for stacks whose blocking calls can hang past their own timeouts."""

    def __init__(self, timeout: float, summary_fields: dict, ledger: Ledger | None = None):
        import threading

        self.timeout = timeout
        self.fields = summary_fields
        self.ledger = ledger
        self.last = time.monotonic()
        self.thread = threading.Thread(target=self._watch, daemon=True)
        self.thread.start()

    def progress(self) -> None:
        self.last = time.monotonic()

    def _watch(self) -> None:
        while True:
            time.sleep(0.1)
            if time.monotonic() - self.last > self.timeout:
                summary(**self.fields, error=f"watchdog: the stack blocked for {self.timeout} s without progress")
                if self.ledger is not None:
                    self.ledger.f.flush()
                os._exit(3)
