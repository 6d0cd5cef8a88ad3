"""router.eventlog: epochs, write discipline, rotation, torn lines, the schema."""

from __future__ import annotations

import importlib
import os
import signal
import subprocess
import sys
from pathlib import Path

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from router import __version__
from router.eventlog import EventLog, EventLogError, read_events
from router.eventschema import EVENT_SCHEMA, EVENTS, FOLDED, spark_schema_fields, unfold, validate_event

REPO = Path(__file__).resolve().parents[2]

try:  # the adapter's compiled buffer a router's log writes into (router/adapter/_logbuffer.h)
    LogBuffer = importlib.import_module("router.adapter._fastpath").LogBuffer
except (ImportError, AttributeError):
    LogBuffer = None

# An EventLog's buffer: its own BytesIO (None), or the compiled LogBuffer a router gives it.
BUFFERS = [
    pytest.param(None, id="BytesIO"),
    pytest.param(LogBuffer, id="LogBuffer", marks=pytest.mark.skipif(LogBuffer is None, reason="_fastpath not built")),
]

SAMPLE_FIELDS = {
    "router-started": {"pid": 1234, "version": "0.1.0"},
    "link-attached": {
        "link": 3,
        "conn": 1,
        "container": "sub-1",
        "name": "recv-1",
        "role": "subscriber",
        "address": "orders",
        "durable": 2,
        "incarnation": "9f2c",
        "resumed": False,
    },
    "link-detached": {
        "link": 3,
        "container": "sub-1",
        "name": "recv-1",
        "role": "subscriber",
        "closed": False,
        "reason": "connection-lost",
    },
    "subscription-expired": {"container": "sub-1", "name": "recv-1", "address": "orders"},
    "received": {
        "delivery": "a1b2",
        "topic": "orders",
        "publisher": "pub-1",
        "link_name": "send-1",
        "pub_tag": "00000001",
        "incarnation": "77aa",
        "stream_seq": 1,
        "size": 100,
        "settled": False,
        "owed": ["sub-1/recv-1", "sub-2/recv-1"],
    },
    "forwarded": {"delivery": "a1b2", "subscriber": "sub-1/recv-1", "link": 3, "settled": False},
    "sub-outcome": {"delivery": "a1b2", "subscriber": "sub-1/recv-1", "outcome": "accepted", "settled": True},
    "pub-outcome": {"delivery": "a1b2", "outcome": "accepted", "condition": None, "reason": None},
    "settled": {"delivery": "a1b2", "by": "publisher"},
    "completed": {
        "delivery": "a1b2",
        "subscriber": "sub-1/recv-1",
        "outcome": "accepted",
        "settled": True,
        "pub_outcome": "accepted",
        "by": "router",
        "deleted": True,
    },
    "sub-outcomes": {"deliveries": ["a1b2", "c3d4"], "subscriber": "sub-1/recv-1", "outcome": "accepted", "settled": True},
    "record-deleted": {"delivery": "a1b2", "reason": "settled"},
    "expired": {"delivery": "a1b2", "subscriber": "sub-1/recv-1"},
    "router-stopping": {"reason": "SIGTERM"},
    "tag-collision": {"delivery": "a1b2", "link": 4, "container": "pub-1", "name": "send-1", "incarnation": "77aa"},
    "dropped": {"delivery": None, "reason": "malformed pre-settled message"},
    "peer-connected": {"peer": "B", "conn": 7, "peer_epoch": 2, "peer_boot": "422ab44afffadaaf", "role": "connector"},
    "peer-lost": {"peer": "B", "conn": 7, "reason": "amqp:resource-limit-exceeded: local-idle-timeout expired"},
    "peer-refused": {"peer": "B", "conn": 8, "reason": "wrong proof (auth): the secrets differ"},
    "forwarded-to-router": {"delivery": "ab12", "to_router": "B", "dests": ["C", "D"]},
    "outcome-to-router": {"delivery": "ab12", "to_router": "A", "outcome": "accepted"},
    "outcome-from-router": {"delivery": "ab12", "from_router": "C", "outcome": "accepted"},
    "settlement-relayed": {"delivery": "ab12", "to_router": "C"},
    "peer-restarted": {"peer": "B", "peer_epoch": 4, "peer_boot": "77aa"},
    "announce-timeout": {"subscriber": "sub-1/recv-1", "routers": ["C"]},
    "order-gap": {"delivery": "ab12", "missing_seq": 16},
    "routes": {"reachable": ["B", "C"], "next_hops": ["B>B", "C>B"]},
    "resume-requested": {"link": 7, "role": "subscriber", "reported": 3, "known": 2, "incomplete": False},
    "resend-matched": {"delivery": "ab12", "link": 7},
    "stream-seq-continued": {"link": 7, "next_seq": 398},
    "resend-beyond-horizon": {"delivery": "ab12", "stream": "ab", "origin_router": "B"},
    "budget": {"topic": "t", "state": "reached", "bytes": 1024, "router_bytes": 4096, "limit": "topic"},
    "streams-forgotten": {"count": 3, "remembered": 12},
    "stream-seq-timeout": {"link": 7, "routers": ["A"]},
    "origin-taken-over": {"delivery": "ab12", "from_router": "A"},
    "placeholder-created": {"delivery": "ab12", "subscriber": "sub-1/recv-1"},
    "placeholder-fulfilled": {"delivery": "ab12", "subscriber": "sub-1/recv-1"},
    "placeholder-expired": {"delivery": "ab12", "subscriber": "sub-1/recv-1"},
    "placeholder-settled": {"delivery": "ab12", "subscriber": "sub-1/recv-1"},
    "owed-moved": {"delivery": "ab12", "from_router": "C", "subscribers": ["sub-1/recv-1"]},
    "owed-state-discarded": {"delivery": "ab12", "subscriber": "sub-1/recv-1"},
}


def events_of(path, raw: bool = True) -> list[dict]:
    return list(read_events(path, raw=raw))


def test_first_open_writes_router_started_as_epoch_1(tmp_path):
    with EventLog(tmp_path / "d", "A") as log:
        assert log.epoch == 1
        assert log.router_id == "A"
        assert log.path == tmp_path / "d" / "events" / "events-000001-000001.jsonl"
        assert log.pending == 1
    assert (tmp_path / "d" / "epoch").read_text() == "1\n"
    [started] = events_of(tmp_path / "d")
    assert started["event"] == "router-started"
    assert started["seq"] == 1 and started["epoch"] == 1 and started["router"] == "A"
    assert started["pid"] == os.getpid() and started["version"] == __version__
    validate_event(started)


def test_epoch_increments_and_boot_id_differs_across_opens(tmp_path):
    seen = []
    for expected in (1, 2, 3):
        with EventLog(tmp_path, "A") as log:
            assert log.epoch == expected
            assert len(log.boot_id) == 16 and int(log.boot_id, 16) >= 0
            seen.append(log.boot_id)
            log.append("router-stopping", 1.0, {"reason": "test"})
    assert len(set(seen)) == 3
    records = events_of(tmp_path)
    assert [(r["epoch"], r["seq"]) for r in records] == [(1, 1), (1, 2), (2, 1), (2, 2), (3, 1), (3, 2)]
    assert [r["boot"] for r in records] == [b for b in seen for _ in range(2)]


def test_epoch_survives_loss_of_the_epoch_file(tmp_path):
    with EventLog(tmp_path, "A"):
        pass
    with EventLog(tmp_path, "A"):
        pass
    (tmp_path / "epoch").unlink()
    with EventLog(tmp_path, "A") as log:
        assert log.epoch == 3  # the log file names still say epoch 2 was used


def test_corrupt_epoch_file_is_an_error(tmp_path):
    (tmp_path / "epoch").write_text("banana\n")
    with pytest.raises(EventLogError, match="epoch"):
        EventLog(tmp_path, "A")


def test_second_open_of_a_data_dir_in_use_fails(tmp_path):
    with EventLog(tmp_path, "A"):
        with pytest.raises(EventLogError, match="in use"):
            EventLog(tmp_path, "A")
    with EventLog(tmp_path, "A") as log:  # released by close()
        assert log.epoch == 2


def test_seq_is_monotone_and_gapless(tmp_path):
    with EventLog(tmp_path, "A", max_bytes=2000, retention=1000) as log:
        for i in range(500):
            log.append("settled", float(i), {"delivery": f"{i:08x}", "by": "publisher"})
            if i % 7 == 0:
                log.flush()
    seqs = [r["seq"] for r in events_of(tmp_path)]
    assert seqs == list(range(1, 502))


def test_append_does_no_io_until_flush(tmp_path):
    log = EventLog(tmp_path, "A")
    try:
        log.flush()
        size = log.path.stat().st_size
        for i in range(100):
            log.append("forwarded", 1.5, {"delivery": "ab", "subscriber": "s/l", "link": i, "settled": False})
        assert log.path.stat().st_size == size
        assert log.pending == 100
        log.flush()
        assert log.pending == 0
        assert log.path.stat().st_size > size
        assert len(events_of(log.path)) == 101
    finally:
        log.close()


def test_line_layout_common_fields_first(tmp_path):
    with EventLog(tmp_path, "A") as log:
        log.append("settled", 1700000000.25, {"delivery": "00ff", "by": "publisher"})
    last = log.path.read_bytes().splitlines()[-1]
    assert last.startswith(b'{"seq":2,"ts":1700000000.25,"router":"A","epoch":1,"boot":"')
    assert last.endswith(b'","event":"settled","delivery":"00ff","by":"publisher"}')


def test_lines_are_the_bytes_of_one_merged_dict(tmp_path):
    """append() joins cached pieces instead of encoding one merged dict: same bytes,
    whatever the timestamp's type, across timestamps and with no fields at all."""
    cases = [
        ("sub-outcome", 1763785201.503, SAMPLE_FIELDS["sub-outcome"]),
        ("sub-outcome", 1763785201.503, SAMPLE_FIELDS["sub-outcome"]),
        ("received", 1763785201.504, SAMPLE_FIELDS["received"]),
        ("router-stopping", 1763785202, {"reason": "x"}),
        ("router-stopping", 1763785202.0, {}),
        ("pub-outcome", 0.1, {"delivery": "é\u2028", "outcome": "accepted", "condition": None}),
    ]
    with EventLog(tmp_path, 'A"') as log:
        for kind, ts, fields in cases:
            log.append(kind, ts, fields)
        boot, epoch = log.boot_id, log.epoch
        path = log.path
    lines = path.read_bytes().splitlines(keepends=True)[1:]
    expected = [
        orjson.dumps(
            {"seq": n, "ts": ts, "router": 'A"', "epoch": epoch, "boot": boot, "event": kind, **fields},
            option=orjson.OPT_APPEND_NEWLINE,
        )
        for n, (kind, ts, fields) in enumerate(cases, start=2)
    ]
    assert lines == expected


def test_unencodable_value_is_refused_without_consuming_seq(tmp_path):
    with EventLog(tmp_path, "A") as log:
        with pytest.raises(TypeError):
            log.append("received", 1.0, {"pub_tag": b"\x00\x01"})  # bytes must be hex already
        log.append("settled", 1.0, {"delivery": "01", "by": "publisher"})
    assert [r["seq"] for r in events_of(tmp_path)] == [1, 2]


def test_closed_log_refuses_to_flush(tmp_path):
    log = EventLog(tmp_path, "A")
    log.close()
    log.close()  # idempotent
    log.append("router-stopping", 1.0, {"reason": "late"})
    with pytest.raises(EventLogError, match="closed"):
        log.flush()


def test_rotation_and_retention(tmp_path):
    line = {"delivery": "x" * 200, "by": "publisher"}
    with EventLog(tmp_path, "A", max_bytes=1000, retention=3) as log:
        for i in range(40):
            log.append("settled", float(i), line)
            log.flush()
            assert log.path.stat().st_size < 1000  # rotated as soon as it reached max_bytes
        current = log.path
    files = sorted((tmp_path / "events").iterdir())
    assert len(files) == 3
    assert files[-1] == current
    assert [f.name for f in files] == sorted(f.name for f in files)
    # What is left is the newest events, contiguous up to the last one.
    seqs = [r["seq"] for r in events_of(tmp_path)]
    assert seqs == list(range(seqs[0], 42))


def test_retention_spans_epochs_but_keeps_the_open_file(tmp_path):
    for _ in range(3):
        with EventLog(tmp_path, "A", max_bytes=10_000_000, retention=1) as log:
            log.append("router-stopping", 1.0, {"reason": "x"})
    names = sorted(p.name for p in (tmp_path / "events").iterdir())
    assert names == ["events-000003-000001.jsonl"]  # older epochs' files deleted, the open one kept


def test_torn_last_line_is_skipped_and_counted(tmp_path):
    with EventLog(tmp_path, "A") as log:
        log.append("settled", 1.0, {"delivery": "01", "by": "publisher"})
        log.append("settled", 2.0, {"delivery": "02", "by": "publisher"})
    whole = log.path.read_bytes()
    log.path.write_bytes(whole[:-15])  # a crash cut the last line
    reader = read_events(log.path)
    assert [r["seq"] for r in reader] == [1, 2]
    assert reader.torn_lines == 1
    assert reader.torn == [(log.path, 3)]

    log.path.write_bytes(whole + b"\x00" * 64)  # power loss can leave zeroes past the end
    reader = read_events(tmp_path)
    assert len(list(reader)) == 3 and reader.torn_lines == 1


def test_a_bad_line_in_the_middle_is_an_error_naming_file_and_line(tmp_path):
    with EventLog(tmp_path, "A") as log:
        log.append("settled", 1.0, {"delivery": "01", "by": "publisher"})
    lines = log.path.read_bytes().splitlines(keepends=True)
    log.path.write_bytes(lines[0] + b'{"seq": 2, "tr\n' + lines[1])
    with pytest.raises(EventLogError) as info:
        list(read_events(log.path))
    assert f"{log.path}:2:" in str(info.value)


def test_read_events_orders_files_and_reads_data_dir(tmp_path):
    with EventLog(tmp_path, "A", max_bytes=300) as log:
        for i in range(20):
            log.append("settled", float(i), {"delivery": f"{i:04x}", "by": "publisher"})
            log.flush()
    with EventLog(tmp_path, "A") as log:
        pass
    by_events_dir = events_of(tmp_path / "events")
    assert by_events_dir == events_of(tmp_path)
    keys = [(r["epoch"], r["seq"]) for r in by_events_dir]
    assert keys == sorted(keys) and len(keys) == 22
    with pytest.raises(FileNotFoundError):
        read_events(tmp_path / "nope")


def test_fsync_mode_writes_the_same_lines(tmp_path):
    with EventLog(tmp_path, "A", fsync=True, max_bytes=200) as log:
        for i in range(5):
            log.append("expired", 1.0, {"delivery": "ab", "subscriber": f"s/{i}"})
            log.flush()
    assert [r["seq"] for r in events_of(tmp_path)] == [1, 2, 3, 4, 5, 6]


def test_flushed_events_survive_sigkill(tmp_path):
    n = 1000
    script = f"""
import os, signal
from router.eventlog import EventLog
log = EventLog({str(tmp_path)!r}, "K", max_bytes=20000)
for i in range({n}):
    log.append("forwarded", 1.0, {{"delivery": "%032x" % i, "subscriber": "s/l", "link": i, "settled": False}})
    if i % 10 == 9:
        log.flush()
log.append("router-stopping", 2.0, {{"reason": "never written"}})
os.kill(os.getpid(), signal.SIGKILL)
"""
    proc = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True, timeout=60)
    assert proc.returncode == -signal.SIGKILL, proc.stderr.decode()
    reader = read_events(tmp_path)
    records = list(reader)
    assert reader.torn_lines == 0
    assert [r["event"] for r in records] == ["router-started"] + ["forwarded"] * n
    assert [r["link"] for r in records[1:]] == list(range(n))
    assert [r["seq"] for r in records] == list(range(1, n + 2))
    # The kernel released the dead process's lock: the next open is epoch 2.
    with EventLog(tmp_path, "K") as log:
        assert log.epoch == 2


# -- the schema ---------------------------------------------------------------


def test_every_kind_carries_the_common_fields(tmp_path):
    assert set(SAMPLE_FIELDS) == set(EVENTS)
    with EventLog(tmp_path, "A") as log:
        for kind, fields in SAMPLE_FIELDS.items():
            log.append(kind, 1700000000.5, fields)
    records = events_of(tmp_path)[1:]
    assert [r["event"] for r in records] == list(EVENTS)
    for record in records:
        assert list(record)[: len(EVENT_SCHEMA)] == list(EVENT_SCHEMA)
        validate_event(record)


def test_schema_is_well_formed():
    allowed = {"string", "long", "double", "boolean", "array<string>"}
    assert set(EVENT_SCHEMA.values()) <= allowed
    for kind, fields in EVENTS.items():
        assert set(fields.values()) <= allowed, kind
        assert not set(fields) & set(EVENT_SCHEMA), kind
    union = spark_schema_fields()
    names = [name for name, _ in union]
    assert len(names) == len(set(names))
    assert union[: len(EVENT_SCHEMA)] == list(EVENT_SCHEMA.items())
    assert set(names) == set(EVENT_SCHEMA).union(*EVENTS.values())
    types = dict(union)
    assert all(types[n] == t for fields in EVENTS.values() for n, t in fields.items())


def test_validate_event_catches_mistakes():
    good = {"seq": 1, "ts": 1.0, "router": "A", "epoch": 1, "boot": "00", "event": "settled", "delivery": "ab"}
    validate_event(good)
    validate_event({**good, "by": None})
    for bad in (
        {**good, "seq": "1"},
        {**good, "by": 3},
        {**good, "subscriber": "x"},
        {**good, "event": "nope"},
        {k: v for k, v in good.items() if k != "boot"},
    ):
        with pytest.raises(ValueError):
            validate_event(bad)


# -- round trip ---------------------------------------------------------------

_VALUES = {
    "string": st.text(),
    "long": st.integers(min_value=-(2**63), max_value=2**63 - 1),
    "double": st.floats(allow_nan=False, allow_infinity=False),
    "boolean": st.booleans(),
    "array<string>": st.lists(st.text(), max_size=5),
}


@st.composite
def events(draw):
    kind = draw(st.sampled_from(sorted(EVENTS)))
    spec = EVENTS[kind]
    names = draw(st.lists(st.sampled_from(sorted(spec)), unique=True))
    fields = {n: draw(st.none() | _VALUES[spec[n]]) for n in names}
    ts = draw(st.floats(min_value=0, max_value=4e9, allow_nan=False))
    return kind, ts, fields


@pytest.mark.parametrize("buffer", BUFFERS)
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(batches=st.lists(st.lists(events(), max_size=8), min_size=1, max_size=6))
def test_round_trip(tmp_path_factory, batches, buffer):
    data_dir = tmp_path_factory.mktemp("rt")
    with EventLog(data_dir, "R", max_bytes=4096, buffer=buffer and buffer()) as log:
        for batch in batches:
            for kind, ts, fields in batch:
                log.append(kind, ts, fields)
            log.flush()
    reader = read_events(data_dir, raw=True)
    records = list(reader)
    assert reader.torn_lines == 0
    expected = [e for batch in batches for e in batch]
    assert len(records) == len(expected) + 1
    for seq, (record, (kind, ts, fields)) in enumerate(zip(records[1:], expected), start=2):
        validate_event(record)
        assert record["seq"] == seq and record["event"] == kind and record["ts"] == ts
        assert {k: v for k, v in record.items() if k not in EVENT_SCHEMA} == fields
        assert orjson.loads(orjson.dumps(record)) == record


@pytest.mark.parametrize("buffer", BUFFERS)
def test_failed_write_keeps_the_unwritten_bytes(tmp_path, monkeypatch, buffer):
    import router.eventlog as module

    real_write = os.write
    calls = []

    def flaky_write(fd, data):
        calls.append(len(data))
        if len(calls) == 1:
            return real_write(fd, bytes(data[:50]))  # a short write...
        raise OSError(28, "No space left on device")  # ...then the disk is full

    with EventLog(tmp_path, "A", buffer=buffer and buffer()) as log:
        log.flush()
        log.append("settled", 1.0, {"delivery": "01", "by": "publisher"})
        log.append("settled", 2.0, {"delivery": "02", "by": "publisher"})
        monkeypatch.setattr(module.os, "write", flaky_write)
        with pytest.raises(OSError):
            log.flush()
        assert log.pending == 2  # the half-written line counts as pending
        monkeypatch.setattr(module.os, "write", real_write)
        log.flush()
        assert log.pending == 0
    assert [r["seq"] for r in events_of(tmp_path)] == [1, 2, 3]


def test_file_order_is_numeric_beyond_six_digits(tmp_path):
    events = tmp_path / "events"
    events.mkdir()
    for epoch in (999999, 1000000):
        line = orjson.dumps({"seq": 1, "ts": 0.0, "router": "A", "epoch": epoch, "boot": "00", "event": "x"})
        (events / f"events-{epoch:06d}-000001.jsonl").write_bytes(line + b"\n")
    assert [r["epoch"] for r in events_of(tmp_path)] == [999999, 1000000]
    with EventLog(tmp_path, "A") as log:
        assert log.epoch == 1000001


# -- folded lines -----------------------------------------------------------------


def test_completed_unfolds_into_the_three_events_it_stands_for(tmp_path):
    with EventLog(tmp_path, "A") as log:
        log.append("received", 1.0, SAMPLE_FIELDS["received"])
        log.append("completed", 2.0, SAMPLE_FIELDS["completed"])
        log.append(
            "completed",
            3.0,
            {"delivery": "c3d4", "subscriber": "s/l", "outcome": "accepted", "settled": True, "pub_outcome": "accepted"},
        )  # publisher settles later
        log.append("settled", 4.0, {"delivery": "c3d4", "by": "publisher", "deleted": True})
    raw = events_of(tmp_path)
    assert [e["event"] for e in raw] == ["router-started", "received", "completed", "completed", "settled"]
    events = events_of(tmp_path, raw=False)
    assert [(e["seq"], e["event"]) for e in events] == [
        (1, "router-started"),
        (2, "received"),
        (3, "sub-outcome"),
        (3, "pub-outcome"),
        (3, "settled"),
        (4, "sub-outcome"),
        (4, "pub-outcome"),
        (5, "settled"),
    ]
    for event in events:
        validate_event(event)
    common = {k: raw[2][k] for k in EVENT_SCHEMA if k != "event"}
    sub, pub, settled = events[2:5]
    assert sub == {
        **common,
        "event": "sub-outcome",
        "delivery": "a1b2",
        "subscriber": "sub-1/recv-1",
        "outcome": "accepted",
        "settled": True,
    }
    assert pub == {**common, "event": "pub-outcome", "delivery": "a1b2", "outcome": "accepted", "condition": None, "reason": None}
    assert settled == {**common, "event": "settled", "delivery": "a1b2", "by": "router", "deleted": True}
    assert unfold(SAMPLE_FIELDS["received"] | {"event": "received"}) == [SAMPLE_FIELDS["received"] | {"event": "received"}]
    assert set(FOLDED) == {"completed", "sub-outcomes"}
    assert all(k in EVENTS and k not in FOLDED for parts in FOLDED.values() for k in parts)


def test_append_sub_outcome_writes_the_bytes_append_writes(tmp_path):
    """The per-copy path's sub-outcome line is byte for byte the generic one, for
    subscriber keys JSON must escape too, across timestamps and the tail cache."""
    cases = [
        ("ab" * 16, "sub/s2", "accepted", True),
        ("cd" * 16 + ".2", 'c"o\\n/é\n', "accepted", False),
        ("ef" * 16, "sub/s2", "rejected", True),
        ("ab" * 16, "sub/s2", "accepted", True),
    ]
    written = []
    for fast in (False, True):
        with EventLog(tmp_path / str(fast), "A") as log:
            for ts in (1.0, 2.5):
                for delivery, subscriber, outcome, settled in cases:
                    if fast:
                        log.append_sub_outcome(ts, delivery, subscriber, outcome, settled)
                    else:
                        log.append(
                            "sub-outcome",
                            ts,
                            {"delivery": delivery, "subscriber": subscriber, "outcome": outcome, "settled": settled},
                        )
            path, boot = log.path, log.boot_id
        lines = path.read_bytes().replace(boot.encode(), b"BOOT").splitlines()[1:]  # after router-started
        for line in lines:
            validate_event(orjson.loads(line))
        written.append(lines)
    slow, fast = written
    assert slow == fast and len(fast) == 8
    second = orjson.loads(fast[1])
    assert second["subscriber"] == 'c"o\\n/é\n' and second["delivery"] == "cd" * 16 + ".2"


def test_a_run_of_sub_outcomes_is_one_line_that_unfolds_into_them(tmp_path):
    """Consecutive append_sub_outcome() calls of one subscriber, outcome, settled flag
    and timestamp are one "sub-outcomes" line; anything else ends the run first, so
    every line keeps its place, and a flush writes it."""
    ts, later = 1.0, 2.0
    with EventLog(tmp_path, "A") as log:
        log.append_sub_outcome(ts, "d1", "s/a", "accepted", True)
        log.append_sub_outcome(ts, "d2", "s/a", "accepted", True)
        assert log.pending == 2  # "router-started" and the open run, as the one line it will be
        log.append_sub_outcome(ts, "d3", "s/a", "accepted", True)
        log.append_sub_outcome(ts, "d3", "s/b", "accepted", True)  # another subscriber: a run of one
        log.append_sub_outcome(ts, "d4", "s/a", "accepted", True)
        log.append_sub_outcome(ts, "d5", "s/a", "accepted", False)  # not settled: a new run
        log.append_sub_outcome(ts, "d6", "s/a", "accepted", False)
        log.append(
            "completed",
            ts,
            {"delivery": "d6", "subscriber": "s/b", "outcome": "accepted", "settled": True, "pub_outcome": "accepted"},
        )  # ends the run first
        log.append_sub_outcome(ts, "d7", "s/a", "released", True)
        log.append_sub_outcome(ts, "d8", "s/a", "accepted", True)  # another outcome
        log.append_sub_outcome(later, "d9", "s/a", "accepted", True)  # the next loop iteration
        log.flush()
        assert log.pending == 0
        log.append_sub_outcome(later, "d10", "s/a", "accepted", True)
        log.append_sub_outcome(later, "d11", "s/a", "accepted", True)
    raw = events_of(tmp_path)[1:]
    assert [(e["seq"], e["event"], e.get("deliveries") or e["delivery"]) for e in raw] == [
        (2, "sub-outcomes", ["d1", "d2", "d3"]),
        (3, "sub-outcome", "d3"),
        (4, "sub-outcome", "d4"),
        (5, "sub-outcomes", ["d5", "d6"]),
        (6, "completed", "d6"),
        (7, "sub-outcome", "d7"),
        (8, "sub-outcome", "d8"),
        (9, "sub-outcome", "d9"),
        (10, "sub-outcomes", ["d10", "d11"]),
    ]
    for line in raw:
        validate_event(line)
    events = events_of(tmp_path, raw=False)[1:]
    subs = [
        (e["seq"], e["delivery"], e["subscriber"], e["outcome"], e["settled"], e["ts"])
        for e in events
        if e["event"] == "sub-outcome"
    ]
    assert subs == [
        (2, "d1", "s/a", "accepted", True, ts),
        (2, "d2", "s/a", "accepted", True, ts),
        (2, "d3", "s/a", "accepted", True, ts),
        (3, "d3", "s/b", "accepted", True, ts),
        (4, "d4", "s/a", "accepted", True, ts),
        (5, "d5", "s/a", "accepted", False, ts),
        (5, "d6", "s/a", "accepted", False, ts),
        (6, "d6", "s/b", "accepted", True, ts),
        (7, "d7", "s/a", "released", True, ts),
        (8, "d8", "s/a", "accepted", True, ts),
        (9, "d9", "s/a", "accepted", True, later),
        (10, "d10", "s/a", "accepted", True, later),
        (10, "d11", "s/a", "accepted", True, later),
    ]
    for event in events:
        validate_event(event)
    assert all(set(e) == set(EVENT_SCHEMA) | set(EVENTS["sub-outcome"]) for e in events if e["event"] == "sub-outcome")


# --- the fold rule, written once (router.eventschema.FOLDS) -----------------------------

_names = st.text("abcdef0123456789", min_size=2, max_size=8)


@st.composite
def _folded_parts(draw):
    """A folded kind and the events one of its lines stands for (their own fields)."""
    from router.eventschema import FOLDS

    kind = draw(st.sampled_from(sorted(FOLDS)))
    subscriber, outcome = draw(_names), draw(st.sampled_from(["accepted", "rejected", "released"]))
    settled = draw(st.booleans())
    if kind == "sub-outcomes":
        deliveries = draw(st.lists(_names, min_size=1, max_size=5))
        return kind, [{"delivery": d, "subscriber": subscriber, "outcome": outcome, "settled": settled} for d in deliveries]
    d = draw(_names)
    parts = [
        {"delivery": d, "subscriber": subscriber, "outcome": outcome, "settled": settled},
        {"delivery": d, "outcome": "accepted", "condition": draw(st.none() | _names), "reason": draw(st.none() | _names)},
    ]
    if draw(st.booleans()):
        parts.append({"delivery": d, "by": draw(st.sampled_from(["publisher", "router"])), "deleted": draw(st.booleans())})
    return kind, parts


@given(_folded_parts())
def test_a_folded_line_unfolds_to_the_events_it_was_folded_from(case):
    from router.eventschema import FOLDED, fold, unfold

    kind, parts = case
    common = {"seq": 7, "ts": 1.5, "router": "A", "epoch": 1, "boot": "00" * 8}
    line = {**common, "event": kind, **fold(kind, parts)}
    events = unfold(line)
    assert [e["event"] for e in events] == [
        FOLDED[kind][i] if kind == "completed" else FOLDED[kind][0] for i in range(len(parts))
    ]
    for event, part in zip(events, parts, strict=True):
        assert {k: v for k, v in event.items() if k not in common and k != "event" and v is not None} == {
            k: v for k, v in part.items() if v is not None
        }
        assert all(event[k] == v for k, v in common.items())


@pytest.mark.skipif(LogBuffer is None, reason="_fastpath not built")
def test_the_compiled_buffer_holds_still_while_a_flush_reads_it():
    """What EventLog.flush relies on from its buffer, as a BytesIO gives it: the bytes
    written so far in a view, no write or rewind while the view is alive (the bytes a
    write(2) is reading cannot move), and a rewind only back over what was written."""
    buffer = LogBuffer()
    assert buffer.write(b'{"seq":1}\n') == 10 and buffer.write(bytearray(b"ab")) == 2
    with buffer.getbuffer() as view:
        assert bytes(view) == b'{"seq":1}\nab' and view.readonly
        with pytest.raises(BufferError):
            buffer.write(b"x")
        with pytest.raises(BufferError):
            buffer.seek(0)
    with pytest.raises(ValueError):
        buffer.seek(13)
    assert buffer.seek(10) == 10 and buffer.getvalue() == b'{"seq":1}\n'
    assert buffer.seek(0) == 0 and buffer.tell() == 0 and buffer.write(b"c" * 100_000) == 100_000
    assert buffer.getvalue() == b"c" * 100_000
    with pytest.raises(TypeError):
        buffer.write("text")
    with pytest.raises(TypeError):
        LogBuffer(1)
