"""Constants the core's seams share (router/core/router.py and its mixins)."""

from __future__ import annotations

from router.core import outcomes, tags

# Link property through which a publisher presents (and learns) its incarnation.
INCARNATION_PROPERTY = "eorouter:incarnation"
UNSETTLED_PROPERTY = "eorouter:unsettled"
MAX_ADDRESS_LENGTH = 1024

_TIMER_LINGER = 0
_TIMER_EXPIRY = 1
_TIMER_SUBSCRIPTION = 2
_TIMER_SHUTDOWN = 3
_TIMER_ANNOUNCE = 4
_TIMER_ORDER_GAP = 5
_TIMER_PLACEHOLDER = 6
_TIMER_PUBLISHER_GONE = 7
_TIMER_MEMBERSHIP = 8
_TIMER_STREAM_SEQ = 9
_TIMER_SETTLED_SWEEP = 10
# Messages smaller than this are not counted against the byte budget: the in-flight
# bound already holds a topic's to max_in_flight_per_topic of them (4 MiB at the
# default), and counting each would cost every small message its share of the hot path.
UNCOUNTED_BELOW = 4096
# What a topic may always hold, in largest messages, whatever the router-wide
# byte budget says (the rest of the router keeps flowing when some topics are stuck).
TOPIC_FLOOR_MESSAGES = 4
# The condition a resend is refused with when the network may have finished and
# forgotten it (docs/resumption.md, "What a publisher may rely on").
BEYOND_HORIZON_CONDITION = "eorouter:resend-beyond-horizon"
GONE = -1  # DeliveryRecord.pub_link once its publisher is gone for good
# The length byte of an inline publisher tag in an outgoing tag (tags.outgoing_tag).
_TAG_SIZE = tuple(bytes((size,)) for size in range(tags.MAX_INLINE_TAG + 1))
# Commands are NamedTuples; on the per-message path they are built with
# tuple.__new__(Cls, (every field)), which skips the Python-level __new__ of a
# NamedTuple call (~0.1 µs each; the same object, equal to Cls(...)).
_new = tuple.__new__
ACCEPTED = outcomes.ACCEPTED
_RELEASED = outcomes.RELEASED
_TERMINAL = outcomes.TERMINAL
_NAMES = outcomes.NAMES

# How long a relayed copy may wait for its predecessor from the same publisher
# before it is delivered anyway (the predecessor is then logged as a gap).
ORDER_HOLD_TIMEOUT = 5.0

# How long a new subscriber's attach waits for every reachable router to confirm
# it knows of the subscriber (docs/inter-router.md, "the propagation race").
ANNOUNCE_TIMEOUT = 2.0
# A relayed copy that has crossed this many routers is dropped: routes that
# disagree while link state floods must not loop a message for ever.
MAX_HOPS = 16
