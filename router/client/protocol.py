"""The wire side of link resumption, without proton (docs/resumption.md).

Pure functions, unit-tested on their own:

- the attach properties a resuming client sends, and the router's answer read back;
- ``cut_unsettled``: the ``eorouter:unsettled`` list cut to fit one attach frame
  (an upper bound of its AMQP encoding against the peer's max-frame-size);
- ``failover_urls`` / ``merge_urls``: the ``failover-server-list`` connection
  property of a router's open frame, merged into the client's own list;
- ``Backoff``: the reconnect schedule.
"""

from __future__ import annotations

from dataclasses import dataclass

from router.core.tags import MAX_TAG_SIZE, STREAM_ID_SIZE, inline_publisher_tag

RESUME = "eorouter:resume"
INCARNATION = "eorouter:incarnation"
UNSETTLED = "eorouter:unsettled"
INCOMPLETE = "eorouter:incomplete-unsettled"
FAILOVER_SERVER_LIST = "failover-server-list"

NONE = "none"  # in doubt: sent (or received) but no outcome known
STATES = ("none", "accepted", "rejected", "released", "modified")
TERMINAL = frozenset(STATES[1:])

# AMQP's smallest allowed max-frame-size: every peer accepts frames this big.
MIN_MAX_FRAME = 512
# What we allow the whole list to take even when the peer's max frame is "unlimited"
# (proton advertises 2^32-1): one attach is parsed in one piece on both sides.
DEFAULT_LIST_CAP = 1024 * 1024
# Room for everything in an attach besides the unsettled list: frame header,
# performative descriptor, handle, role, settle modes, both termini (address,
# durability, expiry, timeout, dynamic flags, outcomes, capabilities), the other
# properties and the map around them. Measured attaches of proton 0.40 are ~150
# bytes plus the name and address; this is a generous bound.
ATTACH_RESERVE = 1024


class ResumeError(ValueError):
    """A resume property did not have the documented shape."""


# --------------------------------------------------------------------------- sizes


def _str_size(n: int) -> int:
    """Bytes for an AMQP binary/string/symbol of ``n`` bytes (str8 / str32)."""
    return 2 + n if n <= 255 else 5 + n


def entry_size(tag: bytes, state: str) -> int:
    """An upper bound of the encoding of one ``[tag, state]`` pair: list32 header
    (constructor, 4-byte size, 4-byte count) even where an encoder would use list8."""
    return 9 + _str_size(len(tag)) + _str_size(len(state.encode()))


def list_size(entries) -> int:
    """Upper bound for the whole ``eorouter:unsettled`` value (a list32 of pairs)."""
    return 9 + sum(entry_size(t, s) for t, s in entries)


def unsettled_budget(remote_max_frame: int | None, *, name: str = "", address: str = "", cap: int = DEFAULT_LIST_CAP) -> int:
    """How many bytes the unsettled list may take in our attach to a peer that
    advertised ``remote_max_frame`` (0 / None: unlimited, as AMQP says)."""
    frame = remote_max_frame or 2**32 - 1
    frame = max(frame, MIN_MAX_FRAME)
    # name, and the address in both termini, may be str32-encoded; symbol keys of the
    # four resume properties and their values
    overhead = ATTACH_RESERVE + 5 + len(name.encode()) + 2 * (5 + len((address or "").encode()))
    overhead += sum(_str_size(len(k)) for k in (RESUME, INCARNATION, UNSETTLED, INCOMPLETE)) + 2 * 133
    return max(0, min(cap, frame - overhead))


def cut_unsettled(entries: list[tuple[bytes, str]], budget: int) -> tuple[list[tuple[bytes, str]], bool]:
    """The longest prefix of ``entries`` (in the caller's order: oldest first) whose
    encoding fits ``budget`` bytes, and whether anything was left out."""
    used = 9
    for index, (tag, state) in enumerate(entries):
        used += entry_size(tag, state)
        if used > budget:
            return list(entries[:index]), True
    return list(entries), False


# --------------------------------------------------------------------------- properties


def check_entry(tag, state) -> tuple[bytes, str]:
    if isinstance(tag, memoryview):
        tag = bytes(tag)
    if not isinstance(tag, (bytes, bytearray)) or not 0 < len(tag) <= MAX_TAG_SIZE:
        raise ResumeError(f"unsettled tag must be 1..{MAX_TAG_SIZE} bytes of binary, got {tag!r}")
    if not isinstance(state, str) or str(state) not in STATES:
        raise ResumeError(f"unsettled state must be one of {STATES}, got {state!r}")
    return bytes(tag), str(state)


def resume_properties(
    entries: list[tuple[bytes, str]], budget: int, *, incarnation: str | None = None
) -> tuple[dict, list[tuple[bytes, str]], bool]:
    """The link properties of a resuming attach (string keys: the caller makes them
    symbols), the entries actually reported and whether the list was cut."""
    entries = [check_entry(t, s) for t, s in entries]
    reported, incomplete = cut_unsettled(entries, budget)
    props: dict = {RESUME: True, UNSETTLED: [[tag, state] for tag, state in reported]}
    if incarnation:
        props[INCARNATION] = incarnation
    if incomplete:
        props[INCOMPLETE] = True
    return props, reported, incomplete


@dataclass(frozen=True)
class ResumeAnswer:
    """What a router's attach said about our resume.

    ``unsettled`` is None when the router's attach carried no ``eorouter:unsettled``
    at all (a router that does not implement resumption); otherwise tag -> state."""

    incarnation: str | None
    unsettled: dict[bytes, str] | None
    incomplete: bool

    @property
    def speaks_resume(self) -> bool:
        return self.unsettled is not None


def _plain_key(key) -> str:
    return str(key)


def read_answer(remote_properties) -> ResumeAnswer:
    """Read a router's attach properties (proton gives symbol keys; binary values
    come back as memoryview)."""
    props = {_plain_key(k): v for k, v in (remote_properties or {}).items()}
    incarnation = props.get(INCARNATION)
    incarnation = str(incarnation) if isinstance(incarnation, str) and incarnation else None
    raw = props.get(UNSETTLED)
    unsettled: dict[bytes, str] | None = None
    if raw is not None:
        if not isinstance(raw, (list, tuple)):
            raise ResumeError(f"{UNSETTLED} must be a list of [tag, state] pairs, got {type(raw).__name__}")
        unsettled = {}
        for item in raw:
            if not isinstance(item, (list, tuple)) or len(item) != 2:
                raise ResumeError(f"{UNSETTLED} entry must be a [tag, state] pair, got {item!r}")
            tag, state = check_entry(*item)
            unsettled[tag] = state
    return ResumeAnswer(incarnation, unsettled, bool(props.get(INCOMPLETE)))


# --------------------------------------------------------------------------- tags


def counter_tag(n: int) -> bytes:
    """Our publisher tags: the decimal counter, like proton's own ("1", "2", ...);
    short enough (<= 15 bytes) to travel verbatim inside the disambiguated tag."""
    return str(n).encode("ascii")


def publisher_tag_of(delivery_tag: bytes) -> bytes | None:
    """The publisher's own tag inside a router's disambiguated tag (docs/tags.md),
    or None when it was hashed (or the tag is not one of ours)."""
    if len(delivery_tag) <= STREAM_ID_SIZE:
        return None
    try:
        return inline_publisher_tag(delivery_tag)
    except IndexError:
        return None


# --------------------------------------------------------------------------- failover


def _port_of(value) -> int | None:
    try:
        port = int(str(value))
    except (TypeError, ValueError):
        return None
    return port if 0 < port < 65536 else None


def failover_urls(connection_properties, tls: bool = False) -> list[str]:
    """``host:port`` for each entry of a ``failover-server-list`` connection property
    (a list of maps with "network-host" (where to connect), "hostname", "port",
    "scheme"); only the entries of the client's kind, amqps (``tls``) or amqp, and
    usable."""
    props = {str(k): v for k, v in (connection_properties or {}).items()}
    entries = props.get(FAILOVER_SERVER_LIST)
    if not isinstance(entries, (list, tuple)):
        return []
    urls = []
    for entry in entries:
        if not isinstance(entry, dict):
            continue
        entry = {str(k): v for k, v in entry.items()}
        scheme = str(entry.get("scheme") or "amqp")
        if scheme != ("amqps" if tls else "amqp"):  # a client speaks TLS to every router or to none
            continue
        host = entry.get("network-host") or entry.get("hostname")
        port = _port_of(entry.get("port", 5672))
        if not host or port is None:
            continue
        host = str(host)
        urls.append(f"[{host}]:{port}" if ":" in host else f"{host}:{port}")
    return urls


def normalise_url(url: str) -> str:
    """``amqp://host:port`` / ``amqps://host:port`` / ``host:port`` / ``host`` ->
    ``host:port`` (TLS is the client's ``ssl_domain``, for every router alike)."""
    text = url.strip()
    if "://" in text:
        scheme, _, text = text.partition("://")
        if scheme not in ("amqp", "amqps"):
            raise ValueError(f"unsupported scheme in {url!r} (amqp or amqps)")
    text = text.split("/", 1)[0]
    if "@" in text:
        text = text.rsplit("@", 1)[1]
    if text.startswith("["):
        return text if "]:" in text else f"{text}:5672"
    if ":" not in text:
        return f"{text}:5672"
    return text


def merge_urls(configured: list[str], advertised: list[str]) -> list[str]:
    """The client's failover list: its configured URLs first (in order), then the
    ones routers advertised that it did not know (in the order first seen)."""
    out: list[str] = []
    for url in list(configured) + list(advertised):
        url = normalise_url(url)
        if url not in out:
            out.append(url)
    return out


class Backoff:
    """Reconnect delays: the first pass over the URL list goes at once (a dead
    router's neighbour is probably up); after each full pass that found nobody,
    the delay doubles from ``initial`` up to ``maximum``."""

    def __init__(self, initial: float = 0.1, maximum: float = 2.0):
        self.initial = initial
        self.maximum = maximum
        self.failures = 0

    def next_delay(self, n_urls: int) -> float:
        n_urls = max(1, n_urls)
        passes = self.failures // n_urls
        self.failures += 1
        if passes == 0:
            return 0.0
        return min(self.maximum, self.initial * 2 ** (passes - 1))

    def reset(self) -> None:
        self.failures = 0
