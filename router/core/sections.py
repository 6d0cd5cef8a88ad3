"""The sections of an encoded AMQP 1.0 message, checked and located without decoding them.

A transfer carries a message as a run of *sections*, each an AMQP described value
(``0x00``, a descriptor, a value)::

    [header 0x70] [delivery-annotations 0x71] [message-annotations 0x72]
    [properties 0x73] [application-properties 0x74]
    [data 0x75 ... | amqp-sequence 0x76 ... | amqp-value 0x77] [footer 0x78]

``_scan`` walks them once and tells router/core/message.py, which reads and splices
the origin annotation, what it needs: ``header.ttl`` (field 2),
``properties.absolute-expiry-time`` (field 8), where the message-annotations map is
(and the origin entry in it, ``ORIGIN_KEY``), and where a new message-annotations
section belongs. The sections other than the body are read by a table of readers,
one per section code (``_READERS``).

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
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from router.core.amqp_values import (
    _TRUNCATED,
    _WIDTH,
    MessageError,
    _bounds,
    _check,
    _i64,
    _skip,
    _u32,
    _u64,
    _within,
)

# The one annotation the router looks for and adds (router/core/message.py): the scan
# finds its entry, so that a message carrying it is never given a second one.
ORIGIN_KEY = "x-opt-eorouter-origin"
_ORIGIN_KEY_BYTES = ORIGIN_KEY.encode("ascii")

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


# Header fields (AMQP 1.0 part 3, 3.2.1) and the constructors each may use.
_BOOLEAN = frozenset((0x40, 0x41, 0x42, 0x56))
_HEADER_FIELDS = (
    _BOOLEAN,  # durable
    frozenset((0x40, 0x50)),  # priority: ubyte
    frozenset((0x40, 0x43, 0x52, 0x70)),  # ttl: uint milliseconds
    _BOOLEAN,  # first-acquirer
    frozenset((0x40, 0x43, 0x52, 0x70)),  # delivery-count: uint
)


def _annotations(p: bytes, i: int, n: int, name: str) -> tuple[int, int, int, int]:
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
            if p[j + 2 : key_end] == _ORIGIN_KEY_BYTES:
                found = key_end
        elif t == 0xB3:
            key_end = j + 5 + _u32(p, j + 1)[0]
            if p[j + 5 : key_end] == _ORIGIN_KEY_BYTES:
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


def _allowed_after() -> tuple[frozenset[int], ...]:
    """_AFTER[code]: the section codes that may follow section ``code`` (0: the
    start). AMQP 1.0 part 3 section 3.2: each section at most once and in order,
    except that the body is one or more data, one or more amqp-sequence, or one
    amqp-value section."""
    after: list[frozenset[int]] = [frozenset()] * (FOOTER + 1)
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
    return MessageError(f"{SECTION_NAMES[code]} section out of order or repeated (after {SECTION_NAMES[last]})", start)


def _descriptor(p: bytes, i: int, n: int) -> tuple[int, int]:
    """The section code of the described value at ``i`` and where its value starts."""
    if p[i]:
        raise MessageError(f"expected a section (a described value, 0x00), found 0x{p[i]:02x}", i)
    c = p[i + 1]
    if c == 0x53:  # smallulong: the usual encoding
        return p[i + 2], i + 3
    if c == 0xA3 or c == 0xB3:  # symbolic descriptor "amqp:...:..."
        if c == 0xA3:
            end = i + 3 + p[i + 2]
            sym = p[i + 3 : end]
        else:
            end = i + 6 + _u32(p, i + 2)[0]
            sym = p[i + 6 : end]
        if end > n:
            raise MessageError("section descriptor runs past the end of the message", i + 1)
        code = _SYMBOLS.get(sym)
        if code is None:
            raise MessageError(f"unknown section descriptor {sym!r}", i + 1)
        return code, end
    if c == 0x80:
        return _u64(p, i + 2)[0], i + 10
    if c == 0x44:
        return 0, i + 2
    raise MessageError(f"section descriptor must be a ulong or a symbol, found constructor 0x{c:02x}", i + 1)


def _list(p: bytes, i: int, n: int, v: int, name: str) -> tuple[int, int, int]:
    """(first field, field count, end) of the list at ``i`` (constructor ``v``)."""
    if v == 0xC0 and p[i + 1]:  # list8, the usual encoding (_bounds inlined)
        end = i + 2 + p[i + 1]
        if end > n:
            raise MessageError(f"{name}: list runs past the end of the message", i)
        return i + 3, p[i + 2], end
    if v == 0xC0 or v == 0xD0:
        return _bounds(p, i, n, v)
    raise MessageError(f"{name}: expected a list, found constructor 0x{v:02x}", i)


# (map offset, first entry offset, map end, entry count, origin value offset or -1)
_Annotations = tuple[int, int, int, int, int]
# The section readers: (p, value offset, message end, value constructor) -> (the
# section's end, what it tells: header the ttl, properties the absolute expiry,
# message-annotations (map offset, first entry, end, count, origin value offset)).
_Reader = Callable[[bytes, int, int, int], tuple[int, Any]]


def _read_header(p: bytes, i: int, n: int, v: int) -> tuple[int, int | None]:
    if v == 0x45:
        return i + 1, None
    j, count, end = _list(p, i, n, v, "header")
    if count > 5:
        raise MessageError(f"header: {count} fields, at most 5 defined", i)
    ttl = None
    for k in range(count):
        t = p[j]
        if t not in _HEADER_FIELDS[k]:
            raise MessageError(f"header field {k}: unexpected constructor 0x{t:02x}", j)
        if k == 2 and t != 0x40:  # ttl
            ttl = _u32(p, j + 1)[0] if t == 0x70 else (p[j + 1] if t == 0x52 else 0)
        j += 1 + _WIDTH[t]
    if j != end:
        raise MessageError("header: list size does not match its fields", i)
    return end, ttl


def _read_properties(p: bytes, i: int, n: int, v: int) -> tuple[int, int | None]:
    if v == 0x45:
        return i + 1, None
    j, count, end = _list(p, i, n, v, "properties")
    expiry = None
    if count > 8:
        j = _skip(p, j, end, 8)
        t = p[j]  # absolute-expiry-time: timestamp (ms since the epoch)
        if t == 0x83:
            expiry = _i64(p, j + 1)[0]
            j += 9
        elif t == 0x40:
            j += 1
        else:
            raise MessageError(f"properties absolute-expiry-time: expected a timestamp, found constructor 0x{t:02x}", j)
        count -= 9
    j = _skip(p, j, end, count)
    if j != end:
        raise MessageError("properties: list size does not match its fields", i)
    return end, expiry


def _read_message_annotations(p: bytes, i: int, n: int, v: int) -> tuple[int, _Annotations]:
    first, end, count, found = _annotations(p, i, n, "message-annotations")
    return end, (i, first, end, count, found)


def _read_delivery_annotations(p: bytes, i: int, n: int, v: int) -> tuple[int, None]:
    return _annotations(p, i, n, "delivery-annotations")[1], None


def _skipped(code: int) -> _Reader:
    """Application-properties and footer (maps) and amqp-sequence (a list): checked
    for their shape, skipped by size."""
    name = SECTION_NAMES[code]

    def read(p: bytes, i: int, n: int, v: int) -> tuple[int, None]:
        if code == AMQP_SEQUENCE:
            if v == 0x45:
                return i + 1, None
            if v != 0xC0 and v != 0xD0:
                raise MessageError(f"{name} section: expected a list, found constructor 0x{v:02x}", i)
        elif v != 0xC1 and v != 0xD1:
            raise MessageError(f"{name}: expected a map, found constructor 0x{v:02x}", i)
        count, end = _bounds(p, i, n, v)[1:]
        if count & 1 and v & 1:
            raise MessageError(f"{name}: odd element count {count}", i)
        return end, None

    return read


_READERS: dict[int, _Reader] = {
    HEADER: _read_header,
    PROPERTIES: _read_properties,
    MESSAGE_ANNOTATIONS: _read_message_annotations,
    DELIVERY_ANNOTATIONS: _read_delivery_annotations,
    APPLICATION_PROPERTIES: _skipped(APPLICATION_PROPERTIES),
    FOOTER: _skipped(FOOTER),
    AMQP_SEQUENCE: _skipped(AMQP_SEQUENCE),
}


def _scan(p: bytes) -> tuple[int | None, int | None, _Annotations | None, int]:
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
            if p[i] == 0 and p[i + 1] == 0x53:  # _descriptor inlined for the usual smallulong
                code = p[i + 2]
                i += 3
            else:
                code, i = _descriptor(p, i, n)
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
            elif (
                v == 0x45 and code <= PROPERTIES and code != MESSAGE_ANNOTATIONS and code != DELIVERY_ANNOTATIONS
            ):  # an empty header or properties (list0): what proton sends
                i += 1
            else:
                i, told = _READERS[code](p, i, n, v)
                if told is not None:
                    if code == HEADER:
                        ttl = told
                    elif code == PROPERTIES:
                        expiry = told
                    else:
                        ma = told
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
