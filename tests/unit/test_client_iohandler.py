"""The client's proton I/O handler survives a selectable that expires after its transport
went (router/client/iohandler.py): proton's own raises out of Container.run() and kills
the client's I/O thread (seen under CPU load in tests/integration/test_network_races.py)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from proton.handlers import IOHandler

from router.client.iohandler import GuardedIOHandler


def _expired_without_transport():
    reactor = SimpleNamespace(now=1.0)
    return SimpleNamespace(selectable=SimpleNamespace(_transport=None, _reactor=reactor, _terminated=True))


def test_proton_s_handler_raises_on_it():
    """Why the guard exists; when this stops raising, proton fixed it and the guard can go."""
    with pytest.raises(AttributeError):
        IOHandler().on_selectable_expired(_expired_without_transport())


def test_the_guarded_handler_skips_it():
    GuardedIOHandler().on_selectable_expired(_expired_without_transport())


def test_the_containers_made_for_the_clients_run_it():
    """(The resumable client and the tests' harness make theirs with new_container.)"""
    from router.client.iohandler import new_container

    assert isinstance(new_container().global_handler.base, GuardedIOHandler)
