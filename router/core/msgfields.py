"""What a selector sees of a message: its header fields and properties under their
JMS names, and its application properties, decoded from the encoded message
(docs/selectors.md, "Names"). Only the header, properties and
application-properties sections are decoded, and only their simple values; the
body is never read.

JMS names: ``JMSDeliveryMode`` ('PERSISTENT' when header.durable, else
'NON_PERSISTENT'), ``JMSPriority`` (header.priority, default 4), ``JMSMessageID``
(properties.message-id), ``JMSCorrelationID`` (correlation-id), ``JMSType``
(subject), ``JMSTimestamp`` (creation-time, ms), ``JMSExpiration``
(absolute-expiry-time, ms; 0 when none), ``JMSXUserID`` (user-id, as UTF-8),
``JMSXGroupID`` (group-id), ``JMSXGroupSeq`` (group-sequence). Application
properties keep their own names; a JMS name wins over an application property of
the same name. Values a selector cannot compare (binary, lists, maps, arrays,
decimals) are null. Pure: no proton. A malformed section ends the decoding: what
was read so far stands, the rest is null (the message itself was checked at its
origin, message.py).
"""

from __future__ import annotations

import os
import struct
import uuid
from collections.abc import Callable
from typing import Any

_HEADER, _DELIVERY_ANN, _MESSAGE_ANN, _PROPERTIES, _APP_PROPERTIES = 0x70, 0x71, 0x72, 0x73, 0x74

_FIXED: dict[int, tuple[int, Callable[[bytes], Any]]] = {
    0x50: (1, lambda b: b[0]),
    0x51: (1, lambda b: struct.unpack(">b", b)[0]),
    0x52: (1, lambda b: b[0]),
    0x53: (1, lambda b: b[0]),
    0x54: (1, lambda b: struct.unpack(">b", b)[0]),
    0x55: (1, lambda b: struct.unpack(">b", b)[0]),
    0x56: (1, lambda b: b[0] != 0),
    0x60: (2, lambda b: struct.unpack(">H", b)[0]),
    0x61: (2, lambda b: struct.unpack(">h", b)[0]),
    0x70: (4, lambda b: struct.unpack(">I", b)[0]),
    0x71: (4, lambda b: struct.unpack(">i", b)[0]),
    0x72: (4, lambda b: struct.unpack(">f", b)[0]),
    0x73: (4, lambda b: chr(struct.unpack(">I", b)[0]) if struct.unpack(">I", b)[0] < 0x110000 else None),
    0x74: (4, lambda b: None),  # decimal32
    0x80: (8, lambda b: struct.unpack(">Q", b)[0]),
    0x81: (8, lambda b: struct.unpack(">q", b)[0]),
    0x82: (8, lambda b: struct.unpack(">d", b)[0]),
    0x83: (8, lambda b: struct.unpack(">q", b)[0]),  # timestamp: ms since the epoch
    0x84: (8, lambda b: None),  # decimal64
    0x94: (16, lambda b: None),  # decimal128
    0x98: (16, lambda b: str(uuid.UUID(bytes=bytes(b)))),
}
_EMPTY: dict[int, Any] = {0x40: None, 0x41: True, 0x42: False, 0x43: 0, 0x44: 0, 0x45: []}


class _Malformed(Exception):
    pass


def _value(p: bytes, i: int) -> tuple[Any, int]:
    """The value at ``p[i]`` (simple ones decoded; compound ones as a list of their
    elements for a list or map, null for an array) and where the next one starts."""
    if i >= len(p):
        raise _Malformed
    code = p[i]
    i += 1
    if code == 0x00:  # described: skip the descriptor, keep the value
        _, i = _value(p, i)
        return _value(p, i)
    if code in _EMPTY:
        return _EMPTY[code], i
    fixed = _FIXED.get(code)
    if fixed is not None:
        width, read = fixed
        if i + width > len(p):
            raise _Malformed
        return read(p[i : i + width]), i + width
    if code in (0xA0, 0xA1, 0xA3, 0xB0, 0xB1, 0xB3):
        wide = code >= 0xB0
        if i + (4 if wide else 1) > len(p):
            raise _Malformed
        size = struct.unpack(">I", p[i : i + 4])[0] if wide else p[i]
        i += 4 if wide else 1
        if i + size > len(p):
            raise _Malformed
        raw = p[i : i + size]
        if code in (0xA0, 0xB0):
            return bytes(raw), i + size
        return bytes(raw).decode("utf-8", "replace"), i + size
    if code in (0xC0, 0xC1, 0xD0, 0xD1):
        wide = code >= 0xD0
        head = 8 if wide else 2
        if i + head > len(p):
            raise _Malformed
        size, count = struct.unpack(">II", p[i : i + 8]) if wide else (p[i], p[i + 1])
        start = i + (4 if wide else 1)
        end = start + size
        if end > len(p):
            raise _Malformed
        j = i + head
        items: list[Any] = []
        for _ in range(count):
            item, j = _value(p, j)
            if j > end:
                raise _Malformed
            items.append(item)
        return items, end
    if code in (0xE0, 0xF0):
        wide = code == 0xF0
        if i + (4 if wide else 1) > len(p):
            raise _Malformed
        size = struct.unpack(">I", p[i : i + 4])[0] if wide else p[i]
        end = i + (4 if wide else 1) + size
        if end > len(p):
            raise _Malformed
        return None, end
    raise _Malformed


def _simple(v: Any) -> Any:
    """A value a selector can compare, else None."""
    if v is None or isinstance(v, (bool, int, float, str)):
        return v
    return None


def _field(fields: list[Any], n: int) -> Any:
    return fields[n] if n < len(fields) else None


#: The names selector_env gives the header and properties (the rest are application properties).
JMS_NAMES = frozenset(
    {
        "JMSDeliveryMode",
        "JMSPriority",
        "JMSMessageID",
        "JMSCorrelationID",
        "JMSType",
        "JMSTimestamp",
        "JMSExpiration",
        "JMSXUserID",
        "JMSXGroupID",
        "JMSXGroupSeq",
    }
)


def _app_properties(p: bytes, i: int, env: dict[str, Any]) -> None:
    """The application-properties map at ``p[i]`` into ``env``: the usual keys and
    values read inline (once per message at a router with selectors), the rest by
    the general decoder."""
    code = p[i]
    if code == 0xC1:
        count, j, end = p[i + 2], i + 3, i + 2 + p[i + 1]
    elif code == 0xD1:
        count = int.from_bytes(p[i + 5 : i + 9], "big")
        j, end = i + 9, i + 5 + int.from_bytes(p[i + 1 : i + 5], "big")
    else:
        return  # null or not a map: no properties
    if end > len(p):
        raise _Malformed
    for _ in range(count // 2):
        k = p[j]
        if k == 0xA1 or k == 0xA3:
            size = p[j + 1]
            key: Any = p[j + 2 : j + 2 + size].decode("utf-8", "replace")
            j += 2 + size
        else:
            key, j = _value(p, j)
        v = p[j]
        if v == 0xA1:
            size = p[j + 1]
            value: Any = p[j + 2 : j + 2 + size].decode("utf-8", "replace")
            j += 2 + size
        elif v == 0x54 or v == 0x51:  # smallint, byte
            value = p[j + 1] - 256 if p[j + 1] > 127 else p[j + 1]
            j += 2
        elif v == 0x55:  # smalllong
            value = p[j + 1] - 256 if p[j + 1] > 127 else p[j + 1]
            j += 2
        elif v == 0x81:  # long
            value = int.from_bytes(p[j + 1 : j + 9], "big", signed=True)
            j += 9
        elif v == 0x71:  # int
            value = int.from_bytes(p[j + 1 : j + 5], "big", signed=True)
            j += 5
        elif v == 0x41 or v == 0x42:
            value = v == 0x41
            j += 1
        else:
            value, j = _value(p, j)
            value = _simple(value)
        if j > end:
            raise _Malformed
        if type(key) is str:
            env[key] = value


def _skip(p: bytes, i: int) -> int:
    """Where the value at ``p[i]`` ends, without decoding a compound one."""
    code = p[i]
    if code in (0xC0, 0xC1, 0xE0, 0xA0, 0xA1, 0xA3):
        if i + 2 > len(p):
            raise _Malformed
        return i + 2 + p[i + 1]
    if code in (0xD0, 0xD1, 0xF0, 0xB0, 0xB1, 0xB3):
        if i + 5 > len(p):
            raise _Malformed
        return i + 5 + int.from_bytes(p[i + 1 : i + 5], "big")
    end: int = _value(p, i)[1]
    return end


def selector_env(payload: bytes, headers: bool = True) -> dict[str, Any]:
    """The names a selector may use, with their values in this message (absent: null).
    ``headers`` False: the application properties only (no selector here reads a JMS name)."""
    env: dict[str, Any] = {}
    header: list[Any] = []
    props: list[Any] = []
    try:
        i = 0
        n = len(payload)
        while i + 2 < n and payload[i] == 0x00:
            if payload[i + 1] == 0x53:  # the usual descriptor: smallulong
                code, j = payload[i + 2], i + 3
            else:
                code, j = _value(payload, i + 1)
            if not isinstance(code, int) or code > _APP_PROPERTIES:
                break  # the body (or a footer): nothing more a selector reads
            if code == _APP_PROPERTIES:
                _app_properties(payload, j, env)
                break  # the sections after it are the body's
            if headers and code in (_HEADER, _PROPERTIES):
                value, i = _value(payload, j)
                if code == _HEADER:
                    header = value if isinstance(value, list) else []
                else:
                    props = value if isinstance(value, list) else []
            else:
                i = _skip(payload, j)  # annotations, or the header when no selector reads it
    except (_Malformed, IndexError):
        pass
    if not headers:
        return env
    durable = _field(header, 0)
    priority = _field(header, 1)
    user = _field(props, 1)
    expiry = _field(props, 8)
    env.update(
        JMSDeliveryMode="PERSISTENT" if durable is True else "NON_PERSISTENT",
        JMSPriority=priority if isinstance(priority, int) and not isinstance(priority, bool) else 4,
        JMSMessageID=_id(_field(props, 0)),
        JMSCorrelationID=_id(_field(props, 5)),
        JMSType=_simple(_field(props, 3)),
        JMSTimestamp=_simple(_field(props, 9)),
        JMSExpiration=expiry if isinstance(expiry, int) and not isinstance(expiry, bool) else 0,
        JMSXUserID=user.decode("utf-8", "replace") if isinstance(user, bytes) else None,
        JMSXGroupID=_simple(_field(props, 10)),
        JMSXGroupSeq=_simple(_field(props, 11)),
    )
    return env


def _id(v: Any) -> str | None:
    """A message or correlation id as a string (ulong, uuid, binary as hex, string)."""
    if v is None:
        return None
    if isinstance(v, bytes):
        return v.hex()
    return str(v)


def python_application_properties(payload: bytes, names: tuple[str, ...]) -> dict[str, Any]:
    """The application properties ``names`` names, of this message: what
    ``selector_env(payload, headers=False)`` gives for those names (absent: not in
    the map), for a router whose selectors read no JMS name. The specification of
    ``application_properties``, which is the compiled reader
    (router/core/_msgfields.c) when it is built: it reads the usual messages itself
    and leaves any it is not sure of to this function."""
    every = selector_env(payload, False)
    return {name: every[name] for name in names if name in every}


def python_application_values(payload: bytes, names: tuple[str, ...]) -> tuple[Any, ...]:
    """python_application_properties as a tuple in the order of ``names`` (None for
    an absent one, as a selector sees it): what a roster with one selector reads,
    without a dict. The specification of ``application_values``."""
    every = selector_env(payload, False)
    return tuple(every.get(name) for name in names)


ApplicationPropertiesReader = Callable[[bytes, tuple[str, ...]], dict[str, Any]]
ApplicationValuesReader = Callable[[bytes, tuple[str, ...]], tuple[Any, ...]]


def _compiled_readers() -> tuple[ApplicationPropertiesReader, ApplicationValuesReader] | None:
    """The compiled readers, unless they are not built or EOROUTER_COMPILED_MSGFIELDS=0."""
    if os.environ.get("EOROUTER_COMPILED_MSGFIELDS", "1").strip().lower() in ("0", "off", "no", "false"):
        return None
    try:
        from router.core import _msgfields  # type: ignore[attr-defined]  # the compiled extension: no stub

        _msgfields.bind(python_application_properties, python_application_values)
        readers: tuple[ApplicationPropertiesReader, ApplicationValuesReader] = (
            _msgfields.application_properties,
            _msgfields.application_values,
        )
    except (ImportError, AttributeError, TypeError):  # not built, or built from another version of this file
        return None
    return readers


application_properties, application_values = _compiled_readers() or (
    python_application_properties,
    python_application_values,
)
