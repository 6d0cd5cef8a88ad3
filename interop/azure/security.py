"""The pyamqp peers' security options (contract: interop/clientkit.py), as ``SendClient`` /
``ReceiveClient`` keyword arguments.

pyamqp's TLS is Python's ``ssl``: an ``SSLContext`` trusting ``--tls-ca`` that checks the server's
name against HOST (``check_hostname``), with the client certificate loaded when given. Its SASL layer
sends exactly one mechanism, chosen by the credential object: PLAIN (``SASLPlainCredential``),
EXTERNAL (``SASLExternalCredential``) or ANONYMOUS; it has no SCRAM. So ``--mech`` must name one of
those three (without it: PLAIN with a password, EXTERNAL with a client certificate, else ANONYMOUS).
With TLS, pyamqp ignores the port in the client's host name and dials 5671: the port goes in
``custom_endpoint_address`` instead.
"""

from __future__ import annotations

import argparse
import ssl

import clientkit
from azure.servicebus._pyamqp.constants import AUTH_TYPE_SASL_PLAIN
from azure.servicebus._pyamqp.sasl import SASLAnonymousCredential, SASLExternalCredential, SASLPlainCredential


class SaslAuth:
    """An ``auth`` for pyamqp's clients: its SASL layer with one credential (``auth_type`` SASL, not CBS)."""

    auth_type = AUTH_TYPE_SASL_PLAIN

    def __init__(self, credential):
        self.sasl = credential


def mechanism(a: argparse.Namespace) -> str:
    mechs = [m.upper() for m in (a.mech or "").split()]
    if len(mechs) > 1:
        clientkit.unsupported(a, f"several SASL mechanisms ({a.mech}): pyamqp offers exactly one")
    if mechs:
        return mechs[0]
    if a.password is not None:
        return "PLAIN"
    if a.tls_cert is not None:
        return "EXTERNAL"
    return "ANONYMOUS"


def client_options(a: argparse.Namespace) -> dict:
    """``auth``, ``use_tls`` and ``ssl_context`` for the clients (none given: ANONYMOUS in clear)."""
    mech = mechanism(a)
    if mech == "PLAIN":
        if a.user is None or a.password is None:
            clientkit.usage_error(a, "PLAIN needs --user and --password")
        credential = SASLPlainCredential(a.user, a.password)
    elif mech == "EXTERNAL":
        if a.tls_cert is None:
            clientkit.usage_error(a, "EXTERNAL needs a client certificate (--tls-cert)")
        credential = SASLExternalCredential()
    elif mech == "ANONYMOUS":
        credential = SASLAnonymousCredential()
    else:
        clientkit.unsupported(a, f"SASL mechanism {mech} (pyamqp has PLAIN, EXTERNAL, ANONYMOUS)")
    opts: dict = {"auth": SaslAuth(credential), "use_tls": a.tls_ca is not None}
    if a.tls_ca is not None:
        context = ssl.create_default_context(cafile=a.tls_ca)  # CERT_REQUIRED, check_hostname
        if a.tls_cert is not None:
            context.load_cert_chain(a.tls_cert, a.tls_key)
        opts["ssl_context"] = context
        # pyamqp's Connection drops the endpoint's port once use_tls is on (it dials 5671); the SDK's
        # custom endpoint address is how to name another port (and the server name checked).
        opts["custom_endpoint_address"] = f"amqps://{a.host}:{a.port}"
    return opts
