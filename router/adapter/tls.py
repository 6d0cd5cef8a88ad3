"""TLS through Qpid Proton's own SSL layer (OpenSSL): one ``pn_ssl_domain`` per
listener or connector, built at start from its TlsSettings, and a ``pn_ssl`` on
each of its transports (docs/configuration.md, "TLS").

A listener with TLS refuses clients that do not speak it unless ``allow_plain``
(proton then tells the two apart by their first bytes). A connector verifies the
server's certificate against its CAs and the name it dials (or ``server_name``).
"""

from __future__ import annotations

from typing import Any

from cproton_ffi import ffi, lib

#: min_protocol -> the protocols proton may negotiate (pn_ssl_domain_set_protocols)
_PROTOCOLS = {"TLSv1.2": b"TLSv1.2 TLSv1.3", "TLSv1.3": b"TLSv1.3"}


class TlsError(Exception):
    """A listener's or connector's TLS settings cannot be used (a certificate or key
    that does not load, a password that does not open the key)."""


def _password(settings: Any) -> Any:
    if settings.key_password_file is None:
        return ffi.NULL
    return settings.key_password_file.read_text().strip().encode()


def server_domain(settings: Any, where: str) -> Any:
    """The domain of a TLS listener."""
    domain = lib.pn_ssl_domain(lib.PN_SSL_MODE_SERVER)
    if domain == ffi.NULL:
        raise TlsError(f"{where}: this Qpid Proton has no TLS support")
    _common(domain, settings, where)
    if settings.require_client_cert:
        rc = lib.pn_ssl_domain_set_peer_authentication(domain, lib.PN_SSL_VERIFY_PEER, str(settings.ca_file).encode())
    else:
        rc = lib.pn_ssl_domain_set_peer_authentication(domain, lib.PN_SSL_ANONYMOUS_PEER, ffi.NULL)
    if rc:
        raise TlsError(f"{where}: cannot set up client certificate checks with {settings.ca_file}")
    if settings.allow_plain and lib.pn_ssl_domain_allow_unsecured_client(domain):
        raise TlsError(f"{where}: cannot also allow plain clients")
    return domain


def client_domain(settings: Any, where: str) -> Any:
    """The domain of a TLS connector: the server's certificate is verified, name included."""
    domain = lib.pn_ssl_domain(lib.PN_SSL_MODE_CLIENT)
    if domain == ffi.NULL:
        raise TlsError(f"{where}: this Qpid Proton has no TLS support")
    _common(domain, settings, where)
    if lib.pn_ssl_domain_set_peer_authentication(domain, lib.PN_SSL_VERIFY_PEER_NAME, ffi.NULL):
        raise TlsError(f"{where}: cannot require the server's certificate")
    return domain


def _common(domain: Any, settings: Any, where: str) -> None:
    if settings.cert_file is not None:
        rc = lib.pn_ssl_domain_set_credentials(
            domain, str(settings.cert_file).encode(), str(settings.key_file).encode(), _password(settings)
        )
        if rc:
            raise TlsError(
                f"{where}: cannot load the certificate {settings.cert_file} with the key "
                f"{settings.key_file} (a wrong file, a key that does not match, or a wrong password)"
            )
    if settings.ca_file is not None and lib.pn_ssl_domain_set_trusted_ca_db(domain, str(settings.ca_file).encode()):
        raise TlsError(f"{where}: cannot load the CA certificates {settings.ca_file}")
    if lib.pn_ssl_domain_set_protocols(domain, _PROTOCOLS[settings.min_protocol]):
        raise TlsError(f"{where}: this OpenSSL does not offer {settings.min_protocol}")


def secure(transport: Any, domain: Any, peer_hostname: str | None = None) -> None:
    """Put ``transport`` under TLS with ``domain``."""
    ssl = lib.pn_ssl(transport)
    if lib.pn_ssl_init(ssl, domain, ffi.NULL):
        raise TlsError("cannot start TLS on a connection")
    if peer_hostname:
        lib.pn_ssl_set_peer_hostname(ssl, peer_hostname.encode())


def peer_common_name(transport: Any) -> str | None:
    """The common name of the certificate the peer of a TLS ``transport`` presented
    (None: none). Inter-router connections check it against the router id the peer
    announces (interrouter.py)."""
    ssl = lib.pn_ssl(transport)
    if ssl == ffi.NULL:
        return None
    name = lib.pn_ssl_get_remote_subject_subfield(ssl, lib.PN_SSL_CERT_SUBJECT_COMMON_NAME)
    return ffi.string(name).decode("utf-8", "replace") if name != ffi.NULL else None
