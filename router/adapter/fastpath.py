"""Which path the adapter takes for subscribers' accepted dispositions, publishers'
whole messages, the copies it sends and publishers' outcomes: compiled or Python.

``router/adapter/_fastpath.c`` (built by ``pip install``, optional) moves a connection's
bytes between its socket and its transport (server.py's ``_read`` and ``_write``), consumes a run of
"accepted + settled" disposition events, or of publishers' messages that arrived whole,
in one call, gives those messages and answers and subscribers' credit to the core and executes its commands, sends a small
message's copy and a publisher's accepted outcome, and appends an event-log line;
``engine.Engine.drain``, ``Engine._messages_batch``, ``Engine._accepted_batch``, ``Engine.CORE_forward``,
``Engine.CORE_send_outcome`` and ``Engine.CORE_log`` do the same in Python when it is
absent or switched off. The
two must agree on every event: tests/integration/test_engine_batching.py and
test_fastpath.py run both.

``EOROUTER_FASTPATH=0`` in the environment switches the compiled path off (to compare
the two, or to rule it out).
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Callable
from functools import partial
from typing import Any

import cproton_ffi
from cproton_ffi import ffi, lib

ENV = "EOROUTER_FASTPATH"

# Both bound, or neither: take_accepted(collector_address, links, seen, items) -> int,
# take_messages(collector_address, links, items) -> int.
take_accepted: Callable[..., int] | None = None
take_messages: Callable[..., int] | None = None
_forward: Callable[..., None] | None = None  # forward(state, cmd): see forwarder()
_send_outcome: Callable[..., None] | None = None  # send_outcome(state, cmd): see outcome_sender()
_log_line: Callable[..., None] | None = None  # log_line(state, cmd): see log_writer()
_deliver_messages: Callable[..., None] | None = None  # deliver_messages(state, items, conn): see message_deliverer()
_deliver_answers: Callable[..., None] | None = None  # deliver_answers(state, items, conn): see answer_deliverer()
_take_flows: Callable[..., int] | None = None  # take_flows(state, collector_address, conn, answers_first): see flow_taker()
# A connection's socket and transport (server.py's _read and _write): read_into(transport_address,
# fd, most) -> bytes read or IO_*; write_out(transport_address, fd, most) -> IO_*.
read_into: Callable[[int, int, int], int] | None = None
write_out: Callable[[int, int, int], int] | None = None
IO_NOTHING, IO_BLOCKED, IO_CLOSED, IO_EOF = 0, 1, -1, -2  # as _fastpath.c defines them
_set_link_id = None
_log_buffer_type: Callable[[], Any] | None = None  # LogBuffer(): see log_buffer()
status = "python"  # what this process uses, for the startup log and the benchmark


def _load() -> None:
    global take_accepted, take_messages, _forward, _send_outcome, _log_line, _deliver_messages, _deliver_answers
    global read_into, write_out, _take_flows, _set_link_id, _log_buffer_type, status
    if os.environ.get(ENV, "1").strip().lower() in ("0", "off", "no", "false"):
        status = f"python ({ENV}=0)"
        return
    try:
        # By name: the import graph sees no compiled module, and would read
        # ``from router.adapter import _fastpath`` as an import of the package
        # router.adapter, whose server imports the engine, which imports this module
        # (a cycle that is not there: the extension imports nothing of ours).
        _fastpath = importlib.import_module("router.adapter._fastpath")
    except ImportError as exc:
        status = f"python (compiled fast path not built: {exc})"
        return
    try:
        _fastpath.bind(cproton_ffi.__file__, lib.PN_ACCEPTED)
        # All or none: an extension built from an older _fastpath.c (an editable install
        # not rebuilt) lacks the newer functions, and the router then runs in Python.
        compiled = (
            _fastpath.take_accepted,
            _fastpath.take_messages,
            _fastpath.forward,
            _fastpath.send_outcome,
            _fastpath.log_line,
            _fastpath.deliver_messages,
            _fastpath.deliver_answers,
            _fastpath.read_into,
            _fastpath.write_out,
            _fastpath.take_flows,
            _fastpath.LogBuffer,
        )
    except (ImportError, AttributeError) as exc:
        status = f"python (compiled fast path unusable: {exc})"
        return
    take_accepted, take_messages, _forward, _send_outcome, _log_line, _deliver_messages, _deliver_answers = compiled[:7]
    read_into, write_out, _take_flows, _log_buffer_type = compiled[7:]
    _set_link_id = _fastpath.set_link_id
    status = "compiled"


def address(ptr) -> int:
    """A proton pointer (cffi cdata) as the integer the compiled path takes."""
    return int(ffi.cast("uintptr_t", ptr))


def forwarder(state: tuple) -> Callable[[Any], None] | None:
    """Engine.CORE_forward's compiled twin bound to the engine's ``state`` (links,
    copies_sent, touched, CORE_forward itself for what it does not do, STREAM_MIN), or
    None when the compiled path is not in use."""
    return partial(_forward, state) if _forward is not None else None


def outcome_sender(state: tuple) -> Callable[[Any], None] | None:
    """Engine.CORE_send_outcome's compiled twin bound to the engine's ``state`` (handles,
    incoming, outcomes_told, touched, CORE_send_outcome itself for what it does not
    do), or None when the compiled path is not in use."""
    return partial(_send_outcome, state) if _send_outcome is not None else None


def log_buffer() -> Any:
    """A new buffer for an EventLog (its ``buffer``) that the compiled log writer
    appends lines to in place, or None (the log's own BytesIO) when the compiled path
    is not in use."""
    return _log_buffer_type() if _log_buffer_type is not None else None


def log_writer(state: tuple) -> Callable[[Any], None] | None:
    """Engine.CORE_log's compiled twin (EventLog.append inlined) bound to ``state``
    (the engine, its EventLog, the kinds it counts, the log's encoder, CORE_log itself
    for what it does not do), or None when the compiled path is not in use."""
    return partial(_log_line, state) if _log_line is not None else None


def message_deliverer(state: tuple) -> Callable[[list, Any], None] | None:
    """Engine._messages_batch's compiled twin (with dispatch and execute) bound to
    ``state`` (the engine, its links, incoming, handles, MessageReceived, the core's
    handle_message, the command table, the engine's ``_refused`` and
    ``_message_failed``, ProtocolError), or None when the compiled path is not in use."""
    return partial(_deliver_messages, state) if _deliver_messages is not None else None


def answer_deliverer(state: tuple) -> Callable[[list, Any], None] | None:
    """Engine._accepted_batch's compiled twin (with execute) bound to ``state`` (the
    engine, the core's accepted_batch, the event log, SubOutcomes, the command table, the
    engine's ``_answers_failed``), or None when the compiled path is not in use."""
    return partial(_deliver_answers, state) if _deliver_answers is not None else None


def flow_taker(state: tuple) -> Callable[[int, Any, bool], int] | None:
    """Engine.AMQP_link_flow's compiled twin for the run of subscribers' flow events at
    the head of a collector (with dispatch and execute), bound to ``state`` (the engine,
    its links, CreditChanged, the core's handle, the command table, the engine's
    ``_refused``, ProtocolError, PN_LINK_FLOW), or None when the compiled path is not in
    use. Called as (collector_address, conn, answers_first)."""
    return partial(_take_flows, state) if _take_flows is not None else None


def mark_link(ptr, link_id: int) -> None:
    """Mark a client link as the adapter's ``link_id``: only marked links' events take
    the compiled path (a subscriber's accepted dispositions, a publisher's messages).
    0 unmarks it."""
    if _set_link_id is not None:
        _set_link_id(address(ptr), link_id)


_load()
