"""AMQP 1.0 encoded values, read in place: how long each one is, and whether it is
well formed (part 1 of the spec: types and their constructors). What message.py
builds its section scan on; nothing here knows about messages."""

from __future__ import annotations

from struct import Struct
from struct import error as _StructError

DECODE_ERROR = "amqp:decode-error"


class MessageError(ValueError):
    """The encoded message is malformed. The router rejects such a delivery with
    the AMQP error condition ``condition`` (amqp:decode-error) and ``str(error)``
    as its description. ``offset`` is the byte offset of the problem."""

    condition = DECODE_ERROR

    def __init__(self, what: str, offset: int | None = None):
        self.what = what
        self.offset = offset
        super().__init__(what if offset is None else f"{what} (at byte offset {offset})")


# Constructor -> bytes after the constructor (>= 0), or how the value is sized.
_VAR8 = -1  # one size byte, then that many bytes (vbin8 str8 sym8 list8 map8 array8)
_VAR32 = -2  # four size bytes, then that many bytes (the 32-bit forms)
_DESCRIBED = -3  # 0x00: a descriptor value, then the described value
_INVALID = -4


def _width_table() -> tuple[int, ...]:
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


def _bounds(p: bytes, i: int, n: int, c: int) -> tuple[int, int, int]:
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


def _within(exc: MessageError, where: str) -> MessageError:
    return MessageError(f"{exc.what} (in the {where})", exc.offset)


def _utf8(p: bytes, i: int, n: int, what: str) -> tuple[str, int]:
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
