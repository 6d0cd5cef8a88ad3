"""Whether the core takes subscribers' accepted answers through its compiled twin.

``router/core/_answers.c`` (built by ``pip install``, optional) is the compiled twin of
``RouterCore.accepted_batch`` (router/core/router.py, the specification): the same
commands and the same state, on the same objects, faster for the usual cases.
``accepted_batch`` here is that function bound to the core's classes, or None when it
is not built, was built from another version of the file, or ``EOROUTER_FASTPATH=0``
(the switch that also turns the adapter's compiled path off, router/adapter/fastpath.py)
is set. tests/unit/test_answers_compiled.py plays both.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Callable
from typing import Any

from router.core import outcomes
from router.core.commands import Log, SendOutcome, SubOutcomes
from router.core.links import PublisherLink, Subscription, Topic
from router.core.records import ANSWER_ACCEPTED, ANSWER_DONE, DeliveryRecord, Roster
from router.core.settled import StreamSettled

ENV = "EOROUTER_FASTPATH"

#: accepted_batch(core, items, now, out), or None: the core runs router.py's loop.
accepted_batch: Callable[[Any, list[Any], float, list[Any]], None] | None = None
status = "python"  # what this process uses, for the startup log


def _load() -> None:
    global accepted_batch, status
    if os.environ.get(ENV, "1").strip().lower() in ("0", "off", "no", "false"):
        status = f"python ({ENV}=0)"
        return
    try:
        # By name, as the adapter loads its own: a compiled module is not in the import graph.
        compiled = importlib.import_module("router.core._answers")
        compiled.bind(
            DeliveryRecord,
            Subscription,
            Roster,
            PublisherLink,
            Topic,
            StreamSettled,
            SubOutcomes,
            Log,
            SendOutcome,
            outcomes.OUTCOME_ACCEPTED,
            ANSWER_ACCEPTED,
            ANSWER_DONE,
        )
    except (ImportError, AttributeError, TypeError) as exc:  # not built, or built from another version
        status = f"python (compiled answers unusable: {exc})"
        return
    accepted_batch = compiled.accepted_batch
    status = "compiled"


_load()
