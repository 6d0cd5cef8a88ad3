"""Proton's C engine as the adapter uses it: event types and the engine functions,
bound to module names once (a module global is cheaper to reach than ``lib.pn_x``
on the per-message path). The one place these are spelled out."""

from functools import partial

from cproton_ffi import ffi, lib

PN_CONNECTION_REMOTE_CLOSE = lib.PN_CONNECTION_REMOTE_CLOSE
PN_CONNECTION_REMOTE_OPEN = lib.PN_CONNECTION_REMOTE_OPEN
PN_DELIVERY = lib.PN_DELIVERY
PN_LINK_FLOW = lib.PN_LINK_FLOW
PN_LINK_REMOTE_CLOSE = lib.PN_LINK_REMOTE_CLOSE
PN_LINK_REMOTE_DETACH = lib.PN_LINK_REMOTE_DETACH
PN_LINK_REMOTE_OPEN = lib.PN_LINK_REMOTE_OPEN
PN_SESSION_REMOTE_CLOSE = lib.PN_SESSION_REMOTE_CLOSE
PN_SESSION_REMOTE_OPEN = lib.PN_SESSION_REMOTE_OPEN
PN_TRANSPORT_CLOSED = lib.PN_TRANSPORT_CLOSED
PN_TRANSPORT_ERROR = lib.PN_TRANSPORT_ERROR

_buffer = ffi.buffer
# A delivery's address (as the compiled fast path gives it) as the cdata pointer the
# engine calls take: equal to, and hashing as, the one proton's events give.
_cast_delivery = partial(ffi.cast, ffi.typeof("pn_delivery_t *"))
# The other way: a delivery's address, as int() reads it.
_delivery_address = partial(ffi.cast, ffi.typeof("uintptr_t"))


def _address_of(d) -> int:
    """A delivery's address: how the engine keeps the deliveries it holds (a link's copies,
    ``Link.out``; a publisher's, ``_incoming``/``_handles``), so that the compiled path,
    which has the address, needs no cdata to keep or find one."""
    return int(_delivery_address(d))


_collector_peek = lib.pn_collector_peek
_collector_pop = lib.pn_collector_pop
_delivery_aborted = lib.pn_delivery_aborted
_delivery_link = lib.pn_delivery_link
_delivery_new = lib.pn_delivery
_delivery_partial = lib.pn_delivery_partial
_delivery_pending = lib.pn_delivery_pending
_delivery_readable = lib.pn_delivery_readable
_delivery_remote_state = lib.pn_delivery_remote_state
_delivery_settle = lib.pn_delivery_settle
_delivery_settled = lib.pn_delivery_settled
_delivery_tag = lib.pn_delivery_tag
_delivery_update = lib.pn_delivery_update
_event_delivery = lib.pn_event_delivery
_event_link = lib.pn_event_link
_event_type = lib.pn_event_type
_from_buffer = ffi.from_buffer
_link_advance = lib.pn_link_advance
_link_credit = lib.pn_link_credit
_link_flow = lib.pn_link_flow
_link_get_drain = lib.pn_link_get_drain
_link_recv = lib.pn_link_recv
_link_send = lib.pn_link_send
_unpack = ffi.unpack
