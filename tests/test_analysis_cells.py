"""Per-cell measures of analysis/cells.py: the stability ratio (docs/report.md#method) on
constructed
per-token series, in the cell's stats, its report row, report.json, and as a match
requirement; the foreign load over the cell's ticks, in its row and report.json."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from runs_helper import AT_MAX, cell, make_run

from abbench.analysis.campaign import analyze
from abbench.analysis.cells import STABILITY_WINDOW_TOKENS, stability_ratio
from abbench.records import Sample, append_jsonl, keys
from abbench.report import write_reports

W = STABILITY_WINDOW_TOKENS


def test_a_steady_series_is_one_and_a_slowed_window_sets_the_ratio() -> None:
    assert stability_ratio(np.full(4 * W, 20.0)) == 1.0
    # The third window runs 25% slower per token: its throughput is 1/1.25 of the others'.
    wall = np.full(4 * W, 20.0)
    wall[2 * W: 3 * W] = 25.0
    assert stability_ratio(wall) == pytest.approx(0.8)
    # One slow token inside a window moves that window by its share only.
    wall = np.full(2 * W, 10.0)
    wall[3] = 10.0 + W * 10.0  # doubles the first window's time
    assert stability_ratio(wall) == pytest.approx(0.5)


def test_a_gradual_throttle_is_worst_over_best() -> None:
    # Speed falling linearly from 100 to 70 tok/s over eight windows.
    rates = np.repeat(np.linspace(100.0, 70.0, 8), W)  # (8W,)
    assert stability_ratio(1000.0 / rates) == pytest.approx(0.7)


def test_partial_windows_are_left_out_and_two_windows_are_needed() -> None:
    wall = np.full(2 * W + W // 2, 10.0)
    wall[2 * W:] = 1000.0  # the partial tail: not a window
    assert stability_ratio(wall) == 1.0
    assert stability_ratio(np.full(2 * W - 1, 10.0)) is None
    assert stability_ratio(np.array([])) is None


def test_the_ratio_is_in_the_cell_row_and_report_json(tmp_path: Path) -> None:
    slowing = np.concatenate([np.full(2 * W, 10.0), np.full(2 * W, 12.5)])
    run = make_run(tmp_path, [cell("B", 100, wall_ms=np.concatenate([np.full(4, 10.0),
                                                                       slowing])),
                              cell("C", 100, n=W)], warmup=4)
    a = analyze(run)
    assert a.cells[0].stability == pytest.approx(0.8)
    assert a.cells[1].stability is None  # 28 steady tokens: less than two windows
    write_reports(run)
    report = json.loads((run / "report.json").read_text())
    assert [c["stability"] for c in report["cells"]] == [pytest.approx(0.8), None]
    assert f"{W}-token windows" in report["method"]["stability"]
    md = (run / "report.md").read_text()
    header = next(ln for ln in md.splitlines() if ln.startswith("| # |"))
    assert "| tok/s | stability |" in header
    assert "| 0.80 |" in md


def test_min_stability_is_a_match_criterion_only_when_set(tmp_path: Path) -> None:
    steady = np.full(4 * W, 10.0)
    throttled = steady.copy()
    throttled[3 * W:] = 12.5
    cells = [cell("B", 100, wall_ms=steady), cell("C", 100, wall_ms=throttled),
             cell("D", 100, n=W)]
    (tmp_path / "a").mkdir()
    p1, p2 = analyze(make_run(tmp_path / "a", cells, warmup=0)).pairs
    assert "stability" not in {c.name for c in p1.criteria + p2.criteria}
    assert p1.state == "matched"
    (tmp_path / "b").mkdir()
    p1, p2 = analyze(make_run(tmp_path / "b", cells, warmup=0,
                              match={"min_stability": 0.9})).pairs
    s1 = next(c for c in p1.criteria if c.name == "stability")
    assert p1.state == "unmatched" and s1.status == "fail"
    assert s1.first == 1.0 and s1.second == pytest.approx(0.8) and s1.tolerance == 0.9
    assert "below the 0.9 required at cell 2" in s1.detail
    s2 = next(c for c in p2.criteria if c.name == "stability")
    assert s2.status == "fail" and "not measured" in s2.detail  # cell 3: one window


def test_the_foreign_load_is_the_mean_of_the_cells_ticks(tmp_path: Path) -> None:
    run = make_run(tmp_path, [cell("B", 100, foreign=0.2, caps_during=[AT_MAX, AT_MAX]),
                              cell("C", 100)])
    # two more ticks of cell 1: a burst, and one without the reading (not a zero)
    for values in ({keys.FOREIGN_CORES: 1.1, keys.RUNNABLE_TASKS: 9},
                   {keys.MEM_AVAILABLE_MIB: 8000.0}):
        append_jsonl(run / "samples.jsonl", Sample(1001.0, 1001.0, values, 0).to_json(),
                     fsync=False)
    a = analyze(run)
    first, second = (c.during for c in a.cells)
    assert first.foreign_cores == pytest.approx(0.5)  # (0.2 + 0.2 + 1.1) / 3
    assert first.max_runnable_tasks == 9
    assert second.foreign_cores is None and second.max_runnable_tasks is None
    write_reports(run)
    report = json.loads((run / "report.json").read_text())
    assert [c["during"]["foreign_cores"] for c in report["cells"]] == [pytest.approx(0.5), None]
    assert [c["during"]["max_runnable_tasks"] for c in report["cells"]] == [9, None]
    md = (run / "report.md").read_text().splitlines()
    header = next(ln for ln in md if ln.startswith("| # |"))
    heads = [h.strip() for h in header.split("|")]
    rows = [[v.strip() for v in ln.split("|")] for ln in md if ln.startswith(("| 1 |", "| 2 |"))]
    k = heads.index("foreign cores")
    assert [r[k] for r in rows[:2]] == ["0.50", "-"]


def test_the_foreign_load_column_is_left_out_when_no_cell_has_it(tmp_path: Path) -> None:
    run = make_run(tmp_path, [cell("B", 100), cell("C", 100)])
    write_reports(run)
    assert "foreign cores" not in (run / "report.md").read_text()
    report = json.loads((run / "report.json").read_text())
    assert [c["during"]["foreign_cores"] for c in report["cells"]] == [None, None]
