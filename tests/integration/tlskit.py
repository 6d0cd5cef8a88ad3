"""The test PKI (eorouter_tools/pki.py, shared with the TLS benchmark), under the name the tests import."""

from eorouter_tools.pki import Pki, other_ca

__all__ = ["Pki", "other_ca"]
