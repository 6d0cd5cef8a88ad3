"""Large messages go to a subscriber piece by piece, from the one copy the core holds.

``pn_link_send`` copies a message into the outgoing delivery's own buffer, and proton
keeps that buffer's memory until the delivery is settled: a subscriber that takes
large messages and never answers them would cost the router a second copy of every
one of them, on top of the delivery record's (issue 16, part 4: 7 GiB for 3 GB of
payload). So a payload of at least ``STREAM_MIN`` bytes is handed to proton
``CHUNK`` bytes at a time, the next piece only once proton has framed the previous
one for the socket; the delivery's buffer then never holds more than about a
chunk, and the bytes themselves stay in the core's record, shared by every copy.

A link with a message in progress queues whatever comes after it, small messages
included, so the link's order is kept. The server feeds the queue after each
write to the connection (``feed``), and whenever the core adds to it.
"""

from __future__ import annotations

from collections import deque

from router.adapter.pn import (
    _address_of,
    _delivery_new,
    _delivery_pending,
    _delivery_settle,
    _from_buffer,
    _link_advance,
    _link_send,
)

STREAM_MIN = 256 * 1024
CHUNK = 64 * 1024
# The most one feed() moves into proton for one connection before its bytes are
# written: the other connections get their turn.
FEED_BUDGET = 16 * CHUNK


class Pending:
    """One queued outgoing message: its delivery once started, how much went out."""

    __slots__ = ("tag", "view", "offset", "d", "presettled", "settle")

    def __init__(self, tag: bytes, payload: bytes, presettled: bool):
        self.tag = tag
        self.view = memoryview(payload)
        self.offset = 0
        self.d = None
        self.presettled = presettled
        self.settle = False  # the core settled it while it was still going out


def send(link, tag: bytes, payload: bytes, presettled: bool) -> None:
    """Queue a message on ``link`` (a large one, or any while one is in progress)."""
    if link.streams is None:
        link.streams = deque()
    link.streams.append(Pending(tag, payload, presettled))
    link.conn.streaming.add(link)
    feed(link, FEED_BUDGET)


def feed(link, budget: int) -> int:
    """Move up to ``budget`` bytes of the link's queue into proton; returns how many."""
    queue = link.streams
    lp = link.ptr
    moved = 0
    while queue:
        item = queue[0]
        d = item.d
        if d is None:
            tag = item.tag
            d = item.d = _delivery_new(lp, (len(tag), _from_buffer(tag)))
            if not item.presettled:
                link.out[tag] = _address_of(d)
        view = item.view
        size = len(view)
        while item.offset < size:
            if _delivery_pending(d) >= CHUNK or moved >= budget:
                return moved
            n = size - item.offset
            if n > CHUNK:
                n = CHUNK
            _link_send(lp, _from_buffer(view[item.offset : item.offset + n]), n)
            item.offset += n
            moved += n
        _link_advance(lp)
        if item.presettled or item.settle:
            _delivery_settle(d)
        queue.popleft()
    link.conn.streaming.discard(link)
    return moved


def settle(link, tag: bytes):
    """The core settles ``tag`` on ``link``: the address of the pn_delivery to settle now, or None
    when it is still queued (settled once it has gone out, or never started: then it
    is dropped, and the subscriber never hears of it)."""
    queue = link.streams
    if queue:
        for item in queue:
            if item.tag == tag:
                if item.d is None:
                    queue.remove(item)
                    if not queue:
                        link.conn.streaming.discard(link)
                else:
                    item.settle = True
                    link.out.pop(tag, None)
                return None
    return link.out.pop(tag, None)


def forget(link) -> None:
    """The link is gone: so is its queue."""
    if link.streams:
        link.streams.clear()
    link.conn.streaming.discard(link)
