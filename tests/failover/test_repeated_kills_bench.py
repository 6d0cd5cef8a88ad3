"""`scripts/bench --failover` end to end on real routers, short: six kills of the
publisher's router (each router twice, restarted each time), the ledgers checked and
the routers' logs proven clean by Spark. Slow (a benchmark's run and a proof, about
a minute). This run, at 20 kills, found three failover bugs (a stream numbered from
0 again, a delivery taken for settled, fulfilled placeholders sent in reverse) and a
proof that counted a placeholder's re-send as a duplicate: kept as their regression."""

import json

import pytest

from bench import failover

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]


def test_six_kills_measured_checked_and_proven(tmp_path):
    out = tmp_path / "out"
    code = failover.main(["--kills", "6", "--rate", "100", "--out", str(out)])
    doc = json.loads((out / "failover.json").read_text())
    assert code == 0, (doc["end"], doc.get("proof"))
    assert [r["timed_out"] for r in doc["rounds"]] == [[]] * 6
    assert [r["victim"] for r in doc["rounds"]][:1] == ["A"] and "sub-A" in doc["rounds"][0]["subscribers_on_victim"]
    victims = [r["victim"] for r in doc["rounds"]]
    assert all(a != b for a, b in zip(victims, victims[1:]))  # the publisher moved each time
    assert doc["publisher"]["n"] == doc["new_message"]["n"] == doc["subscriber"]["n"] == 6
    assert doc["end"]["outcomes"] == {"accepted": doc["end"]["messages"]} and not doc["end"]["problems"]
    assert doc["proof"]["proven_clean"], doc["proof"]
