"""Disambiguated outgoing delivery tags (docs/tags.md).

A publisher's delivery tag is only unique among that link's unsettled deliveries
(proton restarts at "1" on every attach). Subscribers receive deliveries merged
from many publishers, and after a failover any router must compute the *same*
tag for the same publisher delivery, so the tag is derived, never allocated:

    tag = stream_id (16 bytes) + tag_part (1 + up to 15 bytes)  -> at most 32 bytes

- ``stream_id`` = BLAKE2b-128 of (container-id, link name, incarnation), each
  length-prefixed, personalised. It names one publisher *stream*: one link
  incarnation. The incarnation tells a resumed link from a new one with the same
  name: a plain attach gets a fresh one, a resuming publisher presents its old one.
- ``tag_part`` = one length byte + the publisher's tag itself when that tag is at
  most 15 bytes (every stack we know uses short counters), otherwise 0xFF + the
  BLAKE2b-120 of the tag. Short tags are therefore encoded injectively; only the
  stream id and over-long tags are hashes.

Collisions: the core keeps every live stream id with the triple that made it and
refuses an attach whose stream id is taken by a different triple; a long-tag hash
that matches a live record of the same stream but a different publisher tag is
refused for that delivery. Both are logged; at 2^-64 birthday odds for a billion
streams neither is expected to ever fire.
"""

from __future__ import annotations

from hashlib import blake2b

from router.core.errors import ProtocolError

STREAM_ID_SIZE = 16
MAX_TAG_SIZE = 32  # AMQP's limit for a delivery-tag
MAX_INLINE_TAG = 15
_HASHED = 0xFF
_PERSON_STREAM = b"eorouter-stream"
_PERSON_TAG = b"eorouter-tag"


def _field(value: str) -> bytes:
    raw = value.encode("utf-8")
    return len(raw).to_bytes(4, "big") + raw


def stream_id(container_id: str, link_name: str, incarnation: str) -> bytes:
    """The 16-byte id of one publisher link incarnation."""
    digest = blake2b(digest_size=STREAM_ID_SIZE, person=_PERSON_STREAM)
    digest.update(_field(container_id))
    digest.update(_field(link_name))
    digest.update(_field(incarnation))
    return digest.digest()


def outgoing_tag(stream: bytes, publisher_tag: bytes) -> bytes:
    """The tag every router uses for this publisher delivery (<= 32 bytes)."""
    size = len(publisher_tag)
    if size <= MAX_INLINE_TAG:
        return stream + bytes((size,)) + publisher_tag
    if size > MAX_TAG_SIZE:
        raise ProtocolError("amqp:invalid-field", f"delivery-tag of {size} bytes exceeds AMQP's 32")
    return stream + bytes((_HASHED,)) + blake2b(publisher_tag, digest_size=15, person=_PERSON_TAG).digest()


def stream_of(tag: bytes) -> bytes:
    """The publisher stream a disambiguated tag belongs to."""
    return tag[:STREAM_ID_SIZE]


def inline_publisher_tag(tag: bytes) -> bytes | None:
    """The publisher's own tag when it was short enough to be carried inline."""
    size = tag[STREAM_ID_SIZE]
    if size == _HASHED:
        return None
    return tag[STREAM_ID_SIZE + 1 : STREAM_ID_SIZE + 1 + size]


def fresh_incarnation(boot_id: str, counter: int, minted: float | None = None) -> str:
    """An incarnation unique for all time: the router's random boot id (new at
    every start, so a lost data directory cannot repeat one) and a counter; and
    when it was minted (whole seconds of wall time), which tells a router that no
    longer knows every stream it forgot whether a resent delivery could be one of
    them (router/core/settled.py)."""
    if minted is None:
        return f"{boot_id}.{counter}"
    return f"{boot_id}.{counter}.{int(minted)}"


def incarnation_minted(incarnation: str | None) -> float | None:
    """The mint time an incarnation carries (fresh_incarnation), if any."""
    if not incarnation:
        return None
    parts = incarnation.split(".")
    if len(parts) != 3 or not parts[2].isdigit() or len(parts[2]) > 12:
        return None
    return float(parts[2])
