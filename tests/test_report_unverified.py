"""Imported runs (no device state): adjacent pairs get ratios in their own table, never a
verdict (docs/report.md#in-the-order-to-read-it)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from conftest import REFERENCE


def test_desktop_import_reports_intervals_and_unverified_ratios(tmp_path: Path) -> None:
    src = REFERENCE / "v1-desktop-2026-07-24"
    names = ["pc-E-c5000-io4t4", "pc-F-c5000-io8t4", "pc-H-c5000-combo", "pc-I-c5000-overlap"]
    run = tmp_path / "run"
    p = subprocess.run([sys.executable, "-m", "abbench", "import", str(src), "--out", str(run),
                        "--order", ",".join(names), "--decision",
                        "pc-F-c5000-io8t4:pc-E-c5000-io4t4:0.03"],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 3, p.stderr  # the decision is UNVERIFIED: exit as a campaign
    p = subprocess.run([sys.executable, "-m", "abbench", "report", str(run), "--style", "plain"],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 3, p.stdout + p.stderr  # unverified: never a plain GO
    doc = json.loads((run / "report.json").read_text())
    assert all(c["tokens_per_s"]["low"] < c["tokens_per_s"]["high"] for c in doc["cells"])
    assert len(doc["cells"]) == 4
    ratios = doc["unverified_ratios"]
    assert [(r["first"], r["second"]) for r in ratios] == [(0, 1), (1, 2), (2, 3)]
    # H (6.329 tok/s) over F (4.634): the files' own summaries give 1.366
    assert abs(ratios[1]["estimate"] - 6.329 / 4.634) < 0.01
    assert all(r["low"] < r["estimate"] < r["high"] for r in ratios)
    assert doc["decisions"][0]["verdict"] != "GO"
    md = (run / "report.md").read_text()
    verdicts = md.split("## Verdicts")[1].split("##")[0]
    assert "1.366" not in verdicts
    assert "Unverified ratios" in md and "1.366" in md


def test_sensorless_device_owed_advice_is_about_the_probe(tmp_path: Path) -> None:
    from runs_helper import cell, make_run

    from abbench.analysis.campaign import analyze

    # No caps, no temperatures: only the speed probe, which moved between the cells.
    run = make_run(tmp_path, [cell("B", 40, caps=None, cpu_temp=None, battery_temp=None),
                              cell("C", 44, caps=None, cpu_temp=None, battery_temp=None,
                                   probe=0.8)],
                   [{"candidate": "C", "baseline": "B", "min_effect": 0.03}])
    (d,) = analyze(run).decisions
    assert d.verdict == "OWED"
    assert "no caps or temperatures" in (d.settle or "") and "gated re-run" not in d.settle
