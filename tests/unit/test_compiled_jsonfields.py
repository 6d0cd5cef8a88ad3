"""The compiled path's encoder of a log line's fields (router/adapter/_jsonfields.h, used
by _fastpath.c's log_line) against the event log's own encoder, orjson.dumps: for any
fields, the same bytes or "not mine" (then log_line asks orjson); for the shapes the
usual lines carry, always the same bytes."""

from __future__ import annotations

import enum
import importlib

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

try:
    _fastpath = importlib.import_module("router.adapter._fastpath")
except ImportError:  # not built: nothing compiled to compare
    _fastpath = None

pytestmark = pytest.mark.skipif(_fastpath is None, reason="router.adapter._fastpath not built")


class Kind(enum.IntEnum):
    A = 1


class Name(str):
    pass


def orjson_way(fields):
    try:
        return orjson.dumps(fields)
    except orjson.JSONEncodeError:
        return "error"


# What the usual lines carry: ASCII without anything to escape, 64-bit ints, flags, lists.
plain_text = st.text(st.characters(min_codepoint=0x20, max_codepoint=0x7E, exclude_characters='"\\'), max_size=40)
plain_scalar = st.one_of(plain_text, st.integers(-(2**63), 2**63 - 1), st.booleans(), st.none())
plain_value = st.one_of(plain_scalar, st.lists(plain_scalar, max_size=6), st.lists(plain_scalar, max_size=6).map(tuple))
plain_fields = st.dictionaries(plain_text, plain_value, max_size=14)

# Anything orjson may see: every character, any int, floats, nesting, subclasses, other keys.
any_scalar = st.one_of(
    st.text(max_size=20),
    st.integers(-(2**70), 2**70),
    st.floats(allow_nan=True),
    st.booleans(),
    st.none(),
    st.sampled_from([Kind.A, Name("n"), Name('q"')]),
)
any_value = st.recursive(
    any_scalar,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4),
        st.lists(inner, max_size=3).map(tuple),
        st.dictionaries(st.text(max_size=5), inner, max_size=3),
    ),
    max_leaves=8,
)
any_key = st.one_of(st.text(max_size=10), st.sampled_from([Name("k"), 1, None]))
any_fields = st.dictionaries(any_key, any_value, max_size=8)


@settings(max_examples=300)
@given(fields=plain_fields)
def test_the_usual_fields_are_encoded_here_as_orjson_encodes_them(fields):
    assert _fastpath.encode_fields(fields) == orjson.dumps(fields)


@settings(max_examples=500)
@given(fields=any_fields)
def test_any_fields_are_encoded_as_orjson_encodes_them_or_left_to_it(fields):
    encoded = _fastpath.encode_fields(fields)
    if encoded is not None:
        assert encoded == orjson_way(fields)


@pytest.mark.parametrize(
    "fields",
    [
        {"s": "é"},  # not ASCII
        {"s": 'a"b'},
        {"s": "a\\b"},
        {"s": "a\nb"},
        {"s": "\x00"},
        {"s": "\x1f"},
        {"i": 2**63},  # past 64 bits signed (orjson writes it; we leave it)
        {"i": -(2**63) - 1},
        {"f": 1.5},
        {"d": {"k": 1}},
        {"l": [[1]]},
        {"l": ["ok", 1.0]},
        {"e": Kind.A},
        {"s": Name("n")},
        {Name("k"): 1},
        {1: 2},
        {"ok": 1, "s": "é"},  # the first field written, then a later one not mine: nothing kept
    ],
)
def test_what_the_encoder_leaves_to_orjson(fields):
    assert _fastpath.encode_fields(fields) is None


def test_edges_of_what_it_writes():
    for fields in (
        {},
        {"": ""},
        {"a": []},
        {"a": ()},
        {"a": -(2**63), "b": 2**63 - 1, "c": 0, "d": -1},
        {"a": "\x7f ~"},  # DEL is not escaped by orjson
        {"a": [None, True, False, "x", 10**18]},
    ):
        assert _fastpath.encode_fields(fields) == orjson.dumps(fields)


def test_not_a_dict_is_left_to_orjson():
    for fields in ([], "x", None, Name("n")):
        assert _fastpath.encode_fields(fields) is None


def test_a_character_to_escape_is_seen_wherever_it_stands():
    """Strings are checked eight bytes at a time: every length around a word's, with the
    character at every place, and the characters next to the escaped ones kept as they are."""
    for length in range(1, 26):
        for place in range(length):
            for odd in ('"', "\\", "\x00", "\x1f", "\x01", "\n"):
                text = "a" * place + odd + "a" * (length - place - 1)
                assert _fastpath.encode_fields({"k": text}) is None, (length, place, odd)
            for fine in (" ", "!", "#", "[", "]", "\x7f", "~", "0"):
                text = "a" * place + fine + "b" * (length - place - 1)
                assert _fastpath.encode_fields({"k": text}) == orjson.dumps({"k": text})
