"""The report people read (issue 15, part 4): a history with many restarts, reconciled
by the command's own entry point, gives figures whose texts never overlap, and a
report.html that a real browser (headless Chromium, where installed:
scripts/setup-root) renders with every chart drawn."""

from __future__ import annotations

import base64
import contextlib
import io
import json
import re
import shutil
import subprocess

import pytest

from spark.cli import EXIT_CLEAN, reconcile_main
from spark.generate import Spec, generate
from spark.report import figures, text_overlaps

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")


@pytest.fixture(scope="module")
def restarts(spark, tmp_path_factory):
    """A 5-router history in which every router restarts often, reconciled once."""
    base = tmp_path_factory.mktemp("restarts")
    info = generate(
        base / "logs",
        Spec(routers=5, publishers=4, subscribers=8, topics=3, deliveries=6000, round_size=100, p_restart=0.25, seed=7),
    )
    out = base / "report"
    with contextlib.redirect_stdout(io.StringIO()) as printed:
        rc = reconcile_main([str(base / "logs"), "--clients", str(base / "logs" / "clients"), "--out", str(out)])
    assert rc == EXIT_CLEAN, printed.getvalue()
    report = json.loads((out / "report.json").read_text())
    epochs = len(report["summary"]["epochs"])
    assert epochs >= 5 * 10, f"only {epochs} epochs: not the many restarts this test is about ({info['truth']})"
    return report, out / "report.html"


def test_no_two_texts_of_a_figure_overlap(restarts):
    report, _ = restarts
    figs = figures(report)
    assert set(figs) >= {"timeline", "rate", "latency", "counts"}
    for name, fig in figs.items():
        assert text_overlaps(fig) == [], name


def test_the_overlap_check_can_see_an_overlap():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots()
    ax.text(0.5, 0.5, "router A restarted")
    ax.text(0.52, 0.5, "router B restarted")
    assert text_overlaps(fig) == [("router A restarted", "router B restarted")]
    plt.close(fig)


def test_every_chart_is_an_inline_png(restarts):
    _, page = restarts
    html = page.read_text()
    images = re.findall(r"<img[^>]+src=['\"]data:image/png;base64,([A-Za-z0-9+/=]+)['\"]", html)
    assert len(images) >= 4
    for data in images:
        assert base64.b64decode(data)[:8] == b"\x89PNG\r\n\x1a\n"
    assert "http://" not in html and "https://" not in html and "<script" not in html


def _render_and_check(page, tmp_path, min_rows_with_colour: int = 800) -> None:
    """Headless Chromium renders ``page`` to a PNG: it exits 0 and the charts are
    drawn (rows with colour, not only black text on white, over a good part of it)."""
    import matplotlib.image as mpimg
    import numpy as np

    shot = tmp_path / "report.png"
    run = subprocess.run(
        [
            CHROMIUM,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--hide-scrollbars",
            "--no-first-run",
            f"--user-data-dir={tmp_path / 'profile'}",
            "--window-size=1280,6000",
            f"--screenshot={shot}",
            page.resolve().as_uri(),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 0 and shot.exists(), run.stderr[-2000:]
    pixels = mpimg.imread(shot)[:, :, :3]
    assert pixels.shape[:2] == (6000, 1280)
    coloured = np.abs(pixels - pixels.mean(axis=2, keepdims=True)).max(axis=2) > 0.15
    rows_with_colour = int(coloured.any(axis=1).sum())
    assert rows_with_colour > min_rows_with_colour, rows_with_colour


@pytest.mark.skipif(CHROMIUM is None, reason="headless Chromium not installed (scripts/setup-root installs it)")
def test_chromium_renders_the_report_with_every_chart(restarts, tmp_path):
    _render_and_check(restarts[1], tmp_path)


@pytest.mark.slow
@pytest.mark.timeout(1500)
@pytest.mark.skipif(CHROMIUM is None, reason="headless Chromium not installed (scripts/setup-root installs it)")
def test_the_10m_event_report_is_readable(tmp_path):
    """Issue 15's scale: 10 M events (the benchmark's history, 3.5 GB on disk with the
    ledgers) reconciled by the command in its own process, then its report checked
    as above. About 7 minutes on 2 cores."""
    import sys

    logs = tmp_path / "logs"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "spark",
            "generate",
            str(logs),
            "--events",
            "10000000",
            "--routers",
            "3",
            "--publishers",
            "6",
            "--subscribers",
            "6",
            "--topics",
            "2",
            "--restart",
            "0.002",
            "--round",
            "500",
        ],
        check=True,
        capture_output=True,
    )
    routers = [str(logs / r) for r in json.loads((logs / "truth.json").read_text())["routers"]]
    out = tmp_path / "report"
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "spark",
            "reconcile",
            *routers,
            "--clients",
            str(logs / "clients"),
            "--out",
            str(out),
            "--master",
            "local[2]",
        ],
        capture_output=True,
        text=True,
    )
    assert run.returncode == EXIT_CLEAN, run.stdout[-3000:] + run.stderr[-3000:]
    report = json.loads((out / "report.json").read_text())
    assert report["summary"]["events"] >= 10_000_000
    for name, fig in figures(report).items():
        assert text_overlaps(fig) == [], name
    shutil.rmtree(logs)  # 3.5 GB
    # (3 routers: a shorter lives chart than the 5-router history's, so fewer rows with colour)
    _render_and_check(out / "report.html", tmp_path, min_rows_with_colour=400)
