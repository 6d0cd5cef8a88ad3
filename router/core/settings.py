"""The knobs the core's decisions depend on (built from the TOML config by router.config)."""

from __future__ import annotations

from dataclasses import dataclass

from router.core import outcomes
from router.core.guarantees import GuaranteeRule


@dataclass(frozen=True, slots=True)
class CoreSettings:
    router_id: str = "router"
    # Most publisher deliveries a topic may hold unfinished; bounds memory and is
    # how a slow subscriber throttles publishers (their credit stops).
    max_in_flight_per_topic: int = 1000
    # Most credit one publisher link holds at a time.
    publisher_credit_window: int = 250
    max_message_size: int = 1024 * 1024
    # Most message bytes the router's delivery records may hold, router-wide and per
    # topic (the payloads of deliveries in flight): publisher credit is withheld
    # before either is reached (docs/configuration.md).
    max_bytes_in_flight: int = 1024 * 1024 * 1024
    max_bytes_in_flight_per_topic: int = 256 * 1024 * 1024
    # Terminus timeout bounds (seconds) for durable subscriptions; a peer asking for
    # 0 gets the default, one asking for more than the maximum gets the maximum.
    default_terminus_timeout: int = 60
    max_terminus_timeout: int = 3600
    # What a publisher hears when a topic has nobody to deliver to.
    no_subscribers: int = outcomes.RELEASED
    # How long a settled record is kept when no later evidence shows every receiver
    # saw the settlement (the publisher's last delivery has no "later" one).
    record_linger: float = 2.0
    # A publisher link's receiver settle mode (AMQP lets the receiver, the router,
    # choose it): "first" settles every delivery with its final outcome, whatever
    # the publisher asked for; "as-requested" honours a publisher asking for second
    # (outcome unsettled, the router settles after the publisher did); "resumable"
    # honours it for a publisher that speaks the resume protocol only
    # (resumption.publisher_settles_first says why).
    publisher_rcv_settle_mode: str = "resumable"
    # Failover (docs/resumption.md): how long a resumed subscriber's placeholder
    # blocks its publisher stream, and how long a detached publisher's deliveries
    # wait for it to resume before the router settles them on its behalf.
    placeholder_timeout: float = 30.0
    publisher_resume_timeout: float = 8.0
    # How long a resumed publisher's credit waits for the other routers to say how
    # far they saw its stream numbered (it continues after the highest).
    stream_seq_timeout: float = 2.0
    # What a router remembers of settled deliveries (router/core/settled.py): per
    # publisher stream, at least its last max_in_flight_per_topic outcomes, for
    # resume_horizon seconds after the stream's last settlement here; at most
    # remembered_streams streams, and the ids of forgotten_streams forgotten ones
    # (a resend of those is refused, "eorouter:resend-beyond-horizon").
    resume_horizon: float = 600.0
    remembered_streams: int = 100_000
    forgotten_streams: int = 1_000_000
    # The config's [[guarantee]] rules, in order (router/core/guarantees.py).
    guarantees: tuple[GuaranteeRule, ...] = ()
