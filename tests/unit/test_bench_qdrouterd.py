"""bench/qdrouterd.py's pure parts and `scripts/bench --qdrouterd`'s defaults: no processes started."""

from pathlib import Path

import pytest

from bench import qdrouterd as qdr
from bench.run import parse_args


def test_config_has_a_multicast_address_an_ephemeral_listener_and_the_threads():
    text = qdr.config_text(1, "bench")
    assert "workerThreads: 1\n" in text
    assert "address {\n    prefix: bench\n    distribution: multicast\n}" in text
    assert "host: 127.0.0.1\n    port: 0\n" in text
    assert "http" not in text.lower() and "console" not in text.lower()
    # qdrouterd's parser wants one attribute per line: no block on one line
    assert all(line.rstrip().endswith(("{", "}")) or ":" in line for line in text.splitlines())


def test_listening_port_from_its_log():
    log = (
        "2026-11-26 06:07:34.939992 +0000 SERVER (warning) HTTP support is not available\n"
        "2026-11-26 06:07:34.947000 +0000 SERVER (notice) Listening on 127.0.0.1:39441 (listener/127.0.0.1:0)\n"
    )
    assert qdr.listening_port(log) == 39441
    assert qdr.listening_port("SERVER (notice) Operational, 1 Threads Running") is None


def test_targets_name_their_threads():
    assert qdr.is_target("qdrouterd-4") and qdr.threads_of("qdrouterd-4") == 4
    assert not qdr.is_target("eorouter") and not qdr.is_target("qdrouterd")
    with pytest.raises(ValueError):
        qdr.threads_of("qdrouterd-0")


def test_qdrouterd_mode_defaults_and_the_plain_ones_unchanged():
    a = parse_args(["--qdrouterd"])
    assert a.k_values == [1, 4, 16, 64]
    assert a.target_list == ["eorouter", "qdrouterd-1", "qdrouterd-4"]
    assert a.client_list == ["c"] and a.hop_list == [] and a.repeat == 5
    b = parse_args(["--qdrouterd", "--subscribers", "1", "--qdrouterd-threads", "2", "--repeat", "7"])
    assert b.k_values == [1] and b.target_list == ["eorouter", "qdrouterd-2"] and b.repeat == 7
    c = parse_args([])
    assert c.k_values == [1, 4, 16] and c.target_list == ["eorouter", "baseline"]
    assert c.client_list == ["c", "python"] and c.hop_list == [0, 1, 2] and c.repeat == 3


def test_comparison_rows_give_spreads_and_three_ratios():
    def cell(cpu, msgs):
        return {"cpu_by_repeat": cpu, "msgs_by_repeat": msgs, "ok_runs": len(cpu), "runs": len(cpu), "problems": []}

    cells = {
        ("eorouter", "c", 4, "exactly-once"): cell({0: 20.0, 1: 18.0, 2: 19.0}, {0: 30000.0, 1: 32000.0, 2: 31000.0}),
        # bimodal: one slow round
        ("qdrouterd-1", "c", 4, "exactly-once"): cell({0: 8.0, 1: 15.0, 2: 7.5}, {0: 90000.0, 1: 60000.0, 2: 95000.0}),
    }
    (row,) = qdr.comparison_rows(cells, ["qdrouterd-1", "qdrouterd-4"])
    assert row["eo_cpu"] == (18.0, 19.0, 20.0) and row["qd_cpu"] == (7.5, 8.0, 15.0)
    assert row["ratio_median"] == pytest.approx(19.0 / 8.0)
    assert row["ratio_min"] == pytest.approx(18.0 / 7.5)
    assert row["pairs"] == (pytest.approx(18.0 / 15.0), pytest.approx(19.0 / 7.5))
    md = qdr.comparison_markdown([row])
    assert "| exactly-once | 4 | 1 | 19.0 (18.0–20.0) | 8.0 (7.5–15.0) | **2.38×** | 2.40× | 1.20–2.53 |" in md


def test_rounds_read_back_from_json_pair_by_their_string_keys():
    assert qdr.paired({"0": 4.0, "1": 6.0}, {"0": 2.0, "1": 2.0, "2": 9.0}) == [2.0, 3.0]


def test_ensure_built_finds_an_existing_binary_and_says_what_to_do_otherwise(tmp_path: Path, monkeypatch):
    (tmp_path / "sbin").mkdir()
    (tmp_path / "sbin" / "qdrouterd").write_text("")
    assert qdr.ensure_built(tmp_path, tmp_path / "no-script.sh") == tmp_path / "sbin" / "qdrouterd"
    with pytest.raises(qdr.QdrouterdError, match="build script"):
        qdr.ensure_built(tmp_path / "elsewhere", tmp_path / "no-script.sh")
    script = tmp_path / "build.sh"
    script.write_text("exit 1\n")
    monkeypatch.setattr(qdr.os, "geteuid", lambda: 1000)
    with pytest.raises(qdr.QdrouterdError, match="needs root: sudo bash"):
        qdr.ensure_built(tmp_path / "elsewhere", script)
