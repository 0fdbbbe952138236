"""report.html: self-contained, three inline SVG plots (well-formed, referring to nothing
outside), escaped text, verdicts and the
reasons a pair was not compared; written by write_reports and `abbench report`; and
(where chromium is installed) a headless screenshot that is not blank."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import textwrap
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from runs_helper import cell, make_run

from abbench.analysis.campaign import analyze
from abbench.report import write_reports
from abbench.report.html import render_html

DECIDE = [{"candidate": "C", "baseline": "B", "min_effect": 0.03}]
CAPPED = {"policy0": 2_000_000, "policy4": 2_200_000}
SVG = re.compile(r"<svg .*?</svg>")
EVIL = "x<script>alert(1)"


def abbench(*args: str | Path, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "abbench", *map(str, args)],
                          capture_output=True, text=True, timeout=timeout)


def assert_self_contained_with_plots(page: str) -> None:
    low = page.lower()
    assert 'src="http' not in low and "<link" not in low and "<script src" not in low
    assert "url(http" not in low
    plots = SVG.findall(page)
    assert len(plots) == 3 and page.count("<svg") == 3
    for svg in plots:
        root = ET.fromstring(svg)  # well-formed: a stray '<' or '&' in a name would not be
        assert root.tag == "{http://www.w3.org/2000/svg}svg"
        # the only reference is to its own hatch pattern
        assert set(re.findall(r'url\(#([^)]*)\)', svg)) <= set(re.findall(r'id="([^"]*)"', svg))
        assert "href" not in svg and "<image" not in svg and "<script" not in svg


def with_gate_wait(run: Path, index: int, waited: float) -> None:
    lines = (run / "journal.jsonl").read_text().splitlines()
    rec = json.loads(lines[index])
    rec["gate"].update(waited_s=waited, polls=3, reasons=["cpu 47.1 C > 45.0 C"])
    lines[index] = json.dumps(rec)
    (run / "journal.jsonl").write_text("\n".join(lines) + "\n")


def test_html_is_self_contained_escaped_and_shows_unmatched_reasons(tmp_path: Path) -> None:
    run = make_run(tmp_path, [cell("B", 40), cell("C", 30, caps=CAPPED), cell(EVIL, 35),
                              cell("B", 39, sentinel_of=0)], DECIDE)
    with_gate_wait(run, 1, 12.0)
    a, _ = write_reports(run)
    page = (run / "report.html").read_text(encoding="utf-8")
    assert page == render_html(a, run)  # written as rendered
    assert_self_contained_with_plots(page)
    assert "<script" not in page.lower()
    assert "x&lt;script&gt;alert(1)" in page
    verdicts = page.split("<h2>Verdicts</h2>")[1].split("<h2>Cells</h2>")[0]
    assert "OWED" in verdicts
    assert "not compared: cell 2 (C) vs cell 1 (B) — caps differ" in verdicts
    assert "0.750" not in verdicts and "1.33" not in verdicts and "times" not in verdicts
    assert "waited 12 s" in page
    assert not list(run.glob(".report.html.*.tmp"))


def test_matched_verdict_and_banners(tmp_path: Path) -> None:
    run = make_run(tmp_path, [cell("B", 40), cell("C", 48)], DECIDE, floor=0.02)
    write_reports(run)
    page = (run / "report.html").read_text(encoding="utf-8")
    verdicts = page.split("<h2>Verdicts</h2>")[1].split("<h2>Cells</h2>")[0]
    assert ">GO<" in verdicts and "C ran 1.20 ± " in verdicts and "times faster than B" in verdicts
    sim = make_run(tmp_path / "sim", [cell("B", 40)], simulated=True, device="sim:phone")
    unv = make_run(tmp_path / "unv", [cell("B", 40), cell("C", 48)], DECIDE, state=False)
    for r in (sim, unv):
        lines = (r / "journal.jsonl").read_text().splitlines()
        (r / "journal.jsonl").write_text(lines[0] + "\n")  # incomplete (sim has 1 of 1)
    page = render_html(analyze(sim), sim)
    assert "SIMULATED DEVICE" in page and "INCOMPLETE" not in page
    page = render_html(analyze(unv), unv)
    assert "INCOMPLETE: 1 of 2 cells" in page and "NO DEVICE STATE" in page
    assert_self_contained_with_plots(page)


def test_absent_series_say_not_measured(tmp_path: Path) -> None:
    run = make_run(tmp_path, [cell("B", 40, per_token=False, caps={}, caps_during=[])],
                   state=False)
    (run / "samples.jsonl").unlink(missing_ok=True)
    page = render_html(analyze(run), run)
    assert_self_contained_with_plots(page)
    assert "Not measured on this device: CPU caps, temperatures, MemAvailable." in page
    assert "no per-token times" in page


def test_abbench_report_rerenders_html(tmp_path: Path) -> None:
    run = make_run(tmp_path, [cell("B", 40), cell("C", 44)], DECIDE)
    p = abbench("report", run, "--style", "plain")
    assert p.returncode in (0, 1, 3), p.stderr
    first = (run / "report.html").read_text(encoding="utf-8")
    (run / "report.html").unlink()
    abbench("report", run, "--style", "plain")
    assert (run / "report.html").read_text(encoding="utf-8") == first


def test_real_tiny_campaign_writes_html(tiny_model: Path, tmp_path: Path) -> None:
    cells = tmp_path / "cells.toml"
    cells.write_text(textwrap.dedent(f"""\
        [campaign]
        name = "t"
        spacing_s = 0.3
        warmup_tokens = 2
        order = ["B", "C"]

        [device]
        transport = "local"
        sample_hz = 10

        [workload]
        model = "{tiny_model}"
        tokens = 6
        cache_mib = 0.2
        timeout_s = 120

        [cells.B]
        overlap = true

        [cells.C]
        base = "B"
        io_lanes = 1
        """))
    p = abbench("campaign", cells, "--out", tmp_path / "reports", "--sentinels",
                tmp_path / "sentinels", "--no-live")
    assert p.returncode in (0, 1, 3), p.stdout + p.stderr
    (folder,) = [x for x in (tmp_path / "reports").iterdir() if x.is_dir()]
    assert_self_contained_with_plots((folder / "report.html").read_text(encoding="utf-8"))


def chromium() -> str | None:
    for c in ("/usr/bin/chromium", shutil.which("chromium"), shutil.which("chromium-browser")):
        if c and Path(c).exists():
            return c
    return None


def test_headless_screenshot_is_not_blank(tmp_path: Path) -> None:
    exe = chromium()
    if exe is None:
        pytest.skip("chromium not installed")
    run = make_run(tmp_path, [cell("B", 40), cell("C", 30, caps=CAPPED), cell("B", 39)],
                   DECIDE)
    with_gate_wait(run, 2, 20.0)
    write_reports(run)
    shot = tmp_path / "shot.png"
    p = subprocess.run(
        [exe, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         f"--user-data-dir={tmp_path / 'profile'}", f"--screenshot={shot}",
         "--window-size=1200,2400", (run / "report.html").resolve().as_uri()],
        capture_output=True, text=True, timeout=120)
    assert shot.is_file() and shot.stat().st_size > 0, p.stderr[-2000:]
    import numpy as np
    from PIL import Image

    with Image.open(shot) as im:
        px = np.asarray(im.convert("RGB"))
    assert px.shape[0] >= 2000 and px.shape[1] >= 1000
    rgb = px.reshape(-1, 3)
    assert len(np.unique(rgb, axis=0)) > 50  # text, tables and plots, not a blank page
