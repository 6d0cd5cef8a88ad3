"""The resumable client's pure parts: state file (snapshot + journal), unsettled list
encoding and cutting, failover list, dedup window, ledger lines."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from hypothesis import given
from hypothesis import strategies as st
from proton import Data, symbol

from router.client.ledger import FIELDS, Ledger, read_ledger
from router.client.protocol import (
    INCARNATION,
    INCOMPLETE,
    RESUME,
    UNSETTLED,
    Backoff,
    ResumeError,
    cut_unsettled,
    entry_size,
    failover_urls,
    list_size,
    merge_urls,
    normalise_url,
    publisher_tag_of,
    read_answer,
    resume_properties,
    unsettled_budget,
)
from router.client.state import PublisherState, StateError, SubscriberState
from router.core.tags import outgoing_tag, stream_id

IDENT = {"container_id": "c1", "link_name": "l1", "topic": "t1"}


def encoded_size(value) -> int:
    data = Data()
    data.put_object(value)
    return len(data.encode())


# --------------------------------------------------------------------------- publisher state


def test_publisher_state_round_trip(tmp_path):
    path = tmp_path / "p.state"
    st1 = PublisherState(path, **IDENT)
    assert st1.incarnation is None and st1.next_tag == 1 and not st1.resumed_from_file
    st1.record_incarnation("boot.1")
    tags = [st1.record_sent(f"msg{i}".encode(), seq=st1.take_seq()) for i in range(5)]
    assert tags == [b"1", b"2", b"3", b"4", b"5"]
    st1.record_outcome(b"2", "accepted")
    st1.record_settled(b"1")
    st1.record_attached()
    st1.close()

    st2 = PublisherState(path, **IDENT)
    assert st2.resumed_from_file and st2.attached_once
    assert st2.incarnation == "boot.1"
    assert st2.next_tag == 6 and st2.next_seq == 6
    assert list(st2.unsettled) == [b"2", b"3", b"4", b"5"]
    assert st2.unsettled[b"2"].outcome == "accepted" and st2.unsettled[b"3"].payload == b"msg2"
    assert st2.entries() == [(b"2", "accepted"), (b"3", "none"), (b"4", "none"), (b"5", "none")]
    # the next tag is never one used before, even for settled deliveries
    assert st2.record_sent(b"x", None) == b"6"
    st2.close()


def test_publisher_state_survives_torn_journal_tail(tmp_path):
    path = tmp_path / "p.state"
    s = PublisherState(path, **IDENT)
    s.record_sent(b"a", 1)
    s.record_sent(b"b", 2)
    s.close()
    with open(str(path) + ".journal", "a") as fh:
        fh.write('{"op":"sent","n":3,"seq":3,"ms')  # killed mid-write
    s2 = PublisherState(path, **IDENT)
    assert list(s2.unsettled) == [b"1", b"2"] and s2.next_tag == 3
    s2.close()


def test_journal_of_an_older_generation_is_ignored(tmp_path):
    """A crash between writing the snapshot and resetting the journal leaves a
    journal of the previous generation, already folded into the snapshot: it is
    not replayed (a line in it is not applied twice)."""
    path = tmp_path / "p.state"
    s = PublisherState(path, **IDENT)
    s.close()
    generation = json.loads(path.read_text())["generation"]
    journal = tmp_path / "p.state.journal"
    assert json.loads(journal.read_text().splitlines()[0]) == {"generation": generation}
    stale = {"op": "sent", "n": 9, "seq": 9, "msg": ""}
    journal.write_text(json.dumps({"generation": generation - 1}) + "\n" + json.dumps(stale) + "\n")
    s = PublisherState(path, **IDENT)
    assert not s.unsettled and s.next_tag == 1
    s.close()
    journal.write_text(json.dumps({"generation": s.store.generation}) + "\n" + json.dumps(stale) + "\n")
    s = PublisherState(path, **IDENT)
    assert list(s.unsettled) == [b"9"] and s.next_tag == 10
    s.close()


def test_compaction_keeps_state_and_bounds_the_journal(tmp_path):
    path = tmp_path / "p.state"
    s = PublisherState(path, compact_min=10, **IDENT)
    for i in range(100):
        tag = s.record_sent(b"m", i + 1)
        if i % 3:
            s.record_settled(tag)
    lines = (tmp_path / "p.state.journal").read_text().splitlines()
    assert len(lines) <= 1 + max(10, 2 * len(s.unsettled)) + 1
    kept = list(s.unsettled)
    s.close()
    s2 = PublisherState(path, **IDENT)
    assert list(s2.unsettled) == kept and s2.next_tag == 101
    s2.close()


def test_state_file_of_another_link_is_refused(tmp_path):
    path = tmp_path / "p.state"
    PublisherState(path, **IDENT).close()
    with pytest.raises(StateError, match="belongs to"):
        PublisherState(path, **{**IDENT, "link_name": "other"})
    with pytest.raises(StateError, match="belongs to"):
        SubscriberState(path, **IDENT)
    (tmp_path / "bad.state").write_text("{not json")
    with pytest.raises(StateError):
        PublisherState(tmp_path / "bad.state", **IDENT)


def test_snapshot_is_replaced_atomically(tmp_path):
    path = tmp_path / "p.state"
    s = PublisherState(path, **IDENT)
    s.record_sent(b"m", 1)
    s.compact()
    s.close()
    assert not (tmp_path / "p.state.tmp").exists()
    body = json.loads(path.read_text())
    assert body["format"] == "eorouter-client-state" and body["role"] == "publisher"
    assert body["unsettled"][0]["tag"] == b"1".hex()


# --------------------------------------------------------------------------- subscriber state / dedup


def test_subscriber_state_round_trip_and_dedup(tmp_path):
    path = tmp_path / "s.state"
    s = SubscriberState(path, **IDENT)
    t1, t2, t3 = b"\x01" * 18, b"\x02" * 18, b"\x03" * 18
    s.record_delivered(t1, "accepted", now=100.0)
    s.record_delivered(t2, "rejected", now=100.0)
    s.record_delivered(t3, "accepted", settled=True, now=100.0)  # arrived settled
    s.record_settled(t1, now=101.0)
    assert s.seen(t1) == "accepted" and s.seen(t2) == "rejected" and s.seen(t3) == "accepted"
    assert s.entries() == [(t2, "rejected")]
    s.close()
    s2 = SubscriberState(path, **IDENT)
    assert s2.entries() == [(t2, "rejected")]
    assert s2.seen(t1) == "accepted" and s2.seen(t3) == "accepted" and s2.seen(b"\x09" * 18) is None
    s2.close()


def test_dedup_window_trims_only_old_settled_tags(tmp_path):
    s = SubscriberState(tmp_path / "s.state", dedup_window=3, dedup_linger=10.0, **IDENT)
    tags = [bytes([i]) * 18 for i in range(10)]
    for tag in tags:
        s.record_delivered(tag, "accepted", now=0.0)
    for tag in tags[:8]:
        s.record_settled(tag, now=0.0)
    # within the linger nothing settled is dropped, however many there are
    assert all(s.seen(t) for t in tags)
    assert s.trim(now=5.0) == 0
    # past the linger, only the newest 3 settled stay; unsettled ones always stay
    assert s.trim(now=20.0) == 5
    assert [s.seen(t) is not None for t in tags] == [False] * 5 + [True] * 5
    s.close()


@given(st.lists(st.tuples(st.integers(0, 30), st.booleans()), max_size=60))
def test_dedup_never_forgets_an_unsettled_tag(tmp_path_factory, ops):
    s = SubscriberState(tmp_path_factory.mktemp("d") / "s.state", dedup_window=2, dedup_linger=0.0, **IDENT)
    unsettled = set()
    for n, settle in ops:
        tag = bytes([n]) * 18
        if s.seen(tag) is None:
            s.record_delivered(tag, "accepted", now=0.0)
            unsettled.add(tag)
        elif settle and tag in unsettled:
            s.record_settled(tag, now=1.0)
            unsettled.discard(tag)
        s.trim(now=100.0)
        assert all(s.seen(t) == "accepted" for t in unsettled)
        assert len(s.settled) <= 2
    s.close()


# --------------------------------------------------------------------------- unsettled list


def test_entry_size_bounds_proton_encoding():
    for tag_len in (1, 5, 15, 17, 31, 32):
        for state in ("none", "accepted", "rejected", "released", "modified"):
            tag = b"\xab" * tag_len
            assert encoded_size([tag, state]) <= entry_size(tag, state)
    entries = [(str(i).encode(), "none") for i in range(1, 600)]
    assert encoded_size([[t, s] for t, s in entries]) <= list_size(entries)


@given(
    st.lists(
        st.tuples(st.binary(min_size=1, max_size=32), st.sampled_from(["none", "accepted", "rejected", "released", "modified"])),
        max_size=80,
    ),
    st.integers(0, 4000),
)
def test_cut_is_the_longest_fitting_prefix(entries, budget):
    reported, incomplete = cut_unsettled(entries, budget)
    assert reported == entries[: len(reported)]
    assert incomplete == (len(reported) < len(entries))
    if reported:
        assert list_size(reported) <= budget
        assert encoded_size([[t, s] for t, s in reported]) <= budget
    if incomplete:
        assert list_size(entries[: len(reported) + 1]) > budget


def test_resume_properties_and_budget():
    entries = [(str(i).encode(), "none") for i in range(1, 501)]
    budget = unsettled_budget(32768, name="link", address="topic")
    props, reported, incomplete = resume_properties(entries, budget, incarnation="boot.7")
    assert not incomplete and len(reported) == 500  # a full 500 window fits proton's default frame
    assert props[RESUME] is True and props[INCARNATION] == "boot.7" and INCOMPLETE not in props
    assert props[UNSETTLED][0] == [b"1", "none"]
    # the whole properties map, as proton encodes it, fits the budget's frame
    sym = {symbol(k): v for k, v in props.items()}
    assert encoded_size(sym) + 1024 <= 32768
    small = unsettled_budget(4096, name="link", address="topic")
    props, reported, incomplete = resume_properties(entries, small)
    assert incomplete and props[INCOMPLETE] is True and 0 < len(reported) < 500
    assert reported == entries[: len(reported)]
    assert unsettled_budget(512) == 0  # AMQP's minimum frame: nothing fits, everything is "incomplete"
    assert unsettled_budget(0) == unsettled_budget(2**32 - 1)  # 0: no limit, our cap applies
    with pytest.raises(ResumeError):
        resume_properties([(b"x" * 33, "none")], 1000)
    with pytest.raises(ResumeError):
        resume_properties([(b"x", "settled")], 1000)


def test_read_answer():
    tag = b"\x00\xff" * 9
    answer = read_answer({symbol(UNSETTLED): [[memoryview(tag), "accepted"]], symbol(INCARNATION): "b.1"})
    assert answer.speaks_resume and answer.unsettled == {tag: "accepted"} and answer.incarnation == "b.1"
    assert not read_answer({symbol(INCARNATION): "b.1"}).speaks_resume
    assert read_answer(None).unsettled is None
    assert read_answer({symbol(UNSETTLED): []}).unsettled == {}
    with pytest.raises(ResumeError):
        read_answer({symbol(UNSETTLED): {"a": "b"}})
    with pytest.raises(ResumeError):
        read_answer({symbol(UNSETTLED): [[b"t", "bogus"]]})


def test_publisher_tag_of_a_disambiguated_tag():
    stream = stream_id("c", "l", "inc")
    assert publisher_tag_of(outgoing_tag(stream, b"42")) == b"42"
    assert publisher_tag_of(outgoing_tag(stream, b"x" * 20)) is None  # hashed
    assert publisher_tag_of(b"short") is None


# --------------------------------------------------------------------------- failover list


def test_failover_urls_and_merge():
    props = {
        symbol("failover-server-list"): [
            {"hostname": "r2.example", "network-host": "127.0.0.1", "port": "5772", "scheme": "amqp"},
            {"hostname": "127.0.0.2", "port": 5872},
            {"network-host": "127.0.0.3", "port": "5972", "scheme": "amqps"},  # not ours: skipped
            {"network-host": "::1", "port": 5672},
            "garbage",
            {"port": 1},
        ]
    }
    assert failover_urls(props) == ["127.0.0.1:5772", "127.0.0.2:5872", "[::1]:5672"]
    assert failover_urls(props, tls=True) == ["127.0.0.3:5972"]  # a TLS client takes the amqps routers only
    assert failover_urls({}) == [] and failover_urls(None) == []
    assert merge_urls(["amqp://127.0.0.1:5672", "127.0.0.1:5772"], ["127.0.0.1:5772", "h:1"]) == [
        "127.0.0.1:5672",
        "127.0.0.1:5772",
        "h:1",
    ]
    assert normalise_url("amqp://user@host") == "host:5672"
    assert normalise_url("amqps://host:1") == "host:1"  # TLS is the client's ssl_domain, for every router
    with pytest.raises(ValueError):
        normalise_url("http://host:1")


def test_backoff_goes_round_the_list_first():
    b = Backoff(0.1, 1.0)
    assert [b.next_delay(3) for _ in range(3)] == [0.0, 0.0, 0.0]
    assert [b.next_delay(3) for _ in range(3)] == [0.1, 0.1, 0.1]
    assert b.next_delay(3) == 0.2
    for _ in range(30):
        last = b.next_delay(3)
    assert last == 1.0
    b.reset()
    assert b.next_delay(3) == 0.0


# --------------------------------------------------------------------------- ledger


def test_ledger_lines(tmp_path):
    path = tmp_path / "l.jsonl"
    ledger = Ledger(path, client="c1", link="l1", role="subscriber", topic="t")
    ledger.write("delivered", delivery="ab", pub_tag="31", seq=1, outcome="accepted", router="h:1")
    ledger.write("resumed", router="h:2", reported=3)
    with pytest.raises(ValueError):
        ledger.write("bogus")
    ledger.close()
    with open(path, "a") as fh:
        fh.write('{"ts": 1, "cli')  # torn tail
    lines = read_ledger(path)
    assert [list(line)[: len(FIELDS)] for line in lines] == [list(FIELDS)] * 2
    assert lines[0]["event"] == "delivered" and lines[0]["client"] == "c1" and lines[0]["seq"] == 1
    assert lines[1]["reported"] == 3 and lines[1]["delivery"] is None


def test_client_package_is_not_imported_by_the_core():
    code = "import router.core.router, router.adapter, sys; assert not [m for m in sys.modules if m.startswith('router.client')]"
    subprocess.run([sys.executable, "-c", code], check=True)
