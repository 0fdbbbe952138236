"""Messages point at the cause (issue 29, class 8).

`tests/fixtures/imports/messages-overlap/`: hand-edited runs in the seed engine's v1 CSV format
(its README).
`qwen_a.csv` has an `overlap` column written as words (`on`, then `off`): the run is
imported without that column, which is listed under "not imported" with its column, line
and what was expected. `qwen_c.csv` has `n/a` in `wall_ms`, the column its tokens/s rests
on: that file is not imported, with the same message. And the terminal report written to a
pipe is whole: no line cut at 80 columns."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from abbench.cli import main
from abbench.records import read_cell_files, read_journal

FIXTURE = Path(__file__).parent / "fixtures" / "imports" / "messages-overlap"
EXPECTED = "the per-token columns are numbers, an empty field a gap"
# import.json's `not_imported` entries (records.NotImported)
OVERLAP = {"path": "qwen_a.csv", "line": 5,
           "reason": f"column `overlap`: 'on' is not a number ({EXPECTED}; a switch as 1 or "
           "0): the column is left out, the rest of the file is read"}
README = {"path": "README.md", "line": None,
          "reason": "not a kind abbench reads (.csv, .metrics, .log, .out, .state, .sh)"}
WALL = {"path": "qwen_c.csv", "line": 11,
        "reason": f"column `wall_ms`: 'n/a' is not a number ({EXPECTED}; the run's tokens/s "
        "rests on `wall_ms`: the file is not imported)"}


def shown(x: dict) -> str:
    return f"{x['path']}:{x['line']}: {x['reason']}"


def test_a_word_in_a_number_column_leaves_out_the_column_not_the_run(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "run"
    assert main(["import", str(FIXTURE), "--out", str(out), "--style", "plain"]) == 0
    stdout, stderr = capsys.readouterr()
    assert [r.label for r in read_journal(out)] == ["01-qwen_a", "02-qwen_b"]
    a = read_cell_files(out / "cells" / "01-qwen_a")
    assert "overlap" not in a.columns and len(a.columns["wall_ms"]) == 24
    for doc in (json.loads((out / "import.json").read_text()),
                json.loads((out / "report.json").read_text())["import"]):
        assert [dict(sorted(x.items())) for x in doc.get("not_imported", [])] == [
            dict(sorted(x.items())) for x in (README, OVERLAP, WALL)]
    for x in (OVERLAP, WALL):
        assert f"WARNING: not imported: {FIXTURE / x['path']}:{x['line']}: {x['reason']}" in stderr
        assert f"    {shown(x)}\n" in stdout  # the terminal report's list
        assert f"- {shown(x)}\n" in (out / "report.md").read_text()


def test_the_report_to_a_pipe_is_not_cut_at_80_columns(tmp_path: Path) -> None:
    """`abbench import` with stdout a pipe and no --style (rich's default, which cuts at 80
    columns off a terminal): every row of the cells table whole."""
    env = {**os.environ, "COLUMNS": "80", "TERM": "xterm-256color"}
    env.pop("FORCE_COLOR", None)
    done = subprocess.run([sys.executable, "-m", "abbench", "import", str(FIXTURE), "--out",
                           str(tmp_path / "run")], capture_output=True, text=True, env=env,
                          cwd=Path(__file__).parent.parent, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert "…" not in done.stdout
    head = next(ln for ln in lines if ln.startswith("| # "))
    rows = [ln for ln in lines if ln[:2] == "| " and ln[2:3].isdigit()]
    assert len(head) > 80 and rows and all(len(r) == len(head) for r in rows), rows
    assert all(r.count("|") == head.count("|") for r in rows)  # every column, nothing folded
