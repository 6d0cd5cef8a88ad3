"""What routers tell each other about their subscribers: the announcements, the
table's change reports, and the checks a received one must pass
(router/core/membership.py keeps the table these feed)."""

from __future__ import annotations

from typing import NamedTuple, TypeGuard

from router.core.errors import ProtocolError
from router.core.routing import RouterId

# Reasons in RemoteSubscriberRemoved.
REASON_DETACHED = "detached"  # the link detached and its router kept nothing
REASON_CLOSED = "closed"  # the terminus was closed (or its timeout expired at its router)
REASON_SUPERSEDED = "superseded"  # a snapshot or a re-attach on another topic replaced it
REASON_RESTARTED = "restarted"  # a newer incarnation of its router replaced the old one's state
REASON_EXPIRED = "expired"  # its router was lost for longer than the terminus timeout


class SubscriberKey(NamedTuple):
    container_id: str
    link_name: str

    def __str__(self) -> str:
        return f"{self.container_id}/{self.link_name}"


# --- announcements (flooded between routers) -------------------------------------------------


#: The deliveries a router held when a subscription began there, and so never owed
#: it: publisher stream id (hex) -> [[low, high], ...] ranges of their stream_seq.
Before = dict[str, list[list[int]]]


class SubscriberAttached(NamedTuple):
    """A subscriber's link attached at ``router``. ``resumed``: it attached with
    unsettled state (an old link resuming, not a new one). ``timeout``: the
    terminus timeout the router granted, seconds (0 when not durable). ``before``:
    for a new durable subscription, the deliveries its router held when it began
    (never owed to it there: a router that loses ``router`` must not owe them to
    it either, docs/resumption.md); None when there were none."""

    router: RouterId
    epoch: int
    boot: str
    version: int
    topic: str
    container_id: str
    link_name: str
    durable: bool
    resumed: bool
    timeout: int
    before: Before | None = None

    @property
    def key(self) -> SubscriberKey:
        return SubscriberKey(self.container_id, self.link_name)


class SubscriberDetached(NamedTuple):
    """A subscriber's link detached at ``router``. ``closed`` is the detach's AMQP
    closed flag (or the terminus expired there); ``retained`` says the router
    still holds the subscription for ``timeout`` seconds (durable, not closed)."""

    router: RouterId
    epoch: int
    boot: str
    version: int
    topic: str
    container_id: str
    link_name: str
    closed: bool
    retained: bool = False
    timeout: int = 0

    @property
    def key(self) -> SubscriberKey:
        return SubscriberKey(self.container_id, self.link_name)


Announcement = SubscriberAttached | SubscriberDetached


class SubscribersSnapshot(NamedTuple):
    """One router's subscribers as of every version up to ``through``: its live
    announcements, plus detaches newer than ``through`` (from a relaying router)."""

    router: RouterId
    epoch: int
    boot: str
    through: int
    announcements: tuple[Announcement, ...]


# --- changes (what the caller must react to) -------------------------------------------------


class RemoteSubscriberAdded(NamedTuple):
    """Attached at ``router`` (an upsert: also sent when a newer attach replaces one)."""

    router: RouterId
    key: SubscriberKey
    topic: str
    durable: bool
    resumed: bool
    timeout: int


class RemoteSubscriberRetained(NamedTuple):
    """Detached at ``router``, which still holds the subscription (still owed messages)."""

    router: RouterId
    key: SubscriberKey
    topic: str
    timeout: int


class RemoteSubscriberRemoved(NamedTuple):
    router: RouterId
    key: SubscriberKey
    topic: str
    reason: str


class RemoteSubscriberLost(NamedTuple):
    """Its router was lost: the subscriber is waiting to re-attach somewhere."""

    router: RouterId
    key: SubscriberKey
    topic: str
    lost_at: float


class SubscriberMoved(NamedTuple):
    """``key`` attached at ``to_router`` while still known at ``from_router``."""

    key: SubscriberKey
    from_router: RouterId
    to_router: RouterId


Change = RemoteSubscriberAdded | RemoteSubscriberRetained | RemoteSubscriberRemoved | RemoteSubscriberLost | SubscriberMoved


class RemoteSubscriber(NamedTuple):
    """The table's view of one subscriber at one router."""

    router: RouterId
    key: SubscriberKey
    topic: str
    attached: bool  # False: detached, retained by its router
    durable: bool
    resumed: bool
    timeout: int
    version: int
    lost_at: float | None  # when its router was marked lost
    before: Before | None = None  # SubscriberAttached.before

    def was_here_before(self, stream: bytes, seq: int) -> bool:
        """Whether the delivery numbered ``seq`` of publisher stream ``stream`` was at
        its router before this subscription began there (so never owed to it there)."""
        ranges = self.before.get(stream.hex()) if self.before else None
        return ranges is not None and any(low <= seq <= high for low, high in ranges)


def seq_ranges(seqs: list[int]) -> list[list[int]]:
    """Sorted stream_seq numbers as [[low, high], ...] runs of consecutive numbers."""
    ranges: list[list[int]] = []
    for seq in sorted(seqs):
        if ranges and seq <= ranges[-1][1] + 1:
            ranges[-1][1] = seq  # sorted: never below the run's end
        else:
            ranges.append([seq, seq])
    return ranges


class MembershipStamp(NamedTuple):
    """How much of a router's announcements we hold: a peer with a higher
    ``through`` for the same incarnation can send us its snapshot of it."""

    epoch: int
    boot: str
    through: int


# --- validation -----------------------------------------------------------------------------


def _is_int(value: object) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


def _check_origin(router: object, epoch: object, boot: object) -> None:
    if not isinstance(router, str) or not router:
        raise ProtocolError("amqp:invalid-field", f"announcing router {router!r}")
    if not _is_int(epoch) or epoch < 0 or not isinstance(boot, str):
        raise ProtocolError("amqp:invalid-field", f"incarnation {epoch!r}/{boot!r} of {router!r}")


def validate_announcement(message: Announcement) -> None:
    """Raise ``ProtocolError`` unless ``message`` is a well-formed announcement."""
    if not isinstance(message, (SubscriberAttached, SubscriberDetached)):
        raise ProtocolError("amqp:invalid-field", f"not a subscriber announcement: {message!r}")
    _check_origin(message.router, message.epoch, message.boot)
    if not _is_int(message.version) or message.version < 1:
        raise ProtocolError("amqp:invalid-field", f"announcement version {message.version!r}")
    for name in ("topic", "container_id", "link_name"):
        if not isinstance(getattr(message, name), str):
            raise ProtocolError("amqp:invalid-field", f"announcement {name} {getattr(message, name)!r}")
    flags = ("durable", "resumed") if isinstance(message, SubscriberAttached) else ("closed", "retained")
    for name in flags:
        if not isinstance(getattr(message, name), bool):
            raise ProtocolError("amqp:invalid-field", f"announcement {name} {getattr(message, name)!r}")
    if not _is_int(message.timeout) or message.timeout < 0:
        raise ProtocolError("amqp:invalid-field", f"announcement timeout {message.timeout!r}")
    before = getattr(message, "before", None)
    if before is not None and not (
        isinstance(before, dict)
        and all(
            isinstance(stream, str)
            and isinstance(ranges, list)
            and all(isinstance(r, list) and len(r) == 2 and _is_int(r[0]) and _is_int(r[1]) and r[0] <= r[1] for r in ranges)
            for stream, ranges in before.items()
        )
    ):
        raise ProtocolError("amqp:invalid-field", f"announcement before {before!r}")


def validate_snapshot(snapshot: SubscribersSnapshot) -> None:
    """Raise ``ProtocolError`` unless ``snapshot`` is well formed and consistent."""
    _check_origin(snapshot.router, snapshot.epoch, snapshot.boot)
    if not _is_int(snapshot.through) or snapshot.through < 0:
        raise ProtocolError("amqp:invalid-field", f"snapshot through {snapshot.through!r}")
    if not isinstance(snapshot.announcements, tuple):
        raise ProtocolError("amqp:invalid-field", "snapshot announcements must be a tuple")
    keys, versions = set(), set()
    for item in snapshot.announcements:
        validate_announcement(item)
        if (item.router, item.epoch, item.boot) != (snapshot.router, snapshot.epoch, snapshot.boot):
            raise ProtocolError("amqp:invalid-field", f"snapshot of {snapshot.router!r} holds {item!r}")
        if item.key in keys:
            raise ProtocolError("amqp:invalid-field", f"snapshot lists {item.key} twice")
        if item.version in versions:
            raise ProtocolError("amqp:invalid-field", f"snapshot lists version {item.version} twice")
        keys.add(item.key)
        versions.add(item.version)
