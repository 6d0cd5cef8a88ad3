"""RouterCore's state and services as its mixins see them, for the type checker only.

The mixins (admission, attach, credit, relay, control, remote outcomes,
settlement) are parts of ``RouterCore`` (router/core/router.py): their methods
read the core's state and call one another through ``self``. Each mixin names
``CoreState`` as its base under ``TYPE_CHECKING`` and ``object`` at run time, so
nothing here exists when the router runs: no attribute, no method, no change to
the method resolution order. What it gives is a checked contract: mypy checks
every mixin method and every RouterCore attribute against the declarations
below, so a declaration that drifts from the code it stands for is an error, not
a silent ``Any``.

The state is documented where it is made (``RouterCore.__init__``)."""

from __future__ import annotations

from collections.abc import Iterable
from itertools import count
from typing import Any

from router.core.commands import Command
from router.core.events import DataReceived, MessageReceived
from router.core.links import PublisherLink, Subscription, Topic
from router.core.message import OriginTemplate
from router.core.moved import MovedAway
from router.core.network import Network
from router.core.outcomes import Outcome
from router.core.records import DeliveryRecord, Roster
from router.core.resumption import Resumption
from router.core.settings import CoreSettings
from router.core.settled import SettledMemory
from router.core.topictrie import PatternIndex


class CoreState:
    # Bare annotations: declarations only, never class attributes.
    settings: CoreSettings
    boot_id: str
    epoch: int
    topics: dict[str, Topic]
    publishers: dict[int, PublisherLink]
    subscribers: dict[int, Subscription]
    subscriptions: dict[str, Subscription]
    pattern_subs: PatternIndex
    records: dict[bytes, DeliveryRecord]
    by_delivery: dict[int, DeliveryRecord]
    streams: dict[bytes, tuple[str, str, str]]
    links_by_conn: dict[int, set[int]]
    link_conn: dict[int, int]
    _incarnations: count[int]
    _order: count[int]
    _send_counter: int
    net: Network
    resumption: Resumption
    _open_properties: dict[int, dict[str, Any]]
    _known_routers: set[str]
    settled: SettledMemory
    _sweep_at: float | None
    bytes_held: int
    _promised: int
    _starved: dict[str, None]
    _pending_refills: list[Topic]
    _topic_floor: int
    stream_seq: dict[bytes, int]
    lost: set[str]
    moved_away: dict[str, MovedAway]
    moved_via: dict[bytes, set[str]]
    resumed_at: dict[bytes, tuple[str, float]]
    answers_held: set[int]
    announcements_learnt: dict[tuple[str, str], int]
    _flooded: dict[tuple[Any, ...], float]
    _awaiting_acks: dict[str, tuple[int, set[str], int]]
    _answered_early: set[str]
    _last_sent: dict[tuple[bytes, str], int]
    addressed_last: dict[tuple[bytes, str], int]
    _chain_head: dict[bytes, int]
    _chain_start: dict[bytes, tuple[int, str]]
    _held: dict[bytes, dict[int, list[tuple[DataReceived, dict[str, Any]]]]]
    draining: bool

    # The methods one part calls on another: stubs, checked against the definitions
    # (RouterCore's own and the mixins') as overrides. (A stub that returns a value
    # raises: an empty body would be an error; none of these bodies ever runs.)
    def _add_timer(self, deadline: float, kind: int, obj: Any) -> None: ...
    def _arm_sweep(self, now: float) -> None: ...
    def _topic_if_wanted(self, name: str) -> Topic | None:
        raise NotImplementedError

    def _topics_matching(self, address: str) -> list[Topic]:
        raise NotImplementedError

    def _topics_of(self, sub: Subscription) -> list[Topic]:
        raise NotImplementedError

    def _records_for(self, sub: Subscription) -> list[DeliveryRecord]:
        raise NotImplementedError

    def _topic(self, name: str) -> Topic:
        raise NotImplementedError

    def _drop_topic_if_idle(self, topic: Topic) -> None: ...

    # admission
    def _distribute(
        self, record: DeliveryRecord, topic: Topic, out: list[Command], only: Roster | None = None
    ) -> tuple[list[str], list[str], bool]:
        raise NotImplementedError

    def _pump(self, sub: Subscription, now: float, out: list[Command]) -> None: ...
    def _origin_template(self, pub: PublisherLink) -> OriginTemplate:
        raise NotImplementedError

    def _refuse(self, delivery: int, condition: str, description: str, out: list[Command]) -> None: ...

    # pre-settled relay
    def _relay_best_effort(
        self, pub: PublisherLink, topic: Topic, ev: MessageReceived, now: float, out: list[Command]
    ) -> None: ...
    def _best_effort_copies(self, topic: Topic, tag: bytes, payload: bytes, out: list[Command]) -> None: ...
    def _best_effort_from_router(self, ev: DataReceived, header: dict[str, Any], out: list[Command]) -> None: ...

    # credit
    def _refill_credit(self, topic: Topic, out: list[Command], bound_only: bool = False) -> None: ...
    def _hold_bytes(self, topic: Topic, payload: bytes | None) -> None: ...
    def _release_bytes(self, topic: Topic, payload: bytes) -> None: ...

    # relay
    def _send_towards(self, record: DeliveryRecord, routers: Iterable[str], now: float, out: list[Command]) -> None: ...

    # attach
    def _unlink_subscriber(self, sub: Subscription, now: float, out: list[Command], reason: str, closed: bool) -> None: ...
    def _forget_link(self, link_id: int) -> None: ...

    # control
    def _flood(self, message: dict[str, Any], source: str | None, out: list[Command]) -> None: ...
    def _route_control(self, to: str, message: dict[str, Any], out: list[Command]) -> bool:
        raise NotImplementedError

    def _moved_here(self, key: str) -> bool:
        raise NotImplementedError

    # remote outcomes
    def _answer_origin(self, record: DeliveryRecord, outcome: Outcome, origin: str, out: list[Command]) -> None: ...
    def _on_router_outcome(self, message: dict[str, Any], now: float, out: list[Command]) -> None: ...
    def _on_router_settle(self, message: dict[str, Any], now: float, out: list[Command]) -> None: ...
    def _on_settle_ack(self, message: dict[str, Any], now: float, out: list[Command]) -> None: ...
    def _on_settled_query(self, message: dict[str, Any], out: list[Command]) -> None: ...

    # settlement
    def _answer_publisher(self, record: DeliveryRecord, outcome: Outcome, now: float, out: list[Command]) -> None: ...
    def _maybe_answer_publisher(self, record: DeliveryRecord, now: float, out: list[Command]) -> None: ...
    def _settle_record(
        self, record: DeliveryRecord, by: str, now: float, out: list[Command], fold: dict[str, Any] | None = None
    ) -> None: ...
    def _maybe_delete(self, record: DeliveryRecord, now: float, out: list[Command]) -> None: ...
    def _finish_at_least_once(self, record: DeliveryRecord, now: float, out: list[Command]) -> None: ...
    def _delete(self, record: DeliveryRecord, reason: str | None, out: list[Command]) -> None: ...
    def _expire_message(self, record: DeliveryRecord, now: float, out: list[Command]) -> None: ...
    @staticmethod
    def _final_outcome(record: DeliveryRecord) -> int | None:
        raise NotImplementedError

    @staticmethod
    def _settle_message(tag: bytes, outcome: int | None, done: bool = False) -> dict[str, Any]:
        raise NotImplementedError
