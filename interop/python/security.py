"""The python-qpid-proton peers' security options (contract: interop/clientkit.py): TLS with a
trusted CA and the server's name checked, an optional client certificate, a SASL login and the
mechanisms allowed, as ``Container.connect`` arguments."""

from __future__ import annotations

import argparse

from proton import SSLDomain


def url(a: argparse.Namespace) -> str:
    return f"{'amqps' if a.tls_ca else 'amqp'}://{a.host}:{a.port}"


def connect_options(a: argparse.Namespace) -> dict:
    """Keyword arguments for ``Container.connect`` (none: plain AMQP, proton's default SASL)."""
    opts: dict = {}
    if a.tls_ca:
        domain = SSLDomain(SSLDomain.MODE_CLIENT)
        domain.set_trusted_ca_db(a.tls_ca)
        domain.set_peer_authentication(SSLDomain.VERIFY_PEER_NAME)  # against HOST (the URL's host)
        if a.tls_cert:
            domain.set_credentials(a.tls_cert, a.tls_key, None)
        opts["ssl_domain"] = domain
    if a.user is not None:
        opts["user"] = a.user
    if a.password is not None:
        opts["password"] = a.password
    if a.mech:
        opts["allowed_mechs"] = " ".join(a.mech.split())
    if a.user is not None or a.mech or a.tls_cert:
        opts["sasl_enabled"] = True
    return opts
