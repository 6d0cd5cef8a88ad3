"""router.interrouter_codec: open properties, proofs, control and data transfers
(docs/inter-router.md). Anything a peer can send either decodes or raises CodecError."""

from __future__ import annotations

import hashlib
import hmac
import struct

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from router import interrouter_codec as codec
from router.interrouter_codec import CodecError

# JSON values orjson round-trips exactly (64-bit ints, finite floats, str keys).
json_scalars = (
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**63 - 1)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=20)
)
json_values = st.recursive(
    json_scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)
control_messages = st.builds(
    lambda t, rest: {**rest, "t": t},
    st.text(min_size=1, max_size=12),
    st.dictionaries(st.text(max_size=8), json_values, max_size=5),
)
router_ids = st.from_regex(r"[A-Za-z0-9._-]{1,64}", fullmatch=True)


# --------------------------------------------------------------------------- control


@given(router_ids, st.integers(0, 2**63 - 1), st.text(min_size=1, max_size=20), st.lists(control_messages, max_size=20))
def test_control_round_trip(sender, epoch, boot, msgs):
    payload = codec.encode_control(sender, epoch, boot, msgs)
    assert codec.decode_control(payload) == (sender, epoch, boot, msgs)
    assert codec.decode_control(bytearray(payload)) == (sender, epoch, boot, msgs)  # any buffer


@pytest.mark.parametrize("size", [0, 1, 255, 256, 70_000])
def test_control_is_one_data_section_vbin8_or_vbin32(size):
    msgs = [{"t": "x", "pad": "a" * size}] if size else []
    payload = codec.encode_control("A", 1, "b", msgs)
    body = orjson.dumps({"v": 1, "from": "A", "epoch": 1, "boot": "b", "msgs": msgs})
    assert payload[:3] == b"\x00\x53\x75"
    if len(body) < 256:
        assert payload[3] == 0xA0 and payload[4] == len(body) and payload[5:] == body
    else:
        assert payload[3] == 0xB0 and struct.unpack(">I", payload[4:8])[0] == len(body) and payload[8:] == body


def test_control_section_is_valid_amqp_for_proton():
    """An independent decoder reads our hand-built section as a data body."""
    from proton import Message

    for msgs in ([{"t": "ls"}], [{"t": "pad", "x": "y" * 400}]):
        payload = codec.encode_control("A", 3, "9f1c", msgs)
        message = Message()
        message.decode(payload)
        assert orjson.loads(bytes(message.body)) == {"v": 1, "from": "A", "epoch": 3, "boot": "9f1c", "msgs": msgs}


GOOD = {"v": 1, "from": "A", "epoch": 1, "boot": "b", "msgs": [{"t": "ls"}]}


def _section(body: bytes) -> bytes:
    return b"\x00\x53\x75\xb0" + struct.pack(">I", len(body)) + body


@pytest.mark.parametrize(
    "payload,fragment",
    [
        (b"", "one AMQP data section"),
        (b"\x00\x53\x77\xa0\x00", "one AMQP data section"),  # amqp-value, not data
        (b"\x00\x53\x75\xa1\x02{}", "expected binary"),  # str8 instead of vbin8
        (b"\x00\x53\x75\xb0\x00\x00", "cut short"),
        (b"\x00\x53\x75\xa0\x05{}", "says 5 bytes, the transfer has 2"),
        (b"\x00\x53\x75\xa0\x02{}xx", "says 2 bytes, the transfer has 4"),  # trailing bytes
        (_section(b"{nope"), "not JSON"),
        (_section(b"\xff\xfe"), "not JSON"),
        (_section(b"[1,2]"), "a JSON object"),
        (_section(orjson.dumps({**GOOD, "v": 2})), "expected v = 1"),
        (_section(orjson.dumps({**GOOD, "v": True})), "expected v = 1"),
        (_section(orjson.dumps({k: v for k, v in GOOD.items() if k != "from"})), "'from'"),
        (_section(orjson.dumps({**GOOD, "from": ""})), "'from'"),
        (_section(orjson.dumps({**GOOD, "epoch": -1})), "'epoch'"),
        (_section(orjson.dumps({**GOOD, "epoch": "1"})), "'epoch'"),
        (_section(orjson.dumps({**GOOD, "boot": 5})), "'boot'"),
        (_section(orjson.dumps({**GOOD, "msgs": {"t": "ls"}})), "'msgs' must be a list"),
        (_section(orjson.dumps({**GOOD, "msgs": [{"t": "ls"}, {"x": 1}]})), "msgs[1]"),
        (_section(orjson.dumps({**GOOD, "msgs": [["t"]]})), "msgs[0]"),
    ],
)
def test_bad_control_transfers(payload, fragment):
    with pytest.raises(CodecError) as info:
        codec.decode_control(payload)
    assert fragment in str(info.value)
    assert info.value.condition == "amqp:decode-error"


@settings(max_examples=300)
@given(st.binary(max_size=64))
def test_control_decoder_never_fails_otherwise(data):
    for payload in (data, b"\x00\x53\x75\xa0" + bytes([len(data) % 256]) + data, _section(data)):
        try:
            codec.decode_control(payload)
        except CodecError:
            pass


@given(st.lists(control_messages, max_size=5), st.data())
def test_truncated_control_transfer_is_a_clean_error(msgs, data):
    payload = codec.encode_control("A", 1, "b", msgs)
    cut = data.draw(st.integers(0, len(payload) - 1))
    with pytest.raises(CodecError):
        codec.decode_control(payload[:cut])


# --------------------------------------------------------------------------- data

headers = st.fixed_dictionaries(
    {
        "origin": router_ids,
        "epoch": st.integers(0, 2**40),
        "boot": st.text(max_size=16),
        "topic": st.text(max_size=30),
        "dests": st.lists(router_ids, max_size=4),
        "seq": st.integers(0, 2**40),
        "exp": st.none() | st.integers(0, 2**50),
    },
    optional={"extra": json_values},
)


@given(headers, st.binary(max_size=300))
def test_data_round_trip(header, message):
    payload = codec.encode_data(header, message)
    assert payload[:4] == b"EOR1"
    (n,) = struct.unpack(">I", payload[4:8])
    assert orjson.loads(payload[8 : 8 + n]) == header and payload[8 + n :] == message
    assert codec.decode_data(payload) == (header, message)
    assert codec.decode_data(memoryview(payload)) == (header, message)


@pytest.mark.parametrize(
    "payload,fragment",
    [
        (b"", "EOR1 magic"),
        (b"EOR1\x00\x00\x00", "EOR1 magic"),
        (b"EOR2\x00\x00\x00\x02{}", "EOR1 magic"),
        (b"EOR1\x00\x00\x00\x09{}", "runs past the transfer"),
        (b"EOR1\xff\xff\xff\xff{}", "runs past the transfer"),
        (b"EOR1\x00\x00\x00\x05{nopeAMQP", "not JSON"),
        (b"EOR1\x00\x00\x00\x02[]AMQP", "JSON object"),
    ],
)
def test_bad_data_transfers(payload, fragment):
    with pytest.raises(CodecError) as info:
        codec.decode_data(payload)
    assert fragment in str(info.value)
    assert info.value.condition == "amqp:decode-error"


@settings(max_examples=300)
@given(st.binary(max_size=64))
def test_data_decoder_never_fails_otherwise(data):
    for payload in (data, b"EOR1" + data, b"EOR1" + struct.pack(">I", len(data) // 2) + data):
        try:
            header, message = codec.decode_data(payload)
        except CodecError:
            continue
        assert isinstance(header, dict) and isinstance(message, bytes)


# --------------------------------------------------------------------------- open properties


def hello(**changes) -> dict:
    props = codec.hello_properties("B", 2, "9f1c", "ab" * 16)
    props.update(changes)
    return {k: v for k, v in props.items() if v is not None}


def test_hello_round_trip():
    assert codec.parse_hello(hello(), expect_auth=False) == codec.Hello("B", 2, "9f1c", "ab" * 16, None)
    mac = "0f" * 32
    assert codec.parse_hello(hello(**{"eorouter:auth": mac}), expect_auth=True).auth == mac


@pytest.mark.parametrize(
    "changes,expect_auth,fragment",
    [
        ({"eorouter:router-id": None}, False, "carries no eorouter:router-id"),
        ({"eorouter:router-id": "has space"}, False, "eorouter:router-id"),
        ({"eorouter:router-id": 7}, False, "eorouter:router-id"),
        ({"eorouter:proto": 2}, False, "eorouter:proto"),
        ({"eorouter:proto": None}, False, "eorouter:proto"),
        ({"eorouter:proto": True}, False, "eorouter:proto"),
        ({"eorouter:epoch": -1}, False, "eorouter:epoch"),
        ({"eorouter:epoch": "2"}, False, "eorouter:epoch"),
        ({"eorouter:boot": ""}, False, "eorouter:boot"),
        ({"eorouter:boot": "x" * 65}, False, "eorouter:boot"),
        ({"eorouter:nonce": "ab" * 15}, False, "eorouter:nonce"),
        ({"eorouter:nonce": "AB" * 16}, False, "eorouter:nonce"),
        ({"eorouter:nonce": None}, False, "eorouter:nonce"),
        ({"eorouter:auth": "0f" * 32}, False, "only the acceptor"),
        ({}, True, "eorouter:auth"),
        ({"eorouter:auth": "0f" * 31}, True, "eorouter:auth"),
    ],
)
def test_bad_hellos_are_unauthorized(changes, expect_auth, fragment):
    with pytest.raises(CodecError) as info:
        codec.parse_hello(hello(**changes), expect_auth=expect_auth)
    assert fragment in str(info.value)
    assert info.value.condition == "amqp:unauthorized-access"


@pytest.mark.parametrize("props", [None, {}, {"product": "qpid-proton"}])
def test_a_client_open_is_not_a_router(props):
    with pytest.raises(CodecError, match="not an eorouter router"):
        codec.parse_hello(props, expect_auth=False)


def test_nonces_are_fresh_16_bytes_hex():
    nonces = {codec.new_nonce() for _ in range(100)}
    assert len(nonces) == 100
    assert all(len(n) == 32 and int(n, 16) >= 0 and n == n.lower() for n in nonces)


# --------------------------------------------------------------------------- proofs


def test_proofs_are_the_documented_hmacs():
    secret, cn, an = "s3cret", "11" * 16, "22" * 16
    acceptor = hmac.new(b"s3cret", f"eorouter-v1|acceptor|A|3|bootA|{cn}|{an}".encode(), hashlib.sha256).hexdigest()
    connector = hmac.new(b"s3cret", f"eorouter-v1|connector|B|5|bootB|{an}|{cn}".encode(), hashlib.sha256).hexdigest()
    assert codec.acceptor_proof(secret, "A", 3, "bootA", cn, an) == acceptor
    assert codec.connector_proof(secret, "B", 5, "bootB", an, cn) == connector
    # Each side's proof is bound to its role, its identity and both nonces.
    assert codec.acceptor_proof(secret, "A", 3, "bootA", cn, an) != codec.connector_proof(secret, "A", 3, "bootA", cn, an)
    assert codec.acceptor_proof(secret, "A", 3, "bootA", cn, an) != codec.acceptor_proof(secret, "A", 3, "bootA", "33" * 16, an)
    assert codec.acceptor_proof("other", "A", 3, "bootA", cn, an) != acceptor


def test_proof_matches():
    mac = codec.connector_proof("s", "B", 1, "b", "11" * 16, "22" * 16)
    assert codec.proof_matches(mac, mac)
    assert not codec.proof_matches(mac, mac[:-1] + ("0" if mac[-1] != "0" else "1"))
    assert not codec.proof_matches(mac, None)
    assert not codec.proof_matches(mac, 5)
    assert not codec.proof_matches(mac, "é" * 64)
