"""The inter-router wire format (docs/inter-router.md), as pure functions.

No proton, no sockets: the adapter (``router/adapter/interrouter.py``) moves the
bytes, this module makes and checks them, so everything here is unit-tested on
its own (tests/unit/test_interrouter_codec.py).

* **Open properties** (``hello_properties`` / ``parse_hello``): who a router is
  (id, epoch, boot), its fresh nonce, the protocol version and, from the
  acceptor, its proof.
* **Proofs** (``acceptor_proof`` / ``connector_proof`` / ``proof_matches``):
  HMAC-SHA256 over the prover's identity and both nonces.
* **Control transfers** (``encode_control`` / ``decode_control``): one AMQP
  ``data`` section (descriptor ``0x00 0x53 0x75``, then ``vbin8``/``vbin32``)
  holding orjson JSON ``{"v":1,"from":...,"epoch":...,"boot":...,"msgs":[...]}``.
  Built by hand: no proton ``Data`` on this path.
* **Data transfers** (``encode_data`` / ``decode_data``):
  ``b"EOR1" | header length (4 bytes, big-endian) | header JSON | message``.

Everything a peer sends is checked before it is believed; a problem raises
``CodecError`` (a ``ValueError``) carrying the AMQP condition the adapter closes
the connection with, never anything else.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import re
import struct
from typing import NamedTuple, TypeGuard

import orjson

__all__ = [
    "AUTH",
    "CONTROL_ADDRESS",
    "DATA_ADDRESS",
    "DECODE_ERROR",
    "PREFIX",
    "PROTO",
    "UNAUTHORIZED",
    "CodecError",
    "Control",
    "Hello",
    "acceptor_proof",
    "connector_proof",
    "control_link_name",
    "data_link_name",
    "decode_control",
    "decode_data",
    "encode_control",
    "encode_data",
    "encode_data_head",
    "hello_properties",
    "new_nonce",
    "parse_hello",
    "proof_matches",
]

PROTO = 1  # eorouter:proto: this module's (and the document's) version
PREFIX = "_eorouter/"  # every address of the protocol; refused on client listeners
CONTROL_ADDRESS = "_eorouter/control"
DATA_ADDRESS = "_eorouter/data"
AUTH = "auth"  # the connector's first control message

DECODE_ERROR = "amqp:decode-error"
UNAUTHORIZED = "amqp:unauthorized-access"

KEY_ID = "eorouter:router-id"
KEY_EPOCH = "eorouter:epoch"
KEY_BOOT = "eorouter:boot"
KEY_NONCE = "eorouter:nonce"
KEY_PROTO = "eorouter:proto"
KEY_AUTH = "eorouter:auth"

_ROUTER_ID = re.compile(r"[A-Za-z0-9._-]{1,64}")  # as router.config's router.id
_HEX = re.compile(r"[0-9a-f]+")
NONCE_BYTES = 16
MAC_HEX = 64  # hex chars of an HMAC-SHA256
MAX_BOOT = 64


class CodecError(ValueError):
    """Bytes or properties from a peer that break the protocol. ``condition`` is the
    AMQP error condition to close the connection with."""

    def __init__(self, message: str, condition: str = DECODE_ERROR) -> None:
        super().__init__(message)
        self.condition = condition


def control_link_name(router_id: str) -> str:
    return f"eorouter-control-{router_id}"


def data_link_name(router_id: str) -> str:
    return f"eorouter-data-{router_id}"


# --------------------------------------------------------------------- open properties


class Hello(NamedTuple):
    """What a router's open frame says about it."""

    router_id: str
    epoch: int
    boot: str
    nonce: str  # hex
    auth: str | None  # hex MAC (the acceptor's open only)


def new_nonce() -> str:
    """A fresh nonce for one connection: 16 random bytes, hex."""
    return os.urandom(NONCE_BYTES).hex()


def hello_properties(router_id: str, epoch: int, boot: str, nonce: str, auth: str | None = None) -> dict:
    """The open frame's connection properties (symbol keys on the wire; the adapter
    writes ``eorouter:proto`` as an AMQP int, the epoch as a long)."""
    props = {KEY_ID: router_id, KEY_EPOCH: epoch, KEY_BOOT: boot, KEY_NONCE: nonce, KEY_PROTO: PROTO}
    if auth is not None:
        props[KEY_AUTH] = auth
    return props


def _int(value: object) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


def parse_hello(props: dict | None, *, expect_auth: bool) -> Hello:
    """Check a peer's open properties (keys as plain strings). Raises CodecError
    (``amqp:unauthorized-access``: a peer that does not introduce itself properly
    is not let in) naming the first problem."""
    if not props or KEY_ID not in props:
        raise CodecError(f"the open frame carries no {KEY_ID} (not an eorouter router)", UNAUTHORIZED)
    router_id = props.get(KEY_ID)
    if not isinstance(router_id, str) or not _ROUTER_ID.fullmatch(router_id):
        raise CodecError(f"{KEY_ID}: expected a router id, found {router_id!r:.80}", UNAUTHORIZED)
    proto = props.get(KEY_PROTO)
    if not _int(proto) or proto != PROTO:
        raise CodecError(f"{KEY_PROTO}: expected {PROTO}, found {proto!r:.40}", UNAUTHORIZED)
    epoch = props.get(KEY_EPOCH)
    if not _int(epoch) or epoch < 0 or epoch >= 2**63:
        raise CodecError(f"{KEY_EPOCH}: expected a non-negative integer, found {epoch!r:.40}", UNAUTHORIZED)
    boot = props.get(KEY_BOOT)
    if not isinstance(boot, str) or not 0 < len(boot) <= MAX_BOOT:
        raise CodecError(f"{KEY_BOOT}: expected a string of 1 to {MAX_BOOT} characters, found {boot!r:.80}", UNAUTHORIZED)
    nonce = props.get(KEY_NONCE)
    if not isinstance(nonce, str) or len(nonce) != 2 * NONCE_BYTES or not _HEX.fullmatch(nonce):
        raise CodecError(f"{KEY_NONCE}: expected {NONCE_BYTES} bytes as lowercase hex, found {nonce!r:.80}", UNAUTHORIZED)
    auth = props.get(KEY_AUTH)
    if expect_auth:
        if not isinstance(auth, str) or len(auth) != MAC_HEX or not _HEX.fullmatch(auth):
            raise CodecError(f"{KEY_AUTH}: expected an HMAC-SHA256 as lowercase hex, found {auth!r:.80}", UNAUTHORIZED)
    elif auth is not None:
        raise CodecError(f"{KEY_AUTH} in a connector's open (only the acceptor proves itself in its open)", UNAUTHORIZED)
    return Hello(router_id, epoch, boot, nonce, auth)


# --------------------------------------------------------------------- proofs


def _mac(secret: str, text: str) -> str:
    return hmac.new(secret.encode("utf-8"), text.encode("utf-8"), hashlib.sha256).hexdigest()


def acceptor_proof(
    secret: str, acceptor_id: str, acceptor_epoch: int, acceptor_boot: str, connector_nonce: str, acceptor_nonce: str
) -> str:
    """The acceptor's ``eorouter:auth`` (hex)."""
    return _mac(secret, f"eorouter-v1|acceptor|{acceptor_id}|{acceptor_epoch}|{acceptor_boot}|{connector_nonce}|{acceptor_nonce}")


def connector_proof(
    secret: str, connector_id: str, connector_epoch: int, connector_boot: str, acceptor_nonce: str, connector_nonce: str
) -> str:
    """The ``mac`` of the connector's ``auth`` control message (hex)."""
    return _mac(
        secret, f"eorouter-v1|connector|{connector_id}|{connector_epoch}|{connector_boot}|{acceptor_nonce}|{connector_nonce}"
    )


def proof_matches(expected: str, got) -> bool:
    """Constant-time comparison of a MAC a peer sent with the one we computed."""
    if not isinstance(got, str):
        return False
    try:
        got_bytes = got.encode("ascii")
    except UnicodeEncodeError:
        return False
    return hmac.compare_digest(expected.encode("ascii"), got_bytes)


# --------------------------------------------------------------------- control transfers

_DATA_SECTION = b"\x00\x53\x75"
_VBIN8 = 0xA0
_VBIN32 = 0xB0
_pack_u32 = struct.Struct(">I").pack
_unpack_u32 = struct.Struct(">I").unpack_from
_dumps = orjson.dumps
_loads = orjson.loads


class Control(NamedTuple):
    """One decoded control transfer."""

    sender: str  # "from"
    epoch: int
    boot: str
    msgs: list  # of dicts, each with a string "t"


def encode_control(sender: str, epoch: int, boot: str, msgs: list) -> bytes:
    """One control transfer's payload: a data section holding the JSON batch."""
    body = _dumps({"v": PROTO, "from": sender, "epoch": epoch, "boot": boot, "msgs": msgs})
    n = len(body)
    if n < 256:
        return b"".join((_DATA_SECTION, bytes((_VBIN8, n)), body))
    return b"".join((_DATA_SECTION, bytes((_VBIN32,)), _pack_u32(n), body))


def decode_control(payload) -> Control:
    """Check and decode a control transfer's payload (bytes or a buffer)."""
    view = memoryview(payload)
    size = len(view)
    if size < 5 or view[:3] != _DATA_SECTION:
        raise CodecError("control transfer: expected one AMQP data section (0x00 0x53 0x75)")
    code = view[3]
    if code == _VBIN8:
        start, n = 5, view[4]
    elif code == _VBIN32:
        if size < 8:
            raise CodecError("control transfer: data section cut short in its size")
        start, n = 8, _unpack_u32(view, 4)[0]
    else:
        raise CodecError(f"control transfer: expected binary (0xa0/0xb0) in the data section, found 0x{code:02x}")
    if start + n != size:
        raise CodecError(f"control transfer: data section says {n} bytes, the transfer has {size - start}")
    try:
        doc = _loads(view[start:])
    except ValueError as exc:  # orjson.JSONDecodeError
        raise CodecError(f"control transfer: not JSON ({exc})") from None
    if not isinstance(doc, dict):
        raise CodecError("control transfer: expected a JSON object")
    version = doc.get("v")
    if not _int(version) or version != PROTO:
        raise CodecError(f"control transfer: expected v = {PROTO}, found {version!r:.40}")
    sender, epoch, boot, msgs = doc.get("from"), doc.get("epoch"), doc.get("boot"), doc.get("msgs")
    if not isinstance(sender, str) or not sender:
        raise CodecError("control transfer: 'from' must be a router id")
    if not _int(epoch) or epoch < 0:
        raise CodecError("control transfer: 'epoch' must be a non-negative integer")
    if not isinstance(boot, str) or not boot:
        raise CodecError("control transfer: 'boot' must be a non-empty string")
    if not isinstance(msgs, list):
        raise CodecError("control transfer: 'msgs' must be a list")
    for i, msg in enumerate(msgs):
        if not isinstance(msg, dict) or not isinstance(msg.get("t"), str):
            raise CodecError(f"control transfer: msgs[{i}] must be an object with a string 't'")
    return Control(sender, epoch, boot, msgs)


# --------------------------------------------------------------------- data transfers

DATA_MAGIC = b"EOR1"


def encode_data(header: dict, message: bytes) -> bytes:
    """One data transfer's payload."""
    return encode_data_head(header) + message


def encode_data_head(header: dict) -> bytes:
    """A data transfer's payload up to the message: sent before the message's own
    bytes, so a large message is never copied to be joined to its header."""
    h = _dumps(header)
    return b"".join((DATA_MAGIC, _pack_u32(len(h)), h))


def decode_data(payload) -> tuple[dict, bytes]:
    """Check and split a data transfer's payload (bytes or a buffer) into the routing
    header (a dict) and the message bytes (one copy)."""
    view = memoryview(payload)
    size = len(view)
    if size < 8 or view[:4] != DATA_MAGIC:
        raise CodecError("data transfer: expected the EOR1 magic and a header length")
    n = _unpack_u32(view, 4)[0]
    end = 8 + n
    if end > size:
        raise CodecError(f"data transfer: header length {n} runs past the transfer ({size - 8} bytes left)")
    try:
        header = _loads(view[8:end])
    except ValueError as exc:
        raise CodecError(f"data transfer: header is not JSON ({exc})") from None
    if not isinstance(header, dict):
        raise CodecError("data transfer: the header must be a JSON object")
    return header, bytes(view[end:])
