"""The adapter: the only part of the router that talks to proton.

- ``server.py``: the ``selectors`` loop, listening and accepted sockets, one
  server-mode ``pn_transport`` + ``pn_connection`` + ``pn_collector`` per
  connection, transport ticks, the write discipline (event log flushed before any
  frame is written) and the shutdown sequence.
- ``engine.py``: translation, nothing decided. ``AMQP_*`` methods turn engine
  events into core events; ``CORE_*`` methods execute core commands as proton calls.
- ``endpoints.py``: per-connection / per-link state and the rare-path proton calls
  (attach fields, terminus mirroring, link properties, conditions).
"""

from router.adapter.server import Listener, Server

__all__ = ["Server", "Listener"]
