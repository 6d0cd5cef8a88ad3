"""A delivery's place in its publisher stream is the smallest stream_seq any router logged
for it (spark/reconcile.py ``group_deliveries``): its first numbering, by the origin that
took it from the publisher in order. A new origin that did not hold it when the publisher
resumed there numbers the resend above everything it asked about (docs/resumption.md),
so that later number says nothing of the delivery's place. Found under CPU load
(tests/failover/test_resume_under_load.py): taking whichever router's number came first
called 453 sends and 502 applications' hand-overs out of order that were in order."""

from __future__ import annotations

import json

import pytest

from spark import load, reconcile

BOOT = {"A": "b00ta", "B": "b00tb"}


def _line(router: str, seq: int, event: str, **fields) -> str:
    line = {"seq": seq, "ts": 1763785200.0 + seq, "router": router, "epoch": 1, "boot": BOOT[router], "event": event}
    return json.dumps({**line, **fields})


def _received(router: str, seq: int, stream_seq: int, **fields) -> str:
    return _line(
        router,
        seq,
        "received",
        delivery="d1",
        topic="t",
        publisher="p",
        link_name="p-out",
        pub_tag="01",
        incarnation="i.1",
        stream_seq=stream_seq,
        size=1,
        settled=False,
        owed=[],
        forwarded=[],
        **fields,
    )


@pytest.mark.parametrize("first_life", ["A", "B"])
def test_the_first_numbering_of_a_delivery_is_its_place(spark, tmp_path, first_life):
    renumbered = "B" if first_life == "A" else "A"
    numbers = {first_life: 7, renumbered: 1_795_747_531_059_144}  # a resend numbered from the clock
    inputs = []
    for router in ("A", "B"):
        events = tmp_path / router / "events"
        events.mkdir(parents=True)
        lines = [_line(router, 1, "router-started"), _received(router, 2, numbers[router])]
        (events / "events-000001-000001.jsonl").write_text("\n".join(lines) + "\n")
        inputs.append(str(tmp_path / router))
    t = reconcile.prepare(spark, load.resolve(inputs), partitions=2)
    try:
        t.compute_facts()
        (row,) = t.facts.select("delivery", "stream_seq").collect()
    finally:
        t.unpersist()
    assert (row["delivery"], row["stream_seq"]) == ("d1", 7)


@pytest.mark.parametrize("reported", [True, False], ids=["reported-held", "never-held"])
def test_a_resend_of_what_a_resumed_subscriber_reported_holding_is_not_judged_for_order(spark, tmp_path, reported):
    """A subscriber that resumed at router B reported holding #1, which B had not seen (a
    placeholder). B sends it #2, then #1 when it comes: #1 is a resend the subscriber
    recognises (its application had it before #2), sent to have a live delivery to
    settle; the publisher, resumed at B, numbered it above what B held back behind it.
    Found under CPU load (test_resume_under_load [A]: 426 such sends called out of
    order, the applications' ledgers in order). A send of #1 nobody reported holding
    stays a violation."""
    events = tmp_path / "B" / "events"
    events.mkdir(parents=True)
    sub = "s/s-in"

    def received(seq, delivery, stream_seq):
        line = json.loads(_received("B", seq, stream_seq))
        return json.dumps({**line, "delivery": delivery, "pub_tag": delivery[-2:], "owed": [sub]})

    lines = [_line("B", 1, "router-started")]
    if reported:
        lines.append(_line("B", 2, "placeholder-created", delivery="d01", subscriber=sub))
    else:
        lines.append(_line("B", 2, "routes", reachable=[], next_hops=[]))
    lines += [
        received(3, "d02", 2),
        _line("B", 4, "forwarded", delivery="d02", subscriber=sub, link=1, settled=False),
        received(5, "d01", 1),
        _line("B", 6, "forwarded", delivery="d01", subscriber=sub, link=1, settled=False),
    ]
    (events / "events-000001-000001.jsonl").write_text("\n".join(lines) + "\n")
    t = reconcile.prepare(spark, load.resolve([str(tmp_path / "B")]), partitions=2)
    try:
        t.compute_facts()
        found = [row["delivery"] for row in reconcile.out_of_order(t).collect()]
    finally:
        t.unpersist()
    assert found == ([] if reported else ["d01"])
