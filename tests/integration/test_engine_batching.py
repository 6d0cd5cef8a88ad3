"""The adapter's batch of accepted dispositions, in one process: a real ``Engine``
(proton's C engine) serving a subscriber whose client is a raw proton connection,
their transports wired back to back in memory, and a recording core. What a router
process cannot show on demand is driven here: several dispositions and a detach
read in one go, and a core that fails in the middle of a batch."""

from __future__ import annotations

import pytest
from cproton_ffi import ffi, lib
from enginekit import Subscriber, serve
from test_interrouter_flow import FakeLog, _conn

from router.adapter import fastpath
from router.adapter.engine import Engine
from router.core.commands import Forward, Log, OpenLink
from router.core.events import CreditChanged, LinkAttached, LinkDetached

pytestmark = pytest.mark.timeout(60)

TAGS = (b"t1", b"t2", b"t3")


@pytest.fixture(autouse=True, params=["compiled", "python"])
def path(request, monkeypatch):
    """Every test on both of the adapter's paths for accepted dispositions (fastpath.py)."""
    if request.param == "python":
        for name in ("take_accepted", "take_messages", "_forward", "_deliver_answers"):
            monkeypatch.setattr(fastpath, name, None)
    elif fastpath.take_accepted is None:
        pytest.skip(f"compiled fast path not in use: {fastpath.status}")
    return request.param


class RecordingCore:
    """Opens every link and sends a subscriber three deliveries; records every call."""

    def __init__(self, fail_after: int | None = None):
        self.calls: list = []
        self.fail_after = fail_after  # accepted_batch raises after this many items

    def handle(self, event, now):
        self.calls.append(event)
        if isinstance(event, LinkAttached):
            return [OpenLink(event.link_id)] + [Forward(event.link_id, tag, b"\x00Sw\xa1\x01x", False) for tag in TAGS]
        return []

    def accepted_batch(self, items, now, out):
        triples = [tuple(items[i : i + 3]) for i in range(0, len(items), 3)]
        self.calls.append(("accepted_batch", triples))
        for n, (_link, tag, _settled) in enumerate(triples):
            if n == self.fail_after:
                raise RuntimeError("core bug")
            out.append(Log("sub-outcome", {"delivery": tag.hex()}))

    def next_deadline(self):
        return None

    def failover_list(self):
        return []


def setup(core: RecordingCore):
    engine = Engine(core, FakeLog(1, "boot"), max_message_size=1 << 20)
    conn = _conn(True, "router")
    client = Subscriber(credit=10)
    serve(engine, conn, client)
    assert len(client.received) == len(TAGS)
    return engine, conn, client


def answer_all_then_detach(client: Subscriber) -> None:
    """Accept and settle every delivery, then detach, before the router reads a byte."""
    for d in client.received:
        lib.pn_delivery_update(d, lib.PN_ACCEPTED)
        lib.pn_delivery_settle(d)
    lib.pn_link_close(client.link)


def test_accepted_dispositions_reach_the_core_as_one_batch_before_the_detach_behind_them():
    core = RecordingCore()
    engine, conn, client = setup(core)
    link_id = core.calls[0].link_id
    answer_all_then_detach(client)
    serve(engine, conn, client)
    after_attach = [c for c in core.calls[1:] if not isinstance(c, CreditChanged)]  # the client's flow
    assert after_attach[0] == ("accepted_batch", [(link_id, tag, True) for tag in TAGS])
    assert isinstance(after_attach[1], LinkDetached) and after_attach[1].link_id == link_id
    assert engine.counts()["outgoing"] == 0  # every copy settled on our side and forgotten
    assert engine.eventlog.kinds() == ["sub-outcome"] * len(TAGS)


def test_a_core_failing_mid_batch_ends_that_connection_after_carrying_out_what_came_before():
    core = RecordingCore(fail_after=1)
    engine, conn, client = setup(core)
    answer_all_then_detach(client)
    serve(engine, conn, client)
    assert engine.eventlog.kinds() == ["sub-outcome"]  # the first item's command was carried out
    condition = lib.pn_connection_remote_condition(client.connection)
    assert ffi.string(lib.pn_condition_get_name(condition)) == b"amqp:internal-error"
    assert b"core bug" in ffi.string(lib.pn_condition_get_description(condition))
