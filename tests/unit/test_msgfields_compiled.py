"""router/core/_msgfields.c, the compiled reader of the application properties a
router's selectors read, against its specification (msgfields.py's Python reader):
on hypothesis-made encoded messages, well-formed and not (truncated, a byte
changed, odd descriptors, described, compound and unknown values, keys that are
not strings or not UTF-8), the compiled reader gives the same properties or
declines (None); and it does not decline the messages clients send."""

from __future__ import annotations

import math
import os
import struct
import subprocess
import sys
import uuid
from pathlib import Path

import proton
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from router.core.msgfields import (
    application_properties,
    application_values,
    python_application_properties,
    python_application_values,
)

try:
    from router.core._msgfields import read as compiled  # type: ignore[import-not-found]
    from router.core._msgfields import read_values as compiled_values  # type: ignore[import-not-found]
except ImportError:
    compiled = compiled_values = None
needs_compiled = pytest.mark.skipif(compiled is None, reason="the compiled reader is not built (setup.py build_ext)")

NAMES = ("color", "n", "x", "é", "\ufffd", "a.b")


def _sized(small: int, large: int, data: bytes, wide: bool) -> bytes:
    if wide or len(data) > 255:
        return bytes((large,)) + struct.pack(">I", len(data)) + data
    return bytes((small, len(data))) + data


def _compound(small: int, large: int, items: list[bytes], wide: bool, count: int | None = None) -> bytes:
    body = b"".join(items)
    n = len(items) if count is None else count
    if wide or len(body) + 1 > 255:
        return bytes((large,)) + struct.pack(">II", len(body) + 4, n) + body
    return bytes((small, len(body) + 1, n)) + body


FIXED = {0x40: 0, 0x41: 0, 0x42: 0, 0x43: 0, 0x44: 0, 0x45: 0, 0x50: 1, 0x51: 1, 0x52: 1, 0x53: 1, 0x54: 1, 0x55: 1}
FIXED |= {0x56: 1, 0x60: 2, 0x61: 2, 0x70: 4, 0x71: 4, 0x72: 4, 0x73: 4, 0x74: 4, 0x80: 8, 0x81: 8, 0x82: 8, 0x83: 8}
FIXED |= {0x84: 8, 0x94: 16, 0x98: 16}

fixed_values = st.sampled_from(sorted(FIXED)).flatmap(
    lambda code: st.binary(min_size=FIXED[code], max_size=FIXED[code]).map(lambda b: bytes((code,)) + b)
)
raw_strings = st.one_of(
    st.sampled_from(NAMES).map(lambda s: s.encode()),
    st.text(max_size=6).map(lambda s: s.encode()),
    st.binary(max_size=6),  # not always UTF-8
)
strings = st.tuples(st.sampled_from([(0xA1, 0xB1), (0xA3, 0xB3), (0xA0, 0xB0)]), raw_strings, st.booleans()).map(
    lambda t: _sized(t[0][0], t[0][1], t[1], t[2])
)
simple = st.one_of(fixed_values, strings, st.binary(min_size=1, max_size=3))  # (the last: unknown codes, short values)
values = st.recursive(
    simple,
    lambda inner: st.one_of(
        st.tuples(inner, inner).map(lambda t: b"\x00" + t[0] + t[1]),  # described
        st.tuples(st.lists(inner, max_size=3), st.booleans()).map(lambda t: _compound(0xC0, 0xD0, t[0], t[1])),
        st.tuples(st.lists(inner, max_size=4), st.booleans()).map(lambda t: _compound(0xC1, 0xD1, t[0], t[1])),
        st.binary(max_size=4).map(lambda b: _sized(0xE0, 0xF0, b, False)),  # an array (as a selector sees it: null)
    ),
    max_leaves=4,
)
keys = st.one_of(
    st.tuples(st.sampled_from([(0xA1, 0xB1), (0xA3, 0xB3)]), raw_strings, st.booleans()).map(
        lambda t: _sized(t[0][0], t[0][1], t[1], t[2])
    ),
    values,  # not a string, mostly
)
maps = st.tuples(
    st.lists(st.tuples(keys, values), max_size=5),
    st.booleans(),
    st.one_of(st.none(), st.integers(0, 12)),  # a count that lies, sometimes
).map(lambda t: _compound(0xC1, 0xD1, [k + v for k, v in t[0]], t[1], t[2]))
descriptors = st.one_of(
    st.integers(0x70, 0x77).map(lambda code: b"\x00\x53" + bytes((code,))),
    st.integers(0x70, 0x77).map(lambda code: b"\x00\x80" + struct.pack(">Q", code)),
    st.just(b"\x00\xa3\x05other"),
)
sections = st.one_of(
    st.tuples(descriptors, st.one_of(values, maps)).map(lambda t: t[0] + t[1]),
    maps.map(lambda m: b"\x00\x53\x74" + m),
)
# What clients send, mostly: a header, properties, the application properties named.
named_keys = st.tuples(st.sampled_from([0xA1, 0xA3]), st.sampled_from(NAMES)).map(lambda t: _sized(t[0], 0, t[1].encode(), False))
usual_maps = st.tuples(st.lists(st.tuples(named_keys, st.one_of(fixed_values, strings)), max_size=5), st.booleans()).map(
    lambda t: _compound(0xC1, 0xD1, [k + v for k, v in t[0]], t[1])
)
usual = st.tuples(
    st.sampled_from([b"", b"\x00\x53\x70\x45", b"\x00\x53\x70\xc0\x02\x01\x41"]),
    st.sampled_from([b"", b"\x00\x53\x72\xc1\x01\x00", b"\x00\x53\x73\xc0\x03\x01\x53\x07"]),
    usual_maps,
    st.sampled_from([b"", b"\x00\x53\x77\xa1\x01x"]),
).map(lambda t: t[0] + t[1] + b"\x00\x53\x74" + t[2] + t[3])
messages = st.one_of(st.lists(sections, max_size=5).map(b"".join), usual)


@st.composite
def damaged(draw: st.DrawFn) -> bytes:
    payload = draw(messages)
    how = draw(st.sampled_from(["whole", "truncated", "changed", "random"]))
    if how == "truncated" and payload:
        return payload[: draw(st.integers(0, len(payload) - 1))]
    if how == "changed" and payload:
        at = draw(st.integers(0, len(payload) - 1))
        return payload[:at] + bytes((draw(st.integers(0, 255)),)) + payload[at + 1 :]
    if how == "random":
        return b"\x00\x53\x74" + draw(st.binary(max_size=40))
    return payload


def _same(env: dict) -> dict:
    """Values compared by type and repr (a NaN equals itself; 0.0 is not -0.0)."""
    return {k: (type(v), repr(v)) for k, v in env.items()}


@needs_compiled
@settings(max_examples=500)  # (one in ~20 reads named properties of a well-formed map: enough of those)
@given(damaged(), st.lists(st.sampled_from(NAMES), unique=True).map(tuple))
def test_the_compiled_reader_reads_as_the_python_one_or_declines(payload, names):
    expected = python_application_properties(payload, names)
    got = compiled(payload, names)
    assert got is None or _same(got) == _same(expected)
    assert _same(application_properties(payload, names)) == _same(expected)
    expected_values = python_application_values(payload, names)
    assert _same(dict(zip(names, expected_values))) == _same({name: expected.get(name) for name in names})
    got_values = compiled_values(payload, names)
    assert (got_values is None) is (got is None)
    assert got_values is None or _same(dict(zip(names, got_values))) == _same(dict(zip(names, expected_values)))
    assert _same(dict(zip(names, application_values(payload, names)))) == _same(dict(zip(names, expected_values)))


@needs_compiled
def test_the_compiled_reader_reads_what_clients_send():
    properties = {
        "color": "red",
        "n": 7,
        "big": 2**40,
        "neg": -5,
        "w": 2.5,
        "ok": True,
        "no": False,
        "raw": b"\x00",
        "sym": proton.symbol("s"),
        "ch": proton.char("c"),
        "u": proton.ubyte(200),
        "ts": proton.timestamp(1234),
        "id": uuid.UUID(int=5),
        "f": proton.float32(0.5),
        "none": None,
        "long": "y" * 300,
    }
    payload = proton.Message(
        body="payload", properties=properties, durable=True, priority=9, id=7, subject="order", ttl=5
    ).encode()
    names = tuple(properties) + ("missing",)
    got = compiled(payload, names)
    assert got is not None
    assert _same(got) == _same(python_application_properties(payload, names))
    assert got["color"] == "red" and got["n"] == 7 and got["id"] == str(uuid.UUID(int=5)) and got["raw"] is None
    assert "missing" not in got and got["none"] is None
    assert compiled_values(payload, names) == tuple(got.get(name) for name in names)
    assert compiled(proton.Message(body="x").encode(), names) == {}


@needs_compiled
def test_the_core_reads_with_the_compiled_reader_which_leaves_what_it_declines_to_python():
    if application_properties is python_application_properties:
        pytest.skip("EOROUTER_COMPILED_MSGFIELDS=0: the core does not use it")
    payload = proton.Message(body="x", properties={"color": "red", "n": math.pi}).encode()
    assert application_properties(payload, ("color", "n", "x")) == {"color": "red", "n": math.pi}
    described_value = b"\x00\x53\x74\xc1\x0c\x02\xa1\x05color\x00\x53\x01\x41"  # declined: Python reads it
    assert compiled(described_value, ("color",)) is None
    assert application_properties(described_value, ("color",)) == {"color": True}
    assert application_values(described_value, ("color", "x")) == (True, None)


def test_without_the_compiled_reader_the_core_reads_in_python():
    script = (
        "from router.core import msgfields, selection\n"
        "assert msgfields.application_properties is msgfields.python_application_properties\n"
        "assert selection.application_properties is msgfields.python_application_properties\n"
        "assert selection.application_values is msgfields.python_application_values\n"
        "payload = bytes.fromhex('005374c10d02a105636f6c6f72a103726564')  # color = 'red'\n"
        "assert msgfields.application_properties(payload, ('color', 'n')) == {'color': 'red'}\n"
    )
    env = dict(os.environ, EOROUTER_COMPILED_MSGFIELDS="0")
    subprocess.run([sys.executable, "-c", script], check=True, env=env, cwd=Path(__file__).parents[2])
