"""bench/failover.py's pure parts: reading ledgers as they grow, the distribution, the
docs block's verdict. The benchmark itself runs real routers (tests/integration, slow)."""

import json

from bench import failover


def test_a_ledger_is_read_as_it_grows_and_a_torn_line_waits_until_whole(tmp_path):
    path = tmp_path / "pub.ledger.jsonl"
    tail = failover.LedgerTail(path)
    assert tail.read() == []  # not written yet
    path.write_bytes(b'{"event":"sent","ts":1.0}\n{"event":"outc')
    assert [e["event"] for e in tail.read()] == ["sent"]
    with open(path, "ab") as f:
        f.write(b'ome","ts":2.0}\n')
    assert [e["event"] for e in tail.read()] == ["outcome"]
    assert tail.read() == []
    assert [e["ts"] for e in tail.lines] == [1.0, 2.0]


def test_distribution_uses_measured_values_and_counts_the_target():
    d = failover.distribution([0.05, 0.02, 1.5, 0.03, 0.04, 0.06, 0.07, 0.08, 0.09, 0.10])
    assert (d["n"], d["min"], d["max"]) == (10, 0.02, 1.5)
    assert d["p90"] in (0.10, 1.5)  # nearest rank: one of the values
    assert d["within_target"] == 9
    assert failover.distribution([]) == {"n": 0}


def _doc(publisher, timed_out=(), problems=(), proven=True, stalls=()):
    rounds = [
        {
            "victim": "ABC"[i % 3],
            "publisher": v,
            "new_message": v + 0.01,
            "subscriber": v,
            "timed_out": list(timed_out) if i == 0 else [],
            "stall": stalls[i] if i < len(stalls) else 0.0,
        }
        for i, v in enumerate(publisher)
    ]
    doc = {
        "command": "python -m bench.failover",
        "date": "2026-11-26T12:00:00+00:00",
        "machine": {"nproc": 2},
        "settings": {"kills": len(rounds), "rate": 200, "heartbeat": 1.0, "settle": 1.0},
        "rounds": rounds,
        "end": {"messages": 1000, "outcomes": {"accepted": 1000}, "problems": list(problems)},
        "proof": {"exit": 0 if proven else 1, "seconds": 30, "verdict": "v", "proven_clean": proven},
    }
    for key, _ in failover.MEASURES:
        doc[key] = failover.distribution([r[key] for r in rounds])
    return doc


def test_the_docs_block_says_met_only_when_every_kill_recovered_in_time():
    met = failover.markdown(_doc([0.03, 0.05, 0.2]))
    assert "**met**" in met and "3/3" in met and "**proven clean**" in met
    slow = failover.markdown(_doc([0.03, 1.2]))
    assert "**not met**" in slow
    timed_out = failover.markdown(_doc([0.03, 0.04], timed_out=["publisher"]))
    assert "**not met**" in timed_out and "1 round(s) timed out" in timed_out
    broken = failover.markdown(_doc([0.03], problems=["sub-A was handed 1 message(s) twice"], proven=False))
    assert "**disagree**" in broken and "**NOT proven clean**" in broken
    json.dumps(_doc([0.1]))  # what --out writes


def test_a_kill_after_a_stall_is_judged_from_the_sigkill_and_shown_from_the_stop():
    """A round stopped (SIGSTOP) for 1.5 s before its SIGKILL is measured from the stop;
    the target is about the SIGKILL, so the verdict subtracts the stall, and says what
    the worst was from the stop."""
    met = failover.markdown(_doc([0.03, 1.8], stalls=[0.0, 1.5]))
    assert "**met**" in met and "worst 0.310 s" in met  # 1.81 - 1.5
    assert "1 kill(s) came after a SIGSTOP of 1.50–1.50 s" in met and "the worst is 1.810 s" in met
    assert "seconds from the fault (the SIGSTOP of a stalled kill, else the SIGKILL)" in met
    late = failover.markdown(_doc([0.03, 2.8], stalls=[0.0, 1.5]))
    assert "**not met** (worst 1.310 s after the SIGKILL" in late
    moved_during = failover.markdown(_doc([0.03, 0.4], stalls=[0.0, 2.0]))  # the clients moved during the stop
    assert "**met**" in moved_during and "worst 0.040 s" in moved_during
    assert "seconds from the SIGKILL to" in failover.markdown(_doc([0.03, 0.05]))
