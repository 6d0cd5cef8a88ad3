"""Which of the core's steps run as their compiled twins: a publisher's message and
subscribers' accepted answers.

Two optional C extensions (built by ``pip install``, setup.py) are twins of the core's
most frequent steps, for their usual cases, on the same objects (one representation:
the records, links, topics and settled memory the Python core keeps):

- ``router/core/_admission.c``: ``RouterCore._on_message`` (admission.py), a new
  delivery owed to this router's subscribers only;
- ``router/core/_answers.c``: ``RouterCore.accepted_batch`` (router.py), a copy's
  accepted answer and the last one that completes a delivery.

and ``handle_message`` (in ``_admission.c``) is ``RouterCore.handle`` for a publisher's
message, the adapter's call for each (``RouterCore.handle_message``).

The Python methods are the specification: each twin hands what is not its usual case
to them before changing anything. ``on_message`` and ``accepted_batch`` here are the
twins bound to the core's classes, or None when not built, built from another version
of their file, or ``EOROUTER_FASTPATH=0`` (the switch that also turns the adapter's
compiled path off, router/adapter/fastpath.py) is set. tests/unit/test_core_compiled.py
plays generated histories through a core with them and one without.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Callable
from functools import partial
from typing import Any

from router.core import outcomes, sections, tags
from router.core.commands import Completed, Forward, Received, SendOutcome, SubOutcomes
from router.core.constants import _TIMER_EXPIRY, UNCOUNTED_BELOW
from router.core.events import MessageReceived
from router.core.guarantees import EXACTLY_ONCE
from router.core.links import PublisherLink, Subscription, Topic
from router.core.message import OriginTemplate
from router.core.records import ANSWER_ACCEPTED, ANSWER_DONE, ANSWER_UNSENT, DeliveryRecord, Roster
from router.core.settled import StreamSettled

ENV = "EOROUTER_FASTPATH"

#: on_message(core, event, now, out), or None: the core runs admission.py.
on_message: Callable[[Any, Any, float, list[Any]], None] | None = None
#: accepted_batch(core, items, now, out), or None: the core runs router.py's loop.
accepted_batch: Callable[[Any, list[Any], float, list[Any]], None] | None = None
#: handle_message(core, event, now) -> commands: RouterCore.handle for a MessageReceived
#: whose handler is on_message, or None.
handle_message: Callable[[Any, Any, float], list[Any]] | None = None
status = "python"  # what this process uses, for the startup log


def _load() -> None:
    global on_message, accepted_batch, handle_message, status
    if os.environ.get(ENV, "1").strip().lower() in ("0", "off", "no", "false"):
        status = f"python ({ENV}=0)"
        return
    try:
        # By name, as the adapter loads its own: a compiled module is not in the import graph.
        admission = importlib.import_module("router.core._admission")
        answers = importlib.import_module("router.core._answers")
        admission.bind(
            PublisherLink,
            Topic,
            Roster,
            Subscription,
            StreamSettled,
            DeliveryRecord,
            Forward,
            Received,
            EXACTLY_ONCE,
            ANSWER_UNSENT,
            tags.MAX_INLINE_TAG,
            UNCOUNTED_BELOW,
            _TIMER_EXPIRY,
            OriginTemplate,
            sections._EMPTY_HEADER,
            sections._EMPTY_PROPERTIES,
            sections._DATA,
        )
        answers.bind(
            DeliveryRecord,
            Subscription,
            Roster,
            PublisherLink,
            Topic,
            StreamSettled,
            SubOutcomes,
            Completed,
            SendOutcome,
            outcomes.OUTCOME_ACCEPTED,
            ANSWER_ACCEPTED,
            ANSWER_DONE,
        )
    except (ImportError, AttributeError, TypeError) as exc:  # not built, or built from another version
        status = f"python (compiled core unusable: {exc})"
        return
    on_message, accepted_batch = admission.on_message, answers.accepted_batch
    handle_message = admission.handle_message
    status = "compiled"


def install(core: Any) -> None:
    """Give ``core`` (a new RouterCore) the compiled twins, when they are in use."""
    if on_message is not None and accepted_batch is not None and handle_message is not None:
        # (partial: a C-level call, no Python frame of its own)
        core._handlers[MessageReceived] = partial(on_message, core)
        core.accepted_batch = partial(accepted_batch, core)
        core.handle_message = partial(handle_message, core)


def uninstall(core: Any) -> None:
    """Give ``core`` back its Python steps (tests compare the two)."""
    core._handlers[MessageReceived] = core._on_message
    vars(core).pop("accepted_batch", None)
    vars(core).pop("handle_message", None)


_load()
