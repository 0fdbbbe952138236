"""The report package: report.json keys, report.md verdict table, terminal text, and
`abbench report`."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from runs_helper import cell, make_run

from abbench.report import write_reports

DECIDE = [{"candidate": "C", "baseline": "B", "min_effect": 0.03}]
CAPPED = {"policy0": 2_000_000, "policy4": 2_200_000}


def abbench(*args: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "abbench", *map(str, args)],
                          capture_output=True, text=True, timeout=60)


def verdict_table(md: str) -> str:
    return md.split("## Verdicts")[1].split("## Cells")[0]


def test_json_report_has_stable_keys_and_no_nan(tmp_path: Path) -> None:
    run = make_run(tmp_path, [cell("B", 40, dropped=16), cell("C", 48)], DECIDE, floor=0.02)
    _, rc = write_reports(run)
    doc = json.loads((run / "report.json").read_text())
    assert rc == 0
    assert {"format", "campaign", "simulated", "complete", "cells", "pairs", "drift",
            "tells", "decisions", "exit_status", "method", "tolerances"} <= set(doc)
    c = doc["cells"][0]
    assert c["drop_rate"] == 0.125 and c["tokens_per_s"]["low"] < c["tokens_per_s"]["high"]
    d = doc["decisions"][0]
    assert d["verdict"] == "GO" and d["level"] == 0.95 and d["df"] == 30
    assert d["noise"]["source"] == "device history" and abs(d["noise"]["sd"] - 0.02) < 1e-9
    assert d["se"] > d["token_se"] > 0 and d["cell_se"] > 0
    assert doc["noise"]["known"] and doc["noise_floor"]["df"] == 30
    assert doc["pairs"][0]["state"] == "matched"


def test_unmatched_ratio_never_in_the_verdict_table(tmp_path: Path) -> None:
    run = make_run(tmp_path, [cell("B", 40), cell("C", 30, caps=CAPPED)], DECIDE)
    write_reports(run)
    md = (run / "report.md").read_text()
    table = verdict_table(md)
    assert "OWED" in table
    assert "0.75" not in table and "1.33" not in table and "times" not in table
    assert "not compared: cell 2 (C) vs cell 1 (B) — caps differ" in table
    assert "tok/s" in md.split("## Cells")[1]  # the cells still show their own speeds


def test_matched_pair_comparison_reads_times_slower(tmp_path: Path) -> None:
    run = make_run(tmp_path, [cell("B", 40), cell("C", 32)], DECIDE, floor=0.02)
    p = abbench("report", run, "--style", "plain")
    assert p.returncode == 1, p.stderr
    assert "NO-GO" in p.stdout
    assert "C ran 1.25 ± " in p.stdout and "times slower than B" in p.stdout


def test_unverified_table_and_simulated_banner(tmp_path: Path) -> None:
    run = make_run(tmp_path, [cell("B", 40), cell("C", 48)], DECIDE, state=False)
    write_reports(run)
    md = (run / "report.md").read_text()
    assert "### Unverified pairs" in md and "| GO |" not in md
    run2 = make_run(tmp_path / "sim", [cell("B", 40)], simulated=True, device="sim:phone")
    p = abbench("report", run2, "--style", "plain")
    assert p.returncode == 0 and "SIMULATED DEVICE" in p.stdout


def test_report_json_flag_and_inconclusive_exit(tmp_path: Path) -> None:
    run = make_run(tmp_path, [cell("B", 40, noise=0.3), cell("C", 41, noise=0.3)], DECIDE)
    p = abbench("report", run, "--json")
    assert p.returncode == 3
    assert json.loads(p.stdout)["decisions"][0]["verdict"] == "INCONCLUSIVE"


def test_report_is_reproducible(tmp_path: Path) -> None:
    run = make_run(tmp_path, [cell("B", 40), cell("C", 44)], DECIDE)
    write_reports(run)
    first = (run / "report.json").read_text()
    write_reports(run)
    assert (run / "report.json").read_text() == first


def test_incomplete_run_is_marked(tmp_path: Path) -> None:
    run = make_run(tmp_path, [cell("B", 40), cell("C", 44)], DECIDE)
    lines = (run / "journal.jsonl").read_text().splitlines()
    (run / "journal.jsonl").write_text(lines[0] + "\n")
    a, rc = write_reports(run)
    assert not a.complete and rc == 3
    assert "INCOMPLETE: 1 of 2 cells" in (run / "report.md").read_text()


def test_missing_or_malformed_folder_is_one_error_line(tmp_path: Path) -> None:
    p = abbench("report", tmp_path / "nope")
    assert p.returncode == 2 and p.stderr.startswith("ERROR:")
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "plan.json").write_text("{not json")
    p = abbench("report", tmp_path / "bad")
    assert p.returncode == 2 and "malformed plan" in p.stderr and "Traceback" not in p.stderr


def test_summary_only_cell_says_so(tmp_path: Path) -> None:
    run = make_run(tmp_path, [cell("B", 40, per_token=False)])
    a, _ = write_reports(run)
    assert a.cells[0].source == "summary"
    assert "no per-token times" in (run / "report.md").read_text()
