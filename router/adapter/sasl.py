"""SASL through Qpid Proton's Cyrus SASL layer (docs/security.md, "Logins").

A client listener offers the mechanisms its ``sasl_mechanisms`` names. PLAIN and
SCRAM-SHA-* check passwords in the router's sasldb (``[sasl] users_db``, made with
``eorouter passwd``); EXTERNAL takes the user from the client's TLS certificate;
ANONYMOUS lets anyone in as ``anonymous``. Cyrus does the mechanisms and the
password checks; this module only points it at the router's files and reads who
logged in.

Cyrus's configuration is per process (the first transport that asks fixes it):
one ``eorouter.conf`` that the router writes into its data directory at start,
naming the sasldb and every mechanism any listener offers. Each listener narrows
that list on its own transports.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cproton_ffi import ffi, lib

#: The mechanisms a listener may offer; SCRAM and PLAIN need the sasldb.
MECHANISMS = ("ANONYMOUS", "PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512", "EXTERNAL")
PASSWORD_MECHANISMS = frozenset({"PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"})
#: The Cyrus application name: the router reads <config dir>/eorouter.conf
CONFIG_NAME = "eorouter"
_PN_SASL_AUTH = 1  # pn_sasl_outcome: the credentials were wrong


class SaslError(Exception):
    """The router cannot offer the logins its configuration asks for (no Cyrus SASL in
    this Qpid Proton, a sasldb it cannot read)."""


@dataclass(frozen=True, slots=True)
class ListenerLogins:
    """What one listener offers, as proton wants it."""

    mechanisms: bytes  # space-separated
    allow_insecure: bool  # PLAIN without TLS (a listener that says so explicitly)
    require_auth: bool  # no ANONYMOUS: a client that skips SASL is refused
    checks_passwords: bool  # a login can fail for wrong credentials (its answer is then delayed)


def listener_logins(mechanisms: tuple[str, ...], allow_plain_in_clear: bool) -> ListenerLogins:
    return ListenerLogins(
        " ".join(mechanisms).encode(),
        allow_plain_in_clear,
        "ANONYMOUS" not in mechanisms,
        bool(PASSWORD_MECHANISMS.intersection(mechanisms)),
    )


def has_cyrus() -> bool:
    """Whether this Qpid Proton was built against Cyrus SASL (PLAIN/SCRAM on the server side)."""
    return bool(lib.pn_sasl_extended())


def prepare(data_dir: Path, users_db: Path | None, mechanisms: set[str]) -> Path | None:
    """Write Cyrus's configuration for this process into ``data_dir``/sasl and return
    its directory (None: no listener offers a password mechanism, Cyrus is not needed).
    Raises SaslError when password logins cannot work here."""
    if not mechanisms & PASSWORD_MECHANISMS:
        return None
    if not has_cyrus():
        raise SaslError(
            "this Qpid Proton was built without Cyrus SASL, so it cannot check passwords "
            f"({', '.join(sorted(mechanisms & PASSWORD_MECHANISMS))}): run scripts/setup-root, then "
            "scripts/test or scripts/demo once (they rebuild it; docs/security.md)"
        )
    assert users_db is not None  # the config requires it with a password mechanism
    if not os.access(users_db, os.R_OK):
        raise SaslError(f"sasl.users_db: cannot read {users_db} (make it with `eorouter passwd`)")
    conf_dir = data_dir / "sasl"
    conf_dir.mkdir(parents=True, exist_ok=True)
    offered = " ".join(m for m in MECHANISMS if m in mechanisms)
    text = (
        "# Written by the router at start from its configuration ([sasl], listeners' sasl_mechanisms).\n"
        "pwcheck_method: auxprop\n"
        "auxprop_plugin: sasldb\n"
        f"sasldb_path: {users_db}\n"
        f"mech_list: {offered}\n"
    )
    conf = conf_dir / f"{CONFIG_NAME}.conf"
    conf.write_text(text)
    return conf_dir


def secure(transport: Any, logins: ListenerLogins, conf_dir: Path | None) -> None:
    """The SASL layer of one accepted client transport."""
    sasl = lib.pn_sasl(transport)
    if conf_dir is not None:
        # Process-wide in Cyrus (the first call wins): the same for every transport.
        lib.pn_sasl_config_path(sasl, str(conf_dir).encode())
        lib.pn_sasl_config_name(sasl, CONFIG_NAME.encode())
    lib.pn_sasl_allowed_mechs(sasl, logins.mechanisms)
    lib.pn_sasl_set_allow_insecure_mechs(sasl, logins.allow_insecure)
    if logins.require_auth:
        lib.pn_transport_require_auth(transport, True)


def login_failed(transport: Any) -> bool:
    """Whether the client offered credentials that did not check out."""
    return bool(lib.pn_sasl_outcome(lib.pn_sasl(transport)) == _PN_SASL_AUTH)


def password_user(transport: Any, realm: str | None) -> str | None:
    """The user a password mechanism logged in (the realm the router's users live in
    left out: ``alice@eorouter`` is ``alice``); None after another mechanism."""
    sasl = lib.pn_sasl(transport)
    mech = lib.pn_sasl_get_mech(sasl)
    if mech == ffi.NULL or ffi.string(mech).decode() not in PASSWORD_MECHANISMS:
        return None
    user = lib.pn_transport_get_user(transport)
    if user == ffi.NULL:
        return None
    name = ffi.string(user).decode("utf-8", "replace")
    if realm and name.endswith("@" + realm):
        name = name[: -len(realm) - 1]
    return name


def mechanism(transport: Any) -> str | None:
    mech = lib.pn_sasl_get_mech(lib.pn_sasl(transport))
    return ffi.string(mech).decode() if mech != ffi.NULL else None
