"""Scan and splice encoded AMQP 1.0 messages without decoding them.

A transfer carries a message as a run of *sections*, each an AMQP described value
(``0x00``, a descriptor, a value)::

    [header 0x70] [delivery-annotations 0x71] [message-annotations 0x72]
    [properties 0x73] [application-properties 0x74]
    [data 0x75 ... | amqp-sequence 0x76 ... | amqp-value 0x77] [footer 0x78]

The router needs three things from a message and changes one:

* it reads ``header.ttl`` (field 2) and ``properties.absolute-expiry-time`` (field 8);
* it reads the origin annotation (``ORIGIN_KEY`` in message-annotations) if another
  router already added it;
* otherwise it splices that annotation in: one entry appended to the
  message-annotations map (only that map's size/count header is rewritten), or a
  new message-annotations section inserted after header/delivery-annotations.
  Every other byte is copied untouched.

This module is part of the pure core: no proton import (a test enforces it).
Values are skipped by constructor and width, never decoded into Python objects.

How much is checked, and why:

* Everything up to the splice point is checked to the byte, recursively: the
  header's five fields must have their spec types, and every list, map and array
  inside delivery- and message-annotations must be exactly as long as its size
  says. A decoder that trusts element counts (proton-c does) and one that trusts
  sizes (we do) therefore agree on where each of these sections ends, so a
  spliced message never reads differently from the original.
* properties: field 8 (absolute-expiry-time) must be a timestamp or null; the
  list's fields must fill its size exactly (each skipped by its own size).
* application-properties, body sections and footer are checked for section type
  (map / binary / list / any value), size within the message, and a count that
  fits the size, then skipped by size: the router never looks into a body, so a
  large body costs one size read (and one copy when splicing). A corruption
  inside them that keeps every size consistent is forwarded as is, bytes
  unchanged; the receiver's decoder judges the body.
* Section order and repetition follow AMQP 1.0 part 3 section 3.2: at most one
  of each, in order; the body is one or more data, one or more amqp-sequence, or
  one amqp-value section. Deliberate leniency, as proton and qpid-dispatch: a
  message with no body section is accepted (proton sends ``Message()`` with body
  None as header + properties only), and the header, annotations, properties,
  application-properties and footer sections may carry ``null`` for "empty".
  A payload with no section at all, or with trailing bytes, is malformed.

Cost, measured with ``timeit`` (best of 7 x 100k calls, ``time.thread_time``)
on CPython 3.11 on the 2-core project machine while other jobs ran (load 2-8).
A quiet machine should be a little faster:

  ========================================================  ===========
  message (proton-encoded)                                  ``prepare``
  ========================================================  ===========
  92 B: header with ttl, properties with message-id and     ~3.4 us
  absolute-expiry-time, 1 application property, a string
  amqp-value; gets a new message-annotations section
  the same with an existing annotation (map extended)       ~4.4 us
  18 B: ``Message(body="hello")``                           ~1.8 us
  182 B: already carries the origin (returned unchanged)    ~5.3 us
  64 KiB data body (one size read, then one 64 KiB copy)    ~3.8 us
  1 MiB data body                                           ~42 us
  ========================================================  ===========

About 2.4 us of the 3.4 us is the scan and 0.5 us is encoding the origin entry.
The cost grows with the number of sections and of header, properties and
annotation fields. Apart from the one copy, it does not grow with the body's
size.

The router itself calls ``splice_origin`` with an ``OriginTemplate`` kept per
publisher link (the origin entry encoded once, around the tag), not ``prepare``:
about 1 us for the messages above less the ~0.5 us of the entry. What proton
clients send for a binary body alone (an empty header and/or empty properties,
then one data section) skips the general scan: ~0.9 us for the whole splice
against ~1.9 us through ``prepare`` (113 B, the same machine).
"""

from __future__ import annotations

from functools import lru_cache
from struct import Struct, error as _StructError
from typing import NamedTuple

__all__ = ["ORIGIN_KEY", "DECODE_ERROR", "MessageError", "Origin", "OriginTemplate", "Prepared", "prepare",
           "read_origin", "splice_origin"]

ORIGIN_KEY = "x-opt-eorouter-origin"
DECODE_ERROR = "amqp:decode-error"

# Section descriptor codes (AMQP 1.0 part 3, section 3.2).
HEADER = 0x70
DELIVERY_ANNOTATIONS = 0x71
MESSAGE_ANNOTATIONS = 0x72
PROPERTIES = 0x73
APPLICATION_PROPERTIES = 0x74
DATA = 0x75
AMQP_SEQUENCE = 0x76
AMQP_VALUE = 0x77
FOOTER = 0x78

SECTION_NAMES = {
    0: "start of message",
    HEADER: "header",
    DELIVERY_ANNOTATIONS: "delivery-annotations",
    MESSAGE_ANNOTATIONS: "message-annotations",
    PROPERTIES: "properties",
    APPLICATION_PROPERTIES: "application-properties",
    DATA: "data",
    AMQP_SEQUENCE: "amqp-sequence",
    AMQP_VALUE: "amqp-value",
    FOOTER: "footer",
}
_SYMBOLS = {
    b"amqp:header:list": HEADER,
    b"amqp:delivery-annotations:map": DELIVERY_ANNOTATIONS,
    b"amqp:message-annotations:map": MESSAGE_ANNOTATIONS,
    b"amqp:properties:list": PROPERTIES,
    b"amqp:application-properties:map": APPLICATION_PROPERTIES,
    b"amqp:data:binary": DATA,
    b"amqp:amqp-sequence:list": AMQP_SEQUENCE,
    b"amqp:amqp-value:*": AMQP_VALUE,
    b"amqp:footer:map": FOOTER,
}


class MessageError(ValueError):
    """The encoded message is malformed. The router rejects such a delivery with
    the AMQP error condition ``condition`` (amqp:decode-error) and ``str(error)``
    as its description. ``offset`` is the byte offset of the problem."""

    condition = DECODE_ERROR

    def __init__(self, what: str, offset: int | None = None):
        self.what = what
        self.offset = offset
        super().__init__(what if offset is None else f"{what} (at byte offset {offset})")


class Origin(NamedTuple):
    """Where a message entered the router network: the publisher's container id
    and link name, its delivery tag, the publisher link's incarnation and the
    router that received it. Carried in message-annotations under ``ORIGIN_KEY``."""

    container_id: str
    link_name: str
    tag: bytes
    incarnation: str
    ingress_router: str


class Prepared(NamedTuple):
    """``prepare``'s answer. ``payload`` is the message to forward (the input
    itself when it already carried an origin). ``ttl_ms`` is header.ttl (ms) and
    ``absolute_expiry_ms`` properties.absolute-expiry-time (ms since the epoch),
    each None when absent and exactly as encoded otherwise (a ttl of 0 is 0).
    ``origin`` is the message's own origin if it had one, else the given one."""

    payload: bytes
    ttl_ms: int | None
    absolute_expiry_ms: int | None
    origin: Origin


# Constructor -> bytes after the constructor (>= 0), or how the value is sized.
_VAR8 = -1  # one size byte, then that many bytes (vbin8 str8 sym8 list8 map8 array8)
_VAR32 = -2  # four size bytes, then that many bytes (the 32-bit forms)
_DESCRIBED = -3  # 0x00: a descriptor value, then the described value
_INVALID = -4


def _width_table() -> tuple:
    table = [_INVALID] * 256
    for codes, width in (
        ((0x40, 0x41, 0x42, 0x43, 0x44, 0x45), 0),  # null true false uint0 ulong0 list0
        ((0x50, 0x51, 0x52, 0x53, 0x54, 0x55, 0x56), 1),
        ((0x60, 0x61), 2),
        ((0x70, 0x71, 0x72, 0x73, 0x74), 4),
        ((0x80, 0x81, 0x82, 0x83, 0x84), 8),
        ((0x94, 0x98), 16),  # decimal128, uuid
        ((0xA0, 0xA1, 0xA3, 0xC0, 0xC1, 0xE0), _VAR8),
        ((0xB0, 0xB1, 0xB3, 0xD0, 0xD1, 0xF0), _VAR32),
        ((0x00,), _DESCRIBED),
    ):
        for code in codes:
            table[code] = width
    return tuple(table)


_WIDTH = _width_table()
# unpack_from is ~3x cheaper than int.from_bytes on a slice. It raises struct.error
# where a read runs off the end (and indexing raises IndexError): the public
# functions report both as truncation.
_u32 = Struct(">I").unpack_from
_u64 = Struct(">Q").unpack_from
_i64 = Struct(">q").unpack_from
_TRUNCATED = (IndexError, _StructError)
_MAX_DEPTH = 64  # nesting of lists/maps/arrays checked in annotations; deeper is refused

# Header fields (AMQP 1.0 part 3, 3.2.1) and the constructors each may use.
_BOOLEAN = frozenset((0x40, 0x41, 0x42, 0x56))
_HEADER_FIELDS = (
    _BOOLEAN,  # durable
    frozenset((0x40, 0x50)),  # priority: ubyte
    frozenset((0x40, 0x43, 0x52, 0x70)),  # ttl: uint milliseconds
    _BOOLEAN,  # first-acquirer
    frozenset((0x40, 0x43, 0x52, 0x70)),  # delivery-count: uint
)


def _skip(p: bytes, i: int, n: int, count: int = 1) -> int:
    """Offset just past the ``count`` values starting at ``i``, each skipped by
    its own size (not looked into); they must end by ``n``. Iterative, and every
    step consumes a byte: hostile input can neither exhaust the stack nor loop
    for longer than it is long. IndexError/struct.error when the payload ends
    mid-value (the public functions report truncation)."""
    start = i
    width = _WIDTH
    while count:
        c = p[i]
        w = width[c]
        if w >= 0:
            i += 1 + w
        elif w == _VAR8:
            i += 2 + p[i + 1]
        elif w == _VAR32:
            i += 5 + _u32(p, i + 1)[0]
        elif w == _DESCRIBED:
            i += 1
            count += 1  # one value became two: the descriptor, then the described value
            continue
        else:
            raise MessageError(f"invalid type constructor 0x{c:02x}", i)
        count -= 1
    if i > n:
        raise MessageError(f"value runs past the end of its container, which ends at offset {n}", start)
    return i


def _check(p: bytes, i: int, n: int, count: int, depth: int) -> int:
    """Like ``_skip``, but looks into every list, map and array (and described
    value) and requires each to be exactly as long as its size says, so that a
    count-trusting decoder ends where we do. Nesting is bounded by _MAX_DEPTH."""
    if depth > _MAX_DEPTH:
        raise MessageError(f"values nested deeper than {_MAX_DEPTH} levels", i)
    start = i
    width = _WIDTH
    while count:
        c = p[i]
        w = width[c]
        if w >= 0:
            i += 1 + w
        elif c >= 0xC0 and w != _INVALID:  # list, map or array: look inside
            first, items, end = _bounds(p, i, n, c)
            if c >= 0xE0:
                first = _check_array(p, first, end, items, depth + 1)
            else:
                if items & 1 and c & 1:
                    raise MessageError(f"map with an odd element count {items}", i)
                first = _check(p, first, end, items, depth + 1)
            if first != end:
                raise MessageError("list/map/array size does not match its elements", i)
            i = end
        elif w == _VAR8:
            i += 2 + p[i + 1]
        elif w == _VAR32:
            i += 5 + _u32(p, i + 1)[0]
        elif w == _DESCRIBED:
            i += 1
            count += 1
            continue
        else:
            raise MessageError(f"invalid type constructor 0x{c:02x}", i)
        count -= 1
    if i > n:
        raise MessageError(f"value runs past the end of its container, which ends at offset {n}", start)
    return i


def _bounds(p: bytes, i: int, n: int, c: int):
    """(first element offset, element count, end offset) of the list/map/array
    with constructor ``c`` at ``i``; checks the size against ``n``."""
    if c & 0x10:  # the 32-bit forms: 0xd0 0xd1 0xf0
        size = _u32(p, i + 1)[0]
        if size < 4:
            raise MessageError(f"size {size} too small for a count", i)
        end = i + 5 + size
        count = _u32(p, i + 5)[0]
        first = i + 9
    else:
        size = p[i + 1]
        if size < 1:
            raise MessageError("size 0 too small for a count", i)
        end = i + 2 + size
        count = p[i + 2]
        first = i + 3
    if end > n:
        raise MessageError(f"size runs past the end of its container ({end} > {n})", i)
    if c < 0xE0 and count > end - first:  # list/map elements take a byte at least
        raise MessageError(f"{count} elements cannot fit in {end - first} bytes", i)
    return first, count, end


def _check_array(p: bytes, i: int, end: int, count: int, depth: int) -> int:
    """Check ``count`` array elements at ``i`` (the element constructor first)."""
    if depth > _MAX_DEPTH:
        raise MessageError(f"values nested deeper than {_MAX_DEPTH} levels", i)
    c = p[i]
    i += 1
    if c == 0x00:  # described elements: the descriptor, then the real constructor
        i = _check(p, i, end, 1, depth)
        c = p[i]
        i += 1
    w = _WIDTH[c]
    if w >= 0:
        return i + count * w
    if w == _INVALID or w == _DESCRIBED:
        raise MessageError(f"invalid array element constructor 0x{c:02x}", i - 1)
    if count > end - i:
        raise MessageError(f"{count} array elements cannot fit in {end - i} bytes", i)
    for _ in range(count):
        if c < 0xC0:  # binary, string, symbol
            i += 1 + p[i] if w == _VAR8 else 4 + _u32(p, i)[0]
            continue
        # a list, map or array without its constructor byte: size, count, contents
        if w == _VAR8:
            e = i + 1 + p[i]
            items = p[i + 1]
            first = i + 2
        else:
            e = i + 4 + _u32(p, i)[0]
            items = _u32(p, i + 4)[0]
            first = i + 8
        if e > end or first > e:
            raise MessageError("array element runs past the end of its array", i)
        if c >= 0xE0:
            first = _check_array(p, first, e, items, depth + 1)
        else:
            if items & 1 and c & 1:
                raise MessageError(f"map with an odd element count {items}", i)
            first = _check(p, first, e, items, depth + 1)
        if first != e:
            raise MessageError("array element size does not match its contents", i)
        i = e
    return i


def _annotations(p: bytes, i: int, n: int, name: str):
    """Check the annotations map at ``i`` (keys symbol or ulong, values checked to
    the byte); return (first entry offset, end, count, offset of the ORIGIN_KEY
    entry's value or -1)."""
    c = p[i]
    if c != 0xC1 and c != 0xD1:
        raise MessageError(f"{name}: expected a map, found constructor 0x{c:02x}", i)
    j, count, end = _bounds(p, i, n, c)
    if count & 1:
        raise MessageError(f"{name}: odd element count {count}", i)
    first = j
    found = -1
    for _ in range(count >> 1):
        t = p[j]
        if t == 0xA3:
            key_end = j + 2 + p[j + 1]
            if p[j + 2:key_end] == _ORIGIN_KEY_BYTES:
                found = key_end
        elif t == 0xB3:
            key_end = j + 5 + _u32(p, j + 1)[0]
            if p[j + 5:key_end] == _ORIGIN_KEY_BYTES:
                found = key_end
        elif t == 0x53:
            key_end = j + 2
        elif t == 0x80:
            key_end = j + 9
        elif t == 0x44:
            key_end = j + 1
        else:
            raise MessageError(f"{name}: key must be a symbol or a ulong, found constructor 0x{t:02x}", j)
        if key_end >= end:
            raise MessageError(f"{name}: entry runs past the end of the map", j)
        j = _check(p, key_end, end, 1, 1)
    if j != end:
        raise MessageError(f"{name}: map size does not match its {count} elements", i)
    return first, end, count, found


def _within(exc: MessageError, where: str) -> MessageError:
    return MessageError(f"{exc.what} (in the {where})", exc.offset)


def _utf8(p: bytes, i: int, n: int, what: str):
    c = p[i]
    if c == 0xA1:
        start = i + 2
        end = start + p[i + 1]
    elif c == 0xB1:
        start = i + 5
        end = start + _u32(p, i + 1)[0]
    else:
        raise MessageError(f"{what}: expected a string, found constructor 0x{c:02x}", i)
    if end > n:
        raise MessageError(f"{what}: string runs past the end of its list", i)
    try:
        return p[start:end].decode("utf-8"), end
    except UnicodeDecodeError as exc:
        raise MessageError(f"{what}: invalid UTF-8 ({exc.reason})", start + exc.start) from None


def _origin_at(p: bytes, i: int, n: int) -> Origin:
    """Decode the origin annotation's value (a list) at ``i``."""
    what = f"message-annotations {ORIGIN_KEY}"
    c = p[i]
    if c != 0xC0 and c != 0xD0:
        raise MessageError(f"{what}: expected a list of 5 fields, found constructor 0x{c:02x}", i)
    j, count, end = _bounds(p, i, n, c)
    if count < 5:
        raise MessageError(f"{what}: {count} fields, expected 5", i)
    container_id, j = _utf8(p, j, end, what + " container-id")
    link_name, j = _utf8(p, j, end, what + " link-name")
    c = p[j]
    if c == 0xA0:
        start = j + 2
        j = start + p[j + 1]
    elif c == 0xB0:
        start = j + 5
        j = start + _u32(p, j + 1)[0]
    else:
        raise MessageError(f"{what} tag: expected binary, found constructor 0x{c:02x}", j)
    if j > end:
        raise MessageError(f"{what} tag: runs past the end of its list", start)
    tag = p[start:j]
    incarnation, j = _utf8(p, j, end, what + " incarnation")
    ingress_router, j = _utf8(p, j, end, what + " ingress-router")
    j = _skip(p, j, end, count - 5)  # fields a later version may add
    if j != end:
        raise MessageError(f"{what}: list size does not match its contents", i)
    return Origin(container_id, link_name, tag, incarnation, ingress_router)


_ORIGIN_KEY_BYTES = ORIGIN_KEY.encode("ascii")


def _allowed_after() -> tuple:
    """_AFTER[code]: the section codes that may follow section ``code`` (0: the
    start). AMQP 1.0 part 3 section 3.2: each section at most once and in order,
    except that the body is one or more data, one or more amqp-sequence, or one
    amqp-value section."""
    after = [frozenset()] * (FOOTER + 1)
    after[0] = frozenset(range(HEADER, FOOTER + 1))
    for code in range(HEADER, DATA):
        after[code] = frozenset(range(code + 1, FOOTER + 1))
    for code in (DATA, AMQP_SEQUENCE):
        after[code] = frozenset((code, FOOTER))
    after[AMQP_VALUE] = frozenset((FOOTER,))
    return tuple(after)


_AFTER = _allowed_after()
_EMPTY_HEADER = b"\x00\x53\x70\x45"  # header section: described by smallulong 0x70, an empty list
_EMPTY_PROPERTIES = b"\x00\x53\x73\x45"  # properties section, an empty list
_DATA = b"\x00\x53\x75"  # a data section's descriptor


def _order_error(code: int, last: int, start: int) -> MessageError:
    if not HEADER <= code <= FOOTER:
        return MessageError(f"unknown section descriptor 0x{code:x}", start + 1)
    if DATA <= last < code <= AMQP_VALUE:
        return MessageError(f"body mixes {SECTION_NAMES[last]} and {SECTION_NAMES[code]} sections", start)
    return MessageError(f"{SECTION_NAMES[code]} section out of order or repeated (after {SECTION_NAMES[last]})",
                        start)


def _scan(p: bytes):
    """Check the sections of ``p``; return (ttl, expiry, ma, insert_at) where
    ``ma`` is None or (map offset, first entry offset, map end, entry count,
    origin value offset or -1) and ``insert_at`` is where a new
    message-annotations section belongs."""
    n = len(p)
    if not n:
        raise MessageError("empty message: no sections", 0)
    # Fast path for what proton clients send for a message with only a binary body:
    # an empty header and/or empty properties (list0), then one data section that
    # ends the message. The general loop below reaches the same answer (no ttl, no
    # expiry, no annotations) in ~290 bytecodes instead of ~40.
    i = 4 if p.startswith(_EMPTY_HEADER) else 0
    j = i + 4 if p.startswith(_EMPTY_PROPERTIES, i) else i
    if p.startswith(_DATA, j) and n > j + 4:
        v = p[j + 3]
        if (v == 0xA0 and j + 5 + p[j + 4] == n) or (v == 0xB0 and n > j + 8 and j + 8 + _u32(p, j + 4)[0] == n):
            return None, None, None, i
    i = start = last = current = 0
    after = _AFTER
    ttl = expiry = ma = None
    insert_at = -1
    try:
        while i < n:
            start = i
            current = 0  # set once the section's descriptor and place are known
            if p[i]:
                raise MessageError(f"expected a section (a described value, 0x00), found 0x{p[i]:02x}", i)
            c = p[i + 1]
            if c == 0x53:  # smallulong: the usual encoding
                code = p[i + 2]
                i += 3
            elif c == 0xA3 or c == 0xB3:  # symbolic descriptor "amqp:...:..."
                if c == 0xA3:
                    i += 3 + p[i + 2]
                    sym = p[start + 3:i]
                else:
                    i += 6 + _u32(p, i + 2)[0]
                    sym = p[start + 6:i]
                if i > n:
                    raise MessageError("section descriptor runs past the end of the message", start + 1)
                code = _SYMBOLS.get(sym)
                if code is None:
                    raise MessageError(f"unknown section descriptor {sym!r}", start + 1)
            elif c == 0x80:
                code = _u64(p, i + 2)[0]
                i += 10
            elif c == 0x44:
                code = 0
                i += 2
            else:
                raise MessageError(f"section descriptor must be a ulong or a symbol, found constructor 0x{c:02x}",
                                   start + 1)
            if code not in after[last]:
                raise _order_error(code, last, start)
            if code >= PROPERTIES and insert_at < 0:
                insert_at = start
            last = current = code
            v = p[i]  # the section's value constructor (IndexError if the payload stops here)

            if code == AMQP_VALUE:
                i = _skip(p, i, n)
            elif code == DATA:  # _skip inlined for the binary: the body of most messages
                if v == 0xA0:
                    j = i + 2 + p[i + 1]
                elif v == 0xB0:
                    j = i + 5 + _u32(p, i + 1)[0]
                else:
                    raise MessageError(f"data section: expected binary, found constructor 0x{v:02x}", i)
                if j > n:
                    raise MessageError(f"value runs past the end of its container, which ends at offset {n}", i)
                i = j
            elif v == 0x40 and code != AMQP_SEQUENCE:  # null: an empty header/annotations/properties
                if code == MESSAGE_ANNOTATIONS:
                    ma = (i, i + 1, i + 1, 0, -1)
                i += 1
            elif code == PROPERTIES:
                if v == 0x45:
                    i += 1
                    continue
                if v == 0xC0 and p[i + 1]:  # list8, the usual encoding (_bounds inlined)
                    end = i + 2 + p[i + 1]
                    count = p[i + 2]
                    j = i + 3
                    if end > n:
                        raise MessageError("properties: list runs past the end of the message", i)
                elif v == 0xC0 or v == 0xD0:
                    j, count, end = _bounds(p, i, n, v)
                else:
                    raise MessageError(f"properties: expected a list, found constructor 0x{v:02x}", i)
                if count > 8:
                    j = _skip(p, j, end, 8)
                    t = p[j]  # absolute-expiry-time: timestamp (ms since the epoch)
                    if t == 0x83:
                        expiry = _i64(p, j + 1)[0]
                        j += 9
                    elif t == 0x40:
                        j += 1
                    else:
                        raise MessageError("properties absolute-expiry-time: expected a timestamp, "
                                           f"found constructor 0x{t:02x}", j)
                    count -= 9
                j = _skip(p, j, end, count)
                if j != end:
                    raise MessageError("properties: list size does not match its fields", i)
                i = end
            elif code == HEADER:
                if v == 0x45:
                    i += 1
                    continue
                if v == 0xC0 and p[i + 1]:  # list8, the usual encoding (_bounds inlined)
                    end = i + 2 + p[i + 1]
                    count = p[i + 2]
                    j = i + 3
                    if end > n:
                        raise MessageError("header: list runs past the end of the message", i)
                elif v == 0xC0 or v == 0xD0:
                    j, count, end = _bounds(p, i, n, v)
                else:
                    raise MessageError(f"header: expected a list, found constructor 0x{v:02x}", i)
                if count > 5:
                    raise MessageError(f"header: {count} fields, at most 5 defined", i)
                for k in range(count):
                    t = p[j]
                    if t not in _HEADER_FIELDS[k]:
                        raise MessageError(f"header field {k}: unexpected constructor 0x{t:02x}", j)
                    if k == 2 and t != 0x40:  # ttl
                        ttl = _u32(p, j + 1)[0] if t == 0x70 else (p[j + 1] if t == 0x52 else 0)
                    j += 1 + _WIDTH[t]
                if j != end:
                    raise MessageError("header: list size does not match its fields", i)
                i = end
            elif code == MESSAGE_ANNOTATIONS:
                first, end, count, found = _annotations(p, i, n, "message-annotations")
                ma = (i, first, end, count, found)
                i = end
            elif code == DELIVERY_ANNOTATIONS:
                i = _annotations(p, i, n, "delivery-annotations")[1]
            else:  # application-properties, footer: maps; amqp-sequence: a list. Skipped by size.
                name = SECTION_NAMES[code]
                if code == AMQP_SEQUENCE:
                    if v == 0x45:
                        i += 1
                        continue
                    if v != 0xC0 and v != 0xD0:
                        raise MessageError(f"{name} section: expected a list, found constructor 0x{v:02x}", i)
                elif v != 0xC1 and v != 0xD1:
                    raise MessageError(f"{name}: expected a map, found constructor 0x{v:02x}", i)
                count, end = _bounds(p, i, n, v)[1:]
                if count & 1 and v & 1:
                    raise MessageError(f"{name}: odd element count {count}", i)
                i = end
    except _TRUNCATED:
        raise MessageError(f"message truncated inside the section starting at offset {start}", n) from None
    except MessageError as exc:
        name = SECTION_NAMES[current]
        if not current or exc.what.startswith(name):
            raise
        raise _within(exc, f"{name} section at offset {start}") from None
    if i != n:  # not reachable: every step above checks its end against n
        raise MessageError("section runs past the end of the message", start)
    return ttl, expiry, ma, (insert_at if insert_at >= 0 else n)


@lru_cache(maxsize=4096)
def _str(s: str) -> bytes:
    b = s.encode("utf-8")
    size = len(b)
    return (b"\xa1" + size.to_bytes(1, "big") if size < 256 else b"\xb1" + size.to_bytes(4, "big")) + b


_ENTRY_KEY = b"\xa3" + len(_ORIGIN_KEY_BYTES).to_bytes(1, "big") + _ORIGIN_KEY_BYTES


def _origin_entry(origin: Origin) -> bytes:
    """The encoded map entry: symbol ORIGIN_KEY, then list [str, str, binary, str, str]."""
    template = OriginTemplate(origin.container_id, origin.link_name, origin.incarnation, origin.ingress_router)
    return template.entry(origin.tag)


def _map_header(entries_size: int, count: int) -> bytes:
    """map8 when size and count fit a byte, else map32."""
    if entries_size < 255 and count < 256:
        return bytes((0xC1, entries_size + 1, count))
    return b"\xd1" + (entries_size + 4).to_bytes(4, "big") + count.to_bytes(4, "big")


_NEW_SECTION = b"\x00\x53\x72"  # described by smallulong 0x72: message-annotations
_COPY_THRESHOLD = 16384  # bytes; below it, plain slices (copies) are cheaper than a memoryview


class OriginTemplate:
    """The origin annotation of one publisher link incarnation, encoded once.

    Only the delivery tag differs between the origins of one link's deliveries, so
    the entry is cached in two pieces around the tag, per tag length: everything
    before the tag's bytes (the key, the list header, container-id, link name, the
    tag's binary header) and everything after (incarnation, ingress router). The
    router keeps one per publisher link; ``prepare`` builds one per call."""

    __slots__ = ("_head", "tail", "_entry_heads", "_section_heads")

    def __init__(self, container_id: str, link_name: str, incarnation: str, ingress_router: str):
        self._head = _str(container_id) + _str(link_name)
        self.tail = _str(incarnation) + _str(ingress_router)
        self._entry_heads: dict[int, bytes] = {}  # tag length -> the entry up to the tag's bytes
        self._section_heads: dict[int, bytes] = {}  # the same behind a new section's map header

    def entry_head(self, size: int) -> bytes:
        head = self._entry_heads.get(size)
        if head is None:
            tag_header = b"\xa0" + size.to_bytes(1, "big") if size < 256 else b"\xb0" + size.to_bytes(4, "big")
            fields = len(self._head) + len(tag_header) + size + len(self.tail)
            if fields < 255:
                list_header = b"\xc0" + (fields + 1).to_bytes(1, "big") + b"\x05"
            else:
                list_header = b"\xd0" + (fields + 4).to_bytes(4, "big") + b"\x00\x00\x00\x05"
            head = self._entry_heads[size] = b"".join((_ENTRY_KEY, list_header, self._head, tag_header))
        return head

    def section_head(self, size: int) -> bytes:
        """A new message-annotations section holding only our entry, up to the tag's bytes."""
        head = self._section_heads.get(size)
        if head is None:
            entry_head = self.entry_head(size)
            head = self._section_heads[size] = b"".join(
                (_NEW_SECTION, _map_header(len(entry_head) + size + len(self.tail), 2), entry_head))
        return head

    def entry(self, tag: bytes) -> bytes:
        """The encoded map entry: symbol ORIGIN_KEY, then list [str, str, binary, str, str]."""
        return b"".join((self.entry_head(len(tag)), tag, self.tail))


def prepare(payload: bytes, origin: Origin) -> Prepared:
    """Check ``payload`` (an encoded message: its sections back to back), read
    its ttl and absolute expiry, and make sure it carries an origin annotation:
    the message's own if present (payload returned unchanged), else ``origin``
    spliced in. Raises MessageError if the message is malformed. Accepts any
    bytes-like payload (non-bytes are copied once)."""
    p = payload if type(payload) is bytes else bytes(payload)
    template = OriginTemplate(origin.container_id, origin.link_name, origin.incarnation, origin.ingress_router)
    spliced = splice_origin(p, template, origin.tag)
    if spliced is None:
        ttl, expiry, ma, _ = _scan(p)
        return Prepared(p, ttl, expiry, _read_origin_at(p, ma[4], ma[2]))
    return Prepared(spliced[0], spliced[1], spliced[2], origin)


def splice_origin(payload: bytes, template: OriginTemplate, tag: bytes):
    """``prepare`` for the router's hot path: check ``payload`` and splice in the
    origin of ``template`` with delivery tag ``tag``. Returns ``(payload, ttl_ms,
    absolute_expiry_ms)``, or None when the message already carries an origin
    annotation (a router's, or a forgery). Raises MessageError if malformed."""
    p = payload if type(payload) is bytes else bytes(payload)
    ttl, expiry, ma, insert_at = _scan(p)
    size = len(tag)
    if ma is None:
        head = template._section_heads.get(size)
        if head is None:
            head = template.section_head(size)
        if len(p) < _COPY_THRESHOLD:
            return b"".join((p[:insert_at], head, tag, template.tail, p[insert_at:])), ttl, expiry
        # Slices of a memoryview are not copies: a large payload is copied once, by join.
        src = memoryview(p)
        return b"".join((src[:insert_at], head, tag, template.tail, src[insert_at:])), ttl, expiry
    if ma[4] >= 0:
        return None
    # Keep the existing entries as they are, append ours, rewrite the map's header.
    entry = template.entry(tag)
    src = p if len(p) < _COPY_THRESHOLD else memoryview(p)
    at, first, end, count = ma[:4]
    out = b"".join((src[:at], _map_header(end - first + len(entry), count + 2), src[first:end], entry, src[end:]))
    return out, ttl, expiry


def read_origin(payload: bytes) -> Origin | None:
    """The origin annotation the message carries, or None. Checks the message
    like ``prepare`` (MessageError if malformed)."""
    p = payload if type(payload) is bytes else bytes(payload)
    ma = _scan(p)[2]
    if ma is None or ma[4] < 0:
        return None
    return _read_origin_at(p, ma[4], ma[2])


def _read_origin_at(p: bytes, i: int, end: int) -> Origin:
    try:
        return _origin_at(p, i, end)
    except _TRUNCATED:  # not reachable: the value was checked inside the map already
        raise MessageError("origin annotation truncated", i) from None
    except MessageError as exc:
        if exc.what.startswith("message-annotations"):
            raise
        raise _within(exc, f"message-annotations {ORIGIN_KEY} value") from None
