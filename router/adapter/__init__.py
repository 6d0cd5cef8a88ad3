"""The adapter: the only part of the router that talks to proton.

- ``server.py``: the ``selectors`` loop, listening and accepted sockets, one
  server-mode ``pn_transport`` + ``pn_connection`` + ``pn_collector`` per
  connection, transport ticks, the write discipline (event log flushed before any
  frame is written) and the shutdown sequence.
- ``engine.py``: translation, nothing decided. ``AMQP_*`` methods turn engine
  events into core events; ``CORE_*`` methods execute core commands as proton calls.
- ``endpoints.py``: per-connection / per-link state and the rare-path proton calls
  (attach fields, terminus mirroring, link properties, conditions).
- ``interrouter.py``: inter-router connections (docs/inter-router.md): the
  identity/HMAC handshake, the control and data links, batching ``SendControl``
  per neighbour per iteration, ``SendData`` with a bounded queue, and the
  refusals of the protocol on client listeners. Wire formats live in the pure
  ``router/interrouter_codec.py``.
"""

from router.adapter.server import Dialer, Listener, Server

__all__ = ["Server", "Listener", "Dialer"]
